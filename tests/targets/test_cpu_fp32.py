"""The ``cpu`` FP32 artifact: ORT's offline-optimized graph, saved only when it loads again."""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")


def _model(path):
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def _unloadable(ort_mod, src, dst, level):
    """What the extended level did to two real models: a saved file whose tensors point at external
    data that is not there (ORT refuses to load it)."""
    m = onnx.load(str(src))
    onnx.save(m, str(dst), save_as_external_data=True, all_tensors_to_external_data=True, location="gone.bin",
              size_threshold=0)
    (dst.parent / "gone.bin").unlink()


def test_saved_graph_that_does_not_load_falls_back_and_says_so(tmp_path):
    from edgeopt.targets.onnxruntime import loads, optimize, optimize_loadable

    src = _model(tmp_path / "m.onnx")
    dst = tmp_path / "out" / "model.onnx"
    dst.parent.mkdir()
    calls = []

    def save(ort_mod, s, d, level):
        calls.append(level)
        (_unloadable if level == "extended" else optimize)(ort_mod, s, d, level)

    level, notes = optimize_loadable(ort, src, dst, save=save)
    assert calls == ["extended", "basic"] and level == "basic"
    assert loads(ort, dst) is None and len(notes) == 1 and "extended-level offline graph could not be loaded" in notes[0]
    y = ort.InferenceSession(str(dst)).run(None, {"x": np.ones((1, 4), np.float32)})[0]
    assert np.allclose(y, np.arange(12).reshape(4, 3).sum(0))


def test_plain_model_keeps_the_extended_level(tmp_path):
    from edgeopt.targets.onnxruntime import optimize_loadable

    src = _model(tmp_path / "m.onnx")
    assert optimize_loadable(ort, src, tmp_path / "o.onnx") == ("extended", [])


def test_already_quantized_model_is_seen_refused_a_second_int8_pass_and_judged_at_int8(tmp_path):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from edgeopt.model import inspect
    from edgeopt.pipeline import build

    rng = np.random.default_rng(0)
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(rng.normal(size=(64, 32)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                              "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), tmp_path / "f.onnx")
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"), weight_type=QuantType.QInt8)
    info = inspect(tmp_path / "q.onnx")
    assert info.quantized.get("MatMulInteger") == 1 and info.quantized.get("DynamicQuantizeLinear") == 1
    assert inspect(tmp_path / "f.onnx").quantized == {}

    rep = build(str(tmp_path / "q.onnx"), "cpu", ["int8", "fp32"], out=tmp_path / "out", jobs=1)
    by = {r.precision: r for r in rep.results}
    assert by["int8"].status == "failed"
    assert by["int8"].error.startswith("the model is already quantized (DynamicQuantizeLinear x1, MatMulInteger x1)")
    assert by["fp32"].status == "built", by["fp32"].error
    m = by["fp32"].manifest
    assert m["quantized_model"] and m["tolerance_override"]["cosine_min"] == 0.97
    assert m["host_check"]["tolerance"]["cosine_min"] == 0.97
