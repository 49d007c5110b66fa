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
