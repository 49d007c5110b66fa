"""Unseen real models x every target, as a new user would run them: built / refused / crashed.

Models come from PyPI wheels other than the fixtures (install with ``pip install --no-deps``):

- ``ddddocr`` 1.6.1: ``common.onnx``, a captcha/OCR CRNN (Conv + ONNX LSTM, run-time computed
  Reshape shapes, 1-channel input ``[1, 1, 64, W]``, time-major CTC logits ``[T, 1, 8210]``);
  ``common_old.onnx``, an already-quantized recogniser (ConvInteger + DynamicQuantizeLinear).
- ``magika`` 1.0.3: ``standard_v3_3/model.onnx``, a byte-sequence file-type classifier with an
  ``int32`` input ``[N, 2048]`` (token ids 0..256) and 214 classes.
- ``ddddocr`` 1.6.1: ``common_det.onnx``, a YOLOX-style character detector (``[1, 3, 416, 416]`` BGR
  0..255, letterboxed with 114 like ddddocr; output ``[1, 3549, 6]`` boxes/objectness/class).
- ``resemblyzer`` 0.1.4: ``pretrained.pt`` (a 3-layer LSTM speaker encoder, 40 mel bands -> 256-d
  L2-normed embedding).  Exported here to ONNX (opset 17, TorchScript exporter) from its state dict
  with the torch CPU wheel (/opt/wheels) in a throw-away venv under the work dir (not in .venv).
  Input: 160 linear-mel frames (25 ms window, 10 ms hop, resemblyzer's own features) of
  moonshine_onnx's ``beckett.wav`` (real speech), 1.6 s partials every 0.2 s.
- ``attacut`` 1.0.6: ``attacut-c/model.pth`` (Thai word segmenter: character-id Embedding + 3 dilated
  Conv1d + MLP; token-id input ``int64 [1, 128]``), exported the same way, its per-character logit
  put through a Sigmoid (P(word starts here), what attacut thresholds at 0.5).  Input: real Thai
  sentences (the ``th`` gettext catalogues under /usr/share/locale), ids from attacut's
  ``characters.json``.
- ``silero-vad`` 6.2.3: ``silero_vad_16k_sequence.onnx`` (voice activity: Conv front end + ONNX LSTM
  with its state as inputs ``h``/``c`` ``[1, 1, 128]``, 16 windows of 512+64 samples -> 16 speech
  probabilities).  Input: beckett.wav in 16-window chunks, each with the real state the FP32 model
  carried out of the chunk before it.
No GRU model is in the matrix: none of the wheels checked ships GRU weights.

Data is real: horizontal strips of skimage's scanned ``page.png`` (and ``text.png``) for the OCR
models, the first/last 1 KiB of real files from site-packages for magika.  Each (model, target,
precision) is one ``edgeopt build`` run in a child process; the row records the outcome, the
reason of a refusal, whether stderr held a traceback, and the task-level figure of the host check
(CTC decodings equal to FP32's for the recognisers, top-1 for magika).

    .venv/bin/python bench/bench_unseen.py [--models ddddocr,magika] [--targets cpu,...] [--render]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, machine, md_table, stamp, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORK = Path(os.environ.get("EDGEOPT_BENCH_WORK", "/tmp/edgeopt-bench-unseen"))
RESULTS = WORK / "results.json"
TARGETS = ["cpu", "intel-cpu", "mobile", "apple", "jetson-orin", "h100"]
INT8_TOO = {"cpu", "intel-cpu", "mobile"}  # auto is already int8 on none of these but intel-cpu


def _pkg_dir(pkg: str) -> Path | None:
    spec = importlib.util.find_spec(pkg)
    return Path(spec.submodule_search_locations[0]) if spec and spec.submodule_search_locations else None


def ocr_strips(n: int = 40, width: int = 256) -> np.ndarray:
    """[n, 1, 64, width] grayscale strips of real scanned text, scaled like ddddocr ((x/255-0.5)/0.5)."""
    from skimage import data, transform

    pages = [data.page(), data.text()]
    out = []
    for i in range(n):
        img = pages[i % 2].astype(np.float32) / 255.0
        h = 28
        y0 = (i * 9) % max(1, img.shape[0] - h)
        strip = img[y0:y0 + h, :]
        x0 = (i * 17) % max(1, strip.shape[1] - 4 * h)
        strip = strip[:, x0:x0 + 4 * h * 2] if strip.shape[1] > 8 * h else strip
        out.append(transform.resize(strip, (64, width), anti_aliasing=True)[None])
    return ((np.stack(out).astype(np.float32)) - 0.5) / 0.5


def magika_bytes(n: int = 40) -> np.ndarray:
    """[n, 2048] int32: first and last 1 KiB of real files, padded with 256 (magika's own layout)."""
    files = []
    for pkg in ("numpy", "skimage", "onnx", "magika", "json", "email"):
        d = _pkg_dir(pkg)
        if d:
            files += sorted(p for p in d.rglob("*") if p.is_file() and p.stat().st_size > 64)[:40]
    rng = np.random.default_rng(0)
    pick = [files[i] for i in rng.choice(len(files), size=min(n, len(files)), replace=False)]
    rows = []
    for p in pick:
        b = p.read_bytes()
        beg = list(b[:1024].strip() if len(b) > 8 else b) + [256] * 1024
        end = [256] * 1024 + list(b[-1024:].strip())
        rows.append(beg[:1024] + end[-1024:])
    return np.asarray(rows, np.int32)


def det_images(n: int = 40) -> np.ndarray:
    """[n, 3, 416, 416] real photos/scans letterboxed like ddddocr's detector (BGR, 0..255, pad 114)."""
    from skimage import data, transform

    imgs = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket(), data.page(), data.text(),
            data.camera(), data.horse(), data.immunohistochemistry(), data.coins()]
    out = []
    for i in range(n):
        img = imgs[i % len(imgs)]
        img = np.repeat(img[..., None], 3, -1) if img.ndim == 2 else img[..., :3]
        if img.dtype == bool:
            img = img.astype(np.uint8) * 255
        k = i // len(imgs)  # later rounds: crops of the same pictures
        h, w = img.shape[:2]
        img = img[k * h // 10:, k * w // 10:]
        r = min(416 / img.shape[0], 416 / img.shape[1])
        res = transform.resize(img, (int(img.shape[0] * r), int(img.shape[1] * r)), preserve_range=True)
        pad = np.full((416, 416, 3), 114.0, np.float32)
        pad[:res.shape[0], :res.shape[1]] = res[..., ::-1]
        out.append(pad.transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)


def _mel_filters(sr: int, n_fft: int, n_mels: int) -> np.ndarray:
    """librosa's default (Slaney) mel filterbank, in numpy."""
    def hz2mel(f):
        f = np.asarray(f, np.float64)
        return np.where(f >= 1000, 15 + np.log(np.maximum(f, 1e-9) / 1000) / (np.log(6.4) / 27), f * 3 / 200)

    def mel2hz(m):
        return np.where(m >= 15, 1000 * np.exp(np.log(6.4) / 27 * (m - 15)), m * 200 / 3)

    fft_f = np.linspace(0, sr / 2, n_fft // 2 + 1)
    mel_f = mel2hz(np.linspace(hz2mel(0), hz2mel(sr / 2), n_mels + 2))
    fdiff, ramps = np.diff(mel_f), mel_f[:, None] - fft_f[None]
    w = np.maximum(0, np.minimum(-ramps[:-2] / fdiff[:-1, None], ramps[2:] / fdiff[1:, None]))
    return (w * (2.0 / (mel_f[2:n_mels + 2] - mel_f[:n_mels]))[:, None]).astype(np.float32)


def speech_mels(n: int = 40) -> np.ndarray:
    """[n, 160, 40] resemblyzer mel frames of real speech (beckett.wav), 1.6 s partials every 0.2 s."""
    import wave

    with wave.open(str(_pkg_dir("moonshine_onnx") / "assets" / "beckett.wav")) as f:
        wav = np.frombuffer(f.readframes(f.getnframes()), np.int16).astype(np.float32) / 32768
    n_fft, hop = 400, 160
    pad = np.pad(wav, n_fft // 2, mode="reflect")  # librosa's centred STFT
    frames = np.lib.stride_tricks.sliding_window_view(pad, n_fft)[::hop] * np.hanning(n_fft + 1)[:-1]
    mel = (np.abs(np.fft.rfft(frames, axis=-1)) ** 2) @ _mel_filters(16000, n_fft, 40).T
    starts = [min(i * 20, len(mel) - 160) for i in range(n)]
    return np.stack([mel[s:s + 160] for s in starts]).astype(np.float32)


def thai_char_ids(n: int = 40, length: int = 128) -> np.ndarray:
    """[n, 128] int64 attacut character ids of real Thai sentences (the th gettext catalogues)."""
    import gettext

    chars = json.loads((_pkg_dir("attacut") / "artifacts" / "attacut-c" / "characters.json").read_text())
    text = []
    for mo in sorted(Path("/usr/share/locale/th/LC_MESSAGES").glob("*.mo")):
        with mo.open("rb") as f:
            cat = gettext.GNUTranslations(f)._catalog  # noqa: SLF001 - the msgstr texts
        text += [v for v in cat.values() if isinstance(v, str) and sum("\u0e00" <= c <= "\u0e7f" for c in v) > 10]
    text = sorted(set(text))
    rng = np.random.default_rng(0)
    rows = []
    for i in rng.choice(len(text), size=n, replace=len(text) < n):
        s = " ".join(t.replace("\n", " ") for t in text[i:i + 4])[:length]
        ids = [chars.get(c, 1) for c in s] + [0] * length
        rows.append(ids[:length])
    return np.asarray(rows, np.int64)


def vad_chunks(n: int = 40) -> dict[str, np.ndarray]:
    """silero-vad's sequence model fed beckett.wav: [n, 16, 576] windows (64 context + 512 new samples)
    and the LSTM state h/c [n, 1, 1, 128] that FP32 carried out of the chunk before (zeros first)."""
    import wave

    import onnxruntime as ort

    with wave.open(str(_pkg_dir("moonshine_onnx") / "assets" / "beckett.wav")) as f:
        wav = np.frombuffer(f.readframes(f.getnframes()), np.int16).astype(np.float32) / 32768
    wins = np.stack([wav[max(0, i - 64):i + 512] if i >= 64 else np.pad(wav[:i + 512], (64 - i, 0))
                     for i in range(0, len(wav) - 512, 512)])
    sess = ort.InferenceSession(str(_pkg_dir("silero_vad") / "data" / "silero_vad_16k_sequence.onnx"),
                                providers=["CPUExecutionProvider"])
    h = c = np.zeros((1, 1, 128), np.float32)
    xs, hs, cs = [], [], []
    for k in range(min(n, len(wins) // 16)):
        x = wins[k * 16:(k + 1) * 16].astype(np.float32)
        xs.append(x), hs.append(h), cs.append(c)
        _, h, c = sess.run(None, {"input": x, "h": h, "c": c})
    return {"input": np.stack(xs), "h": np.stack(hs), "c": np.stack(cs)}


_EXPORT = r"""
import sys
import torch, torch.nn as nn
which, src, dst = sys.argv[1], sys.argv[2], sys.argv[3]
if which == "resemblyzer":
    class Enc(nn.Module):  # resemblyzer.VoiceEncoder's layers and forward
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(40, 256, 3, batch_first=True)
            self.linear = nn.Linear(256, 256)
        def forward(self, mels):
            _, (h, _) = self.lstm(mels)
            e = torch.relu(self.linear(h[-1]))
            return e / torch.norm(e, dim=1, keepdim=True)
    m = Enc()
    sd = torch.load(src, map_location="cpu")
    sd = sd.get("model_state", sd)
    m.load_state_dict({k: v for k, v in sd.items() if k.split(".")[0] in ("lstm", "linear")})
    args, names, outs = (torch.rand(1, 160, 40),), ["mels"], ["speaker_embedding"]
else:
    class Conv(nn.Module):  # attacut.models.ConvolutionLayer
        def __init__(self, c, f, k, d=1):
            super().__init__()
            p = k // 2
            self.conv = nn.Conv1d(c, f, k, dilation=d, padding=p + p * (d - 1))
        def forward(self, x):
            return self.conv(x)
    class M(nn.Module):  # attacut.models.seq_ch_conv, params emb:48|conv:196|l1:32
        def __init__(self, n):
            super().__init__()
            self.embeddings = nn.Embedding(n, 48, padding_idx=0)
            self.conv1, self.conv2, self.conv3 = Conv(48, 196, 3), Conv(48, 196, 5, 3), Conv(48, 196, 9, 2)
            self.linear1, self.linear2 = nn.Linear(196, 32), nn.Linear(32, 1)
        def forward(self, x):
            e = self.embeddings(x).permute(0, 2, 1)
            out = torch.stack([c(e).permute(0, 2, 1) for c in (self.conv1, self.conv2, self.conv3)], 3)
            out, _ = torch.max(out, 3)
            return torch.sigmoid(self.linear2(torch.relu(self.linear1(out))))
    sd = torch.load(src, map_location="cpu")
    m = M(sd["embeddings.weight"].shape[0])
    m.load_state_dict(sd)
    args, names, outs = (torch.ones(1, 128, dtype=torch.int64),), ["char_ids"], ["boundary"]
m.eval()
torch.onnx.export(m, args, dst, input_names=names, output_names=outs, opset_version=17, dynamo=False)
"""


def _exported(which: str, src: Path) -> Path | None:
    """The model exported to ONNX with torch in a throw-away venv under WORK (made once, cached)."""
    dst = WORK / "exported" / f"{which}.onnx"
    if dst.exists():
        return dst
    py = WORK / "torchenv" / "bin" / "python"
    wheel = next(Path("/opt/wheels").glob("torch-*cpu*.whl"), None)
    if not py.exists():
        if wheel is None:
            return None
        subprocess.run([sys.executable, "-m", "venv", str(py.parents[1])], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", str(wheel), "numpy", "onnx"], check=True)
    dst.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(py), "-c", _EXPORT, which, str(src), str(dst)], check=True, capture_output=True)
    return dst


def models() -> dict[str, dict]:
    dd, mg = _pkg_dir("ddddocr"), _pkg_dir("magika")
    rz, ac = _pkg_dir("resemblyzer"), _pkg_dir("attacut")
    out = {}
    if dd:
        out["ddddocr-lstm"] = {"path": dd / "common.onnx", "shape": "input1:1x1x64x256", "input": "input1",
                               "data": ocr_strips, "task": "CTC text"}
        out["ddddocr-quantized"] = {"path": dd / "common_old.onnx", "shape": "input1:1x1x64x256",
                                    "input": "input1", "data": ocr_strips, "task": "CTC text"}
    if mg:
        out["magika"] = {"path": mg / "models" / "standard_v3_3" / "model.onnx", "shape": "bytes:1x2048",
                         "input": "bytes", "data": magika_bytes, "task": "file type top-1"}
    if dd:
        out["ddddocr-det"] = {"path": dd / "common_det.onnx", "shape": "images:1x3x416x416", "input": "images",
                              "data": det_images, "task": "detections"}
    if rz and (p := _exported("resemblyzer", rz / "pretrained.pt")):
        out["resemblyzer-lstm"] = {"path": p, "shape": "mels:1x160x40", "input": "mels", "data": speech_mels,
                                   "task": "speaker embedding"}
    if (sv := _pkg_dir("silero_vad")) and (sv / "data" / "silero_vad_16k_sequence.onnx").exists():
        out["silero-vad-lstm"] = {"path": sv / "data" / "silero_vad_16k_sequence.onnx",
                                  "shape": "input:16x576,h:1x1x128,c:1x1x128", "input": "input",
                                  "data": vad_chunks, "task": "speech decisions"}
    if ac and (p := _exported("attacut", ac / "artifacts" / "attacut-c" / "model.pth")):
        out["attacut-tokens"] = {"path": p, "shape": "char_ids:1x128", "input": "char_ids",
                                 "data": thai_char_ids, "task": "word boundaries"}
    return out


def _task_figure(manifest: dict | None) -> tuple[str, float | None]:
    if not manifest:
        return "", None
    hc = manifest.get("host_check") or {}
    for o in (hc.get("outputs") or {}).values():
        m = o.get("metrics", {})
        for key, label in (("seq_match", "decodings equal"), ("top1", "top-1 equal"),
                           ("flip_rate", "decisions flipped"), ("vector_cosine_min", "min vector cosine")):
            if key in m:
                return label, float(m[key])
    return "", None


def run_one(name: str, spec: dict, target: str, precision: str, npz: Path, timeout: int) -> dict:
    out_dir = WORK / "out"
    cmd = [str(ROOT / ".venv" / "bin" / "edgeopt"), "build", str(spec["path"]), "-t", target, "-p", precision,
           "--shape", spec["shape"], "--calib", str(npz), "--val-count", "12", "--calib-count", "28",
           "--out", str(out_dir), "--jobs", "1", "--json", "--quiet", "--timeout", str(timeout), "--force"]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 120,
                              env={**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"})
    except subprocess.TimeoutExpired:
        return {"model": name, "target": target, "precision": precision, "outcome": "crashed",
                "reason": f"hung > {timeout + 120}s", "traceback": False}
    row = {"model": name, "target": target, "precision": precision, "rc": proc.returncode,
           "time_s": round(time.perf_counter() - t0, 1), "traceback": "Traceback" in proc.stderr + proc.stdout}
    try:
        rep = json.loads(proc.stdout)
        res = rep["results"][0]
    except (json.JSONDecodeError, KeyError, IndexError):
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        row.update(outcome="refused" if proc.returncode == 2 and not row["traceback"] else "crashed",
                   reason=last[:200])
        return row
    status = res.get("status")
    manifest = None
    if res.get("bundle") and (Path(res["bundle"]) / "manifest.json").exists():
        manifest = json.loads((Path(res["bundle"]) / "manifest.json").read_text())
    chk = res.get("check") or ""
    row["check"] = (chk.get("summary") or "" if isinstance(chk, dict) else chk)[:160]  # --json: the check as data
    label, fig = _task_figure(manifest)
    row["task"] = f"{label} {fig:.0%}" if fig is not None and label != "min vector cosine" else (
        f"{label} {fig:.4f}" if fig is not None else "")
    row["task_value"] = fig
    if status in ("built", "cached", "up-to-date"):
        row["outcome"] = "built"
        if spec.get("task") == "detections" and res.get("bundle"):
            det = detection_task(Path(res["bundle"]))
            row["task"], row["task_value"] = (
                (f"detections equal {det['images_equal']:.0%} (boxes {det['box_match']:.0%})", det["images_equal"])
                if det else ("", None))
        row["kinds"] = ",".join(f"{k}={v['kind']}" for k, v in (manifest or {}).get("output_kinds", {}).items())
    elif status in ("unsupported", "unavailable", "check-failed", "failed"):
        err = (res.get("error") or "").strip()
        first = err.splitlines()[0] if err else status
        # a crash: a traceback, or a raw exception as the message (not a refusal that names one inside)
        crashed = "Traceback" in err or row["traceback"] or bool(re.match(r"^[A-Za-z_.]*(Error|Exception)\b:", first))
        row["outcome"] = "crashed" if crashed else "refused"
        row["reason"] = first[:400]
    else:
        row["outcome"], row["reason"] = "crashed", f"status {status}"
    return row


def detection_task(bundle: Path) -> dict[str, float] | None:
    """The check's own detection figures (``compare.detection_metrics``: ``images_equal``, ``box_match``)
    for the bundle's validation outputs.  The artifact runs in its own runtime where the host has it,
    else (TensorRT, Core ML) its ONNX file in ONNX Runtime; None when neither can run here."""
    from edgeopt_agent.bundle import load_manifest, reference_outputs
    from edgeopt_agent.check import run_validation
    from edgeopt_agent.compare import detection_metrics
    from edgeopt_agent.runners import get_runner

    manifest = load_manifest(bundle)
    try:
        runner = get_runner(manifest["runtime"]["name"])(bundle, manifest, {})
        runner.load()
        outs = run_validation(runner, manifest, bundle)
        runner.close()
    except Exception:  # noqa: BLE001 - a runtime this host lacks: fall back to the ONNX file, if any
        onnx_files = sorted(bundle.glob("*.onnx"))
        if not onnx_files:
            return None
        import onnxruntime as ort

        sess = ort.InferenceSession(str(onnx_files[0]), providers=["CPUExecutionProvider"])
        inp = np.load(bundle / "validation" / "inputs.npz")
        name = sess.get_inputs()[0].name
        x = inp[name] if name in inp.files else inp[inp.files[0]]
        outs = {"output": np.stack([sess.run(None, {name: xi.astype(np.float32)})[0] for xi in x])}
    ref = reference_outputs(bundle, manifest)
    return detection_metrics(np.asarray(outs["output"]), np.asarray(ref["output"]), {"input_hw": [416, 416]})

NOTES = """Reading the table (lead's notes, 2026-11-23; rows come from several runs, each re-run after the change
it tests):
- 7 models, 63 runs: 0 crashed, 0 tracebacks. Every refusal names what missed and what would fix it.
- Output kinds decide the verdict: ddddocr-det is judged as `detection` (YOLOX boxes decoded and matched
  by class at IoU >= 0.5): cpu INT8 / intel-cpu keep 95% of the boxes, mobile INT8 96%, all within the
  INT8 bound of 0.90; per image, 75-83% of the images have exactly the same boxes. silero-vad's
  speech probabilities are per-position decisions: intel-cpu flips 0.52% (1 of 192), within the 1% bound;
  cpu INT8 is refused (rel_l2 0.257 on the probabilities, hn at cos 0.907).
- mobile: onnx2tf raises inside its own code on silero-vad (STFT + LSTM); every alternative switch was
  tried and the refusal says it is a converter bug and which targets build the model. resemblyzer's
  default conversion had an output of another shape ([3, 256] for [1, 256]); fp16 now builds on the
  first alternative that converts and passes (keep_input_shape, vec-cos 1.0000), and int8 searches on
  that same conversion (its float32 file passes) and is refused on the numbers: dynamic-range at
  cos 0.96 / rel_l2 0.28 (full-integer segfaults the TFLite converter: one failed candidate). magika's
  float conversion is wrong with every switch (cos 0.003): auto and int8 say so, not blaming calibration.
- ddddocr-lstm (CRNN, CTC): every INT8 path is refused on its decodings (mobile dynamic-range at cosine
  0.9995 read 83% of the strips like FP32), which cosine alone would have passed.
- intel-cpu `auto` (INT8 first) now falls back when INT8 is refused on accuracy (toolkit/pipeline.py
  `_auto_fallback`): ddddocr-lstm and resemblyzer build fp32 (decodings 100%, vec-cos 1.0000) where the
  earlier run refused both; ddddocr-quantized's fp32 fallback is judged at the INT8 bound its own
  quantization implies and refused there (OpenVINO decodes 10 of 12 strips like ONNX Runtime runs the model).
- The issue's goal was 0 built artifacts whose task result differs from FP32; read strictly it is not
  met: "task differs" counts built artifacts whose task figure is below 100% yet within their precision's bound
  (magika intel-cpu INT8: 11 of 12 file types equal; top-1 is judged on a count, 1 of 12 may differ;
  attacut/silero decisions flipped 0.46-0.65% of positions; ddddocr-det boxes as above)."""


def render(rows: list[dict], header: str) -> str:
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("built", "refused", "crashed")}
    tracebacks = sum(bool(r.get("traceback")) for r in rows)
    task_differs = [r for r in rows if r["outcome"] == "built" and r.get("task_value") is not None
                    and ((r["task"].split()[0] in ("decodings", "top-1", "detections") and r["task_value"] < 1.0)
                         or (r["task"].startswith("decisions flipped") and r["task_value"] > 0))]
    for r in rows:
        r["what"] = r.get("reason") or r.get("check") or ""
        r["what"] = r["what"].replace("|", "/")
    body = [header, "",
            f"**{len(rows)} runs: {counts['built']} built, {counts['refused']} refused, {counts['crashed']} "
            f"crashed; {tracebacks} with a traceback; {len(task_differs)} built whose task result differs "
            "from FP32 on some validation sample (within the bound of their precision, "
            "docs/TOLERANCES.md).**", "",
            md_table(rows, [("model", "model"), ("target", "target"), ("precision", "precision"),
                            ("outcome", "outcome"), ("task", "task vs FP32 (validation)"),
                            ("kinds", "output kinds"), ("what", "check / reason"), ("time_s", "s")])]
    return "\n".join(body + ["", NOTES])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--render", action="store_true", help="only rewrite the section from results.json")
    args = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    rows = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
    when = (f"Measured {stamp()} on {machine()}; {load()} at the start" if not args.render else
            f"Measured until {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(RESULTS.stat().st_mtime))} "
            f"on {machine()}")
    header = (f"{when} (shared machine: other jobs ran). "
              "Rows come from several runs (`--models`/`--targets` re-run only those pairs after a fix). "
              "Script: `bench/bench_unseen.py`. Models from PyPI wheels (ddddocr 1.6.1, magika 1.0.3, resemblyzer "
              "0.1.4, attacut 1.0.6, silero-vad 6.2.3; resemblyzer and attacut exported to ONNX with torch), data "
              "real (skimage page/text strips and photos, real file bytes, beckett.wav speech, Thai gettext "
              "sentences).")
    if not args.render:
        ms = models()
        wanted = [m for m in (args.models.split(",") if args.models else ms) if m in ms]
        # --models/--targets re-run those pairs and keep the other rows
        rows = [r for r in rows if r["model"] not in wanted or r["target"] not in args.targets.split(",")]
        for name in wanted:
            spec = ms[name]
            npz = WORK / f"{name}.npz"
            data = spec["data"]()  # an array of [N, *shape without batch], or {input: [N, *shape]}
            np.savez(npz, **(data if isinstance(data, dict) else {spec["input"]: data[:, None]}))
            for target in args.targets.split(","):
                for prec in ["auto"] + (["int8"] if target in INT8_TOO else []):
                    row = run_one(name, spec, target, prec, npz, args.timeout)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    RESULTS.write_text(json.dumps(rows, indent=1))
    write_section("unseen", render(rows, header))
    print(render(rows, header))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
