"""``inspect`` FLOPs for an NHWC (TensorFlow-exported) CNN and for recurrent layers (issue 26, 5):
ResNet-50-class NHWC models and Conv+LSTM models showed ~0.00 MFLOPs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeopt.model import inspect


def _save(nodes, inputs, outputs, inits, path: Path, opset: int = 14) -> Path:
    g = helper.make_graph(nodes, "m", inputs, outputs, inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), path)
    return path


def nhwc_cnn(path: Path) -> Path:
    """x [1,32,32,3] NHWC -> Transpose -> Reshape to a shape computed at run time (Shape -> Cast -> Floor
    -> Cast: nothing static inference or data propagation follows) -> Conv(3->16, 3x3, pad 1) -> Relu
    -> Transpose back to NHWC: the Conv's shapes are unknown to ONNX shape inference."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "w")
    n = helper.make_node
    nodes = [n("Transpose", ["x"], ["xt"], perm=[0, 3, 1, 2]), n("Shape", ["xt"], ["s"]),
             n("Cast", ["s"], ["sf"], to=TensorProto.FLOAT), n("Floor", ["sf"], ["sff"]),
             n("Cast", ["sff"], ["si"], to=TensorProto.INT64), n("Reshape", ["xt", "si"], ["xr"]),
             n("Conv", ["xr", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]), n("Relu", ["c"], ["r"]),
             n("Transpose", ["r"], ["y"], perm=[0, 2, 3, 1])]
    return _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 32, 3])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "h", "w", "c"])], [w], path)


def test_conv_flops_counted_when_shape_inference_loses_the_nhwc_graphs_shapes(tmp_path):
    model = onnx.load(str(nhwc_cnn(tmp_path / "nhwc.onnx")))
    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    known = {v.name for v in inferred.graph.value_info if v.type.tensor_type.HasField("shape")
             and all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)}
    assert "c" not in known  # the situation: ONNX alone cannot size the Conv
    assert inspect(tmp_path / "nhwc.onnx").flops == 2 * (16 * 32 * 32) * 3 * 9


def test_lstm_and_gru_flops(tmp_path):
    """[T, B, I] -> bidirectional LSTM(H) and GRU(H), layout 1 too."""
    T, IN, H = 20, 12, 16
    rng = np.random.default_rng(0)

    def w(name, shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    n = helper.make_node
    inits = [w("W", (2, 4 * H, IN)), w("R", (2, 4 * H, H)), w("Wg", (1, 3 * H, IN)), w("Rg", (1, 3 * H, H))]
    nodes = [n("LSTM", ["x", "W", "R"], ["Y", "", ""], name="lstm", hidden_size=H, direction="bidirectional"),
             n("GRU", ["xb", "Wg", "Rg"], ["Yg", ""], name="gru", hidden_size=H, layout=1)]
    path = _save(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, 1, IN]),
                         helper.make_tensor_value_info("xb", TensorProto.FLOAT, [1, T, IN])],
                 [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [T, 2, 1, H]),
                  helper.make_tensor_value_info("Yg", TensorProto.FLOAT, [1, T, 1, H])], inits, tmp_path / "rnn.onnx")
    lstm = 2 * 2 * T * 1 * 4 * H * (IN + H)
    gru = 2 * 1 * T * 1 * 3 * H * (IN + H)
    assert inspect(path).flops == lstm + gru


def test_integer_matmul_and_conv_count_as_their_float_ops(tmp_path):
    """An already-quantized model (ORT's dynamic INT8: MatMulInteger; static: ConvInteger) was counted 0."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w")
    path = _save([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 64])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 32])], [w], tmp_path / "f.onnx")
    quantize_dynamic(str(path), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8)
    info = inspect(tmp_path / "q.onnx")
    assert "MatMulInteger" in info.op_histogram
    assert info.flops == inspect(path).flops == 2 * 8 * 32 * 64
