"""OpenVINO runner: reads the bundle's IR (``model.xml`` + ``model.bin``) and runs it on one device.

The device comes from the manifest's ``runtime.options.device`` (``CPU``, ``GPU``, ``NPU``) unless
the caller's options name another one (the host check of an ``intel-gpu`` bundle runs it on
``CPU`` when the build host has no GPU).  One compiled model and one reused infer request: the
latency hint and the thread count are set at compile time, so nothing is re-planned per run.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from . import Runner, RunnerUnavailable


def device_present(available: list[str], device: str) -> bool:
    """``GPU`` is present when OpenVINO lists ``GPU`` or ``GPU.0``...; virtual devices are not checked."""
    if device.split(":")[0] in ("AUTO", "MULTI", "HETERO", "BATCH"):
        return True
    return any(d == device or d.startswith(device + ".") or device.startswith(d + ".") for d in available)


def _plain(value: Any) -> Any:
    """A property value as JSON: ints stay ints, ``ov.Type`` becomes ``"bf16"``, enums their name."""
    if isinstance(value, (int, float, bool)):
        return value
    if hasattr(value, "to_string"):
        return value.to_string()
    return getattr(value, "name", None) or str(value)


class OpenVinoRunner(Runner):
    runtime = "openvino"

    def load(self) -> None:
        try:
            import openvino as ov
        except ImportError as exc:
            raise RunnerUnavailable(f"openvino is not installed: {exc} (pip install openvino)") from None
        self._ov = ov
        rt = dict(self.manifest["runtime"].get("options", {}))
        settings = {**rt, **{k: v for k, v in self.options.items() if v is not None}}
        self.device = str(settings.get("device") or "CPU")
        self.core = ov.Core()
        if settings.get("cache_dir"):  # compiled-blob cache: a warm one skips most of compile_model
            self.core.set_property({"CACHE_DIR": str(settings["cache_dir"])})
        available = list(self.core.available_devices)
        if not device_present(available, self.device):
            raise RunnerUnavailable(f"OpenVINO device {self.device!r} is not present on this machine "
                                    f"(OpenVINO sees {', '.join(available) or 'none'})")
        config: dict[str, Any] = {"PERFORMANCE_HINT": str(settings.get("hint") or "LATENCY")}
        if settings.get("threads"):
            config["INFERENCE_NUM_THREADS"] = int(settings["threads"])
        precision = str(settings.get("inference_precision") or "")
        self._fallback = None
        if precision == "f16" and self.device.split(".")[0] == "CPU" and not self._cpu_has_fp16():
            # The CPU plugin ignores an f16 hint it cannot honour and keeps its default, which is
            # bf16 on CPUs with AVX512-BF16 but no FP16 (coarser than FP16): ask for f32 instead.
            precision, self._fallback = "f32", "f16 requested; this CPU has no FP16 arithmetic, so f32"
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        self.config = config
        model = self.core.read_model(str(self.artifact))
        self.compiled = self.core.compile_model(model, self.device, config)
        self.request = self.compiled.create_infer_request()
        # Results are keyed by the ONNX output names; OpenVINO keeps them as tensor names, but a tensor
        # may carry several names, so pick the one the manifest knows.
        wanted = [o.get("artifact_name") or o["name"] for o in self.manifest["io"]["outputs"]]
        self._outputs = []
        for port in self.compiled.outputs:
            names = port.get_names()
            self._outputs.append((port, next((n for n in wanted if n in names), port.get_any_name())))
        # OpenVINO insists on exact static shapes where ONNX Runtime lets a [1] feed a scalar; a
        # scalar input (silero-vad's `sr`) often arrives as [1] (np.ascontiguousarray makes 0-d 1-d).
        self._shapes: dict[str, tuple[int, ...]] = {}
        for port in self.compiled.inputs:
            if port.get_partial_shape().is_static:
                for name in port.get_names():
                    self._shapes[name] = tuple(port.get_shape())

    def _cpu_has_fp16(self) -> bool:
        try:
            return "FP16" in self.core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
        except Exception:
            return False

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._infer(self.request, feed)

    def _infer(self, request: Any, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for name, value in feed.items():
            shape = self._shapes.get(name)
            if shape is not None and np.shape(value) != shape and np.size(value) == int(np.prod(shape)):
                feed = {**feed, name: np.reshape(value, shape)}
        # infer() copies the outputs (share_outputs=False), so the next run cannot overwrite them.
        result = request.infer(feed)
        return {name: result[port] for port, name in self._outputs}

    def worker(self):  # noqa: ANN201 - see Runner.worker
        """One more infer request on the same compiled model (OpenVINO's unit of concurrency; how many
        run at once is the compiled model's stream count: 1 under the LATENCY hint, more under
        ``hint: THROUGHPUT``)."""
        request = self.compiled.create_infer_request()
        return lambda feed: self._infer(request, feed)

    def profile(self, feeds: list[dict[str, np.ndarray]], iterations: int) -> dict[str, Any]:
        """OpenVINO's performance counters (``PERF_COUNT``: ``get_profiling_info`` per infer request, the
        executed nodes with their real time) on a second compiled model with the same config."""
        compiled = self.core.compile_model(self.core.read_model(str(self.artifact)), self.device,
                                           {**self.config, "PERF_COUNT": "YES"})
        req = compiled.create_infer_request()
        nodes: dict[str, dict[str, Any]] = {}
        wall = 0.0
        for j in range(iterations):
            feed = feeds[j % len(feeds)]
            for name, value in feed.items():
                shape = self._shapes.get(name)
                if shape is not None and np.shape(value) != shape and np.size(value) == int(np.prod(shape)):
                    feed = {**feed, name: np.reshape(value, shape)}
            t0 = time.perf_counter()
            req.infer(feed)
            wall += time.perf_counter() - t0
            for p in req.get_profiling_info():
                if str(p.status).endswith("EXECUTED"):
                    n = nodes.setdefault(p.node_name, {"name": p.node_name, "op": p.node_type,
                                                       "exec": p.exec_type, "us": 0.0})
                    n["us"] += p.real_time.total_seconds() * 1e6
        return {"profiler": "openvino PERF_COUNT", "iterations": iterations, "wall_ms": wall * 1000.0 / iterations,
                "nodes": [{"name": n["name"], "op": n["op"], "exec": n["exec"], "ms": n["us"] / 1000.0 / iterations}
                          for n in nodes.values()]}

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"runtime": self.runtime, "version": self._ov.get_version(), "device": self.device,
                               "requested": dict(self.config)}
        if self._fallback:
            out["precision_fallback"] = self._fallback
        for key, prop in (("device_name", "FULL_DEVICE_NAME"),):
            try:
                out[key] = str(self.core.get_property(self.device, prop))
            except Exception:  # virtual devices (AUTO...) have no such property
                pass
        for key, prop in (("threads", "INFERENCE_NUM_THREADS"), ("inference_precision", "INFERENCE_PRECISION_HINT"),
                          ("performance_hint", "PERFORMANCE_HINT"), ("execution_devices", "EXECUTION_DEVICES")):
            try:
                value = self.compiled.get_property(prop)
            except Exception:  # not every plugin reports every property (NPU)
                continue
            out[key] = [_plain(v) for v in value] if isinstance(value, list) else _plain(value)
        return out

    def close(self) -> None:
        self.request = None
        self.compiled = None
