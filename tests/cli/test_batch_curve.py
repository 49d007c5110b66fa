"""build --batch LIST / bench --batch LIST: one bundle per batch size, each benched at its batch, one report."""

from __future__ import annotations

import json
import subprocess
import sys

from edgeopt.fixtures import path as fixture


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_build_and_bench_a_batch_curve(tmp_path):
    p = _cli("build", str(fixture("ocr-cls")), "-t", "cpu", "--shape", "x:1x3x48x192", "--batch", "1,2",
             "--calib", str(fixture("images")), "--preprocess", "preset=pm1", "--json", "-q", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    built = json.loads(p.stdout)["results"]
    shapes = sorted(json.loads((tmp_path / r["bundle"] / "manifest.json").read_text())["io"]["inputs"][0]["shape"][0]
                    for r in built)
    assert shapes == [1, 2] and any("batch2" in r["bundle"] for r in built)  # batch 2 under dist/batch2/
    p = _cli("bench", "--batch", "1,2", "--duration", "0.3", "--min-iters", "10", "--json", "-q", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    doc = json.loads(p.stdout)
    recs = doc["records"]
    assert sorted(r["bench"]["inputs"]["batch"] for r in recs) == [1, 2]
    assert {r["run_id"] for r in recs} == {doc["run_id"]}  # one run id for the whole curve, as printed
    for r in recs:  # images/s counts every image of a batch
        b = r["bench"]
        assert b["throughput_ips"] == b["inputs"]["batch"] * b["iterations"] / b["duration_s"]
    p = _cli("bench", "--duration", "0.3", "--min-iters", "10", "--json", "-q", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]  # no --batch: each bundle at the batch it was built at
    assert sorted(r["bench"]["inputs"]["batch"] for r in json.loads(p.stdout)["records"]) == [1, 2]
    rep = _cli("report", "--format", "md", cwd=tmp_path)
    assert rep.returncode == 0 and "| batch |" in rep.stdout and rep.stdout.count("| cpu |") == 2, rep.stdout
    p = _cli("bench", "--batch", "4", cwd=tmp_path)  # no bundle takes batch 4: refused in one line
    assert p.returncode == 2 and "--batch 4" in p.stderr and "Traceback" not in p.stderr
    p = _cli("bench", "--batch", "1,x", cwd=tmp_path)
    assert p.returncode == 2 and "--batch takes batch sizes" in p.stderr
