"""Host-side preparation of an ONNX model for TensorRT, and INT8/FP8 explicit quantization (Q/DQ).

TensorRT engines are built on the device (they are tied to the GPU and the TensorRT version), so
everything that does not need the GPU happens here, where it can be checked:

- **Preflight**: every node is checked against the operators the target's TensorRT ONNX parser
  takes -- one table per TensorRT release edgeopt has onnx-tensorrt's matrix for (``data/*_onnx_ops.txt``:
  8.5 for jetson-xavier, 10.1's matrix for jetson-orin's TensorRT 10.3, 10.15 for ``nvidia`` and callers
  without a target, 11.0 for the data-centre GPUs), picked by the TensorRT version the target profile
  names (``tensorrt``, or only its major: ``tensorrt_major``) and recorded with its version and source;
  *all* refused nodes are reported at once.
- **Preparation**: static shapes (or named dynamic dims for the inputs that have an optimization
  profile), an opset TensorRT's parser takes, constant folding and simplification (onnxsim).
- **Explicit quantization**: a Q/DQ model placed the way TensorRT fuses best -- the activation and
  weight inputs of Conv/ConvTranspose/Gemm/MatMul, the residual input of ``Add`` nodes that follow
  a Conv; symmetric INT8 (zero points 0), per-channel weights on the output-channel axis, no bias
  and no output quantization -- with activation ranges calibrated here on the user's data, so the
  device never needs calibration data (INT8 calibration caches do not move between GPUs anyway).
  FP8 (E4M3) uses the same placement with FP8 Q/DQ (ONNX opset 19).

Heavy imports (onnx, onnxruntime, onnxsim) happen inside functions.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgeopt.errors import EdgeoptError, UsageError
from edgeopt.model import constant_tensors

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
# One operator table per TensorRT release whose onnx-tensorrt matrix edgeopt has, by version.
OPS_FILES: dict[tuple[int, int], Path] = {
    (8, 5): DATA_DIR / "tensorrt8_5_onnx_ops.txt",
    (10, 1): DATA_DIR / "tensorrt10_1_onnx_ops.txt",
    (10, 15): DATA_DIR / "tensorrt_onnx_ops.txt",
    (11, 0): DATA_DIR / "tensorrt11_onnx_ops.txt",
}
# A profile that names only a major (``tensorrt_major: 10``, ``tensorrt: "11"``) reads these: what a major
# meant before profiles named versions (10.15 for 10; 11.0, the floor of the 11 line, for 11).
MAJOR_TABLES: dict[int, tuple[int, int]] = {8: (8, 5), 10: (10, 15), 11: (11, 0)}
# For a target that names no TensorRT (``nvidia``: read on the device) and for callers without a target:
# 10.15's table -- every op it takes, the 11.0 table takes too (11.0 adds Swish).
DEFAULT_TENSORRT = (10, 15)
DEFAULT_TENSORRT_MAJOR = DEFAULT_TENSORRT[0]
OPS_FILE = OPS_FILES[DEFAULT_TENSORRT]

# Ops whose inputs get Q/DQ (TensorRT runs them in INT8/FP8 when both inputs are quantized).
WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
# The ONNX opsets the Q/DQ forms need: per-channel `axis` (13), FP8 types (19).
QDQ_MIN_OPSET = {"int8": 13, "fp8": 19}
# Symmetric ranges: weights use the narrow INT8 range [-127, 127]; FP8 E4M3's largest finite is 448.
QMAX = {"int8": 127.0, "fp8": 448.0}
CALIBRATION_METHODS = ("max", "percentile", "mse", "entropy")
HIST_BINS = 2048


class PreparationError(EdgeoptError):
    """The model could not be prepared for TensorRT (opset conversion, simplification, quantization)."""

    exit_code = 3


# --------------------------------------------------------------------------------------------
# The operator table and the preflight
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OpsTable:
    """TensorRT's ONNX parser support matrix for one TensorRT version."""

    tensorrt_version: str
    opset_min: int
    opset_max: int
    source: str
    ops: dict[str, tuple[bool, str, str]] = field(hash=False)  # op -> (parsed, types, restrictions)
    file: str = ""  # the data file's name
    source_commit: str | None = None
    # The TensorRT this table stands for when that is not its own version: "10.3" read from the 10.1 matrix
    # (the newest edgeopt has at or below 10.3); None when the profile names the table's version or a major.
    for_tensorrt: str | None = None

    @property
    def parser(self) -> str:
        """Whose refusal this table stands for, for messages: "TensorRT 10.15's ONNX parser", or
        "TensorRT 10.3's ONNX parser (onnx-tensorrt's 10.1 matrix)" when read from an older matrix."""
        if self.for_tensorrt:
            return f"TensorRT {self.for_tensorrt}'s ONNX parser (onnx-tensorrt's {self.tensorrt_version} matrix)"
        return f"TensorRT {self.tensorrt_version}'s ONNX parser"

    def as_dict(self) -> dict[str, Any]:
        """What the manifest records: which table, from where, for which TensorRT."""
        return {"tensorrt_version": self.tensorrt_version, "opsets": [self.opset_min, self.opset_max],
                "source": self.source, "source_commit": self.source_commit, "file": self.file,
                "for_tensorrt": self.for_tensorrt or self.tensorrt_version}

    def supported(self) -> frozenset[str]:
        return frozenset(op for op, (ok, _, _) in self.ops.items() if ok)

    def restriction(self, op: str) -> str:
        return self.ops.get(op, (False, "", ""))[2]

    def why_not(self, op: str) -> str:
        """Why an op is refused: marked N in the table, or absent from it."""
        if op in self.ops:
            return f"not supported by {self.parser}"
        close = difflib.get_close_matches(op, list(self.ops), n=1)
        return (f"not in the ONNX operator table of {self.parser}"
                + (f" (did you mean {close[0]}?)" if close else ""))


def _version(v: Any, what: str) -> tuple[int, ...]:
    """"10.3" / 10 / "11" -> (10, 3) / (10,) / (11,); anything else is a UsageError naming ``what``."""
    if isinstance(v, float):  # YAML reads `tensorrt: 10.10` as the number 10.1
        raise UsageError(f"{what}: {v!r} is a number; write the version as a string",
                         hint=f'quote it in the config file, e.g. tensorrt: "{v}"')
    text = str(v).strip()
    if isinstance(v, bool) or not re.fullmatch(r"\d+(\.\d+)*", text):
        raise UsageError(f"{what}: expected a TensorRT version such as \"10.3\" or 11, got {v!r}")
    return tuple(int(p) for p in text.split("."))


def profile_tensorrt(profile: dict[str, Any] | None) -> str | None:
    """The TensorRT version a target profile names: ``tensorrt`` ("10.3"), else ``tensorrt_major`` (10), else
    None (read on the device).  Both, disagreeing on the major, is a UsageError."""
    profile = profile or {}
    version, major = profile.get("tensorrt"), profile.get("tensorrt_major")
    if version is not None:
        v = _version(version, "the target profile's tensorrt")
        if major is not None and _version(major, "the target profile's tensorrt_major") != v[:1]:
            raise UsageError(f"the target profile names TensorRT {version} (tensorrt) but tensorrt_major {major}",
                             hint="set one of them: tensorrt (e.g. \"10.3\") is enough")
        return ".".join(map(str, v))
    return None if major is None else ".".join(map(str, _version(major, "the target profile's tensorrt_major")))


def profile_tensorrt_major(profile: dict[str, Any] | None) -> int | None:
    """The major of the TensorRT a profile names (None: read on the device) -- for the typing decision."""
    version = profile_tensorrt(profile)
    return None if version is None else int(version.split(".")[0])


def _known() -> str:
    return ", ".join(".".join(map(str, k)) for k in sorted(OPS_FILES))


def ops_table(path: str | None = None, tensorrt_major: int | None = None, tensorrt: str | None = None) -> OpsTable:
    """The operator table for TensorRT ``tensorrt`` ("10.3") or ``tensorrt_major`` (None: the default, 10.15),
    or the file at ``path``.  A version finer than the major reads the newest table of that major at or below
    it (10.3 -> the 10.1 matrix: a parser accepts what its predecessors did); a major alone reads
    ``MAJOR_TABLES``; a version with no such table is a UsageError naming the tables there are."""
    if path is not None:
        return _parse_table(str(path))
    asked = tensorrt if tensorrt is not None else tensorrt_major
    if asked is None:
        return _parse_table(str(OPS_FILES[DEFAULT_TENSORRT]))
    v = _version(asked, "TensorRT version")
    label = ".".join(map(str, v))
    if len(v) == 1:
        key = MAJOR_TABLES.get(v[0])
    else:
        below = [k for k in OPS_FILES if k[0] == v[0] and k <= v[:2]]
        key = max(below) if below else None
    if key is None:
        raise UsageError(f"no ONNX operator table for TensorRT {label}: edgeopt has onnx-tensorrt's matrices for "
                         f"TensorRT {_known()} (a version reads the newest of its major at or below it)",
                         hint="set the target profile's tensorrt to the version its devices run (one at or above "
                              f"a table of the same major), or add targets/data/tensorrt{'_'.join(map(str, v[:2]))}"
                              "_onnx_ops.txt from onnx-tensorrt's docs/operators.md at that release (and its line in "
                              "trt_prep.OPS_FILES)")
    table = _parse_table(str(OPS_FILES[key]))
    if len(v) > 1 and _version(table.tensorrt_version, "table version")[:2] != v[:2]:
        return replace(table, for_tensorrt=label)
    return table


def table_for_target(spec: dict[str, Any] | None) -> OpsTable:
    """The table of the TensorRT a target's devices run (its profile's ``tensorrt`` or ``tensorrt_major``)."""
    return ops_table(tensorrt=profile_tensorrt((spec or {}).get("profile")))


@functools.lru_cache(maxsize=8)
def _parse_table(path: str) -> OpsTable:
    """Parse a table file (``# key: value`` header, then ``op | Y/N | types | restrictions``)."""
    text = Path(path).read_text()
    meta: dict[str, str] = {}
    ops: dict[str, tuple[bool, str, str]] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = re.match(r"#\s*(tensorrt_version|opset_min|opset_max|source|source_commit)\s*:\s*(\S+)", line)
            if m:
                meta[m.group(1)] = m.group(2)
            continue
        parts = [p.strip() for p in line.split("|")]
        if len(parts) != 4 or parts[1] not in ("Y", "N"):
            raise ValueError(f"{path}:{lineno}: expected 'op | Y/N | types | restrictions'")
        ops[parts[0]] = (parts[1] == "Y", parts[2], parts[3])
    missing = {"tensorrt_version", "opset_min", "opset_max"} - set(meta)
    if missing:
        raise ValueError(f"{path}: header lacks {sorted(missing)}")
    return OpsTable(meta["tensorrt_version"], int(meta["opset_min"]), int(meta["opset_max"]),
                    meta.get("source", ""), ops, Path(path).name, meta.get("source_commit"))


def preflight(nodes: Iterable[tuple[str, str, str]], table: OpsTable | None = None) -> list[tuple[str, str]]:
    """Every (op, node name) TensorRT's parser refuses, all at once; ``nodes`` are (domain, op, name)."""
    table = table or ops_table()
    ok = table.supported()
    bad = []
    for dom, op, name in nodes:
        if dom not in ("", "ai.onnx"):
            bad.append((f"{dom}::{op}", name))
        elif op not in ok:
            bad.append((op, name))
    return bad


def restricted_ops(op_types: Iterable[str], table: OpsTable | None = None) -> dict[str, str]:
    """The model's ops that TensorRT takes only under conditions, with those conditions."""
    table = table or ops_table()
    return {op: table.restriction(op) for op in sorted(set(op_types)) if table.restriction(op)}


def model_nodes(model) -> list[tuple[str, str, str]]:
    """(domain, op, name) of every node, subgraphs included."""
    from edgeopt.model import walk_nodes

    return [(n.domain or "", n.op_type, n.name or f"<unnamed {n.op_type} #{i}>")
            for i, n in enumerate(walk_nodes(model.graph))]


def opset_of(model) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def ensure_opset(model, minimum: int = 0, table: OpsTable | None = None):
    """The model at an opset TensorRT's parser takes (and at least ``minimum``): (model, note or None)."""
    from onnx import version_converter

    table = table or ops_table()
    have = opset_of(model)
    if have > table.opset_max:
        raise UsageError(
            f"the model uses ONNX opset {have}; {table.parser.replace(' ONNX parser', ' parser')} takes opsets "
            f"{table.opset_min}..{table.opset_max}",
            hint=f"export the model at opset {table.opset_max} or lower (or, for a device with a newer "
                 f"TensorRT, update targets/data/{table.file or OPS_FILE.name} from onnx-tensorrt's operators.md)")
    want = max(have, table.opset_min, minimum)
    if want == have:
        return model, None
    try:
        converted = version_converter.convert_version(model, want)
    except Exception as exc:  # the converter raises bare RuntimeErrors with C++ messages
        raise PreparationError(f"could not convert the model from opset {have} to {want}: "
                               f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}",
                               hint=f"export the model at opset {want} or newer") from None
    return converted, f"opset converted {have} -> {want}"


# --------------------------------------------------------------------------------------------
# Optimization profiles (dynamic dims that stay dynamic in the engine)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class InputProfile:
    """min/opt/max shapes of one input: the engine takes any shape in between."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    @property
    def dynamic_axes(self) -> list[int]:
        return [i for i, (a, b) in enumerate(zip(self.min, self.max)) if a != b]

    def as_dict(self) -> dict[str, list[int]]:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}


PROFILE_SYNTAX = "NAME:MIN/OPT/MAX or NAME:MIN/MAX with shapes like 1x3x224x224, inputs separated by ';'"


def _shape(text: str, where: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.strip().lower().split("x"))
    except ValueError:
        raise UsageError(f"{where}: {text!r} is not a shape", hint=f"trt_profile={PROFILE_SYNTAX}") from None
    if not dims or any(d <= 0 for d in dims):
        raise UsageError(f"{where}: dims must be positive integers, got {text!r}")
    return dims


def varlen_profiles(variable: dict[str, list[dict[str, Any]]], static: dict[str, list[int]],
                    lengths: dict[str, list[list[int]]] | None = None) -> tuple[dict[str, InputProfile],
                                                                                list[dict[str, Any]]]:
    """The optimization profiles of a ``--shape`` with a range or buckets (issue 42): (the union profile that
    keeps the variable dims dynamic in the prepared ONNX, the build spec's profile list). A range is one
    profile min=lo, opt=the median validation length (else the middle), max=hi; buckets are one narrow profile
    per bucket, min=opt=max=the bucket (requests are padded to their bucket: the kernels are tuned for exactly
    that shape; TensorRT's one-tactic-set-per-profile makes a wide profile slow at both ends)."""
    union: dict[str, InputProfile] = {}
    per_bucket: list[dict[str, Any]] = []
    counts = {len(v["buckets"]) for vs in variable.values() for v in vs if "buckets" in v}
    all_buckets = all("buckets" in v for vs in variable.values() for v in vs)
    for name, vs in variable.items():
        lo, opt, hi = list(static[name]), list(static[name]), list(static[name])
        for v in vs:
            ax = int(v["axis"])
            if "range" in v:
                lo[ax], hi[ax] = int(v["range"][0]), int(v["range"][1])
                seen = sorted(int(s[ax]) for s in (lengths or {}).get(name, []) if len(s) > ax)
                opt[ax] = seen[len(seen) // 2] if seen else (lo[ax] + hi[ax]) // 2
            else:
                b = sorted(int(x) for x in v["buckets"])
                lo[ax], hi[ax], opt[ax] = b[0], b[-1], b[len(b) // 2]
        union[name] = InputProfile(name, tuple(lo), tuple(opt), tuple(hi))
    if all_buckets and len(counts) == 1:
        for k in range(counts.pop()):
            prof: dict[str, Any] = {}
            for name, vs in variable.items():
                shape = list(static[name])
                for v in vs:
                    shape[int(v["axis"])] = sorted(int(x) for x in v["buckets"])[k]
                prof[name] = {"min": shape, "opt": shape, "max": shape}
            per_bucket.append(prof)
    else:
        per_bucket = [{n: p.as_dict() for n, p in union.items()}]
    return union, per_bucket


def parse_profiles(text: str | None, static: dict[str, list[int]],
                   model_dims: dict[str, list[int | str | None]]) -> dict[str, InputProfile]:
    """Parse ``trt_profile``; ``static`` are the --shape shapes (validation data and default opt),
    ``model_dims`` the inputs' dims as the model declares them (int = fixed)."""
    if text is None or str(text).strip() == "":
        return {}
    out: dict[str, InputProfile] = {}
    for item in str(text).split(";"):
        item = item.strip()
        if not item:
            continue
        name, sep, shapes = item.rpartition(":")
        where = f"trt_profile {item!r}"
        if not sep or not name:
            raise UsageError(f"{where}: expected {PROFILE_SYNTAX}")
        if name not in model_dims:
            raise UsageError(f"{where}: the model has no input {name!r}", hint=f"its inputs are {sorted(model_dims)}")
        parts = [_shape(s, where) for s in shapes.split("/")]
        if len(parts) == 2:
            lo, hi = parts
            opt = tuple(static[name])
        elif len(parts) == 3:
            lo, opt, hi = parts
        else:
            raise UsageError(f"{where}: expected {PROFILE_SYNTAX}")
        rank = len(model_dims[name])
        if any(len(p) != rank for p in (lo, opt, hi)):
            raise UsageError(f"{where}: input {name!r} has rank {rank}")
        val = static[name]
        if any(not (a <= v <= c) for a, v, c in zip(lo, val, hi)):
            raise UsageError(f"{where}: the validation shape {'x'.join(map(str, val))} (--shape) lies outside "
                             "min..max", hint="widen the profile or change --shape")
        if any(not (a <= b <= c) for a, b, c in zip(lo, opt, hi)):
            raise UsageError(f"{where}: need min <= opt <= max in every dim")
        for i, d in enumerate(model_dims[name]):
            if isinstance(d, int) and d > 0 and not (lo[i] == opt[i] == hi[i] == d):
                raise UsageError(f"{where}: dim {i} of {name!r} is fixed at {d} in the model")
        out[name] = InputProfile(name, lo, opt, hi)
    return out


# --------------------------------------------------------------------------------------------
# Preparation
# --------------------------------------------------------------------------------------------
@dataclass
class Prepared:
    """The prepared model and what was done to it (recorded in the manifest)."""

    model: Any  # onnx.ModelProto
    report: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


TWO_GB = 2**31 - 1


def set_input_dims(model, static: dict[str, list[int]], profiles: dict[str, InputProfile]) -> None:
    """Fix every input dim to its static size, except the profiled dynamic ones (named ``<input>_d<i>``)."""
    for vi in model.graph.input:
        if vi.name not in static:
            continue
        dyn = set(profiles[vi.name].dynamic_axes) if vi.name in profiles else set()
        for i, (d, v) in enumerate(zip(vi.type.tensor_type.shape.dim, static[vi.name])):
            d.Clear()
            if i in dyn:
                d.dim_param = f"{vi.name}_d{i}"
            else:
                d.dim_value = v
    del model.graph.value_info[:]
    for vi in model.graph.output:
        for d in vi.type.tensor_type.shape.dim:
            if not (d.HasField("dim_value") and d.dim_value > 0):
                d.Clear()


def prepare(model, static: dict[str, list[int]], profiles: dict[str, InputProfile], min_opset: int = 0,
            simplify: bool = True, progress: Callable[[str], None] = lambda s: None,
            table: OpsTable | None = None) -> Prepared:
    """Shapes, opset (one ``table``'s parser takes), constant folding + simplification; the result runs in
    ONNX Runtime."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    before = len(m.graph.node)
    opset_before = opset_of(m)
    set_input_dims(m, static, profiles)
    warnings: list[str] = []
    m, note = ensure_opset(m, min_opset, table)
    simplified, why = False, None
    if simplify and m.ByteSize() >= TWO_GB:
        why = "model over 2 GB (protobuf limit): onnxsim skipped, TensorRT folds constants itself"
    elif simplify:
        progress("constant folding and simplification (onnxsim)")
        try:
            import onnxsim

            test_shapes = {p.name: list(p.opt) for p in profiles.values()} or None
            sim, simplified = onnxsim.simplify(m, check_n=0, test_input_shapes=test_shapes)
            if simplified:
                m = sim
            else:
                why = "onnxsim could not verify its result; the unsimplified graph is kept"
        except Exception as exc:  # onnxsim raises plain RuntimeErrors from C++
            why = f"onnxsim failed ({str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__}); " \
                  "the unsimplified graph is kept"
    if why:
        warnings.append(why)
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:
        pass  # shapes are a convenience here; TensorRT infers its own
    for vi in m.graph.output:  # exporters write -1 for unknown dims; TensorRT wants them unset
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value <= 0:
                d.Clear()
    report = {"nodes_before": before, "nodes_after": len(m.graph.node), "opset": opset_of(m),
              "opset_source": opset_before, "simplified": bool(simplified),
              "dynamic_inputs": {n: p.dynamic_axes for n, p in profiles.items() if p.dynamic_axes}}
    if note:
        report["opset_note"] = note
    return Prepared(m, report, warnings)


def save_model(model, path: Path) -> list[str]:
    """Save ``model`` (weights in ``<name>.data`` beside it when over 2 GB); the files written."""
    import onnx

    path = Path(path)
    if model.ByteSize() >= TWO_GB:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
        return [path.name, path.name + ".data"]
    onnx.save_model(model, str(path))
    return [path.name]


# --------------------------------------------------------------------------------------------
# Explicit quantization: placement
# --------------------------------------------------------------------------------------------
@dataclass
class QdqPlan:
    """Where Q/DQ goes: activation tensors (-> their quantized consumers) and weights, each with the
    placement rule that put it there, and the candidate nodes left float with the reason."""

    activations: dict[str, list[int]] = field(default_factory=dict)  # tensor -> indices of consumer nodes
    weights: list[tuple[int, int, int | None]] = field(default_factory=list)  # (node index, input index, axis)
    residual_adds: list[str] = field(default_factory=list)  # names of Add nodes given a quantized residual
    rules: dict[str, list[str]] = field(default_factory=dict)  # activation tensor -> placement rules
    weight_rules: dict[int, str] = field(default_factory=dict)  # node index -> weight rule
    left_float: list[dict[str, str]] = field(default_factory=list)  # {"node", "op", "why"}

    def add_activation(self, tensor: str, node_index: int, rule: str = "") -> None:
        users = self.activations.setdefault(tensor, [])
        if node_index not in users:
            users.append(node_index)
        if rule and rule not in self.rules.setdefault(tensor, []):
            self.rules[tensor].append(rule)

    def quantized_nodes(self, graph) -> list[str]:
        """Names of the nodes that read a Q/DQ pair (what a search may keep float instead)."""
        idx = sorted({i for users in self.activations.values() for i in users} | {i for i, _, _ in self.weights})
        return [graph.node[i].name for i in idx if graph.node[i].name]

    def placement(self, graph) -> dict[str, Any]:
        """Every Q/DQ pair with the rule that placed it, and the nodes left float with why (manifest)."""
        def name(i: int) -> str:
            return graph.node[i].name or f"{graph.node[i].op_type}#{i}"

        pairs = [{"tensor": t, "rules": self.rules.get(t, []), "consumers": [name(i) for i in users]}
                 for t, users in self.activations.items()]
        pairs += [{"tensor": graph.node[i].input[k], "rules": [self.weight_rules.get(i, "weight")],
                   "consumers": [name(i)], "axis": axis} for i, k, axis in self.weights]
        counts: dict[str, int] = {}
        for p in pairs:
            for r in p["rules"]:
                counts[r] = counts.get(r, 0) + 1
        return {"rule_counts": counts, "pairs": pairs, "left_float": self.left_float}


# The placement rules (NVIDIA's explicit-quantization guidance for TensorRT): Q/DQ on the data and
# weight inputs of the ops TensorRT runs in INT8, weights per output channel, the skip input of a
# residual Add that follows a Conv (so Conv + Add fuse into one INT8 kernel), nothing on outputs.
INPUT_RULE = {"Conv": "conv-input", "ConvTranspose": "conv-transpose-input", "Gemm": "gemm-input",
              "MatMul": "matmul-input"}


def _attr(node, name: str, default: Any) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def weight_axis(node, weight: np.ndarray) -> int | None:
    """The output-channel axis of a weight (per-channel scales), or None for one per-tensor scale."""
    op = node.op_type
    if op == "Conv":
        return 0  # [Cout, Cin/g, k...]
    if op == "ConvTranspose":
        return 1 if _attr(node, "group", 1) == 1 else None  # [Cin, Cout/g, k...]: axis 1 is Cout only if g == 1
    if op == "Gemm":
        return 0 if _attr(node, "transB", 0) else 1
    if op == "MatMul":
        return 1 if weight.ndim == 2 else None  # [K, N]
    return None


def _not_fusable(node, consts: dict[str, np.ndarray]) -> str | None:
    """Why TensorRT cannot run this weighted node as an INT8 layer from Q/DQ inputs (None: it can)."""
    x, w = node.input[0], node.input[1]
    if node.op_type == "Gemm" and _attr(node, "transA", 0):
        return "builder cannot fuse: Gemm with transA (no INT8 layout for a transposed data input)"
    if w not in consts:
        return ("activation x activation product: kept float (attention-like; accuracy first, "
                "no constant weight to quantize per channel)")
    if x in consts:
        return "builder cannot fuse: constant data input (folded at build time)"
    if consts[w].dtype.kind != "f":
        return "builder cannot fuse: non-float weight"
    if node.op_type == "MatMul" and consts[w].ndim < 2:
        return "builder cannot fuse: MatMul with a 1-D weight (a reduction, no output channels)"
    return None


def plan_qdq(model, exclude: Iterable[str] = (), per_channel: bool = True,
             exclude_why: dict[str, str] | None = None) -> QdqPlan:
    """TensorRT-friendly Q/DQ placement (see the module docstring).

    ``exclude``: node names left float on purpose (a search's sensitivity fallback; ``exclude_why``
    says why, recorded per node); ``per_channel=False`` gives every weight one per-tensor scale.
    """
    graph = model.graph
    consts = constant_tensors(graph)
    producer = {o: i for i, n in enumerate(graph.node) for o in n.output}
    skip = set(exclude)
    why = exclude_why or {}
    plan = QdqPlan()
    for i, node in enumerate(graph.node):
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2:
            continue
        if node.name in skip:
            plan.left_float.append({"node": node.name, "op": node.op_type, "why": why.get(node.name, "excluded")})
            continue
        reason = _not_fusable(node, consts)
        if reason:
            plan.left_float.append({"node": node.name or f"{node.op_type}#{i}", "op": node.op_type, "why": reason})
            continue
        plan.add_activation(node.input[0], i, INPUT_RULE[node.op_type])
        axis = weight_axis(node, consts[node.input[1]]) if per_channel else None
        plan.weights.append((i, 1, axis))
        plan.weight_rules[i] = ("weight-per-channel" if axis is not None else
                                "weight-per-tensor" + ("" if not per_channel else f" ({node.op_type} has no "
                                                        "single output-channel axis)"))
    # Residual Adds: TensorRT fuses Conv + Add(+ReLU) into one INT8 kernel when the Add's other
    # input (the skip branch) is quantized too.
    quantized = {i for users in plan.activations.values() for i in users}
    for i, node in enumerate(graph.node):
        if node.op_type != "Add" or len(node.input) != 2 or any(t in consts for t in node.input):
            continue
        srcs = [producer.get(t) for t in node.input]
        conv_inputs = [k for k, s in enumerate(srcs) if s is not None and graph.node[s].op_type == "Conv"]
        if not conv_inputs:
            continue
        fused = max(conv_inputs, key=lambda k: srcs[k])  # the conv computed last is the one fused
        label = node.name or f"Add#{i}"
        if node.name in skip:
            plan.left_float.append({"node": label, "op": "Add", "why": why.get(node.name, "excluded")})
            continue
        if srcs[fused] not in quantized:  # the conv runs float: a quantized skip would only add noise
            plan.left_float.append({"node": label, "op": "Add",
                                    "why": f"builder cannot fuse: its Conv ({graph.node[srcs[fused]].name}) is "
                                           "float, so no INT8 Conv+Add kernel takes the skip input"})
            continue
        other = node.input[1 - fused]
        plan.add_activation(other, i, "residual-add-skip")
        plan.residual_adds.append(label)
    return plan


# --------------------------------------------------------------------------------------------
# Explicit quantization: calibration
# --------------------------------------------------------------------------------------------
def _session_with_outputs(model, tensors: list[str]):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for t in tensors:
        if t not in have:
            m.graph.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    # As the reference is computed: no graph rewrites (they also trip on some If/Loop models).
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _mse_amax(hist: np.ndarray, edges: np.ndarray, qmax: float) -> float:
    """The clipping value that minimises the expected squared error of symmetric quantization."""
    centers = (edges[:-1] + edges[1:]) / 2
    best, best_err = float(edges[-1]), np.inf
    # Candidates from 1/16 of the observed range up to all of it, ~128 of them.
    start = max(1, len(edges) // 16)
    for k in np.unique(np.linspace(start, len(edges) - 1, 128).astype(int)):
        amax = float(edges[k])
        scale = amax / qmax
        q = np.minimum(np.round(centers / scale), qmax) * scale
        err = float(np.sum(hist * (q - centers) ** 2))
        if err < best_err:
            best, best_err = amax, err
    return best


def _entropy_amax(hist: np.ndarray, edges: np.ndarray, qmax: float, stride: int = 8) -> float:
    """The clipping value whose quantized distribution loses the least information (KL divergence), the
    rule of TensorRT's entropy calibrator: for each candidate bin i, P = the histogram up to i with the
    tail folded into bin i; Q = the histogram up to i merged into qmax + 1 levels, each level's count
    spread over the bins where P is not zero; both smoothed (a small mass on empty bins) before KL(P||Q)."""
    levels = int(qmax) + 1
    best, best_kl = float(edges[-1]), np.inf
    for i in range(levels, len(hist) + 1, stride):
        sliced = hist[:i].astype(np.float64)
        p = sliced.copy()
        p[-1] += hist[i:].sum()
        nz = p != 0
        merged = i // levels
        starts = np.arange(levels) * merged
        counts = np.add.reduceat(sliced, starts)  # the last level takes the remainder bins too
        nonzero = np.add.reduceat(nz.astype(np.float64), starts)
        per_bin = np.divide(counts, nonzero, out=np.zeros(levels), where=nonzero > 0)
        q = np.repeat(per_bin, np.diff(np.append(starts, i))) * nz
        p, q = _smooth(p), _smooth(q)
        if p is None or q is None:
            continue
        p, q = p / p.sum(), q / q.sum()
        kl = float(np.sum(p * np.log(p / q)))
        if kl < best_kl:
            best, best_kl = float(edges[i]), kl
    return best


def _smooth(d: np.ndarray, eps: float = 1e-4) -> np.ndarray | None:
    """Move a little mass onto the empty bins (so KL is finite), as TensorRT's calibrator does."""
    zeros = d == 0
    n_nonzero = d.size - int(zeros.sum())
    if n_nonzero == 0:
        return None
    return d + eps * zeros - (eps * zeros.sum() / n_nonzero) * ~zeros


@dataclass
class ActivationStats:
    """Per-tensor |x| maxima and histograms over the calibration set (2048 bins on [0, absmax])."""

    absmax: dict[str, float]
    hists: dict[str, np.ndarray]


def activation_stats(model, tensors: list[str], feeds: list[dict[str, np.ndarray]],
                     histograms: bool = True) -> ActivationStats:
    """Run the FP32 model over the calibration feeds; two passes (maxima, then histograms)."""
    if not feeds:
        raise UsageError("INT8/FP8 calibration needs calibration samples", hint="pass --calib with real data")
    sess = _session_with_outputs(model, tensors)
    absmax = dict.fromkeys(tensors, 0.0)
    for feed in feeds:
        for t, v in zip(tensors, sess.run(tensors, feed)):
            if v.size:
                absmax[t] = max(absmax[t], float(np.max(np.abs(v))))
    hists = {t: np.zeros(HIST_BINS, np.float64) for t in tensors}
    if histograms:
        for feed in feeds:
            for t, v in zip(tensors, sess.run(tensors, feed)):
                if absmax[t] > 0:
                    hists[t] += np.histogram(np.abs(v), bins=HIST_BINS, range=(0.0, absmax[t]))[0]
    return ActivationStats(absmax, hists)


def calibration_method(method: str) -> tuple[str, float]:
    """Validate one clipping rule (``max``, ``mse``, ``percentile``, ``percentile-99.999``): (name, percentile)."""
    name, _, pct = str(method).partition("-")
    if name not in CALIBRATION_METHODS or (pct and name != "percentile"):
        raise UsageError(f"unknown calibration method {method!r}",
                         hint=f"one of auto, {', '.join(CALIBRATION_METHODS)}, percentile-99.999")
    try:
        percentile = float(pct) if pct else 99.99
    except ValueError:
        raise UsageError(f"bad percentile in {method!r}", hint="e.g. percentile-99.99") from None
    if not 0 < percentile <= 100:
        raise UsageError(f"bad percentile in {method!r}: must be in (0, 100]", hint="e.g. percentile-99.99")
    return name, percentile


def amax_for(stats: ActivationStats, method: str, qmax: float = 127.0) -> dict[str, float]:
    """Clipping values by ``method``: ``max``, ``mse``, ``entropy`` or ``percentile`` / ``percentile-99.999``."""
    name, percentile = calibration_method(method)
    if name == "max":
        return dict(stats.absmax)
    amax = {}
    for t, top in stats.absmax.items():
        h = stats.hists[t]
        if top <= 0 or h.sum() == 0:
            amax[t] = top
            continue
        edges = np.linspace(0.0, top, HIST_BINS + 1)
        if name == "percentile":
            cdf = np.cumsum(h) / h.sum()
            amax[t] = float(edges[min(int(np.searchsorted(cdf, percentile / 100.0)) + 1, HIST_BINS)])
        elif name == "entropy":
            amax[t] = _entropy_amax(h, edges, qmax)
        else:
            amax[t] = _mse_amax(h, edges, qmax)
    return amax


# --------------------------------------------------------------------------------------------
# Explicit quantization: rewriting the graph
# --------------------------------------------------------------------------------------------
def _unique(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}_{k}", k + 1
    taken.add(out)
    return out


def insert_qdq(model, plan: QdqPlan, amax: dict[str, float], kind: str = "int8"):
    """A copy of ``model`` with Q/DQ per ``plan`` (activations: shared pairs; weights: per-channel pairs)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if kind not in QMAX:
        raise ValueError(kind)
    qmax = QMAX[kind]
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    consts = constant_tensors(g)
    taken = {t for n in g.node for t in list(n.input) + list(n.output)} | {i.name for i in g.initializer} \
        | {i.name for i in g.input}
    zp_type = TensorProto.INT8 if kind == "int8" else TensorProto.FLOAT8E4M3FN
    new_inits: list[Any] = []
    before: dict[int, list[Any]] = {}  # node index -> Q/DQ nodes to emit right before it

    def zero_point(name: str, n: int | None) -> str:
        dims = [] if n is None else [n]
        vals = [0] * (1 if n is None else n)
        new_inits.append(helper.make_tensor(name, zp_type, dims, vals))
        return name

    # Activations: one shared Q/DQ pair per tensor, before its first quantized consumer.
    for tensor, users in plan.activations.items():
        a = max(float(amax.get(tensor, 0.0)), 1e-8)
        s = _unique(f"{tensor}_scale", taken)
        new_inits.append(numpy_helper.from_array(np.array(a / qmax, np.float32), s))
        z = zero_point(_unique(f"{tensor}_zp", taken), None)
        q, dq = _unique(f"{tensor}_q", taken), _unique(f"{tensor}_dq", taken)
        first = min(users)
        before.setdefault(first, []).extend([
            helper.make_node("QuantizeLinear", [tensor, s, z], [q], name=_unique(f"{tensor}_QuantizeLinear", taken)),
            helper.make_node("DequantizeLinear", [q, s, z], [dq], name=_unique(f"{tensor}_DequantizeLinear", taken)),
        ])
        for u in users:
            node = g.node[u]
            for k, t in enumerate(node.input):
                if t == tensor:
                    node.input[k] = dq

    # Weights: per-channel symmetric scales on the output-channel axis.
    done: dict[tuple[str, int | None], str] = {}
    for idx, inp, axis in plan.weights:
        node = g.node[idx]
        wname = node.input[inp]
        if (wname, axis) in done:
            node.input[inp] = done[(wname, axis)]
            continue
        w = consts[wname].astype(np.float32)
        if axis is None:
            wmax = np.array(float(np.max(np.abs(w))) if w.size else 0.0, np.float32)
        else:
            wmax = np.max(np.abs(w), axis=tuple(d for d in range(w.ndim) if d != axis)).astype(np.float32)
        scale = np.where(wmax > 0, wmax / qmax, 1.0).astype(np.float32)
        s = _unique(f"{wname}_wscale", taken)
        new_inits.append(numpy_helper.from_array(scale, s))
        z = zero_point(_unique(f"{wname}_wzp", taken), None if axis is None else int(w.shape[axis]))
        dq = _unique(f"{wname}_dq", taken)
        ax = {} if axis is None else {"axis": axis}
        # The FP32 weight goes through its own Q -> DQ pair (TensorRT folds Q into INT8/FP8 weights at
        # build time).  Pre-quantized int8 initializers + DQ are leaner, but the Q/DQ pair is the form
        # every TensorRT release since 8.0 takes (and NVIDIA's own exporters emit).
        src = _unique(f"{wname}_q", taken)
        before.setdefault(idx, []).extend([
            helper.make_node("QuantizeLinear", [wname, s, z], [src], name=_unique(f"{wname}_QuantizeLinear", taken), **ax),
            helper.make_node("DequantizeLinear", [src, s, z], [dq], name=_unique(f"{wname}_DequantizeLinear", taken), **ax),
        ])
        node.input[inp] = dq
        done[(wname, axis)] = dq

    ordered = []
    for i, node in enumerate(g.node):
        ordered.extend(before.get(i, []))
        ordered.append(node)
    del g.node[:]
    g.node.extend(ordered)
    g.initializer.extend(new_inits)
    # Constant-node weights that moved to the Q/DQ path may be left unused: drop unused initializers.
    used = {t for n in g.node for t in n.input} | {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    return m


@dataclass
class Quantized:
    model: Any
    report: dict[str, Any]


# Clipping rules tried by ``calibration="auto"``; FP8's wide exponent range rarely gains from clipping.
AUTO_METHODS = {"int8": ("max", "percentile-99.999", "percentile-99.99", "mse"), "fp8": ("max", "percentile-99.999")}


def _outputs(model, feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Outputs stacked over the feeds, run as the host check runs them (no graph rewrites: Q/DQ as written)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    runs = [sess.run(names, f) for f in feeds]
    return {n: np.stack([r[i] for r in runs]) for i, n in enumerate(names)}


def _score(out: dict[str, np.ndarray], ref: dict[str, np.ndarray], kind: str) -> tuple[int, float]:
    """(outputs failing the precision's bounds, worst rel_l2): lower is better."""
    from edgeopt_agent.compare import compare_outputs

    res = compare_outputs(out, ref, kind)
    failed = sum(not o["passed"] for o in res["outputs"].values())
    worst = max((o["metrics"].get("rel_l2", 0.0) for o in res["outputs"].values()), default=0.0)
    return failed, round(float(worst), 6)


def quantize(model, feeds: list[dict[str, np.ndarray]], kind: str = "int8", method: str = "auto",
             progress: Callable[[str], None] = lambda s: None) -> Quantized:
    """Place, calibrate and insert Q/DQ; ``model`` must already be at ``QDQ_MIN_OPSET[kind]``.

    ``method="auto"`` derives every candidate clipping rule from one set of statistics and keeps the
    one whose Q/DQ model is closest to FP32 on the *calibration* samples (the validation samples stay
    unseen until the check).
    """
    import onnx

    if kind not in QMAX:
        raise UsageError(f"explicit quantization is int8 or fp8, not {kind!r}")
    if opset_of(model) < QDQ_MIN_OPSET[kind]:
        raise ValueError(f"{kind} Q/DQ needs opset >= {QDQ_MIN_OPSET[kind]}; prepare() the model with min_opset")
    plan = plan_qdq(model)
    if not plan.weights:
        raise PreparationError(
            f"no Conv/ConvTranspose/Gemm/MatMul with constant weights found: {kind} would quantize nothing",
            hint="build this model in fp16 instead")
    tensors = list(plan.activations)
    candidates = AUTO_METHODS[kind] if method == "auto" else (method,)
    for c in candidates:  # a bad name fails now, not after the calibration pass
        calibration_method(c)
    progress(f"calibrating {len(tensors)} activation ranges on {len(feeds)} samples")
    stats = activation_stats(model, tensors, feeds, histograms=any(c != "max" for c in candidates))
    tried: dict[str, dict[str, float]] = {}
    best = None
    ref = _outputs(model, feeds) if len(candidates) > 1 else None
    for cand in candidates:
        amax = amax_for(stats, cand, QMAX[kind])
        q = insert_qdq(model, plan, amax, kind)
        score = (0, 0.0)
        if ref is not None:
            # Judged on the calibration samples by the same bounds the check applies: first the
            # outputs that fail them, then the worst relative error.
            score = _score(_outputs(q, feeds), ref, kind)
            tried[cand] = {"outputs_failing": score[0], "rel_l2": score[1]}
            progress(f"calibration {cand}: rel_l2 {score[1]:.4f}, {score[0]} output(s) off bounds "
                     "on the calibration samples")
        if best is None or score < best[0]:
            best = (score, cand, q, amax)
    assert best is not None
    _, chosen, q, amax = best
    try:
        onnx.checker.check_model(q)
    except Exception as exc:
        raise PreparationError(f"the {kind} Q/DQ model fails the ONNX checker: {str(exc).splitlines()[0]}") from None
    per_channel = sum(1 for _, _, ax in plan.weights if ax is not None)
    report = {"kind": kind, "calibration": chosen, "calibration_requested": method,
              "calibration_candidates": tried, "calibration_samples": len(feeds),
              "quantized_activations": len(tensors), "quantized_weights": len(plan.weights),
              "per_channel_weights": per_channel, "residual_adds": len(plan.residual_adds),
              "scheme": "symmetric, zero point 0; weights per output channel; activations per tensor; "
                        "bias and layer outputs not quantized",
              "activation_amax": {t: round(float(v), 6) for t, v in amax.items()}}
    return Quantized(q, report)


FP16_MAX = 65504.0


def fp16_overflow(model, feeds: list[dict[str, np.ndarray]], samples: int = 4) -> list[tuple[str, float]]:
    """Float tensors whose magnitude exceeds FP16's range on the given inputs, largest first.

    TensorRT's FP16 mode keeps tensors in FP16 between layers; a value past 65504 becomes Inf there,
    so these are the layers to keep in FP32.  Only the top graph's node outputs are watched.
    """
    consts = set(constant_tensors(model.graph))
    tensors = [o for n in model.graph.node if n.op_type != "Constant" for o in n.output if o and o not in consts]
    if not tensors or not feeds:
        return []
    import onnx

    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(model.graph.value_info) + list(model.graph.output)}
    tensors = [t for t in tensors if types.get(t, onnx.TensorProto.FLOAT) == onnx.TensorProto.FLOAT]
    sess = _session_with_outputs(model, tensors)
    peak = dict.fromkeys(tensors, 0.0)
    for feed in feeds[:samples]:
        for t, v in zip(tensors, sess.run(tensors, feed)):
            if v.size and v.dtype.kind == "f":
                peak[t] = max(peak[t], float(np.max(np.abs(v))))
    return sorted(((t, v) for t, v in peak.items() if v > FP16_MAX), key=lambda x: -x[1])


def to_fp16(model, keep_fp32_tensors: list[str]) -> tuple[Any, dict[str, Any]]:
    """The model in FP16 for a strongly typed TensorRT network (TensorRT >= 11 has no FP16 builder flag:
    the types must be in the ONNX). onnxconverter-common's converter, inputs and outputs kept FP32 (casts
    at the boundary), the nodes producing or reading ``keep_fp32_tensors`` (FP16 would overflow there) kept
    FP32: a reader converted to FP16 would get the tensor through a Cast to FP16, i.e. Inf, on the GPU
    (ONNX Runtime's CPU check does not see it: it drops a float->half->float Cast pair around its float
    kernels)."""
    try:
        from onnxconverter_common import float16
    except ImportError:
        from edgeopt.errors import MissingDependency

        raise MissingDependency("an FP16 ONNX for TensorRT >= 11 needs onnxconverter-common",
                                hint="pip install 'edgeopt[tensorrt]'") from None
    keep = set(keep_fp32_tensors)
    touches = [n for n in model.graph.node if keep & (set(n.output) | set(n.input))]
    block = [n.name for n in touches if n.name]
    unnamed = [n for n in touches if not n.name]
    for i, n in enumerate(unnamed):  # the converter blocks by node name: name the ones it must skip
        n.name = f"edgeopt_fp32_{i}"
        block.append(n.name)
    _name_nodes(model)  # after the blocked ones are named: the converter names its Casts after nodes
    _split_shared_initializers(model, set(block))
    out = float16.convert_float_to_float16(model, keep_io_types=True, node_block_list=block or None)
    retyped = _fix_float_casts(out, set(block))
    rewired = _fix_output_readers(out, set(block))
    casts = sum(1 for n in out.graph.node if n.op_type == "Cast") - sum(1 for n in model.graph.node
                                                                          if n.op_type == "Cast")
    report = {"converter": "onnxconverter-common float16.convert_float_to_float16 (keep_io_types)",
              "kept_fp32_nodes": block, "casts_added": casts, "casts_retyped": retyped,
              "output_readers_rewired": rewired,
              "summary": f"{len(block)} node(s) kept FP32 (FP16 overflow), {casts} cast(s) added"}
    return out, report


def _fix_output_readers(model, blocked: set[str]) -> list[str]:
    """A graph output that another node also reads (``logits`` an output and fed to the ``Softmax`` whose
    ``probs`` is an output too): onnxconverter-common casts it back to FLOAT for the output (keep_io_types)
    but leaves the FP16 reader reading the FLOAT copy, with its own output typed FLOAT16, which ONNX
    Runtime refuses ("Type (tensor(float16)) of output arg (..._cast_to_probs) ... does not match expected
    type (tensor(float))"). Such a reader (converted, not kept FP32) reads the FP16 tensor before the
    boundary Cast instead; the graph output keeps its declared FLOAT. Returns the nodes rewired."""
    import onnx

    f16 = {vi.name for vi in list(model.graph.value_info) + list(model.graph.output)
           if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16}
    outputs = {o.name for o in model.graph.output}
    source = {}  # graph output (FLOAT) -> the FP16 tensor its boundary Cast reads
    boundary = set()
    for i, node in enumerate(model.graph.node):
        if (node.op_type == "Cast" and node.output and node.output[0] in outputs and node.input[0] in f16
                and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in node.attribute)):
            source[node.output[0]] = node.input[0]
            boundary.add(i)
    rewired = []
    for i, node in enumerate(model.graph.node):
        if i in boundary or node.name in blocked or not any(t in f16 for t in node.output):
            continue  # a node kept FP32 (by us or by the converter's op block list) reads FLOAT as it should
        if any(t in source for t in node.input):
            node.input[:] = [source.get(t, t) for t in node.input]
            rewired.append(node.name or node.op_type)
    return rewired


def _split_shared_initializers(model, blocked: set[str]) -> int:
    """A float initializer read by a node kept FP32 and by one converted to FP16 stays FP32 in
    onnxconverter-common's output, with no Cast for the FP16 reader (openwakeword's melspectrogram:
    two Clips share their max, the first kept FP32 for overflow; ONNX Runtime refused the second,
    "Type parameter (T) of Optype (Clip) bound to different types"). The FP32 readers get their own
    copy first; returns how many initializers were copied."""
    import onnx

    inits = {t.name: t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    readers: dict[str, set[bool]] = {}
    for node in model.graph.node:
        for name in node.input:
            if name in inits:
                readers.setdefault(name, set()).add(node.name in blocked)
    copied = 0
    for name in [n for n, kinds in readers.items() if kinds == {True, False}]:
        copy = onnx.TensorProto()
        copy.CopyFrom(inits[name])
        copy.name = f"{name}_fp32"
        model.graph.initializer.append(copy)
        for node in model.graph.node:
            if node.name in blocked:
                node.input[:] = [copy.name if i == name else i for i in node.input]
        copied += 1
    return copied


def _name_nodes(model) -> int:
    """onnxconverter-common names the Casts it adds (and their output tensors) after the nodes they
    serve: ``images_cast_to_`` + the consumer's name, ``_input_cast`` etc.  Unnamed nodes (what
    ``prepare`` leaves after simplifying) gave two Casts of one name and one output ("two nodes with
    same node name (images_cast_to_)", ddddocr's detector, an input feeding 4 Slices), and ONNX Runtime
    refused the model.  Every unnamed node gets a unique name first; returns how many."""
    used = {n.name for n in model.graph.node if n.name}
    named = 0
    for i, node in enumerate(model.graph.node):
        if not node.name:
            name = f"edgeopt_{node.op_type}_{i}"
            while name in used:
                name += "_"
            node.name = name
            used.add(name)
            named += 1
    return named


def _fix_float_casts(model, blocked: set[str]) -> int:
    """onnxconverter-common retypes a ``Cast(to=FLOAT)`` node's output as float16 but leaves ``to`` at
    FLOAT, which ONNX Runtime then refuses ("Type (tensor(float16)) of output arg ... does not match",
    seen on magika's jax2tf one-hot). Point such casts at FLOAT16; returns how many were changed."""
    import onnx

    f16 = {vi.name for vi in list(model.graph.value_info) + list(model.graph.output)
           if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16}
    changed = 0
    for node in model.graph.node:
        if node.op_type != "Cast" or node.name in blocked or node.output[0] not in f16:
            continue
        for a in node.attribute:
            if a.name == "to" and a.i == onnx.TensorProto.FLOAT:
                a.i = onnx.TensorProto.FLOAT16
                changed += 1
    return changed
