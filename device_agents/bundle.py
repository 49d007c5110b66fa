"""Reading a bundle on the device: manifest, file verification, validation data, IO layouts.

Standard library + numpy only.  Validation inputs and reference outputs are stored in the
*ONNX* layout (``validation/inputs.npz`` keys ``in0, in1, ...`` and ``validation/reference.npz``
keys ``out0, ...``, each stacked on a new leading sample axis).  A runtime whose artifact uses
another layout or dtype (TFLite's NHWC, int8 I/O) says so per tensor in the manifest's IO spec:

``{"name": "x", "shape": [1,3,224,224], "dtype": "float32", "layout": "NCHW",
   "artifact_name": "x", "perm": [0,2,3,1], "artifact_dtype": "int8", "quant": [scale, zero_point]}``

``perm`` maps the ONNX tensor to the artifact's (``np.transpose(t, perm)``); outputs are mapped
back with the inverse permutation before they are compared with the reference.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where arrays are touched: install/has/verify stay fast
    import numpy as np

MANIFEST = "manifest.json"


class BundleError(Exception):
    """The bundle is missing, malformed or fails verification."""


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def safe_relpath(rel: str) -> str:
    """Refuse absolute paths, ``..`` and odd names in a manifest (it may come from elsewhere)."""
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts or rel.startswith(("/", "\\")) or "\x00" in rel or not rel:
        raise BundleError(f"unsafe path in manifest: {rel!r}")
    return rel


def listed_path(manifest: dict[str, Any], rel: Any, what: str) -> str:
    """A path the manifest names for the agent to open (the artifact, validation data): it must be
    safe *and* covered by ``files`` (a listed file, or a folder whose files are listed, e.g. a
    ``.mlpackage``), so that everything the agent opens is something ``verify`` checked."""
    if not isinstance(rel, str):
        raise BundleError(f"{what} in the manifest must be a relative path, got {rel!r}")
    rel = safe_relpath(rel)
    files = manifest.get("files", {})
    norm = rel.rstrip("/")
    if norm not in files and not any(f.startswith(norm + "/") for f in files):
        raise BundleError(f"{what} {rel!r} is not one of the bundle's listed files; the agent opens only "
                          "files the manifest's sha256 list covers")
    return rel


def named_paths(manifest: dict[str, Any]) -> dict[str, str]:
    """Every path the manifest names besides ``files``, by its key."""
    out = {}
    rt = manifest.get("runtime") or {}
    if "artifact" in rt:
        out["runtime.artifact"] = rt["artifact"]
    for key in ("inputs", "reference"):
        if key in (manifest.get("validation") or {}):
            out[f"validation.{key}"] = manifest["validation"][key]
    return out


def load_manifest(bundle: str | os.PathLike) -> dict[str, Any]:
    path = Path(bundle) / MANIFEST
    if not path.is_file():
        raise BundleError(f"no {MANIFEST} in {bundle}")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files", {}), dict):
        raise BundleError(f"{path} is not a bundle manifest (an object with a 'files' table)")
    for rel in manifest.get("files", {}):
        safe_relpath(rel)
    for what, rel in named_paths(manifest).items():
        listed_path(manifest, rel, what)
    return manifest


def verify(bundle: str | os.PathLike, manifest: dict[str, Any] | None = None) -> dict[str, Any]:
    """Check every file against the manifest's sha256 and size; report all problems at once."""
    bundle = Path(bundle)
    manifest = manifest or load_manifest(bundle)
    problems = []
    for rel, meta in manifest.get("files", {}).items():
        path = bundle / safe_relpath(rel)
        if not path.is_file():
            problems.append({"file": rel, "problem": "missing"})
            continue
        if meta.get("size") is not None and path.stat().st_size != meta["size"]:
            problems.append({"file": rel, "problem": f"size {path.stat().st_size} != {meta['size']}"})
            continue
        if sha256_file(path) != meta["sha256"]:
            problems.append({"file": rel, "problem": "sha256 mismatch"})
    return {"ok": not problems, "files": len(manifest.get("files", {})), "problems": problems}


def _stacked(path: Path, prefix: str, count: int) -> list[np.ndarray]:
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        return [data[f"{prefix}{i}"] for i in range(count)]


def validation_inputs(bundle: str | os.PathLike, manifest: dict[str, Any]) -> list[dict[str, np.ndarray]]:
    """The validation samples as a list of feeds {input name: array} in the ONNX layout."""
    import numpy as np

    rel = listed_path(manifest, manifest["validation"]["inputs"], "validation.inputs")
    specs = manifest["io"]["inputs"]
    arrays = _stacked(Path(bundle) / rel, "in", len(specs))
    n = arrays[0].shape[0] if arrays else 0
    return [{s["name"]: np.asarray(a[i]) for s, a in zip(specs, arrays)} for i in range(n)]


def reference_outputs(bundle: str | os.PathLike, manifest: dict[str, Any]) -> dict[str, np.ndarray]:
    """Reference outputs stacked on axis 0, keyed by output name."""
    rel = listed_path(manifest, manifest["validation"]["reference"], "validation.reference")
    specs = manifest["io"]["outputs"]
    arrays = _stacked(Path(bundle) / rel, "out", len(specs))
    return {s["name"]: a for s, a in zip(specs, arrays)}


def to_artifact(feed: dict[str, np.ndarray], specs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Map an ONNX-layout feed to the artifact's names, layouts and dtypes."""
    import numpy as np

    out = {}
    for s in specs:
        a = feed[s["name"]]
        if s.get("perm"):
            a = np.transpose(a, s["perm"])
        dt = s.get("artifact_dtype")
        if dt and dt != s["dtype"]:
            if s.get("quant"):
                scale, zp = s["quant"]
                info = np.iinfo(dt)
                a = np.clip(np.round(a / scale + zp), info.min, info.max)
            a = a.astype(dt)
        # np.require keeps 0-d scalars 0-d (ascontiguousarray would make them shape [1])
        out[s.get("artifact_name") or s["name"]] = np.require(a, requirements="C")
    return out


def from_artifact(outputs: dict[str, np.ndarray], specs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Map an artifact's outputs back to the ONNX names, layout and dtype."""
    import numpy as np

    res = {}
    for s in specs:
        a = np.asarray(outputs[s.get("artifact_name") or s["name"]])
        if s.get("quant") and a.dtype.kind in "iu":
            scale, zp = s["quant"]
            a = (a.astype(np.float32) - zp) * scale
        if s.get("perm"):
            a = np.transpose(a, np.argsort(s["perm"]))
        if a.dtype.name != s["dtype"] and s["dtype"] in ("float32", "float16"):
            a = a.astype(s["dtype"])
        res[s["name"]] = a
    return res
