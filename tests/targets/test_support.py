"""What ``inspect`` tells about a model: FLOPs with a dynamic batch, and the same support check as build."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")


def _conv(path, batch="N"):
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4, 6, 6])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def test_flops_are_counted_per_sample_when_the_batch_is_dynamic(tmp_path):
    from edgeopt.model import inspect

    dynamic = inspect(_conv(tmp_path / "d.onnx")).flops
    static = inspect(_conv(tmp_path / "s.onnx", 1)).flops
    assert dynamic == static == 2 * 4 * 6 * 6 * 3 * 9


def _computed_reshape(path):
    """y = Reshape(x, Cast(n)): the target shape is an input's *value* (what the OCR model did)."""
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Cast", ["n"], ["n64"], to=TensorProto.INT64, name="cast_n"),
                           helper.make_node("Reshape", ["x", "n64"], ["y"], name="computed")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                           helper.make_tensor_value_info("n", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    g.output[0].type.tensor_type.shape.dim.add()
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def test_inspect_and_build_refuse_a_computed_reshape_for_apple_alike(tmp_path):
    from edgeopt.model import inspect
    from edgeopt.pipeline import build
    from edgeopt.targets.registry import get_backend

    path = _computed_reshape(tmp_path / "r.onnx")
    info = inspect(path)
    bad = get_backend("coreml").unsupported_nodes(info, {})
    assert bad == [("Reshape (shape computed from input values)", "computed")]
    # the shape-only route (Shape -> Gather -> Reshape) is not flagged: it folds with static shapes
    assert get_backend("coreml").unsupported_nodes(inspect(_conv(tmp_path / "c.onnx", 1)), {}) == []
    res = build(str(path), "apple", ["fp16"], out=tmp_path / "out", jobs=1).results[0]
    assert res.status == "unsupported" and "Reshape (shape computed from input values) (computed)" in res.error


def test_an_fp16_build_warns_of_fp16_overflow(tmp_path):
    """intel-cpu's fp16 warns (apple keeps those layers FP32 instead: test_coreml)."""
    pytest.importorskip("openvino")
    from onnx import TensorProto, helper, numpy_helper

    from edgeopt.pipeline import build

    big, small = (numpy_helper.from_array(np.array(v, np.float32), n) for v, n in ((1e6, "big"), (1e-6, "small")))
    g = helper.make_graph([helper.make_node("Mul", ["x", "big"], ["huge"], name="scale_up"),
                           helper.make_node("Mul", ["huge", "small"], ["y"], name="scale_down")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [big, small])
    path = tmp_path / "o.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    res = build(str(path), "intel-cpu", ["fp16"], out=tmp_path / "out", jobs=1).results[0]
    assert res.ok, res.error
    assert any(w.startswith("FP16 overflow ahead: huge reaches") for w in res.manifest["warnings"])
