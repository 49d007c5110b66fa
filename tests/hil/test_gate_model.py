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


# --- issue 37, item 4: the candidate is built on the baseline's recorded data, or refused; random is named --

def _gate_model(model, baseline, tmp_path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", "gate", str(model), "--baseline", str(baseline),
                           "--budget", "3s", "--dist", str(tmp_path / "dist-gate"), "--db", str(tmp_path / "r.db"),
                           "--on-inconclusive", "pass", *extra], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)


def test_without_calib_the_candidate_is_built_on_the_baselines_data(gate_bundles, tmp_path):
    src = Path(fixture("ocr-cls"))
    same = tmp_path / "new" / src.name
    same.parent.mkdir()
    same.write_bytes(src.read_bytes())  # the same model as a new version: the gate must not call it regressed
    # what is tested is the data the candidate is built on: latency ungated (two equal models' latencies are
    # "regressed" at the gate's level, 5%, of the time by design; CI at 34c0bdb saw p90 once)
    quiet = tmp_path / "gate.yaml"
    quiet.write_text("p50: off\np90: off\n")
    p = _gate_model(same, gate_bundles["base"], tmp_path, "--json", "-q", "--gate", str(quiet))
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout)
    base = json.loads((Path(gate_bundles["base"]) / "manifest.json").read_text())["validation"]["source"]
    built = json.loads((Path(res["candidate"]) / "manifest.json").read_text())["validation"]["source"]
    assert built["kind"] == "images" and built["path"] == base["path"]
    assert built["preprocess"] == base["preprocess"]  # preset=pm1 as the baseline, not the imagenet default
    assert (built["calibration_samples"], built["validation_samples"]) == (base["calibration_samples"],
                                                                           base["validation_samples"])
    v = {x["metric"]: x for x in res["devices"][0]["verdicts"]}
    assert v["decisions"]["verdict"] == "pass" and v["decisions"]["ratio"] == 0  # same model, same data
    assert "data_note" not in res


def test_a_baseline_whose_data_is_gone_is_refused_before_any_work(gate_bundles, tmp_path):
    import shutil

    base = tmp_path / "base"
    shutil.copytree(gate_bundles["base"], base)
    man = json.loads((base / "manifest.json").read_text())
    man["validation"]["source"]["path"] = str(tmp_path / "moved-away")
    (base / "manifest.json").write_text(json.dumps(man))
    p = _gate_model(fixture("ocr-cls"), base, tmp_path)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "not found here" in p.stderr and "moved-away" in p.stderr and "--calib" in p.stderr
    assert "Traceback" not in p.stderr and len([ln for ln in p.stderr.splitlines() if ln.strip()]) <= 2
    assert not (tmp_path / "dist-gate").exists() and not (tmp_path / "r.db").exists()  # nothing built or measured


def test_random_data_is_named_in_the_verdict_line_junit_and_markdown(tmp_path):
    from edgeopt.pipeline import build

    src = Path(fixture("ocr-cls"))
    rep = build(src, "cpu", ["fp32"], shapes={"x": [1, 3, 48, 192]}, calib=None, out=tmp_path / "dist-rnd",
                n_calib=4, n_val=8)
    assert rep.ok, rep.results
    p = _gate_model(src, rep.results[0].bundle, tmp_path, "--junit", "g.xml", "--md", "g.md")
    assert p.returncode == 0, p.stderr[-2000:]
    built = json.loads((next((tmp_path / "dist-gate").rglob("manifest.json"))).read_text())
    assert built["validation"]["source"]["kind"] == "random"  # as the baseline: the same (seeded) inputs
    verdict_line = [ln for ln in p.stderr.splitlines() if ln.startswith("edgeopt gate: local:")][-1]
    assert "RANDOM data: the baseline and candidate bundles were calibrated and validated on random" in verdict_line
    assert "RANDOM data" in (tmp_path / "g.md").read_text()
    xml = (tmp_path / "g.xml").read_text()
    assert 'name="data" value="RANDOM data' in xml and "WARNING: RANDOM data" in xml


def test_preprocessing_is_carried_exactly():
    from edgeopt.calib import Preprocess
    from edgeopt.hil.gate import preprocess_text

    for text, channels in (("preset=pm1", None), ("preset=imagenet resize=256 crop=1 order=bgr", None),
                           ("preset=raw layout=nhwc scale=1/255 mean=0.1,0.2,0.3 std=2,2,2", None),
                           ("preset=pm1", 1)):
        cfg = Preprocess.parse(text).resolved(channels)
        assert Preprocess.parse(preprocess_text(cfg)).resolved(channels) == cfg
    assert preprocess_text(None) is None
