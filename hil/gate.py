"""``edgeopt gate``: did the candidate regress against the baseline on the rig's hardware?

For each device of the rig that takes the bundles' target: connect, push both bundles (content-
addressed: nothing is re-sent), probe, then ``measure_pair`` (interleaved A B B A rounds, sequential
until decided or the budget is spent) and ``judge``.  A device that cannot be reached or fails is an
infrastructure error (exit 4), never a regression.  Results go to the results DB and, on request,
JUnit XML, Markdown and the raw rounds as JSON (every file written atomically).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from edgeopt.errors import DeviceError, UsageError
from edgeopt.hil.gatefile import GateSpec
from edgeopt.hil.stats import overall

EXIT_INCONCLUSIVE = 6
EXIT = {"pass": 0, "improved": 0, "regressed": 5, "error": 4, "inconclusive": EXIT_INCONCLUSIVE}


def _bundle(path: str | Path, what: str):
    from edgeopt.deploy import load_bundle

    p = Path(path)
    if not p.exists():
        raise UsageError(f"{what} {str(path)!r} does not exist",
                         hint="give a bundle folder from `edgeopt build` (dist/<model>/<target>-<precision>)")
    return load_bundle(p)


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


def run_gate(candidate: str | Path, baseline: str | Path, devices: list, spec: GateSpec,
             budget_s: float = 60.0, trust_new_host_keys: bool = False, jobs: int = 4,
             db_path: str | Path | None = None,
             progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Gate ``candidate`` against ``baseline`` on every device that takes their target.  Every input
    is checked before anything is measured or recorded; the DB is written only once a verdict exists."""
    from edgeopt.fleetbench import matches

    if budget_s <= 0:
        raise UsageError(f"--budget must be above 0 s, got {budget_s:g}")
    cand, base = _bundle(candidate, "candidate"), _bundle(baseline, "baseline")
    check_pair(base, cand)
    rig = [d for d in devices if matches(d, cand)]
    if not rig:
        raise UsageError(f"no device of the rig takes target {cand.target!r} ("
                         + ", ".join(f"{d.name}: {d.target or 'no target'}" for d in devices) + ")",
                         hint="set `target:` for the rig's devices in the inventory")
    gate_id = uuid.uuid4().hex[:12]
    result: dict[str, Any] = {"schema": "edgeopt/v1", "kind": "gate", "gate_id": gate_id, "model": cand.model,
                              "target": cand.target, "baseline_id": base.bundle_id,
                              "candidate_id": cand.bundle_id, "baseline": str(base.path),
                              "candidate": str(cand.path), "spec": spec.as_dict(), "budget_s": budget_s,
                              "devices": []}
    t0 = time.perf_counter()

    def one(dev) -> dict[str, Any]:
        return _gate_device(dev, base, cand, spec, budget_s, trust_new_host_keys, progress)

    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(rig)))) as pool:
        result["devices"] = list(pool.map(one, rig))
    result["elapsed_s"] = round(time.perf_counter() - t0, 3)
    result["verdict"] = _overall(result["devices"])
    result["exit_code"] = EXIT[result["verdict"]]
    if db_path is not None:
        from edgeopt.results import ResultsDB

        with ResultsDB(db_path) as db:
            for dev in result["devices"]:
                db.add(_record(result, dev, cand))
    return result


def _overall(devs: list[dict[str, Any]]) -> str:
    from edgeopt.hil.stats import Verdict

    verdicts = [Verdict(**v) for d in devs for v in d.get("verdicts") or []]
    ov = overall(verdicts) if verdicts else "inconclusive"
    if ov == "regressed":
        return "regressed"  # a real regression on one device outranks a dead device elsewhere
    if any(d.get("error") for d in devs):
        return "error"
    return ov


def _gate_device(dev, base, cand, spec: GateSpec, budget_s: float, trust_new: bool,
                 progress: Callable[[str], None]) -> dict[str, Any]:
    from edgeopt.deploy import DeviceSession
    from edgeopt.hil.paired import measure_pair
    from edgeopt.hil.stats import judge
    from edgeopt.transport import AuthFailed, HostKeyError

    out: dict[str, Any] = {"device": dev.name, "status": "ok"}
    t0 = time.perf_counter()
    try:
        progress(f"{dev.name}: connecting")
        with DeviceSession.open(dev, trust_new, progress=progress) as sess:
            probe = sess.probe()
            push = sess.push([base, cand])
            failed = [b for b in push.bundles if b.status == "failed"]
            if failed:
                raise DeviceError(f"{dev.name}: push failed: {failed[0].error}")
            progress(f"{dev.name}: measuring baseline and candidate interleaved (budget {budget_s:g}s)")
            run = measure_pair(sess, base.bundle_id, cand.bundle_id, spec, budget_s, progress, probe=probe)
        verdicts = judge(run, spec)
        out.update({"verdicts": [v.as_dict() for v in verdicts], "verdict": overall(verdicts),
                    "rounds": len(run.blocks) // 2, "calls": run.calls, "fingerprint": run.fingerprint,
                    "raw": run.as_dict()})
    except DeviceError as exc:
        status = "refused" if isinstance(exc, (HostKeyError, AuthFailed)) else "failed"
        out.update({"status": status, "error": exc.message, "verdict": "error"})
        progress(f"{dev.name}: {status.upper()}: {exc.message}")
    out["elapsed_s"] = round(time.perf_counter() - t0, 3)
    return out


def _record(result: dict[str, Any], dev: dict[str, Any], cand) -> dict[str, Any]:
    from edgeopt.fleetbench import now_iso

    p50 = next((v for v in dev.get("verdicts") or [] if v["metric"] == "p50"), None)
    return {"run_id": f"gate-{result['gate_id']}", "time": now_iso(), "device": {"name": dev["device"]},
            "bundle": cand.describe(), "status": f"gate-{dev.get('verdict')}",
            "error": {"message": dev["error"]} if dev.get("error") else None,
            "bench": {"latency_ms": {"p50": p50.get("candidate") if p50 else None}},
            "gate": {k: v for k, v in dev.items() if k != "raw"},
            "gate_id": result["gate_id"], "baseline_id": result["baseline_id"]}
