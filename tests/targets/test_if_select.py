"""An If as both branches and a Where (targets.if_select): the same values, and the converters that
have no If (onnx2tf for mobile, Core ML's translator for apple) take the model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeopt.targets.if_select import rewrite, why_not

n = helper.make_node


def _verifier(path=None, else_shape=(1, 1), nested: bool = False) -> onnx.ModelProto:
    """openwakeword's pattern in small: score = Sigmoid(x @ w); If(score >= 0.5) a verifier on x reading an
    outer initializer, else the score itself."""
    rng = np.random.default_rng(0)
    then_nodes = [n("MatMul", ["x", "v"], ["h"]), n("Relu", ["h"], ["r"]), n("MatMul", ["r", "u"], ["z"]),
                  n("Sigmoid", ["z"], ["p2"])]
    if nested:
        inner = helper.make_graph([n("Identity", ["p2"], ["q"])], "inner", [],
                                  [helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 1])])
        then_nodes.append(n("If", ["cond"], ["p3"], then_branch=inner, else_branch=inner))
    then_g = helper.make_graph(then_nodes, "then", [],
                               [helper.make_tensor_value_info("p3" if nested else "p2", TensorProto.FLOAT, [1, 1])])
    else_g = helper.make_graph([n("Identity", ["score"], ["p1"])], "else", [],
                               [helper.make_tensor_value_info("p1", TensorProto.FLOAT, list(else_shape))])
    inits = [numpy_helper.from_array(rng.standard_normal((16, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "v"),
             numpy_helper.from_array(rng.standard_normal((8, 1)).astype(np.float32), "u"),
             numpy_helper.from_array(np.array([[0.5]], np.float32), "thr")]
    nodes = [n("MatMul", ["x", "w"], ["a"], name="mm"), n("Sigmoid", ["a"], ["score"], name="sig"),
             n("GreaterOrEqual", ["score", "thr"], ["cond"], name="ge"),
             n("If", ["cond"], ["out"], name="verifier", then_branch=then_g, else_branch=else_g)]
    g = helper.make_graph(nodes, "verifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 1])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    if path is not None:
        onnx.save(model, path)
    return model


def _inputs(k: int = 64) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((k, 1, 16)).astype(np.float32)


def test_the_rewrite_gives_the_same_values_on_both_branches():
    import onnxruntime as ort

    model = _verifier()
    flat, names = rewrite(model)
    assert names == ["verifier"] and not any(x.op_type == "If" for x in flat.graph.node)
    onnx.checker.check_model(flat, full_check=True)
    a, b = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]) for m in (model, flat))
    w = numpy_helper.to_array(model.graph.initializer[0])
    took_then = 0
    for x in _inputs():
        took_then += int(1 / (1 + np.exp(-(x @ w).item())) >= 0.5)
        assert np.array_equal(a.run(None, {"x": x})[0], b.run(None, {"x": x})[0])
    assert 0 < took_then < 64  # both branches were exercised


def test_ifs_it_cannot_rewrite_are_left_with_the_reason():
    assert "differ in shape" in why_not(_verifier(else_shape=(1, 2)).graph.node[-1])
    assert "nested subgraph" in why_not(_verifier(nested=True).graph.node[-1])
    model = _verifier(nested=True)
    assert rewrite(model) == (model, [])


def test_apple_takes_the_if_in_inspect_and_build(tmp_path):
    """Core ML's translator has no If: the support check (inspect's and build's) and the build agree."""
    pytest.importorskip("coremltools")
    from edgeopt.model import inspect
    from edgeopt.pipeline import build
    from edgeopt.targets.registry import get_backend, resolve_target

    _verifier(tmp_path / "v.onnx")
    spec = resolve_target("apple")
    assert get_backend(spec.backend).unsupported_nodes(inspect(tmp_path / "v.onnx"), spec.as_dict()) == []
    np.savez(tmp_path / "d.npz", x=_inputs(24))
    r = build(str(tmp_path / "v.onnx"), "apple", ["fp32"], calib=str(tmp_path / "d.npz"), out=tmp_path / "dist",
              jobs=1).results[0]
    assert r.ok, r.error
    assert any("verifier converted as both branches and a Where" in note for note in r.manifest["notes"])


def test_mobile_converts_the_if_and_its_check_passes(tmp_path):
    """onnx2tf failed inside its own code on such an If (openwakeword's hey-jarvis: KeyError on the branch's
    outer initializer); the rewritten copy converts and the TFLite file matches the model on both branches."""
    pytest.importorskip("onnx2tf")
    from edgeopt.pipeline import build

    _verifier(tmp_path / "v.onnx")
    np.savez(tmp_path / "d.npz", x=_inputs(24))
    r = build(str(tmp_path / "v.onnx"), "mobile", ["fp32"], calib=str(tmp_path / "d.npz"), out=tmp_path / "dist",
              jobs=1).results[0]
    assert r.ok, r.error
    assert r.manifest["host_check"]["passed"] is True
    assert any("converted as both branches and a Where" in note for note in r.manifest["notes"])


def test_a_scalar_condition_is_used_as_it_is():
    import onnxruntime as ort

    model = _verifier()
    sq = helper.make_tensor("no_axes", TensorProto.INT64, [2], [0, 1])
    model.graph.initializer.append(sq)
    model.graph.node.insert(3, n("Squeeze", ["cond", "no_axes"], ["cond0"], name="to_scalar"))
    model.graph.node[-1].input[0] = "cond0"
    flat, names = rewrite(model)
    assert names == ["verifier"] and not any(x.name == "verifier/cond" for x in flat.graph.node)
    a, b = (ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]) for m in (model, flat))
    for x in _inputs(16):
        assert np.array_equal(a.run(None, {"x": x})[0], b.run(None, {"x": x})[0])
