"""TensorRT runner: the engine from the device's engine cache (built on first use), run with CUDA.

- Device buffers and pinned host buffers are allocated once per input shape, never per run.
- Each run records four CUDA events on one stream, so host-to-device copies, compute and
  device-to-host copies are timed separately (GPU clock), and the host wall time of the whole
  ``run()`` is timed too: kernel-only and end-to-end figures differ and users need both.
- Compute is replayed from a CUDA graph when capture works (``options["cuda_graph"]``: auto | on
  | off); engines with data-dependent control flow cannot be captured and run with
  ``execute_async_v3`` instead -- ``info()`` says which and why.
- ``info()`` carries the split timings (mean, std, p50/p90/p99, min, max in ms per phase), the
  engine cache key and whether the engine was reused, and on a Jetson the power mode and clocks.
  The bench calls ``reset_timings()`` after its warm-up, so the split timings (and their ``runs``)
  cover the same runs as its latency figures, not the first inference, accuracy pass or warm-up.

Standard library + numpy at import; tensorrt and cuda-python are imported in ``load()``.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import numpy as np

from . import Runner, RunnerUnavailable

PHASES = ("h2d", "compute", "d2h", "gpu_total", "host_e2e")


def summarize(values_ms: list[float]) -> dict[str, float]:
    """mean, std, p50/p90/p99, min, max of a list of milliseconds (empty list -> {})."""
    if not values_ms:
        return {}
    a = np.asarray(values_ms, np.float64)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": round(float(a.mean()), 4), "std": round(float(a.std()), 4), "p50": round(float(p50), 4),
            "p90": round(float(p90), 4), "p99": round(float(p99), 4), "min": round(float(a.min()), 4),
            "max": round(float(a.max()), 4)}


class TensorRtRunner(Runner):
    """Runs a TensorRT bundle's engine (compiled on this device by ``edgeopt_agent.trt_compile``)."""

    runtime = "tensorrt"

    def load(self) -> None:
        from .. import trt_compile as tc

        try:
            self._trt = tc.import_tensorrt()
            self._cudart = tc.import_cudart()
        except tc.TensorRtUnavailable as exc:
            raise RunnerUnavailable(str(exc)) from None
        self._tc = tc
        self._cuda = lambda result, what: tc.check_cuda(result, what)
        opts = {k: self.options[k] for k in ("gpu", "rebuild", "engine_cache", "workspace_mb", "log_level")
                if k in self.options}
        self.compiled = tc.compile_bundle(self.bundle, opts, self.manifest)
        trt, cudart = self._trt, self._cudart
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        with open(self.compiled["engine"], "rb") as f:
            self.engine = self._runtime.deserialize_cuda_engine(f.read())
        if self.engine is None:
            raise RuntimeError(f"TensorRT could not deserialize {self.compiled['engine']}")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self._inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if n not in self._inputs]
        self._stream = self._cuda(cudart.cudaStreamCreate(), "cudaStreamCreate")
        self._events = [self._cuda(cudart.cudaEventCreate(), "cudaEventCreate") for _ in range(4)]
        self._buffers: dict[str, tuple[int, int, np.ndarray]] = {}  # name -> (device ptr, pinned ptr, host view)
        self._graph = self._graph_exec = None
        self._graph_note = "not captured"
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._times: dict[str, list[float]] = {p: [] for p in PHASES}
        self._runs = 0
        self._configure({s["name"]: tuple(s["shape"]) for s in self.manifest["io"]["inputs"]})

    # --- buffers and graphs ------------------------------------------------------------
    def _free(self) -> None:
        cudart = self._cudart
        if self._graph_exec is not None:
            cudart.cudaGraphExecDestroy(self._graph_exec)
        if self._graph is not None:
            cudart.cudaGraphDestroy(self._graph)
        self._graph = self._graph_exec = None
        for dptr, hptr, _ in self._buffers.values():
            cudart.cudaFree(dptr)
            cudart.cudaFreeHost(hptr)
        self._buffers = {}

    def _configure(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Set input shapes, (re)allocate every buffer once for them, warm up, capture a graph."""
        trt, cudart = self._trt, self._cudart
        self._free()
        self._select_profile(shapes)
        for name in self._inputs:
            if name not in shapes:
                raise ValueError(f"no shape for engine input {name!r}")
            if not self.context.set_input_shape(name, tuple(int(d) for d in shapes[name])):
                raise ValueError(f"shape {shapes[name]} of {name!r} is outside the engine's optimization profile")
        for name in self._inputs + self._outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise RuntimeError(f"{name!r} has a data-dependent shape {shape}: this runner allocates buffers once "
                                   "and does not take data-dependent output shapes")
            dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(name)))
            nbytes = max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)
            dptr = self._cuda(cudart.cudaMalloc(nbytes), f"cudaMalloc({nbytes}) for {name}")
            hptr = self._cuda(cudart.cudaMallocHost(nbytes), f"cudaMallocHost({nbytes}) for {name}")
            raw = (ctypes.c_byte * nbytes).from_address(hptr)
            view = np.frombuffer(raw, dtype=np.uint8, count=nbytes)[: int(np.prod(shape, dtype=np.int64)) * dtype.itemsize]
            self._buffers[name] = (dptr, hptr, view.view(dtype).reshape(shape))
            if not self.context.set_tensor_address(name, dptr):
                raise RuntimeError(f"TensorRT refused the buffer address of {name!r}")
        self._shapes = {n: tuple(shapes[n]) for n in self._inputs}
        # One plain run first: TensorRT does its lazy set-up there, which must not land in a graph.
        if not self.context.execute_async_v3(int(self._stream)):
            raise RuntimeError("TensorRT execute_async_v3 failed on the warm-up run")
        self._cuda(cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        self._capture()

    def _select_profile(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """An engine with several optimization profiles (one per bucket of a variable-length input, issue 42):
        switch the context to the first profile whose min..max holds every input's shape."""
        count = int(getattr(self.engine, "num_optimization_profiles", 1) or 1)
        if count <= 1:
            return
        for k in range(count):
            fits = True
            for name in self._inputs:
                lo, _, hi = self.engine.get_tensor_profile_shape(name, k)
                shape = shapes.get(name, ())
                if len(shape) != len(lo) or any(not (a <= d <= b) for a, d, b in zip(lo, shape, hi)):
                    fits = False
                    break
            if fits:
                if self.context.active_optimization_profile != k:
                    if not self.context.set_optimization_profile_async(k, int(self._stream)):
                        raise RuntimeError(f"TensorRT refused optimization profile {k}")
                    self._cuda(self._cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
                return
        raise ValueError(f"shapes {shapes} lie in none of the engine's {count} optimization profiles")

    def _capture(self) -> None:
        mode = str(self.options.get("cuda_graph", "auto")).lower()
        if mode in ("off", "false", "0", "no"):
            self._graph_note = "off (options)"
            return
        cudart = self._cudart
        err = cudart.cudaStreamBeginCapture(self._stream, cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal)
        ok = int(getattr(err[0], "value", err[0])) == 0
        launched = ok and bool(self.context.execute_async_v3(int(self._stream)))
        end = cudart.cudaStreamEndCapture(self._stream) if ok else None
        graph = end[1] if end is not None and int(getattr(end[0], "value", end[0])) == 0 else None
        exec_ = None
        if launched and graph is not None:
            inst = getattr(cudart, "cudaGraphInstantiateWithFlags", None)
            res = inst(graph, 0) if inst is not None else cudart.cudaGraphInstantiate(graph, 0)
            if int(getattr(res[0], "value", res[0])) == 0:
                exec_ = res[1]
        if exec_ is None:
            if graph is not None:
                cudart.cudaGraphDestroy(graph)
            cudart.cudaGetLastError()  # clear the sticky capture error, if any
            self._graph_note = "capture failed (engine not capturable); running execute_async_v3"
            if mode in ("on", "true", "1", "yes"):
                raise RuntimeError("cuda_graph=on but this engine cannot be captured in a CUDA graph")
            return
        self._graph, self._graph_exec = graph, exec_
        self._graph_note = "replayed"

    # --- running -------------------------------------------------------------------------
    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        cudart, cuda = self._cudart, self._cuda
        t0 = time.perf_counter()
        shapes = {n: tuple(np.shape(feed[n])) for n in self._inputs}
        if shapes != self._shapes:
            self._configure(shapes)
        h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        d2h = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for n in self._inputs:
            np.copyto(self._buffers[n][2], feed[n], casting="unsafe")  # e.g. int64 ids into an int32 engine input
        e0, e1, e2, e3 = self._events
        s = self._stream
        cuda(cudart.cudaEventRecord(e0, s), "cudaEventRecord")
        for n in self._inputs:
            dptr, hptr, view = self._buffers[n]
            cuda(cudart.cudaMemcpyAsync(dptr, hptr, view.nbytes, h2d, s), f"copy {n} to the GPU")
        cuda(cudart.cudaEventRecord(e1, s), "cudaEventRecord")
        if self._graph_exec is not None:
            cuda(cudart.cudaGraphLaunch(self._graph_exec, s), "cudaGraphLaunch")
        elif not self.context.execute_async_v3(int(s)):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        cuda(cudart.cudaEventRecord(e2, s), "cudaEventRecord")
        for n in self._outputs:
            dptr, hptr, view = self._buffers[n]
            cuda(cudart.cudaMemcpyAsync(hptr, dptr, view.nbytes, d2h, s), f"copy {n} from the GPU")
        cuda(cudart.cudaEventRecord(e3, s), "cudaEventRecord")
        cuda(cudart.cudaEventSynchronize(e3), "cudaEventSynchronize")
        out = {n: self._buffers[n][2].copy() for n in self._outputs}  # the pinned buffers are reused
        wall = (time.perf_counter() - t0) * 1000
        times = self._times
        times["h2d"].append(float(cuda(cudart.cudaEventElapsedTime(e0, e1), "cudaEventElapsedTime")))
        times["compute"].append(float(cuda(cudart.cudaEventElapsedTime(e1, e2), "cudaEventElapsedTime")))
        times["d2h"].append(float(cuda(cudart.cudaEventElapsedTime(e2, e3), "cudaEventElapsedTime")))
        times["gpu_total"].append(float(cuda(cudart.cudaEventElapsedTime(e0, e3), "cudaEventElapsedTime")))
        times["host_e2e"].append(wall)
        self._runs += 1
        return out

    def profile(self, feeds: list[dict[str, np.ndarray]], iterations: int) -> dict[str, Any]:
        """Per-layer times from TensorRT's ``IProfiler`` on a second execution context over ``iterations``
        runs of the first feed (already in the device buffers); layer types from the engine inspector
        (the engine is built with DETAILED profiling verbosity). A profiled enqueue is synchronous and
        never replayed from a CUDA graph, so its wall time is above the bench's p50: that is the
        profiler's overhead, reported by the caller."""
        trt, cudart = self._trt, self._cudart
        times: dict[str, list[float]] = {}

        class _Profiler(trt.IProfiler):
            def __init__(self) -> None:
                trt.IProfiler.__init__(self)

            def report_layer_time(self, layer_name: str, ms: float) -> None:
                times.setdefault(layer_name, []).append(float(ms))

        self.run(feeds[0])  # the first feed into the input buffers the profiled context reads
        ctx = self.engine.create_execution_context()
        prof = _Profiler()
        ctx.profiler = prof
        for name in self._inputs:
            ctx.set_input_shape(name, self._shapes[name])
        for name, (dptr, _, _) in self._buffers.items():
            ctx.set_tensor_address(name, dptr)
        t0 = time.perf_counter()
        for _ in range(iterations):
            if not ctx.execute_async_v3(int(self._stream)):
                raise RuntimeError("TensorRT execute_async_v3 failed in the profiled context")
            self._cuda(cudart.cudaStreamSynchronize(self._stream), "cudaStreamSynchronize")
        wall = (time.perf_counter() - t0) * 1000 / max(iterations, 1)
        del ctx
        types = self._layer_types()
        nodes = [{"name": k, "op": types.get(k) or "layer", "ms": sum(v) / max(iterations, 1)} for k, v in times.items()]
        return {"nodes": nodes, "iterations": iterations, "wall_ms": wall,
                "profiler": f"TensorRT {trt.__version__} IProfiler (engine layers: fused ONNX nodes are one layer)"}

    def _layer_types(self) -> dict[str, str]:
        """Layer name -> layer type from the engine inspector's JSON (names only unless built DETAILED)."""
        import json

        try:
            inspector = self.engine.create_engine_inspector()
            info = json.loads(inspector.get_engine_information(self._trt.LayerInformationFormat.JSON))
        except Exception:  # noqa: BLE001 - types are a label; the times stand without them
            return {}
        return {layer["Name"]: str(layer.get("LayerType") or "layer") for layer in info.get("Layers", [])
                if isinstance(layer, dict) and "Name" in layer}

    def reset_timings(self) -> None:
        """Forget the split timings so far (e.g. after warm-up runs)."""
        self._times = {p: [] for p in PHASES}
        self._runs = 0

    def info(self) -> dict[str, Any]:
        c = getattr(self, "compiled", {}) or {}
        out: dict[str, Any] = {
            "runtime": self.runtime, "version": getattr(getattr(self, "_trt", None), "__version__", None),
            "device": (c.get("gpu") or {}).get("name"), "compute_capability": (c.get("gpu") or {}).get("compute_capability"),
            "engine": {"cache_key": c.get("cache_key"), "cached": c.get("cached"), "build_s": c.get("build_s"),
                       "path": c.get("engine")},
            "cuda_graph": getattr(self, "_graph_note", "not loaded"),
            "timings_ms": {"runs": getattr(self, "_runs", 0),
                           "what": "h2d/compute/d2h/gpu_total: CUDA events on the stream (GPU time); "
                                   "host_e2e: wall time of run() incl. copies into pinned memory",
                           **{p: summarize(v) for p, v in getattr(self, "_times", {}).items()}},
        }
        if c.get("jetson"):
            out["jetson"] = c["jetson"]
        return out

    def close(self) -> None:
        if not hasattr(self, "_cudart"):
            return
        cudart = self._cudart
        if getattr(self, "_buffers", None) is not None:
            self._free()
        for ev in getattr(self, "_events", []):
            cudart.cudaEventDestroy(ev)
        self._events = []
        if getattr(self, "_stream", None) is not None:
            cudart.cudaStreamDestroy(self._stream)
            self._stream = None
        self.context = self.engine = None
