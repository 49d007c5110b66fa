"""inspect's mobile rules from the node tests in a real model's form (weights, scales as initializers; issue 41):
a LayerNormalization over two axes with a 2-D scale, a dilated ConvTranspose and one with ``output_shape`` are
refused, as onnx2tf fails on them; the plain forms are not (no conversion here: the rules alone)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper


def _save(tmp_path, node, x_shape, y_shape, inits, name="m") -> str:
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape or [1, 2, 7, 7])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    p = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(p))
    return str(p)


@pytest.mark.parametrize("axis,x_shape,scale_shape,refused", [
    (1, [1, 4, 5], [4, 5], True), (-2, [1, 3, 4, 5], [4, 5], True), (-1, [1, 4, 5], [5], False)])
def test_layernorm_scale_rank(tmp_path, axis, x_shape, scale_shape, refused):
    from edgeopt.targets.support_rules import refusals

    s = np.ones(scale_shape, np.float32)
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=axis, name="ln")
    path = _save(tmp_path, node, x_shape, x_shape, {"s": s, "b": s * 0})
    got = refusals(path, "tflite")
    assert bool(got) is refused, got
    assert not refusals(path, "onnxruntime")


@pytest.mark.parametrize("attrs,refused", [({"dilations": [2, 2]}, True), ({"output_shape": [7, 7], "strides": [2, 2]}, True),
                                           ({"strides": [2, 2], "pads": [1, 1, 1, 1]}, False), ({}, False)])
def test_convtranspose_rules(tmp_path, attrs, refused):
    from edgeopt.targets.support_rules import refusals

    w = np.ones((1, 2, 3, 3), np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", **attrs)
    path = _save(tmp_path, node, [1, 1, 3, 3], None, {"w": w})
    got = refusals(path, "tflite")
    assert bool(got) is refused, got


@pytest.mark.parametrize("x_shape,exp_shape,doubted", [([3], [3], True), ([2, 3], [3], True), ([2, 3], [], False),
                                                       ([3, 4, 5], [3, 4, 5], False)])
def test_pow_with_a_constant_1d_exponent_is_doubted_on_mobile(tmp_path, x_shape, exp_shape, doubted):
    """pow_example and pow_bcast_array (a constant 1-D exponent) failed inside onnx2tf; a scalar exponent and
    test_pow's [3, 4, 5] one converted."""
    from edgeopt.targets.support_rules import doubts, refusals

    node = helper.make_node("Pow", ["x", "e"], ["y"], name="pow")
    path = _save(tmp_path, node, x_shape, x_shape, {"e": np.full(exp_shape, 2.0, np.float32)})
    got = doubts(path, "tflite")
    assert bool(got) is doubted and not refusals(path, "tflite"), got  # "probably not", never a certain no
    assert not doubts(path, "onnxruntime")
