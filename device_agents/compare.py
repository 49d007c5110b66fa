"""Precision-aware comparison of a runtime's outputs with the FP32 reference.

Shared by the host check (edgeopt build) and the agent's bench, so that a bundle is judged by
the same rule on the host and on the device.  Standard library + numpy only.

A flat ``allclose(atol=1e-5)`` is wrong for reduced precision: FP16 keeps ~3 decimal digits, INT8
quantisation noise is a few percent of a tensor's range.  So each precision has bounds on
*scale-free* metrics (see docs/TOLERANCES.md):

- ``rel_l2``  = ||y - r|| / ||r||        (relative error of the whole tensor)
- ``cosine``  = <y, r> / (||y|| ||r||)   (direction kept)
- ``max_abs_norm`` = max|y - r| / max|r| (worst element, normalised by the tensor's range)
- ``topk``    = top-1 / top-5 agreement along the last axis for classifier-like outputs
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

# Bounds per precision. A metric passes when rel_l2 <= rel_l2_max and cosine >= cosine_min and
# max_abs_norm <= max_abs_norm_max (and top1 >= top1_min where a top-k metric applies).
TOLERANCES: dict[str, dict[str, float | None]] = {
    "fp32": {"rel_l2_max": 1e-3, "cosine_min": 0.99999, "max_abs_norm_max": 1e-2, "top1_min": 0.99, "seq_match_min": None},
    # Reduced precisions: no worst-element bound. On a saturating map (a detector's sigmoid) one pixel that
    # crosses the knee moves by ~the whole range while the map as a whole is kept; rel_l2, cosine
    # and top-1 judge the tensor, and task-level checks (OCR) judge what the user sees. Seen with FP16
    # too: PP-OCR det and openwakeword's log-mel at cosine 0.9999 failed a 0.1 worst-element bound.
    "fp16": {"rel_l2_max": 2e-2, "cosine_min": 0.9995, "max_abs_norm_max": None, "top1_min": 0.95, "seq_match_min": None},
    "int8": {"rel_l2_max": 0.25, "cosine_min": 0.97, "max_abs_norm_max": None, "top1_min": 0.90, "seq_match_min": None},
    "fp8": {"rel_l2_max": 0.25, "cosine_min": 0.97, "max_abs_norm_max": None, "top1_min": 0.90, "seq_match_min": None},
}


def tolerance_for(precision: str, override: dict[str, float] | None = None) -> dict[str, float | None]:
    """The bounds for a precision, with any user override applied."""
    tol = dict(TOLERANCES.get(precision, TOLERANCES["int8"]))
    if override:
        tol.update({k: (None if v is None else float(v)) for k, v in override.items() if k in tol})
    return tol


def _is_classifier_like(ref: np.ndarray) -> bool:
    """Scores over classes: [batch, classes] logits/probabilities, or [batch, steps, classes]
    probabilities (rows summing to 1, e.g. a CTC recogniser). Recurrent states and feature maps are not."""
    if ref.dtype.kind != "f" or ref.ndim < 2 or not 2 <= ref.shape[-1] <= 100_000:
        return False
    per_sample = ref.shape[1:]  # axis 0 stacks the validation samples
    if len(per_sample) == 2 and per_sample[0] == 1:
        return True  # [1, classes] per sample
    if len(per_sample) == 3 and per_sample[0] == 1 and per_sample[1] <= 512:
        rows = ref.reshape(-1, ref.shape[-1])
        return bool(np.all(rows >= 0) and np.allclose(rows.sum(-1), 1.0, atol=1e-3))
    return False


def tensor_metrics(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """Scale-free error metrics of one output tensor (all samples stacked on axis 0)."""
    if out.shape != ref.shape:
        return {"shape_mismatch": 1.0}
    if ref.dtype.kind in "biu" or out.dtype.kind in "biu":
        equal = float(np.mean(out == ref)) if ref.size else 1.0
        return {"exact_match": equal}
    y = out.astype(np.float64).ravel()
    r = ref.astype(np.float64).ravel()
    if not np.all(np.isfinite(y)):
        return {"non_finite": float(np.mean(~np.isfinite(y)))}
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
    if _is_classifier_like(ref):
        o2 = out.reshape(-1, out.shape[-1])
        r2 = ref.reshape(-1, ref.shape[-1])
        m["top1"] = float(np.mean(np.argmax(o2, -1) == np.argmax(r2, -1)))
        k = min(5, r2.shape[-1])
        if k > 1:
            ref_top1 = np.argmax(r2, -1)
            topk = np.argsort(-o2, axis=-1)[:, :k]
            m["top5_contains_ref_top1"] = float(np.mean([t in row for t, row in zip(ref_top1, topk)]))
        m.update(ctc_metrics(out, ref))
    return m


def ctc_metrics(out: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """For a CTC recogniser's [N, 1, steps, classes] probabilities: the share of samples whose greedy
    decoding (repeats merged, blanks dropped) is identical to the reference's (``seq_match``).

    Per-position top-1 misses what a reader sees: one position flipping between blank and a space
    merges two words ("Let usfirst") at 98% top-1. The blank is the reference's most frequent class
    (CTC outputs are mostly blank); outputs where no class dominates are not treated as CTC.
    """
    if ref.ndim != 4 or ref.shape[1] != 1 or ref.shape[2] < 4:
        return {}
    r_idx, o_idx = np.argmax(ref[:, 0], -1), np.argmax(out[:, 0], -1)
    counts = np.bincount(r_idx.ravel(), minlength=ref.shape[-1])
    blank = int(np.argmax(counts))
    if counts[blank] < 0.3 * r_idx.size:
        return {}

    def decode(seq: np.ndarray) -> list[int]:
        keep = np.concatenate([[True], seq[1:] != seq[:-1]]) & (seq != blank)
        return seq[keep].tolist()

    same = [decode(a) == decode(b) for a, b in zip(o_idx, r_idx)]
    return {"seq_match": float(np.mean(same)), "ctc_blank": float(blank)}


def judge(metrics: dict[str, float], tol: dict[str, float | None]) -> list[str]:
    """Reasons this tensor fails its bounds (empty when it passes); a bound of None is not judged."""
    reasons = []
    if "shape_mismatch" in metrics:
        return ["shape differs from the reference"]
    if "non_finite" in metrics:
        return [f"{metrics['non_finite']:.1%} of values are NaN/Inf"]
    if "exact_match" in metrics:
        if metrics["exact_match"] < 1.0:
            reasons.append(f"integer output equal on {metrics['exact_match']:.1%} of elements only")
        return reasons
    if metrics["rel_l2"] > tol["rel_l2_max"]:
        reasons.append(f"rel_l2 {metrics['rel_l2']:.3g} > {tol['rel_l2_max']:.3g}")
    if metrics["cosine"] < tol["cosine_min"]:
        reasons.append(f"cosine {metrics['cosine']:.5f} < {tol['cosine_min']}")
    if tol["max_abs_norm_max"] is not None and metrics["max_abs_norm"] > tol["max_abs_norm_max"]:
        reasons.append(f"max_abs_norm {metrics['max_abs_norm']:.3g} > {tol['max_abs_norm_max']:.3g}")
    if "top1" in metrics and metrics["top1"] < tol["top1_min"]:
        reasons.append(f"top-1 agreement {metrics['top1']:.1%} < {tol['top1_min']:.0%}")
    if tol.get("seq_match_min") is not None and "seq_match" in metrics and metrics["seq_match"] < tol["seq_match_min"]:
        reasons.append(f"CTC decoding equal on {metrics['seq_match']:.1%} of samples < {tol['seq_match_min']:.0%}")
    return reasons


def compare_outputs(
    outputs: dict[str, np.ndarray],
    reference: dict[str, np.ndarray],
    precision: str,
    override: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Compare every output; ``{"passed", "tolerance", "outputs": {name: {metrics, passed, reasons}}}``."""
    tol = tolerance_for(precision, override)
    per: dict[str, Any] = {}
    for name, ref in reference.items():
        if name not in outputs:
            per[name] = {"passed": False, "reasons": ["output missing"], "metrics": {}}
            continue
        metrics = tensor_metrics(np.asarray(outputs[name]), np.asarray(ref))
        reasons = judge(metrics, tol)
        per[name] = {"passed": not reasons, "reasons": reasons, "metrics": metrics}
    return {"passed": all(v["passed"] for v in per.values()), "precision": precision, "tolerance": tol,
            "outputs": per}
