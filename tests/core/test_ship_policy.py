"""One accuracy policy, end to end: the README's main job's classifier built cpu fp32 + cpu int8 on its
real text-line pieces, benched on `local`, reported; the report's SHIP is what `edgeopt gate SHIP
--baseline cpu-fp32` accepts with its defaults, or the verdict line says the gate would refuse it.  The
report's per-row judgement of the gate defaults is checked against the real gate's own verdicts.

Real parts: the PP-OCR text-orientation classifier, the ocr-lines fixture, ONNX Runtime FP32 and INT8
builds, the agent's bench on `local`, the results DB, `edgeopt report`, `edgeopt gate` (paired rounds).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import fixture


def _cli(*args: str, cwd, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    from edgeopt.fixtures import ocr_lines

    work = tmp_path_factory.mktemp("ship-policy")
    p = _cli("build", str(fixture("ocr-cls")), "--shape", "x:1x3x48x192", "--calib", str(ocr_lines()),
             "--preprocess", "preset=pm1 order=bgr", "--targets", "cpu", "--precision", "fp32,int8",
             "--out", "dist", "--json", "-q", cwd=work)
    built = {f"{r['target']}-{r['precision']}": r for r in json.loads(p.stdout)["results"]} if p.stdout else {}
    assert built.get("cpu-fp32", {}).get("bundle"), p.stderr[-2000:]
    p = _cli("bench", "--dist", "dist", "--duration", "1", "--min-iters", "60", "--json", "-q", cwd=work)
    assert p.returncode == 0, p.stderr[-2000:]
    rep = _cli("report", "--format", "json", cwd=work)
    assert rep.returncode == 0, rep.stderr[-2000:]
    return {"work": work, "built": built, "report": json.loads(rep.stdout)}


def _gate(work, cand: str, base: str) -> dict:
    p = _cli("gate", f"dist/ch_ppocr_mobile_v2.0_cls_infer/{cand}", "--baseline",
             f"dist/ch_ppocr_mobile_v2.0_cls_infer/{base}", "--budget", "3s", "--db", "gate.db", "--json", "-q",
             cwd=work)
    assert p.returncode in (0, 5, 6), p.stderr[-2000:]  # pass / regressed / inconclusive: it ran
    res = json.loads(p.stdout)
    return {v["metric"]: v for v in res["devices"][0]["verdicts"]}


def test_the_ship_is_what_the_gate_defaults_accept_or_the_line_says_not(main_job):
    rep = main_job["report"]
    (v,) = rep["ship"]
    assert v["ship"] in ("cpu-fp32", "cpu-int8") and v["batch"] == 1 and v["device"] == "local"
    assert v["line"].startswith("batch 1 on local: ")
    acc = _gate(main_job["work"], v["ship"], "cpu-fp32")
    gate_accepts = all(acc[m]["verdict"] != "regressed" for m in ("accuracy", "decisions") if m in acc)
    if gate_accepts:
        assert v["gate_accepts"] is True and "gate defaults accept it against FP32" in v["line"]
    else:
        assert v["gate_accepts"] is False and "gate defaults would refuse it" in v["line"]
    if not v["clear"]:  # the evidence could not separate them: the line says so and names the paired way
        assert "no clear winner" in v["line"] or v["basis"] == "only candidate"


def test_every_rows_gate_judgement_matches_the_real_gate(main_job):
    rows = {f"{r['target']}-{r['precision']}": r for r in main_job["report"]["rows"]}
    if "cpu-int8" not in rows:
        pytest.skip("the cpu INT8 build was refused on this data: nothing to compare with the gate")
    row = rows["cpu-int8"]
    gate = _gate(main_job["work"], "cpu-int8", "cpu-fp32")
    refused = [gate[m]["reason"] for m in ("accuracy", "decisions") if m in gate and gate[m]["verdict"] == "regressed"]
    assert row["gate_accepts"] is (not refused), (row["gate_reason"], refused)
    if refused:
        assert row["gate_reason"] == "; ".join(refused)
    a = row["agreement_ci"]  # agreement with n and its 95% interval
    assert a["n"] == row["samples"] and a["ci_low"] <= a["share"] <= a["ci_high"]
