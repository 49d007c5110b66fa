"""Core ML translators, part 1: convolution, pooling, normalization, activations, softmax, padding.

One small function per ONNX op (see ``ops`` for the table and the context).  Weights must
be constants after folding: Core ML's ``conv`` takes its weight as a constant.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .ops import Context, Unsupported, norm_axis, op, spatial_pads


def _f32(v: Any) -> np.ndarray:
    """A float32 copy of its own (coremltools' passes change const values in place: see ops.mil_array)."""
    return np.array(v, dtype=np.float32, copy=True)


# --- convolution ------------------------------------------------------------------------------
def conv_pad_args(auto_pad: str, pads: list[int] | None, n: int) -> dict[str, Any]:
    """ONNX ``auto_pad``/``pads`` -> MIL ``pad_type``/``pad``."""
    auto_pad = auto_pad or "NOTSET"
    if auto_pad == "NOTSET":
        return {"pad_type": "custom", "pad": spatial_pads(pads, n)}
    if auto_pad == "VALID":
        return {"pad_type": "valid"}
    if auto_pad == "SAME_UPPER":
        return {"pad_type": "same"}
    if auto_pad == "SAME_LOWER":
        return {"pad_type": "same_lower"}
    raise Unsupported(f"auto_pad {auto_pad!r}")


@op("Conv")
def conv(ctx: Context, node: Any) -> Any:
    w = ctx.const(node, 1, "weight")
    n = w.ndim - 2
    if not 1 <= n <= 3:
        raise Unsupported(f"{n}-D convolution (Core ML takes 1-D to 3-D)")
    kwargs = conv_pad_args(ctx.attr(node, "auto_pad"), ctx.attr(node, "pads"), n)
    if kwargs["pad_type"] == "same_lower" and not ctx.at_least("iOS16"):
        raise Unsupported("auto_pad SAME_LOWER needs min_deployment_target iOS16 or later")
    b = ctx.opt_const(node, 2, what="bias")
    return ctx.mb.conv(x=ctx.x(node), weight=_f32(w), bias=None if b is None else _f32(b),
                       strides=ctx.attr(node, "strides", [1] * n), dilations=ctx.attr(node, "dilations", [1] * n),
                       groups=ctx.attr(node, "group", 1), name=ctx.nm(node), **kwargs)


def conv_transpose_geometry(in_sp: list[int], k: list[int], strides: list[int], dil: list[int],
                            pads: list[int] | None, out_pad: list[int], out_shape: list[int] | None,
                            auto_pad: str) -> tuple[list[int], list[int], list[int]]:
    """ONNX ConvTranspose -> (pads begin, pads end, output spatial size) by the ONNX spec's formulas."""
    n = len(in_sp)
    full = [strides[i] * (in_sp[i] - 1) + out_pad[i] + (k[i] - 1) * dil[i] + 1 for i in range(n)]
    if out_shape:
        out_shape = list(out_shape)[-n:]
        total = [full[i] - out_shape[i] for i in range(n)]
        upper = auto_pad != "SAME_LOWER"
        begin = [t // 2 if upper else t - t // 2 for t in total]
        end = [t - b for t, b in zip(total, begin)]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [in_sp[i] * strides[i] for i in range(n)]
        total = [full[i] - out[i] for i in range(n)]
        begin = [t // 2 if auto_pad == "SAME_UPPER" else t - t // 2 for t in total]
        end = [t - b for t, b in zip(total, begin)]
    else:
        p = list(pads or [0] * 2 * n)
        begin, end = p[:n], p[n:]
    if any(v < 0 for v in begin + end):
        raise Unsupported("output_shape larger than the transposed convolution can produce")
    return begin, end, [full[i] - begin[i] - end[i] for i in range(n)]


@op("ConvTranspose")
def conv_transpose(ctx: Context, node: Any) -> Any:
    mb = ctx.mb
    w = _f32(ctx.const(node, 1, "weight"))  # [C_in, C_out/groups, k...] in ONNX and in MIL
    n = w.ndim - 2
    if not 1 <= n <= 2:
        raise Unsupported(f"{n}-D transposed convolution (Core ML takes 1-D and 2-D)")
    shape = ctx.shape(node)
    strides = ctx.attr(node, "strides", [1] * n)
    dil = ctx.attr(node, "dilations", [1] * n)
    groups = ctx.attr(node, "group", 1)
    out_pad = ctx.attr(node, "output_padding", [0] * n)
    begin, end, out_sp = conv_transpose_geometry(list(shape[2:]), list(w.shape[2:]), strides, dil,
                                                 ctx.attr(node, "pads"), out_pad, ctx.attr(node, "output_shape"),
                                                 ctx.attr(node, "auto_pad", "NOTSET"))
    b = ctx.opt_const(node, 2, what="bias")
    c_out = w.shape[1] * groups
    if not any(out_pad):
        return mb.conv_transpose(x=ctx.x(node), weight=w, bias=None if b is None else _f32(b), pad_type="custom",
                                 pad=[v for pair in zip(begin, end) for v in pair], strides=strides, dilations=dil,
                                 groups=groups, output_shape=[shape[0], c_out, *out_sp], name=ctx.nm(node))
    # output_padding: the full (unpadded) result, then crop the pads and zero-extend the end; the
    # extended positions receive no input contribution, only the bias (exactly ONNX's definition).
    y = mb.conv_transpose(x=ctx.x(node), weight=w, pad_type="valid", strides=strides, dilations=dil, groups=groups)
    full = [int(d) for d in y.shape[2:]]
    extra = [max(0, begin[i] + out_sp[i] - full[i]) for i in range(n)]
    if any(extra):
        y = mb.pad(x=y, pad=[v for e in extra for v in (0, e)])
    y = mb.slice_by_index(x=y, begin=[0, 0, *begin], end=[shape[0], c_out, *[begin[i] + out_sp[i] for i in range(n)]])
    if b is not None:
        y = mb.add(x=y, y=_f32(b).reshape([-1] + [1] * n))
    return mb.identity(x=y, name=ctx.nm(node))


# --- pooling ----------------------------------------------------------------------------------
def _pool_args(ctx: Context, node: Any) -> dict[str, Any]:
    k = ctx.attr(node, "kernel_shape")
    n = len(k)
    if not 1 <= n <= 3 or ctx.rank(node) != n + 2:
        raise Unsupported(f"{n}-D pooling on a rank-{ctx.rank(node)} tensor")
    if any(d != 1 for d in ctx.attr(node, "dilations", [1] * n)):
        raise Unsupported("dilated pooling")
    args = conv_pad_args(ctx.attr(node, "auto_pad"), ctx.attr(node, "pads"), n)
    if args["pad_type"] == "same_lower":
        raise Unsupported("auto_pad SAME_LOWER in pooling")
    return {"kernel_sizes": k, "strides": ctx.attr(node, "strides", [1] * n),
            "ceil_mode": bool(ctx.attr(node, "ceil_mode", 0)), **args}


@op("MaxPool")
def max_pool(ctx: Context, node: Any) -> Any:
    if len(node.output) > 1 and node.output[1]:
        raise Unsupported("the Indices output of MaxPool")
    return ctx.mb.max_pool(x=ctx.x(node), name=ctx.nm(node), **_pool_args(ctx, node))


@op("AveragePool")
def avg_pool(ctx: Context, node: Any) -> Any:
    return ctx.mb.avg_pool(x=ctx.x(node), exclude_padding_from_average=not ctx.attr(node, "count_include_pad", 0),
                           name=ctx.nm(node), **_pool_args(ctx, node))


@op("GlobalAveragePool", "GlobalMaxPool")
def global_pool(ctx: Context, node: Any) -> Any:
    axes = list(range(2, ctx.rank(node)))
    fn = ctx.mb.reduce_mean if node.op_type == "GlobalAveragePool" else ctx.mb.reduce_max
    return fn(x=ctx.x(node), axes=axes, keep_dims=True, name=ctx.nm(node))


# --- normalization ----------------------------------------------------------------------------
@op("BatchNormalization")
def batch_norm(ctx: Context, node: Any) -> Any:
    if ctx.attr(node, "training_mode", 0):
        raise Unsupported("training_mode=1")
    gamma, beta, mean, var = (_f32(ctx.const(node, i, w)) for i, w in
                              ((1, "scale"), (2, "bias"), (3, "mean"), (4, "var")))
    eps = float(ctx.attr(node, "epsilon", 1e-5))
    rank = ctx.rank(node)
    if 3 <= rank <= 5:
        return ctx.mb.batch_norm(x=ctx.x(node), mean=mean, variance=var, gamma=gamma, beta=beta, epsilon=eps,
                                 name=ctx.nm(node))
    # Other ranks: the same affine map, folded into one scale and one shift per channel.
    scale = gamma / np.sqrt(var + eps)
    shift = beta - mean * scale
    bshape = [-1] + [1] * max(rank - 2, 0)
    y = ctx.mb.mul(x=ctx.x(node), y=scale.reshape(bshape))
    return ctx.mb.add(x=y, y=shift.reshape(bshape), name=ctx.nm(node))


@op("InstanceNormalization")
def instance_norm(ctx: Context, node: Any) -> Any:
    gamma, beta = _f32(ctx.const(node, 1, "scale")), _f32(ctx.const(node, 2, "bias"))
    eps = float(ctx.attr(node, "epsilon", 1e-5))
    if ctx.rank(node) in (3, 4):
        return ctx.mb.instance_norm(x=ctx.x(node), gamma=gamma, beta=beta, epsilon=eps, name=ctx.nm(node))
    axes = list(range(2, ctx.rank(node)))
    bshape = [-1] + [1] * len(axes)
    y = ctx.mb.layer_norm(x=ctx.x(node), axes=axes, epsilon=eps)
    return ctx.mb.add(x=ctx.mb.mul(x=y, y=gamma.reshape(bshape)), y=beta.reshape(bshape), name=ctx.nm(node))


@op("LayerNormalization")
def layer_norm(ctx: Context, node: Any) -> Any:
    if any(n for n in node.output[1:]):
        raise Unsupported("the Mean/InvStdDev outputs of LayerNormalization")
    shape = ctx.shape(node)
    axis = norm_axis(ctx.attr(node, "axis", -1), len(shape))
    axes = list(range(axis, len(shape)))
    norm_shape = shape[axis:]
    eps = float(ctx.attr(node, "epsilon", 1e-5))
    gamma = ctx.opt_const(node, 1, what="scale")
    beta = ctx.opt_const(node, 2, what="bias")
    # Core ML wants gamma/beta of exactly the normalized shape; ONNX lets them broadcast.
    gamma = None if gamma is None else np.broadcast_to(_f32(gamma), norm_shape).copy()
    beta = None if beta is None else np.broadcast_to(_f32(beta), norm_shape).copy()
    return ctx.mb.layer_norm(x=ctx.x(node), axes=axes, gamma=gamma, beta=beta, epsilon=eps, name=ctx.nm(node))


# --- activations ------------------------------------------------------------------------------
_UNARY_ACT = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "erf", "Softplus": "softplus",
              "Softsign": "softsign"}


@op(*_UNARY_ACT)
def unary_activation(ctx: Context, node: Any) -> Any:
    return getattr(ctx.mb, _UNARY_ACT[node.op_type])(x=ctx.x(node), name=ctx.nm(node))


@op("LeakyRelu")
def leaky_relu(ctx: Context, node: Any) -> Any:
    return ctx.mb.leaky_relu(x=ctx.x(node), alpha=float(ctx.attr(node, "alpha", 0.01)), name=ctx.nm(node))


@op("Elu")
def elu(ctx: Context, node: Any) -> Any:
    return ctx.mb.elu(x=ctx.x(node), alpha=float(ctx.attr(node, "alpha", 1.0)), name=ctx.nm(node))


@op("Selu")
def selu(ctx: Context, node: Any) -> Any:
    y = ctx.mb.elu(x=ctx.x(node), alpha=float(ctx.attr(node, "alpha", 1.67326319217681884765625)))
    return ctx.mb.mul(x=y, y=np.float32(ctx.attr(node, "gamma", 1.05070102214813232421875)), name=ctx.nm(node))


@op("ThresholdedRelu")
def thresholded_relu(ctx: Context, node: Any) -> Any:
    return ctx.mb.thresholded_relu(x=ctx.x(node), alpha=float(ctx.attr(node, "alpha", 1.0)), name=ctx.nm(node))


@op("PRelu")
def prelu(ctx: Context, node: Any) -> Any:
    # max(x, 0) + slope * min(x, 0): exact for any slope shape ONNX's broadcasting allows.
    mb, x = ctx.mb, ctx.x(node)
    neg = mb.mul(x=mb.minimum(x=x, y=np.float32(0)), y=ctx.x(node, 1))
    return mb.add(x=mb.relu(x=x), y=neg, name=ctx.nm(node))


@op("HardSigmoid")
def hard_sigmoid(ctx: Context, node: Any) -> Any:
    return ctx.mb.sigmoid_hard(x=ctx.x(node), alpha=float(ctx.attr(node, "alpha", 0.2)),
                               beta=float(ctx.attr(node, "beta", 0.5)), name=ctx.nm(node))


@op("HardSwish")
def hard_swish(ctx: Context, node: Any) -> Any:
    x = ctx.x(node)
    return ctx.mb.mul(x=x, y=ctx.mb.sigmoid_hard(x=x, alpha=1.0 / 6, beta=0.5), name=ctx.nm(node))


@op("Gelu")
def gelu(ctx: Context, node: Any) -> Any:
    mode = {"none": "EXACT", "tanh": "TANH_APPROXIMATION"}.get(ctx.attr(node, "approximate", "none"))
    if mode is None:
        raise Unsupported(f"approximate={ctx.attr(node, 'approximate')!r}")
    return ctx.mb.gelu(x=ctx.x(node), mode=mode, name=ctx.nm(node))


@op("Mish")
def mish(ctx: Context, node: Any) -> Any:
    x = ctx.x(node)
    return ctx.mb.mul(x=x, y=ctx.mb.tanh(x=ctx.mb.softplus(x=x)), name=ctx.nm(node))


@op("Clip")
def clip(ctx: Context, node: Any) -> Any:
    mb = ctx.mb
    dt = np.float32 if ctx.is_float(node) else np.int32

    def bound(i: int) -> Any:  # a constant, a MIL var (a bound computed at run time: a log-mel's floor), or None
        if not ctx.has(node, i):
            return None
        return dt(ctx.const(node, i)) if ctx.is_const(node.input[i]) else ctx.x(node, i)

    if ctx.opset < 11:
        lo, hi = ctx.attr(node, "min"), ctx.attr(node, "max")
        lo, hi = (None if lo is None else dt(lo)), (None if hi is None else dt(hi))
    else:
        lo, hi = bound(1), bound(2)
    x = ctx.x(node)
    if ctx.is_float(node) and isinstance(lo, np.floating) and isinstance(hi, np.floating):
        return mb.clip(x=x, alpha=float(lo), beta=float(hi), name=ctx.nm(node))
    if lo is not None:
        x = mb.maximum(x=x, y=lo)
    if hi is not None:
        x = mb.minimum(x=x, y=hi)
    return mb.identity(x=x, name=ctx.nm(node))


# --- softmax ----------------------------------------------------------------------------------
def _softmax_like(ctx: Context, node: Any, log: bool) -> Any:
    mb = ctx.mb
    shape = ctx.shape(node)
    default = -1 if ctx.opset >= 13 else 1
    axis = norm_axis(ctx.attr(node, "axis", default), len(shape))

    def f(x, ax, name=None):
        kw = {"name": name} if name else {}
        if not log:
            return mb.softmax(x=x, axis=ax, **kw)
        # log(softmax) = x - logsumexp(x): stays finite where softmax underflows.
        return mb.sub(x=x, y=mb.reduce_log_sum_exp(x=x, axes=[ax], keep_dims=True), **kw)

    if ctx.opset >= 13 or axis == len(shape) - 1:
        return f(ctx.x(node), axis, ctx.nm(node))
    # Before opset 13 the input is flattened to 2-D at `axis` and normalized over the second part.
    rows = int(np.prod(shape[:axis]))
    y = f(mb.reshape(x=ctx.x(node), shape=[rows, -1]), 1)
    return mb.reshape(x=y, shape=list(shape), name=ctx.nm(node))


@op("Softmax")
def softmax(ctx: Context, node: Any) -> Any:
    return _softmax_like(ctx, node, log=False)


@op("LogSoftmax")
def log_softmax(ctx: Context, node: Any) -> Any:
    return _softmax_like(ctx, node, log=True)


# --- padding ----------------------------------------------------------------------------------
def pad_plan(pads: list[int], rank: int, axes: list[int] | None = None) -> tuple[list[int], list[tuple[int, int]]]:
    """ONNX pads ``[b0.., e0..]`` (over ``axes``) -> (MIL pad over the last N dims, crops per axis).

    MIL pads only non-negatively and only the last N dims; negative ONNX pads become crops.
    """
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    if len(pads) != 2 * len(axes):
        raise Unsupported(f"pads has {len(pads)} values for {len(axes)} axes")
    before = [0] * rank
    after = [0] * rank
    for i, a in enumerate(axes):
        before[a], after[a] = int(pads[i]), int(pads[i + len(axes)])
    crops = [(max(0, -b), max(0, -e)) for b, e in zip(before, after)]
    grow = [(max(0, b), max(0, e)) for b, e in zip(before, after)]
    first = next((i for i, g in enumerate(grow) if any(g)), rank)
    return [v for g in grow[first:] for v in g], crops


@op("Pad")
def pad(ctx: Context, node: Any) -> Any:
    mb = ctx.mb
    mode = ctx.attr(node, "mode", "constant")
    mil_mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}.get(mode)
    if mil_mode is None:
        raise Unsupported(f"mode {mode!r}")
    shape = ctx.shape(node)
    if ctx.opset < 11:
        pads, value, axes = ctx.attr(node, "pads"), ctx.attr(node, "value", 0.0), None
    else:
        pads = ctx.const(node, 1, "pads").tolist()
        value = ctx.opt_const(node, 2, 0, "constant_value")
        axes = ctx.opt_const(node, 3, what="axes")
        axes = None if axes is None else axes.tolist()
    if not ctx.is_float(node):
        raise Unsupported("padding a non-float tensor (Core ML pads fp16/fp32)")
    value = float(np.asarray(value).reshape(-1)[0]) if np.size(value) else 0.0
    mil_pad, crops = pad_plan(pads, len(shape), axes)
    x = ctx.x(node)
    if any(b or e for b, e in crops):
        x = mb.slice_by_index(x=x, begin=[b for b, _ in crops], end=[d - e for d, (_, e) in zip(shape, crops)])
    if not any(mil_pad):
        return mb.identity(x=x, name=ctx.nm(node))
    kw = {"constant_val": value} if mil_mode == "constant" else {}
    return mb.pad(x=x, pad=mil_pad, mode=mil_mode, name=ctx.nm(node), **kw)


# --- space/depth ------------------------------------------------------------------------------
@op("DepthToSpace")
def depth_to_space(ctx: Context, node: Any) -> Any:
    b = int(ctx.attr(node, "blocksize"))
    if ctx.attr(node, "mode", "DCR") == "DCR":  # TensorFlow's order == MIL depth_to_space
        return ctx.mb.depth_to_space(x=ctx.x(node), block_size=b, name=ctx.nm(node))
    return ctx.mb.pixel_shuffle(x=ctx.x(node), upscale_factor=b, name=ctx.nm(node))  # CRD == PyTorch's


@op("SpaceToDepth")
def space_to_depth(ctx: Context, node: Any) -> Any:
    return ctx.mb.space_to_depth(x=ctx.x(node), block_size=int(ctx.attr(node, "blocksize")), name=ctx.nm(node))
