"""ONNX Runtime quantizer plumbing for ``int8`` (the cpu INT8 search): prepare, calibrate, quantize, time, and measure
per-node sensitivity.

``quantize_static`` is ``create_calibrator`` -> ``collect_data`` -> ``compute_data`` -> ``QDQQuantizer``;
these are the same public calls, split so that the (slow) calibration of one method is computed once
and shared by every variant that uses it.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeopt.layerdiff import FLOAT_TYPES  # noqa: F401 - re-exported (mixed_concat reads it here)

CALIB_CHUNK = 4  # samples per calibration pass (the histogram calibrators hold all outputs of a pass)
# Ops whose output, when it is a model output, is better left in float: quantizing a final Softmax or
# Sigmoid only adds a Q/DQ pair before a float output, rounding small probabilities to 0 (seen on the
# PP-OCR rec's 6625-way softmax and the det's sigmoid map) for no kernel speed-up.
OUTPUT_ACTIVATIONS = {"Softmax", "LogSoftmax", "Sigmoid", "HardSigmoid", "Tanh", "Relu", "Clip", "LeakyRelu",
                      "HardSwish", "Gelu", "Erf"}
# The search compares kernels' relative speed: one thread keeps a shared build host's load from
# turning thread contention into the measurement; the device's own figures come from bench.
TIMING_THREADS = 1


@dataclass(frozen=True)
class QuantSettings:
    """One point of the INT8 search."""

    calibration: str  # minmax | percentile | entropy
    per_channel: bool
    activation: str = "uint8"  # uint8 | int8
    weight: str = "int8"  # int8 | uint8
    reduce_range: bool = False  # 7-bit weights (avoids int16 saturation of AVX2's u8 x s8 multiply-add)
    exclude: tuple[str, ...] = ()  # nodes kept in float
    float_output: bool = True  # model-output activations (OUTPUT_ACTIVATIONS) kept in float
    ops: str = "all"  # all: ORT's default op list (Add, Mul, pooling ... too) | weighted: WEIGHTED_OPS only

    @property
    def types(self) -> str:
        return ("U" if self.activation == "uint8" else "S") + "8" + ("U" if self.weight == "uint8" else "S") + "8"

    def label(self) -> str:
        parts = [self.calibration, "per-channel" if self.per_channel else "per-tensor", self.types]
        if self.reduce_range:
            parts.append("reduce-range")
        if not self.float_output:
            parts.append("int8-output")
        if self.ops == "weighted":
            parts.append("weighted ops only")
        if self.exclude:
            parts.append(f"{len(self.exclude)} node(s) in float")
        return "/".join(parts)


class FeedReader:
    """A CalibrationDataReader over a list of feeds (ORT only calls ``get_next``)."""

    def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
        self._it = iter(feeds)

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def __iter__(self):
        return self

    def __next__(self):
        item = self.get_next()
        if item is None:
            raise StopIteration
        return item


def preprocess(src: str, dst: Path, notes: list[str]) -> bool:
    """``quant_pre_process`` with fallbacks, unique node names, opset >= 13. Returns per-channel support."""
    import onnx
    from onnxruntime.quantization import quant_pre_process

    attempts = [("full", {}), ("symbolic shape inference skipped", {"skip_symbolic_shape": True}),
                ("symbolic shape inference and ORT optimisation skipped",
                 {"skip_symbolic_shape": True, "skip_optimization": True})]
    errors: list[str] = []
    src_abs, dst_abs = str(Path(src).resolve()), Path(dst).resolve()
    for label, kw in attempts:
        try:
            # ORT's symbolic shape inference, when incomplete, saves "sym_shape_infer_temp.onnx" (and its
            # external data) in the working directory -- the user's folder; run it in the scratch dir.
            with contextlib.redirect_stdout(io.StringIO()), contextlib.chdir(dst_abs.parent):
                quant_pre_process(src_abs, str(dst_abs), **kw)
            if errors:
                notes.append(f"quant_pre_process: {label} ({errors[-1]})")
            break
        except Exception as exc:  # ORT's symbolic shape inference asserts on some models (Concat, Reshape)
            msg = str(exc).splitlines()[0] if str(exc) else "assertion failed"
            errors.append(f"{type(exc).__name__}: {msg}"[:160])
    else:
        shutil.copyfile(src, dst)
        notes.append("quant_pre_process failed (" + "; ".join(errors) + "); quantizing the model as it is")
    model = onnx.load(str(dst))
    per_channel = True
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    if opset < 13:
        try:
            model = onnx.version_converter.convert_version(model, 13)
            notes.append(f"opset {opset} -> 13 (per-channel DequantizeLinear needs opset 13)")
        except Exception as exc:
            per_channel = False
            notes.append(f"opset {opset} could not be raised to 13 ({type(exc).__name__}); per-tensor weights only")
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):  # exclusion works by node name: every node needs one
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{i}"
        seen.add(node.name)
    renamed = rename_quantizer_collisions(model)
    if renamed:
        notes.append("renamed before quantizing (the name ORT's quantizer gives its own scale/zero-point/"
                     "Q/DQ tensors): " + ", ".join(f"{a} -> {b}" for a, b in renamed.items()))
    onnx.save(model, str(dst))
    return per_channel


# Suffixes ORT's QDQ quantizer appends to a tensor's name for the tensors it creates (scale, zero point,
# quantized weight, Q/DQ nodes and outputs; ``qdq_quantizer``/``quant_utils``, ORT 1.23).  It does not
# check them against the names already in the graph: a YOLO head's Conv output ``box`` followed by
# Sigmoid and Mul by a constant named ``box_scale`` ([1,4,1,1]) had that constant taken for the Conv's
# output scale -- a QLinearConv with a 4-element Y_scale that ONNX Runtime refuses at run time.
QUANTIZER_SUFFIXES = ("_scale", "_zero_point", "_quantized", "_QuantizeLinear", "_DequantizeLinear")


def rename_quantizer_collisions(model) -> dict[str, str]:
    """Rename (in place) every tensor whose name is another tensor's name plus a suffix ORT's quantizer
    generates (``QUANTIZER_SUFFIXES``); graph inputs and outputs keep their names (the other tensor of
    the pair is renamed instead).  Returns {old: new}."""
    g = model.graph
    io = {v.name for v in g.input} | {v.name for v in g.output}
    names = io | {i.name for i in g.initializer} | {t for n in g.node for t in [*n.input, *n.output] if t}
    # a name a subgraph (If/Loop/Scan body) reads from the outer scope is left alone: renaming it
    # would need the subgraph rewritten too
    io |= {t for n in g.node for a in n.attribute for sg in [*([a.g] if a.HasField("g") else []), *a.graphs]
           for m in sg.node for t in m.input}
    todo: dict[str, str] = {}
    for t in sorted(names):
        for suffix in QUANTIZER_SUFFIXES:
            at = t.find(suffix)
            while at > 0:
                prefix = t[:at]
                if prefix in names and prefix not in todo and t not in todo:
                    victim = t if t not in io else prefix if prefix not in io else None
                    if victim is not None:
                        new, k = f"{victim}.edgeopt", 1
                        while new in names or new in todo.values():
                            new, k = f"{victim}.edgeopt{k}", k + 1
                        todo[victim] = new
                at = t.find(suffix, at + 1)
    if not todo:
        return {}

    def rn(seq) -> None:
        for j, t in enumerate(seq):
            if t in todo:
                seq[j] = todo[t]

    for n in g.node:
        rn(n.input)
        rn(n.output)
    for v in [*g.initializer, *g.value_info, *(sp.values for sp in g.sparse_initializer)]:
        if v.name in todo:
            v.name = todo[v.name]
    return todo


def calibrate(model: Path, method: str, feeds: list[dict[str, np.ndarray]], work: Path) -> Any:
    """Activation ranges (ORT ``TensorsData``) for one calibration method, fed in small chunks."""
    from onnxruntime.quantization import CalibrationMethod, create_calibrator

    methods = {"minmax": (CalibrationMethod.MinMax, {}),
               # ORT's percentile default is symmetric (|x|), which wastes half of uint8's range on
               # post-ReLU tensors; two-sided 99.999% keeps each tail's outliers out instead.
               "percentile": (CalibrationMethod.Percentile, {"symmetric": False, "percentile": 99.999}),
               # ORT's entropy default has num_bins == num_quantized_bins (128): the KL search then has a
               # single candidate, the full range (= MinMax).  512 bins give it 193 thresholds to try.
               "entropy": (CalibrationMethod.Entropy, {"num_bins": 512, "num_quantized_bins": 128})}
    cal_method, extra = methods[method]
    aug = work / f"augmented-{method}.onnx"
    with contextlib.redirect_stdout(io.StringIO()):  # the histogram calibrators print progress
        calibrator = create_calibrator(model, [], augmented_model_path=str(aug), calibrate_method=cal_method,
                                       extra_options=extra)
        # samples of their own lengths (issue 42: the dynamic form's calibration over the real mix): one per
        # call, since ORT's histogram calibrators stack a call's outputs
        chunk = CALIB_CHUNK if len({tuple((n, a.shape) for n, a in f.items()) for f in feeds}) <= 1 else 1
        for start in range(0, len(feeds), chunk):
            calibrator.collect_data(FeedReader(feeds[start:start + chunk]))
        ranges = calibrator.compute_data()
    del calibrator
    aug.unlink(missing_ok=True)
    return ranges


class SampleRanges:
    """MinMax activation ranges per calibration sample, each computed once and shared.

    MinMax calibration over a set of samples is the minimum of their minima and the maximum of their
    maxima (ORT's ``MinMaxCalibrater`` without moving average), so the ranges of any subset -- the main
    calibration set, each cross-check fold's training samples -- are a merge of per-sample ranges: the
    k-fold cross-check then runs the augmented model once per pooled sample, not once per sample and
    fold (4 folds: 3x the pool's runs saved per variant recipe).  Samples are known by identity (the
    search's feed dicts)."""

    def __init__(self, model: Path, work: Path) -> None:
        self.model, self.work = model, work
        self._by_id: dict[int, Any] = {}
        self._keep: list[dict[str, np.ndarray]] = []  # keeps the feeds alive, so their ids stay theirs
        self._calibrator: Any = None
        self.runs = 0  # samples run through the augmented model (for tests and timings)

    def ranges(self, feeds: list[dict[str, np.ndarray]]) -> Any:
        todo = [f for f in feeds if id(f) not in self._by_id]
        if todo:
            from onnxruntime.quantization import CalibrationMethod, create_calibrator

            if self._calibrator is None:
                aug = self.work / "augmented-minmax-per-sample.onnx"
                with contextlib.redirect_stdout(io.StringIO()):
                    self._calibrator = create_calibrator(self.model, [], augmented_model_path=str(aug),
                                                         calibrate_method=CalibrationMethod.MinMax)
                aug.unlink(missing_ok=True)
            for f in todo:
                self._calibrator.calibrate_tensors_range = None  # this sample's ranges alone
                self._calibrator.collect_data(FeedReader([f]))
                self._by_id[id(f)] = self._calibrator.calibrate_tensors_range
                self._keep.append(f)
                self.runs += 1
        return merge_minmax([self._by_id[id(f)] for f in feeds])


def merge_minmax(per_sample: list[Any]) -> Any:
    """The MinMax ``TensorsData`` of the union of samples (min of minima, max of maxima per tensor)."""
    from onnxruntime.quantization import CalibrationMethod
    from onnxruntime.quantization.calibrate import TensorData, TensorsData

    lo: dict[str, Any] = {}
    hi: dict[str, Any] = {}
    for data in per_sample:
        for name, td in data.items():
            a, b = td.range_value if isinstance(td, TensorData) else td
            lo[name] = a if name not in lo else np.minimum(lo[name], a)
            hi[name] = b if name not in hi else np.maximum(hi[name], b)
    return TensorsData(CalibrationMethod.MinMax, {n: TensorData(lowest=lo[n], highest=hi[n]) for n in lo})


def quantizable_ops() -> list[str]:
    """Op types ORT's static quantizer handles (``quantize_static``'s own default list)."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return sorted(set(QLinearOpsRegistry) | set(QDQRegistry))


# The ops whose INT8 kernels carry the speed-up; the rest of ORT's list (Add, Mul, pooling, Softmax ...)
# mostly saves a Q/DQ pair between them, and costs accuracy where an elementwise op mixes ranges (a
# LayerNorm's (x - mean) * 1/std: magika's INT8 read 3 of 12 files like FP32 with them, 12 of 12 without).
WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


def op_types(s: QuantSettings) -> list[str]:
    """The op types a setting quantizes."""
    ops = quantizable_ops()
    return [o for o in ops if o in WEIGHTED_OPS] if s.ops == "weighted" else ops


def unweighted_products(model) -> list[str]:
    """MatMul/Gemm nodes with no constant operand (attention's Q x K^T and scores x V): with ``ops=weighted``
    they stay float too -- no weight to quantize, two activation ranges multiplied (TensorRT's placement
    keeps them float for the same reason)."""
    consts = {i.name for i in model.graph.initializer}
    consts |= {o for n in model.graph.node if n.op_type == "Constant" for o in n.output}
    return [n.name for n in model.graph.node
            if n.op_type in ("MatMul", "Gemm") and len(n.input) >= 2 and not {n.input[0], n.input[1]} & consts]


def excluded_nodes(model, s: QuantSettings, always: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The nodes a setting keeps float: its own list, the output activations, the unweighted products,
    and ``always`` (the search's rules for every variant: ``mixed_concat``)."""
    out = list(s.exclude) + [n for n in always if n not in s.exclude]
    out += [n for n in (output_activations(model) if s.float_output else []) if n not in out]
    return out + ([n for n in unweighted_products(model) if n not in out] if s.ops == "weighted" else [])


def output_activations(model) -> list[str]:
    """Names of the nodes that produce a model output with an activation op (see OUTPUT_ACTIVATIONS)."""
    outputs = {o.name for o in model.graph.output}
    return [n.name for n in model.graph.node if n.op_type in OUTPUT_ACTIVATIONS and set(n.output) & outputs]


def quantize(model: Path, ranges: Any, s: QuantSettings, dst: Path, always: tuple[str, ...] | list[str] = ()) -> None:
    """The QDQ model for one setting, from precomputed ranges (quantize_static's own steps); ``always``:
    nodes kept float whatever the setting."""
    from onnxruntime.quantization import QDQQuantizer, QuantType
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

    qtype = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
    fp = load_model_with_shape_infer(model)
    quantizer = QDQQuantizer(fp, s.per_channel, s.reduce_range, qtype[s.weight], qtype[s.activation],
                             copy.deepcopy(ranges), [], excluded_nodes(fp, s, always), op_types(s), {})
    quantizer.quantize_model()
    quantizer.model.save_model_to_file(str(dst))


# --- running and timing -----------------------------------------------------------------------

# ORT (>= 1.21) optimizers an INT8 bundle runs without, recorded in its manifest's runtime options.
# WeightBiasQuantization quantizes, at load, the float weights of any Conv/ConvTranspose/Gemm whose input
# comes from a DequantizeLinear -- per-tensor, symmetric -- so a node the search keeps float (its
# input read from a quantized neighbour) ran with INT8 weights after all, fused into a QLinearConv when a
# Q followed: measured on EfficientNet-Lite0, its 16 depthwise convs "kept float" all ran as
# QLinearConv with per-tensor weights. With it off they run in float, as the manifest says.
DISABLED_OPTIMIZERS = ("WeightBiasQuantization",)


def session(ort, path: Path, optimize: bool = True, threads: int | None = None):
    """A CPU session; ``optimize`` as the device runs it (QDQ fused to int8 kernels, without
    DISABLED_OPTIMIZERS), else as written."""
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    so.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                   else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(DISABLED_OPTIMIZERS))


def run_all(sess, feeds: list[dict[str, np.ndarray]], names: list[str]) -> dict[str, np.ndarray]:
    """Outputs over all feeds, stacked on a new axis 0 (the layout of ``reference.npz``)."""
    outs = [sess.run(names, f) for f in feeds]
    return {n: np.stack([o[i] for o in outs]) for i, n in enumerate(names)}


def latency_ms(sess, feed: dict[str, np.ndarray], budget_s: float = 0.6, min_runs: int = 5,
               max_runs: int = 50) -> float:
    """Median of a short timing loop after two warm-up runs."""
    for _ in range(2):
        sess.run(None, feed)
    times: list[float] = []
    t_end = time.perf_counter() + budget_s
    while len(times) < max_runs and (len(times) < min_runs or time.perf_counter() < t_end):
        t0 = time.perf_counter()
        sess.run(None, feed)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def interleaved_rounds(sessions: list[Any], feed: dict[str, np.ndarray], rounds: int = 7,
                       per_round: int = 3) -> list[list[float]]:
    """Per session, the median latency (ms) of each round: the sessions run in turns (round k of every
    session lies close in time: a paired comparison round by round sees through load changes)."""
    times: list[list[list[float]]] = [[[] for _ in range(rounds)] for _ in sessions]
    for s in sessions:
        s.run(None, feed)
    for k in range(rounds):
        for i, s in enumerate(sessions):
            for _ in range(per_round):
                t0 = time.perf_counter()
                s.run(None, feed)
                times[i][k].append(time.perf_counter() - t0)
    return [[1000 * statistics.median(r) for r in t] for t in times]


# --- per-node sensitivity -------------------------------------------------------------------

def _with_outputs(model, names: list[str], types: dict[str, int] | None = None):
    """A copy of ``model`` with ``names`` added as graph outputs, typed (``edgeopt.layerdiff.with_outputs_bytes``)."""
    import onnx

    from edgeopt.layerdiff import with_outputs_bytes

    return onnx.load_from_string(with_outputs_bytes(model, names, types or {}))


def tensor_types(model) -> dict[str, int]:
    """Element type of every tensor ONNX's shape inference can type (``edgeopt.layerdiff.tensor_types``)."""
    from edgeopt.layerdiff import tensor_types as _types

    return _types(model)


def sensitivity(ort, float_path: Path, qdq_path: Path, feeds: list[dict[str, np.ndarray]],
                work: Path, max_memory: int | None = None) -> list[tuple[str, str, float]]:
    """Quantized nodes ranked by the SQNR they lose (dB), most sensitive first.

    Both models run unoptimized (the QDQ one as fake-quant in float).  For each tensor: the noise-to-signal
    ratio of the value consumers read in the QDQ model (after its DequantizeLinear) against the float model.
    A node's sensitivity is the SQNR of its worst activation input minus that of its worst output: the
    precision lost at that node.

    The tensors are read and compared by ``edgeopt debug``'s per-layer machinery (``layerdiff.OrtSource`` with
    typed intermediate outputs and the QDQ side read after its DequantizeLinear, ``layerdiff.compare_tensors``
    in windows of at most ``max_memory`` bytes): the SQNR is ``node_metrics``' ``snr_db`` (10 log10 |ref|^2 /
    |out - ref|^2), summed sample by sample, so the search ranks nodes on the error ``edgeopt debug
    --precision int8`` shows (its rel_l2 = 10^(-SQNR/20)).  ``work`` is unused (kept for callers).
    """
    import onnx

    from edgeopt.layerdiff import DEFAULT_MAX_MEMORY, OrtSource, compare_tensors, tensor_bytes, windows

    fm, qm = onnx.load(str(float_path)), onnx.load(str(qdq_path))
    init = {i.name for i in fm.graph.initializer}
    tensors = sorted({t for n in fm.graph.node for t in list(n.input) + list(n.output) if t and t not in init})
    # What a consumer in the QDQ model reads for tensor t: DQ(Q(t)) when t was quantized, else t.
    q_of = {n.input[0]: n.output[0] for n in qm.graph.node if n.op_type == "QuantizeLinear"}
    dq_of = {n.input[0]: n.output[0] for n in qm.graph.node if n.op_type == "DequantizeLinear"}
    q_names = {o for node in qm.graph.node for o in node.output} | {i.name for i in qm.graph.input}
    f_names = {o for node in fm.graph.node for o in node.output} | {i.name for i in fm.graph.input}
    seen = {t: dq_of.get(q_of.get(t, ""), t) for t in tensors}
    # Only float tensors carry an SQNR. Where shape inference typed the graph, an untyped tensor is left
    # out too (declared float, an int one makes ORT refuse the whole model); where it typed nothing (it
    # failed), every tensor is taken for float as before. The QDQ model's tensor read for t is t itself or
    # a DequantizeLinear output of it: the float model's types say it all.
    f_types = tensor_types(fm)
    typed = len(f_types) > len(fm.graph.input) + len(fm.graph.output)
    # only the tensors the ranking reads: the quantizable nodes' activation inputs and outputs, and the output of a
    # Relu/Clip that alone consumes one of those outputs (see out_sqnr below)
    ops = set(quantizable_ops())
    consumers: dict[str, list[Any]] = {}
    for node in fm.graph.node:
        for t in node.input:
            consumers.setdefault(t, []).append(node)
    needed: set[str] = set()
    for node in fm.graph.node:
        if node.op_type in ops:
            needed.update(t for t in node.input if t and t not in init)
            for t in node.output:
                needed.add(t)
                if len(consumers.get(t, [])) == 1 and consumers[t][0].op_type in ("Relu", "Clip"):
                    needed.add(consumers[t][0].output[0])
    common = [t for t in tensors if t in needed and seen[t] in q_names and t in f_names
              and (not typed or f_types.get(t) in FLOAT_TYPES)]

    def make(data: bytes):  # both unoptimized, as session(optimize=False)
        return ort.InferenceSession(data, _plain(ort), providers=["CPUExecutionProvider"],
                                    disabled_optimizers=list(DISABLED_OPTIMIZERS))

    fsrc = OrtSource(fm, make, label="float", types=f_types, keep_session=True)
    qsrc = OrtSource(qm, make, alias={t: seen[t] for t in common if seen[t] != t}, label="int8 QDQ",
                     types={seen[t]: f_types[t] for t in common if t in f_types}, keep_session=True)

    def measure(_: str, out: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
        if ref.dtype.kind != "f":
            return {}
        a64 = ref.astype(np.float64)
        return {"noise": float(np.sum((a64 - out) ** 2)), "signal": float(np.sum(a64 ** 2))}

    # One sample at a time (SQNR's sums add up over samples): a window holds one sample's tensors, so the
    # memory is that of one sample's activations within ``max_memory``, and each window's two sessions are
    # made once for all samples.
    budget = DEFAULT_MAX_MEMORY if max_memory is None else max_memory
    noise = dict.fromkeys(common, 0.0)
    signal = dict.fromkeys(common, 0.0)
    sizes = tensor_bytes(fm, common, feeds[0]) if feeds else {}
    for group in windows(common, sizes, 1, budget) if feeds else []:
        for feed in feeds:
            per, _ = compare_tensors(fsrc, qsrc, group, [feed], sizes, budget, measure)
            for t, m in per.items():
                if "noise" in m:
                    noise[t] += m["noise"]
                    signal[t] += m["signal"]
    del fsrc, qsrc

    def sqnr(t: str) -> float | None:
        if signal.get(t, 0.0) <= 0:
            return None
        return 10 * math.log10(signal[t] / max(noise[t], 1e-30))

    # A Relu/Clip right after a quantized node is folded into that node's output quantization, so the
    # node's own output may not exist in the QDQ model: measure it after the folded activation.
    def out_sqnr(t: str) -> float | None:
        v = sqnr(t)
        if v is None and len(consumers.get(t, [])) == 1 and consumers[t][0].op_type in ("Relu", "Clip"):
            v = sqnr(consumers[t][0].output[0])
        return v

    ranked = []
    for node in fm.graph.node:
        if node.op_type not in ops:
            continue
        ins = [v for v in (sqnr(t) for t in node.input if t and t not in init) if v is not None]
        outs = [v for v in (out_sqnr(t) for t in node.output if t) if v is not None]
        if ins and outs:  # else not measurable here (e.g. a folded activation itself)
            ranked.append((node.name, node.op_type, min(ins) - min(outs)))
    ranked.sort(key=lambda r: -r[2])
    return ranked


def float_effect(ort, float_path: Path, qdq_path: Path, candidates: list[str], feeds: list[dict[str, np.ndarray]],
                 reference: dict[str, np.ndarray], deadline: float) -> dict[str, float]:
    """Output error (mean rel_l2 over outputs, on ``feeds``) of the fake-quant model with each candidate
    node alone reading float inputs and weights, i.e. what keeping that one node in float would buy.

    Simulated by rewiring the node's inputs in the QDQ graph from DequantizeLinear outputs to the float
    tensors (and float copies of its weights): one cheap unoptimized session per candidate instead of a
    full re-quantization.  Key ``""`` is the error with nothing kept in float.  Stops at ``deadline``.
    """
    import onnx
    from onnx import numpy_helper

    fm, qm = onnx.load(str(float_path)), onnx.load(str(qdq_path))
    f_nodes = {n.name: n for n in fm.graph.node}
    q_nodes = {n.name: n for n in qm.graph.node}
    f_init = {i.name: i for i in fm.graph.initializer}
    q_tensors = {o for n in qm.graph.node for o in n.output} | {i.name for i in qm.graph.input}
    names = list(reference)

    def error() -> float:
        sess = ort.InferenceSession(qm.SerializeToString(), _plain(ort), providers=["CPUExecutionProvider"])
        out = run_all(sess, feeds, names)
        return float(np.mean([np.linalg.norm(out[n] - reference[n]) / max(np.linalg.norm(reference[n]), 1e-12)
                              for n in names]))

    result = {"": error()}
    for name in candidates:
        if time.perf_counter() > deadline:
            break
        fnode, qnode = f_nodes.get(name), q_nodes.get(name)
        if fnode is None or qnode is None or len(fnode.input) != len(qnode.input):
            continue
        saved, added = list(qnode.input), []
        for j, (f_in, q_in) in enumerate(zip(fnode.input, qnode.input)):
            if f_in == q_in or not f_in:
                continue
            if f_in in f_init:  # a weight or bias: read a float copy
                copy_name = f"{f_in}__edgeopt_float"
                added.append(numpy_helper.from_array(numpy_helper.to_array(f_init[f_in]), copy_name))
                qnode.input[j] = copy_name
            elif f_in in q_tensors:  # an activation: read it before its QuantizeLinear
                qnode.input[j] = f_in
        qm.graph.initializer.extend(added)
        try:
            result[name] = error()
        except Exception:  # a rewiring ORT refuses: no measurement for that node
            pass
        finally:
            del qnode.input[:]
            qnode.input.extend(saved)
            for _ in added:
                qm.graph.initializer.pop()
    return result


def _plain(ort):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return so
