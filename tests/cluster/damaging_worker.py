"""`dask worker --preload` for the hash-mismatch test: this worker flips one byte of every bundle artifact it
sends back (the bundle's files as they leave it, after its manifest was written): a faulty disk or a tampering
machine, as the host sees it. Test-only; loaded only by tests/cluster."""

from __future__ import annotations

from pathlib import Path

import edgeopt.cluster.task as task

_read = getattr(task, "_undamaged_read", task._read)  # dask may load a preload file twice
task._undamaged_read = _read


def _damaged(path: Path) -> bytes:
    data = _read(path)
    if path.suffix in (".onnx", ".xml", ".bin", ".tflite") and data:
        return data[:-1] + bytes([data[-1] ^ 0xFF])
    return data


task._read = _damaged
