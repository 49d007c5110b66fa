"""Variable input dims in ``--shape``: a range (``input_ids:1x1..128``) or buckets (``input_ids:1x16|32|64|128``).

A parsed shape is a ``VarShape``: a plain list of ints (every variable axis at its top, the largest size it
takes: what a static form is built at and padded to) that also carries ``axes`` = {axis: ``Range`` or
``Buckets``}. Code that knows nothing of variable dims sees the static shape at the top; code that does asks
``variable_axes(shape)``.  In a bundle the bounds are the IO spec's ``variable`` list
(``[{"axis": 3, "range": [32, 320]}]`` / ``{"axis": 1, "buckets": [16, 32, 64]}``), which the agent reads
(``edgeopt_agent.varlen``) to fit every request to the form the artifact was built in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from edgeopt.errors import UsageError

MAX_BUCKETS = 128  # Core ML's EnumeratedShapes takes up to 128 shapes


@dataclass(frozen=True)
class Range:
    """Every size from ``lo`` to ``hi`` (inclusive)."""

    lo: int
    hi: int

    @property
    def top(self) -> int:
        return self.hi

    def __str__(self) -> str:
        return f"{self.lo}..{self.hi}"

    def as_json(self) -> dict[str, Any]:
        return {"range": [self.lo, self.hi]}


@dataclass(frozen=True)
class Buckets:
    """Only these sizes; a request is padded up to the smallest bucket that holds it."""

    sizes: tuple[int, ...]

    @property
    def top(self) -> int:
        return self.sizes[-1]

    @property
    def lo(self) -> int:
        return 1

    @property
    def hi(self) -> int:
        return self.sizes[-1]

    def __str__(self) -> str:
        return "|".join(map(str, self.sizes))

    def as_json(self) -> dict[str, Any]:
        return {"buckets": list(self.sizes)}


Dim = Union[Range, Buckets]


class VarShape(list):
    """A static shape (each variable axis at its top) that also knows its variable axes."""

    def __init__(self, dims: list[int], axes: dict[int, Dim]):
        super().__init__(int(d) for d in dims)
        self.axes = dict(axes)

    def __repr__(self) -> str:
        return "x".join(str(self.axes.get(i, d)) for i, d in enumerate(self))

    def __str__(self) -> str:
        return repr(self)


def parse_dim(text: str, entry: str, hint: str) -> int | Dim:
    """One dim of ``--shape``: ``128``, ``1..128`` or ``16|32|64``."""
    t = text.strip()
    try:
        if ".." in t:
            lo_s, _, hi_s = t.partition("..")
            lo, hi = int(lo_s), int(hi_s)
            if lo <= 0 or hi <= 0:
                raise UsageError(f"bad --shape {entry!r}: a range's bounds must be positive, got {t}")
            if lo > hi:
                raise UsageError(f"bad --shape {entry!r}: range {t} has min {lo} > max {hi}",
                                 hint=f"write it low..high, e.g. {hi}..{lo}")
            return Range(lo, hi) if lo < hi else lo
        if "|" in t:
            sizes = [int(s) for s in t.split("|")]
            if any(s <= 0 for s in sizes):
                raise UsageError(f"bad --shape {entry!r}: buckets must be positive, got {t}")
            uniq = tuple(sorted(set(sizes)))
            if len(uniq) > MAX_BUCKETS:
                raise UsageError(f"bad --shape {entry!r}: {len(uniq)} buckets, at most {MAX_BUCKETS} "
                                 "(Core ML's EnumeratedShapes limit)")
            return Buckets(uniq) if len(uniq) > 1 else uniq[0]
        return int(t)
    except ValueError:
        raise UsageError(f"bad --shape {entry!r}: dims must be integers, ranges (1..128) or buckets "
                         "(16|32|64)", hint=hint) from None


def make(dims: list[int | Dim]) -> list[int]:
    """A list of parsed dims -> a plain list (all static) or a ``VarShape``."""
    axes = {i: d for i, d in enumerate(dims) if isinstance(d, (Range, Buckets))}
    flat = [d.top if isinstance(d, (Range, Buckets)) else int(d) for d in dims]
    return VarShape(flat, axes) if axes else flat


def from_value(name: str, value: Any) -> list[int]:
    """An API value: ``[1, 3, 48, "32..320"]``, ``[1, (16, 32, 64)]``, ``[1, range(1, 129)]``, a VarShape, or a
    ``--shape`` dims string ``"1x1..128"``."""
    if isinstance(value, VarShape):
        return value
    hint = "e.g. [1, 3, 48, '32..320'] or [1, (16, 32, 64)]"
    if isinstance(value, str):
        return make([parse_dim(d, f"{name}:{value}", hint) for d in value.replace(",", "x").split("x")])
    dims: list[int | Dim] = []
    for d in value:
        if isinstance(d, str):
            dims.append(parse_dim(d, f"{name}:{value}", hint))
        elif isinstance(d, range):
            if len(d) == 0:
                raise UsageError(f"shape {name}: empty range {d}")
            dims.append(Range(d.start, d.stop - 1) if d.step == 1 else Buckets(tuple(d)))
        elif isinstance(d, (tuple, list, set, frozenset)):
            dims.append(parse_dim("|".join(str(int(s)) for s in d), f"{name}:{value}", hint))
        elif isinstance(d, (Range, Buckets)):
            dims.append(d)
        else:
            dims.append(int(d))
    if any(isinstance(d, int) and d <= 0 for d in dims):
        raise UsageError(f"bad shape {name}: dims must be positive, got {list(value)}")
    return make(dims)


def variable_axes(shape: Any) -> dict[int, Dim]:
    """{axis: Range/Buckets} of a parsed shape; {} for a static one."""
    return dict(getattr(shape, "axes", {}) or {})


def is_variable(shapes: dict[str, Any] | None) -> bool:
    return any(variable_axes(s) for s in (shapes or {}).values())


def spec_json(shape: Any) -> list[dict[str, Any]]:
    """The IO spec's ``variable`` list for one input."""
    return [{"axis": i, **d.as_json()} for i, d in sorted(variable_axes(shape).items())]


def describe(shapes: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """{input: spec_json} of the variable inputs (the cache key, the manifest, messages)."""
    return {n: spec_json(s) for n, s in shapes.items() if variable_axes(s)}


def text(shapes: dict[str, Any]) -> str:
    return ", ".join(f"{n}:{s!r}" if isinstance(s, VarShape) else f"{n}:{'x'.join(map(str, s))}"
                     for n, s in shapes.items())


def check_model_axes(name: str, model_dims: list[Any], shape: Any) -> None:
    """A range or buckets only where the model's own dim is dynamic: on a fixed dim they cannot be
    built (exit 2)."""
    for i, d in sorted(variable_axes(shape).items()):
        if i < len(model_dims) and isinstance(model_dims[i], int):
            what = "buckets" if isinstance(d, Buckets) else "a range"
            raise UsageError(f"--shape {name}: {what} ({d}) on dim {i}, which is fixed at {model_dims[i]} in the "
                             "model: a static dim takes no variable size",
                             hint=f"give {model_dims[i]} there; only dynamic dims (edgeopt inspect lists them) "
                             "take a range or buckets")


def bucket_top(dim: Dim, size: int) -> int | None:
    """The size a request of ``size`` runs at on this axis: its own in a range, the smallest bucket that
    holds it; None outside the bounds."""
    if isinstance(dim, Range):
        return size if dim.lo <= size <= dim.hi else None
    return next((b for b in dim.sizes if b >= size), None)


def suggest_buckets(lengths: list[int], count: int = 4) -> list[int]:
    """Bucket edges from the lengths' quantiles (p50/p75/p90/max for 4): each bucket's top is a real length,
    which caps the padding of the samples under it."""
    import numpy as np

    if not lengths:
        return []
    qs = np.linspace(0, 1, count + 1)[1:]
    qs = [0.5, 0.75, 0.9, 1.0] if count == 4 else list(qs)
    return sorted({int(np.ceil(np.quantile(lengths, q))) for q in qs})


# In the cache key of a bundle built with a variable axis (its forms, checks and data layout).
REV = "varlen-2"  # 2: random data at random lengths


def free_model(model: Any, variable: dict[str, list[dict[str, Any]]]) -> Any:
    """A copy of a static-shape model (``prepared.onnx``) whose variable input axes are free again
    (``dim_param`` ``<input>_<axis>``), intermediate and output shapes re-inferred: ONNX Runtime's native
    dynamic form, and what OpenVINO converts before bounding the dims."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        for v in variable.get(vi.name, []):
            d = vi.type.tensor_type.shape.dim[int(v["axis"])]
            d.Clear()
            d.dim_param = f"{vi.name}_{v['axis']}".replace(".", "_").replace(":", "_")
    del m.graph.value_info[:]
    for vi in m.graph.output:
        for d in vi.type.tensor_type.shape.dim:
            d.Clear()
    try:
        m = onnx.shape_inference.infer_shapes(m)
    except Exception:  # noqa: BLE001 - shapes unknown inside are fine for the runtimes
        pass
    return m


def pad_sensitive(model: Any, input_names: list[str]) -> list[str]:
    """Why padding may change this model's answers at the real positions (``--shape`` with a range/buckets
    warns; the per-length check decides): dynamic quantization (one scale over every position, pads
    included), and a mean/normalisation over the whole input with no mask input to leave the pads out."""
    ops = {n.op_type for n in model.graph.node}
    out = []
    if "DynamicQuantizeLinear" in ops or "MatMulIntegerToFloat" in ops or "DynamicQuantizeMatMul" in ops:
        out.append("dynamic quantization (DynamicQuantizeLinear): one scale over every position, pads included, "
                   "so padding moves the real positions' values")
    if not any("mask" in n.lower() for n in input_names):
        means = sorted(ops & {"ReduceMean", "GlobalAveragePool", "Softmax", "InstanceNormalization"})
        if means:
            out.append(f"{', '.join(means)} with no mask input: pads enter sums and means over the variable axis "
                       "unless the graph cuts them off")
    return out
