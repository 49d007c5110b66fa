"""The HIL gate end to end: real bundles, real regressions, the local device and a real sshd rig."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeopt.errors import UsageError
from edgeopt.policy.gatefile import load_gate
from edgeopt.policy.stats import PairedRun, holm, judge, judge_unpaired
from tests.devices.conftest import device_entry, known_hosts, write_inventory


def _gate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", "gate", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def _run_from(rng, rounds: int, slowdown: float, iters: int = 20, noise: float = 0.08) -> PairedRun:
    """Blocks A B B A … with a shared drift per round (what interleaving cancels) and lognormal noise."""
    blocks = []
    for r in range(rounds):
        drift = 1 + 0.3 * np.sin(r / 3)
        for arm in ("AB" if r % 2 == 0 else "BA"):
            base = 1.0 * drift * (slowdown if arm == "B" else 1.0)
            blocks.append({"arm": arm, "ms": list(base * rng.lognormal(0, noise, iters))})
    return PairedRun("synthetic", blocks)


def test_holm_step_down():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_judge_tells_a_slowdown_from_drift_and_noise():
    rng = np.random.default_rng(1)
    spec = load_gate(None)
    same = {v.metric: v.verdict for v in judge(_run_from(rng, 20, 1.0), spec)}
    assert same["p50"] == "pass" and same["p90"] in ("pass", "inconclusive")
    slow = {v.metric: v for v in judge(_run_from(rng, 20, 1.15), spec)}
    assert slow["p50"].verdict == "regressed" and 1.10 < slow["p50"].ratio < 1.20
    assert slow["p50"].ci_low < slow["p50"].ratio < slow["p50"].ci_high
    fast = {v.metric: v.verdict for v in judge(_run_from(rng, 20, 0.8), spec)}
    assert fast["p50"] == "improved"


def test_a_tail_percentile_needs_enough_samples():
    spec = load_gate({"p99": {"max_slowdown": "10%"}})
    v = next(x for x in judge(_run_from(np.random.default_rng(2), 10, 1.5, iters=20), spec)  # 200 samples < 662
             if x.metric == "p99")
    assert v.verdict == "inconclusive" and "662" in v.reason


@pytest.mark.parametrize("data, message", [
    ({"p5O": {"max_slowdown": "5%"}}, "did you mean 'p50'"),
    ({"p50": {"max_slowdown": "5 %"}}, "expected a percentage"),
    ({"p50": {"max_slowdown": "-3%"}}, "expected a percentage"),
    ({"p101": {"max_slowdown": "5%"}}, "unknown key 'p101'"),
    ({"p50": {"max_slowdwn": "5%"}}, "did you mean 'max_slowdown'"),
    ({"rounds": {"start": 20, "max": 10}}, "below start"),
])
def test_bad_gate_files_are_refused(data, message):
    with pytest.raises(UsageError, match=message):
        load_gate(data)


def test_gate_on_local_catches_a_real_slowdown_and_writes_junit(gate_bundles, tmp_path):
    """The ~25%-slower candidate is *regressed*, or — on a box whose load moves the per-round ratio by
    tens of percent (seen here: 90% spread at load 9-15 on 2 cores) — *inconclusive* saying how many rounds
    a decision needs; never *pass*. The JUnit, Markdown and raw files say the same either way."""
    from junitparser import JUnitXml

    # 40s bounds the whole gate (start-up, loading, accuracy passes included); it stops once decided
    p = _gate(str(gate_bundles["slow"]), "--baseline", str(gate_bundles["base"]), "--budget", "40s",
              "--junit", "g.xml", "--md", "g.md", "--raw", "raw.json", "--db", "r.db", cwd=tmp_path)
    assert p.returncode in (5, 6), p.stderr[-3000:]
    verdict = "regressed" if p.returncode == 5 else "inconclusive"
    assert f"local: {verdict}" in p.stderr.splitlines()[-1] and "Traceback" not in p.stderr, p.stderr[-3000:]
    xml = JUnitXml.fromfile(str(tmp_path / "g.xml"))
    cases = {c.name: c for suite in xml for c in suite}
    assert {"p50", "p90", "accuracy"} <= set(cases)
    kinds = {m: (cases[m].result[0].type if cases[m].result and cases[m].result[0].type else
                 ("skipped" if cases[m].result else "pass")) for m in ("p50", "p90")}
    assert "pass" != kinds["p50"], kinds  # never a pass on a 25% slowdown
    if verdict == "regressed":
        assert "regressed" in kinds.values(), kinds
    else:
        assert "noise" in p.stderr or "cannot reach" in p.stderr  # it says what a decision would need
    assert not cases["accuracy"].result  # same outputs: accuracy passes
    props = {pr.get("name"): pr.get("value") for pr in cases["p50"]._elem.iter("property")}
    assert "fingerprint" in props and "ratio" in props
    raw = json.loads((tmp_path / "raw.json").read_text())
    blocks = raw["devices"][0]["raw"]["blocks"]
    assert len(blocks) >= 12 and blocks[0]["arm"] == "A" and blocks[1]["arm"] == "B" and blocks[2]["arm"] == "B"
    assert f"| local | {'p50' if kinds['p50'] == 'regressed' else 'p90'} | ❌ regressed" in (tmp_path / "g.md").read_text() \
        if verdict == "regressed" else "⚠️ inconclusive" in (tmp_path / "g.md").read_text()


def test_gate_catches_an_accuracy_regression_and_passes_the_same_bundle(gate_bundles, tmp_path):
    p = _gate(str(gate_bundles["bad"]), "--baseline", str(gate_bundles["base"]), "--budget", "10s", "--json",
              "--db", "r.db", cwd=tmp_path)
    assert p.returncode == 5, p.stderr
    res = json.loads(p.stdout)
    v = {x["metric"]: x for x in res["devices"][0]["verdicts"]}
    assert v["decisions"]["verdict"] == "regressed" and v["p50"]["verdict"] != "regressed"
    # the same bundle twice: on a shared 2-core CI machine, with the practical threshold such a machine
    # allows (10%), at level 1%; bench/bench_gate.py measures the false-alarm rate at the defaults
    (tmp_path / "gate.yaml").write_text("p50: {max_slowdown: 10%}\np90: {max_slowdown: 20%}\nlevel: 0.01\n")
    p = _gate(str(gate_bundles["base"]), "--baseline", str(gate_bundles["base"]), "--budget", "10s", "--json",
              "--on-inconclusive", "pass", "--gate", "gate.yaml", "--db", "r.db", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout)["verdict"] in ("pass", "inconclusive")


def test_bad_input_is_one_line_and_exit_2(gate_bundles, tmp_path):
    (tmp_path / "gate.yaml").write_text("p50: {max_slowdown: 5 %}\n")
    for args, msg in [
        (["nothere", "--baseline", str(gate_bundles["base"])], "does not exist"),
        ([str(gate_bundles["slow"]), "--baseline", str(gate_bundles["base"]), "--gate", "gate.yaml"],
         "expected a percentage"),
        ([str(gate_bundles["slow"]), "--baseline", str(gate_bundles["base"]), "--budget", "0s"], "above 0"),
    ]:
        p = _gate(*args, cwd=tmp_path)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "edgeopt-results.db").exists()  # nothing measured, nothing recorded


def test_a_dead_rig_device_is_an_infrastructure_error_not_a_regression(gate_bundles, ssh_env, sshd, tmp_path):
    kh = known_hosts(tmp_path / "known_hosts", sshd)
    inv = write_inventory(tmp_path / "rig.yaml", {
        "rig-1": device_entry(ssh_env, sshd, tmp_path / "r1", kh, target="cpu"),
        "rig-off": {**device_entry(ssh_env, sshd, tmp_path / "r2", kh, target="cpu"), "port": 1}})
    p = _gate(str(gate_bundles["base"]), "--baseline", str(gate_bundles["base"]), "--devices", str(inv),
              "--budget", "8s", "--junit", "g.xml", "--db", "r.db", cwd=tmp_path)
    assert p.returncode == 4, p.stdout + p.stderr
    xml = (tmp_path / "g.xml").read_text()
    assert "<error" in xml and "<failure" not in xml
    assert "rig-1" in xml  # the live device was measured over SSH all the same


def test_memory_and_cold_start_are_judged_in_fresh_processes(gate_bundles, tmp_path):
    """A candidate holding 64 MB more weights: its fresh processes' peak RSS is higher by far more than
    10% (regressed), and its load is slower; the same bundle twice: memory passes (RSS of identical
    processes differs by well under 10%)."""
    from tests.conftest import fixture
    from tests.hil.conftest import _build
    from tests.hil.models import heavier

    src = Path(fixture("ocr-cls"))
    heavy = _build(heavier(src, tmp_path / "heavy" / src.name, mb=64), tmp_path / "dist-heavy")
    (tmp_path / "gate.yaml").write_text("p50: {max_slowdown: 1000%}\nmemory: {max_increase: 10%}\n"
                                        "cold_start: {max_slowdown: 1000%}\nfresh_runs: 3\n")
    p = _gate(str(heavy), "--baseline", str(gate_bundles["base"]), "--budget", "3s", "--gate", "gate.yaml",
              "--json", "--db", "r.db", cwd=tmp_path)
    res = json.loads(p.stdout)
    dev = res["devices"][0]
    v = {x["metric"]: x for x in dev["verdicts"]}
    assert p.returncode == 5 and v["memory"]["verdict"] == "regressed", (p.returncode, v.get("memory"), p.stderr)
    assert v["memory"]["candidate"] - v["memory"]["baseline"] > 40 and v["memory"]["n"] == 3  # MB
    assert "fresh processes" in v["memory"]["method"] and v["cold_start"]["n"] == 3
    assert v["cold_start"]["ratio"] > 1 and v["cold_start"]["verdict"] in ("pass", "inconclusive")
    assert [f["arm"] for f in dev["fresh"]] == list("ABBAAB") and all(f["memory"] > 0 for f in dev["fresh"])
    assert "cold start and memory: 3 fresh processes per arm" in p.stderr

    base = str(gate_bundles["base"])
    p = _gate(base, "--baseline", base, "--budget", "2s", "--gate", "gate.yaml", "--json", "--db", "r.db",
              "--on-inconclusive", "pass", cwd=tmp_path)
    v = {x["metric"]: x for x in json.loads(p.stdout)["devices"][0]["verdicts"]}
    assert v["memory"]["verdict"] == "pass" and 0.9 < v["memory"]["ratio"] < 1.1, v["memory"]
    with pytest.raises(UsageError, match="fresh_runs"):
        load_gate({"fresh_runs": 2})
    with pytest.raises(UsageError, match="did you mean 'max_increase'"):
        load_gate({"memory": {"max_increse": "10%"}})


def test_latency_on_an_emulated_cpu_is_not_judged_but_accuracy_is():
    # a clear 30% slowdown, measured on a device whose probe says qemu-user: the emulator's speed is no
    # latency measurement, so every latency metric is inconclusive ("not judged"); accuracy is judged
    rng = np.random.default_rng(3)
    spec = load_gate(None)
    real = {v.metric: v.verdict for v in judge(_run_from(rng, 20, 1.3), spec)}
    assert real["p50"] == "regressed"
    run = _run_from(np.random.default_rng(3), 20, 1.3)
    run.fingerprint = {"emulated": True, "emulator": "qemu-user"}
    got = {v.metric: v for v in judge(run, spec)}
    for m in ("p50", "p90", "p99"):
        if m in got:
            assert got[m].verdict == "inconclusive" and "emulated (qemu-user)" in got[m].reason
    unpaired = judge_unpaired([b["ms"] for b in run.blocks if b["arm"] == "A"],
                              [b["ms"] for b in run.blocks if b["arm"] == "B"], spec, emulator="qemu-user")
    assert all(v.verdict == "inconclusive" for v in unpaired if v.metric == "p50")


def test_the_markdown_says_why_an_emulated_latency_was_not_judged():
    from edgeopt.hil.junit import markdown

    verdicts = [{"metric": "p50", "verdict": "inconclusive", "reason": "not judged: the device's CPU is emulated "
                 "(qemu-user); its latency is the emulator's", "ratio": 1.02, "n": 3},
                {"metric": "p90", "verdict": "inconclusive", "reason": "the interval straddles the bound", "n": 3},
                {"metric": "accuracy", "verdict": "pass", "ratio": 1.0, "n": 20}]
    md = markdown({"model": "m", "target": "cpu", "verdict": "pass", "baseline_id": "a" * 20, "candidate_id": "b" * 20,
                   "devices": [{"device": "arm64-emu", "verdicts": verdicts}]})
    assert "| arm64-emu | p50 | ⚠️ not judged (emulated CPU) |" in md
    assert "| arm64-emu | p90 | ⚠️ inconclusive |" in md and "| arm64-emu | accuracy | ✅ pass |" in md
