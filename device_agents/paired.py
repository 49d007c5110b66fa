"""Paired, interleaved measurement of two bundles on one device (the HIL gate's and rollout's raw data).

``pairbench`` loads a baseline (A) and a candidate (B) in ONE child process (the bench's child, with
its timeout and crash reporting) and alternates timed blocks in the order A B B A A B B A …, so that
drift, thermal state and background load hit both alike.  Each block rotates over the bundle's own
validation inputs and keeps every iteration's time; the per-block figures are what the host's
statistics pair (block *i* of A with the adjacent block of B).  Accuracy of each bundle against its
own FP32 reference is measured once, exactly (same inputs, deterministic), as the bench does.

Option ``calibrate_every: N`` (rounds; 0 = off) runs a short fixed pure-Python workload
(``probe.calibration_ms``, 60000 iterations best of 3, ~10 ms) before the first block and after every N rounds, returned as
``calibration: [{"after_blocks", "t", "ms"}]``: the host sees throttling *within* a call and drops
the blocks measured after it (androidx.benchmark's rule, between blocks).

Standard library + numpy only; the runtimes are imported by their runners.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .bundle import MANIFEST, from_artifact, load_manifest, sha256_file, to_artifact, validation_inputs
from .compare import batch_rows
from .probe import calibration_ms
from .runners import open_runner

MAX_ROUNDS = 400
# the in-call calibration: short enough to run every few rounds, long enough to see a slower CPU
CAL_ITERATIONS, CAL_REPEATS = 60_000, 3


def _prepare(bundle: Path, threads: Any, seed: int = 0) -> dict[str, Any]:
    manifest = load_manifest(bundle)
    io = manifest["io"]
    mix = None
    if (manifest.get("validation") or {}).get("varlen"):  # issue 42: the real length mix, seeded, as bench has it
        from .bench import DEFAULTS, _varlen_mix

        mix = _varlen_mix(bundle, manifest, {**DEFAULTS, "seed": seed})
        feeds = mix["feeds"]
    else:
        feeds = [to_artifact(f, io["inputs"]) for f in validation_inputs(bundle, manifest)]
    opts = {"threads": threads} if threads is not None else {}
    runner = open_runner(bundle, manifest, opts)
    return {"bundle": bundle, "manifest": manifest, "feeds": feeds, "runner": runner, "mix": mix}


def per_bucket_blocks(blocks: list[dict[str, Any]], keys: list[str], block_iters: int,
                      settle: int) -> dict[str, dict[str, Any]]:
    """Each arm's median per bucket over the timed blocks (call j of block k ran feed (k*block_iters + settle +
    j) % n), and B/A: a regression in the longest bucket shows even when the mix's median hides it."""
    n = len(keys)
    got: dict[str, dict[str, list[float]]] = {}
    for k, b in enumerate(blocks):
        for j, ms in enumerate(b["ms"]):
            got.setdefault(keys[(k * block_iters + settle + j) % n], {}).setdefault(b["arm"], []).append(ms)
    out = {}
    for key, arms in got.items():
        a, b = (float(np.median(arms[x])) if arms.get(x) else None for x in "AB")
        out[key] = {"A_p50_ms": a, "B_p50_ms": b, "ratio": (b / a) if a and b else None,
                    "calls": {x: len(arms.get(x, [])) for x in "AB"}}
    return out


def _block(run: Callable[[Any], Any], feeds: list[Any], start: int, iters: int) -> list[float]:
    out = [0.0] * iters
    clock = time.perf_counter_ns
    for j in range(iters):
        feed = feeds[(start + j) % len(feeds)]
        t0 = clock()
        run(feed)
        out[j] = (clock() - t0) / 1e6
    return out


def run_pair(bundles: list[str], options: dict[str, Any] | None = None,
             stage: Callable[[str, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Measure two bundles interleaved in this process (the verb runs it in the bench's child)."""
    from .bench import _accuracy, make_batches

    stage = stage or (lambda name, data: None)
    o = dict(options or {})
    rounds = int(o.get("rounds", 10))
    block_iters = int(o.get("block_iters", 20))
    warmup = int(o.get("warmup", 10))
    budget_s = float(o.get("budget_s", 60.0))
    cal_every = int(o.get("calibrate_every") or 0)
    if not 1 <= rounds <= MAX_ROUNDS or block_iters < 1 or warmup < 0 or budget_s <= 0 or cal_every < 0:
        raise ValueError(f"pairbench options out of range: rounds 1..{MAX_ROUNDS}, block_iters >= 1, "
                         "warmup >= 0, budget_s > 0, calibrate_every >= 0")
    stage("prepare", {})
    arms = [_prepare(Path(b), o.get("threads"), int(o.get("seed", 0))) for b in bundles]
    if len(arms) != 2:
        raise ValueError("pairbench needs exactly two bundles: [baseline, candidate]")
    result: dict[str, Any] = {"arms": []}
    try:
        for name, arm in zip("AB", arms):
            stage("load", {"arm": name})
            t0 = time.perf_counter()
            arm["runner"].load()
            arm["load_s"] = time.perf_counter() - t0
        for name, arm in zip("AB", arms):
            stage("accuracy", {"arm": name})
            if arm["mix"] is not None:  # each sample at its own length against FP32 unpadded (the host check's rule)
                from .bench import _varlen_accuracy

                arm["accuracy"] = _varlen_accuracy(arm["runner"], arm["manifest"], arm["bundle"])
                continue
            samples = validation_inputs(arm["bundle"], arm["manifest"])
            first = next(iter(samples[0].values())) if samples else None
            # each sample as it is stored: one feed (a bundle built at batch B holds B samples to a feed)
            groups, onnx_feeds = make_batches(samples, int(first.shape[0]) if first is not None and first.ndim else 1)
            feeds = [to_artifact(f, arm["manifest"]["io"]["inputs"]) for f in onnx_feeds]
            first = arm["runner"].run(feeds[0])
            arm["accuracy"] = _accuracy(arm["runner"], arm["manifest"], arm["bundle"], groups, feeds, first)
        # Decisions of both arms on the SAME inputs (the baseline's validation samples, each mapped to
        # the arm's own artifact layout): how often a new version decides differently from the old.
        shared = validation_inputs(arms[0]["bundle"], arms[0]["manifest"])
        kind = decision_kind(arms[0]["manifest"]) or decision_kind(arms[1]["manifest"])
        raws: list[list[np.ndarray] | None] = []
        for arm in arms:
            try:
                raws.append(_raw_outputs(arm, [to_artifact(f, arm["manifest"]["io"]["inputs"]) for f in shared],
                                         (kind or {}).get("output"), kind))
            except Exception as exc:  # noqa: BLE001 - inputs the other arm cannot take: no comparison
                raws.append(None)
                arm["decisions_error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows = batch_rows((arms[0]["manifest"].get("validation") or {}).get("source"))
        if rows and len(rows) == len(shared):  # built at batch B: one decision per distinct sample, not per feed
            raws = [r if r is None or any(a.ndim < 1 or a.shape[0] < max(rows) for a in r)
                    else [a[j:j + 1] for a, n in zip(r, rows) for j in range(n)] for r in raws]
        try:
            decided = pair_decisions(raws[0], raws[1], kind)
        except Exception as exc:  # noqa: BLE001 - outputs the kind's decoder cannot read: no comparison
            decided = (None, None)
            for arm in arms:
                arm.setdefault("decisions_error", f"{type(exc).__name__}: {exc}"[:300])
        for arm, dec in zip(arms, decided):
            arm["decisions"] = dec
        stage("warmup", {})
        for arm in arms:
            _block(arm["runner"].run, arm["feeds"], 0, warmup)
        stage("timed", {})
        blocks: list[dict[str, Any]] = []
        t_start = time.perf_counter()
        order = "ABBA"
        settle = max(2, block_iters // 4)
        k = 0
        calibration: list[dict[str, Any]] = []
        while len(blocks) < 2 * rounds and time.perf_counter() - t_start < budget_s:
            if cal_every and k % (2 * cal_every) == 0:
                calibration.append({"after_blocks": k, "t": round(time.perf_counter() - t_start, 4),
                                    "ms": calibration_ms(CAL_ITERATIONS, CAL_REPEATS)})
            name = order[k % 4]
            arm = arms[0 if name == "A" else 1]
            # The first runs after a switch settle (caches, the other session's spinning threads):
            # run them, keep only the block_iters after them.
            ms = _block(arm["runner"].run, arm["feeds"], k * block_iters, settle + block_iters)[settle:]
            blocks.append({"arm": name, "t": round(time.perf_counter() - t_start, 4), "ms": ms})
            if arm["mix"] is not None:  # each timed call's bucket (its request's own length): the gate per bucket
                keys = arm["mix"]["mix_keys"]
                blocks[-1]["keys"] = [keys[(k * block_iters + settle + j) % len(keys)] for j in range(block_iters)]
            k += 1
        if len(blocks) % 2:  # a round is one block of each arm
            blocks.pop()
        if cal_every:
            calibration.append({"after_blocks": len(blocks), "t": round(time.perf_counter() - t_start, 4),
                                "ms": calibration_ms(CAL_ITERATIONS, CAL_REPEATS)})
            result["calibration"] = calibration
        result["blocks"] = blocks
        result["budget_hit"] = len(blocks) < 2 * rounds
        mixes = [arm["mix"] for arm in arms]
        if all(m is not None for m in mixes) and mixes[0]["mix_keys"] == mixes[1]["mix_keys"]:
            result["per_bucket"] = per_bucket_blocks(blocks, mixes[0]["mix_keys"], block_iters, settle)
        for name, arm in zip("AB", arms):
            m = arm["manifest"]
            result["arms"].append({
                "arm": name, "bundle_id": sha256_file(arm["bundle"] / MANIFEST),
                "model": m.get("model", {}).get("name"), "model_sha256": m.get("model", {}).get("sha256"),
                "target": m.get("target"), "precision": m.get("precision"), "load_s": arm["load_s"],
                "inputs_sha256": (m.get("files", {}).get((m.get("validation") or {}).get("inputs"), {})
                                  .get("sha256")),
                "runtime": (m.get("runtime") or {}).get("name"),
                "accuracy": arm["accuracy"], "decisions": arm["decisions"], "decisions_on": "baseline inputs",
                "decisions_kind": (kind or {}).get("kind", "argmax"),
                **({"decisions_output": kind["output"]} if kind and kind.get("output") else {}),
                "runner": arm["runner"].info()})
    finally:
        for arm in arms:
            try:
                arm["runner"].close()
            except Exception:  # noqa: BLE001 - closing must not hide the first failure
                pass
    from . import probe

    result["environment"] = probe.sample_environment()
    result["options"] = {"rounds": rounds, "block_iters": block_iters, "warmup": warmup, "budget_s": budget_s,
                         "settle_iters": max(2, block_iters // 4), "calibrate_every": cal_every}
    return result


def _raw_outputs(arm: dict[str, Any], feeds: list[Any], output: str | None = None,
                 kind: dict[str, Any] | None = None) -> list[np.ndarray]:
    """One output (``output``, else the first) of an arm's runner on each feed, in the ONNX layout; an anchor
    head (``detection@anchors``) as its scores and regressors side by side, ``[1, A, C + K]``."""
    io = arm["manifest"]["io"]
    name = output or io["outputs"][0]["name"]
    if (kind or {}).get("format") == "anchors" and kind.get("boxes"):
        out = []
        for feed in feeds:
            got = from_artifact(arm["runner"].run(feed), io["outputs"])
            b = np.asarray(got[kind["boxes"]])
            b = b.reshape(b.shape[0], -1, b.shape[-1])
            out.append(np.concatenate([np.asarray(got[name]).reshape(*b.shape[:2], -1).astype(np.float64),
                                       b.astype(np.float64)], -1))
        return out
    return [np.asarray(from_artifact(arm["runner"].run(feed), io["outputs"])[name]) for feed in feeds]


def _decisions(arm: dict[str, Any], feeds: list[Any], kind: dict[str, Any] | None = None) -> list[list[int]] | None:
    """Per sample, one arm's decisions (``decisions_of``) on ``feeds``: of the output ``kind`` names (its
    ``output``), else of the first output."""
    return decisions_of(_raw_outputs(arm, feeds, (kind or {}).get("output"), kind), kind)


def decisions_of(raws: list[np.ndarray], kind: dict[str, Any] | None = None,
                 blank: int | None = None) -> list[list[int]] | None:
    """Per validation sample, the decisions of one output (small and exact): lets the host count how often two
    bundles decide differently on the same inputs, by the rule the build check judges that kind with
    (``edgeopt_agent.compare``: one decoder for both).  ``kind`` (the baseline's, from its manifest):

    - CTC: the greedy decoding (repeats merged, the blank dropped: the text read, so a merged word is a
      different decision); the blank is ``blank`` (the baseline's) or the most frequent class here;
    - ``decision``: each position above its threshold; ``probability@T``: each class's probability above T
      (a sample differs when any class crosses, as ``probability_metrics`` counts a flip);
    - ``classification`` (over its axis), ``per_position``, ``sequence``: the argmax of every position;
    - ``label``: the class ids themselves; ``detection``: the boxes the head's own decoding keeps (class and
      corners in whole pixels; ``pair_decisions`` counts two of them equal when they match one to one);
    - a kind without decisions (a map, a regression, an embedding): None;
    - no kind declared (an older manifest): the argmax of the last axis."""
    from . import compare

    name = (kind or {}).get("kind")
    if kind is not None and name not in compare.DECISION_KINDS:
        return None
    if name in ("ctc_time_major", "ctc_batch_major") and raws and raws[0].ndim == 3:
        idx = [np.argmax(np.swapaxes(a, 0, 1) if name == "ctc_time_major" else a, -1) for a in raws]  # [B, T]
        if blank is None:
            blank = int(np.argmax(np.bincount(np.concatenate([i.ravel() for i in idx]))))  # mostly blank
        out = []
        for i in idx:
            seqs: list[int] = []
            for row in i:
                seqs.extend(compare.ctc_decode(row, blank) + [-1])  # -1 ends a sequence of the batch
            out.append(seqs)
        return out
    if name in ("decision", "probability") and len((kind or {}).get("thresholds") or []) > 1:
        ts = sorted(float(t) for t in kind["thresholds"])  # the application's bands: the band is the decision
        return [np.digitize(a, ts, right=name == "decision").astype(int).ravel().tolist() for a in raws]
    if name == "decision":
        thr = float((kind or {}).get("threshold", 0.5))
        return [(a > thr).astype(int).ravel().tolist() for a in raws]
    if name == "probability":
        thr = float((kind or {}).get("threshold", 0.5))
        return [(a > thr).astype(int).ravel().tolist() for a in raws]
    if name == "label":
        return [np.rint(a).astype(np.int64).ravel().tolist() if a.dtype.kind == "f" else
                a.astype(np.int64).ravel().tolist() for a in raws]
    if name == "detection":
        out = []
        for a in raws:
            boxes, cls = compare._boxes_of(a, kind)
            out.append(np.concatenate([cls[:, None], np.rint(boxes)], 1).astype(np.int64).ravel().tolist()
                       if len(boxes) else [])
        return out
    if name == "classification" and kind.get("axis") is not None:
        return [np.argmax(a, axis=int(kind["axis"])).ravel().tolist() if a.ndim > int(kind["axis"]) else
                np.argmax(a, axis=-1).ravel().tolist() for a in raws]
    return [np.argmax(a, axis=-1).ravel().tolist() if a.ndim else [int(a > 0)] for a in raws]


def pair_decisions(base: list[np.ndarray] | None, cand: list[np.ndarray] | None, kind: dict[str, Any] | None
                   ) -> tuple[list[list[int]] | None, list[list[int]] | None]:
    """Both arms' decisions on the same samples (None for an arm whose outputs are missing). A CTC blank is
    the baseline's. A detector is counted by the box, as the build check judges it (``compare.detection_metrics``'
    ``box_match``: boxes matched one to one, same class, IoU >= 0.5, over the larger set of each image): one
    entry per box of that count, ``[1]`` in both arms for a matched box and ``[1]``/``[0]`` for one only one arm
    has, so that the host's plain comparison counts exactly the boxes that differ (an image with no box in
    either arm adds none)."""
    from . import compare

    name = (kind or {}).get("kind")
    blank = None
    if name in ("ctc_time_major", "ctc_batch_major") and base and base[0].ndim == 3:
        idx = [np.argmax(np.swapaxes(a, 0, 1) if name == "ctc_time_major" else a, -1).ravel() for a in base]
        blank = int(np.argmax(np.bincount(np.concatenate(idx))))  # the baseline's (the reference's) blank
    if name == "detection" and base is not None and cand is not None:  # decoded once, by detection_metrics
        ua: list[list[int]] = []
        ub: list[list[int]] = []
        for a, b in zip(base, cand):
            try:
                m = compare.detection_metrics(np.asarray(b)[None], np.asarray(a)[None], kind)
                total, hit = int(m["boxes"]), int(round(m["box_match"] * m["boxes"]))
            except Exception:  # noqa: BLE001 - an output this decoder cannot pair: every box differs
                total, hit = max(len(x) for x in decisions_of([a], kind) + decisions_of([b], kind)) // 5, 0
            ua += [[1]] * total
            ub += [[1]] * hit + [[0]] * (total - hit)
        return ua, ub
    da = decisions_of(base, kind, blank) if base is not None else None
    db = decisions_of(cand, kind, blank) if cand is not None else None
    return da, db


def decision_kind(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The declared kind (``output_kinds``) of the output whose decisions the gate compares, parsed, with that
    output's name as ``output``: the first output whose kind carries decisions (``compare.DECISION_KINDS``: an
    O-Net's face probabilities, not its box regression before them), else the first output's (no decisions);
    None when the manifest declares no kinds (the first output's argmax, as before kinds were recorded)."""
    from .compare import DECISION_KINDS, parse_kind

    names = [o["name"] for o in manifest["io"]["outputs"]]
    declared = manifest.get("output_kinds") or {}
    kinds: dict[str, dict[str, Any]] = {}
    for name in names:
        try:
            k = parse_kind(declared.get(name))
        except ValueError:
            k = None
        if k:
            kinds[name] = k
    pick = next((n for n in names if kinds.get(n, {}).get("kind") in DECISION_KINDS), names[0])
    if pick not in kinds:
        return None
    k = {**kinds[pick], "output": pick}
    if k.get("format") == "anchors":  # scores [1, A, C] beside regressors [1, A, K]: C from the declared shapes
        shapes = {o["name"]: o.get("shape") or [] for o in manifest["io"]["outputs"]}
        s, b = shapes.get(pick) or [], shapes.get(k.get("boxes")) or []
        if not s or not b or not all(isinstance(v, int) and v > 0 for v in [*s, *b]):
            return None  # a shape not known here: no decisions to pair (the build check judged the head)
        k["classes"] = max(1, int(np.prod(s)) // max(1, int(np.prod(b)) // int(b[-1])))
    return k
