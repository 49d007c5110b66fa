#!/usr/bin/env python3
"""The 105 bad inputs of issue 40, each run through the real CLI (``python -m edgeopt ...``) in its own folder:
one line (an ``edgeopt: error:`` line, at most a hint after it)? the documented exit code? no traceback? nothing
written (the folder, the build cache, the simulated device's store, the rollout journal)?

    .venv/bin/python bench/bench_bad_inputs.py            # writes docs/BENCHMARKS.md section "bad-inputs"
    .venv/bin/python bench/bench_bad_inputs.py --only gate --no-write

The older 60 are tests/cli/test_bad_input.py's battery (imported, not copied: 46) and the cases of
tests/cli/test_leftovers.py / test_out_paths.py (14); the 45 new ones cover debug, gate YAML, rollout
resume/status, rollback, tune, --batch, energy options, emulated devices and unwritable paths. The world
they run against is real: the PP-OCR classifier built for cpu, a simulated device (``transport: local``)
with a finished rollout in its journal. Cases run one at a time (one heavy process on the machine).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import load, machine, md_table, stamp, write_section  # noqa: E402

from edgeopt.fixtures import path as fixture  # noqa: E402

SHAPE = "x:1x3x48x192"
MODEL = "ch_ppocr_mobile_v2.0_cls_infer"


def _snapshot(*roots: Path) -> dict[str, str]:
    """Every file under the roots with its size and mtime (a write shows), and every folder."""
    out: dict[str, str] = {}
    for r in roots:
        if not r.exists():
            continue
        for p in r.rglob("*"):
            try:
                st = p.stat()
            except OSError:
                continue
            out[str(p)] = "dir" if p.is_dir() else f"{st.st_size}:{st.st_mtime_ns}"
    return out


def world(base: Path) -> dict:
    """Build the classifier, make a simulated device with a finished rollout, and the bad files."""
    env = {**os.environ, "EDGEOPT_CACHE_DIR": str(base / "cache"), "COLUMNS": "200"}
    env.pop("EDGEOPT_DB", None)
    env.pop("EDGEOPT_SCHEDULER", None)
    model = str(fixture("ocr-cls"))
    built = base / "built"
    built.mkdir()
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "edgeopt", "build", model, "-t", "cpu", "-p", "fp32", "--shape", SHAPE,
                        "-q"], cwd=built, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    (built / "fleet.yaml").write_text(f"devices:\n  sim: {{transport: local, root: {base / 'sim'}, target: cpu}}\n")
    p = subprocess.run([sys.executable, "-m", "edgeopt", "rollout", f"dist/{MODEL}", "--devices", "fleet.yaml",
                        "--waves", "100%", "--no-latency-gate", "--db", "j.db", "--json", "-q"], cwd=built, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rollout_id = json.loads(p.stdout.strip().splitlines()[-1])["rollout_id"]
    bad = base / "files"
    bad.mkdir()
    (bad / "empty").mkdir()
    (bad / "afolder").mkdir()
    (bad / "afile").write_text("x")
    (bad / "truncated.onnx").write_bytes(Path(model).read_bytes()[:5000])
    (bad / "text.onnx").write_text("not a model\n")
    (bad / "typo-target.yaml").write_text("devices:\n  - name: a\n    host: 127.0.0.1\n    target: jetsn-orin\n")
    (bad / "bad-syntax.yaml").write_text("devices:\n  - name: a\n    host: [127.0.0.1\n")
    (bad / "notafolder").write_text("x")
    (bad / "devices-typo.yaml").write_text("device:\n  a: {host: 127.0.0.1}\n")
    (bad / "ssh.yaml").write_text("devices:\n  a: {host: 127.0.0.1, target: cpu}\n")
    gates = {"gate-unknown-key.yaml": "p55: {max_slowdown: 5%}\n",
             "gate-bad-value.yaml": "p50: {max_slowdown: lots}\n",
             "gate-bare-10.yaml": "p50: {max_slowdown: 10}\n",
             "gate-syntax.yaml": "p50: {max_slowdown: 5%\n",
             "gate-level.yaml": "level: 2\n"}
    for name, text in gates.items():
        (bad / name).write_text(text)
    for name, bench in (("energy-unknown.yaml", "{energy: false}"), ("energy-notmap.yaml", "'energy=off'"),
                        ("energy-value.yaml", "{energy: maybe}")):
        (bad / name).write_text(f"devices:\n  e: {{transport: local, root: {base / 'sim-e'}, target: cpu, "
                                f"bench: {bench}}}\n")
    # an emulated board's inventory (as scripts/make_device.py writes it) with a key mistyped
    (bad / "emulated-typo.yaml").write_text("devices:\n  bookworm-arm64:\n    host: 127.0.0.1\n    prot: 2222\n"
                                            "    target: cpu\n")
    return {"root": base, "env": env, "model": model, "built": built, "files": bad, "rollout_id": rollout_id,
            "setup_s": round(time.monotonic() - t0, 1)}


def older_battery(w: dict) -> list[tuple[str, str, list[str], int, str, str]]:
    """tests/cli/test_bad_input.py's 46 cases, as they are (its world's files under w['files'])."""
    from tests.cli.test_bad_input import _cases

    tw = {"root": w["files"], "model": w["model"]}
    return [(name, "older: battery", argv, code, needle, where) for name, argv, code, needle, where in _cases(tw)]


def cases(w: dict) -> list[tuple[str, str, list[str], int, str, str]]:
    """(id, category, argv, documented exit code, text the message must hold, folder: fresh | built)."""
    m, f, rid = w["model"], w["files"], w["rollout_id"]
    bundle = f"dist/{MODEL}/cpu-fp32"
    b = ["build", m, "-t", "cpu", "--shape", SHAPE]
    run = ["run", m, "-t", "cpu", "--shape", SHAPE]
    gate = ["gate", bundle, "--baseline", bundle, "--db", "g.db"]
    tune = ["tune", m, "-t", "cpu", "--shape", SHAPE]
    old = "older: leftovers/out paths"
    return [*older_battery(w),
            # the older 14 of tests/cli/test_leftovers.py and test_out_paths.py
            ("bench-empty-dist", old, ["bench", "--dist", str(f / "empty")], 2, "--dist", "fresh"),
            ("push-empty-dist", old, ["push", "--dist", str(f / "empty")], 2, "no bundle under --dist", "fresh"),
            ("bench-limit-typo", old, ["bench", "--limit", "nosuch"], 2, "nosuch", "built"),
            ("rollout-missing-folder", old, ["rollout", "missing", "--devices", "fleet.yaml"], 2,
             "'missing' does not exist", "built"),
            ("report-json-format-md", old, ["report", "--json", "--format", "md"], 2, "--format md", "fresh"),
            ("rollback-model-nobody-has", old, ["rollback", "--devices", "fleet.yaml", "--model", "nosuchmodel"], 2,
             MODEL, "built"),
            ("run-out-named-like-a-report", old, [*run, "--out", "report.html"], 2, "names a .html file", "fresh"),
            ("build-dist-named-like-json", old, [*b, "--dist", "bundles.json"], 2, "names a .json file", "fresh"),
            ("debug-dist-named-like-csv", old, ["debug", m, "--target", "cpu", "--dist", "layers.csv"], 2,
             "names a .csv file", "fresh"),
            ("build-dist-is-a-file", old, [*b, "--dist", str(f / "notafolder")], 2, "is a file", "fresh"),
            ("gate-junit-missing-folder", old, [*gate, "--junit", "no/such/dir/gate.xml"], 2, "does not exist",
             "built"),
            ("gate-md-a-folder", old, [*gate, "--md", str(f / "afolder")], 2, "is a folder", "built"),
            ("gate-raw-and-md-one-file", old, [*gate, "--raw", "same.json", "--md", "same.json"], 2,
             "the same file as --md", "built"),
            ("fixtures-typo", old, ["-m", "edgeopt.fixtures", "ocr-cl"], 2, "did you mean 'ocr-cls'", "fresh"),
            # --- 45 new --------------------------------------------------------------------------------------
            ("debug-model-without-target", "debug", ["debug", m], 2, "--target", "fresh"),
            ("debug-missing-source", "debug", ["debug", "nothere.onnx", "--target", "cpu"], 2, "not", "fresh"),
            ("debug-bundle-with-target", "debug", ["debug", bundle, "--target", "cpu"], 2, "--target", "built"),
            ("debug-max-memory-bad", "debug", ["debug", bundle, "--max-memory", "lots"], 2, "lots", "built"),
            ("debug-html-a-folder", "debug", ["debug", bundle, "--html", str(f / "afolder")], 2, "is a folder", "built"),
            ("debug-reduce-a-file", "debug", ["debug", bundle, "--reduce", str(f / "afile")], 2, "is a file", "built"),
            ("gate-yaml-unknown-key", "gate YAML", [*gate, "--gate", str(f / "gate-unknown-key.yaml")], 2, "p55",
             "built"),
            ("gate-yaml-bad-value", "gate YAML", [*gate, "--gate", str(f / "gate-bad-value.yaml")], 2, "lots", "built"),
            ("gate-yaml-bare-10", "gate YAML", [*gate, "--gate", str(f / "gate-bare-10.yaml")], 2, "10%", "built"),
            ("gate-yaml-syntax", "gate YAML", [*gate, "--gate", str(f / "gate-syntax.yaml")], 2, "gate-syntax.yaml",
             "built"),
            ("gate-yaml-level-2", "gate YAML", [*gate, "--gate", str(f / "gate-level.yaml")], 2, "level", "built"),
            ("gate-yaml-missing", "gate YAML", [*gate, "--gate", "nothere.yaml"], 2, "nothere.yaml", "built"),
            ("gate-budget-0", "gate YAML", [*gate, "--budget", "0s"], 2, "--budget", "built"),
            ("rollout-status-unknown-id", "rollout resume/status", ["rollout", "status", "nosuch", "--db", "j.db"], 2,
             "nosuch", "built"),
            ("rollout-status-no-journal", "rollout resume/status", ["rollout", "status", rid, "--db", "none.db"], 2,
             "no journal", "built"),
            ("rollout-resume-unknown-id", "rollout resume/status", ["rollout", "resume", "nosuch", "--db", "j.db"], 2,
             "nosuch", "built"),
            ("rollout-resume-finished", "rollout resume/status", ["rollout", "resume", rid, "--db", "j.db"], 2,
             "nothing to resume", "built"),
            ("rollout-waves-0", "rollout resume/status", ["rollout", f"dist/{MODEL}", "--devices", "fleet.yaml",
                                                           "--waves", "0%", "--db", "j.db"], 2, "--waves", "built"),
            ("rollout-max-fail-bad", "rollout resume/status", ["rollout", f"dist/{MODEL}", "--devices", "fleet.yaml",
                                                                "--max-fail", "lots", "--db", "j.db"], 2, "--max-fail",
             "built"),
            ("rollback-inventory-missing", "rollback", ["rollback", "--devices", "nothere.yaml", "--model", MODEL], 2,
             "nothere.yaml", "built"),
            ("rollback-limit-ghost", "rollback", ["rollback", "--devices", "fleet.yaml", "--model", MODEL, "--limit",
                                                  "ghost"], 2, "ghost", "built"),
            ("rollback-target-typo", "rollback", ["rollback", "--devices", "fleet.yaml", "--model", MODEL, "--target",
                                                  "jetsn"], 2, "jetsn", "built"),
            ("tune-latency-bound-bad", "tune", [*tune, "--latency-bound", "p100=5ms"], 2, "--latency-bound", "fresh"),
            ("tune-min-accuracy-2", "tune", [*tune, "--min-accuracy", "2"], 2, "--min-accuracy", "fresh"),
            ("tune-batch-0", "tune", [*tune, "--batch", "0"], 2, "--batch", "fresh"),
            ("tune-dist-named-like-md", "tune", [*tune, "--dist", "t.md"], 2, "names a .md file", "fresh"),
            ("tune-model-missing", "tune", ["tune", "nothere.onnx", "-t", "cpu"], 2, "not found", "fresh"),
            ("build-batch-0", "--batch", [*b, "--batch", "0"], 2, "--batch", "fresh"),
            ("build-batch-letters", "--batch", [*b, "--batch", "a"], 2, "--batch", "fresh"),
            ("bench-batch-list-with-letters", "--batch", ["bench", "--batch", "1,x"], 2, "--batch", "built"),
            ("run-batch-list", "--batch", [*run, "--batch", "1,4"], 2, "--batch", "fresh"),
            ("energy-option-in-inventory", "energy options", ["bench", "--devices", str(f / "energy-unknown.yaml")],
             2, "energy", "built"),
            ("energy-options-not-a-mapping", "energy options", ["bench", "--devices", str(f / "energy-notmap.yaml")],
             2, "bench must be a mapping", "built"),
            ("energy-option-value", "energy options", ["bench", "--devices", str(f / "energy-value.yaml")], 2,
             "energy", "built"),
            ("emulated-arch-unknown", "emulated devices", ["scripts/make_device.py", "--arch", "riscv64"], 2,
             "riscv64", "fresh"),
            ("emulated-suite-unknown", "emulated devices", ["scripts/make_device.py", "--suite", "sid"], 2, "sid",
             "fresh"),
            ("emulated-inventory-key-typo", "emulated devices", ["devices", "--devices",
                                                                 str(f / "emulated-typo.yaml")], 2, "prot", "fresh"),
            ("run-report-to-proc", "unwritable paths", [*run, "--report", "/proc/edgeopt-r.html"], 2, "report",
             "fresh"),
            ("gate-junit-unwritable", "unwritable paths", [*gate, "--junit", "/proc/edgeopt-g.xml"], 2, "--junit",
             "built"),
            ("report-output-unwritable", "unwritable paths", ["report", "--db", "none.db", "--output",
                                                              "/proc/edgeopt.md"], 2, "cannot write", "fresh"),
            ("history-output-under-a-file", "unwritable paths", ["history", "m", "--db", "none.db", "--output",
                                                                 str(f / "afile" / "h.json")], 2, "cannot write",
             "fresh"),
            ("baseline-export-output-a-folder", "unwritable paths", ["baseline", "export", "main", "--db", "none.db",
                                                                     "--output", str(f / "afolder")], 2,
             "--output", "fresh"),
            ("debug-html-under-a-file", "unwritable paths", ["debug", bundle, "--html", str(f / "afile" / "p.html")],
             2, "cannot write", "built"),
            ("rollout-events-unwritable", "unwritable paths", ["rollout", f"dist/{MODEL}", "--devices", "fleet.yaml",
                                                               "--events", "/proc/edgeopt-e.jsonl", "--db", "j.db"],
             2, "--events", "built"),
            ("export-triton-repository-a-file", "unwritable paths", ["export", "triton", bundle, "--repository",
                                                                     str(f / "afile")], 2, "--repository", "built"),
            ]


def run_case(w: dict, case) -> dict:
    name, cat, argv, code, needle, where = case
    cwd = w["root"] / "runs" / name
    if where == "built":
        shutil.copytree(w["built"], cwd, symlinks=True)
    else:
        cwd.mkdir(parents=True)
    watched = (cwd, w["root"] / "cache", w["root"] / "sim", w["root"] / "sim-e", w["files"])
    before = _snapshot(*watched)
    journal = (cwd / "j.db").read_bytes() if (cwd / "j.db").exists() else None
    if argv and argv[0] == "-m":
        cmd = [sys.executable, *argv]
    elif argv and argv[0].endswith(".py"):
        cmd = [sys.executable, str(ROOT / argv[0]), *argv[1:]]
    else:
        cmd = [sys.executable, "-m", "edgeopt", *argv]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=cwd, env=w["env"], capture_output=True, text=True, timeout=600)
    took = time.monotonic() - t0
    err = p.stderr.strip()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    one_line = bool(lines) and ("error" in first.lower()) and all(
        ln.strip().startswith("hint:") or ln.startswith("  ") for ln in lines[1:])
    after = _snapshot(*watched)
    wrote = sorted(k for k in set(after) | set(before) if after.get(k) != before.get(k))
    if journal is not None and (cwd / "j.db").read_bytes() != journal:
        wrote.append("j.db (changed)")
    wrote = [str(Path(x).relative_to(w["root"])) if x.startswith(str(w["root"])) else x for x in wrote]
    problems = []
    if p.returncode != code:
        problems.append(f"exit {p.returncode}")
    if not one_line:
        problems.append("not one line")
    if "Traceback" in err or "Traceback" in p.stdout:
        problems.append("traceback")
    if wrote:
        problems.append("wrote " + ", ".join(wrote[:2]))
    if needle and needle.lower() not in err.lower():
        problems.append(f"message lacks {needle!r}")
    shown = " ".join(a if len(a) < 40 else "…/" + Path(a).name for a in argv)
    return {"id": name, "cat": cat, "argv": shown.replace(w["model"], "ocr-cls.onnx"), "want": code,
            "got": p.returncode, "one_line": "yes" if one_line else "NO", "traceback": "YES" if "Traceback" in err
            else "no", "wrote": ", ".join(wrote[:2]) or "nothing", "ok": "ok" if not problems else "; ".join(problems),
            "message": first[:160].replace("|", "\\|"), "s": round(took, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="run only the cases whose id or category contains this")
    ap.add_argument("--no-write", action="store_true", help="print, do not write docs/BENCHMARKS.md")
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    a = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="edgeopt-bad-inputs-"))
    load0 = load()
    t0 = time.monotonic()
    try:
        w = world(base)
        todo = cases(w)
        assert len(todo) == 105 and len({c[0] for c in todo}) == 105, len(todo)
        if a.only:
            todo = [c for c in todo if a.only in c[0] or a.only in c[1]]
        rows = []
        for i, c in enumerate(todo, 1):
            r = run_case(w, c)
            r["n"] = i
            rows.append(r)
            print(f"{i:3d} {r['id']:38s} want {r['want']} got {r['got']:3d} {r['ok']}", flush=True)
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    bad = [r for r in rows if r["ok"] != "ok"]
    wall = time.monotonic() - t0
    print(f"{len(rows) - len(bad)} of {len(rows)} right; {wall:.0f} s")
    if a.no_write or a.only:
        for r in bad:
            print(f"  {r['id']}: {r['ok']} -- {r['message']}")
        return 0 if not bad else 1
    by_cat: dict[str, list[dict]] = {}
    for r in rows:
        by_cat.setdefault(r["cat"], []).append(r)
    summary = ", ".join(f"{c} {sum(r['ok'] == 'ok' for r in rs)}/{len(rs)}" for c, rs in by_cat.items())
    body = (f"## Bad inputs (issue 40): {len(rows) - len(bad)} of {len(rows)} right\n\n"
            f"`bench/bench_bad_inputs.py`, {stamp()}: {machine()}; {load0} at the start, {load()} at the end; "
            f"{wall:.0f} s (the world's build and rollout {w['setup_s']} s). Each case runs the real CLI "
            "(`python -m edgeopt ...`; two run `scripts/make_device.py`, one `python -m edgeopt.fixtures`) in its "
            "own folder against the PP-OCR classifier built for cpu and a simulated device (`transport: local`) "
            "with a finished rollout in its journal. Right means: the exit code documented for it (2: bad input), "
            "one line (an error line, at most a hint after it), no traceback, and nothing "
            "written (the folder, the build cache, the device's store, the journal, the bad files). By group: "
            f"{summary}.\n\n"
            + md_table(rows, [("n", "#"), ("cat", "group"), ("id", "case"), ("argv", "command"), ("want", "exit doc"),
                              ("got", "exit"), ("one_line", "one line"), ("traceback", "traceback"),
                              ("wrote", "written"), ("ok", "right?"), ("message", "first line")]))
    write_section("bad-inputs", body)
    print("docs/BENCHMARKS.md: section bad-inputs written")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
