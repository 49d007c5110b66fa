"""`edgeopt export mlflow` against a real `mlflow server` (MLflow 3.17.2 in its own venv, so its ~90
packages never touch edgeopt's; made on first use in ~/.cache/edgeopt/mlflow-venv), read back over REST.
Slow: the server takes 20-60 s to start on this machine."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgeopt.results import ResultsDB
from tests.results.conftest import record

pytestmark = pytest.mark.slow
MLFLOW = "mlflow==3.17.2"
VENV = Path(os.path.expanduser("~/.cache/edgeopt/mlflow-venv"))


def mlflow_bin() -> Path:
    """The pinned mlflow in its own venv, made when missing (skips the test when it cannot be installed)."""
    exe = VENV / "bin" / "mlflow"
    if exe.exists():
        return exe
    py = shutil.which("python3.11") or sys.executable
    try:
        subprocess.run([py, "-m", "venv", str(VENV)], check=True, timeout=120)
        subprocess.run([str(VENV / "bin" / "python"), "-m", "pip", "install", "-q", MLFLOW], check=True, timeout=1200)
    except (subprocess.SubprocessError, OSError) as exc:
        shutil.rmtree(VENV, ignore_errors=True)
        pytest.skip(f"{MLFLOW} could not be installed in {VENV}: {exc}")
    return exe


def start_server(folder: Path) -> tuple[subprocess.Popen, str]:
    """A real `mlflow server` on SQLite in ``folder`` (job execution off: no huey workers), ready."""
    folder.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen([str(mlflow_bin()), "server", "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
                             "--default-artifact-root", str(folder / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"], stdout=open(folder / "server.log", "w"),
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=5):
                return proc, uri
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError((folder / "server.log").read_text()[-3000:]) from None
            time.sleep(1)
    proc.kill()
    raise RuntimeError("mlflow server not ready in 300 s")


def stop_server(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> Iterator[str]:
    proc, uri = start_server(tmp_path_factory.mktemp("mlflow"))
    try:
        yield uri
    finally:
        stop_server(proc)


def rest(uri: str, path: str, body: dict | None = None, method: str = "POST") -> dict:
    req = urllib.request.Request(f"{uri}/api/2.0/mlflow/{path}", data=json.dumps(body).encode() if body else None,
                                 method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", *args], capture_output=True, text=True, timeout=600)


def test_export_read_back_and_idempotent(mlflow_uri, tmp_path):
    db = tmp_path / "runs.db"
    recs = [record(i, device="xeon-1" if i % 2 else "orin-1") for i in range(4)]
    recs[0]["bench"]["samples_ms"] = [1.0 + k * 1e-4 for k in range(2300)]  # 2300 samples: 3 log-batch calls
    with ResultsDB(db) as rdb:
        for r in recs:
            rdb.add(r)
    p = _cli("export", "mlflow", "--tracking-uri", mlflow_uri, "--db", str(db), "--experiment", "edge", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["exported"] == 4 and out["skipped"] == 0 and out["batches"] >= 6
    exp = rest(mlflow_uri, "experiments/get-by-name?experiment_name=edge", method="GET")["experiment"]
    runs = rest(mlflow_uri, "runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 100})["runs"]
    assert len(runs) == 4 and all(r["info"]["status"] == "FINISHED" for r in runs)
    by_bundle = {next(p["value"] for p in r["data"]["params"] if p["key"] == "bundle_id"): r for r in runs}
    r0 = by_bundle["b00000"]
    p50 = next(m["value"] for m in r0["data"]["metrics"] if m["key"] == "latency_p50_ms")
    assert p50 == pytest.approx(recs[0]["bench"]["latency_ms"]["p50"])
    tags = {t["key"]: t["value"] for t in r0["data"]["tags"]}
    assert tags["edgeopt.run_id"] == "run-1" and tags["edgeopt.device"] == "orin-1" and "edgeopt.record_key" in tags
    hist = rest(mlflow_uri, f"metrics/get-history?run_id={r0['info']['run_id']}&metric_key=latency_sample_ms"
                            "&max_results=5000", method="GET")["metrics"]
    assert len(hist) == 2300
    # again: each record already there is skipped, nothing doubled
    p = _cli("export", "mlflow", "--tracking-uri", mlflow_uri, "--db", str(db), "--experiment", "edge", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["skipped"] == 4
    assert len(rest(mlflow_uri, "runs/search", {"experiment_ids": [exp["experiment_id"]]})["runs"]) == 4


def test_a_refusal_is_one_line(mlflow_uri, tmp_path):
    db = tmp_path / "runs.db"
    with ResultsDB(db) as rdb:
        rdb.add(record(0))
    exp_id = rest(mlflow_uri, "experiments/create", {"name": "gone"})["experiment_id"]
    rest(mlflow_uri, "experiments/delete", {"experiment_id": exp_id})
    p = _cli("export", "mlflow", "--tracking-uri", mlflow_uri, "--db", str(db), "--experiment", "gone")
    assert p.returncode == 4 and "refused" in p.stderr and "Traceback" not in p.stderr, p.stderr
    p = _cli("export", "mlflow", "--tracking-uri", "http://127.0.0.1:9", "--db", str(db))
    assert p.returncode == 4 and "cannot be reached" in p.stderr


def test_logged_after_each_command_with_the_env(mlflow_uri, tmp_path, monkeypatch, capsys):
    """EDGEOPT_MLFLOW_URI set: what a command stores (here two records through ResultsDB, as bench does) is
    logged to MLflow when it closes the database; a retry logs nothing twice."""
    monkeypatch.setenv("EDGEOPT_MLFLOW_URI", mlflow_uri)
    monkeypatch.setenv("EDGEOPT_MLFLOW_EXPERIMENT", "after-bench")
    with ResultsDB(tmp_path / "runs.db") as rdb:
        rdb.add(record(0, run_id="r-after"))
        rdb.add(record(1, run_id="r-after"))
    assert "2 record(s) logged to MLflow" in capsys.readouterr().err
    with ResultsDB(tmp_path / "runs.db") as rdb:
        rdb.add(record(1, run_id="r-after"))  # the same record again
    assert "1 there already" in capsys.readouterr().err
    exp = rest(mlflow_uri, "experiments/get-by-name?experiment_name=after-bench", method="GET")["experiment"]
    assert len(rest(mlflow_uri, "runs/search", {"experiment_ids": [exp["experiment_id"]]})["runs"]) == 2
