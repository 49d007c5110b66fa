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


class BucketRunner(Runner):
    """One static artifact per bucket (``runtime.buckets``, issue 42: mobile where the converter cannot take
    the variable axis free): every bucket's file loaded (cold start covers all of them), each request run by
    the file whose input shapes it has (``varlen.fit`` padded it to its bucket). The inner runners are the
    runtime's own, each given its bucket's artifact."""

    def __init__(self, bundle: Path, manifest: dict[str, Any], options: dict[str, Any] | None = None) -> None:
        super().__init__(bundle, manifest, options)
        cls = get_runner(manifest["runtime"]["name"])
        self.runtime = cls.runtime
        self.concurrent_calls = cls.concurrent_calls
        specs = manifest["io"]["inputs"]
        self.inner: dict[tuple, Runner] = {}
        for b in manifest["runtime"]["buckets"]:
            one = {**manifest, "runtime": {**manifest["runtime"], "artifact": b["artifact"]}}
            self.inner[self.key_of(b["shapes"], specs)] = cls(bundle, one, options)
        top = self.key_of({s["name"]: s["shape"] for s in specs}, specs)  # the IO spec's shape: the top bucket
        self.top = self.inner.get(top) or list(self.inner.values())[-1]

    @staticmethod
    def key_of(shapes: dict[str, list[int]], specs: list[dict[str, Any]]) -> tuple:
        """The artifact-side input shapes of one bucket (ONNX-layout ``shapes`` through each input's perm)."""
        out = []
        for s in specs:
            shape = [int(v) for v in shapes.get(s["name"], s["shape"])]
            if s.get("perm"):
                shape = [shape[i] for i in s["perm"]]
            out.append((s.get("artifact_name") or s["name"], tuple(shape)))
        return tuple(sorted(out))

    @staticmethod
    def feed_key(feed: dict[str, np.ndarray]) -> tuple:
        """A feed's input shapes, keyed as ``key_of`` keys a bucket."""
        return tuple(sorted((n, tuple(int(d) for d in np.shape(v))) for n, v in feed.items()))

    def _pick(self, feed: dict[str, np.ndarray]) -> Runner:
        key = self.feed_key(feed)
        try:
            return self.inner[key]
        except KeyError:
            raise ValueError("no bucket's file takes input shapes " + ", ".join(f"{n}{list(s)}" for n, s in key)
                             + "; built for " + "; ".join(", ".join(f"{n}{list(s)}" for n, s in k)
                                                         for k in self.inner)) from None

    def load(self) -> None:
        for r in self.inner.values():
            r.load()

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._pick(feed).run(feed)

    def worker(self) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
        runs = {k: r.worker() for k, r in self.inner.items()}

        def run(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            key = self.feed_key(feed)
            return runs[key](feed) if key in runs else self.run(feed)

        return run

    def close_workers(self) -> None:
        for r in self.inner.values():
            r.close_workers()

    def info(self) -> dict[str, Any]:
        return {**self.top.info(), "buckets": len(self.inner)}

    def profile(self, feeds: list[dict[str, np.ndarray]], iterations: int) -> dict[str, Any]:
        return self.top.profile(feeds, iterations)

    def close(self) -> None:
        for r in self.inner.values():
            r.close()


def open_runner(bundle: str | Path, manifest: dict[str, Any], options: dict[str, Any] | None = None) -> Runner:
    """The runner of a bundle (not loaded): the runtime's own, or a ``BucketRunner`` over its files when the
    bundle has one static file per bucket."""
    if manifest["runtime"].get("buckets"):
        return BucketRunner(Path(bundle), manifest, options)
    return get_runner(manifest["runtime"]["name"])(Path(bundle), manifest, options)


def get_runner(name: str) -> type[Runner]:
    if name not in RUNNERS:
        raise RunnerUnavailable(f"no runner for runtime {name!r}")
    module, _, cls = RUNNERS[name].partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:  # the runtime itself is missing
        raise RunnerUnavailable(f"runtime {name!r} is not usable here: {exc}") from None
    return getattr(mod, cls)
