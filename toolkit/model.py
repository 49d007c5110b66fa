"""Loading, validating and inspecting an ONNX model (``ModelInfo``).

Every bad model is a ``ModelError`` with one clear line: missing file, not ONNX, truncated,
failing the ONNX checker, external data missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgeopt.errors import ModelError, UsageError

DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
          10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16"}


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass
class TensorInfo:
    name: str
    shape: list[int | str | None]  # int, a named dynamic dim, or None for an unnamed one
    dtype: str

    @property
    def dynamic_dims(self) -> list[str]:
        return [f"{self.name}[{i}]" + (f"={d}" if isinstance(d, str) else "")
                for i, d in enumerate(self.shape) if not isinstance(d, int)]


@dataclass
class ModelInfo:
    path: str
    sha256: str
    size_bytes: int
    ir_version: int
    opsets: dict[str, int]
    producer: str
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    op_histogram: dict[str, int]
    nodes: list[tuple[str, str, str]]  # (domain, op_type, node name) incl. subgraphs
    parameters: int
    parameter_bytes: int
    flops: int | None
    external_data: list[str]
    metadata: dict[str, str] = field(default_factory=dict)
    quantized: dict[str, int] = field(default_factory=dict)  # already-quantized ops (quantized_ops)
    functions: list[str] = field(default_factory=list)  # model-local functions, "domain::name"
    # every dynamic input axis: {"input", "axis", "dim", "suggest", "why"} (``dynamic_axes``)
    dynamic_axes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def opset(self) -> int:
        return self.opsets.get("", self.opsets.get("ai.onnx", 0))

    @property
    def name(self) -> str:
        return Path(self.path).stem

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("nodes")
        d["metadata"] = {k: (v if len(v) < 200 else v[:200] + f"... ({len(v)} chars)") for k, v in self.metadata.items()}
        return d


def _value_info(vi) -> TensorInfo:
    t = vi.type.tensor_type
    dims: list[int | str | None] = []
    for d in t.shape.dim:
        if d.HasField("dim_value") and d.dim_value > 0:
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return TensorInfo(vi.name, dims, DTYPES.get(t.elem_type, f"type{t.elem_type}"))


def load(path: str | os.PathLike, load_external: bool = True):
    """Load and check an ONNX model, or raise a ModelError saying what is wrong with it."""
    import onnx

    p = Path(path)
    if not p.exists():
        raise ModelError(f"model file not found: {p}")
    if p.is_dir():
        raise ModelError(f"{p} is a directory, not an ONNX model file")
    if p.stat().st_size == 0:
        raise ModelError(f"{p} is empty")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise ModelError(f"{p} is not a readable ONNX model ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else 'parse error'}); "
                         "is the file truncated or of another format?") from None
    if not model.graph.node and not model.graph.output:
        raise ModelError(f"{p} parsed as protobuf but holds no ONNX graph; is it an ONNX file?")
    external = _external_files(model)
    missing = [t for t in external if not (p.parent / t).is_file()]
    if missing:
        raise ModelError(f"{p}: external data file(s) missing next to the model: {', '.join(missing)}")
    try:
        # by path when weights live outside the file: the checker then reads them (and models > 2 GB)
        onnx.checker.check_model(str(p) if external else model)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{p} fails the ONNX checker: {first}") from None
    rejected = inference_error(model)
    if rejected:
        raise ModelError(f"{p}: ONNX's shape inference rejects a node, and ONNX Runtime runs it when it loads a model "
                         f"(no FP32 reference can be computed): {rejected}")
    if load_external and external:
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(model, str(p.parent))
    return model


# ONNX Runtime merges a declared shape that disagrees with the inferred one leniently (a warning), so those are
# not refusals; any other error of a node's own inference fails its load
_LENIENT = ("existing shape differ",)


def inference_error(model) -> str | None:
    """The first error ONNX's strict shape inference raises on a node of ``model`` that ONNX Runtime would raise
    too when loading it (onnx 1.23's DFT-19 test sets ``onesided`` and ``inverse`` together, which the onnx and
    ONNX Runtime here refuse), or None. Run on a copy whose initializers over 256 values are declared inputs: their
    shapes are what inference reads (vgg19's 548 MB: milliseconds, not 4 s)."""
    import math
    import re

    import onnx

    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g = model.graph
    light.graph.node.extend(g.node)
    light.graph.input.extend(g.input)
    light.graph.output.extend(g.output)
    light.graph.value_info.extend(g.value_info)
    listed = {i.name for i in g.input}
    for t in g.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL and math.prod(t.dims) <= 256:  # dims: no data read
            light.graph.initializer.append(t)
        elif t.name not in listed:
            light.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    try:
        onnx.shape_inference.infer_shapes(light, strict_mode=True)
    except Exception as exc:  # noqa: BLE001 - onnx raises InferenceError and ValidationError alike
        ops = {n.op_type for n in g.node}  # an error inside an op's function expansion (onnx 1.19 on MVN's
        real = []  # Constant) is not one ONNX Runtime raises: it runs its own kernel
        for line in str(exc).splitlines():
            op = re.findall(r"\(op_type:([\w.]+)", line)  # nested: the innermost node raised it
            if op and op[-1] in ops and not any(k in line for k in _LENIENT):
                real.append(line.strip())
        if real:
            return real[0].split("Inference error(s): ")[-1][:300]
    return None


def _external_files(model) -> list[str]:
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    files = []
    for t in _get_all_tensors(model):
        if uses_external_data(t):
            for kv in t.external_data:
                if kv.key == "location" and kv.value not in files:
                    files.append(kv.value)
    return files


# Ops that mean the model is already quantized (ONNX Runtime's dynamic/static quantizer output, QDQ).
QUANTIZED_OPS = frozenset({
    "ConvInteger", "MatMulInteger", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul", "QuantizeLinear",
    "DequantizeLinear", "com.microsoft::DynamicQuantizeLSTM", "com.microsoft::DynamicQuantizeMatMul",
    "com.microsoft::MatMulIntegerToFloat", "com.microsoft::QAttention", "com.microsoft::QGemm",
    "com.microsoft::QLinearAdd", "com.microsoft::QLinearMul", "com.microsoft::QLinearConcat",
    "com.microsoft::QLinearSigmoid", "com.microsoft::QLinearLeakyRelu", "com.microsoft::QLinearGlobalAveragePool",
    "com.microsoft::QuantizeLinear", "com.microsoft::DequantizeLinear", "com.microsoft::QOrderedMatMul"})


def quantized_ops(nodes) -> dict[str, int]:
    """{op: count} of the quantized ops among ``(domain, op_type, name)`` nodes (empty: a float model).

    One detector for ``inspect`` (shown), ``build`` (a second INT8 pass refused; artifacts judged at
    the INT8 bound the model's own quantization implies) and the INT8 searches."""
    counts: Counter[str] = Counter()
    for domain, op, _name in nodes:
        label = f"{domain}::{op}" if domain and domain != "ai.onnx" else op
        if label in QUANTIZED_OPS:
            counts[label] += 1
    return dict(counts.most_common())


def walk_nodes(graph):
    """Every node of a graph and of its subgraphs (If/Loop/Scan bodies), depth first."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.g and attr.g.node:
                yield from walk_nodes(attr.g)
            for g in attr.graphs:
                yield from walk_nodes(g)


FLOP_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN",
            "MatMulInteger", "QLinearMatMul", "ConvInteger", "QLinearConv")  # integer ops count as their float
CONV_WEIGHT = {"Conv": 1, "ConvInteger": 1, "QLinearConv": 3}  # which input is the weight
RNN_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _prod(dims: list[int]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def _flops(model) -> int | None:
    """Rough multiply-accumulate x2 for Conv/ConvTranspose/MatMul/Gemm and LSTM/GRU/RNN, from shapes.

    Shapes come from ONNX shape inference, with data propagation (a Reshape to a computed shape, as
    TensorFlow exports of NHWC models have before their Convs) when plain inference leaves a counted
    node's shapes unknown, and else -- inputs static -- from one ONNX Runtime run on zeros that exposes
    those tensors.  A Conv counts from its weight and output shapes, whatever layout the graph keeps
    around it; a recurrent layer counts 2 x directions x steps x batch x gates x hidden x (input + hidden).
    """
    import onnx

    try:
        # A dynamic batch dimension (the usual [N, ...] export) is counted as 1: FLOPs per sample.
        batch_fixed = onnx.ModelProto()
        batch_fixed.CopyFrom(model)
        for vi in batch_fixed.graph.input:
            dims = vi.type.tensor_type.shape.dim
            if len(dims) >= 2 and not (dims[0].HasField("dim_value") and dims[0].dim_value > 0):
                dims[0].Clear()
                dims[0].dim_value = 1
        inferred = onnx.shape_inference.infer_shapes(batch_fixed)
    except Exception:
        return None
    shapes = _known_shapes(inferred)
    nodes = [n for n in inferred.graph.node if n.op_type in FLOP_OPS]
    if any(not _node_shapes_known(n, shapes) for n in nodes):
        try:
            shapes.update(_known_shapes(onnx.shape_inference.infer_shapes(batch_fixed, data_prop=True)))
        except Exception:  # noqa: BLE001 - data propagation is a bonus
            pass
        missing = sorted({t for n in nodes if not _node_shapes_known(n, shapes) for t in _shape_tensors(n)
                          if not _full(shapes.get(t))})
        if missing:
            types = {vi.name: vi.type.tensor_type.elem_type for vi in inferred.graph.value_info
                     if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type}
            shapes.update(_run_shapes(batch_fixed, missing, types))
    total = 0
    known = False
    for node in nodes:
        flops = _node_flops(node, shapes)
        if flops is not None:
            total += flops
            known = True
    return total if known and total >= 0 else None


def _full(dims: list[int] | None) -> bool:
    return bool(dims) and 0 not in dims


def _known_shapes(inferred) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        if not vi.type.tensor_type.HasField("shape"):
            continue
        dims = [max(d.dim_value, 0) if d.HasField("dim_value") else 0 for d in vi.type.tensor_type.shape.dim]
        if len(dims) >= 2 and dims[0] == 0 and 0 not in dims[1:]:
            dims[0] = 1  # a batch dimension lost behind a computed Reshape/Expand: per sample
        if _full(dims) or vi.name not in shapes:
            shapes[vi.name] = dims
    for init in inferred.graph.initializer:
        shapes[init.name] = [max(int(d), 0) for d in init.dims]
    return shapes


def _shape_tensors(node) -> list[str]:
    """The tensors whose shapes a node's count needs."""
    if node.op_type in RNN_GATES:
        return [node.input[0], node.input[1]]
    if node.op_type == "ConvTranspose":
        return [node.input[0], node.input[1]]
    if node.op_type in CONV_WEIGHT:
        return [node.input[CONV_WEIGHT[node.op_type]], node.output[0]]
    return [node.input[0], node.output[0]]


def _node_shapes_known(node, shapes: dict[str, list[int]]) -> bool:
    return all(_full(shapes.get(t)) for t in _shape_tensors(node))


def _run_shapes(model, tensors: list[str], types: dict[str, int]) -> dict[str, list[int]]:
    """Shapes of ``tensors`` from one ONNX Runtime run on zeros (static inputs only; {} when it cannot)."""
    try:
        import numpy as np
        import onnxruntime as ort
        from onnx import TensorProto, helper

        feeds = {}
        for vi in model.graph.input:
            tt = vi.type.tensor_type
            dims = [d.dim_value if d.HasField("dim_value") else 0 for d in tt.shape.dim]
            if 0 in dims:
                return {}
            dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
            feeds[vi.name] = np.zeros(dims, dtype)
        m = type(model)()
        m.CopyFrom(model)
        have = {o.name for o in m.graph.output}
        inits = {i.name for i in m.graph.initializer}
        wanted = [t for t in tensors if t not in inits]
        del m.graph.value_info[:]
        for t in wanted:
            if t not in have:
                m.graph.output.append(helper.make_tensor_value_info(t, types.get(t, TensorProto.FLOAT), None))
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 4
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return {t: list(v.shape) for t, v in zip(wanted, sess.run(wanted, feeds))}
    except Exception:  # noqa: BLE001 - a model ORT cannot run on zeros: the counted nodes stay unknown
        return {}


def _node_flops(node, shapes: dict[str, list[int]]) -> int | None:
    """One node's FLOPs, None when its shapes are unknown."""
    if not _node_shapes_known(node, shapes):
        return None
    if node.op_type in RNN_GATES:
        x, w = shapes[node.input[0]], shapes[node.input[1]]  # X [T, B, I] (layout 0) or [B, T, I]; W [D, G*H, I]
        if len(x) != 3 or len(w) != 3:
            return None
        layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
        steps, batch = (x[1], x[0]) if layout else (x[0], x[1])
        gates = RNN_GATES[node.op_type]
        hidden = w[1] // gates
        return 2 * w[0] * steps * batch * gates * hidden * (w[2] + hidden)
    if node.op_type in ("ConvTranspose", *CONV_WEIGHT):
        w = shapes[node.input[CONV_WEIGHT.get(node.op_type, 1)]]
        kernel = _prod(w[2:])
        if node.op_type == "ConvTranspose":
            return 2 * _prod(shapes[node.input[0]]) * (w[1] * kernel)
        return 2 * _prod(shapes[node.output[0]]) * w[1] * kernel  # w: [Cout, Cin/group, k...]
    a = shapes[node.input[0]]
    k = a[0] if node.op_type == "Gemm" and any(x.name == "transA" and x.i for x in node.attribute) else a[-1]
    return 2 * _prod(shapes[node.output[0]]) * k


# Op domains ONNX Runtime (the FP32 reference every target is held to) implements.
ORT_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft", "com.microsoft.nchwc",
                         "ai.onnx.preview.training", "com.ms.internal.nhwc"})


def foreign_nodes(info: ModelInfo) -> list[tuple[str, str]]:
    """(domain::op, node name) of nodes in a domain no runtime here knows (a custom op library), not
    defined by a model-local function: no target can take them, since the FP32 reference cannot run."""
    local = set(info.functions)
    return [(f"{dom}::{op}", name) for dom, op, name in info.nodes
            if dom not in ORT_DOMAINS and f"{dom}::{op}" not in local]


def flops_for(path: str | os.PathLike, shapes: dict[str, list[int]]) -> int | None:
    """FLOPs with the inputs fixed at ``shapes`` (what ``inspect --shape`` shows for a dynamic model)."""
    model = load(path)
    for vi in model.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            for d, v in zip(dims, shapes[vi.name]):
                d.Clear()
                d.dim_value = int(v)
    return _flops(model)


def inspect(path: str | os.PathLike) -> ModelInfo:
    """Everything ``edgeopt inspect`` shows, as data."""
    import numpy as np
    from onnx import numpy_helper

    model = load(path)
    graph = model.graph
    init_names = {i.name for i in graph.initializer}
    nodes = [(n.domain or "", n.op_type, n.name or f"<unnamed {n.op_type} #{i}>")
             for i, n in enumerate(walk_nodes(graph))]
    functions = [f"{f.domain}::{f.name}" for f in model.functions]
    params = 0
    pbytes = 0
    for init in graph.initializer:
        arr_elems = 1
        for d in init.dims:
            arr_elems *= d
        params += arr_elems
        try:
            pbytes += numpy_helper.to_array(init).nbytes
        except Exception:
            pass
    # Many exporters (paddle2onnx, tf2onnx) keep weights in Constant nodes, not initializers.
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value" and attr.t.dims and int(np.prod(attr.t.dims)) > 1:
                    params += int(np.prod(attr.t.dims))
                    pbytes += int(np.prod(attr.t.dims)) * (2 if attr.t.data_type in (10, 16) else 4)
    return ModelInfo(
        path=str(path),
        sha256=sha256_file(path),
        size_bytes=Path(path).stat().st_size,
        ir_version=model.ir_version,
        opsets={(o.domain or ""): o.version for o in model.opset_import},
        producer=f"{model.producer_name} {model.producer_version}".strip(),
        inputs=[_value_info(v) for v in graph.input if v.name not in init_names],
        outputs=[_value_info(v) for v in graph.output],
        op_histogram=dict(Counter(op if not d else f"{d}::{op}" for d, op, _ in nodes).most_common()),
        nodes=nodes,
        parameters=params,
        parameter_bytes=pbytes,
        flops=_flops(model),
        external_data=_external_files(model),
        metadata={p.key: p.value for p in model.metadata_props},
        quantized=quantized_ops(nodes),
        functions=functions,
        dynamic_axes=dynamic_axes(model, [_value_info(v) for v in graph.input if v.name not in init_names]),
    )


def dynamic_axes(model: Any, inputs: list[TensorInfo]) -> list[dict[str, Any]]:
    """Every dynamic axis of every input, with an upper bound where the model tells one: the row count of a
    position-embedding table (a Gather from a ``[P, H]`` table that is not the largest one -- the vocabulary --
    or a ``[1, P, H]`` initializer added to the activations) for a sequence axis of an integer input, or a
    Reshape's constant that fixes that axis (same rank, a positive size at that index). ``suggest`` is None
    where the model says nothing (a CNN's width, audio samples): bound it by the data."""
    from onnx import numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    consts: dict[str, Any] = {}
    for n in graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    consts[n.output[0]] = a.t
    tables: list[int] = []  # Gather data tables [P, H]
    added: list[int] = []  # [1, P, H] initializers added to activations
    reshapes: list[list[int]] = []
    for n in graph.node:
        if n.op_type == "Gather" and n.input and n.input[0] in inits and len(inits[n.input[0]].dims) == 2:
            tables.append(int(inits[n.input[0]].dims[0]))
        elif n.op_type == "Add":
            for x in n.input:
                t = inits.get(x)
                if t is not None and len(t.dims) == 3 and t.dims[0] == 1 and t.dims[1] > 1:
                    added.append(int(t.dims[1]))
        elif n.op_type == "Reshape" and len(n.input) > 1:
            t = inits.get(n.input[1]) or consts.get(n.input[1])
            if t is not None:
                try:
                    reshapes.append([int(v) for v in numpy_helper.to_array(t).reshape(-1)])
                except Exception:  # noqa: BLE001 - an odd constant tells nothing
                    pass
    positions = sorted(set(tables))[:-1] if len(set(tables)) > 1 else []
    positions = [p for p in positions if 16 <= p <= 65536]
    out: list[dict[str, Any]] = []
    for t in inputs:
        for i, d in enumerate(t.shape):
            if isinstance(d, int):
                continue
            row: dict[str, Any] = {"input": t.name, "axis": i, "dim": d, "suggest": None, "why": ""}
            seq_axis = i == len(t.shape) - 1 and i > 0
            if seq_axis and t.dtype.startswith("int") and positions:
                row.update(suggest=max(positions), why=f"position-embedding table of {max(positions)} rows")
            elif seq_axis and added:
                row.update(suggest=max(added), why=f"a [1, {max(added)}, H] initializer added to the activations "
                           "(learned positions)")
            else:
                fixed = [r[i] for r in reshapes if len(r) == len(t.shape) and i > 0 and r[i] > 1]
                if fixed:
                    row.update(suggest=max(fixed), why=f"a Reshape's constant gives axis {i} as {max(fixed)}")
            out.append(row)
    return out


_PASS_THROUGH = {"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand", "Transpose"}


def constant_tensors(graph, names: set[str] | None = None) -> dict[str, Any]:
    """Initializers and Constant-node outputs of the top graph, as arrays; only ``names`` when given
    (converting every weight costs what the graph weighs)."""
    from onnx import numpy_helper

    out = {t.name: numpy_helper.to_array(t) for t in graph.initializer if names is None or t.name in names}
    for node in graph.node:
        if node.op_type == "Constant" and node.output and (names is None or node.output[0] in names):
            for a in node.attribute:
                if a.name == "value":
                    out[node.output[0]] = numpy_helper.to_array(a.t)
    return out


def integer_input_ranges(path_or_model, names: list[str]) -> dict[str, tuple[int, int] | None]:
    """The valid value range ``[lo, hi)`` of each named integer input where the model tells it, else None.

    Followed through shape-only ops (Cast, Reshape, Unsqueeze ...): indices of a ``Gather`` into a
    constant table are ``[0, rows)``; indices of ``OneHot`` are ``[0, depth)``; an input every use of
    which is bounded gets the tightest bound. A name with ``mask`` in it that is otherwise unbounded
    is taken as 0/1. Anything else (lengths, shapes, positions used in arithmetic) is unknown: random
    values there are not safe, and build asks for real data instead."""
    import numpy as np
    from onnx import numpy_helper

    model = load(path_or_model) if isinstance(path_or_model, (str, os.PathLike)) else path_or_model
    g = model.graph
    consts: dict[str, Any] = {i.name: list(i.dims) for i in g.initializer}
    values: dict[str, Any] = {}
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    consts[n.output[0]] = list(a.t.dims)
                    try:
                        values[n.output[0]] = numpy_helper.to_array(a.t)
                    except Exception:  # noqa: BLE001 - an odd constant: shape known, value not
                        pass
    for i in g.initializer:
        if len(i.dims) <= 1:
            try:
                values[i.name] = numpy_helper.to_array(i)
            except Exception:  # noqa: BLE001
                pass
    users: dict[str, list[tuple[Any, int]]] = {}
    for n in g.node:
        for k, t in enumerate(n.input):
            users.setdefault(t, []).append((n, k))

    def bound(tensor: str, depth: int = 0) -> int | None:
        uses = users.get(tensor, [])
        if not uses or depth > 8:
            return None
        highs = []
        for node, k in uses:
            op = node.op_type
            if op in _PASS_THROUGH and k == 0:
                highs.append(bound(node.output[0], depth + 1))
            elif op == "Gather" and k == 1 and node.input[0] in consts:
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                dims = consts[node.input[0]]
                highs.append(int(dims[axis]) if dims and -len(dims) <= axis < len(dims) else None)
            elif op == "OneHot" and k == 0 and node.input[1] in values:
                highs.append(int(values[node.input[1]].reshape(-1)[0]))
            elif op == "Equal" and len(node.input) == 2:  # a one-hot written as Equal against 0..N-1
                highs.append(range_high(node.input[1 - k]))
            else:
                highs.append(None)
        return None if any(h is None for h in highs) else min(highs)

    producers = {o: n for n in g.node for o in n.output}
    inits = {i.name: i for i in g.initializer}

    def range_high(tensor: str, depth: int = 0) -> int | None:
        """N when ``tensor`` holds 0, 1, ..., N-1 (a constant, or ``Range(0, N, 1)``, through reshapes)."""
        if depth > 8:
            return None
        if tensor not in values and tensor in inits and int(np.prod(inits[tensor].dims or [1])) <= 1 << 16:
            try:  # a range constant of any rank ([1, 1, 256] to broadcast against)
                values[tensor] = numpy_helper.to_array(inits[tensor])
            except Exception:  # noqa: BLE001
                pass
        if tensor in values:
            v = values[tensor]
            try:
                flat = np.asarray(v).reshape(-1)
            except Exception:  # noqa: BLE001
                return None
            if flat.size >= 2 and flat.dtype.kind in "iu" and np.array_equal(flat, np.arange(flat.size)):
                return int(flat.size)
            return None
        node = producers.get(tensor)
        if node is None:
            return None
        if node.op_type in _PASS_THROUGH and node.input:
            return range_high(node.input[0], depth + 1)
        if node.op_type == "Range" and len(node.input) == 3 and all(i in values for i in node.input):
            start, limit, delta = (int(np.asarray(values[i]).reshape(-1)[0]) for i in node.input)
            return limit if start == 0 and delta == 1 and limit > 1 else None
        return None

    out: dict[str, tuple[int, int] | None] = {}
    for name in names:
        hi = bound(name)
        if hi is None and "mask" in name.lower():
            hi = 2
        out[name] = (0, hi) if hi and hi > 0 else None
    return out


MAX_INPUT_ELEMENTS = 1 << 30  # 4 GiB as float32: larger is a typo, not a model input


def _shape_entries(item: str) -> list[str]:
    """``"x:1x3x224x224,y:1x2"`` (trtexec) / ``"x:[1,3,224,224],y:[1,2]"`` (Polygraphy) -> one entry each.
    A comma inside brackets, or before a piece with no ``:`` (``y:1,16``), stays in its entry."""
    parts, cur, depth = [], "", 0
    for ch in item:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    out: list[str] = []
    for p in parts:
        if ":" in p or not out:
            out.append(p)
        else:
            out[-1] += "," + p
    return [p.strip() for p in out if p.strip()]


def parse_shapes(items: list[str] | None) -> dict[str, list[int]]:
    """``["x:1x3x224x224", "y:1,16"]``, trtexec's ``"x:1x3x224x224,y:1x2"`` and Polygraphy's
    ``"x:[1,3,224,224]"`` -> ``{"x": [1, 3, 224, 224], ...}``. Names may hold ``:`` (``input:0:1x3``).
    A dim may be a range (``input_ids:1x1..128``) or buckets (``input_ids:1x16|32|64``): that input's
    shape is then an ``edgeopt.shapes.VarShape`` (each variable axis at its top, bounds in ``.axes``)."""
    shapes: dict[str, list[int]] = {}
    hint = "use NAME:1x3x224x224 (or NAME:[1,3,224,224]; several as x:1x3x224x224,y:1x2)"
    for item in items or []:
        for entry in _shape_entries(item):
            name, sep, dims = entry.rpartition(":")
            dims = dims.strip()
            if dims.startswith("[") and dims.endswith("]"):
                dims = dims[1:-1]
            if not sep or not name or not dims:
                raise UsageError(f"bad --shape {entry!r}", hint=hint)
            from edgeopt import shapes as shapesmod

            values = shapesmod.make([shapesmod.parse_dim(d, entry, hint)
                                     for d in dims.replace(",", "x").replace(" ", "").split("x")])
            if any(v <= 0 for v in values):
                raise UsageError(f"bad --shape {entry!r}: dims must be positive")
            n = 1
            for v in values:
                n *= v
            if n > MAX_INPUT_ELEMENTS:
                raise UsageError(f"--shape {entry!r} is {n:,} elements ({n * 4 / 2**30:.0f} GiB as float32): "
                                 "too large for one input", hint="check the dims for a typo")
            if name in shapes and (shapes[name] != values or repr(shapes[name]) != repr(values)):
                raise UsageError(f"--shape gives {name!r} twice ({shapes[name]!r} and {values!r})")
            shapes[name] = values
    return shapes


def static_input_shapes(info: ModelInfo, given: dict[str, list[int]]) -> dict[str, list[int]]:
    """Every input's concrete shape; dynamic dims must be given with --shape (all named at once)."""
    names = {t.name for t in info.inputs}
    unknown = [n for n in given if n not in names]
    if unknown:
        raise UsageError(f"--shape names unknown input(s) {unknown}", hint=f"the model's inputs are {sorted(names)}")
    out: dict[str, list[int]] = {}
    missing: list[TensorInfo] = []
    for t in info.inputs:
        if t.name in given:
            shape = given[t.name]
            if len(shape) != len(t.shape):
                raise UsageError(f"--shape {t.name}: the model's input has rank {len(t.shape)}, got {len(shape)} dims")
            from edgeopt import shapes as shapesmod

            shapesmod.check_model_axes(t.name, t.shape, shape)  # a range/buckets on a fixed dim: exit 2
            clash = [(i, d, s) for i, (d, s) in enumerate(zip(t.shape, shape)) if isinstance(d, int) and d != s]
            if clash:
                i, d, s = clash[0]
                raise UsageError(f"--shape {t.name}: dim {i} is fixed at {d} in the model, got {s}")
            out[t.name] = shape if isinstance(shape, shapesmod.VarShape) else list(shape)
        elif all(isinstance(d, int) for d in t.shape):
            out[t.name] = list(t.shape)  # type: ignore[arg-type]
        else:
            missing.append(t)
    if missing:
        dims = "; ".join(f"{t.name} {_fmt_shape(t.shape)}" for t in missing)
        example = " ".join(f"--shape {t.name}:" + "x".join(str(d) if isinstance(d, int) else "N" for d in t.shape)
                           for t in missing)
        raise UsageError(f"the model has dynamic dimensions with no shape given: {dims}",
                         hint=f"give concrete sizes, e.g. {example} (replace each N; a range 1..128 or buckets "
                         "16|32|64 keeps a dim variable)")
    return out


def _fmt_shape(shape) -> str:
    return "[" + ",".join(str(d) if d is not None else "?" for d in shape) + "]"


def drop_initializer_inputs(model: Any) -> int:
    """Take an IR < 4 model's initializers off its graph inputs (the IR 3 rule listed them there too; onnx's
    pytorch-converted tests): the values stay, only a feed could have overridden them, and edgeopt feeds the real
    inputs only. Returns how many."""
    if model.ir_version >= 4:
        return 0
    inits = {i.name for i in model.graph.initializer}
    kept = [i for i in model.graph.input if i.name not in inits]
    dropped = len(model.graph.input) - len(kept)
    if dropped:
        del model.graph.input[:]
        model.graph.input.extend(kept)
    return dropped


def make_static(model, shapes: dict[str, list[int]]):
    """A copy of the model with the given input shapes fixed and shapes re-inferred."""
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        if vi.name in shapes:
            dims = vi.type.tensor_type.shape.dim
            for d, v in zip(dims, shapes[vi.name]):
                d.Clear()
                d.dim_value = v
    # Output/value_info dims are recomputed; stale symbolic ones would confuse converters.
    del m.graph.value_info[:]
    for vi in m.graph.output:
        for d in vi.type.tensor_type.shape.dim:
            if not d.HasField("dim_value"):
                d.Clear()
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:
        pass
    return m


# --- which ONNX opset and IR version each runtime reads ----------------------------------------------------
# The installed runtimes are asked (a one-node model stamped with the opset/IR in question), not a table: an
# opset ONNX Runtime 1.23 does not read (24) fails its load with a C++ signature and a temp path, deep in a
# build. ONNX Runtime reads every model edgeopt builds (the FP32 reference, the host checks, onnx2tf's own
# runs, Core ML's structural check), so its limits bound every target; OpenVINO's ONNX frontend and the
# TensorRT parser (its opset range, from the operator table of the TensorRT the target's devices run) add theirs.


@dataclass(frozen=True)
class FormatLimit:
    """The newest ONNX opset (default domain) and IR version ``runtime`` reads; None: not limited below
    what the installed ``onnx`` writes (or not known)."""

    runtime: str
    opset: int | None
    ir: int | None
    why: str = ""  # why it applies to the target ("the FP32 reference every build runs")


def _identity_model(opset: int, ir: int) -> bytes:
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir
    return m.SerializeToString() if isinstance(m, onnx.ModelProto) else bytes(m)


def _newest(reads, have: int, floor: int) -> int | None:
    """The newest value in [floor, have] that ``reads`` accepts, None when ``have`` itself is read (no limit
    at or below ``have``) or nothing is."""
    if reads(have):
        return None
    for v in range(have - 1, floor - 1, -1):
        if reads(v):
            return v
    return None


_PROBED: dict[tuple[str, str, int], bool] = {}


def _reads(runtime: str, kind: str, value: int) -> bool:
    """Does the installed ``runtime`` load a one-node model at opset ``value`` (kind "opset", IR 7) or IR
    ``value`` (kind "ir", opset 13)? Cached per process."""
    key = (runtime, kind, value)
    if key not in _PROBED:
        data = _identity_model(value if kind == "opset" else 13, 7 if kind == "opset" else value)
        try:
            if runtime == "onnxruntime":
                import onnxruntime as ort

                so = ort.SessionOptions()
                so.log_severity_level = 4
                ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
            else:
                import openvino as ov

                ov.Core().read_model(data, b"")
            _PROBED[key] = True
        except ImportError:
            raise
        except Exception:
            _PROBED[key] = False
    return _PROBED[key]


def runtime_limit(runtime: str, opset: int, ir: int) -> FormatLimit | None:
    """Whether the installed ``runtime`` ("onnxruntime" or "openvino") reads opset ``opset`` and IR ``ir``:
    None when it does (or is not installed), else the newest it reads."""
    import importlib.metadata as md

    dist = {"onnxruntime": "onnxruntime", "openvino": "openvino"}[runtime]
    try:
        version = md.version(dist)
    except md.PackageNotFoundError:
        try:
            version = md.version(dist + "-gpu") if runtime == "onnxruntime" else None
        except md.PackageNotFoundError:
            version = None
    if version is None:
        return None
    try:
        new_ir = _newest(lambda v: _reads(runtime, "ir", v), ir, 3) if ir > 7 else None
        new_opset = _newest(lambda v: _reads(runtime, "opset", v), opset, 7) if opset > 7 else None
    except ImportError:
        return None
    if new_ir is None and new_opset is None:
        return None
    name = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO"}[runtime]
    return FormatLimit(f"{name} {version}", new_opset, new_ir)


def format_limits(opset: int, ir: int, backend: str, spec: dict[str, Any] | None = None) -> list[FormatLimit]:
    """The runtimes on ``backend``'s way (for the target ``spec``) that cannot read ONNX opset ``opset`` / IR
    ``ir``, each with the newest it reads (empty: every runtime reads the model)."""
    limits: list[FormatLimit] = []
    ort = runtime_limit("onnxruntime", opset, ir)
    if ort is not None:
        why = {"onnxruntime": "", "tflite": "onnx2tf runs the model in it, and ",
               "coreml": "the structural check runs it, and "}.get(backend, "")
        limits.append(FormatLimit(ort.runtime, ort.opset, ort.ir, why + "it computes the FP32 reference every "
                                  "build is checked against"))
    if backend == "openvino":
        ov = runtime_limit("openvino", opset, ir)
        if ov is not None:
            limits.append(FormatLimit(ov.runtime + "'s ONNX frontend", ov.opset, ov.ir))
    if backend == "tensorrt":
        try:
            from edgeopt.targets.tensorrt.prep import table_for_target

            table = table_for_target(spec)
            if opset > table.opset_max:
                limits.append(FormatLimit(table.parser, table.opset_max, None, "it builds the engine on the device"))
        except Exception:  # a profile naming no known TensorRT is refused by the build itself
            pass
    return limits


def format_refusal(opset: int, ir: int, backend: str, spec: dict[str, Any] | None = None,
                   model: str | os.PathLike | None = None) -> tuple[str, str] | None:
    """Why ``backend`` (for the target ``spec``) cannot take a model stamped with ONNX opset ``opset`` and IR
    ``ir``: ``(message, hint)``, or None when every runtime on the way reads it. The message names the
    runtime, its limit and why it reads the model; the hint says what to re-export with.

    ``model``: the model file; then a model ``onnx.version_converter`` takes down to what the runtimes read
    is not refused (``build`` converts it and keeps the conversion only when its outputs are identical,
    ``down_convert``), and one it cannot take is refused with the converter's reason."""
    limits = format_limits(opset, ir, backend, spec)
    if not limits and 0 < opset < ORT_MIN_OPSET and model is not None:  # older than ONNX Runtime implements
        why = conversion_error(model, ORT_MIN_OPSET, None)
        if why is not None:
            return (f"the model is ONNX opset {opset}: ONNX Runtime implements opset >= {ORT_MIN_OPSET} (it computes the "
                    f"FP32 reference every build is checked against); onnx.version_converter cannot take it to opset "
                    f"{ORT_MIN_OPSET}: {why}", f"re-export with opset >= {ORT_MIN_OPSET}")
    if not limits:
        return None
    max_opset = min((lim.opset for lim in limits if lim.opset is not None), default=None)
    max_ir = min((lim.ir for lim in limits if lim.ir is not None), default=None)
    conv_why = None
    if model is not None:
        conv_why = conversion_error(model, max_opset, max_ir)
        if conv_why is None:
            return None
    said = []
    for lim in limits:
        reads = " and ".join(x for x in (f"opset <= {lim.opset}" if lim.opset is not None else "",
                                         f"IR <= {lim.ir}" if lim.ir is not None else "") if x)
        said.append(f"{lim.runtime} reads ONNX {reads}" + (f" ({lim.why})" if lim.why else ""))
    msg = (f"the model is ONNX opset {opset}, IR {ir}: " + "; ".join(said)
           + (f"; onnx.version_converter cannot take it to opset {max_opset}: {conv_why}" if conv_why else ""))
    fixes = []
    if max_opset is not None:
        fixes.append(f"re-export with opset <= {max_opset}" + ("" if conv_why else
                     f" (or onnx.version_converter.convert_version(model, {max_opset}))"))
    if max_ir is not None:
        fixes.append(f"save it with IR version <= {max_ir} (model.ir_version = {max_ir}; the version converter "
                     "keeps the IR)")
    return msg, "; ".join(fixes)


# --- down-conversion of a model stamped newer than the runtimes read (issue 32) -------------------------------
# onnx writes opset 24 by default; ONNX Runtime 1.23 reads <= 23. Most such models use no op whose semantics
# changed (Flatten, Shape, Transpose ...): onnx.version_converter re-stamps them, and the build keeps the
# converted model only when onnx.reference gives identical outputs for both on the validation inputs.


# ONNX Runtime implements opset 7 and newer ("All versions of ONNX Runtime support ONNX opsets from ONNX v1.2.1+
# (opset version 7 and higher)", its compatibility page): an older model (torch's exports of 2018, onnx's own
# pytorch-converted tests at opset 6) loads and then lacks kernels (AveragePool-1). Every build runs ONNX Runtime
# (the FP32 reference), so such a model is converted up to 7, kept only when onnx.reference agrees exactly.
ORT_MIN_OPSET = 7


def conversion_target(opset: int, ir: int, targets: list[tuple[str, dict[str, Any]]]) -> tuple[int | None, int | None] | None:
    """The (opset, IR) every runtime on the way of ``targets`` (``[(backend, spec)]``) reads, where the model's
    own is newer -- or ``ORT_MIN_OPSET`` where it is older than ONNX Runtime implements (None in a place: that one
    needs no change); None when nothing needs converting."""
    limits = [lim for backend, spec in targets for lim in format_limits(opset, ir, backend, spec)]
    to_opset = min((lim.opset for lim in limits if lim.opset is not None), default=None)
    if 0 < opset < ORT_MIN_OPSET:
        to_opset = ORT_MIN_OPSET
    to_ir = min((lim.ir for lim in limits if lim.ir is not None), default=None)
    return None if to_opset is None and to_ir is None else (to_opset, to_ir)


def _converter_reason(text: str) -> str:
    import re

    text = text.strip()
    m = re.search(r"(?:failed|Assertion[^:]*):\s*(.+)", text)
    return ((m.group(1) if m else text).splitlines() or ["no reason given"])[0][:200]


# onnx.version_converter is C++ and can crash the process (ReduceMin-18 -> 17 segfaults in onnx 1.19.1, found by
# bench/bench_conformance.py): it runs in a child, one target opset after another, nearest first.
_CONVERT_CHILD = r"""
import json, sys
import onnx
from onnx import version_converter
src, out_dir, targets = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
model = onnx.load(src, load_external_data=False)
for t in targets:
    try:
        c = version_converter.convert_version(model, t)
        if out_dir != "-":
            onnx.save(c, f"{out_dir}/opset{t}.onnx")
        why = None
    except Exception as exc:
        why = str(exc) or type(exc).__name__
    print(json.dumps([t, why]), flush=True)
"""


def _convert_child(src: str, opsets: list[int], out_dir: str | None, timeout: float = 300) -> dict[int, str | None]:
    """``{opset: None (converted; saved as OUT_DIR/opset<N>.onnx) or why not}`` for each target opset."""
    import json
    import subprocess
    import sys

    results: dict[int, str | None] = {}
    todo = sorted(set(opsets), reverse=True)
    while todo:
        try:
            proc = subprocess.run([sys.executable, "-c", _CONVERT_CHILD, src, out_dir or "-", json.dumps(todo)],
                                  capture_output=True, text=True, timeout=timeout)
            out, rc = proc.stdout, proc.returncode
        except subprocess.TimeoutExpired as exc:
            out, rc = (exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""), None
        for line in out.splitlines():
            try:
                t, why = json.loads(line)
            except ValueError:
                continue
            results[int(t)] = None if why is None else _converter_reason(why)
        left = [t for t in todo if t not in results]
        if left:  # the converter died (or hung) on left[0]: the others get a fresh child
            results[left[0]] = (f"onnx.version_converter hung (> {timeout:.0f} s)" if rc is None else
                                f"onnx.version_converter crashed ({f'signal {-rc}' if rc < 0 else f'exit {rc}'})")
        todo = left[1:]
    return results


def down_convert(model: Any, opset: int | None, ir: int | None) -> Any:
    """A copy of ``model`` (ModelProto) taken down to ONNX ``opset`` (or up to it: ``ORT_MIN_OPSET``) by
    ``onnx.version_converter`` (in a child process) and stamped IR ``ir`` (None: keep that one). ``ModelError``
    (one line) when it cannot."""
    import tempfile

    import onnx

    have = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if opset is not None and have != opset:
        hint = f"re-export with opset {'<=' if have > opset else '>='} {opset}"
        if model.ByteSize() > 1_900_000_000:
            raise ModelError(f"the model is ONNX opset {have}, and too large (> 1.9 GB) for edgeopt to take it to "
                             f"opset {opset} with onnx.version_converter", hint=hint)
        with tempfile.TemporaryDirectory(prefix="edgeopt-opset-") as d:
            onnx.save(model, f"{d}/model.onnx")
            why = _convert_child(f"{d}/model.onnx", [opset], d).get(opset)
            if why is not None:
                raise ModelError(f"onnx.version_converter cannot take the model from opset {have} to {opset}: {why}",
                                 hint=hint)
            out = onnx.load(f"{d}/opset{opset}.onnx")
    if opset is not None and have < 7 <= opset:
        _legacy_prelu_slopes(out)
    if ir is not None and out.ir_version > ir:
        out.ir_version = ir
    return out


def _legacy_prelu_slopes(model: Any) -> int:
    """PRelu before opset 7 applied a 1-D slope per channel (axis 1: torch exported ``[C]`` for ``nn.PReLU(C)``);
    from opset 7 the slope broadcasts numpy-style from the last axis, and onnx.version_converter re-stamps the
    node without reshaping it (ONNX Runtime then fails to broadcast, or silently scales the wrong axis). Such a
    slope becomes ``[C, 1, ...]`` for an input of rank >= 3 -- the up-conversion's verification (onnx.reference,
    which reads a legacy slope per channel) then holds the result to the original. Returns how many."""
    import onnx
    from onnx import numpy_helper

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - no shapes: nothing known to reshape
        return 0
    ranks = {vi.name: len(vi.type.tensor_type.shape.dim)
             for vi in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output)
             if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")}
    inits = {i.name: i for i in model.graph.initializer}
    done = 0
    for n in model.graph.node:
        if n.op_type != "PRelu" or len(n.input) < 2 or n.input[1] not in inits:
            continue
        slope, rank = inits[n.input[1]], ranks.get(n.input[0], 0)
        if len(slope.dims) != 1 or slope.dims[0] <= 1 or rank < 3:
            continue
        value = numpy_helper.to_array(slope).reshape(int(slope.dims[0]), *([1] * (rank - 2)))
        new = numpy_helper.from_array(value, f"{slope.name}_per_channel")
        model.graph.initializer.append(new)
        if model.ir_version < 4:  # IR 3 lists every initializer as a graph input too
            model.graph.input.append(onnx.helper.make_tensor_value_info(new.name, new.data_type, list(value.shape)))
        n.input[1] = new.name
        done += 1
    return done


_CONVERTIBLE: dict[tuple[str, int, int, int], str | None] = {}


def conversion_error(model: str | os.PathLike, opset: int | None, ir: int | None) -> str | None:
    """None when ``down_convert`` takes the model file to ``opset`` (the converter's structure only: build
    verifies the outputs; an IR stamp alone always can), else the converter's reason. Cached per file (size,
    mtime) and opset."""
    try:
        st = os.stat(model)
    except OSError:
        return "the model file cannot be read"
    if opset is None:
        return None
    key = (str(model), st.st_size, st.st_mtime_ns, opset)
    if key not in _CONVERTIBLE:
        import json

        disk = _conversion_cache(model)
        known = json.loads(disk.read_text()) if disk and disk.exists() else {}
        if str(opset) not in known:
            # the opsets the runtimes' limits name (ONNX Runtime 1.23: 23, TensorRT 10.3: 20, 8.5: 17), one child
            have = _default_opset(model)
            asked = sorted({opset} | {t for t in (23, 20, 17) if t < have and str(t) not in known}, reverse=True)
            known.update({str(t): why for t, why in _convert_child(str(model), asked, None).items()})
            if disk:
                with contextlib.suppress(OSError):
                    disk.parent.mkdir(parents=True, exist_ok=True)
                    disk.write_text(json.dumps(known))
        for t, why in known.items():
            _CONVERTIBLE[(str(model), st.st_size, st.st_mtime_ns, int(t))] = why
    return _CONVERTIBLE[key]


def _default_opset(model: str | os.PathLike) -> int:
    import onnx

    try:
        m = onnx.load(str(model), load_external_data=False)
    except Exception:  # noqa: BLE001 - unreadable: no extra opsets asked
        return 0
    return next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0)


def _conversion_cache(model: str | os.PathLike) -> Path | None:
    """``<edgeopt cache>/opset-conversion/<model sha256>.json``: what the converter answered per opset, so that
    ``inspect`` does not start the converter again for a model it has seen (keyed by content, onnx version)."""
    import onnx

    try:
        from edgeopt.pipeline import cache_dir

        return cache_dir() / "opset-conversion" / f"{sha256_file(model)}-onnx{onnx.__version__}.json"
    except Exception:  # noqa: BLE001 - no cache: ask the converter every time
        return None


def _reference_fixes() -> list[Any]:
    """onnx.reference's own mistakes on old opsets, for both sides of an up-conversion: its
    BatchNormalization_6 (which serves opsets 6 to 8) takes ``is_test`` for a training run when it is absent
    (BatchNormalization-7 dropped it: one output is inference) and on opset 6 too, then fails (a tuple of five
    returned as one output): no opset-6 BatchNormalization torch exported could be verified. Here: opset 6 by
    ``is_test``, 7 and 8 by the number of outputs, as the spec says."""
    import numpy as np
    from onnx import helper
    from onnx.reference.op_run import OpRun
    from onnx.reference.ops.op_batch_normalization import _batchnorm_test_mode

    class BatchNormalization(OpRun):
        op_domain = ""

        def _run(self, x, scale, bias, mean, var, **_: Any):  # noqa: ANN001 - onnx.reference's signature
            attrs = {a.name: helper.get_attribute_value(a) for a in self.onnx_node.attribute}
            eps, momentum = float(attrs.get("epsilon", 1e-5)), float(attrs.get("momentum", 0.9))
            outs = len([o for o in self.onnx_node.output if o])
            training = not attrs["is_test"] if "is_test" in attrs else outs > 1
            if not training:
                return (_batchnorm_test_mode(x, scale, bias, mean, var, epsilon=eps),)
            axes = tuple(i for i in range(x.ndim) if i != 1)
            saved_mean, saved_var = x.mean(axis=axes), x.var(axis=axes)
            y = _batchnorm_test_mode(x, scale, bias, saved_mean, saved_var, epsilon=eps)
            running = (mean * momentum + saved_mean * (1 - momentum), var * momentum + saved_var * (1 - momentum))
            return tuple(np.asarray(t, dtype=x.dtype) for t in (y, *running, saved_mean, saved_var))[:outs]

    return [BatchNormalization]


def verify_conversion(original: Any, converted: Any, feeds: list[dict[str, Any]], samples: int = 4) -> dict[str, Any]:
    """Run ``original`` and ``converted`` (ModelProtos) in ``onnx.reference`` (the spec's implementation: ONNX
    Runtime cannot load the original, which is why it is converted) on up to ``samples`` of ``feeds``: the
    conversion record for the bundle manifest when every output is identical, else ``ModelError`` (one line)."""
    import numpy as np
    from onnx.reference import ReferenceEvaluator

    def opset_of(m: Any) -> int:
        return next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0)

    rec = {"from_opset": opset_of(original), "to_opset": opset_of(converted), "from_ir": original.ir_version,
           "to_ir": converted.ir_version, "converter": "onnx.version_converter"}
    hint = (f"re-export with opset {'>=' if rec['to_opset'] > rec['from_opset'] else '<='} {rec['to_opset']}"
            + (f" and IR <= {rec['to_ir']}" if rec["to_ir"] < rec["from_ir"] else ""))
    used = feeds[:samples]
    if rec["from_opset"] == rec["to_opset"]:  # only the IR stamp lowered: the graph is the same graph
        return {**rec, "verified": "the graph is unchanged (only the IR version stamp lowered)", "samples": 0}
    try:
        a_ev, b_ev = (ReferenceEvaluator(m, new_ops=_reference_fixes() if opset_of(m) < 9 else None)
                      for m in (original, converted))
        for feed in used:
            for x, y in zip(a_ev.run(None, feed), b_ev.run(None, feed)):
                x, y = np.asarray(x), np.asarray(y)
                if x.shape != y.shape or not np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"):
                    diff = (float(np.nanmax(np.abs(x.astype(np.float64) - y.astype(np.float64))))
                            if x.shape == y.shape and x.size and x.dtype.kind in "fciu" else None)
                    raise ModelError(
                        f"the opset {rec['from_opset']} -> {rec['to_opset']} conversion (onnx.version_converter) "
                        "changes the model's outputs on the validation inputs ("
                        + (f"max abs difference {diff:.3g}" if diff is not None else
                           f"shape {list(y.shape)} instead of {list(x.shape)}") + "), so it is not used", hint=hint)
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 - the spec's evaluator cannot run one of them: no verification
        raise ModelError(f"the opset {rec['from_opset']} -> {rec['to_opset']} conversion cannot be verified: "
                         f"onnx.reference fails on it ({(str(exc).splitlines() or [type(exc).__name__])[0][:160]})",
                         hint=hint) from None
    return {**rec, "verified": f"identical outputs: onnx.reference on the original and the converted model, "
                               f"{len(used)} validation sample(s)", "samples": len(used), "max_abs_diff": 0.0}
