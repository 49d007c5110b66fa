"""A simulated fleet: N `transport: local` devices (own agent roots) rolled from v1 to v2 at several
--parallel values, with injected faults (a share with a failing health check, a share whose store
cannot be written), and the invariant checked after every rollout from the agents themselves: every
device runs exactly v1 or v2, never a third bundle or an unconfirmed trial, and the journal agrees.
Writes section `rollout` of docs/BENCHMARKS.md.

    .venv/bin/python bench/bench_rollout.py [--devices-n 40] [--parallel 1,4,16] [--engines builtin,ansible]

With several engines, each --parallel value runs every engine back to back (interleaved), on the same
fleet and the same faults, so their wall times and outcomes compare in one run.

Where the host's time goes (issue 28 item 9), on a fleet set up once (``--work DIR`` reuses it):

    .venv/bin/python bench/bench_rollout.py --devices-n 200 --work /tmp/fleet200 --profile 16
    .venv/bin/python bench/bench_rollout.py --devices-n 200 --work /tmp/fleet200 --scale --parallel 4,16,32

``--profile P``: one wave of every device in this process, each worker thread under cProfile with its own
CPU clock; the host process's CPU against the agents' (child processes: the devices' own work for a
`local` fleet) and the median time per step. ``--scale``: one wave per --parallel value, interleaved,
section ``rollout-scale`` (written after every wave).
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


def one_wave(work: Path, bundle: Path, parallel: int, profile: bool = False, top: int = 25) -> dict:
    """One wave of the whole fleet to ``bundle`` in this process (no latency gate, --max-fail 100%): wall
    time, the host process's own CPU (RUSAGE_SELF: the engine, the journal, starting the agents) against the
    agents' CPU (RUSAGE_CHILDREN: for a `local` device each agent call is a child process of this host, the
    work a real device would do), and the median time per device between successive journal events
    (connect → push → fidelity → activate → done). ``profile``: every worker thread under cProfile with
    its own CPU clock (time.thread_time: CPU seconds per function, waits not counted; merged over threads;
    it slows the host side, so its wall time is not one to compare)."""
    import cProfile
    import io
    import os
    import pstats
    import statistics
    import threading

    import edgeopt.fleet.rollout as ro
    from edgeopt import api

    profs: list[cProfile.Profile] = []
    plock = threading.Lock()
    real = ro.roll_device

    def profiled(*args, **kw):
        pr = cProfile.Profile(time.thread_time)  # CPU seconds of this worker thread, not its waits
        with plock:
            profs.append(pr)
        pr.enable()
        try:
            return real(*args, **kw)
        finally:
            pr.disable()

    marks: dict[str, list[tuple[float, str]]] = {}

    def on_event(ev: dict) -> None:
        if ev.get("device"):
            marks.setdefault(ev["device"], []).append((time.perf_counter(), f"{ev['step']}:{ev['status']}"))

    if profile:
        ro.roll_device = profiled
    cwd = os.getcwd()
    os.chdir(work)
    try:
        s0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN), \
            time.perf_counter()
        l0 = os.getloadavg()[0]
        summary = api.rollout(str(bundle), "fleet.yaml", waves="100%", max_fail="100%", parallel=parallel,
                              latency_gate=False, on_event=on_event, db=str(work / "wave.db"),
                              raise_on_failure=False)
        wall = time.perf_counter() - t0
        s1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        l1 = os.getloadavg()[0]
    finally:
        os.chdir(cwd)
        ro.roll_device = real
    n = len(marks)
    host = (s1.ru_utime - s0.ru_utime) + (s1.ru_stime - s0.ru_stime)
    agents = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    gaps: dict[str, list[float]] = {}
    for seq in marks.values():
        for (ta, a_), (tb, b_) in zip(seq, seq[1:]):
            gaps.setdefault(f"{a_} → {b_}", []).append(tb - ta)
    counts: dict[str, int] = {}
    for w in summary["waves"]:
        for k, v in (w.get("counts") or {}).items():
            counts[k] = counts.get(k, 0) + v
    out = {"devices": n, "parallel": parallel, "profiled": profile, "wall_s": round(wall, 1),
           "host_cpu_s": round(host, 2), "host_cpu_ms_per_device": round(1000 * host / max(n, 1), 1),
           "agents_cpu_s": round(agents, 1), "agents_cpu_ms_per_device": round(1000 * agents / max(n, 1), 1),
           "load_1min": [round(l0, 1), round(l1, 1)], "outcomes": counts,
           "median_ms_per_step": {k: round(1000 * statistics.median(v), 1) for k, v in gaps.items()
                                  if len(v) >= n // 2}}
    print(json.dumps(out), flush=True)
    if profile and profs:
        st = pstats.Stats(profs[0])
        for pr in profs[1:]:
            st.add(pr)
        buf = io.StringIO()
        st.stream = buf
        st.sort_stats("tottime").print_stats(top)
        st.sort_stats("cumulative").print_stats(top)
        print(buf.getvalue(), flush=True)
    return out


def scale(work: Path, vers: dict[str, Path], settings: list[int], repeat: int, n: int, section: str | None,
          warmup: bool = True, first: str | None = None) -> None:
    """One wave of all devices at each --parallel value, interleaved (4, 16, 32, 4, 16, 32, …), each wave
    moving the fleet to the other version (v2, v1, v2, …: both are in every store after the first wave, so
    every measured wave does the same work); the first wave (uploads) is a warm-up and not counted. Without
    ``warmup`` (a fleet a --profile run already moved to v2), the first measured wave goes to v1, or to
    ``first``."""
    import os

    target = ["v2", "v1"]
    k = 0
    if warmup:
        print("warm-up wave (uploads v2 where missing)", flush=True)
        one_wave(work, vers[target[k % 2]], max(settings))
    k += 1
    if first:
        k = target.index(first)
    runs: dict[int, list[dict]] = {p: [] for p in settings}
    loads = [os.getloadavg()[0]]
    t_all = time.perf_counter()
    for _ in range(repeat):
        for par in settings:
            runs[par].append(one_wave(work, vers[target[k % 2]], par))
            loads.extend(runs[par][-1]["load_1min"])
            k += 1
            if section:  # a cut-short run leaves what it measured
                write_section(section, _scale_body(runs, settings, n, loads, t_all, partial=True))
    body = _scale_body(runs, settings, n, loads, t_all)
    print(body)
    if section:
        write_section(section, body)


def _scale_body(runs: dict[int, list[dict]], settings: list[int], n: int, loads: list[float], t_all: float,
                partial: bool = False) -> str:
    import statistics

    rows = []
    for par in settings:
        rs = runs[par]
        if not rs:
            continue
        wall = statistics.median(r["wall_s"] for r in rs)
        rows.append({"--parallel": par, "waves": len(rs),
                     "wall s (each)": ", ".join(f"{r['wall_s']:.0f}" for r in rs),
                     "devices/s": f"{n / wall:.2f}",
                     "host CPU ms/device": ", ".join(f"{r['host_cpu_ms_per_device']:.0f}" for r in rs),
                     "agents' CPU ms/device": ", ".join(f"{r['agents_cpu_ms_per_device']:.0f}" for r in rs),
                     "load (1 min) at start/end": ", ".join(f"{r['load_1min'][0]:.0f}/{r['load_1min'][1]:.0f}"
                                                            for r in rs),
                     "outcomes": ", ".join(f"{kk} {vv}" for kk, vv in sorted(rs[-1]["outcomes"].items()))})
    return (f"### Rollout engine at {n} devices: one wave, --parallel {'/'.join(map(str, settings))} "
            f"(`bench/bench_rollout.py --scale`)\n\n"
            f"{stamp()} · {machine()} · shared machine, 1-minute load {min(loads):.0f}–{max(loads):.0f} during the "
            f"waves (other engineers' builds and tests; not quiet) · {time.perf_counter() - t_all:.0f}s"
            + (" · **partial: still running**" if partial else "") + "\n\n"
            f"{n} `transport: local` devices (own agent roots), the real PP-OCR classifier (cpu fp32), one wave of "
            "every device in the bench's own process (`edgeopt.api.rollout`, `--waves 100% --max-fail 100% "
            "--no-latency-gate`), the settings interleaved, each wave moving the fleet to the other version "
            "(both already in every store: no upload in a measured wave). *host CPU*: this process (the engine, "
            "journal, starting the agent processes); *agents' CPU*: the agent processes it started, i.e. the "
            "work a real device does on its own CPU (here on the same 2 cores).\n\n"
            + (md_table(rows, [(kk, kk) for kk in rows[0]]) if rows else "(no wave finished)") + "\n")


def setup(work: Path, a) -> tuple:
    """Build v1 and v2, write the inventory, put every device on v1, then inject the faults."""
    from edgeopt.fixtures import path as fixture_path
    from edgeopt.pipeline import build

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
    return vers, v1, v2, n, n_health, n_store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices-n", type=int, default=40)
    ap.add_argument("--parallel", default="1,4,16")
    ap.add_argument("--engines", default="builtin", help="builtin, ansible or both (comma-separated)")
    ap.add_argument("--health-fail", type=float, default=0.05)
    ap.add_argument("--store-fail", type=float, default=0.03)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--section", default="rollout", help="docs/BENCHMARKS.md section to (re)write")
    ap.add_argument("--profile", type=int, default=0, metavar="P",
                    help="instead of the table: one wave of every device (v1 → v2, no gate) in this process at "
                         "--parallel P, every worker thread under cProfile, with the host's CPU, the agents' "
                         "CPU and the time per step per device")
    ap.add_argument("--profile-top", type=int, default=25)
    ap.add_argument("--scale", action="store_true",
                    help="instead of the table: one wave of every device at each --parallel value, interleaved "
                         "--repeat times; host CPU vs the agents' CPU per device (section rollout-scale)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-warmup", action="store_true", help="--scale on a fleet a --profile run left on v2")
    ap.add_argument("--first", choices=("v1", "v2"), default=None,
                    help="--scale: the version the first measured wave goes to (the one the fleet is not on)")
    ap.add_argument("--work", default=None, help="the fleet's folder; one set up there before is reused [a new one]")
    a = ap.parse_args()

    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="edgeopt-bench-rollout-"))
    ready = work / "ready.json"  # a fleet this bench set up before (--work): reused as it is
    if ready.is_file() and json.loads(ready.read_text()).get("devices") == a.devices_n:
        r = json.loads(ready.read_text())
        vers = {k: Path(v) for k, v in r["vers"].items()}
        n_health, n_store = r["n_health"], r["n_store"]
        v1, v2, n = bid(vers["v1"]), bid(vers["v2"]), a.devices_n
        print(f"reusing the fleet of {n} in {work}", flush=True)
    else:
        vers, v1, v2, n, n_health, n_store = setup(work, a)
        ready.write_text(json.dumps({"devices": n, "vers": {k: str(v) for k, v in vers.items()},
                                     "n_health": n_health, "n_store": n_store}))
    if a.profile:
        one_wave(work, vers["v2"], a.profile, profile=True, top=a.profile_top)
        return
    if a.scale:
        scale(work, vers, [int(x) for x in a.parallel.split(",")], a.repeat, n,
              None if a.no_write else (a.section if a.section != "rollout" else "rollout-scale"), not a.no_warmup,
              a.first)
        return
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
