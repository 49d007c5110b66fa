"""ONNX graph -> Core ML MIL program: the translation loop, constant folding and the op table.

coremltools dropped its ONNX frontend, so this is ours.  The shape of it:

- ``OPS`` maps an ONNX op type (default domain) to one small translator
  ``fn(ctx, node) -> Var | ndarray | tuple``.  The translators live in ``ops_nn``,
  ``ops_tensor``, ``ops_resize`` and ``ops_rnn``; each registers itself
  with ``@op(...)``.  ``ops_fuse`` fuses decomposed LayerNorms during the walk.
- Constant folding: a node whose inputs are all known constants is evaluated with numpy (ONNX's
  own reference implementation, ``onnx.reference``) instead of being translated.  ``Shape`` and
  ``Size`` of a tensor whose MIL shape is static are constants too, so the shape-computing
  subgraphs exporters write (Shape -> Gather -> Concat -> Reshape) vanish before Core ML sees them.
- Every node that cannot be translated is recorded with its reason and the walk goes on (its
  outputs replaced by zeros of the inferred shape), so one run reports *all* problems at once.

Nothing here imports coremltools at module level: the builder (``mb``) and the MIL types come in
through the ``Context``; ``supported_op_types()`` is cheap enough for ``edgeopt inspect``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeopt.errors import UnsupportedOps

Translator = Callable[["Context", Any], Any]
OPS: dict[str, Translator] = {}

# Modules holding translators; imported by supported_op_types()/convert() to fill OPS.
_OP_MODULES = ("edgeopt.targets.coreml.ops_nn", "edgeopt.targets.coreml.ops_tensor",
               "edgeopt.targets.coreml.ops_resize", "edgeopt.targets.coreml.ops_rnn")
# Never folded: their value is not a function of their inputs.
_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                     "Multinomial", "Bernoulli"}
INT32_MIN, INT32_MAX = np.iinfo(np.int32).min, np.iinfo(np.int32).max


def op(*names: str) -> Callable[[Translator], Translator]:
    """Register a translator for one or more ONNX op types."""
    def register(fn: Translator) -> Translator:
        for n in names:
            OPS[n] = fn
        return fn
    return register


def supported_op_types() -> frozenset[str]:
    """Every ONNX op type (default domain) the table translates."""
    for m in _OP_MODULES:
        importlib.import_module(m)
    return frozenset(OPS)


class Unsupported(Exception):
    """Raised by a translator: this node (with these attributes/inputs) cannot become Core ML."""


@dataclass(frozen=True)
class Problem:
    """One node the converter could not take, and why."""

    op: str
    node: str
    reason: str


class ConversionProblems(UnsupportedOps):
    """All the nodes the Core ML converter could not take, each with its reason."""

    def __init__(self, target: str, problems: list[Problem], stopped_at: str | None = None) -> None:
        super().__init__(target, [(p.op, p.node) for p in problems])
        lines = [f"  {p.op} (node {p.node!r}): {p.reason}" for p in problems]
        if stopped_at:
            lines.append(f"  (nodes after {stopped_at!r} were not checked: its output shape is unknown)")
        self.message = (f"target {target!r}: Core ML conversion cannot take {len(problems)} node(s) of this "
                        "model:\n" + "\n".join(lines))
        self.args = (self.message,)
        self.problems = problems


# --- names ------------------------------------------------------------------------------------
_NAME_RE = re.compile(r"[^A-Za-z0-9_]")
# Names coremltools' own sanitizer would rename (it appends "_workaround"): MIL keywords and types.
_RESERVED = {"any", "bool", "program", "func", "tensor", "list", "dict", "tuple", "true", "false", "string",
             "bf16", "fp16", "fp32", "fp64", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
             "uint64", "state"}


def sanitize(name: str, taken: set[str]) -> str:
    """A MIL-safe name for an ONNX tensor name, unique in ``taken``.

    Letters, digits and ``_`` only, starting with a letter, no MIL keyword: names coremltools keeps
    as they are, so the package's IO names are the ones recorded in the manifest.
    """
    s = _NAME_RE.sub("_", name) or "t"
    if not s[0].isalpha():
        s = "v_" + s
    if s in _RESERVED:
        s += "_"
    base, i = s, 1
    while s in taken:
        s = f"{base}_{i}"
        i += 1
    taken.add(s)
    return s


# --- dtypes -----------------------------------------------------------------------------------
# ONNX TensorProto element type -> numpy dtype name (folding keeps ONNX's dtypes exactly).
ONNX_NP = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
           10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}
# ONNX element type -> the MIL dtype a tensor of it becomes.  Core ML computes in fp16/fp32/int32/bool;
# 64-bit and small integer tensors are carried as int32 (what coremltools' own frontends do).
ONNX_MIL = {1: "fp32", 10: "fp16", 11: "fp32", 6: "int32", 7: "int32", 9: "bool"}


def mil_array(a: np.ndarray) -> np.ndarray:
    """A constant as MIL takes it: float64 -> float32, 64-bit/small ints -> int32 (clipped), bool kept.

    Always a writable copy of its own: coremltools' passes change const values in place (its conv-bias
    fusion negates a Sub's constant: ``ValueError: output array is read-only`` on an initializer viewed
    from the ONNX protobuf's bytes), and a constant read by two ops must not change under the other."""
    a = np.asarray(a)
    if a.dtype == np.float64:
        return a.astype(np.float32)
    if a.dtype.kind in "iu" and a.dtype != np.int32:
        # INT64_MAX/MIN appear as "to the end" sentinels; clipping keeps their meaning.
        return np.clip(a, INT32_MIN, INT32_MAX).astype(np.int32)
    return np.array(a, copy=True)


# --- the translation context ------------------------------------------------------------------
class Context:
    """What a translator sees: the builder, the folded constants, the MIL vars, the ONNX opset."""

    def __init__(self, mb: Any, types: Any, opset: int, target: Any, value_info: dict[str, tuple]) -> None:
        self.mb = mb
        self.types = types
        self.opset = opset
        self.target = target  # a coremltools.target member (an IntEnum: iOS15 < iOS16 < ...)
        self.value_info = value_info  # name -> (static shape or None, numpy dtype name or None)
        self.consts: dict[str, np.ndarray] = {}
        self.vars: dict[str, Any] = {}
        self.taken: set[str] = set()
        self._names: dict[str, str] = {}
        self.block: Any = None  # the MIL function being built (its ``operations`` grow as ops are made)
        self.origins: dict[str, tuple[str, ...]] = {}  # MIL var -> the ONNX tensors its node reads and writes

    # names
    def nm(self, node: Any, i: int = 0) -> str:
        """The MIL name for output ``i`` of ``node`` (sanitized, unique)."""
        key = node.output[i] if i < len(node.output) and node.output[i] else f"{node.name or node.op_type}:out{i}"
        if key not in self._names:
            self._names[key] = sanitize(key, self.taken)
        return self._names[key]

    # inputs
    def has(self, node: Any, i: int) -> bool:
        """Whether optional input ``i`` is given."""
        return i < len(node.input) and node.input[i] != ""

    def is_const(self, name: str) -> bool:
        return name in self.consts

    def const(self, node: Any, i: int, what: str = "") -> np.ndarray:
        """The value of input ``i``, which must be a constant after folding."""
        if not self.has(node, i):
            raise Unsupported(f"input {i}{f' ({what})' if what else ''} is missing")
        name = node.input[i]
        if name not in self.consts:
            raise Unsupported(f"input {i}{f' ({what})' if what else ''} {name!r} must be a constant "
                              "(it is computed from data at run time)")
        return self.consts[name]

    def opt_const(self, node: Any, i: int, default: Any = None, what: str = "") -> Any:
        """Input ``i`` as a constant, or ``default`` when it is absent."""
        return self.const(node, i, what) if self.has(node, i) else default

    def x(self, node: Any, i: int = 0) -> Any:
        """Input ``i`` as a MIL var (a constant becomes a ``const`` op once)."""
        if not self.has(node, i):
            raise Unsupported(f"input {i} is missing")
        return self.var(node.input[i])

    def var(self, name: str) -> Any:
        if name in self.vars:
            return self.vars[name]
        if name in self.consts:
            v = self.mb.const(val=mil_array(self.consts[name]), name=sanitize(name, self.taken))
            self.vars[name] = v
            return v
        raise Unsupported(f"tensor {name!r} is not produced by any node before it")

    def shape(self, node: Any, i: int = 0) -> tuple[int, ...]:
        """The static shape of input ``i``."""
        shape = self.shape_of(node.input[i])
        if shape is None:
            raise Unsupported(f"input {node.input[i]!r} has a dynamic shape; give static shapes with --shape")
        return shape

    def shape_of(self, name: str) -> tuple[int, ...] | None:
        """The static shape of a tensor, None when it is dynamic."""
        if name in self.consts:
            return tuple(self.consts[name].shape)
        shape = self.var(name).shape
        if any(not isinstance(d, (int, np.integer)) for d in shape):
            return None
        return tuple(int(d) for d in shape)

    def at_least(self, target: str) -> bool:
        """Whether the deployment target is ``target`` (e.g. "iOS16") or later."""
        return self.target >= type(self.target)[target]

    def rank(self, node: Any, i: int = 0) -> int:
        return len(self.shape(node, i))

    def is_float(self, node: Any, i: int = 0) -> bool:
        name = node.input[i]
        if name in self.consts:
            return self.consts[name].dtype.kind == "f"
        return self.types.is_float(self.var(name).dtype)

    def attr(self, node: Any, name: str, default: Any = None) -> Any:
        """An attribute's value (strings decoded), or ``default``."""
        from onnx import helper

        for a in node.attribute:
            if a.name == name:
                v = helper.get_attribute_value(a)
                if isinstance(v, bytes):
                    return v.decode()
                if isinstance(v, list) and v and isinstance(v[0], bytes):
                    return [s.decode() for s in v]
                return v
        return default


# --- constant folding -------------------------------------------------------------------------
def foldable(node: Any, consts: dict[str, np.ndarray]) -> bool:
    """All inputs known, deterministic, no subgraph: numpy can compute it at conversion time."""
    if node.domain not in ("", "ai.onnx") or node.op_type in _NONDETERMINISTIC:
        return False
    if any(a.type in (5, 10) for a in node.attribute):  # GRAPH / GRAPHS: If, Loop, Scan
        return False
    return all(n == "" or n in consts for n in node.input)


def fold(node: Any, consts: dict[str, np.ndarray], opset: int) -> list[np.ndarray]:
    """Evaluate one node on constant inputs with ONNX's numpy reference implementation."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    feeds = {n: consts[n] for n in node.input if n}
    # A one-node model, not the bare node: given a NodeProto, the evaluator ignores ``opsets`` and takes
    # the newest schema (seen: opset-12 Unsqueeze with an ``axes`` attribute failed as Unsqueeze-13).
    graph = helper.make_graph([node], "fold", [helper.make_tensor_value_info(n, 0, None) for n in feeds],
                              [helper.make_tensor_value_info(o, 0, None) for o in node.output if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    outs = ReferenceEvaluator(model).run(None, feeds)
    return [np.asarray(o) for o in outs]


# --- the walk ---------------------------------------------------------------------------------
def _value_info(model: Any) -> dict[str, tuple]:
    out: dict[str, tuple] = {}
    g = model.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
        shape = tuple(dims) if t.HasField("shape") and all(d is not None for d in dims) else None
        out[vi.name] = (shape, ONNX_NP.get(t.elem_type))
    return out


@dataclass
class Converted:
    """The MIL program and how its IO names map to the ONNX ones."""

    program: Any
    inputs: list[dict[str, Any]]  # {"name", "artifact_name", "artifact_dtype"} in ONNX input order
    outputs: list[dict[str, Any]]
    folded: int  # nodes evaluated at conversion time
    translated: int
    fused: int  # decomposed LayerNorms fused into one op
    values: dict[str, Any] | None = None  # ONNX output name -> value, when convert(evaluate=...) was used
    origins: dict[str, tuple[str, ...]] = field(default_factory=dict)  # MIL var -> its ONNX node's tensors
    tensor_vars: dict[str, str] = field(default_factory=dict)  # ONNX tensor -> the MIL var holding it

    def fp32_selector(self, tensors: set[str]) -> tuple[Any, int]:
        """An ``op_selector`` for ``ct.transform.FP16ComputePrecision`` that keeps in FP32 every op made
        for an ONNX node reading or writing one of ``tensors`` (FP16 would overflow there), and any op
        the converter's passes put on such a tensor; and how many ONNX nodes that is.  By var names:
        the passes before the FP16 one fuse and rename ops, and keep their output vars' names."""
        kept = {var for var, names in self.origins.items() if tensors.intersection(names)}
        big = {self.tensor_vars[t] for t in tensors if t in self.tensor_vars}
        nodes = len({self.origins[v] for v in kept})

        def fp16(op: Any) -> bool:
            outs = {v.name for v in op.outputs}
            ins = {getattr(x, "name", None) for v in op.inputs.values()
                   for x in (v if isinstance(v, (list, tuple)) else [v])}
            return not (outs & kept or (ins | outs) & big)

        return fp16, nodes


def convert(model: Any, ct: Any, target: Any, target_name: str = "apple",
            evaluate: dict[str, np.ndarray] | None = None) -> Converted:
    """Translate a static-shape ONNX model into a MIL ``Program`` for ``target`` (a ``ct.target``).

    ``evaluate``: input values to bind as MIL constants instead of placeholders.  MIL infers the
    value of every op it has a numpy implementation for (its ``value_inference``), so the outputs'
    values come back in ``Converted.values`` (None where some op on the way has none) -- a numeric
    check of the translation that runs without Core ML.
    """
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function, Program, types
    from onnx import numpy_helper

    from .ops_fuse import find_layer_norms

    supported_op_types()
    g = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    ctx = Context(mb, types, opset, target, _value_info(model))
    for init in g.initializer:
        ctx.consts[init.name] = np.array(numpy_helper.to_array(init), copy=True)  # writable (see mil_array)
    # Graph outputs keep their (sanitized) ONNX names; reserve them before any op takes one.
    out_names = [sanitize(o.name, ctx.taken) for o in g.output]
    in_specs = _input_specs(ctx, g, target_name, scalars_ok=evaluate is not None)
    placeholders = {} if evaluate is not None else {
        s["artifact_name"]: mb.placeholder(shape=s["shape"], dtype=types.string_to_builtin(s["mil_dtype"]))
        for s in in_specs}

    with Function(placeholders, opset_version=target) as fn:
        ctx.block = fn
        for s in in_specs:
            if evaluate is None:
                v = fn.inputs[s["artifact_name"]]
            else:
                val = evaluate[s["name"]]
                v = mb.const(val=mil_array(val.astype(np.int32) if s.get("bool") else val), name=s["artifact_name"])
            # Core ML has no bool model inputs: the package takes int32 0/1 and casts at the boundary.
            ctx.vars[s["name"]] = mb.cast(x=v, dtype="bool", name=s["artifact_name"] + "_bool") if s.get("bool") else v
        nodes, constants = _constants_first(ctx, g.node)
        nodes = find_layer_norms(nodes, ctx.consts, keep={o.name for o in g.output})
        folded, translated, fused = _walk(ctx, nodes, target_name)
        folded += constants
        # An identity gives every output its ONNX name, whatever op produced it.
        outs = [mb.identity(x=ctx.var(o.name), name=s) for o, s in zip(g.output, out_names)]
        fn.set_outputs(outs)
    prog = Program()
    prog.add_function("main", fn)
    io_in = [{k: s[k] for k in ("name", "artifact_name", "artifact_dtype")} for s in in_specs]
    io_out = [{"name": o.name, "artifact_name": s, "artifact_dtype": _np_name(types, types.builtin_to_string(v.dtype))}
              for o, s, v in zip(g.output, out_names, outs)]
    values = {o.name: v.val for o, v in zip(g.output, outs)} if evaluate is not None else None
    tensor_vars = {t: v.name for t, v in ctx.vars.items() if getattr(v, "name", None)}
    return Converted(prog, io_in, io_out, folded, translated, fused, values, ctx.origins, tensor_vars)


def _input_specs(ctx: Context, g: Any, target_name: str, scalars_ok: bool) -> list[dict[str, Any]]:
    """The model inputs as the package will take them; every input Core ML cannot take is reported."""
    specs, bad = [], []
    for vi in g.input:
        if vi.name in ctx.consts:  # old exporters list initializers as inputs too
            continue
        t = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim]
        mil_dt = ONNX_MIL.get(t.elem_type)
        if any(d <= 0 for d in shape):
            bad.append(Problem("input", vi.name, "dynamic shape; give static shapes with --shape"))
        elif not shape and not scalars_ok:
            bad.append(Problem("input", vi.name, "a rank-0 (scalar) model input; Core ML inputs have rank >= 1"))
        elif mil_dt == "bool":  # taken as int32 0/1 and cast to bool inside (the runner casts the feed)
            specs.append({"name": vi.name, "artifact_name": sanitize(vi.name, ctx.taken), "shape": shape,
                          "mil_dtype": "int32", "artifact_dtype": "int32", "bool": True})
        elif mil_dt is None:
            bad.append(Problem("input", vi.name, f"Core ML takes no {ONNX_NP.get(t.elem_type, t.elem_type)} "
                                                 "model inputs (float32/float16/int32/int64 only)"))
        else:
            specs.append({"name": vi.name, "artifact_name": sanitize(vi.name, ctx.taken), "shape": shape,
                          "mil_dtype": mil_dt, "artifact_dtype": _np_name(ctx.types, mil_dt)})
    if bad:
        raise ConversionProblems(target_name, bad)
    return specs


def _constants_first(ctx: Context, nodes: Any) -> tuple[list[Any], int]:
    """Evaluate the Constant nodes up front, so that pattern matching sees their values."""
    rest, n = [], 0
    for node in nodes:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            try:
                ctx.consts[node.output[0]] = fold(node, ctx.consts, ctx.opset)[0]
                n += 1
                continue
            except Exception:  # e.g. a sparse value: the walk reports it with the node's name
                pass
        rest.append(node)
    return rest, n


def _walk(ctx: Context, nodes: list[Any], target_name: str) -> tuple[int, int, int]:
    """Fold or translate every node in order; raise ConversionProblems listing every failure.

    Returns (folded, translated, fused) counts.
    """
    from .ops_fuse import FusedLayerNorm

    problems: list[Problem] = []
    stopped_at = None
    folded = translated = fused = 0
    todo, i = list(nodes), 0
    while i < len(todo):
        node, i = todo[i], i + 1
        if isinstance(node, FusedLayerNorm):
            v = node.translate(ctx)
            if v is None:  # shapes rule the fusion out: translate the original nodes instead
                todo[i:i] = node.members
            else:
                ctx.vars[node.out] = v
                fused += 1
            continue
        label = node.name or f"<unnamed {node.op_type} #{i - 1}>"
        try:
            if foldable(node, ctx.consts):
                try:
                    for name, v in zip(node.output, fold(node, ctx.consts, ctx.opset)):
                        if name:
                            ctx.consts[name] = v
                    folded += 1
                    continue
                except Exception:  # not in ONNX's reference set: translate it instead
                    pass
            if node.domain not in ("", "ai.onnx") or node.op_type not in OPS:
                raise Unsupported("no Core ML translation for this op")
            before = len(ctx.block.operations)
            _bind(ctx, node, OPS[node.op_type](ctx, node))
            ctx.origins.update((v.name, (*node.input, *node.output))
                               for op in list(ctx.block.operations)[before:] for v in op.outputs)
            translated += 1
        except Exception as exc:  # record it and keep walking: the report lists every problem
            reason = str(exc) if isinstance(exc, Unsupported) else f"Core ML rejected it: {type(exc).__name__}: {exc}"
            op_type = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}::{node.op_type}"
            problems.append(Problem(op_type, label, reason.splitlines()[0] if reason else "failed"))
            if not _stand_in(ctx, node):
                stopped_at = label
                break
    if problems:
        raise ConversionProblems(target_name, problems, stopped_at)
    return folded, translated, fused


def _np_name(types: Any, mil_dtype: str) -> str:
    """MIL dtype string -> numpy dtype name ("fp32" -> "float32")."""
    return np.dtype(types.nptype_from_builtin(types.string_to_builtin(mil_dtype))).name


def _bind(ctx: Context, node: Any, result: Any) -> None:
    """Record a translator's result(s) under the node's output names."""
    results = list(result) if isinstance(result, (list, tuple)) else [result]
    wanted = [i for i, n in enumerate(node.output) if n]
    if len(results) < len(wanted) and max(wanted, default=0) >= len(results):
        raise Unsupported(f"output {max(wanted)} of this op is not supported (only the first {len(results)})")
    for i in wanted:
        r = results[i]
        if isinstance(r, (np.ndarray, np.generic)):
            ctx.consts[node.output[i]] = np.asarray(r)
        else:
            ctx.vars[node.output[i]] = r


def _stand_in(ctx: Context, node: Any) -> bool:
    """After a failed node: zeros of its inferred output shapes, so the walk can go on."""
    for name in node.output:
        if not name:
            continue
        shape, dtype = ctx.value_info.get(name, (None, None))
        if shape is None or dtype is None:
            return False
        ctx.consts[name] = np.zeros(shape, dtype)
    return True


# --- helpers shared by the translator modules ----------------------------------------------------
def norm_axis(axis: int, rank: int) -> int:
    """A possibly negative axis as 0..rank-1 (Unsupported when out of range)."""
    a = int(axis)
    if not -rank <= a < max(rank, 1):
        raise Unsupported(f"axis {a} is out of range for rank {rank}")
    return a % rank if rank else 0


def spatial_pads(pads: list[int] | None, n: int) -> list[int]:
    """ONNX pads ``[b1..bn, e1..en]`` -> MIL's ``[b1, e1, b2, e2, ...]``."""
    pads = list(pads or [0] * (2 * n))
    if len(pads) != 2 * n:
        raise Unsupported(f"pads has {len(pads)} values, expected {2 * n}")
    return [int(v) for pair in zip(pads[:n], pads[n:]) for v in pair]
