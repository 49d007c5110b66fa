"""cpu and intel-cpu build a variable form of real fixture models with a variable axis and check it at every
validation sample's own length against FP32 run unpadded (issue 42); a model whose outputs change with the
padding (the PP-OCRv4 recogniser: self-attention over the width, no mask) has its static form refused and
its dynamic form built; the agent benches the real length mix per bucket."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import edgeopt
from edgeopt import calib as calibmod
from edgeopt.errors import CalibrationError
from edgeopt_agent.bench import BenchError, run_bench
from tests.conftest import fixture
from tests.shapes import data


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One build per model: the OCR recogniser (width 32..320) and the melspectrogram (0.25-2 s of real
    speech), on cpu and intel-cpu at fp32; and the melspectrogram in buckets on cpu."""
    d = tmp_path_factory.mktemp("varlen")
    rec = data.ocr_rec(d / "rec.npz", limit=20)
    mel = data.melspec(d / "mel.npz", count=24)
    out = {}
    out["rec"] = edgeopt.build(fixture("ocr-rec"), "cpu,intel-cpu", precision="fp32", shape="x:1x3x48x32..320",
                               calib=str(rec), calib_count=8, val_count=12, dist=str(d / "dist"))
    out["mel"] = edgeopt.build(fixture("oww-melspec"), "cpu,intel-cpu", precision="fp32",
                               shape="input:1x4000..32000", calib=str(mel), calib_count=8, val_count=16,
                               dist=str(d / "dist"))
    # the dynamic form asked for: auto keeps the fastest passing form, and on a loaded machine the static one
    # (every request padded to the top) can measure faster -- a choice by timing, not what this build tests
    out["mel-buckets"] = edgeopt.build(fixture("oww-melspec"), "cpu", precision="fp32",
                                       shape="input:1x8000|16000|24000|32000", calib=str(mel), calib_count=8,
                                       val_count=16, dist=str(d / "dist-buckets"), option=["shape_form=dynamic"])
    out["mel-auto"] = edgeopt.build(fixture("oww-melspec"), "cpu", precision="fp32",
                                    shape="input:1x4000..32000|auto@15%", calib=str(mel), calib_count=8,
                                    val_count=16, dist=str(d / "dist-auto"), option=["shape_form=dynamic"])
    return out


def _manifest(report, target):
    r = next(t for t in report.results if t.target == target)
    assert r.status == "built", (r.status, r.error)
    return r, json.loads((Path(r.bundle) / "manifest.json").read_text())


@pytest.mark.parametrize("target", ["cpu", "intel-cpu"])
def test_variable_form_matches_fp32_at_each_own_length(built, target):
    for model in ("mel", "rec"):
        _, m = _manifest(built[model], target)
        hc = m["host_check"]
        assert hc["passed"], hc
        tried = {t["form"]: t for t in m["shape_form"]["tried"]}
        assert tried["dynamic"]["passed"] is True
        # rec: the static form is wrong, so dynamic whatever the timings; mel: the faster at steady state
        # (dynamic on a quiet machine, but a timing must not fail a test under load)
        assert m["shape_form"]["form"] == "dynamic" or model == "mel"
        lengths = {row["length"] for row in hc["per_length"]}
        assert len(lengths) >= 3, lengths
        if m["shape_form"]["form"] == "dynamic":
            assert all(row["length"] == row["ran_at"] for row in hc["per_length"])  # nothing padded
        assert min(row["cosine"] for row in hc["per_length"]) > 0.9999
        assert m["validation"]["varlen"]["own_lengths"] is True
        var = m["io"]["inputs"][0]["variable"]
        assert var == ([{"axis": 3, "range": [32, 320]}] if model == "rec" else [{"axis": 1, "range": [4000, 32000]}])
    if target == "intel-cpu":
        assert "?" not in json.dumps(m["options"]["bounded_dims"]) and "32..320" in json.dumps(
            m["options"]["bounded_dims"])


def test_padding_changes_the_answers_static_refused_dynamic_built(built):
    for target in ("cpu", "intel-cpu"):
        _, m = _manifest(built["rec"], target)
        tried = {t["form"]: t for t in m["shape_form"]["tried"]}
        assert tried["static"]["passed"] is False and tried["dynamic"]["passed"] is True
        assert "padding changes the answers" in m["shape_form"]["reason"]
        assert any("static form" in w and "padding changes the answers" in w for w in m["warnings"])
    # the melspectrogram is a sliding window: padding adds frames only, the static form passes too
    _, m = _manifest(built["mel"], "cpu")
    tried = {t["form"]: t for t in m["shape_form"]["tried"]}
    assert tried["static"]["passed"] is True and tried["dynamic"]["passed"] is True


def test_buckets_pad_to_their_bucket(built):
    _, m = _manifest(built["mel-buckets"], "cpu")
    assert m["host_check"]["passed"]
    ran = {row["ran_at"] for row in m["host_check"]["per_length"]}
    assert ran <= {f"input[1]={b}" for b in (8000, 16000, 24000, 32000)} and len(ran) >= 2


def test_agent_bench_over_the_real_mix_per_bucket(built):
    r, m = _manifest(built["mel"], "cpu")
    opts = {"duration_s": 0.5, "min_iters": 20, "warmup": 2, "seed": 3}
    a, b = run_bench(r.bundle, opts), run_bench(r.bundle, opts)
    v = a["varlen"]
    assert a["accuracy"]["passed"] and a["accuracy"]["samples"] == 16
    assert v["form"] == m["shape_form"]["form"] and len(v["buckets"]) >= 2
    assert abs(sum(x["share"] for x in v["buckets"].values()) - 1) < 1e-6
    assert all(x["p99_ms"] >= x["p50_ms"] > 0 for x in v["buckets"].values())
    assert v["weighted_mean_ms"] > 0 and "after_switch_p50_ms" in v
    assert any(x["first_at_new_shape_ms"] for x in v["buckets"].values())
    assert list(v["buckets"]) == list(b["varlen"]["buckets"])  # the seeded mix is the same mix
    assert (v["padding_waste"] == 0.0) if v["form"] == "dynamic" else (v["padding_waste"] > 0.5)
    with pytest.raises(BenchError, match="outside the built bounds 4000..32000"):
        run_bench(r.bundle, {**opts, "lengths": [2000]})
    fixed = run_bench(r.bundle, {**opts, "lengths": [8000, 32000]})
    if m["shape_form"]["form"] == "dynamic":
        assert set(fixed["varlen"]["buckets"]) == {"input[1]<=11000", "input[1]<=32000"}


def test_padded_arrays_with_lengths_or_mask_and_one_file_per_sample(tmp_path):
    inputs = [{"name": "ids", "shape": [1, 8], "dtype": "int64", "variable": [{"axis": 1, "range": [1, 8]}]},
              {"name": "mask", "shape": [1, 8], "dtype": "int64", "variable": [{"axis": 1, "range": [1, 8]}]}]
    ids = np.arange(1, 25).reshape(3, 8)
    mask = np.array([[1] * 3 + [0] * 5, [1] * 8, [1] * 5 + [0] * 3])
    np.savez(tmp_path / "padded.npz", ids=ids, mask=mask)
    ds = calibmod.load_data(str(tmp_path / "padded.npz"), inputs, calibmod.Preprocess(), 1, 2)
    shapes = sorted(s["ids"][1] for s in ds.source["validation_shapes"])
    assert all(f["ids"].shape == (1, 8) for f in ds.validation)  # padded to the top for the static data
    assert set(shapes) <= {3, 8, 5}
    np.savez(tmp_path / "lengths.npz", ids=ids, mask=mask, lengths=np.array([3, 8, 5]))
    ds = calibmod.load_data(str(tmp_path / "lengths.npz"), inputs, calibmod.Preprocess(), 3, 3)
    assert sorted(s["ids"][1] for s in ds.source["validation_shapes"]) == [3, 5, 8]
    folder = tmp_path / "per-sample"
    folder.mkdir()
    for i, n in enumerate((2, 6, 4)):
        np.savez(folder / f"s{i}.npz", ids=np.ones((1, n), np.int64), mask=np.ones((1, n), np.int64))
    ds = calibmod.load_data(str(folder), inputs, calibmod.Preprocess(), 3, 3)
    assert sorted(s["ids"][1] for s in ds.source["validation_shapes"]) == [2, 4, 6]
    np.savez(folder / "s9.npz", ids=np.ones((1, 12), np.int64), mask=np.ones((1, 12), np.int64))
    with pytest.raises(CalibrationError, match="past the --shape bounds"):
        calibmod.load_data(str(folder), inputs, calibmod.Preprocess(), 3, 3)


def test_bench_lengths_outside_the_built_bounds_or_on_a_static_bundle_exit_2(built, tmp_path):
    from edgeopt.errors import UsageError

    dist = Path(next(t for t in built["mel"].results if t.target == "cpu").bundle).parents[1]
    with pytest.raises(UsageError, match="outside the built bounds") as exc:
        edgeopt.bench(dist=str(dist), lengths=[2000], db=str(tmp_path / "r.db"), targets="cpu")
    assert exc.value.exit_code == 2
    with pytest.raises(UsageError, match="--lengths takes positive"):
        edgeopt.bench(dist=str(dist), lengths="0,8", db=str(tmp_path / "r.db"))
    static = edgeopt.build(fixture("oww-melspec"), "cpu", precision="fp32", shape="input:1x16000",
                           dist=str(tmp_path / "static"))
    with pytest.raises(UsageError, match="has no variable axis"):
        edgeopt.bench(dist=str(tmp_path / "static"), lengths=[16000], db=str(tmp_path / "r.db"))
    assert static.results[0].status == "built"


def test_tensorrt_records_one_profile_per_bucket(built, tmp_path):
    pytest.importorskip("onnxsim")
    mel = data.melspec(tmp_path / "mel.npz", count=12)
    rep = edgeopt.build(fixture("oww-melspec"), "jetson-orin", precision="fp32",
                        shape="input:1x8000|16000|32000", calib=str(mel), calib_count=4, val_count=8,
                        dist=str(tmp_path / "trt"))
    r, m = _manifest(rep, "jetson-orin")
    spec = json.loads((Path(r.bundle) / "trt_build.json").read_text())
    assert [p["input"]["opt"] for p in spec["profiles"]] == [[1, 8000], [1, 16000], [1, 32000]]
    assert all(p["input"]["min"] == p["input"]["opt"] == p["input"]["max"] for p in spec["profiles"])
    assert m["shape_form"]["form"] == "dynamic"


def test_bench_and_report_per_bucket_on_the_local_device(built, tmp_path):
    from edgeopt.reporting import render

    dist = Path(next(t for t in built["mel"].results if t.target == "cpu").bundle).parents[1]
    res = edgeopt.bench(dist=str(dist), targets="cpu", duration=0.5, min_iters=20, warmup=2,
                        db=str(tmp_path / "r.db"))
    assert len(res.records) == 2  # the recogniser and the melspectrogram, each over its own mix
    assert all(rec.raw["bench"]["varlen"]["buckets"] for rec in res.records)
    text = render(res.records, "table")
    assert "per bucket" in text and "mix-weighted p50" in text
    assert json.loads(render(res.records, "json"))["per_bucket"]


def test_static_form_only_is_refused_with_the_padding_reason(built, tmp_path):
    calib = next(p for p in Path(built["rec"].out).parent.glob("rec.npz"))
    rep = edgeopt.build(fixture("ocr-rec"), "cpu", precision="fp32", shape="x:1x3x48x32..320", calib=str(calib),
                        calib_count=8, val_count=12, dist=str(tmp_path / "d"), option=["shape_form=static"],
                        raise_on_failure=False)
    r = rep.results[0]
    assert r.status != "built" and r.refused
    assert "no form matches FP32 at each sample's own length" in r.error
    assert "static (padded to the top): padding changes the answers" in r.error


def test_random_data_gets_random_lengths(tmp_path):
    from edgeopt.calib import Preprocess, load_data

    inputs = [{"name": "input", "shape": [1, 32000], "dtype": "float32",
               "variable": [{"axis": 1, "range": [4000, 32000]}]}]
    ds = load_data(None, inputs, Preprocess(), 2, 8)
    lengths = [s["input"][1] for s in ds.source["validation_shapes"]]
    assert len(set(lengths)) >= 3 and all(4000 <= n <= 32000 for n in lengths)
    assert all(f["input"].shape == (1, 32000) for f in ds.validation)


def test_pairbench_over_the_real_mix_per_bucket(built):
    from edgeopt_agent.paired import run_pair

    r, _ = _manifest(built["mel"], "cpu")
    res = run_pair([r.bundle, r.bundle], {"rounds": 4, "block_iters": 8, "warmup": 2, "budget_s": 20})
    assert all(a["accuracy"]["passed"] and a["accuracy"]["samples"] == 16 for a in res["arms"])
    per = res["per_bucket"]
    assert len(per) >= 2 and all(v["A_p50_ms"] > 0 and v["B_p50_ms"] > 0 for v in per.values())
    assert all(k.startswith("input[1]<=") for k in per)


def test_gate_judges_each_bucket_by_the_paired_rule(built):
    from edgeopt.hil.varlen_gate import bucket_verdicts
    from edgeopt.policy.gatefile import GateSpec
    from edgeopt.policy.stats import PairedRun
    from edgeopt_agent.paired import run_pair

    r, _ = _manifest(built["mel"], "cpu")
    res = run_pair([r.bundle, r.bundle], {"rounds": 6, "block_iters": 16, "warmup": 2, "budget_s": 30})
    assert all(len(b["keys"]) == len(b["ms"]) for b in res["blocks"])
    verdicts = bucket_verdicts(PairedRun(device="local", blocks=res["blocks"], arms=res["arms"]), GateSpec())
    assert verdicts and all(v.metric.startswith("p50 [input[1]<=") for v in verdicts)
    # A/A under a loaded machine can land anywhere the paired rule allows: only the vocabulary is asserted
    assert {v.verdict for v in verdicts} <= {"pass", "inconclusive", "improved", "regressed"}
    # a fixed-shape pair has no buckets
    assert bucket_verdicts(PairedRun(device="local", blocks=[{"arm": "A", "ms": [1.0]}, {"arm": "B", "ms": [1.0]}]),
                           GateSpec()) == []


def test_auto_buckets_from_the_data_lengths_cap_the_padding(built):
    """``lo..hi|auto@15%``: bucket edges from the --calib lengths' quantiles, the fewest whose padding waste over
    the mix is at most 15%; the bundle is then built in those buckets (each sample padded to its bucket), and the
    agent's bench reports the waste per bucket."""
    from edgeopt import shapes

    r, m = _manifest(built["mel-auto"], "cpu")
    (var,) = m["io"]["inputs"][0]["variable"]
    edges, auto = var["buckets"], var["auto"]
    assert edges[-1] == 32000 and len(edges) >= 3 and auto["from"] == "auto" and auto["lengths"] == 24
    own = data.lengths(_mel_path(built), "input", 1)
    waste, _ = shapes.padding_waste(own, edges)
    assert waste == auto["padding_waste"] <= 0.15 and auto["met_cap"]
    assert shapes.padding_waste(own, [32000])[0] > 0.9  # one bucket at the top: nearly twice the work
    ran = {row["ran_at"] for row in m["host_check"]["per_length"]}
    assert ran <= {f"input[1]={b}" for b in edges} and len(ran) >= 2
    v = run_bench(r.bundle, {"duration_s": 0.3, "min_iters": 16, "warmup": 1, "seed": 1})["varlen"]
    assert all(x["padding_waste"] is not None and x["padding_waste"] <= 1.0 for x in v["buckets"].values())
    assert v["padding_waste"] <= 0.5


def _mel_path(built):
    return next(Path(built["rec"].out).parent.glob("mel.npz"))


def test_apple_records_enumerated_shapes_made_by_coremltools(tmp_path):
    """No macOS here: the converter-level record only. The package is static at the top; the planned form is
    made with coremltools' own ct.TensorType(ct.EnumeratedShapes) (buckets) and recorded as it reads them."""
    pytest.importorskip("coremltools")
    rep = edgeopt.build(fixture("oww-melspec"), "apple", precision="fp32", shape="input:1x8000|16000|32000",
                        dist=str(tmp_path / "apple"), calib_count=4, val_count=8)
    _, m = _manifest(rep, "apple")
    planned = m["options"]["enumerated_shapes_planned"]
    assert planned["input[1]"] == {"EnumeratedShapes": [8000, 16000, 32000]}
    made = planned["input:input_type"]
    assert made["shapes"] == [[1, 8000], [1, 16000], [1, 32000]] and made["default"] == [1, 32000]
    assert "EnumeratedShapes" in made["coremltools"] and made["coremltools_version"]
    assert any("not built" in n and "no macOS" in n for n in m["notes"])
