"""The one comparison engine: which artifact to ship, with an interval, or why the evidence cannot say.

Used by ``report``/``run``'s SHIP line and ``bench``'s summary (both through ``edgeopt.reporting``); ``pick``
is the entry point for any other caller that holds measured rows or records (``tune``).

Method (docs/TOLERANCES.md "One accuracy policy" and docs/HIL.md for the statistics):

* **Groups**: one verdict per (model, device, batch).  Batch sizes are never compared with each other.
* **Device truth** (``device_truth``): ``device`` when the run measured the hardware its target is for;
  ``build-host`` (a non-host-native target benched on the build host), ``other-vendor`` (an Intel target
  on an AMD CPU, Core ML off Apple silicon), ``emulated`` (the probe says so: ``environment.emulated``,
  ``device.emulated`` or ``probe.emulated``).  Only ``device`` rows can be the basis of a SHIP.
* **Accuracy**: a candidate is within its own bound (the bench's check against the FP32 reference) *and*
  accepted by the gate's default accuracy and decision rules (``edgeopt.policy.stats.judge`` with
  ``edgeopt.policy.gatefile.load_gate(None)``, the spec ``gate`` and ``rollout`` use without a gate file),
  judged on the decisions the bench counted against the FP32 reference.  When no candidate is accepted
  the verdict names the best one and says plainly that the gate defaults would refuse it.
* **Speed**: the per-iteration latency samples each bench stores (``bench.samples_ms``, in run order) are
  cut into contiguous blocks; the fastest candidate (lowest p50) against each other one: the two-sample
  Hodges–Lehmann ratio of block medians with the gate's unpaired bootstrap interval (99%, widened by the
  gate's ``session_margin``: two runs measured one after the other are not paired) and a Mann–Whitney
  test, Holm-corrected over the comparisons (``edgeopt.policy.stats``).  A clear winner needs every other
  candidate's corrected p-value at or below the gate's ``level`` and its widened interval above 1, no
  noise flag on any candidate, and enough samples.  Otherwise: **no clear winner**, and among the
  candidates speed did not separate from the fastest the most faithful one ships (higher precision, then
  better agreement), saying so and naming the paired measurement that can separate them
  (``edgeopt gate A --baseline B``: interleaved rounds on the device).
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgeopt.policy import accept as _policy
from edgeopt.policy.accept import agreement, agreement_text, wilson  # noqa: F401 - re-exported

# Too few latency samples to judge a candidate (per run): below this the bench kept too little.
MIN_SAMPLES = 50
BLOCKS = 20  # contiguous blocks per run: their medians are the unit the interval resamples
TRUTHS = ("device", "build-host", "other-vendor", "emulated")
# Targets whose artifacts run natively on an x86/arm64 build host (any other target measured on the
# `local` device ran on the build host, not on the device it is built for).
HOST_NATIVE = {"cpu", "intel-cpu"}
# The CPU vendor a target's artifacts are for (a measurement on another vendor's CPU is not device truth).
TARGET_VENDOR = {"intel-cpu": "intel", "intel-gpu": "intel", "intel-npu": "intel", "apple": "apple"}
PRECISION_RANK = {"fp32": 4, "tf32": 3.5, "bf16": 3, "fp16": 3, "int8": 2, "fp8": 1.5, "int4": 1}


# --- device truth --------------------------------------------------------------------------------

def cpu_vendor(cpu_model: str | None) -> str | None:
    """``intel`` / ``amd`` / ``apple`` / ``arm`` from a CPU model string (None: cannot tell)."""
    m = (cpu_model or "").lower()
    if not m:
        return None
    if "intel" in m or "xeon" in m or "core(tm)" in m:
        return "intel"
    if "amd" in m or "epyc" in m or "ryzen" in m:
        return "amd"
    if "apple" in m:
        return "apple"
    if any(k in m for k in ("arm", "cortex", "neoverse", "aarch64", "qualcomm", "snapdragon", "tegra")):
        return "arm"
    return None


def _truthy(*vals: Any) -> bool:
    """Whether a probe's ``emulated`` fact says yes: True, a name of the emulator ("qemu-user"), or a mapping
    whose ``emulated``/``detected``/``value`` says so."""
    for v in vals:
        if isinstance(v, dict):
            v = next((v[k] for k in ("emulated", "detected", "value") if k in v), None)
        if v is True or (isinstance(v, str) and v.strip().lower() not in ("", "false", "no", "0", "none", "native")):
            return True
    return False


def _emulator(*vals: Any) -> str | None:
    for v in vals:
        if isinstance(v, dict):
            v = next((v[k] for k in ("by", "how", "emulator", "name") if isinstance(v.get(k), str)), None)
        if isinstance(v, str) and v.strip().lower() not in ("true", "yes", "1"):
            return v
    return None


def device_truth(rec: dict[str, Any]) -> tuple[str, str | None]:
    """(one of ``TRUTHS``, why) for one results record: was this the hardware its target is for?"""
    b = rec.get("bundle") or {}
    dev = rec.get("device") or {}
    env = (rec.get("bench") or {}).get("environment") or {}
    probe = rec.get("probe") or {}
    target = b.get("target")
    facts = (env.get("emulated"), dev.get("emulated"), probe.get("emulated"), (probe.get("cpu") if isinstance(probe.get("cpu"), dict) else {}).get("emulated"))
    if _truthy(*facts):
        how = _emulator(*facts)
        return "emulated", f"measured under emulation{f' ({how})' if how else ''}: its speed says nothing of the hardware"
    if dev.get("transport") == "local" and target is not None and target not in HOST_NATIVE:
        return "build-host", f"{target} artifact measured on the build host, not on a {target} device"
    want = TARGET_VENDOR.get(str(target))
    got = cpu_vendor(env.get("cpu_model"))
    if want and got and got != want:
        return "other-vendor", f"{target} artifact measured on a {got.upper() if got == 'amd' else got} CPU " \
                               f"({env.get('cpu_model')}), not {want}"
    return "device", None


# --- the policy (one implementation: edgeopt.policy.accept) --------------------------------------

def gate_defaults_accept(acc: dict[str, Any] | None, baseline_acc: dict[str, Any] | None = None,
                         spec: Any = None) -> tuple[bool | None, str]:
    """(accepted, why) of the accuracy policy (``edgeopt.policy.accept.judge``) for this artifact."""
    a = _policy.judge(acc, spec, baseline_acc)
    return a.accepted, a.reason


# --- the speed comparison ------------------------------------------------------------------------

def blocks_of(samples: list[float] | None) -> list[list[float]]:
    """Contiguous blocks of a run's latency samples (run order kept): the resampling unit."""
    s = [float(x) for x in (samples or []) if isinstance(x, (int, float)) and math.isfinite(x) and x > 0]
    if len(s) < MIN_SAMPLES:
        return []
    k = min(BLOCKS, len(s) // 2)
    size = len(s) / k
    return [s[int(round(i * size)):int(round((i + 1) * size))] for i in range(k)]


def compare_speed(fast: list[float], other: list[float]) -> dict[str, Any]:
    """``other`` against ``fast``: median-latency ratio (> 1: other is slower), its interval and p-value
    (the gate's unpaired statistics: two-sample Hodges–Lehmann of log block medians, 99% bootstrap,
    Mann–Whitney), the interval widened by the gate's ``session_margin``."""
    import numpy as np

    from edgeopt.policy import stats
    from edgeopt.policy.gatefile import load_gate

    a, b = blocks_of(fast), blocks_of(other)
    if not a or not b:
        return {"ratio": None, "ci_low": None, "ci_high": None, "p": 1.0, "n": 0}
    margin = load_gate(None).session_margin
    r, lo, hi, p, n = stats._unpaired_center([np.asarray(x) for x in a], [np.asarray(x) for x in b], "median",
                                              np.random.default_rng(stats.SEED))
    return {"ratio": r, "ci_low": lo / (1 + margin), "ci_high": hi * (1 + margin), "p": p, "n": n,
            "ci": f"99% bootstrap, widened {margin:.0%}"}


# --- the verdict ---------------------------------------------------------------------------------

@dataclass
class ShipVerdict:
    """One decision for (model, device, batch)."""

    model: str | None
    device: str | None
    batch: int
    criterion: str
    ship: str | None = None  # "<target>-<precision>" or None: nothing can be shipped on this evidence
    clear: bool = False  # True: speed separated the pick from every other candidate
    basis: str = ""  # "speed" | "fidelity" | "only candidate" | "none"
    runner_up: str | None = None
    ratio: float | None = None  # p50 ratio of the slower of (pick, runner-up) over the faster (median ratio)
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None  # Holm-corrected
    p50_ms: float | None = None
    gate_accepts: bool | None = None
    gate_reason: str = ""
    why: list[str] = field(default_factory=list)
    compared: list[dict[str, Any]] = field(default_factory=list)
    paired: str | None = None  # the command that separates the candidates (interleaved)
    random_data: bool = False
    measured: str | None = None  # the time of the run the pick rests on
    line: str = ""

    def as_dict(self) -> dict[str, Any]:
        from edgeopt import jsonsafe

        return jsonsafe.clean(asdict(self))


def _name(r: dict[str, Any]) -> str:
    return r.get("label") or f"{r.get('target')}-{r.get('precision')}"


def faithfulness(r: dict[str, Any]) -> tuple:
    """Bigger is more faithful: precision first, then agreement with FP32, then cosine."""
    a = r.get("agreement_ci") or {}
    return (PRECISION_RANK.get(str(r.get("precision")), 0), a.get("share", 1.0) if a else 1.0,
            r.get("cosine_min") if r.get("cosine_min") is not None else 0.0)


def _bundle_ref(r: dict[str, Any]) -> str:
    """A bundle's folder for a command line, never an absolute path of this machine."""
    p = r.get("_bundle_path")
    if not p:
        return f"DIST/{r.get('model')}/{_name(r)}"
    path = Path(p)
    if path.is_absolute():
        try:
            return os.path.relpath(path, Path.cwd()) if Path.cwd() in path.parents else f"DIST/{path.parent.name}/{path.name}"
        except ValueError:
            return f"DIST/{path.parent.name}/{path.name}"
    return str(path)


def decide_group(rows: list[dict[str, Any]]) -> ShipVerdict:
    """The verdict for rows of one (model, device, batch); rows are ``reporting.row_of`` rows (with
    ``_samples`` holding the latency samples)."""
    first = rows[0]
    batch = int(first.get("batch") or 1)
    device = first.get("device")
    crit = f"lowest p50 at batch {batch} on {device}"
    v = ShipVerdict(first.get("model"), device, batch, crit)
    latest: dict[str, dict[str, Any]] = {}  # `report --all`: each artifact's latest run decides
    for r in rows:
        if r.get("status") == "ok" and r.get("accuracy") == "passed" and r.get("p50_ms"):
            if _name(r) not in latest or str(r.get("time") or "") > str(latest[_name(r)].get("time") or ""):
                latest[_name(r)] = r
    within = list(latest.values())
    truth = [r for r in within if r.get("device_truth", "device") == "device"]
    off = [r for r in within if r.get("device_truth", "device") != "device"]
    if off:
        v.why.append("not device truth, never a SHIP: " + ", ".join(f"{_name(r)} ({r['device_truth']})" for r in off))
    if not truth:
        v.basis = "none"
        v.line = (f"batch {batch} on {device}: no SHIP -- no artifact within its bound was measured on its own "
                  "device" + (f" ({'; '.join(v.why)})" if v.why else ""))
        return v
    accepted = [r for r in truth if r.get("gate_accepts") is not False]
    refused = [r for r in truth if r.get("gate_accepts") is False]
    cands = accepted or truth
    if refused and accepted:
        v.why.append("gate defaults would refuse, not shipped: "
                     + "; ".join(f"{_name(r)} ({r.get('gate_reason')})" for r in refused))
    cands = sorted(cands, key=lambda r: r["p50_ms"])
    fast = cands[0]
    noisy = [r for r in cands if r.get("noise")]
    few = [r for r in cands if len(r.get("_samples") or []) < MIN_SAMPLES] if len(cands) > 1 else []
    comps = []
    for r in cands[1:]:
        c = compare_speed(fast.get("_samples") or [], r.get("_samples") or [])
        c["name"] = _name(r)
        comps.append(c)
    if comps:
        from edgeopt.policy.gatefile import load_gate
        from edgeopt.policy.stats import holm

        level = load_gate(None).level
        for c, p in zip(comps, holm([c["p"] for c in comps])):
            c["p_holm"] = p
            c["separated"] = (c["ratio"] is not None and p <= level and c["ci_low"] is not None and c["ci_low"] > 1)
    v.compared = comps
    tie = [fast] + [r for r, c in zip(cands[1:], comps) if not c["separated"]]
    reasons = []
    if noisy:
        reasons.append("device noisy: " + "; ".join(f"{_name(r)} {r['noise']}" for r in noisy))
    if few:
        reasons.append("too few latency samples: " + ", ".join(f"{_name(r)} {len(r.get('_samples') or [])}"
                                                               for r in few) + f" (< {MIN_SAMPLES}"
                       + ("; bench without --no-samples keeps them" if any(not r.get("_samples") for r in few)
                          else "") + ")")
    if len(tie) > 1 and not few:
        reasons.append("intervals include no difference: " + ", ".join(
            f"{c['name']} {_ratio_text(c)}" for c in comps if not c["separated"]))
    if noisy or few:
        tie = list(cands)
    if len(cands) == 1:
        pick, v.basis, v.clear = fast, "only candidate", False
    elif not reasons:
        pick, v.basis, v.clear = fast, "speed", True
    else:
        pick, v.basis = max(tie, key=faithfulness), "fidelity"
    v.ship, v.p50_ms, v.measured = _name(pick), pick["p50_ms"], pick.get("time")
    v.gate_accepts, v.gate_reason = pick.get("gate_accepts"), pick.get("gate_reason") or ""
    v.random_data = pick.get("data_source") == "random"
    others = [c for c in comps if c["name"] != v.ship]
    if v.basis == "speed":
        c = min(comps, key=lambda c: c["ratio"])
        v.runner_up, v.ratio, v.ci_low, v.ci_high, v.p_value = c["name"], c["ratio"], c["ci_low"], c["ci_high"], c["p_holm"]
    elif v.basis == "fidelity" and pick is not fast:
        c = next(c for c in comps if c["name"] == v.ship)
        v.runner_up, v.ratio, v.ci_low, v.ci_high, v.p_value = _name(fast), c["ratio"], c["ci_low"], c["ci_high"], c["p_holm"]
    elif v.basis == "fidelity" and others:
        c = min(others, key=lambda c: c["ratio"] or math.inf)
        v.runner_up, v.ratio, v.ci_low, v.ci_high, v.p_value = c["name"], c["ratio"], c["ci_low"], c["ci_high"], c["p_holm"]
    rivals = [r for r in tie if r is not pick] or [r for r in cands if r is not pick]
    # a gate compares two bundles of one target (hil.gate.check_pair): only such a rival gets a command
    same = [r for r in rivals if r.get("target") == pick.get("target") and not r.get("label")]
    if v.basis == "fidelity" and same:
        rival = min(same, key=lambda r: r["p50_ms"])
        v.paired = (f"edgeopt gate {_bundle_ref(rival)} --baseline {_bundle_ref(pick)}"
                    + ("" if device == "local" else f" --devices INVENTORY --limit {device}"))
    elif v.basis == "fidelity" and rivals:
        v.why.append("no paired gate separates different targets (a gate compares two bundles of one "
                     "target): a longer bench on a quiet device can")
    v.line = _line(v, reasons, pick, fast)
    return v


def _ratio_text(c: dict[str, Any]) -> str:
    if c.get("ratio") is None:
        return "(no samples)"
    return f"{c['ratio']:.2f}x (99% CI {c['ci_low']:.2f}–{c['ci_high']:.2f}x, Holm p={c.get('p_holm', c['p']):.2g})"


def _line(v: ShipVerdict, reasons: list[str], pick: dict[str, Any], fast: dict[str, Any]) -> str:
    head = f"batch {v.batch} on {v.device}: "
    if v.basis == "speed":
        s = (f"{head}ship {v.ship} -- {v.criterion}: {v.p50_ms:.3g} ms; runner-up {v.runner_up} "
             f"{v.ratio:.2f}x slower (99% CI {v.ci_low:.2f}–{v.ci_high:.2f}x, Holm p={v.p_value:.2g})")
    elif v.basis == "only candidate":
        s = (f"{head}ship {v.ship} -- the only candidate (within its bound, measured on its device"
             + (", accepted by the gate defaults" if v.gate_accepts else "") + f"): {v.p50_ms:.3g} ms p50")
    else:
        s = (f"{head}no clear winner on {v.criterion} ({'; '.join(reasons)}): ship {v.ship}, the more faithful "
             f"({pick.get('precision')}"
             + (f", agreement {agreement_text(pick.get('agreement_ci'))}" if pick.get("agreement_ci") else "") + ")")
        if pick is not fast:
            s += f"; {_name(fast)} measured {fast['p50_ms']:.3g} ms p50 against {v.p50_ms:.3g} ms"
        if v.ratio is not None and not any(r.startswith("intervals include") for r in reasons):
            # the figure behind "no clear winner", printed even when noise or few samples are the reason
            slow, quick = (v.ship, v.runner_up) if pick is not fast else (v.runner_up, v.ship)
            s += (f"; {slow} / {quick} p50 ratio {v.ratio:.2f}x (99% CI {v.ci_low:.2f}–{v.ci_high:.2f}x), "
                  "not conclusive on this evidence")
        if v.paired:
            s += f"; to separate them, measure them interleaved on the device: {v.paired}"
    a = pick.get("agreement_ci")
    if v.basis == "speed" and a:
        s += f"; agreement {agreement_text(a)}"
    if v.gate_accepts is False:
        s += f" -- gate defaults would refuse it: {v.gate_reason}"
    elif v.gate_accepts is True:
        s += " -- gate defaults accept it against FP32"
    if v.random_data:
        s += " -- agreement measured on RANDOM data"
    if v.why:
        s += " [" + "; ".join(v.why) + "]"
    return s


_CACHE: dict[tuple, ShipVerdict] = {}


def _key(rs: list[dict[str, Any]]) -> tuple:
    return tuple((r.get("model"), r.get("device"), r.get("batch"), _name(r), r.get("time"), r.get("status"),
                  r.get("accuracy"), r.get("p50_ms"), r.get("device_truth"), r.get("gate_accepts"), r.get("noise"),
                  r.get("_bundle_path"), len(r.get("_samples") or []), sum(r.get("_samples") or [])) for r in rs)


def decide(rows: list[dict[str, Any]]) -> list[ShipVerdict]:
    """One verdict per (model, device, batch) of these comparison rows (the same rows decide the same
    way: the bootstrap is seeded; a report asks several times, so verdicts are kept per set of rows)."""
    import copy

    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r.get("model"), r.get("device"), int(r.get("batch") or 1)), []).append(r)
    out = []
    for _, rs in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        k = _key(rs)
        if k not in _CACHE:
            if len(_CACHE) > 256:
                _CACHE.clear()
            _CACHE[k] = decide_group(rs)
        out.append(copy.deepcopy(_CACHE[k]))
    return out


def pick(rows_or_records: list[Any], one_group: bool = False) -> list[ShipVerdict]:
    """The verdicts for measured rows (``reporting.row_of`` rows) or results records (the API's typed
    ``results.BenchRecord``, or dicts as stored: ``RunRecord.as_dict()``):
    the entry point for ``tune``'s pick (and anything else that compares artifacts).  A row may carry a
    ``label`` (e.g. ``"cpu-int8 batch 1 threads 4"``) that names it instead of ``target-precision``;
    ``one_group=True`` compares every row with every other (one verdict, e.g. one device's tune points)
    instead of one verdict per (model, device, batch).  The criterion is always the lowest p50."""
    from edgeopt.reporting import records_of, rows_of

    rows_or_records = records_of(list(rows_or_records))
    if rows_or_records and isinstance(rows_or_records[0].get("bundle"), dict):
        rows = rows_of(rows_or_records)
    else:
        rows = [dict(r) for r in rows_or_records]
    if one_group and rows:
        first = rows[0]
        mixed = len({r.get("batch") or 1 for r in rows}) > 1
        for r in rows:
            if mixed and "batch" not in _name(r):
                r["label"] = f"{_name(r)} batch {r.get('batch') or 1}"
            r["model"], r["device"], r["batch"] = first.get("model"), first.get("device"), first.get("batch") or 1
    return decide(rows)
