"""Core ML translators, part 3: Resize/Upsample.

ONNX Resize has many coordinate conventions; Core ML's native resampling ops have two or three.
So the translation is done in numpy first and checked, not assumed:

1. ``resize_plan`` computes the output size and, per resized axis, ONNX's source coordinate of
   every output pixel (``source_coords``, the ONNX spec's formulas).
2. When Core ML's *documented* sampling grid for ``upsample_nearest_neighbor`` /
   ``upsample_bilinear`` equals ONNX's on those sizes, the native op is used.
3. Otherwise the resize is written exactly as what it is, a linear map per axis: nearest is a
   ``gather`` of the computed source indices, linear/cubic a ``matmul`` with the interpolation
   matrix (``interp_matrix``).  Slower than native, never different.

``interp_matrix``/``nearest_indices`` are unit-tested against ONNX Runtime.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .ops import Context, Unsupported, norm_axis, op

COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
               "tf_half_pixel_for_nn")


def source_coords(mode: str, out: int, size: int, scale: float) -> np.ndarray:
    """ONNX ``coordinate_transformation_mode``: the input coordinate of each output index."""
    x = np.arange(out, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = out / (scale * size)
        center = size / 2
        return center * (1 - adjustment) + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out > 1 else np.zeros(out)
    if mode == "align_corners":
        return x * (size - 1) / (out - 1) if out > 1 else np.zeros(out)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + 0.5) / scale
    raise Unsupported(f"coordinate_transformation_mode {mode!r}")


def nearest_indices(coords: np.ndarray, size: int, nearest_mode: str) -> np.ndarray:
    """ONNX ``nearest_mode`` rounding of source coordinates, clamped into the input."""
    if nearest_mode == "round_prefer_floor":
        idx = np.ceil(coords - 0.5)
    elif nearest_mode == "round_prefer_ceil":
        idx = np.floor(coords + 0.5)
    elif nearest_mode == "floor":
        idx = np.floor(coords)
    elif nearest_mode == "ceil":
        idx = np.ceil(coords)
    else:
        raise Unsupported(f"nearest_mode {nearest_mode!r}")
    return np.clip(idx, 0, size - 1).astype(np.int64)


def _cubic_weights(s: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic kernel at offsets -1, 0, 1, 2 from floor(x) (ONNX's formula)."""
    def far(t):  # 1 < |t| < 2
        return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a

    def near(t):  # |t| <= 1
        return ((a + 2) * t - (a + 3)) * t * t + 1

    return np.stack([far(s + 1), near(s), near(1 - s), far(2 - s)], axis=-1)


def interp_matrix(coords: np.ndarray, size: int, mode: str, cubic_a: float = -0.75,
                  exclude_outside: bool = False) -> np.ndarray:
    """The [out, in] matrix that resamples one axis (``mode`` linear or cubic)."""
    out = len(coords)
    m = np.zeros((out, size), dtype=np.float64)
    if mode == "linear":
        c = np.clip(coords, 0, size - 1)  # ONNX/ORT clamp the coordinate into the input
        lo = np.floor(c).astype(np.int64)
        hi = np.minimum(lo + 1, size - 1)
        w = c - lo
        np.add.at(m, (np.arange(out), lo), 1 - w)
        np.add.at(m, (np.arange(out), hi), w)
        return m
    if mode == "cubic":
        base = np.floor(coords).astype(np.int64)
        w = _cubic_weights(coords - base, cubic_a)
        idx = base[:, None] + np.arange(-1, 3)[None, :]
        if exclude_outside:
            w = np.where((idx >= 0) & (idx < size), w, 0.0)
            w = w / w.sum(axis=1, keepdims=True)
        idx = np.clip(idx, 0, size - 1)  # edge replication outside the input
        for k in range(4):
            np.add.at(m, (np.arange(out), idx[:, k]), w[:, k])
        return m
    raise Unsupported(f"mode {mode!r}")


@dataclass
class ResizePlan:
    """What one Resize does: output shape, and per resized axis its scale and source coordinates."""

    out_shape: list[int]
    axes: list[int]  # axes whose size or sampling changes
    scales: dict[int, float]
    coords: dict[int, np.ndarray]


def resize_plan(shape: tuple[int, ...], scales: np.ndarray | None, sizes: np.ndarray | None, coord_mode: str,
                axes: list[int] | None = None, policy: str = "stretch") -> ResizePlan:
    """Output shape and source coordinates of an ONNX Resize (scales *or* sizes, optional axes)."""
    rank = len(shape)
    axes = list(range(rank)) if axes is None else [norm_axis(a, rank) for a in axes]
    out = list(shape)
    sc: dict[int, float] = {}
    if sizes is not None and np.size(sizes):
        sizes = [int(v) for v in np.asarray(sizes).reshape(-1)]
        if len(sizes) != len(axes):
            raise Unsupported(f"sizes has {len(sizes)} values for {len(axes)} axes")
        if policy != "stretch":
            ratios = [sizes[i] / shape[a] for i, a in enumerate(axes)]
            r = min(ratios) if policy == "not_larger" else max(ratios)
            sizes = [int(math.floor(r * shape[a] + 0.5)) for a in axes]
            sc = {a: r for a in axes}
        for i, a in enumerate(axes):
            out[a] = sizes[i]
            sc.setdefault(a, sizes[i] / shape[a])
    elif scales is not None and np.size(scales):
        scales = [float(v) for v in np.asarray(scales).reshape(-1)]
        if len(scales) != len(axes):
            raise Unsupported(f"scales has {len(scales)} values for {len(axes)} axes")
        for i, a in enumerate(axes):
            if scales[i] <= 0:
                raise Unsupported(f"scale {scales[i]} on axis {a}")
            out[a] = int(math.floor(shape[a] * scales[i]))
            sc[a] = scales[i]
    else:
        raise Unsupported("neither scales nor sizes is given")
    if any(d <= 0 for d in out):
        raise Unsupported(f"output shape {out} has an empty dimension")
    changed = [a for a in axes if out[a] != shape[a] or sc[a] != 1.0]
    coords = {a: source_coords(coord_mode, out[a], shape[a], sc[a]) for a in changed}
    return ResizePlan(out, changed, sc, coords)


def native_nearest(plan: ResizePlan, shape: tuple[int, ...], nearest_mode: str) -> tuple[int, int] | None:
    """Integer (h, w) factors when Core ML's upsample_nearest_neighbor (index i // s) matches ONNX exactly."""
    rank = len(shape)
    if rank < 3 or any(a < rank - 2 for a in plan.axes):
        return None
    factors = []
    for a in (rank - 2, rank - 1):
        out, size = plan.out_shape[a], shape[a]
        if out % size:
            return None
        s = out // size
        if a in plan.coords and not np.array_equal(nearest_indices(plan.coords[a], size, nearest_mode),
                                                   np.arange(out) // s):
            return None
        factors.append(s)
    return factors[0], factors[1]


def coreml_bilinear_grid(out: int, size: int, align_corners: bool, half_pixel: bool) -> np.ndarray:
    """Core ML's documented upsample_bilinear sampling grid (clamped into the input)."""
    i = np.arange(out, dtype=np.float64)
    if align_corners:
        g = i * (size - 1) / (out - 1) if out > 1 else np.zeros(out)
    elif half_pixel:
        g = (i + 0.5) * size / out - 0.5
    else:
        g = i * size / out
    return np.clip(g, 0, size - 1)


def native_bilinear(plan: ResizePlan, shape: tuple[int, ...], half_pixel_ok: bool) -> dict[str, Any] | None:
    """upsample_bilinear arguments when its grid equals ONNX's linear sampling on both axes."""
    rank = len(shape)
    if rank < 3 or any(a < rank - 2 for a in plan.axes):
        return None
    options = [(True, False), (False, True)] + ([(False, False)] if half_pixel_ok else [])
    h, w = rank - 2, rank - 1
    for align, half in options:
        if all(np.allclose(np.clip(plan.coords[a], 0, shape[a] - 1),
                           coreml_bilinear_grid(plan.out_shape[a], shape[a], align, half), atol=1e-6)
               for a in (h, w) if a in plan.coords):
            fh, fw = (_fp32_scale(plan.out_shape[a], shape[a]) for a in (h, w))
            args = {"scale_factor_height": fh, "scale_factor_width": fw, "align_corners": align}
            if half_pixel_ok:
                args["half_pixel_centers"] = half
            return args
    return None


def _fp32_scale(out: int, size: int) -> float:
    """The fp32 scale MIL turns back into ``out`` (it sizes the output as floor(in * fp32(scale)))."""
    s = np.float32(out / size)
    # 9/5 in fp32 is 1.79999995, and 5 * that floors to 8: nudge up by ulps until the product
    # reaches ``out`` whether it is taken in fp32 or in fp64 (numpy 1 and 2 differ there).
    while min(np.floor(float(s) * size), np.floor(s * np.float32(size))) < out:
        s = np.nextafter(s, np.float32(np.inf))
    return float(s)


def _apply_matrix(mb: Any, x: Any, m: np.ndarray, axis: int, rank: int) -> Any:
    """Resample ``axis`` of ``x`` with ``m`` [out, in] via matmul (axis moved last when needed)."""
    m = m.astype(np.float32)
    if axis == rank - 1:
        return mb.matmul(x=x, y=np.ascontiguousarray(m.T))
    if axis == rank - 2:
        return mb.matmul(x=m, y=x)
    perm = [i for i in range(rank) if i != axis] + [axis]
    y = mb.matmul(x=mb.transpose(x=x, perm=perm), y=np.ascontiguousarray(m.T))
    return mb.transpose(x=y, perm=list(np.argsort(perm)))


def _resize(ctx: Context, node: Any, mode: str, coord_mode: str, nearest_mode: str, scales: Any, sizes: Any,
            axes: list[int] | None = None, policy: str = "stretch") -> Any:
    mb = ctx.mb
    shape = ctx.shape(node)
    if not ctx.is_float(node):
        raise Unsupported("resizing a non-float tensor")
    plan = resize_plan(shape, scales, sizes, coord_mode, axes, policy)
    x = ctx.x(node)
    if not plan.axes:
        return mb.identity(x=x, name=ctx.nm(node))
    if mode == "nearest":
        factors = native_nearest(plan, shape, nearest_mode)
        if factors:
            return mb.upsample_nearest_neighbor(x=x, scale_factor_height=factors[0], scale_factor_width=factors[1],
                                                name=ctx.nm(node))
        for a in plan.axes:
            x = mb.gather(x=x, indices=nearest_indices(plan.coords[a], shape[a], nearest_mode).astype(np.int32), axis=a)
        return mb.identity(x=x, name=ctx.nm(node))
    if mode == "linear":
        args = native_bilinear(plan, shape, half_pixel_ok=ctx.at_least("iOS16"))
        if args:
            return mb.upsample_bilinear(x=x, name=ctx.nm(node), **args)
    for a in plan.axes:
        m = interp_matrix(plan.coords[a], shape[a], mode, float(ctx.attr(node, "cubic_coeff_a", -0.75)),
                          bool(ctx.attr(node, "exclude_outside", 0)))
        x = _apply_matrix(mb, x, m, a, len(shape))
    return mb.identity(x=x, name=ctx.nm(node))


@op("Resize")
def resize(ctx: Context, node: Any) -> Any:
    mode = ctx.attr(node, "mode", "nearest")
    if mode not in ("nearest", "linear", "cubic"):
        raise Unsupported(f"mode {mode!r}")
    if ctx.attr(node, "antialias", 0):
        raise Unsupported("antialias=1")
    if ctx.opset < 11:
        # Resize-10 samples like Upsample: asymmetric coordinates; ORT floors when enlarging, ceils when shrinking.
        scales = ctx.const(node, 1, "scales")
        shrink = bool(np.any(np.asarray(scales) < 1))
        return _resize(ctx, node, mode, "asymmetric", "ceil" if shrink else "floor", scales, None)
    coord = ctx.attr(node, "coordinate_transformation_mode", "half_pixel")
    if coord == "tf_crop_and_resize":
        raise Unsupported("coordinate_transformation_mode 'tf_crop_and_resize'")
    return _resize(ctx, node, mode, coord, ctx.attr(node, "nearest_mode", "round_prefer_floor"),
                   ctx.opt_const(node, 2, what="scales"), ctx.opt_const(node, 3, what="sizes"),
                   ctx.attr(node, "axes"), ctx.attr(node, "keep_aspect_ratio_policy", "stretch"))


@op("Upsample")
def upsample(ctx: Context, node: Any) -> Any:
    mode = ctx.attr(node, "mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise Unsupported(f"mode {mode!r}")
    scales = ctx.attr(node, "scales") if ctx.opset < 9 else ctx.const(node, 1, "scales")
    return _resize(ctx, node, mode, "asymmetric", "floor", np.asarray(scales, dtype=np.float64), None)
