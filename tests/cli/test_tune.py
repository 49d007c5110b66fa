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
    for args, msg in ((["--latency-bound", "p100=5ms"], "--latency-bound"), (["--min-accuracy", "top1=2"], "--min-accuracy"),
                      (["--batch", "0"], "--batch"), (["--objective", "latency", "--batch", "1,2"], "batch 1"),
                      (["--slo", "p100=5ms"], "note: --slo is now --latency-bound")):  # the old name: taken, said
        p = _tune(*args, cwd=tmp_path)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    assert not (tmp_path / "dist").exists()  # refused before building
    # measured fine, the goal not met: exit 5 (not 2, bad input), the closest said; under --json one object
    p = _tune("--threads", "1", "--latency-bound", "p99=0.001ms", "-q", cwd=tmp_path)
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
    assert p.returncode == 2 and "needs --latency-bound" in p.stderr and "Traceback" not in p.stderr


# --- device truth and the paired gate it suggests (issue 37, item 5) --------------------------------

def _local_truth(target: str) -> tuple[str, str | None]:
    from edgeopt import api
    from edgeopt.tuning import _probe, _truth

    dev = api.select_devices("local", None, None)[0]
    return _truth(dev, target, _probe(dev, False))


def test_tune_never_measures_or_picks_what_the_report_would_not_ship(tmp_path):
    """intel-cpu on an AMD CPU (other-vendor) and mobile on the build host: the report's device-truth rule,
    settled from the probe before anything is built; every measured point agrees with decide.device_truth."""
    from edgeopt.decide import device_truth

    p = _tune("-t", "cpu,intel-cpu", "--threads", "1", "--confirm", "0", "--json", "-q", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout)
    truth, why = _local_truth("intel-cpu")
    off = {x["target"]: x for x in res["not_truth"]}
    built = tmp_path / "dist" / "tune" / "batch1" / "ch_ppocr_mobile_v2.0_cls_infer"
    if truth != "device":  # e.g. this AMD EPYC: never built, measured or picked, and said so
        assert off["intel-cpu"]["truth"] == truth and off["intel-cpu"]["why"] == why
        assert not any(pt["target"] == "intel-cpu" for pt in res["points"])
        assert not (built / "intel-cpu-fp32").exists()
    assert res["winners"]["local"]["target"] in ("cpu",) + (("intel-cpu",) if truth == "device" else ())
    from edgeopt import api

    recs = {r.run_id: r for r in api.query(db=str(tmp_path / "edgeopt-results.db"), all_runs=True)}
    for pt in res["points"]:  # each measured point carries the report's word on its record
        assert pt["truth"] == device_truth(recs[pt["run_id"]].as_dict())[0] == "device"
        assert pt["accepted"] is True  # the accuracy policy on the device's validation run (fp32 vs fp32)
    # a mobile artifact on `local` runs on the build host: nothing to tune, refused before any build (exit 2)
    (tmp_path / "m").mkdir()
    p = _tune("-t", "mobile", "--threads", "1", cwd=tmp_path / "m")
    assert p.returncode == 2 and "not device truth" in p.stderr and "build-host" in p.stderr, p.stderr[-1500:]
    assert "Traceback" not in p.stderr and not (tmp_path / "m" / "dist").exists()
    if truth != "device":
        p = _tune("-t", "intel-cpu", "--threads", "1", "--json", cwd=tmp_path / "m")
        assert p.returncode == 2 and json.loads(p.stdout)["message"].startswith("nothing to tune: intel-cpu on local")
        assert not (tmp_path / "m" / "dist").exists()
    # the accuracy policy's gate file, as for build: a bad key is refused before anything is built
    (tmp_path / "m" / "gate.yaml").write_text("decisions: {max_disagreemnt: 10%}\n")
    p = _tune("-t", "cpu", "--accept", "gate.yaml", cwd=tmp_path / "m")
    assert p.returncode == 2 and "max_disagreement" in p.stderr and not (tmp_path / "m" / "dist").exists(), p.stderr


def _gate_argument_check(cmd: str) -> None:
    """Run `edgeopt gate`'s own argument check on a printed command: click's parse of the exact words, then
    the checks gate runs before it measures (the bundles exist, are comparable, a device takes them)."""
    import shlex

    from edgeopt import api
    from edgeopt.commands.gate import command as gate_cmd
    from edgeopt.fleetbench import matches
    from edgeopt.hil.gate import _bundle, check_pair

    words = shlex.split(cmd)
    assert words[:2] == ["edgeopt", "gate"]
    ctx = gate_cmd.make_context("gate", words[2:])
    cand = _bundle(ctx.params["candidate"], "candidate")
    base = _bundle(ctx.params["baseline"], "baseline")
    check_pair(base, cand)  # raises UsageError (exit 2) for a pair gate refuses
    devs = api.select_devices(ctx.params["devices"], list(ctx.params["limit"]) or None, None)
    assert [d for d in devs if matches(d, cand)]


def test_no_clear_winner_suggests_only_a_gate_that_runs_as_printed(tmp_path, monkeypatch):
    """The verdict's paired command: between the two tuned bundles (each with its threads) when gate takes
    the pair, and no command -- a reason instead -- across targets, where `edgeopt gate` exits 2."""
    from pathlib import Path

    import pytest

    from edgeopt import api
    from edgeopt.errors import UsageError
    from edgeopt.hil.gate import _bundle, check_pair
    from edgeopt.tuning import PAIRED_SENTENCE, Point, TuneResult, _paired, write_tuned

    monkeypatch.chdir(tmp_path)
    rep = api.build(str(fixture("ocr-cls")), "cpu,intel-cpu", precision="fp32", shapes=[SHAPE], dist="dist",
                    val_count=4, calib_count=4)
    b = {r.target: r.bundle for r in rep.results}
    dev = api.select_devices("local", None, None)[0]

    def case(rival_target: str):
        win = Point("local", "cpu", "fp32", 1, 2, b["cpu"], "ok", p50_ms=1.0, feasible=True)
        riv = Point("local", rival_target, "fp32", 1, 1, b[rival_target], "ok", p50_ms=0.99, feasible=True)
        res = TuneResult("m", "latency", None, None, False)
        res.tuned["local"] = str(write_tuned(Path(win.bundle), Path("dist/m/tuned/local"), win, res))
        stale = f"edgeopt gate {b[rival_target]} --baseline {b['cpu']}"  # what edgeopt.decide names
        res.verdicts["local"] = {"basis": "fidelity", "ship": "cpu-fp32 batch 1 threads 2",
                                 "runner_up": f"{rival_target}-fp32 batch 1 threads 1", "paired": stale,
                                 "line": f"batch 1 on local: no clear winner (...): ship cpu-fp32 batch 1 threads 2"
                                         f"{PAIRED_SENTENCE}{stale} -- gate defaults accept it against FP32"}
        _paired(res, dev, win, [win, riv], "local", Path("dist/m/tuned/local-rival"))
        return res, res.verdicts["local"], stale

    # one target, the same bundle at other threads: both tuned, the gate between them passes gate's checks
    res, v, _ = case("cpu")
    assert v["paired"] and v["paired"] in v["line"] and res.rivals["local"] in v["paired"]
    _gate_argument_check(v["paired"])
    rival = json.loads((Path(res.rivals["local"]) / "manifest.json").read_text())
    assert rival["runtime"]["options"]["threads"] == 1 and rival["tuned"]["threads"] == 1
    assert v["line"].endswith("-- gate defaults accept it against FP32")
    # two targets: what decide would print fails gate's argument check; tune prints no command, says why
    res, v, stale = case("intel-cpu")
    with pytest.raises(UsageError, match="one target"):
        check_pair(_bundle(b["cpu"], "baseline"), _bundle(b["intel-cpu"], "candidate"))
    assert v["paired"] is None and "edgeopt gate" not in v["line"] and stale not in v["line"]
    assert "no gate can compare intel-cpu-fp32 batch 1 threads 1 with cpu-fp32 batch 1 threads 2" in v["line"]
    assert "local" not in res.rivals
