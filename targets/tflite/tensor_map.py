"""Which ONNX tensor each TFLite tensor computes: recorded while onnx2tf converts, resolved on the written file.

``edgeopt debug`` on mobile compares intermediates through this map (``MAP_FILE`` in the bundle).  It is
made in three steps, each from the converter's own account rather than from names that happen to survive:

1. **onnx2tf's table** (``record_layers``): while onnx2tf converts, each op module's ``make_node`` is wrapped
   and, for every output of the node, the Keras layer of ``tf_layers_dict[output]['tf_node']`` is read
   (onnx2tf's own dict from ONNX output names to the TF tensors it makes).  TFLite tensors are named after
   those layers' scopes (``model/tf.math.add_5/Add``).
2. **Back to the source model's tensors** (``to_source``): onnx2tf converts the *simplified* copy (onnxsim,
   then ``onnx_fixes``), where a tensor name can carry another value -- onnxsim folds a BatchNormalization
   into its Conv and the Conv's output name then holds the BatchNormalization's value.  Each simplified
   tensor is run in ONNX Runtime beside the source model's tensors (one calibration sample) and mapped to
   the source tensor whose value it has: its own name when the values agree, else the nearest tensor
   downstream of it that does; a tensor whose value the source model does not have is left out.
3. **The written file** (``resolve``): a TFLite op's output tensor holds the value of the first entry of its
   ``;``-joined name (TFLite names a fused kernel after its root op first: ``relu;add;convolution``).  That
   entry's layer gives the ONNX tensor; the layers of the later entries were fused into the kernel and their
   ONNX tensors are "fused" into it (the last ONNX node a fused op covers keeps its value, as on the other
   backends).  A kernel whose root entry is no ONNX node's last op (part of a HardSigmoid fused into the
   preceding Conv) maps to nothing.  INT8 files keep these names (their tensors are dequantized when read).
4. **The written file's values** (``check_values``): the file's converter folds too -- two Adds of constants
   (a BERT's word + position, then + token-type embeddings) become one Add that keeps the first one's name and
   holds the second one's value.  Each mapped tensor is read from the file on one sample and compared with the
   source model's tensor and those downstream of it; a tensor much further from its own ONNX tensor than from
   one downstream (``MOVE_RATIO``, past the precision's noise ``CHECK_FLOOR``) is moved there, its own left out.

The file: ``{"schema": SCHEMA, "tensors": {onnx tensor: {"index", "name", "fused": [...]}}, "fused": {onnx
tensor: onnx tensor whose kernel holds it}, "source": {...counts}}``.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

SCHEMA = "edgeopt/tflite-tensor-map/1"
MAP_FILE = "tensor_map.json"  # in the bundle, beside model.tflite
LAYERS_FILE = "onnx2tf_layers.json"  # in the cached SavedModel: source ONNX tensor -> Keras layer, + order
SAME_VALUE = 1e-4  # rel_l2 under which a simplified tensor holds the source tensor's value (fp32 folding noise)
DOWNSTREAM_DEPTH = 6  # how far downstream of a renamed tensor its value is looked for
# step 4: a mapped tensor is moved when it is off its own ONNX tensor by more than the precision's noise and a
# downstream one is MOVE_RATIO times closer (an INT8 file's tensors carry quantization error: a looser floor)
CHECK_FLOOR = {"fp32": 1e-3, "fp16": 1e-2, "int8": 5e-2}
MOVE_RATIO = 4.0


def bare(name: str) -> str:
    """A tensor name's letters and digits (onnx2tf's sanitizing and ours replace the rest)."""
    return re.sub(r"[^0-9A-Za-z]", "", name)


def onnx2tf_name(name: str) -> str:
    """The name onnx2tf 1.29 gives an ONNX tensor in its graph (``tf_layers_dict``'s key): ``:`` made ``__``, and a
    leading ``/`` made ``wa/`` (with ``output_signaturedefs``, which the build passes): torch's
    ``/_blocks.0/_depthwise_conv/Conv_output_0`` is ``wa/_blocks.0/_depthwise_conv/Conv_output_0`` there."""
    return re.sub("^/", "wa/", name.replace(":", "__"))


# --- 1. onnx2tf's table ------------------------------------------------------------------------------------

@contextlib.contextmanager
def record_layers(names: dict[str, str]) -> Iterator[None]:
    """While onnx2tf converts, record ``names[onnx output] = Keras layer name`` from ``tf_layers_dict`` (keys
    are onnx2tf's sanitized names).  Best effort: an onnx2tf whose internals differ records nothing and
    converts as before."""
    try:
        import onnx2tf.onnx2tf as core
    except Exception:  # noqa: BLE001
        yield
        return
    real = getattr(core, "importlib", None)
    if real is None or not hasattr(real, "import_module"):
        yield
        return
    wrapped: list[tuple[Any, Any]] = []

    def record(graph_node: Any, tf_layers_dict: dict[str, Any]) -> None:
        for o in getattr(graph_node, "outputs", None) or []:
            t = (tf_layers_dict.get(getattr(o, "name", None)) or {}).get("tf_node")
            layer = getattr(getattr(t, "_keras_history", None), "layer", None)
            if getattr(layer, "name", None):
                names[o.name] = layer.name

    class _Shim:
        def __getattr__(self, k: str) -> Any:
            return getattr(importlib, k)

        @staticmethod
        def import_module(name: str, *a: Any, **kw: Any) -> Any:
            mod = importlib.import_module(name, *a, **kw)
            if name.startswith("onnx2tf.ops.") and hasattr(mod, "make_node") \
                    and not getattr(mod.make_node, "_edgeopt", False):
                orig = mod.make_node

                def make_node(*args: Any, orig=orig, **kwargs: Any) -> Any:
                    out = orig(*args, **kwargs)
                    try:
                        record(kwargs.get("graph_node"), kwargs.get("tf_layers_dict") or {})
                    except Exception:  # noqa: BLE001 - the map is best effort, the conversion is not
                        pass
                    return out

                make_node._edgeopt = True  # type: ignore[attr-defined]
                wrapped.append((mod, orig))
                mod.make_node = make_node
            return mod

    core.importlib = _Shim()
    try:
        yield
    finally:
        core.importlib = real
        for mod, orig in wrapped:
            mod.make_node = orig


# --- 2. back to the source model's tensors ---------------------------------------------------------------

def _float_tensors(model: Any) -> list[str]:
    from edgeopt.layerdiff import FLOAT_TYPES, tensor_types

    types = tensor_types(model)
    return [o for n in model.graph.node for o in n.output if o and types.get(o, 0) in FLOAT_TYPES]


def _values(model: Any, names: list[str], feed: dict[str, np.ndarray], budget: int = 512 << 20) -> dict[str, np.ndarray]:
    """``names`` of ``model`` on one feed in ONNX Runtime (optimisations off), in groups that fit ``budget``."""
    import onnxruntime as ort

    from edgeopt.layerdiff import tensor_bytes, tensor_types, windows, with_outputs_bytes

    types = tensor_types(model)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    inputs = {i.name for i in model.graph.input}
    feed = {k: v for k, v in feed.items() if k in inputs}
    out: dict[str, np.ndarray] = {}
    for group in windows(names, tensor_bytes(model, names, feed), 1, budget):
        sess = ort.InferenceSession(with_outputs_bytes(model, group, types), so, providers=["CPUExecutionProvider"])
        for n, v in zip(group, sess.run(group, feed)):
            out[n] = np.asarray(v, dtype=np.float32)
        del sess
    return out


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    den = float(np.linalg.norm(b))
    d = float(np.linalg.norm(a - b))
    return d <= SAME_VALUE * den if den > 0 else d == 0.0


def _consumers(model: Any) -> dict[str, list[str]]:
    """Tensor -> the outputs of the nodes that read it."""
    out: dict[str, list[str]] = {}
    for n in model.graph.node:
        for i in n.input:
            out.setdefault(i, []).extend(o for o in n.output if o)
    return out


def _downstream(start: str, consumers: dict[str, list[str]]) -> list[str]:
    """The tensors up to ``DOWNSTREAM_DEPTH`` nodes downstream of ``start``, nearest first, each once."""
    out, frontier, seen = [], [start], {start}
    for _ in range(DOWNSTREAM_DEPTH):
        nxt = []
        for t in frontier:
            for c in consumers.get(t, []):
                if c not in seen:
                    seen.add(c)
                    nxt.append(c)
        out += nxt
        frontier = nxt
    return out


def to_source(layers: dict[str, str], simplified: Any, source: Any, feed: dict[str, np.ndarray]
              ) -> tuple[dict[str, str], dict[str, int]]:
    """``layers`` (onnx2tf's names in the simplified model -> Keras layer) as source-model tensor -> layer,
    each checked by value (module docstring, step 2).  Returns the map and counts (kept as named, moved to
    another tensor, dropped)."""
    sim_names = _float_tensors(simplified)
    by_bare = {bare(t): t for t in sim_names}
    sim_layer = {t: layers[onnx2tf_name(t)] for t in sim_names if onnx2tf_name(t) in layers}
    named = {onnx2tf_name(t) for t in sim_layer}
    for k, v in layers.items():  # another renaming of onnx2tf's: the same letters and digits
        if k not in named and bare(k) in by_bare and by_bare[bare(k)] not in sim_layer:
            sim_layer[by_bare[bare(k)]] = v
    src_set = set(_float_tensors(source))
    consumers = _consumers(source)
    sim_vals = _values(simplified, list(sim_layer), feed)
    # the source tensors a simplified one may stand for: its own name, then what lies downstream of it
    wanted = {s: [t for t in [s, *_downstream(s, consumers)] if t in src_set] for s in sim_layer}
    need = list(dict.fromkeys(c for cs in wanted.values() for c in cs))
    src_vals = _values(source, need, feed)
    out: dict[str, str] = {}
    counts = {"kept": 0, "moved": 0, "dropped": 0}
    for s, layer in sim_layer.items():
        got = sim_vals.get(s)
        hit = next((c for c in wanted[s] if got is not None and c in src_vals and c not in out
                    and _same(got, src_vals[c])), None)
        if hit is None:
            counts["dropped"] += 1
            continue
        counts["kept" if hit == s else "moved"] += 1
        out[hit] = layer
    return out, counts


def write_layers(path: Path, layers: dict[str, str], source: Any, counts: dict[str, int]) -> None:
    """The source-model map and its tensors' topological order (the SavedModel cache keeps it)."""
    order = [o for n in source.graph.node for o in n.output if o]
    path.write_text(json.dumps({"layers": layers, "order": order, "counts": counts}, indent=0, sort_keys=True))


# --- 3. the written file ---------------------------------------------------------------------------------

def _scope_layer(entry: str, known: set[str]) -> str | None:
    """The Keras layer whose scope an op location names (``model_2/tf.math.add_5/Add`` -> ``tf.math.add_5``)."""
    parts = entry.split(":")[0].split("/")[:-1]
    return next((p for p in parts if p in known), None)


def resolve(tflite_path: str | Path, layers_file: str | Path) -> dict[str, Any]:
    """The map of the file at ``tflite_path`` (module docstring, step 3)."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:  # pragma: no cover - the converter's environment has it
        from tflite_runtime.interpreter import Interpreter
    import warnings

    rec = json.loads(Path(layers_file).read_text())
    layers: dict[str, str] = rec["layers"]
    order = {t: i for i, t in enumerate(rec.get("order") or [])}
    by_layer: dict[str, list[str]] = {}
    for t, layer in layers.items():
        by_layer.setdefault(layer, []).append(t)
    for ts in by_layer.values():
        ts.sort(key=lambda t: order.get(t, -1))
    known = set(by_layer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        interp = Interpreter(model_path=str(tflite_path))
    names = {int(d["index"]): d["name"] for d in interp.get_tensor_details()}
    computed = [int(i) for op in interp._get_ops_details() for i in op["outputs"] if int(i) >= 0]
    root: dict[str, int] = {}  # layer -> the last op output whose root entry is in its scope
    fused_into: dict[str, int] = {}  # layer -> the kernel it was fused into (not its root)
    for idx in computed:
        entries = names.get(idx, "").split(";")
        first = _scope_layer(entries[0], known)
        if first is not None:
            root[first] = idx
        for e in entries[1:]:
            layer = _scope_layer(e, known)
            if layer is not None and layer != first:
                fused_into.setdefault(layer, idx)
    tensors: dict[str, dict[str, Any]] = {}
    taken: dict[int, str] = {}
    for layer, idx in root.items():
        onnx_t = by_layer[layer][-1]  # several ONNX tensors on one layer (an Identity): the last keeps it
        if idx in taken and order.get(taken[idx], -1) > order.get(onnx_t, -1):
            continue
        taken[idx] = onnx_t
    for idx, onnx_t in taken.items():
        tensors[onnx_t] = {"index": idx, "name": names[idx], "fused": []}
    fused: dict[str, str] = {}
    owner = {v["index"]: k for k, v in tensors.items()}
    for layer, idx in fused_into.items():
        if layer in root:
            continue  # the layer's own tensor exists: it is observed there
        host = owner.get(idx)
        for t in by_layer[layer]:
            if t not in tensors and host is not None:
                fused[t] = host
                tensors[host]["fused"].append(t)
    return {"schema": SCHEMA, "tensors": tensors, "fused": fused,
            "source": {"layers": len(layers), "tflite_tensors": len(computed), **(rec.get("counts") or {})}}


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    from edgeopt.layerdiff import align

    got = align(a[None], b[None])
    if got is None:
        return float("inf")
    den = float(np.linalg.norm(b))
    d = float(np.linalg.norm(got[0].astype(np.float64) - b))
    return d / den if den > 0 else (0.0 if d == 0 else float("inf"))


def check_values(bundle_dir: str | Path, manifest: dict[str, Any], source: Any, feed: dict[str, np.ndarray],
                 precision: str) -> dict[str, int]:
    """Step 4 (module docstring) on the bundle's written file and ``MAP_FILE``, rewritten in place: each mapped
    tensor read from the file on ``feed`` (``layerdiff.TfliteBundle``) against the source model's tensors in
    ONNX Runtime.  Returns the counts (checked, moved)."""
    from edgeopt.layerdiff import TfliteBundle

    path = Path(bundle_dir) / MAP_FILE
    tmap = json.loads(path.read_text())
    tensors: dict[str, dict[str, Any]] = tmap.get("tensors") or {}
    outputs = {o["name"] for o in manifest["io"]["outputs"]}
    src_set = set(_float_tensors(source))
    consumers = _consumers(source)
    cands = {t: [c for c in _downstream(t, consumers) if c in src_set and c not in tensors] for t in tensors}
    reader = TfliteBundle(Path(bundle_dir), manifest, None)
    names = [t for t in tensors if t in reader.map and t not in outputs and t in src_set]
    got = reader.run(names, [feed])
    want = _values(source, list(dict.fromkeys([*names, *(c for t in names for c in cands[t])])), feed)
    floor = CHECK_FLOOR.get(precision, CHECK_FLOOR["int8"])
    moved, taken = 0, set(tensors)
    for t in names:
        own = _rel(got[t][0], want[t])
        if own <= floor:
            continue
        errs = [(_rel(got[t][0], want[c]), c) for c in cands[t] if c in want and c not in taken]
        best = min(errs, default=None)
        if best is None or best[0] * MOVE_RATIO > own:
            continue
        rec = tensors.pop(t)
        tensors[best[1]] = rec
        taken.add(best[1])
        for f in rec.get("fused") or []:
            if tmap.get("fused", {}).get(f) == t:
                tmap["fused"][f] = best[1]
        moved += 1
    tmap["source"] = {**(tmap.get("source") or {}), "value_checked": len(names), "value_moved": moved}
    path.write_text(json.dumps(tmap, indent=0, sort_keys=True))
    return {"checked": len(names), "moved": moved}


def write_map(tflite_path: str | Path, layers_file: str | Path, out: str | Path) -> dict[str, Any]:
    """``resolve`` written to ``out`` (the bundle's ``MAP_FILE``); returns the map."""
    m = resolve(tflite_path, layers_file)
    Path(out).write_text(json.dumps(m, indent=0, sort_keys=True))
    return m
