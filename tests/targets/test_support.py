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
