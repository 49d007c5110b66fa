"""The observable share ``edgeopt debug`` prints, and onnx2tf's renaming the mobile map follows (no conversion:
plain data)."""

from __future__ import annotations


def _row(node: str, op: str, status: str, covers: list[str] | None = None) -> dict:
    return {"node": node, "op": op, "status": status, "outputs": [node + ":0"], "covers": covers or []}


def test_a_conv_fused_into_the_next_compared_node_is_observed_alone():
    from edgeopt.layerdiff import coverage

    rows = [_row("conv1", "Conv", "not observed"), _row("bn1", "BatchNormalization", "ok", ["conv1"]),
            _row("conv2", "Conv", "ok"), _row("mm", "MatMul", "not observed"), _row("add", "Add", "not observed"),
            _row("conv3", "Conv", "not observed"), _row("relu", "Relu", "FAIL", ["add", "mm", "conv3"])]
    c = coverage(rows)
    # conv1: alone in bn1's kernel; conv2: its own output; mm and conv3 share relu's row: neither is isolated
    assert (c["compute_nodes"], c["own_output"], c["fused"], c["observable"]) == (4, 1, 1, 2), c
    assert c["share"] == 0.5 and set(c["unobserved"]) == {"mm", "conv3"}


def test_onnx2tf_names_torch_tensors_as_it_renames_them():
    from edgeopt.targets.tflite.tensor_map import onnx2tf_name

    assert onnx2tf_name("/_blocks.0/_depthwise_conv/Conv_output_0") == "wa/_blocks.0/_depthwise_conv/Conv_output_0"
    assert onnx2tf_name("onnx::Conv_12") == "onnx____Conv_12"  # each ":" is "__"
    assert onnx2tf_name("conv2d_53.tmp_0") == "conv2d_53.tmp_0"
