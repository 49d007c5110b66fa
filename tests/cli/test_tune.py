"""edgeopt tune: a real (short) sweep on the local device, the tuned bundle it writes, and its refusals."""

from __future__ import annotations

import json
import subprocess
import sys

from edgeopt.fixtures import path as fixture

SHAPE = "x:1x3x48x192"


def _tune(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", "tune", str(fixture("ocr-cls")), "-t", "cpu", "-p", "fp32",
                           "--shape", SHAPE, "--duration", "0.3", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_tune_picks_writes_a_tuned_bundle_that_bench_runs_as_tuned(tmp_path):
    p = _tune("--threads", "1,2", "--exhaustive", "--json", "-q", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout)
    # 2 sweep points, then both finalists re-measured in 2 interleaved rounds: 6 benches
    assert res["schema"] == "edgeopt/v1" and res["kind"] == "tune" and res["benches"] == 6
    win = res["winners"]["local"]
    med = {}
    for t in (1, 2):
        vals = sorted(pt["p50_ms"] for pt in res["points"] if pt["threads"] == t and pt["status"] == "ok")
        assert len(vals) == 3
        med[t] = vals[1]
    assert win["p50_ms"] == med[win["threads"]] == min(med.values())  # picked on the medians
    # the finalists are judged as the report's SHIP is (edgeopt.decide): a verdict with its criterion
    v = res["verdicts"]["local"]
    assert v["ship"] == f"cpu-fp32 batch 1 threads {win['threads']}" and "p50" in v["criterion"], v
    tuned = tmp_path / res["tuned"]["local"]
    m = json.loads((tuned / "manifest.json").read_text())
    assert m["runtime"]["options"]["threads"] == win["threads"] and m["tuned"]["device"] == "local"
    b = subprocess.run([sys.executable, "-m", "edgeopt", "bench", "--dist", str(tuned.parent), "--duration", "0.3",
                        "--json", "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert b.returncode == 0, b.stderr[-1500:]
    runner = json.loads(b.stdout)["records"][0]["bench"]["runner"]
    assert runner["threads"] == win["threads"]  # the agent runs a tuned bundle with its tuned threads


def test_tune_refuses_bad_goals_and_says_when_nothing_meets_them(tmp_path):
    for args, msg in ((["--slo", "p100=5ms"], "--slo"), (["--min-accuracy", "top1=2"], "--min-accuracy"),
                      (["--batch", "0"], "--batch"), (["--objective", "latency", "--batch", "1,2"], "batch 1")):
        p = _tune(*args, cwd=tmp_path)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    assert not (tmp_path / "dist").exists()  # refused before building
    # measured fine, the goal not met: exit 5 (not 2, bad input), the closest said; under --json one object
    p = _tune("--threads", "1", "--slo", "p99=0.001ms", "-q", cwd=tmp_path)
    assert p.returncode == 5 and "no configuration meets" in p.stderr and "closest" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    p = _tune("--threads", "1", "--slo", "p99=0.001ms", "-q", "--json", cwd=tmp_path)
    assert p.returncode == 5, p.stderr[-1500:]
    doc = json.loads(p.stdout)  # the whole of stdout is one object: the sweep, with what it failed at
    assert doc["kind"] == "tune" and doc["exit_code"] == 5 and doc["winners"] == {}
    assert doc["error"]["kind"] == "GoalNotMet" and "closest" in doc["error"]["message"]
    assert doc["closest"]["local"]["feasible"] is False and doc["points"]


def test_tune_offline_picks_on_loadgens_offline_images_per_second(tmp_path):
    import pytest

    pytest.importorskip("mlperf_loadgen")
    p = _tune("--batch", "1,2", "--threads", "1", "--scenario", "offline", "--exhaustive", "--confirm", "0",
              "--json", "-q", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout)
    assert res["objective"] == "throughput" and sorted(pt["batch"] for pt in res["points"]) == [1, 2]
    best = max(res["points"], key=lambda pt: pt["throughput_ips"])
    assert res["winners"]["local"]["batch"] == best["batch"]
    from edgeopt import api

    recs = [r for r in api.query(db=str(tmp_path / "edgeopt-results.db"), all_runs=True)
            if (r.bench or {}).get("scenario")]
    assert len(recs) == 2 and {r.bench["scenario"]["scenario"] for r in recs} == {"offline"}
    rate = {r.bundle.batch: r.bench["scenario"]["images_per_second"]
            if r.bundle.batch > 1 else r.bench["scenario"]["samples_per_second"] for r in recs}
    assert {pt["batch"]: pt["throughput_ips"] for pt in res["points"]} == rate  # LoadGen's rate, not the loop's
    md = api.report(db=str(tmp_path / "edgeopt-results.db"), format="md")  # the report shows the scenario runs
    assert "## Load scenarios" in md and "| offline |" in md and "loadgen" in md and "passed" in md
    p = _tune("--scenario", "offline", "--slo", "p99=5ms", cwd=tmp_path)
    assert p.returncode == 2 and "offline" in p.stderr and "Traceback" not in p.stderr


def test_tune_server_picks_on_the_highest_rate_that_keeps_the_slo(tmp_path):
    import pytest

    pytest.importorskip("mlperf_loadgen")
    p = _tune("--threads", "1,2", "--scenario", "server", "--slo", "p90=50ms", "--exhaustive", "--confirm", "0",
              "--json", "-q", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout)
    assert res["objective"] == "throughput" and len(res["points"]) == 2
    for pt in res["points"]:  # each point's throughput is its searched server rate (batch 1)
        assert pt["max_qps"] and pt["throughput_ips"] == pt["max_qps"]
    assert res["winners"]["local"]["max_qps"] == max(pt["max_qps"] for pt in res["points"])
    p = _tune("--scenario", "server", cwd=tmp_path)
    assert p.returncode == 2 and "needs --slo" in p.stderr and "Traceback" not in p.stderr
