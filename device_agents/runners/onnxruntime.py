"""ONNX Runtime runner (CPU execution provider unless the bundle or options ask for another)."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import Runner, RunnerUnavailable


class OnnxRuntimeRunner(Runner):
    """An ``InferenceSession``; options ``threads``, ``inter_op_threads``, ``providers``."""

    runtime = "onnxruntime"

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
        self.session = ort.InferenceSession(str(self.artifact), so, providers=providers)
        self._outputs = [o.name for o in self.session.get_outputs()]

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = self.session.run(self._outputs, feed)
        return dict(zip(self._outputs, values))

    def info(self) -> dict[str, Any]:
        # 0 threads means ONNX Runtime's default: one per physical core.
        return {"runtime": self.runtime, "version": self._ort.__version__,
                "providers": self.session.get_providers(),
                "threads": self._so.intra_op_num_threads or "default",
                "inter_op_threads": self._so.inter_op_num_threads or "default",
                "graph_optimization_level": self._level}
