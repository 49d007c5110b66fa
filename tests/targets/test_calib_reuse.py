"""The cpu INT8 search computes MinMax calibration once per sample and merges (issue 26, 5): the
cross-check's folds reuse the statistics instead of recalibrating on every fold."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.conftest import fixture, tiny_cnn


def _feeds(n: int) -> list[dict[str, np.ndarray]]:
    from edgeopt.calib import Preprocess, load_data

    return load_data(str(fixture("images")), [{"name": "x", "shape": [1, 3, 32, 32], "dtype": "float32"}],
                     Preprocess.parse("preset=imagenet"), n_calib=n, n_val=2).calibration


def test_merged_per_sample_ranges_equal_minmax_calibration_of_the_set(tmp_path):
    from edgeopt.targets.onnxruntime.quant import SampleRanges, calibrate

    model = tiny_cnn(tmp_path / "m.onnx")
    feeds = _feeds(10)
    whole = calibrate(model, "minmax", feeds, tmp_path)
    pooled = SampleRanges(Path(model), tmp_path)
    merged = pooled.ranges(feeds)
    assert set(merged.keys()) == set(whole.keys())
    for name in whole.keys():
        np.testing.assert_array_equal(np.asarray(merged[name].range_value), np.asarray(whole[name].range_value))
    # a subset (a fold's training samples) costs no run, and equals its own calibration
    sub = feeds[1::2]
    got = pooled.ranges(sub)
    assert pooled.runs == len(feeds)
    ref = calibrate(model, "minmax", sub, tmp_path)
    for name in ref.keys():
        np.testing.assert_array_equal(np.asarray(got[name].range_value), np.asarray(ref[name].range_value))


def test_cross_check_folds_reuse_the_calibration_statistics(tmp_path):
    """A cpu INT8 build with a small validation set cross-checks over 4 folds; MinMax ranges are computed
    once per pooled sample (calibration + validation), not once per sample and fold."""
    from edgeopt.pipeline import build

    model = tiny_cnn(tmp_path / "m.onnx")
    r = build(str(model), "cpu", ["int8"], calib=str(fixture("images")), preprocess="preset=imagenet",
              out=tmp_path / "dist", force=True, jobs=1, n_calib=12, n_val=4).results[0]
    assert r.ok, r.error
    info = r.manifest["options"]["int8"]
    assert info["cross_checks"] and "passed" in info["cross_checks"][0]
    pool = info["calibration_samples"] + info["validation_samples"]
    assert info["timings"]["minmax_sample_runs"] == pool  # was calibration + 4 x 3/4 of the pool


def test_tensorrt_sample_maxima_equal_activation_stats_and_are_computed_once(tmp_path):
    import onnx

    from edgeopt.targets.tensorrt import prep
    from edgeopt.targets.tensorrt.int8 import SampleMaxima

    model = onnx.load(str(tiny_cnn(tmp_path / "m.onnx")))
    tensors = list(prep.plan_qdq(model).activations)
    feeds = _feeds(8)
    ref = prep.activation_stats(model, tensors, feeds)
    shared = SampleMaxima(prep, model, tensors)
    got = shared.stats(feeds)
    assert got.absmax == ref.absmax
    for t in tensors:
        np.testing.assert_array_equal(got.hists[t], ref.hists[t])
    runs = shared.runs
    fold = feeds[::2]
    sub = shared.stats(fold, histograms=False)  # a fold's maxima: no run at all
    assert shared.runs == runs and sub.absmax == prep.activation_stats(model, tensors, fold, histograms=False).absmax
