"""mobile INT8 (TFLite, int8_mode=auto) keeps a concatenation of differently-scaled tensors float
(issue 26, 1c): full-integer gives a CONCATENATION one scale (the converter requantizes every input to
it), so a YOLOv8-style head's 0..1 scores beside 0..1024 px coordinates round to 0; the search then
keeps that concatenation (and the moves on its inputs) float in a selective file instead."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import fixture
from tests.targets.test_mixed_concat import yolov8_head

needs_tflite = pytest.mark.skipif(importlib.util.find_spec("onnx2tf") is None
                                  or importlib.util.find_spec("tensorflow") is None,
                                  reason="onnx2tf/tensorflow not installed (pip install 'edgeopt[tflite]')")


@needs_tflite
def test_mobile_int8_keeps_the_mixed_scale_concat_float_and_the_scores_survive(tmp_path):
    from edgeopt.pipeline import build
    from edgeopt_agent.bundle import load_manifest
    from edgeopt_agent.check import run_validation
    from edgeopt_agent.runners import get_runner

    yolov8_head(tmp_path / "head.onnx")
    r = build(str(tmp_path / "head.onnx"), "mobile", ["int8"], calib=str(fixture("images")),
              preprocess="preset=unit", out=tmp_path / "dist", force=True, jobs=1).results[0]
    assert r.ok, r.error
    info = r.manifest["options"]["int8"]
    assert info["chosen"] == "selective", info["attempts"]  # not dynamic-range: the rest stays int8
    mixed = info["mixed_scale_concats"]
    assert len(mixed) == 1 and mixed[0]["ratio"] > 100
    assert mixed[0]["tensor"] in info["float_layers"] or any(n in info["float_layers"] for n in mixed[0]["denylist"])
    assert any(n.startswith("placement rule: a CONCATENATION whose inputs' scales differ") for n in r.manifest["notes"])
    bundle = Path(r.bundle)
    manifest = load_manifest(bundle)
    runner = get_runner("tflite")(bundle, manifest, {})
    runner.load()
    got = run_validation(runner, manifest, bundle)["output0"]
    ref = np.load(bundle / "validation" / "reference.npz")["out0"]
    assert ref[:, :, 4:].max() > 0.5
    assert np.abs(got[:, :, 4:] - ref[:, :, 4:]).max() < 0.05  # full-integer: every score 0.0
