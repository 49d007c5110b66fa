"""The gate against a stored baseline (unpaired) beside the paired gate, on the same machine at the same time.

On `local` with the real PP-OCR text-orientation classifier (cpu fp32): one paired gate of the baseline
against itself is saved as the named baseline `bench` (its candidate rounds); then, for each case
(the same bundle; the model plus a zero-valued side branch, tests/hil/models.py), the unpaired gate
(`--baseline results:bench`) and the paired gate (`--baseline <bundle>`) run alternately N times each,
so both see the same machine.  Printed and written to docs/BENCHMARKS.md (section `gate-unpaired`):
how often each says regressed / inconclusive / pass, the median time per verdict, and how old the
stored rounds were when the last unpaired verdict was given.

    .venv/bin/python bench/bench_gate_unpaired.py [--runs 10] [--budget 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import load, machine, md_table, stamp, write_section  # noqa: E402
from bench.bench_gate import build, true_slowdown  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--budget", type=float, default=10.0)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()

    from edgeopt.deploy import DeviceSession, load_bundle
    from edgeopt.fixtures import path as fixture_path
    from edgeopt.hil.baseline import save
    from edgeopt.hil.gate import run_gate
    from edgeopt.inventory import local_device
    from edgeopt.policy.gatefile import load_gate
    from tests.hil.models import slower

    work = Path(tempfile.mkdtemp(prefix="edgeopt-bench-unpaired-"))
    db = work / "r.db"
    src = Path(fixture_path("ocr-cls"))
    base = build(src, work / "dist-base")
    slow = build(slower(src, work / "slow" / src.name, channels=1, stride=1), work / "dist-slow")
    dev = local_device(str(work / "agent-root"))
    with DeviceSession.open(dev) as sess:
        sess.push([load_bundle(base), load_bundle(slow)])
        truth = true_slowdown(sess, load_bundle(base), load_bundle(slow))
    print(f"side branch: measured p50 slowdown {(truth - 1) * 100:+.1f}% (100 interleaved rounds)", flush=True)
    spec = load_gate(None)
    t_saved = time.monotonic()
    run_gate(base, base, [dev], load_gate({"rounds": {"start": 40, "max": 40}}), 60.0, db_path=db)
    saved = save("bench", "latest", db)
    rounds = saved["entries"][0]["figures"]["rounds"]
    print(f"baseline saved: {rounds} rounds, p50 {saved['entries'][0]['figures']['p50']} ms", flush=True)
    rows = []
    for name, cand in (("same bundle", base), (f"slower (measured {(truth - 1) * 100:+.1f}%)", slow)):
        counts = {m: {"regressed": 0, "pass": 0, "improved": 0, "inconclusive": 0, "error": 0}
                  for m in ("unpaired", "paired")}
        times: dict[str, list[float]] = {"unpaired": [], "paired": []}
        for i in range(a.runs):
            for mode, against in (("unpaired", "results:bench"), ("paired", base)):
                t0 = time.perf_counter()
                res = run_gate(cand, against, [dev], spec, a.budget, db_path=db)
                times[mode].append(time.perf_counter() - t0)
                counts[mode][res["verdict"]] += 1
                print(f"{name} run {i + 1} {mode}: {res['verdict']} ({times[mode][-1]:.1f}s)", flush=True)
        n = a.runs
        for mode in ("unpaired", "paired"):
            c = counts[mode]
            rows.append({"case": name, "gate": mode, "runs": n,
                         "regressed": f"{c['regressed']}/{n} ({c['regressed'] / n:.0%})",
                         "inconclusive": f"{c['inconclusive']}/{n}", "pass/improved": f"{c['pass'] + c['improved']}/{n}",
                         "error": f"{c['error']}/{n}", "s/verdict (median)": f"{sorted(times[mode])[n // 2]:.1f}"})
    age = (time.monotonic() - t_saved) / 60
    table = md_table(rows, [(k, k) for k in rows[0]])
    body = (f"### HIL gate against a stored baseline: unpaired vs paired (`bench/bench_gate_unpaired.py`)\n\n"
            f"{stamp()} · {machine()} · load before: {load()}\n\nThe real PP-OCR text-orientation classifier, cpu "
            f"fp32, on `local`; the baseline `bench` saved from one paired gate ({rounds} rounds of 20 "
            f"iterations), then each case gated alternately against the stored rounds (unpaired: two-sample "
            f"Hodges-Lehmann, 99% interval widened by the 2% session margin, the 5% calibration-speed rule) and "
            f"against the baseline bundle (paired, 95%); default gate file (p50 5%, p90 10%), budget {a.budget:g}s "
            f"per verdict; the stored rounds were {age:.0f} min old at the end.\n\n{table}\n")
    print(body)
    if not a.no_write:
        write_section("gate-unpaired", body)


if __name__ == "__main__":
    main()
