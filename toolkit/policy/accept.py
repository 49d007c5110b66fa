"""The accuracy policy: does an artifact hold against its FP32 reference?  One rule, one implementation.

The rule is the gate's default (``edgeopt gate`` and ``edgeopt rollout`` without a gate file), overridden by
one gate file that every command takes the same way (``--accept FILE``, the keys of ``GATE.yaml``):

* **the bundle's own bound** (``edgeopt_agent.compare``'s per-tensor metrics at the artifact's precision):
  a miss refuses, and names the metric;
* **the decisions** of the first output that has them, by its kind (top-1 of a class distribution, labels,
  thresholded decisions, CTC decodings, boxes after the model's own decoding, per-position argmax), counted
  on distinct validation samples against the FP32 reference: at most ``decisions.max_disagreement``
  (default 5%) may differ; the count is given with its 95% Wilson interval;
* ``accuracy.top1_min`` / ``cosine_min`` / ``seq_match_min`` when the gate file sets them (no default).

``judge(accuracy)`` takes what the host check, the INT8 searches and the device's bench all produce
(``compare_outputs``' result: ``{"passed", "outputs": {name: {"metrics", "reasons", ...}}, "samples"}``) and
returns an ``Acceptance``: accepted or refused, the metric that decided, its value, the threshold, k of n.
The build's per-tensor figures stay in the result as the diagnosis; the word is this one.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgeopt.policy.gatefile import GateSpec, load_gate


def _rules_rev() -> str:
    """The rule's revision: a hash of the code that judges (this module and the agent's ``compare``), so an
    outcome cached under an earlier rule -- a refusal included -- is judged again after any change to it."""
    import hashlib

    import edgeopt_agent.compare as compare

    h = hashlib.sha256()
    for f in (__file__, compare.__file__):
        h.update(Path(f).read_bytes())
    return "policy-1:" + h.hexdigest()[:12]


# In every build's cache key: an outcome judged under an earlier rule is judged again.
REV = _rules_rev()
Z95 = 1.959963984540054


def mapping_of(source: str | Path | dict[str, Any] | None) -> dict[str, Any] | None:
    """A gate file as the plain mapping a build job and a manifest carry (checked: a bad key or value is a
    UsageError, exit 2); None for the defaults."""
    if source is None:
        return None
    if isinstance(source, dict):
        load_gate(source)
        return dict(source)
    import yaml

    load_gate(source)  # every key and value checked, with the file's name in the message
    return yaml.safe_load(Path(source).read_text()) or {}


def spec_of(source: GateSpec | str | Path | dict[str, Any] | None) -> GateSpec:
    """The policy's thresholds: the defaults (None), a gate file's path, its parsed mapping, or a spec."""
    return source if isinstance(source, GateSpec) else load_gate(source)


# --- counts with an interval ---------------------------------------------------------------------

def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of k successes in n (95% by default)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def flip_n(m: dict[str, Any]) -> int:
    """How many thresholded decisions a ``flip_rate`` was counted over (0: not measured)."""
    if not _num(m.get("flip_rate")) or not _num(m.get("flips")):
        return 0
    if _num(m.get("positions")) and m["positions"] > 0:
        return int(m["positions"])
    return int(round(m["flips"] / m["flip_rate"])) if m["flip_rate"] > 0 else 0


def agreement(acc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The task agreement with the FP32 reference as a count with its 95% Wilson interval: the worst
    output's top-1 agreement, decodings equal, boxes matched or decisions kept (None: not measured)."""
    worst = None
    outputs = (acc or {}).get("outputs") if isinstance(acc, dict) else None
    for name, o in (outputs.items() if isinstance(outputs, dict) else ()):
        m = (o or {}).get("metrics") if isinstance(o, dict) else None
        if not isinstance(m, dict):
            continue
        for key, nkey, what in (("top1", "top1_n", "top-1"), ("seq_match", "sequences", "decoded equal"),
                                ("box_match", "boxes", "boxes matched")):
            if _num(m.get(key)) and _num(m.get(nkey)) and m[nkey] > 0 and 0 <= m[key] <= 1:
                n = int(m[nkey])
                item = (float(m[key]), int(round(m[key] * n)), n, what, name)
                worst = item if worst is None or item[0] < worst[0] else worst
        n = flip_n(m)
        if n:
            item = (1 - float(m["flip_rate"]), n - int(m["flips"]), n, "decisions kept", name)
            worst = item if worst is None or item[0] < worst[0] else worst
    if worst is None:
        return None
    share, k, n, what, name = worst
    lo, hi = wilson(k, n)
    return {"metric": what, "output": name, "share": share, "k": k, "n": n, "ci_low": lo, "ci_high": hi,
            "ci": "95% Wilson"}


def agreement_text(a: dict[str, Any] | None) -> str:
    if not a:
        return ""
    return f"{a['share']:.1%} ({a['k']}/{a['n']}, 95% CI {a['ci_low']:.0%}–{a['ci_high']:.0%})"


def decisions_of(acc: dict[str, Any]) -> tuple[int, int, str] | None:
    """(differing, n, kind) of the first output's decisions against the FP32 reference, as the check or
    the bench counted them (what the gate counts against the baseline's decisions)."""
    d = _decisions(acc)
    return d[:3] if d else None


def _decisions(acc: dict[str, Any]) -> tuple[int, int, str, str] | None:
    """``decisions_of`` and the output's name."""
    for name, o in ((acc or {}).get("outputs") or {}).items():  # the first output with decisions, as the gate's
        m = (o or {}).get("metrics") or {}
        if _num(m.get("seq_match")) and _num(m.get("sequences")) and m["sequences"] > 0:
            n = int(m["sequences"])
            return n - int(round(m["seq_match"] * n)), n, "decision", name
        if "max_abs_prob" in m and (n := flip_n(m) or int(acc.get("samples") or 0)):  # probability@T: samples
            return int(m["flips"]), n, "probability", name  # with a class across T
        if _num(m.get("top1")) and _num(m.get("top1_n")) and m["top1_n"] > 0:
            n = int(m["top1_n"])
            return n - int(round(m["top1"] * n)), n, "label" if m.get("label_output") else "argmax", name
        if _num(m.get("box_match")) and _num(m.get("boxes")) and m["boxes"] > 0:  # a detector: its boxes
            n = int(m["boxes"])
            return n - int(round(m["box_match"] * n)), n, "detection", name
        if _num(m.get("windows_equal")) and acc.get("samples"):  # per-position classes
            n = int(acc["samples"])
            return n - int(round(m["windows_equal"] * n)), n, "argmax", name
        n = flip_n(m)
        if n:
            return int(m["flips"]), n, "decision", name
    return None


# --- the verdict ---------------------------------------------------------------------------------

@dataclass
class Acceptance:
    """The policy's word on one artifact, with what decided it."""

    accepted: bool | None  # None: cannot tell (no accuracy measured here)
    metric: str = ""  # what decided: "decisions" | "bound" | "top1_min" | "cosine_min" | "seq_match_min" | ""
    value: float | None = None  # the decided metric's value (decisions: the share that differ)
    threshold: float | None = None
    differing: int | None = None  # decisions: k of n distinct samples (boxes for a detector) differ
    n: int | None = None
    ci_low: float | None = None  # 95% Wilson interval of the share that differ
    ci_high: float | None = None
    kind: str = ""  # the decisions' kind (argmax, label, decision, probability, detection)
    reason: str = ""  # one line: why accepted or refused
    source: str = "defaults"  # the gate file the thresholds came from

    @property
    def refused(self) -> bool:
        return self.accepted is False

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    def word(self) -> str:
        return {True: "accepted", False: "REFUSED", None: "not judged"}[self.accepted]


def _decision_text(diff: int, n: int, kind: str, limit: float) -> str:
    unit = "boxes" if kind == "detection" else "distinct validation samples"
    lo, hi = wilson(diff, n)
    return (f"{diff} of {n} {unit} decided differently ({diff / n:.1%}, 95% CI {lo:.0%}–{hi:.0%}; "
            f"allowed {limit * 100:g}%)")


def judge(acc: dict[str, Any] | None, spec: GateSpec | str | Path | dict[str, Any] | None = None,
          baseline_acc: dict[str, Any] | None = None) -> Acceptance:
    """The policy on one artifact's accuracy against its FP32 reference (``compare_outputs``' result, the
    host check's, or the device bench's ``accuracy``).  Judged by the gate's own code (``stats.judge``)."""
    from edgeopt.policy.stats import PairedRun, _accuracy_verdicts  # the gate's accuracy verdicts, no latency

    spec = spec_of(spec)
    if not isinstance(acc, dict) or acc.get("passed") is None:  # absent, or not judged here (an h100 check)
        return Acceptance(None, reason="no accuracy measured here", source=spec.source)
    cand: dict[str, Any] = {"accuracy": acc}
    base: dict[str, Any] = {"accuracy": baseline_acc or {}}
    d = decisions_of(acc)
    if d is not None and d[1] > 0:
        diff, n, kind = d
        base["decisions"] = [[0]] * n
        cand["decisions"] = [[0]] * (n - diff) + [[1]] * diff
        base["decisions_kind"] = cand["decisions_kind"] = kind
    verdicts = {v.metric: v for v in _accuracy_verdicts(PairedRun("policy", arms=[base, cand]), spec)}
    out = Acceptance(True, source=spec.source)
    limit = spec.max_disagreement if spec.max_disagreement is not None else 0.05
    dv = verdicts.get("decisions")
    if d is not None and d[1] > 0:
        diff, n, kind = d
        lo, hi = wilson(diff, n)
        out.differing, out.n, out.kind, out.ci_low, out.ci_high = diff, n, kind, lo, hi
    if dv is not None and dv.verdict == "regressed":
        out.accepted, out.metric, out.value, out.threshold = False, "decisions", dv.ratio, limit
        out.reason = _decision_text(out.differing or 0, out.n or 0, out.kind, limit)
        return out
    av = verdicts.get("accuracy")
    if av is not None and av.verdict == "regressed":
        out.accepted = False
        if acc.get("passed") is False:  # the bundle's own bound: name the output and metric that missed
            failed = [(name, o) for name, o in (acc.get("outputs") or {}).items()
                      if isinstance(o, dict) and o.get("passed") is False]
            name, o = failed[0] if failed else ("", {})
            why = "; ".join((o.get("reasons") or [])[:2]) or str(acc.get("summary") or "see metrics")
            out.metric = "bound"
            out.reason = f"misses its {acc.get('precision') or ''} bound".replace("  ", " ") + (
                f" on output {name!r}: {why}" if name else f": {why}")
        else:
            key = next((k for k in ("top1_min", "cosine_min", "seq_match_min") if k.split("_")[0] in av.reason
                        or k in av.reason), "accuracy")
            out.metric, out.threshold = key, getattr(spec, key, None)
            out.value = av.candidate
            out.reason = av.reason
        return out
    if dv is not None:
        out.metric, out.value, out.threshold = "decisions", dv.ratio, limit
        out.reason = _decision_text(out.differing or 0, out.n or 0, out.kind, limit)
    else:
        out.reason = "within its bound" + (f" over {acc.get('samples')} validation samples" if acc.get("samples") else "")
    return out


def accepts(acc: dict[str, Any] | None, spec: GateSpec | str | Path | dict[str, Any] | None = None) -> bool:
    """True only when the policy accepts (False for a refusal and for 'cannot tell')."""
    return judge(acc, spec).accepted is True


def apply(result: dict[str, Any], spec: GateSpec | str | Path | dict[str, Any] | None = None) -> Acceptance:
    """Make a comparison result (``compare_outputs``' or the host check's) say the policy's word: ``passed``
    becomes the policy's, the per-tensor verdict stays as ``bound_passed``, the policy's reasons join the
    deciding output's ``reasons`` (so every line that shows a failure names the metric, its value and the
    threshold), and ``policy`` records the whole ``Acceptance``.  Judging an applied result again gives the
    same word."""
    a = judge(result, spec)
    if a.accepted is None or not isinstance(result, dict) or "error" in result:
        return a
    result.setdefault("bound_passed", bool(result.get("passed")))
    result["policy"] = a.as_dict()
    if a.refused and result.get("passed"):
        from edgeopt_agent.compare import summary_line

        result["passed"] = False
        outs = result.get("outputs") or {}
        d = _decisions(result)
        name = d[3] if d and a.metric == "decisions" else next(iter(outs), None)
        if name is not None and isinstance(outs.get(name), dict):
            o = outs[name]
            o["passed"] = False
            o["reasons"] = [*(o.get("reasons") or []), f"policy: {a.metric}: {a.reason}"]
            o["failed"] = [*(o.get("failed") or []), a.metric]
        result["summary"] = summary_line(result)
    return a
