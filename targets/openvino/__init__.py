"""``intel-cpu`` / ``intel-gpu`` / ``intel-npu`` -> OpenVINO IR (``model.xml`` + ``model.bin``).

FP32: ``ov.convert_model`` of the prepared (static) model, weights kept FP32, and the bundle pins
``INFERENCE_PRECISION_HINT=f32`` (OpenVINO's CPU plugin otherwise runs in bf16 on CPUs with AMX or
AVX512-BF16, which an FP32 bundle must not do silently).  FP16: weights compressed to FP16 and
the hint ``f16`` (on a CPU without FP16 arithmetic the runner asks for f32 rather than let the
plugin keep its bf16 default; GPUs run FP16 anyway).  INT8: NNCF post-training quantization
searched against the FP32 reference, see ``edgeopt.targets.openvino.int8``.

The GPU and NPU plugins compile the IR on the device at load time.  When the build host lacks
that device (``ov.Core().available_devices``), the IR is still built for it and checked
numerically on the CPU plugin; the notes say so.

What OpenVINO cannot take is asked of OpenVINO itself: its ONNX frontend converts the model
partially and every node it left unconverted is listed with its name (cached per model sha).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeopt.errors import BuildFailed, UnsupportedOps

from ..base import BuildJob, BuildOutput, Target, package_versions, require

log = logging.getLogger(__name__)

# The runtime precision a bundle pins, per build precision (None: the device plugin's default).
INFERENCE_PRECISION = {"fp32": "f32", "fp16": "f16", "int8": None}

_support_cache: dict[str, list[tuple[str, str, bool]]] = {}  # model sha + openvino version -> report


class OpenVinoTarget(Target):
    backend = "openvino"
    extra = "openvino"
    packages = ["openvino", "nncf"]

    def toolchain(self) -> dict[str, str]:
        # rev 1: an If branch no calibration sample takes -> built again with the Ifs as a Where
        # rev 2: candidates judged as the saved IR read back; mixed-scale Concats in the ignored scope
        # rev 3: a detection output's decoding in the ignored scope
        return {**super().toolchain(), "int8": "NNCF search; uncalibrated If branches retried as a Where; "
                "judged as saved; detection decoding float (rev 3)", "fp32": "IR layers marked precise (rev 1)"}

    # --- options ------------------------------------------------------------------------
    def known_options(self) -> frozenset[str] | None:
        from .int8 import OPTION_KEYS

        return OPTION_KEYS

    def check_options(self, options: dict[str, Any], precision: str, spec: dict[str, Any]) -> None:
        from .int8 import parse_options

        parse_options(options)  # the int8_* values, whatever the precision: a bad value is a typo

    # --- capabilities -------------------------------------------------------------------
    def unsupported_nodes(self, info, spec: dict[str, Any]) -> list[tuple[str, str]]:
        """Every node OpenVINO's ONNX frontend cannot convert; [] when openvino is not installed.

        Ops with no conversion rule are refused whatever the shapes.  A conversion that fails on
        a model with dynamic inputs may well succeed once the build fixes the shapes (silero-vad's
        opset-15 export does), so those are left to the build, which names them if they persist.
        """
        version = package_versions(["openvino"])["openvino"]
        if version == "missing":
            return self.attribute_refusals(info)
        key = f"{info.sha256}-{version}-{REPORT_VERSION}"
        if key not in _support_cache:
            _support_cache[key] = _cached_on_disk(key, lambda: frontend_report(info.path))
        dynamic = any(not isinstance(d, int) for t in info.inputs for d in t.shape)
        bad = [(op, name) for op, name, failed in _support_cache[key] if not (failed and dynamic)]
        return bad + self.attribute_refusals(info, [n for _, n in bad])

    # --- the build ----------------------------------------------------------------------
    # a variable axis: bounded dynamic dims (ov.Dimension(lo, hi)) first, else the IR static at the top
    shape_forms = ("dynamic", "static", "buckets")

    def _build(self, job: BuildJob, progress: Callable[[str], None]) -> BuildOutput:
        ov = require("openvino", self.extra)
        bundle = Path(job.bundle_dir)
        device = str(job.target.get("profile", {}).get("device") or "CPU")
        present = device_on_host(ov, device)
        check_device = device if present else "CPU"
        notes: list[str] = []
        warnings: list[str] = []
        options: dict[str, Any] = {"device": device}

        progress("converting ONNX -> OpenVINO IR")
        with no_telemetry():
            try:
                # convert_model (not read_model): it also folds BatchNorm and shape subgraphs (MOC),
                # which gives a smaller IR and a graph NNCF quantizes better.
                try:
                    model = ov.convert_model(job.prepared_path)
                except Exception as exc:
                    if "Rank of If condition" not in str(exc):
                        raise
                    # OpenVINO's frontend takes If conditions of rank 0 or 1 only (see scalar_if_conditions)
                    model = ov.convert_model(str(scalar_if_conditions(Path(job.prepared_path), bundle.parent)))
                    notes.append("If conditions reshaped to scalars for OpenVINO's frontend (it takes rank 0 "
                                 "or 1 only; ONNX allows any one-element tensor)")
            except Exception as exc:
                bad = frontend_unsupported(job.prepared_path)
                if bad:
                    raise UnsupportedOps(job.target["name"], bad) from None
                raise BuildFailed(f"OpenVINO could not convert the model: {_first_line(exc)}") from None
        if job.variable and job.shape_form == "dynamic":
            options["bounded_dims"] = bound_dims(ov, model, job.variable)
            notes.append("variable axes as OpenVINO bounded dimensions (ov.Dimension(lo, hi)): "
                         + ", ".join(f"{n}{s}" for n, s in options["bounded_dims"].items()))
        runtime_options: dict[str, Any] = {"device": device, "hint": "LATENCY"}
        extra_manifest: dict[str, Any] = {}
        if job.precision == "int8":
            from .int8 import quantize_searched

            with no_telemetry():
                result = quantize_searched(ov, model, job, check_device, present, progress)
            model = result.model
            options["int8"] = result.record
            notes += result.notes
            warnings += result.warnings
            if result.tolerance_override:
                # The host check (and the device's) must judge by the bound the search used.
                extra_manifest["tolerance_override"] = result.tolerance_override
            if result.inference_precision:
                runtime_options["inference_precision"] = result.inference_precision
        precision_hint = INFERENCE_PRECISION.get(job.precision)
        if precision_hint and device.split(".")[0] in ("CPU", "GPU"):  # the NPU plugin takes no such hint
            runtime_options["inference_precision"] = precision_hint
        if job.precision == "fp32":  # the hint in the IR too, for whoever reads model.xml (see keep_fp32)
            model.set_rt_info("f32", ["runtime_options", "INFERENCE_PRECISION_HINT"])
        progress("saving the IR" + (" (FP16-compressed weights)" if job.precision == "fp16" else ""))
        ov.save_model(model, str(bundle / "model.xml"), compress_to_fp16=(job.precision == "fp16"))
        if job.precision == "fp32":
            options["ir_precision"] = keep_fp32(bundle / "model.xml")
        options["weights"] = {"fp32": "FP32", "fp16": "FP16 (compressed)", "int8": "INT8 (NNCF)"}[job.precision]

        check_options: dict[str, Any] = {}
        if not present:
            # The IR's own numerics (FP16 arithmetic for fp16, as GPU and NPU run it), not the CPU
            # plugin's bf16 default; the INT8 search judged its candidates the same way.
            check_options = {"device": "CPU", "inference_precision": "f16" if job.precision == "fp16" else "f32"}
            notes.append(f"{job.target['name']}: this build host has no OpenVINO {device} device "
                         f"(OpenVINO sees {', '.join(ov.Core().available_devices) or 'none'}): the IR was "
                         f"checked numerically on the CPU plugin; the {device} plugin compiles it on the device "
                         f"at load time, so numerics on the {device} itself are proven only by a check on the device")
            options["host_check_device"] = "CPU"
        return BuildOutput(runtime={"name": "openvino", "artifact": "model.xml", "options": runtime_options},
                           options=options, notes=notes, warnings=warnings, extra_manifest=extra_manifest,
                           check_options=check_options)


def bound_dims(ov, model, variable: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """Reshape the converted model's variable inputs to ``PartialShape``s with ``ov.Dimension(lo, hi)`` on the
    variable axes (a range: its bounds; buckets: 1..the largest) and the static size elsewhere; returns
    {input: the partial shape as OpenVINO prints it}."""
    shapes: dict[str, Any] = {}
    for port in model.inputs:
        name = port.get_any_name()
        var = {int(v["axis"]): v for v in variable.get(name, [])}
        if not var:
            continue
        dims = []
        for i, d in enumerate(port.get_partial_shape()):
            v = var.get(i)
            if v is not None:
                lo, hi = (v["range"] if "range" in v else (min(v["buckets"]), max(v["buckets"])))
                dims.append(ov.Dimension(int(lo), int(hi)))
            else:
                dims.append(d if d.is_static else ov.Dimension(-1))
        shapes[name] = ov.PartialShape(dims)
    if shapes:
        model.reshape(shapes)
    return {n: str(s) for n, s in shapes.items()}


def keep_fp32(xml: Path) -> str:
    """Mark every layer of the saved IR ``precise`` (OpenVINO's DisablePrecisionConversion, which ``read_model``
    restores): OpenVINO's CPU plugin keeps such nodes in their original precision where it would otherwise
    run bf16 (a CPU with AMX or AVX512-BF16) or f16 (ARM), so a user loading ``model.xml`` with OpenVINO's
    defaults gets the FP32 the bundle was checked at, not only edgeopt's runner (which passes
    INFERENCE_PRECISION_HINT=f32).  The ``runtime_options/INFERENCE_PRECISION_HINT=f32`` written into the IR's
    rt_info says the same in words, but OpenVINO 2026.4's CPU plugin applies only its KV-cache and
    dynamic-quantization keys from there (measured), hence the per-layer mark.  Returns what the manifest says."""
    import xml.etree.ElementTree as ET

    tree = ET.parse(xml)
    marked = 0
    for layer in tree.getroot().iter("layer"):
        rt = layer.find("rt_info")
        if rt is None:
            rt = ET.Element("rt_info")
            layer.insert(0, rt)
        if not any(a.get("name") == "precise" for a in rt.findall("attribute")):
            ET.SubElement(rt, "attribute", {"name": "precise", "version": "0"})
            marked += 1
    tmp = xml.with_name(xml.name + ".tmp")
    tree.write(tmp, encoding="utf-8", xml_declaration=True)
    os.replace(tmp, xml)
    return (f"FP32 kept inside the IR: {marked} layers marked precise (OpenVINO keeps them FP32 under a bf16/f16 "
            "default) and rt_info runtime_options INFERENCE_PRECISION_HINT=f32")


@contextlib.contextmanager
def no_telemetry():
    """Keep OpenVINO's converter and NNCF from sending usage telemetry during a build.

    Both send it by default without asking (their opt-in dialog is off) unless they believe they
    run in CI; a build tool must not phone home, so the build worker says it is one.  ``NNCF_CI``
    only switches NNCF's telemetry off; ``CI=true`` is what openvino-telemetry checks.  The worker
    is a child process per build, so the variables go no further.
    """
    saved = {k: os.environ.get(k) for k in ("CI", "NNCF_CI")}
    os.environ["CI"], os.environ["NNCF_CI"] = "true", "1"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def device_on_host(ov, device: str) -> bool:
    """Whether OpenVINO on this machine has the device (``GPU`` matches ``GPU.0``)."""
    from edgeopt_agent.runners.openvino import device_present

    return device_present(list(ov.Core().available_devices), device)


# --- what the ONNX frontend cannot take ---------------------------------------------------
# part of the support report's cache key: 2 = If conditions judged after scalar_if_conditions, 3 = a model with
# non-tensor outputs (skl2onnx's ZipMap) judged without them, their producers listed
REPORT_VERSION = 3


def frontend_unsupported(model_path: str) -> list[tuple[str, str]]:
    """(op, node name) of every node OpenVINO's ONNX frontend cannot convert (see frontend_report)."""
    return [(op, name) for op, name, _ in frontend_report(model_path)]


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and not ln.startswith("Check ")]
    return (lines[0] if lines else type(exc).__name__)[:300]


def frontend_report(model_path: str, _scalar_ifs: bool = False,
                    _tensor_outputs: bool = False) -> list[tuple[str, str, bool]]:
    """(op, node name, conversion failed) of every node OpenVINO's ONNX frontend cannot convert.

    The flag is False for an op with no conversion rule at all, True for a node whose conversion
    failed (an unsupported attribute, or shapes it cannot handle).

    A full conversion is tried first (the usual, cheap answer: nothing).  When it fails, the
    frontend's report names the op types with no conversion rule and, per failed node, its output
    tensor and the reason; a partial conversion keeps the unconverted top-level nodes as framework
    nodes, whose output names lead back to the ONNX nodes.  Nodes inside If/Loop bodies are found
    by the report's output names (failed conversions) or op types (no rule).  A node that failed
    only because an input comes untyped from another unconvertible node is a consequence, not a
    cause, and is left out.
    """
    import onnx
    from openvino.frontend import FrontEndManager

    fe = FrontEndManager().load_by_framework("onnx")
    try:
        fe.convert(fe.load(model_path))
        return []
    except Exception as exc:
        if "Unsupported value_info type" in str(exc) and not _tensor_outputs:
            # The frontend cannot even load a model with a non-tensor output (a ZipMap's sequence of maps)
            return _without_non_tensor_outputs(model_path)
        if "OpConversionFailure" not in type(exc).__name__ and "wasn't fully converted" not in str(exc):
            # Not an op-support problem: let the build report the frontend's own error.
            log.debug("OpenVINO frontend failed on %s: %s", model_path, exc)
            return []
        message = str(exc)
    if "Rank of If condition" in message and not _scalar_ifs:
        # the build converts a copy with scalar If conditions (scalar_if_conditions): judge that copy
        import tempfile

        with tempfile.TemporaryDirectory(prefix="edgeopt-ov-if-") as tmp:
            return frontend_report(str(scalar_if_conditions(Path(model_path), Path(tmp))), _scalar_ifs=True,
                                   _tensor_outputs=_tensor_outputs)
    no_rule, reasons = _parse_report(message)
    top_outputs: set[str] = set()
    for op in fe.convert_partially(fe.load(model_path)).get_ordered_ops():
        # Only name accessors here: other accessors of a framework node crash the process.
        if op.get_type_name() in ("ONNXFrameworkNode", "NotSupportedONNXNode"):
            for out in op.outputs():
                top_outputs |= set(out.get_names())
    found: list[tuple[str, str, bool]] = []
    graphs = [(onnx.load(model_path, load_external_data=False).graph, False)]
    while graphs:
        graph, inner = graphs.pop(0)
        bad = {}
        for i, node in enumerate(graph.node):
            for attr in node.attribute:
                graphs += [(g, True) for g in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)]
            if {node.op_type, f"{node.domain}.{node.op_type}"} & no_rule:
                bad[i] = None
            elif any(o in reasons or (not inner and o in top_outputs) for o in node.output):
                bad[i] = next((reasons[o] for o in node.output if o in reasons), "")
        for i in _causes(graph, bad):
            node = graph.node[i]
            label = _label(node.domain, node.op_type) + (" (in a subgraph)" if inner else "")
            if bad[i] is not None:
                why = bad[i] if len(bad[i] or "") <= 90 else bad[i][:87] + "..."  # type: ignore[index]
                label += f" [conversion failed: {why}]" if why else " [conversion failed]"
            found.append((label, node.name or f"<unnamed {node.op_type}, output {node.output[0]}>",
                          bad[i] is not None))
    if not found:  # the frontend failed but named nothing we can map: say so rather than pass
        first = next((ln for ln in message.splitlines() if ln.startswith("--")), message.splitlines()[-1])
        found.append(("(model)", f"OpenVINO's ONNX frontend: {first.strip('- ')}", True))
    return found


def _without_non_tensor_outputs(model_path: str) -> list[tuple[str, str, bool]]:
    """The report of a model whose graph outputs include non-tensors (skl2onnx's ZipMap output is a
    sequence of maps, which OpenVINO's frontend refuses to load at all): the nodes that make only such
    outputs are listed as untaken, and the rest of the model is judged by the frontend without them
    (its ``ai.onnx.ml`` ops have no conversion rule)."""
    import tempfile

    import onnx

    model = onnx.load(model_path)
    graph = model.graph
    dropped = [o.name for o in graph.output if o.type.WhichOneof("value") != "tensor_type"]
    keep = [o for o in graph.output if o.name not in dropped]
    del graph.output[:]
    graph.output.extend(keep)
    tensor_info = [v for v in graph.value_info if v.type.WhichOneof("value") == "tensor_type"]
    del graph.value_info[:]
    graph.value_info.extend(tensor_info)
    found: list[tuple[str, str, bool]] = []
    while True:  # drop the nodes nothing reads any more (the ZipMap), last first
        used = {t for n in graph.node for t in n.input} | {o.name for o in graph.output}
        dead = [i for i, n in enumerate(graph.node) if not any(t in used for t in n.output if t)]
        if not dead:
            break
        for i in reversed(dead):
            node = graph.node[i]
            makes = [t for t in node.output if t in dropped]
            why = (f" [output {makes[0]!r} is not a tensor]" if makes else " [feeds only a non-tensor output]")
            found.append((_label(node.domain, node.op_type) + why,
                          node.name or f"<unnamed {node.op_type}, output {node.output[0]}>", False))
            del graph.node[i]
    if not graph.output:
        return found
    with tempfile.TemporaryDirectory(prefix="edgeopt-ov-out-") as tmp:
        path = str(Path(tmp) / "tensor_outputs.onnx")
        onnx.save(model, path, save_as_external_data=model.ByteSize() > 1_900_000_000)
        return frontend_report(path, _tensor_outputs=True) + found


def _causes(graph, bad: dict[int, str | None]) -> list[int]:
    """The failing nodes (index -> reason; None = no rule) that no other failing node feeds."""
    producer = {out: i for i, node in enumerate(graph.node) for out in node.output if out}

    def fed_by_bad(i: int) -> bool:
        seen, stack = set(), [producer[t] for t in graph.node[i].input if t in producer]
        while stack:
            j = stack.pop()
            if j in bad:
                return True
            if j not in seen:
                seen.add(j)
                stack += [producer[t] for t in graph.node[j].input if t in producer]
        return False

    def untyped_input(reason: str) -> bool:
        # An unconverted node's outputs have no type or rank: the downstream failure says so.
        return not reason or any(w in reason.lower() for w in ("dynamic", "rank"))

    # No conversion rule is always a cause; a failure over an untyped input fed by one is not.
    return [i for i in sorted(bad) if bad[i] is None or not (untyped_input(bad[i] or "") and fed_by_bad(i))]


def _label(domain: str, op_type: str) -> str:
    return op_type if domain in ("", "ai.onnx") else f"{domain}::{op_type}"


def _parse_report(message: str) -> tuple[set[str], dict[str, str]]:
    """From the frontend's report: op types with no conversion rule, and the reason per failed node
    keyed by its output name (``While validating ONNX node '<Node(Conv): out>'``)."""
    no_rule: set[str] = set()
    for line in message.splitlines():
        if line.strip().startswith("-- No conversion rule found for operations:"):
            no_rule |= {t.strip() for t in line.split(":", 1)[1].split(",") if t.strip()}
    reasons: dict[str, str] = {}
    detail = message.split("\nSummary:")[0]
    for block in re.split(r"\n(?=-- )", detail):
        m = re.search(r"<Node\(\w+\): ([^>]+)>", block)
        if m:
            last = [ln.strip() for ln in block.splitlines() if ln.strip()][-1]
            reasons[m.group(1)] = last.split("': ", 1)[-1][:200]
    return no_rule, reasons


def _cached_on_disk(key: str, compute: Callable[[], list[tuple[str, str, bool]]]) -> list[tuple[str, str, bool]]:
    """The frontend's answer for one model, kept in the bundle cache so `inspect` asks once."""
    from edgeopt.pipeline import cache_dir

    path = cache_dir() / "support" / f"openvino-{key}.v2.json"
    try:
        return [tuple(x) for x in json.loads(path.read_text())]  # type: ignore[misc]
    except (OSError, ValueError, TypeError):
        pass
    result = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(result))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache only costs a re-run
    return result


def scalar_if_conditions(src: Path, work: Path) -> Path:
    """A copy of ``src`` (a scratch file in ``work``) with every top-level If's condition reshaped to a
    scalar: ONNX's If takes any one-element condition ([1, 1] from a Greater over a score, openwakeword's
    verifier), OpenVINO's frontend only rank 0 or 1. A no-op in ONNX."""
    import os
    import tempfile

    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(src))
    g = m.graph
    shape = "edgeopt_if_scalar_shape"
    g.initializer.append(numpy_helper.from_array(np.zeros((0,), np.int64), shape))
    nodes = []
    for i, node in enumerate(g.node):
        if node.op_type == "If" and node.input:
            cond = f"{node.input[0]}__edgeopt_scalar_{i}"
            nodes.append(helper.make_node("Reshape", [node.input[0], shape], [cond],
                                          name=f"{node.name or 'If'}_cond_scalar"))
            node.input[0] = cond
        nodes.append(node)
    del g.node[:]
    g.node.extend(nodes)
    fd, dst = tempfile.mkstemp(suffix=".onnx", prefix=".ov-if-", dir=work)
    os.close(fd)
    onnx.save(m, dst)
    return Path(dst)
