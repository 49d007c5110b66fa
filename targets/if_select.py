"""An ONNX ``If`` rewritten as both branches and a ``Where``: for converters that cannot take If.

``If(c) then A else B`` equals ``Where(c, A, B)`` when both branches are plain dataflow (no nested
subgraphs, tensor outputs) whose outputs declare the same shape (numbers or named sizes) and type:
computing the branch not taken changes no value, only costs its compute.  onnx2tf fails inside its
own code on an If whose branch reads an outer initializer, and Core ML's translator has no If;
openwakeword's wake-word models gate a small verifier with one (``If(score >= thr)``: the verifier,
else the score).  So ``mobile`` and ``apple`` convert the rewritten copy, and the bundle's notes say
which Ifs were rewritten; ONNX Runtime, OpenVINO and TensorRT keep the If (it skips the branch not
taken, which may be large).
"""

from __future__ import annotations

from typing import Any

SUBGRAPH_ATTR_TYPES = (5, 10)  # AttributeProto.GRAPH, GRAPHS


def _branches(node: Any) -> tuple[Any, Any] | None:
    got = {a.name: a.g for a in node.attribute if a.name in ("then_branch", "else_branch")}
    return (got["then_branch"], got["else_branch"]) if len(got) == 2 else None


def _shape(value_info: Any) -> tuple[int, tuple[int | str, ...]] | None:
    """(elem type, dims) of a tensor output whose every dim is a number or a named size, else None."""
    t = value_info.type
    if not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.tensor_type.shape.dim]
    if any(d == "" for d in dims):  # an unnamed unknown size
        return None
    return t.tensor_type.elem_type, tuple(dims)


def why_not(node: Any) -> str | None:
    """None when ``node`` (an If) can be rewritten as a Where, else why not."""
    branches = _branches(node)
    if branches is None:
        return "no then/else branch"
    then_g, else_g = branches
    for g in branches:
        if any(a.type in SUBGRAPH_ATTR_TYPES for n in g.node for a in n.attribute):
            return "a branch holds a nested subgraph"
    if len(then_g.output) != len(else_g.output) or len(then_g.output) != len(node.output):
        return "the branches return different numbers of outputs"
    for a, b in zip(then_g.output, else_g.output):
        sa, sb = _shape(a), _shape(b)
        if sa is None or sb is None:
            return f"branch output {a.name!r}/{b.name!r} has no declared tensor shape"
        if sa != sb:
            return f"the branches' outputs {a.name!r} {sa[1]} and {b.name!r} {sb[1]} differ in shape or type"
    return None


def selectable_ifs(graph: Any) -> list[str]:
    """Names of the top-level If nodes that ``rewrite`` turns into a Where."""
    return [n.name for n in graph.node if n.op_type == "If" and why_not(n) is None]


def unselectable_ifs(graph: Any) -> list[str]:
    """``name: why`` for each top-level If that ``rewrite`` leaves as it is."""
    return [f"{n.name or 'If'}: {why}" for n in graph.node if n.op_type == "If" and (why := why_not(n))]


def _inline(branch: Any, prefix: str, main: Any) -> list[str]:
    """Append ``branch``'s nodes and initializers to ``main`` with its own tensor names prefixed
    (names from the outer scope are kept); return the branch outputs' new names."""
    own = {i.name for i in branch.initializer} | {o for n in branch.node for o in n.output if o}
    rename = {name: f"{prefix}{name}" for name in own}
    for init in branch.initializer:
        copy = main.initializer.add()
        copy.CopyFrom(init)
        copy.name = rename[init.name]
    for i, n in enumerate(branch.node):
        copy = main.node.add()
        copy.CopyFrom(n)
        copy.name = f"{prefix}{n.name or f'{n.op_type}_{i}'}"
        copy.input[:] = [rename.get(x, x) for x in n.input]
        copy.output[:] = [rename.get(x, x) for x in n.output]
    return [rename.get(o.name, o.name) for o in branch.output]


def _ranks(model: Any) -> dict[str, int]:
    """Tensor name -> rank where shape inference knows it (empty when it fails)."""
    import onnx

    try:
        g = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - unknown ranks: the conditions get their Squeeze
        return {}
    return {v.name: len(v.type.tensor_type.shape.dim) for v in [*g.input, *g.value_info, *g.output]
            if v.type.HasField("tensor_type") and v.type.tensor_type.HasField("shape")}


def rewrite(model: Any) -> tuple[Any, list[str]]:
    """A copy of ``model`` with every selectable top-level If replaced by its branches and a Where;
    the names of the Ifs rewritten (the model itself is returned unchanged when there are none)."""
    import onnx
    from onnx import helper

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    names = selectable_ifs(model.graph) if opset >= 9 else []  # Where: opset 9
    if not names:
        return model, []
    ranks = _ranks(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    old_nodes = list(out.graph.node)
    del out.graph.node[:]
    for node in old_nodes:
        if node.op_type != "If" or node.name not in names:
            out.graph.node.add().CopyFrom(node)
            continue
        then_g, else_g = _branches(node)
        tag = node.name or node.output[0]
        then_outs = _inline(then_g, f"{tag}/then/", out.graph)
        else_outs = _inline(else_g, f"{tag}/else/", out.graph)
        cond = node.input[0]
        if ranks.get(cond) != 0:  # any one-element condition -> a scalar (Squeeze, no axes), which Where broadcasts
            cond = f"{tag}/cond_scalar"
            out.graph.node.append(helper.make_node("Squeeze", [node.input[0]], [cond], name=f"{tag}/cond"))
        for i, (t, e, o) in enumerate(zip(then_outs, else_outs, node.output)):
            out.graph.node.append(helper.make_node("Where", [cond, t, e], [o], name=f"{tag}/select{i}"))
    return out, names
