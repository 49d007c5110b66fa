"""The API functions that were CLI-only before issue 40, called for real: ``edgeopt.run`` builds, benches and
writes its report on the local device; the fleet views read simulated devices (``transport: local``); the
failure convention (raise with the typed result, or ``raise_on_failure=False``) holds for each."""

from __future__ import annotations

import pytest

import edgeopt
from edgeopt.fixtures import path as fixture

MODEL = "ch_ppocr_mobile_v2.0_cls_infer"


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    root = tmp_path_factory.mktemp("apicmd")
    res = edgeopt.run(fixture("ocr-cls"), "cpu", precision="fp32", shape="x:1x3x48x192", dist=root / "dist",
                      val_count=4, calib_count=4, duration=0.3, min_iters=20, warmup=2, db=str(root / "r.db"),
                      report=root / "report.md")
    return root, res


def test_run_builds_benches_and_writes_its_report(ran):
    root, res = ran
    assert isinstance(res, edgeopt.RunResult) and res.ok and res.build.ok
    (rec,) = res.bench.records
    assert rec.ok and rec.latency.p50_ms > 0 and res.report == str(root / "report.md")
    assert "| cpu | fp32 |" in (root / "report.md").read_text()


def test_run_refuses_a_report_path_before_building(tmp_path):
    with pytest.raises(edgeopt.UsageError, match="report"):
        edgeopt.run(fixture("ocr-cls"), "cpu", shape="x:1x3x48x192", dist=tmp_path / "dist",
                    report="/proc/edgeopt-api-report.html")
    assert not (tmp_path / "dist").exists()
    with pytest.raises(edgeopt.UsageError, match="no keyword 'reprot'"):
        edgeopt.run(fixture("ocr-cls"), "cpu", reprot="x.html")


def test_fleet_views_and_rollout_journal(ran, tmp_path):
    root, _ = ran
    (tmp_path / "fleet.yaml").write_text(f"devices:\n  sim: {{transport: local, root: {tmp_path / 'sim'}, target: cpu}}\n")
    fleet = str(tmp_path / "fleet.yaml")
    db = str(tmp_path / "j.db")
    assert edgeopt.rollout_list(db) == []
    with pytest.raises(edgeopt.UsageError, match="no journal"):
        edgeopt.rollout_status("nope", db)
    summary = edgeopt.rollout(str(root / "dist"), fleet, waves="100%", no_latency_gate=True, db=db)
    assert summary["status"] == "done"
    (row,) = edgeopt.rollout_list(db)
    assert row["id"] == summary["rollout_id"] and row["status"] == "done"
    st = edgeopt.rollout_status(summary["rollout_id"], db)
    assert st["status"] == "done" and st["devices"]["sim"]["status"] == "done" and not st["unconfirmed_trials"]
    assert isinstance(row, edgeopt.RolloutRecord) and isinstance(st, edgeopt.RolloutStatus) and row.status == "done"
    assert st.devices["sim"].status == "done" and st.devices["sim"].after == st["devices"]["sim"]["after"]
    assert isinstance(summary, edgeopt.RolloutSummary) and summary.ok and summary.outcomes[0].device == "sim"
    with pytest.raises(edgeopt.UsageError, match="nothing to resume"):
        edgeopt.rollout_resume(summary["rollout_id"], db=db)
    fs = edgeopt.fleet_status(fleet, rollout=summary["rollout_id"], db=db)
    assert isinstance(fs, edgeopt.FleetStatus) and fs.ok
    assert fs.devices["sim"]["slots"][f"{MODEL}/cpu"]["current"] == st["devices"]["sim"]["after"]
    (dev,) = edgeopt.devices(fleet)
    assert dev["name"] == "sim" and dev["target"] == "cpu"
    assert isinstance(dev, edgeopt.DeviceEntry) and (dev.name, dev.target, dev.transport) == ("sim", "cpu", "local")
    with pytest.raises(edgeopt.UsageError, match="the models they have: " + MODEL):
        edgeopt.rollback(fleet, model="nosuch")


def test_find_max_qps_and_cache(ran):
    root, _ = ran
    with pytest.raises(edgeopt.GoalNotMet) as err:  # said from the single-stream service time, no probe
        edgeopt.find_max_qps(root / "dist", "p90=0.001ms", load_generator="edgeopt")
    (row,) = err.value.result
    assert row["verdict"] == "not met" and row["probes"] == []
    assert isinstance(row, edgeopt.MaxQpsRow) and row.verdict == "not met" and row.max_qps is None and not row.probes
    assert row.percentile == 90 and row.bound_ms == 0.001 and row.service_p50_ms > row.bound_ms
    entries = edgeopt.cache_list()
    assert any(e.model == MODEL for e in entries)
    dry = edgeopt.cache_clean(all=True, dry_run=True)
    assert isinstance(dry, edgeopt.CacheCleanResult) and dry.dry_run and set(dry.removed) == {e.key for e in entries}
    assert len(dry["removed"]) == len(entries) and [e.key for e in edgeopt.cache_list()] == [e.key for e in entries]


def test_gate_and_report_output_files_are_checked_before_any_work(tmp_path):
    """gate(junit=/md=/raw=) and report(output=) refuse a path that cannot be written before anything is
    measured or read (the verdict must not be lost after the budget is spent)."""
    with pytest.raises(edgeopt.UsageError, match="junit"):
        edgeopt.gate(tmp_path / "no-candidate", tmp_path / "no-baseline", junit="/proc/edgeopt-gate.xml")
    with pytest.raises(edgeopt.UsageError, match="cannot write the report"):
        edgeopt.report(db=str(tmp_path / "none.db"), output="/proc/edgeopt-report.md")


def test_debug_layers_on_a_bundle_writes_its_page(ran, tmp_path):
    root, _ = ran
    bundle = root / "dist" / MODEL / "cpu-fp32"
    with pytest.raises(edgeopt.UsageError, match="cannot write"):  # the page's path first, not after the comparison
        edgeopt.debug_layers(bundle, model=str(fixture("ocr-cls")), html="/proc/edgeopt-debug.html")
    res = edgeopt.debug_layers(bundle, model=str(fixture("ocr-cls")), samples=2, html=tmp_path / "debug.html")
    assert type(res).__name__ == "DebugResult" and res.first_jump is None  # fp32 on ORT: nothing jumps
    assert (tmp_path / "debug.html").read_text().lower().startswith("<!doctype html>")
