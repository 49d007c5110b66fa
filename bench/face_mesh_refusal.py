"""Is issue 39's last refusal right?  face-landmark (MediaPipe's face mesh) intel-cpu INT8 was refused at its bound
(1.07% of coordinates > 2 px on the validation faces, 1% allowed).  Here the variant the policy refused is built with
the share relaxed (``int8_tolerance=px_share_max=0.05``), under both splits, and judged at the task level on all 40
crops (calibration ones too), against the FP32 ONNX model: the points' error in pixels on the crops FP32's presence
logit keeps, and the presence decisions.  Needs bench_unseen.py's exported model and data (run it first).

    .venv/bin/python bench/face_mesh_refusal.py
"""
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, machine, stamp, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
W = Path("/tmp/edgeopt-bench-unseen")
model, npz = W / "exported/face_landmark.onnx", W / "face-landmark.npz"
res = {}
for split in ("shuffle", "head-tail"):
    out = W / f"refusal-{split}"
    cmd = [str(ROOT / ".venv/bin/edgeopt"), "build", str(model), "-t", "intel-cpu", "-p", "int8", "--shape",
           "input_1:1x192x192x3", "--calib", str(npz), "--val-count", "20", "--calib-count", "20", "--split", split,
           "--out", str(out), "--json", "-q", "--force", "--option", "int8_tolerance=px_share_max=0.05"]
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    r = json.loads(p.stdout)["results"][0]
    print(split, r["status"], (r.get("check") or {}).get("summary") if isinstance(r.get("check"), dict) else r.get("check"), round(time.time()-t), flush=True)
    res[split] = r.get("bundle")
import onnxruntime as ort  # noqa: E402

x = np.load(npz)["input_1"]
ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
fp = [ref.run(None, {"input_1": xi}) for xi in x]
names = [o.name for o in ref.get_outputs()]
pi, qi = names.index("conv2d_21"), names.index("conv2d_31")
faces = [i for i in range(len(x)) if fp[i][qi].ravel()[0] > 0]
print("FP32 faces:", len(faces), "of", len(x))
import openvino as ov  # noqa: E402

lines = []
for split, b in res.items():
    if not b:
        continue
    man = json.loads((Path(b) / "manifest.json").read_text())
    xml = Path(b) / man["runtime"]["artifact"]
    comp = ov.Core().compile_model(str(xml), "CPU")
    outs = [comp(xi) for xi in x]
    def get(o, name):
        for k, v in o.items():
            if name in k.get_names():
                return v
    err = np.concatenate([np.abs(get(outs[i], "conv2d_21").ravel() - fp[i][pi].ravel()) for i in faces])
    flips = sum((get(outs[i], "conv2d_31").ravel()[0] > 0) != (fp[i][qi].ravel()[0] > 0) for i in range(len(x)))
    lines.append(f"| {split} | {int((err > 2).sum())} of {err.size} ({(err > 2).mean():.2%}) | {err.max():.2f} px | "
                 f"{flips} of {len(x)} |")
    print(lines[-1], flush=True)
write_section("face-mesh-refusal", (
    "### Is the face mesh's intel-cpu INT8 refusal right? (`bench/face_mesh_refusal.py`)\n\n"
    f"{stamp()} on {machine()} ({load()}). The variant refused at 1.07% > 2 px (1% allowed) built with the share "
    "relaxed, judged on all 40 crops against FP32 (points on the 18 crops FP32's presence logit keeps; bounds of "
    "the task: <= 1% of coordinates beyond 2 px, none beyond 8 px):\n\n"
    "| --split | coordinates > 2 px | worst | presence flipped |\n|---|---|---|---|\n" + "\n".join(lines)
    + "\n\nOn all the data the artifact is further off than on its validation half: outside the task's bound "
    "either way, so the refusal is right (a right refusal, not a right-but-refused)."))
