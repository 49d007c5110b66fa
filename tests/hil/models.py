"""Real regressions for the gate's tests and bench, made from a real model with onnx (no fakes).

``slower``: the same model plus a side branch that costs time and adds exactly zero to the first
output (a Conv stack on the input, reduced to a scalar, times a zero constant), so the outputs are
unchanged and only latency regresses.  ``heavier``: the same, with a side branch that holds ``mb`` of
weights (a MatMul on the input's channel means), so memory regresses.  ``perturbed``: the same graph
with noise added to its weights, so latency is unchanged and accuracy regresses.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def slower(src: str | Path, dst: str | Path, channels: int = 16, convs: int = 1, stride: int = 1) -> Path:
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(src))
    g = m.graph
    x = g.input[0].name
    dims = [d.dim_value for d in g.input[0].type.tensor_type.shape.dim]
    cin = dims[1] if len(dims) > 1 and dims[1] else 3
    rng = np.random.default_rng(7)
    prev, c = x, cin
    for i in range(convs):
        w = numpy_helper.from_array((rng.standard_normal((channels, c, 3, 3)) * 0.1).astype(np.float32), f"_slow_w{i}")
        g.initializer.append(w)
        g.node.append(helper.make_node("Conv", [prev, w.name], [f"_slow_c{i}"], name=f"_slow_conv{i}",
                                       pads=[1, 1, 1, 1], strides=[stride, stride]))
        prev, c = f"_slow_c{i}", channels
    g.initializer.append(numpy_helper.from_array(np.zeros((), np.float32), "_slow_zero"))
    g.node.append(helper.make_node("ReduceMean", [prev], ["_slow_mean"], name="_slow_mean", keepdims=0))
    g.node.append(helper.make_node("Mul", ["_slow_mean", "_slow_zero"], ["_slow_nil"], name="_slow_mul"))
    return _add_to_output(m, "_slow", dst)


def _add_to_output(m, tag: str, dst: str | Path) -> Path:
    """Re-point the producer of the first output, add the side branch's zero (``{tag}_nil``) to it, save."""
    import onnx
    from onnx import helper

    g = m.graph
    out = g.output[0].name
    for n in g.node:
        for k, o in enumerate(n.output):
            if o == out:
                n.output[k] = f"{tag}_pre"
    g.node.append(helper.make_node("Add", [f"{tag}_pre", f"{tag}_nil"], [out], name=f"{tag}_add"))
    onnx.checker.check_model(m)
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(dst))
    return Path(dst)


def heavier(src: str | Path, dst: str | Path, mb: float = 64) -> Path:
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(src))
    g = m.graph
    x = g.input[0].name
    dims = [d.dim_value for d in g.input[0].type.tensor_type.shape.dim]
    cin = dims[1] if len(dims) > 1 and dims[1] else 3
    cols = int(mb * 2**20 / 4 / cin)
    w = numpy_helper.from_array(np.random.default_rng(5).standard_normal((cin, cols)).astype(np.float32), "_heavy_w")
    g.initializer.extend([w, numpy_helper.from_array(np.zeros((), np.float32), "_heavy_zero")])
    g.node.extend([helper.make_node("GlobalAveragePool", [x], ["_heavy_gap"], name="_heavy_gap"),
                   helper.make_node("Flatten", ["_heavy_gap"], ["_heavy_flat"], name="_heavy_flat"),
                   helper.make_node("MatMul", ["_heavy_flat", "_heavy_w"], ["_heavy_mm"], name="_heavy_mm"),
                   helper.make_node("ReduceMean", ["_heavy_mm"], ["_heavy_mean"], name="_heavy_mean", keepdims=0),
                   helper.make_node("Mul", ["_heavy_mean", "_heavy_zero"], ["_heavy_nil"], name="_heavy_mul")])
    return _add_to_output(m, "_heavy", dst)


def perturbed(src: str | Path, dst: str | Path, scale: float = 0.5, seed: int = 3) -> Path:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(src))
    rng = np.random.default_rng(seed)
    tensors = list(m.graph.initializer) + [a.t for n in m.graph.node if n.op_type == "Constant"
                                           for a in n.attribute if a.name == "value"]
    for t in tensors:  # weights as initializers or as Constant nodes (Paddle exports use those)
        a = numpy_helper.to_array(t)
        if a.dtype == np.float32 and a.ndim in (2, 4) and a.size > 16:  # kernels, not BN statistics
            noisy = a + rng.standard_normal(a.shape).astype(np.float32) * scale * (float(a.std()) or 1.0)
            t.CopyFrom(numpy_helper.from_array(noisy, t.name))
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(dst))
    return Path(dst)
