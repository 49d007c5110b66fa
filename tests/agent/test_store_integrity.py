"""A store entry *is* its id; every path the agent opens is listed and verified; repair never leaves a
slot dangling; gc never removes what a slot refers to; trial activations revert by themselves."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import pytest

from tests.agent.conftest import agent


def _bid(bundle: Path) -> str:
    return hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()


def _install(bundle: Path, root: Path, name: str, replace: bool = False) -> dict:
    dest = root / "staging" / name
    shutil.copytree(bundle, dest)
    rc, reply = agent("install", {"root": str(root), "staging": str(dest), "bundle_id": _bid(bundle),
                                  "replace": replace})
    assert rc == 0, reply
    return reply["install"]


def _edit_manifest(entry: Path, **changes) -> None:
    path = entry / "manifest.json"
    m = json.loads(path.read_text())
    m.update(changes)
    os.chmod(path, 0o644)
    path.write_text(json.dumps(m))


def test_an_edited_manifest_is_not_the_installed_bundle(tmp_path, tiny_bundle):
    root, bid = tmp_path / "root", _bid(tiny_bundle)
    _install(tiny_bundle, root, "u1")
    entry = root / "store" / bid
    _edit_manifest(entry, precision="fp16")  # looser tolerances, same id: what issue 9 found accepted
    r = {"root": str(root), "bundle_id": bid}

    rc, reply = agent("has", {"root": str(root), "bundle_ids": [bid]})
    assert reply["has"] == {bid: False}  # so a push re-sends it
    rc, reply = agent("verify", r)
    assert rc == 1 and not reply["ok"] and "manifest.json changed after install" in reply["error"]["message"]
    rc, reply = agent("bench", {**r, "options": {"iterations": 3, "warmup": 1}})
    assert rc == 1 and "is not that bundle" in reply["error"]["message"]
    rc, reply = agent("activate", r)
    assert rc == 1 and "not installed" in reply["error"]["message"]

    # a re-install replaces the edited entry (issue 9 item 8: a broken folder never blocks the id)
    res = _install(tiny_bundle, root, "u2")
    assert res["present"] is False and res["repaired"].startswith("manifest.json changed")
    rc, reply = agent("verify", r)
    assert rc == 0 and reply["verify"]["ok"]


def test_a_store_folder_without_manifest_never_blocks_a_reinstall(tmp_path, tiny_bundle):
    root, bid = tmp_path / "root", _bid(tiny_bundle)
    (root / "store" / bid).mkdir(parents=True)
    (root / "store" / bid / "leftover.bin").write_bytes(b"x")
    res = _install(tiny_bundle, root, "u1")
    assert res["repaired"] == "no manifest.json"
    assert agent("verify", {"root": str(root), "bundle_id": bid})[0] == 0


def test_the_runtime_artifact_must_be_a_listed_file_of_the_bundle(tmp_path, tiny_bundle):
    outside = tmp_path / "outside.onnx"
    shutil.copy(tiny_bundle / json.loads((tiny_bundle / "manifest.json").read_text())["runtime"]["artifact"], outside)
    bad = tmp_path / "bad"
    shutil.copytree(tiny_bundle, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["runtime"]["artifact"] = str(outside)  # absolute, outside the bundle, covered by no sha256
    (bad / "manifest.json").write_text(json.dumps(m))
    rc, reply = agent("check", {"bundle": str(bad)})
    assert rc == 1 and "unsafe path" in reply["error"]["message"]
    m["runtime"]["artifact"] = "validation/../../outside.onnx"
    (bad / "manifest.json").write_text(json.dumps(m))
    assert "unsafe path" in agent("check", {"bundle": str(bad)})[1]["error"]["message"]
    m["runtime"]["artifact"] = "unlisted.onnx"  # inside, but not in `files`
    shutil.copy(outside, bad / "unlisted.onnx")
    (bad / "manifest.json").write_text(json.dumps(m))
    rc, reply = agent("check", {"bundle": str(bad)})
    assert rc == 1 and "not one of the bundle's listed files" in reply["error"]["message"]
    root = tmp_path / "root"  # and the store refuses such an upload
    shutil.copytree(bad, root / "staging" / "u")
    rc, reply = agent("install", {"root": str(root), "staging": str(root / "staging" / "u"),
                                  "bundle_id": _bid(bad)})
    assert rc == 1 and not (root / "store" / _bid(bad)).exists()


def test_repair_of_a_current_bundle_swaps_in_the_good_copy(tmp_path, tiny_bundle):
    root, bid = tmp_path / "root", _bid(tiny_bundle)
    _install(tiny_bundle, root, "u1")
    assert agent("activate", {"root": str(root), "bundle_id": bid, "slot": "m/cpu"})[0] == 0
    art = root / "store" / bid / json.loads((tiny_bundle / "manifest.json").read_text())["runtime"]["artifact"]
    os.chmod(art, 0o644)
    art.write_bytes(art.read_bytes()[:-10])  # corrupted on the device
    assert not agent("verify", {"root": str(root), "bundle_id": bid})[1]["ok"]
    # a plain re-install of a present id is a no-op; the repair (push --verify) asks to replace
    assert _install(tiny_bundle, root, "u2")["present"] is True
    res = _install(tiny_bundle, root, "u3", replace=True)
    assert res["repaired"] == "files failed verification"
    assert agent("verify", {"root": str(root), "bundle_id": bid})[0] == 0
    assert os.readlink(root / "slots" / "m" / "cpu" / "current").endswith(bid)
    assert not [p for p in (root / "store").iterdir() if p.name.startswith((".trash", ".incoming"))]


def test_gc_never_removes_a_bundle_a_slot_refers_to(tmp_path, tiny_bundle, ocr_cls_bundle):
    root = tmp_path / "root"
    a, b = _bid(tiny_bundle), _bid(ocr_cls_bundle)
    _install(tiny_bundle, root, "u1")
    _install(ocr_cls_bundle, root, "u2")
    r = {"root": str(root), "slot": "m/cpu"}
    agent("activate", {**r, "bundle_id": a})
    agent("activate", {**r, "bundle_id": b, "confirm_within_s": 600})  # a trial: a is its way back
    rc, reply = agent("gc", {"root": str(root), "keep": 1, "grace_s": 0})
    assert rc == 0 and reply["gc"]["removed"] == [] and sorted(reply["gc"]["kept"]) == sorted([a, b])


def test_a_trial_is_reverted_at_the_next_agent_call_after_its_deadline(tmp_path, tiny_bundle, ocr_cls_bundle):
    root = tmp_path / "root"
    a, b = _bid(tiny_bundle), _bid(ocr_cls_bundle)
    _install(tiny_bundle, root, "u1")
    _install(ocr_cls_bundle, root, "u2")
    r = {"root": str(root), "slot": "m/cpu"}
    agent("activate", {**r, "bundle_id": a})
    rc, reply = agent("activate", {**r, "bundle_id": b, "confirm_within_s": 0.3})
    assert rc == 0 and reply["activate"]["trial"]["previous"] == a and reply["activate"]["current"] == b
    time.sleep(0.5)
    rc, reply = agent("list", {"root": str(root)})  # any call reverts it first (or the watchdog did)
    slot = reply["list"]["slots"]["m/cpu"]
    assert slot["current"] == a and slot["trial"] is None and slot["reverted"]["bundle_id"] == b
    rc, reply = agent("commit", {**r, "bundle_id": b})  # too late: said plainly
    assert rc == 1 and "expired and was reverted" in reply["error"]["message"]


def test_the_watchdog_reverts_a_trial_with_no_agent_call_and_a_commit_keeps_it(tmp_path, tiny_bundle,
                                                                                ocr_cls_bundle):
    root = tmp_path / "root"
    a, b = _bid(tiny_bundle), _bid(ocr_cls_bundle)
    _install(tiny_bundle, root, "u1")
    _install(ocr_cls_bundle, root, "u2")
    r = {"root": str(root), "slot": "m/cpu"}
    agent("activate", {**r, "bundle_id": a})
    rc, reply = agent("activate", {**r, "bundle_id": b, "confirm_within_s": 1.0})
    pid = reply["activate"]["watchdog"]["pid"]
    assert pid  # detached: the agent call (the "host") has returned already
    state = root / "slots" / "m" / "cpu" / "state.json"
    deadline = time.time() + 15
    while json.loads(state.read_text())["current"] != a and time.time() < deadline:
        time.sleep(0.1)
    assert json.loads(state.read_text())["current"] == a  # reverted with no agent call at all
    for _ in range(50):  # and the watchdog is gone: no daemon left
        try:
            os.kill(pid, 0)
            os.waitpid(pid, os.WNOHANG)
        except (ProcessLookupError, ChildProcessError):
            break
        time.sleep(0.1)
    assert not list(root.glob(".watchdog-*.json"))

    rc, reply = agent("activate", {**r, "bundle_id": b, "confirm_within_s": 1.0})
    rc, reply = agent("commit", {**r, "bundle_id": b})
    assert rc == 0 and reply["commit"]["committed"] is True
    time.sleep(1.5)
    assert agent("list", {"root": str(root)})[1]["list"]["slots"]["m/cpu"]["current"] == b


def test_an_interrupted_upload_is_swept_by_the_next_install_and_has_reports_free_space(tmp_path, tiny_bundle):
    root = tmp_path / "root"
    old = root / "staging" / "dead.upload"
    (old / "validation").mkdir(parents=True)
    (old / "validation" / "part.bin").write_bytes(b"\0" * 4096)  # what a cut connection leaves
    past = time.time() - 3600
    for p in (old / "validation" / "part.bin", old / "validation", old):
        os.utime(p, (past, past))
    fresh = root / "staging" / "in.progress"
    fresh.mkdir()
    res = _install(tiny_bundle, root, "u1")
    assert res["staging_swept"] == ["dead.upload"] and not old.exists() and fresh.exists()
    rc, reply = agent("has", {"root": str(root), "bundle_ids": []})
    st = os.statvfs(root)
    assert abs(reply["free_mb"] - st.f_bavail * st.f_frsize / (1 << 20)) < 64
    assert (root.stat().st_mode & 0o777) == 0o700 and ((root / "store").stat().st_mode & 0o777) == 0o700


@pytest.mark.parametrize("how, word", [
    ("symlink", "symlink"), ("hard link", "hard link"), ("symlinked folder", "symlink"), ("fifo", "not a plain file"),
])
def test_a_rejected_install_changes_nothing_outside_the_root(tmp_path, tiny_bundle, how, word):
    """The upload is inspected (lstat, nothing followed) before anything is renamed or made read-only: a link
    to a private file outside the root leaves that file as it was (it used to become 0444, world-readable)."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret.txt"
    secret.write_text("another user's private file")
    twin = outside / "model.onnx"  # identical bytes: a hard link to it even passes the sha256 check
    shutil.copyfile(tiny_bundle / "model.onnx", twin)
    for p in (secret, twin):
        os.chmod(p, 0o640)
    up = root / "staging" / "u1"
    shutil.copytree(tiny_bundle, up)
    if how == "symlink":
        (up / "extra.txt").symlink_to(secret)
    elif how == "hard link":
        (up / "model.onnx").unlink()
        os.link(twin, up / "model.onnx")
    elif how == "symlinked folder":
        (up / "more").symlink_to(outside, target_is_directory=True)
    else:
        os.mkfifo(up / "pipe")
    bid = _bid(tiny_bundle)
    rc, reply = agent("install", {"root": str(root), "staging": str(up), "bundle_id": bid})
    assert rc == 1 and reply["error"]["type"] == "InstallRejected" and word in reply["error"]["message"], reply
    assert [(p.name, p.stat().st_mode & 0o7777, p.stat().st_nlink) for p in sorted(outside.iterdir())] == \
        [("model.onnx", 0o640, 1), ("secret.txt", 0o640, 1)]
    assert secret.read_text() == "another user's private file"
    assert not up.exists() and not (root / "store" / bid).exists()
    assert not (root / "store").exists() or not any((root / "store").iterdir())


def test_verify_refuses_a_store_file_swapped_for_a_link_and_slot_folders_are_private(tmp_path, tiny_bundle):
    root, bid = tmp_path / "root", _bid(tiny_bundle)
    _install(tiny_bundle, root, "u1")
    agent("activate", {"root": str(root), "bundle_id": bid, "slot": "m/cpu"})
    assert [(root / "slots" / p).stat().st_mode & 0o777 for p in ("", "m", "m/cpu")] == [0o700] * 3
    twin = tmp_path / "elsewhere.onnx"  # identical bytes outside the store: sha256 alone would pass it
    shutil.copyfile(tiny_bundle / "model.onnx", twin)
    entry = root / "store" / bid
    os.chmod(entry, 0o755)
    (entry / "model.onnx").unlink()
    (entry / "model.onnx").symlink_to(twin)
    rc, reply = agent("verify", {"root": str(root), "bundle_id": bid})
    assert rc == 1 and not reply["verify"]["ok"]
    assert {"file": "model.onnx", "problem": "symlink (a bundle holds plain files only)"} in reply["verify"]["problems"]


def test_gc_keeps_a_bundle_a_bench_is_running_and_an_upload_still_being_written(tmp_path, tiny_bundle,
                                                                               ocr_cls_bundle):
    """gc against work in progress: a bench holds a lease on its bundle (rolled back by someone else, then
    `gc --keep 0` while it runs: it used to fail with FileNotFoundError), and an upload is aged by its newest
    file, not by its folder's mtime (a single long file, or a device clock stepped forward mid-upload)."""
    import signal
    import subprocess
    import sys

    root = tmp_path / "root"
    a, b = _bid(tiny_bundle), _bid(ocr_cls_bundle)
    _install(tiny_bundle, root, "u1")
    _install(ocr_cls_bundle, root, "u2")
    r = {"root": str(root), "slot": "m/cpu"}
    agent("activate", {**r, "bundle_id": a})
    agent("activate", {**r, "bundle_id": b})
    agent("rollback", r)  # b is referenced by nothing now
    bench = subprocess.Popen([sys.executable, "-m", "edgeopt_agent", "bench"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    bench.stdin.write(json.dumps({"root": str(root), "bundle_id": b,
                                  "options": {"duration_s": 0.2, "min_iters": 5, "warmup": 1}}))
    bench.stdin.close()
    deadline = time.time() + 120
    while not list((root / "leases").glob("*.json")) if (root / "leases").is_dir() else True:
        assert time.time() < deadline and bench.poll() is None, "the bench never took its lease"
        time.sleep(0.01)
    os.kill(bench.pid, signal.SIGSTOP)  # the bench is in flight, whatever the machine's load
    try:
        rc, reply = agent("gc", {"root": str(root), "keep": 0, "grace_s": 0})
        assert rc == 0 and b not in reply["gc"]["removed"] and b in reply["gc"]["kept"], reply
    finally:
        os.kill(bench.pid, signal.SIGCONT)
    out = json.loads(bench.stdout.read())
    assert bench.wait(60) == 0 and out["ok"] and out["bench"]["iterations"] >= 5, out.get("error")
    assert not list((root / "leases").glob("*.json"))  # released
    rc, reply = agent("gc", {"root": str(root), "keep": 0, "grace_s": 0})
    assert reply["gc"]["removed"] == [b]  # nothing holds it any more

    up = root / "staging" / "slow.upload"
    up.mkdir(parents=True)
    (up / "model.onnx").write_bytes(b"\0" * 4096)  # still being written: its own mtime is now
    past = time.time() - 7200  # the folder looks 2 h old (a clock stepped forward after it was made)
    os.utime(up, (past, past))
    rc, reply = agent("gc", {"root": str(root), "grace_s": 3600})
    assert reply["gc"]["staging_removed"] == [] and up.exists()
    os.utime(up / "model.onnx", (past, past))  # nothing written for 2 h: an interrupted upload
    rc, reply = agent("gc", {"root": str(root), "grace_s": 3600})
    assert reply["gc"]["staging_removed"] == ["slow.upload"] and not up.exists()


def test_an_upload_a_process_still_writes_is_refused_not_installed(tmp_path, tiny_bundle):
    """A writer that still holds a staging file open (a stale upload) could change its bytes after install
    hashed them (the entry would then fail verify): the install refuses such an upload instead."""
    root, bid = tmp_path / "root", _bid(tiny_bundle)
    up = root / "staging" / "u1"
    shutil.copytree(tiny_bundle, up)
    with open(up / "model.onnx", "r+b") as writer:  # this test process plays the writer
        rc, reply = agent("install", {"root": str(root), "staging": str(up), "bundle_id": bid})
        assert rc == 1 and reply["error"]["type"] == "InstallRejected", reply
        assert f"still open for writing by process {os.getpid()}" in reply["error"]["message"]
        assert not (root / "store" / bid).exists()
        writer.write(b"late bytes")  # what it would have done to an installed bundle
    res = _install(tiny_bundle, root, "u2")  # a clean upload installs
    assert res["present"] is False and agent("verify", {"root": str(root), "bundle_id": bid})[0] == 0
    root2 = tmp_path / "root2"
    up = root2 / "staging" / "u1"
    shutil.copytree(tiny_bundle, up)
    with open(up / "model.onnx", "rb"):  # a reader holds nothing up
        rc, reply = agent("install", {"root": str(root2), "staging": str(up), "bundle_id": bid})
        assert rc == 0 and reply["install"]["present"] is False, reply


def test_gc_never_takes_an_upload_a_process_holds_open_whatever_its_times(tmp_path):
    """A clock step made an upload *file* look old too: gc deleted what the SFTP server still held open and the
    push blamed the disk (issue 38, 8).  An open descriptor (checked in /proc) keeps the upload."""
    root = tmp_path / "root"
    up = root / "staging" / "held.upload"
    up.mkdir(parents=True)
    past = time.time() - 7200
    with open(up / "model.onnx", "wb") as f:  # this test process plays the SFTP server
        f.write(b"\0" * 4096)
        f.flush()
        for p in (up / "model.onnx", up):
            os.utime(p, (past, past))
        rc, reply = agent("gc", {"root": str(root), "grace_s": 3600})
        assert rc == 0 and reply["gc"]["staging_removed"] == [] and up.exists(), reply
    rc, reply = agent("gc", {"root": str(root), "grace_s": 3600})  # closed, still 2 h old: interrupted
    assert reply["gc"]["staging_removed"] == ["held.upload"] and not up.exists()


def test_a_shared_writable_mapping_of_an_upload_is_refused_not_installed(tmp_path, tiny_bundle):
    """A writer through a shared mmap whose descriptor was closed before install could change bytes while
    install hashed them (issue 38, 12): /proc/PID/maps shows the mapping, and the install refuses."""
    import mmap

    root, bid = tmp_path / "root", _bid(tiny_bundle)
    up = root / "staging" / "u1"
    shutil.copytree(tiny_bundle, up)
    with open(up / "model.onnx", "r+b") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_WRITE)  # MAP_SHARED, writable
    try:  # the descriptor is closed; the mapping stays
        rc, reply = agent("install", {"root": str(root), "staging": str(up), "bundle_id": bid})
        assert rc == 1 and reply["error"]["type"] == "InstallRejected", reply
        assert f"mapped shared and writable by process {os.getpid()}" in reply["error"]["message"]
        assert not (root / "store" / bid).exists()
    finally:
        m.close()
    res = _install(tiny_bundle, root, "u2")
    assert res["present"] is False and agent("verify", {"root": str(root), "bundle_id": bid})[0] == 0
