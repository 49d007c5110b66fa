"""Sequential paired measurement on one device: the HIL gate's and the rollout's latency comparison.

``measure_pair`` asks the device's agent (``pairbench``) for rounds of interleaved A B B A blocks,
judges after each call, and asks for more only while a gated metric is still inconclusive — up to
``spec.rounds_max`` rounds or the time budget.  Both bundles must already be installed on the device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from edgeopt.errors import DeviceError
from edgeopt.hil.gatefile import GateSpec
from edgeopt.hil.stats import PairedRun, decided, judge, judge_unpaired

# A verdict is never drawn from one process: two ONNX Runtime sessions of the *same* bundle can differ
# by a few percent for the life of the process (seen: one variant's 100-round reference in one child
# measured +2.5%, +2.8%, +7.0% and +8.8% in four bench runs), which blocks inside one child cannot
# show. Each call is a fresh child, so at least two calls put that variation into the rounds.
MIN_CALLS = 2


class AgentFailed(DeviceError):
    """The agent answered, with an error (the bundle failed to load or run): not a hang, never retried."""


def fingerprint(probe: dict[str, Any] | None, arm: dict[str, Any]) -> dict[str, Any]:
    """What must match for two runs to be comparable: runtime versions, kernel, CPU, clocks."""
    p = probe or {}
    env = p.get("environment") or {}
    return {"kernel": p.get("kernel"), "cpu": (p.get("cpu") or {}).get("model"),
            "governor": env.get("governor"), "runtimes": {k: v for k, v in (p.get("runtimes") or {}).items() if v},
            "runner": (arm.get("runner") or {}).get("runtime"), "runner_version": (arm.get("runner") or {}).get("version"),
            "threads": (arm.get("runner") or {}).get("threads"),
            **({"power_mode": jet.get("power_mode"), "clocks_locked": jet.get("clocks_locked")}
               if (jet := p.get("jetson")) else {})}


def measure_pair(session: Any, baseline_id: str, candidate_id: str, spec: GateSpec, budget_s: float = 60.0,
                 progress: Callable[[str], None] = lambda s: None, timeout_s: float | None = None,
                 probe: dict[str, Any] | None = None, check: Callable[[], None] | None = None) -> PairedRun:
    """Interleaved rounds of baseline (A) and candidate (B) on ``session``'s device until decided.
    ``check`` runs after every agent call (the rig's throttling check; it raises to stop)."""
    run = PairedRun(device=session.device.name)
    t0 = time.monotonic()
    want = spec.rounds_start
    while True:
        left = budget_s - (time.monotonic() - t0)
        if run.blocks and left <= 0:
            break
        rounds = want - len(run.blocks) // 2
        if rounds <= 0:
            break
        req = {"root": session.root, "bundle_ids": [baseline_id, candidate_id],
               "options": {"rounds": rounds, "block_iters": spec.block_iters, "budget_s": max(1.0, left),
                           "warmup": 10, "timeout_s": timeout_s or max(60.0, left * 2 + 60),
                           **_calibrating(check)}}
        reply = session.agent("pairbench", req, timeout=req["options"]["timeout_s"] + 30)
        run.calls += 1
        pb = _reply(session, reply)
        run.blocks.extend(pb["blocks"][:_kept(check, pb)])
        if not run.arms:
            run.arms = pb["arms"]
            run.fingerprint = fingerprint(probe, pb["arms"][0])
        run.environment.append(pb.get("environment") or {})
        if check is not None:
            check()
        verdicts = judge(run, spec)
        done = len(run.blocks) // 2
        progress(f"{run.device}: {done} rounds: " + ", ".join(f"{v.metric} {v.verdict}" for v in verdicts))
        if (decided(verdicts) and run.calls >= MIN_CALLS) or done >= spec.rounds_max or pb.get("budget_hit"):
            break
        want = min(spec.rounds_max, done * 2)
    run.elapsed_s = round(time.monotonic() - t0, 3)
    return run


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
                     probe: dict[str, Any] | None = None, check: Callable[[], None] | None = None) -> PairedRun:
    """The candidate alone against a stored baseline's rounds: ``pairbench`` with the candidate in both arms
    (the same method, settle runs and switches as the rounds the baseline was saved from), every block a
    candidate block (relabelled ``B``); sequential like ``measure_pair``, judged by ``judge_unpaired``."""
    run = PairedRun(device=session.device.name)
    t0 = time.monotonic()
    want = spec.rounds_start
    while True:
        left = budget_s - (time.monotonic() - t0)
        if run.blocks and left <= 0:
            break
        rounds = -(-(want - len(run.blocks)) // 2)  # two candidate blocks per pairbench round
        if rounds <= 0:
            break
        req = {"root": session.root, "bundle_ids": [candidate_id, candidate_id],
               "options": {"rounds": rounds, "block_iters": spec.block_iters, "budget_s": max(1.0, left),
                           "warmup": 10, "timeout_s": max(60.0, left * 2 + 60), **_calibrating(check)}}
        pb = _reply(session, session.agent("pairbench", req, timeout=req["options"]["timeout_s"] + 30))
        run.calls += 1
        run.blocks.extend({**b, "arm": "B"} for b in pb["blocks"][:_kept(check, pb)])
        if not run.arms:
            run.arms = [{}, pb["arms"][1]]
            run.fingerprint = fingerprint(probe, pb["arms"][1])
        run.environment.append(pb.get("environment") or {})
        if check is not None:
            check()
        verdicts = judge_unpaired(baseline_blocks, [b["ms"] for b in run.blocks], spec, run.arms[1])
        done = len(run.blocks)
        progress(f"{run.device}: {done} candidate rounds (unpaired): "
                 + ", ".join(f"{v.metric} {v.verdict}" for v in verdicts))
        if (decided(verdicts) and run.calls >= MIN_CALLS) or done >= spec.rounds_max or pb.get("budget_hit"):
            break
        want = min(spec.rounds_max, done * 2)
    run.elapsed_s = round(time.monotonic() - t0, 3)
    return run
