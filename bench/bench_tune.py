"""`edgeopt tune`'s pruned search against the exhaustive sweep of the same space, on `local`.

The space: the PP-OCR classifier for cpu and intel-cpu × fp32, int8 × batch 1, 2, 4 × threads 1, 2
(24 points), objective throughput under p99 <= 50 ms. The exhaustive sweep and the pruned one run back
to back, in both orders (pruned, exhaustive, exhaustive, pruned), so the machine's drift hits both.
Reported: the points each measured, their time, and the pruned pick's throughput *as measured in the
exhaustive sweep of the same run* against the exhaustive best (goal: within 5%).
Writes section `tune` of docs/BENCHMARKS.md.

    .venv/bin/python bench/bench_tune.py [--duration 1.0] [--no-write]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import load, machine, md_table, stamp, write_section  # noqa: E402


def head_to_head(a_pt, b_pt, duration: float, work: Path, rounds: int = 5) -> float:
    """Median throughput of a's configuration over b's, measured A B A B … (1.0 when they are the same)."""
    import statistics

    import edgeopt
    from edgeopt.deploy import load_bundle

    key = lambda p: (p.target, p.precision, p.batch, p.threads)  # noqa: E731
    if key(a_pt) == key(b_pt):
        return 1.0
    got: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(rounds):
        for k, p in enumerate((a_pt, b_pt)):
            fr = edgeopt.bench(bundles=[load_bundle(p.bundle)], threads=p.threads, batch=p.batch, duration=duration,
                               min_iters=20, warmup="0.3s", db=str(work / "h2h.db"))
            got[k].append(fr.records[0].bench["throughput_ips"])
    return statistics.median(got[0]) / statistics.median(got[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=1.0)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()

    from edgeopt.fixtures import path as fixture_path
    from edgeopt.tuning import tune

    work = Path(tempfile.mkdtemp(prefix="edgeopt-bench-tune-"))
    common = dict(targets="cpu,intel-cpu", precision="fp32,int8", batches=[1, 2, 4], threads=[1, 2],
                  slo="p99=50ms", objective="throughput", shapes="x:1x3x48x192", calib=str(fixture_path("images")),
                  preprocess="preset=pm1", dist=str(work / "dist"), duration=a.duration, db=str(work / "r.db"))
    model = str(fixture_path("ocr-cls"))
    tune(model, **{**common, "threads": [1], "batches": [1, 2, 4]}, exhaustive=True)  # builds once (cached after)
    runs = []
    for mode in ("pruned", "exhaustive", "exhaustive", "pruned"):
        t0 = time.perf_counter()
        res = tune(model, **common, exhaustive=mode == "exhaustive")
        runs.append((mode, res, time.perf_counter() - t0))
        w = res.winners.get("local")
        print(mode, len(res.points), f"{res.sweep_s:.1f}s",
              w and (w.target, w.precision, w.batch, w.threads, round(w.throughput_ips or 0, 1)), flush=True)
    rows = []
    for i, (mode, res, wall) in enumerate(runs):
        if mode != "pruned":
            continue
        j = 1 if i == 0 else 2  # the exhaustive sweep next to it
        ex, ex_wall = runs[j][1], runs[j][2]
        w, best = res.winners["local"], ex.winners["local"]
        ratio = head_to_head(w, best, a.duration, work)
        rows.append({"run": f"pruned #{1 if i == 0 else 2}",
                     "pruned pick": f"{w.target} {w.precision} b{w.batch} t{w.threads}",
                     "exhaustive pick": f"{best.target} {best.precision} b{best.batch} t{best.threads}",
                     "pruned / exhaustive throughput (head to head)": f"{ratio:.3f}",
                     "points pruned / exhaustive": f"{len(res.points)} / {len(ex.points)}",
                     "wall s pruned / exhaustive": f"{wall:.1f} / {ex_wall:.1f}"})
    curve = []  # the batch curve, from the first exhaustive sweep: each point at its best threads
    ex = runs[1][1]
    for key in sorted({(p.target, p.precision, p.batch) for p in ex.points if p.status == "ok"}):
        pts = [p for p in ex.points if (p.target, p.precision, p.batch) == key and p.status == "ok"]
        b = max(pts, key=lambda p: p.throughput_ips or 0)
        curve.append({"target": key[0], "precision": key[1], "batch": key[2], "best threads": b.threads,
                      "p50 ms / request": f"{b.p50_ms:.2f}", "p99 ms": f"{b.p99_ms:.2f}",
                      "images/s": f"{b.throughput_ips:.0f}", "meets p99 ≤ 50 ms": "yes" if b.feasible else "no"})
    body = (f"### `edgeopt tune`: pruned vs exhaustive (`bench/bench_tune.py`)\n\n{stamp()} · {machine()} · load "
            f"before: {load()}\n\nPP-OCR classifier, cpu + intel-cpu × fp32/int8 × batch 1/2/4 × threads 1/2 "
            f"(24 points), objective throughput under p99 ≤ 50 ms, {a.duration:g} s per point, on `local`. Runs in "
            "the order pruned, exhaustive, exhaustive, pruned; both pick after re-measuring their 3 best points in 2 "
            "interleaved rounds (medians). Each pruned pick is then measured head to head against the exhaustive "
            "pick beside it (5 interleaved rounds; 1.000 = the same configuration; the goal is ≥ 0.95).\n\n" + md_table(rows, [(k, k) for k in rows[0]])
            + "\n\nThe batch curve (first exhaustive sweep; a request is one batch, so p50 is per batch of "
            "images):\n\n" + md_table(curve, [(k, k) for k in curve[0]]) + "\n")
    print(body)
    if not a.no_write:
        write_section("tune", body)


if __name__ == "__main__":
    main()
