"""A stacked .npy whose leading axis is the sample axis, for an input with a batch of 1 (issue 26, 5),
and the build's data source naming a .npy file ``npy``."""

from __future__ import annotations

import numpy as np
import pytest

from edgeopt.calib import describe, load_data
from edgeopt.errors import CalibrationError

NHWC = [{"name": "input_1", "shape": [1, 224, 224, 3], "dtype": "float32"}]


def test_stacked_npy_without_the_batch_axis_is_one_sample_per_row(tmp_path):
    x = np.random.default_rng(0).random((12, 224, 224, 3), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    ds = load_data(str(tmp_path / "x.npy"), NHWC, None, n_calib=8, n_val=4)
    assert len(ds.calibration) == 8 and len(ds.validation) == 4
    assert ds.calibration[0]["input_1"].shape == (1, 224, 224, 3)
    sp = ds.source["split"]  # the seeded shuffle by default; the rows it took are recorded
    np.testing.assert_array_equal(ds.calibration[3]["input_1"][0], x[sp["calibration"][3]])
    np.testing.assert_array_equal(ds.validation[-1]["input_1"][0], x[sp["validation"][-1]])
    assert ds.source["kind"] == "npy"
    assert describe(ds.source).startswith("data: npy arrays from")


@pytest.mark.parametrize("shape", [(5, 1, 224, 224, 3), (1, 224, 224, 3)])
def test_the_other_accepted_layouts_still_load(tmp_path, shape):
    np.save(tmp_path / "x.npy", np.zeros(shape, np.float32))
    ds = load_data(str(tmp_path / "x.npy"), NHWC, None, n_calib=4, n_val=1)
    assert ds.calibration[0]["input_1"].shape == (1, 224, 224, 3)


def test_an_npz_is_still_called_npz_and_a_wrong_shape_is_refused_naming_both_forms(tmp_path):
    np.savez(tmp_path / "x.npz", input_1=np.zeros((3, 224, 224, 3), np.float32))
    assert load_data(str(tmp_path / "x.npz"), NHWC, None, n_calib=2, n_val=1).source["kind"] == "npz"
    np.save(tmp_path / "bad.npy", np.zeros((3, 224, 224, 1), np.float32))
    with pytest.raises(CalibrationError) as e:
        load_data(str(tmp_path / "bad.npy"), NHWC, None)
    assert "[N, 224, 224, 3]" in str(e.value) and "[N, 1, 224, 224, 3]" in str(e.value)


def test_a_folder_of_npy_files_is_npy(tmp_path):
    for i in range(3):
        np.save(tmp_path / f"{i}.npy", np.zeros((2, 224, 224, 3), np.float32))
    assert load_data(str(tmp_path), NHWC, None, n_calib=4, n_val=2).source["kind"] == "npy"
