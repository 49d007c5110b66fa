"""The Core ML target end to end: real fixture models -> .mlpackage bundles -> structural check.

Core ML predicts only on macOS; here the host check is structural (the package loads from disk,
IO names/shapes/dtypes match, Core ML's inferred output shapes equal ONNX Runtime's), and the
numeric test of a bundle runs on macOS only (skipped elsewhere with the reason).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import fixture

pytest.importorskip("coremltools", reason="the Core ML backend needs coremltools (pip install 'edgeopt[coreml]')")

ON_MAC = sys.platform == "darwin"


@pytest.fixture(scope="module")
def ct():
    from edgeopt.targets.coreml import import_coremltools

    return import_coremltools()


def _build(tmp_path_factory, images_dir, name, shape, precisions, options=None):
    from edgeopt.pipeline import build

    out = tmp_path_factory.mktemp(f"coreml-{name}")
    return build(fixture(name), "apple", precisions=precisions, shapes={"x": shape}, calib=str(images_dir),
                 preprocess="preset=pm1", out=out, jobs=2, n_calib=2, n_val=3, options=options)


@pytest.fixture(scope="module")
def cls_report(tmp_path_factory, images_dir):
    return _build(tmp_path_factory, images_dir, "ocr-cls", [1, 3, 48, 192], ["fp16"],
                  {"min_deployment_target": "iOS17"})


@pytest.fixture(scope="module")
def rec_report(tmp_path_factory, images_dir):
    return _build(tmp_path_factory, images_dir, "ocr-rec", [1, 3, 48, 320], ["fp16", "fp32"])


@pytest.fixture(scope="module")
def det_report(tmp_path_factory, images_dir):
    return _build(tmp_path_factory, images_dir, "ocr-det", [1, 3, 320, 320], ["fp16"])


def _program(ct, bundle: Path):
    """The MIL program saved in a bundle's package, re-read from disk."""
    from coremltools.converters.mil.frontend.milproto.load import load

    model = ct.models.MLModel(str(bundle / "model.mlpackage"), skip_model_load=True)
    spec = model.get_spec()
    return spec, load(spec, spec.specificationVersion, model.weights_dir)


def _assert_structural_ok(result, expected_output_shape):
    assert result.status == "built", result.error
    m = result.manifest
    hc = m["host_check"]
    assert hc["kind"] == "structural" and hc["passed"] and hc["loads"] and hc["inputs_match"] and hc["outputs_match"]
    assert hc["numeric"] == "on device" and "numeric check on device" in hc["note"]
    assert "numeric check: on device" in m["notes"]
    bundle = Path(result.bundle)
    with np.load(bundle / "validation" / "reference.npz") as ref:
        ort_shape = list(ref["out0"].shape[1:])
    (name, shapes), = hc["output_shapes"].items()
    assert shapes == {"coreml": ort_shape, "onnxruntime": ort_shape, "match": True}
    assert ort_shape == expected_output_shape
    assert m["runtime"] == {"name": "coreml", "artifact": "model.mlpackage", "options": {"compute_units": "ALL"}}
    assert (bundle / "model.mlpackage" / "Manifest.json").is_file()
    assert any(f.startswith("model.mlpackage/Data/com.apple.CoreML/weights/") for f in m["files"])
    out = m["io"]["outputs"][0]
    assert out["name"] == name and out["artifact_name"] == name.replace("/", "_").replace(".", "_")
    return bundle


def test_build_ocr_cls_fp16_with_ios17_passes_structural_check(ct, cls_report):
    (r,) = cls_report.results
    bundle = _assert_structural_ok(r, [1, 2])
    assert r.manifest["options"]["min_deployment_target"] == "iOS17"
    spec, _ = _program(ct, bundle)
    assert spec.specificationVersion == 8  # iOS17's Core ML spec version


def test_build_ocr_rec_fp16_and_fp32_pass_structural_check(ct, rec_report):
    by_precision = {r.precision: r for r in rec_report.results}
    for precision in ("fp16", "fp32"):
        bundle = _assert_structural_ok(by_precision[precision], [1, 40, 6625])
        spec, prog = _program(ct, bundle)
        assert spec.specificationVersion == 7  # the target profile's default, iOS16
        dtypes = {str(v.dtype.__name__) for op in prog.functions["main"].operations for v in op.outputs}
        # FP16 computes in fp16 (IO stays fp32); FP32 has no fp16 tensor at all.
        assert ("fp16" in dtypes) == (precision == "fp16"), dtypes
        ops = {op.op_type for op in prog.functions["main"].operations}
        assert {"matmul", "softmax", "conv", "layer_norm"} <= ops  # its 5 LayerNorms fused


def test_build_ocr_det_fp16_passes_structural_check(ct, det_report):
    (r,) = det_report.results
    bundle = _assert_structural_ok(r, [1, 1, 320, 320])
    _, prog = _program(ct, bundle)
    ops = {op.op_type for op in prog.functions["main"].operations}
    # The FPN's nearest x2 resize maps to Core ML's native op; the head's ConvTranspose too.
    assert {"upsample_nearest_neighbor", "conv_transpose", "conv", "sigmoid"} <= ops


def test_bundle_files_verify_against_the_manifest(cls_report):
    from edgeopt_agent.bundle import verify

    result = verify(cls_report.results[0].bundle)
    assert result["ok"] and result["files"] >= 5


def test_agent_check_reports_coreml_unavailable_off_macos(cls_report):
    if ON_MAC:
        pytest.skip("on macOS the check runs (see the macOS numeric test)")
    proc = subprocess.run([sys.executable, "-m", "edgeopt_agent", "check"],
                          input=json.dumps({"bundle": cls_report.results[0].bundle}), capture_output=True, text=True,
                          timeout=120)
    reply = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not reply["ok"]
    assert reply["error"]["type"] == "RunnerUnavailable" and "only on macOS" in reply["error"]["message"]


@pytest.mark.macos
@pytest.mark.skipif(not ON_MAC, reason="Core ML predicts only on macOS (coremltools: 'Model prediction is only "
                                       "supported on macOS'); the Linux host check is structural")
@pytest.mark.parametrize("units", ["CPU_ONLY", "ALL"])
def test_coreml_bundle_numeric_check_on_macos(cls_report, units):
    from edgeopt_agent.check import check_bundle

    result = check_bundle(cls_report.results[0].bundle, {"compute_units": units})
    assert result["passed"], result["outputs"]
    assert result["runner"]["compute_units"] == units


def test_runner_load_refuses_off_macos_with_reason(cls_report):
    if ON_MAC:
        pytest.skip("Core ML loads on macOS")
    from edgeopt_agent.bundle import load_manifest
    from edgeopt_agent.runners import RunnerUnavailable, get_runner

    bundle = cls_report.results[0].bundle
    runner = get_runner("coreml")(Path(bundle), load_manifest(bundle), {"compute_units": "CPU_ONLY"})
    assert runner.compute_units() == "CPU_ONLY"
    with pytest.raises(RunnerUnavailable, match="only on macOS"):
        runner.load()


def test_runner_rejects_unknown_compute_units(tmp_path):
    from edgeopt_agent.runners.coreml import CoreMlRunner

    manifest = {"runtime": {"name": "coreml", "artifact": "model.mlpackage", "options": {"compute_units": "GPU"}},
                "files": {"model.mlpackage/Manifest.json": {}}}
    with pytest.raises(ValueError, match="CPU_AND_GPU"):
        CoreMlRunner(tmp_path, manifest).compute_units()


def test_structural_check_names_what_differs(ct, cls_report):
    from edgeopt.targets.coreml import structural_check

    bundle = Path(cls_report.results[0].bundle)
    io = json.loads((bundle / "manifest.json").read_text())["io"]
    io["inputs"][0]["artifact_name"] = "image"
    io["outputs"][0]["shape"] = [1, 3]
    result = structural_check(ct, bundle / "model.mlpackage", io)
    assert not result["passed"] and not result["inputs_match"] and not result["outputs_match"]
    text = " ".join(result["problems"])
    assert "package has x" in text and "Core ML infers [1, 2]" in text and "ONNX Runtime gives [1, 3]" in text


def test_structural_check_reports_a_broken_package(ct, tmp_path):
    from edgeopt.targets.coreml import structural_check

    pkg = tmp_path / "model.mlpackage"
    pkg.mkdir()
    (pkg / "Manifest.json").write_text("{}")
    result = structural_check(ct, pkg, {"inputs": [], "outputs": []})
    assert not result["passed"] and not result["loads"] and "does not load" in result["problems"][0]


def _tiny_job(tmp_path, options, out_shape):
    from edgeopt.targets.base import BuildJob
    from edgeopt.targets.registry import resolve_target
    from tests.conftest import tiny_cnn

    bundle = tmp_path / "bundle"
    bundle.mkdir(parents=True)
    model = tiny_cnn(tmp_path / "tiny.onnx")
    io = {"inputs": [{"name": "x", "shape": [1, 3, 32, 32], "dtype": "float32"}],
          "outputs": [{"name": "prob", "shape": out_shape, "dtype": "float32"}]}
    return BuildJob(model_name="tiny", model_path=str(model), model_sha256="0", prepared_path=str(model),
                    target=resolve_target("apple").as_dict(), precision="fp32", bundle_dir=str(bundle), io=io,
                    calib_path=None, validation_path="", reference_path="", data_source={"kind": "random"},
                    options=options)


def test_build_fails_when_structure_differs_unless_allowed(tmp_path):
    from edgeopt.errors import BuildFailed
    from edgeopt.targets.coreml import CoreMlTarget

    with pytest.raises(BuildFailed, match=r"ONNX Runtime gives \[1, 11\]"):
        CoreMlTarget()._build(_tiny_job(tmp_path / "a", {}, [1, 11]), lambda s: None)
    out = CoreMlTarget()._build(_tiny_job(tmp_path / "b", {"allow_mismatch": True}, [1, 11]), lambda s: None)
    assert out.structural["passed"] is False and out.check == ("numeric" if ON_MAC else "structural")


def test_build_refuses_a_bad_deployment_target_or_compute_units(tmp_path):
    from edgeopt.errors import UsageError
    from edgeopt.targets.coreml import CoreMlTarget

    with pytest.raises(UsageError, match="iOS14") as info:
        CoreMlTarget()._build(_tiny_job(tmp_path / "a", {"min_deployment_target": "iOS14"}, [1, 10]), lambda s: None)
    assert "iOS15" in str(info.value) and "macOS10_15" not in str(info.value)
    with pytest.raises(UsageError, match="compute_units"):
        CoreMlTarget()._build(_tiny_job(tmp_path / "b", {"compute_units": "NPU"}, [1, 10]), lambda s: None)
    assert not (tmp_path / "a" / "bundle" / "model.mlpackage").exists()


def test_options_are_checked_before_the_build():
    from edgeopt.errors import UsageError
    from edgeopt.targets.coreml import CoreMlTarget
    from edgeopt.targets.registry import resolve_target

    target, spec = CoreMlTarget(), resolve_target("apple").as_dict()
    assert target.known_options() == {"min_deployment_target", "compute_units"}
    target.check_options({"min_deployment_target": "iOS17", "compute_units": "cpu_and_ne", "int8_search": "full"},
                         "fp16", spec)
    with pytest.raises(UsageError, match="iOS14"):
        target.check_options({"min_deployment_target": "iOS14"}, "fp16", spec)
    with pytest.raises(UsageError, match="compute_units"):
        target.check_options({"compute_units": "NPU"}, "fp32", spec)


def test_deployment_target_names(ct):
    from edgeopt.targets.coreml import deployment_target

    assert deployment_target(ct, "ios17") == (ct.target.iOS17, "iOS17")
    assert deployment_target(ct, "macos13") == (ct.target.iOS16, "macOS13")  # same spec version


def test_import_coremltools_leaves_frameworks_importable(ct):
    assert all(sys.modules.get(m, "absent") is not None for m in ("tensorflow", "torch", "sklearn"))


def test_target_is_registered_with_a_structural_check():
    from edgeopt.targets.registry import get_backend, resolve_target

    spec = resolve_target("coreml")
    backend = get_backend(spec.backend)
    assert spec.name == "apple" and backend.backend == "coreml" and backend.check_kind == "structural"
    assert backend.available() is None and backend.packages == ["coremltools"]


@pytest.mark.parametrize("name", ["ocr-cls", "ocr-rec", "ocr-det"])
def test_preflight_takes_every_node_of_the_ocr_models(name):
    from edgeopt.model import inspect
    from edgeopt.targets.registry import get_backend, resolve_target

    assert get_backend("coreml").unsupported_nodes(inspect(fixture(name)), resolve_target("apple").as_dict()) == []


def _speech_windows(model: Path, n: int = 40, every: int = 4) -> dict[str, np.ndarray]:
    """Real speech (beckett.wav) streamed through the VAD in 64+512-sample windows with the state carried
    by ONNX Runtime: (input, state) pairs as the model sees them in use."""
    import wave

    import onnxruntime as ort

    with wave.open(str(fixture("speech"))) as w:
        audio = np.frombuffer(w.readframes(w.getnframes()), np.int16).astype(np.float32) / 32768
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    state, context = np.zeros((2, 1, 128), np.float32), np.zeros(64, np.float32)
    inputs, states = [], []
    for k in range(n):
        chunk = np.concatenate([context, audio[k * 512:(k + 1) * 512]])[None]
        if k % every == 0:
            inputs.append(chunk)
            states.append(state)
        _, state = sess.run(None, {"input": chunk, "state": state})
        context = chunk[0, -64:]
    return {"input": np.stack(inputs), "state": np.stack(states)}


def test_build_stateful_vad_with_lstm_passes_structural_check(tmp_path, ct):
    """silero's static-shape variant (LSTM, state in and out) converts; both outputs check out."""
    from edgeopt.pipeline import build

    model = fixture("silero-vad").parent / "silero_vad_openvino_16k.onnx"
    if not model.is_file():
        pytest.skip(f"{model.name} is not in this silero-vad wheel")
    np.savez(tmp_path / "speech.npz", **_speech_windows(model))
    report = build(model, "apple", precisions=["fp16"], calib=str(tmp_path / "speech.npz"), out=tmp_path / "out",
                   n_calib=2, n_val=4)
    (r,) = report.results
    assert r.status == "built", r.error
    hc = r.manifest["host_check"]
    assert hc["passed"] and hc["inputs_match"] and hc["outputs_match"]
    assert {k: v["coreml"] for k, v in hc["output_shapes"].items()} == {"output": [1, 1], "stateN": [2, 1, 128]}
    _, prog = _program(ct, Path(r.bundle))
    assert "lstm" in {op.op_type for op in prog.functions["main"].operations}


def _silero_expected():
    """Every node of silero_vad (subgraphs too) whose op the table lacks, walked with onnx directly."""
    import onnx

    from edgeopt.targets.coreml.ops import supported_op_types

    ops = supported_op_types()

    def walk(g):
        for n in g.node:
            yield n
            for a in n.attribute:
                for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                    yield from walk(sub)

    return sorted((n.op_type, n.name) for n in walk(onnx.load(str(fixture("silero-vad"))).graph)
                  if n.op_type not in ops)


def test_inspect_json_lists_every_unsupported_silero_node(capsys):
    from edgeopt.cli import main

    assert main(["inspect", str(fixture("silero-vad")), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (row,) = [r for r in data["support"] if r["target"] == "apple"]
    got = sorted((u["op"], u["node"]) for u in row["unsupported"] if u["node"] != "sr")
    assert not row["supported"]
    assert got == _silero_expected()
    # and the rank-0 `sr` input (support_rules: Core ML inputs have rank >= 1), as the translator says
    assert [u["op"] for u in row["unsupported"] if u["node"] == "sr"] == [
        "input 'sr' (rank 0) (a rank-0 (scalar) model input: Core ML takes inputs of rank >= 1)"]
    # LSTM is translated; the If nodes (branching on the `sr` input's value at run time) are not.
    assert {op for op, _ in got} == {"If"} and len(got) == 25


def test_build_of_silero_is_unsupported_with_every_node_named(tmp_path, capsys):
    from edgeopt.cli import main

    rc = main(["build", str(fixture("silero-vad")), "--targets", "coreml", "--shape", "input:1x576",
               "--shape", "state:2x1x128", "--out", str(tmp_path), "--json"])
    assert rc == 3
    (res,) = json.loads(capsys.readouterr().out)["results"]
    assert res["status"] == "unsupported" and res["target"] == "apple"
    assert res["error"].startswith("26 unsupported node(s): ")  # 25 Ifs and the rank-0 `sr` input
    assert "input 'sr' (rank 0)" in res["error"]
    first, hint, nodes = res["error"].splitlines()[:3]  # grouped by op type, the hint, then every node
    assert "If ×25" in first and hint.strip().startswith("hint:") and nodes.strip().startswith("nodes: ")
    for op, name in _silero_expected():
        assert f"{op} ({name})" in res["error"]
    assert not any(p.name != ".edgeopt-probe" and p.is_dir() for p in tmp_path.iterdir())


def _log_power_model(path: Path) -> None:
    """A log-power feature in small: log(x * x) * 0.1, whose x * x passes FP16's 65504 for |x| > 256."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n = helper.make_node
    g = helper.make_graph(
        [n("Mul", ["x", "x"], ["power"], name="square"), n("Log", ["power"], ["logp"], name="log"),
         n("Mul", ["logp", "k"], ["y"], name="scale")], "logpow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [numpy_helper.from_array(np.array(0.1, np.float32), "k")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


@pytest.mark.parametrize("scale,kept", [(3000.0, True), (10.0, False)])
def test_fp16_keeps_the_layers_fp16_would_overflow_in_fp32(ct, tmp_path, scale, kept):
    """apple's default precision is fp16: on raw PCM a power spectrum passes 65504 and would be Inf.
    The FP16 range analysis names those tensors and the ops reading or writing them stay FP32 in the
    package; the rest is FP16, and a model within range is FP16 throughout."""
    from coremltools.proto import MIL_pb2

    from edgeopt.pipeline import build

    _log_power_model(tmp_path / "m.onnx")
    x = (np.random.default_rng(0).uniform(0.5, 1.0, (8, 1, 64)) * scale).astype(np.float32)
    np.savez(tmp_path / "d.npz", x=x)
    r = build(str(tmp_path / "m.onnx"), "apple", ["fp16"], calib=str(tmp_path / "d.npz"), out=tmp_path / "o").results[0]
    assert r.ok, r.error
    notes = [s for s in r.manifest["notes"] if "kept in FP32" in s]
    assert not any("FP16 overflow ahead" in w for w in r.manifest["warnings"])  # handled, not just warned
    spec, _ = _program(ct, Path(r.bundle))
    fn = spec.mlProgram.functions["main"]
    dtypes = {o.name: MIL_pb2.DataType.Name(o.type.tensorType.dataType)
              for op in fn.block_specializations[fn.opset].operations for o in op.outputs if op.type in ("mul", "log")}
    if kept:
        assert len(notes) == 1 and "2 ONNX node(s) kept in FP32" in notes[0] and "power reaches" in notes[0]
        assert dtypes["power"] == dtypes["logp"] == "FLOAT32"  # the square and the log that reads it
        assert [t for n, t in dtypes.items() if n.startswith("y")] == ["FLOAT16"]
    else:
        assert not notes and set(dtypes.values()) == {"FLOAT16"}, dtypes
