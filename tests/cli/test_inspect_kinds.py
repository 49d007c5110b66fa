"""``inspect`` shows the output kinds a build would judge by (issue 39): found by the one function every build
records in its manifest (``targets.base.output_kinds``), on the ``--calib`` data split as ``--split`` says,
overridden by ``--output-kind``/``--decision``; a dynamic axis with no ``--shape`` says why there are none.

Real parts: a small two-headed model (a class distribution and a one-score logit, weights as initializers) run
by ONNX Runtime on real-valued data; the CLI as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeopt


def _two_heads(path, batch: int | str = 1):
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(size=(8, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(size=(8, 1)).astype(np.float32), "w2")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["l1"]), helper.make_node("Softmax", ["l1"], ["probs"], axis=-1),
         helper.make_node("MatMul", ["x", "w2"], ["presence"])],
        "two_heads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 3]),
         helper.make_tensor_value_info("presence", TensorProto.FLOAT, [batch, 1])], [w1, w2])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


@pytest.fixture
def data(tmp_path):
    x = np.random.default_rng(1).normal(size=(40, 1, 8)).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    return tmp_path / "d.npz"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "edgeopt", "inspect", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def test_inspect_shows_the_kinds_a_build_judges_by(tmp_path, data):
    model = _two_heads(tmp_path / "m.onnx")
    p = _cli(model, "--calib", data)
    assert p.returncode == 0, p.stderr
    assert "output kinds (data: npz arrays from " in p.stdout and "d.npz -> 1 calib + 16 val" in p.stdout
    assert "probs: classification@1" in p.stdout and "presence: decision@0" in p.stdout, p.stdout

    doc = json.loads(_cli(model, "--calib", data, "--json").stdout)
    assert doc["output_kinds"]["probs"]["kind"] == "classification"
    assert doc["output_kinds"]["presence"] == {"kind": "decision", "threshold": 0.0, "guess": "logit",
                                               "source": "inferred"}
    # the build records the same kinds in its manifest: one function
    rep = edgeopt.build(model, "cpu", precision="fp32", calib=str(data), dist=tmp_path / "dist")
    assert {n: k["kind"] for n, k in rep.results[0].manifest["output_kinds"].items()} == {
        n: k["kind"] for n, k in doc["output_kinds"].items()}

    info = edgeopt.inspect(model, calib=data, decision="presence=0.5", output_kind="probs=probability@0.2/0.8")
    assert info.output_kinds["presence"]["threshold"] == 0.5 and info.output_kinds["presence"]["source"] == "option"
    assert info.output_kinds["probs"]["thresholds"] == [0.2, 0.8]
    p = _cli(model, "--calib", data, "--output-kind", "probs=probability@0.2/0.8")
    assert "probs: probability@0.2/0.8  (given): class probabilities" in p.stdout, p.stdout
    assert (info.output_kinds["probs"].spec, info.output_kinds["probs"].source) == ("probability@0.2/0.8", "option")
    assert info.output_kinds["presence"].spec == "probability@0.5"  # a threshold in 0..1: a probability


def test_a_dynamic_axis_with_no_shape_says_why_and_a_bad_name_is_one_line(tmp_path, data):
    model = _two_heads(tmp_path / "dyn.onnx", batch="N")
    p = _cli(model)
    assert p.returncode == 0 and "output kinds: not inferred (the model has dynamic dimensions" in p.stdout
    assert "give --shape to see the output kinds" in p.stdout
    info = edgeopt.inspect(model, shape="x:1x8", calib=data)
    assert info.output_kinds["presence"]["kind"] == "decision"
    p = _cli(model, "--shape", "x:1x8", "--decision", "nosuch=0")
    assert p.returncode == 2 and "not an output of the model" in p.stderr and "Traceback" not in p.stderr
    p = _cli(model, "--no-kinds", "--json")
    assert "output_kinds" not in json.loads(p.stdout)
