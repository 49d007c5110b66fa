"""verify: every file of a bundle against its manifest, all problems reported at once."""

from __future__ import annotations

import json
import shutil

from tests.agent.conftest import agent


def _copy(bundle, dest):
    shutil.copytree(bundle, dest)
    return dest


def test_verify_passes_an_intact_bundle(tiny_bundle):
    rc, reply = agent("verify", {"bundle": str(tiny_bundle)})
    assert rc == 0 and reply["verify"] == {"ok": True, "files": 3, "problems": []}


def test_verify_reports_a_flipped_byte_and_a_missing_file_together(tmp_path, tiny_bundle):
    b = _copy(tiny_bundle, tmp_path / "b")
    model = b / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size, one bit off
    model.write_bytes(bytes(data))
    (b / "validation" / "reference.npz").unlink()
    rc, reply = agent("verify", {"bundle": str(b)})
    assert rc == 1 and not reply["ok"] and reply["error"]["type"] == "VerifyFailed"
    assert sorted(reply["verify"]["problems"], key=lambda p: p["file"]) == [
        {"file": "model.onnx", "problem": "sha256 mismatch"},
        {"file": "validation/reference.npz", "problem": "missing"}]


def test_verify_refuses_a_manifest_path_escaping_the_bundle(tmp_path, tiny_bundle):
    b = _copy(tiny_bundle, tmp_path / "b")
    m = json.loads((b / "manifest.json").read_text())
    m["files"]["../outside.bin"] = {"sha256": "0" * 64, "size": 1}
    (b / "manifest.json").write_text(json.dumps(m))
    rc, reply = agent("verify", {"bundle": str(b)})
    assert rc == 1 and reply["error"]["type"] == "BundleError" and "unsafe path" in reply["error"]["message"]


def test_verify_of_a_missing_bundle_is_one_clear_error(tmp_path):
    rc, reply = agent("verify", {"bundle": str(tmp_path / "nope")})
    assert rc == 1 and reply["error"]["type"] == "BundleError" and "nope" in reply["error"]["message"]
    rc, reply = agent("verify", {})
    assert rc == 1 and reply["error"]["type"] == "StoreError" and "'bundle'" in reply["error"]["message"]


def test_bench_refuses_a_corrupted_bundle_before_running_it(tmp_path, tiny_bundle):
    b = _copy(tiny_bundle, tmp_path / "b")
    with open(b / "validation" / "inputs.npz", "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    rc, reply = agent("bench", {"bundle": str(b), "options": {"duration_s": 0.1}})
    assert rc == 1 and reply["error"]["type"] == "BundleError"
    assert "validation/inputs.npz: sha256 mismatch" in reply["error"]["message"]
