"""Latency of every built artifact against a plain ONNX Runtime FP32 session of the original model,
and edgeopt's build time against calling the converters directly.

    .venv/bin/python bench/bench_latency.py [--models ocr-cls,ocr-rec] [--targets cpu,intel-cpu,mobile]
                                           [--rounds 15] [--iters 20] [--build-only]

Latency: batch 1, in-process, each artifact loaded once through the agent's own runner (the same
code that runs on a device), fed the bundle's rotating validation inputs. Interleaved: every round
runs `--iters` calls of each artifact (in a shuffled order) and of the baseline, so machine noise
hits all of them alike; the figure is the median over all rounds. Writes the `latency` and
`build-time` sections of docs/BENCHMARKS.md (`--build-only`: no latency run, only `build-time`).

Build time: each `edgeopt build --force` in an empty cache, against each vendor's converter called
directly with its defaults on the same static-shape model and calibration samples (see the section's
text for what each direct figure includes); onnx2tf and TensorFlow run in a child process
(`--tflite-child`, internal).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, machine, md_table, stamp, write_section  # noqa: E402

MODELS = {  # fixture -> (shape flag, preprocess, calibration source)
    "ocr-cls": ("x:1x3x48x192", "preset=pm1", "images"),
    "ocr-rec": ("x:1x3x48x320", "preset=pm1", "images"),
    "ocr-det": ("x:1x3x640x640", "preset=imagenet", "images"),
}
PRECISIONS = {"cpu": ["fp32", "int8"], "intel-cpu": ["fp32", "fp16", "int8"], "mobile": ["fp32", "fp16", "int8"]}


def build_all(model: str, targets: list[str], out: Path) -> dict:
    """Build with the CLI (each in an empty cache, --force) and return {target-precision: (bundle dir, wall s)}."""
    from edgeopt.fixtures import path

    shape, pre, calib = MODELS[model]
    built = {}
    for target in targets:
        for prec in PRECISIONS[target]:
            cmd = [sys.executable, "-m", "edgeopt", "build", str(path(model)), "--targets", target, "--precision", prec,
                   "--shape", shape, "--preprocess", pre, "--calib", str(path(calib)), "--out", str(out), "--force",
                   "--json", "-q"]
            # An empty cache for every build: the mobile precisions would otherwise share one onnx2tf
            # SavedModel (fp16/int8 timed without onnx2tf), unlike the direct figures.
            cache = tempfile.mkdtemp(prefix="edgeopt-bench-cache-")
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "EDGEOPT_CACHE_DIR": cache})
            wall = time.perf_counter() - t0
            shutil.rmtree(cache, ignore_errors=True)
            try:
                report = json.loads(proc.stdout)
            except json.JSONDecodeError:
                print(f"  {model} {target} {prec}: build crashed: {proc.stderr[-300:]}")
                continue
            r = report["results"][0]
            print(f"  {model} {target} {prec}: {r['status']} in {wall:.1f}s {r.get('check', '')[:80]}", flush=True)
            if r["status"] in ("built", "cached", "up-to-date"):
                built[f"{target} {prec}"] = (Path(r["bundle"]), wall)
    return built


def calibration_samples(model: str) -> tuple[list[dict], list[dict]]:
    """The calibration and validation feeds the build used: `edgeopt build`'s own data step
    (edgeopt.calib.load_data) on the same --calib/--preprocess/--shape and its default counts/seed."""
    from edgeopt import calib as calibmod
    from edgeopt import model as modelmod
    from edgeopt.fixtures import path

    shape, pre, calib = MODELS[model]
    name, dims = shape.split(":")
    info = modelmod.inspect(path(model))
    static = modelmod.static_input_shapes(info, {name: [int(d) for d in dims.split("x")]})
    inputs = [{"name": t.name, "shape": static[t.name], "dtype": t.dtype} for t in info.inputs]
    data = calibmod.load_data(str(path(calib)), inputs, calibmod.Preprocess.parse(pre), 32, 8, seed=0)
    return data.calibration, data.validation


def same_data(validation: list[dict], bundles: dict) -> bool | None:
    """Whether the regenerated validation feeds equal a built bundle's (so the calibration set is the
    build's too: both come from one load_data call); None when there is no bundle to compare with."""
    from edgeopt_agent.bundle import load_manifest, validation_inputs

    if not bundles:
        return None
    bundle = next(iter(bundles.values()))[0]
    theirs = validation_inputs(bundle, load_manifest(bundle))
    return len(theirs) == len(validation) and all(
        np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for a, b in zip(theirs, validation) for k in b)


def _first_line(exc: BaseException) -> str:
    import traceback

    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    if lines:
        return f"{type(exc).__name__}: {lines[0][:160]}"
    tb = traceback.extract_tb(exc.__traceback__)
    return f"{type(exc).__name__} in {tb[-1].name}()" if tb else type(exc).__name__


def direct_converter_times(model: str, work: Path, targets: list[str], samples: list[dict]) -> dict[str, dict]:
    """Each converter called directly with its defaults on the same static-shape model and the same
    calibration samples (no checks). {label: {"s": seconds, "parts": text} or {"error": text}};
    imports are done before the clock starts."""
    import onnx

    from edgeopt import model as modelmod
    from edgeopt.fixtures import path

    shape = MODELS[model][0]
    name, dims = shape.split(":")
    static = modelmod.make_static(modelmod.load(path(model)), {name: [int(d) for d in dims.split("x")]})
    src = work / f"{model}-static.onnx"
    onnx.save(static, str(src))
    out: dict[str, dict] = {}
    if "cpu" in targets:
        import onnxruntime as ort
        from onnxruntime.quantization import CalibrationDataReader, quantize_static
        from onnxruntime.quantization.shape_inference import quant_pre_process

        t0 = time.perf_counter()
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(work / "ort-opt.onnx")
        ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
        out["cpu fp32"] = {"s": time.perf_counter() - t0}

        class Reader(CalibrationDataReader):
            def __init__(self, feeds: list[dict]) -> None:
                self.it = iter(feeds)

            def get_next(self):
                return next(self.it, None)

        # ORT's quantization docs recommend its pre-processing step (shape inference + optimization)
        # first. Its symbolic shape inference may refuse a model: then its documented switch
        # skip_symbolic_shape=True, as a user would, and the figure says so.
        failed = []
        for kw in ({}, {"skip_symbolic_shape": True}):
            what = ", ".join(f"{k}={v}" for k, v in kw.items()) or "defaults"
            try:
                t0 = time.perf_counter()
                quant_pre_process(str(src), str(work / "ort-pre.onnx"), **kw)
                t1 = time.perf_counter()
                break
            except Exception as exc:
                failed.append(f"`quant_pre_process` with {what} failed after {time.perf_counter() - t0:.1f} s "
                              f"({_first_line(exc)}); timed with skip_symbolic_shape=True")
        else:
            out["cpu int8"] = {"error": failed[-1]}
            t1 = None
        if t1 is not None:
            try:
                quantize_static(str(work / "ort-pre.onnx"), str(work / "ort-int8.onnx"), Reader(samples))
                t2 = time.perf_counter()
                out["cpu int8"] = {"s": t2 - t0, "parts": f"pre-process {t1 - t0:.1f} + quantize_static {t2 - t1:.1f}",
                                   "fallback": failed[:1]}
            except Exception as exc:
                out["cpu int8"] = {"error": "quantize_static: " + _first_line(exc)}
    if "intel-cpu" in targets:
        try:
            import openvino as ov
        except ImportError:
            ov = None
        if ov is not None:
            for prec in ("fp32", "fp16"):
                t0 = time.perf_counter()
                ov.save_model(ov.convert_model(str(src)), str(work / f"ov-{prec}.xml"), compress_to_fp16=prec == "fp16")
                out[f"intel-cpu {prec}"] = {"s": time.perf_counter() - t0}
            try:
                import nncf

                t0 = time.perf_counter()
                ov_model = ov.convert_model(str(src))
                t1 = time.perf_counter()
                quantized = nncf.quantize(ov_model, nncf.Dataset(samples))
                t2 = time.perf_counter()
                ov.save_model(quantized, str(work / "ov-int8.xml"))
                t3 = time.perf_counter()
                out["intel-cpu int8"] = {"s": t3 - t0, "parts": f"convert {t1 - t0:.1f} + nncf.quantize "
                                         f"{t2 - t1:.1f} + save {t3 - t2:.1f}"}
            except Exception as exc:
                out["intel-cpu int8"] = {"error": _first_line(exc)}
    if "mobile" in targets:
        out.update(direct_tflite(src, work / "direct-tflite", samples))
    return out


SAMPLE_FILE = "calibration_image_sample_data_20x128x128x3_float32.npy"  # what onnx2tf would download


def direct_tflite(src: Path, work: Path, samples: list[dict]) -> dict[str, dict]:
    """onnx2tf, then TFLiteConverter per precision, in a child process (TensorFlow's state and
    onnx2tf's output stay out of this one); its log is kept in `work`."""
    import shutil

    work.mkdir(parents=True, exist_ok=True)
    copy = work / "model.onnx"  # onnx2tf rewrites its input in place
    shutil.copyfile(src, copy)
    names = list(samples[0])
    np.savez(work / "calib.npz", **{f"in{i}": np.stack([s[n] for s in samples]) for i, n in enumerate(names)})
    req = work / "request.json"
    req.write_text(json.dumps({"model": str(copy), "work": str(work), "inputs": names}))
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")  # onnx2tf runs `onnxsim`
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    with open(work / "child.log", "wb") as log:
        try:
            subprocess.run([sys.executable, str(Path(__file__).resolve()), "--tflite-child", str(req)], cwd=work,
                           env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=1800)
        except subprocess.TimeoutExpired:
            return {f"mobile {p}": {"error": "timed out after 1800 s"} for p in PRECISIONS["mobile"]}
    try:
        reply = json.loads((work / "reply.json").read_text())
    except (OSError, ValueError):
        return {f"mobile {p}": {"error": f"the child crashed (log: {work / 'child.log'})"}
                for p in PRECISIONS["mobile"]}
    res: dict[str, dict] = {}
    for p in PRECISIONS["mobile"]:
        if "onnx2tf_s" not in reply:
            res[f"mobile {p}"] = {"error": "onnx2tf: " + reply.get("onnx2tf_error", "?")}
        elif f"{p}_s" not in reply:
            res[f"mobile {p}"] = {"error": "TFLiteConverter: " + reply.get(f"{p}_error", "?")}
        else:
            o, c = reply["onnx2tf_s"], reply[f"{p}_s"]
            res[f"mobile {p}"] = {"s": o + c, "parts": f"onnx2tf {o:.1f} + TFLiteConverter {c:.1f}",
                                  "fallback": reply.get("failed", [])}
    return res


def tflite_child(req_path: str) -> int:
    """The child of `direct_tflite`: writes reply.json beside the request."""
    import socket

    req = json.loads(Path(req_path).read_text())
    work = Path(req["work"])
    reply: dict = {}

    real_connect = socket.socket.connect

    def connect(self, address):  # offline, as edgeopt's converter is: any download attempt fails at once
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise OSError(f"network access blocked in the benchmark ({address})")
        return real_connect(self, address)

    socket.socket.connect = connect
    with np.load(work / "calib.npz") as z:
        arrays = [z[f"in{i}"] for i in range(len(req["inputs"]))]  # [samples, *ONNX shape]

    def nhwc(a: np.ndarray) -> np.ndarray:
        return a.transpose(0, *range(2, a.ndim), 1) if a.ndim >= 3 else a

    custom, first_image = [], None
    for i, (name, arr) in enumerate(zip(req["inputs"], arrays)):
        sample = nhwc(arr[0])  # one sample, in TensorFlow's layout (as edgeopt passes it)
        np.save(work / f"custom_in{i}.npy", np.ascontiguousarray(sample))
        custom.append([name, str(work / f"custom_in{i}.npy")])
        if first_image is None and arr.ndim == 5:
            first_image = np.concatenate([nhwc(a) for a in arr])
    if first_image is not None:  # onnx2tf loads this from its cwd for image-like inputs, else downloads it
        np.save(work / SAMPLE_FILE, np.ascontiguousarray(first_image, dtype=np.float32))
    os.chdir(work)
    import onnx
    import onnx2tf
    import tensorflow as tf

    # onnx2tf with its defaults first; if it refuses the model, again with the node names made valid
    # TensorFlow scope names (what edgeopt does to the model before onnx2tf), and the figure says so.
    reply["failed"] = []
    for attempt in ("defaults", "sanitized"):
        model = onnx.load(req["model"])  # a fresh copy each time: onnx2tf rewrites its input in place
        if attempt == "sanitized":
            # edgeopt's own fix of the node names, applied before the clock starts
            from edgeopt.targets.tflite.convert import _sanitize_node_names

            _sanitize_node_names(model.graph)
        src = work / f"model-{attempt}.onnx"
        onnx.save(model, str(src))
        sm = work / f"saved_model-{attempt}"
        sys.stdout.flush()
        log_at = (work / "child.log").stat().st_size if (work / "child.log").exists() else 0
        t0 = time.perf_counter()
        try:
            onnx2tf.convert(input_onnx_file_path=str(src), output_folder_path=str(sm), non_verbose=True,
                            custom_input_op_name_np_data_path=custom)
            if not (sm / "saved_model.pb").is_file():
                raise RuntimeError("no SavedModel written")
            reply["onnx2tf_s"] = time.perf_counter() - t0
            break
        except BaseException as exc:  # onnx2tf calls sys.exit(1) on some errors
            took = time.perf_counter() - t0
            sys.stdout.flush()
            err = _scope_error(work / "child.log", log_at) or (
                _first_line(exc) if not isinstance(exc, SystemExit) else "sys.exit (see child.log)")
            how = "its defaults" if attempt == "defaults" else "TF-valid node names"
            reply["failed"].append(f"`onnx2tf.convert` with {how} failed after {took:.1f} s ({err})"
                                   + ("; timed with the node names made TF-valid (edgeopt's own fix, done "
                                      "before the clock)" if attempt == "defaults" else ""))
            reply["onnx2tf_error"] = err
            print(f"== onnx2tf ({attempt}) failed: {err}", flush=True)
    if "onnx2tf_s" in reply:
        for prec in PRECISIONS["mobile"]:
            t0 = time.perf_counter()
            try:
                conv = tf.lite.TFLiteConverter.from_saved_model(str(sm))
                if prec == "fp16":
                    conv.optimizations = [tf.lite.Optimize.DEFAULT]
                    conv.target_spec.supported_types = [tf.float16]
                elif prec == "int8":  # full-integer, float I/O (what edgeopt's full-integer variant is)
                    conv.optimizations = [tf.lite.Optimize.DEFAULT]
                    conv.representative_dataset = lambda: (
                        [np.ascontiguousarray(nhwc(a[k]), np.float32) for a in arrays] for k in range(len(arrays[0])))
                    conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
                (work / f"model-{prec}.tflite").write_bytes(conv.convert())
                reply[f"{prec}_s"] = time.perf_counter() - t0
            except Exception as exc:
                reply[f"{prec}_error"] = _first_line(exc)
                print(f"== TFLiteConverter {prec} failed: {exc}", flush=True)
    (work / "reply.json").write_text(json.dumps(reply))
    return 0


def _scope_error(log: Path, start: int) -> str | None:
    """onnx2tf's 'X is not a valid scope name' line in the child's log after byte `start`, if any."""
    import re

    try:
        with open(log, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
        found = re.findall(r"'[^'\n]*' is not a valid scope name", text)
    except OSError:
        return None
    return found[-1] if found else None


def edgeopt_choice(manifest: dict) -> str:
    """The INT8 variant / mode edgeopt kept, as the manifest records it."""
    opts = manifest.get("options") or {}
    i8 = opts.get("int8") if isinstance(opts.get("int8"), dict) else {}
    chosen = i8.get("chosen_label") or i8.get("chosen") or opts.get("chosen_variant") or opts.get("variant")
    if isinstance(chosen, dict):
        chosen = chosen.get("label") or json.dumps(chosen.get("settings", chosen))
    mode = opts.get("int8_mode")
    how = [f"int8_mode={mode}" if mode and mode not in (chosen, i8.get("chosen")) else "",
           f"{i8['search']} search" if i8.get("search") and i8["search"] != mode else ""]
    how = [h for h in how if h]
    if not chosen:
        return ", ".join(how) or "—"
    return f"{chosen}" + (f" ({', '.join(how)})" if how else "")


def measure(bundles: dict, model: str, rounds: int, iters: int) -> dict[str, list[float]]:
    """Interleaved batch-1 latencies (ms) of every artifact and of the plain ORT FP32 baseline."""
    import onnxruntime as ort

    from edgeopt.fixtures import path
    from edgeopt_agent.bundle import load_manifest, to_artifact, validation_inputs
    from edgeopt_agent.runners import get_runner

    threads = os.cpu_count() or 1
    runs = {}
    any_bundle = next(iter(bundles.values()))[0]
    feeds_onnx = validation_inputs(any_bundle, load_manifest(any_bundle))
    base = ort.InferenceSession(str(path(model)), providers=["CPUExecutionProvider"])
    runs["ORT FP32, original model (baseline)"] = (lambda f: base.run(None, f), feeds_onnx)
    for label, (bundle, _) in bundles.items():
        manifest = load_manifest(bundle)
        runner = get_runner(manifest["runtime"]["name"])(bundle, manifest, {"threads": threads})
        runner.load()
        feeds = [to_artifact(f, manifest["io"]["inputs"]) for f in validation_inputs(bundle, manifest)]
        runs[label] = (runner.run, feeds)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for fn, feeds in runs.values():  # warm-up
        for f in feeds[:3]:
            fn(f)
    order = list(runs)
    for _ in range(rounds):
        random.shuffle(order)
        for label in order:
            fn, feeds = runs[label]
            for i in range(iters):
                f = feeds[i % len(feeds)]
                t0 = time.perf_counter_ns()
                fn(f)
                times[label].append((time.perf_counter_ns() - t0) / 1e6)
    return times


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--tflite-child":
        return tflite_child(sys.argv[2])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="ocr-cls,ocr-rec")
    ap.add_argument("--targets", default="cpu,intel-cpu,mobile")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--build-only", action="store_true",
                    help="skip the latency measurement; write only the build-time section")
    args = ap.parse_args()
    targets = args.targets.split(",")
    lat_sections, build_rows, remarks = [], [], []
    load_before = load()
    for model in args.models.split(","):
        work = Path(tempfile.mkdtemp(prefix=f"bench-{model}-"))
        print(f"{model}: building {targets}", flush=True)
        bundles = build_all(model, targets, work / "dist")
        calibration, validation = calibration_samples(model)
        same = same_data(validation, bundles)
        if same is False:
            remarks.append(f"{model}: the regenerated data differs from the bundle's validation data")
        print(f"{model}: converters called directly ({len(calibration)} calibration samples, "
              f"same data as the build: {same})", flush=True)
        direct = direct_converter_times(model, work, targets, calibration)
        for label, d in direct.items():
            print(f"  direct {label}: " + (f"{d['s']:.1f}s {d.get('parts', '')}" if "s" in d else d["error"]),
                  flush=True)
            if "error" in d:
                remarks.append(f"{model} {label}: the direct converter failed: {d['error']}")
            for f in d.get("fallback") or []:  # once per model and target (mobile: one onnx2tf run)
                line = f"{model} {label.split()[0]} (†): {f}"
                if line not in remarks:
                    remarks.append(line)
        from edgeopt.targets.base import build_times

        for label, (bundle, wall) in bundles.items():
            m = json.loads((bundle / "manifest.json").read_text())
            convert = f"{(build_times(bundle).get('build') or m['build'])['time_s']:.1f} s"  # (older: in the manifest)
            timings = ((build_times(bundle).get("tflite") or m.get("tflite") or {}).get("timings")) or {}
            if "onnx2tf_s" in timings:
                convert += f" (onnx2tf {timings['onnx2tf_s']:.1f}" + (", cached" if timings.get("onnx2tf_cached")
                                                                      else "") + ")"
            d = direct.get(label)
            build_rows.append({"model": model, "artifact": label, "edgeopt": f"{wall:.1f} s", "convert": convert,
                               "direct": "—" if d is None else "failed" if "error" in d else
                               f"{d['s']:.1f} s" + (f" ({d['parts']})" if d.get("parts") else "")
                               + (" †" if d.get("fallback") else ""),
                               "choice": edgeopt_choice(m)})
        for label in direct:
            if label not in bundles:
                remarks.append(f"{model} {label}: edgeopt built no bundle (see the build's output)")
        if args.build_only:
            shutil.rmtree(work, ignore_errors=True)
            continue
        print(f"{model}: measuring {len(bundles)} artifacts, {args.rounds} rounds x {args.iters} iters", flush=True)
        times = measure(bundles, model, args.rounds, args.iters)
        base = float(np.median(times["ORT FP32, original model (baseline)"]))
        rows = []
        for label, ts in times.items():
            med = float(np.median(ts))
            rows.append({"artifact": label, "p50": f"{med:.2f}", "p90": f"{np.percentile(ts, 90):.2f}",
                         "speedup": f"{base / med:.2f}×", "n": len(ts)})
            print(f"  {label:40s} p50 {med:7.2f} ms  ({base / med:.2f}x vs baseline)")
        shutil.rmtree(work, ignore_errors=True)
        lat_sections.append(f"### {model} ({MODELS[model][0]})\n\n" + md_table(
            rows, [("artifact", "artifact"), ("p50", "p50 ms"), ("p90", "p90 ms"), ("speedup", "vs ORT FP32"),
                   ("n", "calls")]))
    load_after = load()
    if not args.build_only:
        head = (f"Measured {stamp()} by `bench/bench_latency.py` on {machine()}.\n"
                f"Quietness: {load_before} before, {load_after} after (other jobs on the machine inflate every "
                f"figure alike; ratios come from one interleaved run). Batch 1, {os.cpu_count()} threads, the "
                f"agent's runners in-process, rotating real validation inputs, {args.rounds} rounds × {args.iters} "
                "calls per artifact.\n\n")
        write_section("latency", "## Artifact latency vs plain ONNX Runtime FP32\n\n" + head
                      + "\n\n".join(lat_sections))
    write_section("build-time", "## Build time: edgeopt vs the converter called directly\n\n"
                  f"Measured {stamp()} by `bench/bench_latency.py{' --build-only' if args.build_only else ''}` "
                  f"on {machine()}; {load_before} before, {load_after} after (other jobs ran beside it: "
                  "absolute seconds are inflated, edgeopt and direct alike).\n\n"
                  "- `edgeopt build` = the whole `edgeopt build --force` command for one target and precision, "
                  "each in an empty cache (data preparation, FP32 reference, conversion in a worker, INT8 "
                  "search, host check, hashing); `convert step` = the conversion inside it (manifest "
                  "`build.time_s`; for mobile, the onnx2tf part of it in brackets).\n"
                  "- `direct converter` = each vendor's converter called directly with its defaults on the same "
                  "static-shape ONNX model and the same calibration samples (regenerated with "
                  "`edgeopt.calib.load_data` from the build's `--calib`/`--preprocess`, checked equal to the "
                  "bundle's data), imports done before the clock, no accuracy check: cpu fp32 = an ONNX Runtime "
                  "session writing its EXTENDED-optimized model; cpu int8 = `quant_pre_process` (the "
                  "pre-processing ONNX Runtime's quantization docs recommend) + `quantize_static` with its "
                  "defaults (QDQ, MinMax, per-tensor) over a `CalibrationDataReader` of the samples; intel-cpu "
                  "fp32/fp16 = `ov.convert_model` + `ov.save_model` (fp16: `compress_to_fp16`); intel-cpu int8 = "
                  "`ov.convert_model` + `nncf.quantize(model, nncf.Dataset(samples))` with defaults + "
                  "`ov.save_model`; mobile = `onnx2tf.convert` once (on a copy of the model, offline, one sample "
                  "as its custom input; its run includes its own float32/float16 .tflite files) + that "
                  "precision's `TFLiteConverter.from_saved_model` run (fp16: `Optimize.DEFAULT` + float16 "
                  "supported type; int8: full-integer, `TFLITE_BUILTINS_INT8`, float I/O, the samples NHWC as "
                  "`representative_dataset`), timed separately and added.\n"
                  "- `edgeopt's choice` = the INT8 variant / mode the build kept, as its manifest records it.\n"
                  "- † = the converter refused the model with its defaults; the figure is for the fix named "
                  "below the table.\n\n"
                  + md_table(build_rows, [("model", "model"), ("artifact", "artifact"), ("edgeopt", "edgeopt build"),
                                          ("convert", "convert step"), ("direct", "direct converter"),
                                          ("choice", "edgeopt's choice")])
                  + ("\n\n" + "\n".join(f"- {r}" for r in remarks) if remarks else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
