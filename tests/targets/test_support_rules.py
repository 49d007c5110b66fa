"""Attribute-level support rules (targets/support_rules.py) and a short real conformance run (issue 32).

The conformance part runs ONNX's own backend node tests (shipped in the onnx wheel, with the spec's
expected outputs) through ``inspect`` and ``build -p fp32`` for cpu and intel-cpu, as
bench/bench_conformance.py does over every float32 test."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def _one_node(path, node, inputs, outputs, opset=18, inits=()):
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], list(inits))
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8), str(path))
    return str(path)


def _refused(backend: str, path: str) -> list[tuple[str, str]]:
    from edgeopt.model import inspect
    from edgeopt.targets.registry import get_backend

    return get_backend(backend).attribute_refusals(inspect(path))


def test_mobile_refuses_cubic_resize_and_takes_linear(tmp_path):
    from onnx import numpy_helper

    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    for mode in ("cubic", "linear"):
        node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=mode, name="up")
        p = _one_node(tmp_path / f"{mode}.onnx", node, [("x", [1, 1, 4, 4])],
                      [("y", TensorProto.FLOAT, [1, 1, 8, 8])], inits=[scales])
        bad = _refused("tflite", p)
        if mode == "cubic":
            assert len(bad) == 1 and bad[0][1] == "up" and "mode=cubic" in bad[0][0] and "onnx2tf" in bad[0][0]
            assert "FlexResizeBicubic" in bad[0][0]
            assert _refused("onnxruntime", p) == [] and _refused("coreml", p) == []
        else:
            assert bad == []


def test_apple_refuses_select_last_index_in_inspect_and_build(tmp_path):
    from edgeopt.api import support_matrix
    from edgeopt.model import inspect
    from edgeopt.pipeline import build

    node = helper.make_node("ArgMax", ["x"], ["y"], axis=1, keepdims=1, select_last_index=1, name="am")
    p = _one_node(tmp_path / "am.onnx", node, [("x", [2, 5])], [("y", TensorProto.INT64, [2, 1])])
    row = next(r for r in support_matrix(inspect(p)) if r["target"] == "apple")
    assert not row["supported"] and [u["node"] for u in row["unsupported"]] == ["am"]
    assert "select_last_index=1" in row["unsupported"][0]["op"]
    res = build(p, "apple", ["fp32"], out=tmp_path / "out", jobs=1).results[0]
    assert res.status == "unsupported" and "select_last_index=1" in res.error
    # the same node with select_last_index=0 is a plain yes
    node0 = helper.make_node("ArgMax", ["x"], ["y"], axis=1, keepdims=1, name="am")
    p0 = _one_node(tmp_path / "am0.onnx", node0, [("x", [2, 5])], [("y", TensorProto.INT64, [2, 1])])
    assert _refused("coreml", p0) == []


def test_intel_cpu_refuses_a_ceil_mode_maxpool_whose_last_window_starts_in_the_padding(tmp_path):
    # the node test maxpool_2d_ceil_output_size_reduce_by_one: 2x2 input, k=1, stride 2, ceil: the spec gives 1x1
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[1, 1], strides=[2, 2], ceil_mode=1, name="mp")
    p = _one_node(tmp_path / "mp.onnx", node, [("x", [1, 1, 2, 2])], [("y", TensorProto.FLOAT, [1, 1, 1, 1])])
    bad = _refused("openvino", p)
    assert len(bad) == 1 and bad[0][1] == "mp" and "ceil_mode=1" in bad[0][0]
    assert _refused("onnxruntime", p) == [] and _refused("tflite", p) == []
    # 3x3 input, k=2, stride 2, ceil: the last window starts inside the input: no refusal
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, name="mp")
    p = _one_node(tmp_path / "mp3.onnx", node, [("x", [1, 1, 3, 3])], [("y", TensorProto.FLOAT, [1, 1, 2, 2])])
    assert _refused("openvino", p) == []
    # AveragePool of the refused geometry: OpenVINO matches the spec, Core ML declares the spec's shape
    # (the node test averagepool_2d_ceil_last_window_starts_on_pad built and passed on both)
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[1, 1], strides=[2, 2], ceil_mode=1, name="ap")
    p = _one_node(tmp_path / "ap.onnx", node, [("x", [1, 1, 2, 2])], [("y", TensorProto.FLOAT, [1, 1, 1, 1])])
    assert _refused("openvino", p) == [] and _refused("coreml", p) == []


def test_intel_cpu_refuses_qk_matmul_output_modes_1_and_2_only(tmp_path):
    """OpenVINO's qk_matmul_output is off the spec after the mask/bias (1) and the softcap (2); the plain QK
    product (0) and the softmax output (3) match (node tests attention_*_qk_matmul{,_bias,_softcap,_softmax})."""
    for mode in range(4):
        node = helper.make_node("Attention", ["q", "k", "v"], ["y", "", "", "qk"], qk_matmul_output_mode=mode,
                                name="att")
        p = _one_node(tmp_path / f"att{mode}.onnx", node, [(n, [1, 2, 3, 4]) for n in "qkv"],
                      [("y", TensorProto.FLOAT, [1, 2, 3, 4]), ("qk", TensorProto.FLOAT, [1, 2, 3, 3])], opset=23)
        bad = _refused("openvino", p)
        assert (len(bad) == 1 and f"qk_matmul_output_mode={mode}" in bad[0][0]) if mode in (1, 2) else bad == []


def _lstm(path, layout, seq=3):
    from onnx import numpy_helper

    batch, inp, hid = 2, 4, 5
    x_shape = [batch, seq, inp] if layout else [seq, batch, inp]
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((1, 4 * hid, inp)).astype(np.float32), "W")
    r = numpy_helper.from_array(rng.standard_normal((1, 4 * hid, hid)).astype(np.float32), "R")
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=hid, layout=layout, name="rnn")
    y_shape = [batch, seq, 1, hid] if layout else [seq, 1, batch, hid]
    return _one_node(path, node, [("x", x_shape)], [("y", TensorProto.FLOAT, y_shape)], opset=14, inits=[w, r])


def test_a_batch_first_lstm_is_refused_everywhere_each_with_its_reason(tmp_path):
    import onnxruntime as ort

    p = _lstm(tmp_path / "bf.onnx", 1)
    with pytest.raises(Exception, match="layout"):  # the fact the onnxruntime rule stands on
        ort.InferenceSession(p, providers=["CPUExecutionProvider"])
    why = {"onnxruntime": "no kernel", "tensorrt": "no kernel", "openvino": "ignores layout=1",
           "coreml": "sequence-first", "tflite": "sequence-first"}
    for backend, text in why.items():
        bad = _refused(backend, p)
        assert [n for _, n in bad] == ["rnn"] and text in bad[0][0] and "layout=1" in bad[0][0], backend
    seq_first = _lstm(tmp_path / "sf.onnx", 0)
    ort.InferenceSession(seq_first, providers=["CPUExecutionProvider"])
    assert _refused("onnxruntime", seq_first) == []


def test_mobile_doubts_a_sequence_first_lstm_with_a_batch_above_one(tmp_path):
    """onnx2tf 1.29 failed on both batch-3 LSTM node tests; a batch-1 LSTM converts: "probably not" only above 1."""
    from edgeopt.model import inspect
    from edgeopt.targets.registry import get_backend

    tfl = get_backend("tflite")
    batch2 = inspect(_lstm(tmp_path / "b2.onnx", 0))
    doubt = tfl.probable_refusals(batch2, {})
    assert [d["node"] for d in doubt] == ["rnn"] and "batch 2" in doubt[0]["why"], doubt
    assert "rnn" not in {n for _, n in tfl.unsupported_nodes(batch2, {})}  # a doubt, not a refusal

    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((1, 20, 4)).astype(np.float32), "W")
    r = numpy_helper.from_array(rng.standard_normal((1, 20, 5)).astype(np.float32), "R")
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=5, name="rnn")
    one = _one_node(tmp_path / "b1.onnx", node, [("x", [3, 1, 4])], [("y", TensorProto.FLOAT, [3, 1, 1, 5])],
                    opset=14, inits=[w, r])
    assert tfl.probable_refusals(inspect(one), {}) == []


def test_probably_not_is_a_third_state_with_its_reason(tmp_path):
    from edgeopt.model import inspect
    from edgeopt.targets.registry import get_backend

    # InstanceNormalization whose scale/bias are model inputs (the node test instancenorm_example)
    node = helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], name="inorm")
    p = _one_node(tmp_path / "in.onnx", node, [("x", [1, 2, 3, 3]), ("s", [2]), ("b", [2])],
                  [("y", TensorProto.FLOAT, [1, 2, 3, 3])])
    info = inspect(p)
    tfl = get_backend("tflite")
    assert "inorm" not in {n for _, n in tfl.unsupported_nodes(info, {})}  # not a refusal...
    doubt = tfl.probable_refusals(info, {})
    assert [d["node"] for d in doubt] == ["inorm"] and "onnx2tf" in doubt[0]["why"]  # ...but not a plain yes
    assert "model inputs" in doubt[0]["why"]
    assert get_backend("onnxruntime").probable_refusals(info, {}) == []
    # inspect shows it: a third state in the table, the reason below it, and `probably` in --json
    import json
    import subprocess
    import sys

    text = subprocess.run([sys.executable, "-m", "edgeopt", "inspect", str(p)], capture_output=True, text=True,
                          timeout=300)
    assert text.returncode == 0, text.stderr[-1500:]
    assert "probably not: 1 node(s): InstanceNormalization" in text.stdout and "inorm: " in text.stdout
    doc = json.loads(subprocess.run([sys.executable, "-m", "edgeopt", "inspect", str(p), "--json"],
                                    capture_output=True, text=True, timeout=300).stdout)
    rows = {r["target"]: r for r in doc["support"]}
    assert rows["mobile"]["supported"] and [d["node"] for d in rows["mobile"]["probably"]] == ["inorm"]
    assert rows["cpu"]["probably"] == []
    # the same op with constant parameters: a plain yes
    from onnx import numpy_helper

    consts = [numpy_helper.from_array(np.ones(2, np.float32), n) for n in ("s", "b")]
    p = _one_node(tmp_path / "inc.onnx", node, [("x", [1, 2, 3, 3])], [("y", TensorProto.FLOAT, [1, 2, 3, 3])],
                  inits=consts)
    assert tfl.probable_refusals(inspect(p), {}) == []


def test_rules_off_lets_build_try(tmp_path, monkeypatch):
    p = _lstm(tmp_path / "bf.onnx", 1)
    assert _refused("onnxruntime", p)
    monkeypatch.setenv("EDGEOPT_SUPPORT_RULES", "off")
    assert _refused("onnxruntime", p) == []


@pytest.mark.parametrize("test", ["test_relu", "test_maxpool_2d_ceil_output_size_reduce_by_one"])
def test_conformance_short(test, tmp_path):
    """Real node tests through inspect and build (cpu, intel-cpu), artifacts against the spec's outputs:
    inspect's yes builds and matches the spec, its no is a build that fails (intel-cpu's ceil-mode MaxPool:
    OpenVINO's output has one element more, edgeopt's check refuses it)."""
    pytest.importorskip("openvino")
    from bench.bench_conformance import node_dir, run_test

    if not (node_dir() / test).exists():
        pytest.skip(f"{test} is not in this onnx wheel")
    rec = run_test(test, ["cpu", "intel-cpu"], tmp_path, timeout=300)
    out = {t: r["outcome"] for t, r in rec["targets"].items()}
    assert out["cpu"] == "passed", rec
    assert out["intel-cpu"] == ("passed" if test == "test_relu" else "refused"), rec
    if test != "test_relu":
        assert rec["targets"]["intel-cpu"]["status"] in ("check-failed", "failed"), rec


def test_the_spec_reference_is_used_where_onnx_runtime_cannot_load_the_model(tmp_path, monkeypatch):
    """A batch-first LSTM: ONNX Runtime has no kernel, onnx.reference makes the FP32 reference (named in the
    manifest), and it catches OpenVINO's conversion, which ignores layout=1 (why inspect refuses it).
    One time step: onnx 1.19's reference LSTM fails on layout=1 with more (a broadcast error, said as such)."""
    pytest.importorskip("openvino")
    from onnx.reference import ReferenceEvaluator

    from edgeopt.pipeline import build
    from edgeopt_agent.bundle import load_manifest, reference_outputs, validation_inputs

    p = _lstm(tmp_path / "bf.onnx", 1, seq=1)
    monkeypatch.setenv("EDGEOPT_SUPPORT_RULES", "off")  # let build try what inspect refuses
    res = build(p, "intel-cpu", ["fp32"], out=tmp_path / "out", jobs=1, allow_mismatch=True).results[0]
    m = load_manifest(res.bundle)
    assert m["validation"]["reference_engine"] == "onnx.reference" and "onnx" in m["validation"]["reference_runtime"]
    feed = validation_inputs(res.bundle, m)[0]
    want = ReferenceEvaluator(p).run(None, feed)[0]
    np.testing.assert_allclose(reference_outputs(res.bundle, m)["y"][0], want, rtol=1e-6)
    assert m["host_check"]["passed"] is False  # OpenVINO's batch-first LSTM is off the spec


def test_grouped_kv_attention_is_refused_everywhere_as_the_reference_is_off_the_spec(tmp_path):
    """The node test attention_4d_gqa: ONNX Runtime 1.23 (every build's FP32 reference) is off the spec's output."""
    from bench.bench_conformance import node_dir, spec_data

    test = "test_attention_4d_gqa"
    if not (node_dir() / test).exists():
        pytest.skip(f"{test} is not in this onnx wheel")
    import onnxruntime as ort

    path = str(node_dir() / test / "model.onnx")
    inputs, expected = spec_data(test)
    got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    assert not np.allclose(got, next(iter(expected.values())), rtol=1e-3, atol=1e-5)  # the fact the rule stands on
    for backend in ("onnxruntime", "openvino", "tensorrt", "tflite", "coreml"):
        assert any("grouped KV heads (9 query heads, 3 key/value heads)" in label for label, _ in
                   _refused(backend, path)), backend
    # equal heads: no refusal
    assert _refused("onnxruntime", str(node_dir() / "test_attention_4d" / "model.onnx")) == []


def test_h100_result_shows_the_host_check_of_its_prepared_onnx(tiny_model, tmp_path):
    """The engine is checked on the device (passed stays null), but the prepared ONNX passed here: the result
    line and --json's check say so instead of a bare "on device" (issue 32 item 4)."""
    from edgeopt.pipeline import build

    rep = build(str(tiny_model), "h100", "fp32", out=tmp_path / "d", jobs=1)
    res = rep.results[0]
    assert res.ok and res.check.startswith("prepared ONNX passed") and "on the host" in res.check
    check = rep.as_dict()["results"][0]["check"]
    assert check["passed"] is None and check["prepared_onnx"]["passed"] is True
    assert "not the TensorRT engine" in check["prepared_onnx"]["what"]


def test_mobile_refuses_ops_onnx2tf_lowers_to_a_flex_op(tmp_path):
    for op in ("Acosh", "Softsign", "Erf", "Asin", "Cos"):
        p = _one_node(tmp_path / f"{op}.onnx", helper.make_node(op, ["x"], ["y"], name="n"), [("x", [2, 3])],
                      [("y", TensorProto.FLOAT, [2, 3])])
        bad = _refused("tflite", p)
        if op in ("Acosh", "Softsign"):  # certain: one TensorFlow op, no LiteRT builtin
            assert len(bad) == 1 and "Flex op" in bad[0][0] and op.lower() in bad[0][0]
        else:  # Erf, Asin: the target asks onnx2tf for builtin replacements; Cos: a builtin
            assert bad == []


def test_intel_cpu_takes_a_one_input_mean_but_not_a_one_input_max(tmp_path):
    # node tests mean_one_input (built, matched the spec) and max/min/sum_one_input (OpenVINO drops the port)
    for op in ("Mean", "Max"):
        p = _one_node(tmp_path / f"{op}.onnx", helper.make_node(op, ["x"], ["y"], name="n"), [("x", [3])],
                      [("y", TensorProto.FLOAT, [3])])
        assert bool(_refused("openvino", p)) == (op == "Max")


def test_the_spec_makes_the_reference_where_onnx_runtime_departs_from_it(tmp_path):
    """Resize align_corners with downsampling scales: ONNX Runtime (every build's usual reference) is off the
    spec's expected output by up to 0.86; spec_check finds it on the node's real inputs, the reference becomes
    onnx.reference's, and the cpu artifact (ONNX Runtime) is refused with the reason instead of passing every
    check off the spec. Upsampling (where both agree) and the same Resize given `sizes` keep ONNX Runtime's."""
    from bench.bench_conformance import node_dir, run_test, spec_data
    from edgeopt import spec_check

    down, up = "test_resize_downsample_scales_linear_align_corners", "test_resize_upsample_scales_linear_align_corners"
    if not (node_dir() / down).exists():
        pytest.skip(f"{down} is not in this onnx wheel")
    inputs, _ = spec_data(down)
    found = spec_check.deviations(node_dir() / down / "model.onnx", inputs)
    assert [d["op"] for d in found] == ["Resize"] and found[0]["max_abs"] > 0.5, found
    assert spec_check.deviations(node_dir() / up / "model.onnx", spec_data(up)[0]) == []
    rec = run_test(down, ["cpu"], tmp_path, timeout=300)["targets"]["cpu"]
    assert rec["status"] == "check-failed" and rec["outcome"] == "probably-failed", rec
    assert "the reference is the ONNX spec's" in rec["error"] and "`sizes` instead of `scales`" in rec["error"]
    rec = run_test(up, ["cpu"], tmp_path, timeout=300)["targets"]["cpu"]
    assert rec["outcome"] == "probably-built" and rec["spec"]["allclose"], rec

    # the same downsampling given as sizes [1, 1, 1, 2]: ONNX Runtime and the spec agree, nothing changes
    node = helper.make_node("Resize", ["X", "", "", "sizes"], ["Y"], mode="linear",
                            coordinate_transformation_mode="align_corners")
    sizes = helper.make_tensor("sizes", TensorProto.INT64, [4], [1, 1, 1, 2])
    p = _one_node(tmp_path / "sizes.onnx", node, [("X", [1, 1, 2, 4])], [("Y", TensorProto.FLOAT, [1, 1, 1, 2])],
                  opset=13, inits=[sizes])
    assert spec_check.suspect_nodes(onnx.load(p)) and spec_check.deviations(p, {"X": inputs["X"]}) == []


def test_a_model_without_inputs_is_refused_in_one_line_where_the_check_feeds_inputs(tmp_path):
    from edgeopt.pipeline import build

    node = helper.make_node("Constant", [], ["y"], value=helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0]))
    g = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    p = str(tmp_path / "const.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8), p)
    for backend in ("onnxruntime", "openvino", "tflite", "tensorrt"):
        assert [label.split(" (")[0] for label, _ in _refused(backend, p)] == ["no model input"], backend
    assert _refused("coreml", p) == []  # Core ML's check is structural: it builds
    res = build(p, "cpu", ["fp32"], out=tmp_path / "out", jobs=1).results[0]
    assert res.status == "unsupported" and "has no inputs" in res.error and "nothing to feed" in res.error, res.error
    assert "stack" not in res.error


def test_debug_says_onnx_runtime_is_off_the_spec_where_the_reference_is_the_specs(tmp_path):
    """The cpu artifact of the align_corners downsampling Resize is ONNX Runtime itself: debug's per-layer table
    (which compares with ONNX Runtime) finds no jump, and says why the build was refused all the same."""
    from bench.bench_conformance import node_dir, spec_data
    from edgeopt.debug import debug_model, summary

    test = "test_resize_downsample_scales_linear_align_corners"
    if not (node_dir() / test).exists():
        pytest.skip(f"{test} is not in this onnx wheel")
    inputs, _ = spec_data(test)
    np.savez(tmp_path / "d.npz", **{k: v[None] for k, v in inputs.items()})
    _, res = debug_model(str(node_dir() / test / "model.onnx"), "cpu", "fp32", dist=str(tmp_path / "d"),
                         calib=str(tmp_path / "d.npz"), progress=lambda s: None)
    text = summary(res)
    # the per-layer table finds no jump, and the policy (against the spec's reference) still refuses: both said
    assert res.first_jump is None and "no tensor past the bound" in text and "policy: REFUSED" in text, text
    assert "ONNX Runtime itself, whose tensors this table compares with, is off the spec at Resize" in text, text


def test_mobile_inputs_that_read_the_same_in_both_layouts_are_fed_as_the_file_takes_them(tmp_path):
    """concat_3d_axis_1: two [2, 2, 2] inputs read the same in NCW and NWC; onnx2tf kept their layout, and
    "taken as NHWC" fed the file transposed values (the check refused it: rel_l2 0.073). The layout is now
    chosen by running validation sample 0, and the artifact matches the spec."""
    pytest.importorskip("onnx2tf")
    from bench.bench_conformance import node_dir, run_test

    test = "test_concat_3d_axis_1"
    if not (node_dir() / test).exists():
        pytest.skip(f"{test} is not in this onnx wheel")
    rec = run_test(test, ["mobile"], tmp_path, timeout=300)["targets"]["mobile"]
    assert rec["outcome"] == "passed" and rec["spec"]["allclose"], rec


@pytest.mark.parametrize("test,label", [("test_det_2d", "Det (lowered to TensorFlow's MatrixDeterminant"),
                                        ("test_basic_deform_conv_with_padding", "DeformConv (a deformable convolution"),
                                        ("test_batchnorm_example_training_mode", "BatchNormalization (its running mean"),
                                        ("test_dft_opset19", "DFT (a DFT")])
def test_mobile_rules_from_the_full_conformance_run(test, label):
    """Rows the full mobile run found ("inspect said yes, build failed" or a check-caught conversion), now refused
    by inspect with the converter's reason; the same models' plain variants are not (batchnorm_example)."""
    from bench.bench_conformance import node_dir

    if not (node_dir() / test).exists():
        pytest.skip(f"{test} is not in this onnx wheel")
    assert any(lbl.startswith(label) for lbl, _ in _refused("tflite", str(node_dir() / test / "model.onnx")))
    assert _refused("tflite", str(node_dir() / "test_batchnorm_example" / "model.onnx")) == []


def test_mobile_deform_conv_refused_only_with_run_time_offsets(tmp_path):
    """DeformConv with its offsets a graph input (a real one predicts them with a Conv) fails inside onnx2tf; with
    offsets and weights initializers (the initializers form of the node tests) all four converted and matched the
    spec: only the former is refused."""
    from bench.bench_conformance import as_initializers, node_dir

    test = "test_basic_deform_conv_with_padding"
    if not (node_dir() / test).exists():
        pytest.skip(f"{test} is not in this onnx wheel")
    assert any(lbl.startswith("DeformConv") for lbl, _ in _refused("tflite", str(node_dir() / test / "model.onnx")))
    const = as_initializers(test, tmp_path)
    assert not any(lbl.startswith("DeformConv") for lbl, _ in _refused("tflite", str(const)))


def test_mobile_refuses_a_conv_with_both_dilation_and_strides():
    """TensorFlow's convolution takes a dilation rate or strides, not both: onnx2tf failed on Conv2d_dilated
    (dilation 2, stride 2) of onnx's pytorch-converted tests; dilation alone (Conv1d_dilated) converts."""
    from bench.bench_conformance import data_dir

    conv = data_dir() / "pytorch-converted"
    if not (conv / "test_Conv2d_dilated").exists():
        pytest.skip("onnx's pytorch-converted tests are not in this wheel")
    labels = [lbl for lbl, _ in _refused("tflite", str(conv / "test_Conv2d_dilated" / "model.onnx"))]
    assert any("dilations > 1 with strides > 1" in lbl for lbl in labels), labels
    assert _refused("tflite", str(conv / "test_Conv1d_dilated" / "model.onnx")) == []


def test_mobile_says_probably_not_to_onnx_sequences():
    """onnx2tf holds ONNX sequences as ragged/sparse tensors: sequence_model4/5 failed inside it, sequence_model6
    needed a Flex op; inspect says 'probably not' with that reason."""
    from bench.bench_conformance import data_dir
    from edgeopt.model import inspect
    from edgeopt.targets.registry import get_backend

    simple = data_dir() / "simple"
    if not (simple / "test_sequence_model4").exists():
        pytest.skip("onnx's simple model tests are not in this wheel")
    for t in ("test_sequence_model4", "test_sequence_model6"):
        probable = get_backend("tflite").probable_refusals(inspect(str(simple / t / "model.onnx")), {})
        assert probable and all("an ONNX sequence" in p["why"] for p in probable), probable


@pytest.mark.parametrize("suite,test", [("pytorch-converted", "test_GLU"), ("pytorch-operator", "test_operator_chunk"),
                                        ("pytorch-converted", "test_MaxPool1d_stride_padding_dilation")])
def test_mobile_rules_narrowed_by_the_pytorch_suite(suite, test):
    """Rules written from node tests at opset 13/18 (Split's sizes an input) and 2-D pools: torch's opset-6 GLU
    (equal parts) and chunk (uneven, sizes an attribute) and a dilated 1-D MaxPool converted and matched the
    spec, so inspect no longer refuses or doubts them."""
    from bench.bench_conformance import data_dir
    from edgeopt.model import inspect
    from edgeopt.targets.registry import get_backend

    path = data_dir() / suite / test / "model.onnx"
    if not path.exists():
        pytest.skip(f"{test} is not in this onnx wheel")
    info = inspect(str(path))
    assert _refused("tflite", str(path)) == [] and get_backend("tflite").probable_refusals(info, {}) == []


def test_mobile_doubts_a_transpose_past_six_dimensions_only_where_axes_cannot_merge(tmp_path):
    """TFLite's TRANSPOSE takes at most 6 dimensions. onnx_fixes.high_rank_transposes merges axes that move
    together (swin3d_t's 8-D window partition becomes 6-D and converts), so inspect doubts only a permutation that
    stays above 6 after merging."""
    from edgeopt.model import inspect
    from edgeopt.targets.registry import get_backend

    def model(perm: list[int]) -> str:
        dims = [2] * 8
        g = helper.make_graph([helper.make_node("Transpose", ["x"], ["y"], name="windows", perm=perm)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
        p = tmp_path / f"t{len(list(tmp_path.iterdir()))}.onnx"
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(p))
        return str(p)

    tfl = get_backend("tflite")
    doubt = tfl.probable_refusals(inspect(model([7, 6, 5, 4, 3, 2, 1, 0])), {})
    assert [p["node"] for p in doubt] == ["windows"] and "8 dimensions (8 after merging)" in doubt[0]["why"], doubt
    assert tfl.probable_refusals(inspect(model([0, 1, 3, 5, 2, 4, 6, 7])), {}) == []  # merges to 6
    assert get_backend("openvino").probable_refusals(inspect(model([7, 6, 5, 4, 3, 2, 1, 0])), {}) == []


def test_attention_softcap_with_a_mask_is_doubted_everywhere_as_onnx_moved_the_mask(tmp_path):
    """onnx 1.23 caps Attention's scores before adding attn_mask; ONNX Runtime 1.23 (every build's FP32 reference)
    and onnx 1.19 add it first: a -inf mask becomes -softcap and masked positions get weight.  With softcap and a
    mask inspect doubts it on every backend; softcap alone or a mask alone is no doubt."""
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    from edgeopt.model import inspect
    from edgeopt.targets.registry import get_backend

    def model(name: str, softcap: float, mask: bool) -> str:
        ins = ["Q", "K", "V"] + (["M"] if mask else [])
        node = helper.make_node("Attention", ins, ["Y"], name="attn", **({"softcap": softcap} if softcap else {}))
        shapes = [("Q", [1, 1, 4, 8]), ("K", [1, 1, 6, 8]), ("V", [1, 1, 6, 8])] + ([("M", [4, 6])] if mask else [])
        return _one_node(tmp_path / name, node, shapes, [("Y", TensorProto.FLOAT, [1, 1, 4, 8])], opset=23)

    both = model("both.onnx", 0.5, True)
    rng = np.random.default_rng(0)
    feed = {k: rng.random(s).astype(np.float32) for k, s in (("Q", (1, 1, 4, 8)), ("K", (1, 1, 6, 8)),
                                                                ("V", (1, 1, 6, 8)))}
    feed["M"] = np.where(np.tril(np.ones((4, 6))) > 0, 0, -np.inf).astype(np.float32)
    got = ort.InferenceSession(both, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_allclose(got, ReferenceEvaluator(both).run(None, feed)[0], rtol=1e-5)  # the old order...
    s = feed["Q"] @ feed["K"].transpose(0, 1, 3, 2) / np.sqrt(8)
    s = 0.5 * np.tanh(s / 0.5) + feed["M"]  # ...and the new one: cap, then mask
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ feed["V"]
    assert np.abs(got - want).max() > 0.01  # the fact the doubt stands on
    info = inspect(both)
    for backend in ("onnxruntime", "openvino", "tensorrt", "tflite", "coreml"):
        be = get_backend(backend)
        if "attn" in {n for _, n in be.unsupported_nodes(info, {})}:
            continue  # Core ML's translator has no Attention: a refusal already
        doubt = be.probable_refusals(info, {})
        assert any(d["node"] == "attn" and "softcap with an attn_mask" in d["why"] for d in doubt), (backend, doubt)
    for name, cap, mask in (("cap.onnx", 0.5, False), ("mask.onnx", 0.0, True)):
        info = inspect(model(name, cap, mask))
        assert not any("softcap with an attn_mask" in d["why"] for d in
                       get_backend("onnxruntime").probable_refusals(info, {})), name


def test_a_build_with_softcap_and_a_mask_warns_that_its_reference_may_be_off_the_spec(tmp_path):
    """The cpu artifact of an Attention with softcap and an attn_mask matches ONNX Runtime's reference and passes its
    check, and both follow the order onnx 1.23 revised: the build says so in its warnings (a softcap alone does
    not warn; Resize align_corners, which spec_check settles, does not either)."""
    from edgeopt.pipeline import build
    from edgeopt.targets.support_rules import reference_doubts

    def model(name: str, mask: bool) -> str:
        ins = ["Q", "K", "V"] + (["M"] if mask else [])
        shapes = [("Q", [1, 1, 4, 8]), ("K", [1, 1, 6, 8]), ("V", [1, 1, 6, 8])] + ([("M", [4, 6])] if mask else [])
        return _one_node(tmp_path / name, helper.make_node("Attention", ins, ["Y"], name="attn", softcap=0.5),
                         shapes, [("Y", TensorProto.FLOAT, [1, 1, 4, 8])], opset=23)

    both = model("both.onnx", True)
    assert [d["node"] for d in reference_doubts(both)] == ["attn"]
    assert reference_doubts(model("cap.onnx", False)) == []
    from onnx import numpy_helper

    from edgeopt.targets.support_rules import doubts

    scales = numpy_helper.from_array(np.array([1, 1, 0.6, 0.6], np.float32), "scales")
    resize = _one_node(tmp_path / "r.onnx", helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear",
                                                             coordinate_transformation_mode="align_corners"),
                       [("x", [1, 1, 4, 4])], [("y", TensorProto.FLOAT, [1, 1, 2, 2])], inits=[scales])
    assert doubts(resize, "onnxruntime") and reference_doubts(resize) == []  # spec_check settles it in the build
    rep = build(both, "cpu", ["fp32"], out=tmp_path / "out", jobs=1)
    r = rep.results[0]
    assert r.status == "built", (r.status, r.error)
    assert any("may be off the ONNX spec at node 'attn'" in w and "softcap with an attn_mask" in w
               for w in rep.warnings), rep.warnings
