"""A device's sshd stopped mid-wave (real sshd, SIGKILL of the listener and its sessions): the device is
reported unreachable after its retries, nothing is half-installed, the others finish; when sshd comes back
within the retry window, the retry finishes the device."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import yaml

from tests.devices.conftest import device_entry, known_hosts
from tests.fleet.test_rollout import _bid, _current, _edgeopt


def _fleet(tmp_path: Path, ssh_env, sshd, flaky) -> None:
    kh = known_hosts(tmp_path / "known_hosts", sshd, flaky)
    devs = {"loc-0": {"transport": "local", "root": str(tmp_path / "r-loc-0"), "target": "cpu"},
            "ssh-0": device_entry(ssh_env, sshd, tmp_path / "r-ssh-0", kh, target="cpu"),
            "ssh-x": device_entry(ssh_env, flaky, tmp_path / "r-ssh-x", kh, target="cpu", connect_timeout=3)}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({"devices": devs}, sort_keys=False))


def _kill_when_reached(db: Path, flaky, back_after: float | None, step: str | None = "connect") -> threading.Thread:
    """SIGKILL ssh-x's sshd (listener and sessions) when the rollout reaches ``step`` on ssh-x (its session
    is open from ``push`` on: the kill drops it mid-step), or -- ``step=None`` -- as soon as the wave has begun
    on any device; maybe bring it back."""
    def watch() -> None:
        deadline = time.time() + 120
        while time.time() < deadline:
            time.sleep(0.02)
            try:
                with sqlite3.connect(db, timeout=5) as c:
                    hit = (c.execute("SELECT 1 FROM rollout_events LIMIT 1").fetchone() if step is None else
                           c.execute("SELECT 1 FROM rollout_events WHERE device='ssh-x' AND step=?", (step,)).fetchone())
            except sqlite3.Error:
                continue
            if hit:
                flaky.kill()
                if back_after is not None:
                    time.sleep(back_after)
                    flaky.start()
                return

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def _outcomes(stdout: str) -> dict[str, dict]:
    """The summary: the last of the JSON lines on stdout with --json."""
    summary = json.loads(stdout.splitlines()[-1])
    return {o["device"]: o for w in summary["waves"] for o in w.get("outcomes", [])}


def test_sshd_stopped_mid_wave_is_unreachable_and_nothing_is_half_installed(versions, ssh_env, sshd, tmp_path):
    flaky = ssh_env.make("flaky-stop")
    _fleet(tmp_path, ssh_env, sshd, flaky)
    # killed once the wave has begun (its first event): waiting for ssh-x's own 'connect' event raced the
    # device's whole push -- events are written in groups every 0.1 s, and ssh-x was once done by then
    watcher = _kill_when_reached(tmp_path / "edgeopt-results.db", flaky, back_after=None, step=None)
    p = _edgeopt("rollout", str(versions["v1"]), "--devices", "fleet.yaml", "--waves", "100%", "--max-fail", "1",
                 "--no-latency-gate", "--retries", "1", "--json", cwd=tmp_path)
    watcher.join(5)
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-1500:]  # 1 failure does not exceed --max-fail 1
    out = _outcomes(p.stdout)
    assert out["ssh-x"]["status"] == "unreachable" and out["ssh-x"]["step"] in ("connect", "push"), out["ssh-x"]
    assert out["ssh-x"]["attempts"] == 2 and not out["ssh-x"]["activated"]
    assert out["loc-0"]["status"] == out["ssh-0"]["status"] == "done"
    flaky.start()  # back up: what does the device itself hold?
    cur = _current(tmp_path)
    assert cur == {"loc-0": _bid(versions["v1"]), "ssh-0": _bid(versions["v1"]), "ssh-x": None}
    store = tmp_path / "r-ssh-x" / "store"
    leftovers = [p.name for p in store.iterdir()] if store.is_dir() else []
    assert all(len(n) == 64 for n in leftovers), leftovers  # only complete, id-named entries (if any)


def test_sshd_back_within_the_retry_window_finishes_the_device(versions, ssh_env, sshd, tmp_path):
    flaky = ssh_env.make("flaky-back")
    _fleet(tmp_path, ssh_env, sshd, flaky)
    watcher = _kill_when_reached(tmp_path / "edgeopt-results.db", flaky, back_after=0.5, step="push")
    p = _edgeopt("rollout", str(versions["v1"]), "--devices", "fleet.yaml", "--waves", "100%",
                 "--no-latency-gate", "--retries", "2", "--json", cwd=tmp_path)
    watcher.join(10)
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-1500:]
    out = _outcomes(p.stdout)
    assert out["ssh-x"]["status"] == "done" and out["ssh-x"]["attempts"] >= 2, out["ssh-x"]
    assert set(_current(tmp_path).values()) == {_bid(versions["v1"])}


def test_a_halt_after_first_installs_puts_devices_back_to_nothing(versions, ssh_env, sshd, tmp_path):
    """The wave's devices had no bundle before: rolled back, they run nothing (not a refused rollback)."""
    flaky = ssh_env.make("flaky-halt")
    _fleet(tmp_path, ssh_env, sshd, flaky)
    flaky.kill()  # ssh-x unreachable from the start: 1 failure exceeds --max-fail 0
    p = _edgeopt("rollout", str(versions["v1"]), "--devices", "fleet.yaml", "--waves", "100%", "--retries", "0",
                 "--no-latency-gate", "--json", cwd=tmp_path)
    assert p.returncode == 4, p.stdout[-1500:] + p.stderr[-1500:]  # halted on an unreachable device
    summary = json.loads(p.stdout.splitlines()[-1])
    assert summary["status"] == "halted" and summary["rolled_back"] == {"loc-0": None, "ssh-0": None}
    flaky.start()
    assert _current(tmp_path) == {"loc-0": None, "ssh-0": None, "ssh-x": None}


def test_a_device_whose_store_cannot_take_the_bundle_fails_alone(versions, tmp_path):
    """Its staging area is a file (a fault that holds even for root): that device fails at push; the
    rollout goes on for the others (was: an internal error that stopped the whole rollout)."""
    devs = {f"d{i}": {"transport": "local", "root": str(tmp_path / f"r{i}"), "target": "cpu"} for i in range(3)}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({"devices": devs}))
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / "staging").write_text("not a folder")
    p = _edgeopt("rollout", str(versions["v1"]), "--devices", "fleet.yaml", "--waves", "100%", "--max-fail", "1",
                 "--no-latency-gate", "--json", cwd=tmp_path)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stdout[-1500:] + p.stderr[-1500:]
    out = _outcomes(p.stdout)
    assert out["d1"]["status"] == "failed" and out["d1"]["step"] == "push", out["d1"]
    assert out["d0"]["status"] == out["d2"]["status"] == "done"
