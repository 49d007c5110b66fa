"""Real variable-length data for the fixture models with a variable axis (issue 42), as the .npz forms
``--calib`` takes: object arrays (one array per sample at its own length).

- ``ocr_rec``: the text-line pieces the PP-OCR detector finds in skimage's page and photos, each at height
  48 and its own width (aspect kept, 32..320: ``tasks.ocr.rec_tensor`` without the right padding), for the
  PP-OCRv4 recogniser (input ``x`` [1, 3, 48, W]).
- ``melspec``: chunks of beckett.wav (real speech) of 0.25-2 s (4000-32000 samples) for openWakeWord's
  melspectrogram (input ``input`` [1, samples]).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np


def ocr_rec(out: Path, limit: int = 40, lo: int = 32, hi: int = 320) -> Path:
    from edgeopt.fixtures import path
    from edgeopt.tasks import ocr

    if out.is_file():
        return out
    det = ocr.onnx_run_fn(path("ocr-det"))
    images = path("images")
    xs: list[np.ndarray] = []
    for img_path in [images / "page.png", *sorted(p for p in images.glob("*.png") if p.name != "page.png")]:
        img = ocr.load_image(img_path)
        for x0, y0, x1, y1 in ocr.detect_lines(det, img):
            for p in ocr.line_pieces(img[y0:y1, x0:x1], (48, hi)):
                rw = min(hi, max(lo, math.ceil(48 * p.shape[1] / p.shape[0])))
                x = (ocr._resize(p, rw, 48).astype(np.float32) / 255 - ocr.REC_MEAN) / ocr.REC_STD
                xs.append(x.transpose(2, 0, 1)[None].astype(np.float32))
        if len(xs) >= limit:
            break
    arr = np.empty(len(xs[:limit]), dtype=object)
    for i, x in enumerate(xs[:limit]):
        arr[i] = x
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, x=arr)
    return out


def melspec(out: Path, count: int = 40, lo: int = 4000, hi: int = 32000, seed: int = 0) -> Path:
    from edgeopt.fixtures import speech

    if out.is_file():
        return out
    audio = speech()
    rng = np.random.default_rng(seed)
    arr = np.empty(count, dtype=object)
    for i in range(count):
        n = int(rng.integers(lo // 400, hi // 400 + 1)) * 400
        start = int(rng.integers(0, len(audio) - n))
        arr[i] = audio[start:start + n][None].astype(np.float32)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, input=arr)
    return out


def lengths(path: Path, name: str, axis: int) -> list[int]:
    with np.load(path, allow_pickle=True) as d:
        return [int(np.shape(a)[axis]) for a in d[name]]
