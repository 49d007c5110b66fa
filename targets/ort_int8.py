"""Accuracy-aware INT8 for the ``cpu`` target: static QDQ with ONNX Runtime's quantizer, searched.

ORT's defaults are not good enough: with MinMax calibration every INT8 variant kept only 65-75%
top-1 agreement with FP32 on a real ImageNet CNN (shared/FIXTURES.md).  So ``build_int8`` tries
quantizer settings and measures each against the FP32 reference, by the host check's own rule
(``edgeopt_agent.compare.compare_outputs(.., "int8")``) on the validation set, and times it:

1. ``quant_pre_process`` (symbolic shape inference skipped where it fails, as on the PP-OCR models
   and transformers), opset raised to 13 for per-channel QDQ (``ort_int8_quant.preprocess``).
2. Activation/weight types from the target CPU's ISA (``choose_types``); options override.
3. The grid: calibration method (MinMax, Percentile; + Entropy in ``full``) x per-channel weights
   (x the other type combinations in ``full``).  Calibration runs once per method.  ``quick`` stops
   after the first method that yields a passing variant: other methods change accuracy, not speed.
4. When nothing passes: per-node sensitivity of the most accurate variant (SQNR lost at each node,
   float vs fake-quant activations on calibration samples), then the most sensitive nodes are kept
   in float, greedily: a group is kept in float only when it lowers the error on calibration
   samples (never judged on the validation set it is then checked on), groups grow while that
   pays, until the bound is met or the trial/time budget runs out.
5. The fastest passing variant is kept (latencies re-measured interleaved; within 3% is a tie,
   broken by accuracy).  None passes: ``CheckFailed`` naming the best figures; nothing is written
   (the pipeline caches that outcome).
"""

from __future__ import annotations

import math
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgeopt.errors import UsageError
from edgeopt_agent.compare import top1_text

from .base import BuildJob, BuildOutput, CheckFailed, parse_tolerance, require
from .ort_int8_quant import (
    TIMING_THREADS,
    QuantSettings,
    calibrate,
    float_effect,
    interleaved_ms,
    latency_ms,
    output_activations,
    preprocess,
    quantize,
    run_all,
    sensitivity,
    session,
)

SEARCH_MODES = {"quick": 120.0, "full": 600.0}  # mode -> default time budget (s)
FALLBACK = {"quick": (6, 32), "full": (24, 128)}  # mode -> (float-fallback trials, candidate nodes)
OPTION_KEYS = {"int8_search", "int8_tolerance", "int8_activation", "int8_weight", "int8_reduce_range",
               "int8_budget_s"}
VNNI_FLAGS = {"avx512_vnni", "avx_vnni", "amx_int8"}
TIE = 0.03  # latencies within 3% are noise on a shared 2-core machine: prefer accuracy then
SENSITIVITY_SAMPLES = 4
CALIB_CHECK_SAMPLES = 8  # calibration samples that judge float-fallback steps


@dataclass
class Variant:
    """A quantized model and how it measured."""

    settings: QuantSettings
    passed: bool
    outputs: dict[str, dict[str, float]]  # per output: the headline metrics on the validation set
    reasons: list[str]
    latency_ms: float
    calib_rel_l2: float  # mean rel_l2 over outputs on calibration samples (guides the fallback)
    path: Path
    step: str = "grid"  # grid | float-fallback

    @property
    def accuracy(self) -> tuple[float, float]:
        """Sort key, higher is better: worst top-1 (1.0 where none applies), then worst cosine."""
        if not self.outputs:  # a variant the quantizer could not make ranks last
            return (-1.0, -1.0)
        top1 = min((m.get("top1", 1.0) for m in self.outputs.values()), default=1.0)
        cos = min((m.get("cosine", 1.0) for m in self.outputs.values()), default=1.0)
        return (top1, cos)

    def record(self) -> dict[str, Any]:
        s = asdict(self.settings)
        s["exclude"] = list(self.settings.exclude)
        return {"label": self.settings.label(), "settings": s, "step": self.step, "passed": self.passed,
                "latency_ms": round(self.latency_ms, 3), "metrics": self.outputs,
                "calib_rel_l2": round(self.calib_rel_l2, 5), "reasons": self.reasons}

    def summary(self) -> str:
        bits = []
        for name, m in self.outputs.items():
            txt = f"cos {m.get('cosine', float('nan')):.4f} rel_l2 {m.get('rel_l2', float('nan')):.3f}"
            if "top1" in m:
                txt += f" top1 {top1_text(m)}"
            bits.append(txt if len(self.outputs) == 1 else f"{name}: {txt}")
        return f"{self.settings.label()}: " + "; ".join(bits) + f", {self.latency_ms:.2f} ms" + (
            "" if self.passed else " (fails: " + "; ".join(self.reasons[:2]) + ")")


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

def grid(plan: SearchPlan, feat: dict[str, Any], per_channel_ok: bool) -> tuple[list[QuantSettings], str]:
    """Variants to try before any node is kept in float, in order (cheapest calibration first)."""
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
    return [QuantSettings(m, pc, a, w, r, float_output=fo)
            for m in methods for (a, w, r) in types for pc in pcs for fo in outs], why


class _Search:
    """State of one INT8 search: work dir, data, references and every variant tried."""

    def __init__(self, job: BuildJob, plan: SearchPlan, work: Path, progress: Callable[[str], None]) -> None:
        self.ort = require("onnxruntime", "onnxruntime")
        self.plan, self.work, self.progress = plan, work, progress
        in_names = [t["name"] for t in job.io["inputs"]]
        self.out_names = [t["name"] for t in job.io["outputs"]]
        self.val = _feeds(job.validation_path, in_names)
        self.calib = _feeds(job.calib_path, in_names) if job.calib_path else self.val
        self.reference = _reference(job.reference_path, self.out_names)
        # FP32 outputs on a few calibration samples, computed like reference.npz (no optimisation).
        self.calib_check = self.calib[:CALIB_CHECK_SAMPLES]
        self.calib_reference = run_all(session(self.ort, Path(job.prepared_path), optimize=False),
                                       self.calib_check, self.out_names)
        self.ranges: dict[str, Any] = {}
        self.variants: list[Variant] = []
        self.notes: list[str] = []
        self.timings: dict[str, float] = {}
        self.t0 = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def over_budget(self) -> bool:
        return self.elapsed() > self.plan.budget_s

    def ranges_for(self, model: Path, method: str) -> Any:
        if method not in self.ranges:
            self.progress(f"int8: calibrating ({method}, {len(self.calib)} samples)")
            t = time.perf_counter()
            self.ranges[method] = calibrate(model, method, self.calib, self.work)
            self.timings[f"calibrate_{method}_s"] = round(time.perf_counter() - t, 2)
        return self.ranges[method]

    def try_variant(self, model: Path, s: QuantSettings, step: str) -> Variant:
        from edgeopt_agent.compare import compare_outputs, tensor_metrics

        path = self.work / f"variant-{len(self.variants)}.onnx"
        try:
            quantize(model, self.ranges_for(model, s.calibration), s, path)
            sess = session(self.ort, path)
        except Exception as exc:  # noqa: BLE001 - one variant the quantizer cannot make is one failed candidate
            msg = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            v = Variant(s, False, {}, [f"ONNX Runtime's quantizer failed: {type(exc).__name__}: {msg}"],
                        math.inf, math.inf, path, step)
            self.variants.append(v)
            self.progress(f"int8: fail {s.label()}: {v.reasons[0]}")
            return v
        result = compare_outputs(run_all(sess, self.val, self.out_names), self.reference, "int8",
                                 self.plan.tolerance)
        cal = run_all(sess, self.calib_check, self.out_names)
        cal_err = float(np.mean([tensor_metrics(cal[n], self.calib_reference[n]).get("rel_l2", math.inf)
                                 for n in self.out_names]))
        del sess
        ms = latency_ms(session(self.ort, path, threads=TIMING_THREADS), self.val[0])
        per = {n: headline(o["metrics"]) for n, o in result["outputs"].items()}
        reasons = [f"{n}: {r}" if len(per) > 1 else r for n, o in result["outputs"].items() for r in o["reasons"]]
        v = Variant(s, bool(result["passed"]), per, reasons, ms, cal_err, path, step)
        self.variants.append(v)
        self.progress(f"int8: {'PASS' if v.passed else 'fail'} {v.summary()}")
        return v

    def run_grid(self, model: Path, settings: list[QuantSettings]) -> None:
        methods = list(dict.fromkeys(s.calibration for s in settings))
        for i, method in enumerate(methods):
            if self.variants and self.over_budget():
                self.notes.append(f"time budget ({self.plan.budget_s:.0f}s) spent: calibration "
                                  f"{', '.join(methods[i:])} not tried")
                return
            for s in (s for s in settings if s.calibration == method):
                self.try_variant(model, s, "grid")
            if self.plan.mode == "quick" and any(v.passed for v in self.variants) and i + 1 < len(methods):
                self.notes.append(f"quick search: stopped after {method} calibration passed ({', '.join(methods[i + 1:])} "
                                  "would change accuracy, not speed)")
                return

    def run_fallback(self, model: Path) -> list[dict[str, Any]]:
        """Keep the nodes whose float fallback helps the output most in float, greedily, until a variant passes.

        Two measurements rank the nodes: the SQNR each loses (cheap, all nodes) picks candidates, then
        each candidate's effect on the model output when it alone reads float inputs and weights
        (fake-quant, on calibration samples) orders them.  Groups of the best are then really quantized
        with those nodes excluded and kept only when the calibration error falls.
        """
        import onnx

        best = max(self.variants, key=lambda v: v.accuracy)
        self.progress(f"int8: no variant passes; per-node sensitivity of {best.settings.label()}")
        t = time.perf_counter()
        feeds = self.calib[:SENSITIVITY_SAMPLES]
        ranking = sensitivity(self.ort, model, best.path, feeds, self.work)
        trials, n_cand = FALLBACK[self.plan.mode]
        skip = set(best.settings.exclude) | set(output_activations(onnx.load(str(model), load_external_data=False)))
        pre = [name for name, _, drop in ranking if drop > 0 and name not in skip][:n_cand]
        reference = {n: a[: len(feeds)] for n, a in self.calib_reference.items()}
        deadline = self.t0 + self.plan.budget_s
        effect = float_effect(self.ort, model, best.path, pre, feeds, reference, deadline)
        base = effect.pop("")
        self.timings["sensitivity_s"] = round(time.perf_counter() - t, 2)
        drops = {name: drop for name, _, drop in ranking}
        ops = {name: op for name, op, _ in ranking}
        ordered = sorted(effect, key=effect.get)
        candidates = [n for n in ordered if effect[n] < base * 0.995]  # measurably better in float
        table = [{"node": n, "op": ops[n], "sqnr_drop_db": round(drops[n], 2),
                  "output_rel_l2_if_float": round(effect[n], 5), "output_rel_l2_quantized": round(base, 5)}
                 for n in ordered[:10]]
        self.progress(f"int8: {len(candidates)} of {len(effect)} measured node(s) help when kept in float")
        current, err = best.settings, best.calib_rel_l2
        i, group = 0, 1
        for _ in range(trials):
            if i >= len(candidates):
                break
            if self.over_budget():
                self.notes.append(f"time budget ({self.plan.budget_s:.0f}s) spent during the float fallback")
                break
            add = tuple(candidates[i:i + group])
            i += len(add)
            v = self.try_variant(model, replace(current, exclude=current.exclude + add), "float-fallback")
            if v.passed:
                break
            if v.calib_rel_l2 < err * 0.99:  # it helps on calibration data: keep it, try bigger steps
                current, err, group = v.settings, v.calib_rel_l2, min(2 * group, 16)
            else:  # it does not: these nodes stay quantized, go back to single nodes
                group = 1
        if not any(v.passed for v in self.variants):
            self._joint_fallback(model, best.settings, pre)
        return table

    def _joint_fallback(self, model: Path, base: QuantSettings, ranked: list[str]) -> None:
        """Nodes that only help together (the real and imaginary Conv of an STFT: float one alone and
        the other still quantizes the shared input) are missed one at a time: keep the 2, 4, 8 ... most
        SQNR-sensitive nodes in float at once, while at least one stays quantized, until a variant passes."""
        sizes = sorted({min(2 ** i, len(ranked) - 1) for i in range(1, 8)} - {0, 1})
        for k in sizes:
            if self.over_budget():
                self.notes.append(f"time budget ({self.plan.budget_s:.0f}s) spent during the joint float fallback")
                return
            v = self.try_variant(model, replace(base, exclude=base.exclude + tuple(ranked[:k])), "joint-fallback")
            if v.passed:
                return

    def select(self, fp32_path: Path) -> tuple[Variant | None, float]:
        """The fastest passing variant (interleaved re-measure, ties to accuracy) and the FP32 latency."""
        passing = sorted((v for v in self.variants if v.passed), key=lambda v: v.accuracy, reverse=True)[:6]
        fp32 = session(self.ort, fp32_path, threads=TIMING_THREADS)
        if not passing:
            return None, latency_ms(fp32, self.val[0])
        ms = interleaved_ms([session(self.ort, v.path, threads=TIMING_THREADS) for v in passing] + [fp32],
                            self.val[0])
        for v, m in zip(passing, ms):
            v.latency_ms = m
        fastest = min(ms[:-1])
        tied = [v for v in passing if v.latency_ms <= fastest * (1 + TIE)]
        return max(tied, key=lambda v: v.accuracy), ms[-1]


def headline(metrics: dict[str, float]) -> dict[str, float]:
    keys = ("cosine", "rel_l2", "max_abs_norm", "top1", "top1_n", "seq_match", "snr_db")
    return {k: round(float(metrics[k]), 6) for k in keys if k in metrics}


def build_int8(job: BuildJob, progress: Callable[[str], None]) -> BuildOutput:
    """Search INT8 QDQ settings against the FP32 reference; write the fastest passing ``model.onnx``."""
    plan = parse_options(job.options)
    feat = cpu_features(job.target.get("profile"))
    bundle = Path(job.bundle_dir)
    # Scratch space beside the bundle, inside the pipeline's work dir: an interrupted build leaves
    # nothing behind either.
    work = Path(tempfile.mkdtemp(prefix=".ort-int8-", dir=bundle.parent))
    try:
        search = _Search(job, plan, work, progress)
        pre = work / "pre.onnx"
        progress("int8: quant_pre_process")
        per_channel_ok = preprocess(job.prepared_path, pre, search.notes)
        settings, why = grid(plan, feat, per_channel_ok)
        progress(f"int8: {plan.mode} search, budget {plan.budget_s:.0f}s; types: {why}")
        search.run_grid(pre, settings)
        ranking: list[dict[str, Any]] = []
        if not any(v.passed for v in search.variants) and not search.over_budget():
            try:
                ranking = search.run_fallback(pre)
            except Exception as exc:  # e.g. intermediate tensors inside If branches cannot be graph outputs
                search.notes.append(f"int8: float fallback not possible on this graph "
                                    f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]})")
        chosen, fp32_ms = search.select(Path(job.prepared_path))
        if chosen is None:
            best = max(search.variants, key=lambda v: v.accuracy)
            raise CheckFailed(
                f"no INT8 variant met the int8 bound ({_bound(plan)}) after {len(search.variants)} variant(s) in "
                f"{search.elapsed():.0f}s; the most accurate: {best.summary()}; INT8 is not shipped",
                hint="keep fp32 for this target, calibrate with more representative --calib data, try "
                     "--option int8_search=full, or accept a looser bound with e.g. "
                     "--option int8_tolerance=cosine_min=0.95,top1_min=0.8")
        if _quantized_nodes(chosen.path) == 0:
            # e.g. silero-vad: every weight lives inside If branches, which the quantizer does not enter
            raise CheckFailed("INT8 quantized nothing in this model (no QuantizeLinear node in the graph or its "
                              "subgraphs); an 'int8' artifact would be the FP32 model under another name",
                              hint="keep fp32 for this target")
        return _output(job, plan, feat, why, search, chosen, fp32_ms, ranking)
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


def _bound(plan: SearchPlan) -> str:
    from edgeopt_agent.compare import tolerance_for

    return ", ".join(f"{k} {'off' if v is None else format(v, 'g')}"
                     for k, v in tolerance_for("int8", plan.tolerance).items())


def _output(job: BuildJob, plan: SearchPlan, feat: dict[str, Any], why: str, search: _Search, chosen: Variant,
            fp32_ms: float, ranking: list[dict[str, Any]]) -> BuildOutput:
    """Write the chosen model (with the source's metadata) and record the whole search."""
    import onnx

    model = onnx.load(str(chosen.path))
    have = {p.key for p in model.metadata_props}
    for p in onnx.load(job.prepared_path, load_external_data=False).metadata_props:
        if p.key not in have:  # e.g. PP-OCR's `character` list, which the task code reads
            model.metadata_props.add(key=p.key, value=p.value)
    onnx.save(model, str(Path(job.bundle_dir) / "model.onnx"))
    speedup = round(fp32_ms / chosen.latency_ms, 3) if chosen.latency_ms > 0 else None
    info = {"search": plan.mode, "budget_s": plan.budget_s, "time_s": round(search.elapsed(), 1),
            "chosen": chosen.record(), "fp32_ms": round(fp32_ms, 3), "speedup_vs_fp32": speedup,
            "cpu": {"arch": feat["arch"], "source": feat["source"],
                    "int8_flags": sorted(set(feat["flags"]) & (VNNI_FLAGS | {"avx2", "avx512f", "asimddp", "i8mm"}))},
            "types_reason": why, "tolerance": plan.tolerance,
            "variants": [v.record() for v in search.variants],
            "sensitivity_top": ranking,
            "timings": search.timings, "timing_threads": TIMING_THREADS, "calibration_samples": len(search.calib),
            "validation_samples": len(search.val), "notes": search.notes,
            "selection": f"fastest passing variant (latencies re-measured interleaved; within {TIE:.0%} is a "
                         "tie, broken by accuracy)"}
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
                                "options": {"graph_optimization_level": "all"}},
                       options={"int8": info}, notes=notes, warnings=warnings,
                       extra_manifest={"tolerance_override": plan.tolerance} if plan.tolerance else {})
