"""The made data fixtures: real inputs a model's own task can judge."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from tests.conftest import fixture


def test_ocr_lines_are_text_pieces_the_classifier_reads_in_both_orientations(tmp_path):
    """ocr-lines (the README's main job calibrates ocr-cls on it): 48x192 pieces, each upright and rotated,
    shuffled; through pm1/bgr the FP32 classifier itself tells most pieces from their rotation (it is not
    sure of every piece: PP-OCR's mobile cls calls ~70% of them right on its own)."""
    import onnxruntime as ort
    from PIL import Image

    from edgeopt.fixtures import ocr_lines

    model = fixture("ocr-cls")
    out = ocr_lines(tmp_path / "lines")
    files = sorted(out.glob("*.png"))
    rotated = [f.name.endswith("-rotated.png") for f in files]
    assert len(files) >= 32 and sum(rotated) * 2 == len(files)
    assert any(rotated[:16]) and not all(rotated[:16])  # shuffled: a head or tail split holds both classes
    pixels = {f: np.asarray(Image.open(f).convert("RGB")) for f in files}
    assert all(a.shape == (48, 192, 3) for a in pixels.values())
    upright = [pixels[f] for f, r in zip(files, rotated) if not r]
    turned = {pixels[f].tobytes() for f, r in zip(files, rotated) if r}
    assert all(np.ascontiguousarray(a[::-1, ::-1]).tobytes() in turned for a in upright)  # the pairs
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])

    def predict(a: np.ndarray) -> int:
        x = ((a[..., ::-1].astype(np.float32) / 255 - 0.5) / 0.5).transpose(2, 0, 1)[None]
        return int(sess.run(None, {"x": np.ascontiguousarray(x)})[0].argmax())

    told_apart = np.mean([predict(a) != predict(np.ascontiguousarray(a[::-1, ::-1])) for a in upright])
    assert told_apart >= 0.7, told_apart
    assert ocr_lines(tmp_path / "lines") == out  # made once
    p = subprocess.run([sys.executable, "-m", "edgeopt.fixtures"], capture_output=True, text=True)
    assert "ocr-lines" in p.stdout and "made on first use" in p.stdout
