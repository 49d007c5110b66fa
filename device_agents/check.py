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
from .runners import open_runner


def run_validation(runner, manifest: dict[str, Any], bundle: Path) -> dict[str, np.ndarray]:
    """Outputs on every validation sample, in the ONNX layout, stacked on axis 0."""
    io = manifest["io"]
    collected: dict[str, list[np.ndarray]] = {o["name"]: [] for o in io["outputs"]}
    for feed in validation_inputs(bundle, manifest):
        out = from_artifact(runner.run(to_artifact(feed, io["inputs"])), io["outputs"])
        for name in collected:
            collected[name].append(out[name])
    return {k: np.stack(v) for k, v in collected.items()}


def run_varlen(runner, manifest: dict[str, Any], bundle: Path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray],
                                                                        list[dict[str, Any]]]:
    """Every variable-length validation sample fitted to the artifact's form (``varlen.fit``: own length, its
    bucket, or padded to the top), its outputs cropped to the unpadded FP32 outputs' shape; returns (outputs,
    reference) stacked zero-padded alike, and one row per sample (its length, the first output's cosine)."""
    from . import varlen

    io = manifest["io"]
    form = varlen.form_of(manifest)
    feeds, refs = varlen.validation(bundle, manifest)
    outs: dict[str, list[np.ndarray]] = {o["name"]: [] for o in io["outputs"]}
    rows = []
    first = io["outputs"][0]["name"] if io["outputs"] else None
    for feed, ref in zip(feeds, refs):
        fitted = varlen.fit(feed, io["inputs"], form)
        out = from_artifact(runner.run(to_artifact(fitted, io["inputs"])), io["outputs"])
        for name in outs:
            outs[name].append(varlen.crop(out[name], np.shape(ref[name])))
        if first is not None:
            a = outs[first][-1].astype(np.float64).ravel()
            b = np.asarray(ref[first], np.float64).ravel()
            cos = float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30)) if a.size == b.size else None
            rows.append({"length": varlen.length_key(feed, io["inputs"]),
                         "ran_at": varlen.length_key(fitted, io["inputs"]), "cosine": cos})
    return ({k: varlen.stack_padded(v) for k, v in outs.items()},
            {k: varlen.stack_padded([r[k] for r in refs]) for k in outs}, rows)


def check_bundle(bundle: str | Path, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load, run over the validation set, compare. Returns the comparison plus timings."""
    bundle = Path(bundle)
    options = dict(options or {})
    manifest = load_manifest(bundle)
    runner = open_runner(bundle, manifest, options)
    t0 = time.perf_counter()
    runner.load()
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    per_length = None
    if (manifest.get("validation") or {}).get("varlen"):  # each sample at its own length, FP32 unpadded
        outputs, reference, per_length = run_varlen(runner, manifest, bundle)
    else:
        outputs = run_validation(runner, manifest, bundle)
        reference = reference_outputs(bundle, manifest)
    run_s = time.perf_counter() - t0
    rows = batch_rows((manifest.get("validation") or {}).get("source"))  # build --batch B: distinct samples
    result = compare_outputs(outputs, reference, manifest["precision"],
                             manifest.get("tolerance_override"), manifest.get("output_kinds"), rows)
    if per_length is not None:
        from . import varlen

        # a second pass over the same samples: every shape seen once already (the first pass also paid each
        # new shape's preparation), the steady-state cost that picks a form
        feeds, _ = varlen.validation(bundle, manifest)
        fitted = [to_artifact(varlen.fit(f, manifest["io"]["inputs"], varlen.form_of(manifest)),
                              manifest["io"]["inputs"]) for f in feeds]
        t0 = time.perf_counter()
        for f in fitted:
            runner.run(f)
        result["warm_validation_s"] = time.perf_counter() - t0
        result["per_length"] = per_length
        result["shape_form"] = (manifest.get("shape_form") or {}).get("form", "static")
    result.update({"load_s": load_s, "validation_s": run_s,
                   "samples": int(sum(rows)) if rows else
                   int(next(iter(outputs.values())).shape[0]) if outputs else 0,
                   "runner": runner.info()})
    runner.close()
    return result
