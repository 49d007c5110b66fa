"""Layer-by-layer comparison of a bundle's artifact with the ONNX FP32 reference (``edgeopt debug``).

Both sides run on the bundle's validation inputs; intermediate tensors are read from each in *windows*
of nodes (never every tensor at once: a window holds at most ``max_memory`` bytes of stacked tensors,
both sides together), mapped to the ONNX tensor they compute, and compared with the same metrics as
the host check (``edgeopt_agent.compare``: one implementation).  The result lists every ONNX node in
topological order and names the **first** node whose error passes the precision's bound: errors
accumulate downstream, so the first node past the bound is the cause, not the one with the largest error.

Per backend (the real runtime, with the options the bundle ships):

- ``onnxruntime`` (cpu): the artifact with the wanted tensors added as graph outputs, in a session built
  with the runner's own session options and disabled optimizers; an INT8 QDQ artifact is read after its
  DequantizeLinear (the value consumers see).  A tensor that a fusion removed from the artifact
  (a Conv's output folded with its BatchNormalization) is "not observed"; the fused node's output is.
- ``openvino`` (intel-*): ``Model.add_outputs`` on the IR's ports found by their ONNX tensor names, with
  the runner's compile config; the runtime graph's ``runtimePrecision`` per layer says which ONNX
  nodes ran in INT8 and which in FP32.
- ``tflite`` (mobile): LiteRT with ``experimental_preserve_all_tensors``; each TFLite tensor is mapped to the
  ONNX tensor it computes by the bundle's ``tensor_map.json`` (recorded by the build from onnx2tf's own table,
  ``edgeopt.targets.tflite.tensor_map``), INT8 tensors dequantized; NHWC tensors are matched to the NCHW ONNX
  shape by the permutation that fits.
- ``tensorrt``: the prepared ONNX the engine is built from (Q/DQ placement, FP16 casts) in ONNX Runtime, as the
  host check runs it (the engine's own layers need a GPU); Core ML: predicts on macOS only, the reason is said
  (``BackendUnavailable``).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FLOAT_TYPES = (1, 10, 11, 16)  # TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16
SKIP_OPS = ("Constant", "ConstantOfShape")
# tensor-level bounds judged on an intermediate tensor (the output kinds' task bounds apply at the outputs)
TENSOR_BOUNDS = ("rel_l2_max", "cosine_min", "max_abs_norm_max")
DEFAULT_MAX_MEMORY = 1 << 30
# the compute nodes whose observable share debug reports (issue 41): convolutions, matrix products, attention
COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "Gemm", "MatMul", "MatMulInteger",
                         "QLinearMatMul", "FusedMatMul", "Attention", "MultiHeadAttention", "Einsum"})


class BackendUnavailable(Exception):
    """This backend's intermediates cannot be read on this host (the message says why)."""


def _say(_: str) -> None:
    pass


# --- the reference graph ----------------------------------------------------------------------------

@dataclass
class Node:
    index: int
    name: str
    op: str
    inputs: list[str]
    outputs: list[str]  # float outputs only (the ones compared)


def tensor_types(model) -> dict[str, int]:
    """Element type of every tensor ONNX's shape inference can type (inputs, outputs, intermediates).

    An intermediate exposed as a graph output must be declared with its own type: ORT refuses to load a
    model that declares an int32 tensor (magika's one-hot indices) as float."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - e.g. a model over 2 GB, a custom op: nothing typed
        inferred = model
    g = inferred.graph
    return {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.value_info, *g.output]
            if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type}


def nodes_of(model) -> list[Node]:
    """Top-level nodes in topological order (ONNX stores them sorted), Constants left out; a node without
    a name is named after its first output."""
    types = tensor_types(model)
    inits = {i.name for i in model.graph.initializer}
    out = []
    for i, n in enumerate(model.graph.node):
        if n.op_type in SKIP_OPS:
            continue
        outs = [t for t in n.output if t and types.get(t, 1) in FLOAT_TYPES]
        ins = [t for t in n.input if t and t not in inits]
        out.append(Node(i, n.name or (n.output[0] if n.output else f"{n.op_type}_{i}"), n.op_type, ins, outs))
    return out


def static_reference(model_path: str | Path, manifest: dict[str, Any]):
    """The source ONNX with the bundle's input shapes fixed (what the pipeline's prepared.onnx is)."""
    from edgeopt import model as modelmod

    m = modelmod.load(model_path)
    shapes = {s["name"]: list(s["shape"]) for s in manifest["io"]["inputs"] if s.get("shape")}
    try:
        return modelmod.make_static(m, shapes)
    except Exception:  # noqa: BLE001 - dims left as they are; the data has the static shapes
        return m


def tensor_bytes(model, names: list[str], feed: dict[str, np.ndarray]) -> dict[str, int]:
    """Bytes per sample of each tensor, from shape inference (unknown dims: 4 MiB, a conservative guess)."""
    import onnx

    try:
        g = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001
        g = model.graph
    sizes = {}
    for v in [*g.input, *g.value_info, *g.output]:
        dims = [d.dim_value for d in v.type.tensor_type.shape.dim]
        if dims and all(d > 0 for d in dims):
            sizes[v.name] = int(np.prod(dims)) * 4
        elif v.type.tensor_type.HasField("shape") and not dims:
            sizes[v.name] = 4
    for k, a in feed.items():
        sizes[k] = a.nbytes
    return {n: sizes.get(n, 4 << 20) for n in names}


def windows(names: list[str], sizes: dict[str, int], samples: int, budget: int) -> list[list[str]]:
    """Consecutive groups of tensors whose stacked values (both sides, every sample) fit ``budget``."""
    out: list[list[str]] = []
    cur: list[str] = []
    used = 0
    for n in names:
        need = sizes.get(n, 4 << 20) * samples * 2
        if cur and used + need > budget:
            out.append(cur)
            cur, used = [], 0
        cur.append(n)
        used += need
    if cur:
        out.append(cur)
    return out


# --- tensor sources ---------------------------------------------------------------------------------

class Source:
    """Intermediate tensors of one side: ``available`` ONNX tensor names, ``run(names, feeds)`` -> stacked."""

    label = "?"
    available: set[str]

    def run(self, names: list[str], feeds: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def precisions(self) -> dict[str, str]:
        """ONNX tensor/node name -> the precision the runtime really ran it in (where the runtime says)."""
        return {}

    def notes(self) -> list[str]:
        return []


def with_outputs_bytes(model, names: list[str], types: dict[str, int]) -> bytes:
    """The model with ``names`` as its only outputs besides its own (serialized; the proto is restored)."""
    from onnx import TensorProto, helper

    n0 = len(model.graph.output)
    have = {o.name for o in model.graph.output}
    for n in names:
        if n not in have:
            model.graph.output.append(helper.make_tensor_value_info(n, types.get(n, TensorProto.FLOAT), None))
    try:
        return model.SerializeToString()
    finally:
        del model.graph.output[n0:]


class OrtSource(Source):
    """An ONNX model in ONNX Runtime; ``alias`` maps an ONNX tensor name to the artifact's tensor."""

    def __init__(self, model, make_session: Callable[[bytes], Any], alias: dict[str, str] | None = None,
                 label: str = "onnxruntime", types: dict[str, int] | None = None, keep_session: bool = False):
        self.model, self.make_session, self.label = model, make_session, label
        # keep_session: the last session stays open for the next run of the same tensors (a caller going
        # sample by sample through one window); off, each run's session is freed at its end (less memory)
        self.keep_session = keep_session
        self._kept: tuple[Any, Any, list[str] | None] | None = None
        self.types = tensor_types(model) if types is None else types
        produced = {o for n in model.graph.node for o in n.output if o} | {i.name for i in model.graph.input}
        self.alias = {k: v for k, v in (alias or {}).items() if v in produced}
        self.available = set(self.alias) | {t for t in produced if self.types.get(t, 1) in FLOAT_TYPES}

    truncate = False  # the reference: run only what the window's tensors need (early windows run fast)

    def _upstream(self, names: list[str]) -> tuple[bytes, list[str]] | None:
        """The part of the model that computes ``names`` (serialized) and its inputs; None when it cannot be cut."""
        import onnx.utils

        try:
            if getattr(self, "_extractor", None) is None:
                self._extractor = onnx.utils.Extractor(self.model)
            sub = self._extractor.extract_model([i.name for i in self.model.graph.input], names)
            return sub.SerializeToString(), [i.name for i in sub.graph.input]
        except Exception:  # noqa: BLE001 - e.g. subgraphs reading outer names: the whole model runs
            return None

    def run(self, names, feeds):
        real = [self.alias.get(n, n) for n in names]
        key = (tuple(real), self.truncate)
        if self._kept is not None and self._kept[0] == key:
            sess, keep_in = self._kept[1], self._kept[2]
        else:
            self._kept = None
            cut = self._upstream(real) if self.truncate else None
            if cut is not None:
                sess, keep_in = self.make_session(cut[0]), cut[1]
            else:
                sess, keep_in = self.make_session(with_outputs_bytes(self.model, real, self.types)), None
            if self.keep_session:
                self._kept = (key, sess, keep_in)
        if keep_in is not None:
            feeds = [{k: v for k, v in f.items() if k in keep_in} for f in feeds]
        got: dict[str, list[np.ndarray]] = {n: [] for n in names}
        for feed in feeds:
            vals = sess.run(real, feed)
            for n, v in zip(names, vals):
                got[n].append(np.asarray(v))
        del sess
        return {n: np.stack(v) for n, v in got.items()}


def reference_source(model) -> OrtSource:
    """The FP32 reference: ONNX Runtime, optimisations off (as the pipeline's reference.npz)."""
    import onnxruntime as ort

    def make(data: bytes):
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 3
        return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])

    src = OrtSource(model, make, label="onnx fp32 (onnxruntime, optimisations off)")
    src.truncate = True
    return src


class BundleSource(Source):
    """The artifact side: feeds in the ONNX layout go through the bundle's IO spec (``to_artifact``)."""

    def __init__(self, bundle: Path, manifest: dict[str, Any]):
        self.bundle, self.manifest = bundle, manifest


class OrtBundle(BundleSource):
    def __init__(self, bundle: Path, manifest: dict[str, Any]):
        super().__init__(bundle, manifest)
        import onnx

        from edgeopt_agent.runners import get_runner

        self._notes: list[str] = []
        if manifest["runtime"]["name"] == "onnxruntime":
            runner = get_runner("onnxruntime")(bundle, manifest, {})
            runner.load()  # the session options and disabled optimizers the bundle ships
            so, disabled, ort = runner._so, runner._disabled, runner._ort
            providers = runner.session.get_providers()
            runner.close()
            label = f"onnxruntime {ort.__version__} (the bundle's session options)"
        else:  # TensorRT: the prepared ONNX the engine is built from, as the host check runs it
            import onnxruntime as ort

            so, disabled, providers = ort.SessionOptions(), [], ["CPUExecutionProvider"]
            so.log_severity_level = 3
            label = f"the prepared ONNX in onnxruntime {ort.__version__} (not the engine)"
            self._notes.append("TensorRT: the engine is built on the device; compared here is the prepared ONNX "
                               "it is built from (Q/DQ placement, FP16 casts of a strongly typed build) in ONNX "
                               "Runtime; the engine's own layer outputs need a GPU")
        model = onnx.load(str(bundle / manifest["runtime"]["artifact"]))
        # INT8 QDQ: what consumers read of tensor t is DQ(Q(t)) when t was quantized
        q_of = {n.input[0]: n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
        dq_of = {n.input[0]: n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
        alias = {t: dq_of[q] for t, q in q_of.items() if q in dq_of}
        self.producer = {o: n.name or o for n in model.graph.node for o in n.output}
        self.producer_op = {o: n.op_type for n in model.graph.node for o in n.output}
        kw = {"disabled_optimizers": disabled} if disabled else {}
        self._io = manifest["io"]
        self._src = OrtSource(model, lambda data: ort.InferenceSession(data, so, providers=providers, **kw), alias,
                              label=label)
        self.available = self._src.available
        self.label = self._src.label
        self._quantized = set(alias)

    def run(self, names, feeds):
        from edgeopt_agent.bundle import to_artifact

        return self._src.run(names, [to_artifact(f, self._io["inputs"]) for f in feeds])

    def notes(self) -> list[str]:
        return list(self._notes)

    def artifact_node(self, tensor: str) -> str | None:
        return self.producer.get(tensor) or self.producer.get(self._src.alias.get(tensor, tensor))

    def precisions(self):
        return {t: "int8" for t in self._quantized}


class OpenVinoBundle(BundleSource):
    """``producers``: ONNX tensor -> the ONNX node that computes it. The ONNX frontend gives the last op of a
    node's decomposition the node's name as friendly name; a tensor name found on another op (a Conv's output
    name left on the Multiply of its folded BatchNormalization) is not that node's value and is not used."""

    def __init__(self, bundle: Path, manifest: dict[str, Any], producers: dict[str, str] | None = None):
        super().__init__(bundle, manifest)
        from edgeopt_agent.runners import RunnerUnavailable, get_runner

        runner = get_runner("openvino")(bundle, manifest, {"device": "CPU"} if manifest.get("options", {}).get(
            "host_check_device") else {})
        try:
            runner.load()
        except RunnerUnavailable as exc:
            raise BackendUnavailable(str(exc)) from None
        self.core, self.device, self.config = runner.core, runner.device, runner.config
        self._runtime_model = runner.compiled.get_runtime_model()
        self.info = runner.info()
        self.xml = str(runner.artifact)
        model = self.core.read_model(self.xml)
        self.ports: dict[str, tuple[str, int]] = {}  # tensor name -> (op friendly name, output index)
        self.friendly: dict[str, str] = {}
        for op in model.get_ordered_ops():
            if op.get_type_name() in ("Parameter", "Constant", "Result"):
                continue
            for i, out in enumerate(op.outputs()):
                for name in out.get_names():
                    if producers is not None and op.get_friendly_name() not in (producers.get(name), name):
                        continue
                    self.ports.setdefault(name, (op.get_friendly_name(), i))
                    self.friendly[name] = op.get_friendly_name()
        self.available = set(self.ports)
        self.label = f"openvino {runner.info().get('version', '')} {self.device}".strip()
        self._io = manifest["io"]

    def run(self, names, feeds):
        from edgeopt_agent.bundle import to_artifact

        model = self.core.read_model(self.xml)
        ops = {op.get_friendly_name(): op for op in model.get_ordered_ops()}
        outs = [ops[self.ports[n][0]].output(self.ports[n][1]) for n in names]
        model.add_outputs(outs)
        compiled = self.core.compile_model(model, self.device, self.config)
        req = compiled.create_infer_request()
        # the compiled model's output ports, matched by tensor name
        port_of = {}
        for port in compiled.outputs:
            for n in port.get_names():
                port_of.setdefault(n, port)
        got: dict[str, list[np.ndarray]] = {n: [] for n in names}
        for feed in feeds:
            res = req.infer(to_artifact(feed, self._io["inputs"]))
            for n in names:
                got[n].append(np.array(res[port_of[n]]))
        del req, compiled
        return {n: np.stack(v) for n, v in got.items()}

    def artifact_node(self, tensor: str) -> str | None:
        return self.friendly.get(tensor)

    def precisions(self):
        """Original layer name -> runtime precision, from the compiled model's runtime graph (a layer that
        ran fused with others gives its precision to each original name it lists)."""
        out: dict[str, str] = {}
        for op in self._runtime_model.get_ordered_ops():
            rt = op.get_rt_info()

            def get(key: str, rt=rt) -> str:
                try:
                    v = rt[key]
                    return str(v.astype(str) if hasattr(v, "astype") else v)
                except Exception:  # noqa: BLE001 - the key is missing
                    return ""

            layer_type = get("layerType")
            if layer_type in ("Reorder", "Input", "Output", "Parameter", "Result", "Const", "Constant"):
                continue
            prec = get("runtimePrecision").lower()
            if not prec:
                continue
            for orig in get("originalLayersNames").split(","):
                if orig.strip():
                    out.setdefault(orig.strip(), prec)
        return out


class TfliteBundle(BundleSource):
    """LiteRT's interpreter with every tensor kept (``experimental_preserve_all_tensors``).

    The graph outputs map through the bundle's IO spec (signature names, layout); intermediates through the
    bundle's ``tensor_map.json``, recorded by the build from onnx2tf's own table of the TF tensors it made
    (``edgeopt.targets.tflite.tensor_map``: checked by value against the source model, resolved on the written
    file through TFLite's fusion; a fused kernel's tensor is the last ONNX node it covers).  Quantized
    tensors (INT8) are dequantized with their own scale and zero point.  A bundle built before the map was
    recorded compares its graph outputs only, and the notes say so."""

    def __init__(self, bundle: Path, manifest: dict[str, Any], onnx_names: list[str] | None = None):
        super().__init__(bundle, manifest)
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError:
            try:
                from tflite_runtime.interpreter import Interpreter
            except ImportError:
                raise BackendUnavailable("neither ai-edge-litert nor tflite-runtime is installed") from None
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "intended for debugging purposes only": that is what this is
            self.interp = Interpreter(model_path=str(bundle / manifest["runtime"]["artifact"]),
                                      experimental_preserve_all_tensors=True, num_threads=1)
        self.interp.allocate_tensors()
        self.details = {d["name"]: d for d in self.interp.get_tensor_details()}
        self._by_index = {int(d["index"]): d for d in self.details.values()}
        self._io = manifest["io"]
        self.label = "LiteRT (experimental_preserve_all_tensors)"
        sigs = self.interp.get_signature_list() if hasattr(self.interp, "get_signature_list") else {}
        if sigs:
            runner = self.interp.get_signature_runner("serving_default" if "serving_default" in sigs else next(iter(sigs)))
            self.inputs = {n: d["index"] for n, d in runner.get_input_details().items()}
            outs = {n: d["index"] for n, d in runner.get_output_details().items()}
        else:
            self.inputs = {d["name"]: d["index"] for d in self.interp.get_input_details()}
            outs = {d["name"]: d["index"] for d in self.interp.get_output_details()}
        self.map: dict[str, int] = {}
        for spec in self._io["outputs"]:
            idx = outs.get(spec.get("artifact_name") or spec["name"])
            if idx is not None:
                self.map[spec["name"]] = int(idx)
        self.fused: dict[str, str] = {}
        self._notes: list[str] = []
        try:
            tmap = json.loads((bundle / "tensor_map.json").read_text())
        except (OSError, ValueError):
            tmap = None
        if tmap is None:
            self._notes.append("the bundle has no tensor_map.json (built before the TFLite -> ONNX tensor map was "
                               "recorded, or the map failed): only the graph outputs are compared; rebuild it")
        else:
            wanted = set(onnx_names) if onnx_names is not None else None
            for onnx_name, rec in (tmap.get("tensors") or {}).items():
                idx = int(rec["index"])
                d = self._by_index.get(idx)
                if d is None or d["name"] != rec["name"] or onnx_name in self.map:
                    continue  # not this file's tensor (the map and the file disagree): not compared
                if wanted is None or onnx_name in wanted:
                    self.map[onnx_name] = idx
            self.fused = dict(tmap.get("fused") or {})
        self.available = set(self.map)

    def notes(self) -> list[str]:
        return list(self._notes)

    def _value(self, idx: int) -> np.ndarray:
        """The tensor's value; a quantized one dequantized (per tensor or per axis)."""
        v = np.array(self.interp.get_tensor(idx))
        d = self._by_index.get(idx) or {}
        if v.dtype.kind not in "iu":
            return v
        qp = d.get("quantization_parameters") or {}
        scales = np.asarray(qp.get("scales", []), dtype=np.float32)
        zps = np.asarray(qp.get("zero_points", []), dtype=np.float32)
        if scales.size == 0 or not np.any(scales):
            return v
        if scales.size > 1:
            shape = [1] * v.ndim
            shape[int(qp.get("quantized_dimension", 0))] = -1
            scales, zps = scales.reshape(shape), zps.reshape(shape)
        return (v.astype(np.float32) - zps) * scales

    def run(self, names, feeds):
        from edgeopt_agent.bundle import to_artifact

        got: dict[str, list[np.ndarray]] = {n: [] for n in names}
        for feed in feeds:
            for name, arr in to_artifact(feed, self._io["inputs"]).items():
                key = name if name in self.inputs else (next(iter(self.inputs)) if len(self.inputs) == 1 else name)
                self.interp.set_tensor(self.inputs[key], arr)
            self.interp.invoke()
            for n in names:
                got[n].append(self._value(self.map[n]))
        return {n: np.stack(v) for n, v in got.items()}

    def artifact_node(self, tensor: str) -> str | None:
        idx = self.map.get(tensor)
        return None if idx is None else self._by_index[idx]["name"]


def artifact_source(bundle: Path, manifest: dict[str, Any], producers: dict[str, str]) -> BundleSource:
    """The artifact's tensor reader for the bundle's runtime; ``producers``: ONNX tensor -> ONNX node name."""
    name = manifest["runtime"]["name"]
    if name == "onnxruntime":
        return OrtBundle(bundle, manifest)
    if name == "openvino":
        return OpenVinoBundle(bundle, manifest, producers)
    if name in ("tflite", "litert"):
        return TfliteBundle(bundle, manifest, list(producers))
    if name == "tensorrt" and str(manifest["runtime"].get("artifact", "")).endswith(".onnx"):
        return OrtBundle(bundle, manifest)
    if name == "tensorrt":
        raise BackendUnavailable("a TensorRT engine is built and run on the device (no GPU and no TensorRT "
                                 "on this host); debug the prepared ONNX with --target cpu for Q/DQ placement")
    if name == "coreml":
        raise BackendUnavailable("Core ML predicts on macOS only (coremltools on Linux: \"Model prediction is "
                                 "only supported on macOS\")")
    raise BackendUnavailable(f"no layer reader for runtime {name!r}")


# --- comparison ---------------------------------------------------------------------------------------

def align(out: np.ndarray, ref: np.ndarray) -> np.ndarray | None:
    """``out`` in ``ref``'s layout: equal shapes as they are; otherwise the axis permutation that gives
    ref's shape (NHWC -> NCHW first), also after dropping unit axes on both sides (a TF conv1d's
    ``[1, 1, T, C]`` is ONNX's ``[1, C, T]``), else a reshape of the same size; None when nothing fits."""
    if out.shape == ref.shape:
        return out
    if out.size != ref.size:
        return None
    if out.ndim == ref.ndim:
        got = _permuted(out, ref.shape)
        if got is not None:
            return got
    sq_out = out.reshape((out.shape[0], *[d for d in out.shape[1:] if d != 1]))
    sq_ref = (ref.shape[0], *[d for d in ref.shape[1:] if d != 1])
    if sq_out.ndim == len(sq_ref):
        got = _permuted(sq_out, sq_ref)
        if got is not None:
            return got.reshape(ref.shape)
    return out.reshape(ref.shape)


def _permuted(out: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``out`` transposed to ``shape`` (axis 0, the sample axis, stays; NHWC->NCHW and N,T,C->N,C,T first)."""
    nd = out.ndim
    first = [(0, nd - 1, *range(1, nd - 1))] if nd >= 3 else []
    first = [(0, 1, nd - 1, *range(2, nd - 1))] + first if nd >= 4 else first
    for perm in first + [(0, *p) for p in itertools.permutations(range(1, nd))]:
        if len(perm) == nd and tuple(out.shape[i] for i in perm) == tuple(shape):
            return np.transpose(out, perm)
    return None


def node_metrics(out: np.ndarray, ref: np.ndarray, precision: str, kind: Any = None,
                 override: dict[str, float] | None = None) -> tuple[dict[str, float], list[str]]:
    """Metrics of one tensor and the bounds it fails: the tensor bounds on an intermediate, the whole
    output check (kind, slices) on a graph output."""
    from edgeopt_agent.compare import compare_outputs, judge, tensor_metrics, tolerance_for

    if kind is not None:
        r = compare_outputs({"t": out}, {"t": ref}, precision, override, {"t": kind})["outputs"]["t"]
        return r["metrics"], r["reasons"]
    tol = {k: v for k, v in tolerance_for(precision, override).items() if k in TENSOR_BOUNDS}
    m = tensor_metrics(out, ref, "regression")
    return m, judge(m, tol)


def compare_tensors(ref: Source, art: Source, names: list[str], feeds: list[dict[str, np.ndarray]],
                    sizes: dict[str, int], max_memory: int,
                    measure: Callable[[str, np.ndarray, np.ndarray], dict[str, Any]],
                    progress: Callable[[str], None] = _say) -> tuple[dict[str, dict[str, Any]], int]:
    """``measure(tensor, artifact value in ref's layout, ref value)`` of every tensor in ``names``, both sides read
    in windows whose stacked values fit ``max_memory`` (``windows``).  A tensor whose artifact value cannot be laid
    out as the reference's gets ``{"metrics": {"shape_mismatch": 1.0}, "reasons": [...]}``.  Returns the records
    and the number of windows.  The one per-layer comparison: ``compare_layers`` (edgeopt debug) and the INT8
    sensitivity pass (``targets.onnxruntime.quant.sensitivity``) both run through it."""
    groups = windows(names, sizes, len(feeds), max_memory)
    out: dict[str, dict[str, Any]] = {}
    for wi, group in enumerate(groups):
        if len(groups) > 1:
            progress(f"window {wi + 1}/{len(groups)}: {len(group)} tensor(s)")
        r = ref.run(group, feeds)
        a = art.run(group, feeds)
        for t in group:
            got = align(a[t], r[t])
            if got is None:
                out[t] = {"metrics": {"shape_mismatch": 1.0}, "reasons": [
                    f"shape {list(a[t].shape[1:])} != ONNX {list(r[t].shape[1:])}"]}
                continue
            if got.dtype != r[t].dtype and r[t].dtype.kind == "f":
                got = got.astype(r[t].dtype)
            out[t] = measure(t, got, r[t])
        del r, a
    return out, len(groups)


@dataclass
class DebugResult:
    bundle: str
    model: str
    target: str
    backend: str
    precision: str
    reference: str
    artifact: str
    samples: int
    bound: dict[str, Any]
    nodes: list[dict[str, Any]] = field(default_factory=list)
    first_jump: dict[str, Any] | None = None
    worst: dict[str, Any] | None = None
    windows: int = 0
    observed: int = 0
    notes: list[str] = field(default_factory=list)
    reduced: dict[str, Any] | None = None
    sample_ids: list[int] | None = None  # the validation samples compared (None: the first ``samples``)
    # the accuracy policy's word on the bundle (``edgeopt.policy.accept.Acceptance.as_dict()`` and how it was
    # reached: ``judged_by``); None: not judged
    policy: dict[str, Any] | None = None
    # when the policy refuses on decisions: the samples whose decision flipped and, for each, the first node
    # where its error jumps (``edgeopt.debug.explain_flips``)
    flips: dict[str, Any] | None = None
    # the share of compute nodes (``COMPUTE_OPS``) whose output debug observes (``coverage``)
    coverage: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return asdict(self)


def compare_layers(bundle: str | Path, model: str | Path, samples: int | None = 4,
                   max_memory: int = DEFAULT_MAX_MEMORY, progress: Callable[[str], None] = _say,
                   source: BundleSource | None = None, sample_ids: list[int] | None = None,
                   per_sample: bool = False) -> DebugResult:
    """Every ONNX node of ``model`` (the bundle's source) against the bundle's artifact, in windows.

    ``sample_ids``: these validation samples (indices into the bundle's validation set) instead of the first
    ``samples``.  ``per_sample``: each node's row also carries ``per_sample``, one entry per compared sample
    (in order): that sample's ``rel_l2``, ``cosine`` and the bound ``reasons`` it fails alone."""
    from edgeopt_agent.bundle import load_manifest, validation_inputs
    from edgeopt_agent.compare import tolerance_for

    bundle = Path(bundle)
    manifest = load_manifest(bundle)
    precision = manifest["precision"]
    override = manifest.get("tolerance_override")
    kinds = manifest.get("output_kinds") or {}
    ref_model = static_reference(model, manifest)
    nodes = nodes_of(ref_model)
    feeds = validation_inputs(bundle, manifest)
    if sample_ids is not None:
        bad = [i for i in sample_ids if not 0 <= i < len(feeds)]
        if bad:
            raise ValueError(f"validation sample {bad[0]} is not in the bundle's {len(feeds)} samples")
        feeds = [feeds[i] for i in sample_ids]
    elif samples:
        feeds = feeds[:samples]
    wanted = [t for n in nodes for t in n.outputs]
    ref = reference_source(ref_model)
    art = source or artifact_source(bundle, manifest, {t: n.name for n in nodes for t in n.outputs})
    observed = [t for t in wanted if t in art.available and t in ref.available]
    if manifest["runtime"]["name"] == "tensorrt":
        # TensorRT's preparation folds a BatchNormalization into the Conv and keeps the Conv's output name, so a
        # tensor whose ONNX consumer vanished may carry the consumer's value: not compared. (ONNX Runtime's own
        # fusions name the fused kernel's output after the LAST node: the tensors that keep a name keep its value.)
        outs_of = {n.name: n.outputs for n in nodes}
        vanished = {n.name for n in nodes if n.outputs and not any(o in art.available for o in n.outputs)}
        consumers: dict[str, list[str]] = {}
        for n in nodes:
            for i in n.inputs:
                consumers.setdefault(i, []).append(n.name)
        observed = [t for t in observed if not any(c in vanished and outs_of[c] for c in consumers.get(t, []))]
    sizes = tensor_bytes(ref_model, observed, feeds[0])
    n_windows = len(windows(observed, sizes, len(feeds), max_memory))
    progress(f"{len(nodes)} nodes, {len(observed)} of {len(wanted)} tensors observable in the artifact, "
             f"{n_windows} window(s), {len(feeds)} sample(s)")
    graph_outputs = {o.name for o in ref_model.graph.output}

    def measure(t: str, out: np.ndarray, want: np.ndarray) -> dict[str, Any]:
        kind = kinds.get(t) if t in graph_outputs else None
        m, reasons = node_metrics(out, want, precision, kind, override)
        rec: dict[str, Any] = {"metrics": m, "reasons": reasons}
        if per_sample:
            rec["per_sample"] = []
            for i in range(len(out)):
                mi, ri = node_metrics(out[i:i + 1], want[i:i + 1], precision, kind, override)
                rec["per_sample"].append({"rel_l2": mi.get("rel_l2"), "cosine": mi.get("cosine"), "err": _err(mi),
                                          "reasons": ri})
        return rec

    if n_windows == 1:
        ref.truncate = False  # one window runs every tensor: cutting the model first would only cost time
    per_tensor, n_windows = compare_tensors(ref, art, observed, feeds, sizes, max_memory, measure,
                                            progress if n_windows > 1 else _say)
    precisions = art.precisions()
    tol = tolerance_for(precision, override)
    res = DebugResult(bundle=str(bundle), model=str(model), target=manifest.get("target", "?"),
                      backend=manifest.get("backend", "?"), precision=precision, reference=ref.label,
                      artifact=art.label, samples=len(feeds),
                      bound={k: v for k, v in tol.items() if k in TENSOR_BOUNDS and v is not None},
                      windows=n_windows, observed=len(observed), notes=list(art.notes()),
                      sample_ids=list(sample_ids) if sample_ids is not None else None)
    err_of: dict[str, float] = {}
    by_output = {t: n for n in nodes for t in n.outputs}
    res_status: dict[str, str] = {}
    for n in nodes:
        row: dict[str, Any] = {"index": n.index, "node": n.name, "op": n.op, "outputs": n.outputs}
        seen = [t for t in n.outputs if t in per_tensor]
        if not n.outputs:
            row["status"] = "no float output"
        elif not seen:
            row["status"] = "not observed"
        else:
            worst = max(seen, key=lambda t: _err(per_tensor[t]["metrics"]))
            m = per_tensor[worst]["metrics"]
            reasons = [r for t in seen for r in per_tensor[t]["reasons"]]
            if per_sample:  # each sample's worst tensor of this node, and every bound it fails alone
                have = [t for t in seen if "per_sample" in per_tensor[t]]
                row["per_sample"] = [
                    {**max((per_tensor[t]["per_sample"][i] for t in have), key=lambda x: x["err"]),
                     "reasons": [r for t in have for r in per_tensor[t]["per_sample"][i]["reasons"]]}
                    for i in range(len(feeds))] if have else []
            row.update({"tensor": worst, "status": "FAIL" if reasons else "ok", "reasons": reasons,
                        "cosine": m.get("cosine"), "rel_l2": m.get("rel_l2"), "max_abs_norm": m.get("max_abs_norm"),
                        **({k: m[k] for k in ("top1", "seq_match", "flip_rate", "non_finite", "exact_match")
                            if k in m})})
            err_of.update({t: _err(per_tensor[t]["metrics"]) for t in seen})
            ins = [err_of[i] for i in n.inputs if i in err_of]
            if ins:
                row["input_rel_l2"] = max(ins)
            node_of = getattr(art, "artifact_node", None)
            if node_of is not None:
                row["artifact_node"] = node_of(worst)
        prec = next((precisions[k] for k in [n.name, *n.outputs] if k in precisions), None)
        if prec:
            row["runtime_precision"] = prec
        if row.get("tensor"):
            row["covers"] = _covers(n, by_output, res_status)
        res_status[n.name] = row.get("status", "")
        res.nodes.append(row)
        if row.get("status") == "FAIL" and res.first_jump is None:
            res.first_jump = row
    scored = [r for r in res.nodes if r.get("rel_l2") is not None]
    if scored:
        res.worst = max(scored, key=lambda r: _err(r))
    res.coverage = coverage(res.nodes, attention_blocks(nodes))
    return res


# an attention block: a matrix product, then scaling / masking / casts, a Softmax, then the matrix product with
# the values (``attention_blocks``)
_PRODUCTS = frozenset({"MatMul", "FusedMatMul", "Einsum", "QLinearMatMul", "MatMulInteger"})
_BEFORE_SOFTMAX = frozenset({"Div", "Mul", "Add", "Sub", "Where", "Cast", "Identity", "DequantizeLinear",
                             "QuantizeLinear"})
_AFTER_SOFTMAX = frozenset({"Cast", "Dropout", "Identity", "DequantizeLinear", "QuantizeLinear"})


def attention_blocks(nodes: list[Node]) -> list[tuple[str, str]]:
    """(scores product, output product) of every attention block of the graph: the matrix product whose result,
    scaled, masked or cast, a Softmax takes, and the matrix product that takes the Softmax's output (Q·Kᵀ and
    ·V).  Issue 41 counts such a block as ONE compute unit: a backend that runs it as one kernel (OpenVINO writes
    ``ScaledDotProductAttention`` into the IR) holds its Q·Kᵀ in no tensor, and the block's output shows the
    error of the block, as a Conv+BatchNormalization kernel's shows the Conv's."""
    by_output = {t: n for n in nodes for t in n.outputs}
    consumers: dict[str, list[Node]] = {}
    for n in nodes:
        for i in n.inputs:
            consumers.setdefault(i, []).append(n)

    def reach(start: list[str], step: Callable[[str], list[Node]], through: frozenset[str], onward: str) -> set[str]:
        """The products reached from ``start`` through ``through`` ops, one ``step`` (producers or consumers) at a
        time, going on through a node's ``onward`` tensors (its inputs or outputs)."""
        found, stack, seen = set(), list(start), set()
        while stack:
            for n in step(stack.pop()):
                if n.name in seen:
                    continue
                seen.add(n.name)
                if n.op in _PRODUCTS:
                    found.add(n.name)
                elif n.op in through:
                    stack.extend(getattr(n, onward))
        return found

    blocks = []
    for s in (n for n in nodes if n.op == "Softmax" and n.inputs and n.outputs):
        # back through the scaling and the mask to the product the Softmax reads; forward through casts and
        # dropout to the product that takes the probabilities
        scores = reach([s.inputs[0]], lambda t: [by_output[t]] if t in by_output else [], _BEFORE_SOFTMAX, "inputs")
        outs = reach(list(s.outputs), lambda t: consumers.get(t, []), _AFTER_SOFTMAX, "outputs")
        if len(scores) == 1 and len(outs) == 1:
            blocks.append((scores.pop(), outs.pop()))
    return blocks


def coverage(rows: list[dict[str, Any]], blocks: list[tuple[str, str]] = ()) -> dict[str, Any]:
    """How many compute nodes (``COMPUTE_OPS`` with a float output) debug observes: at their own output
    (compared), or inside a fused kernel -- not observed themselves but the ONLY compute node a compared node's
    value shows besides nothing else of the kind (in its ``covers``, the compared node itself not a compute
    node): a Conv folded with its BatchNormalization and Relu, the Relu's row shows that Conv's error alone.  A
    compared node whose covers hold several compute nodes (nothing observed between them) observes none of
    them.  ``unobserved`` names up to 12 of the rest.

    ``blocks`` (``attention_blocks``): with them the share is also given in compute *units* (``units``,
    ``units_observable``, ``unit_share``): an attention block is one unit, observed when both its products are,
    or when a compared node's value holds its products and no other compute node (the block run as one
    kernel, compared at its output); every other compute node is a unit of its own, observed as above."""
    compute = [r for r in rows if r["op"] in COMPUTE_OPS and r.get("outputs")]
    ops = {r["node"]: r["op"] for r in rows}
    covered: set[str] = set()
    held: list[set[str]] = []  # per compared node: the compute nodes its value shows
    for r in rows:
        if r.get("status") not in ("ok", "FAIL"):
            continue
        inside = [c for c in r.get("covers") or [] if ops.get(c) in COMPUTE_OPS]
        if len(inside) == 1 and r["op"] not in COMPUTE_OPS:
            covered.add(inside[0])
        held.append(set(inside) | ({r["node"]} if r["op"] in COMPUTE_OPS else set()))
    own = [r["node"] for r in compute if r.get("status") in ("ok", "FAIL")]
    fused = [r["node"] for r in compute if r.get("status") not in ("ok", "FAIL") and r["node"] in covered]
    seen = set(own) | set(fused)
    rest = [r["node"] for r in compute if r["node"] not in seen]
    n = len(compute)
    out = {"compute_nodes": n, "own_output": len(own), "fused": len(fused), "observable": len(own) + len(fused),
           "share": round((len(own) + len(fused)) / n, 4) if n else None, "unobserved": rest[:12]}
    names = {r["node"] for r in compute}
    blocks = [b for b in blocks if set(b) <= names]
    if blocks:
        members = {m for b in blocks for m in b}
        whole = [b for b in blocks if set(b) <= seen or any(h and h <= set(b) for h in held)]
        units = len(names - members) + len(blocks)
        got = len((names - members) & seen) + len(whole)
        out.update({"attention_blocks": len(blocks), "attention_observed": len(whole), "units": units,
                    "units_observable": got, "unit_share": round(got / units, 4) if units else None})
    return out


def _covers(node: Node, by_output: dict[str, Node], status: dict[str, str]) -> list[str]:
    """The ONNX nodes whose values only this node's output shows: the unobserved (fused) producers upstream
    of it, up to observed tensors -- a Conv and its BatchNormalization folded into the Relu's fused kernel."""
    out, stack, seen = [], list(node.inputs), set()
    while stack:
        t = stack.pop()
        p = by_output.get(t)
        if p is None or p.name in seen or status.get(p.name) != "not observed":
            continue
        seen.add(p.name)
        out.append(p.name)
        stack.extend(p.inputs)
    return sorted(out, key=lambda name: next((n.index for n in by_output.values() if n.name == name), 0))


def _err(m: dict[str, Any]) -> float:
    if m.get("non_finite") or m.get("shape_mismatch"):
        return float("inf")
    if "exact_match" in m:
        return 1.0 - float(m["exact_match"])
    if "label_output" in m:  # integer class ids (compare's label kind): the share that differs
        return 1.0 - float(m["top1"])
    v = m.get("rel_l2")
    return float(v) if v is not None and np.isfinite(v) else float("inf")


def save_json(obj: Any, path: Path) -> None:
    from edgeopt.jsonsafe import dumps

    path.write_text(dumps(obj, indent=2, default=str))


