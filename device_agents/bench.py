"""The bench: load a bundle's artifact in a child process, time it, check its accuracy.

The ``bench`` verb never runs a runtime in the agent's own process: it starts
``python -m edgeopt_agent.bench JOB`` with a timeout, so a runtime that crashes (a signal) or hangs
becomes a JSON failure (``RuntimeCrashed`` / ``RuntimeHung``) and the agent still answers.

In the child (``run_bench``, also callable in-process by a benchmark harness):

1. the validation samples are grouped into batches and converted once to the artifact's names,
   layouts and dtypes (``bundle.to_artifact``): nothing is converted inside the timed loop;
2. ``runner.load()`` is timed (cold start), then the first inference separately;
3. one pass over every batch gives the outputs that are compared with the reference outputs by
   the host check's rule (``compare.compare_outputs``, precision-aware);
4. warm-up, then ``timed_loop``: rotating over the batches, each iteration timing only
   ``runner.run(feed)`` with ``perf_counter_ns`` into a preallocated list, until both the minimum
   duration and the minimum count are reached.  A runner that keeps its own per-phase timings
   (TensorRT's H2D/compute/D2H) has a ``reset_timings()``, called after the warm-up so that those
   timings in ``info()`` cover the timed runs only.  Energy (``energy.py``) is measured over the same
   window where the device exposes a source: counters read right before and after the loop, sampled
   rails read by a thread during it; ``result["energy"]`` says the source or why there is none.

Standard library + numpy only; the runtime is imported by its runner.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .bundle import (
    MANIFEST,
    BundleError,
    from_artifact,
    load_manifest,
    reference_outputs,
    sha256_file,
    to_artifact,
    validation_inputs,
    verify,
)
from .compare import batch_rows, compare_outputs
from .runners import open_runner

DEFAULTS: dict[str, Any] = {
    "duration_s": 3.0,  # minimum timed duration
    "min_iters": 50,  # minimum timed iterations
    "max_iters": None,  # stop after this many even if duration_s is not reached
    "warmup": 10,
    "warmup_s": None,  # warm up for at least this long as well (trtexec --warmUp, benchmark_app)
    "threads": None,  # the runner's thread count (None: the runtime's default)
    "batch": 1,
    "timeout_s": 300.0,  # the whole child: load + accuracy + warm-up + timed loop
    "return_samples": False,
    "runner": {},  # runner options, passed through (providers, delegates, device...)
    "limits": {},  # resource limits of the child: memory_mb, cpu_s, core_dumps
    "verify": True,  # check the bundle's files against the manifest first
    # load scenarios (see scenarios.py): single-stream | multi-stream | server | offline | concurrency
    "scenario": None,
    "workers": None,  # threads serving the scenario's queries at once (None: 1; concurrency: one per client)
    "concurrency": None,  # the concurrency scenario's clients (a closed loop)
    "target_qps": None,
    "samples_per_query": None,
    "latency_bound_ms": None,
    "latency_percentile": None,
    "engine": None,  # loadgen | edgeopt (None: LoadGen when installed)
    "max_queue_delay_ms": None,  # server: dynamic batching, up to `batch` queries per run, waiting this long
    "loadgen_accuracy": True,  # with LoadGen: the accuracy check again through its AccuracyOnly mode
    "profile": 0,  # > 0: after the timed loop, the stages of one request and a per-op profile over N runs
    "energy": True,  # energy over the timed loop where the device exposes it (energy.py); false: not measured
    # variable-length bundles (validation.varlen): the requests' order over the real mix is seeded
    "seed": 0,
    # variable-length bundles: run the validation samples cut or zero-padded to these sizes on the variable
    # axis (e.g. [16, 64, 128]) instead of their own; a size outside the built bounds is refused
    "lengths": None,
}
LIMIT_KEYS = ("memory_mb", "cpu_s", "core_dumps")
MAX_SAMPLES = 2000
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
              "TF_NUM_INTEROP_THREADS", "OV_CPU_THREADS_NUM", "ORT_NUM_THREADS")


class BenchError(Exception):
    """A bench request that cannot be run as asked (bad option, batch the artifact cannot take)."""


class RuntimeCrashed(Exception):
    """The child running the runtime died (a signal or an exit without a result)."""


class RuntimeHung(Exception):
    """The child running the runtime did not finish within ``timeout_s`` and was killed."""


# ---- options ----------------------------------------------------------------------------------


def _number(opts: dict[str, Any], key: str, minimum: float, integer: bool = False, allow_none: bool = False) -> None:
    v = opts[key]
    if v is None and allow_none:
        return
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= minimum
    if ok and integer:
        ok = float(v).is_integer()
    if not ok:
        kind = "an integer" if integer else "a number"
        raise BenchError(f"option {key} must be {kind} >= {minimum}" + (" or null" if allow_none else "")
                         + f", got {v!r}")
    opts[key] = int(v) if integer else float(v)


def parse_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """The bench options with defaults filled in; unknown keys and bad values are refused."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise BenchError(f"unknown bench option(s) {', '.join(unknown)}; known: {', '.join(DEFAULTS)}")
    opts = {**DEFAULTS, **options}
    _number(opts, "duration_s", 0)
    _number(opts, "min_iters", 1, integer=True)
    _number(opts, "max_iters", 1, integer=True, allow_none=True)
    _number(opts, "warmup", 0, integer=True)
    _number(opts, "warmup_s", 0, allow_none=True)
    _number(opts, "threads", 1, integer=True, allow_none=True)
    _number(opts, "batch", 1, integer=True)
    _number(opts, "timeout_s", 0.1)
    _number(opts, "profile", 0, integer=True)
    _number(opts, "seed", 0, integer=True)
    if opts["lengths"] is not None:
        if (not isinstance(opts["lengths"], list) or not opts["lengths"]
                or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in opts["lengths"])):
            raise BenchError(f"lengths must be a list of positive integers, got {opts['lengths']!r}")
    if opts["max_iters"] is not None and opts["max_iters"] < opts["min_iters"]:
        raise BenchError(f"max_iters {opts['max_iters']} is below min_iters {opts['min_iters']}")
    if opts["duration_s"] >= opts["timeout_s"]:
        raise BenchError(f"duration_s {opts['duration_s']:g} must be below timeout_s {opts['timeout_s']:g} "
                         "(which also covers loading and the accuracy pass)")
    for key in ("runner", "limits"):
        if not isinstance(opts[key], dict):
            raise BenchError(f"option {key} must be an object, got {opts[key]!r}")
    bad = sorted(set(opts["limits"]) - set(LIMIT_KEYS))
    if bad:
        raise BenchError(f"unknown limit(s) {', '.join(bad)}; known: {', '.join(LIMIT_KEYS)}")
    for key in ("memory_mb", "cpu_s"):
        if opts["limits"].get(key) is not None:
            lim = {key: opts["limits"][key]}
            _number(lim, key, 1)
            opts["limits"] = {**opts["limits"], **lim}
    from .scenarios import ScenarioError, check

    try:
        check(opts)
    except ScenarioError as exc:
        raise BenchError(str(exc)) from None
    if opts["engine"] not in (None, "loadgen", "edgeopt"):
        raise BenchError(f"engine must be loadgen or edgeopt, got {opts['engine']!r}")
    opts["return_samples"] = bool(opts["return_samples"])
    opts["verify"] = bool(opts["verify"])
    opts["loadgen_accuracy"] = bool(opts["loadgen_accuracy"])
    opts["energy"] = bool(opts["energy"])
    return opts


# ---- batches ----------------------------------------------------------------------------------


def _dynamic(dim: Any) -> bool:
    """A manifest dimension that is null, a name or <= 0 is dynamic."""
    return dim is None or isinstance(dim, str) or (isinstance(dim, (int, float)) and dim <= 0)


def check_batch(manifest: dict[str, Any], batch: int) -> None:
    """Refuse a batch the artifact cannot take (a static leading dimension other than ``batch``)."""
    if batch == 1:
        return
    for spec in manifest["io"]["inputs"]:
        shape = spec.get("shape")
        if not shape:
            raise BenchError(f"batch {batch}: input {spec['name']!r} has no batch axis (a scalar)")
        if not _dynamic(shape[0]) and int(shape[0]) != batch:
            raise BenchError(
                f"batch {batch}: this bundle's input {spec['name']!r} has a static batch of {shape[0]} "
                f"(shape {list(shape)}); build the bundle with a dynamic batch (or batch {batch}) to bench it")


def make_batches(samples: list[dict[str, np.ndarray]], batch: int) -> tuple[list[list[int]], list[dict[str, np.ndarray]]]:
    """Group the validation samples into feeds of ``batch`` along axis 0, wrapping around.

    Returns the sample indices of each group and the concatenated ONNX-layout feeds.  A sample
    already carries its leading dimension (usually 1); ``batch`` must be a multiple of it.
    """
    if not samples:
        raise BenchError("the bundle has no validation samples to run")
    first = next(iter(samples[0].values()))
    lead = int(first.shape[0]) if first.ndim else 1
    if batch == lead:
        return [[i] for i in range(len(samples))], list(samples)
    if first.ndim == 0 or batch % lead:
        raise BenchError(f"batch {batch} is not a multiple of the validation samples' leading dimension {lead}")
    per = batch // lead
    n = len(samples)
    groups = [[(g * per + j) % n for j in range(per)] for g in range(math.ceil(n / per))]
    feeds = [{name: np.concatenate([samples[i][name] for i in idx], axis=0) for name in samples[0]}
             for idx in groups]
    return groups, feeds


def _split_outputs(out: dict[str, np.ndarray], parts: int) -> list[dict[str, np.ndarray]]:
    if parts == 1:
        return [out]
    pieces = {}
    for name, a in out.items():
        if a.ndim == 0 or a.shape[0] % parts:
            raise BenchError(f"output {name!r} of shape {list(a.shape)} cannot be split into {parts} samples "
                             "along axis 0")
        pieces[name] = np.split(a, parts, axis=0)
    return [{name: pieces[name][j] for name in out} for j in range(parts)]


# ---- timing -----------------------------------------------------------------------------------


def timed_loop(run: Callable[[Any], Any], feeds: Sequence[Any], min_iters: int = 50, duration_s: float = 3.0,
               max_iters: int | None = None, capacity: int | None = None) -> np.ndarray:
    """Call ``run(feeds[i % len(feeds)])`` until ``min_iters`` calls and ``duration_s`` seconds are
    both reached (or ``max_iters``); returns each call's latency in ns (int64).

    Only ``run`` sits between the two clock reads; the timings list is preallocated (``capacity``,
    grown by doubling in the rare case it fills), the feeds are prebuilt by the caller.
    """
    n = len(feeds)
    if n == 0:
        raise BenchError("timed_loop needs at least one feed")
    limit = max_iters if max_iters else sys.maxsize
    cap = max(int(capacity or 0), min_iters, 16)
    cap = min(cap, limit)
    times = [0] * cap
    clock = time.perf_counter_ns
    i = k = 0
    deadline = clock() + int(duration_s * 1e9)
    while True:
        feed = feeds[k]
        t0 = clock()
        run(feed)
        t1 = clock()
        times[i] = t1 - t0
        i += 1
        k += 1
        if k == n:
            k = 0
        if (i >= min_iters and t1 >= deadline) or i >= limit:
            break
        if i == cap:
            times.extend([0] * cap)
            cap *= 2
    return np.asarray(times[:i], dtype=np.int64)


def latency_stats(ns: np.ndarray) -> dict[str, float]:
    """p50/p90/p95/p99/p99.9, mean, std (population), min, max in milliseconds."""
    ms = ns.astype(np.float64) / 1e6
    q = np.percentile(ms, [50, 90, 95, 99, 99.9])
    return {"p50": float(q[0]), "p90": float(q[1]), "p95": float(q[2]), "p99": float(q[3]), "p99_9": float(q[4]),
            "mean": float(ms.mean()), "std": float(ms.std()), "min": float(ms.min()), "max": float(ms.max())}


def subsample(ns: np.ndarray, limit: int = MAX_SAMPLES) -> list[float]:
    """At most ``limit`` latencies in ms, evenly spaced over the run (order kept: drift stays visible)."""
    if ns.size > limit:
        ns = ns[np.linspace(0, ns.size - 1, limit).round().astype(np.int64)]
    return [round(float(v) / 1e6, 4) for v in ns]


# ---- memory and environment -------------------------------------------------------------------


def current_rss_mb() -> float | None:
    """Resident memory now (Linux /proc), else the peak so far."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 2)
    except OSError:
        pass
    return peak_rss_mb()


def peak_rss_mb() -> float | None:
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1 << 20 if sys.platform == "darwin" else 1024), 2)  # bytes on macOS, KiB on Linux


def _address_space_mb() -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def apply_limits(limits: dict[str, Any]) -> dict[str, Any]:
    """Resource limits on this (child) process: address space, CPU seconds, no core dumps."""
    try:
        import resource
    except ImportError:
        return {"applied": False, "why": "no resource module on this OS"}
    applied: dict[str, Any] = {}
    if not limits.get("core_dumps"):  # a crashing runtime must not fill a small device's disk with cores
        _, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    if limits.get("cpu_s"):  # SIGXCPU at the soft limit (counted from the child's start), SIGKILL at the hard
        soft = math.ceil(limits["cpu_s"])
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        new_hard = soft + 5 if hard == resource.RLIM_INFINITY else min(hard, soft + 5)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, new_hard))
        applied["cpu_s"] = soft
    if limits.get("memory_mb"):
        want = int(limits["memory_mb"] * (1 << 20))
        now = _address_space_mb()
        if now is not None and limits["memory_mb"] <= now:
            raise BenchError(f"limits.memory_mb {limits['memory_mb']:g} is below the agent's own address space "
                             f"before the runtime loads ({now:.0f} MB); give at least {math.ceil(now) + 64}")
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (want, hard if hard == resource.RLIM_INFINITY else min(hard, want)))
        applied["memory_mb"] = limits["memory_mb"]
    return applied


def environment(threads: Any) -> dict[str, Any]:
    """The machine and settings a measurement was taken with."""
    from . import probe

    cpu = probe.cpu_info()
    return {
        "cpu_model": cpu["model"], "cores": cpu["cores"], "cores_usable": cpu["cores_usable"],
        "threads": threads, **probe.sample_environment(),
        "thread_env": {k: os.environ[k] for k in THREAD_ENV if k in os.environ},
        "runtimes": probe.runtime_versions(import_fallback=False), "numpy": np.__version__,
        "python": platform.python_version(), "os": platform.system(), "kernel": platform.release(),
        "arch": platform.machine(), "hostname": platform.node(),
    }


# ---- the bench itself -------------------------------------------------------------------------


def _energy_meter(opts: dict[str, Any], manifest: dict[str, Any], runner_opts: dict[str, Any],
                  env: dict[str, Any]) -> Any:
    """The energy meter for the timed loop (``energy.Meter``, not started), or the reply's ``energy`` at once
    when nothing can be measured here.  A GPU bundle (TensorRT, or ONNX Runtime's CUDA/TensorRT
    providers) prefers the GPU's counter to the CPU's RAPL where a device has both."""
    from . import energy

    if not opts["energy"]:
        return {"source": None, "why_not": "not measured: the bench option energy is false"}
    providers = " ".join(str(p) for p in (runner_opts.get("providers") or []))
    gpu = (manifest.get("runtime") or {}).get("name") == "tensorrt" or "CUDA" in providers or "Tensorrt" in providers
    try:
        return energy.prepare(gpu=gpu, emulated=env.get("emulator") or ("emulated" if env.get("emulated") else None))
    except Exception as exc:  # energy is a side figure: it never fails the bench
        return {"source": None, "why_not": f"not available on this device (the energy probe failed: "
                                           f"{type(exc).__name__}: {exc})"}


def _digest(feed: dict[str, np.ndarray]) -> str:
    h = hashlib.sha1()
    for name in sorted(feed):
        h.update(np.ascontiguousarray(feed[name]).tobytes())
    return h.hexdigest()


def run_bench(bundle: str | Path, options: dict[str, Any] | None = None,
              stage: Callable[[str, dict[str, Any]], None] | None = None,
              before_load: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Bench a bundle in this process (the verb calls it in a child). See the module docstring."""
    stage = stage or (lambda name, data: None)
    opts = parse_options(options)
    bundle = Path(bundle)
    manifest = load_manifest(bundle)
    io = manifest["io"]
    check_batch(manifest, opts["batch"])
    stage("prepare", {})
    mix = _varlen_mix(bundle, manifest, opts) if (manifest.get("validation") or {}).get("varlen") else None
    if mix is not None:  # variable lengths: every request at its own length (or bucket), in a seeded order
        samples = mix["samples"]
        groups, feeds = [[i] for i in range(len(samples))], mix["feeds"]
    else:
        samples = validation_inputs(bundle, manifest)
        groups, onnx_feeds = make_batches(samples, opts["batch"])
        feeds = [to_artifact(f, io["inputs"]) for f in onnx_feeds]
        del onnx_feeds
    runner_opts = dict(opts["runner"])
    if opts["threads"] is not None:
        runner_opts["threads"] = opts["threads"]
    runner = open_runner(bundle, manifest, runner_opts)
    stage("limits", {})
    limits = before_load() if before_load else None
    env = environment(opts["threads"])
    rss_before = current_rss_mb()
    meter = None

    try:
        stage("load", {})
        t0 = time.perf_counter()
        runner.load()
        load_s = time.perf_counter() - t0
        rss_loaded = current_rss_mb()
        stage("first_inference", {"load_s": load_s})
        t0 = time.perf_counter()
        first = runner.run(feeds[0])
        first_s = time.perf_counter() - t0

        if mix is not None:  # the first call at each new shape (re-preparation), before any other at it
            mix["first_at_shape"] = _first_at_shape(runner, feeds, mix)
        stage("accuracy", {"load_s": load_s, "first_inference_s": first_s})
        accuracy = (_accuracy(runner, manifest, bundle, groups, feeds, first) if mix is None
                    else _varlen_accuracy(runner, manifest, bundle))

        stage("warmup", {})
        meter = _energy_meter(opts, manifest, runner_opts, env)  # sources found before the warm-up
        t0 = time.perf_counter()
        j = 0
        while j < opts["warmup"] or (opts["warmup_s"] and time.perf_counter() - t0 < opts["warmup_s"]):
            runner.run(feeds[j % len(feeds)])
            j += 1
        per_iter = (time.perf_counter() - t0) / j if j else first_s
        capacity = min(int(opts["duration_s"] / max(per_iter, 1e-6) * 1.5) + opts["min_iters"], 2_000_000)
        reset = getattr(runner, "reset_timings", None)
        if callable(reset):  # runners that time phases themselves (TensorRT) report the timed runs only
            reset()

        if opts["scenario"]:
            from .scenarios import run as run_scenario

            stage("scenario", {"scenario": opts["scenario"]})
            try:
                dyn = all(spec.get("shape") and _dynamic(spec["shape"][0]) for spec in io["inputs"])
                scenario = run_scenario(runner.run, feeds, opts, worker=runner.worker, dynamic_batch=dyn)
                if scenario.get("engine") == "loadgen" and opts["loadgen_accuracy"] and mix is None:
                    scenario["accuracy"] = _loadgen_accuracy(runner, manifest, bundle, groups, feeds, opts,
                                                             accuracy)
            finally:
                runner.close_workers()
        else:
            scenario = None
        stage("timed", {})
        if not isinstance(meter, dict):
            meter.start()
        t0 = time.perf_counter()
        ns = timed_loop(runner.run, feeds, opts["min_iters"], opts["duration_s"], opts["max_iters"], capacity)
        wall = time.perf_counter() - t0
        energy = meter if isinstance(meter, dict) else meter.stop(int(ns.size) * opts["batch"])
        stage("report", {})
        from . import probe

        after = probe.sample_environment()
        info = runner.info()
        env["threads"] = info.get("threads", opts["threads"])
        env["after"] = {k: after[k] for k in ("freq_mhz", "temperature_c", "loadavg")}
        if limits is not None:
            env["limits"] = limits
        used = min(len(ns), len(feeds))
        result = {
            "bundle_id": sha256_file(bundle / MANIFEST), "bundle": str(bundle),
            "model": manifest.get("model", {}).get("name"), "target": manifest.get("target"),
            "precision": manifest.get("precision"), "backend": manifest.get("backend"),
            "load_s": load_s, "first_inference_s": first_s,
            "latency_ms": latency_stats(ns), "iterations": int(ns.size), "duration_s": wall,
            "throughput_ips": ns.size * opts["batch"] / wall if wall > 0 else None,
            "peak_rss_mb": peak_rss_mb(), "rss_before_load_mb": rss_before, "rss_after_load_mb": rss_loaded,
            "accuracy": accuracy, "energy": energy,
            "inputs": {"validation_samples": len(samples), "batch": opts["batch"], "feeds": len(feeds),
                       "distinct_in_loop": len({_digest(feeds[j]) for j in range(used)})},
            "runner": info, "environment": env, "options": opts,
            "artifact": _artifact_facts(manifest),
        }
        if mix is not None:
            result["varlen"] = per_bucket(ns, mix)
        if opts["return_samples"]:
            result["samples_ms"] = subsample(ns)
        if scenario is not None:
            result["scenario"] = scenario
        if opts["profile"]:
            from .decompose import decompose

            stage("profile", {})
            result["decomposition"] = decompose(runner, manifest, feeds, first, result["latency_ms"]["p50"],
                                                opts["profile"])
    except BaseException:
        if meter is not None and not isinstance(meter, dict):
            meter.abort()  # no sampling thread outlives a failed bench
        with contextlib.suppress(Exception):  # the first failure is the one to report
            runner.close()
        raise
    runner.close()
    return result


def _accuracy(runner, manifest: dict[str, Any], bundle: Path, groups: list[list[int]],
              feeds: list[dict[str, np.ndarray]], first: dict[str, np.ndarray]) -> dict[str, Any]:
    """One pass over every batch, outputs mapped back per sample, compared with the reference."""
    io = manifest["io"]
    return accuracy_of(manifest, bundle, groups,
                       lambda g: from_artifact(first if g == 0 else runner.run(feeds[g]), io["outputs"]))


def _varlen_mix(bundle: Path, manifest: dict[str, Any], opts: dict[str, Any]) -> dict[str, Any]:
    """The requests of a variable-length bundle: each validation sample at its own length (``lengths``: cut or
    zero-padded to each of those sizes), fitted to the artifact's form (own length, its bucket, or padded to
    the top: ``varlen.fit``), in a seeded order; ``keys`` the bucket of each feed, ``shapes`` its run shape."""
    from . import varlen

    if opts["batch"] != 1:
        raise BenchError("a variable-length bundle is benched at batch 1 (each request at its own length)")
    io = manifest["io"]
    form = varlen.form_of(manifest)
    own, _ = varlen.validation(bundle, manifest)
    if opts["lengths"]:
        var = [(s["name"], int(v["axis"])) for s in io["inputs"] for v in s.get("variable") or []]
        made = []
        for size in opts["lengths"]:
            for f in own:
                g = dict(f)
                for name, ax in var:
                    a = np.asarray(f[name])
                    shape = list(a.shape)
                    shape[ax] = size
                    g[name] = varlen.pad(varlen.crop(a, [min(x, y) for x, y in zip(a.shape, shape)]), shape)
                made.append(g)
        own = made
    order = np.random.default_rng(opts["seed"]).permutation(len(own))
    samples = [own[i] for i in order]
    fitted = []
    for i, f in enumerate(samples):
        try:
            fitted.append(varlen.fit(f, io["inputs"], form))
        except varlen.OutOfBounds as exc:
            raise BenchError(f"request {i}: {exc} (the bundle was built for "
                             + ", ".join(f"{s['name']}[{v['axis']}] {varlen.bounds_text(v)}" for s in io["inputs"]
                                         for v in s.get("variable") or []) + ")") from None
    keys = [varlen.bucket_key(f, io["inputs"], form) for f in samples]
    var = [(s["name"], int(v["axis"])) for s in io["inputs"] for v in s.get("variable") or []]
    own_sizes = [sum(int(np.shape(f[n])[ax]) for n, ax in var) for f in samples]
    run_sizes = [sum(int(np.shape(f[n])[ax]) for n, ax in var) for f in fitted]
    return {"samples": samples, "feeds": [to_artifact(f, io["inputs"]) for f in fitted], "keys": keys,
            "own_sizes": own_sizes, "run_sizes": run_sizes,
            # the bucket each request falls in whatever the form (a padded static form runs them all at the
            # top): the key two bundles of one model share in a paired gate
            "mix_keys": [varlen.bucket_key(f, io["inputs"], "dynamic") for f in samples],
            "lengths": [varlen.length_key(f, io["inputs"]) for f in samples],
            "shapes": [tuple(tuple(np.shape(a)) for a in f.values()) for f in fitted], "form": form,
            "seed": opts["seed"], "order": [int(i) for i in order]}


def _first_at_shape(runner, feeds: list[Any], mix: dict[str, Any]) -> dict[str, list[float]]:
    """The latency (ms) of the first call at each distinct run shape, per bucket: what a shape switch costs
    the first time (ONNX Runtime's allocation plan, OpenVINO's shape inference/kernels, a LiteRT resize)."""
    seen = {mix["shapes"][0]}
    out: dict[str, list[float]] = {}
    for j, shape in enumerate(mix["shapes"]):
        if shape in seen:
            continue
        seen.add(shape)
        t0 = time.perf_counter_ns()
        runner.run(feeds[j])
        out.setdefault(mix["keys"][j], []).append((time.perf_counter_ns() - t0) / 1e6)
    return out


def _varlen_accuracy(runner, manifest: dict[str, Any], bundle: Path) -> dict[str, Any]:
    """The host check's rule on the device: each sample at its own length against FP32 run unpadded."""
    from .check import run_varlen

    outputs, reference, rows = run_varlen(runner, manifest, bundle)
    result = compare_outputs(outputs, reference, manifest["precision"], manifest.get("tolerance_override"),
                             manifest.get("output_kinds"))
    result["samples"] = len(rows)
    result["per_length"] = rows
    src = (manifest.get("validation") or {}).get("source") or {}
    result["data"] = {"kind": src.get("kind", "unknown"), "n": len(rows),
                      "path": Path(str(src["path"])).name if src.get("path") else None}
    return result


def per_bucket(ns: np.ndarray, mix: dict[str, Any]) -> dict[str, Any]:
    """Latency per bucket over the timed loop (call ``i`` ran feed ``i % n``), the mix-weighted overall figure
    (each bucket's mean and p50 weighted by its share of the requests), calls right after a shape switch
    apart from calls at the shape of the one before, and the first call at each new shape."""
    n = len(mix["feeds"])
    idx = np.arange(ns.size) % n
    keys = np.asarray(mix["keys"])[idx]
    shapes = [mix["shapes"][i] for i in idx]
    switch = np.array([k > 0 and shapes[k] != shapes[k - 1] for k in range(ns.size)], bool)
    if ns.size and n > 1:
        switch[0] = mix["shapes"][0] != mix["shapes"][-1]
    share = {k: mix["keys"].count(k) / n for k in set(mix["keys"])}
    buckets = {}
    for k in sorted(share, key=lambda b: [float(x) for x in "".join(c if c.isdigit() else " " for c in b).split()]):
        sel = ns[keys == k]
        if not sel.size:
            continue
        stats = latency_stats(sel)
        firsts = mix.get("first_at_shape", {}).get(k, [])
        own = sum(o for o, kk in zip(mix.get("own_sizes", []), mix["keys"]) if kk == k)
        ran = sum(r for r, kk in zip(mix.get("run_sizes", []), mix["keys"]) if kk == k)
        buckets[k] = {"share": round(share[k], 4), "requests": int(sel.size), "p50_ms": stats["p50"],
                      # padded positions per real one on the variable axes (0: nothing padded)
                      "padding_waste": round(ran / own - 1, 4) if own else None,
                      "p99_ms": stats["p99"], "mean_ms": stats["mean"],
                      "first_at_new_shape_ms": (round(float(np.median(firsts)), 3) if firsts else None),
                      "new_shapes": len(firsts)}
    total = sum(b["share"] for b in buckets.values()) or 1.0
    out = {"form": mix["form"], "seed": mix["seed"], "requests_in_mix": n, "buckets": buckets,
           "weighted_mean_ms": sum(b["share"] * b["mean_ms"] for b in buckets.values()) / total,
           "weighted_p50_ms": sum(b["share"] * b["p50_ms"] for b in buckets.values()) / total,
           "switch_share": float(switch.mean()) if ns.size else 0.0,
           "padding_waste": (round(sum(mix["run_sizes"]) / sum(mix["own_sizes"]) - 1, 4)
                             if sum(mix.get("own_sizes", [])) else None)}
    if switch.any() and (~switch).any():
        out["after_switch_p50_ms"] = latency_stats(ns[switch])["p50"]
        out["same_shape_p50_ms"] = latency_stats(ns[~switch])["p50"]
    elif switch.any():
        out["after_switch_p50_ms"] = latency_stats(ns[switch])["p50"]
    return out


def _loadgen_accuracy(runner, manifest: dict[str, Any], bundle: Path, groups: list[list[int]], feeds,
                      opts: dict[str, Any], direct: dict[str, Any]) -> dict[str, Any]:
    """The accuracy check through LoadGen: its AccuracyOnly mode in the same scenario issues every
    sample once, the outputs travel back in LoadGen's accuracy log, and the same comparison judges
    them.  ``same_as_direct``: whether it reached the verdict of the agent's own pass."""
    import io as _io

    from .scenarios import loadgen_accuracy_outputs

    specs = manifest["io"]["outputs"]

    def encode(raw: Any) -> bytes:
        buf = _io.BytesIO()
        np.savez(buf, **from_artifact(raw, specs))
        return buf.getvalue()

    t0 = time.perf_counter()
    blobs, meta = loadgen_accuracy_outputs(runner.run, feeds, opts, encode, worker=runner.worker)

    def outputs_of(g: int) -> dict[str, np.ndarray]:
        with np.load(_io.BytesIO(blobs[g])) as z:
            return {k: z[k] for k in z.files}

    res = accuracy_of(manifest, bundle, groups, outputs_of)
    res.update(meta)
    res["harness_s"] = round(time.perf_counter() - t0, 3)
    res["same_as_direct"] = res.get("passed") == direct.get("passed")
    return res


def accuracy_of(manifest: dict[str, Any], bundle: Path, groups: list[list[int]],
                outputs_of: Callable[[int], dict[str, np.ndarray]]) -> dict[str, Any]:
    """The accuracy check on each batch's outputs (ONNX names and layout, from ``outputs_of(g)``):
    mapped back per sample and compared with the reference by the host check's rule."""
    io = manifest["io"]
    per_sample: dict[int, dict[str, np.ndarray]] = {}
    for g, idx in enumerate(groups):
        for i, out in zip(idx, _split_outputs(outputs_of(g), len(idx))):
            if i not in per_sample:  # a copy: a runner may hand out views of buffers it reuses
                per_sample[i] = {k: np.array(v, copy=True) for k, v in out.items()}
    names = [o["name"] for o in io["outputs"]]
    outputs = {name: np.stack([per_sample[i][name] for i in sorted(per_sample)]) for name in names}
    src = (manifest.get("validation") or {}).get("source") or {}
    # a bundle built at batch B (build --batch): each feed holds B distinct samples, the last one filled up
    # with repeats, which count once
    rows = batch_rows(src) if len(per_sample) == len(batch_rows(src) or ()) else None
    result = compare_outputs(outputs, reference_outputs(bundle, manifest), manifest["precision"],
                             manifest.get("tolerance_override"), manifest.get("output_kinds"), rows)
    n = int(sum(rows)) if rows else len(per_sample)
    result["samples"] = n
    # what "agreement" was measured on: n distinct samples of images / arrays / RANDOM data
    result["data"] = {"kind": src.get("kind", "unknown"), "n": n,
                      "path": Path(str(src["path"])).name if src.get("path") else None}
    return result


def _artifact_facts(manifest: dict[str, Any]) -> dict[str, Any]:
    """Size, input shapes and the build's warnings, carried into every run record (and the report)."""
    files = manifest.get("files") or {}
    size = sum(int(f.get("size", 0)) for f in files.values()) if isinstance(files, dict) else None
    art_size = None
    if isinstance(files, dict):  # the model files: everything but the validation data
        art_size = sum(int(f.get("size", 0)) for name, f in files.items() if not name.startswith("validation/"))
    return {"bundle_bytes": size, "artifact_bytes": art_size or None,
            "input_shapes": {i["name"]: i.get("shape") for i in (manifest.get("io") or {}).get("inputs", [])},
            "build_warnings": list(manifest.get("warnings") or []), "notes": list(manifest.get("notes") or [])[:5]}


# ---- the child process ------------------------------------------------------------------------


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def _child_main(argv: list[str]) -> int:
    """``python -m edgeopt_agent.bench JOB.json``: run one bench, write the result file."""
    job = json.loads(Path(argv[0]).read_text())
    status = open(job["stage_file"], "a", buffering=1)  # line-buffered: the parent reads it after a crash

    def stage(name: str, data: dict[str, Any]) -> None:
        status.write(json.dumps({"stage": name, "t": time.time(), **data}) + "\n")

    try:
        if job.get("pair"):  # the pairbench verb: two bundles interleaved in this one process
            from .paired import run_pair

            apply_limits(job["options"]["limits"])
            result = {"ok": True, "pairbench": run_pair(job["pair"], job.get("pair_options"), stage)}
        else:
            result = {"ok": True, "bench": run_bench(job["bundle"], job["options"], stage,
                                                     before_load=lambda: apply_limits(job["options"]["limits"]))}
    except Exception as exc:  # reported to the parent as JSON; a signal is the parent's to see
        result = {"ok": False, "error": {"type": type(exc).__name__, "message": str(exc).strip()[:4000]}}
    tmp = job["result_file"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, default=_json_default)
    os.replace(tmp, job["result_file"])
    status.close()
    return 0


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


_SIGNAL_HINTS = {
    "SIGXCPU": "it used up limits.cpu_s",
    "SIGKILL": "often the kernel's out-of-memory killer; check dmesg",
    "SIGSEGV": "a segmentation fault in the runtime",
    "SIGABRT": "the runtime aborted",
    "SIGBUS": "a bus error (a truncated memory-mapped file?)",
    "SIGILL": "an illegal instruction: the runtime was built for a CPU with features this one lacks",
}


def _tail(path: Path, lines: int = 8) -> list[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    return [t for t in text.strip().splitlines() if t.strip()][-lines:]


def _stages(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in _tail(path, 100):
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


_STAGE_WORDS = {"start": "start-up", "prepare": "data preparation", "limits": "applying limits", "load": "model load",
                "first_inference": "the first inference", "accuracy": "the accuracy pass",
                "warmup": "warm-up", "timed": "the timed loop", "report": "reporting", "profile": "profiling"}


def bench_in_child(bundle: Path, opts: dict[str, Any], pair: list[Path] | None = None,
                   pair_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``run_bench`` (or, with ``pair``, ``paired.run_pair``) in a child process with
    ``opts["timeout_s"]``; a reply dict (ok or not)."""
    work = Path(tempfile.mkdtemp(prefix="edgeopt-bench-"))
    try:
        job = {"bundle": str(bundle.absolute()), "options": opts, "result_file": str(work / "result.json"),
               "stage_file": str(work / "stages.jsonl")}
        if pair:
            job["pair"], job["pair_options"] = [str(Path(b).absolute()) for b in pair], pair_options or {}
        (work / "job.json").write_text(json.dumps(job))
        env = dict(os.environ)
        pkg_parent = Path(__file__).resolve().parent.parent
        if Path(__file__).resolve().parent.name == "edgeopt_agent":  # a plain copy on a device
            env["PYTHONPATH"] = os.pathsep.join([str(pkg_parent), *filter(None, [env.get("PYTHONPATH")])])
        t0 = time.perf_counter()
        with open(work / "stdout.txt", "wb") as out, open(work / "stderr.txt", "wb") as err:
            proc = subprocess.Popen([sys.executable, "-m", "edgeopt_agent.bench", str(work / "job.json")],
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                    start_new_session=True)  # its own group: a hang is killed with its helpers
            try:
                rc = proc.wait(timeout=opts["timeout_s"])
                hung = False
            except subprocess.TimeoutExpired:
                hung = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError, AttributeError):
                    proc.kill()
                rc = proc.wait()
        elapsed = time.perf_counter() - t0
        stages = _stages(work / "stages.jsonl")
        last = stages[-1]["stage"] if stages else "start"
        detail = {"stage": last, "elapsed_s": round(elapsed, 3), "returncode": rc,
                  "stderr_tail": _tail(work / "stderr.txt") + _tail(work / "stdout.txt", 4)}
        for s in stages:
            detail.update({k: v for k, v in s.items() if k.endswith("_s")})
        where = _STAGE_WORDS.get(last, last)
        if hung:
            return {"ok": False, "bench": detail, "error": {
                "type": RuntimeHung.__name__,
                "message": f"no result after timeout_s={opts['timeout_s']:g}s (stuck in {where}); "
                           "the runtime process was killed"}}
        result_file = work / "result.json"
        if result_file.is_file():
            result = json.loads(result_file.read_text())
            if not result["ok"]:
                result["error"]["message"] = f"{result['error']['message']} (during {where})"
                result["bench"] = detail
            return result
        if rc < 0:
            name = _signal_name(-rc)
            hint = _SIGNAL_HINTS.get(name)
            msg = f"the runtime process died from signal {-rc} ({name}) during {where}" + (f": {hint}" if hint else "")
        else:
            msg = f"the runtime process exited with code {rc} during {where} without a result"
        if detail["stderr_tail"]:
            msg += "; last output: " + detail["stderr_tail"][-1][:300]
        return {"ok": False, "bench": {**detail, "signal": -rc if rc < 0 else None},
                "error": {"type": RuntimeCrashed.__name__, "message": msg}}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench(bundle: Path, options: dict[str, Any] | None) -> dict[str, Any]:
    """The verb's work: check the request, verify the bundle, run the bench in a child."""
    opts = parse_options(options)
    manifest = load_manifest(bundle)
    check_batch(manifest, opts["batch"])
    if opts["verify"]:
        v = verify(bundle, manifest)
        if not v["ok"]:
            raise BundleError(f"bundle {bundle} fails verification: "
                              + "; ".join(f"{p['file']}: {p['problem']}" for p in v["problems"][:5]))
    return bench_in_child(bundle, opts)


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
