"""ONNX Runtime runner (CPU execution provider unless the bundle or options ask for another)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from . import Runner, RunnerUnavailable


class OnnxRuntimeRunner(Runner):
    """An ``InferenceSession``; options ``threads``, ``inter_op_threads``, ``providers``."""

    runtime = "onnxruntime"
    concurrent_calls = True  # InferenceSession.run is thread-safe: workers share the session

    def load(self) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise RunnerUnavailable(f"onnxruntime is not installed: {exc}") from None
        self._ort = ort
        so = ort.SessionOptions()
        threads = self.options.get("threads")
        if threads:
            so.intra_op_num_threads = int(threads)
        if self.options.get("inter_op_threads"):
            so.inter_op_num_threads = int(self.options["inter_op_threads"])
        # The artifact is already optimized at build time; don't redo it at every load.
        level = self.manifest["runtime"].get("options", {}).get("graph_optimization_level", "all")
        so.graph_optimization_level = {
            "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
            "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        providers = self.options.get("providers") or ["CPUExecutionProvider"]
        self._so = so
        self._level = level
        # Optimizers the bundle needs off (cpu INT8: WeightBiasQuantization would re-quantize the weights
        # of the nodes the INT8 search kept float); names this ORT lacks are ignored by ORT itself.
        self._disabled = [str(x) for x in self.manifest["runtime"].get("options", {}).get("disabled_optimizers") or []]
        self.session = self._session(so, providers)
        self._outputs = [o.name for o in self.session.get_outputs()]

    def _session(self, so, providers: list):
        kw = {"disabled_optimizers": self._disabled} if self._disabled else {}
        return self._ort.InferenceSession(str(self.artifact), so, providers=providers, **kw)

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self.session.run(self._outputs, feed)
        return dict(zip(self._outputs, values))

    def profile(self, feeds: list[dict[str, np.ndarray]], iterations: int) -> dict[str, Any]:
        """ONNX Runtime's own profiler (``enable_profiling``: a Chrome trace, ``<node>_kernel_time``
        events with the op type) on a second session with the same options."""
        import json
        import os
        import tempfile

        so = self._ort.SessionOptions()
        so.intra_op_num_threads = self._so.intra_op_num_threads
        so.inter_op_num_threads = self._so.inter_op_num_threads
        so.graph_optimization_level = self._so.graph_optimization_level
        so.enable_profiling = True
        with tempfile.TemporaryDirectory(prefix="edgeopt-prof-") as d:
            so.profile_file_prefix = os.path.join(d, "ort")
            sess = self._session(so, self.session.get_providers())
            sess.run(self._outputs, feeds[0])  # its first run (allocations) is not one of the profiled
            t0 = time.perf_counter()
            for j in range(iterations):
                sess.run(self._outputs, feeds[j % len(feeds)])
            wall = (time.perf_counter() - t0) * 1000.0 / iterations
            with open(sess.end_profiling()) as f:
                events = json.load(f)
        nodes: dict[str, dict[str, Any]] = {}
        for e in events:
            name = e.get("name", "")
            if e.get("cat") == "Node" and name.endswith("_kernel_time"):
                key = name[: -len("_kernel_time")]
                n = nodes.setdefault(key, {"name": key, "op": (e.get("args") or {}).get("op_name", "?"), "us": 0})
                n["us"] += int(e.get("dur", 0))
        return {"profiler": "onnxruntime enable_profiling", "iterations": iterations, "wall_ms": wall,
                "nodes": [{"name": n["name"], "op": n["op"], "ms": n["us"] / 1000.0 / iterations}
                          for n in nodes.values()]}

    def info(self) -> dict[str, Any]:
        # 0 threads means ONNX Runtime's default: one per physical core.
        return {"runtime": self.runtime, "version": self._ort.__version__,
                "providers": self.session.get_providers(),
                "threads": self._so.intra_op_num_threads or "default",
                "inter_op_threads": self._so.inter_op_num_threads or "default",
                "graph_optimization_level": self._level,
                **({"disabled_optimizers": self._disabled} if self._disabled else {})}
