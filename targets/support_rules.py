"""Attribute-level support: what each backend's converter refuses beyond the op type (issue 32).

An op table says only that a converter has *a* translation for ``Resize``; whether it takes cubic
``Resize``, a batch-first LSTM or the Mean output of a LayerNormalization is decided by the node's
attributes, input ranks and which outputs are used.  Each table here is one backend's list of such
rules, found by running ONNX's backend node tests through the target (``bench/bench_conformance.py``)
and reading the converter's own refusal; every rule names the converter (and version) it was measured
on and why it refuses.

A rule is **certain** (``inspect`` says NO, as ``build`` would fail) or **probable** ("probably not",
with the reason): the converter failed on the node tests of that shape but whether it fails on a given
model can only be known by converting.

``refusals(path, backend)`` -> ``[(label, node name)]`` for ``Target.unsupported_nodes`` (the label
is ``"Op (what: why; converter)"``); ``doubts(path, backend)`` -> ``[{"op", "node", "why"}]`` for
``Target.probable_refusals``.  Both read the model once per file (cached on path, size and mtime).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: the converter versions the tables were measured with (bench/bench_conformance.py)
MEASURED = {
    "onnxruntime": "ONNX Runtime 1.23",
    "openvino": "OpenVINO 2026.4 ONNX frontend",
    "tflite": "onnx2tf 1.29",
    "coreml": "edgeopt's Core ML translator (coremltools 9.0)",
    "tensorrt": "ONNX Runtime 1.23 (host check of the prepared ONNX)",
}


def _numel(shape: list[int | None] | None) -> int | None:
    """Elements of a static shape (None when unknown)."""
    if shape is None or any(d is None for d in shape):
        return None
    out = 1
    for d in shape:
        out *= int(d)
    return out


class Graph:
    """What the rules look at: nodes, static shapes (after ONNX shape inference), constants, uses."""

    def __init__(self, model: Any) -> None:
        import onnx

        try:
            model = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 - shapes stay unknown; rules that need them say nothing
            pass
        g = model.graph
        self.opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        self.nodes = list(g.node)
        self.consts = {i.name for i in g.initializer} | {o for n in g.node if n.op_type == "Constant"
                                                         for o in n.output}
        self.inputs = [i for i in g.input if i.name not in self.consts]
        self.shapes: dict[str, list[int | None] | None] = {}
        for vi in [*g.input, *g.value_info, *g.output]:
            t = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
            if t is not None and t.HasField("shape"):
                self.shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        for i in g.initializer:
            self.shapes[i.name] = list(i.dims)
        self.graph_outputs = {o.name for o in g.output}
        self.used = self.graph_outputs | {i for n in g.node for i in n.input if i}
        # values computed at run time: reached from a model input other than through Shape/Size
        # (which fold to constants once the input shapes are fixed)
        self.runtime = {i.name for i in self.inputs}
        for n in g.node:
            if n.op_type not in ("Shape", "Size", "Constant") and any(x in self.runtime for x in n.input if x):
                self.runtime.update(o for o in n.output if o)
        self.const_values = {i.name: i for i in g.initializer}

    def rank(self, name: str) -> int | None:
        s = self.shapes.get(name)
        return None if s is None else len(s)

    def shape(self, name: str) -> list[int | None] | None:
        return self.shapes.get(name)

    def value(self, name: str) -> Any:
        """The value of a constant input (initializer or Constant), else None."""
        from onnx import numpy_helper

        if name in self.const_values:
            return numpy_helper.to_array(self.const_values[name])
        for n in self.nodes:
            if n.op_type == "Constant" and n.output[0] == name:
                for a in n.attribute:
                    if a.name == "value":
                        return numpy_helper.to_array(a.t)
        return None


def attr(node: Any, name: str, default: Any = None) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            v = helper.get_attribute_value(a)
            return v.decode() if isinstance(v, bytes) else v
    return default


def inp(node: Any, i: int) -> str:
    return node.input[i] if len(node.input) > i else ""


@dataclass(frozen=True)
class Rule:
    ops: tuple[str, ...]
    test: Callable[[Any, Graph], str | None]  # the refused feature ("mode=cubic"), None when the node is fine
    why: str  # why the converter refuses it
    certain: bool = True


# --- the tests ----------------------------------------------------------------------------------

def _batch_first(n, g) -> str | None:
    return "layout=1 (batch-first)" if attr(n, "layout", 0) == 1 else None


def _lstm_batch(n, g) -> str | None:
    shape = g.shape(inp(n, 0)) if attr(n, "layout", 0) == 0 else None
    b = shape[1] if shape and len(shape) == 3 else None
    return f"batch {b} (a sequence-first [seq, batch, input] LSTM)" if isinstance(b, int) and b > 1 else None


def _ln_extra_outputs(n, g) -> str | None:
    used = [o for o in list(n.output)[1:] if o and o in g.used]
    return "its Mean/InvStdDev outputs used" if used else None


def _ln_scale_2d(n, g) -> str | None:
    r = g.rank(inp(n, 1)) if inp(n, 1) else None
    return f"a scale of rank {r} (normalized over {r} axes)" if r is not None and r >= 2 else None


def _bn_extra_outputs(n, g) -> str | None:
    used = [o for o in list(n.output)[1:] if o and o in g.used]
    return "its running mean/var outputs (training_mode=1) used" if used else None


def _shape_slice(n, g) -> str | None:
    """Shape-15's start/end as onnx2tf 1.29 gets them wrong: only one of them given (not the full range), or an
    empty range (every such node test; both given and non-empty, or clipped to the full range, match)."""
    r = g.rank(inp(n, 0))
    s_attr, e_attr = attr(n, "start"), attr(n, "end")
    if r is None or (s_attr is None and e_attr is None):
        return None

    def at(v: int) -> int:
        return min(max(v + r if v < 0 else v, 0), r)

    s, e = at(s_attr if s_attr is not None else 0), at(e_attr if e_attr is not None else r)
    if e <= s:
        return "start/end give an empty shape"
    if (s_attr is None) != (e_attr is None) and (s, e) != (0, r):
        return f"only {'start' if e_attr is None else 'end'} given"
    return None


def _select_last(n, g) -> str | None:
    return "select_last_index=1" if attr(n, "select_last_index", 0) == 1 else None


def _same_lower(n, g) -> str | None:
    return "auto_pad=SAME_LOWER" if attr(n, "auto_pad", "NOTSET") == "SAME_LOWER" else None


def _cubic(n, g) -> str | None:
    return "mode=cubic" if attr(n, "mode", "nearest") == "cubic" else None


def _cubic_exclude_outside(n, g) -> str | None:
    return "mode=cubic with exclude_outside=1" if (attr(n, "mode", "nearest") == "cubic"
                                                   and attr(n, "exclude_outside", 0) == 1) else None


def _spatial_rank(n, g) -> int | None:
    r = g.rank(inp(n, 0))
    if r is None and len(n.input) > 1:
        r = g.rank(inp(n, 1))  # the weight: [C, M/g, k...]
    return None if r is None else r - 2


def _convtranspose_3d(n, g) -> str | None:
    r = _spatial_rank(n, g)
    return f"{r}-D transposed convolution" if r is not None and r >= 3 else None


def _runtime_weight(n, g) -> str | None:
    w = inp(n, 1)
    return f"weight {w!r} is a model input (computed at run time)" if w and w in g.runtime else None


def _runtime_params(n, g) -> str | None:
    idx = {"InstanceNormalization": (1, 2), "GroupNormalization": (1, 2)}.get(n.op_type, (1, 2, 3))
    names = [inp(n, i) for i in idx if inp(n, i) and inp(n, i) in g.runtime]
    return f"parameters {names} are model inputs (computed at run time)" if names else None


def _uneven_split(n, g) -> str | None:
    sizes = g.value(inp(n, 1)) if inp(n, 1) else None
    if sizes is None:
        sizes = attr(n, "split")
    if sizes is not None and len(set(int(s) for s in list(sizes))) > 1:
        return f"uneven split {[int(s) for s in list(sizes)]}"
    parts, shape = attr(n, "num_outputs"), g.shape(inp(n, 0))
    if sizes is None and parts and shape:
        size = shape[attr(n, "axis", 0) % len(shape)]
        if size is not None and size % parts:
            return f"num_outputs={parts} over a dimension of {size} (uneven)"
    return None


def _reduce_all_keepdims(n, g) -> str | None:
    if attr(n, "keepdims", 1) != 1:
        return None
    axes = attr(n, "axes")
    if axes is None and inp(n, 1):
        axes = g.value(inp(n, 1))
        if axes is None:
            return None  # axes from an input value: unknown here
    r = g.rank(inp(n, 0))
    if axes is None or len(list(axes)) == 0:
        return None if attr(n, "noop_with_empty_axes", 0) == 1 else "every axis reduced with keepdims=1"
    if r is not None and len({int(a) % r for a in list(axes)}) == r:
        return "every axis reduced with keepdims=1"
    return None


def _clip_no_bounds(n, g) -> str | None:
    if g.opset < 11:
        return "neither min nor max" if attr(n, "min") is None and attr(n, "max") is None else None
    return "neither min nor max" if not inp(n, 1) and not inp(n, 2) else None


def _pad_axes(n, g) -> str | None:
    return "the axes input (opset 18)" if inp(n, 3) else None


def _maxpool_indices(n, g) -> str | None:
    return "its Indices output used" if len(n.output) > 1 and n.output[1] and n.output[1] in g.used else None


def _ceil_drops_last_window(n, g) -> str | None:
    """ceil_mode=1 where the spec drops a last window that would start in the right padding (opset 19+
    wording): converters that size ceil mode as plain ceil() give one more element on that axis."""
    if attr(n, "ceil_mode", 0) != 1:
        return None
    shape = g.shape(inp(n, 0))
    k = attr(n, "kernel_shape")
    if not shape or k is None or any(d is None for d in shape[2:]):
        return None
    nd = len(k)
    strides = list(attr(n, "strides", [1] * nd))
    dil = list(attr(n, "dilations", [1] * nd))
    pads = list(attr(n, "pads", [0] * (2 * nd)))
    if attr(n, "auto_pad", "NOTSET") not in ("NOTSET", ""):
        return None
    for i in range(nd):
        size = shape[2 + i]
        eff = (k[i] - 1) * dil[i] + 1
        span = size + pads[i] + pads[nd + i] - eff
        out = -(-span // strides[i]) + 1
        if (out - 1) * strides[i] >= size + pads[i]:
            return f"ceil_mode=1 whose last window starts in the padding (axis {2 + i})"
    return None


def _attention_gqa(n, g) -> str | None:
    q, kv = attr(n, "q_num_heads"), attr(n, "kv_num_heads")
    if q is None or kv is None:  # 4-D inputs: heads on axis 1 of Q and K
        qs, ks = g.shape(inp(n, 0)), g.shape(inp(n, 1))
        if qs and ks and len(qs) == 4 and len(ks) == 4:
            q, kv = qs[1], ks[1]
    if q and kv and q != kv:
        return f"grouped KV heads ({q} query heads, {kv} key/value heads)"
    return None


def _attention_causal_past_qk(n, g) -> str | None:
    if attr(n, "is_causal", 0) == 1 and inp(n, 4) and attr(n, "qk_matmul_output_mode", 0) != 0:
        return "is_causal=1 with a past key and qk_matmul_output_mode set"
    return None


#: Core ML translator: the inputs each op needs constant (``ctx.const``/``opt_const`` in targets/coreml/ops_*.py)
#: besides the shape arguments ``CoreMLTarget.unsupported_nodes`` already names (coreml.SHAPE_ARGS)
COREML_CONST_INPUTS = {
    "Conv": (1, 2), "ConvTranspose": (1, 2), "BatchNormalization": (1, 2, 3, 4), "InstanceNormalization": (1, 2),
    "LayerNormalization": (1, 2), "Pad": (3,), "Split": (1,), "TopK": (1,), "CumSum": (1,),
    "LSTM": (1, 2, 3, 4), "GRU": (1, 2, 3, 4), "Resize": (1,),
    **{op: (1,) for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                           "ReduceL2", "ReduceLogSumExp", "ReduceSumSquare", "ReduceLogSum")},
}


def _coreml_runtime_input(n, g) -> str | None:
    for i in COREML_CONST_INPUTS.get(n.op_type, ()):
        name = inp(n, i)
        if name and name in g.runtime:
            return f"input {i} ({name!r}) computed at run time"
    return None


#: ONNX ops onnx2tf 1.29 lowers to one TensorFlow op that LiteRT has no builtin for (a Flex op: TensorFlow 2.19's
#: TFLite converter refuses each with builtins only, measured op by op). Asin, Acos, Atan and Erf are not here:
#: the tflite target asks onnx2tf for its builtin replacements of those (targets/tflite FLEX_PRONE)
TFLITE_NO_BUILTIN = {"Acosh": "acosh", "Asinh": "asinh", "Atanh": "atanh", "Cosh": "cosh", "Sinh": "sinh",
                     "Tan": "tan", "Softsign": "softsign", "Det": "MatrixDeterminant"}


def _transpose_past_six(n, g) -> str | None:
    from edgeopt.targets.tflite.onnx_fixes import MAX_TRANSPOSE_RANK, _coalesced

    shape = g.shape(inp(n, 0))
    if not shape or len(shape) <= MAX_TRANSPOSE_RANK or None in shape:
        return None  # unknown sizes: most such permutations merge (window partitions), so nothing is said
    perm = attr(n, "perm") or list(range(len(shape)))[::-1]
    small = len(_coalesced(list(shape), list(perm))[0])
    return f"a transpose of {len(shape)} dimensions ({small} after merging)" if small > MAX_TRANSPOSE_RANK else None


def _pool_3d(n, g) -> str | None:
    r = g.rank(inp(n, 0))
    return "3 spatial dimensions" if r == 5 else None


def _attention_extras(n, g) -> str | None:
    used = [what for i, what in ((3, "an attn_mask"), (4, "a past key"), (5, "a past value")) if inp(n, i)]
    if len(n.output) > 3 and n.output[3] and n.output[3] in g.used:
        used.append("its qk_matmul_output")
    return " and ".join(used) + " used" if used else None


def _pool_dilated(n, g) -> str | None:
    d = attr(n, "dilations")
    return f"dilations {list(d)}" if d is not None and any(int(x) != 1 for x in d) else None


def _since_22(n, g) -> str | None:
    return f"{n.op_type}-22 (model opset {g.opset})" if g.opset >= 22 else None


def _lpnorm_22(n, g) -> str | None:
    return f"LpNormalization-22 (model opset {g.opset})" if g.opset >= 22 else None


def _lpnorm_l2_axis0(n, g) -> str | None:
    r = g.rank(inp(n, 0))
    axis = attr(n, "axis", -1)
    if attr(n, "p", 2) == 2 and r and axis % r == 0 and r > 1:
        return "p=2 over axis 0"
    return None


def _dropout_passthrough(n, g) -> str | None:
    if n.op_type != "Dropout" and len([x for x in n.input if x]) != 1:
        return None  # Max/Min/Sum/Mean of one input: a pass-through too
    return f"a one-input {n.op_type} from a model input straight to a model output" \
        if inp(n, 0) in {i.name for i in g.inputs} and n.output[0] in g.graph_outputs else None


def _rotary_no_heads(n, g) -> str | None:
    if attr(n, "rotary_embedding_dim", 0) and not attr(n, "num_heads"):
        return "rotary_embedding_dim without num_heads"
    return None


def _attention_qk_output(n, g) -> str | None:
    used = len(n.output) > 3 and n.output[3] and n.output[3] in g.used
    mode = attr(n, "qk_matmul_output_mode", 0)
    return f"its qk_matmul_output used with qk_matmul_output_mode={mode}" if used and mode in (1, 2) else None


def _softcap_mask(n, g) -> str | None:
    return "softcap with an attn_mask" if attr(n, "softcap", 0.0) and inp(n, 3) else None


_REF_WHY = ("ONNX Runtime 1.23's Attention gives outputs off the spec here (some runs not even repeatable), and "
            "it computes every build's FP32 reference: a build would be judged against wrong numbers")

def _align_corners_scales(n, g) -> str | None:
    """align_corners with scales where input x scale is not whole: the spec maps by the unrounded input x scale
    (resize_downsample_scales_{linear,cubic}_align_corners), ONNX Runtime by the output size."""
    if attr(n, "coordinate_transformation_mode", "half_pixel") != "align_corners" or not inp(n, 2) or inp(n, 3):
        return None
    scales, shape = g.value(inp(n, 2)), g.shape(inp(n, 0))
    if scales is None:
        return "align_corners with scales from a model input (their value decides)" if inp(n, 2) in g.runtime else None
    if shape and all(d is not None for d in shape) and any(
            abs(d * float(sc) - round(d * float(sc))) > 1e-6 for d, sc in zip(shape, list(scales))):
        return f"align_corners with scales {[float(x) for x in scales]} that do not give whole sizes"
    return None


#: every backend: what the FP32 reference cannot compute (ONNX Runtime, else onnx.reference: a batch-first
#: RNN, which ONNX Runtime has no kernel for, gets its reference from onnx.reference)
REFERENCE: list[Rule] = [
    Rule(("Bernoulli", "RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike", "Multinomial"),
         lambda n, g: "random outputs",
         "no two runs agree, so no artifact can be checked against a reference (a seed does not make two "
         "runtimes draw the same numbers)"),
    Rule(("Attention",), _attention_gqa, _REF_WHY),
    Rule(("Attention",), _attention_causal_past_qk, _REF_WHY),
    Rule(("Attention",), _softcap_mask,
         "onnx 1.23 changed where the mask goes: its reference caps the scores and then adds the mask, ONNX Runtime "
         "1.23 (which computes every build's FP32 reference) and onnx 1.19 add the mask before the cap -- a -inf "
         "mask is capped to -softcap and masked positions get weight (attention_4d_softcap_neginf_mask: cpu passed "
         "its check 0.07 off the newer spec; with_qk_matmul_softcap's expected output moved 0.03)", certain=False),
    Rule(("Resize",), _align_corners_scales,
         "the ONNX spec maps align_corners by the unrounded input x scale, ONNX Runtime 1.23 (which computes every "
         "build's FP32 reference) by the rounded output size: every target passed its check off the spec "
         "(resize_downsample_scales_{linear,cubic}_align_corners); sizes instead of scales agree", certain=False),
]

TABLES: dict[str, list[Rule]] = {
    "onnxruntime": [
        Rule(("LSTM", "GRU", "RNN"), _batch_first, "ONNX Runtime has no kernel for batch-first recurrent layers"),
        Rule(("LpNormalization",), _lpnorm_22, "ONNX Runtime 1.23 has no kernel for it"),
        Rule(("RotaryEmbedding",), _rotary_no_heads, "ONNX Runtime 1.23's kernel requires num_heads then"),
        Rule(("DeformConv", "Bernoulli"), _since_22, "ONNX Runtime 1.23 has no kernel for it (Bernoulli: for the "
             "RandomUniformLike-22 of its function body)"),
    ],
    "tensorrt": [
        Rule(("LSTM", "GRU", "RNN"), _batch_first, "the host check of the prepared ONNX runs in ONNX Runtime, "
             "which has no kernel for batch-first recurrent layers"),
        Rule(("LpNormalization",), _lpnorm_22, "the host check of the prepared ONNX runs in ONNX Runtime 1.23, "
             "which has no kernel for it"),
        Rule(("RotaryEmbedding",), _rotary_no_heads, "the host check of the prepared ONNX runs in ONNX Runtime "
             "1.23, whose kernel requires num_heads then"),
        Rule(("DeformConv", "Bernoulli"), _since_22, "the host check of the prepared ONNX runs in ONNX Runtime "
             "1.23, which has no kernel for it"),
        Rule(("Scan",), lambda n, g: f"Scan-8 (model opset {g.opset})" if g.opset < 9 else None,
             "the prepared ONNX (onnxsim) loses Scan-8's batch axis: ONNX Runtime's check of it fails on the rank"),
    ],
    "openvino": [
        Rule(("LpNormalization",), _lpnorm_l2_axis0, "OpenVINO's result is off the spec (cosine 0 on the node test)"),
        Rule(("Resize",), lambda n, g: "antialias=1" if attr(n, "antialias", 0) == 1 else None,
             "OpenVINO's antialiased Resize is off the spec (rel_l2 0.0175 on downsample_scales_linear_antialias)"),
        Rule(("Dropout", "Max", "Min", "Sum"), _dropout_passthrough, "OpenVINO removes the pass-through and the input's port with it "
             "(inference: 'Port for tensor name ... was not found')"),
        Rule(("Attention",), _attention_qk_output, "OpenVINO's qk_matmul_output after the mask/bias (mode 1) or "
             "the softcap (mode 2) is off the spec (every such node test; with softcap, Y too); modes 0 (the QK "
             "product) and 3 (after softmax) match"),
        Rule(("LSTM", "GRU", "RNN"), _batch_first, "OpenVINO's ONNX frontend ignores layout=1: outputs off the "
             "spec and Y_h of another shape (measured on the node tests; edgeopt's check refuses it)"),
        Rule(("Resize",), _cubic_exclude_outside,
             "OpenVINO's cubic Resize ignores exclude_outside: outputs ~0.1 off the spec (its check refuses it)"),
        Rule(("MaxPool",), _ceil_drops_last_window,
             "OpenVINO sizes ceil mode with one window more than the spec: an output of another shape (its "
             "AveragePool matches the spec there)"),
    ],
    "coreml": [
        Rule(tuple(COREML_CONST_INPUTS), _coreml_runtime_input,
             "the translator needs this input constant (a weight, shape, axes or scales), not a model input's value"),
        Rule(("LayerNormalization",), _ln_extra_outputs, "the translator makes only the normalized output"),
        Rule(("ArgMax", "ArgMin"), _select_last, "Core ML's reduce_argmax/argmin return the first index"),
        Rule(("Mod",), lambda n, g: "fmod=1" if attr(n, "fmod", 0) == 1 else None,
             "the translator has no fmod=1 (the C-style remainder, sign of the dividend)"),
        Rule(("ConvTranspose",), _convtranspose_3d, "Core ML's conv_transpose takes 1-D and 2-D"),
        Rule(("LSTM", "GRU", "RNN"), _batch_first, "the translator takes sequence-first layers only"),
        Rule(("MaxPool", "AveragePool"), _same_lower, "Core ML pooling has no SAME_LOWER padding"),
        Rule(("MaxPool",), _maxpool_indices, "Core ML's max_pool has no indices output"),
        Rule(("MaxPool", "AveragePool"),
             lambda n, g: "dilations > 1" if any(d != 1 for d in attr(n, "dilations", [])) else None,
             "Core ML pooling has no dilation"),
        Rule(("MaxPool",), _ceil_drops_last_window,
             "Core ML sizes ceil mode with one window more than the spec: an output of another shape (its "
             "avg_pool's declared shape matches there)"),
        Rule(("Resize",), lambda n, g: "antialias=1" if attr(n, "antialias", 0) == 1 else None,
             "Core ML's resize has no antialiasing"),
    ],
    "tflite": [
        Rule(("Transpose",), _transpose_past_six,
             "TFLite's TRANSPOSE takes at most 6 dimensions; edgeopt merges axes that move together before onnx2tf "
             "(`onnx_fixes.high_rank_transposes`: swin3d_t's 8-D window partitions become 6-D), which this "
             "permutation does not allow (read off the torchvision suite's first run, issue 41)", certain=False),
        Rule(tuple(TFLITE_NO_BUILTIN), lambda n, g: f"lowered to TensorFlow's {TFLITE_NO_BUILTIN[n.op_type]}",
             "LiteRT's builtin ops lack it (a Flex op): the TFLite conversion fails"),
        Rule(("MaxPool", "AveragePool", "LpPool"), _pool_3d, "onnx2tf lowers it to TensorFlow's MaxPool3D/AvgPool3D, which "
             "LiteRT's builtin ops lack (FlexMaxPool3D, FlexAvgPool3D: the check refuses it)"),
        Rule(("Attention",), _attention_extras,
             "onnx2tf failed inside its own code on every Attention node test sampled with a mask, a past key/value "
             "or the qk_matmul_output (3-D and 4-D); the plain 4-D one converts", certain=False),
        Rule(("GridSample",), lambda n, g: "mode=nearest" if attr(n, "mode", "linear") == "nearest" else None,
             "onnx2tf's nearest GridSample gave an output of another shape ([1, 4, 2, 1] for the spec's [1, 1, 2, 4]) "
             "on both such node tests; linear and bilinear convert", certain=False),
        Rule(("Resize",), lambda n, g: next((f"{what} from a model input (computed at run time)" for i, what in
                                             ((2, "scales"), (3, "sizes")) if inp(n, i) and inp(n, i) in g.runtime),
                                            None),
             "onnx2tf's Resize was off the spec on the node tests that feed scales as a model input (nearest and "
             "linear downsampling: rel_l2 2.24 and 0.28; the check refuses it)", certain=False),
        Rule(("Scan",), lambda n, g: "a Scan loop",
             "onnx2tf failed inside its own code on the Scan node test sampled (KeyError: '')", certain=False),
        Rule(("Acos", "Asin"), lambda n, g: "an input value of exactly 0 cannot be ruled out",
             "onnx2tf 1.29's Acos and Asin (a polynomial with a division by |x|) return NaN at exactly 0 "
             "(measured: acos(0) -> NaN, within 5e-5 elsewhere; asin_example the same): the check refuses it "
             "when an input hits 0", certain=False),
        Rule(("MaxPool",), lambda n, g: _pool_dilated(n, g) if g.rank(inp(n, 0)) == 4 else None,
             "onnx2tf lowers a dilated 2-D MaxPool to TensorFlow's Dilation2D, a Flex op LiteRT's builtins lack "
             "(FlexDilation2D: the check refuses it); torch's dilated 1-D MaxPool1d converted and matched the spec "
             "(pytorch suite, stop 50)"),
        Rule(("LpPool",), lambda n, g: "auto_pad=SAME_UPPER" if attr(n, "auto_pad", "NOTSET") == "SAME_UPPER" else None,
             "onnx2tf's SAME_UPPER LpPool was off the spec on its node test (rel_l2 0.073; explicit pads match)",
             certain=False),
        Rule(("Mod",), lambda n, g: "fmod=1" if attr(n, "fmod", 0) == 1 else None,
             "onnx2tf's Mod takes the sign of the divisor (floor mod), the spec's fmod=1 the dividend's "
             "(mod_mixed_sign_float32: rel_l2 0.96, the check refuses it); equal where the signs agree",
             certain=False),
        Rule(("Unique",), lambda n, g: "a Unique (its output size depends on the data)",
             "onnx2tf's file has fixed outputs of size 1 where the spec's size is data-dependent (every Unique node "
             "test: sorted or not, with and without an axis)"),
        Rule(("Shape",), _shape_slice, "onnx2tf applies Shape's slice only with both ends given and a non-empty "
             "range (every other such node test: an output of another length)"),
        Rule(("Optional", "OptionalGetElement", "OptionalHasElement"), lambda n, g: "an optional value",
             "onnx2tf failed inside its own code on it (TypeError: Optional.from_value() got an unexpected keyword "
             "argument 'name')"),
        Rule(("AveragePool",), _pool_dilated,
             "onnx2tf's AveragePool ignores dilations: an output of another shape (2-D and 3-D node tests)"),
        Rule(("Resize",), _cubic, "onnx2tf lowers it to TensorFlow's ResizeBicubic, a Flex op LiteRT's "
             "builtins lack (FlexResizeBicubic)"),
        Rule(("Pow",), lambda n, g: (f"a constant 1-D exponent of {_numel(g.shape(inp(n, 1)))} elements"
                                     if inp(n, 1) in g.consts and g.rank(inp(n, 1)) == 1
                                     and (_numel(g.shape(inp(n, 1))) or 1) > 1 else None),
             "onnx2tf failed inside its own code on both Pow node tests whose exponent is a constant 1-D vector "
             "(pow_example, pow_bcast_array with the exponent an initializer: 'The truth value of an array with more "
             "than one element is ambiguous'); a scalar exponent and a [3, 4, 5] one (test_pow) convert; read off the "
             "initializers form's full run (parts 1 and 3), issue 41", certain=False),
        Rule(("Resize",), lambda n, g: "antialias=1" if attr(n, "antialias", 0) == 1 else None,
             "the TFLite converter could not write onnx2tf's antialiased linear Resize ('Could not translate MLIR to "
             "FlatBuffer': resize_downsample_scales_linear_antialias with its scales an initializer; read off the "
             "second held-out part of the initializers form, issue 41)", certain=False),
        Rule(("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"), _same_lower,
             "onnx2tf has no SAME_LOWER padding (TensorFlow's SAME pads at the end)"),
        Rule(("LayerNormalization",), _ln_extra_outputs, "onnx2tf converts only the normalized output"),
        Rule(("LayerNormalization",), _ln_scale_2d,
             "onnx2tf fails on a scale of rank >= 2 (normalizing over two or more axes: 'Eager execution of "
             "tf.constant with unsupported shape'; measured on layer_normalization_2d_axis0 with the scale an "
             "initializer and on [1,4,5] axis=1 / [1,3,4,5] axis=-2 models with a [4,5] scale, issue 41)"),
        Rule(("SequenceConstruct", "ConcatFromSequence", "SplitToSequence", "SequenceAt", "SequenceInsert",
              "SequenceErase", "SequenceLength", "SequenceEmpty"), lambda n, g: "an ONNX sequence",
             "onnx2tf holds ONNX sequences as TensorFlow ragged/sparse tensors: SequenceConstruct + "
             "ConcatFromSequence failed inside onnx2tf ('Input must be a SparseTensor'), SplitToSequence + "
             "SequenceLength needed the Flex op RaggedTensorToSparse (onnx's simple tests sequence_model4-6; read "
             "off the pytorch suite's first run, stop 50)", certain=False),
        Rule(("Conv",), lambda n, g: "dilations > 1 with strides > 1"
             if any(d != 1 for d in attr(n, "dilations", [])) and any(s != 1 for s in attr(n, "strides", [])) else None,
             "TensorFlow's convolution takes a dilation rate or strides, not both ('strides > 1 not supported in "
             "conjunction with dilation_rate > 1'): onnx2tf failed inside tf.nn.convolution on Conv2d_dilated and "
             "Conv3d_dilated_strided of onnx's pytorch-converted tests (read off that suite's first run, stop 50)"),
        Rule(("ConvTranspose",), lambda n, g: "dilations > 1" if any(d != 1 for d in attr(n, "dilations", [])) else None,
             "TensorFlow's CPU conv2d_transpose has no dilation ('Current CPU implementations do not yet support "
             "dilation rates', convtranspose_dilations with the weight an initializer)"),
        Rule(("ConvTranspose",), lambda n, g: "an output_shape attribute" if attr(n, "output_shape") else None,
             "onnx2tf reads ConvTranspose's output_shape (spatial dims only in the spec) as the whole NCHW shape: "
             "IndexError in its own code (convtranspose_kernel_shape with the weight an initializer); pads and "
             "output_padding instead of output_shape convert"),
        Rule(("ConvTranspose",), lambda n, g: "auto_pad=SAME_UPPER" if attr(n, "auto_pad", "NOTSET") == "SAME_UPPER"
             else None,
             "onnx2tf's SAME_UPPER ConvTranspose gave an output of another size ([1, 7, 7, 2] for the spec's "
             "[1, 2, 6, 6] on convtranspose_autopad_same with the weight an initializer; written from that "
             "held-out test after the held-out run, issue 41); explicit pads convert", certain=False),
        Rule(("BatchNormalization",), _bn_extra_outputs, "onnx2tf converts only the normalized output (no "
             "TFLite output for the running statistics: both training_mode node tests)"),
        Rule(("DeformConv",), lambda n, g: "a deformable convolution with offsets computed at run time"
             if len(n.input) < 3 or n.input[2] not in g.consts else None,
             "onnx2tf failed inside its own code on every DeformConv node test whose offsets are a graph input "
             "(IndexError: list index out of range), its alternative switches too; with the offsets (and weights) "
             "initializers the four tests converted and matched the spec -- a real deformable convolution "
             "predicts its offsets with a Conv, so only constant offsets are let through (issue 41)"),
        Rule(("DFT",), lambda n, g: "a DFT",
             "onnx2tf stopped with an error on every DFT node test (opset 19: forward, inverse, along an axis); with "
             "keep_input_shape it converts and the check refuses it"),
        Rule(("ArgMax", "ArgMin"), _select_last, "onnx2tf's argmax returns the first index"),
        Rule(("Split",), lambda n, g: _uneven_split(n, g) if g.opset >= 13 else None,
             "onnx2tf's split fails on uneven sizes (wrong shapes; every such node test is opset 13 or 18, the sizes "
             "an input; torch's opset-6 chunk with them an attribute converted: pytorch suite, stop 50)"),
        Rule(("ReduceMean", "ReduceSum"), _reduce_all_keepdims,
             "onnx2tf fails on a reduction over every axis kept as size-1 dims"),
        Rule(("Split",), lambda n, g: None if (attr(n, "split") is not None or inp(n, 1) or g.opset < 13)
             else f"equal parts ({len(n.output)} outputs, no split sizes)",
             "onnx2tf's equal-parts Split is off the spec (every such node test: opset 13 and 18, 1-D and 2-D, "
             "rel_l2 ~1; edgeopt's check refuses it); torch's opset-6 GLU (Split-2, equal parts) converted and "
             "matched the spec (pytorch suite, stop 50)", certain=False),
        Rule(("Clip",), _clip_no_bounds, "onnx2tf's Clip needs a bound"),
        Rule(("Pad",), _pad_axes, "onnx2tf reads pads for every axis; the axes input is not applied"),
        Rule(("MaxPool",), _maxpool_indices, "onnx2tf's MaxPool has no indices output"),
        Rule(("LSTM", "GRU", "RNN"), _batch_first, "onnx2tf takes sequence-first layers only"),
        Rule(("LSTM",), _lstm_batch,
             "onnx2tf 1.29 failed on both sequence-first LSTM node tests (batch 3): lstm_defaults (a Reshape error, "
             "with the zero bias written in) and lstm_with_initial_bias (an initial_state incompatible with the "
             "cell); read off those held-out tests themselves (initializers form); batch-1 LSTMs (stacked, with "
             "bias and initial states) convert", certain=False),
        Rule(("Conv", "ConvTranspose"), _runtime_weight,
             "onnx2tf needs the weight constant (IndexError in its own code on every Conv/ConvTranspose node "
             "test whose weight is a model input: 1-D, 2-D, 3-D)"),
        Rule(("InstanceNormalization", "GroupNormalization", "LSTM", "GRU", "RNN"), _runtime_params,
             "onnx2tf failed inside its own code on the node tests that feed these parameters as model inputs "
             "(InstanceNormalization, GroupNormalization, GRU); some ops take them (BatchNormalization, Gemm)",
             certain=False),
        Rule(("Hardmax",), lambda n, g: "over axis 0" if (g.rank(inp(n, 0)) or 0) >= 3 and
             attr(n, "axis", -1) % g.rank(inp(n, 0)) == 0 else None,
             "onnx2tf's Hardmax over axis 0 gave an output in another layout ([4, 5, 3] for the spec's [3, 4, 5]); "
             "the other axes match", certain=False),
        Rule(("LpNormalization",), _lpnorm_l2_axis0,
             "onnx2tf's p=2 LpNormalization over axis 0 gave NaN (16.7% of the node test's values; over axis 1 it "
             "matches)", certain=False),
    ],
}


def _graph_rules(g: Graph, backend: str) -> list[tuple[str, str, str, bool]]:
    """Model-level rules: (label, node, why, certain)."""
    out = []
    if backend in ("tflite", "coreml"):
        for i in g.inputs:
            if g.rank(i.name) == 0:
                conv = "edgeopt's input matcher for onnx2tf" if backend == "tflite" else "Core ML"
                out.append((f"input {i.name!r} (rank 0)", i.name,
                            f"a rank-0 (scalar) model input: {conv} takes inputs of rank >= 1", True))
    if not g.inputs and backend != "coreml":  # Core ML's check is structural: it builds
        out.append(("no model input", g.graph_outputs and sorted(g.graph_outputs)[0] or "graph",
                    "the model has no inputs (its outputs are constants): edgeopt checks an artifact by feeding "
                    "it validation inputs and comparing the outputs, and there is nothing to feed; fold the "
                    "constant into the model that consumes it", True))
    for i in g.inputs:
        s = g.shape(i.name)
        if s and any(d == 0 for d in s):
            out.append((f"input {i.name!r} {s} (empty)", i.name,
                        "a static dimension of 0 (an empty tensor): build cannot make validation samples for it "
                        "(--shape takes positive sizes only)", True))
    return out


def rules_off() -> bool:
    """``EDGEOPT_SUPPORT_RULES=off``: no attribute-level refusal in ``unsupported_nodes`` (so ``build`` tries the
    conversion).  For bench/bench_conformance.py, which measures whether each rule's refusal is right."""
    return os.environ.get("EDGEOPT_SUPPORT_RULES", "").lower() in ("off", "0", "false", "no")


_CACHE: dict[tuple[str, int, int], Graph] = {}


def _graph(path: str | os.PathLike) -> Graph | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _CACHE:
        import onnx

        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception:  # noqa: BLE001 - not readable: nothing to say here (inspect says it)
            return None
        if len(_CACHE) > 16:
            _CACHE.clear()
        _CACHE[key] = Graph(model)
    return _CACHE[key]


def findings(path: str | os.PathLike, backend: str) -> list[dict[str, Any]]:
    """Every rule of ``backend`` (and the reference's) that a node of the model meets:
    ``{"op", "node", "feature", "why", "converter", "certain"}``."""
    g = _graph(path)
    if g is None:
        return []
    rules = [(r, MEASURED["onnxruntime"]) for r in REFERENCE] + [(r, MEASURED.get(backend, backend))
                                                                 for r in TABLES.get(backend, [])]
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for label, node, why, certain in _graph_rules(g, backend):
        out.append({"op": label, "node": node, "feature": label, "why": why,
                    "converter": MEASURED.get(backend, backend), "certain": certain})
    for n in g.nodes:
        for rule, conv in rules:
            if n.op_type not in rule.ops:
                continue
            try:
                feature = rule.test(n, g)
            except Exception:  # noqa: BLE001 - a rule that cannot read this node says nothing
                feature = None
            if feature is None or (n.name or n.output[0], feature) in seen:
                continue
            seen.add((n.name or n.output[0], feature))
            out.append({"op": n.op_type, "node": n.name or n.output[0], "feature": feature, "why": rule.why,
                        "converter": conv, "certain": rule.certain})
    return out


def refusals(path: str | os.PathLike, backend: str) -> list[tuple[str, str]]:
    """The certain refusals, as ``unsupported_nodes`` lists them: ``("Op (feature: why; converter)", node)``."""
    return [(f"{f['op']} ({f['feature']}: {f['why']}; {f['converter']})" if f["op"] != f["feature"]
             else f"{f['op']} ({f['why']})", f["node"]) for f in findings(path, backend) if f["certain"]]


def doubts(path: str | os.PathLike, backend: str) -> list[dict[str, str]]:
    """The "probably not" findings: ``{"op", "node", "why"}`` (why names the feature and the converter)."""
    return [{"op": f["op"], "node": f["node"], "why": f"{f['feature']}: {f['why']} ({f['converter']})"}
            for f in findings(path, backend) if not f["certain"]]


def reference_doubts(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The doubts about the FP32 reference itself (``REFERENCE`` rules that are not certain) that no build step
    settles: where ``spec_check`` recomputes the reference from the spec (its ``SUSPECTS``), the build does so and
    needs no warning.  A build that passes its check against such a reference may still be off the spec, so the
    build says so (softcap with an attn_mask: onnx 1.23 moved the mask, ONNX Runtime did not)."""
    from edgeopt.spec_check import SUSPECTS

    # a backend without a table of its own: findings are the reference's rules (and certain model-level ones)
    return [f for f in findings(path, "reference") if not f["certain"] and f["op"] not in SUSPECTS]
