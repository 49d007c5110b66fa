"""The TFLite converter's child process: ``python -m edgeopt.targets.tflite_convert REQ REPLY PROGRESS``.

Started by ``edgeopt.targets.tflite.run_converter`` with stdout/stderr going to a log file and a
timeout.  Two stages:

1. ONNX -> SavedModel with onnx2tf, cached under ``<cache>/onnx2tf/<key>`` and shared by the
   precisions of a model (a file lock makes a second worker wait for the first instead of
   converting the same model again);
2. SavedModel -> ``.tflite`` for one precision with TensorFlow's TFLiteConverter (builtin ops
   first; a wider op set only when that fails, and the reply says so), then the file is opened
   with the TFLite interpreter to read its signature, shapes, dtypes and quantization.

Nothing is downloaded: onnx2tf fetches a sample image file from GitHub for image-like inputs
unless that file is in its working directory, so the build's own calibration data is written
there under that name, and connecting to the network raises during the conversion.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

CONVERTER_REV = 3  # bump when the SavedModel stage changes, to invalidate cached conversions
SAMPLE_FILE = "calibration_image_sample_data_20x128x128x3_float32.npy"  # what onnx2tf would download


class _Progress:
    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, msg: str) -> None:
        with open(self.path, "a") as f:
            f.write(msg + "\n")
        print(f"== {msg}", flush=True)  # and into the log, to find one's way in it


def main(argv: list[str]) -> int:
    req_path, reply_path, prog_path = argv
    request = json.loads(Path(req_path).read_text())
    progress = _Progress(prog_path)
    try:
        reply = convert(request, progress)
    except BaseException as exc:  # onnx2tf calls sys.exit(1) on some errors
        msg = f"{type(exc).__name__}: {exc}" if not isinstance(exc, SystemExit) else \
            "onnx2tf stopped with an error (see its last output)"
        traceback.print_exc()
        reply = {"ok": False, "error": msg.strip().splitlines()[0][:500] if msg.strip() else type(exc).__name__}
    tmp = Path(reply_path + ".tmp")
    tmp.write_text(json.dumps(reply, default=_plain))
    os.replace(tmp, reply_path)
    return 0


def _plain(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def convert(req: dict[str, Any], progress) -> dict[str, Any]:
    _no_network()
    from edgeopt.targets.base import package_versions

    versions = package_versions(["onnx2tf", "tensorflow", "tf-keras", "onnxsim", "onnx", "onnx-graphsurgeon"])
    notes: list[str] = []
    warnings: list[str] = []
    t0 = time.perf_counter()
    sm_dir, sm_meta, cached = saved_model(req, versions, progress)
    onnx2tf_s = time.perf_counter() - t0

    progress("loading TensorFlow")
    import tensorflow as tf

    sig = tf.saved_model.load(str(sm_dir)).signatures["serving_default"]
    sig_inputs = [{"name": k, "shape": [int(d) if d is not None else -1 for d in v.shape], "dtype": v.dtype.name}
                  for k, v in sig.structured_input_signature[1].items()]
    from edgeopt.targets.tflite import match_tensors

    in_pairs = match_tensors(req["io"]["inputs"], sig_inputs, "input", notes)
    in_perms = {spec["name"]: _input_perm(spec, cands, notes) for spec, _a, cands in in_pairs}

    precision, mode = req["precision"], req["int8_mode"]
    what = {"fp32": "float32", "fp16": "float16 weights"}.get(precision) or (
        "int8 dynamic-range" if mode == "dynamic" else f"int8 full-integer ({req['io_dtype']} I/O)")
    progress(f"SavedModel -> TFLite ({what})")
    t1 = time.perf_counter()
    rep = None
    if precision == "int8" and mode == "full":
        rep = _representative(req["calib_path"], req["io"]["inputs"], in_pairs, in_perms)
    content, used_ops = _to_tflite(tf, str(sm_dir), precision, mode, req["io_dtype"], rep, notes)
    out = Path(req["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(content)
    tflite_s = time.perf_counter() - t1

    from edgeopt_agent.runners.tflite import TfliteRunner, read_ops

    ops = read_ops(out)
    runner = TfliteRunner(out.parent, {"runtime": {"artifact": out.name}},
                          {"interpreter": "tensorflow"} if ops["flex_ops"] else {})
    runner.load()
    details = runner.io_details()
    io = _artifact_io(req, details, in_perms, runner, notes)
    runner.close()
    progress(f"TFLite file written ({out.stat().st_size / 1e6:.2f} MB, {sum(o['count'] for o in ops['ops'])} ops)")
    return {"ok": True, "io": io, "ops": ops, "notes": notes, "warnings": warnings,
            "io_dtype": req["io_dtype"] if precision == "int8" and mode == "full" else "float32",
            "converter": {"supported_ops": used_ops, "versions": versions, "saved_model_cached": cached,
                          "saved_model_key": sm_dir.name, "replace": req["replace"],
                          "signature": details.get("signature")},
            "timings": {"onnx2tf_s": round(sm_meta.get("onnx2tf_s", onnx2tf_s), 2),
                        "onnx2tf_cached": cached, "tflite_s": round(tflite_s, 2)}}


# --- stage 1: ONNX -> SavedModel (onnx2tf), cached ------------------------------------------------
def saved_model(req: dict[str, Any], versions: dict[str, str], progress) -> tuple[Path, dict[str, Any], bool]:
    """The cached SavedModel directory for this model (converting it under a lock when absent)."""
    h = hashlib.sha256()
    for p in (req["prepared_path"], req["calib_path"]):
        if p:
            h.update(hashlib.sha256(Path(p).read_bytes()).digest())
    h.update(json.dumps([CONVERTER_REV, sorted(req["replace"]), versions], sort_keys=True).encode())
    key = h.hexdigest()[:40]
    root = Path(req["cache_dir"])
    final = root / key
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{key}.lock", progress):
        if (final / "meta.json").is_file():
            progress("onnx2tf: reusing the cached SavedModel of this model")
            return final, json.loads((final / "meta.json").read_text()), True
        tmp = root / f".{key}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        t0 = time.perf_counter()
        run_onnx2tf(req, tmp, progress)
        meta = {"onnx2tf_s": round(time.perf_counter() - t0, 2), "versions": versions, "replace": req["replace"],
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        if req.get("log") and Path(req["log"]).is_file():  # onnx2tf's own account, kept beside its output
            shutil.copyfile(req["log"], tmp / "onnx2tf.log")
        if final.exists():
            shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        return final, meta, False


@contextlib.contextmanager
def _locked(path: Path, progress):
    try:
        import fcntl
    except ImportError:  # no POSIX locks (Windows): two workers may both convert; the result is the same
        yield
        return
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress("waiting for the onnx2tf conversion of this model that another build is running")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run_onnx2tf(req: dict[str, Any], out_dir: Path, progress) -> None:
    """onnx2tf on a copy of the prepared model, fed the build's own calibration data."""
    import onnx

    from edgeopt.targets.tflite import channels_last

    work = Path(req["work"])
    model = onnx.load(req["prepared_path"])
    _sanitize_node_names(model.graph)
    src = work / "model.onnx"  # onnx2tf rewrites its input in place: never hand it the shared file
    onnx.save(model, str(src))
    custom = []
    first_image = None
    with np.load(req["calib_path"]) as calib:
        for i, spec in enumerate(req["io"]["inputs"]):
            data = calib[f"in{i}"]  # [samples, *ONNX shape]
            sample = data[0] if data.ndim == len(spec["shape"]) + 1 else data
            if sample.ndim >= 3:
                # onnx2tf wants TensorFlow's layout here: its TF-side checks take the file as is (and
                # fail quietly, then crash in an accuracy correction, when it is NCHW); its ONNX-side
                # checks move the axes back themselves.
                sample = sample.transpose(channels_last(sample.ndim))
            path = work / f"calib_in{i}.npy"
            np.save(path, np.ascontiguousarray(sample))
            custom.append([spec["name"], str(path)])
            if first_image is None and sample.ndim == 4:
                first_image = data.reshape(-1, *data.shape[-3:]).transpose(0, 2, 3, 1)
    if first_image is not None:
        # onnx2tf loads this file from its cwd for image-like inputs, else downloads it from GitHub.
        np.save(work / SAMPLE_FILE, np.ascontiguousarray(first_image, dtype=np.float32))
    progress("onnx2tf: ONNX -> SavedModel (NCHW -> NHWC); the slow step"
             + (f", replacing {', '.join(req['replace'])} by builtin ops" if req["replace"] else ""))
    import onnx2tf

    cwd = os.getcwd()
    os.chdir(work)
    try:
        onnx2tf.convert(input_onnx_file_path=str(src), output_folder_path=str(out_dir),
                        output_signaturedefs=True, custom_input_op_name_np_data_path=custom,
                        replace_to_pseudo_operators=[n.lower() for n in req["replace"]],  # as its CLI passes them
                        verbosity="warn")
    finally:
        os.chdir(cwd)
    if not (out_dir / "saved_model.pb").is_file():
        raise RuntimeError("onnx2tf finished without writing a SavedModel")
    for stray in out_dir.glob("*.tflite"):  # its own float files: the precisions are made from the SavedModel
        stray.unlink()


def _sanitize_node_names(graph) -> None:
    """Node names as TensorFlow scope names allow (``Softmax@0`` in PaddleOCR models is not), unique."""
    seen: set[str] = set()
    for i, node in enumerate(graph.node):
        name = re.sub(r"[^A-Za-z0-9_.\\/>-]", "_", node.name) or f"{node.op_type}_{i}"
        if not re.match(r"[A-Za-z0-9.]", name):
            name = "n" + name
        while name in seen:
            name += "_"
        seen.add(name)
        node.name = name


def _no_network() -> None:
    """Make any attempt to reach the network fail at once (nothing may be downloaded at build time)."""
    real = socket.socket.connect

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise OSError(f"edgeopt: network access blocked during the TFLite conversion ({address})")
        return real(self, address)

    socket.socket.connect = connect


# --- stage 2: SavedModel -> .tflite --------------------------------------------------------------
def _input_perm(spec: dict[str, Any], cands: list[list[int]], notes: list[str]) -> list[int]:
    if len(cands) == 1:
        return cands[0]
    from edgeopt.targets.tflite import channels_last

    perm = channels_last(len(spec["shape"]))
    notes.append(f"input {spec['name']!r} {spec['shape']} reads the same in NCHW and NHWC; "
                 "taken as NHWC, as onnx2tf converts inputs")
    return perm


def _representative(calib_path: str, specs, in_pairs, in_perms):
    """Calibration samples in the SavedModel's names and layout, for full-integer quantization."""
    with np.load(calib_path) as calib:
        arrays = [calib[f"in{i}"] for i in range(len(specs))]
    names = {spec["name"]: a["name"] for spec, a, _c in in_pairs}
    count = arrays[0].shape[0]

    def gen():
        for k in range(count):
            # Float inputs are fed as float32 (what the SavedModel takes); integer ones keep their type.
            yield {names[s["name"]]: _as_input(np.transpose(arr[k], in_perms[s["name"]]))
                   for s, arr in zip(specs, arrays)}

    return gen, count


def _as_input(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32 if a.dtype.kind == "f" else a.dtype)


def _to_tflite(tf, sm_dir: str, precision: str, mode: str, io_dtype: str, rep, notes: list[str]):
    B, I8, SEL = tf.lite.OpsSet.TFLITE_BUILTINS, tf.lite.OpsSet.TFLITE_BUILTINS_INT8, tf.lite.OpsSet.SELECT_TF_OPS
    full = precision == "int8" and mode == "full"
    attempts = [[I8], [I8, B], [I8, B, SEL]] if full else [[B], [B, SEL]]
    errors = []
    for ops in attempts:
        conv = tf.lite.TFLiteConverter.from_saved_model(sm_dir)
        conv.target_spec.supported_ops = ops
        if precision == "fp16":
            conv.optimizations = [tf.lite.Optimize.DEFAULT]
            conv.target_spec.supported_types = [tf.float16]
        elif precision == "int8":
            conv.optimizations = [tf.lite.Optimize.DEFAULT]
            if full:
                gen, _count = rep
                conv.representative_dataset = gen
                if io_dtype == "int8":
                    conv.inference_input_type = tf.int8
                    conv.inference_output_type = tf.int8
        try:
            content = conv.convert()
        except Exception as exc:  # ConverterError: an op outside this op set
            first = str(exc).strip().splitlines()
            errors.append(first[0] if first else type(exc).__name__)
            print(f"== converter with {[o.name for o in ops]} failed:\n{exc}", flush=True)
            continue
        names = [o.name for o in ops]
        if ops is not attempts[0]:
            notes.append(f"the TFLite converter needed the wider op set {names} "
                         f"({'some ops stay float' if full and B in ops else 'Select TF ops'})")
        return content, names
    raise RuntimeError("the TFLite converter failed: " + " / ".join(errors))


def _artifact_io(req, details, in_perms, runner, notes) -> dict[str, list[dict[str, Any]]]:
    """The IO spec: ONNX tensors mapped to the file's names, perms and dtypes."""
    from edgeopt.targets.tflite import io_entry, match_tensors

    inputs = [io_entry(spec, a, in_perms[spec["name"]] if in_perms[spec["name"]] in cands else cands[0])
              for spec, a, cands in match_tensors(req["io"]["inputs"], details["inputs"], "input", notes)]
    out_pairs = match_tensors(req["io"]["outputs"], details["outputs"], "output", notes)
    chosen = {spec["name"]: cands[0] for spec, _a, cands in out_pairs}
    ambiguous = [(spec, a, cands) for spec, a, cands in out_pairs if len(cands) > 1]
    if ambiguous:
        chosen.update(_resolve_by_running(req, inputs, ambiguous, runner, notes))
    outputs = [io_entry(spec, a, chosen[spec["name"]]) for spec, a, _c in out_pairs]
    return {"inputs": inputs, "outputs": outputs}


def _resolve_by_running(req, inputs, ambiguous, runner, notes) -> dict[str, list[int]]:
    """Outputs whose shape reads the same in two layouts: pick the one that matches the reference."""
    from edgeopt_agent.bundle import to_artifact

    with np.load(req["validation_path"]) as val, np.load(req["reference_path"]) as ref:
        feed = {s["name"]: val[f"in{i}"][0] for i, s in enumerate(req["io"]["inputs"])}
        refs = {s["name"]: ref[f"out{i}"][0] for i, s in enumerate(req["io"]["outputs"])}
    outs = runner.run(to_artifact(feed, inputs))
    chosen = {}
    for spec, a, cands in ambiguous:
        y = np.asarray(outs[a["name"]], np.float64)
        if a.get("quant") and y.dtype.kind in "iu":
            y = (y - a["quant"][1]) * a["quant"][0]
        r = refs[spec["name"]].astype(np.float64).ravel()

        def cos(perm, y=y, r=r):
            v = np.transpose(y, np.argsort(perm)).ravel()
            return float(v @ r / (np.linalg.norm(v) * np.linalg.norm(r) + 1e-30))

        best = max(cands, key=cos)
        chosen[spec["name"]] = best
        notes.append(f"output {spec['name']!r} {spec['shape']} reads the same in two layouts; "
                     f"perm {best} chosen by running validation sample 0")
    return chosen


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
