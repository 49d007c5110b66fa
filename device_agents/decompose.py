"""Where one request's time goes, on the device: stages and the runtime's own per-op profile.

Stages of one end-to-end request (each timed here, on the device):
- ``preprocess``: the manifest's declared image preprocessing (resize to the input's H x W with
  bilinear interpolation, scale, mean/std, layout) in numpy on a 640 x 480 camera-sized frame (a
  fixed synthetic frame: the agent carries no images), or "not declared" for non-image data;
- ``copy in`` / ``copy out``: host-device copies where the runner does them (the TensorRT runner
  times H2D and D2H itself); CPU runtimes read and write host memory, reported as 0 with that reason;
- ``compute``: the bench's p50 (minus the copies where they are separate);
- ``postprocess``: what the output kind implies (classification: argmax + top-5; CTC: greedy
  decoding; decisions: threshold), in numpy on the run's real output.

Per op: the runtime's own profiler on a second, profiled instance (ONNX Runtime ``enable_profiling``,
OpenVINO ``PERF_COUNT``), aggregated by op type and the top nodes, with the profiler's overhead
(profiled wall time per run against the unprofiled p50). Standard library + numpy only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

TOP_NODES = 10


def _timeit(fn: Callable[[], Any], reps: int = 30) -> float:
    """Median ms of ``reps`` calls."""
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return float(np.median(out))


def resize_bilinear(img: np.ndarray, h: int, w: int) -> np.ndarray:
    """[H, W, C] -> [h, w, C], bilinear (half-pixel centres), numpy only."""
    H, W = img.shape[:2]
    ys = np.clip((np.arange(h) + 0.5) * H / h - 0.5, 0, H - 1)
    xs = np.clip((np.arange(w) + 0.5) * W / w - 0.5, 0, W - 1)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, H - 1), np.minimum(x0 + 1, W - 1)
    wy, wx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    f = img.astype(np.float32)
    top = f[y0][:, x0] * (1 - wx) + f[y0][:, x1] * wx
    bottom = f[y1][:, x0] * (1 - wx) + f[y1][:, x1] * wx
    return top * (1 - wy) + bottom * wy


def _preprocess_stage(manifest: dict[str, Any]) -> dict[str, Any]:
    src = (manifest.get("validation") or {}).get("source") or {}
    pre = src.get("preprocess")
    inputs = manifest["io"]["inputs"]
    if not pre or len(inputs) != 1 or len(inputs[0].get("shape") or []) != 4:
        return {"stage": "preprocess", "ms": None, "how": "not declared (the bundle's data is not images)"}
    n, a, b, c = inputs[0]["shape"]
    nchw = pre.get("layout", "nchw") == "nchw"
    ch, h, w = (a, b, c) if nchw else (c, a, b)
    frame = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    mean = np.asarray(pre.get("mean") or [0.0], np.float32)[:ch]
    std = np.asarray(pre.get("std") or [1.0], np.float32)[:ch]
    scale = float(pre.get("scale") or 1.0)

    def run() -> np.ndarray:
        img = frame.mean(axis=2, keepdims=True) if ch == 1 else frame
        if pre.get("order") == "bgr":
            img = img[..., ::-1]
        x = (resize_bilinear(img, h, w) * scale - mean) / std
        return np.ascontiguousarray(x.transpose(2, 0, 1)[None] if nchw else x[None], dtype=np.float32)

    return {"stage": "preprocess", "ms": _timeit(run, 20),
            "how": f"numpy: a synthetic 640x480 uint8 frame (the cost does not depend on the pixels) -> "
                   f"bilinear {h}x{w}, scale, mean/std, {pre.get('layout', 'nchw')}"}


def _postprocess_stage(manifest: dict[str, Any], output: dict[str, np.ndarray]) -> dict[str, Any]:
    from .compare import infer_kind, parse_kind

    kinds = manifest.get("output_kinds") or {}
    jobs, what = [], []
    for spec in manifest["io"]["outputs"]:
        a = np.asarray(output.get(spec["name"]))
        if a.dtype.kind != "f" or a.size == 0:
            continue
        kind = parse_kind(kinds.get(spec["name"])) or infer_kind(spec["name"], a[None])
        k = kind.get("kind")
        if k == "classification":
            axis = int(kind.get("axis", -1))
            jobs.append(lambda a=a, axis=axis: (np.argmax(a, axis=axis),
                                                np.argpartition(-a, min(4, a.shape[axis] - 1), axis=axis)))
            what.append(f"{spec['name']}: argmax + top-5")
        elif k in ("ctc_batch_major", "ctc_time_major"):
            def decode(a=a, tm=k == "ctc_time_major") -> list[list[int]]:
                idx = np.argmax(np.swapaxes(a, 0, 1) if tm else a, axis=-1).reshape(-1, a.shape[-2])
                return [s[np.concatenate([[True], s[1:] != s[:-1]]) & (s != 0)].tolist() for s in idx]
            jobs.append(decode)
            what.append(f"{spec['name']}: CTC greedy decoding")
        elif k == "decision":
            thr = float(kind.get("threshold", 0.5))
            jobs.append(lambda a=a, t=thr: a > t)
            what.append(f"{spec['name']}: threshold")
        elif k == "detection" and (kind.get("input_hw") or kind.get("format", "yolox") != "yolox"):
            from .compare import _boxes_of

            fmt = kind.get("format", "yolox")
            jobs.append(lambda a=a, kind=kind: _boxes_of(a, kind))
            what.append(f"{spec['name']}: " + {"yolox": "YOLOX grid decoding + NMS", "yolov10": "end-to-end rows: "
                                               "score threshold"}.get(fmt, f"{fmt} box decoding + NMS"))
    if not jobs:
        return {"stage": "postprocess", "ms": None, "how": "none declared for these output kinds"}
    return {"stage": "postprocess", "ms": _timeit(lambda: [j() for j in jobs], 50), "how": "; ".join(what)}


def decompose(runner, manifest: dict[str, Any], feeds: list[dict[str, np.ndarray]], first: dict[str, Any],
              p50_ms: float, iterations: int = 20) -> dict[str, Any]:
    """The stages of one request and the per-op profile (see the module's docstring)."""
    from .bundle import from_artifact

    info = runner.info()
    timed = info.get("timings_ms") or {}  # runners that time their copies themselves (TensorRT: CUDA events)
    h2d, d2h = ((timed.get(k) or {}).get("p50") for k in ("h2d", "d2h"))
    copy_how = "timed by the runner" if h2d is not None else "host memory (CPU runtime): no copy"
    stages = [_preprocess_stage(manifest),
              {"stage": "copy in", "ms": h2d if h2d is not None else 0.0, "how": copy_how},
              {"stage": "compute", "ms": p50_ms - (h2d or 0.0) - (d2h or 0.0), "how": "bench p50"},
              {"stage": "copy out", "ms": d2h if d2h is not None else 0.0, "how": copy_how},
              _postprocess_stage(manifest, from_artifact(first, manifest["io"]["outputs"]))]
    out: dict[str, Any] = {"stages": stages}
    try:
        prof = runner.profile(feeds, iterations)
    except Exception as exc:  # noqa: BLE001 - a profiler failure must not lose the bench
        prof = {"available": False, "why": f"{type(exc).__name__}: {exc}"[:300]}
    if prof.get("available") is False:
        out["profile"] = prof
        return out
    nodes = sorted(prof["nodes"], key=lambda n: -n["ms"])
    total = sum(n["ms"] for n in nodes) or 1e-12
    by_op: dict[str, float] = {}
    for n in nodes:
        by_op[n["op"]] = by_op.get(n["op"], 0.0) + n["ms"]
    out["profile"] = {
        "profiler": prof["profiler"], "iterations": prof["iterations"], "nodes_total_ms": total,
        "ops": [{"op": k, "ms": v, "share": v / total} for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])],
        "top_nodes": [{**n, "share": n["ms"] / total} for n in nodes[:TOP_NODES]],
        # the profiled instance's mean wall time per run against the unprofiled p50
        "profiled_wall_ms_per_run": prof.get("wall_ms"),
        "overhead_vs_p50": (prof["wall_ms"] / p50_ms - 1.0) if p50_ms and prof.get("wall_ms") else None,
    }
    return out
