"""The gate's documented accuracy default is the one applied (issue 37, item 6): the decisions rule (at most
5% of the validation samples decide differently) plus each bundle's own bound; ``top1_min`` has no default.
A 15/16 top-1 candidate whose tensors pass their bound is refused, and the refusal names the decisions."""

from __future__ import annotations

import re
from pathlib import Path

from edgeopt.policy import accept, gatefile
from edgeopt.policy.gatefile import load_gate
from edgeopt.policy.stats import PairedRun, judge, overall

ROOT = Path(__file__).resolve().parents[2]


def _top1_15_of_16() -> dict:
    return {"passed": True, "samples": 16, "precision": "int8",
            "outputs": {"logits": {"passed": True, "metrics": {"top1": 15 / 16, "top1_n": 16, "cosine": 0.995}}}}


def test_the_gates_default_spec_refuses_a_15_of_16_candidate_on_decisions():
    spec = load_gate(None)
    assert spec.top1_min is None and spec.cosine_min is None  # no second, conflicting default
    base = {"accuracy": {"passed": True, "samples": 16}, "decisions": [[i % 10] for i in range(16)],
            "decisions_kind": "argmax"}
    cand = {"accuracy": _top1_15_of_16(), "decisions": [[i % 10] for i in range(15)] + [[7]],
            "decisions_kind": "argmax"}
    v = {x.metric: x for x in judge(PairedRun("d", arms=[base, cand]), spec)}
    assert v["accuracy"].verdict == "pass"  # within its bound: the tensors alone would ship it
    assert v["decisions"].verdict == "regressed" and v["decisions"].threshold == 0.05
    assert "1 of 16 validation samples decided differently (allowed 5%)" in v["decisions"].reason
    assert overall([v["accuracy"], v["decisions"]]) == "regressed"


def test_the_policy_names_the_decisions_metric_for_the_same_artifact():
    a = accept.judge(_top1_15_of_16())  # the gate's defaults, against the FP32 reference
    assert a.refused and a.metric == "decisions" and (a.differing, a.n) == (1, 16)
    assert a.threshold == 0.05 and "1 of 16" in a.reason
    assert accept.judge(_top1_15_of_16(), {"decisions": {"max_disagreement": "10%"}}).accepted is True


def test_docs_and_help_state_the_default_that_is_applied():
    from click.testing import CliRunner

    from edgeopt.commands.gate import command

    help_text = CliRunner().invoke(command, ["--help"], terminal_width=200).output
    readme = (ROOT / "README.md").read_text()
    gatefile_doc = gatefile.__doc__
    for text in (help_text, readme):
        # no uncommented `accuracy: {top1_min: ...}` line presented among the defaults
        assert not re.search(r"^\s*accuracy: \{top1_min", text, flags=re.M), text
        assert "decisions: {max_disagreement: 5%}" in text
    assert "NO default" in help_text and "the default accuracy rule" in help_text
    assert "no default" in gatefile_doc and "the decisions rule" in gatefile_doc
