"""`edgeopt debug` on mobile compares intermediates, not only graph outputs: the build records which ONNX tensor
each TFLite tensor computes (``tensor_map.json`` in the bundle, from onnx2tf's own table, checked by value against
the source model: onnxsim folds bn2 into conv2 and conv2's output name then holds bn2's value), and a planted
fault (conv2's filter 0 flipped in the model the bundle is built from) is named by its node -- the
BatchNormalization's row, conv2 fused into its kernel -- when the bundle is compared against the clean model;
against the model it was built from, nothing jumps (no tensor is mapped to the wrong ONNX tensor)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("onnx2tf")


def _net(path: Path, fault: bool = False) -> None:
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    w2 = (rng.standard_normal((8, 8, 3, 3)) * 0.3).astype(np.float32)
    w3 = (rng.standard_normal((4, 8, 1, 1)) * 0.3).astype(np.float32)
    bn = [rng.uniform(0.5, 1.5, 8).astype(np.float32), (rng.standard_normal(8) * 0.2).astype(np.float32),
          (rng.standard_normal(8) * 0.2).astype(np.float32), rng.uniform(0.5, 1.5, 8).astype(np.float32)]
    if fault:
        w2[0] = -2.0 * w2[0]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (w3, "w3"), *zip(
        bn, ("bn_s", "bn_b", "bn_m", "bn_v")))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c1"], ["s1"], name="sig1"),
             helper.make_node("Conv", ["s1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c2", "bn_s", "bn_b", "bn_m", "bn_v"], ["b2"], name="bn2"),
             helper.make_node("Tanh", ["b2"], ["t2"], name="tanh2"),
             helper.make_node("Conv", ["t2", "w3"], ["y"], name="conv3")]
    g = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))


def test_mobile_debug_maps_intermediates_and_names_the_faulty_conv(tmp_path):  # ~25 s (one onnx2tf run)
    from edgeopt import api
    from edgeopt.debug import debug_bundle

    _net(tmp_path / "clean.onnx")
    _net(tmp_path / "net.onnx", fault=True)
    rep = api.build(str(tmp_path / "net.onnx"), "mobile", precision="fp32", dist=str(tmp_path / "d"),
                    allow_mismatch=True, raise_on_failure=False, val_count=8, calib_count=8)  # as the INT8 test: one onnx2tf run
    assert rep.results and rep.results[0].bundle, rep.results
    bundle = Path(rep.results[0].bundle)
    tmap = json.loads((bundle / "tensor_map.json").read_text())
    assert {"c1", "s1", "b2", "t2"} <= set(tmap["tensors"]), tmap  # TFLite tensors of these ONNX tensors
    assert "c2" not in tmap["tensors"]  # conv2's own output exists nowhere in the file: bn2 is folded into it

    same = debug_bundle(str(bundle), str(tmp_path / "net.onnx"), samples=4, progress=lambda s: None, judge=False)
    assert same.first_jump is None, same.first_jump  # every mapped tensor holds its ONNX tensor's value
    assert same.coverage["observable"] == same.coverage["compute_nodes"] == 3, same.coverage

    result = debug_bundle(str(bundle), str(tmp_path / "clean.onnx"), samples=4, progress=lambda s: None)
    compared = [n for n in result.nodes if n.get("status") in ("ok", "FAIL")]
    assert len(compared) >= 4, result.nodes  # intermediates, not only the graph output
    jump = result.first_jump
    assert jump is not None and jump["node"] == "bn2" and "conv2" in jump["covers"], jump
    before = [n for n in result.nodes if n.get("node") in ("conv1", "sig1") and n.get("status") in ("ok", "FAIL")]
    assert len(before) == 2 and all(n["status"] == "ok" for n in before)  # upstream of the fault: equal
    from edgeopt.debug import summary

    assert "first jump: bn2 (BatchNormalization), fused with conv2 (Conv)" in summary(result)


def test_mobile_int8_debug_dequantizes_and_names_the_faulty_conv(tmp_path):  # ~35 s (onnx2tf, then INT8)
    """A full-integer INT8 file keeps the map: its tensors are read dequantized (scale, zero point), the planted
    fault is the first jump and nothing upstream of it passes the INT8 bound."""
    from edgeopt import api
    from edgeopt.debug import debug_bundle

    _net(tmp_path / "clean.onnx")
    _net(tmp_path / "net.onnx", fault=True)
    rep = api.build(str(tmp_path / "net.onnx"), "mobile", precision="int8", dist=str(tmp_path / "d"),
                    allow_mismatch=True, raise_on_failure=False, val_count=8, calib_count=8,
                    option=["int8_mode=full"])
    assert rep.results and rep.results[0].bundle, rep.results
    bundle = Path(rep.results[0].bundle)
    result = debug_bundle(str(bundle), str(tmp_path / "clean.onnx"), samples=4, progress=lambda s: None, judge=False)
    jump = result.first_jump
    assert jump is not None and jump["node"] == "bn2" and "conv2" in jump["covers"], jump
    rows = {n["node"]: n for n in result.nodes}
    assert rows["conv1"]["status"] == "ok" and rows["sig1"]["status"] == "ok", rows
    assert rows["sig1"]["rel_l2"] < 0.1  # dequantized INT8 values, not raw int8 codes


def _embeddings(path: Path) -> None:
    """A BERT's embedding sum in small: x + position table (add1), + token-type row (add2), then a projection."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(a, n) for a, n in (
        (rng.standard_normal((1, 8, 16)).astype(np.float32), "pos"),
        ((rng.standard_normal((1, 1, 16)) * 0.3).astype(np.float32), "typ"),
        ((rng.standard_normal((16, 16)) * 0.3).astype(np.float32), "w"))]
    nodes = [helper.make_node("Add", ["x", "pos"], ["a1"], name="add1"),
             helper.make_node("Add", ["a1", "typ"], ["a2"], name="add2"),
             helper.make_node("MatMul", ["a2", "w"], ["m"], name="mm"),
             helper.make_node("Tanh", ["m"], ["y"], name="tanh")]
    g = helper.make_graph(nodes, "emb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))


def test_two_folded_constant_adds_map_to_the_value_the_file_holds(tmp_path):  # ~30 s (onnx2tf, twice)
    """all-MiniLM-L6-v2 on mobile named its first embedding Add as the first jump against its own model: the TFLite
    converter folds (x + pos) + typ into one Add that keeps add1's name and holds add2's value.  The map is checked
    on the written file's values (tensor_map.check_values): that tensor is add2's, add1 is not observed, and debug
    against the model the bundle was built from finds no jump."""
    from edgeopt import api
    from edgeopt.debug import debug_bundle

    _embeddings(tmp_path / "emb.onnx")
    rep = api.build(str(tmp_path / "emb.onnx"), "mobile", precision="fp32", dist=str(tmp_path / "d"),
                    allow_mismatch=True, raise_on_failure=False, val_count=4, calib_count=4)
    bundle = Path(rep.results[0].bundle)
    tmap = json.loads((bundle / "tensor_map.json").read_text())
    assert "a2" in tmap["tensors"] and "a1" not in tmap["tensors"], tmap
    assert tmap["tensors"]["a2"]["name"].endswith("add/Add") and tmap["source"]["value_moved"] == 1, tmap
    result = debug_bundle(str(bundle), str(tmp_path / "emb.onnx"), samples=2, progress=lambda s: None, judge=False)
    assert result.first_jump is None, result.first_jump
    status = {n.get("node"): n.get("status") for n in result.nodes}
    assert status["add1"] == "not observed" and status["add2"] == status["mm"] == "ok", status
