"""Sequential paired measurement on one device: the HIL gate's and the rollout's latency comparison.

``measure_pair`` asks the device's agent (``pairbench``) for rounds of interleaved A B B A blocks,
judges after each call, and asks for more only while a gated metric is still inconclusive — up to
``spec.rounds_max`` rounds or the time budget.  Both bundles must already be installed on the device.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from edgeopt.errors import DeviceError
from edgeopt.policy.gatefile import GateSpec
from edgeopt.policy.stats import (
    MIN_PAIRS,
    PairedRun,
    decided,
    emulated_by,
    judge,
    judge_unpaired,
    other_vendor,
    rounds_needed,
)

# A verdict is never drawn from one process: two ONNX Runtime sessions of the *same* bundle can differ
# by a few percent for the life of the process (seen: one variant's 100-round reference in one child
# measured +2.5%, +2.8%, +7.0% and +8.8% in four bench runs), which blocks inside one child cannot
# show. Each call is a fresh child, so at least two calls put that variation into the rounds.
MIN_CALLS = 2


class AgentFailed(DeviceError):
    """The agent answered, with an error (the bundle failed to load or run): not a hang, never retried."""


def vendor_mismatch(target: str | None, cpu_model: str | None) -> str | None:
    """Why a latency of a ``target`` bundle measured on this CPU is not the target's hardware's (an intel-cpu
    bundle on an AMD CPU: OpenVINO's kernels for another vendor), or None; the report's rule
    (``edgeopt.decide.device_truth``: ``other-vendor``)."""
    from edgeopt.decide import TARGET_VENDOR, cpu_vendor

    want, got = TARGET_VENDOR.get(str(target)), cpu_vendor(cpu_model)
    if not want or not got or got == want:
        return None
    return (f"measured on another vendor's CPU ({target} artifact on {cpu_model}, not {want}); its latency says "
            f"nothing of the {want} hardware the target is for")


def fingerprint(probe: dict[str, Any] | None, arm: dict[str, Any]) -> dict[str, Any]:
    """What must match for two runs to be comparable: runtime versions, kernel, CPU, clocks; and, when the
    CPU is another vendor's than the bundle's target is for, why its latency is not judged."""
    p = probe or {}
    env = p.get("environment") or {}
    cpu = (p.get("cpu") or {}).get("model") if isinstance(p.get("cpu"), dict) else None
    why = vendor_mismatch(arm.get("target"), cpu)
    return {**({"other_vendor": why} if why else {}), "kernel": p.get("kernel"), "cpu": (p.get("cpu") or {}).get("model"),
            "governor": env.get("governor"), "runtimes": {k: v for k, v in (p.get("runtimes") or {}).items() if v},
            "runner": (arm.get("runner") or {}).get("runtime"), "runner_version": (arm.get("runner") or {}).get("version"),
            "threads": (arm.get("runner") or {}).get("threads"),
            **({"emulated": True, "emulator": p.get("emulator")} if p.get("emulated") else {}),
            **({"power_mode": jet.get("power_mode"), "clocks_locked": jet.get("clocks_locked")}
               if (jet := p.get("jetson")) else {})}


class _Budget:
    """The time a sequential measurement may still spend, learnt from its first call.

    Each agent call costs a fixed part (a fresh child: start, load both bundles, the accuracy pass,
    warm-up) plus the timed rounds. The first call's timed part is held to a third of what is left
    (its start-up cost is not known yet) so a second call can fit; after it, the measured costs say whether another call can add rounds before
    ``deadline - reserve`` (``reserve_calls`` fixed parts are kept back for fresh processes after the
    rounds), and, when MIN_CALLS calls cannot fit, what budget would (``note``, said once)."""

    def __init__(self, budget_s: float, reserve_calls: float = 0.0, started_at: float | None = None) -> None:
        self.t0 = time.monotonic()
        self.deadline = self.t0 + budget_s
        self.budget_s = budget_s
        self.started_at = self.t0 if started_at is None else started_at
        self.reserve_calls = reserve_calls
        self.overhead_s: float | None = None  # fixed part of one call
        self.round_s: float | None = None  # one paired round (both blocks, settle runs included)
        self.first_call_s = 0.0
        self.note = ""

    def left(self) -> float:
        reserve = self.reserve_calls * (self.overhead_s or 0.0)
        return self.deadline - time.monotonic() - reserve

    def learn(self, call_s: float, pb: dict[str, Any], rounds_per_block_pair: float = 1.0) -> None:
        blocks = pb.get("blocks") or []
        timed = max((float(b.get("t") or 0) for b in blocks), default=0.0)
        rounds = len(blocks) / 2 * rounds_per_block_pair
        if self.overhead_s is None:
            self.first_call_s = call_s
            if not rounds:  # not one whole round within the call's budget: a round takes at least that long
                timed = float((pb.get("options") or {}).get("budget_s") or 0.0)
                self.round_s = max(timed, 1e-3)
            else:
                self.round_s = timed / rounds
            self.overhead_s = max(0.0, call_s - timed)

    def agent_budget(self, calls: int) -> float | None:
        """Seconds of timed rounds the next call may spend, or None: no call can add a round in time."""
        left = self.left()
        if calls == 0:  # the start-up cost is not known yet: a third of what is left, so a second call fits
            return max(0.5, left / (MIN_CALLS + 1))
        timed = left - (self.overhead_s or 0.0)
        if timed < (self.round_s or 0.0) or timed <= 0:
            return None
        return timed

    def cannot_reach(self, calls: int, pairs: int, device: str, force: bool = False) -> str:
        """After the first call: '' when MIN_CALLS calls and MIN_PAIRS pairs fit in what is left, else the
        one line saying they cannot and which --budget would. ``force``: no further call fits, so say it
        whenever calls or pairs are short."""
        if self.note or self.overhead_s is None or self.round_s is None:
            return ""
        o, r = self.overhead_s, self.round_s
        need_now = max(0, MIN_CALLS - calls) * (o + r) + max(0, MIN_PAIRS - pairs - max(0, MIN_CALLS - calls)) * r
        short = calls < MIN_CALLS or pairs < MIN_PAIRS
        if not short or (not force and need_now <= self.left()):
            return ""
        before = self.t0 - self.started_at  # connecting, probing, pushing: before the first call
        reserve = self.reserve_calls * o
        # what is left at the first call, L: the first call's rounds get L/3, so a second call fits when
        # 2L/3 - o >= o + r, and the two give (L - 2o)/r rounds
        least = before + reserve + max(MIN_CALLS * o + MIN_PAIRS * r, 3 * o + 1.5 * r)
        typical = before + reserve + max(MIN_CALLS * o + 2 * max(MIN_PAIRS, 10) * r, 3 * o + 1.5 * r)
        self.note = (f"this budget cannot reach a latency verdict for this model on {device}: one call of the "
                     f"agent took {self.first_call_s:.1f}s ({o:.1f}s to start, load and check accuracy, {r:.2f}s per "
                     f"paired round); a verdict needs {MIN_CALLS} calls and {MIN_PAIRS} paired rounds: "
                     f"--budget {_nice(least)} at the least, {_nice(typical)} to double to "
                     f"{2 * max(MIN_PAIRS, 10)} rounds")
        return self.note


def _nice(seconds: float) -> str:
    s = max(1, math.ceil(seconds / 5) * 5 if seconds > 10 else math.ceil(seconds))
    return f"{s // 60}m{s % 60:02d}s" if s >= 600 else f"{s}s"


def measure_pair(session: Any, baseline_id: str, candidate_id: str, spec: GateSpec, budget_s: float = 60.0,
                 progress: Callable[[str], None] = lambda s: None, timeout_s: float | None = None,
                 probe: dict[str, Any] | None = None, check: Callable[[], None] | None = None,
                 reserve_calls: float = 0.0, started_at: float | None = None) -> PairedRun:
    """Interleaved rounds of baseline (A) and candidate (B) on ``session``'s device until decided.
    ``check`` runs after every agent call (the rig's throttling check; it raises to stop).
    ``budget_s`` bounds the whole measurement, every call's start, loading and accuracy pass included
    (the first call always runs: accuracy is exact from one call). ``reserve_calls``: that many calls'
    fixed cost is kept back for work after the rounds (fresh processes); ``started_at`` (monotonic): when
    the caller's own clock started, for the budget a verdict would need."""
    run = PairedRun(device=session.device.name, min_calls=MIN_CALLS)
    clock = _Budget(budget_s, reserve_calls, started_at)
    # an emulated CPU's latency is never judged (stats.not_on_emulation): one short call, for accuracy (issue 31);
    # nor another vendor's CPU (stats.other_vendor): one call, its rounds shown but not judged (issue 37)
    emulated = bool((probe or {}).get("emulated"))
    want = 1 if emulated else spec.rounds_start
    if emulated:
        progress(f"{run.device}: the CPU is emulated ({probe.get('emulator') or 'an emulator'}): latency is not judged "
                 "there; one short call for accuracy")
    while True:
        agent_s = clock.agent_budget(run.calls)
        if agent_s is None:
            if not emulated and clock.cannot_reach(run.calls, len(run.blocks) // 2, run.device, force=True):
                run.budget_note = clock.note
                progress(f"{run.device}: {clock.note}")
            break
        rounds = want - len(run.blocks) // 2
        if rounds <= 0:
            break
        req = {"root": session.root, "bundle_ids": [baseline_id, candidate_id],
               "options": {"rounds": rounds, "block_iters": min(spec.block_iters, 5) if emulated else spec.block_iters,
                           "budget_s": agent_s, "warmup": 2 if emulated else 10,
                           "timeout_s": timeout_s or max(300.0 if emulated else 60.0, agent_s * 2 + 60),
                           **_calibrating(check)}}
        t_call = time.monotonic()
        reply = session.agent("pairbench", req, timeout=req["options"]["timeout_s"] + 30)
        run.calls += 1
        pb = _reply(session, reply)
        clock.learn(time.monotonic() - t_call, pb)
        run.blocks.extend(pb["blocks"][:_kept(check, pb)])
        if not run.arms:
            run.arms = pb["arms"]
            run.fingerprint = fingerprint(probe, pb["arms"][0])
            if other_vendor(run):
                progress(f"{run.device}: latency not judged: {other_vendor(run)}; one call, accuracy judged")
        run.environment.append(pb.get("environment") or {})
        if check is not None:
            check()
        done = len(run.blocks) // 2
        if other_vendor(run):
            break
        if not emulated and clock.cannot_reach(run.calls, done, run.device):
            run.budget_note = clock.note
            progress(f"{run.device}: {clock.note}")
        verdicts = judge(run, spec)
        progress(f"{run.device}: {done} rounds: " + ", ".join(f"{v.metric} {v.verdict}" for v in verdicts))
        if (decided(verdicts) and run.calls >= MIN_CALLS) or done >= spec.rounds_max or run.budget_note \
                or emulated_by(run):
            break
        want = min(spec.rounds_max, max(done * 2, done + 1))
    run.elapsed_s = round(time.monotonic() - clock.t0, 3)
    run.noise_note = _noise_note(run, spec, clock)
    if run.noise_note:
        progress(f"{run.device}: {run.noise_note}")
    return run


def _noise_note(run: PairedRun, spec: GateSpec, clock: _Budget) -> str:
    """A latency metric still inconclusive after MIN_CALLS calls: the rounds (and time) a decision needs at the
    noise seen, per metric (p50, p90, p99)."""
    if run.calls < MIN_CALLS or not clock.round_s or emulated_by(run) or other_vendor(run):
        return ""
    have = len(run.blocks) // 2
    notes = []
    for v in judge(run, spec):
        if v.metric not in ("p50", "p90", "p99") or v.verdict != "inconclusive":
            continue
        got = rounds_needed(run, spec, v.metric)
        if got is None:
            continue
        need, spread, dist = got
        if need > 10000:
            notes.append(f"{v.metric} is within {dist * 100:.1f}% of the allowed change at a per-unit spread of "
                         f"{spread * 100:.1f}%: no practical budget decides it (the change is about the threshold)")
            continue
        more = max(0, need - have)
        calls = max(1, math.ceil(more / max(have, 1)))  # doubling: about one call per doubling
        secs = more * clock.round_s + calls * (clock.overhead_s or 0.0)
        what = "p50 ratio" if v.metric == "p50" else f"per-unit {v.metric} ratio"
        notes.append(f"{v.metric}: at this noise (per-unit spread of the {what} {spread * 100:.1f}%, the estimate "
                     f"{dist * 100:.1f}% from the allowed change) a decision needs about {need} paired rounds "
                     f"({have} measured): about {_nice(secs)} more of measuring")
    return "; ".join(notes)


def _calibrating(check: Any) -> dict[str, Any]:
    """pairbench's in-call calibration, asked for when the check watches for throttling between blocks."""
    every = getattr(check, "calibrate_every", 0)
    return {"calibrate_every": every} if every else {}


def _kept(check: Any, pb: dict[str, Any]) -> int:
    within = getattr(check, "within_call", None)
    return within(pb) if within is not None else len(pb["blocks"])


def _reply(session: Any, reply: dict[str, Any]) -> dict[str, Any]:
    if not reply.get("ok"):
        e = reply.get("error") or {}
        raise AgentFailed(f"{session.device.name}: pairbench failed: {e.get('type')}: {e.get('message')}")
    return reply["pairbench"]


def measure_unpaired(session: Any, candidate_id: str, baseline_blocks: list[list[float]], spec: GateSpec,
                     budget_s: float = 60.0, progress: Callable[[str], None] = lambda s: None,
                     probe: dict[str, Any] | None = None, check: Callable[[], None] | None = None,
                     started_at: float | None = None) -> PairedRun:
    """The candidate alone against a stored baseline's rounds: ``pairbench`` with the candidate in both arms
    (the same method, settle runs and switches as the rounds the baseline was saved from), every block a
    candidate block (relabelled ``B``); sequential like ``measure_pair`` (the same budget rules), judged by
    ``judge_unpaired``."""
    run = PairedRun(device=session.device.name, min_calls=MIN_CALLS)
    clock = _Budget(budget_s, 0.0, started_at)
    want = spec.rounds_start
    while True:
        agent_s = clock.agent_budget(run.calls)
        if agent_s is None:
            if clock.cannot_reach(run.calls, len(run.blocks), run.device, force=True):
                run.budget_note = clock.note
                progress(f"{run.device}: {clock.note}")
            break
        rounds = -(-(want - len(run.blocks)) // 2)  # two candidate blocks per pairbench round
        if rounds <= 0:
            break
        req = {"root": session.root, "bundle_ids": [candidate_id, candidate_id],
               "options": {"rounds": rounds, "block_iters": spec.block_iters, "budget_s": agent_s,
                           "warmup": 10, "timeout_s": max(60.0, agent_s * 2 + 60), **_calibrating(check)}}
        t_call = time.monotonic()
        pb = _reply(session, session.agent("pairbench", req, timeout=req["options"]["timeout_s"] + 30))
        run.calls += 1
        clock.learn(time.monotonic() - t_call, pb, rounds_per_block_pair=2.0)  # each block is a candidate block
        run.blocks.extend({**b, "arm": "B"} for b in pb["blocks"][:_kept(check, pb)])
        if not run.arms:
            run.arms = [{}, pb["arms"][1]]
            run.fingerprint = fingerprint(probe, pb["arms"][1])
        run.environment.append(pb.get("environment") or {})
        if check is not None:
            check()
        done = len(run.blocks)
        if clock.cannot_reach(run.calls, done, run.device):
            run.budget_note = clock.note
            progress(f"{run.device}: {clock.note}")
        verdicts = judge_unpaired(baseline_blocks, [b["ms"] for b in run.blocks], spec, run.arms[1],
                                  calls=run.calls, min_calls=run.min_calls, budget_note=run.budget_note,
                                  emulator=emulated_by(run), other_vendor=other_vendor(run))
        progress(f"{run.device}: {done} candidate rounds (unpaired): "
                 + ", ".join(f"{v.metric} {v.verdict}" for v in verdicts))
        if (decided(verdicts) and run.calls >= MIN_CALLS) or done >= spec.rounds_max or run.budget_note \
                or other_vendor(run):
            break
        want = min(spec.rounds_max, max(done * 2, done + 1))
    run.elapsed_s = round(time.monotonic() - clock.t0, 3)
    return run
