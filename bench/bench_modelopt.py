"""NVIDIA ModelOpt's ONNX PTQ (issue 13's reference) vs edgeopt's TensorRT INT8 Q/DQ search, on the same data.

    .venv/bin/python bench/bench_modelopt.py [--models ocr-cls,ocr-rec,ocr-det,imagenet]
        [--modelopt-python /tmp/modelopt-venv/bin/python] [--no-write]

ModelOpt cannot join the project's environment (``nvidia-modelopt[onnx]`` 0.47 needs onnx ~= 1.21 and
pulls torch, cupy and onnxruntime-gpu), so it runs in a throw-away venv as a child process; this
process never imports it.  Make that venv once (the CPU torch wheel first, so pip keeps it and does not
fetch CUDA torch)::

    /usr/bin/python3.11 -m venv /tmp/modelopt-venv
    /tmp/modelopt-venv/bin/pip install /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
    /tmp/modelopt-venv/bin/pip install "nvidia-modelopt[onnx]==0.47.0"

Per model (PP-OCR cls / rec / det from ``bench_qdq.fixture_jobs``, EfficientNet-Lite0 from
``bench/imagenet_cnn.py``), with the data of ``bench/bench_qdq.py``:

1. **The same data**: the pipeline's own preparation (``pipeline._prepare``: static shapes, the
   calibration / validation split, the ONNX Runtime FP32 reference), then ``trt_prep.prepare`` as the
   jetson-orin build runs it (opset >= 13, onnxsim) -- the FP32 graph edgeopt's search quantizes is
   the graph ModelOpt is given, with the same calibration samples.
2. **edgeopt**: the jetson-orin INT8 build with the default search, as ``bench_qdq.py`` runs it (forced).
3. **ModelOpt**: ``modelopt.onnx.quantization.quantize(quantize_mode="int8")`` with each calibration
   method it offers for INT8 (``max``, ``entropy``), ``calibration_eps=["cpu"]``, and the float parts
   kept FP32 (``high_precision_dtype="fp32"``: the host judges edgeopt's float layers in FP32 too) and,
   as ModelOpt ships by default, FP16 (``"fp16"``).
4. **One judge**: every Q/DQ ONNX runs in ONNX Runtime on the CPU with graph optimisations off (as the
   TensorRT target's host check runs it) on the same validation samples, judged by
   ``edgeopt_agent.compare.compare_outputs(.., "int8", tolerance, output_kinds)`` -- the default INT8
   bound unless the job sets one.  Counted from each graph: QuantizeLinear / DequantizeLinear nodes,
   the weighted layers (Conv, ConvTranspose, Gemm, MatMul) left without a DequantizeLinear input, and
   which op types read a DequantizeLinear (where each tool places Q/DQ).

Writes the ``modelopt`` section of docs/BENCHMARKS.md.  No GPU: TensorRT is not run, so the comparison is
of accuracy and Q/DQ placement, not of engine speed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, machine, md_table, stamp, write_section  # noqa: E402

TARGET = "jetson-orin"
MODELOPT_PYTHON = os.environ.get("EDGEOPT_MODELOPT_PYTHON", "/tmp/modelopt-venv/bin/python")
WEIGHTED = ("Conv", "ConvTranspose", "Gemm", "MatMul")
METHODS = ("max", "entropy")
HIGH_PRECISION = ("fp32", "fp16")

# Run in the throw-away venv: argv = float.onnx calib.npz out.onnx method high_precision_dtype op_types
# (op_types: "" for ModelOpt's own placement, else a comma list for ``op_types_to_quantize``).  ModelOpt
# logs to stdout (DEBUG names the nodes it excludes and why); the last line is this script's JSON.
_CHILD = r"""
import json, sys, time
import numpy as np
src, calib, dst, method, hp, op_types = sys.argv[1:7]
t0 = time.perf_counter()
import modelopt, onnx, onnxruntime
from modelopt.onnx.quantization import quantize
t_import = time.perf_counter() - t0
with np.load(calib) as z:
    data = {k: z[k] for k in z.files}
t1 = time.perf_counter()
quantize(src, quantize_mode="int8", calibration_data=data, calibration_method=method,
         calibration_eps=["cpu"], high_precision_dtype=hp, output_path=dst, log_level="DEBUG",
         op_types_to_quantize=op_types.split(",") if op_types else None)
secs = time.perf_counter() - t1
m = onnx.load(dst, load_external_data=False)
print(json.dumps({"seconds": secs, "import_s": t_import, "modelopt": modelopt.__version__, "onnx": onnx.__version__,
                  "onnxruntime": onnxruntime.__version__, "torch": __import__("torch").__version__,
                  "opset": max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
                  "ir_version": m.ir_version}))
"""


# --- data -------------------------------------------------------------------------------------------
def prepare(job: dict, work: Path) -> dict[str, Any]:
    """The pipeline's data for ``job`` (same split, same reference) and the FP32 graph the search quantizes."""
    import onnx

    from edgeopt import calib as calibmod
    from edgeopt import model as modelmod
    from edgeopt.calib import load_stacked
    from edgeopt.pipeline import _prepare
    from edgeopt.targets.base import BuildJob, output_kinds
    from edgeopt.targets.registry import resolve_targets
    from edgeopt.targets.tensorrt import prep as trt_prep
    from edgeopt.targets.tensorrt import resolve_options

    work.mkdir(parents=True, exist_ok=True)
    info = modelmod.inspect(job["model"])
    static = modelmod.static_input_shapes(info, job["shapes"])
    io = {"inputs": [{"name": t.name, "shape": static[t.name], "dtype": t.dtype} for t in info.inputs],
          "outputs": [{"name": t.name, "shape": None, "dtype": t.dtype} for t in info.outputs]}
    _prepare(work, job["model"], info, static, io, job["calib"], calibmod.Preprocess.parse(None), job["n_calib"],
             job["n_val"], {}, lambda s: None)
    spec = resolve_targets(TARGET)[0].as_dict()
    options = dict(job["options"])
    bj = BuildJob(info.name, str(Path(job["model"]).resolve()), info.sha256, str(work / "prepared.onnx"), spec,
                  "int8", str(work / "bundle"), io, str(work / "calib.npz"), str(work / "validation.npz"),
                  str(work / "reference.npz"), {}, options)
    o = resolve_options(options, spec, "int8")
    names = [t["name"] for t in io["inputs"]]
    out_names = [t["name"] for t in io["outputs"]]
    prepared = trt_prep.prepare(onnx.load(bj.prepared_path), static, {}, trt_prep.QDQ_MIN_OPSET["int8"],
                                simplify=o["trt_simplify"], table=trt_prep.table_for_target(spec))
    trt_prep.save_model(prepared.model, work / "float.onnx")
    calib = load_stacked(bj.calib_path, names, "in")
    np.savez(work / "calib_modelopt.npz", **{n: np.concatenate([c[n] for c in calib]) for n in names})
    with np.load(bj.reference_path) as z:
        reference = {n: z[f"out{i}"] for i, n in enumerate(out_names)}
    return {"float": work / "float.onnx", "calib_npz": work / "calib_modelopt.npz", "n_calib": len(calib),
            "val": load_stacked(bj.validation_path, names, "in"), "reference": reference, "out_names": out_names,
            "kinds": output_kinds(bj), "tolerance": o["int8"].tolerance}


# --- judging and counting ---------------------------------------------------------------------------
def judge(path: Path, data: dict) -> dict[str, Any]:
    """The host check's rule on ``path`` (ORT CPU, optimisations off) over the validation samples."""
    import onnxruntime as ort

    from edgeopt_agent.compare import compare_outputs

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        outs = [sess.run(data["out_names"], f) for f in data["val"]]
    except Exception as exc:  # noqa: BLE001 - e.g. an FP16 op the CPU provider lacks: a row, not a crash
        return {"passed": False, "summary": f"ORT CPU cannot run it: {str(exc).strip().splitlines()[0][:160]}",
                "metrics": {}}
    outputs = {n: np.stack([o[i] for o in outs]).astype(np.float32) for i, n in enumerate(data["out_names"])}
    res = compare_outputs(outputs, data["reference"], "int8", data["tolerance"], data["kinds"])
    return {"passed": bool(res["passed"]), "summary": res["summary"],
            "metrics": {n: o["metrics"] for n, o in res["outputs"].items()}}


def round_fp16_quantize(path: Path) -> tuple[Path, int]:
    """A copy of ``path`` whose QuantizeLinear nodes with FLOAT16 inputs quantize in FP32 (a Cast on the
    input, an FP32 copy of the scale), and how many were changed.  ONNX Runtime's CPU QuantizeLinear
    truncates FLOAT16 inputs toward zero instead of rounding to nearest even (microsoft/onnxruntime#18576,
    #22741; fixed by PR #32452, after 1.24): an FP16 Q/DQ model judged as written looks worse than it is."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    m = onnx.load(str(path))
    inits = {i.name: i for i in m.graph.initializer}
    m16 = onnx.shape_inference.infer_shapes(m)
    types = {v.name: v.type.tensor_type.elem_type for v in (*m16.graph.value_info, *m16.graph.input, *m16.graph.output)}
    types.update({i.name: i.data_type for i in m.graph.initializer})
    nodes, changed = [], 0
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear" and types.get(n.input[0]) == TensorProto.FLOAT16 and n.input[1] in inits:
            x32, s32 = f"{n.input[0]}__fp32_for_{n.name}", f"{n.input[1]}__fp32_for_{n.name}"
            nodes.append(helper.make_node("Cast", [n.input[0]], [x32], to=TensorProto.FLOAT, name=f"{n.name}__cast"))
            m.graph.initializer.append(numpy_helper.from_array(
                numpy_helper.to_array(inits[n.input[1]]).astype(np.float32), s32))
            n.input[0], n.input[1] = x32, s32
            changed += 1
        nodes.append(n)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    dst = path.with_name(path.stem + "-fp32-rounding.onnx")
    onnx.save(m, str(dst))
    return dst, changed


def metric_text(metrics: dict[str, dict[str, float]]) -> str:
    parts = []
    for m in metrics.values():
        s = f"cos {m.get('cosine', float('nan')):.4f}, rel_l2 {m.get('rel_l2', float('nan')):.3f}"
        if "top1" in m:
            n = int(m.get("top1_n") or 0)
            s += f", top-1 {m['top1']:.0%}" + (f" ({round(m['top1'] * n)}/{n})" if n else "")
        if "seq_match" in m:
            s += f", CTC {m['seq_match']:.0%}"
        if "box_match" in m:
            s += f", boxes {m['box_match']:.0%}"
        parts.append(s)
    return "; ".join(parts) or "—"


def census(path: Path) -> dict[str, Any]:
    """Q/DQ nodes, weighted layers without a DequantizeLinear input, op types reading a DequantizeLinear."""
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    inits = {i.name for i in g.initializer}
    dq_out = {o for n in g.node if n.op_type == "DequantizeLinear" for o in n.output}
    dq_of_const = {n.output[0] for n in g.node if n.op_type == "DequantizeLinear" and n.input[0] in inits}
    ops = Counter(n.op_type for n in g.node)
    weighted = [n for n in g.node if n.op_type in WEIGHTED]
    float_weighted = [n for n in weighted if not any(i in dq_out for i in n.input)]
    # activation inputs quantized: a DQ output that is not a constant weight's, read by a non-Q/DQ node
    act_readers = Counter(n.op_type for n in g.node if n.op_type not in ("QuantizeLinear", "DequantizeLinear")
                          and any(i in dq_out and i not in dq_of_const for i in n.input))
    casts = ops.get("Cast", 0)
    fp16 = sum(1 for i in g.initializer if i.data_type == onnx.TensorProto.FLOAT16)
    return {"q": ops.get("QuantizeLinear", 0), "dq": ops.get("DequantizeLinear", 0), "weighted": len(weighted),
            "float_weighted": len(float_weighted), "float_names": [n.name for n in float_weighted],
            "act_readers": dict(act_readers), "casts": casts, "fp16_inits": fp16}


def edgeopt_placement(data: dict) -> dict[str, Any]:
    """edgeopt's full placement (``trt_prep.plan_qdq``, every rule, nothing excluded) on the graph both tools
    are given: the census of a Q/DQ model made from it (scales are irrelevant to where pairs go)."""
    import onnx

    from edgeopt.targets.tensorrt import prep as trt_prep

    model = onnx.load(str(data["float"]))
    trt_prep._name_nodes(model)  # as search_int8 does before planning
    plan = trt_prep.plan_qdq(model)
    dst = Path(data["float"]).with_name("edgeopt-placement.onnx")
    trt_prep.save_model(trt_prep.insert_qdq(model, plan, {t: 1.0 for t in plan.activations}, "int8"), dst)
    c = census(dst)
    c["rules"] = plan.placement(model.graph)["rule_counts"]
    c["left_float_why"] = Counter(d["why"].split(":")[0] for d in plan.left_float)
    return c


def readers_text(c: dict[str, Any]) -> str:
    return ", ".join(f"{op} {k}" for op, k in sorted(c["act_readers"].items(), key=lambda x: (-x[1], x[0])))


# --- the two tools ----------------------------------------------------------------------------------
def run_modelopt(py: str, data: dict, method: str, hp: str, work: Path, op_types: str = "") -> dict[str, Any]:
    tag = f"{method}-{hp}" + ("-weighted-only" if op_types else "")
    dst, log = work / f"modelopt-{tag}.onnx", work / f"modelopt-{tag}.log"
    t0 = time.perf_counter()
    proc = subprocess.run([py, "-c", _CHILD, str(data["float"]), str(data["calib_npz"]), str(dst), method, hp, op_types],
                          capture_output=True, text=True, cwd=work, timeout=1800)
    wall = time.perf_counter() - t0
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()][-1:] or ["?"]
        return {"ok": False, "error": tail[0][:200], "wall": wall}
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    excluded = {"small-channel Conv": len(re.findall(r"Found Conv with I/O channel size less than 16", proc.stdout)),
                "GEMV MatMul/Gemm": sum(int(k) for k in re.findall(r"Excluding (\d+) MatMul nodes due to GEMV",
                                                                  proc.stdout))}
    types = re.search(r"Quantizable op types: \[(.*?)\]", proc.stdout)
    return {"ok": True, "path": dst, "wall": wall, "excluded": {k: v for k, v in excluded.items() if v},
            "op_types": types.group(1).replace("'", "") if types else "?", **info}


def run_edgeopt(job: dict, work: Path) -> dict[str, Any]:
    """The jetson-orin INT8 build with the default search (bench_qdq's run) and its shipped Q/DQ ONNX."""
    from bench_qdq import row, run

    r = run(job, TARGET, True, work / "edgeopt-out")
    res = r["res"]
    out = {"wall": r["wall"], "row": row(job["model"], "search", r), "ok": res.ok, "error": res.error or ""}
    if res.ok and res.bundle:
        out["path"] = Path(res.bundle) / "model.onnx"
        out["bundle"] = Path(res.bundle)
        q = ((res.manifest or {}).get("tensorrt") or {}).get("quantization") or {}
        out["chosen"] = (q.get("chosen") or {}).get("label", "")
        out["variants"] = len(q.get("variants") or [])
    return out


def same_validation(bundle: Path, data: dict) -> bool:
    with np.load(bundle / "validation" / "inputs.npz") as z:
        got = [z[k] for k in sorted(z.files)]
    mine = [np.stack([v[n] for v in data["val"]]) for n in data["val"][0]]
    return len(got) == len(mine) and all(a.shape == b.shape and np.array_equal(a, b) for a, b in zip(got, mine))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="ocr-cls,ocr-rec,ocr-det,imagenet")
    ap.add_argument("--modelopt-python", default=MODELOPT_PYTHON)
    ap.add_argument("--keep", default=None, help="keep the Q/DQ ONNX files and logs under this folder")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    from bench_qdq import model_jobs

    names = args.models.split(",")
    t_all = time.perf_counter()
    rows: list[dict] = []
    placement: list[str] = []
    notes: list[str] = []
    versions: dict[str, Any] = {}
    py_ok = Path(args.modelopt_python).exists()
    if not py_ok:
        notes.append(f"ModelOpt not measured: {args.modelopt_python} does not exist (see the commands in "
                     "bench/bench_modelopt.py's docstring)")
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-modelopt-"))
    tmp.mkdir(parents=True, exist_ok=True)
    jobs, why = model_jobs(tmp, names)
    if why:
        notes.append(f"ImageNet CNN (EfficientNet-Lite0): skipped, {why}")
    for name, job in jobs.items():
        work = tmp / name
        data = prepare(job, work)
        print(f"{name}: {data['n_calib']} calibration, {len(data['val'])} validation samples", flush=True)
        e = run_edgeopt(job, work)
        if e.get("path"):
            j, c = judge(e["path"], data), census(e["path"])
            if not same_validation(e["bundle"], data):
                notes.append(f"{name}: the bundle's validation inputs differ from this script's -- check the data")
            outcome = f"shipped: {e['chosen']}"
        else:
            j, c = {"passed": False, "metrics": {}}, None
            outcome = e["row"]["outcome"]
            outcome = (f"nothing shipped: none of {e['row']['tried']} variants met the bound (the closest shown)"
                       if "closest" in outcome else outcome)
        rows.append({"model": name, "tool": "edgeopt search", "verdict": "PASS" if j["passed"] else "refused",
                     "metrics": metric_text(j["metrics"]) if c else _closest(e["row"]["outcome"]), "q": _qdq(c),
                     "float": f"{c['float_weighted']}/{c['weighted']}" if c else "—",
                     "time": f"{e['wall']:.0f} s (whole build)", "note": _short(outcome)})
        p = edgeopt_placement(data)
        why = ", ".join(f"{v} {k}" for k, v in p["left_float_why"].items())
        placement.append(f"- {name}, edgeopt (`plan_qdq`, before any search fallback; rules: "
                         + ", ".join(f"{k} {v}" for k, v in p["rules"].items()) + "): activations quantized at "
                         f"the inputs of {readers_text(p)}; weighted layers left float: {p['float_weighted']}"
                         + (f" ({why})" if why else ""))
        print(f"  edgeopt: {rows[-1]['verdict']} {rows[-1]['metrics']} ({rows[-1]['time']})", flush=True)
        if not py_ok:
            continue
        variants = [(method, hp, "") for method in METHODS for hp in HIGH_PRECISION]
        variants.append(("max", "fp32", ",".join(WEIGHTED)))  # ablation: edgeopt's op types only
        for method, hp, op_types in variants:
            m = run_modelopt(args.modelopt_python, data, method, hp, work, op_types)
            label = f"ModelOpt {method}, float {hp.upper()}" + (
                ", only Conv/ConvTranspose/Gemm/MatMul (`op_types_to_quantize`)" if op_types else "")
            if not m["ok"]:
                rows.append({"model": name, "tool": label, "verdict": "error", "metrics": "—", "q": "—",
                             "float": "—", "time": f"{m['wall']:.0f} s", "note": _short(m["error"])})
                print(f"  {label}: error {m['error']}", flush=True)
                continue
            versions = {k: m[k] for k in ("modelopt", "onnx", "onnxruntime", "torch")}
            j, c = judge(m["path"], data), census(m["path"])
            note = f"opset {m['opset']}"
            if c["casts"] or c["fp16_inits"]:
                note += f", {c['casts']} Cast, {c['fp16_inits']} FP16 initializers"
            if hp == "fp16":  # judged with correct rounding; ORT CPU's own FP16 rounding said in the note
                fixed, n_fixed = round_fp16_quantize(m["path"])
                if n_fixed:
                    raw, j = j, judge(fixed, data)
                    note += (f"; as ORT CPU runs it ({n_fixed} FP16 QuantizeLinear truncating, "
                             f"onnxruntime#18576): {'PASS' if raw['passed'] else 'fail'} "
                             f"{metric_text(raw['metrics'])}")
            if not j["metrics"]:
                note += "; " + j["summary"]
            rows.append({"model": name, "tool": label, "verdict": "PASS" if j["passed"] else "fail",
                         "metrics": metric_text(j["metrics"]), "q": _qdq(c),
                         "float": f"{c['float_weighted']}/{c['weighted']}",
                         "time": f"{m['seconds']:.0f} s (+{m['wall'] - m['seconds']:.0f} s start)",
                         "note": _short(note)})
            if hp == "fp32" and method == "max" and not op_types:
                why = ", ".join(f"{v} {k}" for k, v in m["excluded"].items())
                placement.append(f"- {name}, ModelOpt (quantizable op types here: {m['op_types']}): activations "
                                 f"quantized at the inputs of {readers_text(c)}; weighted layers left float: "
                                 f"{c['float_weighted']}" + (f" (its exclusion rules: {why})" if why else ""))
            print(f"  {label}: {rows[-1]['verdict']} {rows[-1]['metrics']} Q/DQ {rows[-1]['q']} "
                  f"({rows[-1]['time']})", flush=True)
    took = time.perf_counter() - t_all
    cols = [("model", "model"), ("tool", "tool / variant"), ("verdict", "default INT8 bound"),
            ("metrics", "host check (validation samples)"), ("q", "Q / DQ nodes"),
            ("float", "weighted layers left float"), ("time", "time"), ("note", "notes")]
    ver = ", ".join(f"{k} {v}" for k, v in versions.items()) or "not measured"
    body = [f"## ModelOpt ONNX PTQ vs edgeopt's TensorRT INT8 search ({TARGET})", "",
            f"Measured {stamp()} by `bench/bench_modelopt.py` on {machine()} in {took:.0f} s ({load()} at the end). "
            f"ModelOpt ({ver}) runs in a throw-away venv (CPU torch, `calibration_eps=[\"cpu\"]`; its `[onnx]` "
            "extra cannot join the project's environment) on the FP32 graph edgeopt's search quantizes "
            "(`trt_prep.prepare`: static shapes, opset >= 13, onnxsim) with the same calibration samples. Every "
            "Q/DQ ONNX is judged by the host check's rule (`compare_outputs(.., \"int8\", tolerance, output_kinds)`, "
            "ONNX Runtime CPU, optimisations off) on the same validation samples and FP32 reference. `float FP32`: "
            "ModelOpt's `high_precision_dtype=\"fp32\"`; `float FP16`: its default, the non-INT8 parts converted to "
            "FP16 in the ONNX. edgeopt's time is its whole jetson-orin build (preparation, reference, search, "
            "cross-check, host check); ModelOpt's is its `quantize()` call (+ the child's start and imports). No "
            "GPU: neither is run in TensorRT here.", "", md_table(rows, cols), "",
            "Where each places Q/DQ (op types reading a quantized activation, count of such inputs):", "",
            *placement, ""]
    body += [f"- {s}" for s in notes]
    text = "\n".join(body)
    print(text)
    if not args.no_write:
        write_section("modelopt", text)
    return 0


def _qdq(c: dict | None) -> str:
    return f"{c['q']} / {c['dq']}" if c else "—"


def _short(text: str, n: int = 160) -> str:
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= n else text[: n - 1] + "…"


def _closest(outcome: str) -> str:
    return _short(outcome.split("closest", 1)[-1].strip(), 120) if "closest" in outcome else "—"


if __name__ == "__main__":
    sys.exit(main())
