"""The gate file: which metrics are gated and by how much (``GATE.yaml``), with defaults.

Every key keeps its default unless the file gives it (naming only ``p90`` still gates p50 at 5%); a
metric is ungated only when set to ``off`` (``p50: off``). Percentages are written with ``%``; a bare
number is a fraction (``0.05``), and a bare number above 1 is refused ("did you mean 10%?").

The accuracy default is the decisions rule and nothing else: at most 5% of the validation samples'
decisions (by the output's kind; a detector's boxes) may differ — candidate against baseline in the
gate, artifact against its FP32 reference in the policy (``accept.judge``) — plus each bundle's own
host-check bound, which always applies.  ``accuracy.top1_min``/``cosine_min``/``seq_match_min`` have
no default: they are gated only when the file gives them.  The example below sets keys beyond the
defaults (``p99``, ``throughput``, ``accuracy``, a 1% ``decisions``):

```yaml
p50: {max_slowdown: 5%}
p90: {max_slowdown: 10%}
p99: {max_slowdown: 10%, max_ms: 20}
throughput: {max_drop: 5%}       # opt-in
accuracy: {top1_min: 0.99}        # opt-in, no default; or {cosine_min: 0.999}, {seq_match_min: 0.95} (CTC:
                                  # decodings equal); always also the bundle's own host-check bound
decisions: {max_disagreement: 1%}  # default 5%: candidate vs baseline decisions on the same inputs (for a
                                   # CTC recogniser: the decoded text, so a merged word counts)
cold_start: {max_slowdown: 20%}    # opt-in: load + first inference, in fresh processes (A B B A ...)
memory: {max_increase: 10%}        # opt-in: peak RSS of those fresh processes (or {max_mb: 500})
fresh_runs: 6                      # fresh processes per arm for cold_start/memory
level: 0.05                        # family-wise error rate across the gated latency metrics (Holm)
rounds: {start: 10, max: 320}      # paired rounds per arm: doubling, stop when decided or at the budget
unpaired: {session_margin: 2%, max_speed_change: 5%}  # against a stored baseline: the interval widened
                                   # by session_margin; the device's calibration speed may differ by max_speed_change
```
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeopt.errors import UsageError, yaml_error

LATENCY = ("p50", "p90", "p99")
DEFAULT_SLOWDOWN = {"p50": 0.05, "p90": 0.10, "p99": 0.10}  # a latency metric given without max_slowdown
DEFAULT_LATENCY = ("p50", "p90")  # gated unless set to off
OFF_KEYS = ("p50", "p90", "p99", "throughput", "decisions", "cold_start", "memory")
# Samples needed before a tail percentile is judged at all (MLPerf LoadGen's early-stopping minimums).
MIN_SAMPLES = {"p50": 1, "p90": 64, "p99": 662}
KEYS = {
    "p50": {"max_slowdown", "max_ms"}, "p90": {"max_slowdown", "max_ms"}, "p99": {"max_slowdown", "max_ms"},
    "throughput": {"max_drop"}, "accuracy": {"top1_min", "cosine_min", "seq_match_min"},
    "decisions": {"max_disagreement"}, "cold_start": {"max_slowdown", "max_ms"}, "memory": {"max_increase", "max_mb"},
    "fresh_runs": None, "level": None, "rounds": {"start", "max"}, "block_iters": None,
    "unpaired": {"session_margin", "max_speed_change"},
}
_PCT = re.compile(r"^(\d+(?:\.\d+)?)%$")


@dataclass
class Threshold:
    metric: str
    max_change: float | None = None  # relative, 0.05 = 5 %
    max_ms: float | None = None


@dataclass
class GateSpec:
    latency: dict[str, Threshold] = field(default_factory=lambda: {
        "p50": Threshold("p50", 0.05), "p90": Threshold("p90", 0.10)})
    throughput_max_drop: float | None = None  # opt-in: block means are outlier-prone (p50 gates the centre)
    top1_min: float | None = None
    cosine_min: float | None = None
    seq_match_min: float | None = None  # CTC recognisers: share of decodings equal to the FP32 reference's
    max_disagreement: float | None = None
    decisions_gated: bool = True  # False: `decisions: off`
    cold_start: Threshold | None = None  # opt-in: fresh processes per arm, load + first inference (ms)
    memory: Threshold | None = None  # opt-in: peak RSS of those processes (max_ms holds max MB)
    fresh_runs: int = 6
    level: float = 0.05
    rounds_start: int = 10
    rounds_max: int = 320  # a cap; the time budget is what binds for any model slower than ~0.1 ms
    block_iters: int = 20
    session_margin: float = 0.02  # unpaired only: session-to-session variation the interval is widened by
    max_speed_change: float = 0.05  # unpaired only: calibration speed change beyond which it cannot decide
    source: str = "defaults"

    def as_dict(self) -> dict[str, Any]:
        return {"latency": {k: {"max_slowdown": v.max_change, "max_ms": v.max_ms} for k, v in self.latency.items()},
                "throughput_max_drop": self.throughput_max_drop, "top1_min": self.top1_min,
                "cosine_min": self.cosine_min,
                "seq_match_min": self.seq_match_min, "max_disagreement": self.max_disagreement,
                "decisions_gated": self.decisions_gated,
                "cold_start": ({"max_slowdown": self.cold_start.max_change, "max_ms": self.cold_start.max_ms}
                               if self.cold_start else None),
                "memory": ({"max_increase": self.memory.max_change, "max_mb": self.memory.max_ms}
                           if self.memory else None), "fresh_runs": self.fresh_runs, "level": self.level,
                "rounds": {"start": self.rounds_start, "max": self.rounds_max}, "block_iters": self.block_iters,
                "unpaired": {"session_margin": self.session_margin, "max_speed_change": self.max_speed_change},
                "source": self.source}


def _did_you_mean(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_fraction(value: Any, where: str, upper: float = 1.0) -> float:
    """``5%`` or ``0.05`` → 0.05; refuses ``5 %``, negatives, anything above ``upper``, and a bare number
    above 1 (``max_slowdown: 10`` would be 1000%: "did you mean 10%?")."""
    if isinstance(value, bool):
        raise UsageError(f"{where}: expected a percentage like 5% or a fraction like 0.05, got {value!r}")
    if isinstance(value, (int, float)):
        f = float(value)
        if f > 1:
            raise UsageError(f"{where}: a bare number is a fraction, and {value!r} would be {f * 100:g}%: "
                             f"did you mean {value!r}%?",
                             hint=f"write percentages with %: {value!r}% (or the fraction {f / 100:g})")
    elif isinstance(value, str) and _PCT.match(value.strip()) and value == value.strip():
        f = float(_PCT.match(value).group(1)) / 100
    else:
        raise UsageError(f"{where}: expected a percentage like 5% or a fraction like 0.05, got {value!r}")
    if not 0 <= f <= upper:
        raise UsageError(f"{where}: {value!r} is out of range (0 to {upper * 100:g}%)")
    return f


def _number(value: Any, where: str, lo: float, hi: float, integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and int(value) != value):
        raise UsageError(f"{where}: expected {'an integer' if integer else 'a number'}, got {value!r}")
    if not lo <= value <= hi:
        raise UsageError(f"{where}: {value!r} is out of range ({lo:g} to {hi:g})")
    return int(value) if integer else float(value)


def load_gate(source: str | Path | dict[str, Any] | None) -> GateSpec:
    """A GateSpec from a YAML file, a dict, or None (defaults). Bad keys/values: UsageError (exit 2)."""
    spec = GateSpec()
    if source is None:
        return spec
    if isinstance(source, dict):
        data, name = source, "gate"
    else:
        import yaml

        path = Path(source)
        if not path.is_file():
            raise UsageError(f"gate file {str(path)!r} does not exist")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise UsageError(yaml_error(exc, str(path))) from None
        name = str(path)
        spec.source = name
    if not isinstance(data, dict):
        raise UsageError(f"{name}: expected a mapping of metric: thresholds")
    off: set[str] = set()
    for key, value in data.items():
        if key not in KEYS:
            raise UsageError(f"{name}: unknown key {key!r}{_did_you_mean(str(key), KEYS)}; "
                             f"known: {', '.join(KEYS)}")
        if value is False or (isinstance(value, str) and value.strip().lower() == "off"):
            if key not in OFF_KEYS:
                raise UsageError(f"{name}: {key} cannot be off" + (
                    " (each bundle's own accuracy bound always applies; leave out top1_min/cosine_min "
                    "to gate by that alone)" if key == "accuracy" else ""),
                    hint=f"metrics that can be off: {', '.join(OFF_KEYS)}")
            off.add(key)
            continue
        if value is None:
            raise UsageError(f"{name}: {key} has no value", hint=f"give thresholds, or `{key}: off` to ungate it"
                             if key in OFF_KEYS else None)
        allowed = KEYS[key]
        if allowed is not None:
            if not isinstance(value, dict):
                raise UsageError(f"{name}: {key} needs a mapping like {{{sorted(allowed)[0]}: ...}}")
            for sub in value:
                if sub not in allowed:
                    raise UsageError(f"{name}: unknown key {key}.{sub}{_did_you_mean(str(sub), allowed)}; "
                                     f"known: {', '.join(sorted(allowed))}")
        where = f"{name}: {key}"
        if key in LATENCY:
            t = Threshold(key, DEFAULT_SLOWDOWN[key])
            if "max_slowdown" in value:
                t.max_change = parse_fraction(value["max_slowdown"], f"{where}.max_slowdown", upper=10.0)
            if "max_ms" in value:
                t.max_ms = _number(value["max_ms"], f"{where}.max_ms", 1e-6, 1e9)
            spec.latency[key] = t
        elif key == "throughput":
            spec.throughput_max_drop = parse_fraction(value.get("max_drop", 0.05), f"{where}.max_drop")
        elif key == "accuracy":
            if "top1_min" in value:
                spec.top1_min = parse_fraction(value["top1_min"], f"{where}.top1_min")
            if "cosine_min" in value:
                spec.cosine_min = _number(value["cosine_min"], f"{where}.cosine_min", -1, 1)
            if "seq_match_min" in value:
                spec.seq_match_min = parse_fraction(value["seq_match_min"], f"{where}.seq_match_min")
        elif key == "decisions":
            spec.max_disagreement = parse_fraction(value.get("max_disagreement"), f"{where}.max_disagreement")
        elif key in ("cold_start", "memory"):
            rel, cap = ("max_slowdown", "max_ms") if key == "cold_start" else ("max_increase", "max_mb")
            t = Threshold(key, 0.20 if key == "cold_start" else 0.10)
            if rel in value:
                t.max_change = parse_fraction(value[rel], f"{where}.{rel}", upper=10.0)
            if cap in value:
                t.max_ms = _number(value[cap], f"{where}.{cap}", 1e-6, 1e9)
            setattr(spec, key, t)
        elif key == "fresh_runs":
            spec.fresh_runs = _number(value, where, 3, 50, True)
        elif key == "level":
            spec.level = _number(value, where, 1e-6, 0.5)
        elif key == "rounds":
            spec.rounds_start = _number(value.get("start", spec.rounds_start), f"{where}.start", 2, 400, True)
            spec.rounds_max = _number(value.get("max", spec.rounds_max), f"{where}.max", 2, 400, True)
            if spec.rounds_max < spec.rounds_start:
                raise UsageError(f"{where}: max {spec.rounds_max} is below start {spec.rounds_start}")
        elif key == "block_iters":
            spec.block_iters = _number(value, where, 1, 10000, True)
        elif key == "unpaired":
            spec.session_margin = parse_fraction(value.get("session_margin", spec.session_margin),
                                                 f"{where}.session_margin")
            spec.max_speed_change = parse_fraction(value.get("max_speed_change", spec.max_speed_change),
                                                   f"{where}.max_speed_change", upper=10.0)
    for key in off:
        if key in LATENCY:
            spec.latency.pop(key, None)
        elif key == "throughput":
            spec.throughput_max_drop = None
        elif key == "decisions":
            spec.decisions_gated = False
        else:
            setattr(spec, key, None)
    spec.latency = {k: spec.latency[k] for k in LATENCY if k in spec.latency}  # p50, p90, p99 order
    return spec


def parse_metric_name(text: str) -> str:
    """``p50``/``p90``/``p99``; ``p101`` and friends refused with the list."""
    if text in LATENCY:
        return text
    raise UsageError(f"unknown latency metric {text!r}{_did_you_mean(text, LATENCY)}; gated percentiles: "
                     + ", ".join(LATENCY))
