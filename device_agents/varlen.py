"""Variable-length inputs on the device: fit each request to the form the artifact was built in.

Standard library + numpy only.  An input with variable axes carries ``"variable": [{"axis": 3, "range":
[32, 320]}]`` (or ``{"axis": 1, "buckets": [16, 32, 64]}``) in the manifest's IO spec, and the manifest's
``shape_form.form`` says how the artifact takes it:

- ``dynamic``: a range axis runs at the request's own size; a buckets axis is padded up to the smallest
  bucket that holds it (the runtime sees only the declared shapes);
- ``static``: every variable axis is padded to its top (the IO spec's shape).
- ``buckets``: as ``dynamic`` for buckets: padded to the request's bucket, which the ``BucketRunner`` runs in
  that bucket's own static file (``runtime.buckets``).

Padding is zeros appended at the end of the axis (a mask input padded with zeros masks the pads); the
outputs are cropped back to the size the FP32 model gives unpadded (``crop``).  A request outside the built
bounds is ``OutOfBounds``.

The variable-length validation set (``validation.varlen``) holds every sample at its own length and the
FP32 model's outputs on it unpadded: keys ``s<i>.in<j>`` / ``s<i>.out<j>`` in two .npz files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


class OutOfBounds(ValueError):
    """A request's size on a variable axis is outside the bounds the artifact was built for."""


def variable_of(specs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """{input name: its ``variable`` list} of the inputs that have one."""
    return {s["name"]: list(s["variable"]) for s in specs if s.get("variable")}


def form_of(manifest: dict[str, Any]) -> str:
    return str((manifest.get("shape_form") or {}).get("form") or "static")


def bounds_text(v: dict[str, Any]) -> str:
    if "range" in v:
        return f"{v['range'][0]}..{v['range'][1]}"
    return "|".join(str(b) for b in v["buckets"])


def top_of(v: dict[str, Any]) -> int:
    return int(v["range"][1] if "range" in v else max(v["buckets"]))


def run_size(v: dict[str, Any], size: int, form: str) -> int:
    """The size one request of ``size`` runs at on this axis, or OutOfBounds."""
    if "range" in v:
        lo, hi = int(v["range"][0]), int(v["range"][1])
        if not lo <= size <= hi:
            raise OutOfBounds(f"size {size} on axis {v['axis']} is outside the built bounds {lo}..{hi}")
        return hi if form == "static" else size
    sizes = sorted(int(b) for b in v["buckets"])
    fit = next((b for b in sizes if b >= size), None)
    if fit is None:
        raise OutOfBounds(f"size {size} on axis {v['axis']} is past the largest bucket {sizes[-1]} "
                          f"(buckets {bounds_text(v)})")
    return sizes[-1] if form == "static" else fit


def pad(a: np.ndarray, shape: tuple[int, ...] | list[int]) -> np.ndarray:
    """``a`` with zeros appended on every axis that is shorter than ``shape``."""
    a = np.asarray(a)
    widths = [(0, max(0, int(t) - int(s))) for s, t in zip(a.shape, shape)]
    return np.pad(a, widths) if any(w for _, w in widths) else a


def crop(a: np.ndarray, shape: tuple[int, ...] | list[int]) -> np.ndarray:
    """``a`` cut to ``shape`` (leading part of every axis)."""
    a = np.asarray(a)
    if tuple(a.shape) == tuple(shape) or a.ndim != len(shape):
        return a
    return a[tuple(slice(0, int(s)) for s in shape)]


def fit(feed: dict[str, np.ndarray], specs: list[dict[str, Any]], form: str) -> dict[str, np.ndarray]:
    """A feed at its own lengths -> the feed the artifact takes (padded where its form says)."""
    out = dict(feed)
    for s in specs:
        var = s.get("variable")
        if not var or s["name"] not in feed:
            continue
        a = np.asarray(feed[s["name"]])
        shape = list(a.shape)
        for v in var:
            ax = int(v["axis"])
            try:
                shape[ax] = run_size(v, int(a.shape[ax]), form)
            except OutOfBounds as exc:
                raise OutOfBounds(f"input {s['name']!r}: {exc}") from None
        out[s["name"]] = pad(a, shape)
    return out


def length_key(feed: dict[str, np.ndarray], specs: list[dict[str, Any]]) -> str:
    """The sample's own sizes on its variable axes, ``x[3]=96`` (one per axis, ``;``-joined)."""
    parts = [f"{s['name']}[{v['axis']}]={np.shape(feed[s['name']])[int(v['axis'])]}"
             for s in specs if s.get("variable") and s["name"] in feed for v in s["variable"]]
    return ";".join(parts)


def bucket_key(feed: dict[str, np.ndarray], specs: list[dict[str, Any]], form: str) -> str:
    """The bucket a request falls in: the sizes it runs at (``x[3]=128``); for a range on a dynamic form, its
    own size's bucket among the range's quarters (``x[3]<=160``), so a range also reports per-bucket rows."""
    parts = []
    for s in specs:
        for v in s.get("variable") or []:
            size = int(np.shape(feed[s["name"]])[int(v["axis"])])
            if "buckets" in v or form == "static":
                parts.append(f"{s['name']}[{v['axis']}]={run_size(v, size, form)}")
            else:
                lo, hi = int(v["range"][0]), int(v["range"][1])
                edges = sorted({lo + (hi - lo) * k // 4 for k in (1, 2, 3)} | {hi})
                parts.append(f"{s['name']}[{v['axis']}]<={next(e for e in edges if e >= size)}")
    return ";".join(parts)


def _npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def save(path: str | Path, feeds: list[dict[str, np.ndarray]], names: list[str], prefix: str) -> None:
    """Samples of different shapes, one key per sample and tensor (``s<i>.<prefix><j>``)."""
    arrays = {f"s{i}.{prefix}{j}": np.asarray(f[n]) for i, f in enumerate(feeds) for j, n in enumerate(names)}
    np.savez(path, **arrays)


def load(path: str | Path, names: list[str], prefix: str) -> list[dict[str, np.ndarray]]:
    data = _npz(Path(path))
    count = len({k.split(".")[0] for k in data})
    return [{n: data[f"s{i}.{prefix}{j}"] for j, n in enumerate(names)} for i in range(count)]


def validation(bundle: str | Path, manifest: dict[str, Any]) -> tuple[list[dict[str, np.ndarray]],
                                                                     list[dict[str, np.ndarray]]]:
    """(feeds at their own lengths, FP32 outputs unpadded) of a bundle with ``validation.varlen``."""
    from .bundle import listed_path

    v = manifest["validation"]["varlen"]
    ins = listed_path(manifest, v["inputs"], "validation.varlen.inputs")
    refs = listed_path(manifest, v["reference"], "validation.varlen.reference")
    io = manifest["io"]
    return (load(Path(bundle) / ins, [s["name"] for s in io["inputs"]], "in"),
            load(Path(bundle) / refs, [s["name"] for s in io["outputs"]], "out"))


def stack_padded(arrays: list[np.ndarray]) -> np.ndarray:
    """Samples of different shapes stacked on a new axis 0, each zero-padded to the largest: compared in
    pairs padded alike, the pads are equal zeros on both sides (no error, no decision)."""
    if not arrays:
        return np.zeros((0,))
    shape = np.max([np.shape(a) for a in arrays], axis=0)
    return np.stack([pad(a, shape) for a in arrays])
