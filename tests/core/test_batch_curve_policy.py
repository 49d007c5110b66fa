"""`build --batch 1,4,8` judges every batch size by the batch-1 rule (issue 37 item 3), on the real ocr-cls
classifier and real images:

* the output kind is inferred once (batch 1) and carried: a [B, 2] softmax stays `classification` at 4 and 8,
  never B "positions" that flip;
* each batch feed holds distinct samples (the batch-1 build's, the last feed filled up with repeats) and every
  count -- the host check's top-1 n, the policy's k of n and its interval, the device bench's samples, the
  gate's decisions -- is of distinct samples, not of rows;
* one precision per target across the curve: where `auto` fell back at one size, every size is built at that
  precision (the narrower bundle removed), and a curve that still mixes precisions says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgeopt.pipeline import BuildReport, TargetResult
from tests.conftest import fixture

VAL = 10  # not a multiple of 4 or 8: the last batch is filled up with repeats


@pytest.fixture(scope="module")
def curve(tmp_path_factory):
    from edgeopt import api

    dist = tmp_path_factory.mktemp("curve") / "dist"
    report = api.build(fixture("ocr-cls"), "cpu", precision="fp32", shapes="x:1x3x48x192", calib=str(fixture("images")),
                       preprocess="preset=pm1", calib_count=8, val_count=VAL, batch=[1, 4, 8], dist=dist)
    bundles = {}
    for r in report.results:
        m = json.loads((Path(r.bundle) / "manifest.json").read_text())
        bundles[m["io"]["inputs"][0]["shape"][0]] = (Path(r.bundle), m)
    assert sorted(bundles) == [1, 4, 8]
    return report, bundles


def test_the_output_kind_is_the_batch_1_kind_at_every_batch(curve):
    _, bundles = curve
    kinds = {b: m["output_kinds"] for b, (_, m) in bundles.items()}
    (name, k1), = kinds[1].items()
    assert k1["kind"] == "classification"
    for b in (4, 8):
        assert kinds[b][name]["kind"] == "classification", kinds[b]
        assert kinds[b][name].get("axis") == k1.get("axis") and kinds[b][name]["source"] == "batch 1"
        metrics = bundles[b][1]["host_check"]["outputs"][name]["metrics"]
        assert "top1" in metrics and "flip_rate" not in metrics  # read as top-1, as at batch 1


def test_batches_hold_distinct_samples_and_every_n_counts_them(curve):
    _, bundles = curve
    one = np.load(bundles[1][0] / "validation" / "inputs.npz")["in0"][:, 0]  # [10, 3, 48, 192]
    for b in (1, 4, 8):
        path, m = bundles[b]
        src = m["validation"]["source"]
        hc = m["host_check"]
        (out,) = hc["outputs"].values()
        assert hc["samples"] == VAL and out["metrics"]["top1_n"] == VAL, (b, hc["samples"], out["metrics"])
        assert hc["policy"]["n"] == VAL, hc["policy"]  # the interval stands on 10, not on 10 x B rows
        if b == 1:
            continue
        feeds = np.load(path / "validation" / "inputs.npz")["in0"]  # [S, B, 3, 48, 192]
        assert feeds.shape[:2] == (-(-VAL // b), b)
        assert src["batch"] == b and src["validation_samples"] == VAL
        assert src["validation_repeats"] == feeds.shape[0] * b - VAL
        rows = feeds.reshape(-1, *feeds.shape[2:])
        np.testing.assert_array_equal(rows[:VAL], one)  # the batch-1 build's samples, in order
        assert len({r.tobytes() for r in rows[:VAL]}) == VAL  # every counted row distinct


def test_the_device_bench_counts_distinct_samples(curve):
    from edgeopt_agent.bench import run_bench

    _, bundles = curve
    path, _ = bundles[8]
    res = run_bench(path, {"batch": 8, "duration_s": 0.05, "min_iters": 3, "warmup": 1, "energy": False})
    acc = res["accuracy"]
    (out,) = acc["outputs"].values()
    assert acc["samples"] == VAL and acc["data"]["n"] == VAL and out["metrics"]["top1_n"] == VAL, acc["summary"]
    from edgeopt.policy.accept import agreement

    a = agreement(acc)
    assert (a["k"], a["n"]) == (VAL, VAL) and a["ci_low"] < 0.75  # 10/10: 72-100%, not 80/80's 95-100%


def test_the_gate_compares_decisions_per_distinct_sample(curve):
    from edgeopt_agent.paired import run_pair

    _, bundles = curve
    path, _ = bundles[4]
    res = run_pair([str(path), str(path)], {"rounds": 1, "block_iters": 2, "warmup": 0, "budget_s": 5})
    decisions = [arm["decisions"] for arm in res["arms"]]
    assert all(d is not None and len(d) == VAL for d in decisions), [len(d or []) for d in decisions]


# --- one precision per target across the curve -------------------------------------------------------------

def _result(target, precision, batch, root, ok=True, fallback=None):
    bundle = root / (f"batch{batch}" if batch > 1 else "") / "m" / f"{target}-{precision}"
    bundle.mkdir(parents=True, exist_ok=True)
    return TargetResult(target, precision, "openvino", "built" if ok else "check-failed", bundle=str(bundle),
                        refused=not ok, error=None if ok else "decisions: 2 of 10 differ",
                        fallback_from=fallback)


def test_auto_falls_back_at_one_size_and_the_whole_curve_follows(tmp_path, monkeypatch):
    from edgeopt import api

    fell = {"precision": "int8", "error": "intel-cpu int8 refused: decisions: 2 of 10 differ"}
    reports = {1: BuildReport("m", "d", [_result("intel-cpu", "int8", 1, tmp_path)], [], 0.0),
               4: BuildReport("m", "d", [_result("intel-cpu", "fp32", 4, tmp_path, fallback=fell)], [], 0.0),
               8: BuildReport("m", "d", [_result("intel-cpu", "int8", 8, tmp_path)], [], 0.0)}
    asked = []

    def rebuild(model, targets, precision, base, dist, batch, kinds, kw):
        asked.append((batch, precision))
        return BuildReport("m", "d", [_result("intel-cpu", "fp32", batch, tmp_path)], [], 0.0)

    monkeypatch.setattr(api, "_build_one", rebuild)
    notes = api._one_precision("m.onnx", "intel-cpu", {}, tmp_path, [1, 4, 8], reports, None,
                               {"precisions": "auto"}, lambda s: None)
    assert asked == [(1, "intel-cpu=fp32"), (8, "intel-cpu=fp32")]
    assert {b: [r.precision for r in rep.results] for b, rep in reports.items()} == {1: ["fp32"], 4: ["fp32"],
                                                                                     8: ["fp32"]}
    for b in (1, 8):
        r = reports[b].results[0]
        assert r.fallback_from["curve"] and r.fallback_from["precision"] == "int8"
        assert not (tmp_path / (f"batch{b}" if b > 1 else "") / "m" / "intel-cpu-int8").exists()  # not auto's pick
    assert len(notes) == 2 and all("as at batch 4" in n for n in notes), notes


def test_a_curve_that_still_mixes_precisions_says_so(tmp_path, monkeypatch):
    from edgeopt import api

    fell = {"precision": "int8", "error": "refused"}
    reports = {1: BuildReport("m", "d", [_result("intel-cpu", "int8", 1, tmp_path)], [], 0.0),
               4: BuildReport("m", "d", [_result("intel-cpu", "fp32", 4, tmp_path, fallback=fell)], [], 0.0)}

    def crash(model, targets, precision, base, dist, batch, kinds, kw):  # fp32 could not be built at batch 1
        r = _result("intel-cpu", "fp32", batch, tmp_path)
        r.status, r.error = "failed", "converter crashed"
        return BuildReport("m", "d", [r], [], 0.0)

    monkeypatch.setattr(api, "_build_one", crash)
    notes = api._one_precision("m.onnx", "intel-cpu", {}, tmp_path, [1, 4], reports, None, {"precisions": "auto"},
                               lambda s: None)
    assert [r.precision for r in reports[1].results] == ["fp32"] and not reports[1].results[0].ok
    assert (tmp_path / "m" / "intel-cpu-int8").exists() is False
    assert any("fp32 failed here too" in n for n in notes), notes


def test_explicit_precisions_are_left_alone(tmp_path, monkeypatch):
    from edgeopt import api

    reports = {1: BuildReport("m", "d", [_result("intel-cpu", "int8", 1, tmp_path)], [], 0.0),
               4: BuildReport("m", "d", [_result("intel-cpu", "fp32", 4, tmp_path)], [], 0.0)}
    monkeypatch.setattr(api, "_build_one", lambda *a: pytest.fail("nothing to rebuild"))
    assert api._one_precision("m.onnx", "intel-cpu", {}, tmp_path, [1, 4], reports, None,
                              {"precisions": "int8,fp32"}, lambda s: None) == []
