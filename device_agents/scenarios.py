"""Load scenarios on the device: MLPerf LoadGen (single-stream, multi-stream, server, offline) when the
``mlperf_loadgen`` module is installed there, else the agent's own loops, labelled as such.

Called in the bench child after the warm-up (``bench.run_bench`` with option ``scenario``), with the
runner's ``run`` and the bundle's validation inputs already in the artifact's layout.  The system
under test really queues: LoadGen issues queries on its own schedule from its thread, a worker thread
takes them from a queue one at a time, and LoadGen measures each latency from the query's *scheduled*
issue time, so an overloaded device cannot hide its queue (the coordinated-omission trap).  Results are
LoadGen's own, parsed from its summary log: VALID/INVALID with its reasons, scheduled and completed
rates, percentiles and early-stopping estimates; the logs are returned.  Run lengths follow the
``duration_s`` option; too few queries for a percentile are reported INVALID by LoadGen, never rounded.

Standard library + numpy; LoadGen is an optional import.
"""

from __future__ import annotations

import math
import queue
import re
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SCENARIOS = ("single-stream", "multi-stream", "server", "offline")
LOADGEN_SCENARIO = {"single-stream": "SingleStream", "multi-stream": "MultiStream", "server": "Server",
                    "offline": "Offline"}
SEED = 20261122


class ScenarioError(Exception):
    """A scenario request that makes no sense (bad scenario, QPS, percentile)."""


def check(opts: dict[str, Any]) -> None:
    s = opts.get("scenario")
    if s is None:
        return
    if s not in SCENARIOS:
        raise ScenarioError(f"unknown scenario {s!r}; scenarios: {', '.join(SCENARIOS)}")
    qps = opts.get("target_qps")
    if s == "server" and (not isinstance(qps, (int, float)) or isinstance(qps, bool) or not qps > 0):
        raise ScenarioError(f"the server scenario needs target_qps > 0, got {qps!r}")
    if s != "server" and qps is not None and s != "offline":
        raise ScenarioError(f"target_qps applies to the server (and offline) scenario, not {s}")
    spq = opts.get("samples_per_query")
    if spq is not None and s != "multi-stream":
        raise ScenarioError("samples_per_query applies to the multi-stream scenario only")
    if spq is not None and (not isinstance(spq, int) or isinstance(spq, bool) or spq < 1):
        raise ScenarioError(f"samples_per_query must be an integer >= 1, got {spq!r}")
    pct = opts.get("latency_percentile")
    if pct is not None and not (isinstance(pct, (int, float)) and 0 < pct < 100):
        raise ScenarioError(f"latency_percentile must be in (0, 100), got {pct!r}")


def loadgen_available() -> bool:
    try:
        import mlperf_loadgen  # noqa: F401
    except ImportError:
        return False
    return True


def run(run_fn: Callable[[Any], Any], feeds: Sequence[Any], opts: dict[str, Any]) -> dict[str, Any]:
    """One scenario run; ``opts``: scenario, duration_s, target_qps, samples_per_query, engine."""
    check(opts)
    engine = opts.get("engine") or ("loadgen" if loadgen_available() else "edgeopt")
    if engine == "loadgen":
        if not loadgen_available():
            raise ScenarioError("LoadGen is not installed on this device: pip install mlcommons-loadgen "
                                "(or ask for engine 'edgeopt', the agent's own loops)")
        return _loadgen(run_fn, feeds, opts)
    if opts["scenario"] not in ("single-stream", "server"):
        raise ScenarioError(f"the {opts['scenario']} scenario needs LoadGen on the device "
                            "(pip install mlcommons-loadgen)")
    return _own(run_fn, feeds, opts)


# ---- LoadGen ----------------------------------------------------------------------------------


def _loadgen(run_fn, feeds, opts) -> dict[str, Any]:
    import mlperf_loadgen as lg

    scenario = opts["scenario"]
    n = len(feeds)
    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, LOADGEN_SCENARIO[scenario])
    settings.mode = lg.TestMode.PerformanceOnly
    dur_ms = int(float(opts.get("duration_s", 3.0)) * 1000)
    settings.min_duration_ms = dur_ms
    settings.max_duration_ms = max(dur_ms * 4, dur_ms + 10_000)
    settings.min_query_count = int(opts.get("min_queries") or 1)
    settings.qsl_rng_seed = settings.sample_index_rng_seed = settings.schedule_rng_seed = SEED
    if scenario == "server":
        settings.server_target_qps = float(opts["target_qps"])
        if opts.get("latency_bound_ms"):
            settings.server_target_latency_ns = int(float(opts["latency_bound_ms"]) * 1e6)
        if opts.get("latency_percentile"):
            settings.server_target_latency_percentile = float(opts["latency_percentile"]) / 100
    elif scenario == "offline":
        settings.offline_expected_qps = float(opts.get("target_qps") or 100.0)
    elif scenario == "multi-stream":
        settings.multi_stream_samples_per_query = int(opts.get("samples_per_query") or 8)
        if opts.get("latency_bound_ms"):
            settings.multi_stream_expected_latency_ns = int(float(opts["latency_bound_ms"]) * 1e6)
    elif opts.get("latency_bound_ms"):
        settings.single_stream_expected_latency_ns = int(float(opts["latency_bound_ms"]) * 1e6)

    work: queue.Queue = queue.Queue()
    served = [0]

    def worker() -> None:
        while True:
            items = work.get()
            if items is None:
                return
            responses = []
            for qs in items:
                run_fn(feeds[qs.index % n])
                responses.append(lg.QuerySampleResponse(qs.id, 0, 0))
            served[0] += len(responses)
            lg.QuerySamplesComplete(responses)

    def issue(query_samples) -> None:  # LoadGen's thread: never block it, queue the work
        work.put(list(query_samples))

    def flush() -> None:
        pass

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    sut = lg.ConstructSUT(issue, flush)
    qsl = lg.ConstructQSL(n, n, lambda idx: None, lambda idx: None)
    out = Path(tempfile.mkdtemp(prefix="edgeopt-loadgen-"))
    log = lg.LogOutputSettings()
    log.outdir = str(out)
    log.copy_summary_to_stdout = False
    log_settings = lg.LogSettings()
    log_settings.log_output = log
    log_settings.enable_trace = False
    t0 = time.perf_counter()
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings, log_settings)
    finally:
        work.put(None)
        t.join(timeout=60)
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    wall = time.perf_counter() - t0
    summary_text = _read(out / "mlperf_log_summary.txt")
    res = parse_summary(summary_text)
    res.update({"engine": "loadgen", "loadgen_version": _lg_version(), "scenario": scenario, "wall_s": round(wall, 3),
                "samples_served": served[0], "seeds": SEED, "summary_log": summary_text[-6000:],
                "detail_log_tail": _read(out / "mlperf_log_detail.txt")[-3000:]})
    return res


def _lg_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("mlcommons-loadgen")
    except Exception:  # noqa: BLE001
        return None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


_NUM = r"([-+0-9.eE]+)"


def parse_summary(text: str) -> dict[str, Any]:
    """LoadGen's summary log → numbers (latencies in ms)."""
    out: dict[str, Any] = {"valid": None, "latency_ms": {}, "early_stopping": {}}
    m = re.search(r"Result is\s*:\s*(VALID|INVALID)", text)
    if m:
        out["valid"] = m.group(1) == "VALID"
    for key, pat in (("scheduled_qps", r"Scheduled samples per second\s*:\s*" + _NUM),
                     ("completed_qps", r"Completed samples per second\s*:\s*" + _NUM),
                     ("samples_per_second", r"Samples per second\s*:\s*" + _NUM),
                     ("queries_per_second", r"Queries per second\s*:\s*" + _NUM)):
        m = re.search(pat, text)
        if m:
            out[key] = float(m.group(1))
    for m in re.finditer(r"(\d+\.\d+) percentile latency \(ns\)\s*:\s*(\d+)", text):
        out["latency_ms"][f"p{float(m.group(1)):g}"] = int(m.group(2)) / 1e6
    for key, pat in (("min", r"Min latency \(ns\)\s*:\s*(\d+)"), ("max", r"Max latency \(ns\)\s*:\s*(\d+)"),
                     ("mean", r"Mean latency \(ns\)\s*:\s*(\d+)")):
        m = re.search(pat, text)
        if m:
            out["latency_ms"][key] = int(m.group(1)) / 1e6
    for m in re.finditer(r"Early stopping (\d+\.\d+)th percentile estimate\s*:\s*(\d+)", text):
        out["early_stopping"][f"p{float(m.group(1)):g}"] = int(m.group(2)) / 1e6
    checks = {m.group(1).strip(): m.group(2).strip() == "Yes"
              for m in re.finditer(r"^\s+([A-Za-z ]+satisfied)\s*:\s*(Yes|NO|No)\s*$", text, flags=re.M)}
    out["checks"] = checks
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        out["invalid_reasons"] = bad
    es = re.search(r"Early Stopping Result:\n((?: \*.*\n?| .*\n?)+)", text)
    if es:
        out["early_stopping_note"] = " ".join(x.strip(" *") for x in es.group(1).splitlines()).strip()
    return out


# ---- the agent's own loops (no LoadGen on the device) -------------------------------------------


def _own(run_fn, feeds, opts) -> dict[str, Any]:
    """single-stream: one query after another; server: Poisson arrivals at target_qps, an open loop,
    latency counted from each query's scheduled arrival (queueing included)."""
    n = len(feeds)
    dur = float(opts.get("duration_s", 3.0))
    lat: list[float] = []
    t_start = time.perf_counter()
    if opts["scenario"] == "single-stream":
        i = 0
        while time.perf_counter() - t_start < dur or i < 64:
            t0 = time.perf_counter()
            run_fn(feeds[i % n])
            lat.append(time.perf_counter() - t0)
            i += 1
        issued = len(lat)
    else:
        rng = np.random.default_rng(SEED)
        qps = float(opts["target_qps"])
        gaps = rng.exponential(1 / qps, size=max(64, int(dur * qps * 1.2) + 64))
        sched = np.cumsum(gaps)
        sched = sched[sched < max(dur, sched[min(63, len(sched) - 1)])]
        for i, at in enumerate(sched):
            now = time.perf_counter() - t_start
            if now < at:
                time.sleep(at - now)
            run_fn(feeds[i % n])
            lat.append(time.perf_counter() - t_start - at)  # from the scheduled arrival: the queue counts
        issued = len(sched)
    wall = time.perf_counter() - t_start
    a = np.asarray(lat) * 1000
    pct = {f"p{q:g}": float(np.percentile(a, q)) for q in (50, 90, 95, 99, 99.9)}
    enough = {"p90": len(a) >= 64, "p99": len(a) >= 662}
    res = {"engine": "edgeopt", "note": "LoadGen is not installed on this device: the agent's own "
                                        f"{'closed loop' if opts['scenario'] == 'single-stream' else 'open-loop Poisson server'}"
                                        " (not LoadGen's rules)",
           "scenario": opts["scenario"], "latency_ms": {**pct, "mean": float(a.mean())}, "queries": issued,
           "completed_qps": len(a) / wall if wall > 0 else None, "wall_s": round(wall, 3),
           "enough_samples": enough, "valid": None}
    if opts["scenario"] == "server":
        res["scheduled_qps"] = float(opts["target_qps"])
        bound = opts.get("latency_bound_ms")
        q = float(opts.get("latency_percentile") or 99)
        if bound:
            need = 662 if q >= 99 else 64 if q >= 90 else 1
            val = float(np.percentile(a, q))
            res["valid"] = bool(len(a) >= need and val <= float(bound))
            res["bound"] = {"percentile": q, "ms": float(bound), "measured_ms": val, "samples": len(a),
                            "samples_needed": need}
    if not math.isfinite(res["latency_ms"]["p50"]):
        res["valid"] = False
    return res
