"""Does the INT8 check tell a good variant from a bad one? 8 held-out samples vs the k-fold cross-check.

    .venv/bin/python bench/bench_crosscheck.py [--splits 20] [--models imagenet,ocr-cls]

For each model, a few fixed ONNX Runtime INT8 recipes (``OrtSettings``) are judged the way the cpu INT8
search judges a variant, on many random draws of the data a user would have (27 samples: 19 calibrate,
8 held out):

- **held out (8)**: the variant calibrated on the 19 and judged on the 8 (the check before issue 13 part 3);
- **cross-check (27)**: ``QdqSearch.cross_check``: the 27 pooled, 4 folds, the recipe calibrated on three
  and run on the fourth, the out-of-fold outputs of all 27 judged by the same rule.

The "truth" of a recipe is its top-1 agreement with FP32 over the whole population (every sample the
model has, the recipe calibrated on a fixed half of them); a recipe whose truth is below the INT8 bound
(90%) should be refused, one above it shipped. Writes the `crosscheck` section of docs/BENCHMARKS.md.

Data: EfficientNet-Lite0 (``bench/imagenet_cnn.py``: 24 real photos, 64 views; views of one photo are
correlated, so the population is smaller than 64 independent images) and PP-OCR cls (the fixture's
text lines found in skimage's page and photos, ``bench/build_fixtures.py``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, machine, md_table, stamp, write_section  # noqa: E402

N_POOL, N_VAL = 27, 8
NOTES = """Reading (lead's notes, 2026-11-23): the check that decides on 8 held-out samples passed a recipe
whose agreement over all 64 samples is 82.8% (EfficientNet-Lite0, min-max per-channel U8S8) in 9 of 16
draws; with the cross-check it passed 0 of 16. A recipe at 93.8% (PP-OCR cls per-channel) passed 15 of
16 either way. The cost is on recipes just above the bound: PP-OCR cls per-tensor at 95.3% passed 12 of
16 on the held-out 8 and 10 of 16 with the cross-check (the out-of-fold variants are calibrated on 20
samples, the truth's on 32). The population is 64 samples (views of 24 photos; text lines of a few
pages), so "truth" is itself an estimate. The cross-check costs four calibrations: ~3 s on PP-OCR cls,
~20 s on EfficientNet-Lite0 here (loaded)."""
RECIPES = [("minmax", True, "uint8"), ("minmax", False, "uint8"), ("minmax", False, "int8")]


def population(name: str, work: Path) -> tuple[Path, list[dict[str, np.ndarray]]] | None:
    """(float model, every sample) or None when the model cannot be had here."""
    if name == "imagenet":
        try:
            import imagenet_cnn

            model, npz = imagenet_cnn.efficientnet_lite0(work)
        except Exception as exc:  # noqa: BLE001 - no torch wheel / no PyPI: say so, skip
            print(f"imagenet skipped: {exc}")
            return None
        with np.load(npz) as data:
            key = next(k for k in data.files)
            arr = data[key]
        return Path(model), [{key: _one(arr, i)} for i in range(len(arr))]
    if name == "ocr-cls":
        from build_fixtures import prepare_data

        from edgeopt.fixtures import path

        _, calib = prepare_data(work)["ocr-cls"]
        with np.load(calib) as data:
            key = next(k for k in data.files)
            arr = data[key]
        return path("ocr-cls"), [{key: _one(arr, i)} for i in range(len(arr))]
    raise SystemExit(f"unknown model {name!r}")


def _one(arr: np.ndarray, i: int) -> np.ndarray:
    """Sample ``i`` of a stacked array, with its batch axis of 1."""
    return (arr[i] if arr.ndim == 5 else arr[i:i + 1]).astype(np.float32)


def prepared(model: Path, work: Path) -> Path:
    """The model after ORT's quant_pre_process, as the cpu INT8 build quantizes it."""
    from edgeopt.targets.onnxruntime.int8 import preprocess

    pre = work / "pre.onnx"
    if not pre.exists():
        preprocess(str(model), pre, [])
    return pre


def judge(pre: Path, recipe: tuple, calib: list, val: list, work: Path) -> tuple[bool, bool | None, float, float]:
    """(passes 8 held out, passes the cross-check, held-out top-1, cross-check top-1) of one draw."""
    import onnxruntime as ort

    from edgeopt.targets.onnxruntime.int8 import OrtBackend, OrtSettings
    from edgeopt.targets.onnxruntime.quant import run_all
    from edgeopt.targets.qdq_search import QdqSearch

    work.mkdir(parents=True, exist_ok=True)
    names = [o.name for o in ort.InferenceSession(str(pre), providers=["CPUExecutionProvider"]).get_outputs()]
    backend = OrtBackend(ort, pre, calib, work, lambda s: None)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = run_all(ort.InferenceSession(str(pre), so, providers=["CPUExecutionProvider"]), val, names)
    search = QdqSearch(backend, val=val, calib=calib, reference=ref, mode="quick", budget_s=600, work=work)
    method, per_channel, act = recipe
    v = search.try_variant(OrtSettings(method, per_channel, act), "grid")
    cc = search.cross_check(v)
    top = min(m.get("top1", 1.0) for m in v.outputs.values()) if v.outputs else 0.0
    cc_top = min(m.get("top1", 1.0) for m in cc["metrics"].values()) if cc else float("nan")
    return v.passed, (cc["passed"] if cc else None), top, cc_top


def truth(pre: Path, recipe: tuple, samples: list, work: Path) -> float:
    """Top-1 agreement with FP32 over the whole population, calibrated on its even-indexed half."""
    import onnxruntime as ort

    from edgeopt.targets.onnxruntime.int8 import OrtBackend, OrtSettings
    from edgeopt.targets.onnxruntime.quant import run_all

    backend = OrtBackend(ort, pre, samples[::2], work, lambda s: None)
    path = work / "truth.onnx"
    backend.make(OrtSettings(*recipe), path)
    names = [o.name for o in ort.InferenceSession(str(pre), providers=["CPUExecutionProvider"]).get_outputs()]
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = run_all(ort.InferenceSession(str(pre), so, providers=["CPUExecutionProvider"]), samples, names)
    got = run_all(backend.session(path), samples, names)
    a, b = got[names[0]], ref[names[0]]
    return float(np.mean(a.reshape(len(samples), -1).argmax(1) == b.reshape(len(samples), -1).argmax(1)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", type=int, default=20)
    ap.add_argument("--models", default="imagenet,ocr-cls")
    args = ap.parse_args()
    when = f"Measured {stamp()} on {machine()}; {load()} at the start"
    rows = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        work = Path(tempfile.mkdtemp(prefix=f"edgeopt-bench-cc-{name}-"))
        got = population(name, work)
        if got is None:
            rows.append({"model": name, "recipe": "skipped (see the log)"})
            continue
        model, samples = got
        pre = prepared(model, work)
        rng = np.random.default_rng(0)
        for recipe in RECIPES:
            from edgeopt.targets.onnxruntime.int8 import OrtSettings

            label = OrtSettings(*recipe).label()
            t0 = time.perf_counter()
            true_top1 = truth(pre, recipe, samples, work)
            held, cross, tops, cc_tops = 0, 0, [], []
            for k in range(args.splits):
                pick = rng.permutation(len(samples))[:N_POOL]
                draw = [samples[i] for i in pick]
                ok, cc, top, cc_top = judge(pre, recipe, draw[:N_POOL - N_VAL], draw[N_POOL - N_VAL:],
                                            work / f"s{k}")
                held += ok
                cross += bool(ok and cc)  # the search cross-checks a variant that passed held out
                tops.append(top)
                cc_tops.append(cc_top)
            row = {"model": f"{name} ({len(samples)} samples)", "recipe": label, "truth": f"{true_top1:.1%}",
                   "verdict": "should ship" if true_top1 >= 0.9 else "should be refused",
                   "held": f"{held}/{args.splits}", "cross": f"{cross}/{args.splits}",
                   "top_held": f"{np.median(tops):.1%}", "top_cross": f"{np.nanmedian(cc_tops):.1%}",
                   "s": f"{time.perf_counter() - t0:.0f}"}
            print(row, flush=True)
            rows.append(row)
    table = md_table(rows, [("model", "model"), ("recipe", "ORT INT8 recipe"), ("truth", "top-1 vs FP32, all samples"),
                            ("verdict", "so it"), ("held", "passes: 8 held out"),
                            ("cross", "passes: held out + 4-fold on 27"), ("top_held", "median top-1 (8)"),
                            ("top_cross", "median top-1 out of fold (27)"), ("s", "s")])
    body = "\n".join([when + f"; {args.splits} random draws of 27 samples (19 calibrate, 8 held out) per recipe. "
                      "Script: `bench/bench_crosscheck.py`.", "", table, "",
                      "A draw passes when the variant meets the default INT8 bound on the 8 held-out samples "
                      "(top-1 judged on a count: 1 of 8 may differ) and, in the last column, also the 4-fold "
                      "cross-check on all 27 (3 of 27 may differ).", "", NOTES])
    write_section("crosscheck", body)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
