"""Where one request's time goes, and the batch curve, on `local`.

1. Decomposition (``bench --profile N``): for an image model (PP-OCR text-orientation classifier) and a
   recogniser (PP-OCR rec, CTC), each fp32 artifact (cpu = ONNX Runtime, intel-cpu = OpenVINO, mobile =
   LiteRT): the stages of one request (the manifest's preprocessing in numpy on a 640x480 frame, copies,
   compute = the bench p50, postprocessing by output kind) and the runtime's own per-op profile (top op
   types and nodes) with the profiler's overhead (its profiled wall time per run vs the unprofiled p50).
2. Batch curve: the classifier built at batch 1, 2, 4, 8 (one bundle per batch, as `edgeopt tune` does)
   for cpu, intel-cpu and mobile; per point the single-stream p50 of one batched request and its images/s,
   and LoadGen's offline images/s (samples served in that batch).

Writes sections `decompose` and `batch-curve` of docs/BENCHMARKS.md.

    .venv/bin/python bench/bench_decompose.py [--targets cpu,intel-cpu,mobile] [--batches 1,2,4,8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import load, machine, md_table, stamp, write_section  # noqa: E402

MODELS = {"ocr-cls": "x:1x3x48x192", "ocr-rec": "x:1x3x48x320"}


def decomposition(work: Path, targets: str, iters: int) -> str:
    import edgeopt
    from edgeopt.fixtures import path as fixture

    stage_rows, op_rows = [], []
    for name, shape in MODELS.items():
        edgeopt.build(fixture(name), targets, precision="fp32", shapes=shape, calib=str(fixture("images")),
                      preprocess="preset=pm1", dist=work / name, calib_count=8)
        fleet = edgeopt.bench(dist=work / name, duration=2.0, min_iters=50, warmup="0.5s", profile=iters,
                              db=str(work / "r.db"))
        for rec in fleet.records:
            if not rec.ok:
                stage_rows.append({"model": name, "target": rec.bundle.get("target"), "stages": f"failed: {rec.status}"})
                continue
            d = rec.bench["decomposition"]
            st = {s["stage"]: s for s in d["stages"]}
            total = sum(s["ms"] or 0.0 for s in d["stages"])
            stage_rows.append({
                "model": name, "target": rec.bundle["target"],
                **{f"{k} ms": (f"{st[k]['ms']:.3f}" if st[k]["ms"] is not None else "n/a")
                   for k in ("preprocess", "copy in", "compute", "copy out", "postprocess")},
                "request ms": f"{total:.3f}", "compute share": f"{(st['compute']['ms'] or 0) / total:.0%}",
                "postprocess": st["postprocess"]["how"][:60]})
            p = d["profile"]
            if p.get("available") is False:
                op_rows.append({"model": name, "target": rec.bundle["target"], "profiler": "none",
                                "top op types (share of profiled node time)": p["why"], "top nodes": "",
                                "profiler overhead vs p50": ""})
                continue
            op_rows.append({
                "model": name, "target": rec.bundle["target"], "profiler": p["profiler"],
                "top op types (share of profiled node time)": ", ".join(
                    f"{o['op']} {o['share']:.0%}" for o in p["ops"][:4]),
                "top nodes": ", ".join(f"{n['name'][:28]} ({n['op']}) {n['ms']:.3f} ms" for n in p["top_nodes"][:3]),
                "profiler overhead vs p50": f"{p['overhead_vs_p50']:+.0%}" if p.get("overhead_vs_p50") is not None else ""})
    return (f"### Where one request's time goes (`bench/bench_decompose.py`)\n\n{stamp()} · {machine()} · "
            f"load: {load()}\n\n`bench --profile {iters}` on `local`, fp32 bundles (batch 1). Stages: the manifest's "
            "declared preprocessing run in numpy on a 640x480 frame, copies (0 on CPU runtimes: host memory), "
            "compute = the bench's p50, postprocessing by output kind (argmax/top-5 for the classifier, CTC greedy "
            "decoding for the recogniser).\n\n" + md_table(stage_rows, [(k, k) for k in stage_rows[0]])
            + "\n\nPer-op profiles from each runtime's own profiler, on a second (profiled) instance; the overhead "
            "is its wall time per run against the unprofiled p50:\n\n" + md_table(op_rows, [(k, k) for k in op_rows[0]])
            + "\n")


def batch_curve(work: Path, targets: str, batches: list[int], rounds: int) -> str:
    import statistics

    import edgeopt
    from edgeopt.fixtures import path as fixture

    for b in batches:  # the bundles first: one build per batch size
        edgeopt.build(fixture("ocr-cls"), targets, precision="fp32", shapes=f"x:{b}x3x48x192",
                      calib=str(fixture("images")), preprocess="preset=pm1", dist=work / f"batch{b}", calib_count=8)
    pts: dict[tuple[str, int], dict[str, list[float]]] = {}
    for r in range(rounds):  # interleaved rounds: every (batch, target) once per round
        for b in batches:
            dist = work / f"batch{b}"
            ss = edgeopt.bench(dist=dist, duration=1.5, min_iters=30, warmup="0.5s", batch=b, db=str(work / "r.db"))
            for rec in ss.records:
                if not rec.ok:
                    continue
                t = rec.bundle["target"]
                p50 = rec.bench["latency_ms"]["p50"]
                off = edgeopt.bench(dist=dist, duration=1.5, min_iters=1, warmup="0.5s", batch=b, scenario="offline",
                                    target_qps=1.2 * b * 1000 / p50, db=str(work / "r.db"), targets=t)
                sc = (off.records[0].bench or {}).get("scenario") or {} if off.records and off.records[0].ok else {}
                d = pts.setdefault((t, b), {"p50": [], "p99": [], "loop": [], "offline": []})
                d["p50"].append(p50)
                d["p99"].append(rec.bench["latency_ms"]["p99"])
                d["loop"].append(rec.bench["throughput_ips"])
                d["offline"].append(sc.get("images_per_second") or sc.get("samples_per_second") or 0.0)
            print(f"round {r + 1}: batch {b} done", flush=True)
    rows = []
    for (t, b), d in sorted(pts.items()):
        med = {k: statistics.median(v) for k, v in d.items()}
        rows.append({"target": t, "batch": str(b), "p50 ms / request": f"{med['p50']:.2f}", "p99 ms": f"{med['p99']:.2f}",
                     "images/s (single-stream loop)": f"{med['loop']:.0f}",
                     "images/s (LoadGen offline)": f"{med['offline']:.0f}"})
    return (f"### Batch curve (`bench/bench_decompose.py`)\n\n{stamp()} · {machine()} · load: {load()}\n\n"
            "PP-OCR classifier, fp32, one bundle per batch size (the batch is in the artifact's shape; "
            f"`edgeopt build --batch`), medians of {rounds} interleaved rounds. A request is one batch; LoadGen's "
            "offline samples are images served in that batch.\n\n" + md_table(rows, [(k, k) for k in rows[0]]) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="cpu,intel-cpu,mobile")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=["decompose", "batch-curve"], default=None)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="edgeopt-bench-decomp-"))
    if a.only in (None, "decompose"):
        body = decomposition(work, a.targets, a.iters)
        print(body, flush=True)
        if not a.no_write:
            write_section("decompose", body)
    if a.only in (None, "batch-curve"):
        body = batch_curve(work, a.targets, [int(x) for x in a.batches.split(",")], a.rounds)
        print(body, flush=True)
        if not a.no_write:
            write_section("batch-curve", body)


if __name__ == "__main__":
    main()
