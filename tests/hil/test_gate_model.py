"""A model file as CANDIDATE: built like the baseline bundle (target, precision, shapes), then gated."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import fixture
from tests.hil.models import perturbed


def test_a_changed_model_is_built_like_the_baseline_and_caught(gate_bundles, tmp_path):
    src = Path(fixture("ocr-cls"))
    bad = perturbed(src, tmp_path / "new" / src.name, scale=0.3)  # same name: a new version of the model
    p = subprocess.run([sys.executable, "-m", "edgeopt", "gate", str(bad), "--baseline", str(gate_bundles["base"]),
                        "--budget", "3s", "--calib", str(fixture("images")), "--preprocess", "preset=pm1",
                        "--dist", str(tmp_path / "dist-gate"), "--db", str(tmp_path / "r.db"), "--json", "-q"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 5, p.stderr[-2000:]
    res = json.loads(p.stdout)
    assert res["verdict"] == "regressed" and res["candidate"].startswith(str(tmp_path / "dist-gate"))
    built = json.loads((Path(res["candidate"]) / "manifest.json").read_text())
    assert (built["target"], built["precision"]) == ("cpu", "fp32")
    assert built["io"]["inputs"][0]["shape"] == [1, 3, 48, 192]  # the baseline's shapes
    bad_metrics = [v for d in res["devices"] for v in d.get("verdicts") or [] if v["verdict"] == "regressed"]
    assert bad_metrics and all(v["metric"] in ("accuracy", "decisions") for v in bad_metrics)


def test_a_model_candidate_needs_a_baseline_bundle(tmp_path):
    p = subprocess.run([sys.executable, "-m", "edgeopt", "gate", str(fixture("ocr-cls")), "--baseline",
                        "results:main", "--db", str(tmp_path / "none.db")], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "needs a baseline bundle folder" in p.stderr and "Traceback" not in p.stderr
