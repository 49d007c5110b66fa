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
    # a variable axis: ONNX Runtime's free dimensions (any size per request, nothing padded) first
    shape_forms = ("dynamic", "static")

    def toolchain(self) -> dict[str, str]:
        # rev 2: INT8 bundles run without ORT's WeightBiasQuantization (the nodes kept float stay float)
        # rev 3: variants ranked by their task figure before cosine
        # rev 4: mixed-scale Concats kept float; calibration ranges merged across folds
        # rev 5: a detection output's decoding kept float; detectors try weighted-ops-only second
        return {**super().toolchain(), "int8": "qdq_search, float nodes kept float at load, task-first ranking, "
                "mixed-scale concats and detection decoding float (rev 5)"}

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
        if level != "extended":
            progress(f"the extended-level graph did not load again; kept the {level} level (see the notes)")
        options: dict[str, Any] = {"graph_optimization": f"{level} (offline)"}
        if job.variable and job.shape_form == "dynamic":
            options["dynamic_axes"] = {n: [f"{v['axis']}: " + ("..".join(map(str, v["range"])) if "range" in v
                                                               else "|".join(map(str, v["buckets"])))
                                           for v in vs] for n, vs in job.variable.items()}
            notes.append("variable axes kept as ONNX Runtime free dimensions (each request runs at its own size; "
                         "buckets: padded up to its bucket)")
        return BuildOutput(runtime={"name": "onnxruntime", "artifact": "model.onnx",
                                    "options": {"graph_optimization_level": "all"}},
                           options=options, notes=notes)


LEVELS = ("extended", "basic", "none")
# Initializers this small are written inside model.onnx, never as external data (a Split's `splits`, a
# Reshape's shape: ONNX shape inference must read them and "Cannot parse data from external tensors").
EXTERNAL_MIN_BYTES = 1 << 20
PROTOBUF_LIMIT = 1_900_000_000  # a model past ~2 GB cannot be one protobuf: its big initializers go external


def loads(ort, path: str | Path) -> str | None:
    """None when ORT loads the saved file as the device will (the runner's level, ``all``, which runs the
    optimizers and shape inference again, and with no optimization at all), else why not."""
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        so = ort.SessionOptions()
        so.graph_optimization_level = level
        so.log_severity_level = 3
        try:
            ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - any load failure means: save something else
            return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return None


def model_bytes(path: str | Path) -> int:
    """The model's size with its external data (what one protobuf would have to hold)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    ext = sum(int(e.value) for t in m.graph.initializer for e in t.external_data if e.key == "length")
    return m.ByteSize() + ext


def inline_small_initializers(path: str | Path, limit: int = EXTERNAL_MIN_BYTES) -> int:
    """Write every initializer under ``limit`` bytes that the saved model keeps as external data into the
    model itself (read from its data file); returns how many. One whose data file is not there (ORT's
    in-memory tensors) is left: the saved file then does not load, and the caller saves another level."""
    import onnx

    path = Path(path)
    m = onnx.load(str(path), load_external_data=False)
    moved = 0
    for t in m.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in t.external_data}
        length, offset = int(info.get("length", -1)), int(info.get("offset", 0))
        data = path.parent / info.get("location", "")
        if not 0 <= length < limit or not info.get("location") or not data.is_file():
            continue
        with open(data, "rb") as f:
            f.seek(offset)
            t.raw_data = f.read(length)
        del t.external_data[:]
        t.data_location = onnx.TensorProto.DEFAULT
        moved += 1
    if moved:
        onnx.save(m, str(path))
    return moved


def optimize_loadable(ort, src: str | Path, dst: str | Path, levels: tuple[str, ...] = LEVELS,
                      save: Callable[..., None] | None = None) -> tuple[str, list[str]]:
    """Save the most optimized graph of ``src`` that ORT can load again, checking each.

    Seen on real CRNNs (a Conv front end, then an unrolled LSTM's per-step Gathers): the *extended*
    level's saved file loads with optimizations off but not at the *all* level the runner uses (ORT 1.23:
    "GatherSliceToSplitFusion ... Cannot parse data from external tensors ... splits"), so ``loads``
    tries both.  Then the *basic* level (the device's *all* level re-applies the rest at load), then the
    prepared model itself (initializers inline; the device optimizes at load) are tried; the notes
    say which was kept and why."""
    save = save or optimize
    notes: list[str] = []
    for level in levels:
        Path(dst).unlink(missing_ok=True)
        Path(f"{dst}.data").unlink(missing_ok=True)
        try:
            if level == "none":
                _save_unoptimized(src, dst)
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


def _save_unoptimized(src: str | Path, dst: str | Path) -> None:
    """The prepared model itself at ``dst`` (past the protobuf limit, its big initializers in ``<dst>.data``)."""
    if model_bytes(src) <= PROTOBUF_LIMIT:
        import shutil

        shutil.copyfile(src, dst)
        return
    import onnx

    onnx.save(onnx.load(str(src)), str(dst), save_as_external_data=True, location=Path(dst).name + ".data",
              size_threshold=EXTERNAL_MIN_BYTES)


def optimize(ort, src: str | Path, dst: str | Path, level: str = "extended") -> None:
    """Save ORT's optimized graph of ``src`` to ``dst``: inline, or for a model past the protobuf limit
    with initializers of ``EXTERNAL_MIN_BYTES`` or more in ``<dst>.data``; small ones always inline."""
    so = ort.SessionOptions()
    so.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[level]
    so.optimized_model_filepath = str(dst)
    if model_bytes(src) > PROTOBUF_LIMIT:
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name", Path(dst).name + ".data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                    str(EXTERNAL_MIN_BYTES))
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    inline_small_initializers(dst)
