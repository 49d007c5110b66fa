"""mobile (onnx2tf + LiteRT) with a variable axis (issue 42): slow (an onnx2tf conversion, 20-240 s)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import edgeopt
from tests.conftest import fixture
from tests.shapes import data

pytestmark = pytest.mark.slow


def test_mobile_melspectrogram_keeps_the_padded_form_that_matches_fp32_at_each_length(tmp_path):
    pytest.importorskip("onnx2tf")
    mel = data.melspec(tmp_path / "mel.npz", count=24)
    rep = edgeopt.build(fixture("oww-melspec"), "mobile", precision="fp32", shape="input:1x4000..32000",
                        calib=str(mel), calib_count=8, val_count=16, dist=str(tmp_path / "dist"))
    r = rep.results[0]
    assert r.status == "built", r.error
    m = json.loads((Path(r.bundle) / "manifest.json").read_text())
    tried = {t["form"]: t for t in m["shape_form"]["tried"]}
    # onnx2tf fixes the graph at the top length: LiteRT cannot resize it (with or without XNNPACK)
    assert tried["dynamic"]["passed"] is False and tried["dynamic"].get("retry_error")
    assert m["shape_form"]["form"] == "static" and m["host_check"]["passed"]
    assert len({p["length"] for p in m["host_check"]["per_length"]}) >= 3
    assert all(p["ran_at"] == "input[1]=32000" for p in m["host_check"]["per_length"])
