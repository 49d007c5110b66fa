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


def test_an_attention_block_run_as_one_kernel_is_one_observed_unit():
    from edgeopt.layerdiff import Node, attention_blocks, coverage

    # x -> q, k projections; scores = q·kᵀ / 8 + mask; softmax; ·v; an output projection
    nodes = [Node(0, "q", "MatMul", ["x", "wq"], ["q:0"]), Node(1, "k", "MatMul", ["x", "wk"], ["k:0"]),
             Node(2, "v", "MatMul", ["x", "wv"], ["v:0"]), Node(3, "qk", "MatMul", ["q:0", "k:0"], ["qk:0"]),
             Node(4, "div", "Div", ["qk:0", "eight"], ["div:0"]), Node(5, "mask", "Add", ["div:0", "m"], ["mask:0"]),
             Node(6, "sm", "Softmax", ["mask:0"], ["sm:0"]), Node(7, "av", "MatMul", ["sm:0", "v:0"], ["av:0"]),
             Node(8, "o", "MatMul", ["av:0", "wo"], ["o:0"])]
    blocks = attention_blocks(nodes)
    assert blocks == [("qk", "av")]
    # OpenVINO's ScaledDotProductAttention: q, k, v and o compared, the block's output compared at av, holding qk
    rows = [_row("q", "MatMul", "ok"), _row("k", "MatMul", "ok"), _row("v", "MatMul", "ok"),
            _row("qk", "MatMul", "not observed"), _row("div", "Div", "not observed"),
            _row("mask", "Add", "not observed"), _row("sm", "Softmax", "not observed"),
            _row("av", "MatMul", "FAIL", ["qk", "div", "mask", "sm"]), _row("o", "MatMul", "ok")]
    c = coverage(rows, blocks)
    assert (c["compute_nodes"], c["observable"]) == (6, 5) and c["unobserved"] == ["qk"], c  # per node: qk unseen
    assert (c["units"], c["units_observable"], c["attention_blocks"], c["attention_observed"]) == (5, 5, 1, 1), c
    # the same block, but the compared value also holds the output projection: the block is not isolated
    rows[-1] = _row("o", "MatMul", "ok", ["av", "qk", "div", "mask", "sm"])
    rows[7] = _row("av", "MatMul", "not observed")
    c = coverage(rows, blocks)
    assert (c["units"], c["units_observable"], c["attention_observed"]) == (5, 4, 0), c
    # no Softmax between two products: no block, no unit figures
    assert attention_blocks([n for n in nodes if n.op != "Softmax"]) == []


def test_a_jump_at_a_fused_attention_block_is_said_to_be_one():
    from types import SimpleNamespace

    from edgeopt.debug import _fused_text

    rows = [_row("qk", "MatMul", "not observed"), _row("sm", "Softmax", "not observed"),
            _row("av", "MatMul", "FAIL", ["qk", "sm"])]
    text = _fused_text(SimpleNamespace(nodes=rows), rows[-1])
    assert text.startswith(", fused with qk (MatMul), sm (Softmax)") and "attention block" in text, text
    assert "attention" not in _fused_text(SimpleNamespace(nodes=rows), _row("bn", "BatchNormalization", "ok", ["qk"]))
