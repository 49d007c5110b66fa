"""The agent's harness overhead, and the agent against OpenVINO's own benchmark_app.

    .venv/bin/python bench/bench_agent.py [--rounds 5] [--duration 3]

For ocr-cls (cpu fp32 via ONNX Runtime, intel-cpu fp32 via OpenVINO), in one interleaved run:
- agent:  `python -m edgeopt_agent bench` (child process, rotating validation inputs) → its p50;
- bare:   a plain in-process loop `runner.run(feed)` over the same session type, options and inputs → p50;
- benchmark_app: OpenVINO's tool on the same IR (`-hint latency -infer_precision f32`: one stream on all cores) → median.
Each round runs every method once in a shuffled order; the table gives the median over rounds of each
method's p50 and the ratios. Writes the `agent-overhead` section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, machine, md_table, stamp, write_section  # noqa: E402


def build(out: Path) -> dict[str, Path]:
    from edgeopt.fixtures import path
    from edgeopt.pipeline import build as do_build

    report = do_build(path("ocr-cls"), "cpu,intel-cpu", ["fp32"], shapes={"x": [1, 3, 48, 192]},
                      calib=str(path("images")), preprocess="preset=pm1", out=out)
    assert report.ok, [(r.target, r.status, r.error) for r in report.results]
    return {r.target: Path(r.bundle) for r in report.results}


def agent_p50(bundle: Path, duration: float, threads: int) -> float:
    req = {"bundle": str(bundle), "options": {"duration_s": duration, "min_iters": 100, "warmup": 20,
                                              "threads": threads}}
    proc = subprocess.run([sys.executable, "-m", "edgeopt_agent", "bench"], input=json.dumps(req),
                          capture_output=True, text=True, timeout=600)
    reply = json.loads(proc.stdout)
    assert reply["ok"], reply
    return reply["bench"]["latency_ms"]["p50"]


def bare_p50(bundle: Path, duration: float, threads: int) -> float:
    """The plainest loop: load with the same runner and options, time runner.run(feed) per call."""
    from edgeopt_agent.bundle import load_manifest, to_artifact, validation_inputs
    from edgeopt_agent.runners import get_runner

    manifest = load_manifest(bundle)
    runner = get_runner(manifest["runtime"]["name"])(bundle, manifest, {"threads": threads})
    runner.load()
    feeds = [to_artifact(f, manifest["io"]["inputs"]) for f in validation_inputs(bundle, manifest)]
    for i in range(20):
        runner.run(feeds[i % len(feeds)])
    times = []
    end = time.perf_counter() + duration
    i = 0
    while time.perf_counter() < end or i < 100:
        f = feeds[i % len(feeds)]
        t0 = time.perf_counter_ns()
        runner.run(f)
        times.append(time.perf_counter_ns() - t0)
        i += 1
    runner.close()
    return float(np.median(times)) / 1e6


def benchmark_app_median(xml: Path, duration: float, threads: int) -> float | None:
    exe = shutil.which("benchmark_app") or str(Path(sys.executable).parent / "benchmark_app")
    if not Path(exe).exists():
        return None
    # benchmark_app refuses -nstreams/-nthreads with a hint; the latency hint gives 1 stream on all
    # cores (= `threads` here). f32 as the bundle's runtime options pin it (the CPU's default is bf16).
    proc = subprocess.run([exe, "-m", str(xml), "-d", "CPU", "-hint", "latency", "-infer_precision", "f32",
                           "-t", str(int(max(1, duration))), "-api", "sync"],
                          capture_output=True, text=True, timeout=600)
    m = re.search(r"Median:\s+([\d.]+)\s*ms", proc.stdout)
    return float(m.group(1)) if m else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=3.0)
    args = ap.parse_args()
    os.environ["EDGEOPT_CACHE_DIR"] = tempfile.mkdtemp(prefix="edgeopt-bench-cache-")
    threads = os.cpu_count() or 1
    bundles = build(Path(tempfile.mkdtemp(prefix="bench-agent-")) / "dist")
    methods = {
        "ORT agent": lambda: agent_p50(bundles["cpu"], args.duration, threads),
        "ORT bare loop": lambda: bare_p50(bundles["cpu"], args.duration, threads),
        "OV agent": lambda: agent_p50(bundles["intel-cpu"], args.duration, threads),
        "OV bare loop": lambda: bare_p50(bundles["intel-cpu"], args.duration, threads),
        "OV benchmark_app": lambda: benchmark_app_median(bundles["intel-cpu"] / "model.xml", args.duration, threads),
    }
    results: dict[str, list[float]] = {k: [] for k in methods}
    before = load()
    for r in range(args.rounds):
        order = list(methods)
        random.shuffle(order)
        for name in order:
            v = methods[name]()
            if v is not None:
                results[name].append(v)
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.3f}" for k, v in results.items() if v), flush=True)
    med = {k: statistics.median(v) for k, v in results.items() if v}
    rows = [{"method": k, "p50": f"{v:.3f}", "rounds": " ".join(f"{x:.2f}" for x in results[k])} for k, v in med.items()]
    ratios = [
        ("agent / bare loop, ONNX Runtime", med["ORT agent"] / med["ORT bare loop"]),
        ("agent / bare loop, OpenVINO", med["OV agent"] / med["OV bare loop"]),
    ]
    if "OV benchmark_app" in med:
        ratios.append(("agent / benchmark_app, OpenVINO", med["OV agent"] / med["OV benchmark_app"]))
    for name, v in ratios:
        print(f"{name}: {v:.3f} ({(v - 1) * 100:+.1f}%)")
    body = ("## Agent harness overhead and OpenVINO benchmark_app\n\n"
            f"Measured {stamp()} by `bench/bench_agent.py` on {machine()}. Quietness: {before} before, "
            f"{load()} after. Model: ocr-cls (PP-OCR text-orientation classifier, 1×3×48×192), batch 1, "
            f"{threads} threads, {args.rounds} interleaved rounds of {args.duration:.0f} s per method; "
            "each cell is a p50 in ms (benchmark_app: its Median).\n\n"
            + md_table(rows, [("method", "method"), ("p50", "median of p50s (ms)"), ("rounds", "per round")])
            + "\n\n" + md_table([{"what": n, "ratio": f"{v:.3f} ({(v - 1) * 100:+.1f}%)"} for n, v in ratios],
                                [("what", "comparison"), ("ratio", "ratio")])
            + "\n\nGoal: the agent's harness costs ≤ 3% against the bare loop.")
    write_section("agent-overhead", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
