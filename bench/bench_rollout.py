"""A simulated fleet: N `transport: local` devices (own agent roots) rolled from v1 to v2 at several
--parallel values, with injected faults (a share with a failing health check, a share whose store
cannot be written), and the invariant checked after every rollout from the agents themselves: every
device runs exactly v1 or v2, never a third bundle or an unconfirmed trial, and the journal agrees.
Writes section `rollout` of docs/BENCHMARKS.md.

    .venv/bin/python bench/bench_rollout.py [--devices-n 40] [--parallel 1,4,16] [--engines builtin,ansible]

With several engines, each --parallel value runs every engine back to back (interleaved), on the same
fleet and the same faults, so their wall times and outcomes compare in one run.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import load, machine, md_table, stamp, write_section  # noqa: E402


def edgeopt(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=3600)


def bid(bundle: Path) -> str:
    import hashlib

    return hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()


def invariant(work: Path, rid: str, v1: str, v2: str) -> tuple[bool, dict[str, int], str]:
    p = edgeopt("fleet", "status", "--devices", "fleet.yaml", "--json", "--parallel", "16", cwd=work)
    devs = json.loads(p.stdout)["devices"]
    on: dict[str, int] = {}
    bad = []
    for name, d in devs.items():
        slots = d.get("slots") or {}
        st = next(iter(slots.values()), {}) if slots else {}
        cur = st.get("current")
        tag = {v1: "v1", v2: "v2"}.get(cur, "other")
        on[tag] = on.get(tag, 0) + 1
        if tag == "other" or st.get("trial"):
            bad.append(f"{name}: {cur} trial={bool(st.get('trial'))}")
    js = json.loads(edgeopt("rollout", "status", rid, "--json", cwd=work).stdout)["devices"]
    for name, ev in js.items():
        slots = (devs.get(name) or {}).get("slots") or {}
        cur = next(iter(slots.values()), {}).get("current") if slots else None
        if ev["status"] == "done" and cur != v2:
            bad.append(f"{name}: journal done but runs {cur}")
        if ev["status"] in ("failed", "unreachable", "refused", "timed-out", "rolled-back") and cur not in (v1, None):
            bad.append(f"{name}: journal {ev['status']} but runs {cur}")
    return not bad, on, "; ".join(bad[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices-n", type=int, default=40)
    ap.add_argument("--parallel", default="1,4,16")
    ap.add_argument("--engines", default="builtin", help="builtin, ansible or both (comma-separated)")
    ap.add_argument("--health-fail", type=float, default=0.05)
    ap.add_argument("--store-fail", type=float, default=0.03)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--section", default="rollout", help="docs/BENCHMARKS.md section to (re)write")
    a = ap.parse_args()

    from edgeopt.fixtures import path as fixture_path
    from edgeopt.pipeline import build

    work = Path(tempfile.mkdtemp(prefix="edgeopt-bench-rollout-"))
    src = fixture_path("ocr-cls")
    vers = {}
    for tag, n_val in (("v1", 8), ("v2", 7)):
        rep = build(src, "cpu", ["fp32"], shapes={"x": [1, 3, 48, 192]}, calib=str(fixture_path("images")),
                    preprocess="preset=pm1", out=work / tag, n_calib=4, n_val=n_val)
        vers[tag] = Path(rep.results[0].bundle)
    v1, v2 = bid(vers["v1"]), bid(vers["v2"])
    n = a.devices_n
    n_health, n_store = round(n * a.health_fail), round(n * a.store_fail)
    devs = {}
    for i in range(n):
        d = {"transport": "local", "root": str(work / "roots" / f"d{i:03d}" / "agent"), "target": "cpu"}
        if i < n_health:
            d["health_cmd"] = ["sh", "-c", "exit 1"]
        devs[f"sim-{i:03d}"] = d
    (work / "fleet.yaml").write_text(yaml.safe_dump({"devices": devs}))
    # everybody on v1 first (no health check yet for the "bad health" ones: they start healthy)
    healthy = {k: {kk: vv for kk, vv in v.items() if kk != "health_cmd"} for k, v in devs.items()}
    (work / "fleet-v1.yaml").write_text(yaml.safe_dump({"devices": healthy}))
    p = edgeopt("rollout", str(vers["v1"]), "--devices", "fleet-v1.yaml", "--no-latency-gate", "--max-fail", "100%",
                "--waves", "100%", "--parallel", "8", "-q", cwd=work)
    assert p.returncode == 0, p.stdout + p.stderr
    # then some devices cannot take a new bundle (an injected fault: the push must fail, the device stays on
    # v1): their staging area is a file, not a folder. (A read-only store is no fault for root, who writes
    # through 0500: the first runs of this bench injected nothing that way.)
    for i in range(n_health, n_health + n_store):
        staging = work / "roots" / f"d{i:03d}" / "agent" / "staging"
        if staging.is_dir():
            import shutil

            shutil.rmtree(staging)
        staging.write_text("not a folder: injected fault\n")
    rows = []
    runs = [(par, eng) for par in [int(x) for x in a.parallel.split(",")] for eng in a.engines.split(",")]
    for par, eng in runs:
        t0 = time.perf_counter()
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        p = edgeopt("rollout", str(vers["v2"]), "--devices", "fleet.yaml", "--no-latency-gate", "--max-fail", "10%",
                    "--waves", "1,10%,50%,100%", "--parallel", str(par), "--fleet-engine", eng, "--json", cwd=work)
        wall = time.perf_counter() - t0
        lines = p.stdout.splitlines()  # JSON lines: the events, then the summary as the last line
        assert lines and p.returncode in (0, 4, 5), p.stdout[-2000:] + p.stderr[-2000:]
        summary = json.loads(lines[-1])
        ok, on, why = invariant(work, summary["rollout_id"], v1, v2)
        counts: dict[str, int] = {}
        for w in summary["waves"]:
            for k, v in (w.get("counts") or {}).items():
                counts[k] = counts.get(k, 0) + v
        rows.append({"devices": n, "engine": eng, "--parallel": par, "wall s": f"{wall:.1f}", "status": summary["status"],
                     "outcomes": ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
                     "on v1 / v2 / other": f"{on.get('v1', 0)} / {on.get('v2', 0)} / {on.get('other', 0)}",
                     "invariant": "held" if ok else f"BROKEN: {why}",
                     "host peak RSS MB": f"{max(r0, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024:.0f}"})
        print(rows[-1], flush=True)
        # back to v1 for the next run
        edgeopt("rollback", "--devices", "fleet.yaml", "--model", summary["model"], cwd=work)
    body = (f"### Rollout of a simulated fleet of {n} (`bench/bench_rollout.py`)\n\n{stamp()} · {machine()} · load before: "
            f"{load()}\n\n{n} `transport: local` devices with their own agent roots, the real PP-OCR classifier "
            f"(cpu fp32) v1 → v2, waves 1,10%,50%,100%, --max-fail 10%; faults: {n_health} devices with a failing "
            f"health_cmd, {n_store} whose staging area cannot be written (a file where the folder goes). The latency gate against the incumbent is off here "
            "(`--no-latency-gate`: every simulated device's runtime runs on this same 2-core host, so their timings "
            "would measure each other); fidelity, activation as a trial, hooks and commit run for real. The invariant "
            "is read back from the agents (`edgeopt fleet status`) and compared with the journal. With both engines, "
            "each --parallel value ran builtin then ansible back to back (`--engine ansible`: each wave an Ansible "
            "play through ansible-runner, forks = --parallel; each host's task starts a Python process that runs "
            "the same per-device steps).\n\n"
            + md_table(rows, [(k, k) for k in rows[0]]) + "\n")
    print(body)
    if not a.no_write:
        write_section(a.section, body)


if __name__ == "__main__":
    main()
