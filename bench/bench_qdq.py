"""TensorRT INT8 through the shared Q/DQ search vs the direct path of before, on real models and data.

    .venv/bin/python bench/bench_qdq.py [--models ocr-cls,ocr-rec,ocr-det,imagenet] [--target jetson-orin]

For each model: the jetson-orin INT8 bundle built twice with the same data, ``trt_int8_search=false``
(the direct path: the four clipping rules, the one closest on calibration samples kept, then the host
check) and the default search (``targets/qdq_search.py``: clipping rules x per-channel, then layers
left without Q/DQ -- FP16 in the engine -- ranked by measured sensitivity, then the joint fallback).
Both are judged by the same host check (the Q/DQ ONNX in ONNX Runtime on the CPU, at the default
INT8 bound).  Writes the `trt-int8` section of docs/BENCHMARKS.md: variants tried, which passed, the
choice or the refusal naming what the closest variant missed, and the build time of each path.

Data: the fixture builds' own (``bench/build_fixtures.py``: text lines the FP32 detector finds in
skimage's page and photos for cls/rec, page views + photos for det); the ImageNet CNN comes from
``bench/imagenet_cnn.py`` when that module is present (EfficientNet-Lite0 with real weights and
real photos), else its row says it was skipped.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, machine, md_table, stamp, write_section  # noqa: E402

LINE = re.compile(r"int8: (PASS|fail) (.*)$")


def fixture_jobs(work: Path, names: list[str]) -> dict[str, dict]:
    """Per fixture model: build arguments (shapes, calib npz, counts, options) as build_fixtures uses."""
    from build_fixtures import prepare_data

    from edgeopt.fixtures import path

    data = prepare_data(work)
    jobs = {}
    for name in names:
        if name not in data:
            continue
        flags, calib = data[name]
        args = {"model": str(path(name)), "calib": calib, "shapes": {}, "options": {}, "n_val": None, "n_calib": 32}
        it = iter(flags)
        for f in it:
            v = next(it)
            if f == "--shape":
                n, _, s = v.partition(":")
                args["shapes"][n] = [int(d) for d in s.split("x")]
            elif f == "--val-count":
                args["n_val"] = int(v)
            elif f == "--calib-count":
                args["n_calib"] = int(v)
            elif f == "--option":
                k, _, val = v.partition("=")
                args["options"][k] = val
        jobs[name] = args
    return jobs


def imagenet_job(work: Path) -> tuple[dict | None, str]:
    """The EfficientNet-Lite0 job from bench/imagenet_cnn.py, or (None, why it is skipped)."""
    try:
        import imagenet_cnn  # noqa: F401 - written by another change; optional here
    except ImportError as exc:
        return None, f"bench/imagenet_cnn.py not importable ({exc})"
    for fn in ("efficientnet_lite0", "model_path", "build_model", "get_model", "prepare"):
        f = getattr(imagenet_cnn, fn, None)
        if callable(f):
            break
    else:
        return None, "bench/imagenet_cnn.py has no known entry point"
    try:
        got = f(work) if f.__code__.co_argcount else f()
    except Exception as exc:  # noqa: BLE001 - a missing wheel or download: say so, skip the row
        return None, f"imagenet_cnn.{fn} failed: {type(exc).__name__}: {str(exc)[:120]}"
    if isinstance(got, tuple):
        model, calib = got[0], got[1] if len(got) > 1 else getattr(imagenet_cnn, "CALIB", None)
    elif isinstance(got, dict):
        model, calib = got.get("model"), got.get("calib")
    else:
        model, calib = got, getattr(imagenet_cnn, "calib_path", lambda w: None)(work)
    if not model or not calib:
        return None, f"imagenet_cnn.{fn} gave no (model, calibration data)"
    import onnx

    inp = onnx.load(str(model), load_external_data=False).graph.input[0]
    shape = [d.dim_value or 1 for d in inp.type.tensor_type.shape.dim]
    # photos.npz is ordered calibration photos first, validation photos last (several views of each photo):
    # the head/tail split keeps the photos disjoint, where a shuffle would put views of one photo on both sides
    return {"model": str(model), "calib": str(calib), "shapes": {inp.name: shape}, "options": {"split": "head-tail"},
            "n_val": None, "n_calib": 32}, ""


def model_jobs(work: Path, names: list[str]) -> tuple[dict[str, dict], str | None]:
    """The build jobs of ``names`` (fixtures, and ``imagenet`` for EfficientNet-Lite0), fixtures first; with
    why the ImageNet CNN is skipped (None when it is not)."""
    jobs = fixture_jobs(work, [n for n in names if n != "imagenet"])
    why = None
    if "imagenet" in names:
        job, why = imagenet_job(work)
        if job is not None:
            jobs["efficientnet-lite0"], why = job, None
    return jobs, why


def run(job: dict, target: str, search: bool, out: Path) -> dict:
    """One pipeline build (forced: no cache) with the progress lines kept."""
    from edgeopt.pipeline import build

    lines: list[str] = []
    options = dict(job["options"], trt_int8_search=search)
    t0 = time.perf_counter()
    report = build(job["model"], target, ["int8"], shapes=job["shapes"], calib=job["calib"], out=out,
                   options=options, n_calib=job["n_calib"], n_val=job["n_val"], force=True, jobs=1,
                   progress=lines.append)
    wall = time.perf_counter() - t0
    res = report.results[0]
    variants = [(m.group(1) == "PASS", m.group(2)) for m in (LINE.search(s) for s in lines) if m]
    return {"res": res, "wall": wall, "lines": lines, "variants": variants}


def _short(text: str, n: int = 170) -> str:
    text = text.replace("|", "/").replace("\n", " ")
    return text if len(text) <= n else text[: n - 1] + "…"


def row(model: str, path: str, r: dict) -> dict:
    res = r["res"]
    m = res.manifest or {}
    q = (m.get("tensorrt") or {}).get("quantization") or {}
    tried = q.get("variants")
    if tried is not None:
        n, ok = len(tried), sum(v["passed"] for v in tried)
    elif path == "direct":
        cands = q.get("calibration_candidates") or {}
        n, ok = (len(cands) or 4), "—"
    else:
        n, ok = len(r["variants"]), sum(p for p, _ in r["variants"])
    if res.ok:
        chosen = q.get("chosen", {}).get("label") or f"{q.get('calibration')} (closest on calibration samples)"
        outcome = f"shipped: {chosen}"
        check = (m.get("prepared_onnx_check") or {}).get("summary") or ""
        if not check:
            pc = m.get("prepared_onnx_check") or {}
            check = "passed" if pc.get("passed") else "FAILED"
        floats = q.get("float_nodes", 0)
    else:
        err = res.error or ""
        if "the closest:" in err:
            outcome = "refused; closest " + err.split("the closest:", 1)[1].split("; INT8 is not shipped")[0]
        elif "fails its check" in err:
            outcome = "refused at the host check: " + err.split("ONNX Runtime on the host:", 1)[-1]
        else:
            outcome = "refused: " + err
        check, floats = "—", "—"
    return {"model": model, "path": path, "tried": n, "passed": ok, "float": floats,
            "outcome": _short(outcome, 230), "check": _short(check, 150), "time": f"{r['wall']:.0f} s"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="ocr-cls,ocr-rec,ocr-det,imagenet")
    ap.add_argument("--target", default="jetson-orin")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    names = args.models.split(",")
    t_all = time.perf_counter()
    rows, details, skipped = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        jobs, why = model_jobs(work, names)
        if why:
            skipped.append(f"ImageNet CNN (EfficientNet-Lite0): skipped, {why}")
            print("  imagenet:", why, flush=True)
        for name, job in jobs.items():
            for path, search in (("direct", False), ("search", True)):
                r = run(job, args.target, search, work / f"out-{name}-{path}")
                rows.append(row(name, path, r))
                print(f"  {name} {path}: {rows[-1]['outcome'][:120]} ({rows[-1]['time']})", flush=True)
                if search:
                    q = ((r["res"].manifest or {}).get("tensorrt") or {}).get("quantization") or {}
                    vs = [(v["passed"], v["label"] + ": " + ", ".join(
                        f"cos {mm.get('cosine', 0):.4f} rel_l2 {mm.get('rel_l2', 0):.3f}"
                        + (f" top1 {mm['top1']:.0%}" if "top1" in mm else "")
                        + (f" ctc {mm['seq_match']:.0%}" if "seq_match" in mm else "")
                        for mm in v["metrics"].values())) for v in q.get("variants", [])] or r["variants"]
                    details.append((name, vs))
    took = time.perf_counter() - t_all
    cols = [("model", "model"), ("path", "path"), ("tried", "variants tried"), ("passed", "passed"),
            ("float", "nodes left float"), ("outcome", "chosen / refusal"), ("check", "host check of the shipped Q/DQ ONNX"),
            ("time", "build")]
    body = [f"## TensorRT INT8: the shared Q/DQ search vs the direct path ({args.target})", "",
            f"Measured {stamp()} by `bench/bench_qdq.py` on {machine()} in {took:.0f} s ({load()} at the end). "
            "Each model is built twice with the same data (forced, no cache): `direct` = `trt_int8_search=false` "
            "(clipping rules max / percentile-99.999 / percentile-99.99 / mse, the closest on calibration samples "
            "kept, then the host check); `search` = the default shared search (`targets/qdq_search.py`). Both are "
            "judged by the same host check -- the Q/DQ ONNX in ONNX Runtime on the CPU at the default INT8 bound "
            "(docs/TOLERANCES.md) -- not by a TensorRT engine (none here). Build time is the whole pipeline build "
            "(preparation, onnxsim, calibration, search, host check). Data as in `bench/build_fixtures.py`.", "",
            md_table(rows, cols), ""]
    for name, vs in details:
        body.append(f"<details><summary>{name}: {len(vs)} variant(s) of the search</summary>\n")
        body += [f"- {'PASS' if p else 'fail'} {_short(t, 300)}" for p, t in vs]
        body.append("\n</details>\n")
    body += [f"- {s}" for s in skipped]
    text = "\n".join(body)
    print(text)
    if not args.no_write:
        write_section("trt-int8", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
