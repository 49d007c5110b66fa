"""The gate's tail metrics (p90/p99) in the paired design: per-unit quantiles, paired log ratios,
Hodges–Lehmann, bootstrap interval, signed-rank test (issue 37, item 11).

Synthetic paired blocks with a seeded generator: the verdicts follow from the statistics alone, so no
machine load can move them. The blocks carry what a real device shows: a drift shared by both arms of a
round (interleaving cancels it), lognormal noise, and spikes (a block's few slow iterations), which is
what made the pooled percentile ratio's interval ±12–50% on identical bundles.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgeopt.policy.gatefile import load_gate
from edgeopt.policy.stats import MIN_PAIRS, PairedRun, judge, rounds_needed, tail_group


def _blocks(seed: int, rounds: int, slow: float = 1.0, tail_slow: float = 1.0, iters: int = 20,
            noise: float = 0.08, spikes: float = 0.05) -> PairedRun:
    """Rounds of A B / B A blocks. ``slow`` scales every B sample; ``tail_slow`` only B's samples above its
    block's 70th percentile (a slower tail at the same median)."""
    rng = np.random.default_rng(seed)
    blocks = []
    for r in range(rounds):
        drift = 1 + 0.3 * np.sin(r / 3)
        for arm in ("AB" if r % 2 == 0 else "BA"):
            x = drift * rng.lognormal(0, noise, iters)
            hit = rng.random(iters) < spikes
            x[hit] *= rng.uniform(1.5, 4.0, int(hit.sum()))
            if arm == "B":
                x = np.where(x > np.percentile(x, 70), x * tail_slow, x) * slow
            blocks.append({"arm": arm, "ms": list(x)})
    return PairedRun("synthetic", blocks, calls=2, min_calls=2)


def _verdicts(run: PairedRun, spec) -> dict:
    return {v.metric: v for v in judge(run, spec)}


@pytest.mark.parametrize("seed", range(4))
def test_identical_bundles_pass_on_the_tails(seed):
    """A/A with spikes: p90 passes within the default 20-40 rounds (the pooled ratio ended inconclusive
    4 times in 6 on real A/A gates); p99 passes once it has its 662 samples and 6 units when the spikes are
    rarer than 1 in 100; with 2 in 100 its units are the spikes' own spread, and it says how long it needs."""
    spec = load_gate({"p99": {"max_slowdown": "10%"}})
    v = _verdicts(_blocks(seed, 40, spikes=0.02), spec)
    assert v["p50"].verdict == "pass"
    assert v["p90"].verdict == "pass", v["p90"].reason
    assert v["p90"].ci_low < 1 < v["p90"].ci_high  # no change: the interval holds 1
    assert "per-unit p90" in v["p90"].method and "signed-rank" in v["p90"].method
    assert v["p99"].verdict != "regressed"
    if v["p99"].verdict == "inconclusive":
        assert "a decision needs about" in v["p99"].reason
    quiet = _verdicts(_blocks(seed, 40, spikes=0.002), spec)
    assert quiet["p90"].verdict == quiet["p99"].verdict == "pass", quiet["p99"].reason


@pytest.mark.parametrize("seed", range(4))
def test_a_fifteen_percent_slower_tail_is_regressed_at_the_same_median(seed):
    spec = load_gate(None)  # p50 5%, p90 10%
    v = _verdicts(_blocks(seed, 20, tail_slow=1.15), spec)
    assert v["p50"].verdict == "pass"  # the median did not move
    assert v["p90"].verdict == "regressed", v["p90"].reason
    assert v["p90"].ci_low > 1.10 * 0.97 and v["p90"].p_value <= spec.level  # the evidence, not a margin
    assert v["p90"].ratio == pytest.approx(1.15, rel=0.05)


def test_a_uniform_slowdown_is_regressed_on_every_metric():
    spec = load_gate({"p99": {"max_slowdown": "10%"}})
    v = _verdicts(_blocks(7, 40, slow=1.15, spikes=0.0), spec)
    assert v["p50"].verdict == v["p90"].verdict == v["p99"].verdict == "regressed"


def test_units_hold_enough_samples_beyond_the_quantile():
    pairs20 = [(np.ones(20), np.ones(20))] * 8
    assert tail_group(pairs20, 90) == 1  # 20 >= 10 samples per arm
    assert tail_group(pairs20, 99) == 5  # 5 x 20 >= 100
    assert tail_group([(np.ones(5), np.ones(5))] * 8, 90) == 2


def test_too_few_units_or_samples_is_inconclusive_and_says_what_it_needs():
    spec = load_gate({"p99": {"max_slowdown": "10%"}})
    v = _verdicts(_blocks(1, 20), spec)  # 400 samples per arm < 662, and only 4 units of 5 rounds
    assert v["p99"].verdict == "inconclusive" and "662" in v["p99"].reason
    v = _verdicts(_blocks(1, 4), load_gate(None))  # 80 samples (>= 64) but 4 units < MIN_PAIRS
    assert v["p90"].verdict == "inconclusive" and f"judged from {MIN_PAIRS}" in v["p90"].reason


def test_an_undecided_tail_says_how_many_rounds_it_needs():
    """A tail change near the allowed 10% with heavy spikes cannot be told in 12 rounds: the verdict says
    how many paired rounds a decision needs, and more noise needs more."""
    spec = load_gate(None)
    run = _blocks(3, 12, tail_slow=1.08, spikes=0.15, noise=0.15)
    v = _verdicts(run, spec)["p90"]
    assert v.verdict == "inconclusive"
    assert "a decision needs about" in v.reason and "paired rounds (12 measured)" in v.reason
    need, spread, _ = rounds_needed(run, spec, "p90")
    assert need > 12 and spread > 0
    quiet = rounds_needed(_blocks(3, 12, tail_slow=1.08, spikes=0.0, noise=0.03), spec, "p90")
    assert quiet[0] < need


def test_a_reply_that_cannot_be_true_is_not_power_cycled_and_retried():
    """A lying agent stays a liar after a power cycle: the gate fails that device, it does not retry it
    (issue 38); an unreachable one is still worth a cycle."""
    from edgeopt.errors import DeviceError
    from edgeopt.hil.gate import _retryable
    from edgeopt.replies import ReplyNotBelievable

    assert not _retryable(ReplyNotBelievable("liar: the agent's pairbench reply is not believable: p50_ms = -1"))
    assert _retryable(DeviceError("dev: unreachable"))
