"""Core ML translators, part 2: elementwise math, MatMul/Gemm, shapes and indexing, reductions, casts.

Shape arguments (Reshape's shape, Slice's starts, Squeeze's axes, ...) must be constants after
folding; with static input shapes the exporters' Shape-computing subgraphs always are.  The
parameter translation is plain numpy (``slice_params``, ``reshape_target``) and is unit-tested
against ONNX Runtime.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .ops import Context, Unsupported, norm_axis, op

# --- elementwise ------------------------------------------------------------------------------
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Equal": "equal", "Less": "less", "LessOrEqual": "less_equal",
           "Greater": "greater", "GreaterOrEqual": "greater_equal", "And": "logical_and", "Or": "logical_or",
           "Xor": "logical_xor"}


@op(*_BINARY)
def binary(ctx: Context, node: Any) -> Any:
    return getattr(ctx.mb, _BINARY[node.op_type])(x=ctx.x(node, 0), y=ctx.x(node, 1), name=ctx.nm(node))


@op("Div")
def div(ctx: Context, node: Any) -> Any:
    mb = ctx.mb
    if ctx.is_float(node):
        return mb.real_div(x=ctx.x(node, 0), y=ctx.x(node, 1), name=ctx.nm(node))
    # Integer Div truncates toward zero in ONNX; MIL's floor_div floors.  Divide in fp32 and cast
    # back (the cast truncates), exact for |values| < 2**24.
    a, b = (mb.cast(x=ctx.x(node, i), dtype="fp32") for i in (0, 1))
    return mb.cast(x=mb.real_div(x=a, y=b), dtype="int32", name=ctx.nm(node))


@op("Mod")
def mod(ctx: Context, node: Any) -> Any:
    if ctx.attr(node, "fmod", 0):
        raise Unsupported("fmod=1")
    return ctx.mb.mod(x=ctx.x(node, 0), y=ctx.x(node, 1), name=ctx.nm(node))


@op("Pow")
def pow_(ctx: Context, node: Any) -> Any:
    mb, x = ctx.mb, ctx.x(node, 0)
    e = ctx.consts.get(node.input[1])
    if e is not None and e.size == 1:
        k = float(e.reshape(-1)[0])
        # Small integer powers as products: exact, and safe for negative bases on GPU/ANE,
        # where pow may be computed as exp(k*log(x)).
        if k == 1.0:
            return mb.identity(x=x, name=ctx.nm(node))
        if k == 2.0:
            return mb.mul(x=x, y=x, name=ctx.nm(node))
        if k == 3.0:
            return mb.mul(x=mb.mul(x=x, y=x), y=x, name=ctx.nm(node))
        if k == 0.5:
            return mb.sqrt(x=x, name=ctx.nm(node))
        if k == -1.0:
            return mb.real_div(x=np.float32(1), y=x, name=ctx.nm(node))
        return mb.pow(x=x, y=np.float32(k), name=ctx.nm(node))
    y = ctx.x(node, 1)
    if ctx.types.is_float(x.dtype) and not ctx.types.is_float(y.dtype):
        y = mb.cast(x=y, dtype=ctx.types.builtin_to_string(x.dtype))
    return mb.pow(x=x, y=y, name=ctx.nm(node))


@op("Max", "Min", "Sum", "Mean")
def variadic(ctx: Context, node: Any) -> Any:
    fn = {"Max": ctx.mb.maximum, "Min": ctx.mb.minimum, "Sum": ctx.mb.add, "Mean": ctx.mb.add}[node.op_type]
    acc = ctx.x(node, 0)
    for i in range(1, len(node.input)):
        acc = fn(x=acc, y=ctx.x(node, i))
    if node.op_type == "Mean":
        acc = ctx.mb.real_div(x=acc, y=np.float32(len(node.input)))
    return ctx.mb.identity(x=acc, name=ctx.nm(node))


_UNARY = {"Abs": "abs", "Exp": "exp", "Sqrt": "sqrt", "Floor": "floor", "Ceil": "ceil", "Round": "round",
          "Sign": "sign", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan",
          "Sinh": "sinh", "Cosh": "cosh", "Atanh": "atanh", "Not": "logical_not"}


@op(*_UNARY)
def unary(ctx: Context, node: Any) -> Any:
    return getattr(ctx.mb, _UNARY[node.op_type])(x=ctx.x(node), name=ctx.nm(node))


@op("Log")
def log(ctx: Context, node: Any) -> Any:
    return ctx.mb.log(x=ctx.x(node), epsilon=0.0, name=ctx.nm(node))  # MIL's default adds 1e-45


@op("Neg")
def neg(ctx: Context, node: Any) -> Any:
    k = np.float32(-1) if ctx.is_float(node) else np.int32(-1)
    return ctx.mb.mul(x=ctx.x(node), y=k, name=ctx.nm(node))


@op("Reciprocal")
def reciprocal(ctx: Context, node: Any) -> Any:
    return ctx.mb.real_div(x=np.float32(1), y=ctx.x(node), name=ctx.nm(node))  # inverse() adds an epsilon


@op("Where")
def where(ctx: Context, node: Any) -> Any:
    return ctx.mb.select(cond=ctx.x(node, 0), a=ctx.x(node, 1), b=ctx.x(node, 2), name=ctx.nm(node))


@op("Identity", "Dropout")
def identity(ctx: Context, node: Any) -> Any:
    if node.op_type == "Dropout" and len(node.output) > 1 and node.output[1]:
        raise Unsupported("the mask output of Dropout")
    return ctx.mb.identity(x=ctx.x(node), name=ctx.nm(node))


# --- casts ------------------------------------------------------------------------------------
_CAST = {1: "fp32", 10: "fp16", 11: "fp32", 6: "int32", 7: "int32", 9: "bool"}


def _cast_to(ctx: Context, node: Any, to: int) -> Any:
    dt = _CAST.get(int(to))
    if dt is None:
        raise Unsupported(f"cast to ONNX type {to} (Core ML computes in fp16/fp32/int32/bool)")
    x = ctx.x(node)
    if ctx.types.builtin_to_string(x.dtype) == dt:
        return ctx.mb.identity(x=x, name=ctx.nm(node))
    return ctx.mb.cast(x=x, dtype=dt, name=ctx.nm(node))


@op("Cast")
def cast(ctx: Context, node: Any) -> Any:
    return _cast_to(ctx, node, ctx.attr(node, "to"))


@op("CastLike")
def cast_like(ctx: Context, node: Any) -> Any:
    from .ops import ONNX_NP

    name = node.input[1]
    dtype = ctx.consts[name].dtype.name if name in ctx.consts else ctx.value_info.get(name, (None, None))[1]
    to = next((k for k, v in ONNX_NP.items() if v == dtype), None)
    if to is None:
        raise Unsupported("the target type of CastLike is unknown")
    return _cast_to(ctx, node, to)


# --- matrix products --------------------------------------------------------------------------
@op("MatMul")
def matmul(ctx: Context, node: Any) -> Any:
    return ctx.mb.matmul(x=ctx.x(node, 0), y=ctx.x(node, 1), name=ctx.nm(node))


@op("Gemm")
def gemm(ctx: Context, node: Any) -> Any:
    mb = ctx.mb
    alpha, beta = float(ctx.attr(node, "alpha", 1.0)), float(ctx.attr(node, "beta", 1.0))
    ta, tb = bool(ctx.attr(node, "transA", 0)), bool(ctx.attr(node, "transB", 0))
    c = ctx.consts.get(node.input[2]) if ctx.has(node, 2) else None
    if not ta and node.input[1] in ctx.consts:
        # The common case: a fully connected layer, as Core ML's linear op (weight [out, in]).
        b = ctx.consts[node.input[1]].astype(np.float32)
        w = (b if tb else b.T) * np.float32(alpha)
        n = w.shape[0]
        bias = None
        if c is not None and c.size in (1, n) and (c.ndim < 2 or c.shape[0] == 1):
            bias = np.broadcast_to(c.astype(np.float32).reshape(-1), (n,)) * np.float32(beta)
        y = mb.linear(x=ctx.x(node, 0), weight=w, bias=bias)
        if ctx.has(node, 2) and bias is None:
            y = mb.add(x=y, y=mb.mul(x=ctx.x(node, 2), y=np.float32(beta)))
        return mb.identity(x=y, name=ctx.nm(node))
    y = mb.matmul(x=ctx.x(node, 0), y=ctx.x(node, 1), transpose_x=ta, transpose_y=tb)
    if alpha != 1.0:
        y = mb.mul(x=y, y=np.float32(alpha))
    if ctx.has(node, 2) and beta != 0.0:
        cv = ctx.x(node, 2)
        y = mb.add(x=y, y=cv if beta == 1.0 else mb.mul(x=cv, y=np.float32(beta)))
    return mb.identity(x=y, name=ctx.nm(node))


# --- shapes -----------------------------------------------------------------------------------
@op("Constant")
def constant(ctx: Context, node: Any) -> Any:
    from .ops import fold

    return fold(node, ctx.consts, ctx.opset)[0]  # reached only when folding was skipped


@op("Shape")
def shape(ctx: Context, node: Any) -> np.ndarray:
    s = np.array(ctx.shape(node), dtype=np.int64)  # static shapes: Shape is a constant
    start, end = ctx.attr(node, "start", 0), ctx.attr(node, "end", None)
    return s[slice(start, end)]


@op("Size")
def size(ctx: Context, node: Any) -> np.ndarray:
    return np.array(int(np.prod(ctx.shape(node))), dtype=np.int64)


def reshape_target(in_shape: tuple[int, ...], shape: list[int], allowzero: bool = False) -> list[int]:
    """ONNX Reshape's ``shape`` (0 = copy, -1 = infer) -> the concrete output shape."""
    out = [in_shape[i] if (d == 0 and not allowzero and i < len(in_shape)) else int(d) for i, d in enumerate(shape)]
    if out.count(-1) > 1:
        raise Unsupported("more than one -1 in the target shape")
    total = int(np.prod(in_shape))
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        if known == 0 or total % known:
            raise Unsupported(f"cannot reshape {list(in_shape)} to {list(shape)}")
        out[out.index(-1)] = total // known
    if int(np.prod(out)) != total:
        raise Unsupported(f"cannot reshape {list(in_shape)} to {list(shape)}")
    return out


@op("Reshape")
def reshape(ctx: Context, node: Any) -> Any:
    target = ctx.const(node, 1, "shape").tolist() if ctx.opset >= 5 else ctx.attr(node, "shape")
    out = reshape_target(ctx.shape(node), target, bool(ctx.attr(node, "allowzero", 0)))
    return ctx.mb.reshape(x=ctx.x(node), shape=out, name=ctx.nm(node))


@op("Flatten")
def flatten(ctx: Context, node: Any) -> Any:
    s = ctx.shape(node)
    a = int(ctx.attr(node, "axis", 1))  # in [-r, r]: r is allowed, a negative axis counts from r (not r + 1)
    axis = (norm_axis(a, len(s) + 1) if a >= 0 else norm_axis(a, len(s))) if len(s) else 0
    out = [int(np.prod(s[:axis])), int(np.prod(s[axis:]))]
    return ctx.mb.reshape(x=ctx.x(node), shape=out, name=ctx.nm(node))


@op("Transpose")
def transpose(ctx: Context, node: Any) -> Any:
    perm = ctx.attr(node, "perm") or list(reversed(range(ctx.rank(node))))
    return ctx.mb.transpose(x=ctx.x(node), perm=list(perm), name=ctx.nm(node))


@op("Concat")
def concat(ctx: Context, node: Any) -> Any:
    idx = [i for i in range(len(node.input)) if ctx.has(node, i) and 0 not in ctx.shape(node, i)]
    axis = norm_axis(ctx.attr(node, "axis"), ctx.rank(node, idx[0]) if idx else 1)
    if len(idx) == 1:
        return ctx.mb.identity(x=ctx.x(node, idx[0]), name=ctx.nm(node))
    return ctx.mb.concat(values=[ctx.x(node, i) for i in idx], axis=axis, name=ctx.nm(node))


def slice_params(shape: tuple[int, ...], starts: list[int], ends: list[int], axes: list[int] | None,
                 steps: list[int] | None) -> dict[str, list]:
    """ONNX Slice -> MIL ``slice_by_index`` arguments over every axis (clamping as ONNX/numpy do)."""
    rank = len(shape)
    axes = list(range(len(starts))) if axes is None else [norm_axis(a, rank) for a in axes]
    steps = [1] * len(starts) if steps is None else list(steps)
    begin, end, stride = [0] * rank, list(shape), [1] * rank
    end_mask = [False] * rank
    for s, e, a, st in zip(starts, ends, axes, steps):
        if st == 0:
            raise Unsupported("slice step 0")
        b, en, stp = slice(int(s), int(e), int(st)).indices(shape[a])
        if len(range(b, en, stp)) == 0:
            raise Unsupported(f"an empty slice on axis {a} (Core ML has no empty tensors)")
        begin[a], end[a], stride[a] = b, en, stp
        if stp < 0 and en < 0:  # runs through index 0: no end index expresses that, the mask does
            end[a], end_mask[a] = 0, True
    return {"begin": begin, "end": end, "stride": stride, "end_mask": end_mask}


@op("Slice")
def slice_(ctx: Context, node: Any) -> Any:
    if ctx.opset < 10:
        starts, ends = ctx.attr(node, "starts"), ctx.attr(node, "ends")
        axes, steps = ctx.attr(node, "axes"), None
    else:
        starts, ends = ctx.const(node, 1, "starts").tolist(), ctx.const(node, 2, "ends").tolist()
        axes = ctx.opt_const(node, 3, what="axes")
        steps = ctx.opt_const(node, 4, what="steps")
        axes = None if axes is None else axes.tolist()
        steps = None if steps is None else steps.tolist()
    p = slice_params(ctx.shape(node), starts, ends, axes, steps)
    return ctx.mb.slice_by_index(x=ctx.x(node), name=ctx.nm(node), **p)


def _axes(ctx: Context, node: Any, attr_until: int) -> list[int] | None:
    """Axes from the attribute (opset < attr_until) or from input 1."""
    if ctx.opset < attr_until:
        return ctx.attr(node, "axes")
    a = ctx.opt_const(node, 1, what="axes")
    return None if a is None else [int(v) for v in np.asarray(a).reshape(-1)]


@op("Squeeze")
def squeeze(ctx: Context, node: Any) -> Any:
    s = ctx.shape(node)
    axes = _axes(ctx, node, 13)
    axes = [i for i, d in enumerate(s) if d == 1] if axes is None else [norm_axis(a, len(s)) for a in axes]
    if not axes:
        return ctx.mb.identity(x=ctx.x(node), name=ctx.nm(node))
    return ctx.mb.squeeze(x=ctx.x(node), axes=sorted(axes), name=ctx.nm(node))


@op("Unsqueeze")
def unsqueeze(ctx: Context, node: Any) -> Any:
    axes = _axes(ctx, node, 13)
    if not axes:
        raise Unsupported("Unsqueeze without axes")
    out_rank = ctx.rank(node) + len(axes)
    return ctx.mb.expand_dims(x=ctx.x(node), axes=sorted(norm_axis(a, out_rank) for a in axes), name=ctx.nm(node))


def _indices(ctx: Context, node: Any, i: int, dim: int) -> Any:
    """Indices as int32 with negatives wrapped (iOS17's gathers take no negative indices)."""
    mb = ctx.mb
    name = node.input[i]
    if name in ctx.consts:
        idx = ctx.consts[name].astype(np.int64)
        return np.where(idx < 0, idx + dim, idx).astype(np.int32)
    v = ctx.var(name)
    if ctx.types.builtin_to_string(v.dtype) != "int32":
        v = mb.cast(x=v, dtype="int32")
    return mb.select(cond=mb.less(x=v, y=np.int32(0)), a=mb.add(x=v, y=np.int32(dim)), b=v)


@op("Gather")
def gather(ctx: Context, node: Any) -> Any:
    s = ctx.shape(node)
    axis = norm_axis(ctx.attr(node, "axis", 0), len(s))
    idx = _indices(ctx, node, 1, s[axis])
    return ctx.mb.gather(x=ctx.x(node), indices=idx, axis=axis, name=ctx.nm(node))


@op("GatherElements")
def gather_elements(ctx: Context, node: Any) -> Any:
    s = ctx.shape(node)
    axis = norm_axis(ctx.attr(node, "axis", 0), len(s))
    idx = _indices(ctx, node, 1, s[axis])
    return ctx.mb.gather_along_axis(x=ctx.x(node), indices=idx, axis=axis, name=ctx.nm(node))


@op("Expand")
def expand(ctx: Context, node: Any) -> Any:
    s = ctx.shape(node)
    out = list(np.broadcast_shapes(s, tuple(int(d) for d in ctx.const(node, 1, "shape"))))
    x = ctx.x(node)
    if len(out) > len(s):
        x = ctx.mb.reshape(x=x, shape=[1] * (len(out) - len(s)) + list(s))
    full = [1] * (len(out) - len(s)) + list(s)
    reps = [o // i for o, i in zip(out, full)]
    if all(r == 1 for r in reps):
        return ctx.mb.identity(x=x, name=ctx.nm(node))
    return ctx.mb.tile(x=x, reps=reps, name=ctx.nm(node))


@op("Tile")
def tile(ctx: Context, node: Any) -> Any:
    reps = [int(r) for r in ctx.const(node, 1, "repeats")]
    return ctx.mb.tile(x=ctx.x(node), reps=reps, name=ctx.nm(node))


@op("Split")
def split(ctx: Context, node: Any) -> Any:
    s = ctx.shape(node)
    axis = norm_axis(ctx.attr(node, "axis", 0), len(s))
    sizes = ctx.attr(node, "split") if ctx.opset < 13 else ctx.opt_const(node, 1, what="split")
    n = len(node.output)
    if sizes is None or len(sizes) == 0:
        k = -(-s[axis] // n)  # opset 18: the last chunk may be smaller
        sizes = [min(k, s[axis] - i * k) for i in range(n)]
    sizes = [int(v) for v in sizes]
    if sum(sizes) != s[axis] or any(v <= 0 for v in sizes):
        raise Unsupported(f"split sizes {sizes} do not cover axis {axis} of size {s[axis]}")
    outs = ctx.mb.split(x=ctx.x(node), split_sizes=sizes, axis=axis)
    return list(outs) if isinstance(outs, (list, tuple)) else [outs]


# --- reductions -------------------------------------------------------------------------------
_REDUCE = {"ReduceMean": "reduce_mean", "ReduceSum": "reduce_sum", "ReduceMax": "reduce_max",
           "ReduceMin": "reduce_min", "ReduceProd": "reduce_prod", "ReduceL1": "reduce_l1_norm",
           "ReduceL2": "reduce_l2_norm", "ReduceLogSum": "reduce_log_sum", "ReduceLogSumExp": "reduce_log_sum_exp",
           "ReduceSumSquare": "reduce_sum_square"}


@op(*_REDUCE)
def reduce(ctx: Context, node: Any) -> Any:
    rank = ctx.rank(node)
    axes = _axes(ctx, node, 13 if node.op_type == "ReduceSum" else 18)
    keep = bool(ctx.attr(node, "keepdims", 1))
    if not axes:
        if ctx.attr(node, "noop_with_empty_axes", 0):
            return ctx.mb.identity(x=ctx.x(node), name=ctx.nm(node))
        axes = list(range(rank))
    axes = sorted(norm_axis(a, rank) for a in axes)
    return getattr(ctx.mb, _REDUCE[node.op_type])(x=ctx.x(node), axes=axes, keep_dims=keep, name=ctx.nm(node))


@op("ArgMax", "ArgMin")
def arg_reduce(ctx: Context, node: Any) -> Any:
    if ctx.attr(node, "select_last_index", 0):
        raise Unsupported("select_last_index=1")
    fn = ctx.mb.reduce_argmax if node.op_type == "ArgMax" else ctx.mb.reduce_argmin
    axis = norm_axis(ctx.attr(node, "axis", 0), ctx.rank(node))
    return fn(x=ctx.x(node), axis=axis, keep_dims=bool(ctx.attr(node, "keepdims", 1)), name=ctx.nm(node))


@op("TopK")
def topk(ctx: Context, node: Any) -> Any:
    k = int(np.asarray(ctx.const(node, 1, "k")).reshape(-1)[0]) if ctx.opset >= 10 else ctx.attr(node, "k")
    axis = norm_axis(ctx.attr(node, "axis", -1), ctx.rank(node))
    if not ctx.attr(node, "sorted", 1):
        raise Unsupported("sorted=0")
    values, indices = ctx.mb.topk(x=ctx.x(node), k=k, axis=axis, ascending=not ctx.attr(node, "largest", 1))
    return [values, indices]


@op("CumSum")
def cumsum(ctx: Context, node: Any) -> Any:
    axis = norm_axis(int(np.asarray(ctx.const(node, 1, "axis")).reshape(-1)[0]), ctx.rank(node))
    return ctx.mb.cumsum(x=ctx.x(node), axis=axis, exclusive=bool(ctx.attr(node, "exclusive", 0)),
                         reverse=bool(ctx.attr(node, "reverse", 0)), name=ctx.nm(node))


# --- generators (folded when their inputs are constants) --------------------------------------
@op("ConstantOfShape")
def constant_of_shape(ctx: Context, node: Any) -> Any:
    from onnx import numpy_helper

    value = ctx.attr(node, "value")
    v = numpy_helper.to_array(value).reshape(-1)[0] if value is not None else np.float32(0)
    shape = ctx.x(node)
    if ctx.types.builtin_to_string(shape.dtype) != "int32":
        shape = ctx.mb.cast(x=shape, dtype="int32")
    v = np.float32(v) if np.asarray(v).dtype.kind == "f" else np.int32(v)
    return ctx.mb.fill(shape=shape, value=v, name=ctx.nm(node))


@op("Range")
def range_(ctx: Context, node: Any) -> Any:
    return ctx.mb.range_1d(start=ctx.x(node, 0), end=ctx.x(node, 1), step=ctx.x(node, 2), name=ctx.nm(node))
