"""A full disk on the device, for real: the agent root on a small tmpfs (mounted here as root; skipped where
mounting is not allowed). Too little space is refused before sending; a disk that fills up during the
transfer fails the push in one line and leaves no partial bundle in the store."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from tests.devices.conftest import device_entry, known_hosts, write_inventory


def _push(tmp_path, dist) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", "push", "--dist", str(dist), "--devices",
                           str(tmp_path / "inv.yaml")], cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_too_little_space_is_refused_before_sending(ssh_env, sshd, big_bundle, small_fs, tmp_path):
    root = small_fs(12)  # the 25 MB bundle cannot fit
    write_inventory(tmp_path / "inv.yaml", {"dev": device_entry(ssh_env, sshd, root / "edgeopt",
                                                                known_hosts(tmp_path / "kh", sshd), target="cpu")})
    p = _push(tmp_path, big_bundle.parent.parent)
    out = p.stdout + p.stderr
    assert p.returncode == 4 and "no space left on the device" in out and "Traceback" not in out, out[-1500:]
    assert "MB margin" in out, out[-1500:]  # the margin kept beyond the bytes is said, not hidden
    staging = root / "edgeopt" / "staging"
    assert not staging.exists() or not any(staging.iterdir())  # nothing was sent


def test_a_disk_that_fills_during_the_transfer_leaves_no_partial_bundle(ssh_env, sshd, big_bundle, small_fs,
                                                                      tmp_path):
    root = small_fs(60)  # room for the bundle until something else eats the disk mid-transfer
    write_inventory(tmp_path / "inv.yaml", {"dev": device_entry(ssh_env, sshd, root / "edgeopt",
                                                                known_hosts(tmp_path / "kh", sshd), target="cpu")})

    def fill_when_uploading() -> None:
        deadline = time.time() + 60
        while time.time() < deadline:
            staging = root / "edgeopt" / "staging"
            if staging.is_dir() and any(staging.iterdir()):
                with open(root / "hog", "wb") as f:  # another process fills the disk
                    try:
                        while True:
                            f.write(b"\0" * (1 << 20))
                    except OSError:
                        return
            time.sleep(0.005)

    hog = threading.Thread(target=fill_when_uploading, daemon=True)
    hog.start()
    p = _push(tmp_path, big_bundle.parent.parent)
    hog.join(10)
    out = p.stdout + p.stderr
    print(out[-700:])
    assert (root / "hog").exists(), "the disk was never filled: the test did not test anything"
    assert p.returncode == 4 and "Traceback" not in out, out[-1500:]
    store = root / "edgeopt" / "store"
    assert not store.exists() or not list(store.iterdir()), list(store.iterdir())


def test_a_read_only_filesystem_says_read_only(ssh_env, sshd, cls_bundle, small_fs, tmp_path):
    """A root whose filesystem went read-only (a board remounts / read-only after errors) is said to be
    read-only, not to have no space."""
    import json
    import shutil

    root = small_fs(40)
    write_inventory(tmp_path / "inv.yaml", {"dev": device_entry(ssh_env, sshd, root / "edgeopt",
                                                                known_hosts(tmp_path / "kh", sshd), target="cpu")})
    assert _push(tmp_path, cls_bundle).returncode == 0  # agent and a first bundle in place
    v2 = tmp_path / "v2"
    shutil.copytree(cls_bundle, v2)
    m = json.loads((v2 / "manifest.json").read_text())
    (v2 / "manifest.json").write_text(json.dumps({**m, "notes": [*(m.get("notes") or []), "v2"]}))
    r = subprocess.run(["mount", "-o", "remount,ro", str(root)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    p = _push(tmp_path, v2)
    out = p.stdout + p.stderr
    assert p.returncode == 4 and "is read-only" in out and "no space" not in out and "Traceback" not in out, out
