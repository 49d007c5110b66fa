"""A fusion done during translation: decomposed LayerNorm -> Core ML's ``layer_norm``.

Exporters before opset 17 spell LayerNorm as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div (then
Mul by gamma, Add beta).  Left as is, Core ML computes the squares in FP16, which overflow once
|x - mean| passes 256; its ``layer_norm`` op is made for this, and ONNX Runtime fuses the same
pattern for the same reasons.

``find_layer_norms`` matches the pattern on the ONNX graph (same input, same axes, keepdims,
exponent 2, scalar epsilon, intermediates used only inside the pattern) and puts a
``FusedLayerNorm`` where the pattern's last node was.  Shapes are known only during the walk, so
``FusedLayerNorm.translate`` checks the rest there (trailing axes, gamma/beta of the normalized
shape) and returns None when they do not hold: the walk then translates the original nodes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class FusedLayerNorm:
    """One matched decomposed LayerNorm (the ONNX nodes it replaces are kept in ``members``)."""

    x: str
    axes: list[int]
    eps: float
    gamma: str | None
    beta: str | None
    members: list[Any]
    op_type = "LayerNormalization (fused)"

    @property
    def name(self) -> str:
        return f"{self.members[-1].name or self.out} (fused LayerNorm)"

    @property
    def out(self) -> str:
        return self.members[-1].output[0]

    def translate(self, ctx: Any) -> Any:
        """A MIL ``layer_norm``, or None when the shapes do not allow the fusion."""
        shape = ctx.shape_of(self.x)
        if shape is None:
            return None
        rank = len(shape)
        axes = sorted(a % rank for a in self.axes)
        if axes != list(range(axes[0], rank)):
            return None
        norm = tuple(shape[axes[0]:])
        params = []
        for name in (self.gamma, self.beta):
            v = None if name is None else ctx.consts[name]
            if v is not None and not _fits(v, norm):
                return None
            params.append(None if v is None else np.broadcast_to(v.astype(np.float32), norm).copy())
        return ctx.mb.layer_norm(x=ctx.var(self.x), axes=axes, gamma=params[0], beta=params[1], epsilon=self.eps,
                                 name=ctx.nm(self.members[-1]))


def _fits(v: np.ndarray, norm_shape: tuple[int, ...]) -> bool:
    """Whether a per-feature constant broadcasts onto exactly the normalized dims."""
    if v.ndim > len(norm_shape):
        return False
    try:
        return np.broadcast_shapes(v.shape, norm_shape) == norm_shape
    except ValueError:
        return False


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _axes(node: Any, consts: dict[str, np.ndarray]) -> list[int] | None:
    axes = _attr(node, "axes", None)
    if axes is None and len(node.input) > 1 and node.input[1] in consts:
        axes = consts[node.input[1]].reshape(-1).tolist()
    if not axes or not _attr(node, "keepdims", 1):
        return None
    return [int(a) for a in axes]


def _scalar(name: str, consts: dict[str, np.ndarray]) -> float | None:
    v = consts.get(name)
    return float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None


def find_layer_norms(nodes: list[Any], consts: dict[str, np.ndarray], keep: set[str]) -> list[Any]:
    """``nodes`` with each decomposed LayerNorm replaced by a ``FusedLayerNorm`` (``keep``: graph outputs)."""
    producer = {o: n for n in nodes for o in n.output}
    users: dict[str, list[Any]] = defaultdict(list)
    for n in nodes:
        for i in n.input:
            users[i].append(n)

    def prod(name: str, op: str) -> Any:
        n = producer.get(name)
        return n if n is not None and n.op_type == op else None

    def only_user(name: str, op: str) -> Any:
        us = users.get(name, [])
        return us[0] if len(us) == 1 and us[0].op_type == op and name not in keep else None

    fused: dict[int, FusedLayerNorm] = {}
    taken: set[int] = set()
    for div in nodes:
        if div.op_type != "Div" or id(div) in taken:
            continue
        d = div.input[0]
        sub, sqrt = prod(d, "Sub"), prod(div.input[1], "Sqrt")
        add = prod(sqrt.input[0], "Add") if sqrt is not None else None
        if sub is None or add is None:
            continue
        mean2, eps = prod(add.input[0], "ReduceMean"), _scalar(add.input[1], consts)
        if mean2 is None:  # eps + var, the other way round
            mean2, eps = prod(add.input[1], "ReduceMean"), _scalar(add.input[0], consts)
        x, m = sub.input
        mean1, sq = prod(m, "ReduceMean"), producer.get(mean2.input[0]) if mean2 is not None else None
        if eps is None or mean1 is None or sq is None or mean1.input[0] != x:
            continue
        squares = (sq.op_type == "Pow" and sq.input[0] == d and _scalar(sq.input[1], consts) == 2.0) or \
                  (sq.op_type == "Mul" and list(sq.input) == [d, d])
        axes = _axes(mean1, consts)
        if not squares or axes is None or axes != _axes(mean2, consts):
            continue
        if d in keep or {id(u) for u in users.get(d, [])} != {id(sq), id(div)}:
            continue
        inner = ((m, "Sub"), (sq.output[0], "ReduceMean"), (mean2.output[0], "Add"), (add.output[0], "Sqrt"),
                 (sqrt.output[0], "Div"))
        if not all(only_user(t, op) for t, op in inner):
            continue
        members = [mean1, sub, sq, mean2, add, sqrt, div]
        gamma = beta = None
        mul = only_user(div.output[0], "Mul")  # the affine tail, when its factors are constants
        if mul is not None and (g := next((i for i in mul.input if i in consts), None)):
            gamma = g
            members.append(mul)
            bias = only_user(mul.output[0], "Add")
            if bias is not None and (b := next((i for i in bias.input if i in consts), None)):
                beta = b
                members.append(bias)
        fused[id(members[-1])] = FusedLayerNorm(x, axes, eps, gamma, beta, members)
        taken |= {id(n) for n in members}
    # Each fusion sits where its last node was: its inputs (x and constants) all exist by then,
    # and its intermediates had no users outside it.
    return [fused.get(id(n), n) for n in nodes if id(n) not in taken or id(n) in fused]
