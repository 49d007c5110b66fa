"""``edgeopt debug --reduce`` on mobile (issue 41): with edgeopt's rewrites off, onnx2tf applies a multi-axis Slice's
bounds in ONNX axis order to its NHWC tensor; debug names the Slice through the TFLite tensor map and --reduce cuts
a subgraph of at most a few nodes that fails alone on mobile (reduced.onnx + inputs). 2-8 min (onnx2tf runs for the
model and each reduce step): slow."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytestmark = pytest.mark.slow
pytest.importorskip("onnx2tf")


def _model(path) -> None:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)

    def ints(n, v):
        return numpy_helper.from_array(np.array(v, np.int64), n)

    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Slice", ["c", "st", "en", "ax"], ["s"], name="slice"),
             helper.make_node("Sigmoid", ["s"], ["y"], name="sig")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 1])],
                          [numpy_helper.from_array(w, "w"), ints("st", [0, 0, 0, 0]), ints("en", [1, 4, 8, 1]),
                           ints("ax", [0, 1, 2, 3])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))


def test_mobile_reduce_cuts_the_slice_onnx2tf_gets_wrong(tmp_path, capsys):
    from edgeopt.cli import main

    _model(tmp_path / "sl.onnx")
    rc = main(["debug", str(tmp_path / "sl.onnx"), "-t", "mobile", "-p", "fp32", "--option", "onnx2tf_fixes=false",
               "--dist", str(tmp_path / "d"), "--reduce", str(tmp_path / "red"), "--json", "-q"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 5, doc.get("policy")
    assert doc["first_jump"]["node"] == "slice", doc["first_jump"]
    red = doc["reduced"]
    assert red["reproduced"] and "Slice" in red["ops"] and red["nodes"] <= 3, red
    assert (tmp_path / "red" / "reduced.onnx").is_file() and (tmp_path / "red" / "reduced_inputs.npz").is_file()
