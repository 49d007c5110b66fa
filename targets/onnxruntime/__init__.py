"""``cpu`` -> ONNX Runtime: an offline-optimized .onnx; INT8 as accuracy-checked static QDQ.

FP32: ORT's graph optimizer at the *extended* level, saved to ``model.onnx`` (the *all* level adds
layout transforms tied to the build machine's ISA; the device applies those itself at load).
INT8: see ``edgeopt.targets.onnxruntime.int8``: a search over quantizer settings, each measured against
the FP32 reference, keeping the fastest variant that meets the INT8 bound.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..base import BuildJob, BuildOutput, Target, require


class OnnxRuntimeTarget(Target):
    backend = "onnxruntime"
    extra = "onnxruntime"
    packages = ["onnxruntime"]

    def toolchain(self) -> dict[str, str]:
        # rev 2: INT8 bundles run without ORT's WeightBiasQuantization (the nodes kept float stay float)
        # rev 3: variants ranked by their task figure before cosine
        return {**super().toolchain(), "int8": "qdq_search, float nodes kept float at load, task-first ranking (rev 3)"}

    def known_options(self) -> frozenset[str] | None:
        from .int8 import OPTION_KEYS

        return frozenset(OPTION_KEYS)

    def check_options(self, options: dict[str, Any], precision: str, spec: dict[str, Any]) -> None:
        from .int8 import parse_options

        parse_options(options)  # the int8_* values, whatever the precision: a bad value is a typo

    def _build(self, job: BuildJob, progress: Callable[[str], None]) -> BuildOutput:
        if job.precision == "int8":
            from .int8 import build_int8

            return build_int8(job, progress)
        ort = require("onnxruntime", self.extra)
        out = Path(job.bundle_dir) / "model.onnx"
        progress("optimizing the graph (ORT extended level)")
        level, notes = optimize_loadable(ort, job.prepared_path, out)
        return BuildOutput(runtime={"name": "onnxruntime", "artifact": "model.onnx",
                                    "options": {"graph_optimization_level": "all"}},
                           options={"graph_optimization": f"{level} (offline)"}, notes=notes)


LEVELS = ("extended", "basic", "none")


def loads(ort, path: str | Path) -> str | None:
    """None when ORT loads the saved file as the device will (no further offline work), else why not."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - any load failure means: save something else
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return None


def optimize_loadable(ort, src: str | Path, dst: str | Path, levels: tuple[str, ...] = LEVELS,
                      save: Callable[..., None] | None = None) -> tuple[str, list[str]]:
    """Save the most optimized graph of ``src`` that ORT can load again, checking each.

    Seen on two real models: the *extended* level's saved file cannot be re-loaded ("GatherSliceTo
    SplitFusion ... Cannot parse data from external tensors").  Then the *basic* level, then the
    prepared model itself (initializers inline; the device optimizes at load) are tried; the notes
    say which was kept and why."""
    save = save or optimize
    notes: list[str] = []
    for level in levels:
        Path(dst).unlink(missing_ok=True)
        try:
            if level == "none":
                import shutil

                shutil.copyfile(src, dst)
            else:
                save(ort, src, dst, level)
            why = loads(ort, dst)
        except Exception as exc:  # noqa: BLE001 - the optimizer itself failed at this level
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        if why is None:
            return level, notes
        notes.append(f"ORT's {level}-level offline graph could not be loaded again ({why}); "
                     + ("trying the next level" if level != levels[-1] else "no level left"))
    from edgeopt.errors import BuildFailed

    raise BuildFailed("no ONNX Runtime graph of this model loads again after saving: " + notes[-1],
                      hint="check the model with `edgeopt inspect`; the prepared model may need a newer onnxruntime")


def optimize(ort, src: str | Path, dst: str | Path, level: str = "extended") -> None:
    """Save ORT's optimized graph of ``src`` to ``dst``."""
    so = ort.SessionOptions()
    so.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[level]
    so.optimized_model_filepath = str(dst)
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
