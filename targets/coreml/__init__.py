"""``apple`` (alias ``coreml``) -> a Core ML ML Program (``model.mlpackage``), FP16 by default.

coremltools has had no ONNX frontend for years, so the graph is translated here, op by op
(``ops*``), into coremltools' MIL builder; ``ct.convert`` turns the program into an ML
Program with FP16 (or FP32) compute and the minimum deployment target the user picks
(``--option min_deployment_target=iOS17``; default from the target profile).

The host check: Core ML predicts only on macOS.  On Linux the check is *structural* and says so:
the saved package loads (its MIL program is re-read from disk with its weights and every op's
types re-inferred), its inputs/outputs match the ONNX model's names, shapes and dtypes, and the
output shapes Core ML infers equal the shapes ONNX Runtime produced on the validation inputs.
The numeric check runs on the device (the agent's ``coreml`` runner).  On macOS the build runs
the numeric host check through that same runner.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeopt.errors import UsageError

from ..base import BuildJob, BuildOutput, CheckFailed, Target, require

ARTIFACT = "model.mlpackage"
COMPUTE_UNITS = ("ALL", "CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE")
NOTE = "Core ML cannot predict on Linux: numeric check on device"


def import_coremltools() -> Any:
    """coremltools, imported without its TensorFlow/PyTorch/scikit-learn frontends.

    ``import coremltools`` imports TensorFlow, torch and scikit-learn when they are installed
    (~15 s and ~1 GB here) only to offer converters we never call.  Those not loaded yet are hidden
    for the duration of the import and restored right after, so later imports of them work normally.
    """
    if "coremltools" in sys.modules:
        return sys.modules["coremltools"]
    hidden = [m for m in ("tensorflow", "torch", "sklearn") if m not in sys.modules]
    for m in hidden:
        sys.modules[m] = None  # type: ignore[assignment]  # makes `import m` raise ImportError
    try:
        return require("coremltools", "coreml")
    finally:
        for m in hidden:
            if sys.modules.get(m) is None:
                del sys.modules[m]


def deployment_target(ct: Any, name: str) -> tuple[Any, str]:
    """``"ios17"`` -> (``ct.target.iOS17``, ``"iOS17"``); ML Program-capable targets only.

    ``macOS13`` and the other OS names are aliases of the iOS members with the same spec version.
    """
    members = ct.target.__members__  # includes the aliases, which iterating the enum skips
    first = int(ct.target.iOS15)  # ML Programs start at spec version 6 (iOS15/macOS12)
    valid = [k for k, v in members.items() if int(v) >= first]
    key = next((k for k in valid if k.lower() == str(name).strip().lower()), None)
    if key is None:
        raise UsageError(f"min_deployment_target {name!r} is not a Core ML ML Program target",
                         hint="one of " + ", ".join(valid))
    return members[key], key


def compute_units(value: Any) -> str:
    """Validate ``compute_units`` (the agent's runner option)."""
    v = str(value or "ALL").upper()
    if v not in COMPUTE_UNITS:
        raise UsageError(f"compute_units {value!r} is not one of {', '.join(COMPUTE_UNITS)}")
    return v


class CoreMlTarget(Target):
    """ONNX -> MIL -> ML Program; structural host check on Linux, numeric on macOS."""

    backend = "coreml"
    extra = "coreml"
    ifs_as_where = True  # the ONNX -> MIL translator has no If: targets.if_select
    packages = ["coremltools"]
    check_kind = "structural"
    fp16_range_own = True  # fp16: the layers FP16 would overflow stay FP32 (FP16ComputePrecision op_selector)

    def toolchain(self) -> dict[str, str]:
        # rev 1: fp16 keeps the layers FP16 would overflow in FP32; Clip bounds computed at run time
        return {**super().toolchain(), "translator": "edgeopt ONNX -> MIL, fp16 overflow layers FP32 (rev 1)"}

    def known_options(self) -> frozenset[str] | None:
        return frozenset({"min_deployment_target", "compute_units"})

    def check_options(self, options: dict[str, Any], precision: str, spec: dict[str, Any]) -> None:
        compute_units(options.get("compute_units"))
        if options.get("min_deployment_target"):  # coremltools knows the names: import it only then
            log = logging.getLogger("coremltools")
            level = log.level
            log.setLevel(logging.ERROR)  # not its "Failed to load _MLModelProxy" lines (no Core ML on Linux)
            try:
                ct = import_coremltools()
            finally:
                log.setLevel(level)
            deployment_target(ct, options["min_deployment_target"])

    def supported_ops(self, spec: dict[str, Any]) -> set[str] | None:
        from .ops import supported_op_types

        return set(supported_op_types())

    def unsupported_nodes(self, info, spec: dict[str, Any]) -> list[tuple[str, str]]:
        """Ops outside the translator's table, and shape arguments computed from input *values*
        (the translator needs them constant once the input shapes are fixed) -- the same refusal
        ``build`` would make, so that ``inspect`` and ``build`` agree."""
        bad = super().unsupported_nodes(info, spec)
        try:
            import onnx

            graph = onnx.load(info.path, load_external_data=False).graph
        except Exception:  # noqa: BLE001 - unreadable here: the op table is all we can say
            return bad
        listed = {name for _, name in bad}
        return bad + [(f"{op} (shape computed from input values)", name) for op, name in value_shaped_nodes(graph)
                      if name not in listed]

    def _build(self, job: BuildJob, progress: Callable[[str], None]) -> BuildOutput:
        import onnx

        from .ops import convert

        opts = job.options
        profile = job.target.get("profile", {})
        units = compute_units(opts.get("compute_units"))
        ct = import_coremltools()
        target, target_name = deployment_target(ct, opts.get("min_deployment_target")
                                                or profile.get("minimum_deployment_target") or "iOS16")
        precision = {"fp16": ct.precision.FLOAT16, "fp32": ct.precision.FLOAT32}.get(job.precision)
        if precision is None:
            raise UsageError(f"Core ML takes fp16 or fp32, not {job.precision}")

        progress(f"translating ONNX -> MIL ({target_name})")
        conv = convert(onnx.load(job.prepared_path), ct, target, job.target["name"])
        range_notes, range_warnings = [], []
        if job.precision == "fp16":
            precision, range_notes, range_warnings = fp16_precision(ct, conv, job)
        progress(f"{conv.translated} ops translated, {conv.folded} folded, {conv.fused} LayerNorms fused; "
                 f"ct.convert to ML Program ({job.precision})")
        model = ct.convert(conv.program, convert_to="mlprogram", compute_precision=precision,
                           minimum_deployment_target=target, skip_model_load=True)
        package = Path(job.bundle_dir) / ARTIFACT
        model.save(str(package))
        planned = planned_flexible(job.variable, ct, job.io) if job.variable else {}

        io = artifact_io(job.io, conv)
        progress("structural check")
        structural = structural_check(ct, package, io)
        if not structural["passed"] and not opts.get("allow_mismatch"):
            raise CheckFailed("Core ML structural check failed: " + "; ".join(structural["problems"]),
                              hint="use --allow-mismatch to keep the bundle anyway")
        on_mac = sys.platform == "darwin"
        notes = [f"converted by edgeopt's ONNX->MIL translator: {conv.translated} ops translated, "
                 f"{conv.folded} constant-folded, {conv.fused} decomposed LayerNorms fused",
                 *range_notes,
                 *(["variable axes: built static at the top shape, requests padded to it; the planned form "
                    f"{ {k: v for k, v in planned.items() if ':' not in k} } is recorded (made with coremltools' "
                    "ct.TensorType/EnumeratedShapes/RangeDim, options.enumerated_shapes_planned), not built: "
                    "edgeopt's ONNX->MIL translator fixes every shape when it translates, and a program made flexible "
                    "afterwards fails to load ('Cannot convert symbols to int'); no macOS here to load one"]
                   if planned else []),
                 "numeric check: on host (Core ML runner)" if on_mac else "numeric check: on device"]
        return BuildOutput(
            runtime={"name": "coreml", "artifact": ARTIFACT, "options": {"compute_units": units}},
            options={"min_deployment_target": target_name, "compute_precision": job.precision,
                     "compute_units": units, **({"enumerated_shapes_planned": planned} if planned else {})},
            io=io, check="numeric" if on_mac else "structural", structural=structural, notes=notes,
            warnings=range_warnings, extra_manifest={"structural_check": structural} if on_mac else {})


def fp16_precision(ct: Any, conv: Any, job: BuildJob) -> tuple[Any, list[str], list[str]]:
    """Core ML's fp16 compute precision, with the layers FP16 would overflow kept in FP32: the FP16
    range analysis (``base.fp16_overflow_of``, TensorRT's) on the validation inputs names the tensors
    past 65504, and ``FP16ComputePrecision``'s op selector leaves the ops that read or write them in
    FP32 (a log-mel's power spectrum reaches ~1e10 on raw PCM: Inf in FP16).  (precision, notes, warnings)."""
    from ..base import fp16_overflow_of

    try:
        over = fp16_overflow_of(job)
    except Exception as exc:  # noqa: BLE001 - the analysis must not stop a build
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return ct.precision.FLOAT16, [], [f"FP16 range check skipped ({why}): layers past FP16's range would "
                                          "give Inf/NaN; build fp32 if in doubt"]
    if not over:
        return ct.precision.FLOAT16, [], []
    selector, nodes = conv.fp32_selector({t for t, _ in over})
    shown = ", ".join(f"{t} reaches {v:.3g}" for t, v in over[:4]) + (f" (+{len(over) - 4} more)" if len(over) > 4 else "")
    return (ct.transform.FP16ComputePrecision(op_selector=selector),
            [f"fp16 with {nodes} ONNX node(s) kept in FP32, where FP16 (max 65504) would overflow on the "
             f"validation inputs: {shown}"], [])


# Inputs that must be constant for the ONNX -> MIL translation (index -> the op's shape argument).
SHAPE_ARGS = {"Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Squeeze": (1,),
              "Unsqueeze": (1,), "ConstantOfShape": (0,), "Resize": (2, 3), "Upsample": (1,), "Pad": (1, 2)}


def value_shaped_nodes(graph: Any) -> list[tuple[str, str]]:
    """(op, node name) of the nodes whose shape argument depends on a model input's *values*.

    Shape/Size outputs depend on shapes only: with static input shapes they fold to constants, and the
    translator folds them.  Anything fed by an input's values (a length, a computed Reshape target)
    stays dynamic, which Core ML's MIL cannot take."""
    inits = {i.name for i in graph.initializer}
    dynamic = {i.name for i in graph.input if i.name not in inits}
    found = []
    for i, node in enumerate(graph.node):
        args = SHAPE_ARGS.get(node.op_type, ())
        if any(k < len(node.input) and node.input[k] in dynamic for k in args):
            found.append((node.op_type, node.name or f"<unnamed {node.op_type} #{i}>"))
        if node.op_type in ("Shape", "Size") or node.op_type == "Constant":
            continue
        if any(x in dynamic for x in node.input if x):
            dynamic.update(o for o in node.output if o)
    return found


def planned_flexible(variable: dict[str, list[dict[str, Any]]], ct: Any = None,
                     io: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """Per variable input, the Core ML flexibility its declared bounds map to (issue 42): buckets ->
    ``EnumeratedShapes`` of the bucket sizes (each Neural Engine eligible, at most 128); a range ->
    ``RangeDim(lo, hi)`` (the Neural Engine runs only the default shape). With ``ct`` (coremltools) each input's
    form is also made with coremltools' own classes (``ct.TensorType`` of ``ct.EnumeratedShapes`` / a
    ``ct.Shape`` of ``ct.RangeDim``, default the top shape), and the input type's shapes are recorded as
    coremltools reads them: a converter-level record of the form, not a built flexible model (no macOS here)."""
    out: dict[str, Any] = {}
    tops = {t["name"]: list(t["shape"]) for t in (io or {}).get("inputs", [])}
    for name, var in variable.items():
        for v in var:
            out[f"{name}[{v['axis']}]"] = ({"EnumeratedShapes": list(v["buckets"])} if "buckets" in v else
                                           {"RangeDim": list(v["range"]), "caveat": "Neural Engine at the default "
                                            "shape only"})
        if ct is None or name not in tops:
            continue
        top = tops[name]
        if all("buckets" in v for v in var):
            import itertools

            axes = [int(v["axis"]) for v in var]
            shapes = []
            for combo in itertools.product(*[v["buckets"] for v in var]):
                s = list(top)
                for a, b in zip(axes, combo):
                    s[a] = int(b)
                shapes.append(s)
            shape = ct.EnumeratedShapes(shapes=shapes[:128], default=top)
            made = {"coremltools": f"ct.TensorType(name={name!r}, shape=ct.EnumeratedShapes(shapes=..., default={top}))",
                    "shapes": [[int(d) for d in getattr(x, "shape", x)] for x in shape.shapes],
                    "default": [int(d) for d in getattr(shape.default, "shape", shape.default)]}
        else:
            dims: list[Any] = list(top)
            for v in var:
                lo, hi = v["range"] if "range" in v else (1, max(v["buckets"]))
                dims[int(v["axis"])] = ct.RangeDim(lower_bound=int(lo), upper_bound=int(hi), default=int(hi))
            shape = ct.Shape(shape=dims)
            made = {"coremltools": f"ct.TensorType(name={name!r}, shape=ct.Shape([..ct.RangeDim..]))",
                    "symbolic": [str(d) for d in shape.symbolic_shape],
                    "default": [int(d) for d in getattr(shape.default, "shape", shape.default)]}
        ct.TensorType(name=name, shape=shape)  # coremltools' own input type: it checks the shapes
        out[f"{name}:input_type"] = {**made, "coremltools_version": getattr(ct, "__version__", "?")}
    return out


def artifact_io(io: dict[str, list[dict[str, Any]]], conv: Any) -> dict[str, list[dict[str, Any]]]:
    """The job's ONNX IO spec plus the package's names and dtypes (``artifact_name``/``artifact_dtype``)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for kind, mapped in (("inputs", conv.inputs), ("outputs", conv.outputs)):
        by_name = {m["name"]: m for m in mapped}
        out[kind] = [{**t, "artifact_name": by_name[t["name"]]["artifact_name"],
                      "artifact_dtype": by_name[t["name"]]["artifact_dtype"]} for t in io[kind]]
    return out


_SPEC_DTYPES = {"FLOAT32": "float32", "FLOAT16": "float16", "INT32": "int32", "DOUBLE": "float64"}


def _feature(f: Any) -> tuple[str, list[int], str]:
    from coremltools.proto import FeatureTypes_pb2

    arr = f.type.multiArrayType
    dt = FeatureTypes_pb2.ArrayFeatureType.ArrayDataType.Name(arr.dataType)
    return f.name, [int(d) for d in arr.shape], _SPEC_DTYPES.get(dt, dt.lower())


def structural_check(ct: Any, package: Path, io: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """What can be proven about a package without running it (see the module docstring)."""
    from coremltools.converters.mil.frontend.milproto.load import load as load_mil

    problems: list[str] = []
    try:
        model = ct.models.MLModel(str(package), skip_model_load=True)
        spec = model.get_spec()
        # Re-reading the program from disk re-infers every op's output type, weights included.
        prog = load_mil(spec, spec.specificationVersion, model.weights_dir)
        mil_out = {v.name: [int(d) for d in v.shape] for v in prog.functions["main"].outputs}
    except Exception as exc:
        return {"passed": False, "loads": False, "inputs_match": False, "outputs_match": False, "output_shapes": {},
                "problems": [f"the package does not load: {type(exc).__name__}: {exc}"], "note": NOTE}

    inputs = [_feature(f) for f in spec.description.input]
    if len(inputs) != len(io["inputs"]):
        problems.append(f"{len(inputs)} package inputs for {len(io['inputs'])} ONNX inputs")
    for t, (name, shape, dtype) in zip(io["inputs"], inputs):
        want = (t["artifact_name"], list(t["shape"]), t["artifact_dtype"])
        if (name, shape, dtype) != want:
            problems.append(f"input {t['name']!r}: package has {name} {shape} {dtype}, expected {want[0]} "
                            f"{want[1]} {want[2]}")
    inputs_match = not problems

    outputs = [_feature(f) for f in spec.description.output]
    before_outputs = len(problems)
    shapes: dict[str, Any] = {}
    if len(outputs) != len(io["outputs"]):
        problems.append(f"{len(outputs)} package outputs for {len(io['outputs'])} ONNX outputs")
    for t, (name, spec_shape, dtype) in zip(io["outputs"], outputs):
        inferred = mil_out.get(name)
        ort = list(t["shape"]) if t.get("shape") is not None else None
        ok = inferred == ort and (not spec_shape or spec_shape == ort)
        shapes[t["name"]] = {"coreml": inferred, "onnxruntime": ort, "match": ok}
        if name != t["artifact_name"]:
            problems.append(f"output {t['name']!r}: package names it {name!r}, expected {t['artifact_name']!r}")
        if not ok:
            problems.append(f"output {t['name']!r}: Core ML infers {inferred} (the package declares {spec_shape}), "
                            f"ONNX Runtime gives {ort}")
        if dtype != t["artifact_dtype"]:
            problems.append(f"output {t['name']!r}: package dtype {dtype}, expected {t['artifact_dtype']}")
    return {"passed": not problems, "loads": True, "inputs_match": inputs_match,
            "outputs_match": len(problems) == before_outputs,
            "output_shapes": shapes, "spec_version": spec.specificationVersion, "problems": problems, "note": NOTE}
