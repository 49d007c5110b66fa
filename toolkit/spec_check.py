"""Where ONNX Runtime is known to differ from the ONNX spec, the FP32 reference comes from the spec.

Every build holds its artifacts to an FP32 reference that ONNX Runtime computes.  For a few (op, attribute)
cases ONNX Runtime's kernel gives other values than the spec (``onnx.reference``, which writes the backend
tests' expected outputs), so an artifact could match ONNX Runtime, pass every check and still be off the spec
(issue 32: ``Resize`` with ``coordinate_transformation_mode=align_corners`` and downsampling scales, where
ONNX Runtime maps coordinates by the rounded output size and the spec by input x scale: up to 1.05 off).

For each such node of the model (``SUSPECTS``), the node is run alone on the inputs it really gets (the first
validation sample through ONNX Runtime) in both ONNX Runtime and ``onnx.reference``; when they differ, the
build's reference is computed by ``onnx.reference`` for the whole model and the manifest says why
(``validation.source.spec_deviations``).  Nothing changes for a model whose suspects agree (upsampling
``align_corners``, scales that give whole sizes).  Nodes inside If/Loop bodies are not looked at.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# op type -> (does this node fall under the known deviation?, what the deviation is, what a user can do)
SUSPECTS: dict[str, tuple[Any, str, str]] = {
    "Resize": (lambda attrs: attrs.get("coordinate_transformation_mode") == b"align_corners",
               "ONNX Runtime's align_corners maps coordinates by the rounded output size, the spec by input x scale",
               "give the Resize its output `sizes` instead of `scales` (then both agree), or another "
               "coordinate_transformation_mode"),
}
RTOL, ATOL = 1e-3, 1e-5
REV = 1  # part of a build's cache key when the model has a suspect node (see ``suspect_nodes``)


def may_deviate(op_histogram: dict[str, int]) -> bool:
    """Cheap, from ``ModelInfo.op_histogram``: whether any op of the model has a known deviation to look for."""
    return any(op in op_histogram for op in SUSPECTS)


def suspect_nodes(model: Any) -> list[Any]:
    """The top-level nodes of ``model`` (a ModelProto) where ONNX Runtime may differ from the spec."""
    from onnx import helper

    found = []
    for node in model.graph.node:
        rule = SUSPECTS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if rule and rule[0]({a.name: helper.get_attribute_value(a) for a in node.attribute}):
            found.append(node)
    return found


def has_suspects(path: str | Path) -> bool:
    """Cheap: whether the model file has a suspect node (its graph read without external weights)."""
    import onnx

    try:
        return bool(suspect_nodes(onnx.load(str(path), load_external_data=False)))
    except Exception:  # noqa: BLE001 - unreadable here: the build's own load says why
        return False


def deviations(model_path: str | Path, feed: dict[str, Any]) -> list[dict[str, Any]]:
    """Each suspect node whose ONNX Runtime output differs from ``onnx.reference``'s on the inputs it gets
    from ``feed`` (one sample): ``{"node", "op", "max_abs", "why"}``.  Empty when they all agree."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(model_path))
    nodes = suspect_nodes(model)
    if not nodes:
        return []
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    wanted = sorted({n for node in nodes for n in node.input if n and n not in inits and n not in feed})
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    probe.graph.output.extend([onnx.ValueInfoProto(name=n) for n in wanted if n not in have])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
    values = {**inits, **feed, **(dict(zip(wanted, sess.run(wanted, feed))) if wanted else {})}
    found = []
    for i, node in enumerate(nodes):
        ins = [n for n in node.input if n]
        one = helper.make_model(
            helper.make_graph([node], f"suspect{i}",
                              [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(values[n]).dtype),
                                                             list(np.asarray(values[n]).shape)) for n in ins],
                              [onnx.ValueInfoProto(name=o) for o in node.output if o]),
            opset_imports=model.opset_import, ir_version=model.ir_version)
        node_feed = {n: np.asarray(values[n]) for n in ins}
        try:
            got = ort.InferenceSession(one.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, node_feed)
            spec = ReferenceEvaluator(one).run(None, node_feed)
        except Exception:  # noqa: BLE001 - cannot run alone: the whole model's reference stays ONNX Runtime's
            continue
        worst = 0.0
        for a, b in zip(got, spec):
            a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
            if a.shape != b.shape:
                worst = float("inf")
                break
            if a.size and not np.allclose(a, b, rtol=RTOL, atol=ATOL * max(1.0, float(np.abs(b).max()))):
                worst = max(worst, float(np.abs(a - b).max()))
        if worst:
            found.append({"node": node.name or f"{node.op_type}#{i}", "op": node.op_type, "max_abs": worst,
                          "why": SUSPECTS[node.op_type][1],
                          "fix": SUSPECTS[node.op_type][2]})
    return found


def describe(found: list[dict[str, Any]]) -> str:
    """One sentence for the build's notes."""
    nodes = ", ".join(f"{d['op']} {d['node']!r} (max abs {d['max_abs']:.3g})" for d in found[:3])
    more = f" and {len(found) - 3} more" if len(found) > 3 else ""
    return (f"ONNX Runtime differs from the ONNX spec on {nodes}{more} on the first validation sample "
            f"({found[0]['why']}): the FP32 reference is computed by onnx.reference, the spec's implementation, "
            "so every artifact is held to the spec (a runtime that follows ONNX Runtime here is refused)")


def debug_note(d: dict[str, Any]) -> str:
    """For ``edgeopt debug``, whose per-layer table compares with ONNX Runtime: why it shows no jump there."""
    return (f"the build's FP32 reference is the ONNX spec's (onnx.reference): ONNX Runtime itself, whose tensors "
            f"this table compares with, is off the spec at {d['op']} {d['node']!r} (max abs {d['max_abs']:.3g}: "
            f"{d['why']}); {d['fix']}")


def hint(data_source: dict[str, Any] | None) -> str | None:
    """For a failed check: why an artifact that follows ONNX Runtime is refused, when the reference is the spec's."""
    found = (data_source or {}).get("spec_deviations") or []
    if not found:
        return None
    d = found[0]
    return (f"the reference is the ONNX spec's, which ONNX Runtime and runtimes that follow it do not match on "
            f"{d['op']} {d['node']!r} ({d['why']}): {d['fix']}")
