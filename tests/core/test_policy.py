"""One accuracy policy (``edgeopt.policy.accept``), upstream of the report too: the host check, ``auto``, every
INT8 search and the report say the same word.

Unit part: the rule on compare results of each output kind (decisions on distinct samples with a Wilson
interval, the bound's miss named, a gate file's override, idempotent ``apply``).  Real part: the README's main
job (the PP-OCR orientation classifier on its real text-line pieces, cpu / intel-cpu / mobile, ``auto``) built,
benched on ``local`` and reported: every target ends with an artifact the policy accepts (or a refusal naming
the metric and the fallback taken), and no report row says REFUSE for an artifact ``auto`` chose.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgeopt.policy import accept
from tests.conftest import fixture


def _cls(k: int, n: int, passed: bool = True, cos: float = 0.999) -> dict:
    return {"passed": passed, "samples": n, "precision": "int8",
            "outputs": {"probs": {"passed": passed, "reasons": [] if passed else ["cosine 0.9500 < 0.97"],
                                  "metrics": {"top1": k / n, "top1_n": n, "cosine": cos}, "kind": "classification"}}}


def test_one_decision_of_16_is_refused_and_named_with_its_interval():
    a = accept.judge(_cls(15, 16))
    assert a.refused and a.metric == "decisions" and (a.differing, a.n) == (1, 16) and a.threshold == 0.05
    assert a.value == pytest.approx(1 / 16) and a.ci_low < 1 / 16 < a.ci_high
    assert a.reason == "1 of 16 distinct validation samples decided differently (6.2%, 95% CI 1%–28%; allowed 5%)"


def test_one_decision_of_20_is_accepted_and_a_gate_file_widens_the_rule(tmp_path):
    assert accept.judge(_cls(19, 20)).accepted is True
    gate = tmp_path / "accept.yaml"
    gate.write_text("decisions: {max_disagreement: 10%}\n")
    a = accept.judge(_cls(15, 16), gate)
    assert a.accepted is True and a.threshold == 0.10 and a.source == str(gate)
    assert accept.mapping_of(gate) == {"decisions": {"max_disagreement": "10%"}}


def test_a_missed_bound_names_the_output_and_the_metric():
    a = accept.judge(_cls(16, 16, passed=False, cos=0.95))
    assert a.refused and a.metric == "bound" and "'probs'" in a.reason and "cosine 0.9500 < 0.97" in a.reason


def test_detector_boxes_and_thresholded_decisions_are_counted_by_their_kind():
    det = {"passed": True, "samples": 8, "outputs": {"output0": {"passed": True, "reasons": [], "metrics": {
        "box_match": 103 / 105, "boxes": 105, "cosine": 0.99}}}}
    a = accept.judge(det)
    assert a.accepted is True and (a.differing, a.n, a.kind) == (2, 105, "detection") and "boxes" in a.reason
    flips = {"passed": True, "samples": 40, "outputs": {"p": {"passed": True, "reasons": [], "metrics": {
        "flip_rate": 3 / 40, "flips": 3, "cosine": 0.99}}}}
    a = accept.judge(flips)
    assert a.refused and (a.differing, a.n, a.kind) == (3, 40, "decision")


def test_no_decisions_leaves_the_bound_to_decide_and_no_accuracy_is_not_judged():
    emb = {"passed": True, "samples": 8, "outputs": {"e": {"passed": True, "reasons": [], "metrics": {"cosine": 0.999}}}}
    assert accept.judge(emb).accepted is True and accept.judge(emb).metric == ""
    assert accept.judge(None).accepted is None and accept.judge({"passed": None}).accepted is None


def test_apply_makes_the_check_say_the_policys_word_and_is_idempotent():
    from edgeopt_agent.compare import summary_line

    r = _cls(15, 16)
    a = accept.apply(r)
    assert r["passed"] is False and r["bound_passed"] is True and r["policy"]["metric"] == "decisions"
    assert "policy: decisions: 1 of 16" in r["summary"] and r["summary"] == summary_line(r)
    again = accept.apply(r)
    assert again.accepted is False and again.reason == a.reason and r["bound_passed"] is True


def test_a_bad_accept_file_is_refused_before_anything_builds(tmp_path):
    from edgeopt.errors import UsageError

    bad = tmp_path / "a.yaml"
    bad.write_text("decisons: {max_disagreement: 5%}\n")
    with pytest.raises(UsageError, match="did you mean 'decisions'"):
        accept.mapping_of(bad)


def test_the_int8_pick_is_not_decided_by_timing_noise():
    from edgeopt.targets.qdq_search import slower

    fast = [1.00, 1.02, 0.99, 1.01, 1.00]
    assert not slower([1.02, 1.00, 1.03, 0.99, 1.05], fast)  # within noise: a tie, accuracy decides
    assert not slower([1.10, 1.12, 1.09, 1.00, 1.11], fast)  # not slower in every round
    assert slower([1.10, 1.12, 1.09, 1.08, 1.11], fast)


# --- the README's main job ------------------------------------------------------------------------

def _cli(*args: str, cwd, env=None, timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    import os

    from edgeopt.fixtures import ocr_lines

    work = tmp_path_factory.mktemp("policy-main-job")
    env = {**os.environ, "EDGEOPT_CACHE_DIR": str(work / "cache")}  # a fresh cache, as a new user has
    b = _cli("build", str(fixture("ocr-cls")), "--shape", "x:1x3x48x192", "--calib", str(ocr_lines()),
             "--preprocess", "preset=pm1 order=bgr", "--targets", "cpu,intel-cpu,mobile", "--precision", "auto",
             "--out", "dist", "--json", cwd=work, env=env)
    assert b.returncode == 0, b.stderr[-3000:]
    p = _cli("bench", "--dist", "dist", "--duration", "1", "--min-iters", "60", "--json", "-q", cwd=work, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    rep = _cli("report", "--format", "json", cwd=work, env=env)
    assert rep.returncode == 0, rep.stderr[-2000:]
    return {"build": json.loads(b.stdout), "stderr": b.stderr, "report": json.loads(rep.stdout)}


def test_main_job_every_target_ends_accepted_or_names_the_metric_and_the_fallback(main_job):
    results = main_job["build"]["results"]
    assert {r["target"] for r in results} == {"cpu", "intel-cpu", "mobile"}
    for r in results:
        assert r["status"] in ("built", "cached", "up-to-date"), r
        assert r["check"]["passed"] is True, r["check"]
        fb = r.get("fallback_from")
        if fb:  # auto's first choice was refused: the line names the metric that failed
            assert any(w in fb["error"] for w in ("policy:", "bound", "decided differently", "<", ">")), fb
            assert f"{r['target']} {fb['precision']} (auto) refused; building {r['precision']} instead" \
                in main_job["stderr"]


def test_main_job_no_report_row_refuses_what_auto_chose(main_job):
    built = {(r["target"], r["precision"]) for r in main_job["build"]["results"]}
    rows = [r for r in main_job["report"]["rows"] if (r["target"], r["precision"]) in built]
    assert {(r["target"], r["precision"]) for r in rows} == built
    for r in rows:
        assert r["gate_accepts"] is not False, (r["target"], r["precision"], r["gate_reason"])


def test_the_policy_package_imports_none_of_its_callers():
    code = ("import sys, edgeopt.policy.accept as a; a.judge({'passed': True, 'outputs': {}}); "
            "print(sorted(m for m in sys.modules if m.startswith('edgeopt')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(eval(out))  # noqa: S307 - our own printed list
    assert not {m for m in loaded if m.split(".")[1:2] and m.split(".")[1] in
                ("hil", "targets", "pipeline", "reporting", "decide", "api", "commands", "fleet", "debug", "tuning")}, loaded
