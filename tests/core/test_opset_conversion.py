"""A model stamped with an opset newer than ONNX Runtime reads (onnx 1.19 writes opset 24, ONNX Runtime 1.23
reads <= 23; issue 32): build converts it with onnx.version_converter and keeps the conversion only when
onnx.reference gives identical outputs before and after; a model the converter cannot take is refused in one
line naming the converter's reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import edgeopt
from edgeopt.api import support_matrix
from edgeopt.errors import ModelError
from edgeopt.model import inspect, verify_conversion


def _one_node(path, op: str, opset: int = 24, out: tuple = (2, 3, 4), **attrs):
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **attrs)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])  # IR 12: onnx's default
    onnx.save(m, str(path))
    return m


def test_opset24_model_converted_verified_and_recorded(tmp_path):
    path = tmp_path / "flat.onnx"
    _one_node(path, "Flatten", out=(6, 4), axis=2)
    rows = {r["target"]: r for r in support_matrix(inspect(path))}
    assert rows["cpu"]["supported"] and rows["cpu"]["format"] is None  # build converts it: not a refusal
    rep = edgeopt.build(str(path), "cpu", precision="fp32", dist=tmp_path / "d", jobs=1)
    man = rep.results[0].manifest
    conv = man["validation"]["source"]["opset_conversion"]
    assert man["validation"]["source"]["converted_from_opset"] == 24
    assert (conv["from_opset"], conv["to_opset"], conv["from_ir"], conv["to_ir"]) == (24, 23, 12, 11)
    assert conv["verified"].startswith("identical outputs: onnx.reference") and conv["samples"] >= 1
    assert any(n.startswith("converted from ONNX opset 24") for n in man["notes"])


def test_opset24_model_the_converter_cannot_take_is_refused_in_one_line(tmp_path):
    path = tmp_path / "swish.onnx"
    _one_node(path, "Swish")  # Swish-24 has no earlier version
    with pytest.raises(ModelError) as err:
        edgeopt.build(str(path), "cpu", precision="fp32", dist=tmp_path / "d", jobs=1)
    assert "\n" not in err.value.message and "No Previous Version of Swish" in err.value.message
    assert err.value.hint.startswith("re-export with opset <= 23")
    rows = {r["target"]: r for r in support_matrix(inspect(path))}
    assert not rows["cpu"]["supported"] and "version_converter cannot" in rows["cpu"]["format"]["message"]


def test_an_opset6_model_is_converted_up_to_what_onnx_runtime_implements(tmp_path):
    """onnx's pytorch-converted tests (opset 6, as torch exported in 2018) load in ONNX Runtime and lack kernels
    (AveragePool-1): build takes them up to opset 7 and keeps that only when onnx.reference agrees exactly."""
    path = tmp_path / "pool.onnx"
    _one_node(path, "AveragePool", opset=6, out=(2, 3, 2), kernel_shape=[2], strides=[2])
    m = onnx.load(str(path))
    m.ir_version = 3
    onnx.save(m, str(path))
    rows = {r["target"]: r for r in support_matrix(inspect(path))}
    assert rows["cpu"]["supported"] and rows["cpu"]["format"] is None
    rep = edgeopt.build(str(path), "cpu", precision="fp32", dist=tmp_path / "d", jobs=1)
    r = rep.results[0]
    assert r.status == "built", r.error
    conv = r.manifest["validation"]["source"]["opset_conversion"]
    assert (conv["from_opset"], conv["to_opset"]) == (6, 7) and conv["verified"].startswith("identical outputs")
    assert any("the oldest ONNX Runtime implements" in n for n in r.manifest["notes"])
    assert r.manifest["host_check"]["passed"]


def _bn6(path, is_test: int):
    """A torch-2018-style BatchNormalization-6, IR 3: its statistics are initializers also listed as inputs."""
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    stats = {n: numpy_helper.from_array((rng.random(3) + 0.5).astype(np.float32), n) for n in "sbmv"}
    g = helper.make_graph([helper.make_node("BatchNormalization", ["x", *"sbmv"], ["y"], epsilon=1e-5,
                                            is_test=is_test, momentum=0.9)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 4]),
                           *(helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in "sbmv")],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4, 4])], list(stats.values()))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 6)])
    m.ir_version = 3
    onnx.save(m, str(path))
    return m


def test_an_opset6_batchnorm_is_verified_and_built_its_ir3_initializer_inputs_dropped(tmp_path):
    """onnx.reference's BatchNormalization_6 (serving opsets 6-8) failed on every torch export (it ran the
    training branch): edgeopt's own for those opsets verifies the 6 -> 7 conversion; the IR 3 listing of the
    statistics as inputs is dropped (ONNX Runtime's saved graph asked for them as feeds)."""
    path = tmp_path / "bn.onnx"
    _bn6(path, is_test=1)
    rep = edgeopt.build(str(path), "cpu", precision="fp32", dist=tmp_path / "d", jobs=1)
    r = rep.results[0]
    assert r.status == "built" and r.manifest["host_check"]["passed"], r.error
    assert r.manifest["validation"]["source"]["opset_conversion"]["to_opset"] == 7
    assert any("4 initializer(s) listed as graph inputs too" in n for n in r.manifest["notes"])
    # is_test=0 is a training run (the batch's own statistics); BatchNormalization-7 with one output would be
    # inference: the converter refuses it, and the build says so in one line
    _bn6(tmp_path / "train.onnx", is_test=0)
    with pytest.raises(ModelError, match="cannot take it to opset 7: Attribute is_test must not have value 0") as err:
        edgeopt.build(str(tmp_path / "train.onnx"), "cpu", precision="fp32", dist=tmp_path / "d2", jobs=1)
    assert err.value.hint == "re-export with opset >= 7"


def test_a_conversion_that_changes_the_outputs_is_refused(tmp_path):
    original = _one_node(tmp_path / "a.onnx", "Flatten", out=(6, 4), axis=2)
    changed = _one_node(tmp_path / "b.onnx", "Flatten", opset=23, out=(2, 12), axis=1)  # stands in for a wrong adapter
    feeds = [{"x": np.arange(24, dtype=np.float32).reshape(2, 3, 4)}]
    with pytest.raises(ModelError, match=r"opset 24 -> 23 conversion .* changes the model's outputs"):
        verify_conversion(original, changed, feeds)
    same = _one_node(tmp_path / "c.onnx", "Flatten", opset=23, out=(6, 4), axis=2)
    assert verify_conversion(original, same, feeds)["max_abs_diff"] == 0.0


def test_the_version_converter_runs_in_a_child_and_its_refusal_is_a_reason(tmp_path):
    """onnx.version_converter is C++ (it segfaulted the bench process taking ReduceMin-18 to 17): it runs in a
    child process, and what it cannot do comes back as the one-line reason."""
    from edgeopt.model import conversion_error

    path = tmp_path / "rmin.onnx"
    g = helper.make_graph([helper.make_node("ReduceMin", ["x"], ["y"], keepdims=1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    why = conversion_error(path, 17, None)
    assert why and "\n" not in why
    assert conversion_error(path, None, 8) is None  # an IR stamp alone always can


def test_an_opset6_prelu_keeps_its_slope_per_channel(tmp_path):
    """PRelu-6's 1-D slope is per channel (torch's nn.PReLU(C)); from opset 7 it broadcasts from the last axis and
    onnx.version_converter does not reshape it (ONNX Runtime failed to broadcast [3] on [2, 3, 4]): the
    up-conversion writes it [C, 1] and the artifact computes the per-channel PReLU."""
    from onnx import numpy_helper

    slope = np.array([0.1, 0.2, 0.3], np.float32)
    g = helper.make_graph([helper.make_node("PRelu", ["x", "s"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])],
                          [numpy_helper.from_array(slope, "s")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 6)])
    onnx.save(m, str(tmp_path / "p.onnx"))
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 4)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    rep = edgeopt.build(str(tmp_path / "p.onnx"), "cpu", precision="fp32", dist=tmp_path / "d", jobs=1,
                        calib=str(tmp_path / "x.npz"))
    r = rep.results[0]
    assert r.status == "built", r.error
    from pathlib import Path

    import onnxruntime as ort
    art = Path(r.bundle) / r.manifest["runtime"]["artifact"]
    got = ort.InferenceSession(str(art), providers=["CPUExecutionProvider"]).run(None, {"x": x[0]})[0]
    want = np.where(x[0] > 0, x[0], x[0] * slope.reshape(3, 1))
    np.testing.assert_allclose(got, want, rtol=1e-6)
