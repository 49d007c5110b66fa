"""How far a CNN's artifacts are from this CPU's limit: the model's MACs and bytes against peaks measured here.

    .venv/bin/python bench/roofline.py MODEL.onnx [INT8.onnx]      # prints the counts and the peaks

Used by ``bench/bench_int8_cpu.py`` (the block under EfficientNet-Lite0's table), one implementation:

- **Work**: multiply-accumulates of every Conv/Gemm/MatMul (``edgeopt.model.flops_for`` / 2), with the
  input at its static shape; split into depthwise convolutions (a group per channel: no reuse, a GEMM
  kernel's peak is out of their reach) and the rest.
- **Bytes**: the weights once (FP32: 4 bytes per value; INT8: the quantized model's integer initializers at
  1 byte, its float ones at theirs) -- the least a cold run must read -- and every activation written once and
  read once at its precision (float 4 bytes, INT8 1 byte), the traffic if nothing stayed in cache.
- **Peaks, measured on the cores used** (not datasheet figures): ONNX Runtime's MLAS GEMM on a 1024^3
  product -- FP32 ``MatMul`` and INT8 ``MatMulInteger`` (u8 x s8, the VNNI kernel on a CPU that has it) -- at
  1 thread and at 2, best of 5; memory bandwidth as numpy copies of 256 MB (read + write counted), one
  process and one per core at once.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

GEMM_N = 1024
COPY_MB = 256


def _matmul_model(integer: bool) -> bytes:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    n = GEMM_N
    if integer:
        b = numpy_helper.from_array(rng.integers(-127, 128, (n, n), dtype=np.int8), "B")
        node = helper.make_node("MatMulInteger", ["A", "B"], ["Y"])
        a_type, y_type = TensorProto.UINT8, TensorProto.INT32
    else:
        b = numpy_helper.from_array(rng.standard_normal((n, n)).astype(np.float32), "B")
        node = helper.make_node("MatMul", ["A", "B"], ["Y"])
        a_type, y_type = TensorProto.FLOAT, TensorProto.FLOAT
    g = helper.make_graph([node], "peak", [helper.make_tensor_value_info("A", a_type, [n, n])],
                          [helper.make_tensor_value_info("Y", y_type, [n, n])], [b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


def gemm_peak(integer: bool, threads: int, repeats: int = 5) -> float:
    """GMAC/s of ONNX Runtime's GEMM on a 1024^3 product (best of ``repeats`` timed runs after a warm-up)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    s = ort.InferenceSession(_matmul_model(integer), so, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    a = (rng.integers(0, 256, (GEMM_N, GEMM_N), dtype=np.uint8) if integer
         else rng.standard_normal((GEMM_N, GEMM_N)).astype(np.float32))
    s.run(None, {"A": a})
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        s.run(None, {"A": a})
        best = min(best, time.perf_counter() - t0)
    return GEMM_N ** 3 / best / 1e9


def _copy_gbs(mb: int = COPY_MB) -> float:
    n = mb * 2**20 // 8
    src = np.ones(n, np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best / 1e9  # read + write


def memory_bandwidth(processes: int, mb: int = COPY_MB) -> float:
    """GB/s of copies of ``mb`` MB (read + write), ``processes`` at once (each its own arrays), summed:
    256 MB is DRAM's rate, 4 MB (two arrays in the 32 MB L3, beyond the 2 MB L2) the L3's."""
    if processes <= 1:
        return _copy_gbs(mb)
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(processes) as pool:
        return float(sum(pool.map(_copy_gbs, [mb] * processes)))


def peaks(threads: tuple[int, ...] = (1, 2)) -> dict[str, dict[int, float]]:
    """{'int8_gmacs'|'fp32_gmacs'|'mem_gbs': {threads: value}} measured now."""
    out: dict[str, dict[int, float]] = {"int8_gmacs": {}, "fp32_gmacs": {}, "mem_gbs": {}, "l3_gbs": {}}
    for t in threads:
        out["int8_gmacs"][t] = gemm_peak(True, t)
        out["fp32_gmacs"][t] = gemm_peak(False, t)
        out["mem_gbs"][t] = memory_bandwidth(t)
        out["l3_gbs"][t] = memory_bandwidth(t, 4)
    return out


def _run_shapes(m, shapes: dict[str, list[int]]) -> dict[str, list[int]]:
    """Every node output's shape, by running the model once on zeros at ``shapes`` with all of them exposed."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, shape_inference

    types = {vi.name: vi.type.tensor_type.elem_type for vi in shape_inference.infer_shapes(m).graph.value_info}
    m2 = type(m)()
    m2.CopyFrom(m)
    del m2.graph.value_info[:]
    have = {o.name for o in m2.graph.output}
    wanted = [o for n in m2.graph.node for o in n.output if o]
    for t in wanted:
        if t not in have:
            m2.graph.output.append(helper.make_tensor_value_info(t, types.get(t) or TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    s = ort.InferenceSession(m2.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.zeros(shapes[i.name], np.float32) for i in s.get_inputs()}
    return {t: list(np.shape(v)) for t, v in zip(wanted, s.run(wanted, feeds))}


def model_counts(model: str | Path, shapes: dict[str, list[int]], int8_model: str | Path | None = None) -> dict:
    """MACs (all, depthwise), weight bytes (FP32 model; the INT8 model's when given) and activation bytes
    (each intermediate tensor written and read once: float 4 bytes, in the INT8 model 1 byte)."""
    import onnx
    from onnx import numpy_helper

    from edgeopt.model import flops_for

    macs = (flops_for(model, shapes) or 0) // 2
    m = onnx.load(str(model))
    dims = _run_shapes(m, shapes)  # every tensor's shape from one ONNX Runtime run (shape inference leaves
    # TF-style "same" padding, computed at run time, unknown)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    dw = 0
    for node in m.graph.node:
        if node.op_type != "Conv" or node.input[1] not in inits or node.output[0] not in dims:
            continue
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        w = inits[node.input[1]]
        if group > 1 and w.shape[1] == 1:
            dw += int(np.prod(dims[node.output[0]])) * int(np.prod(w.shape[1:]))
    act_values = sum(int(np.prod(d)) for n, d in dims.items() if n not in inits and all(v > 0 for v in d))
    out = {"macs": macs, "depthwise_macs": dw, "weights_fp32_bytes": int(sum(a.size * 4 for a in inits.values())),
           "activations_fp32_bytes": 2 * 4 * act_values}
    if int8_model:
        q = onnx.load(str(int8_model))
        out["weights_int8_bytes"] = int(sum(numpy_helper.to_array(i).nbytes for i in q.graph.initializer))
        out["activations_int8_bytes"] = 2 * act_values
    return out


def block(counts: dict, pk: dict[str, dict[int, float]], rows: list[tuple[str, bool, int, float]]) -> str:
    """Markdown: the counts, the peaks, and per artifact (label, is_int8, threads, ms) its MAC rate, its
    share of the peak at its precision and thread count, and the floor that bandwidth alone sets."""
    gmac = counts["macs"] / 1e9
    lines = [f"The model: **{gmac:.3f} GMAC** per inference ({counts['depthwise_macs'] / counts['macs']:.1%} of "
             f"them in depthwise convolutions), weights {counts['weights_fp32_bytes'] / 1e6:.1f} MB in FP32"
             + (f" / {counts['weights_int8_bytes'] / 1e6:.1f} MB in the INT8 model" if "weights_int8_bytes" in counts
                else "")
             + f", activations {counts['activations_fp32_bytes'] / 1e6:.1f} MB moved in FP32"
             + (f" / {counts['activations_int8_bytes'] / 1e6:.1f} MB in INT8" if "activations_int8_bytes" in counts
                else "") + " (each written and read once).", "",
             "This CPU, measured now (ONNX Runtime's MLAS GEMM on 1024³, best of 5; numpy copies of 256 MB):", "",
             "| threads | INT8 GEMM (u8×s8) GMAC/s | FP32 GEMM GMAC/s | INT8 / FP32 | DRAM GB/s (256 MB copies) | "
             "L3 GB/s (4 MB copies) |", "|---|---|---|---|---|---|"]
    for t in sorted(pk["int8_gmacs"]):
        i8, f32 = pk["int8_gmacs"][t], pk["fp32_gmacs"][t]
        lines.append(f"| {t} | {i8:.1f} | {f32:.1f} | {i8 / f32:.2f}× | {pk['mem_gbs'][t]:.1f} | "
                     f"{pk['l3_gbs'][t]:.1f} |")
    lines += ["", "| artifact | threads | ms | GMAC/s | share of the GEMM peak at its precision | "
              "ms at that peak | ms its bytes need from DRAM | from L3 |", "|---|---|---|---|---|---|---|---|"]
    for label, int8, t, ms in rows:
        peak = pk["int8_gmacs" if int8 else "fp32_gmacs"].get(t)
        bw, l3 = pk["mem_gbs"].get(t), pk["l3_gbs"].get(t)
        if not peak or not bw or not l3 or not ms:
            continue
        rate = gmac / (ms / 1e3)
        byts = (counts.get("weights_int8_bytes", 0) + counts.get("activations_int8_bytes", 0) if int8
                else counts["weights_fp32_bytes"] + counts["activations_fp32_bytes"])
        lines.append(f"| {label} | {t} | {ms:.2f} | {rate:.1f} | {rate / peak:.1%} | {gmac / peak * 1e3:.2f} | "
                     f"{byts / 1e9 / bw * 1e3:.2f} | {byts / 1e9 / l3 * 1e3:.2f} |")
    return "\n".join(lines)


def main() -> int:
    import onnx

    model = sys.argv[1]
    inp = onnx.load(model, load_external_data=False).graph.input[0]
    shapes = {inp.name: [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]}
    counts = model_counts(model, shapes, sys.argv[2] if len(sys.argv) > 2 else None)
    print(counts)
    print(block(counts, peaks(), []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
