"""A TFLite output of another size than the ONNX output (onnx2tf's conversion of resemblyzer's stacked
LSTM gave [3, 256] for [1, 256]) is refused with what to try, not only what went wrong."""

from __future__ import annotations

import pytest

from edgeopt.errors import BuildFailed
from edgeopt.targets.tflite import ONNX2TF_ALTERNATIVES, match_tensors


def test_wrong_output_size_refusal_names_the_fixes():
    with pytest.raises(BuildFailed) as err:
        match_tensors([{"name": "speaker_embedding", "shape": [1, 256]}],
                      [{"name": "output_0", "shape": [3, 256]}], "output", [])
    msg = str(err.value)
    assert "converted the graph wrongly" in msg and "cpu, intel-cpu, apple" in msg
    assert all(alt in msg for alt in ONNX2TF_ALTERNATIVES)
    with pytest.raises(BuildFailed) as err:  # an input is the user's shape: no converter blame
        match_tensors([{"name": "a", "shape": [1, 5]}], [{"name": "b", "shape": [1, 6]}], "input", [])
    assert "onnx2tf_alt" not in str(err.value)


def test_the_io_matchers_refusal_is_edgeopts_not_onnx2tfs():
    """ONNX Clip with rank-0 min/max inputs: onnx2tf declares them [-1]; the refusal names edgeopt's matcher and
    the rank-0 inputs (it was reported as "onnx2tf failed inside its own code"); an output onnx2tf gave another
    shape is named as a wrong conversion."""
    from edgeopt.targets.tflite.convert import IOMismatch, _matched

    specs = [{"name": "x", "shape": [3]}, {"name": "min", "shape": []}, {"name": "max", "shape": []}]
    art = [{"name": "x", "shape": [3]}, {"name": "min", "shape": [-1]}, {"name": "max", "shape": [-1]}]
    with pytest.raises(IOMismatch) as err:
        _matched(match_tensors, specs, art, "input", [], "SavedModel")
    assert str(err.value).startswith("edgeopt's IO matcher cannot pair the SavedModel onnx2tf made")
    assert "'min', 'max' are rank-0" in err.value.hint and "onnx2tf failed" not in str(err.value)
    with pytest.raises(IOMismatch) as err:
        _matched(match_tensors, [{"name": "y", "shape": [1, 1, 2, 4]}], [{"name": "output_0", "shape": [1, 4, 2, 1]}],
                 "output", [], "TFLite file")
    assert "converted the graph wrongly" in str(err.value)


def test_an_onnx2tf_crash_retries_its_switches_then_says_what_builds_it(tmp_path):
    """silero-vad's sequence model (STFT front end + LSTM), handed to onnx2tf 1.29 as it is
    (``onnx2tf_fixes=false``: its multi-axis Slices not split), makes it raise inside its own code
    ("UnboundLocalError ... 'dummy_tensor'"): every alternative switch is tried, then one line says it is
    the converter's bug and which targets build the model; no traceback, nothing left behind. With the
    rewrites it converts (``test_silero_vad_converts_with_the_rewrites``)."""
    pytest.importorskip("onnx2tf")
    from edgeopt.fixtures import path as fixture
    from edgeopt.pipeline import build

    model = fixture("silero-vad").parent / "silero_vad_16k_sequence.onnx"
    if not model.exists():
        pytest.skip("silero-vad 6.2.3's sequence model is not installed")
    rep = build(str(model), "mobile", ["fp32"], out=tmp_path / "out", jobs=1, options={"onnx2tf_fixes": "false"},
                shapes={"input": [16, 576], "h": [1, 1, 128], "c": [1, 1, 128]})
    res = rep.results[0]
    assert res.status == "failed"
    assert "onnx2tf failed inside its own code" in res.error and "dummy_tensor" in res.error
    assert all(f"{alt}:" in res.error for alt in ONNX2TF_ALTERNATIVES)  # it has an LSTM: rnn_unroll too
    assert "cpu, intel-cpu, apple" in res.error and "Traceback" not in res.error
    assert not any((tmp_path / "out").rglob("*.tflite"))


def test_silero_vad_converts_with_the_rewrites(tmp_path):
    """The same model with the multi-axis Slices split (``onnx_fixes``) converts; its default conversion
    then fails on the LSTM state (an ``initial_state`` incompatible with the cell) and keep_input_shape
    converts it: speech probabilities and states pass the fp32 check."""
    pytest.importorskip("onnx2tf")
    from edgeopt.fixtures import path as fixture
    from edgeopt.pipeline import build

    model = fixture("silero-vad").parent / "silero_vad_16k_sequence.onnx"
    if not model.exists():
        pytest.skip("silero-vad 6.2.3's sequence model is not installed")
    res = build(str(model), "mobile", ["fp32"], out=tmp_path / "out", jobs=1,
                shapes={"input": [16, 576], "h": [1, 1, 128], "c": [1, 1, 128]}).results[0]
    assert res.status == "built", res.error
    assert res.manifest["host_check"]["passed"]
    assert any("multi-axis Slice(s) as one Slice per axis" in n for n in res.manifest["notes"])


def _stacked_lstm(path):
    """resemblyzer's shape in small: 3 stacked LSTMs over a batch-first [1, T, F] input, the last layer's
    state picked from their concatenated states (Gather -1), then a projection. onnx2tf's default
    conversion takes F for channels and returns [3, 4] for [1, 4]; keep_input_shape converts it right."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    hid, feat, steps = 16, 8, 20
    arr = numpy_helper.from_array
    nodes = [helper.make_node("Transpose", ["mels"], ["xt"], perm=[1, 0, 2])]
    inits = [arr(np.zeros((1, 1, hid), np.float32), "zeros"), arr(np.array([1], np.int64), "ax1"),
             arr(np.array(-1, np.int64), "last"), arr(rng.normal(0, .3, (4, hid)).astype(np.float32), "wl"),
             arr(np.zeros(4, np.float32), "bl")]
    prev, states = "xt", []
    for i in range(3):
        inits += [arr(rng.normal(0, .3, (1, 4 * hid, feat if i == 0 else hid)).astype(np.float32), f"w{i}"),
                  arr(rng.normal(0, .3, (1, 4 * hid, hid)).astype(np.float32), f"r{i}"),
                  arr(rng.normal(0, .1, (1, 8 * hid)).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("LSTM", [prev, f"w{i}", f"r{i}", f"b{i}", "", "zeros", "zeros"],
                                   [f"y{i}", f"h{i}", f"c{i}"], hidden_size=hid, name=f"lstm{i}"),
                  helper.make_node("Squeeze", [f"y{i}", "ax1"], [f"ys{i}"])]
        prev = f"ys{i}"
        states.append(f"h{i}")
    nodes += [helper.make_node("Concat", states, ["hn"], axis=0), helper.make_node("Gather", ["hn", "last"], ["hl"]),
              helper.make_node("Gemm", ["hl", "wl", "bl"], ["e"], transB=1), helper.make_node("Relu", ["e"], ["emb"])]
    graph = helper.make_graph(nodes, "stacked", [helper.make_tensor_value_info("mels", TensorProto.FLOAT, [1, steps, feat])],
                              [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_int8_is_searched_on_the_switch_whose_float_conversion_is_right(tmp_path):
    """The INT8 search failing because the float conversion is already wrong (an output of another shape)
    probes the alternative switches in fp32 and searches INT8 on the first that passes, saying so."""
    pytest.importorskip("onnx2tf")
    from edgeopt.pipeline import build

    rep = build(str(_stacked_lstm(tmp_path / "stacked.onnx")), "mobile", ["int8"], out=tmp_path / "out", jobs=1)
    res = rep.results[0]
    assert res.status == "built", res.error
    notes = " ".join(res.manifest.get("notes", []))
    assert "INT8 searched on --option onnx2tf_alt=keep_input_shape, whose float32 file passes" in notes
    assert res.manifest["host_check"]["passed"] is True
    assert not list((tmp_path / "out").glob(".edgeopt-work-*")) and not list((tmp_path / "out").rglob(".fp32-probe-*"))


def test_fp16_that_loses_accuracy_is_not_blamed_on_the_conversion_and_auto_falls_back(tmp_path):
    """A failed FP16 file was reported as "the FP32 conversion itself is wrong" (PP-OCRv4 det at 640x640:
    rel_l2 0.051 in FP16, 1.6e-5 in FP32), which also kept ``auto`` from building FP32. Now the FP32 file
    of the same conversion is checked first: it passes, so FP16 is refused on accuracy (no alternative
    conversion tried) and ``auto`` builds FP32. The model: weights 1000.3 and -1000 that cancel, which
    float16 rounds to 1000.5."""
    pytest.importorskip("onnx2tf")
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgeopt.pipeline import build

    w = np.array([[1000.3, 2.0], [-1000.0, 1.0]], np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "cancel",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
                          [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), tmp_path / "m.onnx")
    x = np.random.default_rng(0).uniform(0.5, 1.5, (24, 1, 1)).astype(np.float32).repeat(2, axis=2)
    np.savez(tmp_path / "d.npz", x=x)  # x1 == x2: y0 = 0.3 x in FP32, 0.5 x with float16 weights
    report = build(str(tmp_path / "m.onnx"), "mobile", "auto", calib=str(tmp_path / "d.npz"), out=tmp_path / "out",
                   jobs=1)
    res = report.results[0]
    assert res.status == "built" and res.precision == "fp32", (res.status, res.error)
    first = res.fallback_from
    assert first["precision"] == "fp16"
    assert "FP16 itself: the FP32 file of the same onnx2tf conversion passes" in first["error"], first
    assert "conversion itself is wrong" not in first["error"]
    assert not any("onnx2tf_alt" in n for n in res.manifest["notes"])


def test_numbered_inputs_pair_by_the_names_tensorflow_gives_them():
    """torch's exports number their inputs ('0', '1'); TensorFlow's SavedModel writes them 'arg_0', 'arg_1'
    (sanitize_arg_name), so two inputs of one shape pair by name, not by a shape both fit (which was refused:
    'cannot tell which TFLite input is ONNX input 0' on six of onnx's pytorch-operator tests)."""
    from edgeopt.targets.tflite import tf_arg_name

    assert (tf_arg_name("0"), tf_arg_name("input.1"), tf_arg_name("x")) == ("arg_0", "input_1", "x")
    specs = [{"name": n, "shape": [3, 4], "dtype": "float32"} for n in ("0", "1")]
    art = [{"name": n, "shape": [3, 4], "dtype": "float32"} for n in ("arg_1", "arg_0")]
    pairs = match_tensors(specs, art, "input", [])
    assert [(s["name"], a["name"]) for s, a, _ in pairs] == [("0", "arg_0"), ("1", "arg_1")]
