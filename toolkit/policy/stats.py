"""The gate's decision: paired rounds → a ratio with an interval and a test per metric → a verdict.

Method (documented in docs/HIL.md, checked by tests/hil/test_gate.py and tests/hil/test_stats_tails.py):

* Data: the ``pairbench`` blocks in the order A B B A …; block 2k and 2k+1 hold one block of each
  arm, measured back to back, so a pair shares the device's momentary state.
* p50 and throughput: per pair the log ratio log(median_B / median_A) (mean for throughput); the
  estimate is the Hodges–Lehmann median of the Walsh averages of those log ratios; its interval is a
  percentile bootstrap over pairs (2,000 resamples, seeded); the test is a Wilcoxon signed-rank
  sign-flip permutation test (4,000 flips, seeded), two-sided.
* p90/p99: the paired design of p50 on per-unit quantiles.  A unit is the fewest consecutive pairs
  whose blocks hold at least 1/(1-q) samples per arm (p90: 10, so one pair of 20-iteration blocks;
  p99: 100, five pairs), so each unit's quantile has samples beyond it; per unit the log ratio
  log(q_B / q_A), then Hodges–Lehmann, the bootstrap interval and the signed-rank test as for p50.
  (The pooled percentile ratio with a pair bootstrap that this replaces gave ±12–50% intervals on
  identical bundles: one block's spike moves a pooled tail, while a per-unit ratio sees it once.)
  Judged only when each arm has at least MLPerf LoadGen's early-stopping minimum (64 samples for p90,
  662 for p99) and MIN_PAIRS units; below that the metric is *inconclusive*, never *pass*.
* A latency metric still inconclusive says how many paired rounds a decision would need at the noise
  seen (``rounds_needed``; the gate adds the seconds from its measured cost per round).
* Holm's step-down correction across the latency metrics gated together, at ``spec.level``.
* Verdicts (``t`` = the metric's allowed change, ``L = 1 + t``): **regressed** when the corrected
  p-value ≤ level *and* the estimate is above ``L`` (evidence and a practical change, as Perfherder,
  asv and Chromeperf demand both); **improved** symmetrically below ``1/L``; **pass** when the whole
  interval lies below ``L``; otherwise **inconclusive** (which buys more rounds, as Pinpoint does).
  ``max_ms`` is an absolute ceiling on the candidate's value, judged when the sample count allows.
* Accuracy is exact, not statistical: each arm's outputs against its own FP32 reference (the
  bundle's bound), the optional ``top1_min``/``cosine_min``, and — when both arms ran the same
  validation inputs — how often the candidate's decisions differ from the baseline's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from edgeopt.policy.gatefile import MIN_SAMPLES, GateSpec

BOOT = 2000
FLIPS = 4000
SEED = 20261122

VERDICT_ORDER = {"regressed": 0, "inconclusive": 1, "pass": 2, "improved": 3}
LATENCY_METRICS = ("p50", "p90", "p99", "throughput")
# The fewest pairs (paired) or blocks per arm (unpaired) a centre metric is judged from: below 6 the
# signed-rank test cannot reach 0.05 at all, and a bootstrap interval over 3-5 pairs is far too
# narrow (seen: a 20%-slower candidate *passed* on 4 pairs, p50 x0.816). A pass needs as much
# evidence as a regression could have.
MIN_PAIRS = 6


@dataclass
class Verdict:
    metric: str
    verdict: str  # pass | regressed | improved | inconclusive
    ratio: float | None = None  # candidate / baseline (latency: > 1 is slower)
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None  # Holm-corrected, two-sided
    n: int = 0  # pairs (p50/throughput) or samples per arm (tails) or validation samples (accuracy)
    method: str = ""
    reason: str = ""
    baseline: float | None = None
    candidate: float | None = None
    threshold: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass
class PairedRun:
    """Raw material of a gate on one device: every block, both arms' facts, where it ran."""

    device: str
    blocks: list[dict[str, Any]] = field(default_factory=list)  # {"arm": "A"|"B", "ms": [...]}
    arms: list[dict[str, Any]] = field(default_factory=list)  # A then B: bundle id, accuracy, decisions…
    calls: int = 0
    elapsed_s: float = 0.0
    environment: list[dict[str, Any]] = field(default_factory=list)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    # Fresh agent processes (calls) a latency verdict needs (``measure_pair`` sets MIN_CALLS); 0 = no rule
    # (a run assembled by hand). Below it every latency metric is *inconclusive*, whatever the budget did.
    min_calls: int = 0
    budget_note: str = ""  # set when the first call showed the budget cannot reach a verdict for this model
    noise_note: str = ""  # set when p50 ended inconclusive: how many rounds a decision needs at this noise

    def pairs(self) -> list[tuple[np.ndarray, np.ndarray]]:
        out = []
        for i in range(0, len(self.blocks) - 1, 2):
            x, y = self.blocks[i], self.blocks[i + 1]
            a, b = (x, y) if x["arm"] == "A" else (y, x)
            if a["arm"] == "A" and b["arm"] == "B":
                out.append((np.asarray(a["ms"], float), np.asarray(b["ms"], float)))
        return out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def hodges_lehmann(x: np.ndarray) -> float:
    i, j = np.triu_indices(len(x))
    return float(np.median((x[i] + x[j]) / 2))


def signed_rank_p(x: np.ndarray, rng: np.random.Generator) -> float:
    """Two-sided Wilcoxon signed-rank p-value by random sign flips (exact enough for a gate)."""
    x = x[x != 0]
    if len(x) == 0:
        return 1.0
    ranks = np.argsort(np.argsort(np.abs(x))) + 1.0
    stat = abs(float(np.sum(np.sign(x) * ranks)))
    signs = rng.choice((-1.0, 1.0), size=(FLIPS, len(x)))
    null = np.abs(signs @ ranks)
    return float((np.sum(null >= stat - 1e-9) + 1) / (FLIPS + 1))


def _paired_log_ratios(pairs: list[tuple[np.ndarray, np.ndarray]], stat: str) -> np.ndarray:
    f = np.median if stat == "median" else np.mean
    return np.array([math.log(f(b) / f(a)) for a, b in pairs if f(a) > 0 and f(b) > 0])


def _hl_interval(lr: np.ndarray, rng) -> tuple[float, float, float, float, int]:
    """Hodges–Lehmann of paired log ratios, its percentile-bootstrap 95% interval and the signed-rank p."""
    n = len(lr)
    est = hodges_lehmann(lr)
    idx = rng.integers(0, n, size=(BOOT, n))
    boots = np.array([hodges_lehmann(lr[row]) for row in idx[:400]]) if n > 60 else \
        np.array([hodges_lehmann(lr[row]) for row in idx])
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return math.exp(est), math.exp(lo), math.exp(hi), signed_rank_p(lr, rng), n


def _center_metric(pairs, stat: str, rng) -> tuple[float, float, float, float, int]:
    lr = _paired_log_ratios(pairs, stat)
    n = len(lr)
    if n < 2:
        return float("nan"), float("nan"), float("nan"), 1.0, n
    return _hl_interval(lr, rng)


def tail_group(pairs: list[tuple[np.ndarray, np.ndarray]], q: float) -> int:
    """Consecutive pairs per tail unit: the fewest whose blocks hold at least 1/(1-q) samples per arm (p90: 10,
    p99: 100), so a unit's q-quantile has samples beyond it instead of being its maximum."""
    per_pair = min((min(len(a), len(b)) for a, b in pairs), default=0)
    if per_pair <= 0:
        return 1
    want = math.ceil(1 / (1 - q / 100) - 1e-9)
    return max(1, math.ceil(want / per_pair))


def _tail_log_ratios(pairs: list[tuple[np.ndarray, np.ndarray]], q: float) -> np.ndarray:
    """Per unit (``tail_group`` consecutive pairs): log(q-quantile of B's samples / of A's)."""
    g = tail_group(pairs, q)
    out = []
    for i in range(0, len(pairs) - g + 1, g):
        a = np.concatenate([x for x, _ in pairs[i:i + g]])
        b = np.concatenate([y for _, y in pairs[i:i + g]])
        qa, qb = float(np.percentile(a, q)), float(np.percentile(b, q))
        if qa > 0 and qb > 0:
            out.append(math.log(qb / qa))
    return np.array(out)


def _tail_metric(pairs, q: float, rng) -> tuple[float, float, float, float, int, int]:
    """(ratio, CI low, CI high, p, samples per arm, units): the paired design of p50 on per-unit quantiles."""
    n = int(min(sum(len(a) for a, _ in pairs), sum(len(b) for _, b in pairs))) if pairs else 0
    lr = _tail_log_ratios(pairs, q)
    if len(lr) < 2:
        return float("nan"), float("nan"), float("nan"), 1.0, n, len(lr)
    r, lo, hi, p, units = _hl_interval(lr, rng)
    return r, lo, hi, p, n, units


def holm(pvalues: list[float]) -> list[float]:
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adj = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adj[i] = running
    return adj


def judge(run: PairedRun, spec: GateSpec) -> list[Verdict]:
    """One verdict per gated metric (latency metrics, throughput, accuracy, decisions)."""
    rng = np.random.default_rng(SEED)
    pairs = run.pairs()
    raw: list[tuple[str, tuple, float, float | None, str]] = []
    units: dict[str, int] = {}
    for name, thr in spec.latency.items():
        q = {"p50": 50, "p90": 90, "p99": 99}[name]
        if name == "p50":
            res = _center_metric(pairs, "median", rng)
            method = "Hodges-Lehmann on paired log ratios of block medians; bootstrap 95% CI; signed-rank test"
        else:
            *res, units[name] = _tail_metric(pairs, q, rng)
            g = tail_group(pairs, q)
            method = (f"Hodges-Lehmann on paired log ratios of per-unit p{q} ({g} paired round(s) per unit); "
                      "bootstrap 95% CI; signed-rank test")
        raw.append((name, res, 1 + (thr.max_change if thr.max_change is not None else 0.05), thr.max_ms, method))
    if spec.throughput_max_drop is not None:
        res = _center_metric(pairs, "mean", rng)
        raw.append(("throughput", res, 1 / (1 - spec.throughput_max_drop) if spec.throughput_max_drop < 1 else
                    float("inf"), None, "Hodges-Lehmann on paired log ratios of block mean latency (1/throughput)"))
    all_a = np.concatenate([a for a, _ in pairs]) if pairs else np.array([])
    all_b = np.concatenate([b for _, b in pairs]) if pairs else np.array([])
    out = _latency_verdicts(raw, spec, all_a, all_b, units=units)
    for v in out:  # what an undecided metric would need at this noise
        if v.verdict == "inconclusive":
            got = rounds_needed(run, spec, v.metric)
            if got is not None:
                v.reason += (f"; at this noise a decision needs about {got[0]} paired rounds ({len(pairs)} measured)"
                             if got[0] <= 10000 else "; the estimate is about the allowed change: no practical "
                             "number of rounds decides it")
    few_calls(out, run.calls, run.min_calls, run.budget_note)
    not_on_emulation(out, emulated_by(run))
    not_judged(out, other_vendor(run))
    out.extend(_accuracy_verdicts(run, spec))
    return out


def emulated_by(run: PairedRun) -> str | None:
    """The emulator behind this run's device (``qemu-user`` …) when the probe or any call's environment
    says the CPU is emulated, else None."""
    for facts in [run.fingerprint, *run.environment]:
        if (facts or {}).get("emulated"):
            return str(facts.get("emulator") or "an emulator")
    return None


def not_on_emulation(verdicts: list[Verdict], emulator: str | None) -> list[Verdict]:
    """Latency on an emulated CPU is the emulator's speed, not the device's: every latency metric is
    *inconclusive* ("not judged"), whatever the rounds said; accuracy is judged as everywhere."""
    if not emulator:
        return verdicts
    return not_judged(verdicts, f"the device's CPU is emulated ({emulator}); its latency is the emulator's speed, "
                                "not a measurement")


def other_vendor(run: PairedRun) -> str | None:
    """Why this run's latency is not the target's hardware: set by the measuring side (``hil.paired``,
    from the bundles' target and the probe's CPU: an intel-cpu bundle on an AMD CPU) as
    ``fingerprint["other_vendor"]``, else None."""
    why = (run.fingerprint or {}).get("other_vendor")
    return str(why) if why else None


def not_judged(verdicts: list[Verdict], why: str | None) -> list[Verdict]:
    """Every latency metric becomes *inconclusive* with the reason "not judged: WHY" (what the rounds said
    kept in the reason); accuracy and decisions are judged as everywhere."""
    if not why:
        return verdicts
    for v in verdicts:
        if v.metric in LATENCY_METRICS and not v.reason.startswith("not judged"):
            v.reason = f"not judged: {why} (the rounds said {v.verdict})"
            v.verdict = "inconclusive"
    return verdicts


def rounds_needed(run: PairedRun, spec: GateSpec, metric: str = "p50") -> tuple[int, float, float] | None:
    """From the pairs so far: (paired rounds a decision on ``metric`` needs at this noise, per-unit spread of
    its log ratio, the estimate's distance from the allowed change), or None without MIN_PAIRS units or a
    threshold for it.  Normal approximation: the 95% interval's half-width 1.96·s/√n must come below that
    distance; a tail's units are ``tail_group`` pairs each, and its sample minimum (MIN_SAMPLES) counts too."""
    thr = spec.latency.get(metric)
    pairs = run.pairs()
    if thr is None or metric not in ("p50", "p90", "p99"):
        return None
    if metric == "p50":
        lr, g = _paired_log_ratios(pairs, "median"), 1
    else:
        q = {"p90": 90, "p99": 99}[metric]
        lr, g = _tail_log_ratios(pairs, q), tail_group(pairs, q)
    if len(lr) < MIN_PAIRS:
        return None
    s = float(np.std(lr, ddof=1))
    est = hodges_lehmann(lr)
    dist = abs(est - math.log(1 + (thr.max_change if thr.max_change is not None else 0.05)))
    if dist < 1e-6:
        return 10**9, s, dist
    need = max(MIN_PAIRS, math.ceil((1.96 * s / dist) ** 2)) * g
    per_pair = min((min(len(a), len(b)) for a, b in pairs), default=0)
    if metric != "p50" and per_pair:
        need = max(need, math.ceil(MIN_SAMPLES[metric] / per_pair))
    return need, s, dist


def few_calls(verdicts: list[Verdict], calls: int, min_calls: int, note: str = "") -> list[Verdict]:
    """No latency verdict from fewer than ``min_calls`` fresh processes: every latency metric becomes
    *inconclusive* with the reason (what it would have said is kept in the reason), never pass/regressed."""
    if calls >= min_calls:
        return verdicts
    for v in verdicts:
        if v.metric in LATENCY_METRICS and v.verdict != "inconclusive":
            v.reason = (f"only {calls} agent call(s) within the budget; latency is judged from {min_calls} fresh "
                        f"processes (one process can be a few % off for its whole life) — it would have said "
                        f"{v.verdict}: {v.reason}")
            v.verdict = "inconclusive"
        elif v.metric in LATENCY_METRICS and f"{min_calls} fresh processes" not in v.reason:
            v.reason = f"only {calls} agent call(s) within the budget (needs {min_calls}); {v.reason}"
        if note and v.metric in LATENCY_METRICS:
            v.reason += f"; {note}"
    return verdicts


def _latency_verdicts(raw: list, spec: GateSpec, all_a: np.ndarray, all_b: np.ndarray,
                      ci: str = "95%", unit: str = "paired rounds", widen: float = 0.0,
                      units: dict[str, int] | None = None) -> list[Verdict]:
    """Holm across the latency metrics, then each metric's verdict from (ratio, interval, p, n).  ``widen``
    (unpaired): the interval is stretched by that fraction each way, and *regressed*/*improved* also need
    the stretched interval to exclude 1 (a change beyond session-to-session variation).  ``units`` (paired
    tails): the per-unit ratios a tail was judged from; fewer than MIN_PAIRS is inconclusive."""
    adj = holm([r[1][3] for r in raw]) if raw else []
    out = []
    for (name, (r, lo, hi, _p, n), limit, max_ms, method), p in zip(raw, adj):
        if widen and not math.isnan(lo):
            lo, hi = lo / (1 + widen), hi * (1 + widen)
        v = Verdict(name, "inconclusive", r, lo, hi, p, n, method, threshold=limit - 1)
        need = MIN_SAMPLES.get(name, 2)
        if name in ("p90", "p99"):
            q = 90 if name == "p90" else 99
            if n:
                v.baseline, v.candidate = float(np.percentile(all_a, q)), float(np.percentile(all_b, q))
        elif name == "p50" and n:
            v.baseline, v.candidate = float(np.median(all_a)), float(np.median(all_b))
        elif name == "throughput" and n:
            v.baseline, v.candidate = 1000 / float(np.mean(all_a)), 1000 / float(np.mean(all_b))
        if (n < need) if name in ("p90", "p99") else (n < MIN_PAIRS):
            v.reason = (f"{n} samples per arm; {name} is judged from {need}" if name in ("p90", "p99")
                        else f"only {n} {unit}; judged from {MIN_PAIRS}")
        elif units is not None and name in units and units[name] < MIN_PAIRS:
            v.reason = f"only {units[name]} units of paired rounds for {name}; judged from {MIN_PAIRS}"
        elif math.isnan(r):
            v.reason = "no data"
        elif max_ms is not None and v.candidate is not None and v.candidate > max_ms:
            v.verdict, v.reason = "regressed", f"candidate {name} {v.candidate:.3f} ms > max_ms {max_ms:g}"
        elif p <= spec.level and r > limit and not (widen and lo <= 1):
            v.verdict = "regressed"
            v.reason = f"{(r - 1) * 100:+.1f}% (CI {(lo - 1) * 100:+.1f}..{(hi - 1) * 100:+.1f}%), p={p:.3g} ≤ " \
                       f"{spec.level:g}, beyond the allowed {(limit - 1) * 100:.1f}%"
        elif p <= spec.level and r < 1 / limit and not (widen and hi >= 1):
            v.verdict, v.reason = "improved", f"{(r - 1) * 100:+.1f}% (p={p:.3g})"
        elif hi <= limit:
            v.verdict = "pass"
            v.reason = f"{(r - 1) * 100:+.1f}%; the {ci} CI's upper end {(hi - 1) * 100:+.1f}% is within " \
                       f"{(limit - 1) * 100:.1f}%"
        else:
            v.reason = f"{(r - 1) * 100:+.1f}% (CI {(lo - 1) * 100:+.1f}..{(hi - 1) * 100:+.1f}%, p={p:.3g}): " \
                       "cannot tell yet"
        out.append(v)
    return out



# --- unpaired: the candidate against a stored baseline's rounds ---------------------------------------
UNPAIRED_CI = (0.5, 99.5)  # a 99% interval: another session, another day: wider than the paired 95%


def _hl2(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sample Hodges–Lehmann shift: the median of every y_j - x_i."""
    return float(np.median(np.subtract.outer(y, x)))


def _mann_whitney_p(x: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> float:
    """Two-sided Mann–Whitney U p-value by random relabelling (FLIPS permutations)."""
    z = np.concatenate([x, y])
    n = len(x)
    ranks = np.argsort(np.argsort(z, kind="stable"), kind="stable") + 1.0
    expect = n * (len(z) + 1) / 2
    stat = abs(float(ranks[:n].sum()) - expect)
    perms = np.argsort(rng.random((FLIPS, len(z))), axis=1)[:, :n]
    null = np.abs(ranks[perms].sum(axis=1) - expect)
    return float((np.sum(null >= stat - 1e-9) + 1) / (FLIPS + 1))


def _unpaired_center(a_blocks, b_blocks, stat: str, rng) -> tuple[float, float, float, float, int]:
    f = np.median if stat == "median" else np.mean
    la = np.log([f(x) for x in a_blocks if len(x) and f(x) > 0])
    lb = np.log([f(x) for x in b_blocks if len(x) and f(x) > 0])
    n = int(min(len(la), len(lb)))
    if n < 2:
        return float("nan"), float("nan"), float("nan"), 1.0, n
    est = _hl2(la, lb)
    boots = np.array([_hl2(la[rng.integers(0, len(la), len(la))], lb[rng.integers(0, len(lb), len(lb))])
                      for _ in range(BOOT)])
    lo, hi = np.percentile(boots, UNPAIRED_CI)
    return math.exp(est), math.exp(lo), math.exp(hi), _mann_whitney_p(la, lb, rng), n


def _unpaired_tail(a_blocks, b_blocks, q: float, rng) -> tuple[float, float, float, float, int]:
    a_all, b_all = np.concatenate(a_blocks), np.concatenate(b_blocks)
    n = int(min(len(a_all), len(b_all)))
    if n == 0:
        return float("nan"), float("nan"), float("nan"), 1.0, 0
    est = math.log(np.percentile(b_all, q) / np.percentile(a_all, q))
    boots = np.empty(BOOT // 2)
    for r in range(len(boots)):
        a = np.concatenate([a_blocks[i] for i in rng.integers(0, len(a_blocks), len(a_blocks))])
        b = np.concatenate([b_blocks[i] for i in rng.integers(0, len(b_blocks), len(b_blocks))])
        boots[r] = math.log(np.percentile(b, q) / np.percentile(a, q))
    lo, hi = np.percentile(boots, UNPAIRED_CI)
    p = min(1.0, 2 * min(np.mean(boots <= 0), np.mean(boots >= 0)) + 1 / len(boots))
    return math.exp(est), math.exp(lo), math.exp(hi), float(p), n


def judge_unpaired(baseline_blocks: list[list[float]], candidate_blocks: list[list[float]], spec: GateSpec,
                   candidate_arm: dict[str, Any] | None = None, speed: float | None = None, calls: int = 0,
                   min_calls: int = 0, budget_note: str = "", emulator: str | None = None,
                   other_vendor: str | None = None) -> list[Verdict]:
    """The candidate's blocks (measured now) against a stored baseline's blocks (measured in another session):
    independent samples, so a two-sample Hodges–Lehmann shift of log block medians with a 99% bootstrap
    interval (each arm resampled on its own) and a Mann–Whitney test; tails as pooled percentiles with a
    99% block bootstrap; every interval then widened by ``spec.session_margin`` each way (what one stored
    session cannot show: the variation between sessions).  Holm and the verdict rules are the paired
    gate's, plus: regressed/improved need the widened interval to exclude no change.  ``speed``: the
    device's calibration time now over its time when the baseline was measured; beyond
    ``spec.max_speed_change`` a slower device cannot make a *regressed* and a faster one cannot make a
    *pass* or *improved* (those become *inconclusive*, saying why).  Accuracy: the candidate's own
    bound (no baseline outputs to compare decisions with)."""
    rng = np.random.default_rng(SEED)
    a_blocks = [np.asarray(b, float) for b in baseline_blocks if len(b)]
    b_blocks = [np.asarray(b, float) for b in candidate_blocks if len(b)]
    raw: list[tuple[str, tuple, float, float | None, str]] = []
    for name, thr in spec.latency.items():
        if name == "p50":
            res = _unpaired_center(a_blocks, b_blocks, "median", rng)
            method = ("UNPAIRED against stored rounds: two-sample Hodges-Lehmann on log block medians; "
                      "bootstrap 99% CI; Mann-Whitney test")
        else:
            q = {"p90": 90, "p99": 99}[name]
            res = _unpaired_tail(a_blocks, b_blocks, q, rng)
            method = f"UNPAIRED against stored rounds: pooled p{q} ratio; block-bootstrap 99% CI and p-value"
        raw.append((name, res, 1 + (thr.max_change if thr.max_change is not None else 0.05), thr.max_ms, method))
    if spec.throughput_max_drop is not None:
        res = _unpaired_center(a_blocks, b_blocks, "mean", rng)
        raw.append(("throughput", res, 1 / (1 - spec.throughput_max_drop) if spec.throughput_max_drop < 1 else
                    float("inf"), None, "UNPAIRED: two-sample Hodges-Lehmann on log block means; bootstrap 99% CI"))
    all_a = np.concatenate(a_blocks) if a_blocks else np.array([])
    all_b = np.concatenate(b_blocks) if b_blocks else np.array([])
    out = _latency_verdicts(raw, spec, all_a, all_b, ci=f"99%+{spec.session_margin * 100:g}%", unit="rounds per arm",
                            widen=spec.session_margin)
    if speed is not None and speed > 0:
        why = f"the device is {(speed - 1) * 100:+.1f}% on the calibration workload against when the baseline " \
              f"was measured (allowed {spec.max_speed_change * 100:g}%)"
        for v in out:
            slower, faster = speed > 1 + spec.max_speed_change, speed < 1 / (1 + spec.max_speed_change)
            if (slower and v.verdict == "regressed") or (faster and v.verdict in ("pass", "improved")):
                v.reason = f"would be {v.verdict} ({v.reason}), but {why}"
                v.verdict = "inconclusive"
    few_calls(out, calls, min_calls, budget_note)
    not_on_emulation(out, emulator)  # ``emulator``: ``emulated_by(run)`` of the candidate's run
    not_judged(out, other_vendor)  # ``other_vendor(run)`` of the candidate's run
    if candidate_arm is not None:
        out.extend(_accuracy_verdicts(PairedRun("unpaired", arms=[{}, candidate_arm]), spec))
        out = [v for v in out if v.metric != "decisions"]
    return out


def _accuracy_verdicts(run: PairedRun, spec: GateSpec) -> list[Verdict]:
    if len(run.arms) != 2:
        return []
    a, b = run.arms
    acc = b.get("accuracy") or {}
    out = []
    cos = _worst(acc, "cosine")
    top1 = _worst(acc, "top1")
    v = Verdict("accuracy", "pass" if acc.get("passed", True) else "regressed", n=int(acc.get("samples") or 0),
                method="exact: the candidate's outputs against its own FP32 reference (the bundle's bound)")
    v.candidate, v.baseline = (top1 if top1 is not None else cos), _worst(a.get("accuracy") or {}, "top1")
    reasons = [] if acc.get("passed", True) else [f"fails its bound ({acc.get('summary') or 'see metrics'})"]
    if spec.top1_min is not None and top1 is not None and top1 < spec.top1_min:
        reasons.append(f"top-1 agreement {top1:.3f} < top1_min {spec.top1_min:g}")
    if spec.cosine_min is not None and cos is not None and cos < spec.cosine_min:
        reasons.append(f"cosine {cos:.5f} < cosine_min {spec.cosine_min:g}")
    seq = _worst(acc, "seq_match")
    if spec.seq_match_min is not None and seq is not None and seq < spec.seq_match_min:
        reasons.append(f"CTC decodings equal to the FP32 reference's {seq:.1%} < seq_match_min {spec.seq_match_min:g}")
    if reasons:
        v.verdict, v.reason = "regressed", "; ".join(reasons)
    else:
        v.reason = f"within its bound over {v.n} validation samples"
    out.append(v)
    da, db = a.get("decisions"), b.get("decisions")
    if da is not None and db is not None and getattr(spec, "decisions_gated", True):
        n = min(len(da), len(db))
        diff = sum(1 for x, y in zip(da, db) if x != y)
        rate = diff / n if n else 0.0
        limit = spec.max_disagreement if spec.max_disagreement is not None else 0.05
        kind = b.get("decisions_kind") or a.get("decisions_kind") or ""
        what = {"ctc_time_major": "CTC decodings (the text read)", "ctc_batch_major": "CTC decodings (the text read)",
                "decision": "thresholded decisions", "probability": "decisions at the probability threshold",
                "detection": "boxes (matched one to one, same class, IoU >= 0.5, over the larger set of each "
                             "image: the build check's box_match)",
                "label": "labels"}.get(kind, "argmax decisions")
        unit = "boxes" if kind == "detection" else "validation samples"
        d = Verdict("decisions", "pass" if rate <= limit else "regressed", rate, n=n, threshold=limit,
                    method=f"exact: {what} of the first output, candidate vs baseline, on the baseline's "
                           "validation inputs",
                    reason=f"{diff} of {n} {unit} decided differently (allowed {limit * 100:g}%)")
        out.append(d)
    return out


def _worst(acc: dict[str, Any], key: str) -> float | None:
    """A metric of a compare result (``outputs.<name>.metrics.<key>``), the worst output's."""
    vals = [float(o["metrics"][key]) for o in (acc.get("outputs") or {}).values()
            if isinstance(o, dict) and isinstance((o.get("metrics") or {}).get(key), (int, float))]
    return min(vals) if vals else None


def overall(verdicts: list[Verdict]) -> str:
    """The worst verdict wins: regressed > inconclusive > pass > improved (improved only if all improve or pass)."""
    if not verdicts:
        return "inconclusive"
    worst = min(verdicts, key=lambda v: VERDICT_ORDER[v.verdict]).verdict
    if worst == "pass" and any(v.verdict == "improved" for v in verdicts):
        return "improved" if all(v.verdict in ("improved", "pass") for v in verdicts) else "pass"
    return worst


def decided(verdicts: list[Verdict]) -> bool:
    return all(v.verdict != "inconclusive" for v in verdicts)
