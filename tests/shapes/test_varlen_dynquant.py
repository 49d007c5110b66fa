"""Issue 42's dynamic-INT8 case on a small encoder made here: ONNX Runtime's ``quantize_dynamic``
(DynamicQuantizeLinear + MatMulInteger) takes one activation scale over all positions, pads included, so the
real tokens' outputs move with the number of pads even though the graph masks the pads out of its mean. Its
static (padded) form is refused with that reason and its variable form (each sample at its own length) is built;
the same model before quantization passes in both forms. bench_varlen ``--part text`` shows it on MiniLM."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgeopt

L_MAX = 32


def _encoder(path: Path) -> Path:
    """ids, mask [1, L] -> masked mean of relu(embed(ids) @ W) [1, 16]; the [PAD] (id 0) embedding is large, as a
    transformer's pad positions' states are, so it sets the dynamic scale when pads are present."""
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(50, 16)).astype(np.float32)
    emb[0] = 1000.0
    w = rng.normal(size=(16, 16)).astype(np.float32) / 4
    nodes = [helper.make_node("Gather", ["E", "input_ids"], ["e"]),
             helper.make_node("MatMul", ["e", "W"], ["h0"]),
             helper.make_node("Relu", ["h0"], ["h"]),
             helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["mf", "ax"], ["m3"]),
             helper.make_node("Mul", ["h", "m3"], ["hm"]),
             helper.make_node("ReduceSum", ["hm", "one"], ["num"], keepdims=0),
             helper.make_node("ReduceSum", ["m3", "one"], ["den"], keepdims=0),
             helper.make_node("Div", ["num", "den"], ["embedding"])]
    g = helper.make_graph(
        nodes, "enc",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, "seq"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, 16])],
        [numpy_helper.from_array(emb, "E"), numpy_helper.from_array(w, "W"),
         numpy_helper.from_array(np.array([-1], np.int64), "ax"), numpy_helper.from_array(np.array([1], np.int64), "one")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    d = tmp_path_factory.mktemp("dynq")
    fp32 = _encoder(d / "enc.onnx")
    dq = d / "enc-dynq.onnx"
    quantize_dynamic(str(fp32), str(dq), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"])
    ops = {n.op_type for n in onnx.load(dq).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    rng = np.random.default_rng(1)
    lens = rng.integers(4, L_MAX + 1, size=20)
    ids, mask = np.empty(20, dtype=object), np.empty(20, dtype=object)
    for i, n in enumerate(lens):
        ids[i] = rng.integers(1, 50, size=(1, int(n))).astype(np.int64)
        mask[i] = np.ones((1, int(n)), np.int64)
    np.savez(d / "data.npz", input_ids=ids, attention_mask=mask)
    return d, fp32, dq, d / "data.npz"


def _build(model, data, dist, **kw):
    return edgeopt.build(str(model), "cpu", precision="fp32", shape=f"input_ids:1x1..{L_MAX},attention_mask:1x1..{L_MAX}",
                         calib=str(data), calib_count=6, val_count=12, dist=str(dist), raise_on_failure=False,
                         **kw).results[0]


def test_dynamic_int8_static_form_refused_for_the_pads_variable_form_built(made, tmp_path):
    _, _, dq, data = made
    r = _build(dq, data, tmp_path / "static", option=["shape_form=static"])
    assert r.status != "built" and r.refused
    assert "static (padded to the top): padding changes the answers" in r.error
    r = _build(dq, data, tmp_path / "auto")
    assert r.status == "built", r.error
    m = json.loads((Path(r.bundle) / "manifest.json").read_text())
    assert m["shape_form"]["form"] == "dynamic"
    assert m["shape_form"]["reason"] == "the static (padded) form was refused: padding changes the answers"
    per = m["host_check"]["per_length"]
    assert len({p["length"] for p in per}) >= 3 and all(p["length"] == p["ran_at"] for p in per)


def test_the_same_encoder_unquantized_passes_padded(made, tmp_path):
    """The mask keeps FP32's answers free of the pads: the refusal above is the dynamic quantization's."""
    _, fp32, _, data = made
    r = _build(fp32, data, tmp_path / "static", option=["shape_form=static"])
    assert r.status == "built", r.error


def test_int8_tolerance_sets_the_bound_an_already_quantized_model_is_judged_at(made, tmp_path):
    """An fp32/fp16 build of an already-quantized model is judged at the INT8 bound; ``--option int8_tolerance=...``
    is that bound as the user sets it (it was ignored: a tighter vector_cosine_min still built)."""
    _, _, dq, data = made
    r = _build(dq, data, tmp_path / "auto", option=["int8_tolerance=vector_cosine_min=0.9995"])
    m = json.loads((Path(r.bundle) / "manifest.json").read_text()) if r.bundle else {}
    assert (m.get("tolerance_override") or {}).get("vector_cosine_min") == 0.9995, (r.error, m.get("tolerance_override"))
