"""The agent's precision-aware comparison: CTC decoding agreement beside per-position top-1."""

from __future__ import annotations

import numpy as np

from edgeopt_agent.compare import compare_outputs, ctc_metrics, tensor_metrics


def _ctc(steps: list[list[int]], classes: int = 6) -> np.ndarray:
    """[N, 1, T, C] probabilities with the given argmax per position (0 = blank)."""
    probs = np.full((len(steps), 1, len(steps[0]), classes), 0.02, np.float32)
    for n, seq in enumerate(steps):
        probs[n, 0, np.arange(len(seq)), seq] = 1 - 0.02 * (classes - 1)
    return probs


def test_one_flipped_space_changes_the_decoding_at_high_top1():
    # "ab cd" vs "abcd": one position of 12 flips from space (5) to blank; top-1 stays 92%.
    ref = _ctc([[1, 0, 2, 0, 5, 0, 3, 3, 0, 4, 0, 0], [1, 1, 0, 2, 0, 0, 3, 0, 0, 4, 0, 0]])
    out = ref.copy()
    out[0, 0, 4] = out[0, 0, 3]
    m = tensor_metrics(out, ref)
    assert m["top1"] > 0.95 and m["seq_match"] == 0.5 and m["ctc_blank"] == 0
    res = compare_outputs({"y": out}, {"y": ref}, "int8", {"seq_match_min": 1.0})
    assert not res["passed"] and any("CTC decoding equal on 50.0%" in r for r in res["outputs"]["y"]["reasons"])
    loose = {"rel_l2_max": 1.0, "cosine_min": 0.5}
    assert compare_outputs({"y": out}, {"y": ref}, "int8", loose)["passed"]  # opt-in: not judged by default
    assert not compare_outputs({"y": out}, {"y": ref}, "int8", {**loose, "seq_match_min": 1.0})["passed"]


def test_repeats_split_by_blank_and_blank_runs_decode_alike():
    ref = _ctc([[1, 1, 0, 2, 0, 0, 3, 0]])
    out = _ctc([[1, 0, 0, 2, 2, 0, 3, 3]])
    assert ctc_metrics(out, ref)["seq_match"] == 1.0


def test_outputs_without_a_dominant_blank_are_not_ctc():
    ref = _ctc([[1, 2, 3, 4, 5, 0] * 2])  # every class 1/6 of the positions: no blank to decode with
    assert ctc_metrics(ref, ref) == {}
    assert ctc_metrics(np.zeros((2, 10)), np.zeros((2, 10))) == {}
