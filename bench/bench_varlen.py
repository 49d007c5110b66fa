"""Variable-length inputs (issue 42): each form per target on real fixture models with a variable axis,
checked at every sample's own length against FP32 run unpadded, and benched over the real length mix.

    .venv/bin/python bench/bench_varlen.py [--out DIR] [--duration 3] [--mobile]

Models and data (tests/shapes/data.py): the PP-OCRv4 recogniser (width 32..320: text-line pieces the
detector finds in skimage's page and photos, at their own aspect) and openWakeWord's melspectrogram
(0.25-2 s of beckett.wav). For each (model, target): the forms the build tried (passed?, steady-state
ms/sample) and the one kept; then the padded-static form (``--option shape_form=static``, kept with
``--allow-mismatch`` where refused) beside the kept variable one: task-level agreement with FP32 unpadded
(the recogniser's CTC text per line; the melspectrogram's frames within the bound) and the agent's
per-bucket p50/p99 over the same seeded mix. Prints a Markdown table for docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import edgeopt  # noqa: E402
from edgeopt.fixtures import path as fixture  # noqa: E402
from edgeopt_agent import varlen  # noqa: E402
from edgeopt_agent.bench import run_bench  # noqa: E402
from edgeopt_agent.bundle import from_artifact, load_manifest, to_artifact  # noqa: E402
from edgeopt_agent.runners import get_runner  # noqa: E402
from tests.shapes import data  # noqa: E402

MODELS = {
    "ocr-rec": ("x:1x3x48x32..320", data.ocr_rec, {"limit": 40}),
    "oww-melspec": ("input:1x4000..32000", data.melspec, {"count": 48}),
}


def task_agreement(bundle: str, model: str) -> tuple[int, int]:
    """(samples whose task answer equals FP32's unpadded one, samples): the recogniser's greedy CTC text; the
    melspectrogram's every frame within 1e-3 of FP32 (relative to the sample's range)."""
    m = load_manifest(bundle)
    runner = get_runner(m["runtime"]["name"])(Path(bundle), m, {})
    runner.load()
    feeds, refs = varlen.validation(bundle, m)
    io = m["io"]
    same = 0
    for f, r in zip(feeds, refs):
        out = from_artifact(runner.run(to_artifact(varlen.fit(f, io["inputs"], varlen.form_of(m)), io["inputs"])),
                            io["outputs"])
        name = io["outputs"][0]["name"]
        got, ref = varlen.crop(out[name], np.shape(r[name])), np.asarray(r[name])
        if model == "ocr-rec":
            def text(p: np.ndarray) -> tuple[int, ...]:
                idx = p.reshape(-1, p.shape[-1]).argmax(-1)
                keep = np.ones(len(idx), bool)
                keep[1:] = idx[1:] != idx[:-1]
                return tuple(int(i) for i in idx[keep] if i != 0)
            same += text(got) == text(ref)
        else:
            scale = float(np.ptp(ref)) or 1.0
            same += bool(np.max(np.abs(got - ref)) <= 1e-3 * scale)
    runner.close()
    return same, len(feeds)


def one(model: str, target: str, out: Path, duration: float, static: bool) -> dict:
    shape, make, kw = MODELS[model]
    calib = make(out / f"{model}.npz", **kw)
    opts = ["shape_form=static"] if static else []
    t0 = time.perf_counter()
    rep = edgeopt.build(str(fixture(model)), target, precision="fp32", shape=shape, calib=str(calib),
                        calib_count=12, val_count=24, dist=str(out / ("static" if static else "dist")),
                        option=opts, allow_mismatch=static, raise_on_failure=False)
    r = rep.results[0]
    row = {"model": model, "target": target, "asked": "static" if static else "auto", "status": r.status,
           "build_s": round(time.perf_counter() - t0, 1)}
    if r.status not in ("built", "cached", "up-to-date"):
        row["error"] = (r.error or "").splitlines()[0][:200]
        return row
    m = json.loads((Path(r.bundle) / "manifest.json").read_text())
    row.update(form=m["shape_form"]["form"], reason=m["shape_form"]["reason"],
               tried=[{k: t.get(k) for k in ("form", "passed", "ms_per_sample", "first_pass_ms_per_sample",
                                             "summary", "error")} for t in m["shape_form"]["tried"]],
               check=m["host_check"].get("summary"), passed=m["host_check"].get("passed"),
               lengths=sorted({p["length"] for p in m["host_check"].get("per_length") or []}))
    row["task_same"], row["task_n"] = task_agreement(r.bundle, model)
    b = run_bench(r.bundle, {"duration_s": duration, "min_iters": 40, "warmup": 5, "seed": 0})
    row["bench"] = {"p50_ms": b["latency_ms"]["p50"], **b["varlen"]}
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/edgeopt-bench-varlen")
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--mobile", action="store_true", help="also mobile (onnx2tf: ~20-240 s per model)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    targets = ["cpu", "intel-cpu"] + (["mobile"] if a.mobile else [])
    rows = []
    print(f"load before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", file=sys.stderr)
    for model in MODELS:
        for target in targets:
            for static in (False, True):
                row = one(model, target, out, a.duration, static)
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"load after: {os.getloadavg()[0]:.1f}", file=sys.stderr)
    (out / "varlen.json").write_text(json.dumps(rows, indent=1))
    print("| model | target | asked | kept form | host check at own lengths | task = FP32 unpadded | "
          "weighted p50 ms | per-bucket p50 / p99 ms (share) | 1st call at a new shape ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "bench" not in r:
            print(f"| {r['model']} | {r['target']} | {r['asked']} | {r['status']}: {r.get('error', '')} | | | | | |")
            continue
        bk = r["bench"]["buckets"]
        per = "; ".join(f"{k.split('<=')[-1].split('=')[-1]}: {v['p50_ms']:.1f} / {v['p99_ms']:.1f} "
                        f"({v['share']:.0%})" for k, v in bk.items())
        first = "; ".join(f"{v['first_at_new_shape_ms']:.1f}" for v in bk.values() if v["first_at_new_shape_ms"])
        print(f"| {r['model']} | {r['target']} | {r['asked']} | {r['form']} | "
              f"{'passed' if r['passed'] else 'REFUSED'} ({len(r['lengths'])} lengths) | "
              f"{r['task_same']}/{r['task_n']} | {r['bench']['weighted_p50_ms']:.1f} | {per} | {first or '-'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
