"""Every refusal on accuracy ends its hint with the ``edgeopt debug`` command that localises it (issue 30
item 4), and that command works: on cpu INT8 ``--allow-mismatch`` (which debug builds with) keeps the most
accurate variant, so the layer-by-layer comparison has an artifact to read."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from edgeopt.targets.base import debug_command
from tests.targets.test_qdq_search import outlier_net

TIGHT = "cosine_min=0.999999,rel_l2_max=0.0001"  # no INT8 of outlier_net meets it, not even all-float


def _command(error: str) -> list[str]:
    hint = error.split("hint:", 1)[1]
    assert "to see which node breaks it: edgeopt debug " in hint
    return shlex.split(hint.split("to see which node breaks it: ", 1)[1].splitlines()[0])


def test_an_int8_search_refusal_names_edgeopt_debug_and_that_command_finds_the_node(tmp_path):
    from edgeopt.debug import debug_model
    from edgeopt.pipeline import build

    outlier_net(tmp_path / "o.onnx")
    opts = {"int8_tolerance": TIGHT, "int8_budget_s": 30}
    res = build(tmp_path / "o.onnx", "cpu", ["int8"], out=tmp_path / "d", options=opts, force=True, jobs=1,
                progress=lambda s: None).results[0]
    assert res.status == "failed" and res.refused and "no INT8 variant the accuracy policy accepts" in res.error
    argv = _command(res.error)
    assert argv[:3] == ["edgeopt", "debug", str((tmp_path / "o.onnx").resolve())]
    assert argv[3:7] == ["--target", "cpu", "--precision", "int8"] and argv[-1] == "--force"
    assert f"int8_tolerance={TIGHT}" in argv and "--shape" not in argv  # static input: no --shape needed

    # what that command runs: the bundle is kept (the most accurate variant), and conv2 -- the node whose
    # INT8 input breaks the output (see outlier_net) -- is where the error first jumps
    bundle, result = debug_model(str(tmp_path / "o.onnx"), "cpu", "int8", dist=str(tmp_path / "dbg"),
                                 options=[f"{k}={v}" for k, v in opts.items()], force=True, progress=lambda s: None)
    assert Path(bundle, "model.onnx").is_file()
    assert result.first_jump is not None, result.notes
    assert result.first_jump["node"] in ("conv1", "relu1", "conv2", "relu2"), result.first_jump


def test_a_failed_host_check_names_edgeopt_debug_with_the_shapes_the_model_leaves_dynamic(tmp_path, monkeypatch):
    """x + RandomNormalLike(x) (every run differs from the reference: the host check always fails) with a
    dynamic batch axis: the hint's command has the --shape of that axis and the --calib the build used."""
    from edgeopt.pipeline import build

    monkeypatch.setenv("EDGEOPT_SUPPORT_RULES", "off")  # the support rules refuse a random op up front

    nodes = [helper.make_node("RandomNormalLike", ["x"], ["n"], name="noise"),
             helper.make_node("Add", ["x", "n"], ["y"], name="add")]
    g = helper.make_graph(nodes, "noisy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 16])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "noisy.onnx"))
    data = tmp_path / "data.npz"
    np.savez(data, x=np.random.default_rng(1).standard_normal((12, 2, 16)).astype(np.float32))

    res = build(tmp_path / "noisy.onnx", "cpu", ["fp32"], shapes={"x": [2, 16]}, calib=str(data),
                out=tmp_path / "d", force=True, jobs=1, progress=lambda s: None).results[0]
    assert res.status == "check-failed" and res.error.startswith("host check failed: ")
    argv = _command(res.error)
    assert argv[3:7] == ["--target", "cpu", "--precision", "fp32"]
    assert argv[argv.index("--shape") + 1] == "x:2x16" and argv[argv.index("--calib") + 1] == str(data)


def test_debug_command_leaves_out_the_pipelines_own_options(tmp_path):
    cmd = debug_command(str(tmp_path / "m.onnx"), "mobile", "fp16", {"inputs": [{"name": "x", "shape": [1, 8]}]},
                        {"kind": "random"}, {"allow_mismatch": True, "check_timeout": 60, "onnx2tf_fixes": False})
    argv = shlex.split(cmd)  # the model cannot be read here: every input's shape is given
    assert argv == ["edgeopt", "debug", str(tmp_path / "m.onnx"), "--target", "mobile", "--precision", "fp16",
                    "--shape", "x:1x8", "--option", "onnx2tf_fixes=false", "--force"]


def test_an_openvino_int8_refusal_names_edgeopt_debug_and_that_command_finds_the_node(tmp_path):
    """intel-cpu INT8 (NNCF): the same as on cpu -- the refusal's hint names the command, and under
    --allow-mismatch the variant closest to the bound is kept so that the command has an IR to compare."""
    from edgeopt.debug import debug_model
    from edgeopt.pipeline import build

    outlier_net(tmp_path / "o.onnx")
    opts = {"int8_tolerance": TIGHT, "int8_budget_s": 60}
    res = build(tmp_path / "o.onnx", "intel-cpu", ["int8"], out=tmp_path / "d", options=opts, force=True, jobs=1,
                progress=lambda s: None).results[0]
    assert res.status == "failed" and res.refused and "no variant the accuracy policy accepts" in res.error
    argv = _command(res.error)
    assert argv[3:7] == ["--target", "intel-cpu", "--precision", "int8"]

    bundle, result = debug_model(str(tmp_path / "o.onnx"), "intel-cpu", "int8", dist=str(tmp_path / "dbg"),
                                 options=[f"{k}={v}" for k, v in opts.items()], force=True, progress=lambda s: None)
    manifest = (Path(bundle) / "manifest.json").read_text()
    assert "kept because of --allow-mismatch" in manifest
    assert result.first_jump is not None, result.notes
