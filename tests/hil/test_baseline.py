"""Named baselines: saved from a real gate run, exported/imported, and gated against (unpaired)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeopt.policy.gatefile import load_gate
from edgeopt.policy.stats import judge_unpaired
from tests.conftest import fixture
from tests.hil.conftest import _build, same_speed_gate
from tests.hil.models import slower


def _edgeopt(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def _blocks(rng, n: int, scale: float, iters: int = 20, session: float = 1.0) -> list[list[float]]:
    return [list(session * scale * rng.lognormal(0, 0.08, iters)) for _ in range(n)]


def test_unpaired_judge_on_independent_sessions():
    rng = np.random.default_rng(5)
    spec = load_gate(None)
    base = _blocks(rng, 20, 1.0)
    same = {v.metric: v for v in judge_unpaired(base, _blocks(rng, 20, 1.0), spec)}
    assert same["p50"].verdict in ("pass", "inconclusive") and "UNPAIRED" in same["p50"].method
    assert same["p90"].verdict == "pass" and "99%+2% CI" in same["p90"].reason  # the widened interval
    assert same["p50"].ci_high / same["p50"].ci_low > 1.02 ** 2  # at least the session margin each way
    slow = {v.metric: v for v in judge_unpaired(base, _blocks(rng, 20, 1.15), spec)}
    assert slow["p50"].verdict == "regressed" and 1.10 < slow["p50"].ratio < 1.20
    assert slow["p50"].ci_low < slow["p50"].ratio < slow["p50"].ci_high
    assert {v.metric: v.verdict for v in judge_unpaired(base, _blocks(rng, 20, 0.8), spec)}["p50"] == "improved"
    # the device 20% slower on the calibration workload than when the baseline was measured: a slower
    # device cannot make a regression (nor a faster one a pass)
    slow_dev = {v.metric: v for v in judge_unpaired(base, _blocks(rng, 20, 1.15), spec, speed=1.2)}
    assert slow_dev["p50"].verdict == "inconclusive" and "calibration workload" in slow_dev["p50"].reason
    fast_dev = {v.metric: v for v in judge_unpaired(base, _blocks(rng, 20, 1.0), spec, speed=0.8)}
    assert fast_dev["p90"].verdict == "inconclusive" and "would be pass" in fast_dev["p90"].reason
    few = {v.metric: v for v in judge_unpaired(base[:2], _blocks(rng, 2, 1.0), spec)}
    assert few["p50"].verdict == "inconclusive" and few["p90"].verdict == "inconclusive"


def test_save_export_import_and_gate_against_a_stored_baseline(gate_bundles, tmp_path):
    from junitparser import JUnitXml

    base, slow = str(gate_bundles["base"]), str(gate_bundles["slow"])
    # the budget bounds the whole gate (start-up, loading, accuracy passes): enough for 2 calls under load
    p = _edgeopt("gate", base, "--baseline", base, "--budget", "15s", "--db", "r.db", "--on-inconclusive", "pass",
                 "--gate", str(same_speed_gate(tmp_path)), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    p = _edgeopt("baseline", "save", "main", "--from", "latest", "--db", "r.db", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    saved = json.loads(p.stdout)
    assert saved["kind"] == "baseline-save" and saved["run_id"].startswith("gate-")
    e = saved["entries"][0]
    assert e["device"] == "local" and e["kind"] == "gate" and e["figures"]["rounds"] >= 3 and e["fingerprint"]["runner"]
    p = _edgeopt("baseline", "save", "main", "--from", "latest", "--db", "r.db", cwd=tmp_path)
    assert p.returncode == 2 and "--force" in p.stderr  # a baseline is not moved by accident
    p = _edgeopt("baseline", "list", "--db", "r.db", cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("main ") and "local" in p.stdout
    p = _edgeopt("baseline", "show", "main", "--db", "r.db", cwd=tmp_path)
    assert p.returncode == 0 and "fingerprint" in p.stdout and "p50" in p.stdout

    # export -> a file to commit; import into a fresh DB, once as is and once with another runtime version
    p = _edgeopt("baseline", "export", "main", "-o", "main.json", "--db", "r.db", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "main.json").read_text())
    assert doc["kind"] == "baseline" and len(doc["entries"][0]["blocks"]) == e["figures"]["rounds"]
    doc["entries"][0]["fingerprint"]["runner_version"] = "0.0.1-old"
    (tmp_path / "old.json").write_text(json.dumps(doc))
    doc["entries"][0]["model"] = "some-other-model"
    (tmp_path / "other.json").write_text(json.dumps(doc))
    for f, name in (("main.json", "main"), ("old.json", "old"), ("other.json", "other")):
        p = _edgeopt("baseline", "import", f, "--name", name, "--db", "ci.db", cwd=tmp_path)
        assert p.returncode == 0 and "imported" in p.stdout, p.stderr

    # a ~6x slower build of the same model (raw ORT, 1 thread, here) against the stored rounds: never a
    # pass, the slowdown seen, said to be unpaired (regressed as a rule; on this shared machine another
    # session can be too far off to decide: exit 6). Not the ~+25% one: a baseline saved while the box was
    # busy made that one look *improved* (seen) -- what BENCHMARKS gate-unpaired measures, and why a
    # baseline bundle is preferred. (A ~3x build was judged only 1.48x on a CI machine: its fixed
    # per-request costs weigh more there.)
    src = Path(fixture("ocr-cls"))
    much_slower = str(_build(slower(src, tmp_path / "slow6" / src.name, channels=32, convs=4), tmp_path / "dist-6x"))
    p = _edgeopt("gate", much_slower, "--baseline", "results:main", "--budget", "15s", "--db", "ci.db", "--junit", "g.xml",
                 "--json", cwd=tmp_path)
    assert p.returncode in (5, 6), p.stdout[-1500:] + p.stderr
    res = json.loads(p.stdout)
    v = {x["metric"]: x for x in res["devices"][0]["verdicts"]}
    assert res["mode"] == "unpaired" and res["baseline_id"] == "results:main"
    assert v["p50"]["verdict"] in ("regressed", "inconclusive") and v["p50"]["ratio"] > 1.5, v["p50"]
    assert "UNPAIRED" in v["p50"]["method"] and "decisions" not in v
    assert v["accuracy"]["verdict"] == "pass"
    cases = {c.name: c for s in JUnitXml.fromfile(str(tmp_path / "g.xml")) for c in s}
    props = {pr.get("name"): pr.get("value") for pr in cases["p50"]._elem.iter("property")}
    assert props["mode"] == "unpaired" and "another session" in props["warnings"]

    # the same bundle against the baseline saved with another runtime version: a warning, not a failure.
    # Latency is not this step's question (the 6x build above is): an unpaired rerun of the very same
    # bundle minutes later was once judged 40%+ slower in the full suite (2/2 passes alone), so its
    # latency bounds are out of the way here.
    any_speed = tmp_path / "any-speed.yaml"
    any_speed.write_text("p50: {max_slowdown: 1000%}\np90: {max_slowdown: 1000%}\n")
    p = _edgeopt("gate", base, "--baseline", "results:old", "--budget", "4s", "--db", "ci.db", "--gate", str(any_speed),
                 "--on-inconclusive", "pass", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr
    dev = json.loads(p.stdout)["devices"][0]
    assert any("fingerprint differs" in w and "runner_version: 0.0.1-old" in w for w in dev["warnings"])
    assert "fingerprint differs" in p.stderr

    # bad input: one line, exit 2, nothing measured
    (tmp_path / "other.yaml").write_text("devices:\n  bench-2: {transport: local, target: cpu}\n")
    with sqlite3.connect(tmp_path / "ci.db") as c:
        before = c.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    for args, msg in [
        (["--baseline", "results:mian", "--db", "ci.db"], "did you mean 'main'"),
        (["--baseline", "results:main", "--db", "nothere.db"], "no results database"),
        (["--baseline", "results:other", "--db", "ci.db"], "holds some-other-model on cpu"),
        (["--baseline", "results:", "--db", "ci.db"], "needs a name"),
        (["--baseline", "results:main", "--db", "ci.db", "--devices", "other.yaml"], "no rounds for device(s) bench-2"),
    ]:
        p = _edgeopt("gate", slow, *args, cwd=tmp_path)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    with sqlite3.connect(tmp_path / "ci.db") as c:
        assert c.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == before
    assert not (tmp_path / "nothere.db").exists()


@pytest.mark.parametrize("args, msg", [
    (["save", "x", "--from", "gate-nope"], "no finished run"),
    (["save", "bad name", "--from", "latest"], "bad baseline name"),
    (["show", "nope"], "no results database"),
    (["import", "missing.json"], "does not exist"),
])
def test_baseline_bad_input(tmp_path, args, msg):
    if args[0] == "save":
        from edgeopt.results import ResultsDB

        ResultsDB(tmp_path / "edgeopt-results.db").close()
    p = _edgeopt("baseline", *args, cwd=tmp_path)
    assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr
