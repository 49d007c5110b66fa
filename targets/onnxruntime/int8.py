"""Accuracy-aware INT8 for the ``cpu`` target: static QDQ with ONNX Runtime's quantizer, searched.

ORT's defaults are not good enough: with MinMax calibration every INT8 variant kept only 65-75%
top-1 agreement with FP32 on a real ImageNet CNN (shared/FIXTURES.md).  So ``build_int8`` runs the
shared Q/DQ search (``qdq_search``: the same engine judges the TensorRT target's Q/DQ models) with
ONNX Runtime's quantizer as the backend:

1. ``quant_pre_process`` (symbolic shape inference skipped where it fails, as on the PP-OCR models
   and transformers), opset raised to 13 for per-channel QDQ (``onnxruntime.quant.preprocess``).
2. Activation/weight types from the target CPU's ISA (``choose_types``); options override.
3. The grid: calibration method (MinMax, Percentile; + Entropy in ``full``) x per-channel weights
   (x the other type combinations, and symmetric activations, in ``full``).  Calibration runs once per
   method.  ``quick`` stops after the first method that yields a passing variant: other methods change
   accuracy, not speed.  In every variant the search keeps float the Concats of differently-scaled
   tensors and, for a detection output, the head's decoding (``mixed_concat``); for a detector the
   weighted-ops-only variant of the first setting comes second (skipped once a variant passes).
   Measured on the real YOLOv8n layout detector (1024x1024, 2-core host under load): the old order's
   four variants kept 22-27% of FP32's boxes in 290 s of search and INT8 was refused; the first
   variant with its decoding float keeps 98% and passes its 4-fold cross-check.
4. When nothing passes: the most accurate variant with only the weighted ops quantized
   (``weighted_only``: Conv/MatMul/Gemm; ORT's default list also quantizes Add, Mul, pooling ...), then
   the sensitivity-ranked float fallback and the joint fallback of ``qdq_search`` (nodes kept float in
   the QDQ model, run by ORT's float kernels).
5. The fastest passing variant is kept (latencies re-measured interleaved; within 3% is a tie,
   broken by accuracy).  None passes: ``CheckFailed`` naming the best figures; nothing is written
   (the pipeline caches that outcome).
"""

from __future__ import annotations

import copy
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgeopt.errors import UsageError
from edgeopt_agent.compare import batch_rows, bound_text

from ..base import BuildJob, BuildOutput, CheckFailed, output_kinds, parse_tolerance, require
from ..qdq_prune import prune_float_nodes
from ..qdq_search import FALLBACK, SEARCH_MODES, TIE, QdqSearch, Variant, headline  # noqa: F401
from .quant import (
    DISABLED_OPTIMIZERS,
    TIMING_THREADS,
    QuantSettings,
    SampleRanges,
    calibrate,
    excluded_nodes,
    op_types,
    output_activations,
    preprocess,
    quantize,
    session,
)

OPTION_KEYS = {"int8_search", "int8_tolerance", "int8_activation", "int8_weight", "int8_reduce_range",
               "int8_budget_s"}
VNNI_FLAGS = {"avx512_vnni", "avx_vnni", "amx_int8"}


@dataclass(frozen=True)
class OrtSettings(QuantSettings):
    """A point of the cpu grid: ORT's quantizer settings, plus symmetric activations (zero point 0
    for int8, 128 for uint8: ORT's ``ActivationSymmetric``)."""

    symmetric_activation: bool = False

    def label(self) -> str:
        base = super().label()
        if not self.symmetric_activation:
            return base
        head, sep, tail = base.partition(f"/{self.types}")
        return f"{head}/{self.types}-symmetric{tail}" if sep else base + "/symmetric"


@dataclass
class SearchPlan:
    """What the options ask for, validated."""

    mode: str
    budget_s: float
    tolerance: dict[str, float | None] | None
    activation: str | None
    weight: str | None
    reduce_range: bool | None


# --- options --------------------------------------------------------------------------------

def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("1", "true", "yes", "on"):
        return True
    if str(value).lower() in ("0", "false", "no", "off"):
        return False
    raise UsageError(f"{key} must be true or false, got {value!r}")


def parse_options(options: dict[str, Any]) -> SearchPlan:
    """The cpu target's ``int8_*`` build options (``OPTION_KEYS``), validated.

    Options are build-wide, so other keys (another backend's ``int8_mode``...) are ignored here; the
    pipeline refuses a key that no selected target reads before anything is built.
    """
    mode = str(options.get("int8_search", "quick")).lower()
    if mode not in SEARCH_MODES:
        raise UsageError(f"int8_search must be quick or full, got {options['int8_search']!r}")
    budget = options.get("int8_budget_s", SEARCH_MODES[mode])
    try:
        budget = float(budget)
    except (TypeError, ValueError):
        raise UsageError(f"int8_budget_s must be a number of seconds, got {budget!r}") from None
    if budget <= 0:
        raise UsageError("int8_budget_s must be > 0")
    act, wt = options.get("int8_activation"), options.get("int8_weight")
    for key, val in (("int8_activation", act), ("int8_weight", wt)):
        if val is not None and val not in ("uint8", "int8"):
            raise UsageError(f"{key} must be uint8 or int8, got {val!r}")
    if act == "int8" and wt == "uint8":
        raise UsageError("ONNX Runtime has no S8U8 kernels (int8 activations with uint8 weights)",
                         hint="use int8_activation=uint8, or int8_weight=int8")
    rr = options.get("int8_reduce_range")
    tol = options.get("int8_tolerance")
    return SearchPlan(mode, budget, parse_tolerance(tol) if tol is not None else None, act, wt,
                      None if rr is None else _bool("int8_reduce_range", rr))


# --- the target CPU -------------------------------------------------------------------------

def cpu_features(profile: dict[str, Any] | None = None, cpuinfo: str = "/proc/cpuinfo") -> dict[str, Any]:
    """Architecture and ISA flags of the target CPU: the profile's ``arch``/``cpu_flags`` when given,
    else the build host's (``/proc/cpuinfo``)."""
    profile = profile or {}
    if profile.get("cpu_flags") is not None or profile.get("arch"):
        flags = profile.get("cpu_flags") or []
        if isinstance(flags, str):
            flags = flags.replace(",", " ").split()
        return {"arch": str(profile.get("arch") or "x86_64"), "flags": sorted(set(flags)), "source": "target profile"}
    arch = platform.machine().lower()
    flags: set[str] = set()
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, val = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    flags.update(val.split())
                    break
    except OSError:
        pass
    return {"arch": arch, "flags": sorted(flags), "source": "build host (/proc/cpuinfo)"}


def choose_types(feat: dict[str, Any]) -> tuple[str, str, bool, str]:
    """(activation, weight, reduce_range, why) for ORT's CPU kernels on this ISA."""
    arch, flags = feat["arch"], set(feat["flags"])
    if arch in ("aarch64", "arm64"):
        return "int8", "int8", False, "arm64: S8S8 (signed dot products; ORT's recommended QDQ default)"
    if flags & VNNI_FLAGS:
        return ("uint8", "int8", False,
                f"x86 with VNNI ({', '.join(sorted(flags & VNNI_FLAGS))}): U8S8, full 8-bit weights (VNNI "
                "accumulates u8 x s8 in int32, no saturation); S8S8 ran ~2x slower than U8S8 in ORT 1.23 on such a host")
    if "avx2" in flags:
        return ("uint8", "int8", True,
                "x86 AVX2 without VNNI: U8S8 (S8S8 gave no speed-up here) with reduce_range: 7-bit weights "
                "keep VPMADDUBSW's int16 pair sums from saturating")
    return "uint8", "int8", False, f"{arch} without AVX2/VNNI flags: U8S8 (ORT's x86 default)"


# --- data -------------------------------------------------------------------------------------

def _feeds(path: str, names: list[str]) -> list[dict[str, np.ndarray]]:
    from edgeopt.calib import load_stacked

    return load_stacked(path, names, "in")


def _reference(path: str, names: list[str]) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {n: data[f"out{i}"] for i, n in enumerate(names)}


# --- the search -----------------------------------------------------------------------------

def grid(plan: SearchPlan, feat: dict[str, Any], per_channel_ok: bool,
         detector: bool = False) -> tuple[list[OrtSettings], str]:
    """Variants to try before any node is kept in float, in order (cheapest calibration first).

    ``detector`` (a detection output: a head that decodes coordinates): the
    weighted-ops-only variant of the first setting comes second, before the per-tensor and the other
    calibration methods -- the variant most likely to keep every box after the first, tried while the
    budget lasts (a 1024x1024 detector's variant costs ~20 s on a loaded 2-core host, its percentile
    calibration over 2 min); ``run_grid`` skips it once a variant passes."""
    act, wt, rr, why = choose_types(feat)
    if plan.activation or plan.weight or plan.reduce_range is not None:
        act, wt = plan.activation or act, plan.weight or wt
        rr = rr if plan.reduce_range is None else plan.reduce_range
        why = "set by options (int8_activation/int8_weight/int8_reduce_range)"
        types = [(act, wt, rr)]
    elif plan.mode == "full":  # measure the other kernels too: the speed answer is empirical
        types = list(dict.fromkeys([(act, wt, rr), ("uint8", "int8", False), ("uint8", "int8", True),
                                    ("int8", "int8", False)]))
    else:
        types = [(act, wt, rr)]
    methods = ["minmax", "percentile"] + (["entropy"] if plan.mode == "full" else [])
    pcs = [True, False] if per_channel_ok else [False]
    outs = [True, False] if plan.mode == "full" else [True]
    out = [OrtSettings(m, pc, a, w, r, float_output=fo)
           for m in methods for (a, w, r) in types for pc in pcs for fo in outs]
    if plan.mode == "full":  # symmetric activations change accuracy, not kernels: once per type
        out += [OrtSettings(m, pc, a, w, r, symmetric_activation=True)
                for m in methods for (a, w, r) in types for pc in pcs]
    if detector and out:
        out.insert(1, replace(out[0], ops="weighted"))
    return out, why


def weighted_only(search: QdqSearch) -> None:
    """Before keeping single nodes float: the most accurate grid variant with only the weighted ops
    quantized (``quant.WEIGHTED_OPS``), the elementwise ops of ORT's default list (Add, Mul, ...) left float.

    The per-node fallback misses this when many small elementwise ops each cost little alone and much
    together (magika's 24 Muls: no single one helps, all of them are the difference between 3 and 12 of
    12 files read like FP32)."""
    done = [v for v in search.variants if v.outputs]
    if not done:
        return
    best = max(done, key=lambda v: v.accuracy)
    if best.settings.ops == "weighted" or replace(best.settings, ops="weighted") in {v.settings for v in done}:
        return
    search.progress("int8: no variant passes; trying the weighted ops (Conv/MatMul/Gemm) only, the rest float")
    search.set_stage("weighted ops", 1, 1)
    search.try_variant(replace(best.settings, ops="weighted"), "weighted-ops")


def quantize_symmetric(model: Path, ranges: Any, s: QuantSettings, dst: Path,
                       always: tuple[str, ...] | list[str] = ()) -> None:
    """``onnxruntime.quant.quantize`` with ORT's ``ActivationSymmetric`` (activation zero points centred)."""
    from onnxruntime.quantization import QDQQuantizer, QuantType
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

    qtype = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
    fp = load_model_with_shape_infer(model)
    quantizer = QDQQuantizer(fp, s.per_channel, s.reduce_range, qtype[s.weight], qtype[s.activation],
                             copy.deepcopy(ranges), [], excluded_nodes(fp, s, always), op_types(s),
                             {"ActivationSymmetric": True})
    quantizer.quantize_model()
    quantizer.model.save_model_to_file(str(dst))


def make_variant(float_path: Path, ranges: Any, s: QuantSettings, dst: Path, always: list[str]) -> None:
    """The QDQ model of setting ``s`` from the float model and its method's calibration ranges (in the search's
    process, ``OrtBackend.make``, or in a Dask task, ``qdq_variant``)."""
    if getattr(s, "symmetric_activation", False):
        quantize_symmetric(float_path, ranges, s, dst, always)
    else:
        quantize(float_path, ranges, s, dst, always)


class OrtBackend:
    """ONNX Runtime's static QDQ quantizer as a ``qdq_search`` backend: calibration computed once per
    method and shared by every variant using it; artifacts timed on the build host."""

    name = "ONNX Runtime"
    timeable = True
    stop_early = True

    def __init__(self, ort, pre: Path, calib: list[dict[str, np.ndarray]], work: Path,
                 progress: Callable[[str], None]) -> None:
        self.ort, self.float_path, self.calib, self.work, self.progress = ort, pre, calib, work, progress
        self.ranges: dict[str, Any] = {}
        self.timings: dict[str, float] = {}
        self.always_float: dict[str, str] = {}  # node -> why, kept float in every variant (qdq_search sets it)
        # MinMax ranges per sample, shared with the cross-check's fold backends (recalibrated)
        self.sample_ranges: SampleRanges | None = None

    def prepare(self, method: str) -> Any:
        if method not in self.ranges:
            self.progress(f"int8: calibrating ({method}, {len(self.calib)} samples)")
            t = time.perf_counter()
            if method == "minmax":  # per-sample ranges, merged: the folds reuse them
                if self.sample_ranges is None:
                    self.sample_ranges = SampleRanges(self.float_path, self.work)
                self.ranges[method] = self.sample_ranges.ranges(self.calib)
            else:
                self.ranges[method] = calibrate(self.float_path, method, self.calib, self.work)
            self.timings[f"calibrate_{method}_s"] = round(time.perf_counter() - t, 2)
        return self.ranges[method]

    def make(self, s: OrtSettings, dst: Path) -> None:
        make_variant(self.float_path, self.prepare(s.calibration), s, dst, list(self.always_float))

    def variant_spec(self, s: OrtSettings) -> dict[str, Any]:
        """What a Dask task needs to make ``s`` elsewhere (``qdq_variant.make_and_judge``): the setting, its
        method's ranges (calibrated here, once) and the nodes every variant keeps float."""
        return {"settings": s, "ranges": self.prepare(s.calibration), "always": list(self.always_float)}

    def session(self, path: Path, timing: bool = False):
        return session(self.ort, path, threads=TIMING_THREADS if timing else None)

    def fallback_nodes(self, settings: Any) -> set[str] | None:
        return None

    def recalibrated(self, calib: list[dict[str, np.ndarray]], work: Path) -> OrtBackend:
        other = OrtBackend(self.ort, self.float_path, calib, work, lambda s: None)
        other.always_float = dict(self.always_float)
        if self.sample_ranges is None:
            self.sample_ranges = SampleRanges(self.float_path, self.work)
        other.sample_ranges = self.sample_ranges  # MinMax: the pooled samples' ranges, computed once
        return other


def build_int8(job: BuildJob, progress: Callable[[str], None]) -> BuildOutput:
    """Search INT8 QDQ settings against the FP32 reference; write the fastest passing ``model.onnx``."""
    plan = parse_options(job.options)
    feat = cpu_features(job.target.get("profile"))
    bundle = Path(job.bundle_dir)
    ort = require("onnxruntime", "onnxruntime")
    # Scratch space beside the bundle, inside the pipeline's work dir: an interrupted build leaves
    # nothing behind either.
    work = Path(tempfile.mkdtemp(prefix=".ort-int8-", dir=bundle.parent))
    try:
        in_names = [t["name"] for t in job.io["inputs"]]
        out_names = [t["name"] for t in job.io["outputs"]]
        val = _feeds(job.validation_path, in_names)
        calib = _feeds(job.calib_path, in_names) if job.calib_path else val
        from edgeopt.shapes import own_length_calib

        # the dynamic form calibrates over the real length mix (each sample at its own length); the search's
        # checks on the calibration samples compare stacked outputs, so they keep the padded samples
        own_calib, own_note = own_length_calib(job.calib_path, calib, job.shape_form)
        pre = work / "pre.onnx"
        progress("int8: quant_pre_process")
        notes: list[str] = []
        per_channel_ok = preprocess(job.prepared_path, pre, notes)
        backend = OrtBackend(ort, pre, own_calib, work, progress)
        search = QdqSearch(backend, val=val, calib=calib, reference=_reference(job.reference_path, out_names),
                           mode=plan.mode, budget_s=plan.budget_s, work=work, tolerance=plan.tolerance,
                           kinds=output_kinds(job), accept=job.accept, progress=progress,
                           rows=batch_rows(job.data_source), calib_rows=batch_rows(job.data_source, "calibration"))
        search.notes.extend(notes + ([own_note] if own_note else []))
        settings, why = grid(plan, feat, per_channel_ok, detector=bool(search.detection_outputs()))
        progress(f"int8: {plan.mode} search, budget {plan.budget_s:.0f}s; types: {why}")
        search.run_grid(settings, backend.prepare)
        if not search.passing() and not search.over_budget():
            weighted_only(search)
        if not search.passing() and not search.over_budget():
            try:
                import onnx

                search.run_fallback(set(output_activations(onnx.load(str(pre), load_external_data=False))))
                prune_float_nodes(search)  # a fallback pass may carry float nodes the bound does not need
            except Exception as exc:  # e.g. intermediate tensors inside If branches cannot be graph outputs
                search.notes.append(f"int8: float fallback not possible on this graph "
                                    f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]})")
        search.timings.update(backend.timings)
        if backend.sample_ranges is not None:  # samples run once for MinMax, shared with every fold
            search.timings["minmax_sample_runs"] = backend.sample_ranges.runs
        chosen, fp32_ms, rule = search.select(Path(job.prepared_path))
        closest = search.closest() if search.variants else None
        if chosen is None and job.options.get("allow_mismatch") and closest is not None and closest.outputs \
                and closest.path and Path(closest.path).is_file():
            # --allow-mismatch (edgeopt debug builds with it): the most accurate variant is shipped, judged by
            # the host check (which fails) -- so the layer-by-layer comparison has an artifact to read
            out = _output(job, plan, feat, why, search, closest, fp32_ms or 0.0, "none met the bound: the most "
                          "accurate variant kept (--allow-mismatch)")
            out.warnings.insert(0, f"no INT8 variant met the int8 bound ({bound_text('int8', plan.tolerance)}); "
                                f"the most accurate one is kept because of --allow-mismatch: {closest.summary()}")
            return out
        if chosen is None:
            raise CheckFailed(
                f"no INT8 variant the accuracy policy accepts after {len(search.variants)} "
                f"variant(s) in {search.elapsed():.0f}s; the most accurate: {search.closest().summary()}"
                f"{search.refusal_detail()}; INT8 is not shipped",
                hint="keep fp32 for this target, calibrate with more representative --calib data, try "
                     "--option int8_search=full" + (" or a larger --option int8_budget_s (the time budget "
                     "stopped the search)" if search.budget_cut() else "") + ", or accept a looser bound with "
                     "e.g. --option int8_tolerance=cosine_min=0.95,top1_min=0.8",
                cacheable=not search.budget_cut(), accuracy=True)
        if _quantized_nodes(chosen.path) == 0:
            # e.g. silero-vad: every weight lives inside If branches, which the quantizer does not enter
            raise CheckFailed("INT8 quantized nothing in this model (no QuantizeLinear node in the graph or its "
                              "subgraphs); an 'int8' artifact would be the FP32 model under another name",
                              hint="keep fp32 for this target")
        return _output(job, plan, feat, why, search, chosen, fp32_ms, rule)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _quantized_nodes(path: Path) -> int:
    """QuantizeLinear nodes in the graph and every subgraph."""
    import onnx

    def count(graph) -> int:
        n = 0
        for node in graph.node:
            n += node.op_type == "QuantizeLinear"
            for attr in node.attribute:
                if attr.g.node:
                    n += count(attr.g)
                n += sum(count(g) for g in attr.graphs)
        return n

    return count(onnx.load(str(path), load_external_data=False).graph)


def _output(job: BuildJob, plan: SearchPlan, feat: dict[str, Any], why: str, search: QdqSearch, chosen: Variant,
            fp32_ms: float, rule: str) -> BuildOutput:
    """Write the chosen model (with the source's metadata) and record the whole search."""
    import onnx

    model = onnx.load(str(chosen.path))
    have = {p.key for p in model.metadata_props}
    for p in onnx.load(job.prepared_path, load_external_data=False).metadata_props:
        if p.key not in have:  # e.g. PP-OCR's `character` list, which the task code reads
            model.metadata_props.add(key=p.key, value=p.value)
    onnx.save(model, str(Path(job.bundle_dir) / "model.onnx"))
    speedup = round(fp32_ms / chosen.latency_ms, 3) if chosen.latency_ms else None
    rec = search.record()
    info = {"search": plan.mode, "budget_s": plan.budget_s, "time_s": rec["time_s"], "engine": "qdq_search",
            "chosen": chosen.record(), "fp32_ms": round(fp32_ms, 3), "speedup_vs_fp32": speedup,
            "cpu": {"arch": feat["arch"], "source": feat["source"],
                    "int8_flags": sorted(set(feat["flags"]) & (VNNI_FLAGS | {"avx2", "avx512f", "asimddp", "i8mm"}))},
            "types_reason": why, "tolerance": plan.tolerance,
            "variants": rec["variants"], "sensitivity_top": rec["sensitivity_top"],
            "float_nodes": chosen.why_float,
            "timings": rec["timings"], "timing_threads": TIMING_THREADS,
            "calibration_samples": rec["calibration_samples"],
            "validation_samples": rec["validation_samples"], "cross_checks": rec["cross_checks"],
            "notes": rec["notes"], "selection": rule, "mixed_scale_concats": rec["mixed_scale_concats"],
            "decode_tail": rec["decode_tail"]}
    notes = [f"INT8 (ORT static QDQ) kept {chosen.summary()}; FP32 {fp32_ms:.2f} ms on the build host (x{speedup})"]
    notes += [f"int8 variant tried: {v.summary()}" for v in search.variants] + search.notes
    if feat["source"].startswith("build host"):
        notes.append("INT8 types chosen for the build host's CPU; give a user target profile arch/cpu_flags "
                     "to choose them for another CPU")
    warnings = []
    if chosen.latency_ms >= fp32_ms:
        warnings.append(f"INT8 was not faster than FP32 on the build host ({chosen.latency_ms:.2f} ms vs "
                        f"{fp32_ms:.2f} ms, batch 1); the device's figure is what counts (edgeopt bench)")
    return BuildOutput(runtime={"name": "onnxruntime", "artifact": "model.onnx",
                                "options": {"graph_optimization_level": "all",
                                            "disabled_optimizers": list(DISABLED_OPTIMIZERS)}},
                       options={"int8": info}, notes=notes, warnings=warnings,
                       extra_manifest={"tolerance_override": plan.tolerance} if plan.tolerance else {})
