"""Rollouts left unattended (issue 28): resume rolls out the bundle it planned (checked by id on the devices),
a last wave never becomes the whole fleet, an approval covers the verdict that paused, a dead host is seen
as stale with its devices' unconfirmed trials and their revert time, and watchdogs exit at commit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.fleet.test_rollout import _bid, _current, _edgeopt


def _local_fleet(tmp_path: Path, n: int, **extra) -> dict[str, dict]:
    devs = {f"d{i}": {"transport": "local", "root": str(tmp_path / f"r{i}"), "target": "cpu",
                      "labels": ["even" if i % 2 == 0 else "odd"], **extra} for i in range(n)}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({"devices": devs}, sort_keys=False))
    return devs


def _tail_gate(folder: Path) -> Path:
    """Latency gated loosely on p50/p90 (same-speed bundles: no false regression) and on p99, which the gate's
    statistics cannot judge from at most 4 paired rounds of 20 (fewer than the 662 samples a p99 needs):
    every comparison with the incumbent is inconclusive, by the gate's own rule, not by a margin."""
    path = folder / "tail-gate.yaml"
    path.write_text("p50: {max_slowdown: 100%}\np90: {max_slowdown: 100%}\np99: {max_slowdown: 100%}\n"
                    "level: 0.01\nrounds: {start: 2, max: 4}\n")
    return path


def _strict(text: str) -> dict:
    """RFC 8259 JSON: NaN / Infinity refused (as JavaScript's JSON.parse and Go's encoding/json do)."""
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _summary(p: subprocess.CompletedProcess) -> dict:
    lines = p.stdout.splitlines()
    assert lines, p.stderr[-2000:]
    assert all(_strict(x) for x in lines)  # JSON lines, every one of them; the last is the summary
    return _strict(lines[-1])


# --- waves -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("waves, n, sizes, out", [
    ("1,10%", 6, [1, 1], 4),  # 10% of 6 is 1: the second wave adds one device, it never becomes the fleet
    ("1,1", 6, [1, 1], 4),
    ("1,20%", 6, [1, 1], 4),
    ("1,10%,100%", 6, [1, 1, 4], 0),
    ("2,10%,50%", 6, [2, 1, 1], 2),  # a wave whose cap is not above what is done still adds exactly one
    ("1,10%,50%,100%", 20, [1, 1, 8, 10], 0),
    ("100%,100%", 3, [3], 0),  # nothing left for the second wave: no empty wave
])
def test_every_wave_adds_at_least_one_device_and_at_most_its_cap(waves, n, sizes, out):
    from edgeopt.deploy import LocalBundle
    from edgeopt.fleet.plan import Plan, make_plan, parse_waves
    from edgeopt.inventory import make_device

    devs = [make_device(f"d{i}", {"transport": "local", "target": "cpu"}) for i in range(n)]
    b = LocalBundle(Path("/x"), "a" * 64, "m", "cpu", "fp32", "onnxruntime", "numeric", (("f", 10),))
    plan = make_plan(devs, [b], parse_waves(waves))
    assert [len(w) for w in plan.waves] == sizes and plan.left_out == out
    assert len({w["device"] for wave in plan.waves for w in wave}) == sum(sizes)
    assert sum(s["reason"] == "beyond the last wave" for s in plan.skipped) == out
    assert Plan.from_dict(json.loads(json.dumps(plan.as_dict()))) == plan  # as the journal keeps it


def test_dry_run_says_how_many_devices_stay_out_and_label_selects(versions, tmp_path):
    _local_fleet(tmp_path, 6)
    p = _edgeopt("rollout", str(versions["v1"]), "--devices", "fleet.yaml", "--waves", "1,10%", "--dry-run",
                 cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "2 device(s) in 2 wave(s)" in p.stdout and "4 device(s) stay out" in p.stdout, p.stdout
    # --label (rollout's spelling of bench/gate's) and --select label= pick the same devices
    plans = []
    for sel in (["--label", "odd"], ["--select", "label=odd"]):
        p = _edgeopt("rollout", str(versions["v1"]), "--devices", "fleet.yaml", *sel, "--waves", "100%",
                     "--dry-run", "--json", cwd=tmp_path)
        assert p.returncode == 0, p.stderr
        plans.append(json.loads(p.stdout))
    assert plans[0]["waves"] == plans[1]["waves"]
    assert sorted(w["device"] for w in plans[0]["waves"][0]) == ["d1", "d3", "d5"]
    assert not list(tmp_path.glob("r*"))  # a dry run touches no device


def test_new_option_names_and_their_old_spellings(versions, tmp_path):
    _local_fleet(tmp_path, 1)
    v = str(versions["v1"])
    for args, msg in [(["--device-budget", "5x"], "--device-budget"), (["--device-budget", "0s"], "--device-budget"),
                      (["--budget", "5x"], "note: --budget is now --device-budget"),
                      (["--on-inconclusive", "maybe"], "pause"), (["--fleet-engine", "chef"], "builtin")]:
        p = _edgeopt("rollout", v, "--devices", "fleet.yaml", *args, cwd=tmp_path)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    help_text = _edgeopt("rollout", "start", "--help", cwd=tmp_path).stdout
    assert "--device-budget" in help_text and "--fleet-engine" in help_text and "--label" in help_text
    assert "--gate-budget" not in help_text and "continue" not in help_text  # old spellings: accepted, not shown
    p = _edgeopt("rollout", v, "--devices", "fleet.yaml", "--gate-budget", "3", "--on-inconclusive", "continue",
                 "--engine", "builtin", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-1500:]
    summary = _summary(p)
    assert summary["status"] == "done"
    rid = summary["rollout_id"]
    with sqlite3.connect(tmp_path / "edgeopt-results.db") as c:
        spec = json.loads(c.execute("SELECT json FROM rollouts WHERE id=?", (rid,)).fetchone()[0])
    assert spec["gate_budget"] == 3.0 and spec["on_inconclusive"] in ("pass", "continue")
    assert not (tmp_path / "edgeopt-results.db.rollouts" / rid).exists()  # done: its kept bundles are gone
    # a budget that allows one agent call: one paired round, intervals that are not numbers -> null, never NaN
    p = _edgeopt("rollout", str(versions["v2"]), "--devices", "fleet.yaml", "--device-budget", "500ms", "--json",
                 cwd=tmp_path)
    assert p.returncode in (0, 6), p.stdout[-1500:] + p.stderr[-1500:]
    summary = _summary(p)
    verdicts = [v for w in summary["waves"] for o in w["outcomes"] for v in o["verdicts"]]
    assert verdicts and all(v["verdict"] != "regressed" for v in verdicts), verdicts


# --- resume: the planned bundle, by id; --approve: one verdict -----------------------------------------
def test_resume_installs_the_planned_bundle_and_an_approval_covers_only_the_pausing_verdict(versions, tmp_path):
    _local_fleet(tmp_path, 3)
    v1, v2, bad = (_bid(versions[k]) for k in ("v1", "v2", "bad"))
    assert _edgeopt("rollout", str(versions["v1"]), "--devices", "fleet.yaml", "--no-latency-gate",
                    cwd=tmp_path).returncode == 0
    dist = tmp_path / "dist" / "cls"
    shutil.copytree(versions["v2"], dist)
    gate = _tail_gate(tmp_path)
    p = _edgeopt("rollout", str(dist), "--devices", "fleet.yaml", "--waves", "1,100%", "--gate", str(gate),
                 "--json", cwd=tmp_path)
    assert p.returncode == 6, p.stdout[-1500:] + p.stderr[-1500:]  # the canary paused: inconclusive p99
    summary = _summary(p)
    rid = summary["rollout_id"]
    canary = summary["waves"][0]["outcomes"][0]
    assert canary["status"] == "paused" and "p99" in canary["reason"], canary
    assert set(_current(tmp_path).values()) == {v1}

    # CI rebuilds the bundle path in place with another (real) bundle before the resume
    shutil.rmtree(dist)
    shutil.copytree(versions["bad"], dist)
    kept = tmp_path / "edgeopt-results.db.rollouts" / rid
    assert (kept / v2 / "manifest.json").is_file()
    # without the copy kept with the journal (a journal from before, or removed): refused in one line
    shutil.move(kept, tmp_path / "kept-aside")
    p = _edgeopt("rollout", "resume", rid, "--approve", cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    msg = p.stderr
    assert v2[:12] in msg and bad[:12] in msg and str(dist) in msg and "new rollout" in msg, msg
    assert set(_current(tmp_path).values()) == {v1}  # nothing changed
    shutil.move(tmp_path / "kept-aside", kept)

    # with it: the approval covers the canary's verdict; the second wave's devices pause on their own
    p = _edgeopt("rollout", "resume", rid, "--approve", "--json", cwd=tmp_path)
    assert p.returncode == 6, p.stdout[-1500:] + p.stderr[-1500:]
    summary = _summary(p)
    outs = {o["device"]: o for w in summary["waves"] for o in w.get("outcomes", [])}
    assert outs[canary["device"]]["status"] == "done", outs
    later = [d for d in outs if d != canary["device"]]
    assert len(later) == 2 and all(outs[d]["status"] == "paused" for d in later), outs
    cur = _current(tmp_path)
    assert cur[canary["device"]] == v2 and all(cur[d] == v1 for d in later)  # the planned id, not the rebuilt one
    events = [json.loads(x) for x in p.stdout.splitlines()[:-1]]
    assert {e["device"] for e in events if e["step"] == "approve"} == {canary["device"]}

    p = _edgeopt("rollout", "resume", rid, "--approve", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-1500:]
    assert set(_current(tmp_path).values()) == {v2}  # every device on the planned bundle, read from its agent
    assert not kept.exists()  # done: the kept copies are removed
    del bad


# --- a dead host: stale, unconfirmed trials with their revert time; watchdogs exit at commit ------------------
def _wait_event(db: Path, sql: str, args: tuple, timeout: float = 180) -> tuple | None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        time.sleep(0.2)
        try:
            with sqlite3.connect(db, timeout=5) as c:
                row = c.execute(sql, args).fetchone()
        except sqlite3.Error:
            continue
        if row:
            return row
    return None


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # reparented and not reaped yet: a zombie is gone too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True


def test_a_dead_host_is_stale_and_its_unconfirmed_trials_are_listed_then_resume_finishes(versions, tmp_path):
    ok = tmp_path / "healthy"  # the health check waits for this file: the host is killed mid-trial, surely
    _local_fleet(tmp_path, 3, health_cmd=["sh", "-c", f"while [ ! -f '{ok}' ]; do sleep 0.2; done"],
                 health_timeout=300)
    db = tmp_path / "edgeopt-results.db"
    proc = subprocess.Popen([sys.executable, "-m", "edgeopt", "rollout", str(versions["v1"]), "--devices",
                             "fleet.yaml", "--waves", "1,100%", "--no-latency-gate"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    row = _wait_event(db, "SELECT rollout_id, device FROM rollout_events WHERE step='activate' AND status='trial'", ())
    assert row, "the canary never reached its trial activation"
    rid, canary = row
    time.sleep(0.5)  # let the host read the activate reply and start the health check
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert f"rollout {rid} started" in proc.stderr.read()  # the id was on screen before the host died
    ls = json.loads(_edgeopt("rollout", "list", "--json", cwd=tmp_path).stdout)["rollouts"]
    assert [(r["id"], r["status"]) for r in ls] == [(rid, "interrupted")], ls
    assert f"edgeopt rollout resume {rid}" in _edgeopt("rollout", "list", cwd=tmp_path).stdout
    p = _edgeopt("rollout", "status", rid, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "stale (host process gone" in p.stdout and f"pid {proc.pid}" in p.stdout, p.stdout
    line = next(x for x in p.stdout.splitlines() if x.strip().startswith(f"{canary}:"))
    assert "unconfirmed trial" in line and "reverts it to the previous bundle at 20" in line, line
    st = json.loads(_edgeopt("rollout", "status", rid, "--json", cwd=tmp_path).stdout)
    assert st["status"] == "stale" and st["journal_status"] == "running" and st["host"]["alive"] is False
    trial = st["unconfirmed_trials"][canary]
    assert trial["confirm_within_s"] == 300 + 60 + 600 and trial["revert_at"].endswith("Z")
    fs = _edgeopt("fleet", "status", "--devices", "fleet.yaml", cwd=tmp_path).stdout
    assert f"{canary}: " in fs and "trial, unconfirmed" in fs and fs.count("no slot") == 2, fs

    ok.write_text("")
    p = _edgeopt("rollout", "resume", rid, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-1500:]
    assert set(_current(tmp_path).values()) == {_bid(versions["v1"])}
    st = json.loads(_edgeopt("rollout", "status", rid, "--json", cwd=tmp_path).stdout)
    assert st["status"] == "done" and st["unconfirmed_trials"] == {}
    # every trial's watchdog (the killed host's one included, re-armed by the resume) exits at the commit,
    # long before its deadline (~16 min away); polled, not timed
    with sqlite3.connect(db) as c:
        pids = [json.loads(r[0]).get("watchdog_pid") for r in c.execute(
            "SELECT json FROM rollout_events WHERE step='activate' AND rollout_id=?", (rid,))]
    assert len(pids) >= 3 and all(pids)
    deadline = time.time() + 120
    while time.time() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.5)
    assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]


def test_a_running_rollout_is_not_resumed_twice(versions, tmp_path):
    ok = tmp_path / "healthy"
    _local_fleet(tmp_path, 1, health_cmd=["sh", "-c", f"while [ ! -f '{ok}' ]; do sleep 0.2; done"])
    db = tmp_path / "edgeopt-results.db"
    proc = subprocess.Popen([sys.executable, "-m", "edgeopt", "rollout", str(versions["v1"]), "--devices",
                             "fleet.yaml", "--no-latency-gate", "-q"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        row = _wait_event(db, "SELECT rollout_id FROM rollout_events WHERE step='activate'", ())
        assert row
        p = _edgeopt("rollout", "resume", row[0], cwd=tmp_path)
        assert p.returncode == 2 and "is running" in p.stderr and f"pid {proc.pid}" in p.stderr, p.stderr
        st = _edgeopt("rollout", "status", row[0], cwd=tmp_path).stdout
        assert ": running" in st and "stale" not in st, st
    finally:
        ok.write_text("")
        assert proc.wait(timeout=300) == 0
