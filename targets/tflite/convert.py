"""The TFLite converter's child process: ``python -m edgeopt.targets.tflite.convert REQ REPLY PROGRESS``.

Started by ``edgeopt.targets.tflite.run_converter`` with stdout/stderr going to a log file and a
timeout.  Two stages:

1. ONNX -> SavedModel with onnx2tf, cached under ``<cache>/onnx2tf/<key>`` and shared by the
   precisions of a model (a file lock makes a second worker wait for the first instead of
   converting the same model again);
2. SavedModel -> ``.tflite`` for one precision with TensorFlow's TFLiteConverter (builtin ops
   first; a wider op set only when that fails, and the reply says so), then the file is opened
   with the TFLite interpreter to read its signature, shapes, dtypes and quantization.

``int8_mode=auto`` (the default) searches in stage 2 (``Int8Search``): full-integer, then the
most sensitive layers kept float (TensorFlow's QuantizationDebugger), then dynamic-range; each
candidate is judged by the host check's own code on the validation set, and the first that meets
the INT8 bound is kept (full-integer is the fastest of them).

Nothing is downloaded: onnx2tf fetches a sample image file from GitHub for image-like inputs
unless that file is in its working directory, so the build's own calibration data is written
there under that name, and connecting to the network raises during the conversion.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io as _io
import json
import math
import os
import re
import shutil
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeopt.targets.tflite import tensor_map
from edgeopt_agent.compare import seq_label, top1_text

CONVERTER_REV = 7  # bump when the SavedModel stage changes, to invalidate cached conversions
SAMPLE_FILE = "calibration_image_sample_data_20x128x128x3_float32.npy"  # what onnx2tf would download


class _Progress:
    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, msg: str) -> None:
        with open(self.path, "a") as f:
            f.write(msg + "\n")
        print(f"== {msg}", flush=True)  # and into the log, to find one's way in it


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--step":
        return _step_main(argv[1])
    req_path, reply_path, prog_path = argv
    request = json.loads(Path(req_path).read_text())
    progress = _Progress(prog_path)
    try:
        reply = convert(request, progress)
    except SearchFailed as exc:  # no INT8 variant meets the bound: one line for the user, no onnx2tf tail
        reply = {"ok": False, "kind": "int8_search", "error": str(exc), "hint": exc.hint, "int8": exc.record}
    except IOMismatch as exc:  # edgeopt's own IO matcher, after onnx2tf finished: not blamed on onnx2tf
        reply = {"ok": False, "kind": "io_match", "error": str(exc), "hint": exc.hint}
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
    if sm_meta.get("rewrites"):
        notes.append("the ONNX onnx2tf converted had, rewritten to the same values: " + "; ".join(sm_meta["rewrites"]))

    progress("loading TensorFlow")
    import tensorflow as tf

    sig = tf.saved_model.load(str(sm_dir)).signatures["serving_default"]
    sig_inputs = [{"name": k, "shape": [int(d) if d is not None else -1 for d in v.shape], "dtype": v.dtype.name}
                  for k, v in sig.structured_input_signature[1].items()]
    from edgeopt.targets.tflite import match_tensors

    in_pairs = _matched(match_tensors, req["io"]["inputs"], sig_inputs, "input", notes, "SavedModel")
    in_perms = {spec["name"]: _input_perm(spec, cands, notes) for spec, _a, cands in in_pairs}

    precision, mode = req["precision"], req["int8_mode"]
    t1 = time.perf_counter()
    rep = None
    if precision == "int8" and mode in ("full", "auto"):
        rep = _representative(req["calib_path"], req["io"]["inputs"], in_pairs, in_perms, req.get("shape_form"),
                              notes)
    search = None
    if precision == "int8" and mode == "auto":
        progress("SavedModel -> TFLite (int8 auto: full-integer, then layers kept float, then dynamic-range)")
        search = Int8Search(tf, req, str(sm_dir), rep, in_perms, progress)
        content, chosen = search.run()
        used_ops, kept = chosen.ops, chosen.mode
        notes += chosen.notes + search.rule_notes
    else:
        what = {"fp32": "float32", "fp16": "float16 weights"}.get(precision) or (
            "int8 dynamic-range" if mode == "dynamic" else f"int8 full-integer ({req['io_dtype']} I/O)")
        progress(f"SavedModel -> TFLite ({what})")
        content, used_ops = _to_tflite(tf, str(sm_dir), precision, mode, req["io_dtype"], rep, notes)
        kept = mode
    out = Path(req["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(content)
    if (sm_dir / tensor_map.LAYERS_FILE).is_file():  # for edgeopt debug: TFLite tensor -> ONNX tensor
        try:
            tensor_map.write_map(out, sm_dir / tensor_map.LAYERS_FILE, out.parent / tensor_map.MAP_FILE)
        except Exception as exc:  # noqa: BLE001 - debug then compares the graph outputs only, and says so
            notes.append(f"the TFLite -> ONNX tensor map was not written ({_first_line(exc)})")
    tflite_s = time.perf_counter() - t1

    from edgeopt_agent.runners.tflite import TfliteRunner, read_ops

    ops = read_ops(out)
    runner = TfliteRunner(out.parent, {"runtime": {"artifact": out.name}, "files": {out.name: {}}},
                          {"interpreter": "tensorflow"} if ops["flex_ops"] else {})
    runner.load()
    details = runner.io_details()
    io = _artifact_io(req, details, in_perms, runner, notes, search.out_perms if search else None)
    runner.close()
    if (out.parent / tensor_map.MAP_FILE).is_file():  # step 4: the written file's own values (its folding)
        try:
            import onnx

            checked = tensor_map.check_values(out.parent, {"runtime": {"artifact": out.name}, "io": io},
                                              onnx.load(req["prepared_path"]), _first_feed(req), precision)
            if checked["moved"]:
                notes.append(f"tensor map: {checked['moved']} of {checked['checked']} TFLite tensors hold a tensor "
                             "downstream of the one onnx2tf named (the TFLite converter folded them): remapped")
        except Exception as exc:  # noqa: BLE001 - the map stands as resolved; debug still names by it
            notes.append(f"the TFLite tensor map's values were not checked ({_first_line(exc)})")
    progress(f"TFLite file written ({out.stat().st_size / 1e6:.2f} MB, {sum(o['count'] for o in ops['ops'])} ops)")
    int8_io = precision == "int8" and kept in ("full", "selective") and req["io_dtype"] == "int8"
    reply = {"ok": True, "io": io, "ops": ops, "notes": notes, "warnings": warnings,
             "io_dtype": "int8" if int8_io else "float32",
             "converter": {"supported_ops": used_ops, "versions": versions, "saved_model_cached": cached,
                           "saved_model_key": sm_dir.name, "replace": req["replace"],
                           "signature": details.get("signature")},
             "timings": {"onnx2tf_s": round(sm_meta.get("onnx2tf_s", onnx2tf_s), 2),
                         "onnx2tf_cached": cached, "tflite_s": round(tflite_s, 2)}}
    if search:
        reply["int8"] = search.record(chosen)
        reply["int8_note"] = search.note(chosen)
        reply["timings"].update(search.timings)
    return reply


# --- stage 1: ONNX -> SavedModel (onnx2tf), cached ------------------------------------------------
def saved_model(req: dict[str, Any], versions: dict[str, str], progress) -> tuple[Path, dict[str, Any], bool]:
    """The cached SavedModel directory for this model (converting it under a lock when absent)."""
    h = hashlib.sha256()
    for p in (req["prepared_path"], req["calib_path"]):
        if p:
            h.update(hashlib.sha256(Path(p).read_bytes()).digest())
    h.update(json.dumps([CONVERTER_REV, sorted(req["replace"]), versions], sort_keys=True).encode())
    # the rewrites run before onnx2tf are part of the conversion: a change to them is another SavedModel (a bumped
    # CONVERTER_REV was forgotten once: gemm_biases' fix never reached a model converted before it)
    h.update(hashlib.sha256(Path(__file__).with_name("onnx_fixes.py").read_bytes()).digest())
    if req.get("onnx2tf_kwargs"):  # an alternative conversion: its own cache entry
        h.update(json.dumps(req["onnx2tf_kwargs"], sort_keys=True).encode())
    if req.get("onnx2tf_fixes") is False:  # the model as it is: another conversion
        h.update(b"onnx2tf_fixes=false")
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
        rewrites = run_onnx2tf(req, tmp, progress)
        meta = {"onnx2tf_s": round(time.perf_counter() - t0, 2), "versions": versions, "replace": req["replace"],
                "rewrites": rewrites,
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


def run_onnx2tf(req: dict[str, Any], out_dir: Path, progress) -> list[str]:
    """onnx2tf on a copy of the prepared model, fed the build's own calibration data, after the
    simplification onnx2tf would run and the rewrites of its known mistakes (``onnx_fixes``); returns
    the rewrites made."""
    import onnx

    from edgeopt.targets.tflite import channels_last, onnx_fixes

    work = Path(req["work"])
    model = onnx.load(req["prepared_path"])
    _sanitize_node_names(model.graph)
    _sanitize_output_names(model.graph)
    kwargs = dict(req.get("onnx2tf_kwargs") or {})
    fixes = req.get("onnx2tf_fixes", True)  # --option onnx2tf_fixes=false: the model as it is
    if fixes and not kwargs.get("not_use_onnxsim"):  # onnx2tf's own first step, done here so the rewrites stay
        progress("onnxsim: simplifying the copy onnx2tf converts")
        model = onnx_fixes.simplify(model, work)
        kwargs["not_use_onnxsim"] = True
    rewrites = onnx_fixes.rewrite(model) if fixes else []
    if rewrites:
        progress("before onnx2tf: " + "; ".join(rewrites))
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
    names: dict[str, str] = {}
    try:
        with tensor_map.record_layers(names):
            onnx2tf.convert(input_onnx_file_path=str(src), output_folder_path=str(out_dir),
                            output_signaturedefs=True, custom_input_op_name_np_data_path=custom,
                            replace_to_pseudo_operators=[n.lower() for n in req["replace"]],  # as its CLI passes them
                            verbosity="warn", **kwargs)
    finally:
        os.chdir(cwd)
    if not (out_dir / "saved_model.pb").is_file():
        raise RuntimeError("onnx2tf finished without writing a SavedModel")
    if names:  # for edgeopt debug: the source model's tensors -> Keras layers, checked by value
        try:
            source = onnx.load(req["prepared_path"])
            # the file onnx2tf converted: it runs onnxsim on it in place when it simplifies the model itself
            converted = onnx.load(str(src)) if src.is_file() else model
            layers, counts = tensor_map.to_source(names, converted, source, _first_feed(req))
            tensor_map.write_layers(out_dir / tensor_map.LAYERS_FILE, layers, source, counts)
        except Exception as exc:  # noqa: BLE001 - the map serves debug; the conversion stands without it
            progress(f"the ONNX -> TFLite tensor map was not recorded ({_first_line(exc)})")
    for stray in out_dir.glob("*.tflite"):  # its own float files: the precisions are made from the SavedModel
        stray.unlink()
    return rewrites


def _first_feed(req: dict[str, Any]) -> dict[str, np.ndarray]:
    """Calibration sample 0 in the ONNX layout, keyed by input name."""
    feed = {}
    with np.load(req["calib_path"]) as calib:
        for i, spec in enumerate(req["io"]["inputs"]):
            data = calib[f"in{i}"]
            feed[spec["name"]] = data[0] if data.ndim == len(spec["shape"]) + 1 else data
    return feed


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


def _sanitize_output_names(graph) -> None:
    """Graph outputs renamed where TensorFlow rejects the name (openwakeword's timer head names its output
    by a JSON string; onnx2tf then fails with "ValueError: in user code"). The signature's outputs are
    paired with the ONNX ones by position (``output_<i>``), so the bundle keeps the ONNX names."""
    taken = {v for node in graph.node for v in (*node.input, *node.output)} | {v.name for v in graph.input}
    for i, out in enumerate(graph.output):
        old = out.name
        if not re.search(r"[^A-Za-z0-9_.\\/>:-]", old):
            continue
        new = re.sub(r"[^A-Za-z0-9_]+", "_", old).strip("_") or f"output_{i}"
        new = new if new[0].isalpha() else "o_" + new
        while new in taken:
            new += "_"
        taken.add(new)
        for node in graph.node:
            node.input[:] = [new if v == old else v for v in node.input]
            node.output[:] = [new if v == old else v for v in node.output]
        for vi in graph.value_info:
            if vi.name == old:
                vi.name = new
        out.name = new


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


def _representative(calib_path: str, specs, in_pairs, in_perms, shape_form: str | None = None,
                    notes: list[str] | None = None):
    """Calibration samples in the SavedModel's names and layout, for full-integer quantization; the dynamic form
    of a variable axis (issue 42) calibrates over the real length mix, each sample at its own length (TFLite's
    calibrator resizes the inputs per sample)."""
    from edgeopt.shapes import own_length_calib

    with np.load(calib_path) as calib:
        arrays = [calib[f"in{i}"] for i in range(len(specs))]
    names = {spec["name"]: a["name"] for spec, a, _c in in_pairs}
    count = arrays[0].shape[0]
    feeds = [{s["name"]: arr[k] for s, arr in zip(specs, arrays)} for k in range(count)]
    feeds, note = own_length_calib(calib_path, feeds, shape_form)
    if note and notes is not None:
        notes.append(note)

    def gen():
        for f in feeds:
            # Float inputs are fed as float32 (what the SavedModel takes); integer ones keep their type.
            yield {names[s["name"]]: _as_input(np.transpose(f[s["name"]], in_perms[s["name"]])) for s in specs}

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


class ConverterCrashed(RuntimeError):
    """The TFLite converter died (a signal) while making one candidate: that candidate fails."""


STEP_TIMEOUT = 1800


def _to_tflite_isolated(sm_dir: str, precision: str, mode: str, io_dtype: str, rep, notes: list[str],
                        work: Path) -> tuple[bytes, list[str]]:
    """``_to_tflite`` in a child process: TensorFlow's converter segfaults on some recurrent models in
    full-integer calibration (seen: three LSTM/GRU models), which would end the whole search here.
    In a child, a crash is one failed candidate, and the search goes on (to dynamic-range)."""
    import subprocess

    step = Path(work) / f"step-{mode}-{time.monotonic_ns()}"
    step.mkdir(parents=True)
    req = {"sm_dir": sm_dir, "precision": precision, "mode": mode, "io_dtype": io_dtype, "out": str(step / "out.tflite"),
           "reply": str(step / "reply.json"), "names": []}
    if rep is not None:
        gen, _count = rep
        feeds = list(gen())
        req["names"] = list(feeds[0]) if feeds else []
        np.savez(step / "rep.npz", **{f"x{i}": _stacked([f[n] for f in feeds]) for i, n in enumerate(req["names"])})
        req["rep"] = str(step / "rep.npz")
    (step / "req.json").write_text(json.dumps(req))
    try:
        proc = subprocess.run([sys.executable, "-m", "edgeopt.targets.tflite.convert", "--step", str(step / "req.json")],
                              capture_output=True, text=True, timeout=STEP_TIMEOUT)
        sys.stdout.write(proc.stdout[-4000:] + proc.stderr[-4000:])  # into the converter's log
        if proc.returncode < 0 or not (step / "reply.json").exists():
            import signal

            sig = -proc.returncode
            what = signal.Signals(sig).name if proc.returncode < 0 and sig in signal.valid_signals() else \
                f"exit code {proc.returncode}"
            if proc.returncode < 0 and sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                raise RuntimeError(f"the {LABELS.get(mode, mode)} conversion was interrupted ({what}), not crashed")
            raise ConverterCrashed(f"the TFLite converter crashed ({what}) in {LABELS.get(mode, mode)} conversion")
        reply = json.loads((step / "reply.json").read_text())
        if not reply.get("ok"):
            raise RuntimeError(reply.get("error") or "the TFLite converter failed")
        notes.extend(reply.get("notes", []))
        return (step / "out.tflite").read_bytes(), reply["ops"]
    except subprocess.TimeoutExpired:
        raise ConverterCrashed(f"the TFLite converter hung > {STEP_TIMEOUT}s in {mode} conversion") from None
    finally:
        shutil.rmtree(step, ignore_errors=True)


def _stacked(arrays: list[np.ndarray]) -> np.ndarray:
    """Samples stacked on a new axis 0, or an object array of them when their shapes differ (own lengths)."""
    if len({a.shape for a in arrays}) <= 1:
        return np.stack(arrays)
    out = np.empty(len(arrays), dtype=object)
    for i, a in enumerate(arrays):
        out[i] = a
    return out


def _step_main(req_path: str) -> int:
    """Child side of ``_to_tflite_isolated``: one conversion, the file and a small JSON reply."""
    req = json.loads(Path(req_path).read_text())
    if os.environ.get("EDGEOPT_TEST_TFLITE_STEP_ABORT") == req["mode"]:
        os.abort()  # lets a test see a real converter death without a model that segfaults TensorFlow
    _no_network()
    import tensorflow as tf

    rep = None
    if req.get("rep"):
        with np.load(req["rep"], allow_pickle=True) as z:  # object arrays: samples of their own lengths
            arrays = {n: z[f"x{i}"] for i, n in enumerate(req["names"])}
        count = next(iter(arrays.values())).shape[0] if arrays else 0

        def gen():
            for k in range(count):
                yield {n: a[k] for n, a in arrays.items()}

        rep = (gen, count)
    notes: list[str] = []
    try:
        content, ops = _to_tflite(tf, req["sm_dir"], req["precision"], req["mode"], req["io_dtype"], rep, notes)
        Path(req["out"]).write_bytes(content)
        reply = {"ok": True, "ops": ops, "notes": notes}
    except Exception as exc:  # noqa: BLE001 - one line back to the search
        reply = {"ok": False, "error": _first_line(exc)}
    Path(req["reply"]).write_text(json.dumps(reply))
    return 0


class IOMismatch(Exception):
    """edgeopt's IO matcher cannot pair an ONNX input/output with the converted file's (after onnx2tf finished)."""

    def __init__(self, message: str, hint: str | None) -> None:
        super().__init__(message)
        self.hint = hint


def _matched(match_tensors, specs, art, kind: str, notes: list[str], where: str):
    """``match_tensors`` whose refusal says it is edgeopt's matcher that stopped (an ``IOMismatch``), with the
    likely cause: a rank-0 ONNX input (onnx2tf declares it ``[-1]``; edgeopt feeds no scalars to a TFLite
    file), else an output onnx2tf gave another shape (a wrong conversion)."""
    from edgeopt.errors import BuildFailed

    try:
        return match_tensors(specs, art, kind, notes)
    except BuildFailed as exc:
        scalars = [t["name"] for t in specs if not t["shape"]]
        if kind == "input" and scalars:
            hint = (f"ONNX input(s) {', '.join(map(repr, scalars))} are rank-0 (scalars), which onnx2tf declares "
                    "as [-1] and edgeopt does not feed to a TFLite file: give them shape [1] in the ONNX, or build a "
                    "target that runs the ONNX itself (cpu, intel-cpu, apple)")
        else:
            hint = exc.hint or ("onnx2tf's conversion has another shape than the ONNX model here (a wrong "
                                "conversion, not a precision problem): a target that runs the ONNX itself "
                                "(cpu, intel-cpu, apple) builds it")
        raise IOMismatch(f"edgeopt's IO matcher cannot pair the {where} onnx2tf made with the ONNX model: "
                         f"{exc.message}", hint) from None


def _artifact_io(req, details, in_perms, runner, notes, out_perms=None) -> dict[str, list[dict[str, Any]]]:
    """The IO spec: ONNX tensors mapped to the file's names, perms and dtypes.  ``out_perms`` (ONNX
    output -> perm) settles outputs whose shape reads the same in two layouts without running the
    file: the layout is the SavedModel's, the same in every quantized variant of it."""
    from edgeopt.targets.tflite import io_entry, match_tensors

    in_pairs = _matched(match_tensors, req["io"]["inputs"], details["inputs"], "input", notes, "TFLite file")
    inputs = [io_entry(spec, a, in_perms[spec["name"]] if in_perms[spec["name"]] in cands else cands[0])
              for spec, a, cands in in_pairs]
    out_pairs = _matched(match_tensors, req["io"]["outputs"], details["outputs"], "output", notes, "TFLite file")
    calibrated = req["precision"] == "int8" and req["int8_mode"] in ("full", "auto")  # fed in in_perms' layout
    if not calibrated and any(len(c) > 1 for _s, _a, c in in_pairs):
        inputs = _inputs_by_running(req, in_pairs, inputs, out_pairs, runner, notes)
    chosen = {spec["name"]: cands[0] for spec, _a, cands in out_pairs}
    known = out_perms or {}
    for spec, _a, cands in out_pairs:
        if len(cands) > 1 and known.get(spec["name"]) in cands:
            chosen[spec["name"]] = known[spec["name"]]
            notes.append(f"output {spec['name']!r} {spec['shape']} reads the same in two layouts; perm "
                         f"{known[spec['name']]} as running the first int8 candidate decided")
    ambiguous = [(spec, a, cands) for spec, a, cands in out_pairs
                 if len(cands) > 1 and known.get(spec["name"]) not in cands]
    if ambiguous:
        chosen.update(_resolve_by_running(req, inputs, ambiguous, runner, notes))
    outputs = [io_entry(spec, a, chosen[spec["name"]]) for spec, a, _c in out_pairs]
    return {"inputs": inputs, "outputs": outputs}


def _inputs_by_running(req, in_pairs, inputs, out_pairs, runner, notes, most: int = 16) -> list[dict[str, Any]]:
    """Inputs whose shape reads the same in NCHW and NHWC (``[2, 2, 2]``, ``[1, 8, 8, 8]``): onnx2tf does not
    always transpose them (a Concat of two such inputs kept their layout), so "taken as NHWC" can feed the file
    transposed values. Every combination of their candidate layouts (at most ``most``) is run on validation
    sample 0 and the one whose outputs best match the reference (each output in its best layout) is kept."""
    import itertools

    from edgeopt.targets.tflite import io_entry
    from edgeopt_agent.bundle import to_artifact

    amb = [i for i, (_s, _a, c) in enumerate(in_pairs) if len(c) > 1]

    def first_current(i: int) -> list[list[int]]:  # a tie keeps the layout taken so far (NHWC, as onnx2tf converts)
        now = inputs[i].get("perm") or list(range(len(in_pairs[i][0]["shape"])))
        return [now] + [c for c in in_pairs[i][2] if c != now]

    feed, refs = _sample_zero(req)

    def score(trial: list[dict[str, Any]]) -> float:
        try:
            outs = runner.run(to_artifact(feed, trial))
        except Exception:  # noqa: BLE001 - a layout the file cannot take
            return -float("inf")
        return sum(max(_layout_cos(outs[a["name"]], a, refs[spec["name"]], perm) for perm in cands)
                   for spec, a, cands in out_pairs)

    scored = []
    for combo in itertools.islice(itertools.product(*[first_current(i) for i in amb]), most):
        trial = list(inputs)
        for i, perm in zip(amb, combo):
            trial[i] = io_entry(in_pairs[i][0], in_pairs[i][1], list(perm))
        scored.append((score(trial), trial))
    best = max(scored, key=lambda st: st[0])[1]
    for i in amb:
        spec = in_pairs[i][0]
        perm = best[i].get("perm") or list(range(len(spec["shape"])))
        notes[:] = [n for n in notes if not n.startswith(f"input {spec['name']!r} {spec['shape']} reads the same")]
        notes.append(f"input {spec['name']!r} {spec['shape']} reads the same in NCHW and NHWC; perm {perm} "
                     "chosen by running validation sample 0 (the layout whose outputs match the reference)")
    return best


def _sample_zero(req) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Validation sample 0 (ONNX layout, by input name) and its FP32 reference outputs (by output name)."""
    with np.load(req["validation_path"]) as val, np.load(req["reference_path"]) as ref:
        feed = {s["name"]: val[f"in{i}"][0] for i, s in enumerate(req["io"]["inputs"])}
        refs = {s["name"]: ref[f"out{i}"][0] for i, s in enumerate(req["io"]["outputs"])}
    return feed, refs


def _layout_cos(y: Any, art: dict[str, Any], ref: np.ndarray, perm: list[int]) -> float:
    """Cosine between the reference and an artifact output read in layout ``perm`` (an int8 output dequantized
    by its ``quant``); -1 when that layout cannot hold the reference's values."""
    y = np.asarray(y)
    if art.get("quant") and y.dtype.kind in "iu":
        y = (y.astype(np.float64) - art["quant"][1]) * art["quant"][0]
    v = np.transpose(np.asarray(y, np.float64), np.argsort(perm)).ravel()
    r = np.asarray(ref, np.float64).ravel()
    if v.shape != r.shape:
        return -1.0
    return float(v @ r / (np.linalg.norm(v) * np.linalg.norm(r) + 1e-30))


def _resolve_by_running(req, inputs, ambiguous, runner, notes) -> dict[str, list[int]]:
    """Outputs whose shape reads the same in two layouts: pick the one that matches the reference."""
    from edgeopt_agent.bundle import to_artifact

    feed, refs = _sample_zero(req)
    outs = runner.run(to_artifact(feed, inputs))
    chosen = {}
    for spec, a, cands in ambiguous:
        best = max(cands, key=lambda perm, a=a, spec=spec: _layout_cos(outs[a["name"]], a, refs[spec["name"]], perm))
        chosen[spec["name"]] = best
        notes.append(f"output {spec['name']!r} {spec['shape']} reads the same in two layouts; "
                     f"perm {best} chosen by running validation sample 0")
    return chosen


# --- int8_mode=auto: the accuracy-aware search -----------------------------------------------------
# Fractions of the quantized layers kept float, worst first.  Measured (TF 2.19, validation sets of
# the slow PP-OCR test): rec's cosine 0.857 full-integer, 0.85 / 0.80 / 0.80 with 5-30% float (a
# float island still reads and writes int8 tensors), 0.980 with 50% (0.987 with 60%); det's 0.50
# rose only to 0.62 with 50% (0.64 with 70%).  Each size costs one quantization pass and one check
# (seconds); the calibration and the layer statistics are done once.
DENYLIST_FRACTIONS = (0.05, 0.15, 0.30, 0.50)
DEBUG_SAMPLES = 8  # calibration samples the QuantizationDebugger measures each layer's error on
CHECK_TIMEOUT = 600.0
LABELS = {"full": "full-integer", "selective": "selective", "dynamic": "dynamic-range",
          "float": "float32 (the conversion itself, no quantization)"}
HEADLINE = ("cosine", "rel_l2", "top1", "max_abs_norm", "snr_db", "exact_match", "seq_match", "flip_rate",
            "vector_cosine_min", "box_match")


class SearchFailed(Exception):
    """No INT8 candidate meets the bound: the build fails with this line, its hint and the record."""

    def __init__(self, message: str, hint: str, record: dict[str, Any]) -> None:
        super().__init__(message)
        self.hint, self.record = hint, record


@dataclass
class Attempt:
    """One INT8 candidate and how the host check's rule judged it on the validation set."""

    mode: str  # full | selective | dynamic
    float_layers: list[str] = field(default_factory=list)  # selective: the denylisted tensors
    layers: int = 0  # selective: the quantized layers measured (before the denylist)
    passed: bool = False
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # output -> headline figures
    reasons: list[str] = field(default_factory=list)
    error: str | None = None
    ops: list[str] = field(default_factory=list)  # the converter's op sets
    notes: list[str] = field(default_factory=list)  # the converter's notes on this file
    time_s: float = 0.0
    size_mb: float = 0.0

    def label(self) -> str:
        if self.mode == "selective":
            return f"{len(self.float_layers)} of {self.layers} layers float"
        return LABELS[self.mode]

    def worst(self) -> dict[str, float]:
        """The worst figures over the outputs: lowest cosine and top-1, highest rel_l2."""
        out = {}
        for key, pick in (("cosine", min), ("rel_l2", max), ("top1", min), ("seq_match", min), ("flip_rate", max),
                          ("box_match", min)):
            vals = [m[key] for m in self.metrics.values() if key in m]
            if vals:
                out[key] = pick(vals)
        ns = [int(m["top1_n"]) for m in self.metrics.values() if "top1_n" in m]
        if "top1" in out and ns:
            out["top1_n"] = min(ns)
        if any("ctc_blank" in m for m in self.metrics.values()):
            out["ctc_blank"] = 0.0  # only says that seq_match is a CTC decoding (its label)
        return out

    def figures(self) -> str:
        if self.error:
            return f"failed: {self.error}"
        w = self.worst()
        bits = [f"cos {w['cosine']:.4f}" if "cosine" in w else "", f"rel_l2 {w['rel_l2']:.3f}" if "rel_l2" in w else "",
                f"top1 {top1_text(w)}" if "top1" in w else "",
                f"{seq_label(w)} {w['seq_match']:.0%}" if "seq_match" in w else "",
                f"flips {w['flip_rate']:.2%}" if "flip_rate" in w else "",
                f"boxes {w['box_match']:.0%}" if "box_match" in w else ""]
        return " ".join(b for b in bits if b) or ("meets the bound" if self.passed else "; ".join(self.reasons))

    def record(self) -> dict[str, Any]:
        rec: dict[str, Any] = {"mode": self.mode, "label": self.label(), "passed": self.passed,
                               "metrics": self.metrics, "reasons": self.reasons, "time_s": round(self.time_s, 2),
                               "size_mb": round(self.size_mb, 3), "converter_ops": self.ops}
        if self.mode == "selective":
            rec.update(float_layers=len(self.float_layers), quantized_layers=self.layers)
        if self.error:
            rec["error"] = self.error
        return rec


class Int8Search:
    """``int8_mode=auto``: the first of full-integer, selective (the worst layers kept float, in a few
    growing steps), dynamic-range that meets the INT8 bound on the validation set is kept.

    That order is the order of speed: full-integer runs every layer in int8; each layer kept float
    costs a dequantize/quantize pair and a float kernel; dynamic-range runs float activations
    throughout.  The layers are ranked by TensorFlow's QuantizationDebugger on calibration samples
    (never on the validation set that then judges the candidates).
    """

    def __init__(self, tf, req: dict[str, Any], sm_dir: str, rep, in_perms: dict[str, list[int]], progress) -> None:
        self.tf, self.req, self.sm_dir, self.rep, self.in_perms, self.progress = tf, req, sm_dir, rep, in_perms, progress
        self.work = Path(req["work"]) / "int8-search"
        self.attempts: list[Attempt] = []
        self.ranking: list[dict[str, Any]] = []
        self.timings: dict[str, float] = {}
        self.out_perms: dict[str, list[int]] | None = None  # decided on the first file, reused
        self.mixed: list[dict[str, Any]] = []  # mixed-scale concatenations found in the full-integer file
        self.rule_notes: list[str] = []  # placement rules applied, for the manifest's notes
        self.t0 = time.perf_counter()

    # --- the order ---------------------------------------------------------------------------
    def run(self) -> tuple[bytes, Attempt]:
        """The kept file and its attempt; raises SearchFailed when no candidate meets the bound."""
        content = self._try(Attempt("full"), self._full)
        first: list[str] = []
        if content is not None:
            first = self._mixed_concats(content, self.attempts[-1])
        if content is not None and self.attempts[-1].passed:
            return content, self.attempts[-1]
        if content is not None:  # calibrated conversion works: keep the worst layers float
            content = self._selective(self.attempts[0].ops, first)
            if content is not None:
                return content, self.attempts[-1]
        content = self._try(Attempt("dynamic"), self._dynamic)
        if content is not None and self.attempts[-1].passed:
            return content, self.attempts[-1]
        # Nothing met the bound: is quantization the cause, or the float conversion already?
        self._try(Attempt("float"), self._float)
        raise self.failure()

    def _float(self, attempt: Attempt) -> bytes:
        content, attempt.ops = _to_tflite_isolated(self.sm_dir, "fp32", "float", "float32", None, attempt.notes,
                                                   self.work)
        return content

    def _full(self, attempt: Attempt) -> bytes:
        content, attempt.ops = _to_tflite_isolated(self.sm_dir, "int8", "full", self.req["io_dtype"], self.rep,
                                                   attempt.notes, self.work)
        return content

    def _dynamic(self, attempt: Attempt) -> bytes:
        content, attempt.ops = _to_tflite_isolated(self.sm_dir, "int8", "dynamic", "float32", None, attempt.notes,
                                                   self.work)
        return content

    def _mixed_concats(self, content: bytes, full: Attempt) -> list[str]:
        """The mixed-scale rule (``mixed_scale_concats``) on the full-integer file: the tensors to keep
        float in every selective file; the full-integer file is then not shipped, even if it passed."""
        try:
            self.mixed = mixed_scale_concats(content)
        except Exception as exc:  # noqa: BLE001 - an interpreter that cannot list ops: no rule, said
            full.notes.append(f"mixed-scale concat check not possible ({_first_line(exc)})")
            return []
        if not self.mixed:
            return []
        rule = (f"placement rule: a CONCATENATION whose inputs' scales differ by more than {MIXED_RATIO:.0f}x is "
                "kept float with what reads it (full-integer gives it one scale: the narrow inputs round to "
                "nothing); " + "; ".join(f"{m['tensor']} ({m['ratio']:.0f}x)" for m in self.mixed))
        self.rule_notes.append(rule)
        self.progress(f"int8 auto: {len(self.mixed)} concatenation(s) of differently-scaled tensors: "
                      "kept float in a selective file")
        if full.passed:
            full.passed = False
            full.reasons.append("a concatenation of differently-scaled tensors is quantized with one scale "
                                "(mixed-scale rule): not shipped")
        return list(dict.fromkeys(n for m in self.mixed for n in m["denylist"]))

    def _selective(self, base_ops: list[str], first: list[str] | None = None) -> bytes | None:
        """The first denylist size whose file meets the bound (None when none does); ``first``: tensors kept
        float in every file (the mixed-scale rule), tried alone before any ranked layer."""
        debugger = self._rank(base_ops)
        if debugger is None:
            return None
        if first:  # names of the full-integer file; the calibrated (float) model's that match
            from edgeopt_agent.runners.tflite import import_interpreter

            calibrated = import_interpreter()[0].Interpreter(model_content=debugger.calibrated_model)
            known = {d["name"] for d in calibrated.get_tensor_details()}
            first = [n for n in first if n in known]
            if not first:
                self.rule_notes.append("mixed-scale rule: the concatenation's tensors were not found in the "
                                       "calibrated model; not applied")
        first = list(first or [])
        ranked = [r["tensor"] for r in self.ranking]
        names = first + [n for n in ranked if n not in first]
        ops = list(dict.fromkeys([*base_ops, "TFLITE_BUILTINS"]))
        sizes = ([len(first)] if first else []) + [len(first) + k for k in denylist_sizes(len(names) - len(first))]
        for k in dict.fromkeys(sizes):
            def make(attempt: Attempt, k: int = k) -> bytes:
                attempt.ops = ops
                return self._denylisted(debugger, names[:k])

            content = self._try(Attempt("selective", names[:k], len(names)), make)
            if content is not None and self.attempts[-1].passed:
                return content
        return None

    # --- selective quantization with TensorFlow's QuantizationDebugger ------------------------
    def _rank(self, base_ops: list[str]):
        """Calibrate, measure every quantized layer's error (``debugger.run()``), rank them; the
        debugger then makes the selective files.  None (and a failed attempt) when that fails."""
        t = time.perf_counter()
        self.progress(f"int8 auto: per-layer quantization error (QuantizationDebugger, {DEBUG_SAMPLES} "
                      "calibration samples)")
        try:
            debugger = self._debugger(base_ops)
            debugger.run()
            self.ranking = rank_layers(debugger)
        except Exception as exc:  # the debugger refuses this model: the search goes on to dynamic-range
            print(f"== QuantizationDebugger failed:\n{traceback.format_exc()}", flush=True)
            self.attempts.append(Attempt("selective", error=f"QuantizationDebugger: {_first_line(exc)}",
                                         time_s=time.perf_counter() - t))
            return None
        finally:
            self.timings["int8_layer_stats_s"] = round(time.perf_counter() - t, 2)
        if not self.ranking:
            self.attempts.append(Attempt("selective", error="the debugger found no quantized layer"))
            return None
        return debugger

    def _debugger(self, base_ops: list[str]):
        tf = self.tf
        conv = tf.lite.TFLiteConverter.from_saved_model(self.sm_dir)
        conv.optimizations = [tf.lite.Optimize.DEFAULT]
        gen, _count = self.rep
        conv.representative_dataset = gen
        # The denylisted layers run float: builtin float kernels must be allowed beside the int8 ones.
        conv.target_spec.supported_ops = [getattr(tf.lite.OpsSet, n)
                                          for n in dict.fromkeys([*base_ops, "TFLITE_BUILTINS"])]
        order: list[str] = []  # the file's input order: the debug dataset yields lists, not dicts

        def debug_dataset():
            for k, feed in enumerate(gen()):
                if k >= DEBUG_SAMPLES:
                    return
                yield [feed[n] for n in order]

        debugger = tf.lite.experimental.QuantizationDebugger(
            converter=conv, debug_dataset=debug_dataset,
            debug_options=tf.lite.experimental.QuantizationDebugOptions())
        order.extend(_input_order(debugger.calibrated_model))
        return debugger

    def _denylisted(self, debugger, names: list[str]) -> bytes:
        """The calibrated model quantized with ``names`` (layer output tensors) left float; int8 I/O
        (``fully_quantize``) when the user asked for it, as the full-integer file has it."""
        debugger.options = self.tf.lite.experimental.QuantizationDebugOptions(
            denylisted_nodes=list(names), fully_quantize=self.req["io_dtype"] == "int8")
        return debugger.get_nondebug_quantized_model()

    # --- judging a candidate ------------------------------------------------------------------
    def _try(self, attempt: Attempt, make) -> bytes | None:
        """Convert (``make``), judge, record; the file's bytes, or None when it could not be made."""
        t = time.perf_counter()
        self.attempts.append(attempt)
        self.progress(f"int8 auto: {attempt.label()}: converting")
        try:
            content = make(attempt)
        except Exception as exc:  # ConverterError and the like: this candidate does not exist
            print(f"== int8 {attempt.label()} failed:\n{traceback.format_exc()}", flush=True)
            attempt.error = f"conversion failed: {_first_line(exc)}"
            content = None
        if content is not None:
            attempt.size_mb = len(content) / 1e6
            tc = time.perf_counter()
            self._judge(attempt, content)
            self._add_time("int8_checks_s", time.perf_counter() - tc)
        attempt.time_s = time.perf_counter() - t
        self._add_time(f"int8_{attempt.mode}_s", attempt.time_s)
        verdict = ("accepted by the accuracy policy" if attempt.passed else
                   "never ran" if attempt.error else "refused by the accuracy policy")
        self.progress(f"int8 auto: {attempt.label()}: {verdict} ({attempt.figures()}, {attempt.time_s:.0f}s)")
        return content

    def _judge(self, attempt: Attempt, content: bytes) -> None:
        """The agent's ``check`` verb on a scratch bundle of this file, in a child process.

        In a child because some int8 TFLite files abort the interpreter inside a kernel: here that
        would kill the converter (and the whole conversion with it) instead of failing one
        candidate.  And the check verb is the host check's own code (same interpreter, delegate,
        IO mapping and bound), so a candidate that passes here passes the build's host check.
        """
        from edgeopt.targets.base import host_check

        cand = self.work / f"{len(self.attempts)}-{attempt.mode}"
        (cand / "validation").mkdir(parents=True)
        (cand / "model.tflite").write_bytes(content)
        try:
            _link_or_copy(self.req["validation_path"], cand / "validation" / "inputs.npz")
            _link_or_copy(self.req["reference_path"], cand / "validation" / "reference.npz")
            try:
                io = self._io(cand / "model.tflite")
            except Exception as exc:  # RunnerUnavailable (Flex ops, refused op versions)...
                attempt.error = f"the interpreter cannot load it: {_first_line(exc)}"
                return
            manifest = {"runtime": {"name": "tflite", "artifact": "model.tflite"}, "precision": "int8", "io": io,
                        "validation": {"inputs": "validation/inputs.npz", "reference": "validation/reference.npz"}}
            if self.req.get("tolerance"):
                manifest["tolerance_override"] = self.req["tolerance"]
            if self.req.get("output_kinds"):
                manifest["output_kinds"] = self.req["output_kinds"]
            manifest["accept"] = self.req.get("accept")  # the accuracy policy the build judges by
            from edgeopt.targets.base import file_table

            manifest["files"] = file_table(cand)  # the agent opens only files its manifest lists
            (cand / "manifest.json").write_text(json.dumps(manifest, default=_plain))
            check = host_check(cand, CHECK_TIMEOUT)
        finally:
            shutil.rmtree(cand, ignore_errors=True)
        if check.get("error"):
            attempt.error = check["error"]
            return
        attempt.passed = bool(check.get("passed"))
        outs = check.get("outputs", {})
        attempt.metrics = {n: {k: round(float(o["metrics"][k]), 6) for k in HEADLINE if k in o["metrics"]}
                           for n, o in outs.items()}
        attempt.reasons = [f"{n}: {r}" if len(outs) > 1 else r for n, o in outs.items() for r in o["reasons"]]

    def _io(self, path: Path) -> dict[str, list[dict[str, Any]]]:
        from edgeopt_agent.runners.tflite import TfliteRunner

        runner = TfliteRunner(path.parent, {"runtime": {"artifact": path.name}, "files": {path.name: {}}})
        runner.load()  # reads the IO details only; the file runs in the check's child
        try:
            io = _artifact_io(self.req, runner.io_details(), self.in_perms, runner, [], self.out_perms)
        finally:
            runner.close()
        if self.out_perms is None:
            self.out_perms = {o["name"]: o["perm"] or list(range(len(o["shape"]))) for o in io["outputs"]}
        return io

    def _add_time(self, key: str, seconds: float) -> None:
        self.timings[key] = round(self.timings.get(key, 0.0) + seconds, 2)

    # --- the outcome --------------------------------------------------------------------------
    def record(self, chosen: Attempt | None) -> dict[str, Any]:
        """What the manifest keeps of the search (``options.int8``)."""
        from edgeopt_agent.compare import tolerance_for

        rec: dict[str, Any] = {
            "search": "auto", "chosen": chosen.mode if chosen else None,
            "chosen_label": chosen.label() if chosen else None,
            "order": "full-integer, then the worst layers kept float, then dynamic-range; the first to meet "
                     "the bound is kept",
            "tolerance": tolerance_for("int8", self.req.get("tolerance")),
            "attempts": [a.record() for a in self.attempts],
            "float_layers": list(chosen.float_layers) if chosen else [],
            "layer_ranking": {"metric": "rmse/scale (the layer's error in its own quantization steps; "
                                        "~0.29 is rounding alone)", "debug_samples": DEBUG_SAMPLES,
                              "quantized_layers": len(self.ranking),
                              "worst": [{**r, "rmse_per_scale": round(r["rmse_per_scale"], 4)}
                                        for r in self.ranking[:10]]} if self.ranking else None,
            "denylist_fractions": list(DENYLIST_FRACTIONS),
            "mixed_scale_concats": [{**m, "ratio": round(m["ratio"], 1)} for m in self.mixed],
            "search_s": round(time.perf_counter() - self.t0, 1)}
        return rec

    def note(self, chosen: Attempt) -> str:
        """The build summary's line, e.g. ``int8 auto: full-integer missed the bound (cos 0.81); kept
        12 of 160 layers float -> cos 0.985``."""
        first = self.attempts[0]
        if chosen is first:
            return f"int8 auto: full-integer meets the bound ({chosen.figures()})"
        missed = f"int8 auto: full-integer missed the bound ({first.figures()})"
        tried_sel = [a for a in self.attempts if a.mode == "selective" and a is not chosen]
        if chosen.mode == "selective":
            return f"{missed}; kept {chosen.label()} -> {chosen.figures()}"
        sel = ""
        if tried_sel:
            best = max(tried_sel, key=lambda a: a.worst().get("cosine", -1.0))
            sel = f"; keeping up to {max(len(a.float_layers) for a in tried_sel)} layers float missed it too " \
                  f"(best: {best.label()}, {best.figures()})"
        return f"{missed}{sel}; dynamic-range (int8 weights, float activations) -> {chosen.figures()}"

    def failure(self) -> SearchFailed:
        from edgeopt_agent.compare import bound_text, tolerance_for

        bound = bound_text("int8", self.req.get("tolerance"))
        tried = "; ".join(f"{a.label()}: {a.figures()}" for a in self.attempts)
        probe = next((a for a in self.attempts if a.mode == "float"), None)
        default = tolerance_for("int8")  # judged at the default bound: a user's strict one says nothing of the file
        w = probe.worst() if probe is not None and not probe.error else {}
        if w and (w.get("cosine", 1.0) < default["cosine_min"] or w.get("rel_l2", 0.0) > default["rel_l2_max"]):
            return SearchFailed(
                f"the FP32 conversion itself is wrong, not the INT8 quantization: the float32 TFLite file of "
                f"this model already misses the int8 bound ({probe.figures()}); tried: {tried}",
                "build fp32 for this target: a failed float check retries onnx2tf's alternative switches "
                "(--option onnx2tf_alt=...), or report the model to onnx2tf", self.record(None))
        ran = [a for a in self.attempts if a.mode != "float" and not a.error and a.reasons]
        closest = max(ran, key=lambda a: a.worst().get("cosine", -1.0)) if ran else None
        why = f" (closest, {closest.label()}: {'; '.join(closest.reasons[:2])})" if closest else f" ({bound})"
        return SearchFailed(
            f"no INT8 TFLite variant the accuracy policy accepts on the validation set{why}, so int8 is not "
            f"shipped (search {time.perf_counter() - self.t0:.0f}s): {tried}",
            "build fp16 (or fp32) for this target, calibrate with more representative --calib data, or (knowingly) relax "
            "the bound with --option int8_tolerance=cosine_min=0.95,...", self.record(None))


def denylist_sizes(n: int, fractions: tuple[float, ...] = DENYLIST_FRACTIONS) -> list[int]:
    """How many of ``n`` ranked layers each selective candidate keeps float (growing, distinct, >= 1)."""
    sizes: list[int] = []
    for f in fractions:
        k = min(n, max(1, math.ceil(f * n)))
        if n and k not in sizes:
            sizes.append(k)
    return sizes


def rank_layers(debugger) -> list[dict[str, Any]]:
    """The quantized layers, worst first, by rmse/scale of ``debugger.layer_statistics_dump`` (the
    ranking of TensorFlow's QuantizationDebugger guide): a layer's error in its own quantization steps."""
    buf = _io.StringIO()
    debugger.layer_statistics_dump(buf)
    rows: dict[str, dict[str, Any]] = {}
    for r in csv.DictReader(_io.StringIO(buf.getvalue())):
        try:
            scale, mse = float(r["scale"]), float(r["mean_squared_error"])
        except (TypeError, ValueError):
            continue
        score = math.sqrt(mse) / scale if scale > 0 and mse >= 0 else math.nan
        rows.setdefault(r["tensor_name"], {"tensor": r["tensor_name"], "op": r["op_name"], "rmse_per_scale": score})
    return sorted(rows.values(), key=lambda r: -r["rmse_per_scale"] if math.isfinite(r["rmse_per_scale"]) else math.inf)


MIXED_RATIO = 16.0  # as edgeopt.targets.mixed_concat.RATIO


def mixed_scale_concats(content: bytes, ratio: float = MIXED_RATIO) -> list[dict[str, Any]]:
    """The CONCATENATIONs of a full-integer file whose inputs came with scales more than ``ratio`` apart.

    TFLite's int8 CONCATENATION takes one scale for all inputs: the converter requantizes each input to
    the output's scale (a QUANTIZE op in front of it), so a 0..1 score channel beside 0..1024 px
    coordinates rounds to 0.  An input's own scale is read before such a requantize.  Each entry: the
    concat's output tensor name (what ``denylisted_nodes`` keeps float), its input scales and the ratio."""
    from edgeopt_agent.runners.tflite import import_interpreter

    mod, _name, _version = import_interpreter()
    it = mod.Interpreter(model_content=content)
    tensors = {d["index"]: d for d in it.get_tensor_details()}
    ops = it._get_ops_details()  # noqa: SLF001 - the only way to the op graph without a flatbuffer parser
    producer = {o: op for op in ops for o in op["outputs"]}

    def scale_of(index: int) -> float:
        return float(tensors.get(index, {}).get("quantization", (0.0, 0))[0])

    def upstream(index: int) -> tuple[float, list[int]]:
        """An input's own scale -- before a requantizing QUANTIZE, looking through ops that only move
        values (onnx2tf puts its layout Transposes and Reshapes between) -- and the tensors on the way."""
        path, t = [], index
        for _ in range(16):
            op = producer.get(t)
            if op is None or not len(op["inputs"]):
                break
            src = int(op["inputs"][0])
            if op["op_name"] == "QUANTIZE":
                if str(tensors.get(src, {}).get("dtype", "")).endswith(("int8'>", "uint8'>", "int16'>")):
                    return scale_of(src), path  # requantized to the concat's scale: its own one is before
                break
            if op["op_name"] not in TFL_PASS_THROUGH:
                break
            path.append(t)
            t = src
        return scale_of(index), path

    readers: dict[int, list[dict[str, Any]]] = {}
    for op in ops:
        for i in op["inputs"]:
            readers.setdefault(int(i), []).append(op)
    found = []
    for op in ops:
        if op["op_name"] != "CONCATENATION":
            continue
        ups = [upstream(int(i)) for i in op["inputs"] if int(i) >= 0]
        scales = [x for x, _ in ups if x > 0]
        if len(scales) >= 2 and max(scales) > ratio * min(scales):
            out = int(op["outputs"][0])
            # the concatenated tensor, the moves on each input's way (they carry the shared scale), and what
            # reads it through ops that only move it: each of them would take the one per-tensor scale
            names = [tensors[t]["name"] for _, path in ups for t in path]
            todo, seen = [out], set()
            while todo:
                t = todo.pop()
                if t in seen:
                    continue
                seen.add(t)
                names.append(tensors[t]["name"])
                for user in readers.get(t, []):
                    if user["op_name"] == "DEQUANTIZE" and len(user["outputs"]):
                        # a graph output: the float tensor after it carries the name the calibrated model has
                        names.append(tensors[int(user["outputs"][0])]["name"])
                    if user["op_name"] in TFL_PASS_THROUGH and len(user["outputs"]):
                        todo.append(int(user["outputs"][0]))
            found.append({"tensor": tensors[out]["name"], "denylist": names, "scales": scales,
                          "ratio": max(scales) / min(scales)})
    return found


TFL_PASS_THROUGH = {"RESHAPE", "TRANSPOSE", "SQUEEZE", "EXPAND_DIMS"}


def _input_order(content: bytes) -> list[str]:
    """The signature input names of a TFLite file in the order of its input tensors."""
    from edgeopt_agent.runners.tflite import import_interpreter

    mod, _name, _version = import_interpreter()
    it = mod.Interpreter(model_content=content)
    sigs = it.get_signature_list()
    if not sigs:
        return [d["name"] for d in it.get_input_details()]
    runner = it.get_signature_runner(next(iter(sigs)))
    by_index = {d["index"]: n for n, d in runner.get_input_details().items()}
    return [by_index[d["index"]] for d in it.get_input_details()]


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0][:240]}" if lines else type(exc).__name__


def _link_or_copy(src: str, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
