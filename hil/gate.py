"""``edgeopt gate``: did the candidate regress against the baseline on the rig's hardware?

For each device of the rig that takes the bundles' target (quarantined devices are skipped): connect,
probe, run the rig's ``prepare`` commands, wait until the device is fit under the rig's policy (load,
free memory, temperature, governor), push both bundles (content-addressed: nothing is re-sent), then
``measure_pair`` (interleaved A B B A rounds, sequential until decided or the budget is spent; the
optional throttle check between calls) and ``judge``; ``restore`` runs afterwards whatever happened.
With ``--baseline results:NAME`` only the candidate is measured and compared with the stored rounds
(``measure_unpaired`` / ``judge_unpaired``: 99% intervals, fingerprint differences as warnings).
A device that cannot be reached, hangs or is unfit is an infrastructure error (exit 4), never a
regression; an unreachable or hung one is power-cycled (the rig's host command) and retried once.
Results go to the results DB (with the per-round samples, so a run can become a named baseline), the
rig's quarantine bookkeeping to its tables, and on request JUnit XML, Markdown and the raw rounds as
JSON (every file written atomically).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from edgeopt.errors import (
    EXIT_DEVICE_FAILED,
    EXIT_GOAL_NOT_MET,
    EXIT_INCONCLUSIVE,
    EXIT_OK,
    DeviceError,
    UsageError,
)
from edgeopt.policy.gatefile import GateSpec
from edgeopt.policy.stats import overall

# a gate verdict -> its exit code (the codes themselves live in edgeopt.errors)
EXIT = {"pass": EXIT_OK, "improved": EXIT_OK, "regressed": EXIT_GOAL_NOT_MET, "error": EXIT_DEVICE_FAILED,
        "inconclusive": EXIT_INCONCLUSIVE}
# --on-inconclusive: pause (exit 6, the default) | fail (exit 5) | pass (exit 0); old spellings kept as aliases
ON_INCONCLUSIVE = ("pause", "fail", "pass")
ON_INCONCLUSIVE_ALIASES = {"exit6": "pause", "continue": "pass"}


def on_inconclusive_policy(value: str) -> str:
    """``pause``/``fail``/``pass`` (``exit6`` → pause, ``continue`` → pass); anything else: UsageError."""
    v = ON_INCONCLUSIVE_ALIASES.get(str(value).strip().lower(), str(value).strip().lower())
    if v not in ON_INCONCLUSIVE:
        raise UsageError(f"on_inconclusive must be pause, fail or pass, not {value!r}",
                         hint="pause = exit 6 (the default), fail = exit 5, pass = exit 0")
    return v


def _bundle(path: str | Path, what: str):
    from edgeopt.deploy import load_bundle

    p = Path(path)
    if not p.exists():
        raise UsageError(f"{what} {str(path)!r} does not exist",
                         hint="give a bundle folder from `edgeopt build` (dist/<model>/<target>-<precision>)")
    return load_bundle(p)


def preprocess_text(cfg: dict[str, Any] | None) -> str | None:
    """A manifest's resolved preprocessing (``validation.source.preprocess``) as ``--preprocess`` text that
    reproduces it exactly (every setting spelt out), or None when the data had none (arrays, random)."""
    if not isinstance(cfg, dict) or not cfg.get("preset"):
        return None
    parts = [f"preset={cfg['preset']}"]
    if cfg.get("resize") is not None:
        parts.append(f"resize={int(cfg['resize'])}")
    if cfg.get("crop"):
        parts.append("crop=1")
    for key in ("order", "layout"):
        if cfg.get(key):
            parts.append(f"{key}={cfg[key]}")
    if cfg.get("scale") is not None:
        parts.append(f"scale={float(cfg['scale'])!r}")
    for key in ("mean", "std"):
        if cfg.get(key):
            parts.append(f"{key}=" + ",".join(repr(float(x)) for x in cfg[key]))
    return " ".join(parts)


def baseline_data(man: dict[str, Any], calib: str | None, preprocess: str | None) -> dict[str, Any]:
    """How the candidate of a model CANDIDATE is built so that it is judged on the baseline's data: the
    baseline manifest's calibration/validation source (``validation.source``: its path, preprocessing and
    sample counts) unless ``--calib``/``--preprocess`` say otherwise (``--calib`` alone keeps the baseline's
    preprocessing and counts).  A recorded source that cannot be
    found here is a UsageError (exit 2), raised before anything is built or measured: building on random
    data instead would judge the same model "regressed" against real-data decisions."""
    src = ((man.get("validation") or {}).get("source")) or {}
    kind = src.get("kind")
    out: dict[str, Any] = {"calib": calib, "preprocess": preprocess, "from": "--calib" if calib else "baseline",
                           "kind": kind}
    if calib is None:
        if kind == "random" or not kind:
            out["kind"] = "random"
        else:
            path = src.get("path")
            if not path or not Path(path).exists():
                raise UsageError(f"the baseline bundle was built on {kind} data from {path or '(no path recorded)'}, "
                                 "which is not found here: the candidate must be built on the same data",
                                 hint="give --calib (and --preprocess) with the baseline's calibration/validation "
                                      "data, or build the candidate with `edgeopt build` and gate the bundle")
            out["calib"] = str(path)
    if preprocess is None:  # the model's input preprocessing, also for data given with --calib
        out["preprocess"] = preprocess_text(src.get("preprocess"))
    for key, field_ in (("calib_count", "calibration_samples"), ("val_count", "validation_samples")):
        if isinstance(src.get(field_), int) and src[field_] > 0:
            out[key] = int(src[field_])
    if out["calib"] and out["from"] == "baseline":  # the baseline's own split (none recorded: head-tail, as then)
        sp = src.get("split") or {"how": "head-tail"}
        out["split"] = sp["how"] + (f":{sp['seed']}" if sp["how"] == "shuffle" and "seed" in sp else "")
    return out


def build_candidate(model: str | Path, baseline: str | Path, calib: str | None, preprocess: str | None,
                    dist: str | Path, progress: Callable[[str], None],
                    data: dict[str, Any] | None = None) -> Path:
    """Build MODEL like the baseline bundle (its target, precision, input shapes, calibration/validation data,
    preprocessing and sample counts, accuracy policy); the bundle folder.  ``data``: ``baseline_data``'s
    answer when the caller checked it already."""
    import json

    from edgeopt import api

    base = _baseline_bundle_of(baseline)
    man = json.loads((base.path / "manifest.json").read_text())
    data = data or baseline_data(man, calib, preprocess)
    shapes = {i["name"]: list(i["shape"]) for i in man["io"]["inputs"]}
    how = ("on RANDOM data (the baseline was built on random data)" if data["kind"] == "random" else
           f"on {data['calib']}" + (" (the baseline's data)" if data["from"] == "baseline" else ""))
    progress(f"building the candidate {Path(model).name} for {base.target} {base.precision} like the baseline, {how}")
    counts = {k: data[k] for k in ("calib_count", "val_count", "split") if k in data}
    # the kinds the baseline's user gave (--output-kind/--decision/--option output_kind): the candidate is judged
    # by them too (an inferred kind is inferred again, from the candidate's own graph)
    given = {n: {k: v for k, v in kind.items() if k != "source"} for n, kind in (man.get("output_kinds") or {}).items()
             if isinstance(kind, dict) and kind.get("source") == "option"}
    if given:
        counts["output_kind"] = given
    rep = api.build(model, base.target, precision=base.precision, shape=shapes, calib=data["calib"],
                    preprocess=data["preprocess"], dist=dist, progress=progress, accept=man.get("accept"), **counts)
    res = rep.results[0]
    if not res.ok:
        from edgeopt.errors import BuildFailed

        raise BuildFailed(f"the candidate did not build for {base.target} {base.precision}: {res.status}: "
                          f"{(res.error or '').splitlines()[0][:300]}")
    return Path(res.bundle)


def _baseline_bundle_of(baseline: str | Path):
    from edgeopt.hil.baseline import PREFIX

    if str(baseline).startswith(PREFIX):
        raise UsageError("a model as CANDIDATE needs a baseline bundle folder (its target, precision and shapes "
                         f"say how to build the model), not {str(baseline)!r}",
                         hint="build the candidate with `edgeopt build`, or give --baseline a bundle folder")
    return _bundle(baseline, "baseline")


def random_data_note(bundles: dict[str, Any]) -> str:
    """'' unless a bundle of the gate was calibrated and validated on random data (no --calib): then the one
    line naming which, for the verdict line, the JUnit and the Markdown."""
    import json

    rnd = []
    for role, b in bundles.items():
        if b is None:
            continue
        try:
            man = json.loads((b.path / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
        if (((man.get("validation") or {}).get("source")) or {}).get("kind") == "random":
            rnd.append(role)
    if not rnd:
        return ""
    who = " and ".join(rnd)
    return (f"RANDOM data: the {who} bundle{'s were' if len(rnd) > 1 else ' was'} calibrated and validated on "
            "random inputs (built without --calib): accuracy and decisions are compared on noise, not real inputs")


def check_pair(baseline, candidate) -> None:
    """The two bundles must be comparable: same target, same model name and the same inputs."""
    import json

    from edgeopt.inventory import canonical_target

    if canonical_target(baseline.target) != canonical_target(candidate.target):
        raise UsageError(f"the baseline is a {baseline.target!r} bundle and the candidate a {candidate.target!r} "
                         "one: a gate compares two bundles of one target")
    if baseline.model != candidate.model:
        raise UsageError(f"the baseline is of model {baseline.model!r} and the candidate of {candidate.model!r}: "
                         "a gate compares two versions of one model")
    io = [json.loads((b.path / "manifest.json").read_text())["io"]["inputs"] for b in (baseline, candidate)]
    ia, ib = ([(i["name"], tuple(i.get("shape") or ())) for i in x] for x in io)
    if ia != ib:
        raise UsageError(f"the baseline's inputs {ia} differ from the candidate's {ib}")


def gate(candidate: str | Path, baseline: str | Path, devices: str | Path | None = "local",
         limit: str | list[str] | None = None, labels: str | list[str] | None = None, gate: str | None = None,
         budget: str | float = "60s", on_inconclusive: str = "pause", db: str | None = "edgeopt-results.db",
         trust_new_host_keys: bool = False, progress: Callable[[str], None] = lambda s: None,
         calib: str | None = None, preprocess: str | None = None, dist: str | Path = "dist-gate") -> dict[str, Any]:
    """``edgeopt gate`` as a function (what ``edgeopt.api.gate`` should call): the rig file's ``rig:`` policy
    read from the inventory, ``--baseline`` a bundle folder or ``results:NAME``; every input checked first.
    CANDIDATE may be a model file (``.onnx``): it is built first, into ``dist``, for the baseline bundle's
    target, precision and input shapes (``calib``/``preprocess`` as for build), so a CI job gates a
    changed model in one command.

    ``budget`` bounds the gate's wall time from here to the verdict (connecting, probing, the health
    wait, pushing, every agent call's start, loading and accuracy pass, the rounds, fresh processes,
    writing results); building a model CANDIDATE comes before it and is timed apart (``build_s``).
    ``on_inconclusive``: ``pause`` (exit 6), ``fail`` (exit 5) or ``pass`` (exit 0)."""
    from edgeopt.api import parse_duration, select_devices
    from edgeopt.hil.rig import load_rig
    from edgeopt.policy.gatefile import load_gate

    policy = on_inconclusive_policy(on_inconclusive)
    rig = load_rig(devices)
    spec = load_gate(gate)
    budget_s = parse_duration(budget)
    chosen = select_devices(devices, limit, labels)
    build_s = None
    if Path(candidate).is_file() and str(candidate).lower().endswith(".onnx"):
        import json

        # the baseline's data must be at hand before anything is built (exit 2 otherwise)
        base = _baseline_bundle_of(baseline)
        data = baseline_data(json.loads((base.path / "manifest.json").read_text()), calib, preprocess)
        t_build = time.monotonic()
        candidate = build_candidate(candidate, baseline, calib, preprocess, dist, progress, data=data)
        build_s = round(time.monotonic() - t_build, 3)
    result = run_gate(candidate, baseline, chosen, spec, budget_s, trust_new_host_keys, db_path=db,
                      progress=progress, rig=rig)
    if build_s is not None:
        result["build_s"] = build_s
    result["on_inconclusive"] = policy
    if result["verdict"] == "inconclusive" and policy != "pause":
        result["exit_code"] = EXIT["regressed"] if policy == "fail" else 0
    return result


def run_gate(candidate: str | Path, baseline: str | Path, devices: list, spec: GateSpec,
             budget_s: float = 60.0, trust_new_host_keys: bool = False, jobs: int = 4,
             db_path: str | Path | None = None,
             progress: Callable[[str], None] = lambda s: None, rig: Any = None) -> dict[str, Any]:
    """Gate ``candidate`` against ``baseline`` (a bundle folder, or ``results:NAME``: a stored baseline,
    compared unpaired) on every device that takes their target.  ``rig``: an ``edgeopt.hil.rig.Rig``
    (health policy, hooks, quarantine); None = no policy.  Every input is checked before anything is
    measured or recorded; the DB is written only once a verdict exists.  ``budget_s`` bounds the wall time
    from this call to the verdict (a device power-cycled and retried gets a fresh budget for the retry)."""
    from edgeopt.fleetbench import matches
    from edgeopt.hil.baseline import PREFIX, resolve
    from edgeopt.hil.rig import Rig, quarantined

    started = time.monotonic()
    rig = rig or Rig()
    if budget_s <= 0:
        raise UsageError(f"--budget must be above 0 s, got {budget_s:g}")
    cand = _bundle(candidate, "candidate")
    stored: dict[str, dict[str, Any]] | None = None
    if str(baseline).startswith(PREFIX):
        base = None
        bname, entries = resolve(str(baseline), db_path, cand.model, cand.target)
        stored = {e["device"]: e for e in entries}
    else:
        base = _bundle(baseline, "baseline")
        check_pair(base, cand)
    targets = [d for d in devices if matches(d, cand)]
    if not targets:
        raise UsageError(f"no device of the rig takes target {cand.target!r} ("
                         + ", ".join(f"{d.name}: {d.target or 'no target'}" for d in devices) + ")",
                         hint="set `target:` for the rig's devices in the inventory")
    held = quarantined(db_path, [d.name for d in targets])
    live = [d for d in targets if d.name not in held]
    if stored is not None:
        lacking = [d.name for d in live if d.name not in stored]
        if lacking:
            raise UsageError(f"baseline {bname!r} has no rounds for device(s) {', '.join(lacking)} (it has "
                             f"{', '.join(sorted(stored))}): a stored baseline is compared on its own device only",
                             hint="--limit the gate to those devices, or save a baseline from a run on these")
    gate_id = uuid.uuid4().hex[:12]
    result: dict[str, Any] = {"schema": "edgeopt/v1", "kind": "gate", "gate_id": gate_id, "model": cand.model,
                              "target": cand.target, "mode": "paired" if base is not None else "unpaired",
                              "baseline_id": base.bundle_id if base else f"{PREFIX}{bname}",
                              "candidate_id": cand.bundle_id, "baseline": str(base.path) if base else str(baseline),
                              "candidate": str(cand.path), "spec": spec.as_dict(), "budget_s": budget_s,
                              "rig": {"source": rig.source, "policy": rig.policy.as_dict()}, "devices": []}
    note = random_data_note({"baseline": base, "candidate": cand})
    if note:
        result["data_note"] = note
        progress(f"WARNING: {note}")
    t0 = time.perf_counter()

    def one(dev) -> dict[str, Any]:
        if dev.name in held:
            q = held[dev.name]
            progress(f"{dev.name}: SKIPPED: quarantined since {q['quarantined_at']} ({q['reason']})")
            return {"device": dev.name, "status": "quarantined", "verdict": "skipped",
                    "skipped": f"quarantined since {q['quarantined_at']}: {q['reason']}; "
                               f"`edgeopt rig release {dev.name}` puts it back"}
        return _gate_device(dev, base, cand, spec, budget_s, trust_new_host_keys, progress,
                            rig.for_device(dev.name), stored.get(dev.name) if stored is not None else None,
                            started=started)

    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(targets)))) as pool:
        result["devices"] = list(pool.map(one, targets))
    result["elapsed_s"] = round(time.perf_counter() - t0, 3)
    result["verdict"] = _overall(result["devices"])
    result["exit_code"] = EXIT[result["verdict"]]
    if db_path is not None:
        from edgeopt.hil.rig import RigState
        from edgeopt.results import ResultsDB

        with ResultsDB(db_path) as db:
            for dev in result["devices"]:
                if dev.get("status") != "quarantined":
                    db.add(_record(result, dev, cand))
        with RigState(db_path) as st:
            for dev in result["devices"]:
                _rig_bookkeeping(st, dev, rig.for_device(dev["device"]), progress)
    return result


def _rig_bookkeeping(st, dev: dict[str, Any], policy, progress: Callable[[str], None]) -> None:
    if dev.get("status") == "quarantined":
        return
    for ev in dev.get("events") or []:
        st.event(dev["device"], ev["kind"], ev["detail"])
    if dev.get("error"):
        if st.record_failure(dev["device"], dev["error"], policy.quarantine_after, kind=dev.get("status", "failed"),
                             seen=dev.get("status") == "unfit", health=dev.get("health")):
            dev["quarantined_now"] = True
            progress(f"{dev['device']}: QUARANTINED after {policy.quarantine_after} failures in a row "
                     f"(`edgeopt rig release {dev['device']}` lifts it)")
    else:
        st.record_ok(dev["device"], dev.get("health"))


def _overall(devs: list[dict[str, Any]]) -> str:
    from edgeopt.policy.stats import Verdict

    verdicts = [Verdict(**v) for d in devs for v in d.get("verdicts") or []]
    ov = overall(verdicts) if verdicts else "inconclusive"
    if ov == "regressed":
        return "regressed"  # a real regression on one device outranks a dead device elsewhere
    if any(d.get("error") for d in devs):
        return "error"
    if all(d.get("status") == "quarantined" for d in devs):
        return "error"  # nothing was measured: never a pass
    return ov


def _retryable(exc: Exception) -> bool:
    """Unreachable or hung (worth a power cycle), as opposed to refused, unfit, a bundle that fails, or a
    reply that cannot be true (a power cycle does not make a lying agent honest)."""
    from edgeopt.hil.paired import AgentFailed
    from edgeopt.hil.rig import HookFailed, RigUnfit
    from edgeopt.replies import ReplyNotBelievable
    from edgeopt.transport import AuthFailed, HostKeyError

    return not isinstance(exc, (HostKeyError, AuthFailed, RigUnfit, HookFailed, AgentFailed, _PushFailed,
                                ReplyNotBelievable))


class _PushFailed(DeviceError):
    pass


def _gate_device(dev, base, cand, spec: GateSpec, budget_s: float, trust: bool,
                 progress: Callable[[str], None], policy: Any = None,
                 stored: dict[str, Any] | None = None, started: float | None = None) -> dict[str, Any]:
    """One device: measure (with the rig's policy); an unreachable or hung device is power-cycled (when the
    rig says how) and tried once more.  Infrastructure failures are ``status`` failed/refused/unfit."""
    from edgeopt.hil.rig import Policy, RigUnfit, power_cycle, tidy
    from edgeopt.transport import AuthFailed, HostKeyError

    policy = policy or Policy()
    out: dict[str, Any] = {"device": dev.name, "status": "ok", "attempts": 0, "events": []}
    t0 = time.perf_counter()
    started = time.monotonic() if started is None else started
    while True:
        out["attempts"] += 1
        try:
            out.update(_measure_device(dev, base, cand, spec, started + budget_s, trust, progress, policy, stored,
                                       started))
            out["status"] = "ok"
            out.pop("error", None)
            break
        except DeviceError as exc:
            status = "refused" if isinstance(exc, (HostKeyError, AuthFailed)) else \
                "unfit" if isinstance(exc, RigUnfit) else "failed"
            message = tidy(exc.message)
            out.update({"status": status, "error": message, "verdict": "error"})
            progress(f"{dev.name}: {status.upper()}: {message}")
            if out["attempts"] == 1 and policy.power_cycle and _retryable(exc):
                out["events"].append({"kind": "failure", "detail": message})
                try:
                    pc = power_cycle(dev, policy, progress)
                except DeviceError as pexc:
                    out["error"] = f"{message}; then {tidy(pexc.message)}"
                    out["events"].append({"kind": "power_cycle_failed", "detail": tidy(pexc.message)})
                    break
                out["power_cycle"] = pc
                out["events"].append({"kind": "power_cycle", "detail": " ".join(pc["command"])})
                progress(f"{dev.name}: back after the power cycle ({pc['elapsed_s']:.1f}s); retrying once "
                         f"(with a fresh budget of {budget_s:g}s)")
                started = time.monotonic()
                continue
            break
    out["elapsed_s"] = round(time.perf_counter() - t0, 3)
    return out


def _measure_device(dev, base, cand, spec: GateSpec, deadline: float, trust: bool,
                    progress: Callable[[str], None], policy: Any, stored: dict[str, Any] | None,
                    started: float) -> dict[str, Any]:
    """Measure one device before ``deadline`` (monotonic): what is left of the gate's budget after connecting,
    the health wait and the push goes to the rounds, less the time the work after them takes (the
    calibration after measuring, as long as the one before; fresh processes: reserved per call)."""
    from edgeopt.deploy import DeviceSession
    from edgeopt.hil.baseline import fingerprint_diff, load_warning
    from edgeopt.hil.fresh import judge_fresh, measure_fresh
    from edgeopt.hil.paired import measure_pair, measure_unpaired
    from edgeopt.hil.rig import ThrottleWatch, calibrate, health_summary, run_hooks, wait_until_fit
    from edgeopt.policy.stats import emulated_by, judge, judge_unpaired, other_vendor

    warnings: list[str] = []
    fresh: list[dict[str, Any]] = []
    progress(f"{dev.name}: connecting")
    with DeviceSession.open(dev, trust, progress=progress) as sess:
        probe = sess.probe()
        try:
            if policy.prepare:
                progress(f"{dev.name}: prepare ({len(policy.prepare)} command(s))")
                run_hooks(sess, policy.prepare, "prepare")
            if policy.settle_s and policy.prepare:
                time.sleep(policy.settle_s)
                probe = sess.probe()
            probe, warnings = wait_until_fit(sess, policy, probe, progress)
            watch = ThrottleWatch(sess, policy, progress) if policy.throttle else None
            t_cal = time.monotonic()
            cal_before = watch.reference_ms if watch else calibrate(sess)
            after_s = time.monotonic() - t_cal  # the calibration after measuring takes about as long
            push = sess.push([cand] if base is None else [base, cand])
            failed = [b for b in push.bundles if b.status == "failed"]
            if failed:
                raise _PushFailed(f"{dev.name}: push failed: {failed[0].error}")
            budget_s = deadline - time.monotonic() - after_s
            if stored is None:
                progress(f"{dev.name}: measuring baseline and candidate interleaved ({max(0.0, budget_s):.1f}s of "
                         "the budget left)")
                run = measure_pair(sess, base.bundle_id, cand.bundle_id, spec, budget_s, progress, probe=probe,
                                   check=watch, reserve_calls=spec.fresh_runs if (spec.cold_start or spec.memory)
                                   else 0.0, started_at=started)
                if spec.cold_start or spec.memory:
                    fresh = measure_fresh(sess, base.bundle_id, cand.bundle_id, spec.fresh_runs, progress)
            else:
                progress(f"{dev.name}: measuring the candidate against the stored baseline's "
                         f"{len(stored['blocks'])} rounds (unpaired, {max(0.0, budget_s):.1f}s of the budget left)")
                run = measure_unpaired(sess, cand.bundle_id, stored["blocks"], spec, budget_s, progress, probe=probe,
                                       check=watch, started_at=started)
                if spec.cold_start or spec.memory:
                    warnings.append("cold_start/memory are judged against a baseline bundle only (fresh processes "
                                    "of both, interleaved), not against stored rounds: not gated here")
            calibration_ms = min(cal_before, calibrate(sess))  # the device's speed, kept with the rounds
        finally:
            if policy.restore:
                try:
                    run_hooks(sess, policy.restore, "restore")
                except DeviceError as exc:
                    warnings.append(f"restore failed: {exc.message}")
    if stored is None:
        from edgeopt.hil.varlen_gate import bucket_verdicts

        buckets = bucket_verdicts(run, spec)  # variable-length pairs: a regressed bucket fails the gate too
        verdicts = judge(run, spec) + judge_fresh(fresh, spec) + [v for v in buckets if v.verdict == "regressed"]
        rounds = {"A": [b["ms"] for b in run.blocks if b["arm"] == "A"],
                  "B": [b["ms"] for b in run.blocks if b["arm"] == "B"]}
    else:
        speed = calibration_ms / stored["calibration_ms"] if stored.get("calibration_ms") else None
        verdicts = judge_unpaired(stored["blocks"], [b["ms"] for b in run.blocks], spec, run.arms[1], speed,
                                  calls=run.calls, min_calls=run.min_calls, budget_note=run.budget_note,
                                  emulator=emulated_by(run), other_vendor=other_vendor(run))
        if speed is None:
            warnings.append("the stored baseline has no calibration time (saved from a bench run or by an older edgeopt): "
                            "a device slower or faster than then cannot be told from a model that is")
        rounds = {"A": stored["blocks"], "B": [b["ms"] for b in run.blocks]}
        diff = fingerprint_diff(stored.get("fingerprint") or {}, run.fingerprint)
        if diff:
            warnings.append("the device's fingerprint differs from the stored baseline's: " + "; ".join(diff))
        lw = load_warning(stored.get("health"), health_summary(probe))
        if lw:
            warnings.append(lw)
        warnings.append(f"unpaired: compared with baseline rounds saved {stored.get('source_time') or stored['created']}"
                        f" (another session); 99% intervals widened by {spec.session_margin * 100:g}%")
    for w in warnings:
        progress(f"{dev.name}: WARNING: {w}")
    return {"verdicts": [v.as_dict() for v in verdicts], "verdict": overall(verdicts),
            "rounds": len(run.blocks) // 2 if stored is None else len(run.blocks), "calls": run.calls,
            "fingerprint": run.fingerprint, "health": health_summary(probe), "warnings": warnings,
            "mode": "paired" if stored is None else "unpaired", "raw": run.as_dict(), "samples": rounds,
            "throttle": watch.as_dict() if watch else None, "calibration_ms": calibration_ms,
            **({"budget_note": run.budget_note} if run.budget_note else {}),
            **({"noise_note": run.noise_note} if getattr(run, "noise_note", "") else {}),
            **({"per_bucket": [v.as_dict() for v in buckets]} if stored is None and buckets else {}),
            **({"fresh": fresh} if fresh else {})}


def _record(result: dict[str, Any], dev: dict[str, Any], cand) -> dict[str, Any]:
    from edgeopt.fleetbench import now_iso

    p50 = next((v for v in dev.get("verdicts") or [] if v["metric"] == "p50"), None)
    return {"run_id": f"gate-{result['gate_id']}", "time": now_iso(), "device": {"name": dev["device"]},
            "bundle": cand.describe(), "status": f"gate-{dev.get('verdict')}",
            "error": {"message": dev["error"]} if dev.get("error") else None,
            "bench": {"latency_ms": {"p50": p50.get("candidate") if p50 else None}},
            "gate": {k: v for k, v in dev.items() if k not in ("raw", "samples")},
            "rounds": {k: [[round(x, 4) for x in b] for b in v] for k, v in (dev.get("samples") or {}).items()},
            "gate_id": result["gate_id"], "baseline_id": result["baseline_id"], "mode": result.get("mode")}
