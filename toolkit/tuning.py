"""``edgeopt tune``: the best configuration of a model per device, measured on the device.

The space: the targets' artifacts (backend × precision, each batch size built as its own bundle) ×
runtime threads. Each point is benched on the device (the agent's bench: the same harness, the same
results DB). A point is *feasible* when it is device truth (``edgeopt.decide.device_truth``, the report's
rule), the accuracy policy (``edgeopt.policy.accept.judge``: the gate's default rule, or ``accept``'s gate
file) accepts its bench's accuracy against the FP32 reference, its agreement met ``min_accuracy`` and its
latency met the SLO. The objective is the lowest p50 per request (``latency``, batch 1) or the highest
throughput (``throughput``, any batch).

Device truth is settled before anything is built, from each device's probe: a target whose artifacts
would be measured on the build host (``build-host``), on another vendor's CPU (``other-vendor``: an
intel-cpu bundle on an AMD CPU) or under emulation is never built, measured or picked there, and
``TuneResult.not_truth`` says why; when no target is device truth on any device, tune refuses before
building (exit 2). Every measured record is judged again by the same rule.

The search is not exhaustive when it need not be (``exhaustive=False``):
- threads are swept upward (1, 2, 4, … up to the device's cores) and the sweep of a bundle stops as
  soon as a step does not improve the objective by ``IMPROVE`` (runtimes stop scaling once the cores
  are busy; further steps only repeat a worse figure);
- batch sizes are tried upward per (target, precision) and stop once a batch misses the SLO at its
  best threads (a bigger batch only makes each request slower), or once throughput has not improved
  for two batch sizes in a row (one flat step can be the machine's noise: a pick 0.90 of the exhaustive
  best was seen when one step ended the sweep).
``exhaustive=True`` measures every point; ``bench/bench_tune.py`` compares both. Either way the best
``finalists`` (3) are then re-measured in ``confirm_rounds`` (2) interleaved rounds and the pick is made
on each finalist's median: one lucky run of a noisy sweep does not decide.

The winner of each device is written as a *tuned bundle*: the winning bundle's files with the
threads in ``runtime.options`` (the agent's runners read them as their default), under
``DIST/<model>/tuned/<device>/``; ``edgeopt bench``/``rollout`` take that folder like any other.
When the confirmation finds no clear winner (``edgeopt.decide``), the runner-up is written as a tuned
bundle too (``DIST/<model>/tuned/<device>-rival/``) and the verdict names the paired gate between the two
tuned folders -- only when ``edgeopt gate``'s own argument check (``hil.gate.check_pair``: one target, one
model, the same inputs) takes the pair; otherwise it says why no gate can compare them.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgeopt.errors import BuildFailed, UsageError

IMPROVE = 0.03  # a step must beat the best so far by 3% to keep a sweep going
BATCH_PATIENCE = 1  # batch sizes that may fail to improve before the batch sweep stops
_SLO = re.compile(r"^(p50|p90|p95|p99|p99\.9)\s*=\s*([0-9.]+)\s*(ms|s)?$")


@dataclass
class Point:
    device: str
    target: str
    precision: str
    batch: int
    threads: int
    bundle: str
    status: str  # ok | failed
    p50_ms: float | None = None
    p99_ms: float | None = None
    latency_ms: float | None = None  # the SLO's percentile
    throughput_ips: float | None = None
    agreement: float | None = None  # top-1 (or cosine) vs the FP32 reference, on the device
    feasible: bool = False
    why_not: str = ""
    run_id: str = ""
    confirm: int = 0  # 0: the sweep; 1, 2 …: a confirmation round of the finalists
    max_qps: float | None = None  # scenario server: the highest rate whose latency percentile meets the SLO
    truth: str = "device"  # edgeopt.decide.device_truth of the run: only "device" points can be picked
    accepted: bool | None = None  # the accuracy policy's word on the bench's accuracy (None: not measured)

    def objective(self, kind: str) -> float:
        """Bigger is better: throughput, or minus the per-request p50."""
        if kind == "throughput":
            return self.throughput_ips or 0.0
        return -(self.p50_ms or float("inf"))


@dataclass
class TuneResult:
    model: str
    objective: str
    slo: dict[str, float] | None
    min_accuracy: dict[str, float] | None
    exhaustive: bool
    points: list[Point] = field(default_factory=list)
    winners: dict[str, Point] = field(default_factory=dict)
    closest: dict[str, Point] = field(default_factory=dict)  # devices with no feasible point
    tuned: dict[str, str] = field(default_factory=dict)  # device -> tuned bundle folder
    # device -> the confirmation's verdict (edgeopt.decide, as the report's SHIP): ratio, interval, or
    # "no clear winner" and the more faithful finalist
    verdicts: dict[str, dict[str, Any]] = field(default_factory=dict)
    build_s: float = 0.0
    sweep_s: float = 0.0
    skipped: list[dict[str, str]] = field(default_factory=list)
    # (device, target) pairs that would not be device truth: never built for, measured or picked there
    not_truth: list[dict[str, str]] = field(default_factory=list)
    rivals: dict[str, str] = field(default_factory=dict)  # device -> the runner-up's tuned folder (no clear winner)
    accept: Any = None  # the accuracy policy's gate file (None: the gate's defaults)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["benches"] = len(self.points)
        return d


def parse_slo(text: str | None) -> dict[str, float] | None:
    """``p99=20ms`` (or ``p90=0.05s``) -> ``{"p99": 20.0}`` in ms."""
    if not text:
        return None
    m = _SLO.match(text.strip().lower())
    if not m:
        raise UsageError(f"--latency-bound: expected PERCENTILE=LATENCY such as p99=20ms, got {text!r}",
                         hint="percentiles: p50, p90, p95, p99, p99.9")
    value = float(m.group(2)) * (1000.0 if m.group(3) == "s" else 1.0)
    if not value > 0:
        raise UsageError(f"--latency-bound must be above 0, got {text!r}")
    return {m.group(1).replace(".", "_"): value}


def parse_min_accuracy(text: str | None) -> dict[str, float] | None:
    """``top1=0.99`` or ``cosine=0.999`` (agreement with the FP32 reference, measured on the device)."""
    if not text:
        return None
    key, sep, value = text.strip().partition("=")
    key = key.strip().lower()
    try:
        v = float(value.rstrip("%")) / (100.0 if value.strip().endswith("%") else 1.0)
    except ValueError:
        v = -1.0
    if not sep or key not in ("top1", "cosine") or not 0 < v <= 1:
        raise UsageError(f"--min-accuracy: expected top1=0.99 or cosine=0.999, got {text!r}")
    return {key: v}


def thread_steps(cores: int, given: list[int] | None) -> list[int]:
    if given:
        return sorted(set(given))
    steps, t = [], 1
    while t < cores:
        steps.append(t)
        t *= 2
    return [*steps, max(1, cores)]


def _truth(dev, target: str, probe: dict[str, Any]) -> tuple[str, str | None]:
    """``edgeopt.decide.device_truth`` (the report's rule) for a ``target`` bundle run on ``dev``, from the
    device's probe: known before anything is built or measured."""
    from edgeopt.decide import device_truth

    cpu = probe.get("cpu") if isinstance(probe.get("cpu"), dict) else {}
    env = {"cpu_model": cpu.get("model"), "emulated": probe.get("emulated")}
    return device_truth({"bundle": {"target": target}, "device": {"name": dev.name, "transport": dev.transport},
                         "bench": {"environment": env}, "probe": probe})


def _record_point(rec, dev: str, bundle, batch: int, threads: int, slo, min_acc, accept_spec=None) -> Point:
    from edgeopt.decide import device_truth
    from edgeopt.policy.accept import judge

    b = rec.bundle
    p = Point(dev, b.target or "", b.precision or "", batch, threads, str(bundle.path), rec.status,
              run_id=rec.run_id)
    p.truth, truth_why = device_truth(rec.as_dict())
    if not rec.ok:
        p.why_not = ((rec.error.message if rec.error else "") or rec.status)[:200]
        return p
    bench = rec.bench or {}
    lat = bench.get("latency_ms") or {}
    p.p50_ms, p.p99_ms = lat.get("p50"), lat.get("p99")
    p.throughput_ips = bench.get("throughput_ips")
    sc = bench.get("scenario")
    if sc:  # offline: LoadGen's images/s over the burst
        p.throughput_ips = sc.get("images_per_second") or sc.get("samples_per_second")
        if not p.throughput_ips:
            p.status, p.why_not = "failed", "the offline scenario reported no rate"
            return p
    acc = bench.get("accuracy") or {}
    metrics = [o.get("metrics") or {} for o in (acc.get("outputs") or {}).values()]
    key = next(iter(min_acc)) if min_acc else "top1"
    vals = [m[key] for m in metrics if isinstance(m.get(key), (int, float))]
    if not vals and key == "top1":
        vals = [m["cosine"] for m in metrics if isinstance(m.get("cosine"), (int, float))]
    p.agreement = min(vals) if vals else None
    why = []
    if p.truth != "device":  # the report's rule: such a row is never a SHIP, so never a pick
        why.append(f"not device truth ({p.truth}: {truth_why}), never picked")
    verdict = judge(acc or None, accept_spec)  # the one accuracy policy, as the host check and the report judge
    p.accepted = verdict.accepted
    if verdict.refused:
        why.append(f"refused by the accuracy policy ({verdict.metric}): {verdict.reason}")
    if min_acc:
        k, v = next(iter(min_acc.items()))
        if p.agreement is None or p.agreement < v:
            why.append(f"{k} {p.agreement if p.agreement is not None else 'n/a'} < {v}")
    if slo:
        k, v = next(iter(slo.items()))
        p.latency_ms = lat.get(k)
        if p.latency_ms is None or p.latency_ms > v:
            why.append(f"{k} {p.latency_ms:.2f} ms > {v:g} ms" if p.latency_ms is not None else f"no {k}")
    p.feasible, p.why_not = not why, "; ".join(why)
    return p


def tune(model: str, targets: str, devices: str = "local", limit: str | list[str] | None = None,
         labels: str | list[str] | None = None, precision: str = "fp32,int8", batches: list[int] | None = None, threads: list[int] | None = None,
         slo: str | None = None, min_accuracy: str | None = None, objective: str | None = None,
         shapes: Any = None, calib: str | None = None, preprocess: str | None = None, dist: str = "dist",
         duration: float = 1.0, exhaustive: bool = False, db: str | None = None, jobs: int = 2,
         confirm_rounds: int = 2, finalists: int = 3, scenario: str | None = None,
         trust_new_host_keys: bool = False, accept: str | Path | dict[str, Any] | None = None,
         progress: Callable[[str], None] = lambda s: None, output_kind: Any = None,
         decision: Any = None) -> TuneResult:
    """Build the candidates, sweep them on each device, pick and write the winner per device.

    ``scenario="offline"``: each point's throughput is MLPerf LoadGen's offline scenario (a burst of
    samples served in the point's batches, images/s) instead of the single-stream loop's, so the pick
    is the batch and threads the offline scenario runs best with. ``scenario="server"``: each point that
    meets the goals in single-stream is then searched for the highest server rate whose latency
    percentile keeps the SLO (``maxqps.search``: LoadGen's VALID where installed); that rate (x batch)
    is its throughput.

    ``accept``: the accuracy policy's gate file (``--accept``, as for build): the candidates are built under
    it and every measured point is judged by it (None: the gate's defaults)."""
    from edgeopt import api
    from edgeopt.deploy import load_bundle
    from edgeopt.fleetbench import plan
    from edgeopt.model import inspect, static_input_shapes

    batches = sorted(set(batches or [1]))
    if any(b < 1 for b in batches) or any(t < 1 for t in threads or []):
        raise UsageError("--batch and --threads values must be at least 1")
    asked = objective  # as given: a scenario refuses an explicit latency objective, not the default
    objective = objective or ("throughput" if batches != [1] or scenario else "latency")
    if objective not in ("latency", "throughput"):
        raise UsageError(f"--objective must be latency or throughput, not {objective!r}")
    if objective == "latency" and batches != [1]:
        raise UsageError("--objective latency is per request at batch 1; drop --batch or use --objective throughput")
    if scenario not in (None, "offline", "server"):
        raise UsageError(f"tune --scenario takes offline or server, not {scenario!r}")
    if scenario == "server":
        if not slo:
            raise UsageError("tune --scenario server needs --latency-bound (e.g. p99=20ms): the bound the server rate "
                             "must keep")
        if asked == "latency":
            raise UsageError("tune --scenario server maximises the server rate under --latency-bound: drop "
                             "--objective latency")
        objective = "throughput"
    if scenario == "offline":
        if asked == "latency" or slo:
            raise UsageError("the offline scenario has no per-request latency to bound or minimise: drop "
                             "--latency-bound/--objective latency, or leave out --scenario")
        objective = "throughput"
    slo_d, acc_d = parse_slo(slo), parse_min_accuracy(min_accuracy)
    if not duration > 0:
        raise UsageError(f"--duration must be above 0 s, got {duration}")
    from edgeopt.policy.accept import mapping_of, spec_of
    from edgeopt.targets.registry import resolve_targets

    accept_map = mapping_of(accept)  # a bad gate file: exit 2 before anything is built
    accept_spec = spec_of(accept_map)
    names = [t.name for t in resolve_targets(targets)]
    devs = api.select_devices(devices, limit, labels)
    info = inspect(model)
    base = static_input_shapes(info, api.parse_shapes(shapes) or {})
    result = TuneResult(info.name, objective, slo_d, acc_d, exhaustive,
                        accept=str(accept) if isinstance(accept, (str, Path)) else accept_map)

    # 0. device truth, from each device's probe, before anything is built (the report's rule)
    probes = {dev.name: _probe(dev, trust_new_host_keys) for dev in devs}
    off: set[tuple[str, str]] = set()
    for dev in devs:
        for t in names:
            kind, why = _truth(dev, t, probes[dev.name])
            if kind != "device":
                off.add((dev.name, t))
                result.not_truth.append({"device": dev.name, "target": t, "truth": kind, "why": why or ""})
                progress(f"{dev.name}: {t} is not device truth there ({kind}: {why}): never measured or picked")
    usable = [t for t in names if any((d.name, t) not in off for d in devs)]
    if not usable:
        raise UsageError("nothing to tune: " + "; ".join(f"{x['target']} on {x['device']} is not device truth "
                                                          f"({x['truth']}: {x['why']})" for x in result.not_truth),
                         hint="tune a target on its own hardware (an inventory device of that target and vendor), "
                              "or add a target this device runs natively (e.g. -t cpu)")

    # 1. the candidate bundles: one build per batch size (the batch is part of the artifact's shape)
    t0 = time.perf_counter()
    built: dict[int, list] = {}
    for b in batches:
        progress(f"building batch {b}: {targets} × {precision}")
        rep = api.build(model, ",".join(usable), precision=precision, shape=api.batch_shapes(base, b), calib=calib,
                        preprocess=preprocess, dist=Path(dist) / "tune" / f"batch{b}", jobs=jobs, progress=progress,
                        raise_on_failure=False, accept=accept_map, output_kind=output_kind, decision=decision)
        for r in rep.results:
            if r.ok:
                built.setdefault(b, []).append(load_bundle(r.bundle))
            else:
                result.skipped.append({"target": r.target, "precision": r.precision, "batch": str(b),
                                       "reason": f"{r.status}: {(r.error or r.status).splitlines()[0][:160]}"})
    result.build_s = round(time.perf_counter() - t0, 2)
    if not built:
        raise BuildFailed("no candidate built: " + "; ".join(f"{s['target']} {s['precision']} batch {s['batch']}: "
                                                           f"{s['reason']}" for s in result.skipped))

    # 2. the sweep, per device
    t1 = time.perf_counter()
    for dev in devs:
        steps = thread_steps(_cores(probes[dev.name]), threads)
        mine: dict[tuple[str, str], dict[int, Any]] = {}
        for b, bundles in built.items():
            work, _ = plan([dev], bundles)
            for _, bs in work:
                for bundle in bs:
                    if (dev.name, bundle.target) not in off:
                        mine.setdefault((bundle.target, bundle.precision), {})[b] = bundle
        if not mine:
            lost = [x for x in result.not_truth if x["device"] == dev.name]
            result.skipped.append({"device": dev.name, "reason": "no candidate bundle runs on this device" + (
                " as device truth (" + "; ".join(f"{x['target']}: {x['truth']}" for x in lost) + ")" if lost else "")})
            continue
        rates: dict[tuple[str, str], float] = {}  # the best images/s seen: the next offline burst's size
        for (target, prec), per_batch in sorted(mine.items()):
            best_prev: Point | None = None
            stale = 0  # batch sizes in a row that did not beat the best so far
            for b in sorted(per_batch):
                bundle = per_batch[b]
                best_here: Point | None = None
                for t in steps:
                    progress(f"{dev.name}: {target} {prec} batch {b} threads {t}")
                    fr = api.bench(devices=devices, limit=dev.name, bundles=[bundle], threads=t, batch=b,
                                   duration=duration, min_iters=20, warmup="0.3s", db=db,
                                   trust_new_host_keys=trust_new_host_keys, raise_on_failure=False,
                                   **_scenario_args(scenario, rates.get((target, prec))))
                    recs = [r for r in fr.records if r.device.name == dev.name]
                    if not recs:
                        break
                    p = _record_point(recs[0], dev.name, bundle, b, t, slo_d, acc_d, accept_spec)
                    if scenario == "server":
                        _server_rate(p, bundle, dev, slo_d, trust_new_host_keys, progress)
                    result.points.append(p)
                    if p.throughput_ips:
                        rates[(target, prec)] = max(rates.get((target, prec)) or 0.0, p.throughput_ips)
                    if p.status != "ok":
                        break
                    improved = best_here is None or p.objective(objective) > best_here.objective(objective) * (
                        1 + IMPROVE if objective == "throughput" else 1 - IMPROVE)
                    if best_here is None or p.objective(objective) > best_here.objective(objective):
                        best_here = p
                    if not exhaustive and not improved:
                        break
                if exhaustive or best_here is None:
                    continue
                # bigger batches only add latency: stop once this one misses the SLO, or stops paying
                if slo_d and best_here.latency_ms is not None and best_here.latency_ms > next(iter(slo_d.values())):
                    break
                if best_prev is not None and best_here.objective(objective) <= best_prev.objective(objective) * (
                        1 + IMPROVE):
                    stale += 1
                    if stale > BATCH_PATIENCE:  # one flat step may be the machine's noise; two end the sweep
                        break
                else:
                    stale = 0
                if best_prev is None or best_here.objective(objective) > best_prev.objective(objective):
                    best_prev = best_here
        pts = [p for p in result.points if p.device == dev.name and p.status == "ok"]
        feasible = [p for p in pts if p.feasible]
        if len(feasible) > 1 and confirm_rounds:
            feasible = _confirm(feasible, objective, confirm_rounds, finalists, result, dev, devices, duration, db,
                                trust_new_host_keys, slo_d, acc_d, progress, scenario, accept_spec)
        if feasible:
            win = max(feasible, key=lambda p: p.objective(objective))
            shipped = (result.verdicts.get(dev.name) or {}).get("ship")
            if shipped:  # the confirmation's verdict: the interval decides, not the lowest median alone
                win = next((p for p in feasible if _label(p) == shipped), win)
            result.winners[dev.name] = win
            result.tuned[dev.name] = str(write_tuned(Path(win.bundle), Path(dist) / info.name / "tuned" / dev.name,
                                                     win, result))
            if dev.name in result.verdicts:
                _paired(result, dev, win, feasible, devices, Path(dist) / info.name / "tuned" / f"{dev.name}-rival")
        elif [p for p in pts if p.truth == "device"]:  # the closest is one the report could ship
            result.closest[dev.name] = min((p for p in pts if p.truth == "device"), key=lambda p: _miss(p, slo_d, acc_d))
    result.sweep_s = round(time.perf_counter() - t1, 2)
    return result


def _confirm(feasible: list[Point], objective: str, rounds: int, finalists: int, result: TuneResult, dev,
             devices, duration: float, db, trust_new: bool, slo, acc, progress,
             scenario: str | None = None, accept_spec=None) -> list[Point]:
    """Re-measure the best ``finalists`` in ``rounds`` interleaved rounds (A B C A B C) and return one
    point per finalist carrying its *median* figures: the pick rests on repeated, interleaved figures,
    not on the luckiest single run of a noisy sweep (the winner's curse)."""
    import statistics

    from edgeopt import api
    from edgeopt.deploy import load_bundle

    top = sorted(feasible, key=lambda p: -p.objective(objective))[:finalists]
    runs: dict[int, list[Point]] = {i: [p] for i, p in enumerate(top)}
    records: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(top))}
    for r in range(1, rounds + 1):
        for i, p in enumerate(top):
            progress(f"{dev.name}: confirming {p.target} {p.precision} batch {p.batch} threads {p.threads} "
                     f"(round {r}/{rounds})")
            bundle = load_bundle(p.bundle)
            fr = api.bench(devices=devices, limit=dev.name, bundles=[bundle], threads=p.threads, batch=p.batch,
                           duration=duration, min_iters=20, warmup="0.3s", db=db, trust_new_host_keys=trust_new,
                           raise_on_failure=False, **_scenario_args(scenario, p.throughput_ips))
            recs = [x for x in fr.records if x.device.name == dev.name]
            if recs:
                q = _record_point(recs[0], dev.name, bundle, p.batch, p.threads, slo, acc, accept_spec)
                if scenario == "server":
                    _server_rate(q, bundle, dev, slo, trust_new, progress)
                q.confirm = r
                result.points.append(q)
                if q.status == "ok":
                    runs[i].append(q)
                    records[i].append(recs[0].as_dict())
    out = []
    rows = []
    for i, ps in runs.items():
        med = Point(**{**asdict(ps[0]), "confirm": len(ps)})
        for attr in ("p50_ms", "p99_ms", "throughput_ips", "latency_ms", "max_qps"):
            vals = [getattr(x, attr) for x in ps if getattr(x, attr) is not None]
            setattr(med, attr, statistics.median(vals) if vals else None)
        med.feasible = all(x.feasible for x in ps)  # a finalist that missed the goals once is out
        med.why_not = "; ".join(sorted({x.why_not for x in ps if x.why_not}))
        if med.feasible:
            out.append(med)
            if records[i]:
                rows.append(_confirm_row(med, records[i]))
    if objective == "latency" and len(rows) > 1:
        from edgeopt.decide import pick

        v = pick(rows, one_group=True)[0]
        result.verdicts[dev.name] = v.as_dict()
        progress(f"{dev.name}: {v.line}")
    return out or top


def _label(p: Point) -> str:
    return f"{p.target}-{p.precision} batch {p.batch} threads {p.threads}"


def _confirm_row(med: Point, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One finalist as a comparison row for ``edgeopt.decide``: its last confirmation run, with the latency
    samples of all its confirmation rounds; its device truth is the report's (``row_of``): a finalist is
    device truth, or it would not be feasible."""
    from edgeopt.reporting import row_of

    rows = [row_of(r) for r in records]
    row = dict(rows[-1])
    row["_samples"] = [x for r in rows for x in (r.get("_samples") or [])]
    row["label"] = _label(med)
    row["p50_ms"] = med.p50_ms  # the median of the rounds, as the pick before a verdict was
    return row


def _server_rate(p: Point, bundle, dev, slo: dict[str, float], trust_new: bool, progress) -> None:
    """The highest server rate at which the point keeps its SLO percentile (bisection, ``maxqps.search``);
    it becomes the point's throughput (x batch). Points that already miss their goals are not searched."""
    from edgeopt.deploy import DeviceSession
    from edgeopt.errors import DeviceError
    from edgeopt.maxqps import search

    if p.status != "ok" or not p.feasible:
        return
    key, bound = next(iter(slo.items()))
    pct = float(key[1:].replace("_", "."))
    try:
        with DeviceSession.open(dev, trust_new) as sess:
            m = search(sess, bundle.bundle_id, bound, pct, threads=p.threads, progress=progress)
    except DeviceError as exc:
        p.feasible, p.why_not = False, f"server search failed: {exc.message}"[:200]
        return
    p.max_qps = m["max_qps"]
    p.throughput_ips = (m["max_qps"] or 0.0) * p.batch
    if not m["max_qps"]:
        p.feasible = False
        p.why_not = f"no server rate keeps {key} <= {bound:g} ms" + (f" ({m['note']})" if m.get("note") else "")


def _scenario_args(scenario: str | None, rate: float | None) -> dict[str, Any]:
    """bench arguments for a point: offline asks LoadGen for a burst of about the rate seen so far
    (``target_qps`` sizes the burst: rate x duration samples), 200/s before any was seen."""
    if scenario != "offline":
        return {}
    return {"scenario": "offline", "target_qps": round(1.2 * rate, 1) if rate else 200.0}


def _miss(p: Point, slo, acc) -> float:
    """How far a point is from feasible (relative), for "the closest" when nothing meets the goals."""
    miss = 0.0
    if slo and p.latency_ms is not None:
        miss += max(0.0, p.latency_ms / next(iter(slo.values())) - 1)
    if acc and p.agreement is not None:
        miss += max(0.0, next(iter(acc.values())) - p.agreement)
    return miss


def _probe(dev, trust_new: bool) -> dict[str, Any]:
    """The device's probe ({} when it cannot be reached: the bench that follows says what is wrong)."""
    from edgeopt.deploy import DeviceSession
    from edgeopt.errors import DeviceError

    try:
        with DeviceSession.open(dev, trust_new) as s:
            return s.probe() or {}
    except DeviceError:
        return {}


def _cores(probe: dict[str, Any]) -> int:
    """The cores the device's agent may use (its probe), 1 when it cannot tell."""
    cpu = probe.get("cpu") if isinstance(probe.get("cpu"), dict) else {}
    return int(cpu.get("cores_usable") or cpu.get("cores") or cpu.get("logical") or 1)


PAIRED_SENTENCE = "; to separate them, measure them interleaved on the device: "


def _paired(result: TuneResult, dev, win: Point, feasible: list[Point], devices: str, rival_dir: Path) -> None:
    """No clear winner: the paired ``edgeopt gate`` that can separate the pick from its runner-up, between
    their tuned bundles (each with its threads), printed only when gate's own argument check
    (``hil.gate.check_pair``) takes the two; otherwise the verdict says why no gate can compare them.
    ``edgeopt.decide`` names a gate between the candidates' bundle folders: the wrong threads for a tune
    point, and across targets or batch sizes a gate refuses (exit 2)."""
    from edgeopt.deploy import load_bundle
    from edgeopt.hil.gate import check_pair

    v = result.verdicts[dev.name]
    if v.get("basis") != "fidelity" or not v.get("runner_up"):
        return
    rival = next((p for p in feasible if _label(p) == v["runner_up"]), None)
    old = f"{PAIRED_SENTENCE}{v.get('paired')}" if v.get("paired") else ""
    if rival is None:
        text = ""
    else:
        try:
            check_pair(load_bundle(Path(win.bundle)), load_bundle(Path(rival.bundle)))
        except UsageError as exc:
            text = (f"; no gate can compare {_label(rival)} with {_label(win)} ({exc.message}): more --confirm "
                    "rounds can separate them")
        else:
            rdir = write_tuned(Path(rival.bundle), rival_dir, rival, result)
            result.rivals[dev.name] = str(rdir)
            cmd = ["edgeopt", "gate", str(rdir), "--baseline", result.tuned[dev.name]]
            if dev.transport != "local" or str(devices) != "local":
                cmd += ["--devices", str(devices), "--limit", dev.name]
            v["paired"] = shlex.join(cmd)
            text = f"{PAIRED_SENTENCE}{v['paired']} (the two tuned bundles, each with its threads)"
    if not v.get("paired") or rival is None or text.startswith("; no gate"):
        v["paired"] = None
    line = v.get("line") or ""
    v["line"] = line.replace(old, text) if old and old in line else line + text


def write_tuned(src: Path, dest: Path, win: Point, result: TuneResult) -> Path:
    """A copy of the winning bundle with the tuned threads in ``runtime.options`` (a new bundle id)."""
    manifest = json.loads((src / "manifest.json").read_text())
    out = dest / src.name
    tmp = dest / f".{src.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    manifest["runtime"].setdefault("options", {})["threads"] = win.threads
    manifest["tuned"] = {"device": win.device, "threads": win.threads, "batch": win.batch,
                         "objective": result.objective, "slo": result.slo, "min_accuracy": result.min_accuracy,
                         "p50_ms": win.p50_ms, "p99_ms": win.p99_ms, "throughput_ips": win.throughput_ips,
                         "run_id": win.run_id, "from_bundle": src.name}
    from edgeopt.jsonsafe import dumps

    (tmp / "manifest.json").write_text(dumps(manifest, indent=1, sort_keys=True))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
