"""Cold start split, and each runtime's cache on and off, measured in fresh processes.

Each measurement is a new Python process (nothing warm from an earlier run): ``import`` of the runtime,
model load/compile, first inference, then the steady p50 of 50 runs. Pairs are interleaved (A B A B …)
so drift hits both. Cases, for the PP-OCR classifier:

- ONNX Runtime: the original model optimised at load (``ORT_ENABLE_ALL``) vs the bundle's artifact, which
  edgeopt saved already optimised (loaded with optimisations off: ORT's "optimised model file");
- OpenVINO: the bundle's IR compiled with no cache vs with ``CACHE_DIR`` (a first run that fills it is not
  counted; the measured runs hit it).

Writes section `coldstart` of docs/BENCHMARKS.md.

    .venv/bin/python bench/bench_coldstart.py [--reps 5] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import load, machine, md_table, stamp, write_section  # noqa: E402

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
kind, path, extra = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
import numpy as np
x = np.random.default_rng(0).random((1, 3, 48, 192), dtype=np.float32)
if kind == "ort":
    import onnxruntime as ort
    t1 = time.perf_counter()
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, extra["level"])
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    run = lambda: s.run(None, {s.get_inputs()[0].name: x})
else:
    import openvino as ov
    t1 = time.perf_counter()
    core = ov.Core()
    if extra.get("cache"):
        core.set_property({"CACHE_DIR": extra["cache"]})
    c = core.compile_model(path, "CPU", {"PERFORMANCE_HINT": "LATENCY"})
    r = c.create_infer_request()
    run = lambda: r.infer({0: x})
t2 = time.perf_counter()
run()
t3 = time.perf_counter()
ts = []
for _ in range(50):
    a = time.perf_counter(); run(); ts.append(time.perf_counter() - a)
ts.sort()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "first_s": t3 - t2, "p50_ms": ts[25] * 1000}))
"""


def child(kind: str, path: str, extra: dict) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, kind, path, json.dumps(extra)], capture_output=True, text=True,
                       timeout=300)
    if p.returncode:
        raise SystemExit(p.stderr[-2000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()

    import edgeopt
    from edgeopt.fixtures import path as fixture_path

    work = Path(tempfile.mkdtemp(prefix="edgeopt-bench-cold-"))
    model = str(fixture_path("ocr-cls"))
    rep = edgeopt.build(model, "cpu,intel-cpu", precision="fp32", shapes="x:1x3x48x192", dist=work / "dist")
    assert rep.ok, rep.results
    b = {r.target: Path(r.bundle) for r in rep.results}
    ort_art = str(b["cpu"] / json.loads((b["cpu"] / "manifest.json").read_text())["runtime"]["artifact"])
    ov_man = json.loads((b["intel-cpu"] / "manifest.json").read_text())
    ov_art = str(b["intel-cpu"] / ov_man["runtime"]["artifact"])
    cache = str(work / "ov-cache")
    child("ov", ov_art, {"cache": cache})  # fills the cache; not counted
    cases = {
        "ORT: original model, optimised at load": ("ort", model, {"level": "ORT_ENABLE_ALL"}),
        "ORT: edgeopt's pre-optimised artifact, no optimisation at load": ("ort", ort_art, {"level": "ORT_DISABLE_ALL"}),
        "OpenVINO: IR compiled, no cache": ("ov", ov_art, {}),
        "OpenVINO: IR compiled, CACHE_DIR warm": ("ov", ov_art, {"cache": cache}),
    }
    got: dict[str, list[dict]] = {k: [] for k in cases}
    for _ in range(a.reps):
        for name, (kind, path, extra) in cases.items():
            got[name].append(child(kind, path, extra))
            print(name, got[name][-1], flush=True)
    rows = []
    for name, runs in got.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        rows.append({"case": name, "import ms": f"{med['import_s'] * 1000:.0f}", "load/compile ms":
                     f"{med['load_s'] * 1000:.1f}", "first inference ms": f"{med['first_s'] * 1000:.2f}",
                     "steady p50 ms": f"{med['p50_ms']:.3f}",
                     "cold total ms": f"{(med['import_s'] + med['load_s'] + med['first_s']) * 1000:.0f}"})
    body = (f"### Cold start and runtime caches (`bench/bench_coldstart.py`)\n\n{stamp()} · {machine()} · load "
            f"before: {load()}\n\nPP-OCR classifier (x:1x3x48x192), each figure the median of {a.reps} fresh "
            "processes, cases interleaved. import = the runtime's Python import; load/compile = session creation "
            "or compile_model; first inference; steady = p50 of the next 50 runs.\n\n"
            + md_table(rows, [(k, k) for k in rows[0]]) + "\n")
    print(body)
    if not a.no_write:
        write_section("coldstart", body)


if __name__ == "__main__":
    main()
