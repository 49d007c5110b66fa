"""The Python API the scripts call: the same options as the CLI, typed results, EdgeoptError raised
(never sys.exit), and the same JSON shape as the CLI's --json."""

from __future__ import annotations

import json

import pytest

import edgeopt
from edgeopt.errors import EdgeoptError, UsageError
from edgeopt.fixtures import path as fixture
from tests.hil.conftest import same_speed_gate


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api")
    report = edgeopt.build(fixture("ocr-cls"), "cpu,intel-cpu", precision="cpu=fp32,intel-cpu=fp32",
                           shapes={"x": [1, 3, 48, 192]}, calib=str(fixture("images")), preprocess="preset=pm1",
                           dist=tmp / "dist", calib_count=8, val_count=4)
    return tmp, report


def test_build_returns_the_report_the_cli_prints(built):
    tmp, report = built
    assert report.ok and [(r.target, r.precision) for r in report.results] == [("cpu", "fp32"), ("intel-cpu", "fp32")]
    assert all((tmp / "dist" / "ch_ppocr_mobile_v2.0_cls_infer" / f"{r.target}-fp32" / "manifest.json").is_file()
               for r in report.results)
    doc = json.loads(json.dumps(report.as_dict()))  # what --json prints
    check = doc["results"][0]["check"]  # data, not a formatted string
    assert check["passed"] is True and check["samples"] >= 1 and check["data"] in ("random", "images", "npz")
    out = next(iter(check["outputs"].values()))
    assert out["kind"] == "classification" and 0.99 < out["metrics"]["cosine"] <= 1.0 + 1e-6


def test_a_precision_one_target_lacks_is_skipped_and_said(built, tmp_path):
    report = edgeopt.build(fixture("ocr-cls"), "cpu,intel-cpu", precision="fp16", shapes="x:1x3x48x192",
                           dist=tmp_path / "d", calib=str(fixture("images")), preprocess="preset=pm1",
                           calib_count=4, val_count=4)
    assert [(r.target, r.precision) for r in report.results] == [("intel-cpu", "fp16")]
    assert report.skipped == [{"target": "cpu", "precision": "fp16", "reason": "cpu offers fp32, int8"}]


def test_bench_and_report_through_the_api(built):
    tmp, _ = built
    db = str(tmp / "r.db")
    fleet = edgeopt.bench(dist=tmp / "dist", devices="local", duration=0.3, min_iters=5, warmup="0.1s", db=db)
    assert fleet.ok and {r.bundle["target"] for r in fleet.records} == {"cpu", "intel-cpu"}
    rows = json.loads(edgeopt.report(db=db, format="json", targets="intel-cpu"))
    assert rows["schema"] == "edgeopt/v1" and [r["target"] for r in rows["rows"]] == ["intel-cpu"]
    assert len(edgeopt.query(db=db)) == 2


def test_errors_are_raised_not_exited(built, tmp_path):
    tmp, _ = built
    with pytest.raises(UsageError, match="did you mean intel-cpu"):
        edgeopt.build(fixture("ocr-cls"), "intl-cpu", shapes="x:1x3x48x192", dist=tmp_path)
    with pytest.raises(UsageError, match="static batch"):
        edgeopt.bench(dist=tmp / "dist", batch=4, db=str(tmp_path / "x.db"))
    with pytest.raises(EdgeoptError) as exc:
        edgeopt.bench(dist=tmp / "dist", devices=tmp_path / "nope.yaml")
    assert exc.value.exit_code == 2
    assert not (tmp_path / "x.db").exists()


def test_inspect_takes_shapes_and_lists_support():
    info = edgeopt.inspect(fixture("ocr-cls"), shapes="x:1x3x48x192")
    assert info["shapes"] == {"x": [1, 3, 48, 192]} and info["flops"] > 0
    assert {r["target"] for r in info["support"]} >= {"cpu", "intel-cpu", "mobile", "jetson-orin"}


def test_gate_and_rollout_through_the_api(built, tmp_path):
    """The HIL gate and the fleet rollout are functions too: same checks, typed results, errors raised."""
    tmp, _ = built
    bundle = tmp / "dist" / "ch_ppocr_mobile_v2.0_cls_infer" / "cpu-fp32"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("devices:\n" + "".join(f"  d{i}: {{transport: local, target: cpu, root: {tmp_path / f'd{i}'}}}\n"
                                            for i in range(3)))
    plan = edgeopt.rollout(bundle, fleet, waves="1,100%", dry_run=True)
    assert [len(w) for w in plan["waves"]] == [1, 2] and plan["bytes"] > 0
    assert not any((tmp_path / f"d{i}").exists() for i in range(3))  # a dry run changes nothing
    with pytest.raises(UsageError, match="--max-fail"):
        edgeopt.rollout(bundle, fleet, max_fail="lots")
    with pytest.raises(UsageError, match="--budget"):
        edgeopt.gate(bundle, bundle, fleet, budget="0s")
    res = edgeopt.gate(bundle, bundle, fleet, limit="d0", budget="3s", db=None,  # A/A: the same bundle
                       gate=str(same_speed_gate(tmp_path)))
    assert res["schema"] == "edgeopt/v1" and res["kind"] == "gate" and [d["device"] for d in res["devices"]] == ["d0"]
    assert res["verdict"] in ("pass", "inconclusive") and res["exit_code"] in (0, 6)
