"""Rollouts on a real mixed fleet: local devices and real sshd devices, real bundle versions, real faults."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.devices.conftest import device_entry, known_hosts
from tests.hil.conftest import same_speed_gate


def _edgeopt(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


def _fleet(tmp_path: Path, ssh_env, sshd, n_local: int = 4, **extra_by_name) -> Path:
    kh = known_hosts(tmp_path / "known_hosts", sshd)
    devs = {f"loc-{i}": {"transport": "local", "root": str(tmp_path / f"r-loc-{i}"), "target": "cpu",
                         "labels": ["shop"]} for i in range(n_local)}
    for i in range(2):
        devs[f"ssh-{i}"] = device_entry(ssh_env, sshd, tmp_path / f"r-ssh-{i}", kh, target="cpu", labels=["lab"])
    for name, extra in extra_by_name.items():
        devs[name].update(extra)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"devices": devs}, sort_keys=False))
    return path


def _current(tmp_path: Path) -> dict[str, str | None]:
    """What every device runs, read from its agent (not from our journal)."""
    p = _edgeopt("fleet", "status", "--devices", "fleet.yaml", "--json", cwd=tmp_path)
    devs = json.loads(p.stdout)["devices"]
    return {n: next(iter(d["slots"].values()))["current"] if d.get("slots") else None for n, d in devs.items()}


def _bid(bundle: Path) -> str:
    import hashlib

    return hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()


def test_three_waves_then_a_bad_candidate_halts_at_the_canary(versions, ssh_env, sshd, tmp_path):
    _fleet(tmp_path, ssh_env, sshd)
    v1, v2, bad = (_bid(versions[k]) for k in ("v1", "v2", "bad"))
    p = _edgeopt("rollout", str(versions["v1"]), "--devices", "fleet.yaml", "--waves", "1,50%,100%", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    # v2 is as fast as v1: six short latency comparisons on a shared box can cry wolf once; this test is
    # about waves, so latency is bounded loosely (see same_speed_gate)
    p = _edgeopt("rollout", str(versions["v2"]), "--devices", "fleet.yaml", "--waves", "1,50%,100%",
                 "--gate", str(same_speed_gate(tmp_path)), "--gate-budget", "6", "--on-inconclusive", "continue", "--events", "ev.jsonl",
                 cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert set(_current(tmp_path).values()) == {v2}  # every device, local and over SSH
    events = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text().splitlines()]
    assert [e["wave"] for e in events if e["step"] == "wave" and e["status"] == "start"] == [0, 1, 2]
    assert {e["step"] for e in events} >= {"push", "gate-fidelity", "gate-incumbent", "activate", "device"}

    p = _edgeopt("rollout", str(versions["bad"]), "--devices", "fleet.yaml", "--waves", "1,50%,100%",
                 "--gate-budget", "6", "--json", cwd=tmp_path)
    assert p.returncode == 5, p.stdout + p.stderr
    lines = p.stdout.splitlines()  # events as JSON lines, then the summary as ONE line: every line parses
    assert all(json.loads(x)["rollout_id"] for x in lines[:-1]) and "NaN" not in p.stdout
    summary = json.loads(lines[-1])
    assert summary["kind"] == "rollout" and all(json.loads(x).get("kind") != "rollout" for x in lines[:-1])
    assert summary["status"] == "halted" and len(summary["waves"]) == 1
    canary = summary["waves"][0]["outcomes"][0]
    assert canary["step"] == "gate" and "decided differently" in canary["reason"]
    assert set(_current(tmp_path).values()) == {v2}  # the canary never switched; nobody else was touched
    del v1, bad


def test_a_failing_health_check_ends_the_device_on_its_previous_bundle(versions, ssh_env, sshd, tmp_path):
    _fleet(tmp_path, ssh_env, sshd, n_local=1, **{"ssh-1": {"health_cmd": ["sh", "-c", "exit 3"]}})
    assert _edgeopt("rollout", str(versions["v1"]), "--devices", "fleet.yaml", "--limit", "loc-0,ssh-0",
                    cwd=tmp_path).returncode == 0
    p = _edgeopt("rollout", str(versions["v1"]), "--devices", "fleet.yaml", "--limit", "ssh-1", cwd=tmp_path)
    assert p.returncode == 5 and "health_cmd exited 3" in p.stdout, p.stdout + p.stderr
    assert _current(tmp_path)["ssh-1"] is None  # it had nothing before: nothing active now


def test_bad_input_changes_nothing(versions, ssh_env, sshd, tmp_path):
    _fleet(tmp_path, ssh_env, sshd, n_local=1)
    v = str(versions["v1"])
    for args, msg in [(["--waves", "0"], "out of range"), (["--waves", "150%"], "out of range"),
                      (["--waves", "10%,5%"], "cannot shrink"), (["--max-fail", "-1"], "--max-fail"),
                      (["--select", "label=nope"], "matches no device"), (["--select", "colour=red"], "--select")]:
        p = _edgeopt("rollout", v, "--devices", "fleet.yaml", *args, cwd=tmp_path)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    p = _edgeopt("rollout", v, str(versions["bad"]), "--devices", "fleet.yaml", cwd=tmp_path)
    assert p.returncode == 2 and "two bundles for target" in p.stderr
    assert _edgeopt("rollout", "status", "nope", cwd=tmp_path).returncode == 2
    assert not list(tmp_path.glob("r-*/store"))  # no device was touched


def test_host_killed_mid_rollout_then_resume_finishes(versions, ssh_env, sshd, tmp_path):
    _fleet(tmp_path, ssh_env, sshd)
    assert _edgeopt("rollout", str(versions["v1"]), "--devices", "fleet.yaml", "--no-latency-gate",
                    cwd=tmp_path).returncode == 0
    db = tmp_path / "edgeopt-results.db"
    with sqlite3.connect(db) as c:
        seq0 = c.execute("SELECT MAX(seq) FROM rollout_events").fetchone()[0]
    proc = subprocess.Popen([sys.executable, "-m", "edgeopt", "rollout", str(versions["v2"]), "--devices",
                             "fleet.yaml", "--waves", "1,100%", "--bake", "30", "--no-latency-gate", "-q"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    rid = None
    while time.time() < deadline:  # wait until the canary is done, then kill the host hard
        time.sleep(0.3)
        if db.exists():
            with sqlite3.connect(db) as c:
                row = c.execute("SELECT rollout_id FROM rollout_events WHERE step='wave' AND status='done' "
                                "AND seq > ? ORDER BY seq DESC LIMIT 1", (seq0,)).fetchone()
            if row:
                rid = row[0]
                break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert rid, "the canary wave never finished"
    cur = _current(tmp_path)
    assert sorted(cur.values()).count(_bid(versions["v2"])) == 1  # only the canary moved
    p = _edgeopt("rollout", "resume", rid, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert set(_current(tmp_path).values()) == {_bid(versions["v2"])}
    p = _edgeopt("rollout", "resume", rid, cwd=tmp_path)
    assert p.returncode == 2 and "nothing to resume" in p.stderr
    st = _edgeopt("rollout", "status", rid, "--json", cwd=tmp_path)
    assert json.loads(st.stdout)["status"] == "done"


@pytest.mark.parametrize("waves, n, sizes", [("1,10%,50%,100%", 20, [1, 1, 8, 10]), ("2,100%", 5, [2, 3])])
def test_waves_are_cumulative_and_stable(waves, n, sizes):
    from edgeopt.deploy import LocalBundle
    from edgeopt.fleet.plan import make_plan, parse_waves
    from edgeopt.inventory import make_device

    devs = [make_device(f"d{i}", {"transport": "local", "target": "cpu"}) for i in range(n)]
    b = LocalBundle(Path("/x"), "a" * 64, "m", "cpu", "fp32", "onnxruntime", "numeric", (("f", 10),))
    p1, p2 = make_plan(devs, [b], parse_waves(waves)), make_plan(list(reversed(devs)), [b], parse_waves(waves))
    assert [len(w) for w in p1.waves] == [s for s in sizes if s] or [len(w) for w in p1.waves] == sizes
    assert p1.waves == p2.waves  # the same devices in the same waves, whatever the inventory order


def test_max_fail_follows_ansibles_exceed_rule():
    from edgeopt.fleet.plan import parse_max_fail, wave_failed

    assert not wave_failed(0, 5, parse_max_fail("0")) and wave_failed(1, 5, parse_max_fail("0"))
    assert not wave_failed(1, 10, parse_max_fail("10%")) and wave_failed(2, 10, parse_max_fail("10%"))


def test_a_halted_wave_rolls_back_its_done_devices_and_the_journal_says_so(versions, tmp_path):
    from edgeopt.deploy import load_bundle
    from edgeopt.fleet.plan import make_plan, parse_waves
    from edgeopt.inventory import make_device

    names = [f"loc-{i}" for i in range(5)]
    devs = {n: {"transport": "local", "root": str(tmp_path / f"r-{n}"), "target": "cpu"} for n in names}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({"devices": devs}))
    assert _edgeopt("rollout", str(versions["v1"]), "--devices", "fleet.yaml", "--no-latency-gate",
                    cwd=tmp_path).returncode == 0
    plan = make_plan([make_device(n, v) for n, v in devs.items()], [load_bundle(versions["v2"])],
                     parse_waves("1,100%"))
    late = [w["device"] for w in plan.waves[1]]
    devs[late[0]]["health_cmd"] = ["sh", "-c", "exit 1"]  # one device of the second wave fails its health
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({"devices": devs}))
    p = _edgeopt("rollout", str(versions["v2"]), "--devices", "fleet.yaml", "--no-latency-gate", "--waves",
                 "1,100%", "--max-fail", "0", "--json", cwd=tmp_path)
    assert p.returncode == 5, p.stdout + p.stderr
    rid = json.loads(p.stdout.splitlines()[-1])["rollout_id"]
    cur = _current(tmp_path)
    v1, v2 = _bid(versions["v1"]), _bid(versions["v2"])
    assert cur[plan.waves[0][0]["device"]] == v2  # the canary's wave passed: kept (--on-halt keep)
    assert all(cur[n] == v1 for n in late)  # the failing wave: every device back on v1
    states = json.loads(_edgeopt("rollout", "status", rid, "--json", cwd=tmp_path).stdout)["devices"]
    assert {states[n]["status"] for n in late} <= {"rolled-back", "failed"}
