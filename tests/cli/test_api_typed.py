"""The API's results are typed all the way down (issue 27 item 6): a bench record is a
``results.BenchRecord`` whose device, bundle, latency, accuracy, energy and error are dataclasses, made by
one function from the stored/agent dict; ``to_dict()`` gives that dict back, so the CLI's ``--json`` keeps
its shape. Real parts: a tiny CNN built for cpu, benched by the agent on the local device, stored in a
results database and read back."""

from __future__ import annotations

import dataclasses
import json
import typing
import warnings
from pathlib import Path

import pytest

import edgeopt
from edgeopt import decide
from edgeopt.reporting import render
from edgeopt.results import (
    AccuracyInfo,
    BenchRecord,
    BenchResult,
    BundleInfo,
    DeviceInfo,
    Latency,
    PushInfo,
    push_from_dict,
    record_from_dict,
)
from tests.conftest import tiny_cnn


@pytest.fixture(scope="module")
def benched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("typed")
    built = edgeopt.build(tiny_cnn(tmp / "tiny.onnx"), "cpu", precision="fp32", dist=tmp / "dist", calib_count=4,
                          val_count=4)
    db = str(tmp / "r.db")
    fleet = edgeopt.bench(dist=tmp / "dist", devices="local", duration=0.2, min_iters=5, warmup="0.05s", db=db)
    return tmp, db, fleet, built


def test_bench_records_are_typed_with_annotations(benched):
    _, _, fleet, _ = benched
    assert isinstance(fleet, BenchResult) and fleet.ok
    (rec,) = fleet.records
    assert isinstance(rec, BenchRecord)
    assert isinstance(rec.device, DeviceInfo) and rec.device.name == "local" and rec.device.transport == "local"
    assert rec.device.device_truth == "device" and rec.device.emulated is False and rec.device.arch
    assert isinstance(rec.bundle, BundleInfo) and (rec.bundle.model, rec.bundle.target, rec.bundle.precision,
                                                   rec.bundle.batch) == ("tiny", "cpu", "fp32", 1)
    assert isinstance(rec.latency, Latency)
    lat = rec.latency
    assert 0 < lat.min_ms <= lat.p50_ms <= lat.p90_ms <= lat.p99_ms <= lat.p999_ms <= lat.max_ms
    assert lat.throughput_ips > 0 and lat.iterations >= 5 and len(lat.samples_ms) >= 5
    assert lat.cold_start_ms == pytest.approx((lat.load_s * 1000) + lat.first_inference_ms)
    assert isinstance(rec.accuracy, AccuracyInfo) and rec.accuracy.passed is True
    assert rec.accuracy.metric == "top-1" and rec.accuracy.k == rec.accuracy.n == 4
    lo, hi = rec.accuracy.interval
    assert 0 < lo < hi == 1.0 and rec.accuracy.data == "random"
    assert rec.error is None and rec.agent
    (push,) = fleet.pushes  # what was sent on the way, typed too
    assert isinstance(push, PushInfo) and push.device == "local" and push.ok
    assert [(b.target, b.precision, b.status in ("installed", "present")) for b in push.bundles] == [("cpu", "fp32", True)]
    # every field's annotation resolves at run time (typing.get_type_hints: what IDEs and checkers read)
    for cls in (BenchResult, BenchRecord, DeviceInfo, BundleInfo, Latency, AccuracyInfo, PushInfo):
        hints = typing.get_type_hints(cls)
        assert {f.name for f in dataclasses.fields(cls)} <= set(hints), cls


def test_the_typed_record_gives_back_the_stored_json_and_query_is_typed(benched):
    _, db, fleet, _ = benched
    (rec,) = fleet.records
    (stored,) = edgeopt.query(db=db)
    assert isinstance(stored, BenchRecord)
    assert stored.to_dict() == json.loads(json.dumps(rec.to_dict()))  # what the database holds, nothing lost
    assert stored.latency == rec.latency and stored.device == rec.device and stored.bundle == rec.bundle
    assert record_from_dict(stored.to_dict()) == stored and record_from_dict(stored) is stored
    assert rec.raw["bench"] is rec.bench and rec.bench["latency_ms"]["p50"] == rec.latency.p50_ms
    failed = record_from_dict({**rec.to_dict(), "status": "failed", "error": None})  # a failed run always says so
    assert not failed.ok and failed.error.message == "failed (no error recorded)"


def test_reading_a_record_as_a_dict_still_works_and_warns(benched):
    _, _, fleet, _ = benched
    (rec,) = fleet.records
    with pytest.warns(DeprecationWarning, match=r"DeviceInfo\['name'\].*DeviceInfo\.name"):
        assert rec.device["name"] == rec.device.name
    with pytest.warns(DeprecationWarning, match=r"BundleInfo\.id"):
        assert rec.bundle.get("bundle_id") == rec.bundle.id
    with pytest.warns(DeprecationWarning):
        assert rec["status"] == "ok"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the typed path warns about nothing, nor do report and decide on it
        assert (rec.device.name, rec.bundle.target, rec.latency.p50_ms) == ("local", "cpu", rec.bench["latency_ms"]["p50"])
        assert json.loads(render(fleet.records, "json"))["rows"] == json.loads(render([rec.to_dict()], "json"))["rows"]
        (verdict,) = decide.pick(fleet.records)
        assert verdict.ship == "cpu-fp32" and verdict.device == "local"


def test_the_cli_json_keeps_its_shape(benched, capsys):
    """``edgeopt bench --json`` prints the same record shape as before the records were typed: the keys of
    ``fleetbench.RunRecord``, and each record is what the typed record's ``to_dict()`` gives."""
    from edgeopt.cli import main
    from edgeopt.deploy import PushResult
    from edgeopt.fleetbench import RunRecord

    tmp, _, _, _ = benched
    rc = main(["bench", "--dist", str(tmp / "dist"), "--db", str(tmp / "cli.db"), "--duration", "0.2",
               "--min-iters", "5", "--json", "-q"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and set(doc) == {"schema", "kind", "run_id", "ok", "time_s", "records", "pushes", "skipped"}
    (rec,) = doc["records"]
    assert set(rec) == {f.name for f in dataclasses.fields(RunRecord)}
    (push,) = doc["pushes"]
    assert set(push) == {*(f.name for f in dataclasses.fields(PushResult)), "bytes_sent"}
    assert push_from_dict(push).to_dict() == push and push_from_dict(push).bundles[0].status in ("present", "installed")
    assert record_from_dict(rec).to_dict() == rec and rec["device"]["name"] == "local"


def test_an_unreachable_device_is_a_typed_error_record(benched, tmp_path):
    tmp, _, _, _ = benched
    rig = Path(tmp_path / "rig.yaml")
    rig.write_text(f"devices:\n  gone: {{host: 127.0.0.1, port: 1, user: ci, target: cpu, "
                   f"known_hosts: {tmp_path / 'kh'}}}\n")
    with pytest.raises(edgeopt.DeviceError) as exc:
        edgeopt.bench(dist=tmp / "dist", devices=str(rig), duration=0.2, db=str(tmp_path / "r.db"),
                      trust_new_host_keys=True)
    (rec,) = exc.value.result.records
    assert rec.status == "unreachable" and rec.latency is None and rec.accuracy is None
    assert rec.error.type and rec.error.message and rec.device.name == "gone" and "gone" in exc.value.message


def test_the_build_report_carries_its_host_check_typed(benched):
    """BuildReport's results are dataclasses; the host check reads as the bench's accuracy does."""
    *_, built = benched
    (res,) = built.results
    acc = res.accuracy
    assert isinstance(acc, AccuracyInfo) and acc.passed is True and (acc.metric, acc.k, acc.n) == ("top-1", 4, 4)
    assert acc.data == "random" and acc.interval[1] == 1.0
    assert "accuracy" not in built.as_dict()["results"][0]  # --json unchanged: its check stays under "check"
