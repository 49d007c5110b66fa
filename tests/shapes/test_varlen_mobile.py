"""mobile (onnx2tf + LiteRT) with a variable axis (issue 42): the build is slow (an onnx2tf conversion per form,
20-240 s); the IO matcher's rule for a dynamic axis is not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import edgeopt
from tests.conftest import fixture
from tests.shapes import data


def test_a_dynamic_axis_in_the_file_pairs_with_any_size():
    from edgeopt.targets.tflite import art_shape, candidate_perms, match_tensors

    assert candidate_perms([1, 32000], [1, -1]) == [[0, 1]]
    assert candidate_perms([1, 3, 48, 320], [1, 48, -1, 3]) == [[0, 2, 3, 1]]
    assert candidate_perms([1, 3, 48, 320], [1, 47, -1, 3]) == []  # a fixed dim still has to agree
    # LiteRT reports 1 on a dynamic axis until resized: the signature is what pairs
    art = {"name": "input", "shape": [1, 1], "shape_signature": [1, -1], "dtype": "float32"}
    assert art_shape({"name": "input", "shape": [1, 32000]}, art) == [1, -1]
    assert art_shape({}, {"shape": [1, 8], "shape_signature": [1, 8]}) == [1, 8]
    spec = {"name": "input", "shape": [1, 32000], "dtype": "float32", "variable": [{"axis": 1, "range": [1, 32000]}]}
    ((s, a, cands),) = match_tensors([spec], [art], "input", [])
    assert a is art and cands == [[0, 1]]


@pytest.mark.slow
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
