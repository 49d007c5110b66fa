"""`edgeopt debug` on real runtimes: a planted fault (one weight of one Conv changed) is named as the first
node past the bound, on cpu (the fault planted inside the built artifact) and intel-cpu (the IR built from a
model with the fault); a clean bundle passes; windows bounded by memory give the same figures as one window;
--reduce cuts a subgraph of a handful of nodes that fails alone.  Real model: PP-OCR's text-orientation
classifier (ocr-cls, 0.6 MB, 53 Conv), its validation data as the bundle carries it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import fixture

SHAPE = ["x:1x3x48x192"]


def _build(model: Path, target: str, dist: Path) -> Path:
    from edgeopt import api

    rep = api.build(str(model), target, precision="fp32", shapes=SHAPE, dist=str(dist), allow_mismatch=True,
                    raise_on_failure=False, val_count=4, calib_count=4)
    assert rep.results and rep.results[0].bundle, rep.results
    return Path(rep.results[0].bundle)


def _bump_weight(tensor):
    """Flip output channel 0's filter, doubled (in place on the TensorProto): a channel that ReLU kept at 0
    comes alive, a live one dies -- a change no input can hide (one element alone can meet a dead input)."""
    from onnx import numpy_helper

    w = numpy_helper.to_array(tensor).copy()
    w[0] = -2.0 * w[0]
    tensor.CopyFrom(numpy_helper.from_array(w, tensor.name))


@pytest.fixture(scope="module")
def cls_model() -> Path:
    return fixture("ocr-cls")


@pytest.fixture(scope="module")
def cpu_bundle(cls_model, tmp_path_factory) -> Path:
    return _build(cls_model, "cpu", tmp_path_factory.mktemp("dist"))


def test_cpu_clean_bundle_passes(cpu_bundle, cls_model):
    from edgeopt.debug import debug_bundle

    res = debug_bundle(cpu_bundle, str(cls_model))
    assert res.first_jump is None
    assert res.observed > 100  # most node outputs survive ORT's offline fusions
    assert all(r["status"] in ("ok", "not observed", "no float output") for r in res.nodes)


def test_cpu_planted_fault_named_and_reduced(cpu_bundle, cls_model, tmp_path):
    import onnx

    from edgeopt.debug import debug_bundle, reduce

    bad = tmp_path / "cpu-fp32"
    shutil.copytree(cpu_bundle, bad)
    art = onnx.load(str(bad / "model.onnx"))
    convs = [n for n in art.graph.node if n.op_type in ("Conv", "FusedConv")]
    victim = convs[len(convs) // 3]
    inits = {i.name: i for i in art.graph.initializer}
    _bump_weight(inits[victim.input[1]])
    onnx.save(art, str(bad / "model.onnx"))

    res = debug_bundle(bad, str(cls_model))
    jump = res.first_jump
    assert jump is not None
    # the first node past the bound is the one whose output the changed kernel computes, not the worst one
    assert jump["artifact_node"] == victim.name
    assert jump["tensor"] in victim.output
    assert victim.name in [jump["node"], *jump["covers"]]  # ORT named the fused kernel after the ONNX Conv
    earlier = [r for r in res.nodes if r["index"] < jump["index"] and r.get("status") == "FAIL"]
    assert not earlier

    # windows of a few tensors (about 2 MB of values held) give the same figures
    small = debug_bundle(bad, str(cls_model), max_memory=2 << 20)
    assert small.windows > 10
    assert small.first_jump["node"] == jump["node"]
    assert small.first_jump["rel_l2"] == pytest.approx(jump["rel_l2"], rel=1e-6)

    red = reduce(res, tmp_path / "red")
    assert red["reproduced"], red
    assert 1 <= red["nodes"] <= 6
    sub = onnx.load(red["model"])
    assert [o.name for o in sub.graph.output] == jump["outputs"]
    with np.load(red["inputs_npz"]) as data:
        assert set(data.files) == {i.name for i in sub.graph.input}


def test_intel_cpu_planted_fault_and_runtime_precision(cls_model, tmp_path):
    pytest.importorskip("openvino")
    import onnx

    from edgeopt.debug import debug_bundle

    m = onnx.load(str(cls_model))
    consts = {o: n for n in m.graph.node if n.op_type == "Constant" for o in n.output}
    inits = {i.name: i for i in m.graph.initializer}
    convs = [n for n in m.graph.node if n.op_type == "Conv"]
    victim = convs[len(convs) // 3]
    w = victim.input[1]
    _bump_weight(consts[w].attribute[0].t if w in consts else inits[w])
    faulty = tmp_path / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    onnx.save(m, str(faulty))
    bundle = _build(faulty, "intel-cpu", tmp_path / "dist")

    res = debug_bundle(bundle, str(cls_model))  # against the model as it should be
    jump = res.first_jump
    assert jump is not None
    assert victim.name in [jump["node"], *jump["covers"]], (victim.name, jump)
    assert not [r for r in res.nodes if r["index"] < jump["index"] and r.get("status") == "FAIL"]
    # the runtime graph says what each layer ran in (an FP32 IR on this CPU: f32)
    precs = {r["runtime_precision"] for r in res.nodes if r.get("runtime_precision")}
    assert precs and precs <= {"f32", "fp32", "i8", "u8", "i32", "i64", "bf16", "f16", "boolean"}
    assert "f32" in precs


def test_cpu_int8_qdq_read_after_dequantize(cpu_bundle, cls_model, tmp_path):
    """A real QDQ artifact (ONNX Runtime's quantizer, U8S8 per-tensor: the model is opset 11) in a
    bundle: every quantized tensor is read after its DequantizeLinear (marked int8), INT8 noise stays within the
    int8 bound up to a Conv whose int8 filter is flipped, which is named as the first jump."""
    import json

    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from edgeopt.debug import debug_bundle
    from edgeopt.layerdiff import static_reference
    from edgeopt_agent.bundle import load_manifest, validation_inputs

    bundle = tmp_path / "cpu-int8"
    shutil.copytree(cpu_bundle, bundle)
    manifest = load_manifest(bundle)
    feeds = validation_inputs(bundle, manifest)
    ref = static_reference(cls_model, manifest)
    for n in [n for n in ref.graph.node if n.op_type == "Constant"]:  # weights as initializers, as quantizers want
        t = onnx.TensorProto()
        t.CopyFrom(n.attribute[0].t)
        t.name = n.output[0]
        ref.graph.initializer.append(t)
        ref.graph.node.remove(n)
    onnx.save(ref, str(tmp_path / "f.onnx"))

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(tmp_path / "f.onnx"), str(bundle / "model.onnx"), Reader(), quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    manifest["precision"] = "int8"
    (bundle / "manifest.json").write_text(json.dumps(manifest))

    clean = debug_bundle(bundle, str(cls_model))
    marked = [r for r in clean.nodes if r.get("runtime_precision") == "int8"]
    assert len(marked) > 100
    convs = [r for r in clean.nodes if r["op"] == "Conv"]
    victim = convs[2]["node"]
    assert all(r.get("status") != "FAIL" for r in clean.nodes if r["index"] <= convs[2]["index"] + 3)

    art = onnx.load(str(bundle / "model.onnx"))
    node = next(n for n in art.graph.node if n.name == victim)
    dq = next(n for n in art.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == node.input[1])
    init = next(i for i in art.graph.initializer if i.name == dq.input[0])
    w = numpy_helper.to_array(init).copy()
    w[0] = np.clip(-2 * w[0].astype(np.int32), -127, 127).astype(w.dtype)
    init.CopyFrom(numpy_helper.from_array(w, init.name))
    onnx.save(art, str(bundle / "model.onnx"))

    res = debug_bundle(bundle, str(cls_model))
    jump = res.first_jump
    assert jump is not None and victim in [jump["node"], *jump["covers"]], (victim, jump)
    assert res.bound == {"rel_l2_max": 0.25, "cosine_min": 0.97}


def test_tensorrt_prepared_onnx_on_the_host(cls_model, tmp_path):
    """A TensorRT bundle (jetson fp16) carries the prepared ONNX the engine is built from: debug runs it in ONNX
    Runtime and says so. The preparation folds BatchNormalization into the Conv and keeps the Conv's output name;
    that tensor (the BN's value under the Conv's name) is not compared, so a clean bundle passes."""
    from edgeopt import api
    from edgeopt.debug import debug_bundle

    rep = api.build(str(cls_model), "jetson", precision="fp16", shapes=SHAPE, dist=str(tmp_path / "dist"),
                    val_count=4, calib_count=4, raise_on_failure=False)
    bundle = Path(rep.results[0].bundle)
    res = debug_bundle(bundle, str(cls_model))
    assert res.first_jump is None, res.first_jump
    assert res.observed > 50
    assert any("TensorRT" in n for n in res.notes) and "not the engine" in res.artifact
