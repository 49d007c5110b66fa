"""``evaluate``: run installed bundles on an evaluation set the host sent, return each one's decisions.

A rollout with ``--eval DATA`` scores the candidate against labels on the device, beside the bundle it
replaces, on the same inputs: the host uploads ``DATA`` (a ``.npz``: one array per model input, samples
on axis 0, in the ONNX layout) into ``<root>/eval/<sha256>.npz`` and asks for the decisions (the class ids
of a label output, else the argmax of the first output, per sample) of every bundle; it holds the labels and does the scoring, so the device
never sees them. Standard library + numpy only; the runtimes are imported by their runners.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .bundle import load_manifest, sha256_file, to_artifact

MAX_SAMPLES = 100_000


def eval_feeds(path: Path, inputs: list[dict[str, Any]]) -> list[dict[str, np.ndarray]]:
    """The samples of an evaluation ``.npz`` as ONNX-layout feeds (batch axis kept or added)."""
    with np.load(path, allow_pickle=False) as z:
        missing = [s["name"] for s in inputs if s["name"] not in z.files]
        if missing:
            raise ValueError(f"evaluation data has no array for input(s) {', '.join(missing)} "
                             f"(it has {', '.join(z.files)})")
        arrays = {s["name"]: np.asarray(z[s["name"]]) for s in inputs}
    ns = {a.shape[0] for a in arrays.values()}
    if len(ns) != 1 or not 0 < next(iter(ns)) <= MAX_SAMPLES:
        raise ValueError(f"evaluation arrays disagree on the sample count or are empty: {sorted(ns)}")
    n = ns.pop()
    feeds = []
    for i in range(n):
        feed = {}
        for s in inputs:
            a = arrays[s["name"]]
            rank = len(s.get("shape") or a.shape[1:])
            feed[s["name"]] = a[i] if a.ndim == rank + 1 else a[i:i + 1]
        feeds.append(feed)
    return feeds


def evaluate(bundles: list[Path], data: Path, threads: Any = None) -> dict[str, Any]:
    """Each bundle's decisions on every sample of ``data``: the class ids of a declared ``label`` or
    ``classification`` output (``paired.decision_kind``), else the argmax of the first output."""
    from .paired import _decisions, decision_kind
    from .runners import open_runner

    arms = []
    for bundle in bundles:
        manifest = load_manifest(bundle)
        io = manifest["io"]
        feeds = [to_artifact(f, io["inputs"]) for f in eval_feeds(data, io["inputs"])]
        runner = open_runner(bundle, manifest, {"threads": threads} if threads else {})
        try:
            runner.load()
            kind = decision_kind(manifest)
            if kind is not None and kind.get("kind") not in ("label", "classification"):
                kind = None  # the labels the host scores against are class ids
            decisions = _decisions({"manifest": manifest, "runner": runner}, feeds, kind)
        finally:
            runner.close()
        arms.append({"bundle_id": sha256_file(bundle / "manifest.json"), "decisions": decisions})
    return {"n": len(arms[0]["decisions"]) if arms else 0, "data_sha256": sha256_file(data), "arms": arms}
