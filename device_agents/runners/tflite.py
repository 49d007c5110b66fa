"""TFLite runner: LiteRT's interpreter (XNNPACK by default), or tflite-runtime, or TensorFlow's.

Whichever interpreter is present is used, in this order: ``ai_edge_litert.interpreter`` (LiteRT,
the successor), ``tflite_runtime.interpreter`` (what older devices carry), ``tensorflow.lite``
(which alone links the Select-TF-ops "Flex" kernels).  ``options["interpreter"]`` forces one.

Options: ``threads`` (int), ``delegate`` = ``xnnpack`` (default: the interpreter's built-in
default delegate) | ``none`` (reference kernels only) | ``gpu`` | ``nnapi`` | a path to a delegate
library; ``delegate_library`` overrides the library file of ``gpu``/``nnapi``.  A delegate that
cannot load falls back to XNNPACK and ``info()`` says so, so a result always names what ran.

The file's operator table is read straight from the flatbuffer (``read_ops``, stdlib only): it
lists the builtin ops with their versions (an old tflite-runtime refuses versions newer than it
knows) and the custom ops, among them ``Flex*`` ops that only a TensorFlow-linked interpreter has.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from . import Runner, RunnerUnavailable

# The import path of each interpreter and how to get its Interpreter class and version.
INTERPRETERS = ("ai_edge_litert", "tflite_runtime", "tensorflow")
CUSTOM = 32  # BuiltinOperator.CUSTOM in the TFLite schema
# Library file names tried for the GPU and NNAPI delegates (Android/Linux builds of LiteRT).
DELEGATE_LIBRARIES = {
    "gpu": ["libtensorflowlite_gpu_delegate.so", "libLiteRtGpuAccelerator.so"],
    "nnapi": ["libtensorflowlite_nnapi_delegate.so", "libnnapi_delegate.so"],
}


class TfliteFileError(Exception):
    """The file is not a TFLite flatbuffer (or is truncated)."""


# --- reading the flatbuffer (no schema package needed) ------------------------------------------
class _Table:
    """A flatbuffer table: typed access to fields by their index in the schema."""

    def __init__(self, buf: bytes, pos: int) -> None:
        self.buf, self.pos = buf, pos
        vt = pos - struct.unpack_from("<i", buf, pos)[0]
        self.vt, self.vt_size = vt, struct.unpack_from("<H", buf, vt)[0]

    def _field(self, i: int) -> int:
        off = 4 + 2 * i
        if off >= self.vt_size:
            return 0
        rel = struct.unpack_from("<H", self.buf, self.vt + off)[0]
        return self.pos + rel if rel else 0

    def scalar(self, i: int, fmt: str, default: int = 0) -> int:
        p = self._field(i)
        return struct.unpack_from("<" + fmt, self.buf, p)[0] if p else default

    def _vector(self, i: int) -> tuple[int, int]:
        p = self._field(i)
        if not p:
            return 0, 0
        start = p + struct.unpack_from("<I", self.buf, p)[0]
        return start + 4, struct.unpack_from("<I", self.buf, start)[0]

    def string(self, i: int) -> str | None:
        start, n = self._vector(i)
        return self.buf[start:start + n].decode("utf-8", "replace") if start else None

    def bytes_(self, i: int) -> bytes:
        start, n = self._vector(i)
        return self.buf[start:start + n] if start else b""

    def tables(self, i: int) -> list[_Table]:
        start, n = self._vector(i)
        out = []
        for k in range(n):
            p = start + 4 * k
            out.append(_Table(self.buf, p + struct.unpack_from("<I", self.buf, p)[0]))
        return out

    def uints(self, i: int) -> list[int]:
        start, n = self._vector(i)
        return list(struct.unpack_from(f"<{n}I", self.buf, start)) if start else []


def read_ops(path: str | os.PathLike) -> dict[str, Any]:
    """The operator table of a .tflite file.

    ``{"ops": [{"builtin_code": int, "op": name, "version": int, "count": uses}, ...],
    "custom_ops": [names], "flex_ops": [names], "min_runtime_version": str | None}``.
    """
    buf = Path(path).read_bytes()
    if len(buf) < 16 or buf[4:8] != b"TFL3":
        raise TfliteFileError(f"{path} is not a TFLite flatbuffer (no TFL3 identifier)")
    try:
        model = _Table(buf, struct.unpack_from("<I", buf, 0)[0])
        codes = []
        for t in model.tables(1):  # Model.operator_codes
            # builtin_code (field 3) superseded the int8 deprecated_builtin_code (field 0) at 127;
            # files keep both and the larger one is the real code.
            code = max(t.scalar(0, "b", 0), t.scalar(3, "i", 0))
            codes.append({"builtin_code": code, "custom_code": t.string(1), "version": t.scalar(2, "i", 1)})
        counts = [0] * len(codes)
        for sg in model.tables(2):  # Model.subgraphs -> SubGraph.operators -> Operator.opcode_index
            for op in sg.tables(3):
                idx = op.scalar(0, "I", 0)
                if idx < len(counts):
                    counts[idx] += 1
        min_version = None
        buffers = model.tables(4)
        for md in model.tables(6):  # Model.metadata: {name, buffer index}
            if md.string(0) == "min_runtime_version":
                b = md.scalar(1, "I", 0)
                if b < len(buffers):
                    min_version = buffers[b].bytes_(0).split(b"\0")[0].decode("ascii", "replace") or None
    except (struct.error, IndexError) as exc:
        raise TfliteFileError(f"{path} is truncated or not a valid TFLite flatbuffer ({exc})") from None
    names = builtin_op_names()
    ops = []
    for c, n in zip(codes, counts):
        if c["builtin_code"] == CUSTOM:
            name = c["custom_code"] or "CUSTOM"
        else:
            name = names.get(c["builtin_code"], f"BUILTIN_{c['builtin_code']}")
        ops.append({"op": name, "builtin_code": c["builtin_code"], "version": c["version"], "count": n,
                    **({"custom": True} if c["builtin_code"] == CUSTOM else {})})
    custom = [o["op"] for o in ops if o.get("custom")]
    return {"ops": ops, "custom_ops": custom, "flex_ops": [c for c in custom if c.startswith("Flex")],
            "min_runtime_version": min_version}


def builtin_op_names() -> dict[int, str]:
    """Builtin operator code -> name, from a schema module where one is installed (else empty)."""
    for mod in ("ai_edge_litert.schema_py_generated", "tensorflow.lite.python.schema_py_generated"):
        try:
            schema = importlib.import_module(mod)
        except Exception:  # absent, or flatbuffers missing: names are a nicety
            continue
        return {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_") and isinstance(v, int)}
    return {}


# --- choosing an interpreter ---------------------------------------------------------------------
def import_interpreter(prefer: str | None = None) -> tuple[Any, str, str]:
    """``(interpreter module, name, version)`` of the first interpreter present (or ``prefer``)."""
    order = [prefer] if prefer else list(INTERPRETERS)
    errors = []
    for name in order:
        if name not in INTERPRETERS:
            raise RunnerUnavailable(f"unknown TFLite interpreter {name!r}; one of {', '.join(INTERPRETERS)}")
        try:
            if name == "tensorflow":
                tf = importlib.import_module("tensorflow")
                return tf.lite, name, tf.__version__
            mod = importlib.import_module(f"{name}.interpreter")
            return mod, name, _version(name)
        except Exception as exc:  # ImportError, or a wheel that fails to load (numpy ABI)
            errors.append(f"{name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
    raise RunnerUnavailable("no TFLite interpreter is usable here (" + "; ".join(errors) + "); "
                            "pip install ai-edge-litert (or tflite-runtime on older devices)")


def _version(package: str) -> str:
    try:
        import importlib.metadata as md

        return md.version(package.replace("_", "-"))
    except Exception:  # installed without metadata (some device images)
        return str(getattr(importlib.import_module(package), "__version__", "unknown"))


class TfliteRunner(Runner):
    """Runs a .tflite file; feeds are keyed by signature input names (or tensor names)."""

    runtime = "tflite"

    def load(self) -> None:
        mod, self._interp_name, self._interp_version = import_interpreter(self.options.get("interpreter"))
        try:
            self._ops = read_ops(self.artifact)
        except (OSError, TfliteFileError) as exc:
            raise RunnerUnavailable(str(exc)) from None
        if self._ops["flex_ops"] and self._interp_name != "tensorflow":
            # The plain interpreters abort or refuse at allocation; say why before that happens.
            raise RunnerUnavailable(
                f"the model needs Select TensorFlow ops {self._ops['flex_ops']} that the {self._interp_name} "
                "interpreter (as shipped on phones) does not have; rebuild with builtin replacements "
                "(edgeopt does this by default) or run it with TensorFlow's interpreter")
        threads = self.options.get("threads")
        self._threads = int(threads) if threads else None
        kwargs: dict[str, Any] = {"model_path": str(self.artifact), "num_threads": self._threads}
        self._delegate = self._choose_delegate(mod, kwargs)
        try:
            self.interpreter = mod.Interpreter(**kwargs)
            self.interpreter.allocate_tensors()
        except (ValueError, RuntimeError) as exc:
            raise RunnerUnavailable(f"{self._interp_name} {self._interp_version} cannot load this model: "
                                    f"{str(exc).strip().splitlines()[0]}") from None
        self._inputs, self._outputs, self._signature = self._io_indices()
        by_index = {d["index"]: tuple(int(v) for v in d["shape"]) for d in self.interpreter.get_input_details()}
        self._shapes = {n: by_index[i] for n, i in self._inputs.items()}

    def _choose_delegate(self, mod, kwargs: dict[str, Any]) -> dict[str, Any]:
        want = str(self.options.get("delegate") or "xnnpack").lower()
        resolver = getattr(mod, "OpResolverType", None)
        if want == "none":
            if resolver is None:
                return {"requested": want, "used": "default", "note": "this interpreter cannot turn XNNPACK off"}
            kwargs["experimental_op_resolver_type"] = resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES
            return {"requested": want, "used": "none"}
        if want == "xnnpack":
            return {"requested": want, "used": "xnnpack"}
        libs = [self.options["delegate_library"]] if self.options.get("delegate_library") else \
            DELEGATE_LIBRARIES.get(want, [want])
        errors = []
        for lib in libs:
            try:
                # Open the library first: a failed load_delegate leaves a Delegate whose __del__ raises.
                ctypes.CDLL(lib)
                kwargs["experimental_delegates"] = [mod.load_delegate(lib)]
                return {"requested": want, "used": want, "library": lib}
            except (ValueError, OSError, RuntimeError, AttributeError) as exc:
                errors.append(f"{lib}: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}")
        return {"requested": want, "used": "xnnpack", "fallback": f"{want} delegate unavailable ({'; '.join(errors)})"}

    def _io_indices(self) -> tuple[dict[str, int], dict[str, int], str | None]:
        """Feed/fetch names -> tensor indices: the signature's names where the file has one."""
        it = self.interpreter
        sigs = it.get_signature_list() if hasattr(it, "get_signature_list") else {}
        if sigs:
            key = "serving_default" if "serving_default" in sigs else next(iter(sigs))
            runner = it.get_signature_runner(key)
            ins = {n: d["index"] for n, d in runner.get_input_details().items()}
            outs = {n: d["index"] for n, d in runner.get_output_details().items()}
            return ins, outs, key
        return ({d["name"]: d["index"] for d in it.get_input_details()},
                {d["name"]: d["index"] for d in it.get_output_details()}, None)

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        it = self.interpreter
        resized = False
        for name, value in feed.items():
            if name not in self._inputs:
                raise KeyError(f"the model has no input {name!r}; inputs: {sorted(self._inputs)}")
            if self._shapes[name] != value.shape:
                # Dynamic dimensions (e.g. an audio length): resize, then re-plan the memory.
                it.resize_tensor_input(self._inputs[name], list(value.shape), strict=False)
                self._shapes[name] = value.shape
                resized = True
        if resized:
            it.allocate_tensors()
        for name, value in feed.items():
            it.set_tensor(self._inputs[name], value)
        it.invoke()
        return {name: it.get_tensor(idx) for name, idx in self._outputs.items()}

    def io_details(self) -> dict[str, list[dict[str, Any]]]:
        """Inputs and outputs as the file declares them (names, shapes, dtypes, quantization)."""
        def one(name: str, idx: int) -> dict[str, Any]:
            d = next(t for t in self.interpreter.get_tensor_details() if t["index"] == idx)
            scale, zp = d["quantization"]
            out = {"name": name, "tensor": d["name"], "index": idx, "shape": [int(s) for s in d["shape"]],
                   "shape_signature": [int(s) for s in d.get("shape_signature", d["shape"])],
                   "dtype": np.dtype(d["dtype"]).name}
            if scale:
                out["quant"] = [float(scale), int(zp)]
            return out

        return {"inputs": [one(n, i) for n, i in self._inputs.items()],
                "outputs": [one(n, i) for n, i in self._outputs.items()], "signature": self._signature}

    def info(self) -> dict[str, Any]:
        delegated = 0
        try:
            delegated = sum(1 for o in self.interpreter._get_ops_details() if o.get("op_name") == "DELEGATE")
        except Exception:  # a private API: absent in some builds
            pass
        return {"runtime": self.runtime, "interpreter": self._interp_name, "version": self._interp_version,
                "threads": self._threads or "default", "delegate": {**self._delegate, "partitions": delegated},
                "signature": self._signature, "min_runtime_version": self._ops.get("min_runtime_version"),
                "custom_ops": self._ops["custom_ops"]}

    def profile(self, feeds: list[dict[str, np.ndarray]], iterations: int) -> dict[str, Any]:
        """LiteRT's Python API has no op profiler: the Interpreter and CompiledModel of ai-edge-litert 2.1
        (and tflite-runtime, tf.lite) expose no per-op timing; the C++ ``benchmark_model
        --enable_op_profiling`` has it and is not in the wheels. Said, not faked."""
        return {"available": False,
                "why": "LiteRT's Python Interpreter/CompiledModel expose no per-op profiler (the C++ benchmark_model "
                       "tool's --enable_op_profiling does; it is not in the Python wheels)"}

    def close(self) -> None:
        self.interpreter = None
