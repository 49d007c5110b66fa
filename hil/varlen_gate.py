"""The gate per bucket of a variable-length pair (issue 42): a regression in the longest bucket must not be
averaged away by many short requests. ``pairbench`` labels each timed call of a variable-length pair with its
request's bucket (``blocks[i].keys``: by the request's own length, so a padded static bundle and a dynamic one
share buckets); each bucket is judged by the paired gate's own p50 rule (``policy.stats.judge``) on the blocks cut
to that bucket's calls, as metric ``p50 [bucket]``."""

from __future__ import annotations

import dataclasses
from typing import Any

from edgeopt.policy.stats import PairedRun, Verdict, judge

MIN_PAIRS = 3  # paired rounds in which both arms ran the bucket: fewer, and the bucket is not judged


def bucket_verdicts(run: PairedRun, spec: Any) -> list[Verdict]:
    """One ``p50 [bucket]`` verdict per bucket seen in at least ``MIN_PAIRS`` rounds; [] for a fixed-shape pair.
    The gate adds the *regressed* ones to its verdicts (a regression in one bucket fails it) and lists all of them
    under ``per_bucket``: an undecided bucket does not make the whole gate undecided."""
    blocks = run.blocks
    if not blocks or not all(b.get("keys") and len(b["keys"]) == len(b["ms"]) for b in blocks):
        return []
    if "p50" not in (getattr(spec, "latency", None) or {}):
        return []
    one = dataclasses.replace(spec, latency={"p50": spec.latency["p50"]}, throughput_max_drop=None)
    out: list[Verdict] = []
    for key in sorted({k for b in blocks for k in b["keys"]}, key=_order):
        cut: list[dict[str, Any]] = []
        for i in range(0, len(blocks) - 1, 2):
            pair = [{"arm": b["arm"], "ms": [m for m, k in zip(b["ms"], b["keys"]) if k == key]}
                    for b in blocks[i:i + 2]]
            if all(p["ms"] for p in pair):
                cut.extend(pair)
        if len(cut) // 2 < MIN_PAIRS:
            continue
        for v in judge(dataclasses.replace(run, blocks=cut), one):
            if v.metric == "p50":
                v.metric = f"p50 [{key}]"
                v.reason = (v.reason + "; " if v.reason else "") + f"{len(cut) // 2} paired rounds hold this bucket"
                out.append(v)
    return out


def _order(key: str) -> list[float]:
    return [float(x) for x in "".join(c if c.isdigit() else " " for c in key).split()] or [0.0]
