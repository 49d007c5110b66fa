"""The load-scenario part of a report: one row per run benched with ``--scenario`` (LoadGen's verdict,
latency, rate, workers, dynamic batching, the AccuracyOnly check), as text, Markdown and HTML."""

from __future__ import annotations

import html
from typing import Any


def scenario_rows(records: list[dict[str, Any]]) -> list[dict[str, str]]:
    out = []
    for rec in records:
        sc = (rec.get("bench") or {}).get("scenario")
        if not sc:
            continue
        b, dev = rec.get("bundle") or {}, rec.get("device") or {}
        lat = sc.get("latency_ms") or {}
        valid = {True: "VALID", False: "INVALID", None: "not judged"}[sc.get("valid")]
        rate = sc.get("images_per_second") or sc.get("completed_qps") or sc.get("samples_per_second")
        how = [sc.get("engine") or "?"]
        if (sc.get("workers") or 1) > 1:
            how.append(f"{sc['workers']} workers")
        if sc.get("concurrency"):
            how.append(f"{sc['concurrency']} clients (closed loop)")
        dyn = sc.get("dynamic_batching")
        if dyn:
            how.append(f"dynamic batching: mean {dyn['mean_batch']} of {dyn['max_batch']}, "
                       f"{dyn['max_queue_delay_ms']:g} ms")
        elif sc.get("batch"):
            how.append(f"batch {sc['batch']}")
        acc = sc.get("accuracy")
        out.append({
            "run": f"{b.get('target')}-{b.get('precision')} @ {dev.get('name')}",
            "scenario": str(sc.get("scenario")), "how": ", ".join(how),
            "verdict": valid + (f" ({', '.join(r + ': NO' for r in sc['invalid_reasons'])})" if sc.get("invalid_reasons") else ""),
            "p50 ms": f"{lat['p50']:.2f}" if isinstance(lat.get("p50"), (int, float)) else "",
            "p99 ms": f"{lat['p99']:.2f}" if isinstance(lat.get("p99"), (int, float)) else "",
            "rate /s": f"{rate:.1f}" if rate else "",
            "accuracy (AccuracyOnly)": "" if not acc else ("passed" if acc.get("passed") else "FAILED")
            + ("" if acc.get("same_as_direct", True) else ", differs from the direct pass"),
        })
    return out


def scenario_text(records: list[dict[str, Any]]) -> str:
    rows = scenario_rows(records)
    if not rows:
        return ""
    from edgeopt.ui import table

    return "load scenarios:\n" + table(rows, [(k, k) for k in rows[0]])


def scenario_md(records: list[dict[str, Any]]) -> str:
    rows = scenario_rows(records)
    if not rows:
        return ""
    keys = list(rows[0])
    lines = ["", "## Load scenarios", "", "| " + " | ".join(keys) + " |", "|" + "|".join("---" for _ in keys) + "|"]
    lines += ["| " + " | ".join(r[k].replace("|", "\\|") for k in keys) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def scenario_html(records: list[dict[str, Any]]) -> str:
    rows = scenario_rows(records)
    if not rows:
        return ""
    keys = list(rows[0])
    head = "".join(f"<th>{html.escape(k)}</th>" for k in keys)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(r[k])}</td>" for k in keys) + "</tr>" for r in rows)
    return (f'<h2>Load scenarios</h2><div class="scroll"><table id="scenarios"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")
