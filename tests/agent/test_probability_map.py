"""A Sigmoid's map (a text detector's) is ``dense@probability``: judged against [0, 1]'s rounding floor."""

import numpy as np
import pytest

from edgeopt_agent.compare import TOLERANCES, infer_kind, judge, parse_kind, tensor_metrics


def _maps(noise: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ref = (rng.random((8, 1, 1, 96, 96)) * 2e-7).astype(np.float32)  # text-free photos: every pixel ~1e-7
    return (ref + rng.standard_normal(ref.shape).astype(np.float32) * noise).clip(0, 1), ref


def test_sigmoid_map_is_a_probability_map():
    ref = _maps(0)[1]
    assert infer_kind("sigmoid_0.tmp_0", ref, "Sigmoid") == {"kind": "dense", "range": "probability"}
    assert infer_kind("feature_map", ref, "Relu") == {"kind": "dense"}
    assert parse_kind("dense@probability") == {"kind": "dense", "range": "probability"}
    with pytest.raises(ValueError):
        parse_kind("dense@7")


def test_rounding_on_a_near_zero_map_passes_fp32_and_a_real_error_fails():
    kind = {"kind": "dense", "range": "probability"}
    out, ref = _maps(5e-8)
    plain = tensor_metrics(out, ref, {"kind": "dense"})
    assert judge(plain, TOLERANCES["fp32"])  # relative to its own tiny norm: refused (the bug)
    m = tensor_metrics(out, ref, kind)
    assert m["rel_l2_floor"] == pytest.approx(1e-3) and m["rel_l2_raw"] == plain["rel_l2"]
    assert judge(m, TOLERANCES["fp32"]) == []
    bad, ref = _maps(0)
    bad = bad.copy()
    bad[0, 0, 0, 10:20, 10:20] = 0.05  # a blob of 0.05 where FP32 says ~0: a real difference
    assert judge(tensor_metrics(bad, ref, kind), TOLERANCES["fp32"])
    assert judge(tensor_metrics(bad, ref, kind), TOLERANCES["int8"])  # rel_l2 ~16 against the floor
