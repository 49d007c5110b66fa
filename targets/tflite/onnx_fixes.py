"""Semantics-preserving ONNX rewrites for patterns onnx2tf (1.29) or TFLite's FP16 conversion get wrong.

Applied to the copy of the prepared model onnx2tf converts, *after* the same simplification onnx2tf
would run itself (``simplify``: the onnxsim CLI three times), so that onnxsim cannot undo them
(``fuse_consecutive_slices`` merges single-axis Slices back into one); onnx2tf is then called with
``not_use_onnxsim=True``.  Each rewrite changes nothing on a model without its pattern, and ONNX
Runtime computes the same values before and after.

- ``split_slices``: onnx2tf moves a multi-axis Slice's axes to its NHWC layout but applies the starts
  and ends in ONNX axis order (its reordering branch runs only for an axes tensor of rank > 1, which a
  valid model never has): magika's ``Slice(axes=[0,1,2,3], ends=[.., .., .., 1])`` after a Conv kept
  1 of 512 channels (cosine 0.003).  Axes a Slice does not cut are dropped; the rest become one Slice
  per axis (an Identity where none is left).
- ``explicit_clips``: onnx2tf drops a Clip bound computed at run time (``Clip(x, max(x) - 80)``, a
  log-mel's 80 dB floor: only ``Minimum(x, max)`` is emitted), and TFLite's float16 conversion stores
  the "no bound" sentinel FLT_MAX as 65504, a real bound (openwakeword's mel power ~1e8 was capped at
  48.17 dB: rel_l2 0.23).  Sentinel bounds (|v| >= 3e38) are dropped; a bound that is not a constant
  becomes an explicit Max / Min (ONNX Clip is ``min(max(x, lo), hi)``).
- ``kernel_shapes``: onnx2tf's ConvTranspose sizes its weight transpose by the ``kernel_shape`` attribute
  alone (``get_weights_constant_or_variable(kernel_size=len(kernel_shape))``), so a ConvTranspose with a
  constant weight and no ``kernel_shape`` -- optional in the spec, inferred from the weight -- failed inside
  onnx2tf ("ValueError: axes don't match array": the node tests with the weight as an initializer, a real
  model's form).  The attribute is written from the weight's shape (its spatial dims: the spec's default).
- ``gemm_biases``: a Gemm whose bias C is one constant element (``[1]`` or a scalar, broadcast by the spec) became
  a FULLY_CONNECTED whose one-element bias LiteRT refuses to load (``fully_connected.cc NumElements(bias)``:
  gemm_default_single_elem_vector_bias with C an initializer).  C is written out to the output's width.
- ``pad_values``: onnx2tf drops the ``value`` attribute of a constant Pad before opset 11 (Pad-2: torch's
  ``ConstantPad2d(.., 2.0)`` padded with zeros, rel_l2 0.97; with value 0 it matches). The Pad pads with 0 and an
  Add of a constant that holds the value in the pads and 0 inside writes it back: exact (x + 0 inside, 0 + v out).
- ``high_rank_transposes``: onnx2tf failed inside its own code on swin3d_t's 8-D window partition (a Reshape and
  Transpose to 8 dimensions; TFLite's TRANSPOSE takes at most 6).  A Transpose whose permutation moves adjacent
  axes together is done on merged axes, between two Reshapes (which fold into the Reshapes around it).
- ``empty_concat_inputs``: torch.roll by a whole dimension exports as ``Concat(x, Slice(x, 0:0))``; onnx2tf sized
  the empty slice as the whole axis (swin3d_t's shifted windows over 4 frames: a Reshape of twice the elements
  failed).  Inputs empty along the concat axis are dropped, with the nodes that only made them.
- ``lstm_initial_states``: an LSTM run backwards (``direction`` reverse or bidirectional) without ``initial_h``
  failed inside onnx2tf: its bidirectional branch indexes ``initial_h[1]`` unconditionally ("'NoneType' object is
  not subscriptable") and its reverse one passes an empty initial state (lstm_bidirectional, lstm_reverse with W
  and R initializers: node tests onnx 1.23 added).  The spec's default, zeros of ``[num_directions, batch,
  hidden_size]``, is written in for ``initial_h`` and ``initial_c`` (a static batch only).
- ``flat_softmaxes``: before opset 13 Softmax, LogSoftmax and Hardmax flatten their input to 2-D at ``axis`` and
  normalize over everything after it.  onnx2tf's conversion of the zoo's squeezenet (opset 9: a Softmax(axis=1)
  over ``[1, 1000, 1, 1]`` after the last fire module's pooling) was wrong, rel_l2 62.5 (edgeopt's check refused
  it); a small head of the same ops (Conv, Relu, GlobalAveragePool, Softmax) converts either way, so the trigger
  lies in the layout onnx2tf carries to that tensor through the graph.  Such a node on an input of rank > 2
  becomes Flatten(axis), the op over axis 1 of that 2-D tensor, and a Reshape back to the input's shape -- the
  old semantics spelled out, which leave onnx2tf no axis to move: squeezenet then converts, cos 1.0000.
- ``exclusive_avgpools``: an AveragePool that excludes its padding from the average (``count_include_pad=0``, the
  default) with uneven padding came out of onnx2tf averaging the padded zeros too (the zoo's inception_v1: a 7x7
  pool over 6x6 with pads ``[0, 0, 1, 1]`` gave 36/49 of each mean, rel_l2 0.265 -- ``edgeopt debug`` named it;
  the check refused the file).  It becomes an explicit zero Pad, the pool over the padded tensor, and a Mul by the
  constant window area / real elements per output position: the spec's average, spelled out.
- ``vector_dots``: a MatMul of two 1-D vectors (a dot product, a scalar out) failed inside onnx2tf
  (``tf.linalg.matmul`` needs rank >= 2: matmul_1d_1d, a node test onnx 1.23 added).  It becomes
  ``ReduceSum(Mul(a, b), keepdims=0)``, the same sum.
- ``rnn_biases``: a GRU without its optional bias B failed inside onnx2tf ("'NoneType' object is not
  subscriptable": gru_defaults with W and R initializers; with B it converts).  The spec's default, zeros of
  ``[num_directions, k * hidden_size]`` (k = 6 GRU, 8 LSTM, 2 RNN), is written in.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

TO_THE_END = 2**31 - 1  # an end at least this large means "to the end" (exporters write INT32/INT64_MAX)
NO_BOUND = 3e38  # |bound| >= this: FLT_MAX or inf, the exporters' "no bound"


def simplify(model: Any, work: Path) -> Any:
    """The model as onnx2tf's own first step leaves it: the onnxsim CLI three times in a child process
    (it can crash on a graph), each failure leaving the model as it was."""
    import onnx

    path, out = work / "simplified.onnx", work / "simplified.next.onnx"
    onnx.save(model, str(path))
    for _ in range(3):
        try:
            done = subprocess.run([sys.executable, "-m", "onnxsim", str(path), str(out)], capture_output=True,
                                  timeout=600, check=False)
        except subprocess.TimeoutExpired:  # as a failure: the model as the last pass left it
            break
        if done.returncode != 0 or not out.is_file():
            break
        out.replace(path)  # only a pass that finished replaces the model
    return onnx.load(str(path))


def rewrite(model: Any) -> list[str]:
    """Apply every rewrite to ``model`` in place; one phrase per rewrite that changed something."""
    done = []
    if n := split_slices(model):
        done.append(f"{n} multi-axis Slice(s) as one Slice per axis (onnx2tf applies a multi-axis Slice's "
                    "bounds in ONNX axis order to its NHWC tensor)")
    clips = explicit_clips(model)
    if clips["sentinels"]:
        done.append(f"{clips['sentinels']} Clip bound(s) of +-FLT_MAX ('no bound') dropped (float16 makes them "
                    "65504, a real bound)")
    if n := kernel_shapes(model):
        done.append(f"{n} ConvTranspose(s) given the kernel_shape their weight implies (onnx2tf needs the "
                    "attribute)")
    if n := gemm_biases(model):
        done.append(f"{n} Gemm one-element bias(es) written out to the output's width (LiteRT's FULLY_CONNECTED "
                    "needs one bias per output)")
    if n := pad_values(model):
        done.append(f"{n} constant Pad(s) of opset < 11 padded with 0 and their value added back (onnx2tf drops "
                    "the value attribute)")
    if n := rnn_biases(model):
        done.append(f"{n} GRU/LSTM/RNN given their default zero bias (onnx2tf needs the input)")
    if n := lstm_initial_states(model):
        done.append(f"{n} reverse/bidirectional LSTM(s) given their default zero initial states (onnx2tf needs "
                    "initial_h there)")
    if n := exclusive_avgpools(model):
        done.append(f"{n} AveragePool(s) with uneven padding excluded from the mean as Pad, pool, Mul by the "
                    "window's share of real elements (onnx2tf averaged the padded zeros)")
    if n := flat_softmaxes(model):
        done.append(f"{n} Softmax/LogSoftmax/Hardmax of opset < 13 as Flatten, the op over one axis, Reshape "
                    "(onnx2tf takes their axis as one axis, not 'everything after it')")
    if n := vector_dots(model):
        done.append(f"{n} MatMul(s) of two vectors as ReduceSum(Mul) (onnx2tf's matmul needs rank >= 2)")
    if n := empty_concat_inputs(model):
        done.append(f"{n} empty Concat input(s) dropped (onnx2tf sizes an empty slice as the whole axis)")
    if n := high_rank_transposes(model):
        done.append(f"{n} Transpose(s) of more than {MAX_TRANSPOSE_RANK} dimensions on merged axes (TFLite's "
                    f"TRANSPOSE takes at most {MAX_TRANSPOSE_RANK}; onnx2tf fails on them)")
    if clips["computed"]:
        done.append(f"{clips['computed']} Clip(s) with a bound computed at run time as Max/Min (onnx2tf drops "
                    "such a bound)")
    if done and model.ir_version < 4:  # IR 3 lists every initializer as a graph input too (the zoo's files)
        from onnx import helper

        listed = {i.name for i in model.graph.input}
        model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                                 for t in model.graph.initializer if t.name not in listed)
    return done


def _operands(graph: Any, op_type: str) -> tuple[list[Any], dict[str, np.ndarray]]:
    """The ``op_type`` nodes and those of their non-data inputs that are constants (only these are
    converted to arrays: the weights stay protobuf)."""
    from edgeopt.model import constant_tensors

    nodes = [n for n in graph.node if n.op_type == op_type]
    return nodes, (constant_tensors(graph, {x for n in nodes for x in n.input[1:] if x}) if nodes else {})


def _typed_dims(model: Any) -> dict[str, tuple[int, list[int | None]]]:
    """{tensor: (element type, dims)} of every tensor shape inference knows (dims None where unknown)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - without shapes only "to the end" ends count as uncut
        inferred = model
    g = inferred.graph
    out = {}
    for vi in (*g.value_info, *g.input, *g.output):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            out[vi.name] = (t.elem_type, [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim])
    return out


def _dims(model: Any) -> dict[str, list[int | None]]:
    return {name: dims for name, (_, dims) in _typed_dims(model).items()}


class _Names:
    def __init__(self, graph: Any) -> None:
        self.taken = ({v for n in graph.node for v in (*n.input, *n.output)} | {n.name for n in graph.node}
                      | {i.name for i in graph.initializer} | {i.name for i in graph.input})

    def __call__(self, base: str) -> str:
        name, i = base, 0
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name


def split_slices(model: Any) -> int:
    """Slices with constant starts/ends/axes/steps over several axes, or over none they cut, rewritten
    (see the module doc); returns how many."""
    from onnx import helper, numpy_helper

    g = model.graph
    slices, consts = _operands(g, "Slice")
    if not slices:
        return 0
    dims = _dims(model)
    name = _Names(g)
    nodes, inits, changed = [], [], 0
    for n in g.node:
        ins = list(n.input) + [""] * (5 - len(n.input))
        if n.op_type != "Slice" or len(n.input) < 3 or any(x and x not in consts for x in ins[1:]):
            nodes.append(n)
            continue
        starts, ends = (consts[x].astype(np.int64).ravel() for x in ins[1:3])
        axes = consts[ins[3]].astype(np.int64).ravel() if ins[3] else np.arange(len(starts))
        steps = consts[ins[4]].astype(np.int64).ravel() if ins[4] else np.ones(len(starts), np.int64)
        shape = dims.get(n.input[0]) or []
        cut = []
        for s, e, a, st in zip(starts.tolist(), ends.tolist(), axes.tolist(), steps.tolist()):
            d = shape[a] if -len(shape) <= a < len(shape) else None
            if not (st == 1 and s == 0 and (e >= TO_THE_END or (d is not None and e >= d))):
                cut.append((s, e, a, st))
        if len(cut) == len(starts) == 1:
            nodes.append(n)
            continue
        changed += 1
        src = n.input[0]
        if not cut:
            nodes.append(helper.make_node("Identity", [src], [n.output[0]], name=n.name))
            continue
        for j, values in enumerate(cut):
            args = []
            for what, v in zip(("starts", "ends", "axes", "steps"), values):
                args.append(name(f"{n.name}_{what}{j}"))
                inits.append(numpy_helper.from_array(np.array([v], np.int64), args[-1]))
            last = j == len(cut) - 1
            out = n.output[0] if last else name(f"{n.output[0]}_axis{j}")
            nodes.append(helper.make_node("Slice", [src, *args], [out], name=n.name if last else name(f"{n.name}_axis{j}")))
            src = out
    if changed:
        del g.node[:]
        g.node.extend(nodes)
        g.initializer.extend(inits)
    return changed


def explicit_clips(model: Any) -> dict[str, int]:
    """Clip bounds rewritten (see the module doc): ``{"sentinels": dropped, "computed": as Max/Min}``."""
    from onnx import helper

    g = model.graph
    clips, consts = _operands(g, "Clip")
    nodes, counts = [], {"sentinels": 0, "computed": 0}
    if not clips:
        return counts
    name = _Names(g)

    def sentinel(x: str) -> bool:
        v = consts.get(x)
        return (v is not None and v.size == 1 and np.issubdtype(v.dtype, np.floating)
                and abs(float(v.ravel()[0])) >= NO_BOUND)

    for n in g.node:
        if n.op_type != "Clip" or len(n.input) < 2:  # opset < 11: bounds are attributes, constants
            nodes.append(n)
            continue
        lo, hi = (list(n.input[1:3]) + [""])[:2]
        dropped = [b for b in (lo, hi) if b and sentinel(b)]
        lo, hi = ("" if sentinel(lo) else lo), ("" if sentinel(hi) else hi)
        counts["sentinels"] += len(dropped)
        if not any(b and b not in consts for b in (lo, hi)):
            if dropped:
                ins = [n.input[0], lo, hi]
                while ins[-1] == "":
                    ins.pop()
                n = helper.make_node("Clip", ins, list(n.output), name=n.name)
            nodes.append(n)
            continue
        counts["computed"] += 1
        src = n.input[0]
        steps = [(op, b) for op, b in (("Max", lo), ("Min", hi)) if b]
        for j, (op, b) in enumerate(steps):
            out = n.output[0] if j == len(steps) - 1 else name(f"{n.output[0]}_min")
            nodes.append(helper.make_node(op, [src, b], [out], name=name(f"{n.name}_{op}")))
            src = out
    if counts["sentinels"] or counts["computed"]:
        del g.node[:]
        g.node.extend(nodes)
    return counts


def kernel_shapes(model: Any) -> int:
    """Write ``kernel_shape`` (the weight's spatial dims) on every ConvTranspose whose weight is a constant of
    known shape and that has none; returns how many."""
    from onnx import helper

    todo = [n for n in model.graph.node if n.op_type == "ConvTranspose" and len(n.input) > 1
            and not any(a.name == "kernel_shape" for a in n.attribute)]
    if not todo:
        return 0
    dims = _dims(model)
    consts = {i.name: list(i.dims) for i in model.graph.initializer}
    consts.update({n.output[0]: list(a.t.dims) for n in model.graph.node if n.op_type == "Constant"
                   for a in n.attribute if a.name == "value" and a.t.dims})
    done = 0
    for n in todo:
        w = consts.get(n.input[1]) or dims.get(n.input[1])
        if not w or len(w) < 3 or any(not isinstance(d, int) or d <= 0 for d in w[2:]):
            continue
        n.attribute.append(helper.make_attribute("kernel_shape", [int(d) for d in w[2:]]))
        done += 1
    return done


def gemm_biases(model: Any) -> int:
    """A Gemm's one-element constant bias C as ``[N]`` (the same value per output column); returns how many."""
    from onnx import helper, numpy_helper

    inits = {i.name: i for i in model.graph.initializer}
    users: dict[str, int] = {}
    for n in model.graph.node:
        for x in n.input:
            users[x] = users.get(x, 0) + 1
    done = 0
    for n in model.graph.node:
        if n.op_type != "Gemm" or len(n.input) < 3 or n.input[2] not in inits or n.input[1] not in inits:
            continue
        c = numpy_helper.to_array(inits[n.input[2]])
        b = inits[n.input[1]]
        if c.size != 1 or len(b.dims) != 2:
            continue
        trans_b = next((helper.get_attribute_value(a) for a in n.attribute if a.name == "transB"), 0)
        width = int(b.dims[0] if trans_b else b.dims[1])
        name = n.input[2] if users.get(n.input[2], 0) == 1 else f"{n.input[2]}_x{width}"
        full = numpy_helper.from_array(np.full([width], c.reshape(-1)[0], dtype=c.dtype), name)
        if name == n.input[2]:
            inits[name].CopyFrom(full)
        else:
            model.graph.initializer.append(full)
            n.input[2] = name
        done += 1
    return done


def pad_values(model: Any) -> int:
    """Every constant Pad of an opset < 11 model with a non-zero ``value`` and a static float32 input, as
    ``Add(Pad(x, value=0), C)`` (see the module doc); returns how many."""
    import onnx
    from onnx import helper, numpy_helper

    if next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0) >= 11:
        return 0
    if not any(n.op_type == "Pad" for n in model.graph.node):
        return 0
    known = _typed_dims(model)
    names = _Names(model.graph)
    nodes = []
    for n in list(model.graph.node):
        nodes.append(n)
        if n.op_type != "Pad":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        mode = attrs.get("mode", b"constant")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        value = float(attrs.get("value", 0.0))
        pads = [int(v) for v in (attrs.get("pads") or attrs.get("paddings") or [])]
        elem, shape = known.get(n.input[0], (None, None))
        if (mode != "constant" or value == 0.0 or not pads or not shape or None in shape or min(pads) < 0
                or len(pads) != 2 * len(shape) or elem != onnx.TensorProto.FLOAT):
            continue
        rank = len(shape)
        c = np.full([shape[i] + pads[i] + pads[rank + i] for i in range(rank)], value, np.float32)
        c[tuple(slice(pads[i], pads[i] + shape[i]) for i in range(rank))] = 0.0
        for a in n.attribute:
            if a.name == "value":
                a.f = 0.0
        out = n.output[0]
        n.output[0] = names(f"{out}_zero_padded")
        const = numpy_helper.from_array(c, names(f"{out}_pad_value"))
        model.graph.initializer.append(const)
        nodes.append(helper.make_node("Add", [n.output[0], const.name], [out], name=names(f"{n.name or out}_value")))
    done = len(nodes) - len(model.graph.node)
    if done:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return done


def rnn_biases(model: Any) -> int:
    """Write the spec's default zero bias B into every GRU/LSTM/RNN that has none; returns how many."""
    from onnx import helper, numpy_helper

    gates = {"GRU": 6, "LSTM": 8, "RNN": 2}
    names = _Names(model.graph)
    done = 0
    for n in model.graph.node:
        if n.op_type not in gates or (len(n.input) > 3 and n.input[3]):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        hidden = attrs.get("hidden_size")
        if not hidden:
            continue
        direction = attrs.get("direction", b"forward")
        dirs = 2 if (direction.decode() if isinstance(direction, bytes) else direction) == "bidirectional" else 1
        name = names(f"{n.name or n.op_type}_default_B")
        model.graph.initializer.append(numpy_helper.from_array(
            np.zeros([dirs, gates[n.op_type] * int(hidden)], np.float32), name))
        ins = list(n.input) + [""] * max(0, 3 - len(n.input))
        ins = ins[:3] + [name] + ins[4:]
        del n.input[:]
        n.input.extend(ins)
        done += 1
    return done


MAX_TRANSPOSE_RANK = 6  # TFLite's TRANSPOSE takes at most 6 dimensions


def _coalesced(shape: list[int], perm: list[int]) -> tuple[list[int], list[int]]:
    """The same permutation on fewer axes: unit axes dropped, and input axes that stay next to each other and in
    order in the output merged into one.  Returns (input shape, perm) of the smaller transpose."""
    keep = [a for a in range(len(shape)) if shape[a] != 1]
    pos = {a: i for i, a in enumerate(keep)}
    groups: list[list[int]] = []  # in output order
    for a in (a for a in perm if shape[a] != 1):
        if groups and pos[groups[-1][-1]] + 1 == pos[a]:
            groups[-1].append(a)
        else:
            groups.append([a])
    by_input = sorted(range(len(groups)), key=lambda g: pos[groups[g][0]])
    sizes = [int(np.prod([shape[a] for a in groups[g]])) for g in by_input]
    return sizes, [by_input.index(g) for g in range(len(groups))]


def high_rank_transposes(model: Any) -> int:
    """Every Transpose of more than ``MAX_TRANSPOSE_RANK`` dimensions with a static input whose permutation
    holds on at most that many (``_coalesced``), as Reshape -> the smaller Transpose -> Reshape; a Reshape
    that only fed it, or one that only takes its output, absorbs the new Reshape next to it.  onnx2tf failed
    inside its own code on swin3d_t's 8-D window partition (``x.view(B, D/wd, wd, H/wh, wh, W/ww, ww, C)
    .permute(0, 1, 3, 5, 2, 4, 6, 7)``, 6-D once B and D/wd, ww and C are merged); returns how many."""
    from onnx import helper, numpy_helper

    from edgeopt.model import constant_tensors

    if not any(n.op_type == "Transpose" for n in model.graph.node):
        return 0
    g = model.graph
    known = _dims(model)
    consumers: dict[str, list[Any]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    producer = {o: n for n in g.node for o in n.output}
    outputs = {o.name for o in g.output}
    names = _Names(g)
    extra: dict[int, list[Any]] = {}  # id(node) -> the nodes that replace it
    for t in g.node:
        if t.op_type != "Transpose":
            continue
        shape = known.get(t.input[0])
        if not shape or len(shape) <= MAX_TRANSPOSE_RANK or None in shape:
            continue
        perm = next((list(a.ints) for a in t.attribute if a.name == "perm"), list(range(len(shape)))[::-1])
        sizes, small = _coalesced(shape, perm)
        if len(sizes) > MAX_TRANSPOSE_RANK:
            continue
        src = t.input[0]
        before = producer.get(src)
        if (before is not None and before.op_type == "Reshape" and len(consumers.get(src, [])) == 1
                and src not in outputs):
            src = before.input[0]  # Reshape(Reshape(x)) is one Reshape: the first is left unused
        in_shape = numpy_helper.from_array(np.array(sizes, np.int64), names(f"{t.name}_merged_shape"))
        merged, moved = names(f"{t.input[0]}_merged"), names(f"{t.output[0]}_merged")
        new = [helper.make_node("Reshape", [src, in_shape.name], [merged], name=names(f"{t.name}_merge")),
               helper.make_node("Transpose", [merged], [moved], name=t.name, perm=small)]
        g.initializer.append(in_shape)
        after = consumers.get(t.output[0], [])
        nxt = after[0] if len(after) == 1 and after[0].op_type == "Reshape" and len(after[0].input) > 1 else None
        target = constant_tensors(g, {nxt.input[1]}).get(nxt.input[1]) if nxt is not None else None
        allowzero = next((a.i for a in nxt.attribute if a.name == "allowzero"), 0) if nxt is not None else 0
        if t.output[0] not in outputs and target is not None and (allowzero or 0 not in target.tolist()):
            nxt.input[0] = moved  # the next Reshape's target needs nothing of the high-rank shape
        else:
            out = numpy_helper.from_array(np.array([shape[a] for a in perm], np.int64), names(f"{t.name}_out_shape"))
            g.initializer.append(out)
            new.append(helper.make_node("Reshape", [moved, out.name], [t.output[0]], name=names(f"{t.name}_split")))
        extra[id(t)] = new
    if extra:
        nodes = [m for n in g.node for m in extra.get(id(n), [n])]
        del g.node[:]
        g.node.extend(nodes)
        _drop_unused(g)
    return len(extra)


def _drop_unused(g: Any) -> None:
    """Nodes none of whose outputs anything uses (repeatedly: what only fed them goes too), then the initializers
    and value_info entries of tensors no node or graph output names any more (an initializer listed as a graph
    input stays: it would become a required input)."""
    outputs = {o.name for o in g.output}
    while True:
        used = {i for m in g.node for i in m.input} | outputs
        dead = [m for m in g.node if m.output and not any(o in used for o in m.output)]
        if not dead:
            break
        for m in dead:
            g.node.remove(m)
    live = used | {o for m in g.node for o in m.output} | {i.name for i in g.input}
    for field in (g.initializer, g.value_info):
        keep = [x for x in field if x.name in live]
        del field[:]
        field.extend(keep)


def empty_concat_inputs(model: Any) -> int:
    """Every Concat input that is empty along the concat axis (a static 0 there) dropped, and the nodes that only
    fed it; a Concat left with one input becomes an Identity.  torch.roll by a whole dimension (swin3d_t's
    shifted windows over 4 frames) exports as Concat(x, Slice(x, 0:0)): onnx2tf sized the empty slice as the
    whole axis and the next Reshape failed ('Cannot reshape a tensor with 602112 elements to ... 301056');
    returns how many inputs were dropped."""
    if not any(n.op_type == "Concat" for n in model.graph.node):
        return 0
    g = model.graph
    known = _dims(model)
    done = 0
    for n in g.node:
        if n.op_type != "Concat":
            continue
        axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
        empty = [i for i in n.input if (d := known.get(i)) and -len(d) <= axis < len(d) and d[axis] == 0
                 and all(x is not None for x in d)]
        if not empty or len(empty) == len(n.input):
            continue
        kept = [i for i in n.input if i not in empty]
        del n.input[:]
        n.input.extend(kept)
        done += len(empty)
        if len(kept) == 1:
            n.op_type = "Identity"
            del n.attribute[:]
    if done:  # the nodes that only made the dropped inputs
        _drop_unused(g)
    return done


def vector_dots(model: Any) -> int:
    """Every MatMul whose two inputs are 1-D (shape inference says so) as ``ReduceSum(Mul(a, b), keepdims=0)``;
    returns how many."""
    from onnx import helper

    g = model.graph
    weights = {i.name: list(i.dims) for i in g.initializer}
    # a MatMul with a weight of rank >= 2 (every Linear layer) is no dot product: no shape inference for those
    if not any(n.op_type == "MatMul" and not any(len(weights.get(x, [0])) >= 2 for x in n.input[:2])
               for n in g.node):
        return 0
    known = {**_dims(model), **weights}  # a weight vector: an initializer
    names = _Names(g)
    nodes, done = [], 0
    for n in g.node:
        if n.op_type == "MatMul" and all(len(known.get(x) or []) == 1 for x in n.input[:2]):
            prod = names(f"{n.output[0]}_products")
            nodes += [helper.make_node("Mul", list(n.input[:2]), [prod], name=names(f"{n.name or 'matmul'}_mul")),
                      helper.make_node("ReduceSum", [prod], [n.output[0]], keepdims=0, name=n.name)]
            done += 1
        else:
            nodes.append(n)
    if done:
        del g.node[:]
        g.node.extend(nodes)
    return done


def lstm_initial_states(model: Any) -> int:
    """Write the spec's zero ``initial_h`` (and ``initial_c`` where missing too) into every LSTM that runs
    backwards, has no ``initial_h`` and a static batch; returns how many."""
    from onnx import helper, numpy_helper

    lstms = [n for n in model.graph.node if n.op_type == "LSTM" and not (len(n.input) > 5 and n.input[5])]
    if not lstms:
        return 0
    g = model.graph
    known = {**_dims(model), **{i.name: list(i.dims) for i in g.initializer}}
    names = _Names(g)
    done = 0
    for n in lstms:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        direction = attrs.get("direction", b"forward")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        x = known.get(n.input[0]) or []
        batch = x[1 if attrs.get("layout", 0) == 0 else 0] if len(x) == 3 else None
        if direction == "forward" or not batch or not attrs.get("hidden_size"):
            continue
        zeros = np.zeros([2 if direction == "bidirectional" else 1, batch, int(attrs["hidden_size"])], np.float32)
        ins = list(n.input) + [""] * max(0, 7 - len(n.input))
        for k, what in ((5, "initial_h"), (6, "initial_c")):
            if not ins[k]:
                ins[k] = names(f"{n.name or 'lstm'}_default_{what}")
                g.initializer.append(numpy_helper.from_array(zeros, ins[k]))
        del n.input[:]
        n.input.extend(ins)
        done += 1
    return done


def flat_softmaxes(model: Any) -> int:
    """Every Softmax/LogSoftmax/Hardmax of a model below opset 13 whose input has rank > 2 (shape inference says
    so), as ``Reshape(op(Flatten(x, axis), axis=1), Shape(x))``; returns how many."""
    from onnx import helper

    ops = ("Softmax", "LogSoftmax", "Hardmax")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset >= 13 or not any(n.op_type in ops for n in model.graph.node):
        return 0
    g = model.graph
    known = _dims(model)
    names = _Names(g)
    nodes, done = [], 0
    for n in g.node:
        rank = len(known.get(n.input[0]) or [])
        if n.op_type not in ops or rank <= 2:
            nodes.append(n)
            continue
        axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
        base = n.name or n.op_type.lower()
        flat, out2d, shape = (names(f"{n.output[0]}_{x}") for x in ("2d_in", "2d", "shape"))
        nodes += [helper.make_node("Flatten", [n.input[0]], [flat], axis=axis % rank, name=names(f"{base}_flatten")),
                  helper.make_node(n.op_type, [flat], [out2d], axis=1, name=names(f"{base}_2d")),
                  helper.make_node("Shape", [n.input[0]], [shape], name=names(f"{base}_shape")),
                  helper.make_node("Reshape", [out2d, shape], [n.output[0]], name=n.name)]
        done += 1
    if done:
        del g.node[:]
        g.node.extend(nodes)
    return done


def _real_share(size: list[int], kernel: list[int], strides: list[int], pads: list[int], ceil: bool) -> np.ndarray:
    """Per output position of a pool over ``size`` (spatial dims), window area / elements of the window inside the
    unpadded input, shaped ``[1, 1, *out]``."""
    nd = len(size)
    axes = []
    for i in range(nd):
        span = size[i] + pads[i] + pads[nd + i] - kernel[i]
        out = (-(-span // strides[i]) if ceil else span // strides[i]) + 1
        starts = np.arange(out) * strides[i] - pads[i]
        inside = np.minimum(starts + kernel[i], size[i]) - np.maximum(starts, 0)
        axes.append(np.maximum(inside, 0))
    count = axes[0].astype(np.float64)
    for a in axes[1:]:
        count = np.multiply.outer(count, a)
    share = np.prod(kernel) / np.maximum(count, 1)
    return share.reshape([1, 1, *share.shape]).astype(np.float32)


def exclusive_avgpools(model: Any) -> int:
    """Every AveragePool with ``count_include_pad=0``, explicit uneven ``pads``, no dilation and a static input, as
    ``Mul(AveragePool(Pad(x)), share)`` (see the module doc); returns how many."""
    from onnx import helper, numpy_helper

    def uneven_exclusive(n) -> bool:  # read off the attributes before any shape inference
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        pads = list(a.get("pads", []))
        return not a.get("count_include_pad", 0) and bool(pads) and pads[:len(pads) // 2] != pads[len(pads) // 2:]

    pools = [n for n in model.graph.node if n.op_type == "AveragePool" and uneven_exclusive(n)]
    if not pools:
        return 0
    g = model.graph
    known = _dims(model)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    names = _Names(g)
    extra: dict[int, list[Any]] = {}
    for n in pools:
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        shape = known.get(n.input[0]) or []
        k = list(a.get("kernel_shape", []))
        nd = len(k)
        pads = list(a.get("pads", [0] * 2 * nd))
        if (a.get("count_include_pad", 0) or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"", "")
                or any(d != 1 for d in a.get("dilations", [])) or len(shape) != nd + 2
                or any(d is None for d in shape[2:]) or pads[:nd] == pads[nd:]):
            continue
        strides = list(a.get("strides", [1] * nd))
        share = _real_share(shape[2:], k, strides, pads, bool(a.get("ceil_mode", 0)))
        base = n.name or "avgpool"
        padded, pooled = names(f"{n.output[0]}_padded"), names(f"{n.output[0]}_pooled")
        onnx_pads = [0, 0, *pads[:nd], 0, 0, *pads[nd:]]
        if opset >= 11:
            pads_name = names(f"{base}_pads")
            g.initializer.append(numpy_helper.from_array(np.array(onnx_pads, np.int64), pads_name))
            pad = helper.make_node("Pad", [n.input[0], pads_name], [padded], name=names(f"{base}_pad"))
        else:
            pad = helper.make_node("Pad", [n.input[0]], [padded], pads=onnx_pads, name=names(f"{base}_pad"))
        share_name = names(f"{base}_real_share")
        g.initializer.append(numpy_helper.from_array(share, share_name))
        pool = helper.make_node("AveragePool", [padded], [pooled], name=names(f"{base}_padded_pool"), kernel_shape=k,
                                strides=strides, **({"ceil_mode": 1} if a.get("ceil_mode", 0) else {}))
        extra[id(n)] = [pad, pool, helper.make_node("Mul", [pooled, share_name], [n.output[0]], name=n.name)]
    if extra:
        nodes = [m for n in g.node for m in extra.get(id(n), [n])]
        del g.node[:]
        g.node.extend(nodes)
    return len(extra)
