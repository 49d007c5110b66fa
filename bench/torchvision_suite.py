"""A held-out conformance suite of real architectures: torchvision's models exported to ONNX (issue 41).

Every model is torchvision's own module (``torchvision.models.get_model(name, weights=None)``: the
architecture as published, its weights torchvision's seeded initialisation -- no pretrained file is downloaded),
put in eval mode and exported with ``torch.onnx.export`` at opset 17: weights as initializers, the form real
models have.  Its input is a real photo (skimage's astronaut, chelsea, coffee, rocket; a pan across one for the
video models, two crops of one for optical flow), and **torch's own output is the spec** the artifacts are
compared with: a reference no edgeopt code computed.  Batch-norm statistics are set from the photo (cumulative
averages over it, flipped and shifted, in train mode) before eval: with the initial ones activations vanish or
explode with depth (efficientnet's logits 1e-13, inception's 6e11), which no trained model shows.

The models, fixed before any was built (the rule, not a pick): **the smallest member of every family** of
torchvision's classification, segmentation, video and optical-flow models with at most 32 M parameters.  Left
out by that rule: alexnet, vgg*, vit*, wide_resnet* (every member > 32 M), fcn (35 M), r3d_18 (33 M), mvit
(34 M).  Detection is left out whole: its models call torchvision's compiled NMS, which the CPU torch wheel here
cannot load.

Written as onnx's backend tests are (``<root>/torchvision/<name>/model.onnx`` and
``test_data_set_0/{input,output}_N.pb``), so ``bench_conformance.py --suite torchvision`` runs it as the other
suites.  The export needs torch and torchvision, which edgeopt does not: they go into a throw-away venv under
the work folder (the CPU torch wheel from /opt/wheels, torchvision without its dependencies).

    .venv/bin/python bench/torchvision_suite.py            # writes /tmp/edgeopt-torchvision/suite
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

WORK = Path("/tmp/edgeopt-torchvision")

# name: (kind, input shape). 224x224 images (inception: 299), 8 frames of 112x112 for video (s3d: 16 of 224x224), two 128x128 frames for
# optical flow
MODELS = {
    "convnext_tiny": ("image", (1, 3, 224, 224)),
    "densenet121": ("image", (1, 3, 224, 224)),
    "efficientnet_b0": ("image", (1, 3, 224, 224)),
    "efficientnet_v2_s": ("image", (1, 3, 224, 224)),
    "googlenet": ("image", (1, 3, 224, 224)),
    "inception_v3": ("image", (1, 3, 299, 299)),
    "maxvit_t": ("image", (1, 3, 224, 224)),
    "mnasnet0_5": ("image", (1, 3, 224, 224)),
    "mobilenet_v2": ("image", (1, 3, 224, 224)),
    "mobilenet_v3_small": ("image", (1, 3, 224, 224)),
    "regnet_x_400mf": ("image", (1, 3, 224, 224)),
    "regnet_y_400mf": ("image", (1, 3, 224, 224)),
    "resnet18": ("image", (1, 3, 224, 224)),
    "resnext50_32x4d": ("image", (1, 3, 224, 224)),
    "shufflenet_v2_x0_5": ("image", (1, 3, 224, 224)),
    "squeezenet1_1": ("image", (1, 3, 224, 224)),
    "swin_t": ("image", (1, 3, 224, 224)),
    "swin_v2_t": ("image", (1, 3, 256, 256)),
    "lraspp_mobilenet_v3_large": ("segmentation", (1, 3, 224, 224)),
    "deeplabv3_mobilenet_v3_large": ("segmentation", (1, 3, 224, 224)),
    "mc3_18": ("video", (1, 3, 8, 112, 112)),
    "r2plus1d_18": ("video", (1, 3, 8, 112, 112)),
    "s3d": ("video", (1, 3, 16, 224, 224)),  # its last pooling is 2x7x7
    "swin3d_t": ("video", (1, 3, 8, 112, 112)),
    "raft_small": ("flow", (1, 3, 128, 128)),
}
PHOTOS = ["astronaut", "chelsea", "coffee", "rocket"]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

_EXPORT = r"""
import sys, numpy as np, torch
# torchvision registers fake kernels for its compiled nms/qnms at import; the CPU torch here cannot load its
# compiled ops (built for another torch), so the two schemas are declared first (no model here calls them)
lib = torch.library.Library("torchvision", "DEF")
lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
lib.define("qnms(Tensor qdets, Tensor scores, float iou_threshold) -> Tensor")
import onnx
from onnx import numpy_helper
from pathlib import Path
from torchvision import models

name, kind, inputs, out = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
torch.manual_seed(0)
kw = {"weights": None}
if kind == "segmentation":
    kw["weights_backbone"] = None
if name in ("googlenet", "inception_v3"):
    kw.update(aux_logits=False, init_weights=True)
m = models.get_model(name, **kw)

class Wrap(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m
    def forward(self, *x):
        y = self.m(*x)
        if isinstance(y, dict):
            return y["out"]
        if isinstance(y, (list, tuple)):  # raft: one flow per refinement step; the last is the answer
            return y[-1]
        return y

net = Wrap(m)
z = np.load(inputs)
feeds = [torch.from_numpy(z[k]) for k in sorted(z.files)]
names = [f"input_{i}" for i in range(len(feeds))]
# batch-norm statistics from the data (as a trained network has them): with the initial ones (mean 0, variance 1)
# activations vanish or explode with depth (efficientnet's logits 1e-13, inception's 6e11), which no real model
# shows. Cumulative averages over the photo, flipped and shifted
norms = [b for b in net.modules() if isinstance(b, torch.nn.modules.batchnorm._BatchNorm)]
if norms:
    for b in norms:
        b.reset_running_stats()
        b.momentum = None
    net.train()
    with torch.no_grad():  # one batch of 4 (a batch of 1 has one value per channel where pooled to 1x1)
        net(*[torch.cat([torch.roll(f.flip(-1) if k % 2 else f, shifts=8 * k, dims=-1) for k in range(4)])
              for f in feeds])
net.eval()
with torch.no_grad():
    want = net(*feeds)
out.mkdir(parents=True, exist_ok=True)
torch.onnx.export(net, tuple(feeds), str(out / "model.onnx"), input_names=names, output_names=["output"],
                  opset_version=17, dynamo=False)
data = out / "test_data_set_0"
data.mkdir(exist_ok=True)
for i, f in enumerate(feeds):
    (data / f"input_{i}.pb").write_bytes(numpy_helper.from_array(f.numpy(), names[i]).SerializeToString())
(data / "output_0.pb").write_bytes(numpy_helper.from_array(want.numpy(), "output").SerializeToString())
print(name, list(want.shape), float(want.abs().max()))
"""


def photo_inputs(kind: str, shape: tuple[int, ...], index: int) -> dict[str, object]:
    """The model's inputs from a real photo, normalised as torchvision's weights expect (ImageNet mean/std)."""
    import numpy as np
    import skimage.data
    from skimage.transform import resize

    img = getattr(skimage.data, PHOTOS[index % len(PHOTOS)])()[..., :3].astype(np.float32) / 255.0

    def frame(crop: tuple[int, int, int, int], hw: tuple[int, int]) -> np.ndarray:
        y0, x0, y1, x1 = crop
        x = resize(img[y0:y1, x0:x1], hw, anti_aliasing=True).astype(np.float32)
        return ((x - np.array(MEAN, np.float32)) / np.array(STD, np.float32)).transpose(2, 0, 1)

    h, w = img.shape[:2]
    side = min(h, w)
    if kind in ("image", "segmentation"):
        return {"input_0": frame((0, 0, side, side), shape[2:])[None]}
    if kind == "video":  # a pan across the photo, one step per frame: [1, 3, T, H, W]
        t, step = shape[2], max(1, (w - side * 3 // 4) // shape[2])
        frames = [frame((0, i * step, side * 3 // 4, i * step + side * 3 // 4), shape[3:]) for i in range(t)]
        return {"input_0": np.stack(frames, axis=1)[None]}
    # optical flow: two crops of one photo, the second moved by a few pixels
    a = frame((0, 0, side - 16, side - 16), shape[2:])[None]
    b = frame((6, 10, side - 10, side - 6), shape[2:])[None]
    return {"input_0": a, "input_1": b}


def torch_python(work: Path) -> Path:
    """The throw-away venv's python with torch (CPU) and torchvision (made once)."""
    py = work / "torchenv" / "bin" / "python"
    if py.exists():
        return py
    torch_whl = next(Path("/opt/wheels").glob("torch-*cpu*.whl"), None)
    vision = next(Path("/opt/pypi-more/files").glob("torchvision-0.28.0-*.whl"), None)
    if torch_whl is None:
        raise SystemExit("no CPU torch wheel in /opt/wheels: the suite cannot be exported here")
    subprocess.run([sys.executable, "-m", "venv", str(py.parents[1])], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", str(torch_whl), "numpy", "onnx", "pillow"], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(vision or "torchvision==0.28.0")],
                   check=True)
    return py


def export(work: Path, only: list[str] | None = None) -> Path:
    """Every model of ``MODELS`` (or ``only``) written under ``work``/suite/torchvision; returns ``work``/suite."""
    import numpy as np

    root = work / "suite"
    py = torch_python(work)
    for i, (name, (kind, shape)) in enumerate(MODELS.items()):
        out = root / "torchvision" / name
        if (only and name not in only) or (out / "test_data_set_0" / "output_0.pb").exists():
            continue
        feeds = work / "inputs" / f"{name}.npz"
        feeds.parent.mkdir(parents=True, exist_ok=True)
        np.savez(feeds, **photo_inputs(kind, shape, i))
        p = subprocess.run([str(py), "-c", _EXPORT, name, kind, str(feeds), str(out)], capture_output=True,
                           text=True)
        print(p.stdout.strip() or f"{name}: export failed: {p.stderr.strip().splitlines()[-1:]}", flush=True)
    return root


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(WORK))
    ap.add_argument("--only", default="", help="these models only: A,B")
    a = ap.parse_args()
    print(export(Path(a.work), [n for n in a.only.split(",") if n] or None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
