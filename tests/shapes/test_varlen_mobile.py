"""mobile (onnx2tf + LiteRT) with a variable axis (issue 42): slow (an onnx2tf conversion per form, 20-240 s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import edgeopt
from tests.conftest import fixture
from tests.shapes import data

pytestmark = pytest.mark.slow


def test_mobile_melspectrogram_one_file_resized_at_load_matches_fp32_at_each_length(tmp_path):
    pytest.importorskip("onnx2tf")
    mel = data.melspec(tmp_path / "mel.npz", count=24)
    rep = edgeopt.build(fixture("oww-melspec"), "mobile", precision="fp32", shape="input:1x4000..32000",
                        calib=str(mel), calib_count=8, val_count=16, dist=str(tmp_path / "dist"),
                        option=["shape_form=dynamic"])
    r = rep.results[0]
    assert r.status == "built", r.error
    m = json.loads((Path(r.bundle) / "manifest.json").read_text())
    assert m["shape_form"]["form"] == "dynamic" and m["host_check"]["passed"]
    per = m["host_check"]["per_length"]
    assert len({p["length"] for p in per}) >= 3
    assert all(p["ran_at"] == p["length"] for p in per)  # each sample at its own length: nothing padded
    assert min(p["cosine"] for p in per) > 0.9999
    # one file whose variable axis stays -1 through to its outputs (onnx2tf given shape_hints)
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_path=str(Path(r.bundle) / m["runtime"]["artifact"]))
    assert list(it.get_input_details()[0]["shape_signature"]) == [1, -1]
    assert -1 in list(it.get_output_details()[0]["shape_signature"])
