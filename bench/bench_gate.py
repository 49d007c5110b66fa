"""How often the HIL gate cries wolf, and how often it catches a real slowdown — vs a naive gate.

On the `local` device (this noisy machine), with the real PP-OCR text-orientation classifier (cpu fp32):
  * same    — the same bundle as baseline and candidate;
  * rebuild — an identical rebuild (built again with --force into another folder);
  * ~10% / ~5% slower — the model plus a zero-valued side branch (tests/hil/models.py: same outputs),
    the branch's width chosen so that the measured slowdown is near 10% and 5% (the true slowdown of
    each variant is measured first with a long interleaved run and printed).
Each case runs the gate N times (default 20) with the default gate file and the given budget; the
naive gate benches baseline then candidate once each (1 s each) and says "regressed" when the
candidate's p50 is > 5% above the baseline's.  Figures go to docs/BENCHMARKS.md (section `gate`).

    .venv/bin/python bench/bench_gate.py [--runs 20] [--budget 20] [--cases same,rebuild,10,5]

``--cases`` runs some of the four (then the figures go to section ``gate-CASES``, the full table stays).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import load, machine, md_table, stamp, write_section  # noqa: E402


def build(model: Path, out: Path, force: bool = False) -> Path:
    from edgeopt.fixtures import path as fixture_path
    from edgeopt.pipeline import build as _build

    rep = _build(model, "cpu", ["fp32"], shapes={"x": [1, 3, 48, 192]}, calib=str(fixture_path("images")),
                 preprocess="preset=pm1", out=out, n_calib=4, n_val=8, force=force)
    assert rep.ok, rep.results
    return Path(rep.results[0].bundle)


def true_slowdown(sess, base, cand) -> float:
    from edgeopt.hil.gatefile import load_gate
    from edgeopt.hil.paired import measure_pair
    from edgeopt.hil.stats import judge

    spec = load_gate({"rounds": {"start": 25, "max": 25}})
    runs = [measure_pair(sess, base.bundle_id, cand.bundle_id, spec, budget_s=60) for _ in range(4)]
    pooled = runs[0]
    for r in runs[1:]:  # four fresh children: one process alone can be a few % off for its whole life
        pooled.blocks.extend(r.blocks)
    return next(v.ratio for v in judge(pooled, spec) if v.metric == "p50")


def naive(sess, base, cand) -> tuple[str, float]:
    t0 = time.perf_counter()
    p50 = []
    for b in (base, cand):
        r = sess.agent("bench", {"root": sess.root, "bundle_id": b.bundle_id,
                                 "options": {"duration_s": 1.0, "warmup": 10, "min_iters": 50}})
        p50.append(r["bench"]["latency_ms"]["p50"])
    return ("regressed" if p50[1] > p50[0] * 1.05 else "pass"), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--budget", type=float, default=20.0)
    ap.add_argument("--cases", default="same,rebuild,10,5", help="which of same,rebuild,10,5")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    chosen = [c.strip() for c in a.cases.split(",") if c.strip()]
    if not chosen or any(c not in ("same", "rebuild", "10", "5") for c in chosen):
        raise SystemExit("--cases: a comma list of same, rebuild, 10, 5")

    from edgeopt.deploy import DeviceSession, load_bundle
    from edgeopt.fixtures import path as fixture_path
    from edgeopt.hil.gate import run_gate
    from edgeopt.hil.gatefile import load_gate
    from edgeopt.inventory import local_device
    from tests.hil.models import slower

    work = Path(tempfile.mkdtemp(prefix="edgeopt-bench-gate-"))
    src = Path(fixture_path("ocr-cls"))
    base = build(src, work / "dist-base")
    rebuild = build(src, work / "dist-rebuild", force=True)
    dev = local_device(str(work / "agent-root"))
    variants = {}
    with DeviceSession.open(dev) as sess:
        for ch, stride in ((1, 2), (2, 2), (3, 2), (4, 2), (1, 1), (2, 1), (3, 1), (4, 1)):
            tag = f"{ch}ch/s{stride}"
            b = build(slower(src, work / f"slow{ch}-{stride}" / src.name, channels=ch, stride=stride),
                      work / f"dist-slow{ch}-{stride}")
            sess.push([load_bundle(base), load_bundle(b)])
            variants[tag] = (b, true_slowdown(sess, load_bundle(base), load_bundle(b)))
            print(f"side branch {tag}: measured p50 slowdown {(variants[tag][1] - 1) * 100:+.1f}%", flush=True)
    pick = {}
    for goal in (1.10, 1.05):
        ch = min(variants, key=lambda c: abs(variants[c][1] - goal))
        pick[goal] = variants[ch]
    every = {"same": ("same bundle", base, 1.0), "rebuild": ("identical rebuild", rebuild, 1.0),
             "10": (f"~10% slower (measured {(pick[1.10][1] - 1) * 100:+.1f}%)", pick[1.10][0], pick[1.10][1]),
             "5": (f"~5% slower (measured {(pick[1.05][1] - 1) * 100:+.1f}%)", pick[1.05][0], pick[1.05][1])}
    cases = [every[c] for c in chosen]
    spec = load_gate(None)
    rows = []
    with DeviceSession.open(dev) as sess:
        for name, cand, _truth in cases:
            counts = {"regressed": 0, "pass": 0, "improved": 0, "inconclusive": 0, "error": 0}
            naive_counts = {"regressed": 0, "pass": 0}
            times, ntimes = [], []
            for i in range(a.runs):
                t0 = time.perf_counter()
                res = run_gate(cand, base, [dev], spec, a.budget)
                times.append(time.perf_counter() - t0)
                counts[res["verdict"]] += 1
                v, t = naive(sess, load_bundle(base), load_bundle(cand))
                naive_counts[v] += 1
                ntimes.append(t)
                print(f"{name} run {i + 1}: gate {res['verdict']} ({times[-1]:.1f}s), naive {v}", flush=True)
            n = a.runs
            rows.append({"case": name, "runs": n,
                         "gate regressed": f"{counts['regressed']}/{n} ({counts['regressed'] / n:.0%})",
                         "gate inconclusive": f"{counts['inconclusive']}/{n}",
                         "gate pass/improved": f"{counts['pass'] + counts['improved']}/{n}",
                         "gate s/verdict (median)": f"{sorted(times)[n // 2]:.1f}",
                         "naive regressed": f"{naive_counts['regressed']}/{n} ({naive_counts['regressed'] / n:.0%})",
                         "naive s/verdict": f"{sorted(ntimes)[n // 2]:.1f}"})
    cols = [(k, k) for k in rows[0]]
    table = md_table(rows, cols)
    body = (f"### HIL gate: false alarms and detection (`bench/bench_gate.py`)\n\n{stamp()} · {machine()} · "
            f"load before: {load()}\n\nThe real PP-OCR text-orientation classifier, cpu fp32, on `local`; default "
            f"gate (p50 5%, p90 10%, Holm at 0.05, {spec.rounds_start}→{spec.rounds_max} paired rounds of "
            f"{spec.block_iters} iterations, doubling while undecided), budget {a.budget:g}s "
            f"per verdict. The naive gate: one 1-s bench of each, regressed when p50 is > 5% higher.\n\n"
            f"{table}\n\nVariants measured first (4 fresh processes x 25 interleaved rounds): "
            + ", ".join(f"{c} {(r - 1) * 100:+.1f}%" for c, (_, r) in variants.items()) + ".\n")
    print(body)
    if not a.no_write:
        write_section("gate" if chosen == list(every) else "gate-" + "-".join(chosen), body)


if __name__ == "__main__":
    main()
