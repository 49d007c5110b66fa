"""Words for a child process that ended by SIGKILL, which nothing in edgeopt sends on its own accord but a timeout.

On Linux a SIGKILL nobody asked for is most often the kernel's out-of-memory killer: onnx2tf converting the zoo's
vgg19 (548 MB of weights) grew to 22.5 GB resident on a 24 GB machine and was killed; the build said only "exit
code -9".  One implementation for every place that runs a converter or a build in a child (tflite's converter,
the pipeline's build workers).
"""

from __future__ import annotations

import os
import signal


def _meminfo_gb(field: str) -> float | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return None


def sigkill_words(returncode: int | None, what: str, model_bytes: int | None = None) -> tuple[str, str] | None:
    """``(message, hint)`` when ``returncode`` says ``what`` was killed by SIGKILL, else None.  The message gives
    the machine's memory and, when a child of this process reached more than half of it, that child's peak."""
    if returncode is None or returncode != -signal.SIGKILL:
        return None
    total = _meminfo_gb("MemTotal")
    peak = None
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KB -> GB (Linux)
    except (ImportError, OSError):
        pass
    said = []
    if total:
        said.append(f"this machine has {total:.1f} GB of memory")
    if peak and total and peak > total / 2:
        said.append(f"a child of this build reached {peak:.1f} GB resident")
    if model_bytes:
        said.append(f"the model is {model_bytes / 2**20:.0f} MB")
    msg = (f"{what} was killed (SIGKILL, signal 9), most likely by the kernel's out-of-memory killer"
           + (": " + "; ".join(said) if said else ""))
    hint = ("build this target on a machine with more memory, or one target at a time (-j 1) with nothing else "
            "running; `dmesg | grep -i 'out of memory'` confirms it")
    return msg, hint


def model_size(path: str | os.PathLike | None) -> int | None:
    try:
        return os.path.getsize(path) if path else None
    except OSError:
        return None
