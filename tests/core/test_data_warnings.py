"""The data range warning speaks of images only where the input looks like one."""

from __future__ import annotations

import numpy as np

from edgeopt.calib import _check_range


def _warnings(shape: list[int], values: np.ndarray) -> list[str]:
    source = {"kind": "npz"}
    _check_range([{"x": values}], [{"name": "x", "shape": shape, "dtype": "float32"}], source)
    return source.get("data_warnings", [])


def test_unnormalised_image_input_is_warned_about():
    got = _warnings([1, 3, 8, 8], np.full((1, 3, 8, 8), 200.0, np.float32))
    assert len(got) == 1 and "image model usually takes normalised values" in got[0]
    assert _warnings([1, 8, 8, 3], np.full((1, 8, 8, 3), 200.0, np.float32))  # NHWC too


def test_features_outside_an_image_range_are_not_called_an_image():
    """openwakeword's verifier takes [1, 16, 96] speech embeddings spanning -53..70: no image warning."""
    assert _warnings([1, 16, 96], np.linspace(-53, 70, 16 * 96, dtype=np.float32).reshape(1, 16, 96)) == []
    assert _warnings([1, 3, 8, 8], np.full((1, 3, 8, 8), 0.5, np.float32)) == []  # normalised: nothing to say


def test_mean_subtracted_caffe_style_input_is_not_called_unpreprocessed():
    """BGR minus the VGG mean spans about -123..151: the preprocessing was applied (issue 39, 9)."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (1, 3, 8, 8)).astype(np.float32)
    caffe = pixels - np.array([103.9, 116.8, 123.7], np.float32)[None, :, None, None]
    assert caffe.min() < -20 and caffe.max() > 20
    assert _warnings([1, 3, 8, 8], caffe) == []
    assert _warnings([1, 3, 8, 8], pixels)  # the raw pixels themselves still are
