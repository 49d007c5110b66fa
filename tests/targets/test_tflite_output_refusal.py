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


def test_an_onnx2tf_crash_retries_its_switches_then_says_what_builds_it(tmp_path):
    """silero-vad's sequence model (STFT front end + LSTM) makes onnx2tf 1.29 raise inside its own code
    ("UnboundLocalError ... 'dummy_tensor'"): every alternative switch is tried, then one line says it is
    the converter's bug and which targets build the model; no traceback, nothing left behind."""
    pytest.importorskip("onnx2tf")
    from edgeopt.fixtures import path as fixture
    from edgeopt.pipeline import build

    model = fixture("silero-vad").parent / "silero_vad_16k_sequence.onnx"
    if not model.exists():
        pytest.skip("silero-vad 6.2.3's sequence model is not installed")
    rep = build(str(model), "mobile", ["fp32"], out=tmp_path / "out", jobs=1,
                shapes={"input": [16, 576], "h": [1, 1, 128], "c": [1, 1, 128]})
    res = rep.results[0]
    assert res.status == "failed"
    assert "onnx2tf failed inside its own code" in res.error and "dummy_tensor" in res.error
    assert all(f"{alt}:" in res.error for alt in ONNX2TF_ALTERNATIVES)  # it has an LSTM: rnn_unroll too
    assert "cpu, intel-cpu, apple" in res.error and "Traceback" not in res.error
    assert not any((tmp_path / "out").rglob("*.tflite"))
