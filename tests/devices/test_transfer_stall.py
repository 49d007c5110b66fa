"""A device whose network freezes mid-upload: the SFTP transfer's progress deadline gives up within
seconds (TCP alone takes minutes), the push fails in one line, and nothing is half-installed.

The freeze is real: the sshd session processes serving the connection are SIGSTOPped while a 25 MB
bundle is being uploaded (the socket stays open, no byte moves), and SIGCONTed afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from tests.devices.conftest import device_entry, known_hosts, write_inventory


def _freeze_when_uploading(root, frozen, stopped: list[int]) -> None:
    """SIGSTOP the sshd session processes of ``frozen`` once an upload appears under ``root/staging``."""
    deadline = time.time() + 120
    while time.time() < deadline:
        staging = root / "staging"
        if staging.is_dir() and any(staging.iterdir()):
            for pid in frozen.descendants():
                try:
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
                except ProcessLookupError:
                    pass
            return
        time.sleep(0.01)


def _thaw(stopped: list[int]) -> None:
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_a_frozen_upload_is_given_up_at_its_deadline(ssh_env, big_bundle, tmp_path):
    frozen = ssh_env.make("frozen")
    kh = known_hosts(tmp_path / "known_hosts", frozen)
    root = tmp_path / "root"
    write_inventory(tmp_path / "inv.yaml", {"dev": device_entry(ssh_env, frozen, root, kh, target="cpu",
                                                                transfer_stall_timeout=2)})
    stopped: list[int] = []

    watcher = threading.Thread(target=_freeze_when_uploading, args=(root, frozen, stopped), daemon=True)
    watcher.start()
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "edgeopt", "push", "--dist", str(big_bundle.parent.parent),
                            "--devices", str(tmp_path / "inv.yaml")], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
        took = time.monotonic() - t0
    finally:
        watcher.join(5)
        _thaw(stopped)
        frozen.kill()
    assert stopped, "the upload finished before the freeze: the test did not test anything"
    out = p.stdout + p.stderr
    assert p.returncode == 4 and "made no progress for 2s" in out and "Traceback" not in out, out[-2000:]
    assert took < 40, f"gave up after {took:.0f}s"
    store = root / "store"
    leftovers = [e.name for e in store.iterdir()] if store.is_dir() else []
    assert all(len(n) == 64 for n in leftovers) and not any((store / n / "manifest.json").exists() is False
                                                           for n in leftovers), leftovers


def _ctrl_c_reaches_it() -> None:
    """The child's SIGINT as a terminal gives it: a suite started in the background (``nohup … &``: SIGINT
    ignored, inherited) would start the CLI with Ctrl-C ignored, and Python then raises no KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_frozen_upload_stops_at_once_and_prints_what_finished(ssh_env, big_bundle, tmp_path):
    """Ctrl-C while one device's upload is frozen: the push stops at once (every connection is closed, no
    upload waits for its stall deadline, here 300 s) and the device that had finished is reported."""
    healthy, frozen = ssh_env.make("ctrlc-ok"), ssh_env.make("ctrlc-frozen")
    kh = known_hosts(tmp_path / "known_hosts", healthy, frozen)
    ok_root, root = tmp_path / "root-ok", tmp_path / "root"
    write_inventory(tmp_path / "inv.yaml", {
        "fine": device_entry(ssh_env, healthy, ok_root, kh, target="cpu"),
        "stuck": device_entry(ssh_env, frozen, root, kh, target="cpu", transfer_stall_timeout=300)})
    stopped: list[int] = []

    watcher = threading.Thread(target=_freeze_when_uploading, args=(root, frozen, stopped), daemon=True)
    watcher.start()
    p = subprocess.Popen([sys.executable, "-m", "edgeopt", "push", "--dist", str(big_bundle.parent.parent),
                          "--devices", str(tmp_path / "inv.yaml")], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_reaches_it)
    try:
        watcher.join(130)
        assert stopped, "the upload finished before the freeze: the test did not test anything"
        deadline = time.time() + 240  # wait until the healthy device is done: its bundle installed and its
        while (not list((ok_root / "store").glob("*/manifest.json")) if (ok_root / "store").is_dir() else True) \
                or healthy.descendants():  # connection closed (the record is kept before it closes)
            assert time.time() < deadline and p.poll() is None, "the healthy device never finished"
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=150)  # far below the 300 s stall deadline it would otherwise wait for
    finally:
        _thaw(stopped)
        frozen.kill()
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and "interrupted" in err and "Traceback" not in err, err[-2000:]
    assert "made no progress" not in err  # it did not wait for the stall deadline
    assert "fine: done before the interrupt" in err and "installed" in err, err[-2000:]
    assert "stuck: interrupted" in err, err[-2000:]
    assert not (root / "store").is_dir() or not [e for e in (root / "store").iterdir() if len(e.name) == 64]


def test_ctrl_c_during_bench_stops_at_once_and_names_the_device_that_finished(ssh_env, big_bundle, tmp_path):
    """Ctrl-C during `bench` while one device's upload is frozen waited for the stall deadline and printed
    nothing, although the other device had finished (issue 38, 11): now it stops at once, names the device
    that finished (its record stored) and the one interrupted, exit 130."""
    healthy, frozen = ssh_env.make("bench-ok"), ssh_env.make("bench-frozen")
    kh = known_hosts(tmp_path / "known_hosts", healthy, frozen)
    ok_root, root = tmp_path / "root-ok", tmp_path / "root"
    write_inventory(tmp_path / "inv.yaml", {
        "fine": device_entry(ssh_env, healthy, ok_root, kh, target="cpu"),
        "stuck": device_entry(ssh_env, frozen, root, kh, target="cpu", transfer_stall_timeout=300)})
    stopped: list[int] = []

    watcher = threading.Thread(target=_freeze_when_uploading, args=(root, frozen, stopped), daemon=True)
    watcher.start()
    p = subprocess.Popen([sys.executable, "-m", "edgeopt", "bench", "--dist", str(big_bundle.parent.parent),
                          "--devices", str(tmp_path / "inv.yaml"), "--duration", "0.2", "--min-iters", "5",
                          "--db", str(tmp_path / "r.db")], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_reaches_it)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(p.stderr), daemon=True)
    reader.start()
    try:
        watcher.join(130)
        assert stopped, "the upload finished before the freeze: the test did not test anything"
        deadline = time.time() + 240  # until the healthy device has its figure
        while not any("fine: " in ln and " p50 " in ln for ln in list(lines)):
            assert time.time() < deadline and p.poll() is None, "the healthy device never finished: " + "".join(lines)
            time.sleep(0.05)
        time.sleep(0.5)  # its record is written right after the line
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        p.wait(timeout=150)  # far below the 300 s stall deadline it would otherwise wait for
        took = time.monotonic() - t0
        reader.join(10)
    finally:
        _thaw(stopped)
        frozen.kill()
        if p.poll() is None:
            p.kill()
    err = "".join(lines)
    assert p.returncode == 130 and "Traceback" not in err, err[-2000:]
    assert "made no progress" not in err and took < 60, (took, err[-2000:])
    assert "fine: done before the interrupt" in err and "ok" in err.split("fine: done before the interrupt")[1]
    assert "stuck: interrupted" in err, err[-2000:]
