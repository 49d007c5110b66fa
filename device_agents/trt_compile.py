"""On the device: build a TensorRT engine from a bundle's prepared ONNX and build spec, with caches.

Engines are tied to the GPU model and the TensorRT version, so they are built here, where they run.
A built engine goes into an **engine cache** keyed by

    sha256({bundle sha256, GPU name, compute capability, TensorRT version, device overrides})

where the *bundle sha256* covers the files the engine is built from (``model.onnx``, its external
data, ``trt_build.json``), hashed from the files themselves and checked against the manifest.
Later ``compile`` calls and the TensorRT runner reuse the cached engine.  A **timing cache** per
(GPU, compute capability, TensorRT version) is loaded before and saved after every build, so
rebuilds (other precisions, other models with the same layers) skip most kernel timing.

Standard library + numpy only at import; ``tensorrt`` and CUDA (``cuda-python``: ``cuda.bindings.runtime``
in cuda-python >= 12.6, ``cuda.cudart`` before) are imported inside the functions that need them.
cuda-python is chosen over PyCUDA because it is NVIDIA's own binding of the CUDA runtime API (the
calls map 1:1 to cudaMalloc/cudaMemcpyAsync/streams/events/graphs) and TensorRT's samples use it.

Cache location: ``options["engine_cache"]``, else ``$EDGEOPT_ENGINE_CACHE``, else
``~/.cache/edgeopt_agent/engines`` (timing caches in ``../timing`` beside it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .bundle import BundleError, listed_path, load_manifest, safe_relpath, sha256_file

SPEC_SCHEMA = 1
MIN_TENSORRT = (8, 5)  # set_memory_pool_limit, parse_from_file, builder_optimization_level (8.6) used below
ENGINE_FILE = "engine.plan"


class TensorRtUnavailable(Exception):
    """TensorRT's Python package or CUDA (cuda-python, a GPU) is not usable on this machine."""


class CompileError(Exception):
    """TensorRT refused the model or failed to build an engine; the message says why."""


# --------------------------------------------------------------------------------------------
# Lazy imports
# --------------------------------------------------------------------------------------------
def import_tensorrt():
    """The ``tensorrt`` module, or TensorRtUnavailable with how to get it."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise TensorRtUnavailable(
            f"TensorRT's Python package is not importable here ({exc}); JetPack ships it on Jetson "
            "(apt install python3-libnvinfer), on x86 install TensorRT with its Python wheel from NVIDIA") from None
    if version_tuple(trt.__version__) < MIN_TENSORRT:
        raise TensorRtUnavailable(f"TensorRT {trt.__version__} is too old; edgeopt needs "
                                  f"{'.'.join(map(str, MIN_TENSORRT))} or newer")
    return trt


def import_cudart():
    """cuda-python's runtime module (new and old import paths), or TensorRtUnavailable."""
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cudart  # older cuda-python
        except ImportError as exc:
            raise TensorRtUnavailable(f"cuda-python is not importable here ({exc}); pip install cuda-python "
                                      "(the major version matching the CUDA driver)") from None
    return cudart


def check_cuda(result, what: str = "CUDA call"):
    """cuda-python returns ``(err, *values)``: raise on an error, return the value(s)."""
    if isinstance(result, tuple):
        err, rest = result[0], result[1:]
    else:
        err, rest = result, ()
    if int(getattr(err, "value", err)) != 0:  # cudaError_t is an int enum; 0 is cudaSuccess
        name = getattr(err, "name", str(err))
        raise CompileError(f"{what} failed: {name}")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in str(v).split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
    return tuple(out)


# --------------------------------------------------------------------------------------------
# The GPU
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuInfo:
    """The GPU an engine is built for."""

    index: int
    name: str
    compute_capability: str
    total_memory_mb: int
    driver: str
    cuda_runtime: str


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def gpu_info(cudart, index: int = 0) -> GpuInfo:
    """Name, compute capability and memory of GPU ``index`` (cudaGetDeviceProperties)."""
    count = check_cuda(cudart.cudaGetDeviceCount(), "cudaGetDeviceCount")
    if not count:
        raise TensorRtUnavailable("no CUDA GPU is visible on this machine")
    if not 0 <= index < count:
        raise CompileError(f"GPU {index} does not exist here ({count} visible)")
    props = check_cuda(cudart.cudaGetDeviceProperties(index), "cudaGetDeviceProperties")
    name = props.name
    if isinstance(name, (bytes, bytearray)):
        name = bytes(name).split(b"\0", 1)[0].decode(errors="replace")
    driver = check_cuda(cudart.cudaDriverGetVersion(), "cudaDriverGetVersion")
    runtime = check_cuda(cudart.cudaRuntimeGetVersion(), "cudaRuntimeGetVersion")
    return GpuInfo(index, str(name).strip(), f"{props.major}.{props.minor}", int(props.totalGlobalMem) >> 20,
                   _cuda_version(int(driver)), _cuda_version(int(runtime)))


# --------------------------------------------------------------------------------------------
# Keys and caches (pure: tested without a GPU)
# --------------------------------------------------------------------------------------------
def engine_input_files(manifest: dict[str, Any]) -> list[str]:
    """The bundle files an engine is built from: the ONNX, its external data, the build spec."""
    rt = manifest.get("runtime") or {}
    if rt.get("name") != "tensorrt":
        raise BundleError(f"not a TensorRT bundle (runtime {rt.get('name')!r})")
    onnx_rel = safe_relpath(rt["artifact"])
    spec_rel = safe_relpath((rt.get("options") or {}).get("build_spec", "trt_build.json"))
    files = manifest.get("files") or {}
    rels = [onnx_rel, spec_rel] + sorted(r for r in files if r.startswith(onnx_rel + ".") and r.endswith(".data"))
    missing = [r for r in rels if r not in files]
    if missing:
        raise BundleError(f"the manifest does not list {missing}")
    return rels


def bundle_sha256(bundle: str | os.PathLike, manifest: dict[str, Any]) -> str:
    """sha256 over the engine's input files, hashed from disk and checked against the manifest."""
    bundle = Path(bundle)
    h = hashlib.sha256()
    for rel in engine_input_files(manifest):
        path = bundle / rel
        if not path.is_file():
            raise BundleError(f"{rel} is missing from the bundle")
        digest = sha256_file(path)
        if digest != manifest["files"][rel]["sha256"]:
            raise BundleError(f"{rel} does not match its sha256 in the manifest: the bundle is damaged; push it again")
        h.update(f"{rel}:{digest}\n".encode())
    return h.hexdigest()


def cache_key(bundle_digest: str, gpu_name: str, compute_capability: str, tensorrt_version: str,
              overrides: dict[str, Any] | None = None) -> str:
    """The engine cache key: everything an engine depends on, and nothing else."""
    parts = {"bundle": bundle_digest, "gpu": gpu_name, "compute_capability": str(compute_capability),
             "tensorrt": str(tensorrt_version), "overrides": overrides or {}}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def cache_root(options: dict[str, Any] | None = None) -> Path:
    o = options or {}
    root = o.get("engine_cache") or os.environ.get("EDGEOPT_ENGINE_CACHE") \
        or Path.home() / ".cache" / "edgeopt_agent" / "engines"
    return Path(root)


def timing_cache_path(root: Path, gpu_name: str, compute_capability: str, tensorrt_version: str) -> Path:
    """One timing cache per (GPU, compute capability, TensorRT version), shared by all models."""
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", gpu_name).strip("-") or "gpu"
    return root.parent / "timing" / f"{slug}-sm{compute_capability.replace('.', '')}-trt{tensorrt_version}.cache"


def write_atomic(path: Path, data: bytes) -> None:
    """Write through a temp file in the same folder and rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class EngineCache:
    """``root/<key[:2]>/<key>/{engine.plan, meta.json, build.log}``, each entry installed atomically."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def entry(self, key: str) -> Path:
        if not re.fullmatch(r"[0-9a-f]{64}", key):
            raise ValueError(f"bad engine cache key {key!r}")
        return self.root / key[:2] / key

    def lookup(self, key: str) -> dict[str, Any] | None:
        """The entry's metadata when a complete, intact engine is cached, else None."""
        d = self.entry(key)
        try:
            meta = json.loads((d / "meta.json").read_text())
            engine = d / ENGINE_FILE
            if engine.stat().st_size != meta["engine_bytes"] or sha256_file(engine) != meta["engine_sha256"]:
                return None
        except (OSError, ValueError, KeyError):
            return None
        meta["engine"] = str(engine)
        return meta

    def store(self, key: str, engine: bytes, meta: dict[str, Any], log: str = "") -> dict[str, Any]:
        """Install an entry (temp dir + rename); a concurrent build that won the race is kept."""
        d = self.entry(key)
        d.parent.mkdir(parents=True, exist_ok=True)
        meta = {**meta, "key": key, "engine_bytes": len(engine), "engine_sha256": hashlib.sha256(engine).hexdigest()}
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}.", dir=d.parent))
        try:
            (tmp / ENGINE_FILE).write_bytes(engine)
            (tmp / "build.log").write_text(log)
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
            if d.exists():
                shutil.rmtree(d, ignore_errors=True)
            os.replace(tmp, d)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if self.lookup(key) is None:
                raise
        meta["engine"] = str(d / ENGINE_FILE)
        return meta


# --------------------------------------------------------------------------------------------
# The build spec
# --------------------------------------------------------------------------------------------
def load_spec(bundle: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    rel = listed_path(manifest, (manifest["runtime"].get("options") or {}).get("build_spec", "trt_build.json"),
                      "runtime.options.build_spec")
    try:
        spec = json.loads((bundle / rel).read_text())
    except (OSError, ValueError) as exc:
        raise BundleError(f"cannot read the build spec {rel}: {exc}") from None
    if spec.get("schema") != SPEC_SCHEMA:
        raise BundleError(f"{rel} has schema {spec.get('schema')!r}; this agent reads schema {SPEC_SCHEMA}: "
                          "update the agent")
    return spec


# --------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------
def _collecting_logger(trt, min_severity: str = "INFO"):
    """A trt.ILogger that keeps every message (for the build log) at ``min_severity`` and above."""
    sev = trt.ILogger.Severity
    order = [sev.INTERNAL_ERROR, sev.ERROR, sev.WARNING, sev.INFO, sev.VERBOSE]
    limit = order.index(getattr(sev, min_severity.upper(), sev.INFO))
    names = {sev.INTERNAL_ERROR: "E!", sev.ERROR: "E", sev.WARNING: "W", sev.INFO: "I", sev.VERBOSE: "V"}

    class Collecting(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.lines: list[str] = []
            self.errors: list[str] = []
            self.warnings = 0

        def log(self, severity, msg) -> None:  # called by TensorRT, possibly from its threads
            if order.index(severity) > limit:
                return
            self.lines.append(f"[{names.get(severity, '?')}] {msg}")
            if severity in (sev.ERROR, sev.INTERNAL_ERROR):
                self.errors.append(msg)
            elif severity == sev.WARNING:
                self.warnings += 1

    return Collecting()


def _parser_errors(parser) -> list[str]:
    """Every parser error, with the node and op where TensorRT says which."""
    out = []
    for i in range(parser.num_errors):
        e = parser.get_error(i)
        bits = []
        for attr in ("node_name", "node_operator"):
            fn = getattr(e, attr, None)
            try:
                v = fn() if callable(fn) else None
            except Exception:  # older TensorRT: the accessor exists but is not implemented
                v = None
            if v:
                bits.append(f"{attr.split('_')[1]} {v}")
        if not bits:
            bits.append(f"node #{e.node()}")
        out.append(f"{e.desc()} ({', '.join(bits)})")
    return out


def check_typing(tensorrt_version: str, spec: dict[str, Any]) -> None:
    """TensorRT 11 removed weak typing (the FP16/INT8/FP8/BF16 builder flags, calibrators, precision
    constraints): a bundle built for the builder-flag path cannot compile there. Refused in one line."""
    weak = [f for f in spec.get("flags", []) if f in ("FP16", "INT8", "FP8", "BF16")]
    if version_tuple(tensorrt_version) >= (11,) and (weak or not spec.get("strongly_typed")):
        raise CompileError(
            f"this bundle was built for TensorRT {spec.get('tensorrt_major') or 10}'s builder flags "
            f"({', '.join(weak) or 'weakly typed'}); TensorRT {tensorrt_version} has no weak typing: rebuild it "
            "for a TensorRT 11 target (a100, h100, l4, nvidia: strongly typed, the precision in the ONNX)")


def build_engine(trt, onnx_path: Path, spec: dict[str, Any], gpu: GpuInfo, timing_cache: Path | None,
                 workspace_mb: int | None = None, log_level: str = "INFO") -> tuple[bytes, dict[str, Any]]:
    """Parse the ONNX and build a serialized engine per the spec; returns (engine bytes, build facts)."""
    check_typing(trt.__version__, spec)
    logger = _collecting_logger(trt, log_level)
    builder = trt.Builder(logger)
    flags = 0
    if version_tuple(trt.__version__) < (10,):  # explicit batch is the only mode from TensorRT 10 on
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    if spec.get("strongly_typed"):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = _parser_errors(parser)
        raise CompileError(f"TensorRT {trt.__version__}'s ONNX parser refused the model ({len(errors)} error(s)):\n  "
                           + "\n  ".join(errors))
    config = builder.create_builder_config()
    if hasattr(trt, "ProfilingVerbosity"):  # layer types in the engine's metadata (the per-layer profile); no speed cost
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_mb or spec["workspace_mb"]) << 20)
    cc = version_tuple(gpu.compute_capability)
    for name in spec.get("flags", []):
        if name == "FP8" and cc < (8, 9):
            raise CompileError(f"FP8 needs compute capability 8.9 or newer (Ada, Hopper); {gpu.name} is "
                               f"{gpu.compute_capability}")
        flag = getattr(trt.BuilderFlag, name, None)
        if flag is None:
            raise CompileError(f"TensorRT {trt.__version__} has no builder flag {name}")
        config.set_flag(flag)
    for name in spec.get("clear_flags", []):
        flag = getattr(trt.BuilderFlag, name, None)
        if flag is not None:
            config.clear_flag(flag)
    if hasattr(config, "builder_optimization_level"):  # TensorRT >= 8.6
        config.builder_optimization_level = int(spec.get("builder_optimization_level", 3))
    dynamic = [network.get_input(i) for i in range(network.num_inputs) if -1 in tuple(network.get_input(i).shape)]
    for prof in spec.get("profiles", []):
        profile = builder.create_optimization_profile()
        for name, s in prof.items():
            profile.set_shape(name, tuple(s["min"]), tuple(s["opt"]), tuple(s["max"]))
        config.add_optimization_profile(profile)
    unprofiled = [t.name for t in dynamic if not any(t.name in p for p in spec.get("profiles", []))]
    if unprofiled:
        raise CompileError(f"input(s) {unprofiled} have dynamic dims but the build spec gives no profile for them")
    dla = spec.get("dla")
    if dla:
        if builder.num_DLA_cores <= int(dla["core"]):
            raise CompileError(f"the spec asks for DLA core {dla['core']} but this device has "
                               f"{builder.num_DLA_cores} DLA core(s)")
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = int(dla["core"])
    cache_bytes = b""
    if timing_cache is not None and timing_cache.is_file():
        cache_bytes = timing_cache.read_bytes()
    tcache = None
    if timing_cache is not None:
        tcache = config.create_timing_cache(cache_bytes)
        config.set_timing_cache(tcache, ignore_mismatch=False)
    t0 = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    build_s = time.perf_counter() - t0
    if serialized is None:
        tail = logger.errors[-5:] or logger.lines[-5:]
        raise CompileError("TensorRT built no engine:\n  " + "\n  ".join(tail or ["(no log lines)"]))
    if timing_cache is not None:
        write_atomic(timing_cache, bytes(memoryview(config.get_timing_cache().serialize())))
    facts = {"build_s": round(build_s, 3), "layers": network.num_layers, "warnings": logger.warnings,
             "timing_cache": {"path": str(timing_cache) if timing_cache else None,
                              "loaded_bytes": len(cache_bytes), "used": timing_cache is not None},
             "log": logger.lines}
    return bytes(memoryview(serialized)), facts


def compile_bundle(bundle: str | os.PathLike, options: dict[str, Any] | None = None,
                   manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build (or reuse) the engine of a TensorRT bundle on this device; the ``compile`` verb.

    options: ``gpu`` (index, 0), ``rebuild`` (ignore the cache), ``engine_cache`` (folder),
    ``workspace_mb`` (override the spec, e.g. on a smaller Jetson), ``log_level`` (INFO|VERBOSE|WARNING),
    ``copy_to`` (also write the engine there, e.g. a Triton model repository's ``1/model.plan``).
    """
    o = dict(options or {})
    bundle = Path(bundle)
    manifest = manifest or load_manifest(bundle)
    digest = bundle_sha256(bundle, manifest)
    spec = load_spec(bundle, manifest)
    trt = import_tensorrt()
    cudart = import_cudart()
    gpu = gpu_info(cudart, int(o.get("gpu", 0)))
    check_cuda(cudart.cudaSetDevice(gpu.index), "cudaSetDevice")
    overrides = {k: o[k] for k in ("workspace_mb",) if o.get(k) is not None}
    key = cache_key(digest, gpu.name, gpu.compute_capability, trt.__version__, overrides)
    root = cache_root(o)
    cache = EngineCache(root)
    warnings = []
    want = (spec.get("target") or {}).get("compute_capability")
    if want and want != gpu.compute_capability:
        warnings.append(f"the bundle was made for target {spec['target']['name']} (compute capability {want}); "
                        f"this GPU is {gpu.name} ({gpu.compute_capability}): the engine is built for this GPU")
    hit = None if o.get("rebuild") else cache.lookup(key)
    t0 = time.perf_counter()
    if hit is not None:
        meta, log_tail, built = hit, [], False
    else:
        timing = timing_cache_path(root, gpu.name, gpu.compute_capability, trt.__version__) \
            if spec.get("timing_cache", True) else None
        engine, facts = build_engine(trt, bundle / listed_path(manifest, spec.get("onnx", manifest["runtime"]["artifact"]),
                                                                     "build spec onnx"), spec, gpu,
                                     timing, o.get("workspace_mb"), str(o.get("log_level", "INFO")))
        log = facts.pop("log")
        meta = cache.store(key, engine, {
            "bundle_sha256": digest, "gpu": asdict(gpu), "tensorrt": trt.__version__, "overrides": overrides,
            "model": (manifest.get("model") or {}).get("name"), "target": manifest.get("target"),
            "precision": manifest.get("precision"), "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **facts}, "\n".join(log) + "\n")
        log_tail, built = log[-40:], True
    result = {
        "engine": meta["engine"], "cache_key": key, "cached": not built,
        "key_parts": {"bundle_sha256": digest, "gpu": gpu.name, "compute_capability": gpu.compute_capability,
                      "tensorrt": trt.__version__, "overrides": overrides},
        "build_s": meta.get("build_s"), "built_at": meta.get("built_at"), "elapsed_s": round(time.perf_counter() - t0, 3),
        "engine_bytes": meta.get("engine_bytes"), "layers": meta.get("layers"),
        "timing_cache": meta.get("timing_cache"), "build_log": str(Path(meta["engine"]).with_name("build.log")),
        "build_log_tail": log_tail, "gpu": asdict(gpu), "tensorrt": trt.__version__, "warnings": warnings,
    }
    if o.get("copy_to"):
        dst = Path(o["copy_to"])
        write_atomic(dst, Path(meta["engine"]).read_bytes())
        result["copied_to"] = str(dst)
    jetson = jetson_state()
    if jetson is not None:
        result["jetson"] = jetson
    return result


# --------------------------------------------------------------------------------------------
# Jetson power mode and clocks
# --------------------------------------------------------------------------------------------
_TOOL_DIRS = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")


def _tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in _TOOL_DIRS:  # /usr/sbin is often off a non-root user's PATH
        p = Path(d) / name
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def parse_nvpmodel(text: str) -> dict[str, Any]:
    """``nvpmodel -q`` -> {"name", "id"} (e.g. "NV Power Mode: MAXN" then "0")."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        line = line.strip()
        m = re.match(r"NV Power Mode\s*:\s*(.+)", line)
        if m:
            out["name"] = m.group(1).strip()
        elif re.fullmatch(r"\d+", line) and "id" not in out:
            out["id"] = int(line)
    return out


def parse_jetson_clocks(text: str) -> dict[str, dict[str, str]]:
    """``jetson_clocks --show`` lines like ``GPU MinFreq=... MaxFreq=... CurrentFreq=...`` -> {unit: {k: v}}."""
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        pairs = re.findall(r"(\w+)=(\S+)", line)
        if not pairs:
            continue
        unit = line.split()[0].rstrip(":")
        if "=" in unit:
            continue
        out[unit] = dict(pairs)
    return out


def parse_tegrastats(line: str) -> dict[str, Any]:
    """One ``tegrastats`` line -> RAM, GPU load/frequency, EMC, temperatures (C) and rails (mW)."""
    out: dict[str, Any] = {}
    m = re.search(r"RAM (\d+)/(\d+)MB", line)
    if m:
        out["ram_mb"] = {"used": int(m.group(1)), "total": int(m.group(2))}
    m = re.search(r"GR3D_FREQ (\d+)%(?:@\[?([\d,]+)\]?)?", line)
    if m:
        out["gpu_load_pct"] = int(m.group(1))
        if m.group(2):
            out["gpu_freq_mhz"] = [int(v) for v in m.group(2).split(",") if v]
    m = re.search(r"EMC_FREQ (\d+)%(?:@(\d+))?", line)
    if m:
        out["emc_load_pct"] = int(m.group(1))
        if m.group(2):
            out["emc_freq_mhz"] = int(m.group(2))
    temps = {k: float(v) for k, v in re.findall(r"\b([A-Za-z0-9_]+)@(-?\d+(?:\.\d+)?)C\b", line)}
    if temps:
        out["temperature_c"] = temps
    rails = {k: {"now_mw": int(a), "avg_mw": int(b)} for k, a, b in re.findall(r"\b([A-Z][A-Z0-9_]+) (\d+)mW/(\d+)mW", line)}
    if rails:
        out["power_mw"] = rails
    return out


def _run(cmd: list[str], timeout: float = 5.0) -> tuple[str | None, str | None]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if p.returncode != 0:
        return None, (p.stderr or p.stdout).strip().splitlines()[-1][:200] if (p.stderr or p.stdout).strip() \
            else f"exit code {p.returncode}"
    return p.stdout, None


def _tegrastats_line(timeout: float = 3.0) -> tuple[str | None, str | None]:
    exe = _tool("tegrastats")
    if not exe:
        return None, "tegrastats not found"
    try:
        proc = subprocess.Popen([exe, "--interval", "200"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True)
    except OSError as exc:
        return None, str(exc)
    try:
        import select

        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline().strip() if ready and proc.stdout else ""
        return (line or None), (None if line else "tegrastats printed nothing")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def is_jetson(root: str = "/") -> bool:
    r = Path(root)
    if (r / "etc/nv_tegra_release").is_file():
        return True
    try:
        model = (r / "proc/device-tree/model").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return "jetson" in model.lower()


def jetson_state(root: str = "/") -> dict[str, Any] | None:
    """Power mode, clocks and a tegrastats sample on a Jetson; None elsewhere.  Unreadable parts say why."""
    if not is_jetson(root):
        return None
    r = Path(root)
    state: dict[str, Any] = {"errors": {}}
    try:
        state["model"] = (r / "proc/device-tree/model").read_bytes().decode(errors="replace").strip("\x00 \n")
    except OSError:
        pass
    try:
        state["l4t"] = (r / "etc/nv_tegra_release").read_text().splitlines()[0].strip("# ").strip()
    except (OSError, IndexError):
        pass
    for name, args, parse in (("nvpmodel", ["-q"], parse_nvpmodel), ("jetson_clocks", ["--show"], parse_jetson_clocks)):
        exe = _tool(name)
        if not exe:
            state["errors"][name] = "not found"
            continue
        text, err = _run([exe, *args])
        if err:
            state["errors"][name] = err  # jetson_clocks --show usually needs root; the agent never does
        else:
            state[name] = parse(text or "")
    line, err = _tegrastats_line()
    if line:
        state["tegrastats"] = {"line": line, **parse_tegrastats(line)}
    else:
        state["errors"]["tegrastats"] = err
    devfreq = {}
    for d in sorted((r / "sys/class/devfreq").glob("*")):
        entry = {}
        for f in ("cur_freq", "max_freq", "min_freq", "governor"):
            try:
                entry[f] = (d / f).read_text().strip()
            except OSError:
                pass
        if entry:
            devfreq[d.name] = entry
    if devfreq:
        state["devfreq"] = devfreq
    if not state["errors"]:
        del state["errors"]
    return state
