"""Variable input dims in ``--shape``: a range (``input_ids:1x1..128``) or buckets (``input_ids:1x16|32|64|128``).

A parsed shape is a ``VarShape``: a plain list of ints (every variable axis at its top, the largest size it
takes: what a static form is built at and padded to) that also carries ``axes`` = {axis: ``Range`` or
``Buckets``}. Code that knows nothing of variable dims sees the static shape at the top; code that does asks
``variable_axes(shape)``.  In a bundle the bounds are the IO spec's ``variable`` list
(``[{"axis": 3, "range": [32, 320]}]`` / ``{"axis": 1, "buckets": [16, 32, 64]}``), which the agent reads
(``edgeopt_agent.varlen``) to fit every request to the form the artifact was built in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    auto: Any = field(default=None, compare=False, hash=False)  # ``lo..hi|auto``: how the edges were chosen

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
        return {"buckets": list(self.sizes), **({"auto": self.auto} if self.auto else {})}


@dataclass(frozen=True)
class AutoBuckets(Range):
    """``lo..hi|auto`` (``lo..hi|auto@10%``): buckets chosen from the data's own lengths (``choose_buckets``) before anything is built;
    until then a range. ``cap``: the padding waste the buckets may cost over the whole mix."""

    cap: float = 0.25

    def __str__(self) -> str:
        return f"{self.lo}..{self.hi}|auto@{self.cap:.0%}"


DEFAULT_WASTE_CAP = 0.25


def parse_cap(text: str, entry: str) -> float:
    """``auto`` or ``auto@10%`` / ``auto@0.1`` -> the waste cap (0 < cap < 10)."""
    _, _, v = text.partition("@")
    v = v.strip()
    if not v:
        return DEFAULT_WASTE_CAP
    try:
        cap = float(v[:-1]) / 100 if v.endswith("%") else float(v)
    except ValueError:
        cap = -1.0
    if not 0 < cap < 10:
        raise UsageError(f"bad --shape {entry!r}: the padding-waste cap after auto@ must be a positive fraction or "
                         f"percentage, got {v!r}", hint="e.g. input_ids:1x8..128|auto@10%")
    return cap


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
        if "|" in t and t.split("|", 1)[1].lower().startswith("auto"):  # lo..hi|auto[:CAP%]: buckets from data
            rng, _, cap_s = t.partition("|")
            dim = parse_dim(rng, entry, hint)
            if not isinstance(dim, Range):
                raise UsageError(f"bad --shape {entry!r}: '|auto' follows a range (lo..hi|auto), got {rng}",
                                 hint="e.g. input_ids:1x8..128|auto")
            return AutoBuckets(dim.lo, dim.hi, parse_cap(cap_s, entry))
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
REV = "varlen-3"  # 2: random data at random lengths; 3: mobile dynamic form, INT8 at own lengths, |auto


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


def padding_waste(lengths: list[int], edges: list[int]) -> tuple[float, dict[int, dict[str, Any]]]:
    """Padding waste of ``lengths`` run in buckets ``edges``: overall and per bucket, as the agent's bench
    measures it (the sizes run over the sizes of the samples' own lengths, minus 1: 0.5 = half again as much
    work as the real lengths need), with each bucket's share of the samples."""
    per: dict[int, dict[str, Any]] = {}
    ran = own = 0
    for b in edges:
        prev = max([e for e in edges if e < b], default=0)
        mine = [n for n in lengths if prev < n <= b]
        per[b] = {"samples": len(mine), "share": round(len(mine) / len(lengths), 4) if lengths else 0.0,
                  "padding_waste": round(b * len(mine) / sum(mine) - 1, 4) if mine else None}
        ran, own = ran + b * len(mine), own + sum(mine)
    return (round(ran / own - 1, 4) if own else 0.0), per


def choose_buckets(lengths: list[int], lo: int, hi: int, cap: float = DEFAULT_WASTE_CAP,
                   most: int = 16) -> tuple[list[int], dict[str, Any]]:
    """``--shape x:..lo..hi|auto``: the fewest buckets whose edges are the lengths' quantiles (1/k, 2/k, .. of
    the mix, each edge a real length) and whose padding waste over the mix is at most ``cap``; the range's top
    ``hi`` is always the last bucket (a request as long as declared still runs). -> (edges, what was chosen)."""
    import numpy as np

    real = sorted(int(n) for n in lengths if lo <= int(n) <= hi)
    if not real:
        return [hi], {"from": "auto", "lengths": 0, "cap": cap, "note": "no sample length within the range: one bucket"}
    best: tuple[list[int], float] | None = None
    for k in range(1, most + 1):
        qs = [np.quantile(real, i / k, method="higher") for i in range(1, k + 1)]
        edges = sorted({int(q) for q in qs} | {hi})[:MAX_BUCKETS]
        waste, _ = padding_waste(real, edges)
        if best is None or waste < best[1]:
            best = (edges, waste)
        if waste <= cap:
            break
    edges, waste = best
    _, per = padding_waste(real, edges)
    return edges, {"from": "auto", "lengths": len(real), "cap": cap, "padding_waste": waste,
                   "met_cap": waste <= cap, "per_bucket": {str(b): v for b, v in per.items()}}


def has_auto(shapes: dict[str, Any]) -> bool:
    return any(isinstance(d, AutoBuckets) for s in (shapes or {}).values() for d in variable_axes(s).values())


def resolve_auto(shapes: dict[str, Any], lengths_of: Any) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Every ``|auto`` axis turned into ``Buckets`` from the data: ``lengths_of(name, axis)`` -> the lengths of
    every sample (calibration and validation) on that axis. -> (shapes, {"name[axis]": what was chosen})."""
    out, chosen = {}, {}
    for name, shape in shapes.items():
        axes = variable_axes(shape)
        if not any(isinstance(d, AutoBuckets) for d in axes.values()):
            out[name] = shape
            continue
        dims: list[int | Dim] = list(shape)
        for i, d in axes.items():
            if isinstance(d, AutoBuckets):
                edges, why = choose_buckets(lengths_of(name, i), d.lo, d.hi, d.cap)
                dims[i] = Buckets(tuple(edges), auto=why) if len(edges) > 1 else Range(d.lo, d.hi)
                chosen[f"{name}[{i}]"] = {**why, "buckets": edges}
            else:
                dims[i] = d
        out[name] = make(dims)
    return out, chosen


def lengths_from_data(calib: str | None, inputs: list[dict[str, Any]], load: Any) -> Any:
    """``lengths_of(name, axis)`` over every sample of ``--calib`` (read at their own lengths by ``load``, the
    build's own ``calib.load_data`` with the range as bounds); UsageError (exit 2) without real lengths."""
    if not calib:
        raise UsageError("--shape ...|auto picks buckets from the data's own lengths: give --calib data with "
                         "samples of their own lengths", hint="or give the buckets (x:1x16|32|64) or a range (x:1x1..128)")
    ds = load(calib, inputs)
    feeds = [*ds.calibration, *ds.validation]
    true = [getattr(f, "true", None) for f in feeds]
    if not any(true):
        raise UsageError(f"--shape ...|auto: {calib} has no samples of their own lengths (every sample is at the top "
                         "shape)", hint="give a .npz of object arrays, a folder of one-sample .npz, or padded arrays "
                         "with 'lengths' or a mask input")

    def lengths_of(name: str, axis: int) -> list[int]:
        return [int((t or {}).get(name, [0] * (axis + 1))[axis]) for t in true if t]

    return lengths_of


# Beside a build's calib.npz (padded to the top): each calibration sample's own shapes, for INT8 calibration
# over the real length mix (``own_length_calib``).
CALIB_SHAPES = "calib_shapes.json"


def save_calib_shapes(calib_npz: Any, samples: list[Any]) -> None:
    """Write ``CALIB_SHAPES`` beside ``calib_npz`` when the samples carry their own shapes (``VarFeed.true``)."""
    import json
    from pathlib import Path

    true = [getattr(f, "true", None) for f in samples]
    if samples and all(true):
        Path(calib_npz).with_name(CALIB_SHAPES).write_text(json.dumps(true))


def own_length_calib(calib_path: str | None, feeds: list[dict[str, Any]], shape_form: str | None
                     ) -> tuple[list[dict[str, Any]], str | None]:
    """INT8 calibration over the real length mix (issue 42): for the dynamic form, each calibration sample cut
    back to its own lengths (the quantizer then sees the activations the requests make, no pads); the static
    form calibrates on what it runs, the padded samples. -> (feeds, a note for the manifest or None)."""
    import json
    from pathlib import Path

    if shape_form != "dynamic" or not calib_path:
        return feeds, None
    p = Path(calib_path).with_name(CALIB_SHAPES)
    if not p.is_file():
        return feeds, None
    true = json.loads(p.read_text())
    if len(true) != len(feeds):
        return feeds, None
    out = [{n: a[tuple(slice(0, int(s)) for s in t[n])] if n in t and len(t[n]) == a.ndim else a
            for n, a in f.items()} for f, t in zip(feeds, true)]
    sizes = sorted({tuple(v) for t in true for v in t.values()})
    return out, (f"INT8 calibrated over the real length mix: {len(out)} samples at their own lengths "
                 f"({len(sizes)} distinct shapes, {'x'.join(map(str, sizes[0]))} to {'x'.join(map(str, sizes[-1]))}), "
                 "not padded")


def with_auto_buckets(items: list[str], value: str) -> list[str]:
    """``build --buckets auto[@CAP]``: every range in the ``--shape`` items becomes ``lo..hi|auto[@CAP]``; exit 2
    for another value or when no --shape has a range."""
    import re

    v = value.strip().lower()
    if not v.startswith("auto") or (v != "auto" and not v.startswith("auto@")):
        raise UsageError(f"--buckets {value!r}: expected auto or auto@CAP (e.g. auto@10%)",
                         hint="give fixed buckets in --shape instead: x:1x16|32|64")
    parse_cap(v, f"--buckets {value}")
    pat = re.compile(r"(\d+\.\.\d+)(?![\d.|])")
    out = [pat.sub(lambda mt: f"{mt.group(1)}|{v}", s) for s in items]
    if out == list(items):
        raise UsageError(f"--buckets {value}: no --shape gives a range to cut into buckets",
                         hint="e.g. --shape input_ids:1x8..128 --buckets auto")
    return out
