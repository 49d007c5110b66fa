"""Does the SHIP verdict hold under noise?  The README's main job's bench, 5 times on the same bundles,
under load.

The README's main job builds the PP-OCR text-orientation classifier (``--targets cpu,intel-cpu,mobile
--precision auto``, calibrated on the ocr-lines fixture) once; then, with CPU hogs running (2 per core,
each ending by itself after ``--hog-s`` seconds at most), ``edgeopt bench`` runs ``--runs`` times on
those bundles, each into its own results DB, and ``edgeopt report --json`` gives each run's verdicts
(edgeopt.decide: one per device and batch).  The claim: the same pick every time or "no clear winner"
-- never two different *confident* picks.  Printed as a table; ``--write`` also writes it to
docs/BENCHMARKS.md (section ``verdict``).  Exit 1 when two confident picks differ.

    .venv/bin/python bench/bench_verdict.py [--runs 5] [--duration 3] [--hogs-per-core 2] [--no-load]
        [--targets cpu,intel-cpu,mobile] [--dist DIR (bundles already built)] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import load, machine, md_table, stamp, write_section  # noqa: E402

HOG = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


def edgeopt(*args: str, cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def build(work: Path, targets: str) -> Path:
    """The README main job's build (its flags), into work/dist."""
    from edgeopt.fixtures import ocr_lines
    from edgeopt.fixtures import path as fixture_path

    p = edgeopt("build", str(fixture_path("ocr-cls")), "--shape", "x:1x3x48x192", "--calib", str(ocr_lines()),
                "--preprocess", "preset=pm1 order=bgr", "--targets", targets, "--precision", "auto",
                "--out", "dist", "-q", "--json", cwd=work)
    if not p.stdout:
        sys.exit(f"build failed: {p.stderr[-2000:]}")
    for r in json.loads(p.stdout)["results"]:
        print(f"  built {r['target']}-{r['precision']}: {r['status']}", flush=True)
    return work / "dist"


def hogs(n: int, seconds: float) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", HOG, str(seconds)]) for _ in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--duration", type=float, default=3.0, help="bench --duration per bundle (s)")
    ap.add_argument("--hogs-per-core", type=int, default=2)
    ap.add_argument("--hog-s", type=float, default=1800.0, help="each hog ends by itself after this (s)")
    ap.add_argument("--no-load", action="store_true", help="no hogs (the quiet-machine comparison)")
    ap.add_argument("--targets", default="cpu,intel-cpu,mobile")
    ap.add_argument("--dist", type=Path, help="bundles already built (skip the build)")
    ap.add_argument("--write", action="store_true", help="write the section `verdict` of docs/BENCHMARKS.md")
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="edgeopt-bench-verdict-"))
    print(f"machine: {machine()}\nwork dir: {work}", flush=True)
    dist = a.dist.resolve() if a.dist else build(work, a.targets)
    cores = os.cpu_count() or 1
    procs = [] if a.no_load else hogs(a.hogs_per_core * cores, a.hog_s)
    rows, runs = [], []
    try:
        time.sleep(0 if a.no_load else 5)  # the load average starts to show the hogs
        for i in range(1, a.runs + 1):
            db = work / f"run{i}.db"
            t0 = time.monotonic()
            p = edgeopt("bench", "--dist", str(dist), "--db", str(db), "--duration", str(a.duration), "-q",
                        "--json", cwd=work)
            rep = edgeopt("report", "--db", str(db), "--json", cwd=work)
            if rep.returncode != 0:
                print(f"run {i}: bench exit {p.returncode}, report exit {rep.returncode}: {rep.stderr[-500:]}")
                continue
            doc = json.loads(rep.stdout)
            la = os.getloadavg()[0]
            for v in doc["ship"]:
                rows.append({"run": i, "device": v["device"], "batch": v["batch"], "ship": v["ship"] or "-",
                             "verdict": "clear" if v["clear"] else ("no clear winner" if v["basis"] == "fidelity"
                                                                    else v["basis"]),
                             "ratio": (f"{v['ratio']:.2f}x [{v['ci_low']:.2f}, {v['ci_high']:.2f}]"
                                       if v.get("ratio") and v.get("ci_low") else ""),
                             "why": v["line"].split(" (", 1)[1].split("):", 1)[0][:110] if v["basis"] == "fidelity"
                             else "", "load": f"{la:.1f}", "s": f"{time.monotonic() - t0:.0f}"})
                runs.append(v)
                print(f"run {i}: {v['line'][:300]}", flush=True)
    finally:
        for h in procs:
            h.terminate()
        for h in procs:
            h.wait(timeout=10)
    confident: dict[tuple, set[str]] = {}
    for v in runs:
        if v["clear"]:
            confident.setdefault((v["device"], v["batch"]), set()).add(v["ship"])
    split = {k: s for k, s in confident.items() if len(s) > 1}
    table = md_table(rows, [("run", "run"), ("device", "device"), ("batch", "batch"), ("ship", "ship"),
                            ("verdict", "verdict"), ("ratio", "runner-up / pick p50 [99% CI]"), ("why", "why not clear"),
                            ("load", "load (1 min)"), ("s", "s")])
    outcome = ("FAILED: two different confident picks: " + "; ".join(f"{k}: {sorted(s)}" for k, s in split.items())
               if split else "held: the same pick every time or no clear winner")
    print("\n" + table + f"\n\n{outcome}")
    if a.write:
        write_section("verdict", (
            f"### SHIP verdict under load ({stamp()})\n\n`bench/bench_verdict.py --runs {a.runs} --duration "
            f"{a.duration:g}`{' --no-load' if a.no_load else f' with {a.hogs_per_core} CPU hogs per core'}: the "
            f"README's main job's bench {a.runs} times on the same bundles, each run's report verdict.\n"
            f"{machine()}; {load()} at the end.\n\n{table}\n\n**{outcome}**\n"))
    return 1 if split else 0


if __name__ == "__main__":
    sys.exit(main())
