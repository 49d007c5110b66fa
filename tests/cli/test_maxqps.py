"""bench --find-max-qps: a real bisection on the local device's server scenario (the agent's own open-loop
server, p90: quick), and its refusals."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import edgeopt
from edgeopt.fixtures import path as fixture


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("maxqps")
    rep = edgeopt.build(fixture("ocr-cls"), "intel-cpu", precision="fp32", shape="x:1x3x48x192", dist=tmp / "dist")
    assert rep.ok, rep.results
    return tmp


def test_find_max_qps_is_the_highest_valid_probe(dist):
    p = subprocess.run([sys.executable, "-m", "edgeopt", "bench", "--find-max-qps", "--latency-bound", "p90=30ms",
                        "--load-generator", "edgeopt", "--json", "-q"], cwd=dist, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-1500:]
    doc = json.loads(p.stdout)
    assert doc["kind"] == "max-qps"
    row = doc["items"][0]
    assert row["status"] == "ok" and row["engine"] == "edgeopt" and len(row["probes"]) >= 2
    valid = [pr["qps"] for pr in row["probes"] if pr["valid"]]
    assert row["max_qps"] == (max(valid) if valid else None)
    assert all(pr["p90_ms"] <= 30 for pr in row["probes"] if pr["valid"])  # VALID means within the bound
    assert all("why" in pr for pr in row["probes"] if not pr["valid"])


def test_find_max_qps_with_a_bound_no_rate_meets_exits_5(dist):
    """A bound no rate can keep (p90 within 1 microsecond): said at once from the single-stream service time,
    without a server probe (it used to probe for minutes first), exit 5 (goal not met)."""
    p = subprocess.run([sys.executable, "-m", "edgeopt", "bench", "--find-max-qps", "--latency-bound", "p90=0.001ms",
                        "--load-generator", "edgeopt", "--json", "-q"], cwd=dist, capture_output=True, text=True, timeout=600)
    assert p.returncode == 5, (p.returncode, p.stderr[-1500:])
    doc = json.loads(p.stdout)
    row = doc["items"][0]
    assert doc["exit_code"] == 5 and row["status"] == "ok" and row["max_qps"] is None and row["verdict"] == "not met"
    assert row["probes"] == [] and "not met at any rate" in row["note"] and row["service_p50_ms"] > 0.001


def test_bench_targets_with_no_such_bundle_exits_2_and_writes_nothing(dist, tmp_path):
    for flag, extra in (("--targets", []), ("--target", ["--find-max-qps", "--latency-bound", "p90=30ms"])):
        p = subprocess.run([sys.executable, "-m", "edgeopt", "bench", "--dist", str(dist / "dist"), flag, "jetson",
                            "--db", str(tmp_path / "r.db"), "--json", *extra], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)  # --target: the hidden spelling of --targets
        assert p.returncode == 2 and "no bundle of --targets jetson" in p.stderr and "intel-cpu" in p.stderr, p.stderr
        err = json.loads(p.stdout)  # --json: the error object on stdout
        assert err["kind"] == "error" and err["exit_code"] == 2 and "jetson" in err["message"] and err["hint"]
        assert not (tmp_path / "r.db").exists() and not (tmp_path / "edgeopt-results.db").exists()


def test_find_max_qps_refusals(dist):
    for args, msg in ((["--find-max-qps"], "needs --latency-bound"),
                      (["--find-max-qps", "--latency-bound", "p99=5ms", "--target-qps", "10"], "drop --target-qps")):
        p = subprocess.run([sys.executable, "-m", "edgeopt", "bench", *args], cwd=dist, capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_bench_reports_a_device_whose_staging_cannot_be_written(dist, tmp_path):
    """A local device whose staging area is a file: that bundle fails to push (exit 4, one failure line),
    not an internal error with a traceback."""
    (tmp_path / "r0").mkdir()
    (tmp_path / "r0" / "staging").write_text("not a folder")
    (tmp_path / "f.yaml").write_text(f"devices:\n  d0: {{transport: local, root: {tmp_path / 'r0'}, target: intel-cpu}}\n")
    p = subprocess.run([sys.executable, "-m", "edgeopt", "bench", "--dist", str(dist / "dist"), "--devices",
                        str(tmp_path / "f.yaml"), "--duration", "0.2", "--db", str(tmp_path / "r.db")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 4 and "Traceback" not in p.stderr, p.stderr[-1500:]
    assert "PushFailed: d0: cannot create" in p.stdout and "Not a directory" in p.stdout
