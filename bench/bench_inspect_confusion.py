"""``inspect`` against ``build`` on real models: the confusion table (issue 41).

Every fixture (shared/FIXTURES.md) and every model of ``bench/bench_unseen.py`` installed here, for every target:
``edgeopt inspect``'s verdict (``edgeopt.api.support_matrix``: yes / probably not / no) against what
``edgeopt build -p fp32`` does with the attribute rules OFF (``EDGEOPT_SUPPORT_RULES=off``: build tries every
conversion inspect's rules would refuse, so whether each refusal is right is measured; the op-type tables still
refuse, as they are what the converter has no translation for at all):

- **ok**: built, and its host check passed (or, for targets checked on the device, built);
- **refused**: edgeopt refused it in one line before converting (an op type the target has no translation for,
  a model form no target takes);
- **failed**: the conversion failed, crashed or timed out, or the artifact failed its host check.

One build call per (model, target) (real data: bench_unseen's recipes, its shapes and flags), resumable:
rows go to ``$EDGEOPT_BENCH_WORK_CONFUSION``/rows.json (default /tmp/edgeopt-bench-confusion) as they finish.

    nohup nice -n 19 .venv/bin/python bench/bench_inspect_confusion.py [--models a,b] [--targets ...] &
    .venv/bin/python bench/bench_inspect_confusion.py --write-only --write
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
WORK = Path(os.environ.get("EDGEOPT_BENCH_WORK_CONFUSION", "/tmp/edgeopt-bench-confusion"))
TARGETS = ["cpu", "intel-cpu", "apple", "jetson-orin", "h100", "mobile"]  # mobile last: the slow one
VERDICTS = ["yes", "probably", "no"]
OUTCOMES = ["ok", "refused", "failed"]


def all_models() -> dict[str, dict]:
    """bench_unseen's models (installed ones) plus the fixtures it does not have (silero-vad's two files)."""
    import bench_unseen as bu

    from edgeopt import fixtures

    out = bu.models()
    for name in ("silero-vad", "silero-vad-op15"):
        try:
            path = fixtures.path(name)
        except FileNotFoundError:
            continue

        def data(name=name) -> dict[str, np.ndarray]:
            WORK.mkdir(parents=True, exist_ok=True)
            npz = fixtures.audio_data("silero-vad", WORK / "silero-vad-fixture.npz")
            with np.load(npz) as z:
                return {k: z[k] for k in z.files}

        out[f"fixture:{name}"] = {"path": path, "shape": "input:1x576,state:2x1x128", "input": "input",
                                  "data": data, "task": "speech decisions"}
    return out


def verdicts(model: str) -> dict[str, dict]:
    from edgeopt.api import support_matrix
    from edgeopt.model import inspect

    out = {}
    for r in support_matrix(inspect(model)):
        if not r["supported"]:
            why = "; ".join(u["op"] for u in r["unsupported"]) or (r.get("format") or {}).get("message") or ""
            out[r["target"]] = {"verdict": "no", "why": why}
        elif r.get("probably"):
            out[r["target"]] = {"verdict": "probably", "why": "; ".join(p["op"] + ": " + p["why"] for p in r["probably"])}
        else:
            out[r["target"]] = {"verdict": "yes", "why": ""}
    return out


def build(name: str, spec: dict, target: str, npz: Path, timeout: int) -> dict:
    calib, val = spec.get("counts", (16, 12))
    cmd = [str(ROOT / ".venv" / "bin" / "edgeopt"), "build", str(spec["path"]), "-t", target, "-p", "fp32",
           "--shape", spec["shape"], "--calib", str(npz), "--val-count", str(val), "--calib-count", str(calib),
           "--out", str(WORK / "out"), "--jobs", "1", "--json", "--quiet", "--build-timeout", str(timeout),
           *spec.get("flags", [])]
    env = {**os.environ, "EDGEOPT_SUPPORT_RULES": "off", "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 120, env=env)
    except subprocess.TimeoutExpired:
        return {"outcome": "failed", "why": f"hung > {timeout + 120}s", "s": round(time.perf_counter() - t0, 1)}
    s = round(time.perf_counter() - t0, 1)
    try:
        res = json.loads(p.stdout)["results"][0]
    except (ValueError, KeyError, IndexError):
        last = (p.stderr.strip().splitlines() or ["(no output)"])[-1][:200]
        tb = "Traceback" in p.stderr
        return {"outcome": "refused" if p.returncode == 2 and not tb else "failed", "why": last, "s": s}
    status = res.get("status")
    err = [x.strip() for x in (res.get("error") or "").strip().splitlines()]
    if len(err) > 1 and err[0].endswith(":"):  # "cannot take 1 node(s) of this model:" then the node
        err = [err[0] + " " + err[1]] + err[2:]
    if status in ("built", "cached", "up-to-date"):
        chk = res.get("check") or {}
        passed = chk.get("passed") if isinstance(chk, dict) else None
        return {"outcome": "failed" if passed is False else "ok", "status": status, "s": s,
                "why": "" if passed is not False else "host check refused it"}
    if status in ("unsupported", "unavailable"):
        return {"outcome": "refused", "status": status, "why": err[0][:200] if err else status, "s": s}
    return {"outcome": "failed", "status": status, "why": err[0][:200] if err else status, "s": s}


def run(args) -> list[dict]:
    WORK.mkdir(parents=True, exist_ok=True)
    rows_path = WORK / "rows.json"
    rows = json.loads(rows_path.read_text()) if rows_path.exists() else []
    done = {(r["model"], r["target"]) for r in rows}
    ms = all_models()
    names = [m for m in (args.models.split(",") if args.models else ms) if m in ms]
    targets = args.targets.split(",")
    for name in names:
        spec = ms[name]
        todo = [t for t in targets if (name, t) not in done]
        if not todo:
            continue
        try:
            if callable(spec["path"]):
                spec["path"] = spec["path"]()
            data = spec["data"]()
        except (RuntimeError, OSError) as exc:
            print(f"{name} skipped: {exc}", file=sys.stderr)
            continue
        npz = WORK / f"{name.replace(':', '_')}.npz"
        np.savez(npz, **(data if isinstance(data, dict) else {spec["input"]: data[:, None]}))
        v = verdicts(str(spec["path"]))
        for t in todo:
            row = {"model": name, "target": t, **v.get(t, {"verdict": "?"}),
                   **{f"build_{k}": x for k, x in build(name, spec, t, npz, args.timeout).items()}}
            rows.append(row)
            rows_path.write_text(json.dumps(rows, indent=1))
            print(f"{name} {t}: inspect {row['verdict']}, build {row['build_outcome']} {row.get('build_why', '')[:120]}",
                  flush=True)
    return rows


def render(rows: list[dict], targets: list[str]) -> str:
    def grid(rs: list[dict]) -> str:
        cells = []
        for v in VERDICTS:
            line = {"v": f"inspect {v}" if v != "probably" else "inspect probably not"}
            for o in OUTCOMES:
                n = sum(1 for r in rs if r["verdict"] == v and r["build_outcome"] == o)
                line[o] = f"**{n}**" if n and (v, o) in (("yes", "failed"), ("no", "ok")) else n
            cells.append(line)
        return md_table(cells, [("v", ""), ("ok", "build ok"), ("refused", "build refused"), ("failed", "build failed")])

    per_target = []
    for t in targets:
        rs = [r for r in rows if r["target"] == t]
        if not rs:
            continue
        c = {(v, o): sum(1 for r in rs if r["verdict"] == v and r["build_outcome"] == o) for v in VERDICTS
             for o in OUTCOMES}
        per_target.append({"t": t, "n": len(rs), **{f"{v}-{o}": c[(v, o)] for v in VERDICTS for o in OUTCOMES}})
    wrong = [r for r in rows if (r["verdict"], r["build_outcome"]) in (("yes", "failed"), ("no", "ok"),
                                                                      ("probably", "ok"), ("probably", "failed"))]
    models = sorted({r["model"] for r in rows})
    return "\n".join([
        "## inspect against build on real models: the confusion table (bench/bench_inspect_confusion.py)", "",
        f"{stamp()}; {machine()}; {load()} (other engineers' jobs on the same 2 cores). {len(models)} models "
        f"({', '.join(models)}) x {len(targets)} targets, one `edgeopt build -p fp32` per pair with real data and "
        "`EDGEOPT_SUPPORT_RULES=off` (build tries what inspect's attribute rules would refuse; op types a target has "
        "no translation for are still refused). ok: built and its host check passed (device-checked targets: "
        "built); refused: one-line refusal before converting; failed: conversion failed or crashed, or the host "
        "check refused the artifact.", "",
        "All targets:", "", grid(rows), "",
        "Per target (verdict-outcome counts):", "",
        md_table(per_target, [("t", "target"), ("n", "pairs")] + [(f"{v}-{o}", f"{v} / {o}") for v in VERDICTS
                                                                   for o in OUTCOMES]), "",
        "The pairs off the diagonal (inspect yes and build failed, inspect no and build ok) and every \"probably\":",
        "", "\n".join(f"- {r['model']} {r['target']}: inspect {r['verdict']}"
                      + (f" ({r['why'][:140]})" if r.get("why") else "") + f", build {r['build_outcome']}"
                      + (f" ({r.get('build_why', '')[:160]})" if r.get("build_why") else "") for r in wrong) or "- none"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None)
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--timeout", type=int, default=900, help="seconds per build")
    ap.add_argument("--write-only", action="store_true", help="render rows.json, build nothing")
    ap.add_argument("--write", action="store_true", help="write docs/BENCHMARKS.md section inspect-confusion")
    args = ap.parse_args()
    if args.write_only:  # today's inspect against the recorded builds (a build does not depend on inspect)
        rows = json.loads((WORK / "rows.json").read_text()) if (WORK / "rows.json").exists() else []
        ms, now = all_models(), {}
        for r in rows:
            spec = ms.get(r["model"])
            if spec is None:
                continue
            if r["model"] not in now:
                path = spec["path"]() if callable(spec["path"]) else spec["path"]
                now[r["model"]] = verdicts(str(path))
            r.update(now[r["model"]].get(r["target"], {}))
    else:
        rows = run(args)
    body = render(rows, args.targets.split(","))
    print(body)
    if args.write:
        write_section("inspect-confusion", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
