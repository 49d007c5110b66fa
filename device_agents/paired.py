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
from .probe import calibration_ms
from .runners import get_runner

MAX_ROUNDS = 400
# the in-call calibration: short enough to run every few rounds, long enough to see a slower CPU
CAL_ITERATIONS, CAL_REPEATS = 60_000, 3


def _prepare(bundle: Path, threads: Any) -> dict[str, Any]:
    manifest = load_manifest(bundle)
    io = manifest["io"]
    feeds = [to_artifact(f, io["inputs"]) for f in validation_inputs(bundle, manifest)]
    opts = {"threads": threads} if threads is not None else {}
    runner = get_runner(manifest["runtime"]["name"])(bundle, manifest, opts)
    return {"bundle": bundle, "manifest": manifest, "feeds": feeds, "runner": runner}


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
    arms = [_prepare(Path(b), o.get("threads")) for b in bundles]
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
            samples = validation_inputs(arm["bundle"], arm["manifest"])
            groups, onnx_feeds = make_batches(samples, 1)
            feeds = [to_artifact(f, arm["manifest"]["io"]["inputs"]) for f in onnx_feeds]
            first = arm["runner"].run(feeds[0])
            arm["accuracy"] = _accuracy(arm["runner"], arm["manifest"], arm["bundle"], groups, feeds, first)
        # Decisions of both arms on the SAME inputs (the baseline's validation samples, each mapped to
        # the arm's own artifact layout): how often a new version decides differently from the old.
        shared = validation_inputs(arms[0]["bundle"], arms[0]["manifest"])
        kind = decision_kind(arms[0]["manifest"]) or decision_kind(arms[1]["manifest"])
        for arm in arms:
            try:
                arm["decisions"] = _decisions(arm, [to_artifact(f, arm["manifest"]["io"]["inputs"]) for f in shared],
                                              kind)
            except Exception as exc:  # noqa: BLE001 - inputs the other arm cannot take: no comparison
                arm["decisions"], arm["decisions_error"] = None, f"{type(exc).__name__}: {exc}"[:300]
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
            k += 1
        if len(blocks) % 2:  # a round is one block of each arm
            blocks.pop()
        if cal_every:
            calibration.append({"after_blocks": len(blocks), "t": round(time.perf_counter() - t_start, 4),
                                "ms": calibration_ms(CAL_ITERATIONS, CAL_REPEATS)})
            result["calibration"] = calibration
        result["blocks"] = blocks
        result["budget_hit"] = len(blocks) < 2 * rounds
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


def _decisions(arm: dict[str, Any], feeds: list[Any], kind: dict[str, Any] | None = None) -> list[list[int]]:
    """Per validation sample, the decisions of the first output (small and exact): lets the host count how
    often two bundles decide differently on the same inputs.  What a decision is follows the output's kind
    (``kind``: the baseline's, from its manifest): a CTC recogniser's greedy decoding (repeats merged,
    blanks dropped: the text it reads, so a merged word is a different decision), a thresholded map's
    positions, otherwise the argmax of the last axis."""
    out = []
    io = arm["manifest"]["io"]
    first = io["outputs"][0]["name"]
    raws = [np.asarray(from_artifact(arm["runner"].run(feed), io["outputs"])[first]) for feed in feeds]
    name = (kind or {}).get("kind")
    if name in ("ctc_time_major", "ctc_batch_major") and raws and raws[0].ndim == 3:
        idx = [np.argmax(np.swapaxes(a, 0, 1) if name == "ctc_time_major" else a, -1) for a in raws]  # [B, T]
        blank = int(np.argmax(np.bincount(np.concatenate([i.ravel() for i in idx]))))  # CTC output: mostly blank
        for i in idx:
            seqs = []
            for row in i:
                keep = np.concatenate([[True], row[1:] != row[:-1]]) & (row != blank)
                seqs.extend(row[keep].tolist() + [-1])  # -1 ends a sequence of the batch
            out.append(seqs)
        return out
    if name == "decision":
        thr = float((kind or {}).get("threshold", 0.5))
        return [(a > thr).astype(int).ravel().tolist() for a in raws]
    for a in raws:
        out.append(np.argmax(a, axis=-1).ravel().tolist() if a.ndim else [int(a > 0)])
    return out


def decision_kind(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The declared kind of the manifest's first output (``output_kinds``), parsed; None when not declared."""
    from .compare import parse_kind

    first = manifest["io"]["outputs"][0]["name"]
    try:
        return parse_kind((manifest.get("output_kinds") or {}).get(first))
    except ValueError:
        return None
