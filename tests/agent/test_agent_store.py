"""The device's content-addressed store: install, has, activate, rollback, gc, list; tampering refused."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgeopt_agent import AGENT_VERSION
from tests.agent.conftest import agent


def _bundle_id(bundle: Path) -> str:
    return hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()


def _upload(bundle: Path, root: Path, name: str) -> Path:
    """What the host does over SFTP: copy the bundle's files into <root>/staging/<name>/."""
    dest = root / "staging" / name
    shutil.copytree(bundle, dest)
    return dest


def _store_entries(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "store").iterdir()) if (root / "store").is_dir() else []


def test_install_activate_rollback_gc_round_trip(tmp_path, tiny_bundle, ocr_cls_bundle):
    root = tmp_path / "root"
    a, b = _bundle_id(tiny_bundle), _bundle_id(ocr_cls_bundle)
    r = {"root": str(root)}

    rc, reply = agent("install", {**r, "staging": str(_upload(tiny_bundle, root, "up1")), "bundle_id": a})
    assert rc == 0 and reply["install"]["present"] is False and reply["install"]["path"] == str(root / "store" / a)
    assert not (root / "staging" / "up1").exists()
    assert (root / "store" / a / "model.onnx").stat().st_mode & 0o222 == 0  # installed content is read-only
    _upload(ocr_cls_bundle, root, "up2")
    rc, reply = agent("install", {**r, "staging": "staging/up2", "bundle_id": b})  # relative to the root
    assert rc == 0 and reply["install"]["model"] == "ch_ppocr_mobile_v2.0_cls_infer"
    # A redundant upload of an installed bundle is a no-op and is cleaned up.
    rc, reply = agent("install", {**r, "staging": str(_upload(tiny_bundle, root, "up3")), "bundle_id": a})
    assert reply["install"]["present"] is True and not (root / "staging" / "up3").exists()
    rc, reply = agent("has", {**r, "bundle_ids": [a, b, "f" * 64]})
    assert reply["has"] == {a: True, b: True, "f" * 64: False}
    rc, listed = agent("list", {**r, "bundle_ids": [a, b, "f" * 64]})  # list answers has in the same call
    assert rc == 0 and listed["has"] == reply["has"] and listed["free_mb"] and "list" in listed
    assert "has" not in agent("list", r)[1]
    rc, reply = agent("verify", {**r, "bundle_id": a})
    assert rc == 0 and reply["verify"]["ok"]

    slot = root / "slots" / "app" / "cpu"
    rc, reply = agent("activate", {**r, "bundle_id": a, "slot": "app/cpu"})
    assert reply["activate"] == {"slot": "app/cpu", "current": a, "previous": None, "history": [], "trial": None,
                                 "changed": True}
    assert (slot / "current").resolve() == (root / "store" / a).resolve() and not (slot / "previous").exists()
    rc, reply = agent("activate", {**r, "bundle_id": b, "slot": "app/cpu"})
    assert reply["activate"]["current"] == b and reply["activate"]["previous"] == a
    assert json.loads((slot / "current" / "manifest.json").read_text())["model"]["name"].startswith("ch_ppocr")
    assert (slot / "previous").resolve() == (root / "store" / a).resolve()
    rc, reply = agent("activate", {**r, "bundle_id": b, "slot": "app/cpu"})
    assert reply["activate"]["changed"] is False and reply["activate"]["previous"] == a

    rc, reply = agent("rollback", {**r, "slot": "app/cpu"})
    assert reply["rollback"] == {"slot": "app/cpu", "current": a, "previous": None, "history": [], "trial": None,
                                 "rolled_back": b}
    assert (slot / "current").resolve() == (root / "store" / a).resolve()
    rc, reply = agent("rollback", {**r, "slot": "app/cpu"})
    assert rc == 1 and reply["error"]["type"] == "StoreError" and "no previous version" in reply["error"]["message"]

    # b is referenced by no slot now, but was installed moments ago: the grace period keeps it.
    rc, reply = agent("gc", {**r, "keep": 3})
    assert reply["gc"]["removed"] == [] and sorted(reply["gc"]["kept"]) == sorted([a, b])
    rc, reply = agent("gc", {**r, "keep": 3, "grace_s": 0, "dry_run": True})
    assert reply["gc"]["removed"] == [b] and _store_entries(root) == sorted([a, b])
    rc, reply = agent("gc", {**r, "keep": 3, "grace_s": 0})
    assert reply["gc"]["removed"] == [b] and reply["gc"]["freed_mb"] > 0 and _store_entries(root) == [a]

    # Default slot from the manifest; keep=N keeps N previous versions besides the current one (keep=1:
    # the rollback target stays), keep=0 trims a slot's history, but a bundle current elsewhere stays.
    rc, reply = agent("activate", {**r, "bundle_id": a})
    assert reply["activate"]["slot"] == "tiny/cpu" and reply["activate"]["current"] == a
    agent("install", {**r, "staging": str(_upload(ocr_cls_bundle, root, "up4")), "bundle_id": b})
    rc, reply = agent("activate", {**r, "bundle_id": b, "slot": "app/cpu"})
    assert reply["activate"]["history"] == [a]
    rc, reply = agent("gc", {**r, "keep": 1, "grace_s": 0})
    assert reply["gc"]["removed"] == [] and reply["gc"]["keep"] == 1
    assert agent("list", r)[1]["list"]["slots"]["app/cpu"]["history"] == [a]
    rc, reply = agent("gc", {**r, "keep": 0, "grace_s": 0})
    assert reply["gc"]["removed"] == [] and _store_entries(root) == sorted([a, b])
    rc, reply = agent("list", r)
    assert reply["list"]["slots"] == {
        "app/cpu": {"current": b, "history": [], "trial": None, "reverted": None},
        "tiny/cpu": {"current": a, "history": [], "trial": None, "reverted": None}}
    assert sorted(x["bundle_id"] for x in reply["list"]["bundles"]) == sorted([a, b])

    # bench by id, from the store, as the host's fleet bench asks for it.
    rc, reply = agent("bench", {**r, "bundle_id": a, "options": {"duration_s": 0.05, "min_iters": 5}})
    assert rc == 0 and reply["bench"]["bundle_id"] == a and reply["bench"]["accuracy"]["passed"]


@pytest.mark.parametrize("tamper, problem", [
    ("flip", {"file": "model.onnx", "problem": "sha256 mismatch"}),
    ("extra", {"file": "evil.sh", "problem": "not in the manifest"}),
    ("truncate", {"file": "validation/reference.npz", "problem": "size"}),
    ("manifest", {"file": "manifest.json", "problem": "is not the bundle id"}),
])
def test_install_refuses_a_tampered_upload_and_leaves_nothing(tmp_path, tiny_bundle, tamper, problem):
    root = tmp_path / "root"
    bid = _bundle_id(tiny_bundle)
    up = _upload(tiny_bundle, root, "up")
    if tamper == "flip":
        data = bytearray((up / "model.onnx").read_bytes())
        data[-10] ^= 0x40
        (up / "model.onnx").write_bytes(bytes(data))
    elif tamper == "extra":
        (up / "evil.sh").write_text("rm -rf ~\n")
    elif tamper == "truncate":
        with open(up / "validation" / "reference.npz", "r+b") as f:
            f.truncate(10)
    else:
        m = json.loads((up / "manifest.json").read_text())
        m["precision"] = "int8"
        (up / "manifest.json").write_text(json.dumps(m))
    rc, reply = agent("install", {"root": str(root), "staging": str(up), "bundle_id": bid})
    assert rc == 1 and reply["error"]["type"] == "InstallRejected"
    (p,) = [p for p in reply["install"]["problems"] if p["file"] == problem["file"]]
    assert problem["problem"] in p["problem"]
    assert not up.exists() and _store_entries(root) == []
    assert agent("has", {"root": str(root), "bundle_ids": [bid]})[1]["has"] == {bid: False}


def test_install_refuses_staging_outside_the_staging_dir_and_touches_nothing(tmp_path, tiny_bundle):
    root = tmp_path / "root"
    bid = _bundle_id(tiny_bundle)
    outside = tmp_path / "elsewhere"
    shutil.copytree(tiny_bundle, outside)
    (root / "staging").mkdir(parents=True)
    for staging in [str(outside), "staging/../../elsewhere", str(root / "staging"), "staging/../store/x"]:
        rc, reply = agent("install", {"root": str(root), "staging": staging, "bundle_id": bid})
        assert rc == 1 and reply["error"]["type"] == "StoreError" and "not inside" in reply["error"]["message"]
    assert (outside / "manifest.json").is_file() and _store_entries(root) == []


@pytest.mark.parametrize("verb, request_, words", [
    ("install", {"staging": "staging/x", "bundle_id": "abc"}, "bad bundle id 'abc'"),
    ("has", {"bundle_ids": ["../../etc"]}, "bad bundle id"),
    ("activate", {"bundle_id": "0" * 64}, "not installed"),
    ("rollback", {"slot": "../../etc"}, "bad slot"),
    ("rollback", {"slot": "app/cpu"}, "never been activated"),
    ("gc", {"keep": -1}, "keep must be an integer >= 0"),
    ("bench", {"bundle_id": "0" * 64}, "not installed"),
])
def test_store_verbs_refuse_bad_requests_with_one_clear_error(tmp_path, verb, request_, words):
    rc, reply = agent(verb, {"root": str(tmp_path / "root"), **request_})
    assert rc == 1 and reply["error"]["type"] == "StoreError" and words in reply["error"]["message"]


def test_two_agents_installing_the_same_bundle_at_once_install_it_once(tmp_path, tiny_bundle):
    root = tmp_path / "root"
    bid = _bundle_id(tiny_bundle)
    procs = [subprocess.Popen([sys.executable, "-m", "edgeopt_agent", "install"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    for i in range(len(procs)):  # both uploads exist before either agent reads its request
        _upload(tiny_bundle, root, f"up{i}")
    for i, p in enumerate(procs):
        p.stdin.write(json.dumps({"root": str(root), "staging": f"staging/up{i}", "bundle_id": bid}))
        p.stdin.close()
    replies = [json.loads(p.stdout.read()) for p in procs]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    assert all(r["agent"] == AGENT_VERSION for r in replies)
    assert sorted(r["install"]["present"] for r in replies) == [False, True]
    assert _store_entries(root) == [bid] and list((root / "staging").iterdir()) == []


def test_two_long_model_names_with_one_prefix_get_two_slots():
    """Slot parts were cut at 128 characters: the second long name displaced the first (issue 38, 7)."""
    from edgeopt_agent.store import SLOT_PART_MAX, _slot_part, check_slot

    a, b = "m" * 150 + "-detector", "m" * 150 + "-classifier"
    sa, sb = _slot_part(a), _slot_part(b)
    assert sa != sb and len(sa) <= SLOT_PART_MAX and len(sb) <= SLOT_PART_MAX
    assert check_slot(f"{sa}/cpu") and sa == _slot_part(a)  # valid, and the same every time
    assert _slot_part("yolov8n") == "yolov8n" and _slot_part("x" * SLOT_PART_MAX) == "x" * SLOT_PART_MAX
