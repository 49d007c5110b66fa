"""A detector-like table output ([1, anchors, 4 + 1 + classes]) is judged per column: a broken
objectness column under well-kept box offsets fails, though the whole tensor's cosine passes."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from edgeopt_agent.compare import judge, tensor_metrics, tolerance_for


def _detector_like() -> bytes:
    # boxes: x * 3 (large scale); objectness: Sigmoid(x) (0..1): concatenated on the last axis
    g = helper.make_graph(
        [helper.make_node("Slice", ["x", "s0", "e0", "ax"], ["xb"]),
         helper.make_node("Slice", ["x", "s1", "e1", "ax"], ["xs"]),
         helper.make_node("Mul", ["xb", "three"], ["boxes"]),
         helper.make_node("Sigmoid", ["xs"], ["scores"]),
         helper.make_node("Concat", ["boxes", "scores"], ["output"], axis=2)],
        "det", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 200, 6])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 200, 6])],
        [helper.make_tensor("s0", TensorProto.INT64, [1], [0]), helper.make_tensor("e0", TensorProto.INT64, [1], [4]),
         helper.make_tensor("s1", TensorProto.INT64, [1], [4]), helper.make_tensor("e1", TensorProto.INT64, [1], [6]),
         helper.make_tensor("ax", TensorProto.INT64, [1], [2]), helper.make_tensor("three", TensorProto.FLOAT, [], [30.0])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def test_broken_score_column_fails_though_whole_cosine_passes():
    sess = ort.InferenceSession(_detector_like(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 1, 200, 6)).astype(np.float32)
    ref = np.stack([sess.run(None, {"x": xi})[0] for xi in x])
    bad = ref.copy()
    bad[..., 4] = rng.uniform(0, 1, size=bad[..., 4].shape)  # objectness scrambled
    m = tensor_metrics(bad, ref, {"kind": "dense"})
    tol = tolerance_for("int8")
    assert m["cosine"] > tol["cosine_min"]  # the whole tensor hides it
    assert m["column_worst"] == 4 and m["column_cosine_min"] < tol["cosine_min"]
    assert any(r.startswith("column_cosine_min") for r in judge(m, tol))
    good = ref + rng.normal(scale=1e-3, size=ref.shape).astype(np.float32)
    assert judge(tensor_metrics(good, ref, {"kind": "dense"}), tol) == []


def test_image_like_dense_maps_are_not_judged_per_column():
    ref = np.random.default_rng(1).normal(size=(4, 1, 8, 32, 32)).astype(np.float32)  # last axis 32, 32 rows
    assert "column_cosine_min" not in tensor_metrics(ref, ref, {"kind": "dense"})
    assert onnx.__version__  # the graph above is built with the real onnx
