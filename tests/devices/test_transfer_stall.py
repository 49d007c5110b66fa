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


def test_a_frozen_upload_is_given_up_at_its_deadline(ssh_env, big_bundle, tmp_path):
    frozen = ssh_env.make("frozen")
    kh = known_hosts(tmp_path / "known_hosts", frozen)
    root = tmp_path / "root"
    write_inventory(tmp_path / "inv.yaml", {"dev": device_entry(ssh_env, frozen, root, kh, target="cpu",
                                                                transfer_stall_timeout=2)})
    stopped: list[int] = []

    def freeze_when_uploading() -> None:
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

    watcher = threading.Thread(target=freeze_when_uploading, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-m", "edgeopt", "push", "--dist", str(big_bundle.parent.parent),
                            "--devices", str(tmp_path / "inv.yaml")], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
        took = time.monotonic() - t0
    finally:
        watcher.join(5)
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        frozen.kill()
    assert stopped, "the upload finished before the freeze: the test did not test anything"
    out = p.stdout + p.stderr
    assert p.returncode == 4 and "made no progress for 2s" in out and "Traceback" not in out, out[-2000:]
    assert took < 40, f"gave up after {took:.0f}s"
    store = root / "store"
    leftovers = [e.name for e in store.iterdir()] if store.is_dir() else []
    assert all(len(n) == 64 for n in leftovers) and not any((store / n / "manifest.json").exists() is False
                                                           for n in leftovers), leftovers
