"""Load scenarios on the device: MLPerf LoadGen (single-stream, multi-stream, server, offline) when the
``mlperf_loadgen`` module is installed there, else the agent's own loops, labelled as such.

Called in the bench child after the warm-up (``bench.run_bench`` with option ``scenario``), with the
runner's ``run`` and the bundle's validation inputs already in the artifact's layout.  The system
under test really queues: LoadGen issues queries on its own schedule from its thread, a worker thread
takes them from a queue one at a time (single- and multi-stream with one worker: served in LoadGen's
issue callback instead, since LoadGen sends the next query only after the last one completes), and
LoadGen measures each latency from the query's *scheduled* issue time, so an overloaded device cannot
hide its queue (the coordinated-omission trap).  Results are LoadGen's own, parsed from its summary
log: VALID/INVALID with its reasons, scheduled and completed rates, percentiles and early-stopping
estimates; the logs are returned.  Run lengths follow the
``duration_s`` option; too few queries for a percentile are reported INVALID by LoadGen, never rounded.

``workers`` (default 1): how many threads serve queries at once, each with its own run function from
the runner (``Runner.worker``: the shared session where the runtime allows concurrent calls, else its
own infer request or instance) — the system under test's concurrency, as a serving process with N
model instances has.  ``concurrency`` is a closed-loop scenario of the agent's own (LoadGen has none):
C clients each send a query, wait for its answer and send the next, so exactly C are outstanding at
any time (Triton perf_analyzer's concurrency mode); with fewer workers than clients the queries queue
and the wait counts.  A closed loop hides the queueing an open arrival process would build (the
coordinated-omission trap): its latency is not a server-scenario latency, and it is labelled so.

Standard library + numpy; LoadGen is an optional import.
"""

from __future__ import annotations

import math
import queue
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

SCENARIOS = ("single-stream", "multi-stream", "server", "offline", "concurrency")
MAX_WORKERS = 256
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
    delay = opts.get("max_queue_delay_ms")
    if delay is not None:
        if s != "server":
            raise ScenarioError("max_queue_delay_ms (dynamic batching) applies to the server scenario only")
        if not isinstance(delay, (int, float)) or isinstance(delay, bool) or not 0 <= delay <= 10_000:
            raise ScenarioError(f"max_queue_delay_ms must be a number from 0 to 10000, got {delay!r}")
        if int(opts.get("batch") or 1) < 2:
            raise ScenarioError("dynamic batching needs the artifact's batch >= 2 (the batch option is the "
                                "largest batch a worker forms)")
        if opts.get("engine") == "edgeopt":
            raise ScenarioError("dynamic batching runs in LoadGen's server scenario (engine loadgen)")
    for key in ("workers", "concurrency"):
        v = opts.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_WORKERS):
            raise ScenarioError(f"{key} must be an integer from 1 to {MAX_WORKERS}, got {v!r}")
    if s == "concurrency":
        if opts.get("engine") == "loadgen":
            raise ScenarioError("LoadGen has no closed-loop concurrency scenario: the agent runs it "
                                "(engine edgeopt); for LoadGen's rules use the server scenario at a QPS")
    elif opts.get("concurrency") is not None:
        raise ScenarioError("concurrency applies to the concurrency scenario only (the number of clients); "
                            "the threads that serve queries are 'workers'")


def loadgen_available() -> bool:
    try:
        import mlperf_loadgen  # noqa: F401
    except ImportError:
        return False
    return True


# a string: collections.abc.Callable cannot be subscripted at run time before Python 3.9 (the agent runs on 3.8)
RunFn = "Callable[[Any], Any]"


def run(run_fn: RunFn, feeds: Sequence[Any], opts: dict[str, Any],
        worker: Callable[[], RunFn] | None = None, dynamic_batch: bool = False) -> dict[str, Any]:
    """One scenario run; ``opts``: scenario, duration_s, target_qps, samples_per_query, engine, workers,
    concurrency, batch, max_queue_delay_ms. ``worker()`` gives the run function of each worker thread
    beyond the first (the runner's ``worker``); without it every worker calls ``run_fn``.
    ``dynamic_batch``: the artifact takes any batch up to ``batch`` (a partial batch is run as is;
    otherwise it is padded to the artifact's batch, as a server with a fixed-batch engine does)."""
    check(opts)
    clients = int(opts.get("concurrency") or 1)
    n_workers = int(opts.get("workers") or (clients if opts["scenario"] == "concurrency" else 1))
    fns = [run_fn] + [(worker or (lambda: run_fn))() for _ in range(n_workers - 1)]
    if opts["scenario"] == "concurrency":
        return _closed_loop(fns, feeds, opts)
    engine = opts.get("engine") or ("loadgen" if loadgen_available() else "edgeopt")
    if engine == "loadgen":
        if not loadgen_available():
            raise ScenarioError("LoadGen is not installed on this device: pip install mlcommons-loadgen "
                                "(or ask for engine 'edgeopt', the agent's own loops)")
        return _loadgen(fns, feeds, opts, dynamic_batch=dynamic_batch)
    if opts["scenario"] not in ("single-stream", "server"):
        raise ScenarioError(f"the {opts['scenario']} scenario needs LoadGen on the device "
                            "(pip install mlcommons-loadgen)")
    if opts["scenario"] == "single-stream" and len(fns) > 1:
        raise ScenarioError("single-stream sends one query at a time: more workers cannot serve it "
                            "(use the server scenario, or concurrency for a closed loop)")
    return _own(fns, feeds, opts)


# ---- LoadGen ----------------------------------------------------------------------------------


def loadgen_accuracy_outputs(run_fn: RunFn, feeds: Sequence[Any], opts: dict[str, Any],
                             encode: Callable[[Any], bytes],
                             worker: Callable[[], RunFn] | None = None) -> tuple[list[bytes], dict[str, Any]]:
    """LoadGen's AccuracyOnly mode in the scenario of ``opts``: every feed is issued (once at least), the
    SUT answers with ``encode(outputs)`` and LoadGen writes those bytes to its accuracy log, which is
    read back: the bytes of each feed, in feed order, and what the run was."""
    n_workers = int(opts.get("workers") or 1)
    fns = [run_fn] + [(worker or (lambda: run_fn))() for _ in range(n_workers - 1)]
    res, blobs = _loadgen(fns, feeds, opts, encode=encode)
    missing = [i for i in range(len(feeds)) if i not in blobs]
    if missing:
        raise ScenarioError(f"LoadGen's accuracy log has no output for sample(s) {missing[:10]}")
    meta = {"harness": f"LoadGen AccuracyOnly ({opts['scenario']})", "loadgen_version": res.get("loadgen_version"),
            "queries_logged": res.get("accuracy_entries"), "workers": len(fns)}
    return [blobs[i] for i in range(len(feeds))], meta


def _loadgen(fns: list[RunFn], feeds, opts, encode: Callable[[Any], bytes] | None = None,
             dynamic_batch: bool = False) -> Any:
    """A LoadGen run; with ``encode`` in AccuracyOnly mode, returning ``(result, {sample: bytes})``.

    Server with ``max_queue_delay_ms`` (dynamic batching, the inference-server trade-off): a query is
    one image; a worker takes the first waiting query, waits up to the delay for more, and runs up to
    ``batch`` of them as one batch; every query's latency still counts from its scheduled arrival."""
    import mlperf_loadgen as lg

    scenario = opts["scenario"]
    nf = len(feeds)
    # offline with batch B: LoadGen's samples are images and the SUT runs them B at a time (one batched
    # feed per B samples, as an offline server batches its burst), so samples/s are images/s; the other
    # scenarios send requests, each one feed of B images
    batching = scenario == "server" and opts.get("max_queue_delay_ms") is not None and encode is None
    per = int(opts.get("batch") or 1) if (scenario == "offline" or batching) and encode is None else 1
    n = nf * per
    settings = lg.TestSettings()
    settings.scenario = getattr(lg.TestScenario, LOADGEN_SCENARIO[scenario])
    settings.mode = lg.TestMode.AccuracyOnly if encode else lg.TestMode.PerformanceOnly
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
    served = [0] * len(fns)

    delay_s = float(opts.get("max_queue_delay_ms") or 0) / 1000
    sizes: list[int] = []

    def worker(k: int) -> None:
        run_fn = fns[k]
        if batching:
            return batching_worker(k, run_fn)
        while True:
            items = work.get()
            if items is None:
                return
            served[k] += serve(run_fn, items)

    def batching_worker(k: int, run_fn: RunFn) -> None:
        pending: list = []
        stop = False
        while True:
            if not pending:
                if stop:
                    return
                items = work.get()
                if items is None:
                    return
                pending.extend(items)
            t_end = time.perf_counter() + delay_s
            while len(pending) < per and not stop:
                left = t_end - time.perf_counter()
                try:
                    items = work.get(timeout=left) if left > 0 else work.get_nowait()
                except queue.Empty:
                    break
                if items is None:
                    stop = True
                else:
                    pending.extend(items)
            chunk, pending = pending[:per], pending[per:]
            sizes.append(len(chunk))
            served[k] += serve(run_fn, chunk)

    inline = scenario in ("single-stream", "multi-stream") and len(fns) == 1

    def serve(run_fn: RunFn, items) -> int:
        responses, keep = [], []
        for j in range(0, len(items), per):
            chunk = items[j:j + per]
            feed = feeds[(chunk[0].index // per) % nf]
            if dynamic_batch and len(chunk) < per:  # a partial batch, as is (a fixed-batch artifact: padded)
                feed = {k: v[:len(chunk)] for k, v in feed.items()}
            raw = run_fn(feed)
            if encode is None:
                responses.extend(lg.QuerySampleResponse(qs.id, 0, 0) for qs in chunk)
            else:  # the outputs' bytes, kept alive until LoadGen has copied them into its log
                buf = np.frombuffer(encode(raw), np.uint8)
                keep.append(buf)
                responses.append(lg.QuerySampleResponse(chunk[0].id, buf.ctypes.data, buf.nbytes))
        lg.QuerySamplesComplete(responses)
        del keep
        return len(responses)

    def issue(query_samples) -> None:  # LoadGen's thread: never block it, queue the work
        items = list(query_samples)
        if inline:  # LoadGen sends the next query only after this one completes: nothing can queue,
            served[0] += serve(fns[0], items)  # so serve it here: no thread hand-off in every latency
            return
        step = per * max(1, math.ceil(len(items) / (len(fns) * 4 * per)))  # an offline burst: shared by workers
        for i in range(0, len(items), step):
            work.put(items[i:i + step])

    def flush() -> None:
        pass

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(len(fns))]
    for t in threads:
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
        for _ in threads:
            work.put(None)
        for t in threads:
            t.join(timeout=60)
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    wall = time.perf_counter() - t0
    try:  # LoadGen's logs are read, then removed: a detail log can reach tens of MB per run on the device
        if encode is not None:
            blobs = _accuracy_log(out / "mlperf_log_accuracy.json")
            return {"loadgen_version": _lg_version(), "wall_s": round(wall, 3), "accuracy_entries": len(blobs)}, blobs
        summary_text = _read(out / "mlperf_log_summary.txt")
        detail_tail = _tail(out / "mlperf_log_detail.txt", 3000)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    res = parse_summary(summary_text)
    batch = int(opts.get("batch") or 1)
    if batching:
        res["dynamic_batching"] = {"max_batch": per, "max_queue_delay_ms": delay_s * 1000, "batches": len(sizes),
                                   "mean_batch": round(sum(sizes) / len(sizes), 3) if sizes else None,
                                   "partial_batches": "run as is" if dynamic_batch else "padded to the artifact's batch"}
    if batch > 1:  # what one LoadGen sample is, and the rate in images
        res["batch"] = batch
        res["sample_is"] = ("an image (served in batches)" if scenario == "offline" else
                            "an image (batched by the server)") if per > 1 else f"a request of {batch} images"
        rate = res.get("samples_per_second") or res.get("completed_qps") or res.get("queries_per_second")
        if rate:
            res["images_per_second"] = rate * (1 if per > 1 else batch)
    res.update({"engine": "loadgen", "loadgen_version": _lg_version(), "scenario": scenario, "wall_s": round(wall, 3),
                "samples_served": sum(served), "workers": len(fns), "served_per_worker": served, "seeds": SEED, "summary_log": summary_text[-6000:],
                "detail_log_tail": detail_tail})
    return res


def _accuracy_log(path: Path) -> dict[int, bytes]:
    """LoadGen's accuracy log: a JSON list of {qsl_idx, data (hex)}; the first entry of each sample."""
    import json

    try:
        entries = json.loads(path.read_text() or "[]")
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"LoadGen wrote no readable accuracy log ({exc})") from None
    out: dict[int, bytes] = {}
    for e in entries:
        out.setdefault(int(e["qsl_idx"]), bytes.fromhex(e["data"]))
    return out


def _lg_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("mlcommons-loadgen")
    except Exception:  # noqa: BLE001
        return None


def _tail(path: Path, chars: int) -> str:
    """The last ``chars`` characters of a (possibly large) text file, without reading all of it."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 4 * chars))
            return f.read().decode(errors="replace")[-chars:]
    except OSError:
        return ""


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


def _own(fns: list[RunFn], feeds, opts) -> dict[str, Any]:
    """single-stream: one query after another; server: Poisson arrivals at target_qps, an open loop,
    latency counted from each query's scheduled arrival (queueing included), served by ``len(fns)``
    worker threads (one: in this thread, as it arrives)."""
    run_fn = fns[0]
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
        if len(fns) == 1:
            for i, at in enumerate(sched):
                now = time.perf_counter() - t_start
                if now < at:
                    time.sleep(at - now)
                run_fn(feeds[i % n])
                lat.append(time.perf_counter() - t_start - at)  # from the scheduled arrival: the queue counts
        else:
            lat = _served_by_workers(fns, feeds, sched, t_start)
        issued = len(sched)
    wall = time.perf_counter() - t_start
    a = np.asarray(lat) * 1000
    pct = {f"p{q:g}": float(np.percentile(a, q)) for q in (50, 90, 95, 99, 99.9)}
    enough = {"p90": len(a) >= 64, "p99": len(a) >= 662}
    res = {"engine": "edgeopt", "note": "LoadGen is not installed on this device: the agent's own "
                                        f"{'closed loop' if opts['scenario'] == 'single-stream' else 'open-loop Poisson server'}"
                                        " (not LoadGen's rules)", "workers": len(fns),
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


def _served_by_workers(fns: list[RunFn], feeds, sched: np.ndarray, t_start: float) -> list[float]:
    """Arrivals released at their scheduled times into one queue, served by one thread per run function;
    each latency from the scheduled arrival to the answer."""
    n = len(feeds)
    work: queue.Queue = queue.Queue()
    lat = [math.nan] * len(sched)
    errors: list[BaseException] = []

    def serve(run_fn: RunFn) -> None:
        while (i := work.get()) is not None:
            if errors:
                continue  # drain: the run failed, the caller re-raises
            try:
                run_fn(feeds[i % n])
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(exc)
                continue
            lat[i] = time.perf_counter() - t_start - sched[i]

    threads = [threading.Thread(target=serve, args=(f,), daemon=True) for f in fns]
    for t in threads:
        t.start()
    for i, at in enumerate(sched):
        if errors:
            break
        now = time.perf_counter() - t_start
        if now < at:
            time.sleep(at - now)
        work.put(i)
    for _ in threads:
        work.put(None)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return lat


def _closed_loop(fns: list[RunFn], feeds, opts) -> dict[str, Any]:
    """``concurrency`` clients, each sending its next query when its last one is answered, for
    ``duration_s``; served by ``len(fns)`` workers (a client's own call when there are as many workers as
    clients, else through a queue whose wait counts in the latency)."""
    n = len(feeds)
    clients = int(opts.get("concurrency") or 1)
    dur = float(opts.get("duration_s", 3.0))
    per_client: list[list[float]] = [[] for _ in range(clients)]
    start = threading.Barrier(clients + 1)
    t_start = [0.0]
    direct = len(fns) >= clients
    work: queue.Queue = queue.Queue()

    def client(c: int) -> None:
        done = threading.Event()
        box: list[Any] = [None]
        i = c
        start.wait()
        while time.perf_counter() - t_start[0] < dur or len(per_client[c]) < max(2, 64 // clients):
            t0 = time.perf_counter()
            if direct:
                fns[c](feeds[i % n])
            else:
                done.clear()
                work.put((feeds[i % n], done, box))
                done.wait()
                if box[0] is not None:
                    raise box[0]
            per_client[c].append(time.perf_counter() - t0)
            i += clients

    def serve(run_fn: RunFn) -> None:
        while (job := work.get()) is not None:
            feed, done, box = job
            try:
                run_fn(feed)
                box[0] = None
            except BaseException as exc:  # noqa: BLE001 - handed to the client that waits for it
                box[0] = exc
            done.set()

    servers = [] if direct else [threading.Thread(target=serve, args=(f,), daemon=True) for f in fns]
    errors: list[BaseException] = []

    def guarded(c: int) -> None:
        try:
            client(c)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(c,), daemon=True) for c in range(clients)]
    for t in servers + threads:
        t.start()
    t_start[0] = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_start[0]
    for _ in servers:
        work.put(None)
    for t in servers:
        t.join()
    if errors:
        raise errors[0]
    a = np.concatenate([np.asarray(x) for x in per_client]) * 1000
    pct = {f"p{q:g}": float(np.percentile(a, q)) for q in (50, 90, 95, 99, 99.9)}
    return {"engine": "edgeopt", "scenario": "concurrency", "concurrency": clients, "workers": len(fns),
            "note": f"closed loop: {clients} client(s), each sending its next query when the last is answered "
                    f"({len(fns)} worker(s) serving); the queueing an open arrival process would build is hidden, "
                    "so these latencies are not a server-scenario result (not LoadGen's rules)",
            "latency_ms": {**pct, "mean": float(a.mean())}, "queries": int(a.size),
            "per_client_queries": [len(x) for x in per_client],
            "completed_qps": a.size / wall if wall > 0 else None, "wall_s": round(wall, 3),
            "enough_samples": {"p90": a.size >= 64, "p99": a.size >= 662}, "valid": None}
