"""Issue 39, 5: onnx2tf's alternative switches are retried for a wrong float file; when the first retry gives
the same wrong numbers (an already-quantized transformer: 15 minutes of equally wrong files), the chain ends."""

from __future__ import annotations

from edgeopt.targets.tflite import same_numeric_failure


def _hc(rel_l2: float, cosine: float, passed: bool = False, name: str = "y") -> dict:
    return {"passed": passed, "outputs": {name: {"passed": passed, "metrics": {"rel_l2": rel_l2, "cosine": cosine}}}}


def test_the_same_wrong_numbers_from_another_switch_are_the_same_failure():
    assert same_numeric_failure(_hc(1.55, 0.21), _hc(1.551, 0.2101))
    assert not same_numeric_failure(_hc(1.55, 0.21), _hc(0.9, 0.6))  # another switch changed the numbers: go on
    assert not same_numeric_failure(_hc(1.55, 0.21), _hc(1.55, 0.21, name="z"))  # other outputs failing
    assert not same_numeric_failure(_hc(1.55, 0.21), _hc(0.001, 1.0, passed=True))  # the retry passed
    assert not same_numeric_failure({"outputs": {}}, {"outputs": {}})
