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


def test_fp16_of_an_initializer_shared_by_a_kept_fp32_node_and_an_fp16_one_loads_and_matches():
    """openwakeword's melspectrogram: two Clips share their max; the first is kept FP32 (its input
    overflows FP16), and the FP16 ONNX bound the second Clip's T to float16 and float."""
    consts = [helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]),
              helper.make_tensor("hi", TensorProto.FLOAT, [], [1e10]),
              helper.make_tensor("scale", TensorProto.FLOAT, [], [1e-3])]
    g = helper.make_graph(
        [helper.make_node("Clip", ["x", "lo", "hi"], ["big"], name="Clip_big"),
         helper.make_node("Mul", ["big", "scale"], ["small"], name="Mul_1"),
         helper.make_node("Clip", ["small", "lo", "hi"], ["output"], name="Clip_small")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 8])], consts)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    out, report = to_fp16(model, ["big"])
    # the producer and the reader of the overflowing tensor: no Cast of "big" to FP16 anywhere
    assert report["kept_fp32_nodes"] == ["Clip_big", "Mul_1"]
    assert not [n for n in out.graph.node if n.op_type == "Cast" and "big" in n.input
                and any(a.name == "to" and a.i == TensorProto.FLOAT16 for a in n.attribute)]
    sess = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).uniform(-1e5, 1e6, size=(1, 8)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.clip(x, 0, None) * 1e-3, rtol=2e-3, atol=2e-3)
