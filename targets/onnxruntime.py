"""``cpu`` -> ONNX Runtime: an offline-optimized .onnx; INT8 as accuracy-checked static QDQ.

FP32: ORT's graph optimizer at the *extended* level, saved to ``model.onnx`` (the *all* level adds
layout transforms tied to the build machine's ISA; the device applies those itself at load).
INT8: see ``edgeopt.targets.ort_int8``: a search over quantizer settings, each measured against
the FP32 reference, keeping the fastest variant that meets the INT8 bound.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from .base import BuildJob, BuildOutput, Target, require


class OnnxRuntimeTarget(Target):
    backend = "onnxruntime"
    extra = "onnxruntime"
    packages = ["onnxruntime"]

    def known_options(self) -> frozenset[str] | None:
        from .ort_int8 import OPTION_KEYS

        return frozenset(OPTION_KEYS)

    def check_options(self, options: dict[str, Any], precision: str, spec: dict[str, Any]) -> None:
        from .ort_int8 import parse_options

        parse_options(options)  # the int8_* values, whatever the precision: a bad value is a typo

    def _build(self, job: BuildJob, progress: Callable[[str], None]) -> BuildOutput:
        if job.precision == "int8":
            from .ort_int8 import build_int8

            return build_int8(job, progress)
        ort = require("onnxruntime", self.extra)
        out = Path(job.bundle_dir) / "model.onnx"
        progress("optimizing the graph (ORT extended level)")
        optimize(ort, job.prepared_path, out)
        return BuildOutput(runtime={"name": "onnxruntime", "artifact": "model.onnx",
                                    "options": {"graph_optimization_level": "all"}},
                           options={"graph_optimization": "extended (offline)"})


def optimize(ort, src: str | Path, dst: str | Path, level: str = "extended") -> None:
    """Save ORT's optimized graph of ``src`` to ``dst``."""
    so = ort.SessionOptions()
    so.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[level]
    so.optimized_model_filepath = str(dst)
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
