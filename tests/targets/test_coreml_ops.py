"""The Core ML op table, op by op, against ONNX Runtime.

Core ML cannot run on Linux, so each op is proven in the two ways that can run here:
- the MIL program built from a one-op ONNX model has the output shape ONNX Runtime produces;
- where every MIL op on the way has a numpy value inference (coremltools' own semantics of its
  ops: elementwise, reshape/slice/gather, matmul, reductions, softmax, pad, layer_norm ...), the
  translated program, evaluated on the same inputs, gives ONNX Runtime's values.
The numpy parameter translations (slice, reshape, pad, resize, conv-transpose geometry) are tested
against ONNX Runtime directly.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

R = np.random.default_rng(0)
_NP_ONNX = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64, np.int32: TensorProto.INT32,
            np.bool_: TensorProto.BOOL}


@pytest.fixture(scope="module")
def ct():
    pytest.importorskip("coremltools", reason="coremltools is the Core ML backend's converter (edgeopt[coreml])")
    from edgeopt.targets.coreml import import_coremltools

    return import_coremltools()


def f(*shape, lo=None, hi=None):
    if lo is not None:
        return R.uniform(lo, hi, shape).astype(np.float32)
    return R.standard_normal(shape).astype(np.float32)


class V:
    """A graph input (a run-time value)."""

    def __init__(self, a):
        self.a = np.asarray(a)


class K:
    """An initializer (a constant)."""

    def __init__(self, a):
        self.a = np.asarray(a)


def model(nodes, ins: dict, outs: list[str], opset: int = 17):
    """A model from nodes; ``ins`` maps names to V/K; output types are inferred."""
    inputs = [helper.make_tensor_value_info(n, _NP_ONNX[v.a.dtype.type], list(v.a.shape))
              for n, v in ins.items() if isinstance(v, V)]
    inits = [numpy_helper.from_array(v.a, n) for n, v in ins.items() if isinstance(v, K)]
    graph = helper.make_graph(nodes, "t", inputs, [helper.make_empty_tensor_value_info(o) for o in outs],
                              initializer=inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    feeds = {n: v.a for n, v in ins.items() if isinstance(v, V)}
    return m, feeds


def one(op, ins: dict, n_out: int = 1, opset: int = 17, **attrs):
    """A model of a single node ``op`` over ``ins`` (None = an omitted optional input)."""
    names = [("" if v is None else n) for n, v in ins.items()]
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, name=f"the_{op}", **attrs)
    return model([node], {n: v for n, v in ins.items() if v is not None}, outs, opset)


def gt0(name, src):
    """A node making a bool tensor from a float one (Core ML takes no bool model inputs)."""
    return helper.make_node("Greater", [src, "zero"], [name])


def run_ort(m, feeds):
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def _gru_ins(dirs, s=4, b=2, i=3, h=5):
    return {"x": V(f(s, b, i)), "w": K(f(dirs, 3 * h, i)), "r": K(f(dirs, 3 * h, h)), "b": K(f(dirs, 6 * h)),
            "lens": None, "h0": V(f(dirs, b, h))}


def _lstm_ins(dirs, peephole=False, s=4, b=2, i=3, h=5):
    ins = {"x": V(f(s, b, i)), "w": K(f(dirs, 4 * h, i)), "r": K(f(dirs, 4 * h, h)), "b": K(f(dirs, 8 * h)),
           "lens": None, "h0": V(f(dirs, b, h)), "c0": V(f(dirs, b, h))}
    if peephole:
        ins["p"] = K(f(dirs, 3 * h))
    return ins


# (id, builder) -> (model, feeds).  Every op of the table appears at least once (test below).
CASES = {
    "Conv": lambda: one("Conv", {"x": V(f(1, 3, 9, 9)), "w": K(f(4, 3, 3, 3)), "b": K(f(4))}, pads=[1, 1, 1, 1],
                        strides=[2, 2]),
    "Conv-same-depthwise": lambda: one("Conv", {"x": V(f(1, 4, 9, 10)), "w": K(f(4, 1, 3, 3))}, group=4,
                                        auto_pad="SAME_UPPER", strides=[2, 2]),
    "Conv-dilated": lambda: one("Conv", {"x": V(f(1, 2, 10, 10)), "w": K(f(3, 2, 3, 3))}, dilations=[2, 2],
                                pads=[2, 1, 2, 1]),
    "Conv-1d": lambda: one("Conv", {"x": V(f(1, 2, 16)), "w": K(f(3, 2, 5))}, pads=[2, 1], strides=[3]),
    "ConvTranspose": lambda: one("ConvTranspose", {"x": V(f(1, 4, 5, 5)), "w": K(f(4, 2, 2, 2)), "b": K(f(2))},
                                 strides=[2, 2]),
    "ConvTranspose-output_padding": lambda: one("ConvTranspose", {"x": V(f(1, 2, 4, 5)), "w": K(f(2, 3, 3, 3)),
                                                                  "b": K(f(3))},
                                                strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 0]),
    "ConvTranspose-output_shape-groups": lambda: one("ConvTranspose", {"x": V(f(1, 4, 3, 3)), "w": K(f(4, 1, 3, 3))},
                                                     group=2, strides=[2, 2], output_shape=[6, 6]),
    "MaxPool": lambda: one("MaxPool", {"x": V(f(1, 2, 9, 9))}, kernel_shape=[2, 2], strides=[2, 2]),
    "MaxPool-ceil-pads": lambda: one("MaxPool", {"x": V(f(1, 2, 9, 8))}, kernel_shape=[3, 3], strides=[2, 2],
                                     pads=[1, 1, 1, 1], ceil_mode=1),
    "AveragePool": lambda: one("AveragePool", {"x": V(f(1, 2, 12, 10))}, kernel_shape=[3, 2], strides=[3, 2]),
    "AveragePool-pads-exclusive": lambda: one("AveragePool", {"x": V(f(1, 2, 7, 7))}, kernel_shape=[3, 3],
                                              pads=[1, 1, 1, 1], count_include_pad=0),
    "GlobalAveragePool": lambda: one("GlobalAveragePool", {"x": V(f(1, 3, 5, 7))}),
    "GlobalMaxPool": lambda: one("GlobalMaxPool", {"x": V(f(1, 3, 5, 7))}),
    "BatchNormalization": lambda: one("BatchNormalization", {"x": V(f(1, 3, 4, 4)), "s": K(f(3)), "b": K(f(3)),
                                                             "m": K(f(3)), "v": K(f(3, lo=0.5, hi=2))}),
    "BatchNormalization-2d": lambda: one("BatchNormalization", {"x": V(f(5, 3)), "s": K(f(3)), "b": K(f(3)),
                                                                "m": K(f(3)), "v": K(f(3, lo=0.5, hi=2))}),
    "InstanceNormalization": lambda: one("InstanceNormalization", {"x": V(f(2, 3, 5, 5)), "s": K(f(3)),
                                                                   "b": K(f(3))}),
    "LayerNormalization": lambda: one("LayerNormalization", {"x": V(f(2, 5, 8)), "s": K(f(8)), "b": K(f(8))}),
    "LayerNormalization-axis1": lambda: one("LayerNormalization", {"x": V(f(2, 3, 4)), "s": K(f(3, 4))}, axis=1),
    **{op: (lambda op=op: one(op, {"x": V(f(2, 3, 4))})) for op in
       ["Relu", "Sigmoid", "Tanh", "Erf", "Softplus", "Softsign", "Abs", "Exp", "Floor", "Ceil", "Round", "Sign",
        "Sin", "Cos", "Tan", "Atan", "Sinh", "Cosh", "Neg", "Reciprocal", "Identity", "HardSwish"]},
    "Mish": lambda: one("Mish", {"x": V(f(2, 6))}, opset=18),
    **{op: (lambda op=op: one(op, {"x": V(f(2, 3, 4, lo=-0.9, hi=0.9))})) for op in ["Asin", "Acos", "Atanh"]},
    **{op: (lambda op=op: one(op, {"x": V(f(2, 3, 4, lo=0.1, hi=4))})) for op in ["Sqrt", "Log"]},
    "LeakyRelu": lambda: one("LeakyRelu", {"x": V(f(2, 6))}, alpha=0.1),
    "Elu": lambda: one("Elu", {"x": V(f(2, 6))}, alpha=0.7),
    "Selu": lambda: one("Selu", {"x": V(f(2, 6))}),
    "ThresholdedRelu": lambda: one("ThresholdedRelu", {"x": V(f(2, 6))}, alpha=0.3),
    "PRelu": lambda: one("PRelu", {"x": V(f(1, 3, 4, 4)), "s": K(f(3, 1, 1))}),
    "HardSigmoid": lambda: one("HardSigmoid", {"x": V(f(2, 6))}, alpha=1 / 6, beta=0.5),
    "Gelu": lambda: one("Gelu", {"x": V(f(2, 6))}, opset=20),
    "Gelu-tanh": lambda: one("Gelu", {"x": V(f(2, 6))}, opset=20, approximate="tanh"),
    "Clip": lambda: one("Clip", {"x": V(f(2, 6)), "lo": K(np.float32(-0.5)), "hi": K(np.float32(0.5))}),
    "Clip-min-only": lambda: one("Clip", {"x": V(f(2, 6)), "lo": K(np.float32(0.0))}),
    "Clip-opset6": lambda: one("Clip", {"x": V(f(2, 6))}, opset=6, min=-0.2, max=0.3),
    # a bound computed at run time (openwakeword's log-mel: Clip(x, max(x) - 80))
    "Clip-runtime-min": lambda: model(
        [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0), helper.make_node("Sub", ["m", "d"], ["lo"]),
         helper.make_node("Clip", ["x", "lo"], ["y0"], name="the_Clip")],
        {"x": V(f(2, 6)), "d": K(np.float32(1.0))}, ["y0"]),
    "Softmax": lambda: one("Softmax", {"x": V(f(2, 3, 5))}, axis=1),
    "Softmax-opset11-flatten": lambda: one("Softmax", {"x": V(f(2, 3, 5))}, opset=11, axis=1),
    "LogSoftmax": lambda: one("LogSoftmax", {"x": V(f(2, 7))}),
    "Pad": lambda: one("Pad", {"x": V(f(1, 2, 4, 5)), "p": K(np.array([0, 0, 1, 2, 0, 0, 3, 0], np.int64)),
                               "c": K(np.float32(1.5))}),
    "Pad-reflect": lambda: one("Pad", {"x": V(f(1, 2, 4, 5)), "p": K(np.array([0, 0, 2, 1, 0, 0, 1, 3], np.int64))},
                               mode="reflect"),
    "Pad-edge-negative": lambda: one("Pad", {"x": V(f(1, 2, 6, 5)), "p": K(np.array([0, 0, -1, 2, 0, 0, 2, -2],
                                                                                    np.int64))}, mode="edge"),
    "Pad-axes": lambda: one("Pad", {"x": V(f(2, 3, 4)), "p": K(np.array([1, 2], np.int64)), "c": None,
                                    "a": K(np.array([-1], np.int64))}, opset=18),
    "DepthToSpace": lambda: one("DepthToSpace", {"x": V(f(1, 8, 2, 3))}, blocksize=2),
    "DepthToSpace-CRD": lambda: one("DepthToSpace", {"x": V(f(1, 8, 2, 3))}, blocksize=2, mode="CRD"),
    "SpaceToDepth": lambda: one("SpaceToDepth", {"x": V(f(1, 2, 4, 6))}, blocksize=2),
    **{op: (lambda op=op: one(op, {"a": V(f(2, 3, 4)), "b": V(f(3, 1))})) for op in
       ["Add", "Sub", "Mul", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"]},
    "Div": lambda: one("Div", {"a": V(f(2, 3)), "b": V(f(2, 3, lo=0.5, hi=2))}),
    "Div-int": lambda: one("Div", {"a": V(np.array([[7, -7, 9], [-9, 4, 5]], np.int64)), "b": K(np.array([2, 2, -4],
                                                                                                    np.int64))}),
    "Mod": lambda: one("Mod", {"a": V(np.array([7, -7, 9, 3], np.int64)), "b": K(np.array([3, 3, -4, 2], np.int64))}),
    "Pow": lambda: one("Pow", {"a": V(f(2, 3)), "b": K(np.float32(2.0))}),
    "Pow-fractional": lambda: one("Pow", {"a": V(f(2, 3, lo=0.1, hi=3)), "b": K(np.float32(1.5))}),
    "Pow-var": lambda: one("Pow", {"a": V(f(2, 3, lo=0.1, hi=3)), "b": V(f(2, 3))}),
    **{op: (lambda op=op: model([gt0("p", "a"), helper.make_node("Less", ["b", "zero"], ["q"]),
                                 helper.make_node(op, ["p", "q"], ["y0"], name=f"the_{op}")],
                                {"a": V(f(3, 4)), "b": V(f(3, 4)), "zero": K(np.float32(0))}, ["y0"]))
       for op in ["And", "Or", "Xor"]},
    "Not": lambda: model([gt0("p", "a"), helper.make_node("Not", ["p"], ["y0"])],
                         {"a": V(f(3, 4)), "zero": K(np.float32(0))}, ["y0"]),
    "Where": lambda: model([gt0("p", "a"), helper.make_node("Where", ["p", "b", "c"], ["y0"])],
                           {"a": V(f(3, 4)), "b": V(f(3, 4)), "c": K(f(4)), "zero": K(np.float32(0))}, ["y0"]),
    **{op: (lambda op=op: one(op, {"a": V(f(2, 3)), "b": V(f(3)), "c": K(f(1, 3))})) for op in
       ["Max", "Min", "Sum", "Mean"]},
    "Dropout": lambda: one("Dropout", {"x": V(f(2, 3))}),
    "Cast": lambda: one("Cast", {"x": V(f(2, 3) * 4)}, to=TensorProto.INT64),
    "Cast-int-to-float": lambda: one("Cast", {"x": V(np.array([[1, -2, 3]], np.int64))}, to=TensorProto.FLOAT),
    "CastLike": lambda: one("CastLike", {"x": V(f(2, 3) * 4), "t": K(np.array([1], np.int32))}),
    "MatMul": lambda: one("MatMul", {"a": V(f(2, 5, 4)), "b": K(f(4, 3))}),
    "MatMul-vars-batched": lambda: one("MatMul", {"a": V(f(2, 1, 5, 4)), "b": V(f(3, 4, 2))}),
    "Gemm": lambda: one("Gemm", {"a": V(f(2, 4)), "b": K(f(3, 4)), "c": K(f(3))}, transB=1, alpha=0.5, beta=2.0),
    "Gemm-vars": lambda: one("Gemm", {"a": V(f(4, 2)), "b": V(f(4, 3)), "c": V(f(2, 3))}, transA=1, alpha=1.5,
                             beta=0.5),
    "Constant": lambda: model([helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(f(3), "k")),
                               helper.make_node("Add", ["x", "k"], ["y0"])], {"x": V(f(2, 3))}, ["y0"]),
    "Shape": lambda: model([helper.make_node("Shape", ["x"], ["s"], start=1),
                            helper.make_node("Concat", ["m1", "s"], ["t"], axis=0),
                            helper.make_node("Reshape", ["x", "t"], ["y0"])],
                           {"x": V(f(2, 3, 4)), "m1": K(np.array([-1], np.int64))}, ["y0"]),
    "Size": lambda: model([helper.make_node("Size", ["x"], ["n"]), helper.make_node("Reshape", ["n", "one"], ["s"]),
                           helper.make_node("Reshape", ["x", "s"], ["y0"])],
                          {"x": V(f(2, 3, 4)), "one": K(np.array([1], np.int64))}, ["y0"]),
    "Reshape": lambda: one("Reshape", {"x": V(f(2, 3, 4)), "s": K(np.array([0, -1, 2], np.int64))}),
    "Flatten": lambda: one("Flatten", {"x": V(f(2, 3, 4, 5))}, axis=2),
    "Flatten-negative-axis": lambda: one("Flatten", {"x": V(f(2, 3, 4, 5))}, axis=-1),  # [24, 5]: -1 counts from r
    "Transpose": lambda: one("Transpose", {"x": V(f(2, 3, 4, 5))}, perm=[2, 0, 3, 1]),
    "Concat": lambda: one("Concat", {"a": V(f(2, 3)), "b": K(f(2, 2)), "c": V(f(2, 1))}, axis=-1),
    "Slice": lambda: one("Slice", {"x": V(f(6, 7, 8)), "s": K(np.array([1, -1, 0], np.int64)),
                                   "e": K(np.array([100, -8, 7], np.int64)), "a": K(np.array([0, 1, 2], np.int64)),
                                   "st": K(np.array([2, -2, 3], np.int64))}),
    "Slice-opset9": lambda: one("Slice", {"x": V(f(5, 6))}, opset=9, starts=[1, 0], ends=[4, -1], axes=[0, 1]),
    "Squeeze": lambda: one("Squeeze", {"x": V(f(1, 3, 1, 4)), "a": K(np.array([0, -2], np.int64))}),
    "Squeeze-opset11-all": lambda: one("Squeeze", {"x": V(f(1, 3, 1, 4))}, opset=11),
    "Unsqueeze": lambda: one("Unsqueeze", {"x": V(f(3, 4)), "a": K(np.array([0, -1], np.int64))}),
    "Gather": lambda: one("Gather", {"x": V(f(5, 4)), "i": K(np.array([[0, -1], [2, 3]], np.int64))}, axis=0),
    "Gather-scalar": lambda: one("Gather", {"x": V(f(5, 4)), "i": K(np.array(-2, np.int64))}, axis=1),
    "Gather-var-indices": lambda: one("Gather", {"x": V(f(5, 4)), "i": V(np.array([4, -5, 0], np.int64))}),
    "GatherElements": lambda: one("GatherElements", {"x": V(f(3, 4)), "i": K(np.array([[0, -1], [2, 1], [3, 0]],
                                                                                      np.int64))}, axis=1),
    "Expand": lambda: one("Expand", {"x": V(f(3, 1)), "s": K(np.array([2, 1, 4], np.int64))}),
    "Tile": lambda: one("Tile", {"x": V(f(2, 3)), "r": K(np.array([2, 3], np.int64))}),
    "Split": lambda: one("Split", {"x": V(f(2, 7)), "s": K(np.array([3, 4], np.int64))}, n_out=2, axis=1),
    "Split-num_outputs": lambda: one("Split", {"x": V(f(7, 2))}, n_out=3, opset=18, num_outputs=3),
    **{op: (lambda op=op: one(op, {"x": V(f(2, 3, 4, lo=0.1, hi=2))}, axes=[1, -1])) for op in
       ["ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
        "ReduceLogSumExp", "ReduceSumSquare"]},
    "ReduceSum": lambda: one("ReduceSum", {"x": V(f(2, 3, 4)), "a": K(np.array([0], np.int64))}, keepdims=0),
    "ReduceMean-opset18-all": lambda: one("ReduceMean", {"x": V(f(2, 3, 4))}, opset=18, keepdims=0),
    "ArgMax": lambda: one("ArgMax", {"x": V(f(3, 5))}, axis=1),
    "ArgMin": lambda: one("ArgMin", {"x": V(f(3, 5))}, axis=0, keepdims=0),
    "TopK": lambda: one("TopK", {"x": V(f(3, 6)), "k": K(np.array([2], np.int64))}, n_out=2),
    "CumSum": lambda: one("CumSum", {"x": V(f(3, 4)), "a": K(np.array(1, np.int64))}, reverse=1),
    "ConstantOfShape": lambda: model([helper.make_node("ConstantOfShape", ["s"], ["c"],
                                                       value=numpy_helper.from_array(np.array([2.5], np.float32))),
                                      helper.make_node("Add", ["c", "x"], ["y0"])],
                                     {"x": V(f(2, 3)), "s": V(np.array([2, 3], np.int64))}, ["y0"]),
    "Range": lambda: one("Range", {"a": V(np.array(1, np.int64)), "b": V(np.array(10, np.int64)),
                                   "c": K(np.array(3, np.int64))}),
    "Resize-nearest-asymmetric-floor": lambda: one("Resize", {"x": V(f(1, 2, 4, 5)), "r": None,
                                                              "s": K(np.array([1, 1, 2, 2], np.float32))},
                                                   mode="nearest", coordinate_transformation_mode="asymmetric",
                                                   nearest_mode="floor"),
    "Resize-nearest-half_pixel-x3": lambda: one("Resize", {"x": V(f(1, 2, 4, 5)), "r": None,
                                                           "s": K(np.array([1, 1, 3, 3], np.float32))}),
    "Resize-nearest-fallback": lambda: one("Resize", {"x": V(f(1, 2, 4, 5)), "r": None, "s": None,
                                                      "z": K(np.array([1, 2, 7, 13], np.int64))},
                                           coordinate_transformation_mode="asymmetric",
                                           nearest_mode="round_prefer_ceil"),
    "Resize-linear-align_corners": lambda: one("Resize", {"x": V(f(1, 2, 4, 5)), "r": None, "s": None,
                                                          "z": K(np.array([1, 2, 7, 9], np.int64))}, mode="linear",
                                               coordinate_transformation_mode="align_corners"),
    "Resize-linear-half_pixel": lambda: one("Resize", {"x": V(f(1, 2, 4, 5)), "r": None,
                                                       "s": K(np.array([1, 1, 2, 2], np.float32))}, mode="linear"),
    "Resize-linear-fallback": lambda: one("Resize", {"x": V(f(1, 2, 6, 5)), "r": None,
                                                     "s": K(np.array([1, 1, 0.7, 1.6], np.float32))}, mode="linear",
                                          coordinate_transformation_mode="pytorch_half_pixel"),
    "Resize-cubic": lambda: one("Resize", {"x": V(f(1, 1, 5, 6)), "r": None,
                                           "s": K(np.array([1, 1, 1.5, 2], np.float32))}, mode="cubic",
                                exclude_outside=1),
    "Resize-opset10": lambda: one("Resize", {"x": V(f(1, 2, 3, 4)), "s": K(np.array([1, 1, 2, 2], np.float32))},
                                  opset=10),
    "LSTM": lambda: one("LSTM", _lstm_ins(1, peephole=True), n_out=3, hidden_size=5),
    "LSTM-minimal": lambda: one("LSTM", {k: v for k, v in _lstm_ins(1).items() if k in "xwr"}, n_out=3,
                                hidden_size=5),
    "LSTM-reverse": lambda: one("LSTM", _lstm_ins(1), n_out=3, hidden_size=5, direction="reverse"),
    "GRU": lambda: one("GRU", _gru_ins(1), n_out=2, hidden_size=5),
    "GRU-linear-before-reset": lambda: one("GRU", _gru_ins(1), n_out=2, hidden_size=5, linear_before_reset=1),
    "GRU-bidirectional": lambda: one("GRU", _gru_ins(2), n_out=2, hidden_size=5, direction="bidirectional"),
    "GRU-reverse": lambda: one("GRU", _gru_ins(1), n_out=2, hidden_size=5, direction="reverse"),
    "LSTM-bidirectional": lambda: one("LSTM", _lstm_ins(2), n_out=3, hidden_size=5, direction="bidirectional"),
    "Upsample": lambda: one("Upsample", {"x": V(f(1, 2, 3, 4)), "s": K(np.array([1, 1, 2, 3], np.float32))},
                            opset=9, mode="linear"),
}


def _convert(ct, m, evaluate=None):
    from edgeopt.targets.coreml.ops import convert

    return convert(m, ct, ct.target.iOS16, evaluate=evaluate)


# Cases whose output shape depends on input *values*: static only once the values are known.
VALUE_SHAPED = {"Range", "ConstantOfShape"}


@pytest.mark.parametrize("case", list(CASES))
def test_op_output_shape_and_values_match_onnxruntime(ct, case):
    m, feeds = CASES[case]()
    ref = run_ort(m, feeds)
    conv = _convert(ct, m, evaluate=feeds if case in VALUE_SHAPED else None)
    shapes = {o["name"]: tuple(v.shape) for o, v in zip(conv.outputs, conv.program.functions["main"].outputs)}
    assert shapes == {k: v.shape for k, v in ref.items()}
    values = _convert(ct, m, evaluate=feeds).values
    for name, val in values.items():
        if val is None:  # some MIL op on the way has no numpy semantics (conv, pools, upsample...)
            continue
        want = ref[name]
        if want.dtype.kind in "iub":
            np.testing.assert_array_equal(np.asarray(val), want, err_msg=case)
        else:
            np.testing.assert_allclose(np.asarray(val, np.float32), want, rtol=2e-4, atol=2e-5, err_msg=case)


def test_op_table_every_op_has_a_case():
    from edgeopt.targets.coreml.ops import supported_op_types

    covered = set()
    for build in CASES.values():
        m, _ = build()
        covered |= {n.op_type for n in m.graph.node}
    assert supported_op_types() - covered == set()


def test_numeric_proof_covers_most_of_the_table(ct):
    """How many cases MIL can evaluate; a floor so that a regression in evaluation shows."""
    evaluated = 0
    for build in CASES.values():
        m, feeds = build()
        values = _convert(ct, m, evaluate=feeds).values
        evaluated += all(v is not None for v in values.values())
    assert evaluated >= 0.6 * len(CASES)


# --- numpy parameter translations, against ONNX Runtime -----------------------------------------
@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([1, -1], [100, -8], [0, 1], [2, -2]),
    ([-3], [2**63 - 1], [2], None),
    ([5, 0], [-2**63, 3], [0, 2], [-1, 1]),
    ([0], [-1], [-1], [3]),
])
def test_slice_params_match_onnxruntime(starts, ends, axes, steps):
    from edgeopt.targets.coreml.ops_tensor import slice_params

    x = f(6, 7, 8)
    ins = {"x": V(x), "s": K(np.array(starts, np.int64)), "e": K(np.array(ends, np.int64)),
           "a": K(np.array(axes, np.int64))}
    if steps is not None:
        ins["st"] = K(np.array(steps, np.int64))
    m, feeds = one("Slice", ins)
    want = run_ort(m, feeds)["y0"]
    p = slice_params(x.shape, starts, ends, axes, steps)
    idx = tuple(slice(b, None if mask else e, s) for b, e, s, mask in zip(p["begin"], p["end"], p["stride"],
                                                                          p["end_mask"]))
    np.testing.assert_array_equal(x[idx], want)


def test_slice_params_refuses_an_empty_slice():
    from edgeopt.targets.coreml.ops import Unsupported
    from edgeopt.targets.coreml.ops_tensor import slice_params

    with pytest.raises(Unsupported, match="empty slice"):
        slice_params((4, 5), [3], [1], [0], None)


@pytest.mark.parametrize("shape,target,allowzero", [((2, 3, 4), [0, -1], 0), ((2, 3, 4), [4, 0, -1], 0),
                                                    ((6, 4), [-1, 2, 2], 0), ((2, 3), [3, 2], 1)])
def test_reshape_target_matches_onnxruntime(shape, target, allowzero):
    from edgeopt.targets.coreml.ops_tensor import reshape_target

    m, feeds = one("Reshape", {"x": V(f(*shape)), "s": K(np.array(target, np.int64))}, allowzero=allowzero)
    assert tuple(reshape_target(shape, target, bool(allowzero))) == run_ort(m, feeds)["y0"].shape


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", [[0, 1, 2, 0, 3, 1], [0, -1, 2, 0, 1, -2], [1, 0, 0, 0, 0, 0]])
def test_pad_plan_matches_onnxruntime(mode, pads):
    from edgeopt.targets.coreml.ops_nn import pad_plan

    x = f(2, 5, 6)
    m, feeds = one("Pad", {"x": V(x), "p": K(np.array(pads, np.int64))}, mode=mode)
    want = run_ort(m, feeds)["y0"]
    mil_pad, crops = pad_plan(pads, 3)
    y = x[tuple(slice(b, d - e) for d, (b, e) in zip(x.shape, crops))]
    widths = [(0, 0)] * (3 - len(mil_pad) // 2) + list(zip(mil_pad[::2], mil_pad[1::2]))
    assert all(v >= 0 for v in mil_pad)
    np.testing.assert_array_equal(np.pad(y, widths, mode=mode), want)


def _resize_ref(x, ins, **attrs):
    m, feeds = one("Resize", {"x": V(x), **ins}, **attrs)
    return run_ort(m, feeds)["y0"]


def _apply_axis(x, m, axis):
    return np.moveaxis(np.tensordot(m, np.moveaxis(x, axis, 0), axes=(1, 0)), 0, axis)


@pytest.mark.parametrize("coord", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
                                   "half_pixel_symmetric"])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("scales", [[1, 1, 2.0, 3.0], [1, 1, 0.6, 1.7]])
def test_resize_translation_matches_onnxruntime(coord, mode, scales):
    """The numpy resampling the fallback path emits (gather / interpolation matrices) equals ORT."""
    from edgeopt.targets.coreml.ops_resize import interp_matrix, nearest_indices, resize_plan

    x = f(1, 2, 5, 7).astype(np.float64)
    attrs = {"mode": mode, "coordinate_transformation_mode": coord}
    if mode == "nearest":
        attrs["nearest_mode"] = "round_prefer_ceil" if coord == "asymmetric" else "round_prefer_floor"
    want = _resize_ref(x.astype(np.float32), {"r": None, "s": K(np.array(scales, np.float32))}, opset=19, **attrs)
    plan = resize_plan(x.shape, np.array(scales, np.float32), None, coord)
    assert plan.out_shape == list(want.shape)
    y = x
    for a in plan.axes:
        if mode == "nearest":
            y = np.take(y, nearest_indices(plan.coords[a], x.shape[a], attrs["nearest_mode"]), axis=a)
        else:
            y = _apply_axis(y, interp_matrix(plan.coords[a], x.shape[a], mode), a)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


def test_resize_cubic_exclude_outside_with_sizes_matches_onnxruntime():
    from edgeopt.targets.coreml.ops_resize import interp_matrix, resize_plan

    x = f(1, 1, 6, 5).astype(np.float64)
    sizes = np.array([1, 1, 9, 3], np.int64)
    want = _resize_ref(x.astype(np.float32), {"r": None, "s": None, "z": K(sizes)}, mode="cubic",
                       exclude_outside=1, cubic_coeff_a=-0.5)
    plan = resize_plan(x.shape, None, sizes, "half_pixel")
    y = x
    for a in plan.axes:
        y = _apply_axis(y, interp_matrix(plan.coords[a], x.shape[a], "cubic", -0.5, True), a)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("coord,nearest,scale,native", [
    ("asymmetric", "floor", 2, (2, 2)),  # ocr-det's FPN upsampling
    ("half_pixel", "round_prefer_floor", 3, (3, 3)),
    ("asymmetric", "round_prefer_floor", 2, (2, 2)),
    ("asymmetric", "round_prefer_floor", 3, None),  # rounds up at 2/3: not i // 3
    ("tf_half_pixel_for_nn", "round_prefer_ceil", 2, None),
])
def test_native_nearest_only_where_it_equals_onnx(coord, nearest, scale, native):
    """upsample_nearest_neighbor samples index i // s; it is used only where ORT does the same."""
    from edgeopt.targets.coreml.ops_resize import native_nearest, resize_plan

    x = f(1, 2, 4, 5)
    scales = np.array([1, 1, scale, scale], np.float32)
    want = _resize_ref(x, {"r": None, "s": K(scales)}, mode="nearest", coordinate_transformation_mode=coord,
                       nearest_mode=nearest)
    plan = resize_plan(x.shape, scales, None, coord)
    got = native_nearest(plan, x.shape, nearest)
    assert got == native
    same_as_floor = np.array_equal(x.repeat(scale, 2).repeat(scale, 3), want)
    assert same_as_floor == (native is not None)


@pytest.mark.parametrize("coord,sizes,expect", [
    ("align_corners", [7, 9], {"align_corners": True}),
    ("half_pixel", [8, 10], {"align_corners": False, "half_pixel_centers": True}),
    ("pytorch_half_pixel", [8, 10], {"align_corners": False, "half_pixel_centers": True}),
    ("asymmetric", [8, 10], {"align_corners": False, "half_pixel_centers": False}),
])
def test_native_bilinear_grid_equals_onnx(coord, sizes, expect):
    """Core ML's documented upsample_bilinear grid, applied in numpy, reproduces ORT's output."""
    from edgeopt.targets.coreml.ops_resize import (
        coreml_bilinear_grid,
        interp_matrix,
        native_bilinear,
        resize_plan,
    )

    x = f(1, 2, 4, 5).astype(np.float64)
    z = np.array([1, 2, *sizes], np.int64)
    want = _resize_ref(x.astype(np.float32), {"r": None, "s": None, "z": K(z)}, mode="linear",
                       coordinate_transformation_mode=coord)
    args = native_bilinear(resize_plan(x.shape, None, z, coord), x.shape, half_pixel_ok=True)
    assert args is not None and {k: args[k] for k in expect} == expect
    half = args.get("half_pixel_centers", not args["align_corners"])
    y = x
    for a in (2, 3):
        grid = coreml_bilinear_grid(z[a], x.shape[a], args["align_corners"], half)
        y = _apply_axis(y, interp_matrix(grid, x.shape[a], "linear"), a)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attrs", [
    {"strides": [2, 2], "pads": [1, 0, 1, 2], "output_padding": [1, 1]},
    {"strides": [3, 2], "output_shape": [10, 7]},
    {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
    {"strides": [2, 1], "auto_pad": "SAME_LOWER", "dilations": [1, 2]},
])
def test_conv_transpose_geometry_matches_onnxruntime(attrs):
    from edgeopt.targets.coreml.ops_nn import conv_transpose_geometry

    m, feeds = one("ConvTranspose", {"x": V(f(1, 2, 4, 3)), "w": K(f(2, 3, 3, 3))}, **attrs)
    want = run_ort(m, feeds)["y0"].shape
    _, _, out = conv_transpose_geometry([4, 3], [3, 3], attrs["strides"], attrs.get("dilations", [1, 1]),
                                        attrs.get("pads"), attrs.get("output_padding", [0, 0]),
                                        attrs.get("output_shape"), attrs.get("auto_pad", "NOTSET"))
    assert tuple(out) == want[2:]


# --- folding, names, problem reports ------------------------------------------------------------
def test_shape_subgraph_is_folded_away(ct):
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape (what exporters write) leaves one reshape."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "i0"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
             helper.make_node("Concat", ["n1", "m1"], ["t"], axis=0),
             helper.make_node("Cast", ["t"], ["t2"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["x", "t2"], ["y0"])]
    m, feeds = model(nodes, {"x": V(f(2, 3, 4)), "i0": K(np.array(0, np.int64)), "ax": K(np.array([0], np.int64)),
                             "m1": K(np.array([-1], np.int64))}, ["y0"])
    conv = _convert(ct, m)
    ops = {o.op_type for o in conv.program.functions["main"].operations}
    assert (conv.folded, conv.translated) == (4, 2)  # Shape itself is "translated" into a constant
    assert ops - {"const", "identity"} == {"reshape"}
    np.testing.assert_array_equal(_convert(ct, m, evaluate=feeds).values["y0"], run_ort(m, feeds)["y0"])


def test_names_are_sanitized_and_mapped(ct):
    nodes = [helper.make_node("Relu", ["input.1"], ["out/0:x"]), helper.make_node("Sigmoid", ["state"], ["9"]),
             helper.make_node("Tanh", ["input.1"], ["_t"])]
    m, _ = model(nodes, {"input.1": V(f(2, 3)), "state": V(f(2, 3))}, ["out/0:x", "9", "_t"])
    conv = _convert(ct, m)
    assert [(s["name"], s["artifact_name"]) for s in conv.inputs] == [("input.1", "input_1"), ("state", "state_")]
    names = [("out/0:x", "out_0_x"), ("9", "v_9"), ("_t", "v__t")]
    assert [(s["name"], s["artifact_name"]) for s in conv.outputs] == names
    assert [v.name for v in conv.program.functions["main"].outputs] == [n for _, n in names]
    # coremltools' own sanitizer (run by ct.convert) leaves every one of them as it is.
    mlmodel = ct.convert(conv.program, convert_to="mlprogram", skip_model_load=True,
                         minimum_deployment_target=ct.target.iOS16)
    spec = mlmodel.get_spec().description
    assert [i.name for i in spec.input] == ["input_1", "state_"] and [o.name for o in spec.output] == [n for _, n in names]


def test_every_problem_is_reported_at_once_with_node_names(ct):
    from edgeopt.targets.coreml.ops import ConversionProblems

    nodes = [helper.make_node("MaxPool", ["x"], ["a"], name="pool_dilated", kernel_shape=[2, 2], dilations=[2, 2]),
             helper.make_node("Resize", ["a", "", "sc"], ["b"], name="resize_roi",
                              coordinate_transformation_mode="tf_crop_and_resize"),
             helper.make_node("Relu", ["b"], ["c"], name="fine"),
             helper.make_node("Reshape", ["c", "shp"], ["y0"], name="data_dependent_shape")]
    m, _ = model(nodes, {"x": V(f(1, 2, 8, 8)), "sc": K(np.array([1, 1, 2, 2], np.float32)),
                         "shp": V(np.array([1, -1], np.int64))}, ["y0"])
    with pytest.raises(ConversionProblems) as info:
        _convert(ct, m)
    names = [p.node for p in info.value.problems]
    assert names == ["pool_dilated", "resize_roi", "data_dependent_shape"]
    text = str(info.value)
    assert "dilated pooling" in text and "tf_crop_and_resize" in text and "must be a constant" in text
    assert "hint:" in text


def test_unknown_op_is_reported(ct):
    from edgeopt.targets.coreml.ops import ConversionProblems

    m, _ = model([helper.make_node("Det", ["x"], ["y0"], name="det")], {"x": V(f(3, 3))}, ["y0"])
    with pytest.raises(ConversionProblems, match=r"Det \(node 'det'\): no Core ML translation"):
        _convert(ct, m)


def test_fold_matches_onnxruntime():
    from edgeopt.targets.coreml.ops import fold

    node = helper.make_node("Range", ["a", "b", "c"], ["y0"])
    consts = {"a": np.array(2, np.int64), "b": np.array(11, np.int64), "c": np.array(3, np.int64)}
    m, _ = model([node], {k: K(v) for k, v in consts.items()}, ["y0"])
    np.testing.assert_array_equal(fold(node, consts, 17)[0], run_ort(m, {})["y0"])


def _decomposed_layer_norm(gamma, keep_diff=False, axes=(-1,)):
    """LayerNorm as exporters before opset 17 write it (eps and exponent as Constant nodes)."""
    def c(name, v):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(v), name))

    nodes = [c("eps", np.float32(1e-5)), c("two", np.float32(2.0)),
             helper.make_node("ReduceMean", ["x"], ["m"], axes=list(axes)),
             helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["p"]),
             helper.make_node("ReduceMean", ["p"], ["v"], axes=list(axes)),
             helper.make_node("Add", ["v", "eps"], ["ve"]),
             helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["n"], name="ln_div"),
             helper.make_node("Mul", ["n", "g"], ["ng"]),
             helper.make_node("Add", ["ng", "b"], ["y0"])]
    outs = ["y0", "d"] if keep_diff else ["y0"]
    return model(nodes, {"x": V(f(2, 5, 8) * 30), "g": K(gamma), "b": K(f(8))}, outs, opset=12)


@pytest.mark.parametrize("gamma,keep_diff,axes,fused", [
    (f(8), False, (-1,), 1),
    (f(5, 8), False, (-2, -1), 1),
    (f(2, 1, 8), False, (-1,), 0),  # gamma with a batch dim: not a per-feature scale
    (f(8), True, (-1,), 0),  # x - mean is also a graph output
    (f(8), False, (1,), 0),  # not the trailing axes
])
def test_decomposed_layer_norm_is_fused_only_when_exact(ct, gamma, keep_diff, axes, fused):
    m, feeds = _decomposed_layer_norm(gamma, keep_diff, axes)
    conv = _convert(ct, m)
    ops = {o.op_type for o in conv.program.functions["main"].operations}
    assert conv.fused == fused and ("layer_norm" in ops) == bool(fused)
    values = _convert(ct, m, evaluate=feeds).values
    ref = run_ort(m, feeds)
    for name, want in ref.items():
        np.testing.assert_allclose(values[name], want, rtol=1e-4, atol=1e-4)


def test_lstm_weights_reordered_for_mil_reproduce_onnxruntime():
    """MIL's documented LSTM (gates i, f, o, z; one summed bias; peephole i, f, o) run in numpy on the
    reordered weights gives ORT's outputs for an ONNX LSTM (gates i, o, f, c)."""
    from edgeopt.targets.coreml.ops_rnn import lstm_weights

    ins = _lstm_ins(1, peephole=True)
    m, feeds = one("LSTM", ins, n_out=3, hidden_size=5)
    want = run_ort(m, feeds)
    mw = lstm_weights(ins["w"].a, ins["r"].a, ins["b"].a, ins["p"].a, 0)

    def sig(v):
        return 1 / (1 + np.exp(-v))

    h, c = feeds["h0"][0].astype(np.float64), feeds["c0"][0].astype(np.float64)
    pi, pf, po = np.split(mw["peephole"], 3)
    ys = []
    for x in feeds["x"]:
        g = x @ mw["weight_ih"].T + h @ mw["weight_hh"].T + mw["bias"]
        gi, gf, go, gz = np.split(g, 4, axis=-1)
        i, f_ = sig(gi + pi * c), sig(gf + pf * c)
        c = f_ * c + i * np.tanh(gz)
        h = sig(go + po * c) * np.tanh(c)
        ys.append(h)
    np.testing.assert_allclose(np.stack(ys)[:, None], want["y0"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(h[None], want["y1"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(c[None], want["y2"], rtol=1e-4, atol=1e-5)


def test_bool_input_is_taken_as_int32_and_cast_at_the_boundary(ct):
    mask = np.array([[True, False, True], [False, False, True]])
    m, feeds = one("Where", {"c": V(mask), "x": V(f(2, 3)), "y": V(f(2, 3))})
    ref = run_ort(m, feeds)
    conv = _convert(ct, m)
    spec = next(s for s in conv.inputs if s["name"] == "c")
    assert spec["artifact_dtype"] == "int32"
    values = _convert(ct, m, evaluate=feeds).values
    np.testing.assert_allclose(np.asarray(values["y0"], np.float32), ref["y0"], rtol=1e-6)


def test_fold_uses_the_models_opset():
    # opset 12 Unsqueeze takes axes as an attribute; folded by the opset-13 schema it failed, and a
    # Shape -> Gather -> Unsqueeze -> Concat -> Reshape chain (ddddocr's CRNN) was refused as "computed"
    from edgeopt.targets.coreml.ops import fold

    node = helper.make_node("Unsqueeze", ["a"], ["b"], axes=[0])
    assert fold(node, {"a": np.array(3, np.int64)}, 12)[0].tolist() == [3]
