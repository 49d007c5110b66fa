"""TensorRT targets: preflight, preparation, Q/DQ placement and calibration, bundles, engine cache keys,
Triton export, the agent side without TensorRT; GPU-marked compile and bench tests.

The builds here run the real pipeline (workers, ONNX Runtime host checks) on the real OCR fixture
models and real images; what needs a GPU and TensorRT is marked ``gpu`` and skips with a reason.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeopt.errors import UsageError
from edgeopt.targets.registry import BUILTIN, get_backend
from edgeopt.targets.tensorrt import ENGINE_NOTE, SPEC_FILE, TensorRtTarget, build_spec, resolve_options
from edgeopt.targets.tensorrt import prep as trt_prep
from edgeopt_agent import trt_compile
from edgeopt_agent.bundle import BundleError, load_manifest
from tests.conftest import fixture

CLS_SHAPE = "x:1x3x48x192"
CLS_PROFILE = "x:1x3x48x192/4x3x48x192/16x3x48x192"


# ---------------------------------------------------------------------------------------------
# helpers: tiny models built with onnx.helper
# ---------------------------------------------------------------------------------------------
def _save(graph, path: Path, opset: int = 13) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def residual_net(path: Path, batch: int | str = 1, opset: int = 13) -> Path:
    """conv1 -> relu -> conv2 ; add(conv2, relu) -> relu -> GAP -> flatten -> gemm; real-valued weights."""
    rng = np.random.default_rng(3)
    w1 = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    b1 = numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b1")
    w2 = numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), "w2")
    fw = numpy_helper.from_array((rng.standard_normal((5, 8)) * 0.5).astype(np.float32), "fw")
    fb = numpy_helper.from_array(np.zeros(5, np.float32), "fb")
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "r1"], ["s"], name="residual"),
        helper.make_node("Relu", ["s"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 5])],
                              initializer=[w1, b1, w2, fw, fb])
    return _save(graph, path, opset)


def _feeds(n: int, shape=(1, 3, 16, 16), seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(n)]


def _run(model, feeds, disable_opt: bool = False) -> list[np.ndarray]:
    so = ort.SessionOptions()
    if disable_opt:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    blob = model.SerializeToString() if hasattr(model, "SerializeToString") else str(model)
    sess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
    return [sess.run(None, f)[0] for f in feeds]


def _producers(model) -> dict[str, onnx.NodeProto]:
    return {o: n for n in model.graph.node for o in n.output}


def _inits(model) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _gpu_reason() -> str | None:
    if importlib.util.find_spec("tensorrt") is None:
        return "TensorRT's Python package is not installed (its wheels cannot be fetched here)"
    try:
        cudart = trt_compile.import_cudart()
        n = trt_compile.check_cuda(cudart.cudaGetDeviceCount(), "cudaGetDeviceCount")
    except Exception as exc:  # no cuda-python or no driver
        return f"CUDA is not usable here: {exc}"
    return None if n else "no CUDA GPU visible"


GPU_REASON = _gpu_reason()


# ---------------------------------------------------------------------------------------------
# shared builds (module scope: each is a real pipeline run)
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cls_model() -> Path:
    return fixture("ocr-cls")


@pytest.fixture(scope="module")
def cli_fp16(tmp_path_factory, cls_model):
    """`edgeopt build ocr-cls --targets jetson-orin,h100` through the CLI: (exit code, stdout, out dir)."""
    from edgeopt.cli import main

    out = tmp_path_factory.mktemp("trt-fp16")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["build", str(cls_model), "--targets", "jetson-orin,h100", "--shape", CLS_SHAPE,
                   "--calib", str(fixture("images")), "--preprocess", "preset=pm1", "--out", str(out), "-q"])
    return rc, buf.getvalue(), out / cls_model.stem


def text_line_crops(count: int = 48, seed: int = 0) -> np.ndarray:
    """Text-line crops of the scanned page (skimage's page.png), upright and turned 180 degrees: the
    orientation classifier's own kind of input, preprocessed as PaddleOCR does (x/255 - 0.5) / 0.5."""
    from skimage import io as skio
    from skimage import transform

    page = skio.imread(str(fixture("page"))).astype(np.float32) / 255.0
    crops = []
    for y in range(0, page.shape[0] - 24, 12):
        for x in range(0, page.shape[1] - 95, 96):
            c = transform.resize(page[y:y + 24, x:x + 96], (48, 192), anti_aliasing=True)
            for cc in (c, c[::-1, ::-1]):
                crops.append(((np.repeat(cc[None], 3, 0) - 0.5) / 0.5)[None].astype(np.float32))
    order = np.random.default_rng(seed).permutation(len(crops))[:count]
    return np.stack([crops[i] for i in order])


@pytest.fixture(scope="module")
def int8_profiled(tmp_path_factory, cls_model):
    """a100 int8 (explicit Q/DQ calibrated on real text lines) with a dynamic-batch optimization profile."""
    from edgeopt.pipeline import build

    out = tmp_path_factory.mktemp("trt-int8")
    data = out / "lines.npz"
    np.savez(data, x=text_line_crops())
    # 32 calibration + 16 validation samples: with 8, one near-tie flip alone is a 12.5% top-1 change.
    report = build(cls_model, "a100", precisions=["int8"], shapes={"x": [1, 3, 48, 192]}, calib=str(data),
                   out=out / "dist", n_calib=32, n_val=16, options={"trt_profile": CLS_PROFILE},
                   accept={"decisions": {"max_disagreement": "13%"}})  # the engine's form, not the 5% rule
    return report


# ---------------------------------------------------------------------------------------------
# the operator table and the preflight
# ---------------------------------------------------------------------------------------------
def test_ops_table_records_its_tensorrt_version_and_opsets():
    table = trt_prep.ops_table()
    assert table.tensorrt_version == "10.15"
    assert (table.opset_min, table.opset_max) == (9, 24)
    assert len(table.ops) > 190
    ok = table.supported()
    assert {"Conv", "ConvTranspose", "Resize", "HardSigmoid", "QuantizeLinear", "NonZero"} <= ok
    assert not {"Unique", "StringNormalizer", "QLinearConv", "MatMulInteger"} & ok
    assert "2D or 3D" in table.restriction("MaxPool")


def test_preflight_lists_every_unsupported_node_at_once(tmp_path):
    from edgeopt.model import inspect

    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="ok_relu"),
        helper.make_node("Unique", ["r"], ["u"], name="bad_unique"),
        helper.make_node("Det", ["m"], ["d"], name="bad_det"),
        helper.make_node("MyOp", ["r"], ["c"], name="bad_custom", domain="com.example"),
    ]
    graph = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
                                             helper.make_tensor_value_info("m", TensorProto.FLOAT, [3, 3])],
                              [helper.make_tensor_value_info("u", TensorProto.FLOAT, ["k"]),
                               helper.make_tensor_value_info("d", TensorProto.FLOAT, []),
                               helper.make_tensor_value_info("c", TensorProto.FLOAT, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)])
    model.ir_version = 8
    path = tmp_path / "bad.onnx"
    onnx.save(model, str(path))

    bad = get_backend("tensorrt").unsupported_nodes(inspect(path), BUILTIN["h100"].as_dict())

    assert sorted(bad) == [("Det", "bad_det"), ("Unique", "bad_unique"), ("com.example::MyOp", "bad_custom")]


def test_build_reports_unsupported_nodes_for_trt_targets_without_building(tmp_path):
    from edgeopt.pipeline import build

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Unique", ["r"], ["y"], name="uniq")]
    path = _save(helper.make_graph(nodes, "u", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["k"])]), tmp_path / "u.onnx")

    report = build(path, "jetson,h100", out=tmp_path / "out")

    assert [r.status for r in report.results] == ["unsupported", "unsupported"]
    assert all("Unique (uniq)" in r.error for r in report.results)


def test_opset_too_new_for_the_parser_is_a_clear_error(tmp_path):
    model = onnx.load(str(residual_net(tmp_path / "r.onnx")))
    model.opset_import[0].version = 30
    with pytest.raises(UsageError, match="opset 30.*9..24"):
        trt_prep.ensure_opset(model)


def test_old_opset_is_converted_up_to_what_the_parser_and_qdq_need(tmp_path):
    model = onnx.load(str(residual_net(tmp_path / "r.onnx", opset=7)))
    up, note = trt_prep.ensure_opset(model)
    assert trt_prep.opset_of(up) == 9 and "7 -> 9" in note
    up13, _ = trt_prep.ensure_opset(model, minimum=13)
    assert trt_prep.opset_of(up13) == 13
    feeds = _feeds(2)
    np.testing.assert_allclose(_run(up13, feeds)[0], _run(model, feeds)[0], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# preparation and optimization profiles
# ---------------------------------------------------------------------------------------------
def test_prepare_folds_constants_and_keeps_the_numbers(tmp_path):
    # (x + (2 * 3)) -> relu: the Constant/Mul chain folds away.
    two = helper.make_node("Constant", [], ["two"], value=numpy_helper.from_array(np.full(4, 2, np.float32)))
    three = helper.make_node("Constant", [], ["three"], value=numpy_helper.from_array(np.full(4, 3, np.float32)))
    nodes = [two, three, helper.make_node("Mul", ["two", "three"], ["six"]),
             helper.make_node("Add", ["x", "six"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    path = _save(helper.make_graph(nodes, "fold", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])]), tmp_path / "f.onnx")
    model = onnx.load(str(path))

    prepared = trt_prep.prepare(model, {"x": [2, 4]}, {})

    assert [n.op_type for n in prepared.model.graph.node] == ["Add", "Relu"]
    dims = [d.dim_value for d in prepared.model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [2, 4] and prepared.report["simplified"] and prepared.report["opset"] >= 9
    feed = [{"x": np.arange(8, dtype=np.float32).reshape(2, 4) - 9}]
    np.testing.assert_array_equal(_run(prepared.model, feed)[0], _run(model, feed)[0])


def test_profile_keeps_declared_dims_dynamic_and_runs_at_other_batches(tmp_path):
    model = onnx.load(str(residual_net(tmp_path / "dyn.onnx", batch="N")))
    profiles = trt_prep.parse_profiles("x:1x3x16x16/4x3x16x16/8x3x16x16", {"x": [2, 3, 16, 16]},
                                       {"x": ["N", 3, 16, 16]})

    prepared = trt_prep.prepare(model, {"x": [2, 3, 16, 16]}, profiles)

    dims = prepared.model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "x_d0" and [d.dim_value for d in dims[1:]] == [3, 16, 16]
    assert prepared.report["dynamic_inputs"] == {"x": [0]}
    for b in (1, 5):
        feed = _feeds(1, (b, 3, 16, 16))
        np.testing.assert_allclose(_run(prepared.model, feed)[0], _run(model, feed)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("text, message", [
    ("y:1x3x16x16/8x3x16x16", "no input 'y'"),
    ("x:1x3x16/8x3x16", "rank 4"),
    ("x:1x3x16x16/9x3x16x16/8x3x16x16", "min <= opt <= max"),
    ("x:4x3x16x16/8x3x16x16", "outside min..max"),
    ("x:1x3x16x16/8x3x32x32", "fixed at 16"),
    ("x:1x3xAx16/8x3x16x16", "not a shape"),
    ("x-1x3x16x16", "expected NAME"),
])
def test_bad_profiles_are_refused_with_a_reason(text, message):
    with pytest.raises(UsageError, match=message):
        trt_prep.parse_profiles(text, {"x": [2, 3, 16, 16]}, {"x": ["N", 3, 16, 16]})


def test_two_part_profile_takes_opt_from_the_shape():
    p = trt_prep.parse_profiles("x:1x3x16x16/8x3x16x16", {"x": [2, 3, 16, 16]}, {"x": ["N", 3, 16, 16]})["x"]
    assert (p.min, p.opt, p.max) == ((1, 3, 16, 16), (2, 3, 16, 16), (8, 3, 16, 16))


def test_fp16_overflow_names_the_tensors_past_65504(tmp_path):
    big = numpy_helper.from_array(np.array(1e5, np.float32), "big")
    nodes = [helper.make_node("Mul", ["x", "big"], ["huge"], name="scale_up"),
             helper.make_node("Div", ["huge", "big"], ["y"], name="scale_down")]
    path = _save(helper.make_graph(nodes, "ovf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], initializer=[big]),
                 tmp_path / "o.onnx")
    over = trt_prep.fp16_overflow(onnx.load(str(path)), [{"x": np.array([1, 2, 3, 0.1], np.float32)}])
    assert [t for t, _ in over] == ["huge"] and over[0][1] == pytest.approx(3e5)


# ---------------------------------------------------------------------------------------------
# explicit quantization: placement and arithmetic
# ---------------------------------------------------------------------------------------------
def test_qdq_placement_is_tensorrt_friendly(tmp_path):
    model = onnx.load(str(residual_net(tmp_path / "r.onnx")))
    plan = trt_prep.plan_qdq(model)
    amax = {t: 4.0 for t in plan.activations}

    q = trt_prep.insert_qdq(model, plan, amax, "int8")

    prod, inits = _producers(q), _inits(q)
    by_name = {n.name: n for n in q.graph.node}
    for name, weight, axis in (("conv1", "w1", 0), ("conv2", "w2", 0), ("fc", "fw", 0)):  # Gemm transB=1: [N, K]
        node = by_name[name]
        act, w = prod[node.input[0]], prod[node.input[1]]
        assert act.op_type == "DequantizeLinear" and prod[act.input[0]].op_type == "QuantizeLinear"
        wq = prod[w.input[0]]
        assert w.op_type == "DequantizeLinear" and wq.op_type == "QuantizeLinear" and wq.input[0] == weight
        assert helper.get_attribute_value(w.attribute[0]) == axis and inits[w.input[1]].ndim == 1
        assert inits[w.input[2]].dtype == np.int8 and not np.any(inits[w.input[2]])  # symmetric INT8
        assert inits[act.input[1]].ndim == 0 and not np.any(inits[act.input[2]])  # per-tensor activations
    assert by_name["conv1"].input[2] == "b1"  # bias stays float
    residual = by_name["residual"]
    assert residual.input[0] == "c2"  # the conv output fused into the add stays unquantized
    assert prod[residual.input[1]].op_type == "DequantizeLinear"  # the skip branch is quantized
    assert residual.input[1] == by_name["conv2"].input[0]  # one shared Q/DQ pair per tensor
    assert plan.residual_adds == ["residual"]
    for n in q.graph.node:  # no layer output is quantized
        if n.op_type == "QuantizeLinear":
            assert prod.get(n.input[0]) is None or prod[n.input[0]].op_type not in ("Conv", "Gemm")


def test_qdq_weights_dequantize_to_within_half_a_step_per_channel(tmp_path):
    model = onnx.load(str(residual_net(tmp_path / "r.onnx")))
    plan = trt_prep.plan_qdq(model)
    q = trt_prep.insert_qdq(model, plan, {t: 4.0 for t in plan.activations}, "int8")
    q.graph.output.append(helper.make_tensor_value_info("w2_dq", TensorProto.FLOAT, None))  # what Conv sees
    sess = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    seen = sess.run(["w2_dq"], _feeds(1)[0])[0]
    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "w2"))
    scale = _inits(q)["w2_wscale"]
    np.testing.assert_allclose(scale, np.max(np.abs(w), axis=(1, 2, 3)) / 127, rtol=1e-6)
    steps = seen / scale[:, None, None, None]
    np.testing.assert_allclose(steps, np.round(steps), atol=1e-3)  # on the INT8 grid of its channel
    assert np.all(np.abs(steps) <= 127.001)
    assert np.all(np.abs(seen - w) <= scale[:, None, None, None] / 2 + 1e-7)


def test_fp8_qdq_uses_e4m3_types_and_runs_in_onnxruntime(tmp_path):
    model = onnx.load(str(residual_net(tmp_path / "r.onnx")))
    model, _ = trt_prep.ensure_opset(model, trt_prep.QDQ_MIN_OPSET["fp8"])
    feeds = _feeds(6, seed=1)

    q = trt_prep.quantize(model, feeds[:4], "fp8", "max")

    zps = [t for t in q.model.graph.initializer if t.data_type == TensorProto.FLOAT8E4M3FN]
    assert zps and q.report["calibration"] == "max" and q.report["per_channel_weights"] == 3
    got = np.concatenate(_run(q.model, feeds[4:], disable_opt=True))
    ref = np.concatenate(_run(model, feeds[4:]))
    assert np.isfinite(got).all()
    assert np.dot(got.ravel(), ref.ravel()) / (np.linalg.norm(got) * np.linalg.norm(ref)) > 0.98


def test_int8_calibration_auto_tries_each_rule_and_keeps_the_best(tmp_path):
    model = onnx.load(str(residual_net(tmp_path / "r.onnx")))
    feeds = _feeds(8, seed=2)
    q = trt_prep.quantize(model, feeds, "int8", "auto")
    tried = q.report["calibration_candidates"]
    assert set(tried) == set(trt_prep.AUTO_METHODS["int8"])
    best = min(tried.values(), key=lambda v: (v["outputs_failing"], v["rel_l2"]))
    assert tried[q.report["calibration"]] == best
    with pytest.raises(UsageError, match="unknown calibration method"):
        trt_prep.quantize(model, feeds, "int8", "entropyy")


# ---------------------------------------------------------------------------------------------
# options and the build spec
# ---------------------------------------------------------------------------------------------
def test_trt_options_are_validated_against_the_target():
    orin, a100, h100 = (BUILTIN[n].as_dict() for n in ("jetson-orin", "a100", "h100"))
    with pytest.raises(UsageError, match="did you mean trt_workspace_mb"):
        resolve_options({"trt_workspace": 512}, orin, "fp16")
    with pytest.raises(UsageError, match="has no DLA"):
        resolve_options({"trt_dla_core": 0}, a100, "fp16")
    with pytest.raises(UsageError, match=r"2 DLA core\(s\)"):
        resolve_options({"trt_dla_core": 2}, orin, "fp16")
    with pytest.raises(UsageError, match="DLA runs fp16 or int8"):
        resolve_options({"trt_dla_core": 0}, orin, "fp32")
    with pytest.raises(UsageError, match="no FP8"):
        resolve_options({}, orin, "fp8")
    with pytest.raises(UsageError, match="0..5"):
        resolve_options({"trt_opt_level": 7}, h100, "fp16")
    o = resolve_options({"trt_dla_core": 1, "trt_opt_level": "5"}, orin, "int8")
    assert o["trt_dla_core"] == 1 and o["trt_opt_level"] == 5 and o["trt_workspace_mb"] == 2048


@pytest.mark.parametrize("precision, flags, clear", [
    ("fp32", [], ["TF32"]), ("fp16", ["FP16"], []), ("int8", ["INT8", "FP16"], []),
])
def test_build_spec_flags_per_precision_on_tensorrt_10(precision, flags, clear):
    """Jetson (JetPack: TensorRT 10) keeps the builder-flag path."""
    spec = BUILTIN["jetson-orin"].as_dict()
    bs = build_spec(precision, resolve_options({}, spec, precision), spec, {"x": [1, 3, 8, 8]}, {})
    assert (bs["flags"], bs["clear_flags"], bs["strongly_typed"]) == (flags, clear, False)
    assert (bs["tensorrt"], bs["tensorrt_major"], bs["target"]["compute_capability"]) == ("10.3", 10, "8.7")


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8", "fp8"])
def test_tensorrt_11_targets_are_strongly_typed_with_no_precision_flags(precision):
    """TensorRT 11 removed weak typing: h100 bundles carry the precision in the ONNX, no FP16/INT8/FP8 flag."""
    spec = BUILTIN["h100"].as_dict()
    bs = build_spec(precision, resolve_options({}, spec, precision), spec, {"x": [1, 3, 8, 8]}, {})
    assert bs["strongly_typed"] is True and bs["tensorrt_major"] == 11
    assert not set(bs["flags"]) & {"FP16", "INT8", "FP8", "BF16"}
    assert bs["workspace_mb"] == 8192 and bs["timing_cache"] is True and bs["dla"] is None
    assert bs["target"]["compute_capability"] == "9.0" and bs["target"]["fp8"] is True
    with pytest.raises(UsageError, match="no weak typing"):
        resolve_options({"trt_strongly_typed": False}, spec, precision)


def test_the_device_refuses_a_weakly_typed_bundle_on_tensorrt_11():
    from edgeopt_agent.trt_compile import CompileError, check_typing

    orin = BUILTIN["jetson-orin"].as_dict()
    weak = build_spec("fp16", resolve_options({}, orin, "fp16"), orin, {}, {})
    check_typing("10.3.0", weak)  # JetPack's TensorRT takes it
    with pytest.raises(CompileError, match="TensorRT 11.4.0 has no weak typing: rebuild"):
        check_typing("11.4.0", weak)
    h100 = BUILTIN["h100"].as_dict()
    strong = build_spec("fp16", resolve_options({}, h100, "fp16"), h100, {}, {})
    check_typing("11.4.0", strong)
    check_typing("10.8.0", strong)  # strongly typed networks exist in TensorRT 10 too


def test_trt_options_are_checked_before_the_build():
    trt, h100, orin = TensorRtTarget(), BUILTIN["h100"].as_dict(), BUILTIN["jetson-orin"].as_dict()
    assert {"trt_profile", "trt_calibration"} <= trt.known_options()
    trt.check_options({"trt_opt_level": "4", "int8_search": "full"}, "fp16", h100)  # other backends' keys: ignored
    trt.check_options({"trt_dla_core": 1}, "int8", orin)
    for options, message in (({"trt_calibration": "entropyy"}, "unknown calibration method"),
                             ({"trt_calibration": "percentile-101"}, "bad percentile"),
                             ({"trt_calibration": "max-5"}, "unknown calibration method"),
                             ({"trt_simplify": "maybe"}, "true or false"),
                             ({"trt_dla_core": 0}, "has no DLA")):
        with pytest.raises(UsageError, match=message):
            trt.check_options(options, "int8", h100)
    assert trt_prep.calibration_method("percentile-99.9") == ("percentile", 99.9)
    assert trt_prep.calibration_method("mse")[0] == "mse"


def test_dla_spec_adds_gpu_fallback():
    spec = BUILTIN["jetson-orin"].as_dict()
    bs = build_spec("int8", resolve_options({"trt_dla_core": 0}, spec, "int8"), spec, {}, {})
    assert bs["dla"] == {"core": 0, "gpu_fallback": True} and "GPU_FALLBACK" in bs["flags"]


def test_user_defined_trt_target_profile_drives_the_build_spec(tmp_path):
    from edgeopt.targets.registry import resolve_target

    cfg = tmp_path / "edgeopt.yaml"
    cfg.write_text("targets:\n  lab-orin-nano:\n    base: jetson-orin\n"
                   "    profile: {dla_cores: 0, workspace_mb: 512}\n    precisions: [fp16, int8]\n")
    spec = resolve_target("lab-orin-nano", cfg).as_dict()
    bs = build_spec("fp16", resolve_options({}, spec, "fp16"), spec, {"x": [1, 3, 8, 8]}, {})
    assert bs["workspace_mb"] == 512 and bs["target"] == {"name": "lab-orin-nano", "compute_capability": "8.7",
                                                          "dla_cores": 0, "fp8": False, "jetson": True}
    with pytest.raises(UsageError, match="has no DLA"):
        resolve_options({"trt_dla_core": 0}, spec, "fp16")


def test_backend_is_available_without_tensorrt():
    assert TensorRtTarget().available() is None
    assert TensorRtTarget().toolchain()["tensorrt_ops_table"] == (
        "8.5 (jetson-xavier), 10.1 for 10.3 (jetson-orin), 10.15 (nvidia, default), 11.0 (a100, h100, l4)")


# ---------------------------------------------------------------------------------------------
# bundles on a machine without a GPU
# ---------------------------------------------------------------------------------------------
def test_cli_build_jetson_orin_and_h100_gives_complete_bundles(cli_fp16):
    rc, stdout, root = cli_fp16
    assert rc == 0, stdout
    assert f"note: {ENGINE_NOTE}" in stdout
    for target in ("jetson-orin", "h100"):
        bundle = root / f"{target}-fp16"
        m = load_manifest(bundle)
        assert m["backend"] == "tensorrt" and m["runtime"]["name"] == "tensorrt"
        assert {"model.onnx", SPEC_FILE, "validation/inputs.npz", "validation/reference.npz"} <= set(m["files"])
        assert ENGINE_NOTE in m["notes"]
        assert m["host_check"]["kind"] == "device" and m["host_check"]["passed"] is None
        pc = m["prepared_onnx_check"]
        # Jetson (TensorRT 10): the FP32 ONNX + the FP16 flag, its prepared ONNX held to FP32 bounds;
        # h100 (TensorRT 11, strongly typed): an FP16 ONNX written here, held to the FP16 bounds in ORT
        strong = target == "h100"
        assert pc["kind"] == "prepared-onnx" and pc["passed"] is True
        assert pc["precision_bounds"] == ("fp16" if strong else "fp32")
        assert "not the TensorRT engine" in pc["what"]
        spec = json.loads((bundle / SPEC_FILE).read_text())
        assert spec["flags"] == ([] if strong else ["FP16"]) and spec["strongly_typed"] is strong
        assert spec["profiles"] == [] and spec["io_shapes"] == {"x": [1, 3, 48, 192]}
        prepared = onnx.load(str(bundle / "model.onnx"))
        types = {i.data_type for i in prepared.graph.initializer if i.data_type in (1, 10)}
        assert types == ({10} if strong else {1})  # FP16 weights only in the strongly typed one
        if strong:
            assert m["tensorrt"]["fp16_onnx"]["converter"].startswith("onnxconverter-common")
            assert prepared.graph.input[0].type.tensor_type.elem_type == 1  # I/O kept FP32
        assert all(d.dim_value > 0 for d in prepared.graph.input[0].type.tensor_type.shape.dim)
        assert len(prepared.graph.node) < 566 and not trt_prep.preflight(trt_prep.model_nodes(prepared))
        # the manifest names the operator table the preflight used: the one of the target's TensorRT
        table = m["tensorrt"]["ops_table"]
        assert (table["tensorrt_version"], table["for_tensorrt"], table["tensorrt_major"]) == (
            ("11.0", "11.0", 11) if strong else ("10.1", "10.3", 10))  # JetPack 6's 10.3, from the 10.1 matrix
        assert table["file"] == ("tensorrt11_onnx_ops.txt" if strong else "tensorrt10_1_onnx_ops.txt")
        assert table["source"].startswith("https://github.com/onnx/onnx-tensorrt/")
        assert table["opsets"] == ([9, 24] if strong else [9, 20])
    orin = json.loads((root / "jetson-orin-fp16" / SPEC_FILE).read_text())
    h100 = json.loads((root / "h100-fp16" / SPEC_FILE).read_text())
    assert (orin["workspace_mb"], orin["target"]["compute_capability"], orin["target"]["dla_cores"]) == (2048, "8.7", 2)
    assert (h100["workspace_mb"], h100["target"]["compute_capability"], h100["target"]["fp8"]) == (8192, "9.0", True)
    assert bundle_digest_differs(root / "jetson-orin-fp16", root / "h100-fp16")


def bundle_digest_differs(a: Path, b: Path) -> bool:
    """Same ONNX, different build spec -> different bundle digests (the spec is part of the engine)."""
    da, db = (trt_compile.bundle_sha256(p, load_manifest(p)) for p in (a, b))
    return da != db


def test_int8_bundle_is_explicitly_quantized_and_within_int8_bounds_on_real_data(int8_profiled):
    res = int8_profiled.results[0]
    assert res.status == "built", res.error
    bundle = Path(res.bundle)
    m = load_manifest(bundle)
    pc = m["prepared_onnx_check"]
    assert pc["passed"] is True and pc["precision_bounds"] == "int8"
    out = next(iter(pc["outputs"].values()))["metrics"]
    assert out["cosine"] >= 0.97 and out["rel_l2"] <= 0.25 and out["top1"] >= 0.9
    qinfo = m["tensorrt"]["quantization"]
    assert qinfo["quantized_weights"] == qinfo["per_channel_weights"] >= 50 and qinfo["residual_adds"] > 0
    assert qinfo["calibration"] in trt_prep.AUTO_METHODS["int8"]
    spec = json.loads((bundle / SPEC_FILE).read_text())
    # a100 runs TensorRT 11: strongly typed, the INT8 in the Q/DQ, no precision flags
    assert spec["flags"] == [] and spec["strongly_typed"] is True and spec["quantization"] == "explicit Q/DQ in the ONNX"
    assert spec["profiles"] == [{"x": {"min": [1, 3, 48, 192], "opt": [4, 3, 48, 192], "max": [16, 3, 48, 192]}}]
    q = onnx.load(str(bundle / "model.onnx"))
    assert trt_prep.opset_of(q) >= 13
    assert q.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "x_d0"
    inits = _inits(q)
    dq = [n for n in q.graph.node if n.op_type == "DequantizeLinear"]
    assert all(not np.any(inits[n.input[2]]) for n in dq)  # symmetric everywhere
    # The Q/DQ ONNX runs in ONNX Runtime at another batch size of the profile, too.
    feeds = [{"x": np.random.default_rng(0).standard_normal((3, 3, 48, 192)).astype(np.float32)}]
    assert _run(q, feeds)[0].shape == (3, 2)


def test_ocr_det_fp16_bundle_at_a_small_shape(tmp_path):
    from edgeopt.pipeline import build

    # 160x160: large enough that the text-probability map is not all ~0 on these images (a near-empty
    # map makes float32 rounding alone look like a relative error).
    report = build(fixture("ocr-det"), "jetson-xavier", shapes={"x": [1, 3, 160, 160]}, calib=str(fixture("images")),
                   preprocess="preset=imagenet", out=tmp_path, n_calib=4)
    res = report.results[0]
    assert res.status == "built", res.error
    m = load_manifest(Path(res.bundle))
    assert m["precision"] == "fp16" and m["prepared_onnx_check"]["passed"] is True
    assert "Resize" in m["tensorrt"]["restricted_ops"]  # its conditions travel with the bundle
    assert m["tensorrt"]["preparation"]["nodes_after"] < m["tensorrt"]["preparation"]["nodes_before"]


# ---------------------------------------------------------------------------------------------
# the agent side without TensorRT: keys, caches, errors, Jetson state
# ---------------------------------------------------------------------------------------------
def test_agent_modules_import_with_stdlib_and_numpy_only():
    code = ("import sys, edgeopt_agent.trt_compile, edgeopt_agent.runners.tensorrt; "
            "heavy = [m for m in sys.modules if m.split('.')[0] in ('tensorrt', 'cuda', 'onnx', 'onnxruntime')]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_cache_key_covers_bundle_gpu_capability_and_tensorrt_version():
    base = ("a" * 64, "NVIDIA H100 80GB HBM3", "9.0", "10.3.0")
    k = trt_compile.cache_key(*base)
    assert k == trt_compile.cache_key(*base) and len(k) == 64
    variants = [("b" * 64, *base[1:]), (base[0], "NVIDIA A100-SXM4-40GB", *base[2:]), (*base[:2], "8.0", base[3]),
                (*base[:3], "10.4.0")]
    keys = {trt_compile.cache_key(*v) for v in variants} | {trt_compile.cache_key(*base, {"workspace_mb": 1024})}
    assert len(keys) == 5 and k not in keys


def test_bundle_sha256_follows_the_engine_inputs_and_catches_damage(cli_fp16, tmp_path):
    _, _, root = cli_fp16
    bundle = tmp_path / "b"
    shutil.copytree(root / "h100-fp16", bundle)
    m = load_manifest(bundle)
    assert trt_compile.engine_input_files(m) == ["model.onnx", SPEC_FILE]
    digest = trt_compile.bundle_sha256(bundle, m)
    (bundle / "validation" / "inputs.npz").write_bytes(b"other validation data")  # not an engine input
    assert trt_compile.bundle_sha256(bundle, m) == digest
    with open(bundle / "model.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(BundleError, match="model.onnx does not match"):
        trt_compile.bundle_sha256(bundle, m)


def test_engine_cache_round_trip_and_refuses_a_damaged_entry(tmp_path):
    cache = trt_compile.EngineCache(tmp_path / "engines")
    key = trt_compile.cache_key("c" * 64, "Orin", "8.7", "10.3.0")
    assert cache.lookup(key) is None
    blob = bytes(range(256)) * 64  # engine bytes as TensorRT would hand them over
    meta = cache.store(key, blob, {"build_s": 1.5}, "[I] built\n")
    assert Path(meta["engine"]).read_bytes() == blob
    hit = cache.lookup(key)
    assert hit["build_s"] == 1.5 and hit["engine_bytes"] == len(blob)
    Path(hit["engine"]).write_bytes(blob[:100])
    assert cache.lookup(key) is None
    with pytest.raises(ValueError):
        cache.entry("../../etc")
    tc = trt_compile.timing_cache_path(cache.root, "NVIDIA H100 80GB HBM3", "9.0", "10.3.0")
    assert tc.parent == tmp_path / "timing" and tc.name == "NVIDIA-H100-80GB-HBM3-sm90-trt10.3.0.cache"


def test_compile_verb_without_tensorrt_says_what_is_missing(cli_fp16):
    if GPU_REASON is None:
        pytest.skip("TensorRT and a GPU are present: the GPU tests cover compile")
    _, _, root = cli_fp16
    reply = _agent("compile", {"bundle": str(root / "h100-fp16")})
    assert reply["ok"] is False and reply["error"]["type"] == "TensorRtUnavailable"
    assert "TensorRT" in reply["error"]["message"] or "cuda-python" in reply["error"]["message"]


def test_compile_verb_refuses_a_damaged_bundle_before_touching_tensorrt(cli_fp16, tmp_path):
    _, _, root = cli_fp16
    bundle = tmp_path / "b"
    shutil.copytree(root / "jetson-orin-fp16", bundle)
    (bundle / SPEC_FILE).write_text((bundle / SPEC_FILE).read_text().replace('"FP16"', '"FP32"'))
    reply = _agent("compile", {"bundle": str(bundle)})
    assert reply["ok"] is False and reply["error"]["type"] == "BundleError"
    assert "trt_build.json does not match" in reply["error"]["message"]


def test_trt_bundle_check_without_tensorrt_is_a_clear_runner_error(cli_fp16):
    if GPU_REASON is None:
        pytest.skip("TensorRT and a GPU are present")
    _, _, root = cli_fp16
    reply = _agent("check", {"bundle": str(root / "jetson-orin-fp16")})
    assert reply["ok"] is False and reply["error"]["type"] == "RunnerUnavailable"
    assert "TensorRT" in reply["error"]["message"]


def _agent(verb: str, request: dict) -> dict:
    proc = subprocess.run([sys.executable, "-m", "edgeopt_agent", verb], input=json.dumps(request),
                          capture_output=True, text=True, timeout=120)
    return json.loads(proc.stdout.strip().splitlines()[-1])


NVPMODEL_Q = "NV Power Mode: MAXN\n0\n"
JETSON_CLOCKS = ("SOC family:tegra234  Machine:Jetson AGX Orin\n"
                 "Online CPUs: 0-11\n"
                 "cpu0: Online=1 Governor=schedutil MinFreq=729600 MaxFreq=2201600 CurrentFreq=1190400 IdleStates: WFI=1\n"
                 "GPU MinFreq=306000000 MaxFreq=1300500000 CurrentFreq=1300500000\n"
                 "EMC MinFreq=204000000 MaxFreq=3199000000 CurrentFreq=3199000000 FreqOverride=0\n")
TEGRASTATS = ("11-21-2025 10:02:03 RAM 3120/30593MB (lfb 6911x4MB) SWAP 0/15296MB (cached 0MB) "
              "CPU [3%@1190,1%@1190,off,off] EMC_FREQ 1%@3199 GR3D_FREQ 37%@[1300,1300] VIC_FREQ 729 "
              "APE 174 CV0@-256C CPU@47.25C SOC2@44.5C GPU@45.968C tj@47.25C "
              "VDD_GPU_SOC 3987mW/3987mW VDD_CPU_CV 797mW/797mW VIN_SYS_5V0 4432mW/4432mW")


def test_jetson_tool_output_is_parsed():
    assert trt_compile.parse_nvpmodel(NVPMODEL_Q) == {"name": "MAXN", "id": 0}
    clocks = trt_compile.parse_jetson_clocks(JETSON_CLOCKS)
    assert clocks["GPU"]["CurrentFreq"] == "1300500000" and clocks["cpu0"]["Governor"] == "schedutil"
    assert "SOC" not in clocks and "Online" not in clocks
    t = trt_compile.parse_tegrastats(TEGRASTATS)
    assert t["ram_mb"] == {"used": 3120, "total": 30593}
    assert (t["gpu_load_pct"], t["gpu_freq_mhz"]) == (37, [1300, 1300])
    assert t["emc_freq_mhz"] == 3199 and t["temperature_c"]["GPU"] == pytest.approx(45.968)
    assert t["power_mw"]["VDD_GPU_SOC"] == {"now_mw": 3987, "avg_mw": 3987}


def test_jetson_state_reads_what_it_can_and_says_what_it_cannot(tmp_path, monkeypatch):
    assert trt_compile.jetson_state(str(tmp_path)) is None  # not a Jetson
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "nv_tegra_release").write_text("# R36 (release), REVISION: 4.0, GCID: 1, BOARD: generic\n")
    dev = tmp_path / "sys" / "class" / "devfreq" / "17000000.gpu"
    dev.mkdir(parents=True)
    (dev / "cur_freq").write_text("1300500000\n")
    (dev / "governor").write_text("nvhost_podgov\n")
    monkeypatch.setenv("PATH", str(tmp_path / "no-tools"))
    monkeypatch.setattr(trt_compile, "_TOOL_DIRS", ())

    state = trt_compile.jetson_state(str(tmp_path))

    assert state["l4t"].startswith("R36 (release)")
    assert state["devfreq"]["17000000.gpu"] == {"cur_freq": "1300500000", "governor": "nvhost_podgov"}
    assert state["errors"] == {"nvpmodel": "not found", "jetson_clocks": "not found",
                               "tegrastats": "tegrastats not found"}


def test_timing_summary_statistics():
    from edgeopt_agent.runners.tensorrt import summarize

    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s["p50"] == 3.0 and s["max"] == 100.0 and s["min"] == 1.0 and s["mean"] == 22.0
    assert summarize([]) == {}


# ---------------------------------------------------------------------------------------------
# Triton export
# ---------------------------------------------------------------------------------------------
def _triton_config_class():
    """The fields of Triton's ModelConfig (model_config.proto) that the export writes, as a real protobuf
    message, so that config.pbtxt is parsed by protobuf's own text-format parser."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="mini_model_config.proto", package="inference", syntax="proto3")
    dt = fdp.enum_type.add(name="DataType")
    for i, n in enumerate(["TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64",
                           "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32",
                           "TYPE_FP64", "TYPE_STRING", "TYPE_BF16"]):
        dt.value.add(name=n, number=i)

    def msg(name, fields):
        m = fdp.message_type.add(name=name)
        for num, (fname, ftype, label, tname) in enumerate(fields, 1):
            f = m.field.add(name=fname, number=num, type=ftype, label=label)
            if tname:
                f.type_name = tname
        return m

    one, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    tensor = [("name", F.TYPE_STRING, one, None), ("data_type", F.TYPE_ENUM, one, ".inference.DataType"),
              ("dims", F.TYPE_INT64, rep, None)]
    msg("ModelInput", tensor)
    msg("ModelOutput", tensor)
    msg("ModelDynamicBatching", [("preferred_batch_size", F.TYPE_INT32, rep, None),
                                 ("max_queue_delay_microseconds", F.TYPE_UINT64, one, None)])
    group = msg("ModelInstanceGroup", [("name", F.TYPE_STRING, one, None), ("kind", F.TYPE_ENUM, one,
                                        ".inference.ModelInstanceGroup.Kind"), ("count", F.TYPE_INT32, one, None),
                                       ("gpus", F.TYPE_INT32, rep, None)])
    kind = group.enum_type.add(name="Kind")
    for i, n in enumerate(["KIND_AUTO", "KIND_GPU", "KIND_CPU", "KIND_MODEL"]):
        kind.value.add(name=n, number=i)
    msg("ModelConfig", [("name", F.TYPE_STRING, one, None), ("platform", F.TYPE_STRING, one, None),
                        ("max_batch_size", F.TYPE_INT32, one, None),
                        ("input", F.TYPE_MESSAGE, rep, ".inference.ModelInput"),
                        ("output", F.TYPE_MESSAGE, rep, ".inference.ModelOutput"),
                        ("instance_group", F.TYPE_MESSAGE, rep, ".inference.ModelInstanceGroup"),
                        ("default_model_filename", F.TYPE_STRING, one, None),
                        ("dynamic_batching", F.TYPE_MESSAGE, one, ".inference.ModelDynamicBatching")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("inference.ModelConfig"))


def _parse_pbtxt(text: str):
    from google.protobuf import text_format

    return text_format.Parse(text, _triton_config_class()())


def test_triton_export_of_a_profiled_bundle_batches_dynamically(int8_profiled, tmp_path):
    from edgeopt.triton import TritonOptions, export_triton

    bundle = Path(int8_profiled.results[0].bundle)
    res = export_triton(bundle, tmp_path / "repo", TritonOptions(queue_delay_us=250, preferred_batch=(4, 8),
                                                                 instances=2, gpus=(0, 1)))

    cfg = _parse_pbtxt((res.model_dir / "config.pbtxt").read_text())
    assert cfg.name == bundle.parent.name and cfg.platform == "tensorrt_plan"
    assert cfg.default_model_filename == "model.plan" and cfg.max_batch_size == 16
    assert [(i.name, list(i.dims)) for i in cfg.input] == [("x", [3, 48, 192])]
    assert [list(o.dims) for o in cfg.output] == [[2]] and cfg.input[0].data_type == 11  # TYPE_FP32
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 250
    g = cfg.instance_group[0]
    assert (g.count, g.kind, list(g.gpus)) == (2, 1, [0, 1])  # KIND_GPU
    assert (res.model_dir / "1").is_dir() and not res.engine_copied
    assert "edgeopt_agent compile" in res.next_steps[0] and "copy_to" in res.next_steps[0]


def test_triton_export_cli_of_a_static_bundle_and_its_errors(cli_fp16, tmp_path, capsys):
    from edgeopt.cli import main

    _, _, root = cli_fp16
    repo = tmp_path / "repo"
    assert main(["export", "triton", str(root / "h100-fp16"), "--repository", str(repo)]) == 0
    cfg = _parse_pbtxt((repo / root.name / "config.pbtxt").read_text())
    assert cfg.max_batch_size == 0 and list(cfg.input[0].dims) == [1, 3, 48, 192]
    assert not cfg.HasField("dynamic_batching")
    capsys.readouterr()

    cases = [
        (["export", "triton", str(root / "h100-fp16"), "--repository", str(repo)], "exists"),
        (["export", "triton", str(root / "h100-fp16"), "--repository", str(repo), "--name", "b", "--max-batch", "8"],
         "needs a dynamic batch dim"),
        (["export", "triton", str(root / "jetson-orin-fp16"), "--repository", str(repo), "--name", "j"], "Jetson"),
        (["export", "triton", str(root / "h100-fp16"), "--repository", str(repo), "--name", "bad/name"], "may hold only"),
        (["export", "triton", str(root / "h100-fp16"), "--repository", str(repo), "--name", "e", "--engine",
          str(tmp_path / "missing.plan")], "not a non-empty file"),
        (["export", "triton", str(tmp_path), "--repository", str(repo), "--name", "n"], "no manifest.json"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    assert sorted(p.name for p in repo.iterdir()) == [root.name]  # nothing half-written
    # --out/-o, the old spelling of --repository (one name per concept: --out is a bundle folder), still works
    # for one release, with one note on stderr
    for old, name in (("--out", "old"), ("-o", "short")):
        assert main(["export", "triton", str(root / "h100-fp16"), old, str(repo), "--name", name]) == 0
        err = capsys.readouterr().err
        assert [ln for ln in err.splitlines() if "note:" in ln] == [
            "edgeopt: note: --out/-o is now --repository (one name per concept); --out/-o goes in a later release"]
        assert (repo / name / "config.pbtxt").read_text() == (repo / root.name / "config.pbtxt").read_text() \
            .replace(f'name: "{root.name}"', f'name: "{name}"')
    (tmp_path / "afile").write_text("x")
    assert main(["export", "triton", str(root / "h100-fp16"), "--out", str(tmp_path / "afile" / "r")]) == 2
    err = capsys.readouterr().err
    assert "cannot write --repository" in err and "Traceback" not in err  # checked first, named by its new flag


def test_triton_export_copies_a_given_engine(cli_fp16, tmp_path):
    from edgeopt.triton import TritonOptions, export_triton

    _, _, root = cli_fp16
    engine = tmp_path / "h100.plan"
    engine.write_bytes(os.urandom(4096))  # stands in for the bytes `compile` writes; only copied here
    res = export_triton(root / "h100-fp16", tmp_path / "repo", TritonOptions(name="cls", engine=str(engine), version=3))
    assert res.engine_copied and (res.model_dir / "3" / "model.plan").read_bytes() == engine.read_bytes()
    assert json.loads((res.model_dir / "edgeopt.json").read_text())["precision"] == "fp16"


# ---------------------------------------------------------------------------------------------
# on a GPU with TensorRT: compile and bench (skipped here, with the reason)
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(GPU_REASON is not None, reason=str(GPU_REASON))
def test_compile_builds_then_reuses_the_engine(cli_fp16, tmp_path):
    _, _, root = cli_fp16
    bundle_name = "h100-fp16"
    opts = {"engine_cache": str(tmp_path / "engines")}
    first = _agent("compile", {"bundle": str(root / bundle_name), "options": opts})
    assert first["ok"], first
    c1 = first["compile"]
    assert c1["cached"] is False and Path(c1["engine"]).stat().st_size > 0 and c1["build_s"] > 0
    assert c1["timing_cache"]["used"] and Path(c1["timing_cache"]["path"]).is_file()
    assert Path(c1["build_log"]).read_text().strip()
    second = _agent("compile", {"bundle": str(root / bundle_name), "options": opts})["compile"]
    assert second["cached"] is True and second["cache_key"] == c1["cache_key"]
    assert second["key_parts"]["tensorrt"] == c1["tensorrt"]


@pytest.mark.gpu
@pytest.mark.skipif(GPU_REASON is not None, reason=str(GPU_REASON))
def test_tensorrt_runner_checks_fp16_and_int8_bundles_and_splits_timings(cli_fp16, int8_profiled, tmp_path):
    from edgeopt_agent.check import check_bundle

    _, _, root = cli_fp16
    opts = {"engine_cache": str(tmp_path / "engines")}
    for bundle in (root / "h100-fp16", Path(int8_profiled.results[0].bundle)):
        result = check_bundle(bundle, opts)
        assert result["passed"], result["outputs"]
        info = result["runner"]
        t = info["timings_ms"]
        assert t["runs"] == result["samples"]
        for phase in ("h2d", "compute", "d2h", "gpu_total", "host_e2e"):
            assert t[phase]["p50"] > 0
        assert t["host_e2e"]["mean"] >= t["compute"]["mean"]
        assert info["cuda_graph"] in ("replayed",) or info["cuda_graph"].startswith("capture failed")


@pytest.mark.gpu
@pytest.mark.skipif(GPU_REASON is not None, reason=str(GPU_REASON))
def test_bench_verb_reports_split_timings_for_tensorrt(cli_fp16, tmp_path):
    _, _, root = cli_fp16
    reply = _agent("bench", {"bundle": str(root / "h100-fp16"),
                             "options": {"duration_s": 0.5, "min_iters": 20, "warmup": 5,
                                         "runner": {"engine_cache": str(tmp_path / "engines")}}})
    assert reply["ok"], reply
    text = json.dumps(reply)
    assert "timings_ms" in text and "compute" in text and "h2d" in text
    # the split timings cover the timed loop only (reset after the warm-up), like the latency figures
    assert reply["bench"]["runner"]["timings_ms"]["runs"] == reply["bench"]["iterations"]


@pytest.mark.gpu
@pytest.mark.skipif(GPU_REASON is not None, reason=str(GPU_REASON))
def test_bench_profile_gives_tensorrt_layer_times_and_event_timed_copies(cli_fp16, tmp_path):
    _, _, root = cli_fp16
    reply = _agent("bench", {"bundle": str(root / "h100-fp16"),
                             "options": {"duration_s": 0.5, "min_iters": 20, "warmup": 5, "profile": 10,
                                         "runner": {"engine_cache": str(tmp_path / "engines")}}})
    assert reply["ok"], reply
    d = reply["bench"]["decomposition"]
    stages = {s["stage"]: s for s in d["stages"]}
    assert stages["copy in"]["ms"] > 0 and stages["copy in"]["how"] == "timed by the runner"
    p = d["profile"]
    assert p["profiler"].startswith("TensorRT") and "IProfiler" in p["profiler"] and p["iterations"] == 10
    assert p["ops"] and sum(o["share"] for o in p["ops"]) == pytest.approx(1.0)
    assert any(o["op"] != "layer" for o in p["ops"])  # layer types from the DETAILED engine inspector


def test_fp16_onnx_retypes_float_casts_so_onnx_runtime_loads_it():
    """y = Cast(ids -> float) * w: the converter retypes the Cast's output as float16 but leaves to=FLOAT,
    which ORT refuses (seen on magika's one-hot); the FP16 ONNX for TensorRT 11 must load and agree."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.linspace(-2, 2, 8, dtype=np.float32).reshape(1, 8), "w")
    g = helper.make_graph([helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT, name="to_float"),
                           helper.make_node("Mul", ["f", "w"], ["y"], name="mul")], "g",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    m16, report = trt_prep.to_fp16(model, [])
    assert report["casts_retyped"] == 1
    sess = ort.InferenceSession(m16.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.arange(8, dtype=np.int64).reshape(1, 8)
    y = sess.run(None, {"ids": ids})[0]
    expected = ids * np.linspace(-2, 2, 8, dtype=np.float32).reshape(1, 8)
    assert y.dtype == np.float32 and np.allclose(y, expected, atol=1e-2)
