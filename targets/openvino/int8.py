"""Accuracy-aware INT8 for OpenVINO: NNCF post-training quantization, searched against the reference.

Every variant is judged the way the bundle will be judged: compiled with the bundle's runtime
settings, run over the validation set, compared with the FP32 reference by
``edgeopt_agent.compare.compare_outputs(..., "int8")``.  Variants, in the order of the speed they
are expected to have (all fully quantized, each costs one NNCF pass):

1. ``performance``: symmetric INT8 weights and activations, fast bias correction (NNCF's default);
2. ``transformer`` (models with attention only): NNCF's transformer scheme (SmoothQuant, no
   quantizers on the attention's sensitive paths);
3. ``mixed``: asymmetric activations (for activations that are not centred on zero);
4. ``bias-correction`` (``int8_search=full`` only): the full bias correction, several times slower
   to build and rarely decisive.

``int8_search=quick`` (default) stops at the first variant that meets the bound, the fastest
expected; ``full`` tries them all and keeps the fastest measured.  When no fully quantized variant
meets the bound, NNCF's accuracy-controlled quantization reverts the most sensitive layers to
floating point, one group at a time (its metric is ``margin``, the same rule as the check).  It
runs in a child process killed at the end of the search budget, since its cost grows with the
number of layers and no NNCF setting bounds it.  When nothing meets the bound the build fails
with every variant's figures: a model is never shipped as int8 that is not.

The plugin's default inference precision is part of the judgement: OpenVINO's CPU plugin runs the
layers left in floating point in bf16 on CPUs with AMX/AVX512-BF16.  When that alone breaks the
bound (the FP32 IR run that way already misses it), the bundle pins ``f32`` for them.

Options (``--option``): ``int8_search=quick|full``, ``int8_tolerance=cosine_min=0.99,top1_min=1``
(the bound; also written to the manifest so that every later check uses it), ``int8_budget_s``
(the search's time budget, default 90: no variant is started that would not fit),
``int8_accuracy_control=false``, ``int8_max_reverts`` (accuracy control's iterations, default 12).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeopt.errors import BuildFailed, UsageError
from edgeopt_agent.compare import batch_rows, bound_text, compare_outputs, tolerance_for, top1_floor

from ..base import BuildJob, CheckFailed, UncalibratedBranch, if_as_where_refused, parse_tolerance, require

SEARCH_MODES = ("quick", "full")
DEFAULT_BUDGET_S = 90.0
# bound -> metric, by direction: larger is better for the first, smaller for the second.
_HIGHER_IS_BETTER = {"cosine_min": "cosine", "top1_min": "top1", "seq_match_min": "seq_match",
                     "vector_cosine_min": "vector_cosine_min", "box_match_min": "box_match",
                     "slice_cosine_min": "slice_cosine"}
_LOWER_IS_BETTER = {"rel_l2_max": "rel_l2", "max_abs_norm_max": "max_abs_norm", "flip_rate_max": "flip_rate",
                    "slice_rel_l2_max": "slice_rel_l2"}
# (name, settings, only in full mode); settings are plain data so that they cross into the child.
VARIANTS: list[tuple[str, dict[str, Any], bool]] = [
    ("performance", {"preset": "performance", "fast_bias_correction": True}, False),
    ("transformer", {"preset": "mixed", "model_type": "transformer", "fast_bias_correction": True}, False),
    ("mixed", {"preset": "mixed", "fast_bias_correction": True}, False),
    ("bias-correction", {"preset": "performance", "fast_bias_correction": False}, True),
]


@dataclass
class Int8Result:
    """The chosen quantized model and what the search did."""

    model: Any
    record: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    tolerance_override: dict[str, float] | None = None
    inference_precision: str | None = None  # pinned for the layers left in floating point


def margin(comparison: dict[str, Any]) -> float:
    """How far inside the bound a comparison is: 1 = identical to the reference, >= 0 passes, < 0 fails.

    The smallest normalised slack over every output and bounded metric, e.g. for cosine
    ``(cosine - cosine_min) / (1 - cosine_min)``.  This is the figure NNCF's accuracy control
    maximises, so that "meets the bound" means the same thing there as in the check.
    """
    tol = comparison["tolerance"]
    worst = 1.0
    pol = comparison.get("policy") or {}
    if pol.get("accepted") is False:  # the accuracy policy refused (decisions): below 0 by how far past it
        over = (pol.get("value") or 0.0) - (pol.get("threshold") or 0.0) if pol.get("metric") == "decisions" else 0.0
        worst = min(worst, -max(over, 1e-3))
    for per in comparison["outputs"].values():
        m = per["metrics"]
        if not m or "shape_mismatch" in m or "non_finite" in m:
            return -10.0
        if "exact_match" in m:
            worst = min(worst, 1.0 if m["exact_match"] >= 1.0 else -10.0 * (1 - m["exact_match"]))
            continue
        for bound, metric in _HIGHER_IS_BETTER.items():
            if tol.get(bound) is not None and metric in m:
                # top-1 is judged on a count (compare.top1_allowed): its floor depends on n
                floor = top1_floor(int(m.get("top1_n") or 0), tol[bound]) if metric == "top1" else tol[bound]
                worst = min(worst, (m[metric] - floor + 1e-9) / max(1.0 - floor, 1e-9))
        for bound, metric in _LOWER_IS_BETTER.items():
            if tol.get(bound) is not None and metric in m:  # a bound of None is not judged
                worst = min(worst, (tol[bound] - m[metric]) / max(tol[bound], 1e-9))
    return float(worst)


def summary(comparison: dict[str, Any]) -> dict[str, Any]:
    """The headline figures of each output (and why it fails) for the record and messages."""
    out: dict[str, Any] = {}
    for name, per in comparison["outputs"].items():
        m = per["metrics"]
        out[name] = {k: round(float(m[k]), 5) for k in ("cosine", "rel_l2", "max_abs_norm", "top1", "top1_n",
                                                             "seq_match", "flip_rate", "vector_cosine_min", "box_match")
                     if k in m}
        if per["reasons"]:
            out[name]["fails"] = per["reasons"]
    return out


class Judge:
    """Runs a model over the validation set with the bundle's runtime settings and compares."""

    def __init__(self, ov, device: str, config: dict[str, Any], feeds: list[dict[str, np.ndarray]],
                 refs: list[dict[str, np.ndarray]], out_names: list[str], override: dict[str, float] | None,
                 kinds: dict[str, Any] | None = None, accept: dict[str, Any] | None = None,
                 rows: list[int] | None = None) -> None:
        self.core = ov.Core()
        # build --batch B: the distinct samples of each feed (``compare.batch_rows``), counted once each
        self.rows = rows if rows and len(rows) == len(feeds) else None
        self.accept = accept  # the accuracy policy's gate file (None: the defaults): every candidate judged by it
        self.device, self.config = device, dict(config)
        self.feeds, self.refs, self.out_names, self.override = feeds, refs, out_names, override
        self.kinds = kinds  # the manifest's output_kinds: what each output means

    def run(self, compiled, indices: list[int]) -> dict[str, np.ndarray]:
        ports = []
        for port in compiled.outputs:
            names = port.get_names()
            ports.append((port, next((n for n in self.out_names if n in names), port.get_any_name())))
        request = compiled.create_infer_request()
        got: dict[str, list[np.ndarray]] = {n: [] for _, n in ports}
        for i in indices:
            result = request.infer(self.feeds[i])
            for port, name in ports:
                got[name].append(np.array(result[port]))
        return {k: np.stack(v) for k, v in got.items()}

    def compare(self, outputs: dict[str, np.ndarray], indices: list[int]) -> dict[str, Any]:
        ref = {n: np.stack([self.refs[i][n] for i in indices]) for n in self.out_names}
        from edgeopt.policy import accept

        result = compare_outputs(outputs, ref, "int8", self.override, self.kinds,
                                 [self.rows[i] for i in indices] if self.rows else None)
        accept.apply(result, self.accept)
        return result

    def judge(self, model, config: dict[str, Any] | None = None) -> dict[str, Any]:
        compiled = self.core.compile_model(model, self.device, {**self.config, **(config or {})})
        idx = list(range(len(self.feeds)))
        return self.compare(self.run(compiled, idx), idx)

    def validation_fn(self, compiled, items) -> tuple[float, list[float]]:
        """NNCF's accuracy-control metric: the margin inside the bound, overall and per sample."""
        idx = [int(i) for i in items]
        outputs = self.run(compiled, idx)
        overall = margin(self.compare(outputs, idx))
        per = [margin(self.compare({k: v[j:j + 1] for k, v in outputs.items()}, [i])) for j, i in enumerate(idx)]
        return overall, per

    def latency_ms(self, models: list[tuple[Any, dict[str, Any]]], rounds: int = 3,
                   seconds: float = 0.25) -> list[float]:
        """Median latency of each (model, config) on one sample, measured interleaved (rounds x models)."""
        reqs = [self.core.compile_model(m, self.device, {**self.config, **c}).create_infer_request()
                for m, c in models]
        feed = self.feeds[0]
        times: list[list[float]] = [[] for _ in models]
        for r in reqs:
            for _ in range(3):
                r.infer(feed)
        for _ in range(rounds):
            for k, r in enumerate(reqs):
                t_end = time.perf_counter() + seconds
                while time.perf_counter() < t_end or len(times[k]) < 5:
                    t0 = time.perf_counter()
                    r.infer(feed)
                    times[k].append(time.perf_counter() - t0)
        return [round(float(np.median(t)) * 1e3, 3) for t in times]


def has_attention(model) -> bool:
    """Self-attention: OpenVINO's fused ScaledDotProductAttention, or a MatMul of two activations."""
    def constant(output) -> bool:
        node = output.get_node()
        while node.get_type_name() in ("Convert", "Reshape", "Transpose", "Unsqueeze") and node.get_input_size():
            node = node.input_value(0).get_node()
        return node.get_type_name() == "Constant"

    return any(op.get_type_name() == "ScaledDotProductAttention"
               or (op.get_type_name() == "MatMul" and not any(constant(v) for v in op.input_values()))
               for op in model.get_ordered_ops())


def untaken_if_branches(ov, model, samples: list[dict[str, np.ndarray]]) -> list[str]:
    """The top-level If nodes whose then or else branch no calibration sample takes, one phrase each.

    NNCF (``quantize_ifmodel``) splits the calibration set between the two bodies by the condition
    each sample gives and fails on an empty half ("Calibration dataset must not be empty"), after a
    full statistics pass; counting the conditions first costs one inference per sample.
    """
    ifs = [op for op in model.get_ordered_ops() if op.get_type_name() == "If"]
    if not ifs or not samples:
        return []
    probe = model.clone()
    by_name = {op.get_friendly_name(): op for op in probe.get_ordered_ops()}
    conds = [by_name[op.get_friendly_name()].input_value(0) for op in ifs]
    probe.add_outputs(conds)
    compiled = ov.Core().compile_model(probe, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    ports = compiled.outputs[-len(conds):]
    taken = np.zeros(len(conds), dtype=int)
    for feed in samples:
        result = request.infer(feed)
        taken += [bool(np.asarray(result[port]).reshape(-1)[0]) for port in ports]
    phrases = []
    for op, then_n in zip(ifs, taken.tolist()):
        else_n = len(samples) - then_n
        if min(then_n, else_n) == 0:
            branch = "then" if then_n == 0 else "else"
            phrases.append(f"the If computing {op.get_friendly_name()!r} takes its {branch} branch for none of the "
                           f"{len(samples)} calibration samples")
    return phrases


def reloaded(ov, model, scratch: Path):
    """``model`` as the bundle will hold it: serialized as the build saves it (``ov.save_model``, FP32
    weights) and read back into memory.  The search judges and times this, never NNCF's in-memory model:
    the CPU plugin compiles the two differently (measured, OpenVINO 2026.4 on an AVX2 host: a CNN+LSTM's
    in-memory INT8 model ran its LSTMSequence as a float TensorIterator, rel_l2 0.019 against FP32; the
    same model saved and read back ran it as a quantized u8 RNNSeq, rel_l2 0.32 -- the in-memory graph's
    runtime info, which the IR does not keep, changed the plugin's choice).  So "meets the bound" is said
    of the saved artifact."""
    d = Path(tempfile.mkdtemp(prefix="ov-judge-", dir=scratch))
    try:
        ov.save_model(model, str(d / "model.xml"), compress_to_fp16=False)
        return ov.Core().read_model(str(d / "model.xml"), config={"ENABLE_MMAP": False})
    finally:
        shutil.rmtree(d, ignore_errors=True)


def quantizers(model) -> int:
    """FakeQuantize nodes: how much of the model runs in INT8."""
    return sum(op.get_type_name() == "FakeQuantize" for op in model.get_ordered_ops())


def nncf_kwargs(nncf, settings: dict[str, Any], target_device: str, subset_size: int,
                ignored: list[str] | None = None) -> dict[str, Any]:
    """A variant's plain settings -> keyword arguments of nncf.quantize* (``ignored``: OpenVINO op names
    NNCF must not quantize, ``mixed_scale_ignored``)."""
    kw: dict[str, Any] = {"preset": nncf.QuantizationPreset(settings["preset"]),
                          "fast_bias_correction": bool(settings.get("fast_bias_correction", True)),
                          "subset_size": subset_size,
                          "target_device": getattr(nncf.TargetDevice, target_device, nncf.TargetDevice.ANY)}
    if settings.get("model_type") == "transformer":
        kw["model_type"] = nncf.ModelType.TRANSFORMER
    if ignored:
        kw["ignored_scope"] = nncf.IgnoredScope(names=list(ignored), validate=False)
    return kw


def mixed_scale_ignored(model, prepared_path: str, calib: list[dict[str, np.ndarray]]) -> tuple[list[str], list[Any]]:
    """OpenVINO op names of the Concats of differently-scaled inputs and their readers (``mixed_concat``:
    NNCF keeps them float), found on the prepared ONNX and matched by output tensor name; and what was found."""
    import onnx

    from ..mixed_concat import find

    onnx_model = onnx.load(prepared_path)
    found = find(onnx_model, calib)
    if not found:
        return [], []
    outputs = {n.name: list(n.output) for n in onnx_model.graph.node}
    wanted = {t for mc in found for node in mc.float_nodes for t in outputs.get(node, [])}
    names = [op.get_friendly_name() for op in model.get_ordered_ops()
             if op.get_type_name() not in ("Result", "Constant")
             and any(wanted & set(port.get_names()) for port in op.outputs())]
    return names, found


def decode_tail_ignored(model, prepared_path: str, outputs: list[str]) -> tuple[list[str], list[str]]:
    """OpenVINO op names of the decoding of the detection ``outputs`` (``mixed_concat.decode_tail``: the
    nodes after the head's last weighted op, kept float, as ultralytics' own OpenVINO export keeps its
    head's post-processing out of NNCF), matched by output tensor name; and the ONNX nodes found."""
    import onnx

    from ..mixed_concat import decode_tail

    if not outputs:
        return [], []
    onnx_model = onnx.load(prepared_path, load_external_data=False)
    tail = decode_tail(onnx_model, outputs)
    if not tail:
        return [], []
    produced = {n.name: list(n.output) for n in onnx_model.graph.node}
    wanted = {t for node in tail for t in produced.get(node, [])}
    names = [op.get_friendly_name() for op in model.get_ordered_ops()
             if op.get_type_name() not in ("Result", "Constant", "Parameter")
             and any(wanted & set(port.get_names()) for port in op.outputs())]
    return names, tail


OWN_READING = "openvino-read"


def _own_reading(ov, nncf, job: BuildJob, calib_ds, judge, target_device: str, n_calib: int, ignored: list[str],
                 progress: Callable[[str], None]) -> tuple[dict[str, Any] | None, Any]:
    """The ``performance`` variant on ``Core().read_model`` of the user's ONNX (reshaped to the build's static
    input shapes) instead of edgeopt's converted IR: (entry, model) -- (None, None) when it is the same file
    or OpenVINO cannot read it (nothing to add); a failure to quantize or judge it is an entry that says so."""
    src, prepared = str(job.model_path or ""), str(job.prepared_path or "")
    if not src or not Path(src).is_file() or Path(src).resolve() == Path(prepared or src).resolve():
        return None, None
    try:
        own = ov.Core().read_model(src)
        shapes = {t["name"]: t["shape"] for t in job.io["inputs"]}
        own.reshape({i.get_any_name(): shapes[i.get_any_name()] for i in own.inputs
                     if i.get_any_name() in shapes})
        if {i.get_any_name() for i in own.inputs} != set(shapes):
            return None, None
    except Exception:  # noqa: BLE001 - OpenVINO reads only what edgeopt prepared: nothing to add
        return None, None
    settings = dict(VARIANTS[0][1])
    progress(f"INT8 variant {OWN_READING}: NNCF quantization of OpenVINO's own reading of the ONNX "
             f"(read_model, its own fusions) on {n_calib} calibration samples")
    t0 = time.perf_counter()
    try:
        q = nncf.quantize(own, calib_ds, **nncf_kwargs(nncf, settings, target_device, n_calib,
                                                       [n for n in ignored if _has_op(own, n)]))
        q = reloaded(ov, q, Path(job.bundle_dir).parent)
        comparison = judge.judge(q)
    except Exception as exc:  # noqa: BLE001 - recorded, the search goes on
        return {"variant": OWN_READING, "settings": settings, "passed": False, "error": _first_line(exc),
                "quantize_s": round(time.perf_counter() - t0, 1)}, None
    entry = {"variant": OWN_READING, "settings": settings, "passed": comparison["passed"],
             "margin": round(margin(comparison), 4), "metrics": summary(comparison),
             "policy": comparison.get("policy"), "quantizers": quantizers(q),
             "quantize_s": round(time.perf_counter() - t0, 1), "graph": "OpenVINO's read_model of the user's ONNX"}
    progress(f"INT8 variant {OWN_READING}: {'accepted' if entry['passed'] else 'refused'} by the accuracy policy "
             f"({(entry.get('policy') or {}).get('reason') or 'see metrics'}; margin {entry['margin']:+.3f})")
    return entry, q


def _has_op(model, name: str) -> bool:
    return any(op.get_friendly_name() == name for op in model.get_ops())


def _load_sets(job_like: dict[str, Any]):
    from edgeopt.calib import load_stacked
    from edgeopt.shapes import own_length_calib

    ins, outs = job_like["in_names"], job_like["out_names"]
    # issue 42: the dynamic form calibrates over the real length mix (each sample at its own lengths)
    calib, _ = own_length_calib(job_like["calib_path"], load_stacked(job_like["calib_path"], ins, "in"),
                                job_like.get("shape_form"))
    return (calib, load_stacked(job_like["validation_path"], ins, "in"),
            load_stacked(job_like["reference_path"], outs, "out"))


OPTION_KEYS = frozenset({"int8_search", "int8_tolerance", "tolerance_override", "int8_budget_s",
                         "int8_accuracy_control", "int8_max_reverts"})


def parse_options(opts: dict[str, Any]) -> dict[str, Any]:
    """The INT8 search's ``--option`` values (``OPTION_KEYS``), validated; other keys are ignored."""
    mode = str(opts.get("int8_search", "quick")).lower()
    if mode not in SEARCH_MODES:
        raise UsageError(f"int8_search={mode!r} is not known", hint="int8_search=quick or int8_search=full")
    override = parse_tolerance(opts.get("int8_tolerance") or opts.get("tolerance_override"))
    try:
        budget = float(opts.get("int8_budget_s", DEFAULT_BUDGET_S))
    except (TypeError, ValueError):
        raise UsageError(f"int8_budget_s={opts.get('int8_budget_s')!r} is not a number of seconds") from None
    if not budget > 0:
        raise UsageError(f"int8_budget_s must be > 0, got {opts.get('int8_budget_s')!r}")
    control = str(opts.get("int8_accuracy_control", True)).lower()
    if control not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
        raise UsageError(f"int8_accuracy_control={opts.get('int8_accuracy_control')!r}: expected true or false")
    reverts = opts.get("int8_max_reverts", 12)
    try:
        if isinstance(reverts, bool) or int(reverts) != float(reverts) or int(reverts) < 1:
            raise ValueError
    except (TypeError, ValueError):
        raise UsageError(f"int8_max_reverts={reverts!r}: expected a whole number >= 1") from None
    return {"mode": mode, "tolerance": override, "budget_s": budget,
            "accuracy_control": control not in ("false", "0", "no", "off"), "max_reverts": int(reverts)}


def quantize_searched(ov, model, job: BuildJob, device: str, device_on_host: bool,
                      progress: Callable[[str], None]) -> Int8Result:
    """Search NNCF settings for the fastest INT8 model that meets the bound; raise CheckFailed if none.

    ``device`` is where the candidates are judged here (the target's device, or CPU when the
    host lacks it: then the layers left in floating point are judged in f32, the IR's own numerics).
    """
    nncf = require("nncf", "openvino")
    nncf.set_log_level(logging.WARNING)  # its INFO lines would bury a crash's last words in the worker's tail
    t_start = time.perf_counter()
    parsed = parse_options(job.options)
    mode, override, budget = parsed["mode"], parsed["tolerance"], parsed["budget_s"]
    if not job.calib_path:
        raise UsageError("INT8 needs calibration data", hint="pass --calib with real samples")
    sets = {"calib_path": job.calib_path, "validation_path": job.validation_path,
            "reference_path": job.reference_path, "in_names": [t["name"] for t in job.io["inputs"]],
            "out_names": [t["name"] for t in job.io["outputs"]], "shape_form": job.shape_form}
    calib, feeds, refs = _load_sets(sets)
    target_device = str(job.target.get("profile", {}).get("device") or "CPU")

    # Which precision the layers left in floating point run in: the plugin's default unless that
    # alone breaks the bound (measured on the FP32 IR), then f32.
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
    from ..base import output_kinds

    kinds = output_kinds(job)
    judge = Judge(ov, device, config, feeds, refs, sets["out_names"], override, kinds, job.accept,
                  batch_rows(job.data_source))
    pinned: str | None = None
    fp32_default = judge.judge(model)
    if not device_on_host:
        pinned = "f32"  # judged on CPU for another device: the IR's own numerics, not CPU's bf16
    elif margin(fp32_default) < 0 and margin(judge.judge(model, {"INFERENCE_PRECISION_HINT": "f32"})) >= 0:
        pinned = "f32"
    if pinned:
        judge.config["INFERENCE_PRECISION_HINT"] = pinned
    precision_record = {"fp32_ir_at_plugin_default": summary(fp32_default), "pinned": pinned}

    untaken = untaken_if_branches(ov, model, calib)
    if untaken:  # Target.build retries with the Ifs as a Where where it can (UncalibratedBranch)
        import onnx

        from ..if_select import unselectable_ifs

        hint = "give --calib samples that take both branches of each If (for a detector: positives as well as negatives)"
        if if_as_where_refused(job.options):
            hint += (", or leave out --option if_as_where=false (both branches are then computed on every input and "
                     "selected by a Where, so NNCF calibrates both), or build fp32/fp16 for this target")
        else:
            left = unselectable_ifs(onnx.load(job.prepared_path, load_external_data=False).graph)
            hint += (", or build fp32/fp16 for this target (these Ifs cannot be computed as a Where: "
                     f"{'; '.join(left) or 'see edgeopt inspect'})")
        raise UncalibratedBranch(
            f"INT8 for {job.target['name']}: NNCF calibrates each branch of an If with the calibration samples "
            f"that take it, and {'; '.join(untaken)}: that branch cannot be calibrated, so no int8 bundle is shipped",
            hint=hint)

    calib_ds = nncf.Dataset(calib)
    scratch = Path(job.bundle_dir).parent
    try:
        ignored, mixed = mixed_scale_ignored(model, job.prepared_path, calib)
    except Exception as exc:  # noqa: BLE001 - the rule cannot be measured on this graph: said, not fatal
        ignored, mixed = [], []
        mixed_note = f"mixed-scale concat check not possible ({_first_line(exc)[:160]})"
    else:
        from ..mixed_concat import note as mixed_concat_note

        mixed_note = mixed_concat_note(mixed) + " (NNCF ignored scope: " + ", ".join(ignored) + ")" if mixed else ""
    if mixed:
        progress(f"INT8: {len(mixed)} concat(s) of differently-scaled tensors kept float (NNCF ignored scope)")
    detections = [n for n in sets["out_names"] if (kinds or {}).get(n, {}).get("kind") == "detection"]
    try:
        tail_names, tail = decode_tail_ignored(model, job.prepared_path, detections)
    except Exception as exc:  # noqa: BLE001 - the walk cannot read this graph: no rule, said
        tail_names, tail = [], []
        mixed_note = "; ".join(x for x in (mixed_note, f"detection decode-tail rule not applied ({_first_line(exc)[:160]})")
                               if x)
    if tail_names:
        from ..mixed_concat import TAIL_RULE

        ignored = list(dict.fromkeys(ignored + tail_names))
        mixed_note = "; ".join(x for x in (mixed_note, f"placement rule: {TAIL_RULE}; kept float here: {len(tail)} "
                                           f"node(s) after the last weighted op before {', '.join(detections)} (NNCF "
                                           f"ignored scope: {len(tail_names)} op(s))") if x)
        progress(f"INT8: the decoding of {', '.join(detections)} kept float ({len(tail_names)} op(s), NNCF ignored scope)")
    attention = has_attention(model)
    tried: list[dict[str, Any]] = []
    models: dict[str, Any] = {}
    last_s = 0.0
    planned = [v for v in VARIANTS if not ((v[0] == "transformer" and not attention) or (v[2] and mode != "full"))]
    if detections:
        # a detector: asymmetric activations first (SiLU/ReLU6 outputs are not centred on zero; ultralytics'
        # own OpenVINO INT8 export uses this preset) -- the first variant always runs, the budget may stop the rest
        planned.sort(key=lambda v: v[0] != "mixed")
    from ..qdq_variant import fanout

    fanned = _fan_out(ov, fanout(progress), planned, model, calib, judge, target_device, ignored, scratch, progress)
    for k, (name, settings, _) in enumerate(planned):
        if fanned is not None:  # made and judged on the cluster's workers: taken in order, as the loop would
            entry, q = fanned[k]
            tried.append(entry)
            if q is None:
                progress(f"INT8 variant {name}: failed ({entry['error'][:120]})")
                continue
            models[name] = q
            progress(f"INT8 variant {name} (made on {entry['made_on']}): "
                     f"{'accepted' if entry['passed'] else 'refused'} by the accuracy policy "
                     f"({(entry.get('policy') or {}).get('reason') or 'see metrics'}; margin {entry['margin']:+.3f})")
            if entry["passed"] and mode == "quick":
                break
            continue
        elapsed = time.perf_counter() - t_start
        if tried and elapsed + last_s * (3 if not settings["fast_bias_correction"] else 1) > budget:
            tried.append({"variant": name, "settings": settings,
                          "skipped": f"would not fit the {budget:.0f}s search budget (int8_budget_s)"})
            continue
        left = max(0.0, budget - elapsed)
        eta = (f"~{min(left, last_s * (len(planned) - k)):.0f}s left at most" if tried
               else f"<= {left:.0f}s left of the budget")
        progress(f"[variant {k + 1}/{len(planned)}, {eta}] INT8 variant {name}: NNCF quantization on "
                 f"{len(calib)} calibration samples")
        t0 = time.perf_counter()
        try:
            q = nncf.quantize(model.clone(), calib_ds,
                              **nncf_kwargs(nncf, settings, target_device, len(calib), ignored))
            q = reloaded(ov, q, scratch)  # judged (and later saved) as the bundle's IR, not in memory
            comparison = judge.judge(q)
        except Exception as exc:  # NNCF or the plugin refuses this model/variant: record it, try the next
            last_s = time.perf_counter() - t0
            tried.append({"variant": name, "settings": settings, "passed": False, "error": _first_line(exc),
                          "quantize_s": round(last_s, 1)})
            progress(f"INT8 variant {name}: failed ({tried[-1]['error'][:120]})")
            continue
        last_s = time.perf_counter() - t0
        entry = {"variant": name, "settings": settings, "passed": comparison["passed"],
                 "margin": round(margin(comparison), 4), "metrics": summary(comparison),
                 "policy": comparison.get("policy"),
                 "quantizers": quantizers(q), "quantize_s": round(last_s, 1)}
        tried.append(entry)
        models[name] = q
        progress(f"INT8 variant {name}: {'accepted' if entry['passed'] else 'refused'} by the accuracy policy "
                 f"({(entry.get('policy') or {}).get('reason') or 'see metrics'}; margin {entry['margin']:+.3f})")
        if entry["passed"] and mode == "quick":
            break

    passing = [t for t in tried if t.get("passed")]
    if not passing and models and budget - (time.perf_counter() - t_start) > last_s:
        # The graph OpenVINO itself reads from the user's ONNX (its own fusions: a CNN+LSTM read directly got
        # 9 FakeQuantize where edgeopt's IR got 7, and max |dprob| 0.025 instead of 0.45), quantized with the
        # same defaults and judged by the same rule; kept when the rule accepts it.
        entry, q = _own_reading(ov, nncf, job, calib_ds, judge, target_device, len(calib), ignored, progress)
        if entry is not None:
            tried.append(entry)
            if q is not None:
                models[entry["variant"]] = q
                passing = [t for t in tried if t.get("passed")]
    if not passing and parsed["accuracy_control"]:
        left = budget - (time.perf_counter() - t_start)
        if not models:
            tried.append({"variant": "accuracy-control",
                          "skipped": "NNCF could not quantize this model in any variant (errors above)"})
        elif left < 15:
            tried.append({"variant": "accuracy-control",
                          "skipped": f"no time left in the {budget:.0f}s search budget (int8_budget_s)"})
        else:
            entry, q = _accuracy_control(ov, model, judge, tried, sets, target_device, parsed["max_reverts"],
                                         left, job, progress, ignored)
            tried.append(entry)
            if q is not None and entry.get("passed"):
                models["accuracy-control"] = q
                passing = [entry]

    tol = tolerance_for("int8", override)
    # --allow-mismatch (edgeopt debug builds with it): the variant closest to the bound is kept, judged by the
    # host check (which fails), so the layer-by-layer comparison has an IR to read
    closest = max((t for t in tried if t["variant"] in models and "margin" in t), key=lambda t: t["margin"],
                  default=None)
    kept_closest = not passing and closest is not None and bool(job.options.get("allow_mismatch"))
    if kept_closest:
        passing = [closest]
    if not passing:
        # A crashed accuracy-control child may be transient (memory): only a search that ran is cached.
        failure = BuildFailed if any(t.get("crashed") for t in tried) else CheckFailed
        cut = any("budget" in str(t.get("skipped", "")) or "budget" in str(t.get("error", "")) for t in tried)
        extra = {"cacheable": not cut, "accuracy": True} if failure is CheckFailed else {}
        why = ((closest or {}).get("policy") or {}).get("reason")
        raise failure(
            f"INT8 for {job.target['name']}: no variant the accuracy policy accepts on {len(feeds)} validation "
            "samples" + (f" (closest, {closest['variant']}: {why})" if why else "") + ", so no int8 bundle is shipped "
            f"(search {time.perf_counter() - t_start:.0f}s):\n  " + "\n  ".join(describe(t) for t in tried)
            + f"\n  (FP32 IR at the plugin's default precision: {_figures(summary(fp32_default))})",
            hint="build fp16 or fp32 for this target, give more representative --calib data, raise "
                 "--option int8_budget_s, or (knowingly) relax the bound with --option int8_tolerance=KEY=VALUE,...",
            **extra)

    progress("INT8: timing the candidates against the FP32 IR")
    # The FP32 IR is timed as an fp32 bundle runs it (f32 pinned): the yardstick INT8 must beat.
    lat = judge.latency_ms([(models[t["variant"]], {}) for t in passing]
                           + [(model, {"INFERENCE_PRECISION_HINT": "f32"})])
    fp32_ms = lat[-1]
    for t, ms in zip(passing, lat):
        t["latency_ms"] = ms
    # Fastest wins; within 5% (noise on a shared machine) the larger margin wins.
    best_ms = min(t["latency_ms"] for t in passing)
    chosen = max((t for t in passing if t["latency_ms"] <= best_ms * 1.05), key=lambda t: t["margin"])
    record = {"search": mode, "tolerance": tol, "tried": tried, "chosen": chosen["variant"],
              "runtime_precision": precision_record, "validation_samples": len(feeds),
              "calibration_samples": len(calib), "search_s": round(time.perf_counter() - t_start, 1),
              "latency_ms_build_host": {"int8": chosen["latency_ms"], "fp32_ir_f32": fp32_ms, "device": device},
              "judged": "the serialized IR read back (what the bundle holds), with the bundle's compile config",
              "mixed_scale_concats": [mc.record() for mc in mixed], "decode_tail": tail_names}
    notes = [f"INT8 by NNCF {nncf.__version__}, variant {chosen['variant']} {chosen['settings']} chosen of "
             f"{sum('passed' in t for t in tried)} tried ({_figures(chosen['metrics'])}); "
             f"build-host latency {chosen['latency_ms']} ms vs FP32 IR {fp32_ms} ms on {device}"]
    if mixed_note:
        notes.append(mixed_note)
    from edgeopt.shapes import own_length_calib

    own_note = own_length_calib(job.calib_path, calib, job.shape_form)[1]
    if own_note:
        notes.append(own_note.replace("samples at their own lengths", "samples at their own lengths (NNCF)"))
    search_s = time.perf_counter() - t_start
    if search_s > budget + 0.5:  # no variant is started that would not fit, but none is cut mid-way either
        record["overrun_s"] = round(search_s - budget, 1)
        notes.append(f"the INT8 search ran {search_s - budget:.0f}s past its {budget:.0f}s budget (int8_budget_s): "
                     "a variant is never cut mid-way, and timing the candidates comes after the last")
        progress(f"note: {notes[-1]}")
    if pinned and device_on_host:
        notes.append("INT8 bundle pins INFERENCE_PRECISION_HINT=f32 for the layers left in floating point: the FP32 "
                     "IR at the plugin's default precision alone misses the INT8 bound "
                     f"({_figures(summary(fp32_default))})")
    warnings: list[str] = []
    if kept_closest:
        warnings.append(f"no INT8 variant met the int8 bound ({bound_text('int8', override)}); the closest, "
                        f"{chosen['variant']} ({_figures(chosen['metrics'])}), is kept because of --allow-mismatch")
    if chosen["latency_ms"] >= fp32_ms:
        warnings.append(f"INT8 was not faster than the FP32 IR on the build host ({chosen['latency_ms']} ms vs "
                        f"{fp32_ms} ms on {device}); measure on the device before choosing it")
    if job.data_source.get("kind") == "random":
        warnings.append("INT8 was calibrated and judged on RANDOM data: its accuracy on real inputs is unknown")
    return Int8Result(models[chosen["variant"]], record, notes, warnings, override,
                      pinned if device_on_host else None)


def _fan_out(ov, fan, planned: list, model, calib: list[dict[str, np.ndarray]], judge: Judge, target_device: str,
             ignored: list[str], scratch: Path, progress: Callable[[str], None]) -> list[tuple[dict[str, Any], Any]] | None:
    """Every planned NNCF variant made and judged as a Dask task at once (``make_and_judge``; a quick search then
    keeps the first that passes, in order, as it would here): [(record, the IR read back or None)]; None without
    a cluster, with fewer than two variants, or when the cluster fails (said)."""
    if fan is None or len(planned) < 2:
        return None
    d = Path(tempfile.mkdtemp(prefix="ov-fan-", dir=scratch))
    try:
        ov.save_model(model, str(d / "model.xml"), compress_to_fp16=False)
        ir = ((d / "model.xml").read_bytes(), (d / "model.bin").read_bytes())
    finally:
        shutil.rmtree(d, ignore_errors=True)
    progress(f"INT8: {len(planned)} NNCF variant(s) made and judged on the cluster's workers")
    try:
        got = fan.map(make_and_judge, ("openvino", id(judge)), lambda: {
            "ir": ir, "calib": calib, "feeds": judge.feeds, "refs": judge.refs, "out_names": judge.out_names,
            "override": judge.override, "kinds": judge.kinds, "accept": judge.accept, "rows": judge.rows,
            "device": judge.device, "config": judge.config, "target_device": target_device, "ignored": ignored},
            [{"name": name, "settings": settings} for name, settings, _ in planned])
    except Exception as exc:  # noqa: BLE001 - the cluster went away: the variants run here, as without it
        progress(f"INT8: variants made here: the cluster failed ({_first_line(exc)[:160]})")
        return None
    out = []
    for (name, settings, _), res in zip(planned, got):
        if res.get("error"):
            out.append(({"variant": name, "settings": settings, "passed": False, "error": res["error"],
                         "quantize_s": res.get("quantize_s"), "made_on": res.get("worker")}, None))
            continue
        d = Path(tempfile.mkdtemp(prefix="ov-variant-", dir=scratch))
        try:
            (d / "model.xml").write_bytes(res["ir"][0])
            (d / "model.bin").write_bytes(res["ir"][1])
            q = ov.Core().read_model(str(d / "model.xml"), config={"ENABLE_MMAP": False})
        finally:
            shutil.rmtree(d, ignore_errors=True)
        comparison = res["comparison"]
        out.append(({"variant": name, "settings": settings, "passed": comparison["passed"],
                     "margin": round(margin(comparison), 4), "metrics": summary(comparison),
                     "policy": comparison.get("policy"), "quantizers": quantizers(q),
                     "quantize_s": res.get("quantize_s"), "made_on": res.get("worker")}, q))
    return out


def make_and_judge(shared: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """On a Dask worker: one NNCF variant of the shared FP32 IR, saved and read back as the bundle holds it
    (``reloaded``) and judged by the search's ``Judge`` with the bundle's compile config, untimed -> ``{"ir": (xml,
    bin), "comparison", "quantize_s", "worker"}`` or ``{"error", "worker"}``."""
    import openvino as ov

    from ..qdq_variant import worker_name

    nncf = require("nncf", "openvino")
    nncf.set_log_level(logging.WARNING)
    where = worker_name()
    d = Path(tempfile.mkdtemp(prefix="edgeopt-ov-variant-"))
    t0 = time.perf_counter()
    try:
        (d / "fp32.xml").write_bytes(shared["ir"][0])
        (d / "fp32.bin").write_bytes(shared["ir"][1])
        model = ov.Core().read_model(str(d / "fp32.xml"))
        try:
            q = nncf.quantize(model, nncf.Dataset(shared["calib"]),
                              **nncf_kwargs(nncf, spec["settings"], shared["target_device"], len(shared["calib"]),
                                            shared["ignored"]))
            ov.save_model(q, str(d / "q.xml"), compress_to_fp16=False)
            q = ov.Core().read_model(str(d / "q.xml"), config={"ENABLE_MMAP": False})
            judge = Judge(ov, shared["device"], shared["config"], shared["feeds"], shared["refs"], shared["out_names"],
                          shared["override"], shared["kinds"], shared["accept"], shared["rows"])
            comparison = judge.judge(q)
        except Exception as exc:  # noqa: BLE001 - NNCF or the plugin refuses this variant: recorded, the next tried
            return {"error": _first_line(exc), "worker": where, "quantize_s": round(time.perf_counter() - t0, 1)}
        return {"ir": ((d / "q.xml").read_bytes(), (d / "q.bin").read_bytes()), "comparison": comparison,
                "quantize_s": round(time.perf_counter() - t0, 1), "worker": where}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _accuracy_control(ov, model, judge: Judge, tried, sets, target_device, iterations: int, left_s: float,
                      job: BuildJob, progress, ignored: list[str] | None = None) -> tuple[dict[str, Any], Any]:
    """NNCF's accuracy-controlled quantization from the best variant's settings, in a child process
    killed after ``left_s`` seconds; returns (record, model or None)."""
    ran = [t for t in tried if "margin" in t]
    base = max(ran, key=lambda t: t["margin"]) if ran else {"variant": VARIANTS[0][0], "settings": VARIANTS[0][1]}
    # NNCF measures the original model with f32 inference and stops once the drop is within
    # max_drop; a quantized margin >= 0 is what passes, so the allowed drop is the FP32 margin,
    # less a little headroom for the final check's precision.
    fp32_margin = margin(judge.judge(model, {"INFERENCE_PRECISION_HINT": "f32"}))
    entry: dict[str, Any] = {"variant": "accuracy-control",
                             "settings": {**base["settings"], "max_reverts": iterations,
                                          "max_drop": round(max(fp32_margin - 0.02, 1e-3), 4)}}
    progress(f"INT8 accuracy control from {base['variant']}: reverting the most sensitive layers "
             f"(<= {iterations} steps, <= {left_s:.0f}s)")
    work = Path(tempfile.mkdtemp(prefix="ov-ac-", dir=Path(job.bundle_dir).parent))
    t0 = time.perf_counter()
    try:
        ov.save_model(model, str(work / "fp32.xml"), compress_to_fp16=False)
        request = {**sets, "fp32_xml": str(work / "fp32.xml"), "out_xml": str(work / "int8.xml"),
                   "device": judge.device, "config": judge.config, "override": judge.override,
                   "kinds": judge.kinds, "accept": judge.accept, "rows": judge.rows,
                   "settings": entry["settings"], "target_device": target_device, "ignored": list(ignored or [])}
        (work / "request.json").write_text(json.dumps(request))
        try:
            proc = subprocess.run([sys.executable, "-m", "edgeopt.targets.openvino.int8", str(work / "request.json")],
                                  capture_output=True, text=True, timeout=left_s, env=os.environ.copy())
        except subprocess.TimeoutExpired:
            entry.update({"passed": False, "error": f"stopped at the search budget after {left_s:.0f}s "
                                                    "(raise --option int8_budget_s to let it finish)"})
            return entry, None
        reply_path = work / "reply.json"
        reply = json.loads(reply_path.read_text()) if reply_path.is_file() else None
        if proc.returncode != 0 or not reply or not reply.get("ok"):
            why = (reply or {}).get("error") or next(
                (ln for ln in reversed(proc.stderr.strip().splitlines()) if ln.strip()), f"exit code {proc.returncode}")
            entry.update({"passed": False, "error": why[:300], "crashed": proc.returncode != 0})
            return entry, None
        # Read into memory (no mmap of model.bin): the folder is removed below.
        q = ov.Core().read_model(str(work / "int8.xml"), config={"ENABLE_MMAP": False})
        comparison = judge.judge(q)
        kept = quantizers(q)
        entry.update({"passed": comparison["passed"] and kept > 0, "margin": round(margin(comparison), 4),
                      "metrics": summary(comparison), "quantizers": kept, "quantizers_full": base.get("quantizers"),
                      "policy": comparison.get("policy")})
        if comparison["passed"] and not kept:  # every layer reverted: that is the FP32 model, not INT8
            entry["error"] = "the bound was met only by reverting every quantizer: nothing is left in INT8"
        progress(f"INT8 accuracy control: {'accepted' if entry['passed'] else 'refused'} by the accuracy policy "
                 f"({(entry.get('policy') or {}).get('reason') or 'see metrics'}; margin {entry['margin']:+.3f}), {entry['quantizers']} of {entry['quantizers_full']} quantizers kept")
        return entry, q
    finally:
        entry["quantize_s"] = round(time.perf_counter() - t0, 1)
        shutil.rmtree(work, ignore_errors=True)


def _first_line(exc: BaseException) -> str:
    """The informative line of a native exception (OpenVINO's start with file/line noise)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    useful = [ln for ln in lines if not ln.startswith(("Exception from", "Check '"))]
    return f"{type(exc).__name__}: " + ((useful or lines or [""])[-1])[:240]


def describe(t: dict[str, Any]) -> str:
    """One line per variant for the failure message."""
    if "skipped" in t:
        return f"{t['variant']}: not tried ({t['skipped']})"
    if "error" in t:
        return f"{t['variant']}: failed ({t['error']})"
    return f"{t['variant']} {t['settings']}: {_figures(t['metrics'], reasons=True)}"


def _figures(metrics: dict[str, Any], reasons: bool = False) -> str:
    return "; ".join(f"{n}: " + ", ".join(f"{k} {v}" for k, v in d.items() if k != "fails")
                     + (" -- " + ", ".join(d["fails"]) if reasons and d.get("fails") else "")
                     for n, d in metrics.items())


def _child(request_path: str) -> int:
    """``python -m edgeopt.targets.openvino.int8 REQUEST.json``: accuracy control, out of process."""
    import nncf
    import openvino as ov
    from nncf.quantization.advanced_parameters import AdvancedAccuracyRestorerParameters

    req = json.loads(Path(request_path).read_text())
    reply_path = Path(request_path).with_name("reply.json")
    nncf.set_log_level(logging.WARNING)
    try:
        calib, feeds, refs = _load_sets(req)
        judge = Judge(ov, req["device"], req["config"], feeds, refs, req["out_names"], req["override"],
                      req.get("kinds"), req.get("accept"), req.get("rows"))
        settings = req["settings"]
        model = ov.Core().read_model(req["fp32_xml"])
        q = nncf.quantize_with_accuracy_control(
            model, nncf.Dataset(calib), nncf.Dataset(list(range(len(feeds)))), judge.validation_fn,
            max_drop=settings["max_drop"], drop_type=nncf.DropType.ABSOLUTE,
            **nncf_kwargs(nncf, settings, req["target_device"], len(calib), req.get("ignored")),
            advanced_accuracy_restorer_parameters=AdvancedAccuracyRestorerParameters(
                max_num_iterations=int(settings["max_reverts"]), ranking_subset_size=len(feeds),
                num_ranking_workers=1))
        ov.save_model(q, req["out_xml"], compress_to_fp16=False)
        reply = {"ok": True}
    except Exception as exc:  # NNCF gives up (nothing left to revert...): a failed variant, not a crash
        reply = {"ok": False, "error": _first_line(exc)}
    reply_path.write_text(json.dumps(reply))
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1]))
