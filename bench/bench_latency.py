"""Latency of every built artifact against a plain ONNX Runtime FP32 session of the original model,
and edgeopt's build time against calling the converters directly.

    .venv/bin/python bench/bench_latency.py [--models ocr-cls,ocr-rec] [--targets cpu,intel-cpu,mobile]
                                           [--rounds 15] [--iters 20]

Latency: batch 1, in-process, each artifact loaded once through the agent's own runner (the same
code that runs on a device), fed the bundle's rotating validation inputs. Interleaved: every round
runs `--iters` calls of each artifact (in a shuffled order) and of the baseline, so machine noise
hits all of them alike; the figure is the median over all rounds. Writes the `latency` and
`build-time` sections of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, machine, md_table, stamp, write_section  # noqa: E402

MODELS = {  # fixture -> (shape flag, preprocess, calibration source)
    "ocr-cls": ("x:1x3x48x192", "preset=pm1", "images"),
    "ocr-rec": ("x:1x3x48x320", "preset=pm1", "images"),
    "ocr-det": ("x:1x3x640x640", "preset=imagenet", "images"),
}
PRECISIONS = {"cpu": ["fp32", "int8"], "intel-cpu": ["fp32", "fp16", "int8"], "mobile": ["fp32", "fp16", "int8"]}


def build_all(model: str, targets: list[str], out: Path) -> dict:
    """Build with the CLI (cache cleared, --force) and return {target-precision: (bundle dir, wall s)}."""
    from edgeopt.fixtures import path

    shape, pre, calib = MODELS[model]
    built = {}
    for target in targets:
        for prec in PRECISIONS[target]:
            cmd = [sys.executable, "-m", "edgeopt", "build", str(path(model)), "--targets", target, "--precision", prec,
                   "--shape", shape, "--preprocess", pre, "--calib", str(path(calib)), "--out", str(out), "--force",
                   "--json", "-q"]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            try:
                report = json.loads(proc.stdout)
            except json.JSONDecodeError:
                print(f"  {model} {target} {prec}: build crashed: {proc.stderr[-300:]}")
                continue
            r = report["results"][0]
            print(f"  {model} {target} {prec}: {r['status']} in {wall:.1f}s {r.get('check', '')[:80]}", flush=True)
            if r["status"] in ("built", "cached", "up-to-date"):
                built[f"{target} {prec}"] = (Path(r["bundle"]), wall)
    return built


def direct_converter_times(model: str, work: Path) -> dict[str, float]:
    """Each converter called directly with its defaults on the same static-shape model (no checks)."""
    import onnx

    from edgeopt import model as modelmod
    from edgeopt.fixtures import path

    shape = MODELS[model][0]
    name, dims = shape.split(":")
    static = modelmod.make_static(modelmod.load(path(model)), {name: [int(d) for d in dims.split("x")]})
    src = work / f"{model}-static.onnx"
    onnx.save(static, str(src))
    times = {}
    t0 = time.perf_counter()
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(work / "ort-opt.onnx")
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    times["cpu fp32"] = time.perf_counter() - t0
    try:
        import openvino as ov

        for prec in ("fp32", "fp16"):
            t0 = time.perf_counter()
            ov.save_model(ov.convert_model(str(src)), str(work / f"ov-{prec}.xml"), compress_to_fp16=prec == "fp16")
            times[f"intel-cpu {prec}"] = time.perf_counter() - t0
    except ImportError:
        pass
    return times


def measure(bundles: dict, model: str, rounds: int, iters: int) -> dict[str, list[float]]:
    """Interleaved batch-1 latencies (ms) of every artifact and of the plain ORT FP32 baseline."""
    import onnxruntime as ort

    from edgeopt.fixtures import path
    from edgeopt_agent.bundle import load_manifest, to_artifact, validation_inputs
    from edgeopt_agent.runners import get_runner

    threads = os.cpu_count() or 1
    runs = {}
    any_bundle = next(iter(bundles.values()))[0]
    feeds_onnx = validation_inputs(any_bundle, load_manifest(any_bundle))
    base = ort.InferenceSession(str(path(model)), providers=["CPUExecutionProvider"])
    runs["ORT FP32, original model (baseline)"] = (lambda f: base.run(None, f), feeds_onnx)
    for label, (bundle, _) in bundles.items():
        manifest = load_manifest(bundle)
        runner = get_runner(manifest["runtime"]["name"])(bundle, manifest, {"threads": threads})
        runner.load()
        feeds = [to_artifact(f, manifest["io"]["inputs"]) for f in validation_inputs(bundle, manifest)]
        runs[label] = (runner.run, feeds)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for fn, feeds in runs.values():  # warm-up
        for f in feeds[:3]:
            fn(f)
    order = list(runs)
    for _ in range(rounds):
        random.shuffle(order)
        for label in order:
            fn, feeds = runs[label]
            for i in range(iters):
                f = feeds[i % len(feeds)]
                t0 = time.perf_counter_ns()
                fn(f)
                times[label].append((time.perf_counter_ns() - t0) / 1e6)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="ocr-cls,ocr-rec")
    ap.add_argument("--targets", default="cpu,intel-cpu,mobile")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    os.environ["EDGEOPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="edgeopt-bench-cache-")
    targets = args.targets.split(",")
    lat_sections, build_rows = [], []
    load_before = load()
    for model in args.models.split(","):
        work = Path(tempfile.mkdtemp(prefix=f"bench-{model}-"))
        print(f"{model}: building {targets}", flush=True)
        bundles = build_all(model, targets, work / "dist")
        direct = direct_converter_times(model, work)
        for label, (bundle, wall) in bundles.items():
            m = json.loads((bundle / "manifest.json").read_text())
            build_rows.append({"model": model, "artifact": label, "edgeopt": f"{wall:.1f} s",
                               "convert": f"{m['build']['time_s']:.1f} s",
                               "direct": f"{direct[label]:.1f} s" if label in direct else "—",
                               "note": m["options"].get("chosen_variant", m["options"].get("variant", ""))})
        print(f"{model}: measuring {len(bundles)} artifacts, {args.rounds} rounds x {args.iters} iters", flush=True)
        times = measure(bundles, model, args.rounds, args.iters)
        base = float(np.median(times["ORT FP32, original model (baseline)"]))
        rows = []
        for label, ts in times.items():
            med = float(np.median(ts))
            rows.append({"artifact": label, "p50": f"{med:.2f}", "p90": f"{np.percentile(ts, 90):.2f}",
                         "speedup": f"{base / med:.2f}×", "n": len(ts)})
            print(f"  {label:40s} p50 {med:7.2f} ms  ({base / med:.2f}x vs baseline)")
        lat_sections.append(f"### {model} ({MODELS[model][0]})\n\n" + md_table(
            rows, [("artifact", "artifact"), ("p50", "p50 ms"), ("p90", "p90 ms"), ("speedup", "vs ORT FP32"),
                   ("n", "calls")]))
    load_after = load()
    head = (f"Measured {stamp()} by `bench/bench_latency.py` on {machine()}.\n"
            f"Quietness: {load_before} before, {load_after} after (other jobs on the machine inflate every "
            f"figure alike; ratios come from one interleaved run). Batch 1, {os.cpu_count()} threads, the agent's "
            f"runners in-process, rotating real validation inputs, {args.rounds} rounds × {args.iters} calls per "
            "artifact.\n\n")
    write_section("latency", "## Artifact latency vs plain ONNX Runtime FP32\n\n" + head + "\n\n".join(lat_sections))
    write_section("build-time", "## Build time: edgeopt vs the converter called directly\n\n"
                  f"Measured {stamp()} by `bench/bench_latency.py` on {machine()}. `edgeopt` = the whole "
                  "`edgeopt build --force` command (data preparation, FP32 reference, conversion in a worker, "
                  "INT8 search, host check, hashing); `convert` = the conversion step inside it (manifest "
                  "`build.time_s`); `direct` = the converter called directly with its defaults, no check.\n\n"
                  + md_table(build_rows, [("model", "model"), ("artifact", "artifact"), ("edgeopt", "edgeopt build"),
                                          ("convert", "convert step"), ("direct", "direct converter")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
