"""Gate and rollout on another vendor's hardware (issue 37, item 9): an intel-cpu bundle measured on an AMD
CPU says "latency not judged: measured on another vendor's CPU (…)", as an emulated board does; accuracy
and decisions are judged as everywhere. The same words in the verdict line, the JUnit and the Markdown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeopt.hil.junit import junit_xml, markdown, not_judged_line
from edgeopt.hil.paired import fingerprint, vendor_mismatch
from edgeopt.policy.gatefile import load_gate
from edgeopt.policy.stats import PairedRun, judge, judge_unpaired, other_vendor

AMD = "AMD EPYC 7B13 64-Core Processor"


def _run(slow: float, seed: int = 5) -> PairedRun:
    rng = np.random.default_rng(seed)
    blocks = []
    for r in range(20):
        for arm in ("AB" if r % 2 == 0 else "BA"):
            blocks.append({"arm": arm, "ms": list((slow if arm == "B" else 1.0) * rng.lognormal(0, 0.03, 20))})
    base = {"decisions": [[i % 3] for i in range(16)], "accuracy": {"passed": True, "samples": 16}}
    cand = {"decisions": [[i % 3] for i in range(15)] + [[9]], "accuracy": {"passed": True, "samples": 16}}
    return PairedRun("nuc-on-amd", blocks, arms=[base, cand], calls=2, min_calls=2)


def test_the_vendor_rule_is_the_reports():
    assert vendor_mismatch("intel-cpu", AMD) and "another vendor's CPU" in vendor_mismatch("intel-cpu", AMD)
    assert vendor_mismatch("intel-cpu", "Intel(R) Xeon(R) Platinum 8480+") is None
    assert vendor_mismatch("cpu", AMD) is None  # the generic cpu target is for any x86 CPU
    assert vendor_mismatch("intel-cpu", None) is None  # cannot tell: judged
    fp = fingerprint({"cpu": {"model": AMD}}, {"target": "intel-cpu"})
    assert "intel-cpu artifact on AMD EPYC" in fp["other_vendor"]
    assert "other_vendor" not in fingerprint({"cpu": {"model": AMD}}, {"target": "cpu"})


def test_latency_on_another_vendors_cpu_is_not_judged_but_accuracy_is():
    spec = load_gate(None)
    assert {v.metric: v.verdict for v in judge(_run(1.3), spec)}["p50"] == "regressed"  # a clear slowdown ...
    run = _run(1.3)
    run.fingerprint = fingerprint({"cpu": {"model": AMD}}, {"target": "intel-cpu"})
    got = {v.metric: v for v in judge(run, spec)}
    for m in ("p50", "p90"):  # ... is not judged there
        assert got[m].verdict == "inconclusive"
        assert got[m].reason.startswith("not judged: measured on another vendor's CPU (intel-cpu artifact on AMD")
        assert "the rounds said regressed" in got[m].reason and got[m].ratio > 1.2  # figures kept
    assert got["decisions"].verdict == "regressed"  # 1 of 16 differs (6.25% > 5%): accuracy still judged
    assert got["accuracy"].verdict == "pass"
    unpaired = judge_unpaired([b["ms"] for b in run.blocks if b["arm"] == "A"],
                              [b["ms"] for b in run.blocks if b["arm"] == "B"], spec, run.arms[1],
                              other_vendor=other_vendor(run))
    assert all(v.verdict == "inconclusive" and "another vendor" in v.reason for v in unpaired
               if v.metric in ("p50", "p90"))


def test_junit_and_markdown_say_latency_not_judged():
    run = _run(1.0)
    run.fingerprint = fingerprint({"cpu": {"model": AMD}}, {"target": "intel-cpu"})
    dev = {"device": "nuc-01", "verdicts": [v.as_dict() for v in judge(run, load_gate(None))], "verdict": "regressed"}
    result = {"model": "m", "target": "intel-cpu", "verdict": "regressed", "baseline_id": "a" * 20,
              "candidate_id": "b" * 20, "devices": [dev]}
    assert not_judged_line(dev).startswith("latency not judged: measured on another vendor's CPU (intel-cpu")
    md = markdown(result)
    assert "| nuc-01 | p50 | ⚠️ not judged (another vendor's CPU) |" in md
    assert "- ⚠️ nuc-01: latency not judged: measured on another vendor's CPU (intel-cpu artifact on AMD" in md
    assert "| nuc-01 | decisions | ❌ regressed |" in md
    xml = junit_xml(result)
    assert 'message="latency not judged: measured on another vendor' in xml


def _local_vendor() -> str | None:
    from edgeopt.decide import cpu_vendor
    from edgeopt_agent.probe import cpu_info

    return cpu_vendor(cpu_info().get("model"))


def test_a_real_intel_cpu_gate_on_this_amd_host(tmp_path):
    """The real thing where this host is not Intel: an intel-cpu bundle of the PP-OCR classifier gated
    against itself on `local` (one agent call, latency not judged, accuracy judged), exit 6."""
    if _local_vendor() in (None, "intel"):
        pytest.skip("this host's CPU is Intel (or unknown): an intel-cpu bundle's latency is judged here")
    pytest.importorskip("openvino")
    from edgeopt.pipeline import build
    from tests.conftest import fixture

    rep = build(Path(fixture("ocr-cls")), "intel-cpu", ["fp32"], shapes={"x": [1, 3, 48, 192]},
                calib=str(fixture("images")), preprocess="preset=pm1", out=tmp_path / "dist", n_calib=4, n_val=8)
    assert rep.ok, rep.results
    b = str(rep.results[0].bundle)
    p = subprocess.run([sys.executable, "-m", "edgeopt", "gate", b, "--baseline", b, "--budget", "30s", "--json",
                        "--md", "g.md", "--junit", "g.xml", "--db", "r.db"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 6, p.stderr[-2000:]
    res = json.loads(p.stdout)
    dev = res["devices"][0]
    v = {x["metric"]: x for x in dev["verdicts"]}
    assert dev["calls"] == 1 and "another vendor's CPU" in dev["fingerprint"]["other_vendor"]
    assert all(v[m]["verdict"] == "inconclusive" and v[m]["reason"].startswith("not judged: measured on another")
               for m in ("p50", "p90"))
    assert v["accuracy"]["verdict"] == "pass" and v["decisions"]["verdict"] == "pass"
    assert "latency not judged: measured on another vendor's CPU" in p.stderr.splitlines()[-1]
    assert "not judged (another vendor's CPU)" in (tmp_path / "g.md").read_text()
    assert "latency not judged: measured on another vendor" in (tmp_path / "g.xml").read_text()


def test_the_reports_gate_section_says_not_judged():
    from edgeopt.gate_report import section_html

    run = _run(1.0)
    run.fingerprint = fingerprint({"cpu": {"model": AMD}}, {"target": "intel-cpu"})
    rec = {"status": "gate-regressed", "gate_id": "g1", "time": "2026-11-28T10:00:00Z", "baseline_id": "a" * 20,
           "bundle": {"model": "m", "target": "intel-cpu", "precision": "int8", "bundle_id": "b" * 20},
           "device": {"name": "nuc-01"},
           "gate": {"verdict": "regressed", "verdicts": [v.as_dict() for v in judge(run, load_gate(None))]}}
    html = section_html([rec], plots=False)
    assert "not judged (another vendor&#x27;s CPU)" in html and ">regressed<" in html  # decisions: 1 of 16
