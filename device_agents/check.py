"""Accuracy check of a bundle: run its artifact over the validation inputs, compare with the reference.

Used by the host check (in a child process, so a crashing runtime is a reported failure) and by
the agent's bench.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from .bundle import from_artifact, load_manifest, reference_outputs, to_artifact, validation_inputs
from .compare import batch_rows, compare_outputs
from .runners import get_runner


def run_validation(runner, manifest: dict[str, Any], bundle: Path) -> dict[str, np.ndarray]:
    """Outputs on every validation sample, in the ONNX layout, stacked on axis 0."""
    io = manifest["io"]
    collected: dict[str, list[np.ndarray]] = {o["name"]: [] for o in io["outputs"]}
    for feed in validation_inputs(bundle, manifest):
        out = from_artifact(runner.run(to_artifact(feed, io["inputs"])), io["outputs"])
        for name in collected:
            collected[name].append(out[name])
    return {k: np.stack(v) for k, v in collected.items()}


def check_bundle(bundle: str | Path, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load, run over the validation set, compare. Returns the comparison plus timings."""
    bundle = Path(bundle)
    options = dict(options or {})
    manifest = load_manifest(bundle)
    runner = get_runner(manifest["runtime"]["name"])(bundle, manifest, options)
    t0 = time.perf_counter()
    runner.load()
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    outputs = run_validation(runner, manifest, bundle)
    run_s = time.perf_counter() - t0
    rows = batch_rows((manifest.get("validation") or {}).get("source"))  # build --batch B: distinct samples
    result = compare_outputs(outputs, reference_outputs(bundle, manifest), manifest["precision"],
                             manifest.get("tolerance_override"), manifest.get("output_kinds"), rows)
    result.update({"load_s": load_s, "validation_s": run_s,
                   "samples": int(sum(rows)) if rows else
                   int(next(iter(outputs.values())).shape[0]) if outputs else 0,
                   "runner": runner.info()})
    runner.close()
    return result
