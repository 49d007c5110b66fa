"""``auto`` is the most efficient precision that holds: a target whose default (intel-cpu: INT8) is refused on
accuracy gets the next wider precision built, and says what was refused; a precision asked for by name is
never swapped for another."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("openvino")


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """A model ONNX Runtime's dynamic quantizer already made INT8: a second INT8 pass is refused."""
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    d = tmp_path_factory.mktemp("q")
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(64, 32)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
                              "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), d / "f.onnx")
    quantize_dynamic(str(d / "f.onnx"), str(d / "q.onnx"), weight_type=QuantType.QInt8)
    return d / "q.onnx"


def test_fallback_order():
    from edgeopt.pipeline import fallback_precision
    from edgeopt.targets.registry import resolve_target

    cpu, ov, trt, h100 = (resolve_target(n) for n in ("cpu", "intel-cpu", "jetson-orin", "h100"))
    assert fallback_precision(ov, "int8") == "fp32"  # a CPU runs FP16 weights in FP32: no gain
    assert fallback_precision(trt, "int8") == "fp16" and fallback_precision(trt, "fp16") == "fp32"
    assert fallback_precision(h100, "fp8") == "int8"
    assert fallback_precision(cpu, "fp32") is None


def test_auto_int8_refused_builds_fp32_and_says_why(quantized, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEOPT_CACHE_DIR", str(tmp_path / "cache"))
    from edgeopt.pipeline import build

    lines: list[str] = []
    rep = build(str(quantized), "intel-cpu", None, out=tmp_path / "dist", jobs=1, progress=lines.append)
    (res,) = rep.results
    assert rep.ok and res.status == "built" and res.precision == "fp32", res.error
    assert res.fallback_from["precision"] == "int8"
    assert res.fallback_from["error"].startswith("the model is already quantized")
    assert any("auto chose int8, which was refused" in w and "built fp32 instead" in w for w in rep.warnings)
    assert any("refused; building fp32 instead" in s for s in lines)
    assert (tmp_path / "dist" / "q" / "intel-cpu-fp32" / "manifest.json").is_file()
    assert not (tmp_path / "dist" / "q" / "intel-cpu-int8").exists()

    # the refusal is cached: a second auto build falls back again without re-running the INT8 pass
    again = build(str(quantized), "intel-cpu", "auto", out=tmp_path / "dist", jobs=1)
    assert again.ok and again.results[0].precision == "fp32" and again.results[0].fallback_from


def test_int8_asked_by_name_is_not_swapped(quantized, tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEOPT_CACHE_DIR", str(tmp_path / "cache"))
    from edgeopt.pipeline import build

    rep = build(str(quantized), "intel-cpu", "int8", out=tmp_path / "dist", jobs=1)
    (res,) = rep.results
    assert not rep.ok and res.precision == "int8" and res.refused and res.fallback_from is None


def test_cli_json_shows_the_fallback_and_exits_0(quantized, tmp_path):
    env = {**os.environ, "EDGEOPT_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "edgeopt", "build", str(quantized), "-t", "intel-cpu", "--json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    (res,) = doc["results"]
    assert res["precision"] == "fp32" and res["fallback_from"]["precision"] == "int8"
