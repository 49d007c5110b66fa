"""Per-bucket rows of variable-length bundles in the report (issue 42): a regression in the longest bucket
must not be averaged away by many short requests. Read from each bench record's ``varlen`` (the agent's
``bench.per_bucket``)."""

from __future__ import annotations

from typing import Any


def varlen_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (record, bucket): device, target-precision, form, bucket, share, p50/p99, first call at a new
    shape; plus the record's mix-weighted figures."""
    rows = []
    for rec in records:
        bench = rec.get("bench") or {}
        v = bench.get("varlen")
        if not v:
            continue
        b = rec.get("bundle") or {}
        dev = (rec.get("device") or {}).get("name") if isinstance(rec.get("device"), dict) else rec.get("device")
        who = f"{b.get('model', '?')} {b.get('target', bench.get('target', '?'))}-{b.get('precision', bench.get('precision', '?'))}"
        for key, x in (v.get("buckets") or {}).items():
            rows.append({"device": dev, "bundle": who, "form": v.get("form"), "bucket": key,
                         "share": x.get("share"), "p50_ms": x.get("p50_ms"), "p99_ms": x.get("p99_ms"),
                         "first_at_new_shape_ms": x.get("first_at_new_shape_ms"),
                         "padding_waste": x.get("padding_waste"),
                         "weighted_p50_ms": v.get("weighted_p50_ms"), "weighted_mean_ms": v.get("weighted_mean_ms")})
    return rows


def varlen_text(records: list[dict[str, Any]]) -> str:
    """The per-bucket table, or '' when no record has variable lengths."""
    rows = varlen_rows(records)
    if not rows:
        return ""

    def f(v: Any) -> str:
        return "—" if v is None else f"{v:.2f}"

    lines = ["per bucket (variable-length bundles: requests at their own lengths, seeded order):",
             f"  {'device':<12} {'bundle':<36} {'form':<8} {'bucket':<22} {'share':>6} {'p50 ms':>8} {'p99 ms':>8} "
             f"{'1st@new':>8} {'padding':>8}"]
    for r in rows:
        lines.append(f"  {str(r['device'])[:12]:<12} {r['bundle'][:36]:<36} {str(r['form']):<8} {r['bucket'][:22]:<22} "
                     f"{r['share']:>6.0%} {f(r['p50_ms']):>8} {f(r['p99_ms']):>8} {f(r['first_at_new_shape_ms']):>8} "
                     + (f"{r['padding_waste']:>8.0%}" if r.get("padding_waste") is not None else f"{'—':>8}"))
    done = set()
    for r in rows:
        k = (r["device"], r["bundle"])
        if k not in done:
            done.add(k)
            lines.append(f"  {r['device']} {r['bundle']}: mix-weighted p50 {f(r['weighted_p50_ms'])} ms, "
                         f"mean {f(r['weighted_mean_ms'])} ms")
    return "\n".join(lines)
