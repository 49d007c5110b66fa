"""A rebuild with nothing changed: wall time of the whole `edgeopt build` command (process start
included) when every bundle is already in --out, and when --out is new but the cache has them.

    .venv/bin/python bench/bench_cache.py [--targets cpu,intel-cpu,mobile] [--precision fp32,int8]

Writes the `cache` section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, machine, md_table, stamp, write_section  # noqa: E402


def run(cmd: list[str]) -> tuple[float, dict]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    return wall, json.loads(proc.stdout)


def main() -> int:
    from edgeopt.fixtures import path

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--targets", default="cpu,intel-cpu,mobile,apple,jetson-orin")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    os.environ["EDGEOPT_CACHE_DIR"] = str(work / "cache")  # an empty cache: the first build is real
    base = [sys.executable, "-m", "edgeopt", "build", str(path("ocr-cls")), "--targets", args.targets,
            "--precision", args.precision, "--shape", "x:1x3x48x192", "--preprocess", "preset=pm1",
            "--calib", str(path("images")), "--json", "-q"]
    first, report = run(base + ["--out", str(work / "d")])
    n = len(report["results"])
    print(f"first build of {n} bundles: {first:.1f}s")
    same, fresh = [], []
    for i in range(args.repeat):
        w, r = run(base + ["--out", str(work / "d")])
        assert all(x["status"] == "up-to-date" for x in r["results"]), r
        same.append(w)
        w, r = run(base + ["--out", str(work / f"fresh{i}")])
        assert all(x["status"] == "cached" for x in r["results"]), r
        fresh.append(w)
    rows = [{"case": f"first build ({n} bundles, empty cache)", "wall": f"{first:.2f} s",
             "status": ", ".join(sorted({x["status"] for x in report["results"]}))},
            {"case": "rebuild, same --out", "wall": f"{statistics.median(same):.2f} s (median of {len(same)})",
             "status": "up-to-date (says so)"},
            {"case": "rebuild, new --out", "wall": f"{statistics.median(fresh):.2f} s (median of {len(fresh)})",
             "status": "cached (copied from the cache)"}]
    for r in rows:
        print(r)
    write_section("cache", "## Rebuild with nothing changed\n\n"
                  f"Measured {stamp()} by `bench/bench_cache.py` on {machine()}; {load()}. Whole command wall "
                  f"time (Python start, model load and check, hashing) for `edgeopt build` of ocr-cls to "
                  f"`{args.targets}` × `{args.precision}`.\n\n"
                  + md_table(rows, [("case", "case"), ("wall", "wall time"), ("status", "status reported")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
