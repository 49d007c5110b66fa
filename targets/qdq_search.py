"""One accuracy-aware INT8 search for Q/DQ models, shared by the ``cpu`` (ONNX Runtime) and TensorRT targets.

A backend says how to make a Q/DQ model from one setting (``QdqBackend.make``) and how it runs on the
host; the search does the rest, the same way for both:

0. **Placement rules for every variant** (the backend's ``always_float``, ``mixed_concat``): a Concat of
   differently-scaled tensors and its readers, and a detection output's decoding (the nodes after the
   head's last weighted op), stay float.
1. **The grid**: calibration method x per-channel weights x activation types/symmetry, as the
   backend lists them (TensorRT: symmetric INT8 only, zero points 0, per its explicit-quantization
   rules).  Every variant is judged by the host check's own rule
   (``edgeopt_agent.compare.compare_outputs(.., "int8", tolerance, output_kinds)``) on the validation
   samples, and its error on a few *calibration* samples is kept to guide the steps below.
2. **Sensitivity fallback** when nothing passes: per-node SQNR lost in the most accurate variant
   (``onnxruntime.quant.sensitivity``) picks candidates, each candidate's effect on the output when it
   alone reads float inputs (``onnxruntime.quant.float_effect``) orders them; groups of the best are kept
   float (TensorRT: no Q/DQ pair around them, the builder runs them in FP16) and kept only when they
   lower the calibration error, until a variant passes or the trial/time budget is spent.
3. **Joint fallback**: the 2, 4, 8 ... most SQNR-sensitive nodes float at once (nodes that only help
   together are missed one at a time).
4. **Selection**: a backend whose artifact the host can time (ONNX Runtime) keeps the fastest passing
   variant (interleaved re-measure, ties to accuracy); TensorRT's engine cannot be timed on the host,
   so it keeps the passing variant with the fewest float nodes (ties: the lower error on calibration
   samples), and the manifest records that choice for the device's engine timing to confirm.
5. **k-fold cross-check** of every variant that passes, when the validation set is small
   (< ``CROSS_CHECK_BELOW``: 8 held-out samples move top-1 in 12.5% steps, so a variant that really
   agrees on 80% passes about half the time): calibration and validation samples are pooled and split
   into ``CROSS_FOLDS`` folds; the variant's recipe is calibrated on the other folds and run on each fold
   (one calibration per fold and method, shared by every variant), and the out-of-fold outputs of the
   whole pool (20 samples from 20 images, not 8) are judged by the same rule. A variant that fails it
   counts as failed, so the grid goes on to the next calibration method and the float fallback runs,
   as for any other miss.  Its FP32 outputs reuse the validation reference and the calibration
   samples' outputs already computed (only calibration samples past ``CALIB_CHECK_SAMPLES`` are run).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edgeopt.policy import accept as policy
from edgeopt_agent.compare import seq_label, task_agreement, top1_text

from . import mixed_concat
from .onnxruntime.quant import float_effect, interleaved_rounds, latency_ms, run_all, sensitivity

SEARCH_MODES = {"quick": 120.0, "full": 600.0}  # mode -> default time budget (s)
FALLBACK = {"quick": (6, 32), "full": (24, 128)}  # mode -> (float-fallback trials, candidate nodes)
TIE = 0.03  # latencies within 3% are noise on a shared 2-core machine: prefer accuracy then
SENSITIVITY_SAMPLES = 4
CALIB_CHECK_SAMPLES = 8  # calibration samples that judge float-fallback steps
CROSS_CHECK_BELOW = 32  # validation samples: below this the pick is confirmed by a k-fold cross-check
CROSS_FOLDS = 4
SELECT_TIMING_S = 30.0  # the selection's interleaved timing aims at this (>= 3 rounds whatever it costs)


class QdqBackend(Protocol):
    """What the search needs from a backend (``onnxruntime.int8.OrtBackend``, ``tensorrt.int8.TrtBackend``)."""

    name: str
    timeable: bool  # can the host time the artifact (ONNX Runtime) or not (a TensorRT engine)
    stop_early: bool  # quick mode: stop the grid after the first calibration method that passes
    float_runs_as: str  # what a node kept float runs in on the device ("FP16", "FP32", "float")
    float_path: Path  # the float model the Q/DQ variants are made from (same node names)

    def make(self, settings: Any, dst: Path) -> None:
        """Write the Q/DQ model for ``settings`` (``settings.exclude``: nodes kept float)."""

    def session(self, path: Path, timing: bool = False) -> Any:
        """An ONNX Runtime session as the host check runs the artifact (``timing``: as timed)."""

    def fallback_nodes(self, settings: Any) -> set[str] | None:
        """The nodes the fallback may keep float (None: any quantized node), given a variant."""

    def recalibrated(self, calib: list[dict[str, np.ndarray]], work: Path) -> QdqBackend:
        """The same backend calibrated on ``calib`` instead (the cross-check's folds)."""


@dataclass
class Variant:
    """A quantized model and how it measured."""

    settings: Any  # a frozen dataclass with label(), exclude
    passed: bool
    outputs: dict[str, dict[str, float]]  # per output: the headline metrics on the validation set
    reasons: list[str]
    latency_ms: float | None  # None: the host cannot time this backend's artifact
    calib_rel_l2: float  # mean rel_l2 over outputs on calibration samples (guides the fallback)
    path: Path
    step: str = "grid"  # grid | float-fallback | joint-fallback
    why_float: dict[str, str] = field(default_factory=dict)  # excluded node -> why
    policy: dict[str, Any] | None = None  # the accuracy policy's word on the validation samples (Acceptance)
    where: str | None = None  # the Dask worker that made and judged it (``qdq_variant``); None: this process

    @property
    def accuracy(self) -> tuple[float, float]:
        """Sort key, higher is better: the worst task agreement over outputs (top-1, CTC decodings, boxes,
        decisions not flipped, per-vector cosine: ``compare.task_agreement``), then the worst cosine."""
        if not self.outputs:  # a variant the quantizer could not make ranks last
            return (-1.0, -1.0)
        task = min((task_agreement(m) for m in self.outputs.values()), default=1.0)
        cos = min((m.get("cosine", 1.0) for m in self.outputs.values()), default=1.0)
        return (task, cos)

    def record(self) -> dict[str, Any]:
        s = asdict(self.settings)
        s["exclude"] = list(self.settings.exclude)
        return {"label": self.settings.label(), "settings": s, "step": self.step, "passed": self.passed,
                "latency_ms": None if self.latency_ms is None or not math.isfinite(self.latency_ms)
                else round(self.latency_ms, 3),
                "float_nodes": len(self.settings.exclude), "metrics": self.outputs,
                "calib_rel_l2": round(self.calib_rel_l2, 5) if math.isfinite(self.calib_rel_l2) else None,
                "reasons": self.reasons, "policy": self.policy,
                **({"made_on": self.where} if self.where else {})}

    def summary(self) -> str:
        bits = []
        for name, m in self.outputs.items():
            txt = f"cos {m.get('cosine', float('nan')):.4f} rel_l2 {m.get('rel_l2', float('nan')):.3f}"
            if "top1" in m:
                txt += f" top1 {top1_text(m)}"
            if "seq_match" in m:
                txt += f" {seq_label(m)} {m['seq_match']:.0%}"
            bits.append(txt if len(self.outputs) == 1 else f"{name}: {txt}")
        ms = f", {self.latency_ms:.2f} ms" if self.latency_ms is not None and math.isfinite(self.latency_ms) else ""
        return f"{self.settings.label()}: " + "; ".join(bits) + ms + (
            "" if self.passed else " (fails: " + "; ".join(self.reasons[:2]) + ")")


def _first(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}"


def judge_session(sess: Any, val: list[dict[str, np.ndarray]], reference: dict[str, np.ndarray],
                  out_names: list[str], tolerance: dict[str, float | None] | None, kinds: dict[str, Any] | None,
                  rows: list[int] | None, accept: dict[str, Any] | None, calib_check: list[dict[str, np.ndarray]],
                  calib_reference: dict[str, np.ndarray]) -> tuple[dict[str, Any], float]:
    """One variant's session judged: the host check's rule on the validation samples with the accuracy policy's
    word (``policy.apply``), and its mean rel_l2 on the calibration samples (guides the fallback).  The one
    judgement of a variant, in the search's process or in a Dask task (``qdq_variant``)."""
    from edgeopt_agent.compare import compare_outputs, tensor_metrics

    result = compare_outputs(run_all(sess, val, out_names), reference, "int8", tolerance, kinds, rows)
    policy.apply(result, accept)
    cal = run_all(sess, calib_check, out_names)
    cal_err = float(np.mean([tensor_metrics(cal[n], calib_reference[n]).get("rel_l2", math.inf)
                             for n in out_names]))
    return result, cal_err


def headline(metrics: dict[str, float]) -> dict[str, float]:
    keys = ("cosine", "rel_l2", "max_abs_norm", "top1", "top1_n", "seq_match", "ctc_blank", "flip_rate",
            "vector_cosine_min", "snr_db")
    return {k: round(float(metrics[k]), 6) for k in keys if k in metrics}


def slower(rounds: list[float], fastest: list[float], tie: float = TIE) -> bool:
    """Is a variant measurably slower than the fastest, from their interleaved per-round medians?  Only
    when it is slower in every round (the rounds are paired in time) and its median round ratio passes
    ``1 + tie``: two variants within noise are a tie, and a tie goes to accuracy, so the pick does not
    depend on which one the machine's load happened to favour."""
    ratios = [a / b for a, b in zip(rounds, fastest) if b > 0]
    return bool(ratios) and min(ratios) > 1 and statistics.median(ratios) > 1 + tie


class QdqSearch:
    """State of one INT8 search: backend, data, references and every variant tried."""

    def __init__(self, backend: QdqBackend, *, val: list[dict[str, np.ndarray]], calib: list[dict[str, np.ndarray]],
                 reference: dict[str, np.ndarray], mode: str, budget_s: float, work: Path,
                 tolerance: dict[str, float | None] | None = None, kinds: dict[str, Any] | None = None,
                 accept: dict[str, Any] | None = None, progress: Callable[[str], None] = lambda s: None,
                 rows: list[int] | None = None, calib_rows: list[int] | None = None) -> None:
        import onnxruntime as ort

        self.ort, self.backend = ort, backend
        self.mode, self.budget_s, self.work, self.progress = mode, budget_s, work, progress
        self.tolerance, self.kinds = tolerance, kinds
        self.accept = accept  # the accuracy policy's gate file (None: the defaults): what "passes" means
        self.val, self.calib, self.reference = val, calib or val, reference
        # build --batch B: the distinct samples of each feed (``compare.batch_rows``), counted once each
        self.rows = rows if rows and len(rows) == len(val) else None
        self.calib_rows = calib_rows if calib and calib_rows and len(calib_rows) == len(calib) else None
        self.n_val = int(sum(self.rows)) if self.rows else len(val)
        self.out_names = list(reference)
        self.calib_check = self.calib[:CALIB_CHECK_SAMPLES]
        # FP32 outputs on a few calibration samples, computed like reference.npz (no optimisation).
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 3
        fsess = ort.InferenceSession(str(backend.float_path), so, providers=["CPUExecutionProvider"])
        self.float_session = fsess
        self.notes: list[str] = []
        self._found_outputs: dict[str, np.ndarray] = {}  # FP32 outputs of calib_check, from mixed_concat's runs
        self.mixed_concats = self._mixed_concats()
        found = self._found_outputs
        self.calib_reference = (found if set(self.out_names) <= set(found)
                                and all(len(found[n]) == len(self.calib_check) for n in self.out_names)
                                else run_all(fsess, self.calib_check, self.out_names))
        self.decode_tail = self._decode_tail()
        # a Dask cluster to make and judge a method's variants on (``qdq_variant.fanout``: the job's worker passes
        # its scheduler); None: every variant here
        from .qdq_variant import fanout

        self.fanout = fanout(progress)
        self.variants: list[Variant] = []
        self.cross_checks: list[dict[str, Any]] = []
        self._folds: list[tuple[Any, list[int], Path]] | None = None  # (backend, held-out indices, work)
        self._pool_reference: dict[str, np.ndarray] | None = None  # FP32 outputs of calib + val, made once
        self.timings: dict[str, float] = {}
        self.ranking: list[dict[str, Any]] = []
        self.stage = ""  # the step running and its estimated time left, for the progress lines
        self._variant_s: list[float] = []  # how long each variant took (quantize, judge, cross-check)
        self.t0 = time.perf_counter()

    def _mixed_concats(self) -> list[mixed_concat.MixedConcat]:
        """Concats of differently-scaled inputs (``mixed_concat``): kept float, with their readers, in every
        variant (the backend's ``always_float``), and said in the notes."""
        if not hasattr(self.backend, "always_float"):
            return []
        try:
            found = mixed_concat.find(self.backend.float_path, self.calib, samples=len(self.calib_check),
                                      outputs=self._found_outputs)
        except Exception as exc:  # noqa: BLE001 - a graph whose Concat inputs cannot be exposed: no rule, said
            self.notes.append(f"mixed-scale concat check not possible ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:160] if str(exc) else ''})")
            return []
        if found:
            self.backend.always_float = mixed_concat.float_nodes(found)
            self.notes.append(mixed_concat.note(found))
            self.progress(f"int8: {len(found)} concat(s) of differently-scaled tensors kept float: "
                          + ", ".join(f"{mc.node} ({mc.ratio:.0f}x)" for mc in found))
        return found

    def detection_outputs(self) -> list[str]:
        """The outputs judged as detections (``compare`` kind ``detection``: boxes after the head's own
        decoding and NMS)."""
        return [n for n in self.out_names if (self.kinds or {}).get(n, {}).get("kind") == "detection"]

    def _decode_tail(self) -> list[str]:
        """The decoding of each detection output (``mixed_concat.decode_tail``): kept float, like the
        mixed-scale Concats, in every variant (the backend's ``always_float``), and said in the notes."""
        dets = self.detection_outputs()
        if not dets or not hasattr(self.backend, "always_float"):
            return []
        try:
            tail = mixed_concat.decode_tail(self.backend.float_path, dets)
        except Exception as exc:  # noqa: BLE001 - a graph the walk cannot read: no rule, said
            self.notes.append(f"detection decode-tail rule not applied ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:160] if str(exc) else ''})")
            return []
        if tail:
            why = f"decoding of detection output(s) {', '.join(dets)} (after the head's last weighted op)"
            added = [n for n in tail if n not in self.backend.always_float]
            self.backend.always_float = {**self.backend.always_float, **dict.fromkeys(added, why)}
            self.notes.append(f"placement rule: {mixed_concat.TAIL_RULE}; kept float here: {len(tail)} node(s) "
                              f"after the last weighted op before {', '.join(dets)}")
            self.progress(f"int8: the decoding of {', '.join(dets)} kept float ({len(tail)} node(s) after the "
                          "head's last weighted op)")
        return tail

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def set_stage(self, step: str, k: int, total: int) -> None:
        """Name the step for the progress lines: ``[grid 2/6, ~40s left]`` -- the time left estimated from
        the variants so far (mean time x variants left in this step), never past the time budget."""
        left_budget = max(0.0, self.budget_s - self.elapsed())
        if self._variant_s:
            est = min(float(np.mean(self._variant_s)) * (total - k + 1), left_budget)
            eta = f"~{est:.0f}s left"
        else:
            eta = f"<= {left_budget:.0f}s left of the budget"
        self.stage = f"[{step} {k}/{total}, {eta}]"

    def over_budget(self) -> bool:
        return self.elapsed() > self.budget_s

    def passing(self) -> list[Variant]:
        return [v for v in self.variants if v.passed]

    # --- one variant ------------------------------------------------------------------------
    def try_variant(self, s: Any, step: str, why_float: dict[str, str] | None = None) -> Variant:
        t_variant = time.perf_counter()
        tag = f"{self.stage} int8" if self.stage else "int8"  # "int8: PASS|fail" stays searchable
        self.progress(f"{tag}: trying {s.label()} ({step})")
        path = self.work / f"variant-{len(self.variants)}.onnx"
        try:
            self.backend.make(s, path)
            sess = self.backend.session(path)
        except Exception as exc:  # noqa: BLE001 - one variant the quantizer cannot make is one failed candidate
            return self._made(s, step, why_float, path, None, math.inf, _first(exc), t_variant)
        result, cal_err = judge_session(sess, self.val, self.reference, self.out_names, self.tolerance, self.kinds,
                                        self.rows, self.accept, self.calib_check, self.calib_reference)
        del sess
        return self._made(s, step, why_float, path, result, cal_err, None, t_variant)

    def _made(self, s: Any, step: str, why_float: dict[str, str] | None, path: Path, result: dict[str, Any] | None,
              cal_err: float, error: str | None, t_variant: float, where: str | None = None) -> Variant:
        """A variant made and judged (here or on a Dask worker, ``where``): timed here, cross-checked, recorded."""
        tag = f"{self.stage} int8" if self.stage else "int8"
        why = {**getattr(self.backend, "always_float", {}), **(why_float or {})}
        if result is None:
            v = Variant(s, False, {}, [f"{self.backend.name} quantizer failed: {error}"],
                        math.inf if self.backend.timeable else None, math.inf, path, step, why, where=where)
            self.variants.append(v)
            self._variant_s.append(time.perf_counter() - t_variant)
            self.progress(f"{tag}: fail {s.label()}: {v.reasons[0]}")
            return v
        # a first look (the fastest passing variants are timed again, interleaved, by ``select``): at least 3
        # runs, more within 0.6 s -- a 1024x1024 detector's 1.5-s runs cost 10 s a variant at the old 5
        ms = (latency_ms(self.backend.session(path, timing=True), self.val[0], min_runs=3)
              if self.backend.timeable else None)
        per = {n: headline(o["metrics"]) for n, o in result["outputs"].items()}
        reasons = [f"{n}: {r}" if len(per) > 1 else r for n, o in result["outputs"].items() for r in o["reasons"]]
        v = Variant(s, bool(result["passed"]), per, reasons, ms, cal_err, path, step, why, result.get("policy"),
                    where)
        if v.passed:
            cc = self.cross_check(v)
            if cc is not None and not cc["passed"]:
                v.passed = False
                v.reasons = [f"{CROSS_FOLDS}-fold cross-check on {cc['samples']} samples: {r}" for r in cc["reasons"]]
        self.variants.append(v)
        self._variant_s.append(time.perf_counter() - t_variant)
        self.progress(f"{tag}: {'PASS' if v.passed else 'fail'} {v.summary()}")
        return v

    # --- the grid ---------------------------------------------------------------------------
    def run_grid(self, settings: list[Any], prepare: Callable[[str], None] | None = None) -> None:
        """Try ``settings`` grouped by calibration method (``prepare(method)`` computes its ranges)."""
        methods = list(dict.fromkeys(s.calibration for s in settings))
        skipped = 0  # variants not needed after all: the stage counts ("grid k/n") leave them out
        for i, method in enumerate(methods):
            if self.variants and self.over_budget():
                self.notes.append(f"time budget ({self.budget_s:.0f}s) spent: calibration "
                                  f"{', '.join(methods[i:])} not tried")
                return
            if prepare is not None:
                prepare(method)
            todo = [s for s in settings if s.calibration == method]
            if self.fanout is not None:
                todo = self._fan_out(todo, settings)  # what is left runs here, in order
            for j, s in enumerate(todo):
                if self.passing() and self.over_budget():  # a variant already ships: the budget is the bound
                    self.notes.append(f"time budget ({self.budget_s:.0f}s) spent with a passing variant: "
                                      f"{', '.join(x.label() for x in todo[j:])} not tried")
                    return
                if getattr(s, "ops", "all") == "weighted" and self.passing():
                    # an accuracy fallback (fewer ops INT8: never the faster one), not needed once one passes
                    self.notes.append(f"{s.label()} not tried: a variant with more ops in INT8 already passes")
                    skipped += 1
                    continue
                self.set_stage("grid", settings.index(s) + 1 - skipped, len(settings) - skipped)
                self.try_variant(s, "grid")
            if (self.mode == "quick" and self.backend.stop_early and self.passing()
                    and i + 1 < len(methods)):
                self.notes.append(f"quick search: stopped after {method} calibration passed "
                                  f"({', '.join(methods[i + 1:])} would change accuracy, not speed)")
                return

    def _fan_out(self, todo: list[Any], settings: list[Any]) -> list[Any]:
        """One calibration method's independent variants (every setting but the weighted-ops-only fallback, which
        runs only when none passes) made and judged as Dask tasks at once (``qdq_variant``), then timed,
        cross-checked and recorded here in the grid's order; returns the settings left to run here."""
        if not hasattr(self.backend, "variant_spec"):
            return todo
        batch = [s for s in todo if getattr(s, "ops", "all") != "weighted"]
        if len(batch) < 2 or (self.variants and self.over_budget()):
            return todo
        t0 = time.perf_counter()
        paths = [self.work / f"variant-{len(self.variants) + k}.onnx" for k in range(len(batch))]
        self.progress(f"int8: {len(batch)} variant(s) of {batch[0].calibration} calibration made and judged on the "
                      "cluster's workers")
        try:
            got = self.fanout.run([self.backend.variant_spec(s) for s in batch], self)
        except Exception as exc:  # noqa: BLE001 - the cluster went away: the variants run here, as without it
            self.notes.append(f"variants not fanned out to the cluster ({_first(exc)}): made here")
            self.fanout = None
            return todo
        per = (time.perf_counter() - t0) / len(batch)
        for s, path, res in zip(batch, paths, got):
            self.set_stage("grid", settings.index(s) + 1, len(settings))
            if res.get("model") is not None:
                path.write_bytes(res["model"])
            self.progress(f"{self.stage} int8: judged {s.label()} on {res.get('worker')}")
            self._made(s, "grid", None, path, res.get("result"), res.get("cal_err", math.inf), res.get("error"),
                       time.perf_counter() - per, res.get("worker"))
        return [s for s in todo if s not in batch]

    # --- the float fallback -----------------------------------------------------------------
    def run_fallback(self, skip: set[str] = frozenset()) -> list[dict[str, Any]]:
        """Keep the nodes whose float fallback helps the output most in float, greedily, until a variant
        passes; then the joint fallback.  Returns the sensitivity table (top 10) for the manifest."""
        best = max(self.variants, key=lambda v: v.accuracy)
        self.progress(f"int8: no variant passes; per-node sensitivity of {best.settings.label()}")
        t = time.perf_counter()
        feeds = self.calib[:SENSITIVITY_SAMPLES]
        ranking = sensitivity(self.ort, self.backend.float_path, best.path, feeds, self.work)
        allowed = self.backend.fallback_nodes(best.settings)
        trials, n_cand = FALLBACK[self.mode]
        skip = set(skip) | set(best.settings.exclude) | set(getattr(self.backend, "always_float", {}))
        pre = [name for name, _, drop in ranking
               if drop > 0 and name not in skip and (allowed is None or name in allowed)][:n_cand]
        reference = {n: a[: len(feeds)] for n, a in self.calib_reference.items()}
        effect = float_effect(self.ort, self.backend.float_path, best.path, pre, feeds, reference,
                              self.t0 + self.budget_s)
        base = effect.pop("")
        self.timings["sensitivity_s"] = round(time.perf_counter() - t, 2)
        drops = {name: drop for name, _, drop in ranking}
        ops = {name: op for name, op, _ in ranking}
        ordered = sorted(effect, key=effect.get)
        rank = {n: k + 1 for k, n in enumerate(ordered)}
        candidates = [n for n in ordered if effect[n] < base * 0.995]  # measurably better in float
        self.ranking = [{"node": n, "op": ops[n], "sqnr_drop_db": round(drops[n], 2),
                         "output_rel_l2_if_float": round(effect[n], 5), "output_rel_l2_quantized": round(base, 5)}
                        for n in ordered[:10]]
        self.progress(f"int8: {len(candidates)} of {len(effect)} measured node(s) help when kept in float")
        current, err, why = best.settings, best.calib_rel_l2, dict(best.why_float)
        i, group = 0, 1
        for trial in range(trials):
            if i >= len(candidates):
                break
            self.set_stage("float fallback", trial + 1, min(trials, len(candidates)))
            if self.over_budget():
                self.notes.append(f"time budget ({self.budget_s:.0f}s) spent during the float fallback")
                break
            add = tuple(candidates[i:i + group])
            i += len(add)
            step_why = {**why, **{n: f"sensitivity rank {rank[n]} (output rel_l2 {effect[n]:.4f} float vs "
                                     f"{base:.4f} quantized, on calibration samples)" for n in add}}
            v = self.try_variant(replace(current, exclude=current.exclude + add), "float-fallback", step_why)
            if v.passed:
                break
            if v.calib_rel_l2 < err * 0.99:  # it helps on calibration data: keep it, try bigger steps
                current, err, why, group = v.settings, v.calib_rel_l2, step_why, min(2 * group, 16)
            else:  # it does not: these nodes stay quantized, go back to single nodes
                group = 1
        if not self.passing():
            self._joint_fallback(best, pre, drops)
        return self.ranking

    def _joint_fallback(self, best: Variant, ranked: list[str], drops: dict[str, float]) -> None:
        """Nodes that only help together (the real and imaginary Conv of an STFT: float one alone and
        the other still quantizes the shared input) are missed one at a time: keep the 2, 4, 8 ... most
        SQNR-sensitive nodes in float at once, while at least one stays quantized, until a variant passes."""
        sizes = sorted({min(2 ** i, len(ranked) - 1) for i in range(1, 8)} - {0, 1})
        for j, k in enumerate(sizes):
            self.set_stage("joint fallback", j + 1, len(sizes))
            if self.over_budget():
                self.notes.append(f"time budget ({self.budget_s:.0f}s) spent during the joint float fallback")
                return
            add = tuple(ranked[:k])
            why = {**best.why_float, **{n: f"sensitivity rank {j + 1} by SQNR lost ({drops[n]:.1f} dB), kept "
                                           f"float jointly with the top {k}" for j, n in enumerate(add)}}
            v = self.try_variant(replace(best.settings, exclude=best.settings.exclude + add), "joint-fallback", why)
            if v.passed:
                return

    # --- selection --------------------------------------------------------------------------
    def select(self, fp32_path: Path | None = None) -> tuple[Variant | None, float | None, str]:
        """The variant to ship, the FP32 latency (None when not timeable) and the rule that chose it."""
        passing = self.passing()
        if not self.backend.timeable:
            runs_as = getattr(self.backend, "float_runs_as", "float")
            rule = (f"fewest float nodes (the host cannot time a TensorRT engine: every node kept float "
                    f"runs in {runs_as} instead of INT8), ties broken by the lower error on calibration samples; "
                    "the device's engine timing (edgeopt bench) confirms it")
            if not passing:
                return None, None, rule
            chosen = min(passing, key=lambda v: (len(v.settings.exclude), v.calib_rel_l2))
            return chosen, None, rule + self._cross_rule()
        rule = ("fastest variant the accuracy policy accepts (latencies re-measured interleaved, round by round; "
                f"a variant counts as slower only when it is slower in every round and by more than {TIE:.0%} "
                "in the median round: otherwise a tie, broken by accuracy)")
        top = sorted(passing, key=lambda v: v.accuracy, reverse=True)[:6]
        fp32 = self.backend.session(fp32_path, timing=True) if fp32_path else None
        if not top:
            return None, (latency_ms(fp32, self.val[0]) if fp32 is not None else None), rule
        sessions = [self.backend.session(v.path, timing=True) for v in top] + ([fp32] if fp32 is not None else [])
        per_round = interleaved_rounds(sessions, self.val[0], rounds=self._select_rounds(top))
        ms = [statistics.median(r) for r in per_round]
        for v, m in zip(top, ms):
            v.latency_ms = m
        f = min(range(len(top)), key=lambda i: ms[i])
        tied = [v for i, v in enumerate(top) if not slower(per_round[i], per_round[f])]
        chosen = max(tied, key=lambda v: v.accuracy)
        self.timings["selection"] = [  # the timings behind the pick (manifest: int8_search.timings)
            {"label": v.settings.label(), "median_ms": round(ms[i], 4), "rounds_ms": [round(x, 4) for x in per_round[i]],
             "tied_with_fastest": v in tied, "chosen": v is chosen, "accuracy": list(v.accuracy)}
            for i, v in enumerate(top)] + ([{"label": "fp32", "median_ms": round(ms[-1], 4),
                                             "rounds_ms": [round(x, 4) for x in per_round[-1]]}] if fp32 is not None else [])
        return chosen, (ms[-1] if fp32 is not None else None), rule + self._cross_rule()

    @staticmethod
    def _select_rounds(top: list[Variant]) -> int:
        """Rounds of the interleaved re-measure (3 runs per session per round): 7, fewer (>= 3) where the
        variants' first timings say 7 rounds of them and FP32 would take over ``SELECT_TIMING_S``."""
        known = [v.latency_ms for v in top if v.latency_ms is not None and math.isfinite(v.latency_ms)]
        if not known:
            return 7
        round_ms = 3 * (sum(known) + 2 * max(known))  # FP32 not timed yet: taken as 2x the slowest INT8
        return max(3, min(7, int(SELECT_TIMING_S * 1000 / max(round_ms, 1e-9))))

    # --- k-fold cross-check -----------------------------------------------------------------
    def _cross_rule(self) -> str:
        done = [c for c in getattr(self, "cross_checks", []) if "passed" in c]
        return (f"; a variant passes only if it also passes a {CROSS_FOLDS}-fold cross-check on {done[0]['samples']} "
                "pooled calibration + validation samples (each fold judged by a variant calibrated without it)"
                ) if done else ""

    def cross_check(self, v: Variant) -> dict[str, Any] | None:
        """Judge ``v``'s recipe on every pooled sample out of fold; None where it does not apply (enough
        validation samples, calibration is the validation set, or a backend that cannot recalibrate)."""
        from edgeopt_agent.compare import compare_outputs

        folds = self._fold_backends()
        if not folds:
            return None
        pool = self.calib + self.val
        t = time.perf_counter()
        got: list[dict[str, np.ndarray] | None] = [None] * len(pool)
        for backend, held, work in folds:
            path = work / f"variant-{len(self.variants)}.onnx"
            try:
                backend.make(v.settings, path)
                outs = run_all(backend.session(path), [pool[i] for i in held], self.out_names)
            except Exception as exc:  # noqa: BLE001 - a fold the quantizer cannot make: no confirmation
                rec = {"label": v.settings.label(), "error": f"{type(exc).__name__}: {str(exc)[:160]}"}
                self.cross_checks.append(rec)
                self.notes.append(f"cross-check of {v.settings.label()} not possible ({rec['error']}); "
                                  "the held-out samples decided")
                return None
            finally:
                path.unlink(missing_ok=True)
            for j, i in enumerate(held):
                got[i] = {n: outs[n][j] for n in self.out_names}
        outputs = {n: np.stack([g[n] for g in got]) for n in self.out_names}
        if self._pool_reference is None:
            self._pool_reference = self._pool_fp32()
        pool_rows = (self.calib_rows + self.rows) if self.rows and self.calib_rows else None
        result = compare_outputs(outputs, self._pool_reference, "int8", self.tolerance, self.kinds, pool_rows)
        policy.apply(result, self.accept)
        n_pool = int(sum(pool_rows)) if pool_rows else len(pool)
        rec = {"label": v.settings.label(), "folds": CROSS_FOLDS, "samples": n_pool,
               "passed": bool(result["passed"]), "summary": result["summary"],
               "reasons": [r for o in result["outputs"].values() for r in o["reasons"]],
               "metrics": {n: headline(o["metrics"]) for n, o in result["outputs"].items()},
               "time_s": round(time.perf_counter() - t, 2)}
        self.cross_checks.append(rec)
        self.progress(f"int8: {CROSS_FOLDS}-fold cross-check on {n_pool} samples "
                      f"{'PASS' if rec['passed'] else 'fail'} {v.settings.label()}: {rec['summary']} ({rec['time_s']:.1f}s)")
        return rec

    def _pool_fp32(self) -> dict[str, np.ndarray]:
        """FP32 outputs of the pooled calibration + validation samples, in pool order: the calibration
        samples' already computed (``calib_reference``) and the validation set's reference (what the host
        check judges against) reused; only the calibration samples past ``CALIB_CHECK_SAMPLES`` are run."""
        n_cal = len(self.calib_check)
        rest = self.calib[n_cal:]
        extra = run_all(self.float_session, rest, self.out_names) if rest else None
        parts: dict[str, list[np.ndarray]] = {}
        for n in self.out_names:
            parts[n] = [self.calib_reference[n][:n_cal]] + ([extra[n]] if extra is not None else []) \
                + [np.asarray(self.reference[n])[: len(self.val)]]
        self.timings["cross_check_fp32_runs"] = len(rest)
        return {n: np.concatenate(v) for n, v in parts.items()}

    def _fold_backends(self) -> list[tuple[Any, list[int], Path]]:
        """One backend per fold, calibrated on the other folds (made once; each caches its calibration
        per method, so a variant's cross-check after the first is a quantization and a run per fold)."""
        if self._folds is not None:
            return self._folds
        self._folds = []
        pool = self.calib + self.val
        if (not hasattr(self.backend, "recalibrated") or self.n_val >= CROSS_CHECK_BELOW
                or self.calib is self.val or len(pool) < len(self.val) + CROSS_FOLDS):
            return self._folds
        self.progress(f"int8: small validation set ({self.n_val}): variants that pass are cross-checked over "
                      f"{CROSS_FOLDS} folds of the {len(pool)} calibration + validation samples ({CROSS_FOLDS} "
                      f"quantizations and {len(pool)} inferences each, inside the {self.budget_s:.0f}s budget)")
        for k in range(CROSS_FOLDS):
            work = self.work / f"fold-{k}"
            work.mkdir(parents=True, exist_ok=True)
            train = [x for i, x in enumerate(pool) if i % CROSS_FOLDS != k]
            self._folds.append((self.backend.recalibrated(train, work), list(range(k, len(pool), CROSS_FOLDS)), work))
        return self._folds

    def budget_cut(self) -> bool:
        """Did the time budget stop the search before it had tried what it would have (a refusal then
        depends on the machine's load, and is not cached)?"""
        return any("time budget" in n for n in self.notes)

    def refusal_detail(self) -> str:
        """What the cross-check refused, for a refusal message ("" when it refused nothing)."""
        failed = [c for c in self.cross_checks if c.get("passed") is False]
        if not failed:
            return ""
        return (f"; {len(failed)} variant(s) passed the {self.n_val} held-out samples but failed the "
                f"{CROSS_FOLDS}-fold cross-check on {failed[0]['samples']} samples (first: {failed[0]['label']}: "
                f"{failed[0]['summary']})")

    def closest(self) -> Variant:
        """The most accurate variant tried (what a refusal names)."""
        return max(self.variants, key=lambda v: v.accuracy)

    def overrun(self) -> str | None:
        """A search stops starting steps at its budget but never cuts one mid-way: when the last step ran past
        the budget, by how much and which step (said in the record, the notes and a progress line)."""
        over = self.elapsed() - self.budget_s
        if over <= min(0.5, 0.1 * self.budget_s):  # timer noise, not an overrun
            return None
        last = self._variant_s[-1] if self._variant_s else over
        return (f"the search ran {over:.0f}s past its {self.budget_s:.0f}s budget: a step is never cut mid-way, "
                f"and the last ({self.stage or 'the first variant'}) took {last:.0f}s")

    def record(self) -> dict[str, Any]:
        over = self.overrun()
        if over and over not in self.notes:
            self.notes.append(over)
            self.progress(f"note: {over}")
        return {"search": self.mode, "budget_s": self.budget_s, "time_s": round(self.elapsed(), 1),
                **({"overrun_s": round(self.elapsed() - self.budget_s, 3)} if over else {}),
                "variants": [v.record() for v in self.variants], "sensitivity_top": self.ranking,
                "timings": self.timings, "calibration_samples": len(self.calib),
                "validation_samples": self.n_val, "cross_checks": self.cross_checks, "notes": self.notes,
                "mixed_scale_concats": [mc.record() for mc in self.mixed_concats],
                "decode_tail": list(self.decode_tail)}
