"""Read a page with a PP-OCR detector + recogniser pair: the task-level check of OCR bundles.

The pipeline (after rapidocr 1.4.4, written here because rapidocr's own deps are not installed):
image (BGR, as rapidocr loads it) -> det input: resized to fit the det input keeping the aspect
ratio, padded, ``(x/255 - 0.5)/0.5`` (rapidocr's config.yaml Det mean/std; PaddleOCR's own
configs use ImageNet mean/std) -> probability map -> threshold 0.3, 2x2 dilation, connected
components (``scipy.ndimage.label``), mean score >= 0.5, boxes grown by DB's unclip ratio 1.6 ->
line crops -> split at the widest ink gaps into pieces that fit the rec input at height 48 -> rec
input ``(x/255 - 0.5)/0.5``, right-padded with zeros to 320 -> greedy CTC decode with the model's
``character`` metadata (index 0 = blank, then the list, then " ").

The models are called through *run functions* (``NCHW float32 -> first output``), so the same code
reads with the FP32 ONNX models (``read_page_onnx``) and with any pair of built bundles through the
agent's runners (``read_page_with_bundles``): ORT, OpenVINO, TFLite alike.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from edgeopt.errors import ModelError, UsageError

RunFn = Callable[[np.ndarray], np.ndarray]  # NCHW float32 feed -> the model's first output
Box = tuple[int, int, int, int]  # x0, y0, x1, y1 in image pixels

DET_MEAN, DET_STD = 0.5, 0.5  # rapidocr_onnxruntime/config.yaml, Det
REC_MEAN, REC_STD = 0.5, 0.5  # text_recognize.resize_norm_img: (x/255 - 0.5)/0.5
DET_THRESH, BOX_THRESH, UNCLIP_RATIO, MIN_SIZE = 0.3, 0.5, 1.6, 3  # rapidocr's DBPostProcess settings
DET_SHAPE, REC_SHAPE = (640, 640), (48, 320)


# --- images -----------------------------------------------------------------------------------

def load_image(path: str | os.PathLike) -> np.ndarray:
    """An image as H x W x 3 uint8 in BGR order (rapidocr's LoadImage does the same)."""
    from PIL import Image

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"image not found: {p}")
    try:
        with Image.open(p) as im:
            rgb = np.asarray(im.convert("RGB"))
    except Exception as exc:
        raise UsageError(f"cannot read image {p}: {exc}") from None
    return np.ascontiguousarray(rgb[..., ::-1])


def _resize(img: np.ndarray, w: int, h: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(np.ascontiguousarray(img)).resize((w, h), Image.BILINEAR))


def det_tensor(img: np.ndarray, shape: tuple[int, int] = DET_SHAPE) -> tuple[np.ndarray, float]:
    """The det input [1,3,H,W] (image fit into H x W, aspect kept, zero-padded) and the scale used."""
    h, w = shape
    s = min(h / img.shape[0], w / img.shape[1])
    nh, nw = max(1, round(img.shape[0] * s)), max(1, round(img.shape[1] * s))
    x = (_resize(img, nw, nh).astype(np.float32) / 255 - DET_MEAN) / DET_STD
    out = np.zeros((h, w, 3), np.float32)
    out[:nh, :nw] = x
    return out.transpose(2, 0, 1)[None], s


# --- detection post-processing ----------------------------------------------------------------

def text_boxes(prob: np.ndarray, scale: float, image_hw: tuple[int, int]) -> list[Box]:
    """Line boxes from DB's probability map, in image pixels, in reading order."""
    from scipy import ndimage

    p = np.asarray(prob, np.float32).reshape(prob.shape[-2:])
    mask = ndimage.binary_dilation(p > DET_THRESH, structure=np.ones((2, 2), bool))
    labels, n = ndimage.label(mask)
    boxes: list[Box] = []
    for i, sl in enumerate(ndimage.find_objects(labels), start=1):
        if sl is None:
            continue
        bh, bw = sl[0].stop - sl[0].start, sl[1].stop - sl[1].start
        if min(bh, bw) < MIN_SIZE or float(p[sl][labels[sl] == i].mean()) < BOX_THRESH:
            continue
        # DB predicts shrunk text kernels; grow them back by area * ratio / perimeter.
        d = bh * bw * UNCLIP_RATIO / (2 * (bh + bw))
        x0, y0 = (sl[1].start - d) / scale, (sl[0].start - d) / scale
        x1, y1 = (sl[1].stop + d) / scale, (sl[0].stop + d) / scale
        x0, y0 = max(0, int(x0)), max(0, int(y0))
        x1, y1 = min(image_hw[1], math.ceil(x1)), min(image_hw[0], math.ceil(y1))
        if x1 - x0 > MIN_SIZE and y1 - y0 > MIN_SIZE:
            boxes.append((x0, y0, x1, y1))
    return reading_order(boxes)


def reading_order(boxes: list[Box]) -> list[Box]:
    """Top to bottom; boxes on the same line (tops within half a line height) left to right."""
    boxes = sorted(boxes, key=lambda b: (b[1], b[0]))
    if not boxes:
        return boxes
    tol = 0.5 * float(np.median([b[3] - b[1] for b in boxes]))
    lines: list[list[Box]] = []
    for b in boxes:
        if lines and abs(b[1] - lines[-1][0][1]) < tol:
            lines[-1].append(b)
        else:
            lines.append([b])
    return [b for line in lines for b in sorted(line, key=lambda b: b[0])]


# --- recognition ------------------------------------------------------------------------------

def line_pieces(crop: np.ndarray, shape: tuple[int, int] = REC_SHAPE) -> list[np.ndarray]:
    """Cut a line crop at its widest ink gaps into pieces that fit the rec input at its height.

    A fixed-width rec input (48 x 320) holds ~6.7 x its height: longer lines are split between
    words (the widest blank column runs of the text band) rather than squashed.
    """
    if crop.shape[0] >= 1.5 * crop.shape[1]:  # a vertical line: read it rotated, as rapidocr does
        crop = np.ascontiguousarray(np.rot90(crop))
    ch, cw = crop.shape[:2]
    max_w = int(shape[1] * ch / shape[0])
    if cw <= max_w:
        return [crop]
    gray = crop.astype(np.float32).mean(-1)
    band = gray[ch // 4: max(ch // 4 + 1, 3 * ch // 4)]  # the text's own rows; neighbours sit at the edges
    dev = np.abs(band - np.median(band))
    ink = (dev > max(24.0, 0.3 * float(dev.max()))).any(axis=0)
    gaps: list[tuple[int, int]] = []  # (length, centre) of blank column runs
    start = None
    for x, v in enumerate(list(ink) + [True]):
        if not v and start is None:
            start = x
        elif v and start is not None:
            gaps.append((x - start, (start + x) // 2))
            start = None
    pieces, x0 = [], 0
    while cw - x0 > max_w:
        window = [g for g in gaps if x0 + max_w // 2 < g[1] <= x0 + max_w] or \
                 [g for g in gaps if x0 < g[1] <= x0 + max_w]
        cut = max(window)[1] if window else x0 + max_w
        pieces.append(crop[:, x0:cut])
        x0 = cut
    pieces.append(crop[:, x0:])
    return [p for p in pieces if p.shape[1] > 1]


def rec_tensor(piece: np.ndarray, shape: tuple[int, int] = REC_SHAPE) -> np.ndarray:
    """The rec input [1,3,48,W]: height 48, aspect kept (at most W wide), zero-padded on the right."""
    h, w = shape
    rw = min(w, max(1, math.ceil(h * piece.shape[1] / piece.shape[0])))
    x = (_resize(piece, rw, h).astype(np.float32) / 255 - REC_MEAN) / REC_STD
    out = np.zeros((3, h, w), np.float32)
    out[:, :, :rw] = x.transpose(2, 0, 1)
    return out[None]


def ctc_decode(probs: np.ndarray, characters: list[str]) -> str:
    """Greedy CTC: best class per step, repeats merged, blanks (index 0) dropped."""
    idx = np.asarray(probs).reshape(-1, np.asarray(probs).shape[-1]).argmax(-1)
    keep = np.ones(len(idx), bool)
    keep[1:] = idx[1:] != idx[:-1]
    keep &= idx != 0
    return "".join(characters[i] for i in idx[keep] if i < len(characters))


def characters_from_onnx(path: str | os.PathLike) -> list[str]:
    """The CTC alphabet of a PP-OCR rec model: blank, the ``character`` metadata list, space."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelError(f"cannot read {path} as ONNX: {exc}") from None
    meta = {p.key: p.value for p in model.metadata_props}
    if "character" not in meta:
        raise ModelError(f"{path} has no `character` metadata (not a PP-OCR rec model?)",
                         hint="pass characters=characters_from_onnx(<the original rec .onnx>)")
    return ["blank", *meta["character"].splitlines(), " "]


# --- the pipeline -----------------------------------------------------------------------------

def detect_lines(det: RunFn, img: np.ndarray, det_shape: tuple[int, int] = DET_SHAPE) -> list[Box]:
    """Line boxes of an image (BGR uint8) in reading order."""
    x, s = det_tensor(img, det_shape)
    return text_boxes(det(x), s, img.shape[:2])


def read_lines(det: RunFn, rec: RunFn, img: np.ndarray, characters: list[str],
               det_shape: tuple[int, int] = DET_SHAPE, rec_shape: tuple[int, int] = REC_SHAPE) -> list[str]:
    """The text of every detected line (pieces joined with a space), top to bottom."""
    lines = []
    for x0, y0, x1, y1 in detect_lines(det, img, det_shape):
        texts = [ctc_decode(rec(rec_tensor(p, rec_shape))[0], characters).strip()
                 for p in line_pieces(img[y0:y1, x0:x1], rec_shape)]
        text = " ".join(t for t in texts if t)
        if text:
            lines.append(text)
    return lines


def rec_inputs(det: RunFn, images: Iterable[str | os.PathLike], det_shape: tuple[int, int] = DET_SHAPE,
               rec_shape: tuple[int, int] = REC_SHAPE, limit: int | None = None) -> np.ndarray:
    """Real rec inputs [N,1,3,48,W]: the line pieces the detector finds in ``images`` (calibration data)."""
    out: list[np.ndarray] = []
    for path in images:
        img = load_image(path)
        for x0, y0, x1, y1 in detect_lines(det, img, det_shape):
            out.extend(rec_tensor(p, rec_shape) for p in line_pieces(img[y0:y1, x0:x1], rec_shape))
        if limit and len(out) >= limit:
            break
    if not out:
        raise UsageError("the detector found no text line in the given images")
    return np.stack(out[:limit] if limit else out)


def det_inputs(text_images: Iterable[str | os.PathLike], other_images: Iterable[str | os.PathLike] = (),
               det_shape: tuple[int, int] = DET_SHAPE, views: int = 6, seed: int = 0) -> np.ndarray:
    """Text-bearing det inputs [N,1,3,H,W] to calibrate and validate a detector on.

    A detector judged on photos without text is judged on a probability map that is ~0 everywhere:
    its metrics then weigh rounding, not text edges.  So each text image is shown ``views`` times at
    other scales and places than the task's own view (``det_tensor``: fit, top-left): zoomed-in crops
    and shrunken copies placed away from the corner.  Each other image (text-free photos: the map
    must stay empty there) is shown once, fit.  Samples are interleaved so a split into calibration
    and validation sets keeps both kinds on both sides.
    """
    h, w = det_shape
    rng = np.random.default_rng(seed)
    text: list[np.ndarray] = []
    for path in text_images:
        img = load_image(path)
        fit = min(h / img.shape[0], w / img.shape[1])
        for k in range(views):
            # Alternate zoomed crops (1.2-2.5x the fit scale) and shrunken copies (0.35-0.85x).
            s = fit * (rng.uniform(1.2, 2.5) if k % 2 == 0 else rng.uniform(0.35, 0.85))
            nh, nw = max(1, round(img.shape[0] * s)), max(1, round(img.shape[1] * s))
            big = (_resize(img, nw, nh).astype(np.float32) / 255 - DET_MEAN) / DET_STD
            y0, x0 = int(rng.integers(0, max(1, nh - h + 1))), int(rng.integers(0, max(1, nw - w + 1)))
            crop = big[y0:y0 + h, x0:x0 + w]
            out = np.zeros((h, w, 3), np.float32)
            oy = int(rng.integers(0, h - crop.shape[0] + 1))
            ox = int(rng.integers(1 if crop.shape[1] < w else 0, w - crop.shape[1] + 1))  # never the task's view
            out[oy:oy + crop.shape[0], ox:ox + crop.shape[1]] = crop
            text.append(out.transpose(2, 0, 1)[None])
    other = [det_tensor(load_image(p), det_shape)[0] for p in other_images]
    if not text:
        raise UsageError("det_inputs needs at least one image with text")
    mixed: list[np.ndarray] = []
    step = max(1, len(text) // max(1, len(other)))
    while text or other:
        mixed.extend(text[:step])
        del text[:step]
        if other:
            mixed.append(other.pop(0))
    return np.stack(mixed)


# --- run functions ----------------------------------------------------------------------------

def onnx_run_fn(path: str | os.PathLike) -> RunFn:
    """Run an ONNX model with ONNX Runtime (CPU), FP32 reference style."""
    import onnxruntime as ort

    if not Path(path).is_file():
        raise UsageError(f"model not found: {path}")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    name, out = sess.get_inputs()[0].name, sess.get_outputs()[0].name
    return lambda x: sess.run([out], {name: x})[0]


def bundle_run_fn(bundle: str | os.PathLike, options: dict[str, Any] | None = None) -> tuple[RunFn, list[int]]:
    """Run a built bundle through the agent's runner for its runtime; returns (run, input shape)."""
    from edgeopt_agent.bundle import BundleError, from_artifact, load_manifest, to_artifact
    from edgeopt_agent.runners import RunnerUnavailable, open_runner

    try:
        manifest = load_manifest(bundle)
        runner = open_runner(bundle, manifest, options or {})
        runner.load()
    except BundleError as exc:
        raise UsageError(f"not a usable bundle: {exc}", hint="pass a folder made by `edgeopt build`") from None
    except RunnerUnavailable as exc:
        raise UsageError(f"cannot run bundle {bundle}: {exc}") from None
    io = manifest["io"]
    spec, out_name = io["inputs"][0], io["outputs"][0]["name"]
    shape = list(spec["shape"])
    if len(shape) != 4 or shape[1] != 3:
        raise UsageError(f"bundle {bundle} input {spec['name']!r} {shape} is not an NCHW image input")

    def run(x: np.ndarray) -> np.ndarray:
        return from_artifact(runner.run(to_artifact({spec["name"]: x}, io["inputs"])), io["outputs"])[out_name]

    return run, shape


def read_page_onnx(det_path: str | os.PathLike, rec_path: str | os.PathLike, image_path: str | os.PathLike,
                   det_shape: tuple[int, int] = DET_SHAPE) -> list[str]:
    """Lines of text in an image, read with the FP32 ONNX det and rec models."""
    img = load_image(image_path)
    return read_lines(onnx_run_fn(det_path), onnx_run_fn(rec_path), img, characters_from_onnx(rec_path), det_shape)


def read_page_with_bundles(det_bundle_dir: str | os.PathLike, rec_bundle_dir: str | os.PathLike,
                           image_path: str | os.PathLike, characters: list[str] | None = None) -> list[str]:
    """Lines of text in an image, read with a det bundle and a rec bundle (any runtime).

    ``characters`` defaults to the rec bundle's ONNX artifact metadata (kept by the cpu target);
    bundles of other runtimes pass ``characters_from_onnx(<the source rec model>)``.
    """
    img = load_image(image_path)
    det, det_hw = model_run_fn(det_bundle_dir, DET_SHAPE)  # a bundle of any runtime, or an .onnx
    rec, rec_hw = model_run_fn(rec_bundle_dir, REC_SHAPE)
    if characters is None:
        onnx_file = _onnx_of(rec_bundle_dir)
        if onnx_file is None:
            raise UsageError(f"the rec bundle {rec_bundle_dir} carries no character list (its artifact is not .onnx)",
                             hint="pass characters=characters_from_onnx(<the source rec .onnx>)")
        characters = characters_from_onnx(onnx_file)
    return read_lines(det, rec, img, characters, det_hw, rec_hw)


def word_match(expected: str, lines: list[str]) -> tuple[float, str]:
    """Best share of ``expected``'s words found in order in one of ``lines`` (and that line)."""
    want = expected.split()
    best = (0.0, "")
    for line in lines:
        sm = difflib.SequenceMatcher(a=want, b=line.split(), autojunk=False)
        score = sum(m.size for m in sm.get_matching_blocks()) / max(1, len(want))
        if score > best[0]:
            best = (score, line)
    return best


# --- the task gate ------------------------------------------------------------------------------

def model_run_fn(path: str | os.PathLike, default_hw: tuple[int, int]) -> tuple[RunFn, tuple[int, int]]:
    """A bundle folder (any runtime) or an .onnx file -> (run function, its input H x W)."""
    p = Path(path)
    if p.is_dir():
        run, shape = bundle_run_fn(p)
        return run, (shape[2], shape[3])
    if p.suffix.lower() != ".onnx":
        raise UsageError(f"{p}: expected a bundle folder made by `edgeopt build` or an .onnx file")
    run = onnx_run_fn(p)
    import onnx

    dims = onnx.load(str(p), load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    hw = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else dflt
               for d, dflt in zip(list(dims)[2:4], default_hw))
    return run, ((int(hw[0]), int(hw[1])) if len(hw) == 2 else default_hw)


def _onnx_of(model: str | os.PathLike) -> Path | None:
    """The .onnx file behind a rec given as an .onnx path or a bundle folder (None when it has none)."""
    p = Path(model)
    if p.is_dir():
        from edgeopt_agent.bundle import load_manifest

        p = p / load_manifest(p)["runtime"]["artifact"]
    return p if p.suffix == ".onnx" else None


def character_similarity(a: list[str], b: list[str]) -> float:
    """How alike two readings of a page are: each line matched to its closest line of the other
    reading (so two boxes of a similar height read in swapped order cost nothing), character
    similarity weighted by length, both directions averaged (a missing or extra line costs)."""
    def one_way(xs: list[str], ys: list[str]) -> float:
        xs = [x.replace(" ", "") for x in xs if x.strip()]
        ys = [y.replace(" ", "") for y in ys if y.strip()]
        if not xs:
            return 1.0
        if not ys:
            return 0.0
        best = [max(difflib.SequenceMatcher(None, x, y, autojunk=False).ratio() for y in ys) for x in xs]
        return sum(r * len(x) for r, x in zip(best, xs)) / sum(len(x) for x in xs)

    return (one_way(a, b) + one_way(b, a)) / 2


def check_pair(det: str | os.PathLike, rec: str | os.PathLike, image: str | os.PathLike,
               expect: str | None = None, reference: tuple[str, str] | None = None,
               min_words: float = 1.0, min_similarity: float = 0.9) -> dict[str, Any]:
    """Read ``image`` with a det + rec pair and judge it: the expected text found (share of its
    words, in order, in one line >= ``min_words``) and/or the reading of the FP32 ONNX ``reference``
    pair matched (character similarity over the page >= ``min_similarity``)."""
    if expect is None and reference is None:
        raise UsageError("nothing to judge the reading by", hint="give --expect TEXT and/or --reference DET.onnx REC.onnx")
    img = load_image(image)
    det_run, det_hw = model_run_fn(det, DET_SHAPE)
    rec_run, rec_hw = model_run_fn(rec, REC_SHAPE)
    chars_from = _onnx_of(rec) or (_onnx_of(reference[1]) if reference else None)
    if chars_from is None:
        raise UsageError(f"the rec bundle {rec} carries no character list",
                         hint="give --reference DET.onnx REC.onnx (the original models)")
    chars = characters_from_onnx(chars_from)
    lines = read_lines(det_run, rec_run, img, chars, det_hw, rec_hw)
    out: dict[str, Any] = {"image": str(image), "det": str(det), "rec": str(rec), "lines": lines, "passed": True}
    if expect is not None:
        words, line = word_match(expect, lines)
        ok = words >= min_words
        out["expect"] = {"text": expect, "words": round(words, 4), "line": line, "min_words": min_words, "passed": ok}
        out["passed"] &= ok
    if reference is not None:
        ref_det, _ = model_run_fn(reference[0], det_hw)  # read at the pair's own input sizes
        ref_rec, _ = model_run_fn(reference[1], rec_hw)
        ref_lines = read_lines(ref_det, ref_rec, img, chars, det_hw, rec_hw)
        sim = character_similarity(ref_lines, lines)
        ok = sim >= min_similarity
        out["reference"] = {"det": reference[0], "rec": reference[1], "lines": ref_lines,
                            "similarity": round(sim, 4), "min_similarity": min_similarity, "passed": ok}
        out["passed"] &= ok
    return out
