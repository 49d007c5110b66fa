"""Precision-aware comparison of a runtime's outputs with the FP32 reference.

Shared by the host check (edgeopt build) and the agent's bench, so that a bundle is judged by
the same rule on the host and on the device.  Standard library + numpy only.

A flat ``allclose(atol=1e-5)`` is wrong for reduced precision: FP16 keeps ~3 decimal digits, INT8
quantisation noise is a few percent of a tensor's range.  So each precision has bounds on
*scale-free* metrics (see docs/TOLERANCES.md):

- ``rel_l2``  = ||y - r|| / ||r||        (relative error of the whole tensor)
- ``cosine``  = <y, r> / (||y|| ||r||)   (direction kept)
- ``max_abs_norm`` = max|y - r| / max|r| (worst element, normalised by the tensor's range)

and each output has a *kind* (``OUTPUT_KINDS``) that adds what the task sees:

- ``classification`` (over an axis): top-1 / top-5 agreement along that axis -- inferred only for a
  distribution over classes (a Softmax, rows summing to 1, or ``[1, C]`` logits with no sign of a regression)
- ``probability`` (``@threshold``): class probabilities an application thresholds: top-1 plus the samples
  whose decision at the threshold flips (``flip_rate``)
- ``per_position``: ``[1, T, K]`` tags / emissions, a time-major ``[T, 1, K]`` per-frame classifier: the argmax
  of every position is a decision (``flip_rate``)
- ``ctc_time_major`` / ``ctc_batch_major``: greedy CTC decoding agreement per sequence (``seq_match``)
- ``sequence``: a greedy decoder's steps ``[.., T, C]`` (argmax per step, no CTC merging): the share of
  samples whose whole sequence equals the reference's (``seq_match``) -- a word with one phoneme changed
  is a wrong word, though 11 of its 12 steps agree
- ``decision``: per-position thresholded decisions (sigmoid > 0.5 / logit > 0), ``flip_rate``
- ``embedding``: per-vector cosine (``vector_cosine_min``), no top-1
- ``detection`` (a known detector head: YOLOX's ``[anchors, 4 + 1 + classes]`` table over stride-8/16/32
  grids; YOLOv5/v8/v11's ``[4 + classes, anchors]`` / ``[anchors, 4 (+1) + classes]``; YOLOv10's end-to-end
  ``[1, 300, 6]`` rows ``x1, y1, x2, y2, score, class`` sorted by score, NMS-free): boxes decoded (and NMS'd)
  as the head's own post-processing does; the share of boxes matched by one of the same class at
  IoU >= 0.5 (``box_match``, the lower of recall and precision)
- ``label`` (an integer class id per sample or position: scikit-learn's ``output_label``, an ArgMax output):
  exact agreement of the labels, counted k of n as top-1 agreement is (``top1``, ``top1_n``)
- ``dense`` (a map: detection, segmentation) and ``regression`` (boxes, landmarks, offsets): the tensor
  metrics alone, against the output's own scale

Whatever the kind, every float output is also judged per slice (``slice_metrics``): each index along its
channel-like axis (``channel_axis``: a head's channels, a table's columns, a vector's components) against
its own scale, so a sub-range of a concatenated output (class scores collapsed to 0 beside pixel
coordinates) fails although the whole tensor's cosine is 0.999.

The host infers the kinds from the graph (``edgeopt.targets.base.output_kinds``), a user may set
them (``--option output_kind=name:ctc_time_major``), and the manifest records them
(``output_kinds``), so the device judges by the same rule.  Without kinds, ``infer_kind`` guesses
from the reference data alone.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

PROBABILITY_FLOOR = 1e-3  # decision outputs in [0, 1]: rel_l2's denominator is at least this RMS value

OUTPUT_KINDS = ("classification", "probability", "ctc_time_major", "ctc_batch_major", "sequence", "per_position",
                "decision", "embedding", "detection", "label", "dense", "regression")
DETECTION_FORMATS = ("yolox", "yolov8", "yolov5", "yolov10", "anchors")  # yolov10: end-to-end rows, no NMS;
# anchors: an anchor head's scores decoded with its regressors output (detection@anchors:boxes=...)
# Kinds whose outputs carry per-sample decisions (the gate compares them between two bundles): the others
# (dense maps, regression, embeddings) are judged on their tensors alone and have none.
DECISION_KINDS = ("classification", "probability", "ctc_time_major", "ctc_batch_major", "sequence", "per_position",
                  "decision", "detection", "label")
LABEL_MAX = 4096  # an integer output of at most this many values per sample is labels (class ids)

# Bounds per precision. A metric passes when rel_l2 <= rel_l2_max and cosine >= cosine_min and
# max_abs_norm <= max_abs_norm_max, plus the bound of the output's kind: top1_min (classification),
# seq_match_min (CTC), flip_rate_max (decision), vector_cosine_min (embedding), box_match_min (detection).
# None: not judged.
TOLERANCES: dict[str, dict[str, float | None]] = {
    # CTC decodings are judged from INT8 down: at FP32/FP16 the cosine bound already holds the scores,
    # and a decoding that differs there comes from a near-tie (seen: PP-OCR rec on photos, fp16 at
    # cosine 1.0000, one of 8 noise "lines" decoded differently); the figure is still reported.
    "fp32": {"rel_l2_max": 1e-3, "cosine_min": 0.99999, "max_abs_norm_max": 1e-2, "top1_min": 0.99,
             "seq_match_min": None, "flip_rate_max": 1e-3, "vector_cosine_min": 0.9999, "box_match_min": 0.99,
             "slice_rel_l2_max": 5e-2, "slice_cosine_min": 0.999, "prob_delta_max": 1e-3,
             "px_max": 0.1, "px_share_max": 0.0},
    # Reduced precisions: no worst-element bound. On a saturating map (a detector's sigmoid) one pixel that
    # crosses the knee moves by ~the whole range while the map as a whole is kept; rel_l2, cosine
    # and top-1 judge the tensor, and task-level checks (OCR) judge what the user sees. Seen with FP16
    # too: PP-OCR det and openwakeword's log-mel at cosine 0.9999 failed a 0.1 worst-element bound.
    "fp16": {"rel_l2_max": 2e-2, "cosine_min": 0.9995, "max_abs_norm_max": None, "top1_min": 0.95,
             "seq_match_min": None, "flip_rate_max": 5e-3, "vector_cosine_min": 0.999, "box_match_min": 0.95,
             "slice_rel_l2_max": 0.1, "slice_cosine_min": 0.995, "prob_delta_max": 1e-2,
             "px_max": 0.5, "px_share_max": 1e-3},
    "int8": {"rel_l2_max": 0.25, "cosine_min": 0.97, "max_abs_norm_max": None, "top1_min": 0.90,
             "seq_match_min": 0.9, "flip_rate_max": 1e-2, "vector_cosine_min": 0.95, "box_match_min": 0.90,
             "slice_rel_l2_max": 0.5, "slice_cosine_min": 0.9, "prob_delta_max": 0.1,
             "px_max": 2.0, "px_share_max": 1e-2},
    "fp8": {"rel_l2_max": 0.25, "cosine_min": 0.97, "max_abs_norm_max": None, "top1_min": 0.90,
            "seq_match_min": 0.9, "flip_rate_max": 1e-2, "vector_cosine_min": 0.95, "box_match_min": 0.90,
            "slice_rel_l2_max": 0.5, "slice_cosine_min": 0.9, "prob_delta_max": 0.1,
            "px_max": 2.0, "px_share_max": 1e-2},
}
# prob_delta_max: the most a probability the application reads (an output of kind ``probability``) may move
# from FP32's, whatever its thresholds: a safety score that moves by 0.10 is a different score.
# px_max / px_share_max: coordinates judged in their own units (``regression`` in an image input's pixels, a
# ``regression:px=N`` the user bounded, an anchor head's box regressors): an element off by more than px_max
# (the kind's ``px`` where given) is an outlier; at most px_share_max of the elements may be, and none by more
# than PX_WORST x the bound (a landmark 12 px off is visible whatever the other 51 000 do).
PX_WORST = 4.0

# The per-slice check (``slice_metrics``): every index along the channel-like per-sample axis
# (``channel_axis``, 2..SLICE_AXIS_MAX entries) is a slice (a channel, a column of a table, a component of a
# vector), judged against its own scale, so that a sub-range of a concatenated output (class scores beside
# pixel coordinates) cannot hide under the rest.  A slice smaller than SLICE_FLOOR x its natural scale (1 for
# a slice of values in [0, 1], else the output's RMS) is negligible -- a class nobody saw (probabilities
# ~1e-4): only noise -- and is judged against the typical slice of its group (values in [0, 1] or not) along
# that axis, not on its cosine; so a slice that is 0 in the reference is judged against the output's scale.
# The per-slice bounds catch a sub-range that is lost, not noise spread unevenly: at FP32 too they are loose
# (a GPU's TF32 convolutions leave ~1e-4 of the output's scale, which a slice 100x smaller than the rest
# sees as 1%), while a collapsed slice reads rel_l2 ~1.
SLICE_AXIS_MAX = 256
SLICE_FLOOR = {"fp32": 1e-2, "fp16": 2e-2, "int8": 2e-2, "fp8": 2e-2}
_SLICE_OF = {"slice_rel_l2_max": "rel_l2_max", "slice_cosine_min": "cosine_min"}


def tolerance_for(precision: str, override: dict[str, float] | None = None) -> dict[str, float | None]:
    """The bounds for a precision, with any user override applied."""
    base = TOLERANCES.get(precision, TOLERANCES["int8"])
    tol = dict(base)
    if override:
        tol.update({k: (None if v is None else float(v)) for k, v in override.items() if k in tol})
        for sk, wk in _SLICE_OF.items():
            # a whole-tensor bound the user moved moves its per-slice bound alike, unless that is given too
            if sk in override or wk not in override:
                continue
            if tol[wk] is None or base[wk] is None or base[sk] is None:
                tol[sk] = None
            elif sk == "slice_rel_l2_max":
                tol[sk] = max(base[sk], tol[wk] * base[sk] / base[wk])
            else:
                tol[sk] = min(base[sk], 1.0 - (1.0 - tol[wk]) * (1.0 - base[sk]) / max(1.0 - base[wk], 1e-12))
    return tol


def bound_text(precision: str, override: dict[str, float] | None = None) -> str:
    """A precision's bound in one line, as refusals quote it (``rel_l2_max 0.25, cosine_min 0.97, ...``):
    the judged bounds only (a bound of None is not judged); the kind bounds apply to outputs of that kind."""
    return ", ".join(f"{k} {v:g}" for k, v in tolerance_for(precision, override).items() if v is not None)


# --- output kinds ---------------------------------------------------------------------------------

def parse_kind(spec: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """``"classification"``, ``"classification@1"`` (axis), ``"decision@0.5"`` (threshold),
    ``"probability@0.2"`` (class probabilities the application thresholds at 0.2), ``"detection@416x416"``
    (a YOLOX head on that input size), ``"detection@anchors:boxes=NAME:anchors=8x2+16x6"`` (an anchor head's
    scores, decoded with the output NAME's box regressors: ``ANCHOR_OPTIONS``), ``"detection@yolov8"`` / ``"detection@yolov5"`` (a YOLOv5/v8/v11 head:
    ``[4 + classes, anchors]`` or ``[anchors, 4 (+1) + classes]``), ``"detection@yolov10"`` (``@end2end``: a
    YOLOv10 / YOLO26 end-to-end output ``[1, 300, 6]``), ``"label"`` (integer class ids), ``"dense@probability"`` (a map of probabilities in [0, 1]: a
    text detector's), ``"regression@48"`` (errors also reported
    in the unit of that scale, e.g. pixels of a 48-px crop for normalised landmarks), ``"regression:px=2"``
    (coordinates judged in their own units: no element off by more than 4 x 2, at most ``px_share_max`` of
    them by more than 2) or a dict ``{"kind": ...,
    "axis"|"threshold"|"input_hw"|"format"|"scale": ...}`` -> the dict form; ValueError for an unknown kind."""
    if spec is None:
        return None
    if isinstance(spec, dict):
        spec = dict(spec)
        if spec.get("kind") not in OUTPUT_KINDS:
            raise ValueError(f"unknown output kind {spec.get('kind')!r} (kinds: {', '.join(OUTPUT_KINDS)})")
        if spec["kind"] == "detection" and (spec.get("format", "yolox") not in DETECTION_FORMATS or (
                spec.get("format", "yolox") == "yolox" and not spec.get("input_hw"))):
            raise ValueError(f"output kind detection: unknown format or no input size in {spec!r} "
                             f"(formats: {', '.join(DETECTION_FORMATS)}; yolox needs input_hw)")
        if spec["kind"] == "detection" and spec.get("format") == "anchors":
            _check_anchor_kind(spec)
        return spec
    head, _, opts = str(spec).strip().partition(":")
    if opts:  # kind[@param]:key=value[:key=value]: regression:px=2, detection@anchors:boxes=regressors:...
        return parse_kind({**parse_kind(head), **_kind_options(head.partition("@")[0], opts)})
    kind, _, param = head.partition("@")
    if kind not in OUTPUT_KINDS:
        raise ValueError(f"unknown output kind {kind!r} (kinds: {', '.join(OUTPUT_KINDS)})")
    out: dict[str, Any] = {"kind": kind}
    if kind == "detection" and param.lower() in ("anchors", "anchor", "ssd", "blazeface"):
        return {"kind": "detection", "format": "anchors"}  # checked once its options are in (boxes=...)
    if kind == "detection" and param.lower() in ("yolov10", "end2end", "e2e", "yolo26"):
        return {"kind": "detection", "format": "yolov10"}
    if kind == "detection" and param.lower() in ("yolo", "yolov8", "yolov11", "yolov5"):
        return {"kind": "detection", "format": "yolov5" if param.lower() == "yolov5" else "yolov8"}
    if kind == "detection":
        try:
            hw = [int(v) for v in param.lower().split("x")]
        except ValueError:
            hw = []
        if len(hw) != 2 or min(hw) < 32:
            raise ValueError("output kind detection needs the input's size for a YOLOX head (detection@416x416), "
                             "or a YOLO head's format (detection@yolov8, detection@yolov5, detection@yolov10), "
                             f"not {spec!r}")
        return {"kind": "detection", "format": "yolox", "input_hw": hw}
    if kind == "dense" and param:  # dense@probability: a map of probabilities (judged with [0, 1]'s floor)
        if param.lower() not in ("probability", "prob"):
            raise ValueError(f"output kind dense takes @probability (a map of probabilities), not {spec!r}")
        return {"kind": "dense", "range": "probability"}
    if param and kind == "probability":  # one threshold, or the application's bands: probability@0.2/0.8
        try:
            ts = sorted(float(t) for t in param.replace("|", "/").split("/"))
        except ValueError:
            raise ValueError(f"bad parameter {param!r} for output kind {kind!r}") from None
        if not ts or not all(0 < t < 1 for t in ts):
            raise ValueError("output kind probability takes a threshold in (0, 1), e.g. probability@0.2, or the "
                             f"bands' thresholds, probability@0.2/0.8, not {spec!r}")
        out["threshold"] = ts[0]
        if len(ts) > 1:
            out["thresholds"] = ts
    elif param:
        key = {"classification": "axis", "regression": "scale"}.get(kind, "threshold")
        try:
            out[key] = int(param) if key == "axis" else float(param)
        except ValueError:
            raise ValueError(f"bad parameter {param!r} for output kind {kind!r}") from None
    elif kind == "probability":
        out["threshold"] = 0.5
    return out


# How a check judges each kind, in a few words (``inspect``; docs/TOLERANCES.md has the bounds).
KIND_MEANING = {
    "classification": "top-1 class against FP32", "probability": "class probabilities: |dp| and threshold crossings",
    "ctc_time_major": "CTC decodings (time-major)", "ctc_batch_major": "CTC decodings",
    "sequence": "decoded sequences", "per_position": "the class at every position",
    "decision": "a decision at its threshold: flips", "embedding": "vector cosine per sample",
    "detection": "boxes after decoding and NMS, matched to FP32's", "label": "integer labels equal",
    "dense": "the whole map (cosine, rel_l2)", "regression": "values in their own units",
}


def kind_text(kind: dict[str, Any] | None) -> str:
    """A kind dict as ``--output-kind`` spells it (``regression:px=2``, ``decision@0``,
    ``detection@anchors:boxes=regressors:anchors=8x2+16x6``): ``parse_kind``'s inverse."""
    if not kind or not kind.get("kind"):
        return "?"
    k = kind["kind"]
    head, opts = k, []
    if k == "detection":
        fmt = kind.get("format", "yolox")
        head += "@" + ("x".join(str(v) for v in kind.get("input_hw") or []) if fmt == "yolox" else fmt)
        if fmt == "anchors":
            opts += [f"boxes={kind['boxes']}"] if kind.get("boxes") else []
            opts += ["anchors=" + "+".join(f"{a}x{b}" for a, b in kind["anchors"])] if kind.get("anchors") else []
    elif k == "classification" and kind.get("axis") is not None:
        head += f"@{kind['axis']}"
    elif k in ("decision", "probability") and kind.get("threshold") is not None:
        head += "@" + "/".join(f"{t:g}" for t in kind.get("thresholds") or [kind["threshold"]])
    elif k == "regression" and kind.get("scale"):
        head += f"@{kind['scale']:g}"
    elif k == "dense" and kind.get("range") == "probability":
        head += "@probability"
    if kind.get("px"):
        opts.append(f"px={kind['px']:g}")
    if kind.get("when"):
        opts.append(f"when={kind['when']}")
    return ":".join([head, *opts])


def kind_meaning(kind: dict[str, Any] | None) -> str:
    """What a check judges on an output of this kind, in a few words (``KIND_MEANING``)."""
    kind = kind or {}
    if kind.get("anchors_of"):
        return f"the box regressors of {kind['anchors_of']}'s detections"
    what = KIND_MEANING.get(kind.get("kind"), "")
    return what + (f", where {kind['when']} is positive" if kind.get("when") else "")


# ``detection@anchors``: an anchor head's two outputs -- scores ``[1, A, C]`` (C >= 1: logits or probabilities)
# and box regressors ``[1, A, 4 + K]`` -- decoded as the head's post-processing does (score threshold, box
# decoding against the anchors, NMS) and judged on the detections, not on every anchor (most are background).
ANCHOR_OPTIONS = {
    "boxes": "the output holding the box regressors [1, A, 4 + K] (required)",
    "anchors": "the anchor grid, STRIDExPER_CELL joined by + (BlazeFace 128 px: 8x2+16x6), for encoding=offset",
    "input": "the input's size HxW the anchors are laid over (128x128) [the image input's]",
    "encoding": "offset (BlazeFace/MediaPipe: centre = anchor centre + dx, dy; w, h in pixels), cxcywh or xyxy "
                "(boxes already in pixels) [offset]",
    "score": "logit (sigmoid applied) or prob [logit when any FP32 score is outside 0..1]",
    "threshold": f"score threshold [{0.5}]",
    "nms": f"NMS IoU [{0.3}]",
    "px": "bound on the matched detections' corners and keypoints, in pixels (judged as regression:px's)",
}
ANCHOR_SCORE_THR = 0.5  # MediaPipe face detection's min_score_thresh
ANCHOR_NMS_IOU = 0.3  # its min_suppression_threshold
ANCHOR_ENCODINGS = ("offset", "cxcywh", "xyxy")


def _hw(text: str, what: str) -> list[int]:
    try:
        hw = [int(v) for v in str(text).lower().split("x")]
    except ValueError:
        hw = []
    if len(hw) == 1:
        hw = hw * 2
    if len(hw) != 2 or min(hw) < 1:
        raise ValueError(f"{what} takes HxW (128x128), not {text!r}")
    return hw


def _kind_options(kind: str, text: str) -> dict[str, Any]:
    """``key=value[:key=value]`` after a kind -> its dict entries: ``px`` for regression (and an anchor head),
    ``ANCHOR_OPTIONS`` for ``detection@anchors``; ValueError naming the keys it takes."""
    keys = {"regression": ("px", "when"), "detection": tuple(ANCHOR_OPTIONS)}.get(kind, ())
    out: dict[str, Any] = {}
    for part in text.split(":"):
        k, sep, v = part.strip().partition("=")
        k = {"thr": "threshold", "iou": "nms", "input_hw": "input"}.get(k.strip(), k.strip())
        if not sep or k not in keys:
            raise ValueError(f"output kind {kind} takes " + (", ".join(f"{x}=" for x in keys) or "no options")
                             + f" after ':', not {part!r}")
        v = v.strip()
        try:
            if k == "px":
                out["px"] = float(v)
                if not out["px"] > 0 or not math.isfinite(out["px"]):
                    raise ValueError
            elif k in ("threshold", "nms"):
                out[k] = float(v)
            elif k == "input":
                out["input_hw"] = _hw(v, "input=")
            elif k == "anchors":
                out["anchors"] = [[int(a) for a in item.lower().split("x")] for item in
                                  v.replace(",", "+").replace("/", "+").split("+") if item]
                if not out["anchors"] or any(len(a) != 2 or min(a) < 1 for a in out["anchors"]):
                    raise ValueError
            else:
                out[k] = v
        except ValueError:
            what = ("a bound above 0 in the output's own units (pixels)" if k == "px" else
                    ANCHOR_OPTIONS.get(k, "") if kind == "detection" else "")
            raise ValueError(f"bad value in {part!r} for output kind {kind}" + (f" ({k}: {what})" if what else "")
                             ) from None
    return out


def _check_anchor_kind(spec: dict[str, Any]) -> None:
    if not spec.get("boxes"):
        raise ValueError("output kind detection@anchors needs boxes=OUTPUT, the output with the box regressors "
                         "(e.g. detection@anchors:boxes=regressors:anchors=8x2+16x6)")
    if spec.get("encoding", "offset") not in ANCHOR_ENCODINGS:
        raise ValueError(f"detection@anchors: encoding is one of {', '.join(ANCHOR_ENCODINGS)}, "
                         f"not {spec.get('encoding')!r}")
    if spec.get("score", "auto") not in ("auto", "logit", "prob"):
        raise ValueError(f"detection@anchors: score is logit or prob, not {spec.get('score')!r}")
    if spec.get("encoding", "offset") == "offset" and not spec.get("anchors"):
        raise ValueError("detection@anchors with encoding=offset needs anchors=STRIDExPER_CELL+... "
                         "(BlazeFace at 128 px: anchors=8x2+16x6)")
    if not 0 < float(spec.get("nms", ANCHOR_NMS_IOU)) <= 1:
        raise ValueError("detection@anchors: nms is an IoU in (0, 1]")


def anchor_centres(input_hw: list[int], layout: list[list[int]]) -> np.ndarray:
    """The anchors' centres ``[A, 2]`` (x, y in input pixels) of an SSD-style grid (MediaPipe's
    SsdAnchorsCalculator with anchor_offset 0.5): per ``[stride, per_cell]`` of ``layout``, rows then columns of
    cells, ``per_cell`` anchors at each cell's centre."""
    h, w = int(input_hw[0]), int(input_hw[1])
    out = []
    for stride, k in layout:
        gh, gw = -(-h // stride), -(-w // stride)
        ys, xs = np.meshgrid((np.arange(gh) + 0.5) * stride, (np.arange(gw) + 0.5) * stride, indexing="ij")
        c = np.stack([xs.ravel(), ys.ravel()], 1)
        out.append(np.repeat(c, k, axis=0))
    return np.concatenate(out) if out else np.zeros((0, 2))


def _anchor_rows(scores: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stacked scores ``[N, (1,) A(, C)]`` and boxes ``[N, (1,) A, K]`` as ``[N, A, C]`` and ``[N, A, K]``."""
    n, k = boxes.shape[0], boxes.shape[-1]
    a = boxes.size // (n * k)
    return scores.reshape(n, a, -1), boxes.reshape(n, a, k)


def _anchor_probs(s: np.ndarray, logits: bool) -> np.ndarray:
    s = s.astype(np.float64)
    return 1.0 / (1.0 + np.exp(-np.clip(s, -100, 100))) if logits else s


def anchor_boxes(scores: np.ndarray, regs: np.ndarray, kind: dict[str, Any], logits: bool,
                 centres: np.ndarray | None = None, detail: bool = False) -> tuple[np.ndarray, ...]:
    """One image's anchor head (scores ``[A, C]``, regressors ``[A, 4 + K]``) -> (boxes xyxy [D, 4], classes
    [D]): score (sigmoid of a logit) of the best class > ``threshold``, boxes decoded (``encoding``), NMS per
    class at ``nms``.  ``detail``: also each detection's decoded row (corners, then any keypoints, in input
    pixels) and its probabilities ``[D, C]``."""
    p = _anchor_probs(scores, logits)
    cls, sc = p.argmax(1), p.max(1)
    keep = np.flatnonzero(sc > float(kind.get("threshold", ANCHOR_SCORE_THR)))
    r = regs[keep].astype(np.float64)
    enc = kind.get("encoding", "offset")
    if enc == "offset":
        if centres is None:
            centres = anchor_centres(kind["input_hw"], kind["anchors"])
        c = centres[keep]
        r = np.concatenate([r[:, :2] + c, r[:, 2:4], r[:, 4:4 + 2 * ((r.shape[1] - 4) // 2)]
                            + np.tile(c, (1, (r.shape[1] - 4) // 2)), r[:, 4 + 2 * ((r.shape[1] - 4) // 2):]], 1)
    if enc == "xyxy":
        b = r[:, :4]
    else:
        b = np.concatenate([r[:, :2] - r[:, 2:4] / 2, r[:, :2] + r[:, 2:4] / 2], 1)
    rows = np.concatenate([b, r[:, 4:]], 1)
    if len(b):
        shift = cls[keep][:, None] * (float(np.abs(b).max()) + 1.0) * 2
        kept = np.asarray(_nms(b + shift, sc[keep], float(kind.get("nms", ANCHOR_NMS_IOU))), dtype=np.int64)
    else:
        kept = np.zeros(0, np.int64)
    if detail:
        return b[kept].reshape(-1, 4), cls[keep][kept], rows[kept], p[keep][kept]
    return b[kept].reshape(-1, 4), cls[keep][kept]


def anchor_detection_metrics(out_s: np.ndarray, ref_s: np.ndarray, out_b: np.ndarray, ref_b: np.ndarray,
                             kind: dict[str, Any]) -> tuple[dict[str, float], tuple[np.ndarray, ...]]:
    """An anchor head's detections, FP32's against the artifact's, image by image (``detection_metrics``'
    figures: ``box_match`` ...), and what the tensor figures of its two outputs are taken over: the detections
    both sides keep and match (same class, IoU >= 0.5) -- their probabilities ``[M, C]`` (artifact, FP32) and
    their decoded rows ``[M, 4 + K]`` (corners and keypoints in input pixels) -- not every anchor."""
    (so, bo), (sr, br) = _anchor_rows(out_s, out_b), _anchor_rows(ref_s, ref_b)
    if so.shape != sr.shape or bo.shape != br.shape or sr.size != ref_s.size or br.shape[-1] < 4:
        raise ValueError(f"detection@anchors: scores {tuple(ref_s.shape[1:])} and boxes {tuple(ref_b.shape[1:])} "
                         "are not [1, A, C] and [1, A, 4 + K] over the same anchors")
    score = kind.get("score", "auto")
    logits = score == "logit" or (score == "auto" and bool(sr.size) and (sr.min() < 0 or sr.max() > 1))
    centres = None
    if kind.get("encoding", "offset") == "offset":
        if not kind.get("input_hw"):
            raise ValueError("detection@anchors: no input size to lay the anchors over (add input=HxW)")
        centres = anchor_centres(kind["input_hw"], kind["anchors"])
        if len(centres) != sr.shape[1]:
            raise ValueError(f"detection@anchors: anchors={'+'.join(f'{s}x{k}' for s, k in kind['anchors'])} "
                             f"over {kind['input_hw'][0]}x{kind['input_hw'][1]} make {len(centres)} anchors, "
                             f"the outputs have {sr.shape[1]}")
    dets = [(anchor_boxes(o, ob, kind, logits, centres, True), anchor_boxes(r, rb, kind, logits, centres, True))
            for o, r, ob, rb in zip(so, sr, bo, br)]
    pairs: list[tuple[int, int, int]] = []
    m = _match_boxes([(d_o[:2], d_r[:2]) for d_o, d_r in dets], len(sr), pairs)
    k, c = br.shape[-1], sr.shape[-1]
    views = (np.asarray([dets[i][0][3][j] for i, _, j in pairs]).reshape(-1, c),
             np.asarray([dets[i][1][3][q] for i, q, _ in pairs]).reshape(-1, c),
             np.asarray([dets[i][0][2][j] for i, _, j in pairs]).reshape(-1, k),
             np.asarray([dets[i][1][2][q] for i, q, _ in pairs]).reshape(-1, k))
    m["anchors"], m["detections_compared"] = float(sr.shape[1]), float(len(pairs))
    return m, views


def _match_boxes(pairs: list, images: int, matches: list | None = None) -> dict[str, float]:
    """``detection_metrics``' figures from per image ((artifact boxes, classes), (FP32 boxes, classes));
    ``matches`` collects (image, FP32 index, artifact index) of each matched pair."""
    matched = total = equal = n_ref = n_out = 0
    for img, ((bo, co), (br, cr)) in enumerate(pairs):
        n_ref, n_out = n_ref + len(br), n_out + len(bo)
        hits, free = 0, np.ones(len(bo), bool)
        for q, (b, c) in enumerate(zip(br, cr)):
            cand = np.flatnonzero(free & (co == c))
            if cand.size:
                ious = _iou(b, bo[cand])
                if ious.max() >= 0.5:
                    j = int(cand[int(ious.argmax())])
                    free[j] = False
                    hits += 1
                    if matches is not None:
                        matches.append((img, q, j))
        matched, total = matched + hits, total + max(len(br), len(bo))
        equal += int(hits == len(br) == len(bo))
    return {"box_match": float(matched / total) if total else 1.0, "boxes": float(total),
            "box_recall": float(matched / n_ref) if n_ref else float(n_out == 0),
            "box_precision": float(matched / n_out) if n_out else float(n_ref == 0),
            "boxes_ref": float(n_ref), "boxes_out": float(n_out),
            "images_equal": float(equal / images) if images else 1.0}


def px_metrics(diff: np.ndarray, bound: float) -> dict[str, float]:
    """Coordinates' errors in their own units (pixels): the worst, the 99th percentile, and how many elements
    are off by more than ``bound`` (``over_px`` of ``elements``, ``over_px_share``), judged by ``px_share_max``
    and ``PX_WORST`` x ``bound``."""
    a = np.abs(np.asarray(diff, dtype=np.float64)).ravel()
    if not a.size:
        return {"max_abs_px": 0.0, "px_bound": float(bound), "over_px": 0.0, "over_px_share": 0.0, "elements": 0.0}
    over = float(np.sum(a > bound))
    return {"max_abs_px": float(a.max()), "p99_abs_px": float(np.percentile(a, 99)), "over_1px": float(np.sum(a > 1.0)),
            "px_bound": float(bound), "over_px": over, "over_px_share": over / a.size, "elements": float(a.size)}


def _pixel_coordinates(rows: np.ndarray, input_hw: list[int]) -> bool:
    """``[N, C]`` rows that read as points in the input's pixels (x, y[, z] per point: C a multiple of 2 or 3,
    at least 4 points): the x and y columns non-negative almost everywhere, inside the image give or take a
    quarter, spread over at least a tenth of it.  Logits are not: about half of them are negative, and their
    spread is a few units, not tens of pixels."""
    n, c = rows.shape
    side = float(max(input_hw))
    for k in (3, 2):
        if c % k or c // k < 4:
            continue
        pts = rows.reshape(n, c // k, k).astype(np.float64)
        xy = pts[..., :2]
        if not np.all(np.isfinite(xy)):
            return False
        inside = np.mean((xy >= -0.25 * side) & (xy <= 1.25 * side))
        nonneg = np.mean(xy >= 0)
        spread = float(np.median(xy[..., 0].max(1) - xy[..., 0].min(1)))
        if inside >= 0.99 and nonneg >= 0.9 and spread >= 0.1 * side and float(np.max(xy)) >= 0.2 * side:
            return True
    return False


def _prob_rows(rows: np.ndarray) -> bool:
    """Rows of probabilities (>= 0, summing to 1) or log-probabilities (exp summing to 1)."""
    if rows.size == 0:
        return False
    if np.all(rows >= 0) and np.allclose(rows.sum(-1), 1.0, atol=1e-3):
        return True
    if np.all(rows <= 1e-6):
        with np.errstate(over="ignore", under="ignore"):
            return bool(np.allclose(np.exp(rows.astype(np.float64)).sum(-1), 1.0, atol=1e-3))
    return False


def _blank_dominates(idx: np.ndarray, classes: int, share: float = 0.3) -> bool:
    counts = np.bincount(idx.ravel(), minlength=classes)
    return bool(counts.max() >= share * idx.size)


def _blank_evident(idx: np.ndarray, classes: int, share: float = 0.3) -> bool:
    """A CTC blank, not merely the most frequent class: per sequence (rows of ``idx`` [sequences, T]) the most
    frequent class is the first or the last class (where CTC heads put it: PyTorch/Paddle 0, Keras last) and
    covers >= ``share`` of positions, other classes do occur, and they come in short runs between blanks
    (characters, phonemes: median run <= 3 steps), not in the long runs of a per-frame classifier."""
    counts = np.bincount(idx.ravel(), minlength=classes)
    blank = int(np.argmax(counts))
    if classes < 3 or blank not in (0, classes - 1) or counts[blank] < share * idx.size:
        return False
    if counts[blank] > 0.99 * idx.size:
        return False  # one class everywhere: nothing says it is a blank
    runs = []
    for row in idx.reshape(-1, idx.shape[-1]):
        edges = np.flatnonzero(np.diff(row)) + 1
        for seg in np.split(row, edges):
            if seg.size and seg[0] != blank:
                runs.append(seg.size)
    return bool(runs) and float(np.median(runs)) <= 3


REGRESSION_WORDS = ("box", "bbox", "landmark", "lmk", "offset", "regress", "coord", "keypoint", "kpt", "pose",
                    "angle", "depth", "delta", "point", "pts", "age")
HIDDEN_WORDS = ("hidden", "state", "feat", "embed", "pooler", "last_hidden", "encoder_out", "memory")


def _yolo_head(ref: np.ndarray, input_hw: list[int] | None = None) -> dict[str, Any] | None:
    """A YOLOv5/v8/v10/v11 head's raw table: ``[1, 4 + C, anchors]`` (v8/v11 channel-major) or ``[1, anchors,
    4 (+1) + C]`` (v5, or a transposed v8): box centre/size in pixels, then scores after their sigmoid in
    [0, 1]. Anchors >= 8x the columns and >= 64."""
    per = ref.shape[1:]
    if len(per) == 3 and per[0] == 1:
        per = per[1:]
    if len(per) != 2 or ref.dtype.kind != "f":
        return None
    k, a = min(per), max(per)
    if k < 5 or k > 1024 or a < 64 or a < 8 * k:
        return None
    t = _yolo_rows(ref.reshape(ref.shape[0], *per), per[0] == k)
    scores, xy, wh = t[..., 4:], t[..., :2], t[..., 2:4]
    if scores.min() < -1e-6 or scores.max() > 1 + 1e-6 or scores.max() <= 0:
        return None
    if float(np.abs(xy).max()) < 2.0 or float(wh.min()) < -1e-3 * float(np.abs(xy).max()):
        return None  # pixel-scale centres and non-negative sizes; normalised boxes look like scores
    fmt = "yolov8"
    if input_hw and per[0] != k:
        h, w = int(input_hw[0]), int(input_hw[1])
        if a == 3 * sum((h // s) * (w // s) for s in YOLOX_STRIDES):
            fmt = "yolov5"  # three anchors per cell: v5's [1, 25200, 85] at 640x640
    return {"kind": "detection", "format": fmt}


def _labels(ref: np.ndarray) -> bool:
    """Integer class ids: 32- or 64-bit integers (not bool, not 8/16-bit pixels or codes), non-negative, at most
    LABEL_MAX per sample (scikit-learn's ``output_label``, an ArgMax over classes, a greedy decoder's token ids)."""
    if ref.dtype.kind not in "iu" or ref.dtype.itemsize < 4 or ref.size == 0 or ref.ndim < 1:
        return False
    return bool(ref.size // max(ref.shape[0], 1) <= LABEL_MAX and ref.min() >= 0)


def _yolo_end2end(ref: np.ndarray) -> bool:
    """A YOLOv10 / YOLO26 end-to-end output, stacked ``[N, (1,) D, 6]``: per row ``x1, y1, x2, y2, score,
    class`` -- scores in [0, 1] not increasing down the rows (top-k order; padding rows score 0), class ids
    integral and >= 0, corners ordered (x2 >= x1, y2 >= y1) wherever the score is > 0, some score > 0."""
    per = ref.shape[1:]
    if len(per) == 3 and per[0] == 1:
        per = per[1:]
    if len(per) != 2 or per[1] != 6 or not 8 <= per[0] <= 10_000 or ref.dtype.kind != "f":
        return False
    t = ref.reshape(ref.shape[0], *per).astype(np.float64)
    score, cls = t[..., 4], t[..., 5]
    if not np.all(np.isfinite(t)) or score.min() < 0 or score.max() > 1 or score.max() <= 0:
        return False
    if np.any(np.diff(score, axis=1) > 1e-6) or cls.min() < 0 or np.any(np.abs(cls - np.rint(cls)) > 1e-3):
        return False
    live = score > 0
    return bool(np.all(t[..., 2][live] >= t[..., 0][live]) and np.all(t[..., 3][live] >= t[..., 1][live]))


def _yolo_rows(table: np.ndarray, channels_first: bool | None = None) -> np.ndarray:
    """A stacked YOLO table ``[N, (1,) K, A]`` or ``[N, (1,) A, K]`` as rows ``[N, A, K]``."""
    t = table.reshape(table.shape[0], *table.shape[-2:])
    if channels_first is None:
        channels_first = t.shape[1] < t.shape[2]
    return np.swapaxes(t, 1, 2) if channels_first else t


def _like_columns(rows: np.ndarray) -> bool:
    """Columns of one kind (every class's score spread alike, within 10x): per-position logits, not a table
    that mixes box values with scores (a YOLOX head, read without its input size)."""
    sd = rows.astype(np.float64).std(0)
    unit = (rows.min(0) >= 0) & (rows.max(0) <= 1)
    if unit.any() and not unit.all():
        return False  # some columns are scores in [0, 1], others are not
    return bool(sd.min() > 0 and sd.max() <= 10 * sd.min())


def infer_kind(name: str, ref: np.ndarray, producer: str | None = None,
               producer_axis: int | None = None, input_hw: list[int] | None = None) -> dict[str, Any]:
    """Guess an output's kind from its stacked reference ``[N, *shape]``, its name and (when known) the
    op that produces it and the image input's size.  The rules are in docs/TOLERANCES.md; anything
    unclear is ``regression``.  ``infer_kinds`` adds the rules that look at the model's other outputs."""
    per = ref.shape[1:]
    low = name.lower()
    if _labels(ref) or (producer == "ArgMax" and ref.size and np.all(np.isfinite(ref))):
        return {"kind": "label"}
    if ref.dtype.kind not in "f" or ref.ndim < 2:
        return {"kind": "regression"}
    if len(per) >= 3 and all(d == 1 for d in per[:-1]):
        # a vector behind singleton axes (a TFLite conv head's [1, 1, 1, 1404] landmarks, [1, 1, 1, 1] presence
        # logit): the [1, C] rules, not a map's -- the axes are only the conv's spatial 1 x 1
        k = infer_kind(name, ref.reshape(len(ref), 1, per[-1]), producer, None, input_hw)
        return {**k, "axis": len(per) - 1} if k.get("kind") == "classification" else k
    if input_hw and _yolox_table(ref, input_hw):
        return {"kind": "detection", "format": "yolox", "input_hw": [int(v) for v in input_hw]}
    if _yolo_end2end(ref):
        return {"kind": "detection", "format": "yolov10"}
    yolo = _yolo_head(ref, input_hw)
    if yolo and producer not in ("Softmax", "LogSoftmax"):
        return yolo
    if any(w in low for w in ("embed", "vector", "pooler", "sentence_emb", "speaker")) or producer == "LpNormalization":
        return {"kind": "embedding"}
    c = per[-1]
    last_axis_softmax = producer in ("Softmax", "LogSoftmax") and producer_axis is not None and (
        producer_axis == -1 or producer_axis == len(per) - 1)
    if len(per) == 3 and 2 <= c <= 100_000 and (per[0] == 1 or per[1] == 1) and max(per[0], per[1]) >= 4:
        rows = ref.reshape(-1, c)
        idx = ref.argmax(-1).reshape(ref.shape[0], -1) if per[0] == 1 else np.swapaxes(ref.argmax(-1), 1, 2).reshape(
            -1, per[0])
        probs = producer in ("Softmax", "LogSoftmax", None) and _prob_rows(rows) and _blank_evident(idx, c)
        # raw logits (a recogniser that leaves the softmax to its decoder): many classes, mostly the blank
        logits = c >= 10 and producer not in ("Sigmoid",) and _blank_evident(idx, c, 0.5)
        if probs or logits:
            return {"kind": "ctc_batch_major" if per[0] == 1 else "ctc_time_major"}
        # per-position classes ([1, T, K] tags/emissions, a time-major [T, 1, K] per-frame classifier): the
        # argmax of every position is a decision, whatever op made the scores
        hidden = any(w in low for w in HIDDEN_WORDS) or (
            producer in ("Softmax", "LogSoftmax") and not last_axis_softmax)  # classes on another axis: a map
        logits = c <= 64 and producer not in (None, "Concat", "Transpose", "Reshape", "Sigmoid") and _like_columns(rows)
        if not hidden and (last_axis_softmax or _prob_rows(rows) or logits):
            return {"kind": "per_position"}
    if len(per) == 2 and per[0] >= 4 and per[0] != 1 and 2 <= c <= 64 and not any(w in low for w in HIDDEN_WORDS) \
            and (last_axis_softmax or _prob_rows(ref.reshape(-1, c))):
        return {"kind": "per_position"}  # [T, K] per sample: a model without a batch axis
    if producer in ("Softmax", "LogSoftmax") and producer_axis is not None:
        axis = producer_axis if producer_axis >= 0 else len(per) + producer_axis
        if per[axis] >= 2 and (len(per) <= 2 or axis == len(per) - 1):
            return {"kind": "classification", "axis": axis}
        if per[axis] >= 2:
            return {"kind": "dense"}  # per-pixel classes: judged as a map
    if producer == "Sigmoid" and len(per) == 1:
        return {"kind": "decision", "threshold": 0.5}  # one probability per position ([T]: voice activity)
    if c == 1 and (producer == "Sigmoid" or (np.all(ref >= 0) and np.all(ref <= 1) and producer in (None,))):
        return {"kind": "decision", "threshold": 0.5}
    if c == 1 and len(per) <= 2 and int(np.prod(per)) == 1 and producer != "Sigmoid" and len(ref) >= 2 \
            and float(np.min(ref)) < 0 < float(np.max(ref)) and not any(w in low for w in REGRESSION_WORDS):
        # one score per sample on both sides of 0 (a presence/face logit): a decision at 0, not a tensor
        return {"kind": "decision", "threshold": 0.0, "guess": "logit"}
    if len(per) == 2 and per[0] == 1 and 2 <= c <= 100_000:
        if producer in ("Div",) and any(w in low for w in ("norm", "emb")):
            return {"kind": "embedding"}
        if _prob_rows(ref.reshape(-1, c)):
            return {"kind": "classification", "axis": 1}  # a distribution over classes
        if any(w in low for w in REGRESSION_WORDS):
            return {"kind": "regression"}  # boxes, landmarks, offsets: not a choice among classes
        if input_hw and _pixel_coordinates(ref.reshape(len(ref), c), input_hw):
            return {"kind": "regression", "guess": "coordinates"}  # landmarks in the input's pixels
        return {"kind": "classification", "axis": 1, "guess": "shape"}  # [1, classes] logits
    if len(per) >= 3:
        if producer == "Sigmoid":  # a probability per pixel (a text detector's map): [0, 1]'s rounding floor
            return {"kind": "dense", "range": "probability"}
        return {"kind": "dense"}
    return {"kind": "regression"}


def infer_kinds(refs: dict[str, np.ndarray], producers: dict[str, tuple[str | None, int | None]] | None = None,
                input_hw: list[int] | None = None) -> dict[str, dict[str, Any]]:
    """``infer_kind`` for every output of a model, plus the rule that needs them all: a small vector
    (``[1, C]``, C <= 32) taken for classification on its shape alone is a regression (boxes, landmarks,
    offsets: MTCNN's O-Net) when another output of the model is the distribution over classes."""
    producers = producers or {}
    kinds = {n: infer_kind(n, r, *producers.get(n, (None, None)), input_hw) for n, r in refs.items()}
    has_dist = any(k["kind"] in ("classification", "probability") and "guess" not in k for k in kinds.values())
    for n, k in kinds.items():
        if k.get("guess") == "shape" and has_dist and refs[n].shape[-1] <= 32:
            kinds[n] = {"kind": "regression"}
    kinds.update(_mediapipe_anchor_head(refs, input_hw))
    # one decision per sample (a face/presence logit or probability) beside points in the input's pixels: the
    # points are used only where that decision is positive (a face mesh on a non-face is discarded), so they are
    # judged on FP32's positive samples (``when``)
    flags = [n for n, k in kinds.items() if k.get("kind") == "decision" and refs[n].size == len(refs[n])]
    if len(flags) == 1:
        for n, k in kinds.items():
            if k.get("kind") == "regression" and k.get("guess") == "coordinates":
                kinds[n] = {**k, "when": flags[0]}
    return kinds


# MediaPipe's SSD anchor grids (SsdAnchorsCalculator in its graphs) by (input side, anchors): the grid an anchor
# head of that many anchors over that input has in MediaPipe's own models -- BlazeFace short range (128 px,
# front camera) and back camera (256 px), full range (192 px), palm detection (192 px).
MEDIAPIPE_GRIDS = {(128, 896): [[8, 2], [16, 6]], (256, 896): [[16, 2], [32, 6]], (192, 2304): [[4, 1]],
                   (192, 2016): [[8, 2], [16, 6]]}


def _mediapipe_anchor_head(refs: dict[str, np.ndarray], input_hw: list[int] | None) -> dict[str, dict[str, Any]]:
    """Two outputs over one of ``MEDIAPIPE_GRIDS``' anchor counts for a square image input -- scores ``[1, A, C]``
    (C <= 16) and regressors ``[1, A, K]`` (K >= 4, even) -- whose FP32 detections decode as boxes (a positive
    width and height wherever a score passes 0.5): ``detection@anchors`` with that grid (``guess: mediapipe
    grid``); else nothing (random inputs that detect nothing leave the plain kinds)."""
    if not input_hw or int(input_hw[0]) != int(input_hw[1]):
        return {}
    side = int(input_hw[0])
    per = {n: r.shape[1:] for n, r in refs.items() if r.dtype.kind == "f" and r.ndim >= 3}
    per = {n: (sh[1:] if len(sh) == 3 and sh[0] == 1 else sh) for n, sh in per.items()}
    per = {n: sh for n, sh in per.items() if len(sh) == 2 and (side, int(sh[0])) in MEDIAPIPE_GRIDS}
    scores = [n for n, sh in per.items() if 1 <= sh[1] <= 16]
    boxes = [n for n, sh in per.items() if sh[1] >= 4 and sh[1] % 2 == 0]
    for s_ in scores:
        for b in boxes:
            if b == s_ or per[b][0] != per[s_][0] or per[b][1] <= per[s_][1]:
                continue
            n, a = len(refs[s_]), int(per[s_][0])
            sc, rg = refs[s_].reshape(n, a, -1).astype(np.float64), refs[b].reshape(n, a, -1)
            logits = bool(sc.min() < 0 or sc.max() > 1)
            live = _anchor_probs(sc, logits).max(-1) > ANCHOR_SCORE_THR
            if not live.any() or not np.all(rg[live][:, 2:4] > 0):
                continue
            kind = {"kind": "detection", "format": "anchors", "boxes": b, "anchors": MEDIAPIPE_GRIDS[(side, a)],
                    "input_hw": [side, side], "guess": "mediapipe grid"}
            return {s_: kind, b: {"kind": "regression", "anchors_of": s_}}
    return {}


# --- metrics --------------------------------------------------------------------------------------

def tensor_metrics(out: np.ndarray, ref: np.ndarray, kind: dict[str, Any] | str | None = None) -> dict[str, float]:
    """Error metrics of one output tensor (all samples stacked on axis 0), with its kind's metrics."""
    out, ref = np.asarray(out), np.asarray(ref)
    if out.shape != ref.shape:
        return {"shape_mismatch": 1.0}
    k = parse_kind(kind) if kind is not None else None
    if (k or {}).get("kind") == "label" or (k is None and _labels(ref)):
        return label_metrics(out, ref)
    if (k or {}).get("kind") == "detection" and k.get("format") == "yolov10":
        if not np.all(np.isfinite(out.astype(np.float64))):
            return {"non_finite": float(np.mean(~np.isfinite(out.astype(np.float64))))}
        # rows in score order: a near-tie swaps two rows, so the tensor figures are the matched detections'
        pairs = end2end_pairs(out, ref)
        m = tensor_metrics(*pairs, "regression")
        m["detections_compared"] = float(len(pairs[1]))
        m.update(detection_metrics(out, ref, k))
        return m
    if ref.dtype.kind in "biu" or out.dtype.kind in "biu":
        # bool and integer outputs: exact (a float artifact output of a bool is compared as 0/1)
        o = out.astype(ref.dtype) if ref.dtype.kind == "b" and out.dtype.kind == "f" else out
        equal = float(np.mean(o == ref)) if ref.size else 1.0
        return {"exact_match": equal}
    y = out.astype(np.float64).ravel()
    r = ref.astype(np.float64).ravel()
    if not np.all(np.isfinite(y)):
        m = {"non_finite": float(np.mean(~np.isfinite(y)))}
        if not np.all(np.isfinite(r)):  # the FP32 model makes some too: are they the same ones?
            m["ref_non_finite"] = float(np.mean(~np.isfinite(r)))
            m["non_finite_as_ref"] = float(all(np.array_equal(f(y), f(r)) for f in (np.isnan, np.isposinf, np.isneginf)))
        return m
    diff = y - r
    rn, yn = float(np.linalg.norm(r)), float(np.linalg.norm(y))
    scale = float(np.max(np.abs(r))) if r.size else 0.0
    m = {
        "max_abs": float(np.max(np.abs(diff))) if r.size else 0.0,
        "mean_abs": float(np.mean(np.abs(diff))) if r.size else 0.0,
        "rel_l2": float(np.linalg.norm(diff) / rn) if rn > 0 else float(np.linalg.norm(diff) > 0),
        "cosine": float(np.dot(y, r) / (yn * rn)) if rn > 0 and yn > 0 else float(rn == yn),
        "max_abs_norm": float(np.max(np.abs(diff)) / scale) if scale > 0 else float(np.max(np.abs(diff), initial=0)),
    }
    m["snr_db"] = float(10 * math.log10((rn**2) / max(float(np.sum(diff**2)), 1e-30))) if rn > 0 else 0.0
    k = k or infer_kind("", ref)
    name = k["kind"]
    if name == "classification":
        m.update(_topk(out, ref, k.get("axis", ref.ndim - 2)))
    elif name == "probability":
        m.update(_topk(out, ref, ref.ndim - 2))
        m.update(probability_metrics(out, ref, k.get("thresholds") or float(k.get("threshold", 0.5))))
    elif name == "per_position":
        m.update(per_position_metrics(out, ref))
    elif name == "regression" and k.get("scale"):
        m["max_abs_scaled"] = m["max_abs"] * float(k["scale"])
        m["mean_abs_scaled"] = m["mean_abs"] * float(k["scale"])
    elif name == "regression" and k.get("guess") == "coordinates" and r.size:
        # points in the input's pixels: the error in pixels, and the outliers a whole-tensor cosine hides
        a = np.abs(diff)
        m["max_abs_px"] = float(a.max())
        m["p99_abs_px"] = float(np.percentile(a, 99))
        m["over_1px"] = float(np.sum(a > 1.0))
        m["elements"] = float(a.size)
    elif name in ("ctc_time_major", "ctc_batch_major"):
        m.update(ctc_metrics(out, ref, time_major=name == "ctc_time_major"))
    elif name == "sequence":
        m.update(_topk(out, ref, ref.ndim - 2))  # per step (the last axis), for the record
        m.update(sequence_metrics(out, ref))
    elif name == "decision":
        m.update(decision_metrics(out, ref, k.get("thresholds") or k.get("threshold")))
        if 0 < m["threshold"] < 1 and r.size and 0 <= r.min() and r.max() <= 1:
            _probability_floor(m, diff, rn, r)
    elif name == "embedding":
        m.update(embedding_metrics(out, ref))
    elif name == "dense":
        m.update(column_metrics(out, ref))
        if k.get("range") == "probability" and r.size and 0 <= r.min() and r.max() <= 1:
            _probability_floor(m, diff, rn, r)
    elif name == "detection" and k.get("format") != "anchors":
        m.update(column_metrics(out, ref))
        m.update(detection_metrics(out, ref, k))
    return m


def _px_view(kind: dict[str, Any], ref: np.ndarray) -> float | None:
    """The factor that turns an output's error into its own units when it is judged in them (a regression in an
    image input's pixels, one with ``px`` or ``@scale``, an anchor head's regressors), else None."""
    if kind.get("kind") != "regression" or ref.dtype.kind != "f":
        return None
    if kind.get("scale"):
        return float(kind["scale"])
    if kind.get("px") or kind.get("guess") == "coordinates" or kind.get("anchors_of"):
        return 1.0
    return None


def _probability_floor(m: dict[str, float], diff: np.ndarray, rn: float, r: np.ndarray) -> None:
    """Probabilities near 0: a wake-word score of 1e-5 that reads 1.006e-5, or a text detector's map of a
    page with no text (every pixel ~1e-7), differ by float32's rounding, not by an error, yet their rel_l2
    is 1e-3..1e-2 (> FP32's 1e-3) and their cosine 0.9999.  They are taken relative to at least
    ``PROBABILITY_FLOOR`` of the [0, 1] scale (RMS for rel_l2, the largest value for max_abs_norm); the raw
    figures stay as ``*_raw``.  The floored cosine is the one equal norms would give at that rel_l2
    (1 - rel_l2^2 / 2)."""
    if r.size and float(np.max(np.abs(r))) < PROBABILITY_FLOOR:
        m["max_abs_norm_raw"], m["max_abs_norm"] = m["max_abs_norm"], m["max_abs"] / PROBABILITY_FLOOR
    floor = PROBABILITY_FLOOR * math.sqrt(r.size)
    if rn >= floor:
        return
    rel = float(np.linalg.norm(diff) / floor)
    m["rel_l2_raw"], m["cosine_raw"] = m["rel_l2"], m["cosine"]
    m["rel_l2"], m["rel_l2_floor"] = rel, PROBABILITY_FLOOR
    m["cosine"] = max(m["cosine"], 1.0 - rel * rel / 2)


def label_metrics(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """Integer class ids (``label``): each value is a decision, equal to FP32's or not -- counted as top-1
    agreement is (``top1`` the share, ``top1_n`` the labels), judged on ``top1_min``; ``label_output`` marks
    them.  An artifact that returns the ids as floats is read rounded."""
    o = np.rint(out) if out.dtype.kind == "f" else out
    r = np.rint(ref) if ref.dtype.kind == "f" else ref
    with np.errstate(invalid="ignore"):
        equal = (o == r) & np.isfinite(o.astype(np.float64))
    n = int(equal.size)
    return {"top1": float(np.mean(equal)) if n else 1.0, "top1_n": float(n), "label_output": 1.0}


def judged_view(out: np.ndarray, ref: np.ndarray, kind: dict[str, Any] | None) -> tuple[np.ndarray, np.ndarray]:
    """What the tensor and per-slice figures compare: the outputs themselves, or for an end-to-end detector's
    score-ordered rows the matched detections (``end2end_pairs``)."""
    if kind and kind.get("kind") == "detection" and kind.get("format") == "yolov10":
        return end2end_pairs(out, ref)
    return out, ref


def channel_axis(shape: tuple[int, ...], axis_max: int = SLICE_AXIS_MAX) -> int | None:
    """The per-sample axis the per-slice check cuts along, or None: where outputs are concatenated (a head's
    coordinates and scores, a table's columns, a vector's components, a map's channels) -- the only axis of
    a vector, the shorter axis of a ``[A, B]`` table when the other is >= 8x longer (YOLO's ``[84, 8400]``,
    ``[T, K]`` scores), else the shortest axis besides the two longest (a map's channels, NCHW or NHWC).
    Never the rows and columns of a map: they are one quantity over space, and slicing them judged a text
    map's background noise (PP-OCR det at 160x160, OpenVINO INT8: a row at rel_l2 2.15 where the pair still
    reads the page) -- and only below 256 px."""
    dims = [i for i, n in enumerate(shape) if n >= 2]
    if len(dims) == 2:
        small, large = sorted(dims, key=lambda i: (shape[i], i))
        dims = [small] if shape[large] >= 8 * shape[small] else []
    elif len(dims) >= 3:
        dims = sorted(dims, key=lambda i: (shape[i], i))[:-2]
    dims = [i for i in dims if shape[i] <= axis_max]
    return min(dims, key=lambda i: (shape[i], i)) if dims else None


def slice_metrics(out: np.ndarray, ref: np.ndarray, floor: float = SLICE_FLOOR["int8"],
                  axis_max: int = SLICE_AXIS_MAX) -> dict[str, float]:
    """The worst slice of a stacked output ``[N, *shape]``: along its channel-like axis (``channel_axis``),
    each index is a slice (a channel, a column of a table, one coordinate of a small vector over all samples)
    judged against its own scale: ``slice_rel_l2`` (the worst) and ``slice_cosine`` (the worst of the slices
    judged on it), with where they are (``slice_axis``, counted in the per-sample shape, and
    ``slice_index`` / ``slice_cosine_index``).  A slice whose RMS is below ``floor`` x its natural scale (1
    for values in [0, 1], else the output's RMS) is negligible: judged on rel_l2 against the RMS of its
    group's slices (those of the same value domain), not on its cosine.  Empty when no axis qualifies."""
    if ref.ndim < 2 or ref.dtype.kind != "f" or out.shape != ref.shape or ref.size == 0:
        return {}
    axis = channel_axis(ref.shape[1:], axis_max)
    if axis is None:
        return {}
    size, others = ref.shape[axis + 1], tuple(i for i in range(ref.ndim - 1) if i != axis)
    # per-slice sums, accumulated one sample at a time (a detector's [32, 1, 84, 8400] stays small in memory)
    rr, yy, dd, yr = (np.zeros(size) for _ in range(4))
    lo, hi = np.full(size, np.inf), np.full(size, -np.inf)
    for o_s, r_s in zip(out, ref):
        r, y = r_s.astype(np.float64), o_s.astype(np.float64)
        if not np.all(np.isfinite(y)):
            return {}
        d = y - r
        rr += np.sum(r * r, axis=others)
        yy += np.sum(y * y, axis=others)
        dd += np.sum(d * d, axis=others)
        yr += np.sum(y * r, axis=others)
        lo, hi = np.minimum(lo, np.min(r, axis=others)), np.maximum(hi, np.max(r, axis=others))
    n = ref.size // size
    rn, yn, dn = np.sqrt(rr), np.sqrt(yy), np.sqrt(dd)
    unit = (lo >= 0) & (hi <= 1)
    fl = floor * np.where(unit, 1.0, math.sqrt(float(np.sum(rr)) / ref.size)) * math.sqrt(n)
    judged = (rn >= fl) & (rn > 0)
    # a negligible slice (a class no input shows, a slice that is 0) is judged against the typical slice of
    # its group (values in [0, 1], or the others): noise there is noise relative to the rest, not to itself
    group = np.array([math.sqrt(float(np.mean(rr[unit == u]))) if np.any(unit == u) else 0.0 for u in (False, True)])
    den = np.where(judged, rn, np.maximum(group[unit.astype(int)], fl))
    rel = np.where(den > 0, dn / np.where(den > 0, den, 1.0), 0.0)
    ok = judged & (yn > 0)
    cos = np.where(ok, yr / np.where(ok, rn * yn, 1.0), np.where(judged, 0.0, 1.0))
    i, j = int(np.argmax(rel)), int(np.argmin(cos))
    return {"slice_rel_l2": float(rel[i]), "slice_axis": float(axis), "slice_index": float(i),
            "slice_cosine": float(cos[j]), "slice_cosine_index": float(j)}


def column_metrics(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """A detector's ``[.., anchors, 4 + 1 + classes]`` rows mix box offsets with scores of another scale:
    one cosine over the whole tensor is the boxes', and a broken objectness column hides under it.  For a
    table-like output (last axis 5..128 columns, at least 16 rows per column) the worst column's cosine."""
    if ref.ndim < 3 or not 5 <= ref.shape[-1] <= 128 or ref.shape[-2] < 16 * ref.shape[-1]:
        return {}
    y = out.astype(np.float64).reshape(-1, ref.shape[-1])
    r = ref.astype(np.float64).reshape(-1, ref.shape[-1])
    yn, rn = np.linalg.norm(y, axis=0), np.linalg.norm(r, axis=0)
    ok = (rn > 0) & (yn > 0)
    if not ok.any():
        return {}
    cos = np.where(ok, np.sum(y * r, axis=0) / np.where(ok, yn * rn, 1.0), 1.0)
    worst = int(np.argmin(cos))
    return {"column_cosine_min": float(cos[worst]), "column_worst": float(worst)}


YOLOX_STRIDES = (8, 16, 32)


def _yolox_table(ref: np.ndarray, input_hw: list[int]) -> bool:
    """A YOLOX head's raw table: one row per cell of the stride-8/16/32 grids of the input, 4 box values,
    an objectness and class scores (both after their sigmoid, in [0, 1])."""
    h, w = int(input_hw[0]), int(input_hw[1])
    cells = sum((h // s) * (w // s) for s in YOLOX_STRIDES)
    per = ref.shape[1:]
    if len(per) not in (2, 3) or (len(per) == 3 and per[0] != 1) or per[-2] != cells or per[-1] < 6:
        return False
    scores = ref[..., 4:]
    return bool(np.all(scores >= 0) and np.all(scores <= 1))


def yolox_boxes(table: np.ndarray, input_hw: list[int], score_thr: float = 0.1,
                nms_thr: float = 0.45) -> tuple[np.ndarray, np.ndarray]:
    """One image's YOLOX table -> (boxes xyxy [K, 4], classes [K]): the grid decoding, score = obj x class,
    class-agnostic NMS — the post-processing of YOLOX's ONNX demo (score 0.1, NMS 0.45)."""
    h, w = int(input_hw[0]), int(input_hw[1])
    grids, strides = [], []
    for s in YOLOX_STRIDES:
        xv, yv = np.meshgrid(np.arange(w // s), np.arange(h // s))
        grids.append(np.stack((xv, yv), 2).reshape(-1, 2))
        strides.append(np.full((grids[-1].shape[0], 1), s))
    g, st = np.concatenate(grids), np.concatenate(strides)
    p = table.reshape(-1, table.shape[-1]).astype(np.float64)
    xy, wh = (p[:, :2] + g) * st, np.exp(np.minimum(p[:, 2:4], 20)) * st
    boxes = np.concatenate([xy - wh / 2, xy + wh / 2], 1)
    scores = p[:, 4:5] * p[:, 5:]
    cls, sc = scores.argmax(1), scores.max(1)
    keep = sc > score_thr
    boxes, cls, sc = boxes[keep], cls[keep], sc[keep]
    order, kept = np.argsort(-sc), []
    while order.size:
        i = order[0]
        kept.append(i)
        order = order[1:][_iou(boxes[i], boxes[order[1:]]) <= nms_thr]
    return boxes[kept], cls[kept]


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    w = np.clip(np.minimum(box[2], boxes[:, 2]) - np.maximum(box[0], boxes[:, 0]), 0, None)
    h = np.clip(np.minimum(box[3], boxes[:, 3]) - np.maximum(box[1], boxes[:, 1]), 0, None)
    inter = w * h
    area = (box[2] - box[0]) * (box[3] - box[1]) + (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / np.maximum(area - inter, 1e-9)


YOLO_SCORE_THR = 0.25  # YOLOv5/v8's default confidence threshold
YOLO_NMS_IOU = 0.45  # YOLOv5's (and its ONNX demos') NMS IoU
YOLO_MAX_DET = 300


def _nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> list[int]:
    order, kept = np.argsort(-scores, kind="stable"), []
    while order.size:
        i = order[0]
        kept.append(int(i))
        order = order[1:][_iou(boxes[i], boxes[order[1:]]) <= iou]
    return kept


def yolo_boxes(table: np.ndarray, fmt: str = "yolov8", score_thr: float = YOLO_SCORE_THR,
               nms_thr: float = YOLO_NMS_IOU, channels_first: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One image's YOLOv5/v8/v11 head ``[(1,) 4 + C, A]`` or ``[(1,) A, 4 (+1) + C]`` -> (boxes xyxy [K, 4],
    classes [K]) as those models' own post-processing does: centre/size to corners, score = the best class's
    (v8/v11) or objectness x class (v5, objectness also > the threshold), > 0.25, NMS per class at IoU 0.45
    (boxes offset by class, as ultralytics' ``non_max_suppression``), at most 300."""
    p = _yolo_rows(np.asarray(table)[None], channels_first)[0].astype(np.float64)
    if fmt == "yolov5":
        obj = p[:, 4:5]
        scores = obj * p[:, 5:]
        pre = p[:, 4] > score_thr
    else:
        scores = p[:, 4:]
        pre = np.ones(len(p), bool)
    cls, sc = scores.argmax(1), scores.max(1)
    keep = pre & (sc > score_thr)
    p, cls, sc = p[keep], cls[keep], sc[keep]
    boxes = np.concatenate([p[:, :2] - p[:, 2:4] / 2, p[:, :2] + p[:, 2:4] / 2], 1)
    if not len(boxes):
        return boxes.reshape(0, 4), cls
    shift = (cls[:, None] * (float(np.abs(boxes).max()) + 1.0) * 2)  # one NMS pass keeps classes apart
    kept = _nms(boxes + shift, sc, nms_thr)[:YOLO_MAX_DET]
    return boxes[kept], cls[kept]


def _e2e_rows(table: np.ndarray) -> np.ndarray:
    t = np.asarray(table, dtype=np.float64)
    return t.reshape(-1, t.shape[-1])


def end2end_boxes(table: np.ndarray, score_thr: float = YOLO_SCORE_THR) -> tuple[np.ndarray, np.ndarray]:
    """One image's YOLOv10 / YOLO26 end-to-end output ``[(1,) D, 6]`` (``x1, y1, x2, y2, score, class``, top-k
    rows, no NMS needed) -> (boxes xyxy [K, 4], classes [K]) as ultralytics keeps them: score > 0.25."""
    p = _e2e_rows(table)
    keep = p[:, 4] > score_thr
    return p[keep, :4], np.rint(p[keep, 5]).astype(np.int64)


def end2end_pairs(out: np.ndarray, ref: np.ndarray, score_thr: float = YOLO_SCORE_THR
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The detections both end-to-end outputs (stacked ``[N, (1,) D, 6]``) hold, as aligned rows ``[M, 5]``
    (corners and score) of the artifact and FP32: each FP32 detection (score > ``score_thr``) beside the
    artifact's row of the same class that overlaps it most (IoU >= 0.5, at any score > 0: a score that fell
    below the threshold is a score error here, and a lost box in ``box_match``).  Detections one side has
    and the other has not are ``box_match``'s to judge.  The rows are in score order, so a near-tie swaps
    two of them: compared row by row the tensor would differ where the detections do not."""
    os_, rs_ = [], []
    for o, r in zip(out, ref):
        po, pr = _e2e_rows(o), _e2e_rows(r)
        free = po[:, 4] > 0
        co, cr = np.rint(po[:, 5]), np.rint(pr[:, 5])
        for i in np.flatnonzero(pr[:, 4] > score_thr):
            cand = np.flatnonzero(free & (co == cr[i]))
            if cand.size:
                ious = _iou(pr[i, :4], po[cand, :4])
                if ious.max() >= 0.5:
                    j = int(cand[int(ious.argmax())])
                    free[j] = False
                    rs_.append(pr[i, :5])
                    os_.append(po[j, :5])
    shape = (len(rs_), 5)
    return np.asarray(os_, np.float64).reshape(shape), np.asarray(rs_, np.float64).reshape(shape)


def _boxes_of(table: np.ndarray, kind: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    if kind.get("format") == "anchors":  # scores and regressors side by side [(1,) A, C + K] (the gate's pairs)
        t = np.asarray(table).reshape(-1, np.asarray(table).shape[-1])
        c = int(kind["classes"])
        s = t[:, :c]
        logits = kind.get("score") == "logit" or (kind.get("score") != "prob" and bool(s.size)
                                                   and (s.min() < 0 or s.max() > 1))
        return anchor_boxes(s, t[:, c:], kind, logits)
    if kind.get("format", "yolox") == "yolox":
        return yolox_boxes(table, kind["input_hw"])
    if kind["format"] == "yolov10":
        return end2end_boxes(table)
    return yolo_boxes(table, kind["format"])


def detection_metrics(out: np.ndarray, ref: np.ndarray, kind: dict[str, Any]) -> dict[str, float]:
    """Per image, the boxes the head's post-processing keeps: ``box_match`` = boxes matched (same class,
    IoU >= 0.5) / boxes of the larger set, over all images (the lower of recall and precision, both
    reported: ``box_recall`` = matched / FP32's boxes, ``box_precision`` = matched / the artifact's);
    ``images_equal`` = images whose boxes all match one to one."""
    if ref.ndim < 3 or (kind.get("format", "yolox") == "yolox" and not kind.get("input_hw")) \
            or (kind.get("format") == "anchors" and "classes" not in kind):  # both outputs: anchor_detection_metrics
        return {}
    return _match_boxes([(_boxes_of(np.asarray(o), kind), _boxes_of(np.asarray(r), kind))
                         for o, r in zip(out, ref)], len(ref))


def _topk(out: np.ndarray, ref: np.ndarray, axis: int) -> dict[str, float]:
    """Top-1/top-5 agreement over the per-sample ``axis`` (samples stacked on axis 0)."""
    a = axis + 1 if axis >= 0 else ref.ndim + axis
    if not 1 <= a < ref.ndim or ref.shape[a] < 2:
        return {}
    o2 = np.moveaxis(out, a, -1).reshape(-1, ref.shape[a])
    r2 = np.moveaxis(ref, a, -1).reshape(-1, ref.shape[a])
    ref_top1 = np.argmax(r2, -1)
    m = {"top1": float(np.mean(np.argmax(o2, -1) == ref_top1)), "top1_n": float(len(ref_top1))}
    kk = min(5, r2.shape[-1])
    if kk > 1:
        topk = np.argsort(-o2, axis=-1)[:, :kk]
        m["top5_contains_ref_top1"] = float(np.mean(np.any(topk == ref_top1[:, None], -1)))
    return m


def ctc_metrics(out: np.ndarray, ref: np.ndarray, time_major: bool = False) -> dict[str, float]:
    """For a CTC recogniser's scores, stacked ``[N, 1, T, C]`` (batch-major) or ``[N, T, 1, C]``
    (time-major): the share of sequences whose greedy decoding (repeats merged, blanks dropped) is
    identical to the reference's (``seq_match``).

    Per-position top-1 misses what a reader sees: one position flipping between blank and a space
    merges two words ("Let usfirst") at 98% top-1. The blank is the reference's most frequent class
    (CTC outputs are mostly blank); outputs where no class dominates are not treated as CTC.
    """
    if ref.ndim != 4 or ref.shape[-1] < 2:
        return {}
    r, o = (np.swapaxes(ref, 1, 2), np.swapaxes(out, 1, 2)) if time_major else (ref, out)  # -> [N, B, T, C]
    if r.shape[2] < 4:
        return {}
    r_idx = np.argmax(r, -1).reshape(-1, r.shape[2])
    o_idx = np.argmax(o, -1).reshape(-1, r.shape[2])
    counts = np.bincount(r_idx.ravel(), minlength=ref.shape[-1])
    blank = int(np.argmax(counts))
    if counts[blank] < 0.3 * r_idx.size:
        return {}

    same = [ctc_decode(a, blank) == ctc_decode(b, blank) for a, b in zip(o_idx, r_idx)]
    return {"seq_match": float(np.mean(same)), "ctc_blank": float(blank), "sequences": float(len(same))}


def ctc_decode(seq: np.ndarray, blank: int) -> list[int]:
    """Greedy CTC decoding of one sequence of class indices: repeats merged, then the blank dropped."""
    seq = np.asarray(seq).ravel()
    if seq.size == 0:
        return []
    keep = np.concatenate([[True], seq[1:] != seq[:-1]]) & (seq != blank)
    return seq[keep].tolist()


def sequence_metrics(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """For a greedy decoder's step scores stacked ``[N, .., T, C]``: the share of samples whose argmax
    sequence over every step equals the reference's (``seq_match``; no merging, no blank)."""
    if ref.ndim < 3 or ref.shape[-1] < 2:
        return {}
    r = np.argmax(ref, -1).reshape(ref.shape[0], -1)
    o = np.argmax(out, -1).reshape(ref.shape[0], -1)
    same = np.all(r == o, axis=1)
    return {"seq_match": float(np.mean(same)), "sequences": float(len(same))}


def per_position_metrics(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """Per-position classes (tags, emissions, a per-frame classifier's frames): the argmax of the last axis at
    every position is a decision; ``flip_rate`` = positions whose argmax differs from FP32's, ``flips`` their
    count; ``windows_equal`` = samples with every position equal (reported)."""
    if ref.ndim < 2 or ref.shape[-1] < 2:
        return {}
    r, o = np.argmax(ref, -1), np.argmax(out, -1)
    flips = r != o
    return {"flip_rate": float(np.mean(flips)), "flips": float(np.sum(flips)), "positions": float(flips.size),
            "windows_equal": float(np.mean(~flips.reshape(len(ref), -1).any(1)))}


def probability_metrics(out: np.ndarray, ref: np.ndarray, threshold: Any) -> dict[str, float]:
    """Class probabilities an application thresholds (``probability@0.2``, or its bands ``probability@0.2/0.8``):
    a sample flips when any class's probability falls in another band than FP32's (for one threshold: on the
    other side of it); ``flip_rate`` = flipped samples / samples (``flips`` their count), ``max_abs_prob`` =
    the largest probability moved (judged by ``prob_delta_max``)."""
    if ref.ndim < 2:
        return {}
    ts = sorted(float(t) for t in threshold) if isinstance(threshold, (list, tuple)) else [float(threshold)]
    a = np.digitize(out, ts) != np.digitize(ref, ts)
    per = a.reshape(len(ref), -1).any(1)
    m = {"flip_rate": float(np.mean(per)), "flips": float(np.sum(per)), "threshold": ts[0],
         "max_abs_prob": float(np.max(np.abs(out.astype(np.float64) - ref))) if ref.size else 0.0}
    if len(ts) > 1:
        m["bands"] = float(len(ts) + 1)
    return m


def decision_metrics(out: np.ndarray, ref: np.ndarray, threshold: Any = None) -> dict[str, float]:
    """Per-position decisions: the share of positions on the other side of the threshold
    (0.5 for probabilities in [0, 1], 0 for logits), or in another band than FP32's for the application's
    thresholds (a list: ``--decision score=-1,1``)."""
    if isinstance(threshold, (list, tuple)) and len(threshold) > 1:
        ts = sorted(float(t) for t in threshold)
        flips = np.digitize(out, ts, right=True) != np.digitize(ref, ts, right=True)
        return {"flip_rate": float(np.mean(flips)) if ref.size else 0.0, "flips": float(np.sum(flips)),
                "threshold": ts[0], "bands": float(len(ts) + 1)}
    if isinstance(threshold, (list, tuple)):
        threshold = threshold[0]
    if threshold is None:
        threshold = 0.5 if (np.all(ref >= 0) and np.all(ref <= 1)) else 0.0
    flips = (out > threshold) != (ref > threshold)
    return {"flip_rate": float(np.mean(flips)) if ref.size else 0.0, "flips": float(np.sum(flips)),
            "threshold": float(threshold)}


def embedding_metrics(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """Cosine of each embedding vector (last axis) with the reference's: worst and mean."""
    o2 = out.reshape(-1, ref.shape[-1]).astype(np.float64)
    r2 = ref.reshape(-1, ref.shape[-1]).astype(np.float64)
    den = np.linalg.norm(o2, axis=-1) * np.linalg.norm(r2, axis=-1)
    cos = np.where(den > 0, np.sum(o2 * r2, -1) / np.where(den > 0, den, 1), 1.0)
    return {"vector_cosine_min": float(cos.min()), "vector_cosine_mean": float(cos.mean())}


# --- judging --------------------------------------------------------------------------------------

def judge(metrics: dict[str, float], tol: dict[str, float | None]) -> list[str]:
    """Reasons this tensor fails its bounds (empty when it passes); a bound of None is not judged.
    Each reason starts with the name of the metric that failed."""
    reasons = []
    if "shape_mismatch" in metrics:
        return ["shape differs from the reference"]
    if "non_finite" in metrics:
        if metrics.get("non_finite_as_ref") == 1.0:  # still refused: a deployment of NaN is no deployment
            return [f"non_finite: {metrics['non_finite']:.1%} of values are NaN/Inf, exactly where the FP32 model's "
                    "own are: the model makes them on this data, not the conversion"]
        return [f"non_finite: {metrics['non_finite']:.1%} of values are NaN/Inf"
                + (f" (the FP32 model's own: {metrics['ref_non_finite']:.1%}, elsewhere)" if "ref_non_finite" in metrics
                   else "")]
    if "label_output" in metrics:
        n, differ = int(metrics["top1_n"]), int(round((1.0 - metrics["top1"]) * metrics["top1_n"]))
        allowed = top1_allowed(n, tol["top1_min"]) if tol.get("top1_min") is not None else n
        if differ > allowed:
            reasons.append(f"labels: {n - differ}/{n} equal to FP32's ({metrics['top1']:.1%}) < "
                           f"{tol['top1_min']:.0%}: {differ} differ, at most {allowed} allowed")
        return reasons
    if "exact_match" in metrics:
        if metrics["exact_match"] < 1.0:
            reasons.append(f"exact_match: integer/bool output equal on {metrics['exact_match']:.1%} of elements only")
        return reasons
    if tol.get("rel_l2_max") is not None and metrics["rel_l2"] > tol["rel_l2_max"]:
        reasons.append(f"rel_l2 {metrics['rel_l2']:.3g} > {tol['rel_l2_max']:.3g}")
    if tol.get("cosine_min") is not None and metrics["cosine"] < tol["cosine_min"]:
        reasons.append(f"cosine {metrics['cosine']:.5f} < {tol['cosine_min']}")
    if (tol.get("cosine_min") is not None and "column_cosine_min" in metrics
            and metrics["column_cosine_min"] < tol["cosine_min"]):
        reasons.append(f"column_cosine_min: column {int(metrics['column_worst'])} (of a detector-like table) "
                       f"cosine {metrics['column_cosine_min']:.5f} < {tol['cosine_min']}")
    if tol.get("max_abs_norm_max") is not None and metrics["max_abs_norm"] > tol["max_abs_norm_max"]:
        reasons.append(f"max_abs_norm {metrics['max_abs_norm']:.3g} > {tol['max_abs_norm_max']:.3g}")
    if tol.get("top1_min") is not None and "top1" in metrics:
        reason = _top1_reason(metrics, tol["top1_min"])
        if reason:
            reasons.append(reason)
    if tol.get("seq_match_min") is not None and "seq_match" in metrics and metrics["seq_match"] < tol["seq_match_min"]:
        n = int(metrics.get("sequences", 0))
        what = "CTC decoding" if "ctc_blank" in metrics else "greedy decoding (every step)"
        reasons.append(f"seq_match: {what} equal on {metrics['seq_match']:.1%} of {n} sequences "
                       f"< {tol['seq_match_min']:.0%}")
    if tol.get("flip_rate_max") is not None and "flip_rate" in metrics and metrics["flip_rate"] > tol["flip_rate_max"]:
        if "positions" in metrics:
            what = (f"{int(metrics['flips'])} of {int(metrics['positions'])} positions changed class "
                    f"(argmax per position)")
        elif "max_abs_prob" in metrics and "bands" in metrics:
            what = (f"{int(metrics['flips'])} samples changed band ({int(metrics['bands'])} bands from "
                    f"{metrics['threshold']:g}; probabilities moved up to {metrics['max_abs_prob']:.3g})")
        elif "max_abs_prob" in metrics:
            what = (f"{int(metrics['flips'])} samples crossed the {metrics['threshold']:g} threshold "
                    f"(probabilities moved up to {metrics['max_abs_prob']:.3g})")
        else:
            what = f"{int(metrics['flips'])} decisions flipped"
        reasons.append(f"flip_rate: {what} ({metrics['flip_rate']:.2%}) > {tol['flip_rate_max']:.2%}")
    if tol.get("prob_delta_max") is not None and "max_abs_prob" in metrics \
            and metrics["max_abs_prob"] > tol["prob_delta_max"]:
        reasons.append(f"prob_delta: a probability moved by {metrics['max_abs_prob']:.3g} from FP32's "
                       f"> {tol['prob_delta_max']:g}")
    if tol.get("slice_rel_l2_max") is not None and "slice_rel_l2" in metrics \
            and metrics["slice_rel_l2"] > tol["slice_rel_l2_max"]:
        reasons.append(f"slice_rel_l2: index {int(metrics['slice_index'])} of axis {int(metrics['slice_axis'])} "
                       f"(a slice judged against its own scale) rel_l2 {metrics['slice_rel_l2']:.3g} > "
                       f"{tol['slice_rel_l2_max']:.3g}")
    if tol.get("slice_cosine_min") is not None and "slice_cosine" in metrics \
            and metrics["slice_cosine"] < tol["slice_cosine_min"]:
        reasons.append(f"slice_cosine: index {int(metrics['slice_cosine_index'])} of axis "
                       f"{int(metrics['slice_axis'])} cosine {metrics['slice_cosine']:.4f} < "
                       f"{tol['slice_cosine_min']:g}")
    if "px_bound" in metrics and metrics.get("elements"):
        n, over, bound = int(metrics["elements"]), int(metrics["over_px"]), metrics["px_bound"]
        allowed = top1_allowed(n, 1.0 - tol["px_share_max"]) if tol.get("px_share_max") is not None else n
        if over > allowed:
            reasons.append(f"px: {over} of {n} coordinates off by more than {bound:g} px "
                           f"({metrics['over_px_share']:.2%}), at most {allowed} allowed (worst {metrics['max_abs_px']:.3g} px)")
        if metrics["max_abs_px"] > PX_WORST * bound:
            reasons.append(f"px_worst: a coordinate off by {metrics['max_abs_px']:.3g} px > {PX_WORST * bound:g} px "
                           f"({PX_WORST:g} x the {bound:g}-px bound)")
    if (tol.get("vector_cosine_min") is not None and "vector_cosine_min" in metrics
            and metrics["vector_cosine_min"] < tol["vector_cosine_min"]):
        reasons.append(f"vector_cosine_min {metrics['vector_cosine_min']:.5f} < {tol['vector_cosine_min']}")
    if tol.get("box_match_min") is not None and "box_match" in metrics and metrics["box_match"] < tol["box_match_min"]:
        reasons.append(f"box_match: {metrics['box_match']:.1%} of {int(metrics['boxes'])} boxes matched by the "
                       f"same class at IoU >= 0.5 < {tol['box_match_min']:.0%}")
    return reasons


def task_agreement(metrics: dict[str, float]) -> float:
    """What a user of the output's task sees agree with FP32, as one share (1.0: nothing differs): the
    worst of top-1 agreement, sequences decoded equal, boxes matched, decisions not flipped and
    per-vector cosine, of those the output's kind measured; 1.0 when it measured none (a dense map)."""
    shares = [metrics[k] for k in ("top1", "seq_match", "box_match", "vector_cosine_min", "exact_match")
              if k in metrics]
    if "flip_rate" in metrics:
        shares.append(1.0 - metrics["flip_rate"])
    return float(min(shares, default=1.0))


def top1_allowed(n: int, top1_min: float) -> int:
    """Decisions of ``n`` that may differ under ``top1_min``: the bound applied to a count, rounded to the
    nearest sample (half up), so it is never stricter than half a sample's step. 8 samples at 90%: 1;
    32 at 90%: 3; 8 at 99% (fp32): 0."""
    return int(math.floor(n * (1.0 - top1_min) + 0.5 + 1e-9))


def top1_floor(n: int, top1_min: float) -> float:
    """The agreement share that passes ``top1_min`` on ``n`` decisions (``1 - allowed/n``)."""
    return 1.0 - top1_allowed(n, top1_min) / n if n > 0 else top1_min


def _top1_reason(metrics: dict[str, float], top1_min: float) -> str | None:
    top1, n = metrics["top1"], int(metrics.get("top1_n") or 0)
    if not n:  # figures from before n was recorded: the plain share
        return f"top1 agreement {top1:.1%} < {top1_min:.0%}" if top1 < top1_min else None
    differ = int(round((1.0 - top1) * n))
    allowed = top1_allowed(n, top1_min)
    if differ <= allowed:
        return None
    return (f"top1 agreement {top1:.1%} ({n - differ}/{n}) < {top1_min:.0%}: {differ} of {n} decisions differ, "
            f"at most {allowed} allowed")


# --- batches of distinct samples (``build --batch B``) ----------------------------------------------

def batch_rows(source: dict[str, Any] | None, which: str = "validation") -> list[int] | None:
    """How many rows of each stacked feed are distinct samples, for a set built at ``build --batch B``
    (``source``: the manifest's ``validation.source``): B samples to a feed, the last feed filled up with
    repeats of the first ones, which count once; None for a batch-1 set (or one from before batches were
    filled with distinct samples: each feed is one sample)."""
    src = source or {}
    b, n = src.get("batch"), src.get(f"{which}_samples")
    if not isinstance(b, int) or b < 2 or not isinstance(n, int) or n < 1:
        return None
    return [min(b, n - i) for i in range(0, n, b)]


def unbatch(arrays: dict[str, np.ndarray], rows: list[int] | None) -> dict[str, np.ndarray]:
    """Stacked batch feeds ``[S, B, ...]`` -> one row per distinct sample ``[N, 1, ...]`` (the repeats that
    fill the last batch dropped): what the batch-1 model gives on the same samples, so a batch-B artifact is
    judged, and counted, as the batch-1 one is.  An array without that batch axis is kept as it is."""
    if not rows:
        return dict(arrays)
    out = {}
    for name, a in arrays.items():
        a = np.asarray(a)
        if a.ndim >= 2 and a.shape[0] == len(rows) and a.shape[1] >= max(rows) > 0:
            out[name] = np.concatenate([a[i, :r] for i, r in enumerate(rows)])[:, None]
        else:
            out[name] = a
    return out


def compare_outputs(
    outputs: dict[str, np.ndarray],
    reference: dict[str, np.ndarray],
    precision: str,
    override: dict[str, float] | None = None,
    kinds: dict[str, Any] | None = None,
    rows: list[int] | None = None,
) -> dict[str, Any]:
    """Compare every output; ``{"passed", "tolerance", "outputs": {name: {kind, metrics, passed,
    reasons, failed}}, "summary"}``.  ``kinds``: the manifest's ``output_kinds`` (inferred from the
    data where an output has none).  ``rows``: the distinct samples of each batch feed (``batch_rows``):
    outputs and reference are compared sample by sample (``unbatch``), so every count is of distinct
    samples, and ``samples`` says how many."""
    if rows:
        outputs, reference = unbatch(outputs, rows), unbatch(reference, rows)
    tol = tolerance_for(precision, override)
    per: dict[str, Any] = {}
    refs = {name: np.asarray(ref) for name, ref in reference.items()}
    given = {name: parse_kind((kinds or {}).get(name)) for name in refs}
    guessed = infer_kinds({n: r for n, r in refs.items() if given[n] is None}) if None in given.values() else {}
    floor = SLICE_FLOOR.get(precision, SLICE_FLOOR["int8"])
    heads = _anchor_heads(outputs, refs, {n: given[n] or guessed[n] for n in refs})
    for name, ref in refs.items():
        kind = given[name] or guessed[name]
        if name not in outputs:
            per[name] = {"passed": False, "reasons": ["output missing"], "metrics": {}, "kind": kind["kind"],
                         "failed": ["missing"]}
            continue
        out = np.asarray(outputs[name])
        head = heads.get(name)
        kind = (head or {}).get("kind", kind)
        gate = _gated(kind, out, ref, refs, given[kind["when"]] or guessed.get(kind["when"]) if
                      kind.get("when") in refs else None)
        if gate is not None:  # judged where the model's own decision uses it: FP32's positive samples
            head = {"view": (out[gate], ref[gate]), "metrics": {"samples_judged": float(gate.sum()),
                                                                "samples_of": float(len(gate))}}
        if head is not None:  # an anchor head's output: its tensor figures over the anchors that matter
            o_v, r_v = head["view"]
            metrics = tensor_metrics(o_v, r_v, "regression")
            metrics.update(head["metrics"])
        else:
            metrics = tensor_metrics(out, ref, kind)
        if "cosine" in metrics and head is None:  # a float output: also per slice, whatever its kind
            metrics.update(slice_metrics(*judged_view(out, ref, kind), floor))
        unit = _px_view(kind, ref)
        if unit is not None and "cosine" in metrics:
            # an anchor head's boxes are judged by box_match (IoU >= 0.5, as the YOLO heads are); their pixels only
            # against a bound the user gave (detection@anchors:...:px=N), else reported
            bound = kind.get("px") or (None if kind.get("anchors_of") else tol.get("px_max"))
            o_v, r_v = head["view"] if head is not None else (out, ref)
            diff = (np.asarray(o_v, np.float64) - np.asarray(r_v, np.float64)) * unit
            metrics.update(px_metrics(diff, float(bound)) if bound else
                           {k: v for k, v in px_metrics(diff, 1.0).items() if not k.startswith(("over_px", "px_"))})
        reasons = judge(metrics, tol)
        if (head or {}).get("error"):
            reasons.insert(0, f"anchors: {head['error']}")
        per[name] = {"passed": not reasons, "reasons": reasons, "metrics": metrics, "kind": kind["kind"],
                     "failed": [r.split(":")[0].split(" ")[0] for r in reasons]}
    result = {"passed": all(v["passed"] for v in per.values()), "precision": precision, "tolerance": tol,
              "outputs": per}
    if rows:
        result["samples"] = int(sum(rows))
    result["summary"] = summary_line(result)
    return result


def _gated(kind: dict[str, Any], out: np.ndarray, ref: np.ndarray, refs: dict[str, np.ndarray],
           flag_kind: dict[str, Any] | None) -> np.ndarray | None:
    """The samples a ``regression`` with ``when=FLAG`` is judged on: those whose FP32 ``FLAG`` (one value per
    sample) is above its threshold (0 for a logit, 0.5 for a probability, the kind's own where it has one)."""
    flag = refs.get(kind.get("when")) if kind.get("when") else None
    if flag is None or kind.get("kind") != "regression" or out.shape != ref.shape or flag.size != len(ref) \
            or not len(ref):
        return None
    f = np.asarray(flag, np.float64).reshape(len(ref))
    thr = (flag_kind or {}).get("threshold")
    if thr is None:
        thr = 0.5 if (f.min() >= 0 and f.max() <= 1) else 0.0
    return f > float(thr)


def _anchor_heads(outputs: dict[str, Any], refs: dict[str, np.ndarray], kinds: dict[str, dict[str, Any]]
                  ) -> dict[str, dict[str, Any]]:
    """For each ``detection@anchors`` output and the ``boxes`` output it names: the head's detection figures
    (on the scores output) and what the tensor figures are taken over -- the detections both sides keep and
    match: their probabilities, and their corners and keypoints decoded in input pixels (judged in pixels:
    ``px_max``), not the regressors of every anchor, most of them background."""
    heads: dict[str, dict[str, Any]] = {}
    for name, kind in kinds.items():
        if kind.get("kind") != "detection" or kind.get("format") != "anchors":
            continue
        bname = kind.get("boxes")
        if name not in outputs or bname not in outputs or bname not in refs:
            continue
        os_, rs_ = np.asarray(outputs[name]), refs[name]
        ob, rb = np.asarray(outputs[bname]), refs[bname]
        if os_.shape != rs_.shape or ob.shape != rb.shape or not np.all(np.isfinite(os_.astype(np.float64))) \
                or not np.all(np.isfinite(ob.astype(np.float64))):
            continue  # the plain figures say shape_mismatch / non_finite
        try:
            m, (po, pr, do, dr) = anchor_detection_metrics(os_, rs_, ob, rb, kind)
        except ValueError as exc:  # anchors that do not fit the outputs: said on the output, judged as failed
            heads[name] = {"view": (os_.reshape(-1), rs_.reshape(-1)), "metrics": {}, "error": str(exc)}
            continue
        heads[name] = {"view": (po, pr), "metrics": m}
        heads[bname] = {"view": (do, dr), "metrics": {"detections_compared": m["detections_compared"]},
                        "kind": {"kind": "regression", "anchors_of": name,
                                 **({"px": kind["px"]} if kind.get("px") else {})}}
    return heads


_SHOWN = (("cosine", "cos {:.4f}"), ("top1", "top1 {}"), ("seq_match", "{} {:.0%}"),
          ("flip_rate", "flips {:.2%}"), ("vector_cosine_min", "vec-cos {:.4f}"), ("box_match", "boxes {:.0%}"),
          ("exact_match", "exact {:.0%}"), ("max_abs_px", "max Δ {:.3g} px"))


def _shown(key: str, fmt: str, m: dict[str, float]) -> str:
    if key == "top1":
        return ("labels {}" if m.get("label_output") else fmt).format(top1_text(m))
    if key == "seq_match":
        return fmt.format(seq_label(m), m[key])
    if key == "max_abs_px" and m.get("elements") and "px_bound" in m:
        on = f" on {int(m['samples_judged'])} of {int(m['samples_of'])} samples" if "samples_of" in m else ""
        return fmt.format(m[key]) + f" ({int(m['over_px'])} of {int(m['elements'])} > {m['px_bound']:g} px{on})"
    if key == "max_abs_px" and m.get("elements"):
        return fmt.format(m[key]) + f" ({int(m.get('over_1px', 0))} of {int(m['elements'])} > 1 px)"
    return fmt.format(m[key])


def seq_label(m: dict[str, float]) -> str:
    """How ``seq_match`` is shown: ``ctc-decode`` for a CTC output, ``seq-equal`` for a greedy decoder's."""
    return "ctc-decode" if "ctc_blank" in m else "seq-equal"


def top1_text(m: dict[str, float]) -> str:
    """``100% (8/8)``: the agreement with the count it stands on (``97%`` when n was not recorded)."""
    n = int(m.get("top1_n") or 0)
    return f"{m['top1']:.0%}" + (f" ({int(round(m['top1'] * n))}/{n})" if n else "")


def summary_line(result: dict[str, Any], limit: int = 2) -> str:
    """One line for a comparison: ``passed (y: cos 0.9990 top1 98%)`` or ``FAILED (y: rel_l2 0.31 >
    0.25)`` — a failed output shows the reasons (the metric that failed), a passing one its figures."""
    parts = []
    outs = result.get("outputs") or {}
    ordered = sorted(outs.items(), key=lambda kv: kv[1].get("passed", True))  # failures first
    for name, o in ordered[:limit]:
        if o.get("passed"):
            m = o.get("metrics", {})
            bits = [_shown(k, fmt, m) for k, fmt in _SHOWN if k in m and m[k] == m[k]]
            parts.append(f"{name}: " + " ".join(bits))
        else:
            parts.append(f"{name}: " + "; ".join(o.get("reasons") or ["failed"]))
    head = "passed" if result.get("passed") else "FAILED"
    more = " …" if len(outs) > limit else ""
    return head + (" (" + "; ".join(parts) + more + ")" if parts else "")
