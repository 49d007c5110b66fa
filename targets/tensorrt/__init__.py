"""jetson-orin, jetson-xavier, a100, h100, l4, nvidia -> TensorRT, engine built on the device.

TensorRT engines are tied to the GPU model and the TensorRT version (INT8 calibration caches do not
move between GPUs either), so the host never builds one.  It builds a *bundle* that the agent's
``compile`` verb turns into an engine on the device (``edgeopt_agent.trt_compile``):

- ``model.onnx``: the prepared ONNX (static shapes or profiled dynamic dims, an opset TensorRT's
  parser takes, constants folded, simplified); for int8/fp8 the explicit-quantization Q/DQ model
  calibrated here on the user's data (``edgeopt.targets.tensorrt.prep``);
- ``trt_build.json``: the build spec -- builder flags per precision, workspace, optimization
  profiles, DLA core, timing-cache use, builder optimization level;
- ``validation/``: the inputs and the ONNX Runtime FP32 reference outputs.

The engine cannot run here, but the prepared ONNX can: it is checked in ONNX Runtime on the host
and recorded as ``prepared_onnx_check`` -- a check of the ONNX handed to TensorRT, not of the
engine (``host_check`` stays ``kind: device``: the engine is checked on the device).

Options (``--option KEY=VALUE``): ``trt_profile`` (``x:1x3x224x224/8x3x224x224/32x3x224x224``),
``trt_workspace_mb``, ``trt_opt_level`` (0-5), ``trt_dla_core``, ``trt_gpu_fallback``,
``trt_timing_cache``, ``trt_calibration`` (auto|max|mse|entropy|percentile[-99.99]), ``trt_fp16_fallback``,
``trt_strongly_typed``, ``trt_simplify``, ``trt_int8_search``; and the INT8 search keys it shares with
the ``cpu`` target: ``int8_search`` (quick|full), ``int8_budget_s``, ``int8_tolerance``.

INT8 runs the accuracy-aware Q/DQ search shared with the ``cpu`` target (``trt_int8``/``qdq_search``):
clipping rules x per-channel weights, then the most sensitive layers left without Q/DQ (FP16 in a
TensorRT 10 engine with the FP16 flag, FP32 in a strongly typed one) until the host check's INT8 bound is met; none meets it: the build refuses, naming what the
closest variant missed.  ``trt_int8_search=false`` is the direct path of before (clipping rules only).
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeopt import spec_check
from edgeopt.errors import BuildFailed, UnsupportedOps, UsageError
from edgeopt_agent.compare import batch_rows, top1_text

from ..base import (
    BuildJob,
    BuildOutput,
    CheckFailed,
    Target,
    host_check,
    output_kinds,
    package_versions,
    require,
)

ENGINE_NOTE = "engine is built on the device (TensorRT engines are tied to the GPU model and TensorRT version)"
SPEC_FILE = "trt_build.json"
SPEC_SCHEMA = 1
ARTIFACT = "model.onnx"

# trt_* option -> (default, one-line help).  Anything else starting with trt_ is refused.
OPTIONS: dict[str, tuple[Any, str]] = {
    "trt_profile": (None, "optimization profile: NAME:MIN/OPT/MAX (or NAME:MIN/MAX, opt = --shape); ';' between inputs"),
    "trt_workspace_mb": (None, "builder workspace limit in MiB (default: the target profile's)"),
    "trt_opt_level": (3, "builder optimization level 0-5 (higher: longer builds, maybe faster engines)"),
    "trt_dla_core": (None, "run on this DLA core (Jetson); layers DLA cannot take fall back to the GPU"),
    "trt_gpu_fallback": (True, "with trt_dla_core: let layers DLA cannot run fall back to the GPU"),
    "trt_timing_cache": (True, "reuse and update the device's timing cache across builds"),
    "trt_calibration": ("auto", "int8/fp8 activation ranges: auto, max, mse, entropy, percentile, percentile-99.999"),
    "trt_fp16_fallback": (True, "int8/fp8: let layers left unquantized run in FP16 (else FP32)"),
    "trt_strongly_typed": ("auto", "strongly typed network (types from the ONNX, no precision flags): auto = yes "
                                   "for TensorRT >= 11 targets (a100, h100, l4, nvidia), which removed weak typing; "
                                   "fp16 then ships an FP16 ONNX written on the host"),
    "trt_simplify": (True, "constant folding and simplification with onnxsim"),
    "trt_int8_search": (True, "int8: the accuracy-aware Q/DQ search (sensitive layers left without Q/DQ until the INT8 bound "
                              "is met); false: calibration rules only, as before"),
}
# Keys of the INT8 search that the cpu target reads too (one search, one set of knobs).
SHARED_INT8_OPTIONS = ("int8_search", "int8_budget_s", "int8_tolerance")
# TensorRT releases that first took each precision's ONNX form (explicit Q/DQ: 8.0; FP8 Q/DQ: 9.0 [8.6 on Hopper
# only through plugins]).
MIN_TENSORRT = {"fp32": "8.0", "fp16": "8.0", "int8": "8.0", "fp8": "9.0"}


def _bool(key: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int | float) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.lower() in ("true", "false", "yes", "no", "on", "off", "1", "0"):
        return v.lower() in ("true", "yes", "on", "1")
    raise UsageError(f"--option {key}={v!r}: expected true or false")


def _int(key: str, v: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int | str):
        raise UsageError(f"--option {key}={v!r}: expected an integer")
    try:
        n = int(v)
    except ValueError:
        raise UsageError(f"--option {key}={v!r}: expected an integer") from None
    if n < lo or (hi is not None and n > hi):
        raise UsageError(f"--option {key}={n}: must be in {lo}..{'' if hi is None else hi}")
    return n


def resolve_options(options: dict[str, Any], spec: dict[str, Any], precision: str) -> dict[str, Any]:
    """The trt_* options with defaults, validated against the target profile and precision."""
    unknown = [k for k in options if k.startswith("trt_") and k not in OPTIONS]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(OPTIONS), n=1)
        raise UsageError(f"unknown TensorRT option(s) {unknown}",
                         hint=(f"did you mean {close[0]}? " if close else "") + f"known: {', '.join(OPTIONS)}")
    o = {k: options.get(k, d) for k, (d, _) in OPTIONS.items()}
    profile = spec.get("profile", {})
    from .prep import profile_tensorrt

    version = profile_tensorrt(profile)  # 8.5/10.3: Jetson (JetPack); 11+ or None: the data-centre GPUs, any
    major = None if version is None else int(version.split(".")[0])
    weak_ok = major is not None and major < 11
    if str(o["trt_strongly_typed"]).lower() == "auto":
        o["trt_strongly_typed"] = not weak_ok
    for k in ("trt_gpu_fallback", "trt_timing_cache", "trt_fp16_fallback", "trt_strongly_typed", "trt_simplify",
              "trt_int8_search"):
        o[k] = _bool(k, o[k])
    if not o["trt_strongly_typed"] and not weak_ok:
        raise UsageError(f"target {spec['name']!r} runs TensorRT {version or '>= 11'}, which has no weak typing "
                         "(no FP16/INT8 builder flags): trt_strongly_typed cannot be false there",
                         hint="drop the option; Jetson targets (TensorRT 8.5, 10.3) take the builder-flag path")
    o["trt_opt_level"] = _int("trt_opt_level", o["trt_opt_level"], 0, 5)
    from ..onnxruntime.int8 import parse_options as parse_int8

    o["int8"] = parse_int8({k: options[k] for k in SHARED_INT8_OPTIONS if k in options})
    o["trt_calibration"] = str(o["trt_calibration"])
    if o["trt_calibration"] != "auto":
        from .prep import calibration_method

        calibration_method(o["trt_calibration"])
    ws = o["trt_workspace_mb"] if o["trt_workspace_mb"] is not None else profile.get("workspace_mb", 4096)
    o["trt_workspace_mb"] = _int("trt_workspace_mb", ws, 16)
    if o["trt_dla_core"] is not None and str(o["trt_dla_core"]).lower() not in ("none", "", "-1"):
        cores = int(profile.get("dla_cores") or 0)
        core = _int("trt_dla_core", o["trt_dla_core"], 0)
        if cores == 0:
            raise UsageError(f"target {spec['name']!r} has no DLA (dla_cores is 0 in its profile)",
                             hint="drop trt_dla_core, or target a Jetson (jetson-orin, jetson-xavier)")
        if core >= cores:
            raise UsageError(f"trt_dla_core={core}: {spec['name']} has {cores} DLA core(s) (0..{cores - 1})")
        if precision not in ("fp16", "int8"):
            raise UsageError(f"DLA runs fp16 or int8, not {precision}", hint="use --precision fp16 or int8")
        o["trt_dla_core"] = core
    else:
        o["trt_dla_core"] = None
    if precision == "fp8" and not profile.get("fp8"):
        raise UsageError(f"target {spec['name']!r} has no FP8 (its profile says fp8: false)",
                         hint="FP8 needs Ada or Hopper (l4, h100)")
    return o


def _check_hint(prec: str) -> str:
    """What to try when the prepared ONNX fails its host check: the knobs of that precision only."""
    if prec in ("int8", "fp8"):
        return "use --allow-mismatch to keep it, another --option trt_calibration, or fp16"
    if prec == "fp16":
        return "build fp32 for this target, or use --allow-mismatch to keep it"
    return "use --allow-mismatch to keep it"


def _validation_lengths(job: BuildJob) -> dict[str, list[list[int]]]:
    """{input: every validation sample's own shape} (``data_source.validation_shapes``), for a range's opt."""
    out: dict[str, list[list[int]]] = {}
    for row in job.data_source.get("validation_shapes") or []:
        for name, shape in (row or {}).items():
            out.setdefault(name, []).append(list(shape))
    return out


def build_spec(precision: str, o: dict[str, Any], spec: dict[str, Any], io_shapes: dict[str, list[int]],
               profiles: dict[str, Any]) -> dict[str, Any]:
    """What the device's ``compile`` needs, as plain data (``trt_build.json``)."""
    from .prep import profile_tensorrt, profile_tensorrt_major

    flags: list[str] = []
    clear: list[str] = []
    if o["trt_strongly_typed"]:
        # types come from the ONNX (FP16 written on the host, Q/DQ for int8/fp8): no precision flags
        if precision == "fp32":
            clear = ["TF32"]
    elif precision == "fp16":
        flags = ["FP16"]
    elif precision == "int8":
        flags = ["INT8"] + (["FP16"] if o["trt_fp16_fallback"] else [])
    elif precision == "fp8":
        flags = ["FP8"] + (["FP16"] if o["trt_fp16_fallback"] else [])
    else:  # fp32 is checked with fp32 bounds: TF32 tensor-core math would not meet them
        clear = ["TF32"]
    if o["trt_dla_core"] is not None and o["trt_gpu_fallback"]:
        flags.append("GPU_FALLBACK")
    profile = spec.get("profile", {})
    return {
        "schema": SPEC_SCHEMA,
        "onnx": ARTIFACT,
        "precision": precision,
        "quantization": "explicit Q/DQ in the ONNX" if precision in ("int8", "fp8") else None,
        "flags": flags,
        "clear_flags": clear,
        "strongly_typed": o["trt_strongly_typed"],
        "tensorrt_major": profile_tensorrt_major(profile),
        "tensorrt": profile_tensorrt(profile),  # the version the profile names: what the host checked against
        "workspace_mb": o["trt_workspace_mb"],
        "builder_optimization_level": o["trt_opt_level"],
        "io_shapes": io_shapes,
        "profiles": [{n: p.as_dict() for n, p in profiles.items()}] if profiles else [],
        "dla": None if o["trt_dla_core"] is None else {"core": o["trt_dla_core"], "gpu_fallback": o["trt_gpu_fallback"]},
        "timing_cache": o["trt_timing_cache"],
        "min_tensorrt": MIN_TENSORRT[precision],
        "target": {"name": spec["name"], "compute_capability": profile.get("compute_capability"),
                   "dla_cores": profile.get("dla_cores", 0), "fp8": bool(profile.get("fp8")),
                   "jetson": bool(profile.get("jetson"))},
    }


class TensorRtTarget(Target):
    """NVIDIA GPUs through TensorRT: a prepared-ONNX bundle; the engine is compiled on the device."""

    backend = "tensorrt"
    extra = "tensorrt"
    packages = ["onnxsim"]  # the host needs onnx, onnxruntime and onnxsim; never tensorrt
    check_kind = "device"
    # issue 42: a variable axis as optimization profiles (one per bucket), from the user's model's dims
    shape_forms = ("dynamic",)
    dynamic_from_free = False
    fp16_range_own = True  # its FP16 range analysis: the overflowing layers FP32 (strongly typed) or a warning

    def known_options(self) -> frozenset[str] | None:
        return frozenset(OPTIONS) | frozenset(SHARED_INT8_OPTIONS)

    def check_options(self, options: dict[str, Any], precision: str, spec: dict[str, Any]) -> None:
        """Every trt_* value but ``trt_profile`` (that one needs the model's inputs: checked in the build)."""
        resolve_options(options, spec, precision)

    def supported_ops(self, spec: dict[str, Any]) -> set[str] | None:
        """The ops the ONNX parser of the TensorRT the target's devices run takes (its profile's ``tensorrt``
        or ``tensorrt_major``): the one check behind ``inspect``, the build's refusal and the in-build preflight."""
        from .prep import table_for_target

        return set(table_for_target(spec).supported())

    def unsupported_why(self, spec: dict[str, Any], nodes: list[tuple[str, str]]) -> str | None:
        from .prep import table_for_target

        ops = [op for op, _ in nodes if " (" not in op]  # not the attribute rules' "Op (why)": no parser said it
        return refusal_note(table_for_target(spec), ops) if ops else None

    def toolchain(self) -> dict[str, str]:
        tables = ", ".join(t.tensorrt_version + (f" for {t.for_tensorrt}" if t.for_tensorrt else "")
                           + f" ({', '.join(names)})" for t, names in _tables_in_use())
        return {**super().toolchain(), **package_versions(["onnxconverter-common"]),
                "tensorrt": "on the device", "tensorrt_ops_table": tables,
                "typing": "strongly typed for TensorRT >= 11 targets (FP16: overflowing tensors' producers and readers FP32), builder flags for 10 (rev 3)",
                "int8": "qdq_search: clipping rules x per-channel, sensitivity float fallback, task-first ranking, "
                "mixed-scale concats and detection decoding float (rev 4)"}

    def _build(self, job: BuildJob, progress: Callable[[str], None]) -> BuildOutput:
        import onnx

        from . import prep as trt_prep

        require("onnxsim", self.extra)
        spec, prec = job.target, job.precision
        o = resolve_options(job.options, spec, prec)
        static = {t["name"]: list(t["shape"]) for t in job.io["inputs"]}
        declared = _declared_dims(job.model_path)
        profiles = trt_prep.parse_profiles(o["trt_profile"], static, declared)
        bucket_profiles: list[dict[str, Any]] = []
        if not profiles and job.variable:  # issue 42: the --shape bounds as optimization profiles
            profiles, bucket_profiles = trt_prep.varlen_profiles(job.variable, static, _validation_lengths(job))
        bundle = Path(job.bundle_dir)
        warnings: list[str] = []

        progress("preparing the ONNX for TensorRT" + (" (dynamic: " + ", ".join(
            f"{n}{p.dynamic_axes}" for n, p in profiles.items() if p.dynamic_axes) + ")" if profiles else ""))
        if profiles:  # keep the profiled dims dynamic: start from the user's model, not the static one
            from edgeopt.model import load

            source = load(job.model_path)
        else:
            source = onnx.load(job.prepared_path)
        table = trt_prep.table_for_target(spec)  # the parser of the TensorRT the target's devices run
        prepared = trt_prep.prepare(source, static, profiles, trt_prep.QDQ_MIN_OPSET.get(prec, 0),
                                    simplify=o["trt_simplify"], progress=progress, table=table)
        warnings += prepared.warnings
        bad = trt_prep.preflight(trt_prep.model_nodes(prepared.model), table)
        if bad:
            raise UnsupportedOps(spec["name"], bad, refusal_note(table, [op for op, _ in bad]))
        model = prepared.model
        quant = None
        if prec == "fp16":
            try:
                over = trt_prep.fp16_overflow(model, _feeds(job, "validation"))
            except Exception as exc:  # ONNX Runtime refusing extra outputs must not stop the build
                over = []
                warnings.append(f"FP16 range check skipped: {str(exc).strip().splitlines()[0][:200]}")
            if over:
                warnings.append("FP16 overflow ahead: " + ", ".join(f"{t} reaches {v:.3g}" for t, v in over[:5])
                                + (f" (+{len(over) - 5} more)" if len(over) > 5 else "")
                                + "; FP16 tops out at 65504 -- expect Inf/NaN on the device unless those "
                                  "layers run in FP32")
        if prec == "fp16" and o["trt_strongly_typed"]:
            # TensorRT >= 11: the precision is in the ONNX. FP16 everywhere but where FP16 would overflow
            # (those nodes stay FP32), inputs/outputs kept FP32 with casts at the boundary.
            model, fp16_report = trt_prep.to_fp16(model, [t for t, _ in over])
            progress(f"FP16 ONNX written for a strongly typed network: {fp16_report['summary']}")
        else:
            fp16_report = None
        tolerance = None
        if prec in ("int8", "fp8"):
            feeds = _feeds(job, "calib")
            if job.data_source.get("kind") == "random":
                warnings.append(f"{prec} ranges were calibrated on RANDOM data: pass --calib with real inputs")
            if prec == "int8" and o["trt_int8_search"]:
                quant, tolerance = _int8_search(job, model, feeds, o, bundle, progress)
            else:
                quant = trt_prep.quantize(model, feeds, prec, str(o["trt_calibration"]), progress=progress)
            model = quant.model
        files = trt_prep.save_model(model, bundle / ARTIFACT)

        bspec = build_spec(prec, o, spec, static, profiles)
        if bucket_profiles:  # one narrow profile per bucket: kernels tuned for each bucket's own shape
            bspec["profiles"] = bucket_profiles
        (bundle / SPEC_FILE).write_text(json.dumps(bspec, indent=2) + "\n")

        progress("checking the prepared ONNX in ONNX Runtime (the engine is checked on the device)")
        check = prepared_check(bundle, files, job, prec, job.options.get("check_timeout", 600),
                               fp16_onnx=fp16_report is not None, tolerance=tolerance)
        summary = _summary(check)
        if not check.get("passed") and not job.options.get("allow_mismatch"):
            # a check that ran and failed is this model's outcome (cached); a crashed or hung one is not
            failure = BuildFailed if "error" in check else CheckFailed
            raise failure(f"the prepared {prec} ONNX fails its check in ONNX Runtime on the host: {summary}",
                          hint="; ".join(h for h in (spec_check.hint(job.data_source), _check_hint(prec)) if h))
        if not check.get("passed"):
            warnings.append(f"the prepared ONNX fails its host check ({summary}); kept by --allow-mismatch")

        restricted = trt_prep.restricted_ops((n[1] for n in trt_prep.model_nodes(model)), table)
        notes = [ENGINE_NOTE,
                 f"{spec['name']} {prec}: prepared ONNX checked in ONNX Runtime on the host (not the engine): {summary}"]
        options = {k: v for k, v in o.items() if k not in ("trt_profile", "int8")}
        options["trt_profile"] = {n: p.as_dict() for n, p in profiles.items()} or None
        tensorrt = {
            "build_spec": SPEC_FILE,
            "engine": "built on the device by `python3 -m edgeopt_agent compile`",
            "engine_cache_key": "sha256 of (bundle sha256 over model.onnx + trt_build.json, GPU name, "
                                "compute capability, TensorRT version)",
            "ops_table": {**table.as_dict(), "tensorrt_major": trt_prep.profile_tensorrt_major(spec.get("profile"))},
            "preparation": prepared.report,
            "restricted_ops": restricted,
        }
        if quant is not None:
            tensorrt["quantization"] = {k: v for k, v in quant.report.items() if k != "activation_amax"}
            if "chosen" in quant.report:
                notes.append(f"INT8 Q/DQ search kept {quant.report['chosen']['label']} ("
                             f"{len(quant.report['variants'])} variant(s) tried); {quant.report['selection']}")
        if fp16_report is not None:
            tensorrt["fp16_onnx"] = fp16_report
        progress(ENGINE_NOTE)
        return BuildOutput(
            runtime={"name": "tensorrt", "artifact": ARTIFACT, "options": {"build_spec": SPEC_FILE}},
            options=options, check="device", notes=notes, warnings=warnings,
            extra_manifest={"tensorrt": tensorrt, "prepared_onnx_check": check,
                            **({"tolerance_override": tolerance} if tolerance else {})})


def _tables_in_use():
    """[(table, [built-in targets reading it])] in version order; the default table lists ``default`` too."""
    from ..registry import BUILTIN
    from .prep import OPS_FILES, ops_table, table_for_target

    users: dict[str, tuple[Any, list[str]]] = {}  # file -> (the table as its first user reads it, users)
    for s in BUILTIN.values():
        if s.backend == "tensorrt":
            table = table_for_target(s.as_dict())  # with the TensorRT it stands for ("10.3" from 10.1's)
            users.setdefault(table.file, (table, []))[1].append(s.name)
    users.setdefault(ops_table().file, (ops_table(), []))[1].append("default")
    return [users[f.name] for _, f in sorted(OPS_FILES.items()) if f.name in users]


def refusal_note(table, ops: list[str]) -> str:
    """Whose parser refuses ``ops`` and, where the table of another built-in target takes some of them,
    which (and those targets): "refused by TensorRT 10.15's ONNX parser; TensorRT 11.0's ONNX parser takes
    Swish (a100, h100, l4)"."""
    note = f"refused by {table.parser}"
    for other, names in _tables_in_use():
        taken = sorted({op for op in ops if op in other.supported()})
        names = [n for n in names if n != "default"]
        if other.file == table.file or not taken or not names:
            continue
        note += f"; {other.parser} takes {', '.join(taken)} ({', '.join(names)})"
    return note


def _int8_search(job: BuildJob, model, feeds: list[dict[str, Any]], o: dict[str, Any], bundle: Path,
                 progress: Callable[[str], None]):
    """The shared Q/DQ search for TensorRT INT8: (Quantized, tolerance override or None).  Raises
    CheckFailed (nothing shipped) when no variant meets the INT8 bound, unless --allow-mismatch."""
    import numpy as np

    from . import prep as trt_prep
    from .int8 import search_int8

    plan = o["int8"]
    val = _feeds(job, "validation")
    names = [t["name"] for t in job.io["outputs"]]
    with np.load(job.reference_path, allow_pickle=False) as data:
        reference = {n: data[f"out{i}"] for i, n in enumerate(names)}
    work = Path(tempfile.mkdtemp(prefix=".trt-int8-", dir=bundle.parent))
    try:
        res = search_int8(model, feeds, val, reference, work, method=str(o["trt_calibration"]), mode=plan.mode,
                          budget_s=plan.budget_s, tolerance=plan.tolerance, kinds=output_kinds(job),
                          keep_closest=bool(job.options.get("allow_mismatch")), progress=progress, accept=job.accept,
                          rows=batch_rows(job.data_source), calib_rows=batch_rows(job.data_source, "calibration"),
                          float_runs_as="FP16" if not o["trt_strongly_typed"] and o["trt_fp16_fallback"] else "FP32")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if res.model is None:
        closest = res.search.closest()
        raise CheckFailed(
            "no TensorRT INT8 variant the accuracy policy accepts on the host after "
            f"{len(res.search.variants)} variant(s) in {res.search.elapsed():.0f}s; the closest: {closest.summary()}"
            f"{res.search.refusal_detail()}; INT8 is not shipped",
            hint="use fp16 for this target, calibrate with more representative --calib data, try "
                 "--option int8_search=full (more variants, a longer float fallback), or accept a looser bound "
                 "with e.g. --option int8_tolerance=cosine_min=0.95,top1_min=0.8",
            cacheable=not res.search.budget_cut(), accuracy=True)
    return trt_prep.Quantized(res.model, res.report), plan.tolerance


def _declared_dims(model_path: str) -> dict[str, list[int | str | None]]:
    """Input dims as the user's model declares them (no weights loaded)."""
    import onnx

    m = onnx.load(model_path, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    out: dict[str, list[int | str | None]] = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        dims: list[int | str | None] = []
        for d in vi.type.tensor_type.shape.dim:
            dims.append(int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0
                        else (d.dim_param or None))
        out[vi.name] = dims
    return out


def _feeds(job: BuildJob, which: str) -> list[dict[str, Any]]:
    from edgeopt.calib import load_stacked

    names = [t["name"] for t in job.io["inputs"]]
    path = job.calib_path if which == "calib" else job.validation_path
    if not path:
        raise UsageError("int8/fp8 needs calibration data", hint="pass --calib with real inputs")
    return load_stacked(path, names, "in")


def prepared_check(bundle: Path, files: list[str], job: BuildJob, precision: str, timeout: float,
                   fp16_onnx: bool = False, tolerance: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run the agent's ``check`` with ONNX Runtime on the prepared ONNX, in a staging copy of the bundle.

    The staging bundle (hard links, removed afterwards) says ``runtime: onnxruntime`` so the agent
    checks the ONNX exactly as it checks any ORT bundle; FP32/FP16 bundles are held to FP32 bounds
    (the prepared ONNX is FP32: preparation must not change the numbers), INT8/FP8 to theirs, and the FP16
    ONNX of a strongly typed build to the FP16 bounds (it *is* the FP16 arithmetic, run by ORT).
    """
    check_prec = precision if precision in ("int8", "fp8") or fp16_onnx else "fp32"
    # Run as the reference was computed, without graph rewrites: Q/DQ then run as written (what
    # TensorRT's arithmetic is closest to; ORT's QDQ fusions also do not type-check FP8), and ORT's
    # optimizer cannot stand in for a difference the preparation made.
    level = "disabled"
    stage = Path(tempfile.mkdtemp(prefix=".trt-check-", dir=bundle.parent))
    try:
        (stage / "validation").mkdir()
        for rel in files + ["validation/inputs.npz", "validation/reference.npz"]:
            _link(bundle / rel, stage / rel)
        manifest = {"schema": 1, "kind": "edgeopt.bundle", "target": job.target["name"], "precision": check_prec,
                    "io": job.io, "runtime": {"name": "onnxruntime", "artifact": ARTIFACT,
                                              "options": {"graph_optimization_level": level}},
                    "validation": {"inputs": "validation/inputs.npz", "reference": "validation/reference.npz"},
                    # the agent opens only listed files: list what this staging copy holds (no hashes
                    # are needed for a host-side check of files this process just linked)
                    "files": {rel: {"sha256": None} for rel in files + ["validation/inputs.npz",
                                                                       "validation/reference.npz"]},
                    # judged by the same output kinds and bound as the bundle (and the search) are
                    "output_kinds": output_kinds(job), "accept": job.accept}
        if tolerance:
            manifest["tolerance_override"] = tolerance
        (stage / "manifest.json").write_text(json.dumps(manifest))
        result = host_check(stage, timeout)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    result["kind"] = "prepared-onnx"
    result["what"] = "the prepared ONNX in ONNX Runtime on the host, not the TensorRT engine"
    result["precision_bounds"] = check_prec
    return result


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _summary(check: dict[str, Any]) -> str:
    if "error" in check:
        return "FAILED: " + str(check["error"])
    parts = []
    for name, out in (check.get("outputs") or {}).items():
        m = out.get("metrics", {})
        bits = [f"cos {m['cosine']:.4f}" if "cosine" in m else "", f"rel_l2 {m['rel_l2']:.3g}" if "rel_l2" in m else "",
                f"top1 {top1_text(m)}" if "top1" in m else ""]
        parts.append(f"{name}: " + " ".join(b for b in bits if b)
                     + ("" if out.get("passed") else " FAIL (" + "; ".join(out.get("reasons", [])) + ")"))
    head = "passed" if check.get("passed") else "FAILED"
    return f"{head} at {check.get('precision_bounds')} bounds" + (" (" + "; ".join(parts[:2]) + ")" if parts else "")
