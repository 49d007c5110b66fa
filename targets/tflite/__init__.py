"""``android`` / ``mobile`` (alias ``tflite``) -> a ``.tflite`` file through onnx2tf + TensorFlow Lite.

onnx2tf turns the prepared ONNX model into a TensorFlow SavedModel, moving channels last (NCHW ->
NHWC) the way TFLite kernels want them.  That conversion is the slow part (minutes for a
MobileNet on 2 cores), so it runs once per model and is cached, shared by the precisions;
TensorFlow's TFLite converter then makes the file for one precision from the SavedModel:

- ``fp32``; ``fp16`` (float16 weights, dequantized at load or run in fp16 by GPU delegates);
- ``int8`` with ``--option int8_mode=auto`` (default): an accuracy-aware search in the converter
  child (``convert.Int8Search``): full-integer; if that misses the INT8 bound on the
  validation set, the layers TensorFlow's QuantizationDebugger ranks worst kept float (5%, 15%,
  30%, 50% of the quantized layers); then dynamic-range.  The first candidate that meets the bound
  (``int8_tolerance`` overrides included) is kept, each one judged by the host check's own code;
  none: the build fails naming every attempt's figures.  The manifest keeps the search under
  ``options.int8`` and a line in the notes.  ``int8_mode=full``: full-integer, calibrated on the
  build's calibration data, with float32 or int8 I/O (``--option io_dtype=float32|int8``; int8 I/O
  puts ``artifact_dtype`` and ``quant: [scale, zero_point]`` in the IO spec so the agent quantizes;
  ``auto`` keeps it for its full-integer and selective files); ``int8_mode=dynamic``: dynamic-range
  (int8 weights, float activations).  ``full`` and ``dynamic`` do no search: the host check judges them.

Both conversions run in a child process (``edgeopt.targets.tflite.convert``) with a timeout: it
keeps TensorFlow's global state and onnx2tf's very long output (a log file) away from the worker,
and the last lines of that log go into the error when it fails.

Ops that TFLite has no builtin kernel for would become "Select TF ops" (``FlexErf`` from an Erf);
phones' interpreters lack those, so onnx2tf's builtin replacements are asked for every such op the
model holds (``--option replace_ops=auto``, the default; ``none`` turns them off; or a comma list
of onnx2tf names).  The manifest records what was replaced, the op table with op versions (an old
tflite-runtime refuses newer versions), and any Flex op left, which the host check then reports.

The IO spec maps every ONNX tensor to the file's signature name, shape, layout (``perm``) and
dtype; names come from the SavedModel signature onnx2tf writes, shapes decide where names cannot.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeopt.errors import BuildFailed, UsageError

from ..base import BuildJob, BuildOutput, CheckFailed, Target, output_kinds, parse_tolerance, write_manifest

# ONNX op -> onnx2tf's builtin replacement (``-rtpo``) for ops that would otherwise need Flex.
FLEX_PRONE = {"Erf": "Erf", "Asin": "Asin", "Acos": "Acos", "Atan": "Atan", "MatMulInteger": "MatMulInteger"}
RTPO_NAMES = ("Asin", "Acos", "Atan", "Abs", "PReLU", "LeakyReLU", "Power", "GatherND", "Neg", "HardSwish",
              "Erf", "GeLU", "MatMulInteger")
CHOICES = {"int8_mode": ("auto", "full", "dynamic"), "io_dtype": ("float32", "int8")}
DEFAULT_CONVERT_TIMEOUT = 1500.0
OPTION_KEYS = frozenset({"int8_mode", "io_dtype", "replace_ops", "int8_tolerance", "convert_timeout", "onnx2tf_alt",
                         "onnx2tf_fixes"})

# onnx2tf's own switches for a conversion that came out numerically wrong, in the order tried when a
# float build fails its check (``--option onnx2tf_alt=NAME`` picks one).  Each is a function of the
# job's input names -> onnx2tf.convert keyword arguments.
ONNX2TF_ALTERNATIVES: dict[str, Callable[[list[str]], dict[str, Any]]] = {
    "keep_input_shape": lambda names: {"keep_shape_absolutely_input_names": names},
    "keep_input_nchw": lambda names: {"keep_ncw_or_nchw_or_ncdhw_input_names": names},
    "no_onnxsim": lambda names: {"not_use_onnxsim": True},
    "rnn_unroll": lambda names: {"enable_rnn_unroll": True},
    "param_replacement": lambda names: {"auto_generate_json": True},
}


def varlen_hints(job: BuildJob) -> dict[str, Any]:
    """onnx2tf's ``shape_hints`` for the dynamic form of a variable axis (issue 42): each variable input at its
    top shape (ONNX layout), the shape its dummy inferences and checks run at; {} for every other build."""
    if job.shape_form != "dynamic" or not job.variable:
        return {}
    return {"shape_hints": [f"{t['name']}:{','.join(str(int(d)) for d in t['shape'])}"
                            for t in job.io["inputs"] if t.get("variable")]}


# An INT8 search's failure that is the float conversion's, not the quantization's.
FLOAT_CONVERSION_WRONG = ("the FP32 conversion itself is wrong", "cannot tell which TFLite output")


class TfliteTarget(Target):
    backend = "tflite"
    extra = "tflite"
    ifs_as_where = True  # onnx2tf fails on If (KeyError on a branch's outer initializer): targets.if_select
    # issue 42: a variable axis as the one converted file resized at load to each request (the runner's
    # resize_tensor_input), else padded to the top, else (buckets declared, the one file failing: onnx2tf cannot
    # take MiniLM's or the OCR recogniser's free axis) one static file per bucket (targets.buckets)
    shape_forms = ("dynamic", "static", "buckets")
    # the dynamic form is converted from the model with its variable axes free, onnx2tf given ``shape_hints``
    # (each variable input at its top) for its dummy inferences: without them onnx2tf 1.29 ran its checks at
    # length 1 (ORT: "Invalid input shape: {1}") or fixed the outputs at the top length, so LiteRT could not
    # resize the file; with them the file keeps -1 on the variable axes through to its outputs
    dynamic_from_free = True
    dynamic_retry_runtime = {"delegate": "none"}  # XNNPACK cannot always re-plan a resized graph
    packages = ["onnx2tf", "tensorflow", "tf-keras", "onnx-graphsurgeon", "onnxsim", "ai-edge-litert"]

    def toolchain(self) -> dict[str, str]:
        # rev 1: onnxsim run by edgeopt, then onnx_fixes' rewrites; a failed FP16 file checked against FP32
        return {**super().toolchain(), "converter": "onnx2tf after edgeopt's onnxsim + onnx_fixes rewrites; "
                "fp16 failures checked against the fp32 file (rev 1)",
                "int8": "auto: mixed-scale concatenations float (rev 1)",
                "io": "inputs that read the same in NCHW and NHWC: layout chosen by running (rev 2)",
                "debug_map": "TFLite tensor -> ONNX tensor map (tensor_map.json, rev 3: checked on the written file)"}

    def known_options(self) -> frozenset[str] | None:
        return OPTION_KEYS

    def check_options(self, options: dict[str, Any], precision: str, spec: dict[str, Any]) -> None:
        parse_options(options, precision)  # a bad value is a usage error before anything is built
        parse_tolerance(options.get("int8_tolerance"))  # a typo there too, whatever the precision

    def supported_ops(self, spec: dict[str, Any]) -> set[str] | None:
        """The ONNX ops onnx2tf converts: one module per op in ``onnx2tf/ops`` (found without importing)."""
        found = importlib.util.find_spec("onnx2tf")
        if found is None or not found.submodule_search_locations:
            return None
        ops_dir = Path(list(found.submodule_search_locations)[0]) / "ops"
        ops = {p.stem for p in ops_dir.glob("*.py") if not p.stem.startswith("_")}
        return ops or None

    def _int8_on_a_fixed_conversion(self, job: BuildJob, failure: CheckFailed,
                                    progress: Callable[[str], None]) -> dict[str, Any]:
        """The INT8 search failed because onnx2tf's float conversion is already wrong (its float32 file misses
        the bound, or has an output of another shape): find the alternative switch whose *float* build
        passes its check (a throw-away fp32 build each, seconds), then search INT8 on that conversion."""
        import dataclasses
        import shutil

        tried = []
        for alt in _alternatives(job.prepared_path):
            progress(f"INT8 found the float conversion wrong; checking onnx2tf with {alt} in fp32 first")
            probe_dir = Path(tempfile.mkdtemp(prefix=".fp32-probe-", dir=Path(job.bundle_dir).parent))
            try:
                probe = dataclasses.replace(job, precision="fp32", bundle_dir=str(probe_dir / "b"),
                                            options={**job.options, "onnx2tf_alt": alt})
                m = super().build(probe, progress)
                passed = (m.get("host_check") or {}).get("passed") is True
            except Exception as exc:  # noqa: BLE001 - this switch does not convert: the next one
                passed, m = False, {"host_check": {"error": _ANSI.sub("", (str(exc).splitlines() or ["?"])[0])}}
            finally:
                shutil.rmtree(probe_dir, ignore_errors=True)
            if not passed:
                tried.append(alt)
                continue
            shutil.rmtree(job.bundle_dir, ignore_errors=True)
            try:
                manifest = super().build(dataclasses.replace(job, options={**job.options, "onnx2tf_alt": alt}),
                                         progress)
            except CheckFailed as exc:
                raise CheckFailed(f"{exc.message} (on onnx2tf's conversion with --option onnx2tf_alt={alt}, "
                                  "whose float32 file passes its check; the default conversion's was wrong)",
                                  hint=exc.hint) from None
            manifest.setdefault("notes", []).append(
                f"onnx2tf's default conversion was wrong in float already; INT8 searched on --option "
                f"onnx2tf_alt={alt}, whose float32 file passes its check")
            write_manifest(Path(job.bundle_dir), manifest)
            return manifest
        raise CheckFailed(failure.message, hint=(failure.hint + "; " if failure.hint else "")
                          + f"onnx2tf's alternative switches ({', '.join(tried)}) did not give a float conversion "
                            "that passes either: a target that runs the ONNX itself (cpu, intel-cpu, apple) builds it")

    def _convert_with_alternatives(self, job: BuildJob, failure: BuildFailed,
                                   progress: Callable[[str], None]) -> dict[str, Any]:
        """onnx2tf raised inside its own code (silero-vad's LSTM: ``UnboundLocalError ... 'dummy_tensor'``):
        try its alternative switches and keep the first conversion that builds, recording it; when none
        does, the one-line failure says so and what else builds this model."""
        import dataclasses
        import shutil

        bundle = Path(job.bundle_dir)
        full = _ANSI.sub("", failure.message.removeprefix("TFLite conversion failed: "))
        first = full[:120]
        tried = []
        for alt in _alternatives(job.prepared_path):
            progress(f"onnx2tf failed ({first}); retrying it with {alt}")
            shutil.rmtree(bundle, ignore_errors=True)
            try:
                m2 = super().build(dataclasses.replace(job, options={**job.options, "onnx2tf_alt": alt}), progress)
            except CheckFailed:
                raise  # it converted; the INT8 search's own verdict stands
            except Exception as exc:  # noqa: BLE001 - this switch does not convert either: the next one
                msg = _ANSI.sub("", (str(exc).strip().splitlines() or [type(exc).__name__])[0])
                msg = msg.removeprefix("TFLite conversion failed: ")
                tried.append(f"{alt}: " + ("the same error" if msg[:60] == first[:60] else msg[:80]))
                continue
            h2 = m2.get("host_check") or {}
            if h2.get("passed") is False:
                worst = next((r for o in (h2.get("outputs") or {}).values() for r in o.get("reasons", [])), "failed")
                tried.append(f"{alt}: converts, fails its check ({worst})")
                continue
            m2.setdefault("notes", []).append(
                f"onnx2tf's default conversion failed ({first}); converted with --option onnx2tf_alt={alt}")
            write_manifest(bundle, m2)
            return m2
        shutil.rmtree(bundle, ignore_errors=True)
        if first.startswith("edgeopt's IO matcher"):  # onnx2tf converted; the pairing of its IO failed
            raise BuildFailed(f"TFLite conversion failed: {full[:400]}; onnx2tf's alternative switches did not give a "
                              f"file that pairs either ({'; '.join(tried) or 'none applied'})", hint=failure.hint)
        raise BuildFailed(
            f"TFLite conversion failed: onnx2tf failed inside its own code on this graph ({first}); its "
            f"alternative switches did not convert it either ({'; '.join(tried) or 'none applied'})",
            hint="a converter bug, not your model: a target that runs the ONNX itself (cpu, intel-cpu, apple) "
                 "builds it; " + (failure.hint or ""))

    def build(self, job: BuildJob, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
        """Build; when a float (fp32/fp16) file fails its numeric check, try onnx2tf's alternative
        switches (``ONNX2TF_ALTERNATIVES``) and keep the first that passes, recording it.  When none
        does, the check says the FP32 conversion itself is wrong.  When onnx2tf itself fails (an
        exception inside the converter), the same switches are tried before giving up."""
        import dataclasses
        import shutil

        try:
            manifest = super().build(job, progress)
        except CheckFailed as exc:
            if (job.precision == "int8" and not job.options.get("onnx2tf_alt")
                    and any(sign in exc.message for sign in FLOAT_CONVERSION_WRONG)):
                return self._int8_on_a_fixed_conversion(job, exc, progress)
            raise  # the INT8 search's own verdict on a sound conversion
        except BuildFailed as exc:
            if job.options.get("onnx2tf_alt") or not exc.message.startswith("TFLite conversion failed"):
                raise  # a chosen switch, a timeout or a crash: not retried
            return self._convert_with_alternatives(job, exc, progress)
        hc = manifest.get("host_check") or {}
        if (job.precision not in ("fp32", "fp16") or job.options.get("onnx2tf_alt")
                or hc.get("passed") is not False or "outputs" not in hc):
            return manifest
        first = next((f"{n}: {r}" for n, o in hc["outputs"].items() for r in o.get("reasons", [])), "failed")
        bundle = Path(job.bundle_dir)
        if job.precision == "fp16":
            fp32 = self._fp32_check(job, progress)
            if fp32.get("passed"):  # the conversion is right: float16 weights are what misses
                from edgeopt_agent.compare import summary_line

                manifest["host_check"]["why"] = (
                    "FP16 itself: the FP32 file of the same onnx2tf conversion passes the fp32 check "
                    f"({summary_line(fp32)}), so float16 weights lose this accuracy, not the conversion")
                write_manifest(bundle, manifest)
                return manifest
        tried = []
        for alt in _alternatives(job.prepared_path):
            progress(f"the {job.precision} file failed its check ({first}); retrying onnx2tf with {alt}")
            shutil.rmtree(bundle, ignore_errors=True)
            alt_job = dataclasses.replace(job, options={**job.options, "onnx2tf_alt": alt})
            try:
                m2 = super().build(alt_job, progress)
            except Exception as exc:  # noqa: BLE001 - this switch does not convert: the next one
                msg = _ANSI.sub("", (str(exc).strip().splitlines() or [type(exc).__name__])[0])
                tried.append(f"{alt}: does not convert ({msg[:90]})")
                continue
            h2 = m2.get("host_check") or {}
            if h2.get("passed"):
                m2["notes"].append(f"onnx2tf's default conversion failed the {job.precision} check ({first}); "
                                   f"kept the conversion with --option onnx2tf_alt={alt}, which passes")
                write_manifest(bundle, m2)
                return m2
            worst = next((r for o in (h2.get("outputs") or {}).values() for r in o.get("reasons", [])), "failed")
            tried.append(f"{alt}: {worst}")
            if not tried[:-1] and same_numeric_failure(hc, h2):
                # The switches address converter *errors* (a layout onnx2tf guessed wrong, an unrolled RNN); the
                # same wrong numbers from another switch say the graph itself converts wrong: more switches
                # only cost time (an already-quantized transformer: 15 min of equally wrong files)
                tried.append("the first retry repeated the same numeric failure, so the other switches were not "
                             "tried (they address converter errors, not this)")
                progress(f"the {job.precision} file of {alt} fails the same way ({worst}); not trying more switches")
                break
        shutil.rmtree(bundle, ignore_errors=True)
        manifest = super().build(job, progress)  # the default conversion, as the bundle to report
        manifest["host_check"]["error"] = (
            f"the FP32 conversion itself is wrong (onnx2tf: {first}), not a precision problem; "
            f"onnx2tf's alternative switches did not fix it ({'; '.join(tried) or 'none applied'})")
        write_manifest(bundle, manifest)
        return manifest

    def _fp32_check(self, job: BuildJob, progress: Callable[[str], None]) -> dict[str, Any]:
        """The host check of the FP32 file of the same (cached) onnx2tf conversion, built in scratch."""
        import dataclasses
        import shutil

        progress(f"the {job.precision} file failed its check; checking the FP32 file of the same conversion")
        scratch = Path(tempfile.mkdtemp(prefix=".tflite-fp32-", dir=Path(job.bundle_dir).parent))
        try:
            m = super().build(dataclasses.replace(job, precision="fp32", bundle_dir=str(scratch / "b")), progress)
            return m.get("host_check") or {}
        except Exception as exc:  # noqa: BLE001 - no FP32 file either: the conversion is what is wrong
            return {"passed": False, "error": str(exc)}
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _build(self, job: BuildJob, progress: Callable[[str], None]) -> BuildOutput:
        opts = parse_options(job.options, job.precision)
        replace, replaced_nodes = replacements(job.prepared_path, opts["replace_ops"])
        bundle = Path(job.bundle_dir)
        work = Path(tempfile.mkdtemp(prefix=".tflite-", dir=bundle.parent))
        try:
            request = {
                "prepared_path": job.prepared_path, "calib_path": job.calib_path,
                "validation_path": job.validation_path, "reference_path": job.reference_path,
                "io": job.io, "precision": job.precision, "int8_mode": opts["int8_mode"],
                "io_dtype": opts["io_dtype"], "tolerance": opts["tolerance"], "replace": replace,
                "output_kinds": output_kinds(job), "accept": job.accept,
                "onnx2tf_alt": opts["onnx2tf_alt"], "onnx2tf_fixes": opts["onnx2tf_fixes"],
                "onnx2tf_kwargs": {**(ONNX2TF_ALTERNATIVES[opts["onnx2tf_alt"]]([t["name"] for t in job.io["inputs"]])
                                      if opts["onnx2tf_alt"] else {}), **varlen_hints(job)},
                "shape_form": job.shape_form,  # issue 42: the dynamic form's INT8 calibrates at the own lengths
                "out": str(bundle / "model.tflite"),
                "work": str(work), "cache_dir": str(_cache_root()), "log": str(work / "convert.log"),
            }
            reply = run_converter(request, work, opts["convert_timeout"], progress)
        finally:
            import shutil

            shutil.rmtree(work, ignore_errors=True)

        notes = ([reply["int8_note"]] if reply.get("int8_note") else []) + list(reply.get("notes", []))
        if opts["io_dtype_ignored"]:
            notes.append("io_dtype=int8 applies to full-integer int8 builds only; this file keeps float I/O")
        elif opts["io_dtype"] == "int8" and reply["io_dtype"] != "int8":
            notes.append("io_dtype=int8 was not kept: the int8 search chose dynamic-range, whose I/O is float")
        warnings = list(reply.get("warnings", []))
        if replaced_nodes:
            notes.append("builtin replacements asked of onnx2tf (so no Select TF op is needed): "
                         + ", ".join(f"{op} x{n}" for op, n in replaced_nodes.items()))
        ops = reply["ops"]
        if ops["flex_ops"]:
            warnings.append(f"the file needs Select TensorFlow ops {ops['flex_ops']}: it runs only with "
                            "TensorFlow's interpreter, not with LiteRT/tflite-runtime as phones ship them"
                            + ("" if replace else "; drop --option replace_ops=none to get builtin replacements"))
        runtime_options: dict[str, Any] = {"delegate": "xnnpack"}
        delegates = job.target.get("profile", {}).get("delegates")
        if delegates:
            runtime_options["delegates_supported"] = list(delegates)
        options = {"int8_mode": opts["int8_mode"] if job.precision == "int8" else None,
                   "onnx2tf_alt": opts["onnx2tf_alt"], "onnx2tf_fixes": None if opts["onnx2tf_fixes"] else False,
                   "io_dtype": reply["io_dtype"], "replace_ops": replace,
                   "converter_ops": reply["converter"]["supported_ops"], "int8": reply.get("int8")}
        extra: dict[str, Any] = {}
        if opts["tolerance"]:
            extra["tolerance_override"] = opts["tolerance"]
            notes.append(f"int8 bound overridden by the user: {opts['tolerance']}")
        return BuildOutput(
            runtime={"name": "tflite", "artifact": "model.tflite", "options": runtime_options},
            options={k: v for k, v in options.items() if v is not None},
            io=reply["io"], notes=notes, warnings=warnings,
            extra_manifest={"tflite": {
                "ops": ops["ops"], "flex_ops": ops["flex_ops"], "custom_ops": ops["custom_ops"],
                "min_runtime_version": ops["min_runtime_version"],
                "replaced": replaced_nodes, "converter": reply["converter"], "timings": reply["timings"]},
                **extra})


# --- options -------------------------------------------------------------------------------------
def parse_options(options: dict[str, Any], precision: str) -> dict[str, Any]:
    """This backend's ``--option`` values, checked (other backends' keys are ignored)."""
    out: dict[str, Any] = {"int8_mode": str(options.get("int8_mode", "auto")).lower(),
                           "io_dtype": str(options.get("io_dtype", "float32")).lower()}
    out["onnx2tf_alt"] = options.get("onnx2tf_alt") or None
    fixes = str(options.get("onnx2tf_fixes", "true")).lower()
    if fixes not in ("true", "false"):
        raise UsageError(f"--option onnx2tf_fixes={options['onnx2tf_fixes']!r}: expected true or false",
                         hint="false hands onnx2tf the model as it is (its own onnxsim, none of edgeopt's rewrites)")
    out["onnx2tf_fixes"] = fixes == "true"
    if out["onnx2tf_alt"] and out["onnx2tf_alt"] not in ONNX2TF_ALTERNATIVES:
        raise UsageError(f"--option onnx2tf_alt={out['onnx2tf_alt']!r} is not one of "
                         + ", ".join(ONNX2TF_ALTERNATIVES), hint="e.g. --option onnx2tf_alt=keep_input_shape")
    for key, allowed in CHOICES.items():
        if out[key] not in allowed:
            raise UsageError(f"--option {key}={options.get(key)!r} is not one of {', '.join(allowed)}",
                             hint=f"e.g. --option {key}={allowed[0]}")
    # Options apply to every precision of a build: int8 I/O only to the full-integer one (and to
    # auto, whose full-integer and selective files keep it).
    out["io_dtype_ignored"] = out["io_dtype"] == "int8" and not (precision == "int8"
                                                                 and out["int8_mode"] in ("full", "auto"))
    if out["io_dtype_ignored"]:
        out["io_dtype"] = "float32"
    rep = str(options.get("replace_ops", "auto"))
    if rep not in ("auto", "none"):
        names = [n.strip() for n in rep.split(",") if n.strip()]
        bad = [n for n in names if n not in RTPO_NAMES]
        if bad:
            raise UsageError(f"--option replace_ops: unknown op(s) {bad}",
                             hint=f"auto, none, or a comma list of: {', '.join(RTPO_NAMES)}")
        rep = ",".join(names)
    out["replace_ops"] = rep
    out["tolerance"] = parse_tolerance(options.get("int8_tolerance")) if precision == "int8" else None
    try:
        out["convert_timeout"] = float(options.get("convert_timeout", DEFAULT_CONVERT_TIMEOUT))
    except (TypeError, ValueError):
        raise UsageError(f"--option convert_timeout={options.get('convert_timeout')!r} is not a number "
                         "of seconds") from None
    return out


def replacements(model_path: str, setting: str) -> tuple[list[str], dict[str, int]]:
    """onnx2tf replacement names to ask for, and the ONNX nodes (op -> count) they concern."""
    import onnx

    counts: dict[str, int] = {}
    for node in _all_nodes(onnx.load(model_path, load_external_data=False).graph):
        if node.domain in ("", "ai.onnx"):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    if setting == "none":
        return [], {}
    if setting == "auto":
        names = sorted({FLEX_PRONE[op] for op in counts if op in FLEX_PRONE})
    else:
        names = setting.split(",")
    lowered = {n.lower() for n in names}
    return names, {op: n for op, n in counts.items() if op.lower() in lowered}


def _all_nodes(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g is not None and attr.g.node:
                yield from _all_nodes(attr.g)
            for g in attr.graphs:
                yield from _all_nodes(g)


def _cache_root() -> Path:
    from edgeopt.pipeline import cache_dir

    return cache_dir() / "onnx2tf"


# --- the converter child process -----------------------------------------------------------------
HEARTBEAT_S = 30.0  # a "still converting" line at least this often while the converter is silent

def run_converter(request: dict[str, Any], work: Path, timeout: float,
                  progress: Callable[[str], None]) -> dict[str, Any]:
    """Run ``edgeopt.targets.tflite.convert`` on ``request``; relay its progress; its reply or BuildFailed."""
    req_path, reply_path, prog_path, log_path = (work / n for n in
                                                 ("request.json", "reply.json", "progress.txt", "convert.log"))
    req_path.write_text(json.dumps(request))
    prog_path.write_text("")
    env = dict(os.environ)
    # onnx2tf runs `onnxsim` by name: the venv's bin must be on PATH even when it is not activated.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "edgeopt.targets.tflite.convert", str(req_path),
                                 str(reply_path), str(prog_path)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=work, env=env, start_new_session=True)
        seen, last_beat = 0, t0
        last: list[Any] = []  # [the step the converter last announced, when]
        while True:
            try:
                proc.wait(timeout=2)
                break
            except subprocess.TimeoutExpired:
                pass
            seen = _relay(prog_path, seen, progress, last)
            now = time.monotonic()
            if now - t0 > timeout:
                _kill(proc)
                raise BuildFailed(f"the TFLite conversion took longer than {timeout:.0f}s and was stopped",
                                  hint="raise it with --option convert_timeout=SECONDS; last output: "
                                  + " | ".join(log_tail(log_path, 3)))
            if now - last_beat >= HEARTBEAT_S:  # which step is running, and for how long
                limit = f"{now - t0:.0f}s of the {timeout:.0f}s limit (convert_timeout)"
                progress(f"still converting: {last[0]} for {now - last[1]:.0f}s ({limit})" if last
                         else f"still converting ({limit})")
                last_beat = now
        _relay(prog_path, seen, progress, last)
    try:
        reply = json.loads(reply_path.read_text())
    except (OSError, ValueError):
        stopped = interrupted_by(proc.returncode)
        if stopped:  # someone stopped it (kill, a CI cancel, timeout): not a converter crash
            raise BuildFailed(f"the TFLite conversion was interrupted ({stopped}) after {time.monotonic() - t0:.0f}s",
                              hint="nothing was built; run the build again to convert") from None
        from edgeopt.killed import model_size, sigkill_words

        oom = sigkill_words(proc.returncode, "the TFLite converter (onnx2tf)", model_size(request.get("prepared_path")))
        if oom:
            raise BuildFailed(oom[0], hint=oom[1] + "; last output: " + " | ".join(log_tail(log_path, 3))) from None
        sig = f" (signal {-proc.returncode})" if proc.returncode < 0 else ""
        raise BuildFailed(f"the TFLite converter crashed: exit code {proc.returncode}{sig}",
                          hint="last output: " + " | ".join(log_tail(log_path, 5))) from None
    if reply.get("kind") == "int8_search":  # ran to the end, no INT8 candidate met the bound: its own line
        raise CheckFailed(reply["error"], hint=reply.get("hint"), accuracy=True)
    if reply.get("kind") == "io_match":  # onnx2tf finished; edgeopt's own matcher stopped (not onnx2tf's fault)
        raise BuildFailed(f"TFLite conversion failed: {reply['error']}", hint=reply.get("hint"))
    if not reply.get("ok"):
        tail = log_tail(log_path, 8)
        raise BuildFailed(f"TFLite conversion failed: {reply.get('error')}",
                          hint=("the converter's last output: " + " | ".join(tail)) if tail else None)
    return reply


def interrupted_by(returncode: int | None) -> str | None:
    """The signal's name when a child ended by SIGTERM, SIGINT or SIGHUP (stopped, not crashed), else None."""
    import signal

    stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    if returncode is not None and returncode < 0 and -returncode in {int(s) for s in stops}:
        return signal.Signals(-returncode).name
    return None


def _relay(path: Path, seen: int, progress: Callable[[str], None], last: list[Any] | None = None) -> int:
    """Pass the converter's new progress lines on; ``last`` keeps the latest step and when it began."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return seen
    for line in lines[seen:]:
        progress(line)
        if last is not None:
            last[:] = [line.split(";")[0].rstrip(":"), time.monotonic()]
    return len(lines)


def _kill(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child and whatever onnx2tf started (onnxsim)
    except (OSError, AttributeError):
        proc.kill()
    proc.wait()


_NOISE = re.compile(r"^([IWE]\d{4} |\d{4}-\d\d-\d\d |WARNING: All log messages|To enable the following|\s*$)")
# A Python traceback's frames (our own or Keras'): never shown to the user, only its last line is.
_TRACEBACK = re.compile(r"^(Traceback \(most recent call last\):|\s+File \"|\s{2,}\S|\s*[\^~]+\s*$|"
                        r"During handling of the above exception|The above exception was the direct cause|== .* failed:$)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def log_tail(path: Path, n: int) -> list[str]:
    """The last ``n`` meaningful lines of a converter log (TensorFlow's C++ chatter dropped)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    plain = [_ANSI.sub("", ln) for ln in lines]
    keep = [ln.strip() for ln in plain if not _NOISE.match(ln) and not _TRACEBACK.match(ln)]
    return [ln[:300] for ln in keep[-n:]]


# --- matching the file's tensors to the ONNX tensors ---------------------------------------------
def same_numeric_failure(a: dict[str, Any], b: dict[str, Any], rel: float = 0.02) -> bool:
    """Two host checks that failed the same way: the same outputs failing the same metrics, each failing
    figure within ``rel`` (relative) of the other's -- another conversion, the same wrong numbers."""
    def failing(hc: dict[str, Any]) -> dict[str, dict[str, float]]:
        return {n: {k: float(v) for k, v in (o.get("metrics") or {}).items()
                    if isinstance(v, (int, float)) and k in ("rel_l2", "cosine", "top1", "seq_match", "flip_rate")}
                for n, o in (hc.get("outputs") or {}).items() if o.get("passed") is False}

    fa, fb = failing(a), failing(b)
    if not fa or set(fa) != set(fb):
        return False
    for n, ma in fa.items():
        keys = set(ma) & set(fb[n])
        if not keys or any(abs(ma[k] - fb[n][k]) > rel * max(abs(ma[k]), abs(fb[n][k]), 1e-6) for k in keys):
            return False
    return True


def _alternatives(path: str) -> list[str]:
    """The onnx2tf switches worth a try on this model (``rnn_unroll`` only where it has a recurrent op)."""
    return [alt for alt in ONNX2TF_ALTERNATIVES if alt != "rnn_unroll" or _has_rnn(path)]


def _has_rnn(path: str) -> bool:
    try:
        import onnx

        return any(n.op_type in ("LSTM", "GRU", "RNN") for n in onnx.load(path, load_external_data=False).graph.node)
    except Exception:  # noqa: BLE001
        return False


def channels_last(rank: int) -> list[int]:
    """onnx2tf's layout change: NCHW -> NHWC (and NCW -> NWC, NCDHW -> NDHWC)."""
    return [0, *range(2, rank), 1]


def candidate_perms(onnx_shape: list[int], artifact_shape: list[int]) -> list[list[int]]:
    """The perms (identity, channels-last) that turn the ONNX shape into the artifact's; a -1 in the artifact's
    shape (a variable axis of the dynamic form, issue 42) takes any size."""
    rank = len(onnx_shape)
    cands: list[list[int]] = []
    for perm in [list(range(rank))] + ([channels_last(rank)] if rank >= 3 else []):
        if len(artifact_shape) == rank and all(a in (-1, onnx_shape[i]) for i, a in zip(perm, artifact_shape)) \
                and perm not in cands:
            cands.append(perm)
    return cands


def onnx2tf_name(name: str) -> str:
    """An ONNX tensor name as onnx2tf names the SavedModel signature input."""
    return re.sub("^/", "wa/", name.replace(":", "__"))


def tf_arg_name(name: str) -> str:
    """A name as TensorFlow's SavedModel writes a function argument (``function_type.sanitize_arg_name``): every
    character that is not alphanumeric becomes ``_``, and one that does not start with a letter gets ``arg_``
    (torch's numbered inputs '0', '1' become signature inputs 'arg_0', 'arg_1')."""
    swapped = "".join(c if c.isalnum() else "_" for c in name) or "_"
    return swapped if swapped[0].isalpha() else "arg_" + swapped


def _norm(name: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", name.lower()).strip("_")


def art_shape(spec: dict[str, Any], art: dict[str, Any]) -> list[int]:
    """The artifact tensor's shape to pair with: its signature where that has a dynamic axis (-1: the dynamic
    form of a variable axis, issue 42, where LiteRT reports 1 until resized; -1 takes any size), else its shape."""
    sig = art.get("shape_signature")
    return list(sig) if sig is not None and -1 in list(sig) else list(art["shape"])


def match_tensors(onnx_specs: list[dict[str, Any]], art: list[dict[str, Any]], kind: str,
                  notes: list[str]) -> list[tuple[dict[str, Any], dict[str, Any], list[list[int]]]]:
    """Pair each ONNX tensor with one artifact tensor: by name (outputs: ``output_<i>`` is ONNX
    output i, as onnx2tf exports them), then by shape; each pair with its candidate perms."""
    left = list(art)
    pairs: dict[str, tuple[dict[str, Any], list[list[int]]]] = {}

    def take(spec: dict[str, Any], a: dict[str, Any]) -> bool:
        cands = candidate_perms(spec["shape"], art_shape(spec, a))
        if not cands:
            return False
        pairs[spec["name"]] = (a, cands)
        left.remove(a)
        return True

    for i, spec in enumerate(onnx_specs):
        wanted = {spec["name"], onnx2tf_name(spec["name"]), tf_arg_name(onnx2tf_name(spec["name"]))}
        a = next((t for t in left if t["name"] in wanted), None) \
            or next((t for t in left if _norm(t["name"]) == _norm(spec["name"])), None)
        positional = False
        if a is None and kind == "output":
            a = next((t for t in left if t["name"] == f"output_{i}"), None)
            positional = a is not None
        if a is not None and take(spec, a) and positional:
            notes.append(f"output {spec['name']!r} is TFLite signature output {a['name']!r} by position "
                         "(onnx2tf names outputs output_<i> in ONNX order; its shape agrees)")
    for spec in onnx_specs:
        if spec["name"] in pairs:
            continue
        fits = [t for t in left if candidate_perms(spec["shape"], art_shape(spec, t))]
        if len(fits) != 1:
            shapes = [(t["name"], t["shape"]) for t in left]
            raise BuildFailed(f"cannot tell which TFLite {kind} is ONNX {kind} {spec['name']!r} "
                              f"{spec['shape']}: " + (f"{len(fits)} of {shapes} fit its shape" if fits else
                                                      f"none of {shapes} has its shape in NCHW or NHWC order"
                                                      + (": onnx2tf converted the graph wrongly (seen on a "
                                                         "stacked LSTM's last hidden state), not a precision "
                                                         "problem; try --option onnx2tf_alt="
                                                         + "|".join(ONNX2TF_ALTERNATIVES) + ", or a target "
                                                         "that runs the ONNX itself (cpu, intel-cpu, apple)"
                                                         if kind == "output" else "")))
        notes.append(f"{kind} {spec['name']!r} matched to TFLite tensor {fits[0]['name']!r} by shape "
                     "(the names differ)")
        take(spec, fits[0])
    return [(spec, *pairs[spec["name"]]) for spec in onnx_specs]


def io_entry(spec: dict[str, Any], art: dict[str, Any], perm: list[int]) -> dict[str, Any]:
    """One IO spec entry: the ONNX tensor plus how the artifact holds it (see edgeopt_agent.bundle)."""
    rank = len(spec["shape"])
    identity = perm == list(range(rank))
    entry = {**spec, "artifact_name": art["name"], "artifact_shape": list(art_shape(spec, art)),
             "perm": None if identity else list(perm)}
    letters = spec.get("layout")
    if letters and len(letters) == rank:
        entry["artifact_layout"] = "".join(letters[i] for i in perm)
    else:  # the ONNX side declares no layout: say only what onnx2tf did
        entry["artifact_layout"] = None if identity else "channels_last"
    if art["dtype"] != spec["dtype"]:
        entry["artifact_dtype"] = art["dtype"]
        if art.get("quant"):
            entry["quant"] = list(art["quant"])
    return entry
