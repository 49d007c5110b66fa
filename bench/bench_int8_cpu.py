"""What makes ONNX Runtime INT8 fast on a VNNI CPU, measured: artifacts vs plain ORT FP32, interleaved.

    .venv/bin/python bench/bench_int8_cpu.py [--models imagenet,ocr-cls,ocr-rec,ocr-det] [--rounds 9]

Per model (EfficientNet-Lite0 from ``bench/imagenet_cnn.py``; the PP-OCR cls/rec/det fixtures with
the data of ``bench/build_fixtures.py``), one interleaved timing loop over:

- ``ORT FP32``: the model as given, plain ``InferenceSession`` (graph optimization ALL);
- the edgeopt bundles, run by the agent's own runners: ``cpu`` fp32 and int8 (the shipped QDQ model,
  chosen by the accuracy-aware search at the default INT8 bound), ``intel-cpu`` int8 (OpenVINO IR +
  NNCF), and for the ImageNet CNN the cpu int8 search asked for ``top1_min=0.95``;
- hand-made ORT variants from the same calibration samples (ORT's MinMax ranges, the quantizer's
  default) that isolate one choice each: QDQ vs QOperator format, U8S8 vs S8S8, per-channel vs
  per-tensor weights, ``reduce_range``, and the QDQ model at a lower graph optimization level (does
  ORT's QDQ -> QLinear fusion matter).  The optimized graph's node types are counted for each.

Timing: intra_op threads = 1 for every artifact (the machine has 2 cores shared with other jobs:
two ORT threads spinning against a busy neighbour measured 3-4x slower than one here), then a
second loop at each runtime's default threads for FP32 and the bundles.  Rounds A,B,C,...,A,B,C;
medians; the load average at the start and end is printed.  Each model's block is kept in
``$EDGEOPT_BENCH_WORK/blocks.json`` (default /tmp/edgeopt-bench-int8-cpu) so that ``--models`` re-measures
some models and the section still shows all.  Accuracy on the bundles' validation
samples against the FP32 reference: the host check's own metrics (top-1 agreement for a classifier,
CTC decodings equal for the recogniser, cosine for the detector's map).  Writes the ``int8-cpu``
section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import io
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, machine, md_table, stamp, write_section  # noqa: E402

INT8_KERNELS = ("QLinearConv", "QLinearMatMul", "QGemm", "MatMulInteger", "ConvInteger", "QLinearAdd",
                "QLinearMul", "QLinearGlobalAveragePool", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat",
                "QLinearAveragePool", "QLinearSoftmax", "DynamicQuantizeMatMul", "NhwcQLinearConv")
FLOAT_HEAVY = ("Conv", "MatMul", "Gemm", "FusedConv", "FusedMatMul", "ConvTranspose", "FusedGemm", "NchwcConv")

STORE = Path(os.environ.get("EDGEOPT_BENCH_WORK", "/tmp/edgeopt-bench-int8-cpu")) / "blocks.json"
ORDER = ["efficientnet-lite0", "ocr-cls", "ocr-rec", "ocr-det"]

# (label, format, activation, weight, per_channel, reduce_range, graph level[, nodes kept float])
MANUAL = [
    ("QDQ U8S8 per-channel", "qdq", "uint8", "int8", True, False, "all"),
    ("QDQ U8S8 per-tensor", "qdq", "uint8", "int8", False, False, "all"),
    ("QDQ U8S8 per-channel reduce_range", "qdq", "uint8", "int8", True, True, "all"),
    ("QDQ S8S8 per-channel", "qdq", "int8", "int8", True, False, "all"),
    ("QOperator U8S8 per-channel", "qop", "uint8", "int8", True, False, "all"),
    ("QOperator S8S8 per-channel", "qop", "int8", "int8", True, False, "all"),
    ("QDQ U8S8 per-channel, graph level basic", "qdq", "uint8", "int8", True, False, "basic"),
    ("QDQ U8S8 per-channel, graph optimization off", "qdq", "uint8", "int8", True, False, "off"),
    # is one kind of conv slower in INT8 than in FP32 on this CPU (keep it float, see if the model gets faster)?
    ("QDQ U8S8 per-channel, depthwise convs float", "qdq", "uint8", "int8", True, False, "all", "depthwise"),
    ("QDQ U8S8 per-channel, first conv float", "qdq", "uint8", "int8", True, False, "all", "first"),
]


NOTES_AVX2 = """Reading (lead's notes, 2026-11-23, EfficientNet-Lite0 on this 2-vCPU AVX2 EPYC): no artifact
reaches issue 13's 2x. What bounds it is the INT8 convolution kernels, not the graph: the profile puts
80% of the cpu INT8 bundle's time in QLinearConv (the FP32 bundle: 97% in Conv), its Q/DQ and layout
nodes at ~1-2%; the best accurate artifact is 1.6x its FP32 at each one's best thread count (1.4-1.5x at 1
thread; the "default threads" column flatters INT8 because ORT FP32 on 2 threads of this machine runs
*slower* than on 1). Changing the graph does not help: keeping the 16 depthwise convs float (truly float
now, see below) costs 34 Q/DQ + 34 layout transposes and lands at ~1.06x; the first conv float, ~1.56x;
QOperator = QDQ; S8S8 is slower (no u8s8 kernel fusion for it on AVX2). Other runtimes' INT8 on this CPU:
OpenVINO + NNCF 1.3x, LiteRT XNNPACK (edgeopt's mobile bundle) 1.0x. Without VNNI, AVX2's u8 x s8
multiply-add (vpmaddubsw + vpmaddwd) does about 1.3-2x the MACs per cycle of FP32 FMA (reasoning, not
measured), so 2x at batch 1 on a depthwise CNN is likely beyond these kernels.
Found on the way: ORT (>= 1.21) quantized the weights of convs edgeopt's search had kept float
(WeightBiasQuantization, per-tensor, at load): the depthwise-float row ran 60 int8 kernels and 0 float
convs; with the optimizer off (as cpu bundles now run) it runs 16 float convs."""


def float_nodes(pre: Path, rule: str) -> tuple[str, ...]:
    """Node names a MANUAL rule keeps float: ``depthwise`` (Conv with group == input channels > 1) or
    ``first`` (the first Conv: 3 input channels, the least int8-friendly shape)."""
    import onnx

    convs = [n for n in onnx.load(str(pre), load_external_data=False).graph.node if n.op_type == "Conv"]
    if rule == "first":
        return tuple(n.name for n in convs[:1])
    return tuple(n.name for n in convs if any(a.name == "group" and a.i > 1 for a in n.attribute))


# --- artifacts ------------------------------------------------------------------------------

def _level(ort, name: str):
    return {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL, "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
            "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
            "off": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[name]


def ort_session(path: Path, threads: int | None, level: str = "all", optimized: Path | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    so.graph_optimization_level = _level(ort, level)
    so.log_severity_level = 3
    if optimized is not None:
        so.optimized_model_filepath = str(optimized)
    # as edgeopt's cpu INT8 bundles run (a no-op on FP32 and fully quantized models): nodes left float stay float
    from edgeopt.targets.onnxruntime.quant import DISABLED_OPTIMIZERS

    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(DISABLED_OPTIMIZERS))


def node_types(path: Path, level: str, work: Path) -> str:
    """What ORT runs after optimizing at ``level``: int8 kernels vs float Conv/MatMul/Gemm left."""
    import onnx

    opt = work / f"opt-{abs(hash((str(path), level)))}.onnx"
    ort_session(path, 1, level, opt)
    ops = collections.Counter(n.op_type for n in onnx.load(str(opt), load_external_data=False).graph.node)
    opt.unlink(missing_ok=True)
    q = sum(v for k, v in ops.items() if k in INT8_KERNELS)
    f = sum(v for k, v in ops.items() if k in FLOAT_HEAVY)
    qdq = ops.get("QuantizeLinear", 0) + ops.get("DequantizeLinear", 0)
    return f"{q} int8 kernels, {f} float conv/matmul, {qdq} Q/DQ, {ops.get('Transpose', 0)} Transpose"


def qoperator(pre: Path, ranges, per_channel: bool, act: str, wt: str, reduce_range: bool, dst: Path) -> None:
    """ORT's QOperator (QLinearConv...) model from precomputed ranges (quantize_static's own steps)."""
    from onnxruntime.quantization import QuantizationMode, QuantType
    from onnxruntime.quantization.onnx_quantizer import ONNXQuantizer
    from onnxruntime.quantization.quant_utils import load_model_with_shape_infer

    from edgeopt.targets.onnxruntime.quant import quantizable_ops

    class Quantizer(ONNXQuantizer):
        # ORT 1.23: per-channel weights are recorded without their axis, and re-quantizing a weight
        # whose int32 bias would overflow then fails ("operands could not be broadcast"); record it.
        def quantize_weight_per_channel(self, name, qtype, axis, reduce_range=True, keep_float_weight=False):
            got = super().quantize_weight_per_channel(name, qtype, axis, reduce_range, keep_float_weight)
            self.quantized_value_map[name].axis = axis
            return got

    qt = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
    q = Quantizer(load_model_with_shape_infer(pre), per_channel, reduce_range, QuantizationMode.QLinearOps, True,
                  qt[wt], qt[act], copy.deepcopy(ranges), [], [], quantizable_ops(), {})
    q.quantize_model()
    q.model.save_model_to_file(str(dst))


def manual_variants(model: str, cal: list[dict], work: Path) -> list[dict]:
    """The hand-made variants of MANUAL, each {label, path, level} (or {label, error})."""
    from edgeopt.targets.onnxruntime.quant import QuantSettings, calibrate, preprocess, quantize

    pre = work / "pre.onnx"
    preprocess(model, pre, [])
    ranges = calibrate(pre, "minmax", cal, work)
    out = []
    for label, fmt, act, wt, pc, rr, level, *rule in MANUAL:
        keep = float_nodes(pre, rule[0]) if rule else ()
        dst = work / f"manual-{fmt}-{act}-{wt}-{int(pc)}-{int(rr)}{'-' + rule[0] if rule else ''}.onnx"
        try:
            if not dst.exists():
                with contextlib.redirect_stdout(io.StringIO()):
                    if fmt == "qdq":
                        quantize(pre, ranges, QuantSettings("minmax", pc, act, wt, rr, exclude=keep,
                                                            float_output=False), dst)
                    else:
                        qoperator(pre, ranges, pc, act, wt, rr, dst)
            out.append({"label": label, "path": dst, "level": level, "kind": "ort"})
        except Exception as exc:  # noqa: BLE001 - one variant ORT cannot make is a row saying so
            out.append({"label": label, "error": f"{type(exc).__name__}: {str(exc)[:120]}"})
    return out


class BundleRun:
    """A bundle loaded by the agent's own runner (what `edgeopt bench` times on a device)."""

    def __init__(self, bundle: Path, threads: int | None) -> None:
        from edgeopt_agent.bundle import from_artifact, to_artifact
        from edgeopt_agent.runners import get_runner

        self.manifest = json.loads((bundle / "manifest.json").read_text())
        runner = get_runner(self.manifest["runtime"]["name"])
        self.r = runner(bundle, self.manifest, {"threads": threads} if threads else {})
        self.r.load()
        self._to, self._from = to_artifact, from_artifact

    def prepare(self, feed: dict) -> dict:
        return self._to(feed, self.manifest["io"]["inputs"])

    def run(self, feed: dict) -> dict:
        return self._from(self.r.run(feed), self.manifest["io"]["outputs"])


class OrtRun:
    def __init__(self, path: Path, threads: int | None, level: str = "all") -> None:
        self.s = ort_session(path, threads, level)
        self.names = [o.name for o in self.s.get_outputs()]

    def prepare(self, feed: dict) -> dict:
        return feed

    def run(self, feed: dict) -> dict:
        return dict(zip(self.names, self.s.run(self.names, feed)))


def interleaved(runs: list, feed: dict, rounds: int, per_round: int) -> list[float]:
    """Median ms of each run, measured in turns A,B,C,A,B,C..."""
    feeds = [r.prepare(feed) for r in runs]
    times: list[list[float]] = [[] for _ in runs]
    for r, f in zip(runs, feeds):
        for _ in range(2):
            r.run(f)
    for _ in range(rounds):
        for i, (r, f) in enumerate(zip(runs, feeds)):
            for _ in range(per_round):
                t0 = time.perf_counter()
                r.run(f)
                times[i].append(time.perf_counter() - t0)
    return [1000 * statistics.median(t) for t in times]


def accuracy(run, val: list[dict], reference: dict, kinds: dict) -> tuple[str, float | None, bool, float]:
    """(headline text, task figure, passes the default INT8 bound, worst cosine) on the validation set."""
    from edgeopt_agent.compare import compare_outputs

    outs = [run.run(run.prepare(f)) for f in val]
    stacked = {n: np.stack([o[n] for o in outs]) for n in reference}
    res = compare_outputs(stacked, reference, "int8", None, kinds)
    from edgeopt.policy.accept import judge

    res["policy"] = judge(res).as_dict()  # the one accuracy policy (the report's, the gate's, the build's)
    texts, task, cos = [], None, 1.0
    for m in (o["metrics"] for o in res["outputs"].values()):
        cos = min(cos, float(m.get("cosine", 1.0)))
        if "top1" in m:
            task = float(m["top1"])
            texts.append(f"top-1 {m['top1']:.1%}")
        if "seq_match" in m:
            task = float(m["seq_match"])
            texts.append(f"CTC decodings equal {m['seq_match']:.0%}")
        texts.append(f"cos {m.get('cosine', float('nan')):.4f}")
    return ", ".join(texts), task, res["policy"].get("accepted") is True, cos


# --- one model --------------------------------------------------------------------------------

def build_bundles(name: str, job: dict, out: Path, extra: bool) -> dict[str, dict]:
    """edgeopt bundles (pipeline build, forced): label -> {bundle | error, time_s, note}."""
    from edgeopt.pipeline import build

    plan = [("edgeopt cpu fp32", "cpu", "fp32", {}), ("edgeopt cpu int8", "cpu", "int8", {}),
            # NNCF's accuracy control stops at the INT8 time budget: under load the default (120 s quick)
            # ran out on EfficientNet-Lite0 in one run and not in another; 600 s makes the row load-proof.
            ("edgeopt intel-cpu int8", "intel-cpu", "int8", {"int8_budget_s": 600})]
    if extra:
        plan.append(("edgeopt cpu int8, top1_min 0.95", "cpu", "int8", {"int8_tolerance": "top1_min=0.95"}))
        # another runtime's INT8 kernels on the same x86 CPU: the mobile bundle, run by LiteRT with XNNPACK
        plan.append(("edgeopt mobile int8 (LiteRT XNNPACK, this CPU)", "mobile", "int8", {}))
    got = {}
    for label, target, prec, opts in plan:
        t0 = time.perf_counter()
        rep = build(job["model"], target, [prec], shapes=job["shapes"], calib=job["calib"],
                    out=out / re.sub(r"[^A-Za-z0-9.=-]+", "_", label), options={**job["options"], **opts},
                    n_calib=job["n_calib"], n_val=job["n_val"], force=True, jobs=1, progress=lambda s: None)
        res = rep.results[0]
        row = {"time_s": time.perf_counter() - t0}
        if res.ok and res.bundle:
            row["bundle"] = Path(res.bundle)
            info = ((res.manifest or {}).get("options") or {}).get("int8")
            chosen = info.get("chosen") if isinstance(info, dict) else None
            row["note"] = (chosen.get("label") or "" if isinstance(chosen, dict) else str(chosen or ""))[:120]
        else:
            row["error"] = (res.error or res.status or "?").splitlines()[0][:220]
        print(f"  {name}: {label}: {row.get('note') or row.get('error', 'built')} ({row['time_s']:.0f} s)", flush=True)
        got[label] = row
    return got


def measure_model(name: str, job: dict, work: Path, rounds: int, extras: bool = True) -> dict:
    from edgeopt.calib import load_stacked

    bundles = build_bundles(name, job, work / "out", extra=(name == "efficientnet-lite0" and extras))
    fp32b = bundles["edgeopt cpu fp32"].get("bundle")
    if fp32b is None:
        return {"name": name, "error": "cpu fp32 bundle failed: " + bundles["edgeopt cpu fp32"]["error"]}
    man = json.loads((fp32b / "manifest.json").read_text())
    in_names = [t["name"] for t in man["io"]["inputs"]]
    out_names = [t["name"] for t in man["io"]["outputs"]]
    val = load_stacked(fp32b / "validation" / "inputs.npz", in_names, "in")
    with np.load(fp32b / "validation" / "reference.npz") as d:
        reference = {n: d[f"out{i}"] for i, n in enumerate(out_names)}
    kinds = man.get("output_kinds")
    # calibration samples as the pipeline took them (the manifest's split: never a validation sample)
    with np.load(job["calib"]) as d:
        arr = d[in_names[0]] if in_names[0] in d else d[d.files[0]]
    split = ((man.get("validation") or {}).get("source") or {}).get("split") or {}
    arr = arr[split["calibration"]] if split.get("calibration") else arr[:-len(val)][:job["n_calib"]]
    shape = man["io"]["inputs"][0]["shape"]
    cal = [{in_names[0]: (a if a.ndim == len(shape) else a[None]).astype(np.float32)} for a in arr]
    mwork = work / name
    mwork.mkdir(parents=True, exist_ok=True)
    arts = [{"label": "ORT FP32 (model as given)", "path": Path(job["model"]), "level": "all", "kind": "ort"}]
    for label, row in bundles.items():
        arts.append({"label": label, "bundle": row["bundle"], "kind": "bundle", "note": row.get("note", ""),
                     "build_s": row["time_s"]} if "bundle" in row else
                    {"label": label, "error": row["error"], "build_s": row["time_s"]})
    arts += manual_variants(job["model"], cal, mwork)
    live = [a for a in arts if "error" not in a]
    for a in live:
        if a["kind"] == "ort":
            a["graph"] = node_types(a["path"], a["level"], mwork)
        elif a["bundle"] and (a["bundle"] / "model.onnx").exists():
            a["graph"] = node_types(a["bundle"] / "model.onnx", "all", mwork)
        else:
            a["graph"] = {"openvino": "OpenVINO IR", "tflite": "TFLite flatbuffer"}.get(
                json.loads((a["bundle"] / "manifest.json").read_text())["runtime"]["name"], "?")
    feed = val[0]

    def runs(threads):
        return [OrtRun(a["path"], threads, a["level"]) if a["kind"] == "ort" else BundleRun(a["bundle"], threads)
                for a in live]

    load0 = load()
    one = runs(1)
    for a, r in zip(live, one):
        a["acc"], a["task"], a["passed"], a["cos"] = accuracy(r, val, reference, kinds)
    per = 1  # one run per artifact per round: the finest interleaving, load changes hit all alike
    ms1 = interleaved(one, feed, rounds, per)
    for a, m in zip(live, ms1):
        a["ms1"] = m
    if name == "efficientnet-lite0":  # where each bundle's time goes, by the runtime's own profiler
        for a, r in zip(live, one):
            if a["kind"] == "bundle":
                a["profile"] = op_profile(r, feed, a["ms1"])
    del one
    default = [a for a in live if a["kind"] == "bundle" or a["label"].startswith("ORT FP32")]
    msd = interleaved(runs_for(default), feed, rounds, per)
    for a, m in zip(default, msd):
        a["msd"] = m
    res = {"name": name, "arts": arts, "val": len(val), "cal": len(cal), "load0": load0, "load1": load(),
           "stamp": stamp()}
    if name == "efficientnet-lite0":
        res["roofline"] = roofline_block(res, job)
    return res


def roofline_block(res: dict, job: dict) -> str:
    """ORT FP32 and the fastest artifact the policy accepts against this CPU's measured peaks
    (``bench/roofline.py``), at 1 thread and at the default threads (2 here)."""
    import roofline

    arts = [a for a in res["arts"] if "error" not in a]
    fp = next(a for a in arts if a["label"].startswith("ORT FP32"))
    ok = [a for a in arts if a is not fp and a["passed"] and a["kind"] == "bundle"
          and (a["bundle"] / "model.onnx").exists()]
    best = min(ok, key=_best_ms) if ok else None
    int8_model = best["bundle"] / "model.onnx" if best else None
    counts = roofline.model_counts(job["model"], job["shapes"], int8_model)
    pk = roofline.peaks((1, 2))
    rows = [("ORT FP32 (model as given)", False, 1, fp["ms1"]), ("ORT FP32 (model as given)", False, 2, fp.get("msd"))]
    if best:
        is8 = "int8" in best["label"]
        rows += [(best["label"], is8, 1, best["ms1"]), (best["label"], is8, 2, best.get("msd"))]
    return roofline.block(counts, pk, rows)


def op_profile(run: BundleRun, feed: dict, p50_ms: float) -> dict:
    """The agent's per-op decomposition (``edgeopt bench --profile``'s, one implementation) of one bundle."""
    from edgeopt_agent.decompose import decompose

    f = run.prepare(feed)
    return decompose(run.r, run.manifest, [f], run.r.run(f), p50_ms, iterations=30)["profile"]


def _best_ms(a: dict) -> float:
    """An artifact's median at its faster thread setting (1 thread, or the runtime's default)."""
    return min(m for m in (a["ms1"], a.get("msd")) if m)


def best_vs_best(res: dict) -> str:
    """The fastest artifact the accuracy policy accepts (``edgeopt.policy.accept``: its INT8 bound and at
    most 5% of decisions differing, by its interval) at its faster
    thread setting, against ORT FP32 at *its* faster one: the ratio a user gets, whatever threads do."""
    arts = [a for a in res["arts"] if "error" not in a]
    fp = next(a for a in arts if a["label"].startswith("ORT FP32"))
    ok = [a for a in arts if a is not fp and a["passed"]]
    if not ok:
        return "No artifact the accuracy policy accepts."
    best = min(ok, key=_best_ms)
    ms, fp_ms = _best_ms(best), _best_ms(fp)
    return (f"Best vs best: {best['label']} at {ms:.2f} ms (its faster thread setting) vs ORT FP32 at "
            f"{fp_ms:.2f} ms (its faster one): **{fp_ms / ms:.2f}×** at {best['acc']}.")


def profile_table(res: dict) -> str:
    """Per bundle: the profiled time by op type (the 4 largest), from the runtime's own profiler."""
    rows = []
    for a in res["arts"]:
        prof = a.get("profile")
        if not prof:
            continue
        if prof.get("available") is False:
            rows.append({"art": a["label"], "prof": "—", "total": "—", "ops": _esc(prof.get("why", "no profiler"))})
            continue
        ops = ", ".join(f"{o['op']} {o['ms']:.2f} ms ({o['share']:.0%})" for o in prof["ops"][:4])
        rows.append({"art": a["label"], "prof": prof["profiler"], "total": f"{prof['nodes_total_ms']:.2f}",
                     "ops": ops})
    return md_table(rows, [("art", "bundle"), ("prof", "profiler"), ("total", "ms in ops per run, 1 thread"),
                           ("ops", "largest op types")]) if rows else ""


def runs_for(arts: list[dict]) -> list:
    return [OrtRun(a["path"], None, a["level"]) if a["kind"] == "ort" else BundleRun(a["bundle"], None) for a in arts]


# --- report -----------------------------------------------------------------------------------

def table(res: dict) -> str:
    arts = res["arts"]
    fp1 = next(a["ms1"] for a in arts if a["label"].startswith("ORT FP32"))
    fpd = next(a.get("msd") for a in arts if a["label"].startswith("ORT FP32"))
    rows = []
    for a in arts:
        if "error" in a:
            rows.append({"art": a["label"], "acc": "—", "ms1": "—", "x1": "—", "msd": "—", "xd": "—",
                         "graph": _esc(a["error"])})
            continue
        rows.append({"art": a["label"] + (f" ({_esc(a['note'])})" if a.get("note") else ""),
                     "acc": a["acc"] + ("" if a["passed"] else " (refused by the accuracy policy)"),
                     "ms1": f"{a['ms1']:.2f}", "x1": f"{fp1 / a['ms1']:.2f}×",
                     "msd": f"{a['msd']:.2f}" if a.get("msd") else "", "xd": f"{fpd / a['msd']:.2f}×" if a.get("msd") else "",
                     "graph": a["graph"]})
    cols = [("art", "artifact"), ("acc", "agreement with FP32 (validation)"), ("ms1", "ms, 1 thread"),
            ("x1", "vs ORT FP32, 1 thread"), ("msd", "ms, default threads"), ("xd", "vs ORT FP32, default threads"),
            ("graph", "what ORT runs (optimized graph)")]
    return md_table(rows, cols)


def _photos() -> str:
    import imagenet_cnn

    s = imagenet_cnn.split()
    return (f" Data: {s['photos']} real photos bundled in installed wheels, disjoint: {s['calib_photos']} calibrate "
            f"({s['calib_samples']} views), {s['val_photos']} validate ({s['val_samples']} views); see "
            "`bench/imagenet_cnn.py`.")


def _esc(s: str) -> str:
    return s.replace("|", "/").replace("\n", " ")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="imagenet,ocr-cls,ocr-rec,ocr-det",
                    help='comma-separated; "" re-renders the section from the stored blocks')
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--no-extras", action="store_true",
                    help="EfficientNet-Lite0 without the top1_min 0.95 and mobile (LiteRT) rows")
    ap.add_argument("--section", default="int8-cpu",
                    help="BENCHMARKS section (int8-cpu: the VNNI machine's; int8-cpu-avx2 for a CPU without VNNI)")
    args = ap.parse_args()
    store_path = STORE.with_name(f"blocks-{args.section}.json")
    from bench_qdq import model_jobs

    names = [n for n in args.models.split(",") if n]  # --models "": re-render the stored blocks only
    t_all = time.perf_counter()
    results, skipped = [], []
    with tempfile.TemporaryDirectory(prefix="bench-int8-cpu-") as tmp:
        work = Path(tmp)
        jobs, why = model_jobs(work, names) if names else ({}, None)  # the blocks are rendered in ORDER, whatever the run order
        if why:
            skipped.append(f"EfficientNet-Lite0: skipped, {why}")
        for name, job in jobs.items():
            print(f"{name}: {load()}", flush=True)
            res = measure_model(name, job, work, args.rounds, extras=not args.no_extras)
            results.append(res)
            if "error" in res:
                print(f"  {name}: {res['error']}", flush=True)
                continue
            print(table(res), flush=True)
            print(best_vs_best(res), flush=True)
            print(res.get("roofline", ""), flush=True)
            print(profile_table(res), flush=True)
    took = time.perf_counter() - t_all
    # Each model's block is kept between runs (its ratios come from its own interleaved loop, with its own
    # date and load), so one model can be re-measured on a quieter machine without re-running the others.
    store_path.parent.mkdir(parents=True, exist_ok=True)
    store = json.loads(store_path.read_text()) if store_path.exists() else {}
    for res in results:
        if "error" in res:
            block = [f"### {res['name']}", "", res["error"], ""]
        else:
            block = [f"### {res['name']}", "",
                     f"Measured {res['stamp']} in one interleaved run: {res['cal']} calibration and {res['val']} "
                     f"validation samples; {res['load0']} at the start, {res['load1']} at the end."
                     + (_photos() if res["name"] == "efficientnet-lite0" else ""), "", table(res), "",
                     best_vs_best(res), ""]
            if res.get("roofline"):
                block += ["How far from this CPU's limit (`bench/roofline.py`): the fastest ONNX Runtime artifact "
                          "the policy accepts and ORT FP32, as multiply-accumulates per second against the GEMM peak "
                          "measured at the same precision and threads, and the time memory traffic alone "
                          "would take.", "", res["roofline"], ""]
            prof = profile_table(res)
            if prof:
                block += ["Where the time goes (the agent's per-op decomposition, `edgeopt bench --profile`; "
                          "30 profiled runs of one sample, 1 thread):", "", prof, ""]
        store[res["name"]] = "\n".join(block)
    for s in skipped:
        store.setdefault("efficientnet-lite0", f"### efficientnet-lite0\n\n{s}\n")
    store_path.write_text(json.dumps(store, indent=1))
    avx2 = args.section != "int8-cpu"
    body = [f"## cpu INT8 on {'an AVX2 CPU without VNNI' if avx2 else 'a VNNI CPU'}: ONNX Runtime's choices vs "
            "plain ORT FP32 and OpenVINO", "",
            f"Measured by `bench/bench_int8_cpu.py` on {machine()}; each model's block says when and how loaded. "
            f"Each model's artifacts are timed in one interleaved loop ({args.rounds} rounds of one run each: "
            "A,B,C,…,A,B,C; medians, batch 1), first every artifact at 1 intra-op thread, then FP32 and the "
            "edgeopt bundles at each runtime's default threads (2 here). Agreement is on the bundles' validation "
            "samples against the FP32 reference, with the host check's own metrics. Manual variants: ORT's "
            "quantizer on the same calibration samples with its default MinMax ranges, one choice changed at a "
            "time; `what ORT runs` counts the node types of the graph ORT optimized at load. Rows whose optimized "
            "graphs are identical (QDQ vs QOperator U8S8 per-channel, per-channel vs per-tensor) show the noise "
            "of the run." + (" The goal on such a CPU (issue 13): the best artifact ≥ 2× plain ORT FP32 at ≥ 95% "
                             "top-1 agreement." if avx2 else " The AVX2-only figures are in section "
                             "`int8-cpu-avx2`."), ""]
    body += [store[n] for n in ORDER if n in store]
    if avx2:
        body.append(NOTES_AVX2)
    text = "\n".join(body)
    if not args.no_write:
        write_section(args.section, text)
    print(f"done in {took:.0f} s; {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
