"""ONNX rewrites before onnx2tf (``targets.tflite.onnx_fixes``): same values in ONNX Runtime, and the
mobile builds they exist for pass their check.

- a multi-axis Slice after a Conv (magika's ``Conv_0/strided_slice_2``): onnx2tf applied the bounds in
  ONNX axis order to its NHWC tensor and kept 1 of the channels (cosine 0.003 on magika);
- Clip bounds of FLT_MAX ("no bound"; TFLite's float16 file stores 65504, a real bound) and a bound
  computed at run time (``max(db) - 80``, a log-mel's floor, which onnx2tf dropped): openwakeword's
  melspectrogram fp16 was refused at rel_l2 0.23.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeopt.targets.tflite import onnx_fixes
from tests.targets.test_tflite import needs_tflite

BIG = 2**31 - 1
FLT_MAX = float(np.finfo(np.float32).max)


def _model(nodes, inits, x_shape, y_shape, path=None):
    g = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    if path is not None:
        onnx.save(m, path)
    return m


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def conv_slice(cut_channels: bool):
    """Conv1d then one Slice over three axes; ``cut_channels``: it cuts channels and time, else it is a
    no-op on every axis but the last, which is 1 wide after a [C, T, 1] view (magika's pattern)."""
    w = np.random.default_rng(0).standard_normal((8, 4, 3)).astype(np.float32)
    if cut_channels:
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                 helper.make_node("Slice", ["c", "st", "en", "ax"], ["s"], name="slice"),
                 helper.make_node("Relu", ["s"], ["y"], name="relu")]
        inits = [_i64("st", [0, 2, 1]), _i64("en", [BIG, 5, 20]), _i64("ax", [0, 1, 2])]
    else:
        nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
                 helper.make_node("Unsqueeze", ["c", "u"], ["c4"], name="view"),
                 helper.make_node("Slice", ["c4", "st", "en", "ax"], ["s"], name="slice"),
                 helper.make_node("Relu", ["s"], ["y"], name="relu")]
        inits = [_i64("u", [3]), _i64("st", [0, 0, 0, 0]), _i64("en", [BIG, BIG, BIG, 1]), _i64("ax", [0, 1, 2, 3])]
    return nodes, [numpy_helper.from_array(w, "w"), *inits]


def log_mel_floor():
    """power = x^2 clipped to [1e-10, FLT_MAX], dB, then clipped to [max(dB) - 80, FLT_MAX]."""
    nodes = [helper.make_node("Mul", ["x", "x"], ["p"]),
             helper.make_node("Clip", ["p", "eps", "fmax"], ["pc"], name="clip_power"),
             helper.make_node("Log", ["pc"], ["ln"]),
             helper.make_node("Mul", ["ln", "k"], ["db"]),
             helper.make_node("ReduceMax", ["db"], ["top"], keepdims=0),
             helper.make_node("Sub", ["top", "range"], ["floor"]),
             helper.make_node("Clip", ["db", "floor", "fmax"], ["y"], name="clip_floor")]
    f = lambda n, v: numpy_helper.from_array(np.array(v, np.float32), n)  # noqa: E731
    return nodes, [f("eps", 1e-10), f("fmax", FLT_MAX), f("k", 10 / np.log(10)), f("range", 80.0)]


def _run(model, x):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def loud_and_quiet(n: int) -> np.ndarray:
    """[n, 1, 64]: amplitudes up to 3e3 (power ~1e7 > 65504) beside near-silence (the 80 dB floor binds)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((n, 1, 64)).astype(np.float32) * 3e3
    x[:, :, :16] *= 1e-5
    return x


def test_multi_axis_slices_become_one_slice_per_axis_with_the_same_values():
    m = _model(*conv_slice(True), [1, 4, 32], [1, 3, 19])
    x = np.random.default_rng(2).standard_normal((1, 4, 32)).astype(np.float32)
    before = _run(m, x)
    assert onnx_fixes.split_slices(m) == 1
    slices = [n for n in m.graph.node if n.op_type == "Slice"]
    assert len(slices) == 2  # channels and time; the batch axis is not cut
    assert all(numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == s.input[3])).size == 1
               for s in slices)
    np.testing.assert_array_equal(_run(m, x), before)


def test_a_slice_that_cuts_nothing_becomes_an_identity():
    m = _model(*conv_slice(False), [1, 4, 32], [1, 8, 30, 1])
    x = np.random.default_rng(2).standard_normal((1, 4, 32)).astype(np.float32)
    before = _run(m, x)
    assert onnx_fixes.rewrite(m) and not any(n.op_type == "Slice" for n in m.graph.node)
    np.testing.assert_array_equal(_run(m, x), before)


def test_single_axis_slices_and_models_without_the_patterns_are_left_alone():
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"], name="one")]
    m = _model(nodes, [_i64("st", [1]), _i64("en", [5]), _i64("ax", [1])], [1, 8], [1, 4])
    assert onnx_fixes.rewrite(m) == [] and [n.op_type for n in m.graph.node] == ["Slice"]


def test_clip_sentinels_are_dropped_and_a_computed_bound_becomes_max():
    m = _model(*log_mel_floor(), [1, 64], [1, 64])
    x = loud_and_quiet(1)[0]
    before = _run(m, x)
    assert (before > before.max() - 80.0 + 1e-3).mean() < 1  # the floor binds on this input
    done = onnx_fixes.rewrite(m)
    assert len(done) == 2 and "2 Clip bound(s) of +-FLT_MAX" in done[0] and "1 Clip(s) with a bound computed" in done[1]
    ops = [n.op_type for n in m.graph.node]
    assert ops.count("Clip") == 1 and "Max" in ops and "Min" not in ops
    clip = next(n for n in m.graph.node if n.op_type == "Clip")
    assert list(clip.input) == ["p", "eps"]  # no FLT_MAX left for float16 to turn into 65504
    np.testing.assert_allclose(_run(m, x), before, rtol=0, atol=0)


@needs_tflite
@pytest.mark.parametrize("which, precision", [("slice", "fp32"), ("clip", "fp16")])
def test_mobile_builds_the_patterns_onnx2tf_got_wrong(which, precision, tmp_path):
    """Before the rewrites: the Slice model converted to a tensor of the wrong width (1 of 8 channels
    kept in magika's case); the log-mel's fp16 file capped the power at 65504 and lost the floor."""
    from edgeopt.pipeline import build

    if which == "slice":
        _model(*conv_slice(True), [1, 4, 32], [1, 3, 19], tmp_path / "m.onnx")
        data = np.random.default_rng(3).standard_normal((24, 1, 4, 32)).astype(np.float32)
    else:
        _model(*log_mel_floor(), [1, 64], [1, 64], tmp_path / "m.onnx")
        data = loud_and_quiet(24)
    np.savez(tmp_path / "d.npz", x=data)
    res = build(str(tmp_path / "m.onnx"), "mobile", [precision], calib=str(tmp_path / "d.npz"), out=tmp_path / "out",
                jobs=1).results[0]
    assert res.status == "built", res.error
    hc = res.manifest["host_check"]
    assert hc["passed"], hc["summary"]
    assert hc["outputs"]["y"]["metrics"]["rel_l2"] < 1e-3
    assert any("rewritten to the same values" in n for n in res.manifest["notes"]), res.manifest["notes"]
