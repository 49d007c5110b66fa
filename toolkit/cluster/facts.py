"""What a machine can build, as Dask resources: ``<backend>@<toolchain hash>`` (light: no dask, no converter
imported; versions come from package metadata).

A job needs exactly one resource (one per task: dask/distributed#6136), named by its backend and a hash of the
host's converter versions (``Target.toolchain()``, the versions in the cache key) and of edgeopt's own code
(``code_hash``: the conversion and judging code, which the cache key holds only as a version string), so a job
goes only to a worker whose bundle would be the host's own: same cache key, same bundle id. TensorRT's resource is an engine slot per GPU: two TensorRT jobs
never build at once on one GPU (it perturbs tactic timing).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
from typing import Any

BACKENDS = ("onnxruntime", "openvino", "tflite", "coreml", "tensorrt")
#: what each backend's resource stands for, in refusals and `edgeopt cluster status`
WHAT = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO + NNCF", "tflite": "onnx2tf + TensorFlow (LiteRT)",
        "coreml": "coremltools", "tensorrt": "a GPU's TensorRT engine slot"}


_CODE: list[str] = []  # code_hash(), once per process


def code_hash() -> str:
    """sha256[:12] of edgeopt's own code as this process imports it: every ``.py`` of ``edgeopt`` (with its
    ``targets`` and ``hil`` parts, wherever they are installed from) and ``edgeopt_agent``, and the targets' data
    files, by path inside the package. Two machines with one edgeopt release agree; a worker started before a
    change to the code (an editable install), or running a patched copy, does not."""
    if not _CODE:
        import importlib
        from pathlib import Path

        h = hashlib.sha256()
        for pkg in ("edgeopt", "edgeopt.targets", "edgeopt.hil", "edgeopt_agent"):
            root = Path(next(iter(importlib.import_module(pkg).__path__))).resolve()
            files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                           and (p.suffix == ".py" or p.parent.name == "data"))
            for f in files:
                rel = f.relative_to(root).as_posix()
                if pkg == "edgeopt" and rel.split("/", 1)[0] in ("targets", "hil"):
                    continue  # their own packages (the same folder when installed as one tree)
                h.update(f"{pkg}/{rel}\0".encode())
                h.update(hashlib.sha256(f.read_bytes()).digest())
        _CODE.append(h.hexdigest()[:12])
    return _CODE[0]


def toolchain(backend: str) -> dict[str, str]:
    """What a bundle of ``backend`` is made by: the converter versions it is keyed by (``Target.toolchain()``)
    and ``edgeopt code`` (``code_hash``)."""
    from edgeopt.targets.registry import get_backend

    return {**get_backend(backend).toolchain(), "edgeopt code": code_hash()}


def resource(backend: str, chain: dict[str, str] | None = None) -> str:
    """``openvino@1a2b3c4d``: the resource a job of ``backend`` needs at these converter versions."""
    chain = toolchain(backend) if chain is None else chain
    digest = hashlib.sha256(json.dumps(chain, sort_keys=True).encode()).hexdigest()[:8]
    return f"{backend}@{digest}"


def split(name: str) -> tuple[str, str]:
    """``openvino@1a2b3c4d`` -> ("openvino", "1a2b3c4d"); a foreign resource -> (name, "")."""
    backend, _, digest = name.partition("@")
    return backend, digest


def gpu_count() -> int:
    """GPUs this worker can build TensorRT engines on: ``nvidia-smi -L`` lines, where ``tensorrt`` imports."""
    from importlib.util import find_spec

    if find_spec("tensorrt") is None or not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def detect(nthreads: int = 1) -> dict[str, float]:
    """The resources this machine offers: every backend that can build here (``Target.available()``), as many
    slots as the worker has threads; TensorRT one engine slot per GPU."""
    from edgeopt.targets.registry import get_backend

    out: dict[str, float] = {}
    for b in BACKENDS:
        backend = get_backend(b)
        if backend.available() is not None:
            continue
        if b == "tensorrt":
            gpus = gpu_count()
            if gpus:
                out[resource(b)] = gpus
            continue
        out[resource(b)] = nthreads
    return out


def worker_facts() -> dict[str, Any]:
    """What `edgeopt cluster status` shows of one worker (run there by ``Client.run``)."""
    from edgeopt import __version__

    return {"edgeopt": __version__, "python": platform.python_version(), "machine": platform.machine(),
            "system": platform.system(), "host": platform.node(), "pid": os.getpid(),
            "toolchains": {b: toolchain(b) for b in BACKENDS}}


def differences(mine: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """``["openvino 2025.0.0 (host 2026.4.1)", ...]``: the versions that differ between two toolchains."""
    return [f"{k} {theirs.get(k, 'missing')} (host {v})" for k, v in mine.items() if theirs.get(k) != v]
