"""Runtime runners: one class per runtime, registered by dotted path (imported on use).

A runner loads one bundle's artifact and runs feeds that are already in the artifact's names,
layouts and dtypes (``edgeopt_agent.bundle.to_artifact``), so that layout conversion never sits
inside a timed loop.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

RUNNERS: dict[str, str] = {
    "onnxruntime": "edgeopt_agent.runners.onnxruntime:OnnxRuntimeRunner",
    "openvino": "edgeopt_agent.runners.openvino:OpenVinoRunner",
    "tflite": "edgeopt_agent.runners.tflite:TfliteRunner",
    "coreml": "edgeopt_agent.runners.coreml:CoreMlRunner",
    "tensorrt": "edgeopt_agent.runners.tensorrt:TensorRtRunner",
}


class RunnerUnavailable(Exception):
    """The runtime a bundle needs is not installed on this machine."""


class Runner:
    """Base class: ``load()`` once (timed as cold start), then ``run(feed)`` many times."""

    runtime = "base"
    #: one loaded instance may serve several threads at once (ONNX Runtime's ``InferenceSession.run``)
    concurrent_calls = False

    def __init__(self, bundle: Path, manifest: dict[str, Any], options: dict[str, Any] | None = None) -> None:
        self.bundle = Path(bundle)
        self.manifest = manifest
        # a tuned bundle (``edgeopt tune``) carries its threads in runtime.options: the default here;
        # a request's own options win
        rt = manifest["runtime"].get("options") or {}
        self.options = {**{k: rt[k] for k in ("threads", "inter_op_threads") if rt.get(k)}, **dict(options or {})}
        from ..bundle import listed_path

        self.artifact = self.bundle / listed_path(manifest, manifest["runtime"]["artifact"], "runtime.artifact")

    def load(self) -> None:
        raise NotImplementedError

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def worker(self) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
        """A run function for one more thread serving requests at the same time as ``run`` (the load
        scenarios' ``workers``). Where the runtime allows concurrent calls on one instance, ``run`` itself;
        else a second instance of the same bundle with the same options, loaded here and closed with
        this one. Runtimes with a cheaper unit of concurrency (OpenVINO's infer request, TensorRT's
        execution context) override this."""
        if self.concurrent_calls:
            return self.run
        twin = type(self)(self.bundle, self.manifest, self.options)
        twin.load()
        self._twins = [*getattr(self, "_twins", []), twin]
        return twin.run

    def close_workers(self) -> None:
        for twin in getattr(self, "_twins", []):
            twin.close()
        self._twins = []

    def info(self) -> dict[str, Any]:
        """Runtime name, version and the settings in force (threads, delegates, device)."""
        return {"runtime": self.runtime}

    def profile(self, feeds: list[dict[str, np.ndarray]], iterations: int) -> dict[str, Any]:
        """Per-node times from the runtime's own profiler over ``iterations`` runs, in a separate
        profiled instance (the measured one stays unprofiled): ``{"nodes": [{"name", "op", "ms"}],
        "iterations", "profiler"}`` with each node's mean ms per run; runtimes whose Python API has no
        profiler say so (``{"available": False, "why": ...}``)."""
        return {"available": False, "why": f"{self.runtime}: no per-op profiler in its Python API is wired up"}

    def close(self) -> None:
        pass


def get_runner(name: str) -> type[Runner]:
    if name not in RUNNERS:
        raise RunnerUnavailable(f"no runner for runtime {name!r}")
    module, _, cls = RUNNERS[name].partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:  # the runtime itself is missing
        raise RunnerUnavailable(f"runtime {name!r} is not usable here: {exc}") from None
    return getattr(mod, cls)
