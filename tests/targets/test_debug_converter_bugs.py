"""`edgeopt debug` names the ONNX node behind real converter mistakes (issue 30, "Must show"), each run through
the command line (``edgeopt debug MODEL --target T ... --json``) on the real runtime:

- openwakeword's melspectrogram on ``mobile`` fp16 with ``--option onnx2tf_fixes=false``: TFLite's float16 file
  stores the Clip bound FLT_MAX ("no bound") as 65504, a real bound, and the mel power (~1e8) is capped there;
  the first jump is that Clip, its input still equal to ONNX's (``targets/tflite/onnx_fixes.py``);
- magika on ``mobile`` with the fixes off: onnx2tf applies the multi-axis Slice's bounds in ONNX axis order to
  its NHWC tensor and keeps 1 of 512 channels: the first jump is ``Conv_0/strided_slice_2`` (a tensor of the
  wrong shape), not the einsum whose fused bias-add kernel carries the next node's value;
- an INT8 model whose refusal comes from one sensitive layer (``outlier_net``: conv2 reads a channel ~300x
  the others through one per-tensor scale), on ``cpu`` (ONNX Runtime QDQ) and ``intel-cpu`` (NNCF IR): the
  search is refused and debug names conv2 -- not conv1, whose INT8 output is within the int8 bound.

Mobile conversions take minutes on 2 cores (melspectrogram 100 s, magika 380 s measured here at load ~2): both
are ``slow`` (magika also needs ``magika==1.0.3``, requirements/bench-unseen.txt); the normal suite's mobile
debug case is the planted fault of test_debug_mobile_names.py. The INT8 pair runs in ~45 s.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgeopt.cli import main
from tests.conftest import fixture

PREFIX = "jax2tf_get_logits_/pjit_get_logits_/MagikaV2/"


def _debug(capsys, *argv: str) -> tuple[int, dict]:
    rc = main(["debug", *argv, "--json", "-q"])
    out = capsys.readouterr().out
    return rc, json.loads(out, parse_constant=lambda c: pytest.fail(f"bare {c} in --json"))


def _earlier_failures(doc: dict) -> list[str]:
    j = doc["first_jump"]["index"]
    return [r["node"] for r in doc["nodes"] if r["index"] < j and r.get("status") == "FAIL"]


@pytest.mark.slow
def test_mobile_fp16_melspectrogram_clip_at_65504_is_the_first_jump(tmp_path, capsys):
    pytest.importorskip("onnx2tf")
    from edgeopt.layerdiff import TfliteBundle
    from edgeopt_agent.bundle import load_manifest, validation_inputs
    from tests.targets.test_tflite import MEL_SAMPLES, oww_data

    mel_npz, _ = oww_data(tmp_path)
    model = fixture("oww-melspec")
    rc, doc = _debug(capsys, str(model), "--target", "mobile", "--precision", "fp16", "--option",
                     "onnx2tf_fixes=false", "--shape", f"input:1x{MEL_SAMPLES}", "--calib", str(mel_npz),
                     "--dist", str(tmp_path / "dist"))
    assert rc == 5, doc
    jump = doc["first_jump"]
    assert jump["node"] == "Clip_16" and jump["op"] == "Clip", jump
    assert jump["input_rel_l2"] < 1e-3  # what the Clip reads is still ONNX's: the Clip itself departs
    assert not _earlier_failures(doc)
    assert "tf.clip_by_value" in jump["artifact_node"]
    # the STFT convs (TF conv1d: [1, 1, T, C] against ONNX's [1, C, T]) and the power are compared, and equal
    ok = {r["node"] for r in doc["nodes"] if r.get("status") == "ok"}
    assert {"Conv_2", "Conv_3", "MatMul_15"} <= ok

    # the artifact's Clip output really stops at float16's largest value where ONNX's power goes on
    bundle = tmp_path / "dist" / "melspectrogram" / "mobile-fp16"
    manifest = load_manifest(bundle)
    src = TfliteBundle(bundle, manifest, [jump["tensor"]])
    feeds = validation_inputs(bundle, manifest)[:2]
    capped = src.run([jump["tensor"]], feeds)[jump["tensor"]]
    assert float(capped.max()) == pytest.approx(65504.0, rel=1e-3)


@pytest.mark.slow
def test_mobile_magika_multi_axis_slice_is_the_first_jump(tmp_path, capsys):
    pytest.importorskip("onnx2tf")
    from edgeopt.fixtures import package_dir

    base = package_dir("magika")
    if base is None or not (base / "models/standard_v3_3/model.onnx").is_file():
        pytest.skip("magika's model needs `pip install --no-deps magika==1.0.3` (requirements/fixtures.txt; install.sh installs it)")
    model = base / "models/standard_v3_3/model.onnx"
    # real bytes: the first and last KiB of real files, padded with 256 as magika does
    files = sorted(p for p in (base.parent / "numpy").rglob("*.py") if p.stat().st_size > 2048)[:12]
    rows = []
    for p in files:
        b = p.read_bytes()
        rows.append((list(b[:1024].strip()) + [256] * 1024)[:1024] + ([256] * 1024 + list(b[-1024:].strip()))[-1024:])
    np.savez(tmp_path / "bytes.npz", bytes=np.asarray(rows, np.int32)[:, None, :])

    rc, doc = _debug(capsys, str(model), "--target", "mobile", "--precision", "fp32", "--option",
                     "onnx2tf_fixes=false", "--shape", "bytes:1x2048", "--calib", str(tmp_path / "bytes.npz"),
                     "--dist", str(tmp_path / "dist"))
    assert rc == 5, doc
    jump = doc["first_jump"]
    assert jump["node"] == PREFIX + "Conv_0/strided_slice_2" and jump["op"] == "Slice", jump
    assert any("shape" in r and "!= ONNX" in r for r in jump["reasons"]), jump["reasons"]
    assert not _earlier_failures(doc)
    ok = {r["node"] for r in doc["nodes"] if r.get("status") == "ok"}
    assert {PREFIX + "Conv_0/Conv2D", PREFIX + "Dense_0/AddV2"} <= ok  # the Conv before it is right
    # the einsum's TFLite tensor is a FULLY_CONNECTED fused with its bias: it carries the Add's value
    einsum = next(r for r in doc["nodes"] if r["node"] == PREFIX + "Dense_0/einsum/Einsum")
    assert einsum["status"] == "not observed"


@pytest.mark.parametrize("target, options", [
    ("cpu", ["int8_budget_s=0.5"]),
    ("intel-cpu", ["int8_budget_s=0.5", "int8_accuracy_control=false"]),
])
def test_int8_refusal_from_one_sensitive_layer_names_that_layer(target, options, tmp_path, capsys):
    """A budget that leaves the search no time for its float fallback: the build is refused (kept for debug
    under --allow-mismatch) and the layer that breaks it is named at the int8 bound; conv1 before it is fine."""
    if target == "intel-cpu":
        pytest.importorskip("nncf")
    from edgeopt import api
    from tests.targets.test_qdq_search import outlier_net

    outlier_net(tmp_path / "o.onnx")
    rep = api.build(str(tmp_path / "o.onnx"), target, precision="int8", dist=str(tmp_path / "refused"),
                    options=options, raise_on_failure=False, progress=lambda s: None)
    res = rep.results[0]
    assert res.status in ("failed", "check-failed") and "edgeopt debug" in (res.error or ""), (res.status, res.error)

    argv = [str(tmp_path / "o.onnx"), "--target", target, "--precision", "int8", "--dist", str(tmp_path / "dbg"),
            "--force"]
    for o in options:
        argv += ["--option", o]
    rc, doc = _debug(capsys, *argv)
    assert rc == 5, doc
    assert doc["bound"] == {"rel_l2_max": 0.25, "cosine_min": 0.97}  # the int8 bound, no override
    jump = doc["first_jump"]
    assert "conv2" in [jump["node"], *jump.get("covers", [])] or jump.get("artifact_node") == "conv2", jump
    assert not _earlier_failures(doc)
    conv1_side = [r for r in doc["nodes"] if r["node"] in ("conv1", "relu1") and r.get("status") == "ok"]
    assert conv1_side and all(r["rel_l2"] < 0.05 for r in conv1_side)
    if target == "intel-cpu":  # the runtime graph says the layer really ran quantized
        assert jump.get("runtime_precision") in ("u8", "i8"), jump
