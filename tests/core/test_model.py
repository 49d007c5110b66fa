"""Model loading, validation and inspection on real fixture models and broken files."""

from __future__ import annotations

import pytest

from edgeopt.cli import main
from edgeopt.errors import ModelError, UsageError
from edgeopt.model import inspect, load, parse_shapes, static_input_shapes
from tests.conftest import fixture, tiny_cnn


def test_load_refuses_missing_file(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        load(tmp_path / "nope.onnx")


def test_load_refuses_non_onnx_file(tmp_path):
    p = tmp_path / "notes.onnx"
    p.write_text("this is a text file, not a model\n" * 20)
    with pytest.raises(ModelError, match="not a readable ONNX model|no ONNX graph"):
        load(p)


def test_load_refuses_truncated_model(tmp_path):
    src = fixture("ocr-cls").read_bytes()
    p = tmp_path / "cut.onnx"
    p.write_bytes(src[: len(src) // 3])
    with pytest.raises(ModelError):
        load(p)


def test_load_refuses_model_failing_checker(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4])])  # y != z
    p = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(p))
    with pytest.raises(ModelError, match="checker"):
        load(p)


def _one_node(tmp_path, node, x_shape, y_shape, opset):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)])
    p = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), str(p))
    return p


def test_load_refuses_a_node_shape_inference_rejects_as_onnx_runtime_would(tmp_path):
    """onnx 1.23's DFT-19 test sets onesided and inverse together: the checker passes it, ONNX's strict shape
    inference -- which ONNX Runtime runs when it loads a model -- does not, so no FP32 reference can be computed
    (the build used to fail later with 'no ONNX Runtime graph of this model loads again')."""
    import onnxruntime as ort
    from onnx import helper

    p = _one_node(tmp_path, helper.make_node("DFT", ["x"], ["y"], axis=1, inverse=1, onesided=1),
                  [1, 8, 1], [1, 8, 2], 19)
    with pytest.raises(Exception, match="is_onesided and inverse"):  # the fact the refusal stands on
        ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
    with pytest.raises(ModelError, match="shape inference rejects a node.*DFT.*is_onesided and inverse"):
        load(p)


def test_load_keeps_a_declared_shape_onnx_runtime_merges_leniently(tmp_path):
    """A declared output shape that disagrees with the inferred one: ONNX Runtime warns and loads it, so load
    does too (only a node's own inference error is a refusal)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import helper

    p = _one_node(tmp_path, helper.make_node("Relu", ["x"], ["y"]), [1, 3], [1, 2], 17)
    got = ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, {"x": np.ones((1, 3), "f")})
    assert got[0].shape == (1, 3)
    assert load(p).graph.node[0].op_type == "Relu"


def test_inspect_reports_real_model():
    info = inspect(fixture("ocr-rec"))
    assert info.opset == 12
    assert info.inputs[0].name == "x" and info.inputs[0].shape[1] == 3
    assert "MatMul" in info.op_histogram and "Softmax" in info.op_histogram
    assert info.parameters > 1_000_000
    assert "character" in info.metadata


def test_inspect_counts_flops_of_tiny_model(tmp_path):
    info = inspect(tiny_cnn(tmp_path / "t.onnx"))
    # conv: 2 * (8*32*32) outputs * 3*3*3 MACs; gemm: 2 * 10 * 8
    assert info.flops == 2 * 8 * 32 * 32 * 27 + 2 * 10 * 8


def test_dynamic_dims_without_shape_name_them_and_the_flag():
    info = inspect(fixture("ocr-det"))
    with pytest.raises(UsageError) as e:
        static_input_shapes(info, {})
    assert "--shape x:" in str(e.value)


def test_shape_flag_parses_and_checks_rank():
    assert parse_shapes(["x:1x3x48x192"]) == {"x": [1, 3, 48, 192]}
    info = inspect(fixture("ocr-cls"))
    with pytest.raises(UsageError, match="rank"):
        static_input_shapes(info, {"x": [1, 3, 48]})
    with pytest.raises(UsageError, match="bad --shape"):
        parse_shapes(["x:1xAx3"])


def test_cli_inspect_json_lists_support_matrix(capsys):
    import json

    assert main(["inspect", str(fixture("ocr-cls")), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = {r["target"] for r in data["support"]}
    assert {"cpu", "intel-cpu", "jetson-orin", "apple", "android"} <= names


def test_cli_bad_model_is_one_line_exit_2(tmp_path, capsys):
    p = tmp_path / "x.onnx"
    p.write_bytes(b"\x08\x07garbage" * 10)
    assert main(["inspect", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edgeopt: error:") and "Traceback" not in err
