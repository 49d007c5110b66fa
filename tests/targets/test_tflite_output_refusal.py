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
