"""The builtin rollout engine: waves over a bounded thread pool, one device's steps in order.

Per device: connect → push (staging, verified, content-addressed) → pre-activation gate on the device
((a) fidelity: the candidate against its own FP32 reference; (b)+(c) against the incumbent — the slot's
current bundle — on the same device: decisions on the same inputs and latency measured interleaved,
by the HIL gate's ``measure_pair``/``judge``, one implementation for both) → activate as a *trial*
(the agent reverts it by itself unless committed: see device_agents/SCHEMA.md) → ``activate_cmd`` →
``health_cmd`` over the watch window → commit.  A device that fails any step is rolled back (and, if
the host is gone, its trial reverts on its own): it ends on its previous bundle, never half-way.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeopt.errors import DeviceError
from edgeopt.fleet.journal import Journal
from edgeopt.fleet.plan import Plan, wave_failed
from edgeopt.ui import clip

FAILED = ("failed", "unreachable", "timed-out", "refused")


@dataclass
class Options:
    gate: Any = None  # GateSpec
    gate_budget_s: float = 20.0
    max_fail: tuple[float, bool] = (0.0, False)
    parallel: int = 8
    bake_s: float = 0.0
    on_inconclusive: str = "pause"  # pause | pass | fail (the old ``continue`` is read as pass)
    on_halt: str = "keep"  # keep | rollback-all
    health_watch_s: float = 0.0
    trust_new_host_keys: bool = False
    latency_gate: bool = True
    step_timeout_s: float = 600.0
    retries: int = 2  # for transient failures before activation only (connection lost/refused), never a gate
    retry_delay_s: float = 2.0
    eval_set: Any = None  # evalset.EvalSet: labelled data scored on the device (--eval)
    engine: str = "builtin"  # builtin (thread pool) | ansible (a play per wave, ansible-runner)
    # devices whose inconclusive latency verdict paused the rollout and was approved (`resume --approve`):
    # for these an inconclusive verdict goes on once; every other device keeps ``on_inconclusive``
    approved: frozenset = frozenset()

    def __post_init__(self) -> None:
        self.on_inconclusive = policy_name(self.on_inconclusive)

    def revert_window_s(self, dev) -> float:
        """Seconds an unconfirmed trial serves the candidate before the device's watchdog reverts it
        (the host gone): health watch + health timeout + 60 s + one step's timeout."""
        return self.health_watch_s + (dev.health_timeout if dev.health_cmd else 0) + 60 + self.step_timeout_s


def policy_name(policy: str) -> str:
    """``--on-inconclusive``'s one vocabulary (fail | pass | pause); ``continue`` is the old name of pass."""
    return {"continue": "pass", "exit6": "pause"}.get(policy, policy)


@dataclass
class Outcome:
    device: str
    status: str  # done | already | failed | unreachable | timed-out | refused | paused
    step: str = ""
    reason: str = ""
    before: str | None = None
    after: str | None = None
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    time_s: float = 0.0
    attempts: int = 1
    activated: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def slot_of(model: str, target: str) -> str:
    from edgeopt_agent.store import _slot_part  # the agent's own rule: host and device name slots alike

    return f"{_slot_part(model)}/{_slot_part(target)}"


class _Step(Exception):
    def __init__(self, step: str, reason: str, status: str = "failed", verdicts=None) -> None:
        super().__init__(reason)
        self.step, self.reason, self.status, self.verdicts = step, reason, status, verdicts or []


def _run_hook(sess, argv: tuple[str, ...], timeout: float, what: str) -> None:
    rc, out, err = sess.transport.run(list(argv), timeout=timeout)
    if rc != 0:
        tail = clip(" | ".join((err or out).strip().splitlines()[-2:]), 300)
        raise _Step(what, f"{what} exited {rc}: {tail}")


def roll_device(dev, bundle, opts: Options, emit: Callable[..., None]) -> Outcome:
    """One device through every step; never leaves it on a half state. A transient failure (the device
    unreachable or the connection lost) *before* the trial activation is retried ``opts.retries`` times
    with a growing delay; a failed gate, hook or health check never is."""
    attempt = 1
    while True:
        out = _roll_once(dev, bundle, opts, emit)
        if out.status != "unreachable" or out.activated or attempt > opts.retries:
            out.attempts = attempt
            return out
        emit(dev.name, "retry", "wait", attempt=attempt, reason=out.reason)
        time.sleep(opts.retry_delay_s * attempt)
        attempt += 1


def _roll_once(dev, bundle, opts: Options, emit: Callable[..., None]) -> Outcome:
    from edgeopt.deploy import DeviceSession
    from edgeopt.hil.paired import measure_pair
    from edgeopt.policy.stats import judge
    from edgeopt.transport import AuthFailed, HostKeyError

    t0 = time.perf_counter()
    out = Outcome(dev.name, "failed")
    slot = slot_of(bundle.model, bundle.target)
    activated = False
    sess = None
    stage = "connect"
    try:
        emit(dev.name, "connect", "start")
        sess = DeviceSession.open(dev, opts.trust_new_host_keys)
        state = sess.listing([bundle.bundle_id]).get("slots", {}).get(slot) or {}  # and has(), for push
        trial = state.get("trial") or {}
        incumbent = trial.get("previous") if trial else state.get("current")
        out.before = incumbent
        if state.get("current") == bundle.bundle_id and not trial:
            out.status, out.after, out.step = "already", bundle.bundle_id, "done"
            emit(dev.name, "device", "already", before=incumbent, after=bundle.bundle_id)
            return out
        stage = "push"
        emit(dev.name, "push", "start", bytes=bundle.size)
        pr = sess.push([bundle])
        if not pr.ok:
            raise _Step("push", pr.bundles[0].error or "push failed")
        emit(dev.name, "push", "ok", status_detail=pr.bundles[0].status)
        # (a) fidelity: the candidate against its own FP32 reference, on this device
        stage = "gate"
        reply = sess.agent("check", {"root": sess.root, "bundle_id": bundle.bundle_id}, timeout=opts.step_timeout_s)
        if not reply.get("ok"):
            raise _Step("gate", f"fidelity check could not run: {(reply.get('error') or {}).get('message')}")
        chk = reply.get("check") or {}
        if not chk.get("passed", False):
            raise _Step("gate", f"fidelity: {chk.get('summary', 'the candidate misses its own FP32 reference')}")
        emit(dev.name, "gate-fidelity", "pass")
        if opts.eval_set is not None:  # (b) with labels: accuracy on the device, beside the incumbent
            from edgeopt.fleet.evalset import gate as eval_gate

            ev = eval_gate(sess, opts.eval_set, incumbent, bundle.bundle_id, opts.step_timeout_s)
            out.verdicts = [*out.verdicts, ev]
            emit(dev.name, "gate-eval", "pass" if ev["passed"] else "regressed", **ev)
            if not ev["passed"]:
                raise _Step("gate", ev["reason"], verdicts=out.verdicts)
        # (b)+(c) against the incumbent on the same device: decisions and latency, interleaved
        if incumbent and opts.latency_gate:
            # the probe: the fingerprint, and an emulated CPU's or another vendor's CPU's one call (latency never
            # judged there: "not judged" makes the step inconclusive, as --on-inconclusive says; accuracy judged)
            run = measure_pair(sess, incumbent, bundle.bundle_id, opts.gate, opts.gate_budget_s,
                               progress=lambda s: emit(dev.name, "gate-budget", "note", message=s), probe=sess.probe())
            verdicts = [v.as_dict() for v in judge(run, opts.gate)]
            out.verdicts = [*out.verdicts, *verdicts]
            bad = [v for v in verdicts if v["verdict"] == "regressed"]
            unsure = [v for v in verdicts if v["verdict"] == "inconclusive"]
            emit(dev.name, "gate-incumbent", "regressed" if bad else "inconclusive" if unsure else "pass",
                 verdicts=verdicts)
            if bad:
                raise _Step("gate", "; ".join(f"{v['metric']}: {v['reason']}" for v in bad), verdicts=verdicts)
            policy = "pass" if dev.name in opts.approved else opts.on_inconclusive
            if unsure and dev.name in opts.approved:
                emit(dev.name, "gate-incumbent", "approved",
                     reason="inconclusive, approved by `rollout resume --approve` (this device only)")
            if unsure and policy != "pass":
                status = "paused" if policy == "pause" else "failed"
                raise _Step("gate", "inconclusive: " + "; ".join(f"{v['metric']}: {v['reason']}" for v in unsure),
                            status=status, verdicts=verdicts)
        # activate as a trial the agent reverts by itself unless we commit after the health window
        window = opts.revert_window_s(dev)
        stage = "activate"
        res = sess.activate(bundle.bundle_id, slot, confirm_within_s=window)
        activated = out.activated = True
        stage = "health"
        # the device's own deadline (its clock) when it says so, else this host's estimate of it
        revert_at = (res.get("trial") or {}).get("deadline_at") or _iso(time.time() + window)
        emit(dev.name, "activate", "trial", confirm_within_s=window, revert_at=revert_at,
             bundle_id=bundle.bundle_id, slot=slot, watchdog_pid=(res.get("watchdog") or {}).get("pid"))
        if dev.activate_cmd:
            _run_hook(sess, dev.activate_cmd, dev.health_timeout, "activate_cmd")
            emit(dev.name, "activate_cmd", "ok")
        if dev.health_cmd:
            end = time.monotonic() + opts.health_watch_s
            checks = 0
            while True:
                _run_hook(sess, dev.health_cmd, dev.health_timeout, "health_cmd")
                checks += 1
                if time.monotonic() >= end:
                    break
                time.sleep(min(2.0, max(0.1, end - time.monotonic())))
            emit(dev.name, "health", "ok", checks=checks)
        stage = "commit"
        sess.commit(slot, bundle.bundle_id)
        out.status, out.step, out.after = "done", "commit", bundle.bundle_id
        emit(dev.name, "device", "done", before=incumbent, after=bundle.bundle_id)
    except _Step as exc:
        out.status, out.step, out.reason, out.verdicts = exc.status, exc.step, exc.reason, exc.verdicts or out.verdicts
    except DeviceError as exc:
        from edgeopt.transport import ConnectionLost, DeviceTimeout

        out.step = out.step or stage
        out.reason = exc.message
        out.status = ("refused" if isinstance(exc, (HostKeyError, AuthFailed)) else
                      "timed-out" if isinstance(exc, DeviceTimeout) else
                      "unreachable" if sess is None or isinstance(exc, ConnectionLost) else "failed")
    except (OSError, ValueError, KeyError) as exc:  # a step that broke on this device fails this device only
        out.step = out.step or stage
        out.reason = f"{type(exc).__name__}: {exc}"[:500]
        out.status = "failed"
    finally:
        if out.status not in ("done", "already") and activated and sess is not None:
            try:
                sess.rollback(slot)  # back to the incumbent now; the trial's watchdog is the fallback
                out.after = out.before
            except DeviceError:
                out.after = None  # the agent reverts the unconfirmed trial itself at its deadline
        if out.status not in ("done", "already"):
            if out.after is None and not activated:
                out.after = out.before
            emit(dev.name, "device", out.status, at=out.step, reason=out.reason, before=out.before,
                 after=out.after, verdicts=out.verdicts)
        if sess is not None:
            sess.close()
        out.time_s = round(time.perf_counter() - t0, 3)
    return out


def rollback_devices(devs: list, model: str, targets: dict[str, str], trust_new: bool,
                     emit: Callable[..., None], to_empty: bool = False) -> dict[str, str]:
    """Put these devices' slot back on its previous bundle (halt with rollback-all, `edgeopt rollback`).
    ``to_empty`` (a halt): a device with no previous bundle goes back to none, as before its first install;
    without it (`edgeopt rollback`) such a device is refused and stays as it is."""
    from edgeopt.deploy import DeviceSession

    result = {}
    for dev in devs:
        try:
            with DeviceSession.open(dev, trust_new) as sess:
                r = sess.rollback(slot_of(model, targets[dev.name]), to_empty=to_empty)
                result[dev.name] = r.get("current")
                emit(dev.name, "rollback", "ok", after=r.get("current"))
                # the device's outcome in the journal is now this, not the "done" it had before
                emit(dev.name, "device", "rolled-back", before=r.get("rolled_back"), after=r.get("current"))
        except DeviceError as exc:
            result[dev.name] = f"failed: {exc.message}"
            emit(dev.name, "rollback", "failed", reason=exc.message)
    return result


def run_rollout(plan: Plan, devices: dict[str, Any], bundles: dict[str, Any], opts: Options, journal: Journal,
                rollout_id: str | None = None, spec: dict[str, Any] | None = None,
                done: dict[str, str] | None = None, progress: Callable[[str], None] = lambda s: None
                ) -> dict[str, Any]:
    """Run (or resume) a planned rollout; returns its summary.  ``done``: devices already finished.

    A new rollout keeps a copy of each planned bundle with the journal (``Journal.keep_bundles``) and
    rolls out from it: a rebuild of the bundle paths meanwhile (between waves, or before a resume)
    changes nothing.  While it runs, this process's pid and a heartbeat are in the journal."""
    new = rollout_id is None
    rollout_id = rollout_id or uuid.uuid4().hex[:12]
    journal.claim(rollout_id, [d["device"] for w in plan.waves for d in w])  # one rollout per device at a time
    try:
        return _run_claimed(plan, devices, bundles, opts, journal, rollout_id, new, spec, done, progress)
    finally:
        journal.release(rollout_id)


def _run_claimed(plan: Plan, devices: dict[str, Any], bundles: dict[str, Any], opts: Options, journal: Journal,
                 rollout_id: str, new: bool, spec: dict[str, Any] | None, done: dict[str, str] | None,
                 progress: Callable[[str], None]) -> dict[str, Any]:
    if new:
        try:  # before anything is journalled: a bundle that cannot be kept is bad input, nothing written
            kept = journal.keep_bundles(rollout_id, list(bundles.values()))
        except Exception:
            journal.drop_kept(rollout_id)
            raise
        journal.create(rollout_id, plan.model, {**(spec or {}), "plan": plan.as_dict(), "kept": kept,
                                                "bundle_paths": {b.bundle_id: str(Path(b.path).resolve())
                                                                 for b in bundles.values()}})
        bundles = kept_bundles(bundles, kept)
        progress(f"rollout {rollout_id} started: if this host stops, `edgeopt rollout resume {rollout_id}` finishes it")
    journal.start_heartbeat(rollout_id)
    try:
        summary = _run(plan, devices, bundles, opts, journal, rollout_id, dict(done or {}), progress)
    finally:
        journal.stop_heartbeat()
    if summary["status"] in ("done", "halted"):
        journal.drop_kept(rollout_id)
    return summary


def kept_bundles(bundles: dict[str, Any], kept: dict[str, str]) -> dict[str, Any]:
    """The per-device bundle map pointed at the journal's kept copies (same ids)."""
    from edgeopt.deploy import load_bundle

    loaded = {bid: load_bundle(path) for bid, path in kept.items()}
    return {name: loaded.get(b.bundle_id, b) for name, b in bundles.items()}


def planned_bundles(plan: Plan, spec: dict[str, Any], rollout_id: str) -> dict[str, Any]:
    """For a resume: each planned device's bundle, exactly the one the plan names (checked by id): the
    copy kept with the journal, else the bundle path if it still holds that id. A path that now holds
    another bundle is refused (exit 2) rather than rolled out."""
    from edgeopt.deploy import find_bundles, load_bundle
    from edgeopt.errors import EdgeoptError, UsageError

    wanted = {w["bundle_id"]: w for wave in plan.waves for w in wave}
    found: dict[str, Any] = {}
    for bid in wanted:
        path = (spec.get("kept") or {}).get(bid)
        if path:
            try:
                b = load_bundle(path)
            except EdgeoptError:
                b = None
            if b is not None and b.bundle_id == bid:
                found[bid] = b
    missing = [bid for bid in wanted if bid not in found]
    if missing:  # no kept copy (a journal from before kept copies, or it was removed): the paths, by id
        paths = [(spec.get("bundle_paths") or {}).get(bid) for bid in missing]
        candidates = [p for p in paths if p] or list(spec.get("bundles") or [])
        on_disk: dict[str, Any] = {}
        for p in candidates:
            try:
                for b in ([load_bundle(p)] if (Path(p) / "manifest.json").is_file() else find_bundles(p)):
                    on_disk.setdefault(b.bundle_id, b)
            except EdgeoptError:
                continue
        for bid in missing:
            if bid in on_disk:
                found[bid] = on_disk[bid]
                continue
            w = wanted[bid]
            path = (spec.get("bundle_paths") or {}).get(bid) or ", ".join(spec.get("bundles") or [])
            from edgeopt.inventory import canonical_target

            now = [b.bundle_id for b in on_disk.values()
                   if canonical_target(b.target) == canonical_target(w["target"])]
            raise UsageError(
                f"rollout {rollout_id}: the plan's bundle {bid[:12]} ({w['target']}) is not at {path} any more: "
                f"it now holds {now[0][:12] if now else 'no bundle for that target'}; resume installs only the "
                "planned bundles", hint="rebuild into another folder and put the planned bundle back, or start a "
                "new rollout of the new bundle")
    return {w["device"]: found[w["bundle_id"]] for wave in plan.waves for w in wave}


def _run(plan: Plan, devices: dict[str, Any], bundles: dict[str, Any], opts: Options, journal: Journal,
         rollout_id: str, done: dict[str, str], progress: Callable[[str], None]) -> dict[str, Any]:
    summary: dict[str, Any] = {"schema": "edgeopt/v1", "kind": "rollout", "rollout_id": rollout_id, "model": plan.model,
                               "waves": [], "skipped": plan.skipped, "left_out": plan.left_out}
    finished: list[str] = []  # devices moved to the candidate by this rollout, in order

    for wi, wave in enumerate(plan.waves):
        todo = [w for w in wave if done.get(w["device"]) not in ("done", "already")]
        finished += [w["device"] for w in wave if done.get(w["device"]) == "done"]
        if not todo:
            summary["waves"].append({"wave": wi, "devices": len(wave), "resumed_done": len(wave)})
            continue
        window = max(opts.revert_window_s(devices[w["device"]]) for w in todo)
        progress(f"wave {wi + 1}/{len(plan.waves)}: {len(todo)} device(s); an unconfirmed trial reverts on the "
                 f"device by itself {window:.0f} s after its activation if this host stops")
        journal.event(rollout_id, wi, None, "wave", "start", {"devices": [w["device"] for w in todo]})

        def emit(device, step, status, _wi=wi, **data):
            journal.event(rollout_id, _wi, device, step, status, data)
            if step == "gate-budget":  # the gate's own word: --budget cannot reach a verdict for this model
                progress(f"  {data.get('message')}")
            if step == "activate" and status == "trial":
                progress(f"  {device}: trial active; reverts to its previous bundle at {data.get('revert_at')} "
                         f"({data.get('confirm_within_s', 0):.0f} s) unless committed")

        if opts.engine == "ansible":
            from edgeopt.fleet.ansible_engine import run_wave

            outs = run_wave(rollout_id, wi, todo, devices, bundles, opts, journal, progress)
        else:
            with ThreadPoolExecutor(max_workers=max(1, min(opts.parallel, len(todo)))) as pool:
                outs = list(pool.map(lambda w: roll_device(devices[w["device"]], bundles[w["device"]], opts, emit),
                                     todo))
        counts: dict[str, int] = {}
        for o in outs:
            counts[o.status] = counts.get(o.status, 0) + 1
            progress(f"  {o.device}: {o.status}" + (f" at {o.step}: {clip(o.reason, 200)}" if o.reason else ""))
        failures = sum(counts.get(s, 0) for s in FAILED)
        wave_sum = {"wave": wi, "devices": len(wave), "counts": counts, "failures": failures,
                    "outcomes": [o.as_dict() for o in outs]}
        summary["waves"].append(wave_sum)
        finished += [o.device for o in outs if o.status == "done"]
        if wave_failed(failures, len(todo), opts.max_fail):
            journal.event(rollout_id, wi, None, "wave", "halted", {"failures": failures, "counts": counts})
            wave_done = [o.device for o in outs if o.status == "done"]
            targets = {n: bundles[n].target for n in finished}
            to_roll = wave_done if opts.on_halt == "keep" else finished
            summary["rolled_back"] = rollback_devices([devices[n] for n in to_roll], plan.model, targets,
                                                      opts.trust_new_host_keys,
                                                      lambda d, s, st, **kw: emit(d, s, st, **kw), to_empty=True)
            summary["status"] = "halted"
            summary["reason"] = f"wave {wi + 1}: {failures} failure(s) exceed --max-fail"
            journal.set_status(rollout_id, "halted", {"reason": summary["reason"]})
            return summary
        if counts.get("paused"):
            summary["status"] = "paused"
            paused = [o.device for o in outs if o.status == "paused"]
            summary["reason"] = (f"wave {wi + 1}: {counts['paused']} device(s) with an inconclusive latency verdict "
                                 f"({', '.join(paused[:5])}{', …' if len(paused) > 5 else ''}); "
                                 f"`edgeopt rollout resume {rollout_id} --approve` approves these verdicts and goes "
                                 "on (later devices pause again on theirs)")
            journal.set_status(rollout_id, "paused", {"reason": summary["reason"]})
            return summary
        journal.event(rollout_id, wi, None, "wave", "done", {"counts": counts})
        if opts.bake_s and wi < len(plan.waves) - 1:
            progress(f"  baking {opts.bake_s:g}s")
            time.sleep(opts.bake_s)
    summary["status"] = "done"
    journal.set_status(rollout_id, "done")
    return summary
