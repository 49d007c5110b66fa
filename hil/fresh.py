"""Cold start and memory for the gate: what a paired loop inside one process cannot show.

Both are properties of a *fresh* process: cold start is the time to load the artifact and answer its first
inference (``load_s + first_inference_s`` of the agent's bench child), memory the child's peak RSS.  So
each is measured in ``fresh_runs`` bench children per arm, in the order A B B A A B … (so the page cache,
the CPU's state and the time of day hit both alike), and judged on the paired log ratios: the geometric
mean ratio with a Student-t 95% interval over the pairs.  The verdict rules are the latency metrics':
*regressed* when the interval lies above no change and the ratio beyond the allowed change (or the
candidate above an absolute cap), *pass* when the interval's upper end is within it, *improved* when
the interval lies below no change by more than it, else *inconclusive*.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from edgeopt.policy.gatefile import GateSpec, Threshold
from edgeopt.policy.stats import Verdict

# Student-t 97.5% quantiles for 1..30 degrees of freedom (two-sided 95%); above 30, 2.0 is close enough.
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042]
FIGURES = {"cold_start": ("cold start", "ms"), "memory": ("peak RSS", "MB")}


def _figures(bench: dict[str, Any]) -> dict[str, float | None]:
    load, first = bench.get("load_s"), bench.get("first_inference_s")
    return {"cold_start": (load + first) * 1000 if load is not None and first is not None else None,
            "memory": bench.get("peak_rss_mb")}


def measure_fresh(session: Any, baseline_id: str, candidate_id: str, runs: int,
                  progress: Callable[[str], None] = lambda s: None, timeout_s: float = 300) -> list[dict[str, Any]]:
    """``runs`` fresh bench children per arm, A B B A …; each entry ``{"arm", "cold_start", "memory"}``."""
    out = []
    progress(f"{session.device.name}: cold start and memory: {runs} fresh processes per arm")
    for k in range(2 * runs):
        arm = "ABBA"[k % 4]
        bid = baseline_id if arm == "A" else candidate_id
        reply = session.agent("bench", {"root": session.root, "bundle_id": bid,
                                        "options": {"duration_s": 0.05, "min_iters": 1, "warmup": 0,
                                                    "return_samples": False, "timeout_s": timeout_s}},
                              timeout=timeout_s + 30)
        if not reply.get("ok"):
            e = reply.get("error") or {}
            from edgeopt.hil.paired import AgentFailed

            raise AgentFailed(f"{session.device.name}: a fresh bench of arm {arm} failed: "
                              f"{e.get('type')}: {e.get('message')}")
        out.append({"arm": arm, **_figures(reply["bench"])})
    return out


def _pairs(fresh: list[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    a = [f[key] for f in fresh if f["arm"] == "A" and f.get(key)]
    b = [f[key] for f in fresh if f["arm"] == "B" and f.get(key)]
    n = min(len(a), len(b))
    return np.asarray(a[:n], float), np.asarray(b[:n], float)


def judge_fresh(fresh: list[dict[str, Any]], spec: GateSpec) -> list[Verdict]:
    out = []
    for key in ("cold_start", "memory"):
        thr: Threshold | None = getattr(spec, key)
        if thr is None:
            continue
        name, unit = FIGURES[key]
        a, b = _pairs(fresh, key)
        n = len(a)
        limit = 1 + (thr.max_change if thr.max_change is not None else 0.0)
        v = Verdict(key, "inconclusive", n=n, threshold=limit - 1,
                    method=f"{name}: {n} fresh processes per arm (A B B A ...); geometric mean of paired ratios, "
                           "Student-t 95% CI")
        if n < 3:
            v.reason = f"only {n} fresh process(es) per arm with a {name}"
            out.append(v)
            continue
        d = np.log(b / a)
        m, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(n))
        t = _T975[n - 2] if n - 1 <= len(_T975) else 2.0
        v.ratio, v.ci_low, v.ci_high = math.exp(m), math.exp(m - t * se), math.exp(m + t * se)
        v.baseline, v.candidate = float(np.median(a)), float(np.median(b))
        r, lo, hi = v.ratio, v.ci_low, v.ci_high
        shown = f"{(r - 1) * 100:+.1f}% (CI {(lo - 1) * 100:+.1f}..{(hi - 1) * 100:+.1f}%)"
        if thr.max_ms is not None and v.candidate > thr.max_ms:
            v.verdict, v.reason = "regressed", f"candidate {name} {v.candidate:.1f} {unit} > the cap {thr.max_ms:g}"
        elif lo > 1 and r > limit:
            v.verdict, v.reason = "regressed", f"{shown}, beyond the allowed {(limit - 1) * 100:.1f}%"
        elif hi < 1 and r < 1 / limit:
            v.verdict, v.reason = "improved", shown
        elif hi <= limit:
            v.verdict, v.reason = "pass", f"{shown}: within {(limit - 1) * 100:.1f}%"
        else:
            v.reason = f"{shown}: cannot tell from {n} pairs"
        out.append(v)
    return out
