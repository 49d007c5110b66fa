"""The bad-input battery: every case runs the installed CLI (``python -m edgeopt``) in its own folder and
must end with one message (an error line, at most a hint after it), the right exit code, no traceback,
and nothing written (no dist, no report, no database, no cache entry).

A first build of the real OCR classifier fills the cache, so the --calib typo case is the one the issue
found: a cached bundle must not hide a data source that does not exist.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from edgeopt.fixtures import path as fixture

SHAPE = "x:1x3x48x192"


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A folder with a built classifier (dist/, cache) and the bad inputs the cases point at."""
    root = tmp_path_factory.mktemp("bad")
    env = {**os.environ, "EDGEOPT_CACHE_DIR": str(root / "cache"), "COLUMNS": "200"}
    model = str(fixture("ocr-cls"))
    built = root / "built"
    built.mkdir()
    proc = subprocess.run([sys.executable, "-m", "edgeopt", "build", model, "-t", "cpu", "-p", "fp32", "--shape",
                           SHAPE, "-q"], cwd=built, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (root / "empty").mkdir()
    (root / "truncated.onnx").write_bytes(Path(model).read_bytes()[:5000])
    (root / "text.onnx").write_text("not a model\n")
    (root / "typo-target.yaml").write_text("devices:\n  - name: a\n    host: 127.0.0.1\n    target: jetsn-orin\n")
    (root / "bad-syntax.yaml").write_text("devices:\n  - name: a\n    host: [127.0.0.1\n")
    (root / "notafolder").write_text("x")
    (root / "devices-typo.yaml").write_text("device:\n  a: {host: 127.0.0.1}\n")
    (root / "ssh.yaml").write_text("devices:\n  a: {host: 127.0.0.1, target: cpu}\n")
    return {"root": root, "env": env, "model": model, "built": built}


def _cases(w) -> list[tuple[str, list[str], int, str, str]]:
    """(id, argv, exit code, text the message must hold, folder: 'fresh' or 'built')."""
    r, m = w["root"], w["model"]
    b = ["build", m, "-t", "cpu", "--shape", SHAPE]
    run = ["run", m, "-t", "cpu", "--shape", SHAPE]
    return [
        ("calib-typo-after-cached-build", [*b, "--calib", "nothere/"], 2, "not found", "built"),
        ("calib-empty-folder", [*b, "--calib", str(r / "empty")], 2, "", "built"),
        ("jobs-0", [*b, "--jobs", "0"], 2, "--jobs", "fresh"),
        ("jobs-negative", [*b, "--jobs", "-3"], 2, "--jobs", "fresh"),
        ("timeout-0", [*b, "--timeout", "0"], 2, "timeout", "fresh"),
        ("calib-count-0", [*b, "--calib-count", "0"], 2, "--calib-count", "fresh"),
        ("val-count-0", [*b, "--val-count", "0"], 2, "--val-count", "fresh"),
        ("shape-huge", ["build", m, "-t", "cpu", "--shape", "x:1x3x48x99999999"], 2, "too large", "fresh"),
        ("shape-bad", ["build", m, "-t", "cpu", "--shape", "x:1xax48"], 2, "integers", "fresh"),
        ("target-typo", ["build", m, "-t", "intl-cpu", "--shape", SHAPE], 2, "did you mean intel-cpu", "fresh"),
        ("precision-typo", [*b, "-p", "fp9"], 2, "unknown precision", "fresh"),
        ("precision-not-offered", [*b, "-p", "fp16"], 2, "offers", "fresh"),
        ("precision-target-not-built", [*b, "-p", "intel-cpu=int8"], 2, "not in --targets", "fresh"),
        ("option-unknown", [*b, "--option", "nosuch=1"], 2, "nosuch", "fresh"),
        ("model-missing", ["build", "nothere.onnx", "-t", "cpu"], 2, "not found", "fresh"),
        ("model-truncated", ["build", str(r / "truncated.onnx"), "-t", "cpu"], 2, "", "fresh"),
        ("model-not-onnx", ["build", str(r / "text.onnx"), "-t", "cpu"], 2, "", "fresh"),
        ("dynamic-no-shape", ["build", m, "-t", "cpu"], 2, "--shape", "fresh"),
        ("run-inventory-missing", [*run, "--devices", "nope.yaml"], 2, "does not exist", "fresh"),
        ("run-report-unwritable", [*run, "--report", str(r / "notafolder" / "r.html")], 2, "not a folder", "fresh"),
        ("run-batch-static", [*run, "--batch", "4"], 2, "--batch 4", "fresh"),
        ("run-threads-0", [*run, "--threads", "0"], 2, "--threads", "fresh"),
        ("bench-threads-0", ["bench", "--threads", "0"], 2, "--threads", "built"),
        ("bench-batch-static", ["bench", "--batch", "4"], 2, "static batch", "built"),
        ("bench-target-typo", ["bench", "--targets", "intl-cpu"], 2, "did you mean intel-cpu", "built"),
        ("bench-label-nothing", ["bench", "--label", "nothing"], 2, "no device", "built"),
        ("bench-warmup-bad", ["bench", "--warmup", "2x"], 2, "--warmup", "built"),
        ("bench-latency-bound-bad", ["bench", "--scenario", "server", "--target-qps", "5", "--latency-bound",
                                     "p100=5"], 2, "--latency-bound", "built"),
        ("bench-concurrency-no-c", ["bench", "--scenario", "concurrency"], 2, "needs --concurrency", "built"),
        ("bench-concurrency-loadgen", ["bench", "--scenario", "concurrency", "--concurrency", "4", "--load-generator",
                                       "loadgen"], 2, "closed loop", "built"),
        ("bench-workers-no-scenario", ["bench", "--workers", "2"], 2, "need --scenario", "built"),
        ("bench-concurrency-on-server", ["bench", "--scenario", "server", "--target-qps", "5", "--concurrency", "2"],
         2, "--concurrency applies to --scenario concurrency", "built"),
        ("bench-queue-delay-offline", ["bench", "--scenario", "offline", "--batch", "4", "--max-queue-delay", "2"],
         2, "dynamic batching in the server scenario", "built"),
        ("bench-queue-delay-batch-1", ["bench", "--scenario", "server", "--target-qps", "5", "--max-queue-delay",
                                       "2"], 2, "--batch >= 2", "built"),
        ("bench-no-dist", ["bench"], 2, "is not a folder", "fresh"),
        ("inventory-target-typo", ["devices", "--devices", str(r / "typo-target.yaml")], 2,
         "did you mean jetson-orin", "fresh"),
        ("inventory-yaml-syntax", ["devices", "--devices", str(r / "bad-syntax.yaml")], 2, "bad-syntax.yaml:4:",
         "fresh"),
        ("inventory-devices-key-typo", ["devices", "--devices", str(r / "devices-typo.yaml")], 2,
         "did you mean 'devices'", "fresh"),
        ("inventory-limit-nothing", ["devices", "--limit", "ghost"], 2, "ghost", "fresh"),
        ("command-typo", ["biuld"], 2, "did you mean build", "fresh"),
        ("no-command", [], 2, "", "fresh"),
        ("option-typo", ["build", m, "--targts", "cpu"], 2, "--targets", "fresh"),
        ("report-no-db", ["report", "--db", "none.db"], 2, "", "fresh"),
        ("report-target-typo", ["report", "--targets", "jetsn"], 2, "did you mean jetson-orin", "fresh"),
        ("inspect-missing", ["inspect", "nothere.onnx"], 2, "not found", "fresh"),
        ("cache-clean-nothing-said", ["cache", "clean"], 2, "--all", "fresh"),
    ]


def _one(w, case, pre: list[str] | None = None) -> tuple[str, str | None]:
    name, argv, code, needle, where = case
    cwd = w["root"] / "runs" / name
    if where == "built":
        shutil.copytree(w["built"], cwd, symlinks=True)
    else:
        cwd.mkdir(parents=True)
    before, cache_before = _tree(cwd), _tree(w["root"] / "cache")
    proc = subprocess.run([sys.executable, *(pre or ["-m", "edgeopt"]), *argv], cwd=cwd, env=w["env"], capture_output=True,
                          text=True, timeout=180)
    err = proc.stderr.strip()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    problems = []
    if proc.returncode != code:
        problems.append(f"exit {proc.returncode}, wanted {code}")
    if "Traceback" in err:
        problems.append("traceback")
    if name != "no-command":
        if not lines or not lines[0].startswith("edgeopt") or "error" not in lines[0]:
            problems.append("no error line first")
        extra = [ln for ln in lines[1:] if not ln.strip().startswith(("hint:", "  "))]
        if extra:
            problems.append(f"more than one message: {extra[:2]}")
        if needle and needle.lower() not in err.lower():
            problems.append(f"message lacks {needle!r}")
    if _tree(cwd) != before:
        problems.append(f"wrote {sorted(_tree(cwd) - before)[:3]}")
    if _tree(w["root"] / "cache") != cache_before:
        problems.append("wrote to the cache")
    return name, (f"{name}: {'; '.join(problems)} -- stderr: {err[:300]!r}" if problems else None)


def test_bad_input_battery(world):
    cases = _cases(world)
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda c: _one(world, c), cases))
    failed = [msg for _, msg in results if msg]
    assert not failed, "\n".join(failed)
    assert len(results) == len(cases) >= 35


def test_core_install_without_paramiko_gets_one_line_before_any_work(world):
    """A core install has no paramiko: an SSH device is refused up front, naming the extra, nothing built."""
    block = ["-c", "import sys; sys.modules['paramiko'] = None; from edgeopt.cli import main; "
                   "sys.exit(main(sys.argv[1:]))"]
    case = ("no-paramiko", ["run", world["model"], "-t", "cpu", "--shape", SHAPE, "--devices",
                            str(world["root"] / "ssh.yaml")], 2, "edgeopt[devices]", "fresh")
    _, problem = _one(world, case, pre=block)
    assert problem is None, problem
