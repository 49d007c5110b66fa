"""to_fp16 on a graph whose input feeds several nodes (ddddocr's detector: 4 unnamed Slices of ``images`` after prepare):
onnxconverter-common named two Casts alike and ONNX Runtime refused the FP16 ONNX."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

pytest.importorskip("onnxconverter_common")

from edgeopt.targets.tensorrt.prep import to_fp16  # noqa: E402


def test_fp16_of_input_with_several_consumers_loads_and_matches():
    ints = [helper.make_tensor(n, TensorProto.INT64, [1], [v])
            for n, v in (("a0", 0), ("a1", 2), ("b1", 4), ("ax", 1))]
    g = helper.make_graph(
        [helper.make_node("Slice", ["images", "a0", "a1", "ax"], ["s0"]),
         helper.make_node("Slice", ["images", "a1", "b1", "ax"], ["s1"]),
         helper.make_node("Add", ["s0", "s1"], ["output"], name="Add_1")],
        "g", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 4, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 2, 8])], ints)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    out, _ = to_fp16(model, [])
    names = [n.name for n in out.graph.node if n.name]
    assert len(names) == len(set(names))
    sess = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).normal(size=(1, 4, 8)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"images": x})[0], x[:, :2] + x[:, 2:4], rtol=2e-3, atol=2e-3)
