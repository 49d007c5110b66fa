"""Core ML translators, part 4: recurrent layers (LSTM via MIL's lstm, GRU unrolled).

ONNX and Core ML order an LSTM's four gates differently: ONNX stacks W/R/B as [i, o, f, c],
MIL's ``lstm`` wants [i, f, o, c] (coremltools' own PyTorch frontend reorders to the same), and
MIL takes one summed bias where ONNX has input and recurrent biases.  Peepholes are [i, o, f] in
ONNX and [i, f, o] in MIL.  ONNX's state tensors carry a direction axis ([dirs, b, H]); MIL's are
[b, dirs*H].  ``lstm_weights`` does the reordering in numpy (unit-tested against ONNX Runtime).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .ops import Context, Unsupported, op

_ACT = {"Sigmoid": "sigmoid", "Tanh": "tanh", "Relu": "relu"}
_GATES = [0, 2, 1, 3]  # ONNX i, o, f, c  ->  MIL i, f, o, c


def _reorder(w: np.ndarray, order: list[int]) -> np.ndarray:
    """Reorder equal blocks along axis 0."""
    blocks = np.split(w, len(order), axis=0)
    return np.concatenate([blocks[k] for k in order], axis=0)


def lstm_weights(w: np.ndarray, r: np.ndarray, b: np.ndarray | None, p: np.ndarray | None,
                 d: int) -> dict[str, np.ndarray]:
    """MIL weights of direction ``d`` from ONNX's W [dirs,4H,I], R [dirs,4H,H], B [dirs,8H], P [dirs,3H]."""
    h4 = w.shape[1]
    out = {"weight_ih": _reorder(w[d], _GATES).astype(np.float32),
           "weight_hh": _reorder(r[d], _GATES).astype(np.float32)}
    if b is not None:
        out["bias"] = _reorder(b[d][:h4] + b[d][h4:], _GATES).astype(np.float32)
    if p is not None and np.any(p[d]):
        out["peephole"] = _reorder(p[d], [0, 2, 1]).astype(np.float32)
    return out


@op("LSTM")
def lstm(ctx: Context, node: Any) -> list[Any]:
    mb = ctx.mb
    if ctx.attr(node, "layout", 0):
        raise Unsupported("layout=1 (batch-first)")
    if ctx.attr(node, "input_forget", 0):
        raise Unsupported("input_forget=1")
    if ctx.attr(node, "clip") is not None:
        raise Unsupported("clip (Core ML clips a different quantity)")
    if ctx.attr(node, "activation_alpha") or ctx.attr(node, "activation_beta"):
        raise Unsupported("activations with alpha/beta")
    direction = ctx.attr(node, "direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    acts = ctx.attr(node, "activations") or ["Sigmoid", "Tanh", "Tanh"] * dirs
    if any(a not in _ACT for a in acts) or (dirs == 2 and acts[:3] != acts[3:]):
        raise Unsupported(f"activations {acts}")
    s, b, _ = ctx.shape(node)
    w, r = ctx.const(node, 1, "W"), ctx.const(node, 2, "R")
    hidden = r.shape[-1]
    bias = ctx.opt_const(node, 3, what="B")
    if ctx.has(node, 4):
        lens = ctx.const(node, 4, "sequence_lens")
        if np.any(lens != s):
            raise Unsupported("sequence_lens shorter than the sequence (padded batches)")
    peep = ctx.opt_const(node, 7, what="P")

    def state(i: int) -> Any:
        if not ctx.has(node, i):
            return np.zeros((b, dirs * hidden), np.float32)
        v = ctx.x(node, i)  # [dirs, b, H] -> [b, dirs*H]
        if dirs == 1:
            return mb.squeeze(x=v, axes=[0])
        return mb.reshape(x=mb.transpose(x=v, perm=[1, 0, 2]), shape=[b, dirs * hidden])

    kwargs = lstm_weights(w, r, bias, peep, 0)
    if dirs == 2:
        kwargs.update({f"{k}_back": v for k, v in lstm_weights(w, r, bias, peep, 1).items()})
    x = ctx.x(node)
    if direction == "reverse":
        # ONNX's reverse LSTM is a forward one over the time-reversed sequence, its outputs put back
        # in time order; MIL's documentation leaves its own "reverse" output order open, so say it exactly.
        x = mb.reverse(x=x, axes=[0])
    y, y_h, y_c = mb.lstm(x=x, initial_h=state(5), initial_c=state(6),
                          direction="forward" if dirs == 1 else "bidirectional", output_sequence=True,
                          recurrent_activation=_ACT[acts[0]], cell_activation=_ACT[acts[1]],
                          activation=_ACT[acts[2]], **kwargs)
    if direction == "reverse":
        y = mb.reverse(x=y, axes=[0])
    if dirs == 1:
        return [mb.expand_dims(x=y, axes=[1], name=ctx.nm(node, 0)),  # [s, 1, b, H]
                mb.expand_dims(x=y_h, axes=[0], name=ctx.nm(node, 1)),  # [1, b, H]
                mb.expand_dims(x=y_c, axes=[0], name=ctx.nm(node, 2))]
    seq = mb.transpose(x=mb.reshape(x=y, shape=[s, b, 2, hidden]), perm=[0, 2, 1, 3], name=ctx.nm(node, 0))
    last = [mb.transpose(x=mb.reshape(x=v, shape=[b, 2, hidden]), perm=[1, 0, 2], name=ctx.nm(node, i))
            for i, v in ((1, y_h), (2, y_c))]
    return [seq, *last]


@op("GRU")
def gru(ctx: Context, node: Any) -> list[Any]:
    """ONNX GRU, unrolled over its (static) sequence into MIL matmuls and activations.

    MIL's own ``gru`` has one bias per gate and applies the reset gate as PyTorch does, which matches
    neither ONNX's default ``linear_before_reset=0`` nor a non-zero recurrent bias of the candidate
    gate with ``linear_before_reset=1``; the unrolled form is exact for both (gates z, r, h)."""
    mb = ctx.mb
    if ctx.attr(node, "layout", 0):
        raise Unsupported("layout=1 (batch-first)")
    if ctx.attr(node, "clip") is not None:
        raise Unsupported("clip")
    if ctx.attr(node, "activation_alpha") or ctx.attr(node, "activation_beta"):
        raise Unsupported("activations with alpha/beta")
    direction = ctx.attr(node, "direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    acts = ctx.attr(node, "activations") or ["Sigmoid", "Tanh"] * dirs
    if any(a not in _ACT for a in acts):
        raise Unsupported(f"activations {acts}")
    s, b, _ = ctx.shape(node)
    w, r = ctx.const(node, 1, "W"), ctx.const(node, 2, "R")
    hidden = r.shape[-1]
    bias = ctx.opt_const(node, 3, what="B")
    if bias is None:
        bias = np.zeros((dirs, 6 * hidden), np.float32)
    if ctx.has(node, 4):
        lens = ctx.const(node, 4, "sequence_lens")
        if np.any(lens != s):
            raise Unsupported("sequence_lens shorter than the sequence (padded batches)")
    lbr = bool(ctx.attr(node, "linear_before_reset", 0))
    x = ctx.x(node)
    h0 = ctx.x(node, 5) if ctx.has(node, 5) else None
    ys, lasts = [], []
    for d in range(dirs):
        f_act, g_act = _ACT[acts[2 * d]], _ACT[acts[2 * d + 1]]
        act = {"sigmoid": mb.sigmoid, "tanh": mb.tanh, "relu": mb.relu}
        wb, rb = bias[d][:3 * hidden].astype(np.float32), bias[d][3 * hidden:].astype(np.float32)
        xw = mb.add(x=mb.matmul(x=x, y=np.ascontiguousarray(w[d].T, np.float32)), y=wb)  # [s, b, 3H]
        rz, rr, rh = (np.ascontiguousarray(m.T, np.float32) for m in np.split(r[d], 3, axis=0))
        bz, br, bh = np.split(rb, 3)
        h = (mb.squeeze(x=mb.slice_by_index(x=h0, begin=[d, 0, 0], end=[d + 1, b, hidden]), axes=[0])
             if h0 is not None else np.zeros((b, hidden), np.float32))
        steps = range(s - 1, -1, -1) if (direction == "reverse" or d == 1) else range(s)
        out = [None] * s
        for t in steps:
            xt = mb.squeeze(x=mb.slice_by_index(x=xw, begin=[t, 0, 0], end=[t + 1, b, 3 * hidden]), axes=[0])
            xz, xr, xh = mb.split(x=xt, num_splits=3, axis=-1)
            z = act[f_act](x=mb.add(x=xz, y=mb.add(x=mb.matmul(x=h, y=rz), y=bz)))
            rg = act[f_act](x=mb.add(x=xr, y=mb.add(x=mb.matmul(x=h, y=rr), y=br)))
            if lbr:
                hh = mb.mul(x=rg, y=mb.add(x=mb.matmul(x=h, y=rh), y=bh))
            else:
                hh = mb.add(x=mb.matmul(x=mb.mul(x=rg, y=h), y=rh), y=bh)
            cand = act[g_act](x=mb.add(x=xh, y=hh))
            # h = (1 - z) * cand + z * h  ==  cand + z * (h - cand)
            h = mb.add(x=cand, y=mb.mul(x=z, y=mb.sub(x=h, y=cand)))
            out[t] = h
        ys.append(mb.stack(values=out, axis=0))  # [s, b, H]
        lasts.append(h)
    y = mb.stack(values=ys, axis=1, name=ctx.nm(node, 0))  # [s, dirs, b, H]
    y_h = mb.stack(values=lasts, axis=0, name=ctx.nm(node, 1))  # [dirs, b, H]
    return [y, y_h]
