"""Are issue 39's last refusals right?  Each INT8 build the accuracy policy refused in ``bench_unseen.py``'s table is
built again keeping the variant it refused (``--allow-mismatch``: the closest one is shipped and marked), and that
artifact is judged at the task level on ALL the model's samples (calibration ones too, not only the validation
part the policy saw), against the FP32 ONNX model in ONNX Runtime, by the task's own bound:

- face-landmark (MediaPipe's face mesh) intel-cpu: points in pixels on the crops FP32's presence logit keeps (<= 1%
  of coordinates beyond 2 px, none beyond 8 px) and the presence decisions;
- ppocr-cls-0.9 (PP-OCR's orientation classifier at rapidocr's own ``cls_thresh``) cpu and intel-cpu: the rotate
  decisions at 0.9 (class 1 with probability > 0.9) against FP32's (<= 1% of samples changed, |dp| <= 0.1).

A refusal is *right* when the refused artifact misses its task bound on all the data.  Needs bench_unseen.py's
exported models and data (run it first).

    .venv/bin/python bench/refusal_truth.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, machine, md_table, stamp, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
W = Path("/tmp/edgeopt-bench-unseen")


def _ppocr_cls() -> Path:
    import importlib.util

    pkg = Path(importlib.util.find_spec("rapidocr_onnxruntime").origin).parent  # not imported: it needs pyclipper
    return pkg / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"


def face_mesh(outs: list[dict], refs: list[dict]) -> tuple[str, bool]:
    faces = [i for i, r in enumerate(refs) if r["conv2d_31"].ravel()[0] > 0]
    err = np.concatenate([np.abs(outs[i]["conv2d_21"].ravel() - refs[i]["conv2d_21"].ravel()) for i in faces])
    flips = sum((o["conv2d_31"].ravel()[0] > 0) != (r["conv2d_31"].ravel()[0] > 0) for o, r in zip(outs, refs))
    share = float((err > 2).mean())
    return (f"{len(faces)} faces: {int((err > 2).sum())} of {err.size} coordinates > 2 px ({share:.2%}), worst "
            f"{err.max():.2f} px; presence flipped {flips} of {len(refs)}", share <= 0.01 and err.max() <= 8 and not flips)


def rotate_at_09(outs: list[dict], refs: list[dict]) -> tuple[str, bool]:
    name = "save_infer_model/scale_0.tmp_1"
    p = np.stack([o[name].reshape(-1) for o in outs])
    q = np.stack([r[name].reshape(-1) for r in refs])
    rot_p, rot_q = (p.argmax(1) == 1) & (p[:, 1] > 0.9), (q.argmax(1) == 1) & (q[:, 1] > 0.9)
    changed, dp = int((rot_p != rot_q).sum()), float(np.abs(p - q).max())
    return (f"{changed} of {len(refs)} rotate decisions changed ({changed / len(refs):.1%}); probabilities moved up to "
            f"{dp:.3f}", changed / len(refs) <= 0.01 and dp <= 0.1)


CASES = [  # (model, target, ONNX path, --shape, data, counts (calib, val), flags, judge)
    ("face-landmark", "intel-cpu", lambda: W / "exported/face_landmark.onnx", "input_1:1x192x192x3",
     W / "face-landmark.npz", (20, 20), [], face_mesh),
    ("ppocr-cls-0.9", "cpu", _ppocr_cls, "x:1x3x48x192", W / "ppocr-cls-0.9.npz", (28, 12),
     ["--decision", "save_infer_model/scale_0.tmp_1=0.9"], rotate_at_09),
    ("ppocr-cls-0.9", "intel-cpu", _ppocr_cls, "x:1x3x48x192", W / "ppocr-cls-0.9.npz", (28, 12),
     ["--decision", "save_infer_model/scale_0.tmp_1=0.9"], rotate_at_09),
]


def artifact_outputs(bundle: Path, feeds: list[dict]) -> list[dict]:
    """The bundle's artifact in its own runtime (the agent's runner) on every feed, outputs in the ONNX layout."""
    from edgeopt_agent.bundle import from_artifact, load_manifest, to_artifact
    from edgeopt_agent.runners import get_runner

    manifest = load_manifest(bundle)
    runner = get_runner(manifest["runtime"]["name"])(bundle, manifest, {})
    runner.load()
    io = manifest["io"]
    try:
        return [from_artifact(runner.run(to_artifact(f, io["inputs"])), io["outputs"]) for f in feeds]
    finally:
        runner.close()


def main() -> int:
    import onnxruntime as ort

    rows = []
    for name, target, model_of, shape, npz, (n_cal, n_val), flags, judge in CASES:
        model = model_of()
        out = W / f"refusal-{name}-{target}"
        cmd = [str(ROOT / ".venv/bin/edgeopt"), "build", str(model), "-t", target, "-p", "int8", "--shape", shape,
               "--calib", str(npz), "--calib-count", str(n_cal), "--val-count", str(n_val), "--out", str(out),
               "--json", "-q", "--force", *flags]
        t0 = time.time()
        first = json.loads(subprocess.run(cmd, capture_output=True, text=True).stdout)["results"][0]
        kept = json.loads(subprocess.run([*cmd, "--allow-mismatch"], capture_output=True, text=True).stdout)["results"][0]
        verdict = "refused" if first["status"] != "built" else "built"
        if not kept.get("bundle"):
            rows.append({"model": name, "target": target, "policy": verdict, "task (all samples)": "no artifact kept: "
                         + str(kept.get("error") or "")[:160], "right?": "-"})
            continue
        data = np.load(npz)
        inp = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        iname = inp.get_inputs()[0].name
        feeds = [{iname: x} for x in data[data.files[0]]]
        names = [o.name for o in inp.get_outputs()]
        refs = [dict(zip(names, inp.run(None, f))) for f in feeds]
        text, ok = judge(artifact_outputs(Path(kept["bundle"]), feeds), refs)
        right = ("yes: a right refusal" if verdict == "refused" and not ok else
                 "NO: right-but-refused" if verdict == "refused" else "built")
        rows.append({"model": name, "target": target, "policy": verdict, "task (all samples)": text, "right?": right,
                     "s": f"{time.time() - t0:.0f}"})
        print(rows[-1], flush=True)
    write_section("refusal-truth", (
        "### Are the unseen models' INT8 refusals right? (`bench/refusal_truth.py`)\n\n"
        f"{stamp()} on {machine()} ({load()}). Each refused INT8 build rebuilt with `--allow-mismatch` (the variant "
        "the policy refused, kept) and judged at the task level on all the model's samples against FP32 (module "
        "docstring: the task bounds).\n\n"
        + md_table(rows, [("model", "model"), ("target", "target"), ("policy", "policy"),
                          ("task (all samples)", "the kept variant on all samples"), ("right?", "refusal right?")])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
