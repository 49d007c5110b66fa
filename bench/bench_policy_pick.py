"""Does every INT8 search pick what the accuracy policy accepts, and the fastest such variant?

    .venv/bin/python bench/bench_policy_pick.py [--models ocr-cls,ocr-rec,silero-vad,oww-embedding]
                                                [--targets cpu,intel-cpu,mobile]

Per fixture model (data from ``bench/build_fixtures.prepare_data``: real text-line pieces, real audio) and
target, ``edgeopt build --precision int8`` on a fresh cache; from the bundle's manifest (the search's own
record): the variant picked, every variant the policy (``edgeopt.policy.accept``) accepted, the fastest
of those by the build host's timing, both latencies, and the policy's word on the pick.  A refused build
names the closest variant and the metric.  mobile's search is not timed on the host: its candidates are
tried in the order of speed (full-integer, selective, dynamic-range) and the first accepted is kept.
Writes the ``policy-pick`` section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import load, machine, md_table, stamp, write_section  # noqa: E402
from build_fixtures import prepare_data  # noqa: E402


def _cpu_rows(rec: dict) -> tuple[str, list[dict], dict]:
    sel = {s["label"]: s for s in (rec.get("timings") or {}).get("selection") or [] if "label" in s}
    variants = []
    for v in rec.get("variants") or []:
        ms = (sel.get(v["label"]) or {}).get("median_ms", v.get("latency_ms"))
        variants.append({"label": v["label"], "passed": v.get("passed"), "ms": ms,
                         "policy": (v.get("policy") or {}).get("reason", ""), "retimed": v["label"] in sel})
    return rec["chosen"]["label"], variants, rec


def _ov_rows(rec: dict) -> tuple[str, list[dict], dict]:
    variants = [{"label": t["variant"], "passed": t.get("passed"), "ms": t.get("latency_ms"),
                 "policy": (t.get("policy") or {}).get("reason", ""), "retimed": "latency_ms" in t}
                for t in rec.get("tried") or [] if "settings" in t or "margin" in t]
    return rec["chosen"], variants, rec


def _tfl_rows(rec: dict) -> tuple[str, list[dict], dict]:
    variants = [{"label": a.get("label") or a.get("mode"), "passed": a.get("passed"), "ms": None,
                 "policy": "; ".join(a.get("reasons") or [])[:120]} for a in rec.get("attempts") or []]
    chosen = next((a.get("label") or a.get("mode") for a in rec.get("attempts") or [] if a.get("passed")),
                  rec.get("chosen"))
    return chosen, variants, rec


def row_of(model: str, target: str, result: dict) -> dict:
    row = {"model": model, "target": target, "status": result["status"]}
    if result["status"] not in ("built", "cached"):
        row["picked"] = "refused: " + (result.get("error") or "").splitlines()[0][:200].replace("|", "/")
        return row
    m = json.loads((Path(result["bundle"]) / "manifest.json").read_text())
    rec = (m.get("options") or {}).get("int8") or {}
    pick, variants, rec = (_cpu_rows if target == "cpu" else _ov_rows if target.startswith("intel") else _tfl_rows)(rec)
    accepted = [v for v in variants if v["passed"]]
    timed = [v for v in accepted if isinstance(v["ms"], (int, float))]
    fastest = min(timed, key=lambda v: v["ms"]) if timed else (accepted[0] if accepted else None)
    picked = next((v for v in variants if v["label"] == pick), None)
    pol = (m.get("host_check") or {}).get("policy") or {}
    row.update({
        "picked": pick, "picked_ms": f"{picked['ms']:.3f}" if picked and isinstance(picked["ms"], float) else "—",
        "fastest_accepted": fastest["label"] if fastest else "—",
        "fastest_ms": f"{fastest['ms']:.3f}" if fastest and isinstance(fastest["ms"], float) else "—",
        "accepted": f"{len(accepted)} of {len(variants)}",
        "policy_on_pick": ("accepted" if pol.get("accepted") else "REFUSED" if pol.get("accepted") is False
                           else "—") + (f": {pol.get('reason')}" if pol.get("reason") else ""),
    })
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="ocr-cls,ocr-rec,silero-vad,oww-embedding")
    ap.add_argument("--targets", default="cpu,intel-cpu,mobile")
    args = ap.parse_args()
    from edgeopt.fixtures import path

    work = Path(tempfile.mkdtemp(prefix="edgeopt-bench-policy-"))
    env = {**os.environ, "EDGEOPT_CACHE_DIR": str(work / "cache")}
    data = prepare_data(work)
    rows, t0, load0 = [], time.time(), load()
    for model in args.models.split(","):
        flags, calib = data[model]
        for target in args.targets.split(","):
            cmd = [sys.executable, "-m", "edgeopt", "build", str(path(model)), "--targets", target, "--precision",
                   "int8", *flags, "--calib", calib, "--out", str(work / "dist"), "--json", "-q"]
            p = subprocess.run(cmd, capture_output=True, text=True, env=env)
            try:
                results = json.loads(p.stdout)["results"]
            except (json.JSONDecodeError, KeyError):
                rows.append({"model": model, "target": target, "status": "error",
                             "picked": (p.stderr.strip().splitlines() or ["?"])[-1][:200]})
                continue
            for r in results:
                rows.append(row_of(model, target, r))
                print(json.dumps(rows[-1]), flush=True)
    cols = [("model", "model"), ("target", "target"), ("status", "status"), ("picked", "variant picked"),
            ("picked_ms", "its ms (build host)"), ("fastest_accepted", "fastest variant the policy accepts"),
            ("fastest_ms", "its ms"), ("accepted", "variants accepted"), ("policy_on_pick", "policy on the pick")]
    bad = [r for r in rows if r.get("policy_on_pick", "").startswith("REFUSED")]
    body = (f"### INT8 picks under the accuracy policy ({stamp()})\n\n"
            f"`bench/bench_policy_pick.py` on {machine()}; {load0} at the start, {load()} at the end "
            f"({(time.time() - t0) / 60:.0f} min). Each build on a fresh cache, `--precision int8`, default "
            "policy (the bundle's bound and at most 5% of decisions differing on distinct validation samples). "
            "Latencies are the build host's, from the search's own record (cpu: the interleaved re-timing of "
            "the top variants, the first look for the others; intel-cpu: NNCF candidates timed against the "
            "FP32 IR; mobile: not timed on the host, its candidates are tried fastest mode first). "
            f"**Picks the policy refuses: {len(bad)}.**\n\n" + md_table(rows, cols))
    write_section("policy-pick", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
