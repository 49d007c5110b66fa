"""Calibration and validation data: a folder of images with declared preprocessing, .npy/.npz
files, or (with a loud warning) random data.

The result is two lists of feeds (``{input name: array}``) in the model's ONNX layout: the
calibration set (for INT8) and a held-out validation set (for the host and device checks).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeopt.errors import CalibrationError, UsageError

IMAGE_EXT = {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff", ".ppm"}
PRESETS = {
    "imagenet": {"scale": 1 / 255, "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]},
    "unit": {"scale": 1 / 255, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]},
    "pm1": {"scale": 1 / 255, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
    "raw": {"scale": 1.0, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]},
}
RANDOM_WARNING = ("calibration/validation data is RANDOM: INT8 ranges and accuracy figures are not "
                  "representative of real inputs; pass --calib with real data")


@dataclass(frozen=True)
class Preprocess:
    """How an image becomes a tensor: resize (short side), centre crop, scale, mean/std, order, layout."""

    preset: str = "imagenet"
    resize: int | None = None  # short side; None = resize straight to the input's H x W
    crop: bool = False
    order: str = "rgb"
    layout: str = "nchw"
    scale: float | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    @classmethod
    def parse(cls, text: str | None) -> Preprocess:
        """``"preset=imagenet resize=256 crop=1 order=bgr layout=nchw mean=0.5,0.5,0.5 std=..."``."""
        if not text:
            return cls()
        kw: dict[str, Any] = {}
        for part in text.replace(";", " ").split():
            key, sep, value = part.partition("=")
            if not sep:
                raise UsageError(f"bad --preprocess item {part!r}", hint="use key=value, e.g. preset=imagenet resize=256")
            try:
                if key == "preset":
                    if value not in PRESETS:
                        raise UsageError(f"unknown preprocess preset {value!r}", hint=f"one of {sorted(PRESETS)}")
                    kw["preset"] = value
                elif key == "resize":
                    kw["resize"] = int(value)
                elif key == "crop":
                    kw["crop"] = value.lower() in ("1", "true", "yes", "center")
                elif key in ("order", "layout"):
                    kw[key] = value.lower()
                elif key == "scale":
                    kw["scale"] = float(eval_fraction(value))
                elif key in ("mean", "std"):
                    kw[key] = tuple(float(v) for v in value.split(","))
                else:
                    raise UsageError(f"unknown --preprocess key {key!r}",
                                     hint="keys: preset, resize, crop, order, layout, scale, mean, std")
            except ValueError:
                raise UsageError(f"bad --preprocess value {part!r}") from None
        p = cls(**kw)
        if p.order not in ("rgb", "bgr", "gray") or p.layout not in ("nchw", "nhwc"):
            raise UsageError("--preprocess order must be rgb|bgr|gray and layout nchw|nhwc")
        return p

    def resolved(self, channels: int | None = None) -> dict[str, Any]:
        """The settings in full. ``channels=1`` (a grayscale input): order ``gray`` and one mean/std,
        the average of a preset's three unless given with one value (what is recorded is what is done)."""
        base = PRESETS[self.preset]
        cfg = {"preset": self.preset, "resize": self.resize, "crop": self.crop, "order": self.order,
               "layout": self.layout, "scale": self.scale if self.scale is not None else base["scale"],
               "mean": list(self.mean if self.mean is not None else base["mean"]),
               "std": list(self.std if self.std is not None else base["std"])}
        if channels == 1:
            cfg["order"] = "gray"
            cfg["mean"] = [round(sum(cfg["mean"]) / len(cfg["mean"]), 6)]
            cfg["std"] = [round(sum(cfg["std"]) / len(cfg["std"]), 6)]
        return cfg

    def channels_of(self, inputs: list[dict[str, Any]]) -> int | None:
        """The channel count of the single 4-D image input, in this layout (None when there is none)."""
        imgs = [t for t in inputs if len(t.get("shape") or []) == 4]
        if len(inputs) != 1 or not imgs:
            return None
        shape = imgs[0]["shape"]
        return shape[1] if self.layout == "nchw" else shape[3]


def eval_fraction(v: str) -> float:
    if "/" in v:
        a, b = v.split("/", 1)
        return float(a) / float(b)
    return float(v)


@dataclass
class DataSet:
    calibration: list[dict[str, np.ndarray]]
    validation: list[dict[str, np.ndarray]]
    source: dict[str, Any] = field(default_factory=dict)


def fingerprint(path: str | None, preprocess: Preprocess, shapes: dict[str, list[int]], counts: tuple[int, int],
                seed: int, split: str | None = None) -> str:
    """A cheap identity of the data source (names, sizes, mtimes; no decoding) for the cache key.

    The source is checked here, before any cache lookup: a typo in ``--calib`` (a missing path, an
    empty folder, a file of another kind) is an error, never a silent fall back to random data that
    an earlier build left in the cache."""
    check_source(path, counts)
    h = hashlib.sha256(repr((preprocess.resolved(), sorted(shapes.items()), counts, seed,
                             "random" if not path else "data")).encode())
    if path:
        h.update(repr((parse_split(split, seed), "val>=20")).encode())
    if path:
        p = Path(path)
        files = sorted(p.rglob("*")) if p.is_dir() else [p]
        for f in files:
            if f.is_file():
                st = f.stat()
                h.update(f"{f.relative_to(p) if p.is_dir() else f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


VAL_DEFAULT, VAL_MAX = 8, 32


def check_source(path: str | None, counts: tuple[int, int] = (1, 1)) -> None:
    """Refuse a data source that cannot give samples (CalibrationError, exit 2), without decoding it."""
    n_calib, n_val = counts[0], (VAL_DEFAULT if counts[1] is None else counts[1])
    if n_calib < 1 or n_val < 1:
        raise CalibrationError(f"--calib-count and --val-count must be >= 1 (got {n_calib} and {n_val})")
    if not path:
        return
    p = Path(path)
    if not p.exists():
        raise CalibrationError(f"calibration data not found: {p}")
    if p.is_dir():
        if not any(f.suffix.lower() in IMAGE_EXT | {".npy", ".npz"} for f in p.rglob("*") if f.is_file()):
            raise CalibrationError(f"{p} holds no images ({', '.join(sorted(IMAGE_EXT))}) and no .npy/.npz files")
    elif p.suffix.lower() not in IMAGE_EXT | {".npy", ".npz"}:
        raise CalibrationError(f"{p}: calibration data must be a folder of images, a .npy or a .npz file")


def load_data(path: str | None, inputs: list[dict[str, Any]], preprocess: Preprocess,
              n_calib: int = 32, n_val: int | None = None, seed: int = 0, split: str | None = None) -> DataSet:
    """Calibration + validation feeds from ``path`` (or random data when path is None), split by ``split``
    (``SPLITS``; the seeded ``shuffle`` by default; the indices go into ``source["split"]``, the manifest).

    ``n_val=None``: 8 validation samples, grown up to ``VAL_MAX`` when the data has more samples than
    calibration takes (top-1 agreement on n samples moves in 1/n steps)."""
    auto_val = n_val is None
    n_val = VAL_DEFAULT if n_val is None else n_val
    if path is None:
        rng = np.random.default_rng(seed)
        samples = [_random_feed(inputs, rng) for _ in range(n_calib + n_val)]
        source: dict[str, Any] = {"kind": "random", "seed": seed, "warning": RANDOM_WARNING}
        if any(t.get("variable") for t in inputs):  # variable axes: random lengths within the bounds too
            samples = _padded([_random_lengths(f, inputs, rng) for f in samples], inputs, Path("random data"))
            source["validation_shapes"] = [f.true for f in samples[n_calib:]]
        return DataSet(samples[:n_calib], samples[n_calib:], source)
    p = Path(path)
    if not p.exists():
        raise CalibrationError(f"calibration data not found: {p}")
    if p.is_dir():
        images = sorted(f for f in p.rglob("*") if f.suffix.lower() in IMAGE_EXT)
        arrays = sorted(f for f in p.rglob("*") if f.suffix.lower() in (".npy", ".npz"))
        if images:
            skipped: list[str] = []
            samples = _from_images(images, inputs, preprocess, skipped)
            source = {"kind": "images", "path": str(p), "count": len(samples),
                      "preprocess": preprocess.resolved(preprocess.channels_of(inputs))}
            if skipped:
                source["skipped_unreadable"] = skipped
        elif arrays:
            samples = [s for f in arrays for s in _from_arrays(f, inputs)]
            kinds = {f.suffix.lower()[1:] for f in arrays}
            source = {"kind": kinds.pop() if len(kinds) == 1 else "npy+npz", "path": str(p), "files": len(arrays)}
        else:
            raise CalibrationError(f"{p} holds no images ({', '.join(sorted(IMAGE_EXT))}) and no .npy/.npz files")
    elif p.suffix.lower() in (".npy", ".npz"):
        samples = _from_arrays(p, inputs)
        source = {"kind": p.suffix.lower()[1:], "path": str(p)}  # "npy" or "npz": what was given
    elif p.suffix.lower() in IMAGE_EXT:
        samples = _from_images([p], inputs, preprocess)
        source = {"kind": "images", "path": str(p), "count": 1,
                  "preprocess": preprocess.resolved(preprocess.channels_of(inputs))}
    else:
        raise CalibrationError(f"{p}: calibration data must be a folder of images, a .npy or a .npz file")
    if not samples:
        raise CalibrationError(f"{p}: no samples found")
    if auto_val:
        n_val = max(n_val, min(VAL_MAX, len(samples) - n_calib))
        if n_val < VAL_WARN_BELOW <= len(samples) // 2:
            # room for 20 held out: below 20 the policy (at most 5% differing) refuses on one flip, so
            # calibration (--calib-count is "at most") yields to validation
            n_val = VAL_WARN_BELOW
            n_calib = min(n_calib, len(samples) - n_val)
    how, split_seed = parse_split(split, seed)
    cal_idx, val_idx, overlap = split_indices(len(samples), n_calib, n_val, how, split_seed)
    val, cal = [samples[i] for i in val_idx], [samples[i] for i in cal_idx]
    if overlap:
        source["note"] = "fewer samples than calibration + validation need: the two sets overlap"
    source.update({"calibration_samples": len(cal), "validation_samples": len(val),
                   "split": {"how": how, **({"seed": split_seed} if how == "shuffle" else {}),
                             "of": len(samples), "calibration": cal_idx, "validation": val_idx}})
    if len(val) < VAL_WARN_BELOW:
        source.setdefault("data_warnings", []).append(
            f"only {len(val)} validation samples: one differing decision is {100 / len(val):.0f}% of them, so the "
            f"accuracy policy (at most 5% differing) refuses on a single flip; give --calib more samples "
            f"(or --val-count {VAL_WARN_BELOW}+) for a figure that can tell")
    if any(isinstance(f, VarFeed) for f in val):  # variable lengths: each validation sample's own shapes
        source["validation_shapes"] = [getattr(f, "true", None) or {n: list(np.shape(a)) for n, a in f.items()}
                                       for f in val]
    _check_range(val, inputs, source)
    return DataSet(cal, val, source)


#: How ``--calib`` data is split into calibration and validation (``--split``): ``shuffle`` (the default,
#: seeded: data ordered by class -- all faces, then all non-faces -- calibrates and validates on every
#: class), ``stride`` (evenly spaced over the data, no randomness) or ``head-tail`` (the first N calibrate,
#: the last M validate: what edgeopt did before; only for data already shuffled).
SPLITS = ("shuffle", "stride", "head-tail")
VAL_WARN_BELOW = 20


def parse_split(text: str | None, seed: int = 0) -> tuple[str, int]:
    """``shuffle`` / ``shuffle:7`` / ``stride`` / ``head-tail`` -> (how, seed); one line for anything else."""
    text = (text or "shuffle").strip().lower()
    how, _, s = text.partition(":")
    if how not in SPLITS or (s and how != "shuffle"):
        raise UsageError(f"--split takes {', '.join(SPLITS)} (shuffle:SEED for another seed), got {text!r}")
    try:
        return how, int(s) if s else int(seed or 0)
    except ValueError:
        raise UsageError(f"--split shuffle:SEED takes an integer seed, got {s!r}") from None


def split_indices(n: int, n_calib: int, n_val: int, how: str = "shuffle",
                  seed: int = 0) -> tuple[list[int], list[int], bool]:
    """(calibration indices, validation indices, overlap) of ``n`` samples, each list in the data's order.

    The two sets are disjoint when the data has room (``n >= n_val + 2``); else validation takes the first
    ``n_val`` and calibration the first ``n_calib`` of the order, and ``overlap`` is True.  The same ``n``,
    counts, ``how`` and seed give the same indices on every target and every machine."""
    if how == "shuffle":
        order = [int(i) for i in np.random.default_rng(seed).permutation(n)]
    else:
        order = list(range(n))
    if n < n_val + 2:
        return sorted(order[:n_calib]), sorted(order[:n_val]), True
    if how == "head-tail":
        return order[:n - n_val][:n_calib], order[n - n_val:], False
    if how == "stride":
        val = sorted({min(n - 1, int((i + 0.5) * n / n_val)) for i in range(n_val)})
        rest = [i for i in order if i not in set(val)]
        step = max(1, len(rest) / max(1, n_calib)) if len(rest) > n_calib else 1
        cal = [rest[int(j * step)] for j in range(min(n_calib, len(rest)))]
        return cal, val, False
    return sorted(order[n_val:n_val + n_calib]), sorted(order[:n_val]), False


def describe(source: dict[str, Any]) -> str:
    """The one progress line for the data: what was read, how it was split, what was skipped."""
    kind = source.get("kind")
    if kind == "random":
        return f"data: RANDOM (seed {source.get('seed')}), no --calib given"
    what = (f"{source.get('count')} images" if kind == "images" else f"{kind} arrays") + f" from {source.get('path')}"
    pre = source.get("preprocess") or {}
    line = (f"data: {what}" + (f" (preset={pre.get('preset')})" if pre.get("preset") else "")
            + f" -> {source.get('calibration_samples')} calib + {source.get('validation_samples')} val")
    sp = source.get("split") or {}
    if sp:
        line += f" ({sp['how']}" + (f", seed {sp['seed']}" if "seed" in sp else "") + " split)"
    if source.get("skipped_unreadable"):
        line += f"; skipped {len(source['skipped_unreadable'])} unreadable"
    if source.get("batch"):  # build --batch B: distinct samples, B to a feed
        line += (f"; batch {source['batch']}: {source.get('validation_samples')} distinct val samples in "
                 f"{source.get('validation_batches')} batch(es)"
                 + (f", {source['validation_repeats']} repeat(s) fill the last, counted once"
                    if source.get("validation_repeats") else ""))
    return line


def _check_range(samples: list[dict[str, np.ndarray]], inputs: list[dict[str, Any]], source: dict[str, Any]) -> None:
    """Warn when arrays do not fit the model's inputs (dtype, or a range far from the preprocessing's)."""
    warnings = []
    for t in inputs:
        arrs = [s[t["name"]] for s in samples if t["name"] in s]
        if not arrs:
            continue
        a = np.stack(arrs)
        if a.dtype != np.dtype(t["dtype"]):
            warnings.append(f"input {t['name']!r}: data is {a.dtype}, the model takes {t['dtype']} (cast)")
        shape = t["shape"]
        image = len(shape) == 4 and (shape[1] in (1, 3) or shape[-1] in (1, 3))  # audio features, embeddings: not
        if image and a.dtype.kind == "f" and a.size and source.get("kind") in ("npy", "npz"):
            lo, hi = float(a.min()), float(a.max())
            # raw pixels (0..255, never negative) are the mistake; mean-subtracted (Caffe/VGG: BGR minus the
            # mean, -123..151) is a preprocessing that was applied, and is not warned about
            if hi > 20 and lo >= 0:
                warnings.append(f"input {t['name']!r}: values span {lo:.3g}..{hi:.3g}, like raw pixels; an image "
                                "model usually takes normalised values (was the preprocessing applied?)")
    if warnings:
        source["data_warnings"] = warnings


def _random_feed(inputs: list[dict[str, Any]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    feed = {}
    for t in inputs:
        dt = np.dtype(t["dtype"])
        if dt.kind == "f":
            feed[t["name"]] = rng.standard_normal(t["shape"]).astype(dt)
        elif dt.kind == "b":
            feed[t["name"]] = rng.integers(0, 2, t["shape"]).astype(dt)
        else:  # inside the range the model implies (token ids into a table); build refuses the unknown
            lo, hi = t.get("range") or (0, 4)
            feed[t["name"]] = rng.integers(lo, hi, t["shape"]).astype(dt)
    return feed


class VarFeed(dict):
    """A sample of a variable-length input padded to the static (top) shape; ``true`` holds each input's
    own shape before padding (``--shape`` with a range or buckets: ``edgeopt.shapes``)."""

    true: dict[str, list[int]]


def _varlen_arrays(path: Path, inputs: list[dict[str, Any]]) -> list[dict[str, np.ndarray]] | None:
    """Samples at their own lengths from a .npz for inputs with variable axes (their IO spec's ``variable``):
    object arrays (one array per sample), one sample per file (a folder of .npz), or padded arrays with
    ``lengths`` (an int array [N], or [N, axes]) or a 0/1 mask input (its name holds "mask"; the lengths are
    its sums over the variable axis). None: not such data (read as fixed-shape arrays)."""
    var = {t["name"]: t["variable"] for t in inputs if t.get("variable")}
    if not var or path.suffix.lower() != ".npz":
        return None
    try:
        data = np.load(path, allow_pickle=False)
        files = {k: data[k] for k in data.files}
    except ValueError:  # object arrays: one array per sample of its own length (pickled by numpy)
        data = np.load(path, allow_pickle=True)
        files = {k: data[k] for k in data.files}
    names = [t["name"] for t in inputs]
    missing = [n for n in names if n not in files]
    if missing:
        raise CalibrationError(f"{path} lacks array(s) for input(s) {missing}", hint=f"keys found: {list(files)}")
    by_name = {t["name"]: t for t in inputs}

    def one(n: str, a: np.ndarray) -> np.ndarray:
        a = np.asarray(a)
        rank = len(by_name[n]["shape"])
        if a.ndim == rank - 1 and by_name[n]["shape"][0] == 1:
            a = a[None]
        if a.ndim != rank:
            raise CalibrationError(f"{path}: a sample of input {n!r} has shape {list(a.shape)}, rank {a.ndim}; "
                                   f"the model's input has rank {rank}")
        return a.astype(by_name[n]["dtype"])

    if any(files[n].dtype == object for n in names):
        counts = {len(files[n]) for n in names}
        if len(counts) != 1:
            raise CalibrationError(f"{path}: inputs have different sample counts")
        return [{n: one(n, files[n][i]) for n in names} for i in range(counts.pop())]
    rank_of = {n: len(by_name[n]["shape"]) for n in names}
    if all(files[n].ndim == rank_of[n] for n in names) and any(
            files[n].shape[int(v["axis"])] != int(by_name[n]["shape"][int(v["axis"])]) for n in var for v in var[n]):
        return [{n: one(n, files[n]) for n in names}]  # one sample at its own length (a folder of .npz)
    lengths = files.get("lengths")
    mask = next((n for n in names if "mask" in n.lower()), None)
    if lengths is None and mask is None:
        return None  # padded arrays with no length: fixed-shape data
    samples = []
    stacked = {n: files[n] if files[n].ndim == rank_of[n] + 1 else files[n][:, None] for n in names}
    for i in range(len(stacked[names[0]])):
        feed = {}
        for n in names:
            a = stacked[n][i]
            cut = list(a.shape)
            for k, v in enumerate(var.get(n, [])):
                ax = int(v["axis"])
                if lengths is not None:
                    row = np.atleast_1d(lengths[i])
                    cut[ax] = int(row[min(k, len(row) - 1)])
                else:
                    m = np.asarray(stacked[mask][i])
                    cut[ax] = int(np.max(np.sum(m != 0, axis=min(ax, m.ndim - 1))))
            feed[n] = one(n, a[tuple(slice(0, c) for c in cut)])
        samples.append(feed)
    return samples


def _random_lengths(feed: dict[str, np.ndarray], inputs: list[dict[str, Any]],
                    rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A random sample cut to a random size on each variable axis (a range: lo..hi; buckets: 1..the largest)."""
    out = dict(feed)
    for t in inputs:
        a = feed[t["name"]]
        cut = list(a.shape)
        for v in t.get("variable") or []:
            lo, hi = v["range"] if "range" in v else (1, max(v["buckets"]))
            cut[int(v["axis"])] = int(rng.integers(int(lo), int(hi) + 1))
        out[t["name"]] = a[tuple(slice(0, c) for c in cut)]
    return out


def _padded(samples: list[dict[str, np.ndarray]], inputs: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    """Each sample padded with zeros to the static (top) shape, its own shapes kept in ``VarFeed.true``; a
    sample past the top is refused."""
    out = []
    for i, smp in enumerate(samples):
        feed = VarFeed()
        feed.true = {}
        for t in inputs:
            a = smp[t["name"]]
            top = [int(d) for d in t["shape"]]
            if any(s > d for s, d in zip(a.shape, top)) or a.ndim != len(top):
                raise CalibrationError(f"{path}: sample {i} of input {t['name']!r} has shape {list(a.shape)}, "
                                       f"past the --shape bounds (top {top})",
                                       hint="widen the range/buckets in --shape or drop the longer samples")
            fixed = [ax for ax, (s, d) in enumerate(zip(a.shape, top)) if s != d
                     and ax not in {int(v["axis"]) for v in t.get("variable") or []}]
            if fixed:
                raise CalibrationError(f"{path}: sample {i} of input {t['name']!r} has shape {list(a.shape)}; only "
                                       f"the variable axes may differ from {top}")
            feed.true[t["name"]] = list(a.shape)
            feed[t["name"]] = np.pad(a, [(0, d - s) for s, d in zip(a.shape, top)])
        out.append(feed)
    return out


def _from_arrays(path: Path, inputs: list[dict[str, Any]]) -> list[dict[str, np.ndarray]]:
    """A .npy (single-input models) or .npz keyed by input name; a leading sample axis is optional.

    An input whose shape starts with a batch of 1 (``[1, 224, 224, 3]``) also takes samples stacked
    without that 1 (``[N, 224, 224, 3]``): the sample axis replaces the batch axis.  Inputs with variable
    axes (``--shape x:1x3x48x32..320``) also take samples of their own lengths (``_varlen_arrays``), padded
    to the top shape (``VarFeed``)."""
    varlen = _varlen_arrays(path, inputs)
    if varlen is not None:
        return _padded(varlen, inputs, path)
    try:
        data = np.load(path, allow_pickle=False)
    except Exception as exc:
        raise CalibrationError(f"{path} is not a readable .npy/.npz file ({exc})") from None
    if isinstance(data, np.ndarray):
        if len(inputs) != 1:
            raise CalibrationError(f"{path}: a .npy file only fits a single-input model; this one has "
                                   f"{[t['name'] for t in inputs]}; use a .npz keyed by input name")
        arrays = {inputs[0]["name"]: data}
    else:
        names = [t["name"] for t in inputs]
        missing = [n for n in names if n not in data.files]
        if missing:
            raise CalibrationError(f"{path} lacks array(s) for input(s) {missing}", hint=f"keys found: {data.files}")
        arrays = {n: data[n] for n in names}
    count = None
    for t in inputs:
        a = arrays[t["name"]]
        shape = list(t["shape"])
        if list(a.shape) == shape:
            a = a[None]
        elif list(a.shape[1:]) == shape:
            pass
        elif shape and shape[0] == 1 and a.ndim == len(shape) and list(a.shape[1:]) == shape[1:]:
            a = a[:, None]  # [N, 224, 224, 3] for [1, 224, 224, 3]: one sample per row, each a batch of 1
        else:
            alt = f" or [N, {', '.join(map(str, shape[1:]))}]" if shape and shape[0] == 1 else ""
            raise CalibrationError(f"{path}: array for input {t['name']!r} has shape {list(a.shape)}; "
                                   f"expected {shape} or [N, {', '.join(map(str, shape))}]{alt}")
        arrays[t["name"]] = a.astype(t["dtype"])
        if count is not None and a.shape[0] != count:
            raise CalibrationError(f"{path}: inputs have different sample counts")
        count = a.shape[0]
    return [{n: np.asarray(arrays[n][i]) for n in arrays} for i in range(count or 0)]


def _from_images(files: list[Path], inputs: list[dict[str, Any]], pre: Preprocess,
                 skipped: list[str] | None = None) -> list[dict[str, np.ndarray]]:
    """One feed per readable image; unreadable files go to ``skipped`` (or raise when it is None)."""
    image_inputs = [t for t in inputs if len(t["shape"]) == 4]
    if len(inputs) != 1 or not image_inputs:
        raise CalibrationError("a folder of images fits a model with one 4-D image input; this model's inputs are "
                               f"{[(t['name'], t['shape']) for t in inputs]}; use a .npz keyed by input name")
    import importlib.util

    if importlib.util.find_spec("PIL") is None:
        from edgeopt.errors import MissingDependency

        raise MissingDependency("reading images as calibration data needs Pillow",
                                hint="pip install 'edgeopt[images]', or pass a .npz keyed by input name")
    t = image_inputs[0]
    cfg = pre.resolved(pre.channels_of(inputs))
    n, a, b, c = t["shape"]
    if cfg["layout"] == "nchw":
        ch, h, w = a, b, c
    else:
        h, w, ch = a, b, c
    if ch not in (1, 3):
        raise CalibrationError(f"input {t['name']!r} {t['shape']} does not look like an image in layout "
                               f"{cfg['layout']}", hint="set --preprocess layout=nhwc or nchw")
    samples = []
    for f in files:
        try:
            img = _load_image(f, h, w, cfg, gray=(ch == 1 or cfg["order"] == "gray"))
        except CalibrationError:
            if skipped is None:
                raise
            skipped.append(f.name)
            continue
        if cfg["layout"] == "nchw":
            img = img.transpose(2, 0, 1)
        batch = np.repeat(img[None], n, axis=0).astype(t["dtype"])
        samples.append({t["name"]: batch})
    return samples


def _load_image(path: Path, h: int, w: int, cfg: dict[str, Any], gray: bool) -> np.ndarray:
    try:
        from PIL import Image
    except ImportError:
        raise CalibrationError("reading images needs Pillow", hint="pip install 'edgeopt[images]'") from None
    try:
        im = Image.open(path)
        im = im.convert("L" if gray else "RGB")
    except Exception as exc:
        raise CalibrationError(f"cannot read image {path}: {exc}") from None
    if cfg["resize"]:
        s = cfg["resize"] / min(im.size)
        im = im.resize((max(w, round(im.size[0] * s)), max(h, round(im.size[1] * s))), Image.BILINEAR)
        if cfg["crop"]:
            left, top = (im.size[0] - w) // 2, (im.size[1] - h) // 2
            im = im.crop((left, top, left + w, top + h))
        else:
            im = im.resize((w, h), Image.BILINEAR)
    else:
        im = im.resize((w, h), Image.BILINEAR)
    arr = np.asarray(im, dtype=np.float32)
    if arr.ndim == 2:
        arr = arr[..., None]
    if cfg["order"] == "bgr":
        arr = arr[..., ::-1]
    arr = arr * cfg["scale"]
    mean = np.asarray(cfg["mean"][: arr.shape[-1]], np.float32)
    std = np.asarray(cfg["std"][: arr.shape[-1]], np.float32)
    return (arr - mean) / std


def one_sample_inputs(inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The inputs at batch 1 (``build --batch B`` reads its data as single samples, then ``pack``s them)."""
    return [{**t, "shape": [1, *t["shape"][1:]]} if t.get("shape") else dict(t) for t in inputs]


def split_rows(samples: list[dict[str, np.ndarray]], batch: int) -> list[dict[str, np.ndarray]]:
    """Feeds of ``batch`` rows (arrays given already batched, ``[N, B, ...]``) -> one feed per row."""
    out = []
    for feed in samples:
        lead = {n: a for n, a in feed.items() if a.ndim and a.shape[0] == batch}
        for j in range(batch):
            out.append({n: (lead[n][j:j + 1] if n in lead else a) for n, a in feed.items()})
    return out


def pack(samples: list[dict[str, np.ndarray]], batch: int) -> list[dict[str, np.ndarray]]:
    """Single samples (leading dimension 1) -> feeds of ``batch`` distinct samples each; the last feed is
    filled up with the first samples again (``edgeopt_agent.compare.batch_rows`` says how many rows of each
    feed count, so a repeat is never counted twice).  Inputs without a leading batch of 1 (a scalar) are
    taken from the feed's first sample."""
    if batch <= 1 or not samples:
        return list(samples)
    feeds = []
    for start in range(0, len(samples), batch):
        group = samples[start:start + batch]
        group = group + [samples[i % len(samples)] for i in range(batch - len(group))]
        feeds.append({n: (np.concatenate([g[n] for g in group], axis=0) if a.ndim and a.shape[0] == 1 else a)
                      for n, a in group[0].items()})
    return feeds


def save_stacked(path: str | os.PathLike, feeds: list[dict[str, np.ndarray]], names: list[str], prefix: str) -> None:
    """Write feeds as ``{prefix}{i}`` arrays stacked on a new axis 0 (the bundle's npz format)."""
    np.savez(path, **{f"{prefix}{i}": np.stack([f[n] for f in feeds]) for i, n in enumerate(names)})


def load_stacked(path: str | os.PathLike, names: list[str], prefix: str) -> list[dict[str, np.ndarray]]:
    with np.load(path, allow_pickle=False) as data:
        arrays = [data[f"{prefix}{i}"] for i in range(len(names))]
    count = arrays[0].shape[0] if arrays else 0
    return [{n: np.asarray(a[i]) for n, a in zip(names, arrays)} for i in range(count)]
