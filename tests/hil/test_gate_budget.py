"""No verdict from one call, the whole-gate budget, the gate file's per-key defaults, --on-inconclusive.

Real parts: the PP-OCR text-orientation classifier and its real slower variant (tests/hil/models.py:
a zero-valued side branch, ~+25% time, same outputs), the real agent's ``pairbench`` on ``local``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeopt.errors import UsageError
from edgeopt.policy.gatefile import load_gate
from edgeopt.policy.stats import MIN_PAIRS, PairedRun, judge


def _run(rng, rounds: int, slowdown: float, calls: int, min_calls: int, iters: int = 20) -> PairedRun:
    blocks = []
    for r in range(rounds):
        for arm in ("AB" if r % 2 == 0 else "BA"):
            blocks.append({"arm": arm, "ms": list((slowdown if arm == "B" else 1.0) * rng.lognormal(0, 0.03, iters))})
    return PairedRun("synthetic", blocks, calls=calls, min_calls=min_calls)


def test_one_call_or_too_few_pairs_is_never_a_latency_verdict():
    rng = np.random.default_rng(4)
    spec = load_gate(None)
    # 20 clean rounds of a 20% slowdown: regressed from two calls ...
    two = {v.metric: v for v in judge(_run(rng, 20, 1.2, calls=2, min_calls=2), spec)}
    assert two["p50"].verdict == "regressed"
    # ... inconclusive from one, with the reason (and what it would have said)
    one = {v.metric: v for v in judge(_run(rng, 20, 1.2, calls=1, min_calls=2), spec)}
    assert one["p50"].verdict == "inconclusive" and one["p90"].verdict == "inconclusive"
    assert "only 1 agent call" in one["p50"].reason and "would have said regressed" in one["p50"].reason
    assert 1.15 < one["p50"].ratio < 1.25  # the figures are kept, only the verdict is withheld
    # the same for the same speed: never a pass from one call
    same = {v.metric: v for v in judge(_run(rng, 20, 1.0, calls=1, min_calls=2), spec)}
    assert same["p50"].verdict == "inconclusive"
    # fewer pairs than MIN_PAIRS: inconclusive however many calls
    few = {v.metric: v for v in judge(_run(rng, MIN_PAIRS - 2, 0.8, calls=3, min_calls=2), spec)}
    assert few["p50"].verdict == "inconclusive" and f"judged from {MIN_PAIRS}" in few["p50"].reason


def test_gate_file_keys_keep_their_defaults_and_off_ungates():
    spec = load_gate({"p90": {"max_slowdown": "15%"}})  # naming only p90 keeps p50 gated at 5%
    assert {k: t.max_change for k, t in spec.latency.items()} == {"p50": 0.05, "p90": 0.15}
    spec = load_gate({"p99": {"max_ms": 20}})  # p99 added at its default slowdown, the defaults kept
    assert {k: t.max_change for k, t in spec.latency.items()} == {"p50": 0.05, "p90": 0.10, "p99": 0.10}
    spec = load_gate({"p50": "off", "p90": False, "decisions": "off"})  # YAML's off parses as False too
    assert spec.latency == {} and spec.decisions_gated is False
    assert "p50" in load_gate({"p50": {"max_ms": 5}}).latency and load_gate({"p50": {"max_ms": 5}}).latency[
        "p50"].max_change == 0.05


@pytest.mark.parametrize("data, message", [
    ({"p50": {"max_slowdown": 10}}, "did you mean 10%"),
    ({"throughput": {"max_drop": 5}}, "did you mean 5%"),
    ({"accuracy": {"top1_min": 99}}, "did you mean 99%"),
    ({"accuracy": "off"}, "accuracy cannot be off"),
])
def test_footguns_in_the_gate_file_are_refused(data, message):
    with pytest.raises(UsageError, match=message):
        load_gate(data)


def test_gate_file_from_yaml_with_off(tmp_path):
    p = tmp_path / "gate.yaml"
    p.write_text("p90: off\np99: {max_slowdown: 20%}\n")
    assert list(load_gate(p).latency) == ["p50", "p99"]
    p.write_text("p50: {max_slowdown: 10}\n")
    with pytest.raises(UsageError, match="did you mean 10%"):
        load_gate(p)


def test_a_budget_for_one_call_is_inconclusive_on_a_slower_candidate_every_time(gate_bundles, tmp_path):
    """The real ~25%-slower candidate with a budget that allows one agent call: 5 runs, every one
    *inconclusive* (never pass, never a verdict drawn from one process), each saying which budget would do."""
    from edgeopt.hil.gate import run_gate
    from edgeopt.inventory import local_device

    dev = local_device(str(tmp_path / "agent-root"))
    spec = load_gate(None)
    seen = []
    for _ in range(5):
        lines: list[str] = []
        res = run_gate(gate_bundles["slow"], gate_bundles["base"], [dev], spec, budget_s=1.0, progress=lines.append)
        d = res["devices"][0]
        p50 = next(v for v in d["verdicts"] if v["metric"] == "p50")
        seen.append((res["verdict"], d["calls"], p50["reason"][:80]))
        assert res["verdict"] == "inconclusive" and res["exit_code"] == 6, seen
        assert d["calls"] == 1 and p50["verdict"] == "inconclusive" and "agent call" in p50["reason"]
        assert "cannot reach a latency verdict" in d["budget_note"] and "--budget" in d["budget_note"]
        assert sum("cannot reach a latency verdict" in x for x in lines) == 1  # said once, up front


def _gate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", "gate", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def test_on_inconclusive_pause_fail_pass_and_the_old_name(gate_bundles, tmp_path):
    base, slow = str(gate_bundles["base"]), str(gate_bundles["slow"])
    codes = {}
    for policy in ("pause", "exit6", "fail", "pass"):
        p = _gate(slow, "--baseline", base, "--budget", "1s", "--on-inconclusive", policy, "--json", "--db", "r.db",
                  cwd=tmp_path)
        res = json.loads(p.stdout)
        assert res["verdict"] == "inconclusive", p.stderr[-1500:]
        codes[policy] = p.returncode
    assert codes == {"pause": 6, "exit6": 6, "fail": 5, "pass": 0}
    assert "cannot reach a latency verdict" in p.stderr and "Traceback" not in p.stderr
    p = _gate(slow, "--baseline", base, "--on-inconclusive", "maybe", cwd=tmp_path)
    assert p.returncode == 2 and "pause" in p.stderr
    from edgeopt.hil.gate import on_inconclusive_policy

    assert on_inconclusive_policy("continue") == "pass"
    with pytest.raises(UsageError, match="pause, fail or pass"):
        on_inconclusive_policy("exit5")


def test_rounds_needed_grows_with_noise_and_nearness_to_the_threshold():
    from edgeopt.policy.stats import rounds_needed

    spec = load_gate(None)
    rng = np.random.default_rng(9)

    def run(slowdown: float, noise: float, rounds: int = 12) -> PairedRun:
        blocks = []
        for r in range(rounds):
            for arm in ("AB" if r % 2 == 0 else "BA"):
                f = (slowdown if arm == "B" else 1.0) * rng.lognormal(0, noise)  # a per-block shift: round noise
                blocks.append({"arm": arm, "ms": list(f * rng.lognormal(0, 0.01, 20))})
        return PairedRun("synthetic", blocks, calls=2, min_calls=2)

    quiet, noisy = rounds_needed(run(1.0, 0.01), spec), rounds_needed(run(1.0, 0.08), spec)
    assert quiet and noisy and noisy[0] > quiet[0] and noisy[1] > quiet[1]
    near = rounds_needed(run(1.05, 0.04), spec)  # a change of about the allowed 5%: hard to decide
    assert near[0] > noisy[0] / 4 and near[2] < 0.03
    assert rounds_needed(run(1.0, 0.01, rounds=MIN_PAIRS - 1), spec) is None
