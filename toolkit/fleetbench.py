"""Bench fan-out: every device whose target matches a bundle gets it pushed and measured.

Devices run concurrently (bounded); on one device the bundles run one after another, since two
benches at once would measure each other.  A dead, slow or failing device becomes records with an
error, and the others finish; a runtime that crashes or hangs on a device is the agent's reported
failure (``RuntimeCrashed`` / ``RuntimeHung``) for that bundle only.  Every record, failed or not,
goes to the results database with the full JSON.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from edgeopt.deploy import DeviceSession, LocalBundle, _in_daemon_threads, reply_error
from edgeopt.errors import DeviceError, HostKeyError, UsageError
from edgeopt.inventory import Device, canonical_target
from edgeopt.replies import ReplyNotBelievable
from edgeopt.transport import AuthFailed, ConnectionLost, connect

Progress = Callable[[str], None]

# What `bench` asks the agent for by default (the agent's own defaults, plus the samples the
# HTML report plots).
DEFAULT_OPTIONS: dict[str, Any] = {"duration_s": 3.0, "min_iters": 50, "warmup": 10, "threads": None, "batch": 1, "limits": {},
                                   "timeout_s": 300.0, "return_samples": True}
# Statuses of a record; everything but "ok" counts as a device failure (exit code 4).
STATUSES = ("ok", "mismatch", "crashed", "hung", "failed", "unreachable", "refused")


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class RunRecord:
    """One (device, bundle) measurement or the reason there is none."""

    run_id: str
    time: str
    device: dict[str, Any]
    bundle: dict[str, Any]
    status: str
    error: dict[str, Any] | None = None
    bench: dict[str, Any] | None = None
    probe: dict[str, Any] | None = None
    push: dict[str, Any] | None = None
    agent: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FleetResult:
    run_id: str
    records: list[RunRecord] = field(default_factory=list)
    pushes: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # devices with nothing to run
    time_s: float = 0.0
    unsaved: str | None = None  # the results database could not take the records: where they were kept

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.records)

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "ok": self.ok, "time_s": self.time_s,
                "records": [r.as_dict() for r in self.records], "pushes": self.pushes, "skipped": self.skipped,
                **({"unsaved": self.unsaved} if self.unsaved else {})}


def matches(device: Device, bundle: LocalBundle) -> bool:
    """A device's ``target`` picks its bundles; ``local`` without one takes every bundle this host can run."""
    if device.target:
        return canonical_target(device.target) == canonical_target(bundle.target)
    return device.is_local and bundle.check_kind == "numeric"


def plan(devices: list[Device], bundles: list[LocalBundle], targets: list[str] | None = None
         ) -> tuple[list[tuple[Device, list[LocalBundle]]], list[dict[str, str]]]:
    """(device, its bundles) pairs, and the devices that get nothing with the reason."""
    if targets:
        want = {canonical_target(t) for t in targets}
        bundles = [b for b in bundles if canonical_target(b.target) in want]
    work, skipped = [], []
    for d in devices:
        mine = [b for b in bundles if matches(d, b)]
        if mine:
            work.append((d, mine))
        else:
            why = (f"no bundle for target {d.target!r}" if d.target else
                   "no bundle this host can run" if d.is_local else "the device has no `target` in the inventory")
            skipped.append({"device": d.name, "reason": why})
    return work, skipped


def bench_fleet(devices: list[Device], bundles: list[LocalBundle], options: dict[str, Any] | None = None,
                targets: list[str] | None = None, trust_new_host_keys: bool = False, jobs: int = 4,
                verify: bool = False, db=None, progress: Progress = lambda s: None,
                run_id: str | None = None) -> FleetResult:
    """Push what is missing and bench every matching (device, bundle); see ``edgeopt bench --help``.
    ``run_id``: the run these records belong to (one for a whole ``--batch 1,4,8`` curve); new if None."""
    opts = {**DEFAULT_OPTIONS, **(options or {})}
    work, skipped = plan(devices, bundles, targets)
    if not work:
        raise UsageError("nothing to bench: " + "; ".join(f"{s['device']}: {s['reason']}" for s in skipped),
                         hint="check the devices' `target` against the bundles under --dist (edgeopt devices)")
    result = FleetResult(run_id or uuid.uuid4().hex[:12], skipped=skipped)
    lock = threading.Lock()
    t0 = time.perf_counter()

    def add(rec: RunRecord) -> None:
        with lock:
            result.records.append(rec)
            if db is not None:
                db.add(rec.as_dict())

    live: dict[str, Any] = {}  # device -> its open transport, closed at once on Ctrl-C
    stopping = [False]

    def quiet(line: str) -> None:  # after Ctrl-C, the workers' lines would bury the summary
        if not stopping[0]:
            progress(line)

    try:
        _in_daemon_threads(lambda w: _one_device(w[0], w[1], opts, result.run_id, trust_new_host_keys, verify,
                                                 add, result.pushes, lock, quiet, live), work, jobs)
    except KeyboardInterrupt:
        # Ctrl-C: every open connection is closed now (no bench waits for its stall deadline), the devices
        # that finished are named with their records (already stored), and the interrupt goes on (exit 130)
        stopping[0] = True
        for tr in list(live.values()):
            with contextlib.suppress(Exception):
                (getattr(tr, "abort", None) or tr.close)()
        with lock:
            recs = list(result.records)
        for d, mine in work:
            got = [r for r in recs if r.device.get("name") == d.name]
            if got and len(got) >= len(mine):
                progress(f"{d.name}: done before the interrupt: "
                         + ", ".join(f"{r.bundle.get('model')} {r.bundle.get('target')}-{r.bundle.get('precision')} "
                                     f"{r.status}" for r in got) + (" (stored)" if db is not None else ""))
            else:
                progress(f"{d.name}: interrupted" + (f" after {len(got)} of {len(mine)} bundle(s)" if got else ""))
        raise
    result.time_s = round(time.perf_counter() - t0, 3)
    if db is not None and getattr(db, "unsaved", None):  # the database filled meanwhile: keep the measurements
        result.unsaved = db.save_unsaved(result.run_id)
    return result


def _one_device(dev: Device, bundles: list[LocalBundle], opts: dict[str, Any], run_id: str, trust_new: bool,
                verify: bool, add: Callable[[RunRecord], None], pushes: list, lock: threading.Lock,
                progress: Progress, live: dict[str, Any] | None = None) -> None:
    def rec(b: LocalBundle, status: str, error: dict[str, Any] | None = None, **kw) -> RunRecord:
        return RunRecord(run_id, now_iso(), dev.public(), b.describe(), status, error, **kw)

    def err(exc: DeviceError) -> dict[str, Any]:
        return {"type": type(exc).__name__, "message": exc.message, "hint": exc.hint}

    progress(f"{dev.name}: connecting")
    try:
        tr = connect(dev, trust_new_host_keys=trust_new, progress=progress)
    except DeviceError as exc:
        status = "refused" if isinstance(exc, (HostKeyError, AuthFailed)) else "unreachable"
        progress(f"{dev.name}: {status.upper()}: {exc.message}")
        for b in bundles:
            add(rec(b, status, err(exc)))
        return
    pending = list(bundles)  # a bundle leaves only once its record is written
    probe = None
    if live is not None:
        live[dev.name] = tr
    try:
        with DeviceSession(dev, tr, progress) as sess:
            sess.ensure_agent()
            probe = sess.probe()
            push = sess.push(bundles, verify=verify)
            with lock:
                pushes.append(push.as_dict())
            by_id = {p.bundle_id: p for p in push.bundles}
            while pending:
                b = pending[0]
                p = by_id[b.bundle_id]
                if p.status == "failed":
                    add(rec(b, "failed", {"type": "PushFailed", "message": p.error}, probe=probe, push=asdict(p)))
                else:
                    add(_bench_one(sess, b, opts, probe, asdict(p), rec, progress))
                pending.pop(0)
    except DeviceError as exc:  # the connection died or the agent cannot run: what is left fails with it
        status = "refused" if isinstance(exc, ReplyNotBelievable) else "failed"
        progress(f"{dev.name}: {status.upper()}: {exc.message}")
        for b in pending:
            add(rec(b, status, err(exc), probe=probe))
    finally:
        if live is not None:
            live.pop(dev.name, None)


def _bench_one(sess: DeviceSession, b: LocalBundle, opts: dict[str, Any], probe: dict[str, Any],
               push: dict[str, Any], rec, progress: Progress) -> RunRecord:
    name = sess.device.name
    tag = f"{b.model} {b.target}-{b.precision}"
    mine = sess.device.bench_options  # a device's own settings (threads, limits ...) win
    opts = {**opts, **mine, "limits": {**(opts.get("limits") or {}), **(mine.get("limits") or {})}}
    progress(f"{name}: bench {tag}")
    # The agent enforces timeout_s on the runtime; the host waits a margin longer for load and reply.
    timeout = float(opts.get("timeout_s") or 300) + 60
    try:
        reply = sess.agent("bench", {"root": sess.root, "bundle_id": b.bundle_id, "options": opts}, timeout=timeout)
    except DeviceError as exc:
        if isinstance(exc, ConnectionLost):
            raise
        # a reply that cannot be true is refused: nothing of it is kept (edgeopt.replies)
        status = "refused" if isinstance(exc, ReplyNotBelievable) else "failed"
        progress(f"{name}: {tag}: {status.upper()}: {exc.message}")
        return rec(b, status, {"type": type(exc).__name__, "message": exc.message, "hint": exc.hint}, probe=probe,
                   push=push)
    agent = reply.get("agent")
    if not reply.get("ok"):
        err = dict(reply.get("error") or {})
        err.pop("traceback", None)
        status = {"RuntimeCrashed": "crashed", "RuntimeHung": "hung"}.get(err.get("type"), "failed")
        progress(f"{name}: {tag}: {status.upper()}: {reply_error(reply)}")
        return rec(b, status, err, bench=reply.get("bench"), probe=probe, push=push, agent=agent)
    bench = reply.get("bench") or {}
    acc = bench.get("accuracy") or {}
    lat = bench.get("latency_ms") or {}
    if acc.get("passed") is False:
        bad = [f"{n}: {', '.join(o.get('reasons') or ['failed'])}" for n, o in (acc.get("outputs") or {}).items()
               if not o.get("passed")]
        progress(f"{name}: {tag}: ACCURACY MISMATCH on the device: {'; '.join(bad)[:200]}")
        return rec(b, "mismatch", {"type": "AccuracyMismatch", "message": "; ".join(bad)}, bench=bench,
                   probe=probe, push=push, agent=agent)
    env = bench.get("environment") or {}
    emulated = (f" (EMULATED by {env.get('emulator') or 'an emulator'}: the emulator's speed, not a latency "
                "measurement)") if env.get("emulated") else ""
    progress(f"{name}: {tag}: p50 {lat.get('p50', float('nan')):.2f} ms, "
             f"{bench.get('throughput_ips', float('nan')):.1f}/s over {bench.get('iterations')} iterations{emulated}")
    return rec(b, "ok", None, bench=bench, probe=probe, push=push, agent=agent)
