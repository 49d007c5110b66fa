"""How --calib data is split into calibration and validation (issue 39, 1): a seeded shuffle by default,
stride and the old head-tail on request; the same indices everywhere, recorded, and a warning below 20
validation samples."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from edgeopt.calib import SPLITS, VAL_WARN_BELOW, load_data, parse_split, split_indices
from edgeopt.errors import UsageError

ONE = [{"name": "x", "shape": [1, 4], "dtype": "float32"}]


@pytest.mark.parametrize("how", SPLITS)
def test_the_sets_are_disjoint_sized_and_the_same_every_time(how):
    cal, val, overlap = split_indices(100, 32, 16, how, seed=3)
    assert not overlap and len(cal) == 32 and len(val) == 16
    assert not set(cal) & set(val) and all(0 <= i < 100 for i in cal + val)
    assert (cal, val) == split_indices(100, 32, 16, how, seed=3)[:2]
    assert cal == sorted(cal) and val == sorted(val)  # in the data's own order


@pytest.mark.parametrize("how", ["shuffle", "stride"])
def test_data_ordered_by_class_is_validated_on_every_class(how):
    labels = np.array([0] * 60 + [1] * 40)  # all faces, then all non-faces
    cal, val, _ = split_indices(len(labels), 32, 20, how)
    for idx in (cal, val):
        share = labels[idx].mean()
        assert 0.15 < share < 0.65, (how, share)  # both classes, roughly as in the data
    cal, val, _ = split_indices(len(labels), 32, 20, "head-tail")
    assert set(labels[val]) == {1} and set(labels[cal]) == {0}  # what the old split did


def test_another_seed_gives_another_shuffle_and_the_seed_is_parsed():
    assert split_indices(100, 32, 16, "shuffle", 0)[1] != split_indices(100, 32, 16, "shuffle", 1)[1]
    assert parse_split(None) == ("shuffle", 0) and parse_split("shuffle:7") == ("shuffle", 7)
    assert parse_split("stride", seed=5) == ("stride", 5)
    for bad in ("random", "stride:3", "shuffle:x"):
        with pytest.raises(UsageError):
            parse_split(bad)


def test_too_few_samples_overlap_and_say_so(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.arange(20, dtype=np.float32).reshape(5, 1, 4))
    ds = load_data(str(tmp_path / "d.npz"), ONE, None, n_calib=4, n_val=4)
    assert "overlap" in ds.source["note"] and len(ds.validation) == 4


def test_the_indices_are_recorded_and_match_the_rows_taken(tmp_path):
    x = np.arange(50 * 4, dtype=np.float32).reshape(50, 1, 4)
    np.savez(tmp_path / "d.npz", x=x)
    ds = load_data(str(tmp_path / "d.npz"), ONE, None, n_calib=16, n_val=24, split="stride")
    sp = ds.source["split"]
    assert sp["how"] == "stride" and sp["of"] == 50 and "seed" not in sp
    for feed, i in zip(ds.validation, sp["validation"]):
        np.testing.assert_array_equal(feed["x"], x[i])
    assert not ds.source.get("data_warnings")  # 24 validation samples: no warning
    few = load_data(str(tmp_path / "d.npz"), ONE, None, n_calib=16, n_val=8)
    assert any("only 8 validation samples" in w and f"{VAL_WARN_BELOW}" in w for w in few.source["data_warnings"])


def test_build_records_the_split_in_the_manifest_and_refuses_a_bad_one(tmp_path):
    from edgeopt.fixtures import ocr_lines
    from tests.conftest import fixture

    run = [sys.executable, "-m", "edgeopt", "build", str(fixture("ocr-cls")), "--shape", "x:1x3x48x192",
           "--targets", "cpu", "--precision", "fp32", "--calib", str(ocr_lines()), "--preprocess",
           "preset=pm1 order=bgr", "--calib-count", "16", "--val-count", "24", "--out", str(tmp_path / "dist"),
           "--json"]
    env = {**os.environ, "EDGEOPT_CACHE_DIR": str(tmp_path / "cache")}
    bad = subprocess.run(run + ["--split", "sideways"], capture_output=True, text=True, timeout=300, env=env)
    assert bad.returncode == 2 and "--split takes shuffle, stride, head-tail" in bad.stderr, bad.stderr[-2000:]
    assert "Traceback" not in bad.stderr and not (tmp_path / "dist").exists()
    ok = subprocess.run(run + ["--split", "shuffle:4"], capture_output=True, text=True, timeout=600, env=env)
    assert ok.returncode == 0, ok.stderr[-2000:]
    bundle = json.loads(ok.stdout)["results"][0]["bundle"]
    sp = json.loads(open(f"{bundle}/manifest.json").read())["validation"]["source"]["split"]
    assert sp["how"] == "shuffle" and sp["seed"] == 4 and sp["of"] == 48
    assert (sp["calibration"], sp["validation"]) == split_indices(48, 16, 24, "shuffle", 4)[:2]
    assert "(shuffle, seed 4 split)" in ok.stderr and "only 24 validation" not in ok.stderr


def test_with_40_samples_or_more_validation_takes_at_least_20(tmp_path):
    """Below 20 validation samples one differing decision is refused (the README's own 48 text lines gave
    32 + 16); with room for 20, calibration yields: 28 + 20."""
    np.savez(tmp_path / "d.npz", x=np.arange(48 * 4, dtype=np.float32).reshape(48, 1, 4))
    ds = load_data(str(tmp_path / "d.npz"), ONE, None)
    assert (len(ds.calibration), len(ds.validation)) == (28, 20) and not ds.source.get("data_warnings")
    ds = load_data(str(tmp_path / "d.npz"), ONE, None, n_calib=32, n_val=16)  # asked for: as asked, warned
    assert len(ds.validation) == 16 and ds.source["data_warnings"]
    np.savez(tmp_path / "s.npz", x=np.arange(30 * 4, dtype=np.float32).reshape(30, 1, 4))
    assert len(load_data(str(tmp_path / "s.npz"), ONE, None).validation) == 8  # no room: as before, warned
