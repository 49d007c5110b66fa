"""The common interface of every backend.  The base class owns the verbs.

``Target.build(job)`` validates the job, times the conversion, runs the host check, hashes every
file and writes the manifest; a backend implements ``_build(job) -> BuildOutput`` (and, where the
ops it takes are known, ``supported_ops``).  Heavy imports happen inside ``_build`` through
``require()``, which turns a missing package into "install edgeopt[extra]".
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeopt.errors import BuildFailed, MissingDependency, UsageError

MANIFEST_SCHEMA = 1
CHECK_FAILED_MARK = "check_failed.json"  # left in the bundle dir when _build raises CheckFailed
# Build options every backend takes (read by the pipeline and by ``Target.build``).
COMMON_OPTIONS = frozenset({"seed", "split", "check_timeout", "output_kind", "if_as_where", "shape_form"})
SHAPE_FORMS = ("auto", "dynamic", "static", "buckets")  # --option shape_form: the form a variable axis is built in


def shape_form_asked(options: dict[str, Any]) -> str:
    """``--option shape_form`` (auto | dynamic | static | buckets), or UsageError (exit 2) before anything is
    built."""
    value = str(options.get("shape_form", "auto")).lower()
    if value not in SHAPE_FORMS:
        raise UsageError(f"--option shape_form={options.get('shape_form')!r}: expected one of {', '.join(SHAPE_FORMS)}",
                         hint="auto: every form the target offers, checked at each sample's own length, the fastest "
                         "that passes kept")
    return value


class CheckFailed(BuildFailed):
    """The build ran to the end, but no artifact met its check (the INT8 search found no passing
    variant, a structural or prepared-model check failed).  Unlike a crash or a timeout this is the
    outcome for these inputs: the pipeline caches it, and ``--force`` retries -- except when a time
    budget cut the search short (``cacheable=False``): on a less loaded machine the same inputs may
    pass, so the refusal is reported (and ``auto`` falls back) but not remembered."""

    def __init__(self, message: str, hint: str | None = None, *, cacheable: bool = True,
                 accuracy: bool = False) -> None:
        super().__init__(message, hint)
        self.cacheable = cacheable
        self.accuracy = accuracy  # a refusal on accuracy: Target.build ends its hint with `edgeopt debug ...`


# Job options that are the pipeline's, not the user's: not repeated in a suggested command line.
_INTERNAL_OPTIONS = frozenset({"allow_mismatch", "check_timeout"})


def debug_command(model_path: str, target: str, precision: str, io: dict[str, Any] | None = None,
                  data_source: dict[str, Any] | None = None, options: dict[str, Any] | None = None) -> str:
    """The ``edgeopt debug`` command line that localises an accuracy refusal of this build: the same
    model, target, precision, the shapes of inputs the model leaves dynamic, the user's --calib and
    --option values; ``--force`` because the refusal is remembered."""
    import shlex

    parts = ["edgeopt", "debug", shlex.quote(str(model_path)), "--target", target, "--precision", precision]
    try:
        import onnx

        graph = onnx.load(str(model_path), load_external_data=False).graph
        dynamic = {i.name for i in graph.input
                   if any(not d.HasField("dim_value") or d.dim_value <= 0 for d in i.type.tensor_type.shape.dim)}
    except Exception:  # noqa: BLE001 - unreadable here: give every shape
        dynamic = None
    for t in (io or {}).get("inputs", []):
        if (dynamic is None or t.get("name") in dynamic) and t.get("shape"):
            parts += ["--shape", shlex.quote(f"{t['name']}:" + "x".join(str(d) for d in t["shape"]))]
    if (data_source or {}).get("path"):
        parts += ["--calib", shlex.quote(str(data_source["path"]))]
    for k, v in sorted((options or {}).items()):
        if k not in _INTERNAL_OPTIONS and isinstance(v, (str, int, float, bool)):
            parts += ["--option", shlex.quote(f"{k}={str(v).lower() if isinstance(v, bool) else v}")]
    return " ".join(parts + ["--force"])


def with_debug_hint(hint: str | None, command: str) -> str:
    """``hint`` ending with the ``edgeopt debug`` command that finds the first diverging node."""
    return (hint + "; " if hint else "") + f"to see which node breaks it: {command}"


class UncalibratedBranch(CheckFailed):
    """INT8 calibration cannot reach a branch of an If: no calibration sample takes it (NNCF calibrates
    each branch with the samples that take it).  ``Target.build`` retries once with those Ifs as both
    branches and a Where (every sample then reaches both), unless ``--option if_as_where=false``."""


def require(module: str, extra: str):
    """Import a heavy module or raise a clear 'install edgeopt[extra]' error."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(f"{module} is needed for this target but is not installed ({exc})",
                                hint=f"pip install 'edgeopt[{extra}]'") from None


def parse_tolerance(value: Any) -> dict[str, float | None] | None:
    """``--option int8_tolerance=...`` -> bound overrides for the INT8 check (None when not given).

    Accepts a dict, JSON text, or ``"cosine_min=0.99,top1_min=0.95"`` (``,``, ``;`` or spaces
    between items). Keys are the bounds of ``edgeopt_agent.compare.TOLERANCES``; ``off``/``none``
    switches a bound off. The override is written to the manifest, so the device judges by it too.
    Shared by every backend with an INT8 option (cpu, intel-*, tflite).
    """
    import json
    import math

    from edgeopt.errors import UsageError
    from edgeopt_agent.compare import TOLERANCES

    keys = sorted(TOLERANCES["int8"])
    hint = f"e.g. --option int8_tolerance=cosine_min=0.99,top1_min=0.95 (keys: {', '.join(keys)})"
    if value is None or (isinstance(value, (str, dict)) and not value):
        return None
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, str) and value.strip().startswith("{"):
        try:
            items = list(json.loads(value).items())
        except (json.JSONDecodeError, AttributeError) as exc:
            raise UsageError(f"int8_tolerance is not a valid JSON object: {exc}", hint=hint) from None
    else:
        items = []
        for part in str(value).replace(";", ",").replace(" ", ",").split(","):
            if not part:
                continue
            k, sep, v = part.partition("=")
            if not sep:
                raise UsageError(f"bad int8_tolerance item {part!r}", hint=hint)
            items.append((k.strip(), v.strip()))
    out: dict[str, float | None] = {}
    for k, v in items:
        if k not in TOLERANCES["int8"]:
            raise UsageError(f"unknown int8_tolerance key {k!r}", hint=hint)
        if v is None or str(v).lower() in ("none", "off"):
            out[k] = None
            continue
        try:
            out[k] = float(v)
        except (TypeError, ValueError):
            raise UsageError(f"int8_tolerance {k}={v!r} is not a number", hint=hint) from None
        if not math.isfinite(out[k]) or out[k] < 0:
            raise UsageError(f"int8_tolerance {k} must be a finite number >= 0, got {v!r}", hint=hint)
    return out or None


def package_versions(names: list[str]) -> dict[str, str]:
    """Installed versions from metadata (no import), ``"missing"`` for absent ones."""
    out = {}
    for n in names:
        try:
            out[n] = importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            out[n] = "missing"
    return out


@dataclass
class BuildJob:
    """Everything one (target, precision) build needs. Plain data: it crosses a process boundary."""

    model_name: str
    model_path: str  # the user's model
    model_sha256: str
    prepared_path: str  # static-shape FP32 model (shapes fixed, inferred)
    target: dict[str, Any]  # TargetSpec.as_dict()
    precision: str
    bundle_dir: str  # write everything here (a temp dir renamed by the caller when complete)
    io: dict[str, list[dict[str, Any]]]  # {"inputs": [...], "outputs": [...]} ONNX layout, static shapes
    calib_path: str | None  # npz in0.. stacked calibration samples
    validation_path: str  # npz in0.. stacked validation samples
    reference_path: str  # npz out0.. FP32 reference outputs on the validation samples
    data_source: dict[str, Any]  # {"kind": "images"|"npz"|"random", ...}
    options: dict[str, Any] = field(default_factory=dict)
    cache_key: str = ""
    accept: dict[str, Any] | None = None  # the accuracy policy's gate file (``--accept``), parsed; None: defaults
    carried_kinds: dict[str, Any] | None = None  # build --batch: the output kinds of the batch-1 build
    # issue 42: {input: [{"axis", "range"|"buckets"}]} of a --shape with a range/buckets; None: all static
    variable: dict[str, Any] | None = None
    shape_form: str | None = None  # the form this build makes: "static" (padded to the top) | "dynamic"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BuildJob:
        return cls(**d)


@dataclass
class BuildOutput:
    """What a backend's ``_build`` returns."""

    runtime: dict[str, Any]  # {"name": runner name, "artifact": relpath, "options": {...}}
    options: dict[str, Any] = field(default_factory=dict)  # settings chosen (recorded in the manifest)
    io: dict[str, list[dict[str, Any]]] | None = None  # IO spec as the artifact sees it (layouts...)
    check: str = "numeric"  # numeric | structural | device
    structural: dict[str, Any] | None = None  # result of a structural check, when check == structural
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    extra_manifest: dict[str, Any] = field(default_factory=dict)
    check_options: dict[str, Any] = field(default_factory=dict)  # runner options for the host check only


class Target:
    """One backend.  Subclasses set the class attributes and implement ``_build``."""

    backend = "base"
    extra = ""  # the pip extra that brings the backend's packages
    packages: list[str] = []  # distributions whose versions go into the manifest and cache key
    check_kind = "numeric"  # what the host check can do: numeric | structural | device
    # The converter has no If: every If it can be is converted as both branches and a Where
    # (targets.if_select); for the others ``--option if_as_where=true`` asks for it.
    ifs_as_where = False
    # The backend runs the FP16 range analysis itself (tensorrt: keeps those layers FP32 when strongly
    # typed, else warns; coreml: keeps them FP32); for the others ``build`` warns about them.
    fp16_range_own = False
    # The forms a variable axis can take here (issue 42), in the order preferred when both pass and time
    # alike: "dynamic" (the runtime's own variable dims), "static" (one shape, the top, inputs padded) and
    # "buckets" (one static file per bucket, targets.buckets: tried by auto only when no dynamic form passed and
    # every variable axis has buckets).
    shape_forms: tuple[str, ...] = ("static",)
    # True: the dynamic form is converted from the model with its variable axes free (ONNX Runtime, OpenVINO);
    # False: the one static conversion is also the dynamic form, resized at load to each request (LiteRT's
    # resize_tensor_input): converted once, checked in both forms
    dynamic_from_free = True
    # runtime options the dynamic form is checked again with when it fails as built (tflite: no XNNPACK, whose
    # delegate cannot always re-plan a resized graph); None: no second try
    dynamic_retry_runtime: dict[str, Any] | None = None

    def _build_ifs(self, job: BuildJob, progress: Callable[[str], None]) -> tuple[BuildOutput, list[str], bool]:
        """``(output, Ifs selected, retried)``: ``_build`` on the job -- its Ifs as both branches and a
        Where when the backend has no If or the user asked -- and, when INT8 calibration cannot reach an
        If branch (``UncalibratedBranch``), once more with the Ifs selected, unless the user said
        ``if_as_where=false`` or no If can be."""
        with ifs_as_where(job, self.ifs_as_where) as (this, selected):
            try:
                return self._build(this, progress), selected, False
            except UncalibratedBranch:
                if (selected or if_as_where_refused(job.options)
                        or not selectable_ifs_of(job.prepared_path)):
                    raise
        progress("int8: an If branch no calibration sample takes: building again with the If as both "
                 "branches and a Where")
        with ifs_as_where(job, True) as (this, selected):
            return self._build(this, progress), selected, True

    # --- options ------------------------------------------------------------------------
    def known_options(self) -> frozenset[str] | None:
        """The ``--option`` keys this backend reads; None: it does not say (then the pipeline
        refuses no key as unknown)."""
        return None

    def check_options(self, options: dict[str, Any], precision: str, spec: dict[str, Any]) -> None:
        """Raise UsageError for a bad value of one of this backend's options, before any build starts.

        ``options`` are build-wide (every ``--option`` reaches every target): ignore keys that are
        not this backend's.  ``spec`` is ``TargetSpec.as_dict()``.  The default checks nothing.
        """

    # --- capabilities -------------------------------------------------------------------
    def supported_ops(self, spec: dict[str, Any]) -> set[str] | None:
        """ONNX op types (default domain) this backend takes; None when it has no list."""
        return None

    def unsupported_why(self, spec: dict[str, Any], nodes: list[tuple[str, str]]) -> str | None:
        """What refuses ``nodes`` (from ``unsupported_nodes``) on this target, for messages -- e.g. the
        runtime version whose support table was checked, and where else those ops are taken; None: say nothing."""
        return None

    def unsupported_nodes(self, info, spec: dict[str, Any]) -> list[tuple[str, str]]:
        """Every (op_type, node name) of the model the backend cannot take; ops of a custom domain
        (no model-local function) for every backend, as the FP32 reference cannot run them; and the
        certain attribute-level refusals of ``targets.support_rules`` (``"Op (feature: why; converter)"``)."""
        from edgeopt.model import foreign_nodes

        foreign = foreign_nodes(info) if hasattr(info, "functions") else []
        ops = self.supported_ops(spec)
        if ops is None:
            return foreign + self.attribute_refusals(info, [n for _, n in foreign])
        seen = {name for _, name in foreign}
        if self.ifs_as_where and "If" not in ops:  # the build takes these Ifs; their branches' ops are judged
            seen |= set(selectable_ifs_of(info.path))
        bad = foreign + [(op if not dom else f"{dom}::{op}", name) for dom, op, name in info.nodes
                         if name not in seen and ((dom not in ("", "ai.onnx")) or op not in ops)]
        return bad + self.attribute_refusals(info, [n for _, n in bad])

    def attribute_refusals(self, info, already: list[str] | None = None) -> list[tuple[str, str]]:
        """The certain refusals of this backend's attribute-level table (``targets.support_rules``):
        cubic Resize on mobile, a batch-first LSTM anywhere (no ONNX Runtime reference), ...; nodes in
        ``already`` (refused by op type) are not listed twice."""
        from .support_rules import refusals, rules_off

        if rules_off():
            return []
        skip = set(already or [])
        return [(label, n) for label, n in refusals(info.path, self.backend) if n not in skip]

    def probable_refusals(self, info, spec: dict[str, Any]) -> list[dict[str, str]]:
        """"Probably not" (``{"op", "node", "why"}``): nodes this backend's converter failed on in the
        conformance run (bench/bench_conformance.py) in a shape that only a conversion can confirm for
        this model. ``inspect`` shows them as a third state, never as a plain yes."""
        from .support_rules import doubts

        refused = {n for _, n in self.unsupported_nodes(info, spec)}
        return [d for d in doubts(info.path, self.backend) if d["node"] not in refused]

    def toolchain(self) -> dict[str, str]:
        # "check": the host check's rules (edgeopt_agent.compare) are part of what a cached bundle or a
        # cached refusal was judged by. rev 1: per-slice check, YOLO heads, regression/per-position kinds,
        # kinds inferred on the batch-1 view
        return {**package_versions(["onnx", "onnxruntime", "numpy", *self.packages]),
                "check": "per-slice, output kinds (rev 1)"}

    def available(self) -> str | None:
        """None when the backend can build here, else why not."""
        missing = [p for p, v in package_versions(self.packages).items() if v == "missing"]
        return f"missing {', '.join(missing)} (pip install 'edgeopt[{self.extra}]')" if missing else None

    # --- the verb -----------------------------------------------------------------------
    def _build(self, job: BuildJob, progress: Callable[[str], None]) -> BuildOutput:
        raise NotImplementedError

    def build(self, job: BuildJob, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
        """Convert, check, hash, write ``manifest.json``; return the manifest."""
        bundle = Path(job.bundle_dir)
        (bundle / "validation").mkdir(parents=True, exist_ok=True)
        _link_or_copy(job.validation_path, bundle / "validation" / "inputs.npz")
        _link_or_copy(job.reference_path, bundle / "validation" / "reference.npz")
        quant = model_quantization(job.model_path)
        t0 = time.perf_counter()
        try:
            if quant and job.precision == "int8":
                raise CheckFailed(f"the model is already quantized ({_quant_summary(quant)}): a second INT8 pass is "
                                  "refused", hint="build it at fp32 (--precision fp32): its artifacts are judged at "
                                  "the INT8 bound its own quantization implies")
            if job.precision == "int8" and not has_weighted_ops(job.prepared_path or job.model_path):
                raise CheckFailed("nothing to quantize: the model has no weighted op (" + ", ".join(sorted(WEIGHTED_OPS))
                                  + "), so an 'int8' artifact would be the FP32 model under another name",
                                  hint="build it at fp32 (--precision fp32; auto falls back to it by itself)")
            if job.variable:
                out, selected, uncalibrated = self._build_forms(job, progress)
            else:
                out, selected, uncalibrated = self._build_ifs(job, progress)
        except CheckFailed as exc:  # tells the pipeline this outcome may be cached (a crash may not)
            if exc.accuracy:
                exc.hint = with_debug_hint(exc.hint, self.debug_command(job))
            (bundle / CHECK_FAILED_MARK).write_text(json.dumps({"error": str(exc), "cacheable": exc.cacheable}) + "\n")
            raise
        if uncalibrated:
            out.warnings.append(f"If node(s) {', '.join(selected)} converted as both branches and a Where: no "
                                "calibration sample takes one of their branches, which INT8 calibration could "
                                "then not reach; the values are the same, but the branch not taken is computed "
                                "on every input (--calib samples that take both branches keep the If; "
                                "--option if_as_where=false refuses instead)")
        elif selected:
            out.notes.append(f"If node(s) {', '.join(selected)} converted as both branches and a Where "
                             + ("(this converter has no If" if self.ifs_as_where else "(--option if_as_where")
                             + "; the values are the same, the branch not taken is computed too)")
        build_s = time.perf_counter() - t0
        if job.precision == "fp16" and not self.fp16_range_own:
            out.warnings.extend(fp16_overflow_warnings(job, lambda: self.debug_command(job)))
        manifest = self._manifest(job, out, build_s)
        write_manifest(bundle, manifest)  # the check reads it
        if out.check == "numeric":
            progress("host check")
            manifest["host_check"] = host_check(bundle, job.options.get("check_timeout", 600), out.check_options)
        elif out.check == "structural":
            manifest["host_check"] = {"kind": "structural", **(out.structural or {}),
                                      "numeric": "on device"}
        else:
            manifest["host_check"] = {"kind": "device", "passed": None,
                                      "note": "this host cannot run the artifact; the check runs on the device"}
        write_manifest(bundle, manifest)
        return manifest

    # --- variable-length inputs (issue 42) ------------------------------------------------------------
    def _build_forms(self, job: BuildJob, progress: Callable[[str], None]) -> tuple[BuildOutput, list[str], bool]:
        """Each form this backend offers (``shape_forms``; ``--option shape_form=static|dynamic`` picks one),
        built in a folder of its own and checked at every validation sample's own length against FP32 run
        unpadded; the fastest form that passes is kept (its files moved into the bundle) and the manifest's
        ``shape_form`` says which, why, and what each form measured. A static form whose padding changes the
        answers is refused with that reason; when a dynamic form passes instead, it is built and said."""
        import dataclasses
        import shutil

        bundle = Path(job.bundle_dir)
        free = varlen_data(job, bundle)
        asked = shape_form_asked(job.options)
        forms = list(self.shape_forms) if asked == "auto" else [asked]
        if asked != "auto" and asked not in self.shape_forms:
            raise BuildFailed(f"--option shape_form={asked}: {job.target['name']} builds a variable axis only as "
                              + " or ".join(self.shape_forms))
        tried: list[dict[str, Any]] = []
        built: dict[str, tuple[BuildOutput, list[str], bool, Path]] = {}
        last_exc: CheckFailed | None = None
        all_buckets = all("buckets" in v for vs in (job.variable or {}).values() for v in vs)
        for form in forms:
            if form == "buckets" and asked == "auto" and (not all_buckets or any(
                    t["form"] == "dynamic" and t["passed"] for t in tried)):
                continue  # a file per bucket costs a conversion each: only where one file cannot take them all
            sub = bundle.parent / f"{bundle.name}.form-{form}"
            shutil.rmtree(sub, ignore_errors=True)
            shutil.copytree(bundle, sub)  # the validation files
            this = dataclasses.replace(job, bundle_dir=str(sub), shape_form=form,
                                       prepared_path=str(free) if form == "dynamic" and self.dynamic_from_free
                                       else job.prepared_path)
            t0 = time.perf_counter()
            twin = next(iter(built.values()), None) if not self.dynamic_from_free and form != "buckets" else None
            if twin is not None:  # the same conversion in the other form: its files, not a second conversion
                progress(f"shape form {form}: the same artifact, {'resized at load' if form == 'dynamic' else 'padded'}")
                out, selected, uncal = dataclasses.replace(twin[0], extra_manifest=dict(twin[0].extra_manifest),
                                                           notes=list(twin[0].notes)), twin[1], twin[2]
                for item in twin[3].iterdir():
                    if item.name not in ("manifest.json", "validation", CHECK_FAILED_MARK):
                        (shutil.copytree if item.is_dir() else shutil.copy2)(item, sub / item.name)
            else:
                progress(f"shape form {form}: " + ("a static file per bucket" if form == "buckets" else "building"))
                try:
                    if form == "buckets":  # targets.buckets: each bucket an ordinary static build of its own
                        from edgeopt.targets.buckets import build_per_bucket

                        out, selected, uncal = build_per_bucket(self, this, progress)
                    else:
                        out, selected, uncal = self._build_ifs(this, progress)
                except BuildFailed as exc:  # CheckFailed, or a converter that cannot take this form
                    if not isinstance(exc, CheckFailed) and form == forms[-1] and not built:
                        raise
                    tried.append({"form": form, "passed": False, "error": str(exc).splitlines()[0][:300]})
                    last_exc = exc if isinstance(exc, CheckFailed) else CheckFailed(str(exc), exc.hint)
                    continue
            out.extra_manifest["shape_form"] = {"form": form}
            if out.io:  # the artifact's own IO spec (layouts): the variable axes (ONNX layout) go with it
                for spec in out.io["inputs"]:
                    given = next((s for s in job.io["inputs"] if s["name"] == spec["name"]), {})
                    if given.get("variable"):
                        spec["variable"] = given["variable"]
            manifest = self._manifest(this, out, time.perf_counter() - t0)
            write_manifest(sub, manifest)
            progress(f"shape form {form}: checking at each sample's own length")
            check = host_check(sub, job.options.get("check_timeout", 600), out.check_options) \
                if out.check == "numeric" else {"passed": None, "summary": f"{out.check} check"}
            retry_error = None
            if check.get("passed") is False and form == "dynamic" and self.dynamic_retry_runtime:
                first = (check.get("summary") or check.get("error") or "failed").splitlines()[0]
                kept = out.runtime
                out.runtime = {**kept, "options": {**(kept.get("options") or {}), **self.dynamic_retry_runtime}}
                manifest["runtime"] = out.runtime
                write_manifest(sub, manifest)
                progress(f"shape form {form}: checking again with runtime options {self.dynamic_retry_runtime} "
                         f"({first[:120]})")
                again = host_check(sub, job.options.get("check_timeout", 600),
                                   {**out.check_options, **self.dynamic_retry_runtime})
                if again.get("passed"):
                    check = again
                    out.check_options = {**out.check_options, **self.dynamic_retry_runtime}
                    out.notes.append(f"resized at load with runtime options {self.dynamic_retry_runtime}: with the "
                                     f"defaults the check failed ({first[:200]})")
                else:
                    retry_error = (again.get("summary") or again.get("error") or "failed").splitlines()[0][:300]
                    out.runtime = kept
                    manifest["runtime"] = kept
                    write_manifest(sub, manifest)
            n = max(1, len(check.get("per_length") or []) or 1)
            tried.append({"form": form, "passed": check.get("passed"), "summary": check.get("summary", ""),
                          "error": check.get("error"),
                          "ms_per_sample": round(1e3 * check["warm_validation_s"] / n, 3)
                          if check.get("warm_validation_s") else None,
                          "first_pass_ms_per_sample": round(1e3 * check["validation_s"] / n, 3)
                          if check.get("validation_s") else None, "per_length": check.get("per_length"),
                          **({"retried_with": self.dynamic_retry_runtime, "retry_error": retry_error}
                             if retry_error else {})})
            built[form] = (out, selected, uncal, sub)
        if not built:
            assert last_exc is not None
            raise last_exc
        ok = [t for t in tried if t["passed"] and t["form"] in built]
        if ok:
            order = {f: i for i, f in enumerate(forms)}
            # the fastest that passes; within 10% of the preferred one, the preferred (no padding cost/risk)
            best = min(ok, key=lambda t: (t["ms_per_sample"] or 0, order[t["form"]]))
            first = min(ok, key=lambda t: order[t["form"]])
            if first is not best and (first["ms_per_sample"] or 0) <= 1.1 * (best["ms_per_sample"] or 0):
                best = first
        else:
            if any(t["passed"] is False for t in tried) and not job.options.get("allow_mismatch"):
                for form in built:
                    shutil.rmtree(built[form][3], ignore_errors=True)
                how = {"static": "padded to the top", "dynamic": "each request at its own length or bucket",
               "buckets": "a static file per bucket"}
                raise CheckFailed(
                    "no form matches FP32 at each sample's own length: " + "; ".join(
                        f"{t['form']} ({how.get(t['form'], t['form'])}): "
                        + ("padding changes the answers: " if t["form"] == "static" and t.get("summary") else "")
                        + (t.get("summary") or t.get("error") or "failed") for t in tried),
                    hint=("the model's answers move with the padding even at its buckets: finer buckets, or "
                          "--allow-mismatch to keep the closest form" if all_buckets and "buckets" in forms else
                          "declare buckets (--shape NAME:..x16|32|64) for a form per bucket, or --allow-mismatch to "
                          "keep the closest form"), accuracy=True)
            best = next(t for t in tried if t["form"] in built)
        chosen = best["form"]
        out, selected, uncal, sub = built[chosen]
        for item in sub.iterdir():
            if item.name in ("manifest.json", "validation", CHECK_FAILED_MARK):
                continue
            dst = bundle / item.name
            if dst.exists():
                shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
            shutil.move(str(item), str(dst))
        for form in built:
            shutil.rmtree(built[form][3], ignore_errors=True)
        refused = [t for t in tried if t["passed"] is False]
        if not ok and not refused:
            reason = "the one form this target builds (its numeric check runs on the device)"
        elif not ok:
            reason = "no form passed its check at each sample's own length"
        elif chosen in ("dynamic", "buckets") and any(t["form"] == "static" for t in refused):
            reason = "the static (padded) form was refused: padding changes the answers"
        elif len(ok) > 1:
            reason = (f"fastest passing form at steady state ({best['form']} {best['ms_per_sample']} ms/sample vs "
                      + ", ".join(f"{t['form']} {t['ms_per_sample']}" for t in ok if t is not best) + ")")
        else:
            reason = "the only form tried" if len(tried) == 1 else "the only form that passed"
        out.extra_manifest["shape_form"] = {
            "form": chosen, "reason": reason,
            "runs_at": ("each request's own length (range) / its bucket (buckets)" if chosen == "dynamic"
                        else "each request padded to its bucket, in that bucket's file" if chosen == "buckets"
                        else "every request padded to the top"),
            "tried": [{k: v for k, v in t.items() if k != "per_length"} for t in tried]}
        for t in refused:
            if t["form"] == "static":
                msg = (f"static form (padded to {_tops(job)}) refused: padding changes the answers ("
                       + (t.get("summary") or t.get("error") or "check failed") + ")")
                (out.warnings if ok else out.notes).append(
                    msg + (f"; built the {chosen} form, which matches FP32 at each sample's own length" if ok else ""))
                progress(msg)
        out.notes.append(f"shape form: {chosen} ({reason})")
        if not job.data_source.get("validation_shapes"):
            out.warnings.append("variable axes checked at one length only: the --calib data has no samples of their "
                                "own lengths (every sample is at the top shape); give a .npz of object arrays, a folder "
                                "of one-sample .npz, or padded arrays with 'lengths' or a mask input")
        import onnx

        from edgeopt.shapes import pad_sensitive

        for why in pad_sensitive(onnx.load(job.prepared_path, load_external_data=False),
                                 [s["name"] for s in job.io["inputs"]]):
            out.notes.append(f"padding may change the answers: {why} (the check at each own length decides)")
        return out, selected, uncal

    def debug_command(self, job: BuildJob) -> str:
        """``debug_command`` for this job."""
        return debug_command(job.model_path, job.target["name"], job.precision, job.io, job.data_source,
                             job.options)

    def _manifest(self, job: BuildJob, out: BuildOutput, build_s: float) -> dict[str, Any]:
        from edgeopt import __version__
        from edgeopt_agent.compare import TOLERANCES

        quant = model_quantization(job.model_path)
        if quant and job.precision != "int8":
            # The reference is ONNX Runtime running the model's own integer kernels; another runtime
            # rounds its dynamic quantization differently: the bound is the one INT8 implies.
            given = out.extra_manifest.get("tolerance_override") or {}
            asked = parse_tolerance(job.options.get("int8_tolerance")) or {}  # the INT8 bound, as the user set it
            out.extra_manifest["tolerance_override"] = {**TOLERANCES["int8"], **asked, **given}
            out.notes.append(f"the model is already quantized ({_quant_summary(quant)}): judged at the INT8 bound")
        return {
            "schema": MANIFEST_SCHEMA,
            "kind": "edgeopt.bundle",
            "edgeopt_version": __version__,
            "model": {"name": job.model_name, "sha256": job.model_sha256, "source": os.path.basename(job.model_path)},
            "target": job.target["name"],
            "target_spec": job.target,
            "backend": self.backend,
            "precision": job.precision,
            "options": {**{k: v for k, v in job.options.items() if k not in ("check_timeout",)}, **out.options},
            "toolchain": self.toolchain(),
            "io": out.io or job.io,
            "runtime": out.runtime,
            "validation": {"inputs": "validation/inputs.npz", "reference": "validation/reference.npz",
                           "source": job.data_source,
                           "reference_runtime": package_versions(
                               ["onnx"] if job.data_source.get("reference_engine") == "onnx.reference"
                               else ["onnxruntime"]),
                           "reference_engine": job.data_source.get("reference_engine", "onnxruntime"),
                           **({"varlen": {"inputs": VARLEN_INPUTS, "reference": VARLEN_REFERENCE,
                                          "reference_form": "FP32 model run unpadded at each sample's own length",
                                          "own_lengths": bool(job.data_source.get("validation_shapes"))}}
                              if job.variable else {})},
            "notes": job.data_source.get("prepare_notes", []) + out.notes,
            "warnings": out.warnings + ([job.data_source["warning"]] if job.data_source.get("warning") else [])
            + job.data_source.get("prepare_warnings", []),
            "build": {"time_s": round(build_s, 3), "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "host": {"machine": platform.machine(), "system": platform.system(),
                               "python": platform.python_version(), "node": platform.node()},
                      "cache_key": job.cache_key},
            "output_kinds": output_kinds(job),
            "accept": job.accept,
            **({"quantized_model": quant} if quant else {}),
            **out.extra_manifest,
        }


def fp16_overflow_of(job: BuildJob) -> list[tuple[str, float]]:
    """Float tensors of the prepared model whose magnitude passes 65504 on the validation inputs, largest
    first (``tensorrt.prep.fp16_overflow``, the analysis TensorRT's fp16 path runs)."""
    import onnx

    from edgeopt.calib import load_stacked

    from .tensorrt.prep import fp16_overflow

    feeds = load_stacked(job.validation_path, [t["name"] for t in job.io["inputs"]], "in")
    return fp16_overflow(onnx.load(job.prepared_path), feeds)


def fp16_overflow_warnings(job: BuildJob, debug: Callable[[], str] | None = None) -> list[str]:
    """The FP16 range analysis of every fp16 artifact whose backend does not keep those layers in FP32
    itself (mobile, intel-*): a warning naming the tensors that pass FP16's range (and ``debug``, the
    ``edgeopt debug`` command that compares them layer by layer)."""
    try:
        over = fp16_overflow_of(job)
    except Exception as exc:  # noqa: BLE001 - the analysis must not stop a build
        return [f"FP16 range check skipped: {(str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]}"]
    if not over:
        return []
    return ["FP16 overflow ahead: " + ", ".join(f"{t} reaches {v:.3g}" for t, v in over[:5])
            + (f" (+{len(over) - 5} more)" if len(over) > 5 else "")
            + "; FP16 tops out at 65504 -- expect Inf/NaN in those layers unless they run in FP32 (build fp32)"
            + (f"; to see which node breaks it: {debug()}" if debug else "")]


# The ops INT8 quantization gains on (weights, or the matrix products of attention); a model with none of
# them in any graph (a tree ensemble, a scaler) has nothing to quantize.
WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "LSTM", "GRU", "RNN", "Gather",
                          "Attention", "MultiHeadAttention"})


def has_weighted_ops(path: str) -> bool:
    """Whether any node of the model (subgraphs included) is one of ``WEIGHTED_OPS``; True when unreadable
    (the converter then says what is wrong)."""
    try:
        import onnx

        from edgeopt.model import walk_nodes

        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # noqa: BLE001
        return True
    return any(n.op_type in WEIGHTED_OPS and n.domain in ("", "ai.onnx", "com.microsoft") for n in walk_nodes(graph))


_QUANT_CACHE: dict[tuple[str, float], dict[str, int]] = {}


def model_quantization(path: str) -> dict[str, int]:
    """The already-quantized ops of the user's model (``edgeopt.model.quantized_ops``), cached per file."""
    try:
        key = (str(path), os.path.getmtime(path))
    except OSError:
        return {}
    if key not in _QUANT_CACHE:
        try:
            import onnx

            from edgeopt.model import quantized_ops, walk_nodes

            graph = onnx.load(str(path), load_external_data=False).graph
            _QUANT_CACHE[key] = quantized_ops((n.domain or "", n.op_type, n.name) for n in walk_nodes(graph))
        except Exception:  # noqa: BLE001 - not readable here: the load-time checks report that
            _QUANT_CACHE[key] = {}
    return _QUANT_CACHE[key]


def _quant_summary(quant: dict[str, int]) -> str:
    return ", ".join(f"{op} x{n}" for op, n in list(quant.items())[:4]) + (" ..." if len(quant) > 4 else "")


def parse_output_kind_option(value: Any, names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """``--option output_kind=name:ctc_time_major,other:classification@1`` -> {name: kind dict}.

    Kinds: ``edgeopt_agent.compare.OUTPUT_KINDS``; ``@N`` is a classification's axis or a decision's
    threshold.  UsageError for an unknown kind or output name."""
    from edgeopt.errors import UsageError
    from edgeopt_agent.compare import OUTPUT_KINDS, parse_kind

    hint = ("e.g. --option output_kind=logits:ctc_time_major,emb:embedding (kinds: "
            + ", ".join(OUTPUT_KINDS) + ")")
    if not value:
        return {}
    if isinstance(value, dict):
        items = list(value.items())
    else:
        items = []
        for part in str(value).replace(";", ",").split(","):
            if part.strip():
                name, sep, kind = part.strip().rpartition(":")
                if not sep or not name:
                    raise UsageError(f"bad output_kind item {part!r} (want name:kind)", hint=hint)
                items.append((name, kind))
    out = {}
    for name, kind in items:
        if names is not None and name not in names:
            raise UsageError(f"output_kind names {name!r}, which is not an output of the model "
                             f"(outputs: {', '.join(names)})", hint=hint)
        try:
            out[name] = {**parse_kind(kind), "source": "option"}
        except ValueError as exc:
            raise UsageError(f"output_kind: {exc}", hint=hint) from None
    return out


KIND_FLAG_HINT = ("e.g. --output-kind landmarks=regression:px=2, --output-kind "
                  "scores=detection@anchors:boxes=regressors:anchors=8x2+16x6, --decision score=0.2,0.8")


def _kind_items(value: Any, flag: str) -> list[tuple[str, Any]]:
    if value is None:
        return []
    if isinstance(value, dict):
        return list(value.items())
    return [(None, v) for v in ([value] if isinstance(value, str) else list(value))]


def parse_kind_flags(output_kind: Any = None, decision: Any = None) -> dict[str, dict[str, Any]]:
    """``--output-kind NAME=KIND`` (repeatable: ``landmarks=regression:px=2``, ``logit=decision@0``,
    ``scores=detection@anchors:boxes=regressors:anchors=8x2+16x6``) and ``--decision NAME=T[,T2...]`` (the
    application's thresholds: within (0, 1) a ``probability`` judged by bands and ``prob_delta_max``, else a
    ``decision`` at them) -> {name: kind dict}, the form ``--option output_kind=`` takes; the API's
    ``output_kind``/``decision`` may also be dicts ({name: kind}, {name: [0.2, 0.8]}).  A bad value is a
    UsageError (exit 2) listing the kinds."""
    from edgeopt.errors import UsageError
    from edgeopt_agent.compare import OUTPUT_KINDS, parse_kind

    kinds_text = "kinds: " + ", ".join(OUTPUT_KINDS)
    out: dict[str, dict[str, Any]] = {}
    for name, spec in _kind_items(output_kind, "--output-kind"):
        if name is None:  # NAME=KIND: split at the first '=' followed by a kind (an output name may hold '=')
            text = str(spec)
            cut = next((i for i in range(len(text)) if text[i] == "=" and i and
                        text[i + 1:].partition("@")[0].partition(":")[0].strip() in OUTPUT_KINDS), None)
            if cut is None:
                raise UsageError(f"--output-kind {text!r}: want NAME=KIND ({kinds_text})", hint=KIND_FLAG_HINT)
            name, spec = text[:cut].strip(), text[cut + 1:].strip()
        try:
            out[str(name)] = {**parse_kind(spec), "source": "option"}
        except ValueError as exc:
            msg = str(exc) if "kinds:" in str(exc) else f"{exc} ({kinds_text})"
            raise UsageError(f"--output-kind {name}: {msg}", hint=KIND_FLAG_HINT) from None
    for name, spec in _kind_items(decision, "--decision"):
        if name is None:
            name, sep, spec = str(spec).rpartition("=")
            if not sep or not name.strip():
                raise UsageError(f"--decision {spec!r}: want NAME=THRESHOLD[,THRESHOLD...] (0.2,0.8)",
                                 hint=KIND_FLAG_HINT)
            name = name.strip()
        try:
            vals = spec if isinstance(spec, (list, tuple)) else [spec] if isinstance(spec, (int, float)) else \
                [v for v in str(spec).replace("/", ",").split(",") if v.strip()]
            ts = sorted(float(v) for v in vals)
            if not ts or not all(t == t and abs(t) != float("inf") for t in ts):
                raise ValueError
        except (TypeError, ValueError):
            raise UsageError(f"--decision {name}: thresholds are numbers separated by commas (0.2,0.8), "
                             f"not {spec!r}", hint=KIND_FLAG_HINT) from None
        if name in out and out[name]["kind"] not in ("probability", "decision"):
            raise UsageError(f"--decision {name}: its --output-kind is {out[name]['kind']}, which has no thresholds "
                             "(decisions are for probability or decision outputs)", hint=KIND_FLAG_HINT)
        if all(0 < t < 1 for t in ts):  # probabilities: the application's bands, and how far one may move
            k: dict[str, Any] = {"kind": "probability", "threshold": ts[0]}
        else:  # logits or scores of any range: decisions at the thresholds
            k = {"kind": "decision", "threshold": ts[0]}
        if len(ts) > 1:
            k["thresholds"] = ts
        out[name] = {**k, "source": "option", "decision": ts}
    return out


def check_kind_names(kinds: dict[str, dict[str, Any]], model: str | os.PathLike) -> None:
    """Every name ``--output-kind``/``--decision`` gives (and an anchor head's ``boxes``) is an output of
    ``model``: UsageError (exit 2) naming the outputs, before anything is built."""
    from edgeopt.errors import UsageError

    if not kinds:
        return
    try:
        import onnx

        names = [o.name for o in onnx.load(str(model), load_external_data=False).graph.output]
    except Exception:  # noqa: BLE001 - an unreadable model: the pipeline's own message
        return
    for name, k in kinds.items():
        for n, what in ((name, "names"), (k.get("boxes"), "boxes= names"), (k.get("when"), "when= names")):
            if n is not None and n not in names:
                raise UsageError(f"--output-kind/--decision {what} {n!r}, which is not an output of the model "
                                 f"(outputs: {', '.join(names)})", hint=KIND_FLAG_HINT)


def output_kinds(job: BuildJob) -> dict[str, dict[str, Any]]:
    """What each output means (see ``edgeopt_agent.compare``): the user's ``output_kind`` option, else
    inferred from the op producing it (Softmax axis, Sigmoid, LpNormalization), its name and the
    reference values.  Recorded in the manifest, so the device judges by the same kinds."""
    import numpy as np

    from edgeopt_agent.compare import batch_rows, infer_kinds, unbatch

    names = [o["name"] for o in job.io["outputs"]]
    given = parse_output_kind_option(job.options.get("output_kind"), names)
    producers: dict[str, tuple[str, int | None]] = {}
    try:
        import onnx

        graph = onnx.load(job.prepared_path or job.model_path, load_external_data=False).graph
        nodes = {o: node for node in graph.node for o in node.output}
        for node in graph.node:
            axis = next((a.i for a in node.attribute if a.name == "axis"), None)
            for o in node.output:
                producers[o] = (node.op_type, -1 if axis is None and node.op_type in ("Softmax", "LogSoftmax")
                                else axis)
        for node in graph.node:  # an If whose branches both end in a Sigmoid (openwakeword's verifier) is one
            if node.op_type == "If":
                for i, o in enumerate(node.output):
                    ops = {_branch_producer(a.g, i, nodes) for a in node.attribute if a.name.endswith("_branch")}
                    if len(ops) == 1 and (op := ops.pop()) in ELEMENTWISE_KIND_OPS:
                        producers[o] = (op, None)
        for name in names:  # an output reshaped after its Sigmoid (silero-vad's speech_probs) is still one
            node, hops = nodes.get(name), 0
            while node is not None and node.op_type in SHAPE_ONLY_OPS and node.input and hops < 8:
                node, hops = nodes.get(node.input[0]), hops + 1
            if hops and node is not None and node.op_type in ELEMENTWISE_KIND_OPS:
                producers[name] = (node.op_type, None)  # an axis does not survive a reshape
            node, hops = nodes.get(name), 0  # class ids, whatever their type: an ArgMax (through Cast/reshapes)
            while node is not None and node.op_type in (*SHAPE_ONLY_OPS, "Cast") and node.input and hops < 8:
                node, hops = nodes.get(node.input[0]), hops + 1
            if node is not None and node.op_type == "ArgMax":
                producers[name] = ("ArgMax", None)
    except Exception:  # noqa: BLE001 - no graph: the kinds come from the data alone
        producers = {}
    try:
        with np.load(job.reference_path) as ref:
            refs = {n: ref[f"out{i}"] for i, n in enumerate(names) if f"out{i}" in ref}
    except Exception:  # noqa: BLE001
        refs = {}
    shapes = [i.get("shape") or [] for i in job.io["inputs"]]
    image_hw = None  # one image input: its pixels (NCHW, or NHWC as TF exports have it)
    if len(shapes) == 1 and len(shapes[0]) == 4:
        image_hw = (shapes[0][2:] if shapes[0][1] in (1, 3) else shapes[0][1:3] if shapes[0][3] in (1, 3)
                    else None)
    rows = batch_rows(job.data_source)
    batch = _fixed_batch(job)
    if rows:  # `build --batch B`: the kind is the batch-1 model's (a [B, 2] softmax is not [T, K] positions),
        refs = unbatch(refs, rows)  # inferred on the distinct samples, one at a time
    elif batch:  # a batch this build chose otherwise (--shape): each row a sample
        refs = {n: r.reshape(-1, 1, *r.shape[2:]) if r.ndim >= 2 and r.shape[1] == batch else r
                for n, r in refs.items()}
    carried = {n: {**k, "source": k["source"] if str(k.get("source", "")).startswith(("batch", "bucket"))
                   else "batch 1"}
               for n, k in (job.carried_kinds or {}).items()
               if n in names and n not in given and isinstance(k, dict) and k.get("kind")}
    inferred = infer_kinds({n: refs[n] for n in names if n not in given and n not in carried and n in refs},
                           producers, image_hw)
    # One score vector per input token is a tagger, not CTC: a [1, T, K] output whose T is the length of
    # an integer (token-id) input is judged per position, however dominant its "no tag" class is.
    token_lengths = {(i.get("shape") or [0, 0])[-1] for i in job.io["inputs"]
                     if str(i.get("dtype", "")).startswith(("int", "uint")) and len(i.get("shape") or []) == 2}
    for name, k in inferred.items():
        shape = refs[name].shape[1:]
        if k.get("kind") == "ctc_batch_major" and len(shape) == 3 and shape[0] == 1 and shape[1] in token_lengths:
            inferred[name] = {"kind": "per_position"}
    kinds = {}
    for name in names:
        if name in given:
            kinds[name] = given[name]
        elif name in carried:  # build --batch: every batch size judges by the batch-1 build's kinds
            kinds[name] = carried[name]
        elif name in inferred:
            kinds[name] = {**inferred[name], "source": "inferred"}
    for name, k in list(kinds.items()):  # an anchor head: its anchors over the image input, its regressors
        if k.get("kind") == "detection" and k.get("format") == "anchors":
            if not k.get("input_hw") and image_hw:
                kinds[name] = k = {**k, "input_hw": [int(v) for v in image_hw]}
            b = k.get("boxes")
            if b in names and b not in given and kinds.get(b, {}).get("anchors_of") != name:
                kinds[b] = {"kind": "regression", "anchors_of": name, **({"px": k["px"]} if k.get("px") else {}),
                            "source": "option"}
    return kinds


def _fixed_batch(job: BuildJob) -> int | None:
    """B when every input of the user's model has a dynamic leading (batch) dimension that this build
    fixed to the same B > 1 (``build --batch B``); else None."""
    try:
        import onnx

        graph = onnx.load(job.model_path, load_external_data=False).graph
    except Exception:  # noqa: BLE001 - no model to read: no batch folding
        return None
    inits = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    fixed = {i["name"]: (i.get("shape") or [None])[0] for i in job.io["inputs"]}
    sizes = set()
    for vi in inputs:
        dims = vi.type.tensor_type.shape.dim
        # dynamic: a name, no value, or a value of 0 or -1 (Paddle's exports write -1: ocr-cls's [-1, 3, 48, ?])
        if not dims or not (dims[0].dim_param or not dims[0].HasField("dim_value") or dims[0].dim_value <= 0):
            return None  # a static leading dimension: not a batch this build chose
        sizes.add(fixed.get(vi.name))
    if len(sizes) != 1:
        return None
    b = sizes.pop()
    return b if isinstance(b, int) and b > 1 else None


# Ops that only move an output's values around, and the producers whose meaning survives them.
SHAPE_ONLY_OPS = ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity")
ELEMENTWISE_KIND_OPS = ("Sigmoid",)


def _branch_producer(branch, i: int, outer: dict) -> str | None:
    """The op that makes output ``i`` of an If branch, through Identity (also into the outer graph)."""
    inner = {o: node for node in branch.node for o in node.output}
    name = branch.output[i].name if i < len(branch.output) else ""
    for _ in range(8):
        node = inner.get(name) or outer.get(name)
        if node is None or node.op_type != "Identity" or not node.input:
            return node.op_type if node is not None else None
        name = node.input[0]
    return None


VARLEN_INPUTS, VARLEN_REFERENCE = "validation/varlen_inputs.npz", "validation/varlen_reference.npz"


def _tops(job: BuildJob) -> str:
    return ", ".join(f"{s['name']}{s['shape']}" for s in job.io["inputs"] if s.get("variable"))


def varlen_data(job: BuildJob, bundle: Path) -> Path:
    """The variable-length validation set in the bundle (``VARLEN_INPUTS``: every validation sample at its
    own length, cut from the padded one by ``data_source.validation_shapes``; ``VARLEN_REFERENCE``: the FP32
    model run *unpadded* at that length, ONNX Runtime with optimizations off); returns the prepared model
    with its variable axes free again (``shapes.free_model``), written beside the bundle."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from edgeopt.calib import load_stacked
    from edgeopt.shapes import free_model
    from edgeopt_agent import varlen

    names = [s["name"] for s in job.io["inputs"]]
    outs = [s["name"] for s in job.io["outputs"]]
    feeds = load_stacked(job.validation_path, names, "in")
    true = job.data_source.get("validation_shapes")
    if true:
        feeds = [{n: varlen.crop(f[n], t.get(n, np.shape(f[n]))) for n in names} for f, t in zip(feeds, true)]
    free = bundle.parent / f"{bundle.name}.free.onnx"
    onnx.save(free_model(onnx.load(job.prepared_path), job.variable or {}), str(free))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(free), so, providers=["CPUExecutionProvider"])
    refs = [dict(zip(outs, sess.run(outs, f))) for f in feeds]
    (bundle / "validation").mkdir(parents=True, exist_ok=True)
    varlen.save(bundle / VARLEN_INPUTS, feeds, names, "in")
    varlen.save(bundle / VARLEN_REFERENCE, refs, outs, "out")
    return free


def host_check(bundle: Path, timeout: float = 600, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the agent's ``check`` verb on the bundle in a child process (a crash is a failure)."""
    cmd = [sys.executable, "-m", "edgeopt_agent", "check"]
    request = {"bundle": str(bundle), **({"options": options} if options else {})}
    try:
        proc = subprocess.run(cmd, input=json.dumps(request), capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"kind": "numeric", "passed": False, "error": f"host check hung (> {timeout:.0f}s) and was killed"}
    try:
        reply = json.loads(proc.stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        why = f"exit code {proc.returncode}" + (f" (signal {-proc.returncode})" if proc.returncode < 0 else "")
        tail = (proc.stderr or "").strip().splitlines()[-3:]
        return {"kind": "numeric", "passed": False, "error": f"runtime crashed during the host check: {why}",
                "stderr_tail": tail}
    if not reply.get("ok"):
        return {"kind": "numeric", "passed": False, "error": reply.get("error", {}).get("message", "check failed")}
    check = {"kind": "numeric", **reply["check"]}
    _apply_policy(bundle, check)
    return check


def _apply_policy(bundle: Path, check: dict[str, Any]) -> None:
    """The accuracy policy's word on a host check (``edgeopt.policy.accept.apply``), with the gate file the
    bundle was built under (its manifest's ``accept``; none: the defaults)."""
    from edgeopt.policy import accept

    try:
        spec = (json.loads((Path(bundle) / "manifest.json").read_text()) or {}).get("accept")
    except (OSError, ValueError):
        spec = None
    accept.apply(check, spec)


# The bundle's id is sha256(manifest.json) (the agent's store, push, results): what determines the artifact
# only, so that two builds of the same inputs -- here or on a cluster worker -- have one id. How long the build
# and its check took, when and where, go to BUILD_TIMES beside it: not listed in `files`, not hashed, not pushed.
BUILD_TIMES = "build-times.json"
VOLATILE: tuple[tuple[str, ...], ...] = (
    ("build", "time_s"), ("build", "built_at"), ("build", "host"),
    ("host_check", "load_s"), ("host_check", "validation_s"), ("host_check", "warm_validation_s"),
    ("prepared_onnx_check", "load_s"), ("prepared_onnx_check", "validation_s"), ("tflite", "timings"))


def split_times(manifest: dict[str, Any]) -> dict[str, Any]:
    """Take the ``VOLATILE`` entries out of ``manifest`` (in place); returned nested as they were."""
    times: dict[str, Any] = {}
    for path in VOLATILE:
        node: Any = manifest
        for k in path[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict) and path[-1] in node:
            dst = times
            for k in path[:-1]:
                dst = dst.setdefault(k, {})
            dst[path[-1]] = node.pop(path[-1])
    return times


def build_times(bundle: str | os.PathLike) -> dict[str, Any]:
    """A bundle's ``BUILD_TIMES`` (``{"build": {"time_s", "built_at", "host"}, "host_check": {"load_s", ...}}``);
    {} when absent (a bundle from before they moved, or one copied without it)."""
    try:
        data = json.loads((Path(bundle) / BUILD_TIMES).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def file_table(bundle: Path) -> dict[str, dict[str, Any]]:
    from edgeopt.model import sha256_file

    files = {}
    for p in sorted(bundle.rglob("*")):
        if p.is_file() and p.name != "manifest.json" and p.relative_to(bundle).as_posix() != BUILD_TIMES:
            rel = p.relative_to(bundle).as_posix()
            files[rel] = {"sha256": sha256_file(p), "size": p.stat().st_size}
    return files


def write_manifest(bundle: Path, manifest: dict[str, Any]) -> None:
    """``manifest.json``: ``manifest`` less its timings (``split_times``), which go to ``BUILD_TIMES``
    (``manifest`` itself keeps them)."""
    manifest["files"] = file_table(bundle)
    stable = json.loads(json.dumps(manifest, default=str))
    times = split_times(stable)
    tmp = bundle / f"{BUILD_TIMES}.tmp"
    tmp.write_text(json.dumps(times, indent=2) + "\n")
    os.replace(tmp, bundle / BUILD_TIMES)
    tmp = bundle / "manifest.json.tmp"
    tmp.write_text(json.dumps(stable, indent=2) + "\n")
    os.replace(tmp, bundle / "manifest.json")


def _link_or_copy(src: str, dst: Path) -> None:
    import shutil

    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def selectable_ifs_of(path: str) -> list[str]:
    """The top-level Ifs of the model at ``path`` that ``ifs_as_where`` converts (none when unreadable)."""
    try:
        import onnx

        from .if_select import selectable_ifs

        return selectable_ifs(onnx.load(path, load_external_data=False).graph)
    except Exception:  # noqa: BLE001 - unreadable here: the op table alone judges
        return []


def if_as_where_asked(options: dict[str, Any]) -> bool:
    """``--option if_as_where=true|false`` (UsageError for another value)."""
    value = str(options.get("if_as_where", "false")).lower()
    if value not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        raise UsageError(f"if_as_where={options['if_as_where']!r}: expected true or false")
    return value in ("1", "true", "yes", "on")


def if_as_where_refused(options: dict[str, Any]) -> bool:
    """The user said ``--option if_as_where=false`` (not merely left it out)."""
    return "if_as_where" in options and not if_as_where_asked(options)


@contextlib.contextmanager
def ifs_as_where(job: BuildJob, always: bool):
    """``(job, names)``: the job itself, or -- when the backend has no If (``always``) or the user asked
    (``if_as_where``) and the model has Ifs it can be -- a copy whose prepared model has them as both
    branches and a Where, in a scratch folder beside the bundle removed afterwards."""
    if not (always or if_as_where_asked(job.options)) or not selectable_ifs_of(job.prepared_path):
        yield job, []
        return
    import dataclasses
    import shutil
    import tempfile

    import onnx

    from .if_select import rewrite

    model, names = rewrite(onnx.load(job.prepared_path))
    work = Path(tempfile.mkdtemp(prefix=".ifs-", dir=Path(job.bundle_dir).parent))
    try:
        path = work / Path(job.prepared_path).name
        onnx.save(model, str(path))
        yield dataclasses.replace(job, prepared_path=str(path)), names
    finally:
        shutil.rmtree(work, ignore_errors=True)
