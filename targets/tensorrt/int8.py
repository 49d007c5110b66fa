"""TensorRT INT8 through the shared Q/DQ search (``qdq_search``), judged on the host in ONNX Runtime.

The backend of the search for TensorRT's explicit quantization:

- **Placement** is ``trt_prep.plan_qdq`` (NVIDIA's rules: data and weight inputs of Conv /
  ConvTranspose / Gemm / MatMul, weights per output channel, the skip input of a residual Add that
  follows a Conv, no output quantization), and each pair records the rule that placed it.
- **Variants**: the clipping rules of one calibration pass (max, percentile-99.999, percentile-99.99,
  mse) x per-channel weights (per-tensor too in ``full``); activations symmetric INT8 only -- zero
  points must be 0 in TensorRT's explicit quantization, so asymmetric activations are not a variant.
- **Float fallback**: a node the search keeps unquantized gets no Q/DQ pair around it; the builder runs
  it in FP16 on TensorRT 10 (the Jetsons: the FP16 flag, ``trt_fp16_fallback``, the default), in FP32
  in a strongly typed network (TensorRT >= 11 targets: the ONNX's own types).  On the host it is
  judged in FP32; FP16's rounding is far inside the INT8 bound.
- **Judging**: each Q/DQ model runs in ONNX Runtime with graph optimisations off (Q/DQ as written, the
  arithmetic closest to TensorRT's) against the FP32 reference, by the host check's rule and bound.
- **Choice**: the engine cannot be timed here, so among passing variants the fewest float nodes wins
  (ties: the lower error on calibration samples); the manifest records the choice so the device's
  engine timing (``edgeopt bench``) can confirm it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..qdq_search import QdqSearch, Variant

# TensorRT's own entropy rule (trt_calibration=entropy) is not in the grid: on PP-OCR cls it clipped far too
# much (cos 0.93 where the others reach 0.99); ModelOpt's "entropy" is ORT's coarse 128-bin variant, not it.
GRID_METHODS = ("max", "percentile-99.999", "percentile-99.99", "mse")


@dataclass(frozen=True)
class TrtSettings:
    """One point of the TensorRT INT8 search."""

    calibration: str  # a trt_prep clipping rule: max | percentile-99.999 | percentile-99.99 | mse
    per_channel: bool = True
    exclude: tuple[str, ...] = ()  # nodes left without Q/DQ (FP16 or FP32 in the engine)

    def label(self) -> str:
        parts = [self.calibration, "per-channel" if self.per_channel else "per-tensor", "S8S8-symmetric"]
        if self.exclude:
            parts.append(f"{len(self.exclude)} node(s) in float")
        return "/".join(parts)


class SampleMaxima:
    """Per-sample |x| maxima of the calibrated tensors, each computed once (``prep.activation_stats``'
    first pass, shared): the maximum over a set of samples is the maximum of theirs, so the cross-check's
    folds take their ``max`` ranges without running the model again, and only the histogram pass (whose
    bins span each fold's own maximum) runs per fold.  Samples are known by identity (the search's feeds)."""

    def __init__(self, prep, model, tensors: list[str]) -> None:
        self.prep, self.model, self.tensors = prep, model, tensors
        self._sess = None
        self._by_id: dict[int, np.ndarray] = {}
        self._keep: list[dict[str, np.ndarray]] = []  # keeps the feeds alive, so their ids stay theirs
        self.runs = 0  # model runs for maxima and histograms (for timings and tests)

    def _session(self):
        if self._sess is None:
            self._sess = self.prep._session_with_outputs(self.model, self.tensors)
        return self._sess

    def stats(self, feeds: list[dict[str, np.ndarray]], histograms: bool = True):
        """``prep.ActivationStats`` over ``feeds``, as ``prep.activation_stats`` computes them."""
        from edgeopt.errors import UsageError

        if not feeds:
            raise UsageError("INT8/FP8 calibration needs calibration samples", hint="pass --calib with real data")
        for f in feeds:
            if id(f) not in self._by_id:
                vals = self._session().run(self.tensors, f)
                self._by_id[id(f)] = np.array([float(np.max(np.abs(v))) if v.size else 0.0 for v in vals])
                self._keep.append(f)
                self.runs += 1
        top = np.max(np.stack([self._by_id[id(f)] for f in feeds]), axis=0)
        absmax = {t: float(m) for t, m in zip(self.tensors, top)}
        hists = {t: np.zeros(self.prep.HIST_BINS, np.float64) for t in self.tensors}
        if histograms:
            for f in feeds:
                self.runs += 1
                for t, v in zip(self.tensors, self._session().run(self.tensors, f)):
                    if absmax[t] > 0:
                        hists[t] += np.histogram(np.abs(v), bins=self.prep.HIST_BINS, range=(0.0, absmax[t]))[0]
        return self.prep.ActivationStats(absmax, hists)


class TrtBackend:
    """``plan_qdq`` + ``insert_qdq`` as a ``qdq_search`` backend; one calibration pass for all variants."""

    name = "TensorRT Q/DQ"
    timeable = False
    stop_early = False  # every clipping rule costs one ORT run, no recalibration: try them all

    def __init__(self, model, calib: list[dict[str, np.ndarray]], work: Path, methods: tuple[str, ...],
                 progress: Callable[[str], None] = lambda s: None, float_runs_as: str = "FP16",
                 samples: SampleMaxima | None = None) -> None:
        from . import prep as trt_prep

        self.prep, self.model, self.work, self.float_runs_as = trt_prep, model, work, float_runs_as
        self.float_path = work / "float.onnx"
        trt_prep.save_model(model, self.float_path)
        self.full = trt_prep.plan_qdq(model)
        if not self.full.weights:
            raise trt_prep.PreparationError(
                "no Conv/ConvTranspose/Gemm/MatMul with constant weights found: int8 would quantize nothing",
                hint="build this model in fp16 instead")
        tensors = list(self.full.activations)
        progress(f"calibrating {len(tensors)} activation ranges on {len(calib)} samples")
        self.samples = samples or SampleMaxima(trt_prep, model, tensors)  # shared with the cross-check's folds
        self.stats = self.samples.stats(calib, histograms=any(m != "max" for m in methods))
        self._amax: dict[str, dict[str, float]] = {}
        self._methods = methods
        self.always_float: dict[str, str] = {}  # node -> why, no Q/DQ in any variant (qdq_search sets it)

    def amax(self, method: str) -> dict[str, float]:
        if method not in self._amax:
            self._amax[method] = self.prep.amax_for(self.stats, method, self.prep.QMAX["int8"])
        return self._amax[method]

    def plan(self, s: TrtSettings, why: dict[str, str] | None = None):
        return self.prep.plan_qdq(self.model, exclude=tuple(s.exclude) + tuple(self.always_float),
                                  per_channel=s.per_channel, exclude_why={**self.always_float, **(why or {})})

    def make(self, s: TrtSettings, dst: Path) -> None:
        plan = self.plan(s)
        if not plan.weights:  # e.g. the joint fallback left every weighted layer float
            raise ValueError("every weighted layer is left float: nothing would run in INT8")
        self.prep.save_model(self.prep.insert_qdq(self.model, plan, self.amax(s.calibration), "int8"), dst)

    def session(self, path: Path, timing: bool = False):
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as the host check runs it
        return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    def recalibrated(self, calib: list[dict[str, np.ndarray]], work: Path) -> TrtBackend:
        other = TrtBackend(self.model, calib, work, tuple(self._methods), float_runs_as=self.float_runs_as,
                           samples=self.samples)
        other.always_float = dict(self.always_float)
        return other

    def fallback_nodes(self, settings: Any) -> set[str]:
        """Nodes that read a Q/DQ pair in the full placement: weighted layers and residual Adds."""
        return set(self.full.quantized_nodes(self.model.graph)) | set(self.full.residual_adds)


@dataclass
class TrtSearchResult:
    """The outcome: the model to ship (None: no variant met the bound), its report, the search."""

    model: Any
    chosen: Variant | None
    report: dict[str, Any]
    search: QdqSearch


def grid(methods: tuple[str, ...], mode: str) -> list[TrtSettings]:
    """Per-channel weights first (NVIDIA's guidance); per-tensor only in ``full`` (it only loses accuracy)."""
    pcs = (True, False) if mode == "full" else (True,)
    return [TrtSettings(m, pc) for m in methods for pc in pcs]


def search_int8(model, calib: list[dict[str, np.ndarray]], val: list[dict[str, np.ndarray]],
                reference: dict[str, np.ndarray], work: Path, *, method: str = "auto", mode: str = "quick",
                budget_s: float = 120.0, tolerance: dict[str, float | None] | None = None,
                kinds: dict[str, Any] | None = None, keep_closest: bool = False, float_runs_as: str = "FP16",
                accept: dict[str, Any] | None = None, progress: Callable[[str], None] = lambda s: None,
                rows: list[int] | None = None, calib_rows: list[int] | None = None) -> TrtSearchResult:
    """Search TensorRT INT8 Q/DQ variants of ``model`` (prepared, opset >= 13) against ``reference``.

    ``method``: ``auto`` (every clipping rule) or one rule; ``keep_closest``: return the most accurate
    variant when none passes (``--allow-mismatch``); ``float_runs_as``: what the engine runs a node
    without Q/DQ in -- FP16 with the FP16 builder flag (TensorRT 10, ``trt_fp16_fallback``), FP32 in a
    strongly typed network of this FP32 ONNX (TensorRT >= 11) -- recorded, not simulated: the host
    judges those nodes in FP32.
    """
    from . import prep as trt_prep

    if trt_prep.opset_of(model) < trt_prep.QDQ_MIN_OPSET["int8"]:
        raise ValueError("int8 Q/DQ needs opset >= 13; prepare() the model with min_opset")
    methods = GRID_METHODS if method == "auto" else (method,)
    for m in methods:
        trt_prep.calibration_method(m)
    named = trt_prep._name_nodes(model)  # the fallback excludes nodes by name
    backend = TrtBackend(model, calib, work, methods, progress, float_runs_as)
    search = QdqSearch(backend, val=val, calib=calib, reference=reference, mode=mode, budget_s=budget_s,
                       work=work, tolerance=tolerance, kinds=kinds, accept=accept, progress=progress, rows=rows,
                       calib_rows=calib_rows)
    if named:
        search.notes.append(f"{named} unnamed node(s) named (the float fallback keeps nodes by name)")
    search.run_grid(grid(methods, mode))
    if not search.passing() and not search.over_budget():
        try:
            search.run_fallback()
        except Exception as exc:  # noqa: BLE001 - e.g. tensors ORT cannot expose as outputs
            search.notes.append(f"int8: float fallback not possible on this graph "
                                f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]})")
    chosen, _, rule = search.select()
    ship = chosen or (search.closest() if keep_closest and search.variants else None)
    q = None
    report: dict[str, Any] = {"kind": "int8", "engine": "qdq_search", "selection": rule,
                              **search.record(), "calibration_requested": method}
    if ship is not None and ship.outputs:
        s = ship.settings
        plan = backend.plan(s, ship.why_float)
        q = trt_prep.insert_qdq(model, plan, backend.amax(s.calibration), "int8")
        try:
            import onnx

            onnx.checker.check_model(q)
        except Exception as exc:
            raise trt_prep.PreparationError(
                f"the int8 Q/DQ model fails the ONNX checker: {str(exc).splitlines()[0]}") from None
        placement = plan.placement(model.graph)
        if search.mixed_concats:  # the rule that kept them float, beside the per-node reasons in left_float
            from ..mixed_concat import RULE

            placement["rules_applied"] = [RULE]
            placement["mixed_scale_concats"] = [mc.record() for mc in search.mixed_concats]
        report.update({
            "chosen": ship.record(), "calibration": s.calibration,
            "calibration_candidates": {v.settings.label(): {"passed": v.passed, "calib_rel_l2": v.record()["calib_rel_l2"]}
                                       for v in search.variants if v.step == "grid"},
            "quantized_activations": len(plan.activations), "quantized_weights": len(plan.weights),
            "per_channel_weights": sum(1 for _, _, ax in plan.weights if ax is not None),
            "residual_adds": len(plan.residual_adds), "float_nodes": len(s.exclude),
            "quantizable_nodes": len(backend.fallback_nodes(s)),
            "scheme": "symmetric, zero point 0; weights per output channel; activations per tensor; "
                      f"bias and layer outputs not quantized; nodes left float run in {float_runs_as}",
            "float_nodes_run_as": float_runs_as,
            "placement": placement,
        })
    return TrtSearchResult(q, chosen, report, search)
