"""The API functions return typed results (issue 40): no ``Any`` in what ``gate``, ``rollout``, ``inspect``,
``export``, ``results_*``, ``cluster_status`` and ``start_worker`` return; the dict their ``--json`` prints
stays in ``raw`` (``to_dict()``) and ``res["key"]`` still reads it. The functions last given to the CLI-only
commands (export, results, cluster, worker) called for real: their refusals are the errors the CLI exits with."""

from __future__ import annotations

import dataclasses
import inspect
import sqlite3
import typing

import pytest

import edgeopt
from edgeopt import api_types

# What these return is typed all the way down (a dataclass, a list of them, or a plain str/float; the dataclasses'
# fields other than ``raw``, the --json dict, hold no Any).
TYPED = ("inspect", "gate", "rollout", "rollout_resume", "export", "results_sync", "results_info", "cluster_status",
         "start_worker", "run", "rollback", "fleet_status", "debug_layers", "bench", "build", "tune", "cache_list",
         "rollout_list", "rollout_status", "query", "push", "history", "change_points", "select_devices",
         "parse_duration", "report", "list_targets", "cache_clean", "devices", "ocr_check", "find_max_qps",
         "rig_status", "rig_release", "baseline_save", "baseline_list", "baseline_show", "baseline_export",
         "baseline_import", "probe", "gc")
# Still dict/list-of-dict returns (the older functions), said here so the list can only shrink.
STILL_DICTS = {"bench_options"}  # the options sent to the agent, a request


def _hints(fn) -> dict[str, typing.Any]:
    import edgeopt.api as api_mod

    ns = {**vars(api_mod), **vars(api_types)}
    from edgeopt.cache import CacheEntry
    from edgeopt.debug import DebugResult
    from edgeopt.deploy import PushResult
    from edgeopt.hil.history import ChangePoint, Series
    from edgeopt.inventory import Device
    from edgeopt.pipeline import BuildReport
    from edgeopt.results import BenchRecord, BenchResult
    from edgeopt.tuning import TuneResult

    ns.update(CacheEntry=CacheEntry, DebugResult=DebugResult, BuildReport=BuildReport, BenchRecord=BenchRecord,
              BenchResult=BenchResult, TuneResult=TuneResult, PushResult=PushResult, ChangePoint=ChangePoint,
              Series=Series, Device=Device)
    return typing.get_type_hints(inspect.unwrap(fn), globalns=ns)


@pytest.mark.parametrize("name", TYPED)
def test_what_the_function_returns_is_a_dataclass_with_no_any(name):
    ret = _hints(getattr(edgeopt, name))["return"]
    assert "Any" not in str(ret) and "dict[str, dict" not in str(ret), (name, ret)
    if typing.get_origin(ret) is dict:  # name -> a dataclass (probe, gc)
        ret = typing.get_args(ret)[1]
    for cls in typing.get_args(ret) or (typing.get_origin(ret) and typing.get_args(ret)) or (ret,):
        cls = typing.get_args(cls)[0] if typing.get_origin(cls) is list else cls
        assert dataclasses.is_dataclass(cls) or cls in (str, float), (name, cls)


def test_every_api_function_is_listed_typed_or_still_dicts():
    names = {n for n in edgeopt.API if n[0].islower()}
    assert names == set(TYPED) | STILL_DICTS, names ^ (set(TYPED) | STILL_DICTS)


@pytest.mark.parametrize("cls", [getattr(api_types, n) for n in api_types.__all__ if n[0].isupper()])
def test_the_typed_results_hold_no_any_but_the_raw_json(cls):
    hints = typing.get_type_hints(cls)
    loose = [f.name for f in dataclasses.fields(cls) if "Any" in str(hints[f.name])
             and f.name not in ("raw", "config")]  # config: Triton's config.pbtxt as a dict, any depth
    assert not loose, (cls.__name__, loose)
    assert getattr(edgeopt, cls.__name__, None) is cls or cls.__name__ in ("PlannedDevice", "TensorSpec", "RolloutDeviceEvent", "RolloutHost", "DeviceProbe",
                                                                "MaxQpsProbe", "RigDevice", "BaselineEntry", "DeviceGc")


def test_a_gate_result_reads_typed_and_as_its_json():
    raw = {"gate_id": "g1", "verdict": "regressed", "exit_code": 5, "model": "m", "target": "cpu", "mode": "paired",
           "baseline": "a", "candidate": "b", "baseline_id": "A", "candidate_id": "B", "budget_s": 60.0,
           "devices": [{"device": "d0", "status": "ok", "verdict": "regressed", "attempts": 1,
                        "verdicts": [{"metric": "p50", "verdict": "regressed", "ratio": 1.31, "ci_low": 1.2,
                                      "ci_high": 1.4, "n": 40}]}]}
    res = api_types.gate_result(raw)
    assert not res.ok and res.devices[0].verdicts[0].ratio == 1.31 and res.devices[0].verdicts[0].n == 40
    assert res["verdict"] == "regressed" and "budget_s" in res and res.to_dict() == raw
    err = edgeopt.api.gate_failure(res)
    assert isinstance(err, edgeopt.GateFailed) and err.result is res and "p50 regressed x1.31" in err.message


def test_export_results_cluster_and_worker_refuse_bad_input_as_the_cli_does(tmp_path, monkeypatch):
    with pytest.raises(edgeopt.UsageError, match="did you mean 'triton'"):
        edgeopt.export("tritn")
    with pytest.raises(edgeopt.UsageError, match="BUNDLE and --repository"):
        edgeopt.export("triton", tmp_path)
    with pytest.raises(edgeopt.UsageError, match="--instances must be"):
        edgeopt.export("triton", tmp_path, repository=tmp_path / "repo", instances=0)
    with pytest.raises(edgeopt.UsageError, match="no manifest.json"):
        edgeopt.export("triton", tmp_path, repository=tmp_path / "repo")
    assert not (tmp_path / "repo").exists()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(edgeopt.UsageError, match="--tracking-uri"):
        edgeopt.export("mlflow", db=str(tmp_path / "r.db"))
    with pytest.raises(edgeopt.UsageError, match="no results database"):
        edgeopt.export("mlflow", tracking_uri="http://127.0.0.1:9", db=str(tmp_path / "r.db"))
    with pytest.raises(edgeopt.UsageError, match="nothing to sync"):
        edgeopt.results_sync(str(tmp_path / "r.db"))
    with pytest.raises(edgeopt.UsageError, match="no results database"):
        edgeopt.results_info(str(tmp_path / "r.db"))
    monkeypatch.delenv("EDGEOPT_SCHEDULER", raising=False)
    with pytest.raises(edgeopt.UsageError, match="--scheduler"):
        edgeopt.cluster_status()
    with pytest.raises(edgeopt.UsageError, match="not a scheduler address"):
        edgeopt.cluster_status("http://x")
    with pytest.raises(edgeopt.UsageError, match="--nthreads"):
        edgeopt.start_worker("tcp://127.0.0.1:8786", nthreads=0)
    with pytest.raises(edgeopt.UsageError, match="--only"):
        edgeopt.start_worker("tcp://127.0.0.1:8786", only="tensorflow")
    assert not any(tmp_path.iterdir())  # nothing written by any refusal


def test_start_worker_dry_run_is_the_cli_command_line(capsys):
    from edgeopt.cli import main

    w = edgeopt.start_worker("tcp://127.0.0.1:8786", nthreads=2, name="w1", resources="tensorrt=1 gpu=2",
                             dry_run=True, dask_args=["--memory-limit", "2GB"])
    assert isinstance(w, edgeopt.WorkerProcess) and w.process is None and w.stop() is None
    assert w.scheduler == "tcp://127.0.0.1:8786" and w.resources["gpu"] == 2.0
    assert any(k.startswith("tensorrt@") for k in w.resources) and w.argv[-2:] == ["--memory-limit", "2GB"]
    assert main(["worker", "--scheduler", "tcp://127.0.0.1:8786", "--nthreads", "2", "--name", "w1",
                 "--resources", "tensorrt=1 gpu=2", "--dry-run", "--", "--memory-limit", "2GB"]) == 0
    import shlex

    assert shlex.split(capsys.readouterr().out.strip()) == w.argv


def test_list_targets_is_typed_and_keeps_its_json():
    rows = edgeopt.list_targets()
    cpu = next(t for t in rows if t.name == "cpu")
    assert isinstance(cpu, edgeopt.TargetInfo) and "ort" in cpu.aliases and cpu.builds_here and "int8" in cpu.precisions
    assert cpu["name"] == "cpu" and cpu.to_dict()["backend"] == cpu.backend == "onnxruntime"


def test_results_info_reads_a_real_database(tmp_path, capsys):
    from edgeopt.results import ResultsDB

    db = tmp_path / "r.db"
    with ResultsDB(db):
        pass
    info = edgeopt.results_info(str(db))
    assert isinstance(info, edgeopt.ResultsInfo) and info.db_kind == "sqlite" and info.records == 0
    assert info.schema_version == info.edgeopt_schema and info["records"] == 0
    from edgeopt.cli import main

    assert main(["results", "info", "--db", str(db), "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)  # the envelope's kind is the object's, not the database's
    assert out["kind"] == "results-info" and out["db_kind"] == "sqlite" and out["records"] == 0
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0


def test_cluster_status_of_an_unreachable_scheduler_is_a_device_error(monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setenv("EDGEOPT_SCHEDULER_TIMEOUT", "1")
    with pytest.raises(edgeopt.DeviceError, match="unreachable") as err:
        edgeopt.cluster_status("tcp://127.0.0.1:9")
    assert err.value.exit_code == 4


def test_rig_status_and_baselines_are_typed(tmp_path):
    fleet = tmp_path / "dev" / "fleet.yaml"
    fleet.parent.mkdir()
    fleet.write_text(f"devices:\n  sim: {{transport: local, root: {tmp_path / 'dev' / 'store'}, target: cpu}}\n")
    (g,) = edgeopt.gc(fleet, dry_run=True).values()  # a fresh agent store: nothing to remove
    assert isinstance(g, api_types.DeviceGc) and g.ok and g.dry_run and g.removed == () and g["ok"]
    st = edgeopt.rig_status("local", db=str(tmp_path / "r.db"), probe=False)
    assert isinstance(st, edgeopt.RigStatus) and [d.device for d in st.devices] == ["local"]
    assert st.devices[0].health == "not probed" and not st.devices[0].quarantined and st["devices"][0]["device"] == "local"
    assert edgeopt.baseline_list(str(tmp_path / "r.db")) == []
    with pytest.raises(edgeopt.UsageError):
        edgeopt.baseline_show("main", str(tmp_path / "r.db"))
    assert [p.name for p in tmp_path.iterdir()] == ["dev"]  # no database made
