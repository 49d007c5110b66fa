"""The report's gate section: each ``edgeopt gate`` verdict in the results DB as baseline vs candidate per
device — every gated metric with both figures, the change and its interval, p and n — and, in HTML, the
paired rounds drawn side by side (block medians of baseline and candidate per round: drift that hit both
arms shows as both lines moving, a regression as a gap).

Gate records are those with ``status`` ``gate-*`` (written by ``edgeopt.hil.gate``); the comparison table
above them keeps bench runs only.
"""

from __future__ import annotations

import html
from typing import Any


def is_gate(rec: dict[str, Any]) -> bool:
    return str(rec.get("status") or "").startswith("gate-") and isinstance(rec.get("gate"), dict)


def gates_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per gate run (``gate_id``), newest first, with its devices' records."""
    by: dict[str, dict[str, Any]] = {}
    for rec in records:
        if not is_gate(rec):
            continue
        b = rec.get("bundle") or {}
        g = by.setdefault(rec.get("gate_id") or rec.get("run_id") or "?", {
            "gate_id": rec.get("gate_id"), "time": rec.get("time"), "model": b.get("model"),
            "target": b.get("target"), "precision": b.get("precision"), "baseline_id": rec.get("baseline_id"),
            "candidate_id": b.get("bundle_id"), "mode": rec.get("mode") or "paired", "devices": []})
        g["time"] = max(str(g["time"] or ""), str(rec.get("time") or ""))
        g["devices"].append(rec)
    return sorted(by.values(), key=lambda g: str(g["time"]), reverse=True)


def _verdict(devs: list[dict[str, Any]]) -> str:
    vs = [str((d.get("gate") or {}).get("verdict") or d.get("status", "")[5:]) for d in devs]
    for v in ("regressed", "error", "inconclusive", "pass", "improved"):
        if v in vs:
            return v
    return vs[0] if vs else "?"


def as_json(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**{k: v for k, v in g.items() if k != "devices"}, "verdict": _verdict(g["devices"]),
             "devices": [{"device": (d.get("device") or {}).get("name"), "verdict": (d.get("gate") or {}).get("verdict"),
                          "rounds": (d.get("gate") or {}).get("rounds"),
                          "verdicts": (d.get("gate") or {}).get("verdicts") or [],
                          "error": (d.get("error") or {}).get("message")} for d in g["devices"]]}
            for g in gates_of(records)]


def text(records: list[dict[str, Any]]) -> str:
    """Plain lines for the table and Markdown formats: one per gate and device."""
    lines = []
    for g in gates_of(records):
        for d in g["devices"]:
            gd = d.get("gate") or {}
            bad = [v["metric"] for v in gd.get("verdicts") or [] if v["verdict"] in ("regressed", "inconclusive")]
            lines.append(f"gate {g['gate_id']} {g['time'][:19]}: {g['model']} {g['target']}-{g['precision']} on "
                         f"{(d.get('device') or {}).get('name')}: {gd.get('verdict') or d.get('status')}"
                         + (f" ({', '.join(bad)})" if bad else "")
                         + f" — baseline {str(g['baseline_id'])[:12]} vs candidate {str(g['candidate_id'])[:12]}")
    return "\n".join(lines)


def _rounds_png(d: dict[str, Any]) -> str | None:
    """Per-round block medians of both arms (base64 PNG), or None without rounds or matplotlib."""
    import base64
    import importlib.util
    import io

    rounds = d.get("rounds") or {}
    a, b = rounds.get("A") or [], rounds.get("B") or []
    if not a or not b or importlib.util.find_spec("matplotlib") is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(5.5, 2.4))
    paired = (d.get("mode") or "paired") == "paired"
    for arm, blocks, colour in (("baseline", a, "#57606a"), ("candidate", b, "#2f81f7")):
        med = [float(np.median(x)) for x in blocks if x]
        ax.plot(range(1, len(med) + 1), med, marker="o", ms=3, lw=1.2, color=colour,
                label=arm + ("" if paired or arm == "candidate" else " (stored)"))
    ax.set_xlabel("round" if paired else "block")
    ax.set_ylabel("block median, ms")
    ax.legend(fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


CSS = """
h2.gates{font-size:18px;margin:24px 0 4px} div.gate{margin:0 0 18px} div.gate h3{font-size:15px;margin:8px 0 2px}
td.v-regressed{color:#cf222e;font-weight:600} td.v-improved{color:#1a7f37;font-weight:600}
td.v-pass{color:#1a7f37} td.v-inconclusive{color:#9a6700;font-weight:600} td.v-error{color:#cf222e}
"""


def section_html(records: list[dict[str, Any]], plots: bool = True) -> str:
    """The gate section of the HTML report ('' when the records hold no gate)."""
    from edgeopt.hil.junit import verdict_cells, verdict_text

    gates = gates_of(records)
    if not gates:
        return ""
    out = ['<h2 class="gates">Gates: baseline vs candidate</h2>',
           '<p class="meta">Each <code>edgeopt gate</code> verdict, per device: the baseline and candidate figures '
           'from interleaved rounds on that device, the change with its 95% interval (99% when unpaired), the '
           'Holm-corrected p and n. Latency and cold start in ms, memory in MB.</p>']
    for g in gates:
        e = html.escape
        head = (f"{e(str(g['model']))} on {e(str(g['target']))}-{e(str(g['precision']))}: "
                f"<span class=\"v-{e(_verdict(g['devices']))}\">{e(_verdict(g['devices']))}</span>")
        out.append(f'<div class="gate"><h3>{head}</h3><div class="meta">gate {e(str(g["gate_id"]))} · '
                   f'{e(str(g["time"])[:19])} · baseline <code>{e(str(g["baseline_id"])[:40])}</code> vs candidate '
                   f'<code>{e(str(g["candidate_id"])[:12])}</code> · {e(g["mode"])}</div>')
        rows = []
        figs = []
        for d in g["devices"]:
            gd = d.get("gate") or {}
            name = e(str((d.get("device") or {}).get("name")))
            if d.get("error"):
                rows.append(f'<tr><td>{name}</td><td>—</td><td class="v-error">{e(str(gd.get("status") or "error"))}'
                            f'</td><td colspan="6">{e(str((d.get("error") or {}).get("message"))[:200])}</td></tr>')
            for v in gd.get("verdicts") or []:
                c = verdict_cells(v)
                shown = verdict_text(v).split(" ", 1)[-1]  # the words without the icon: "not judged (…)" too
                rows.append(f"<tr><td>{name}</td><td>{e(v['metric'])}</td><td class=\"v-{e(v['verdict'])}\">"
                            f"{e(shown)}</td><td class=\"num\">{e(c['baseline'])}</td>"
                            f"<td class=\"num\">{e(c['candidate'])}</td><td class=\"num\">{e(c['change'])}</td>"
                            f"<td class=\"num\">{e(c['p'])}</td><td class=\"num\">{e(c['n'])}</td>"
                            f"<td>{e(str(v.get('reason') or '')[:160])}</td></tr>")
            png = _rounds_png({**d, "mode": g["mode"]}) if plots else None
            if png:
                figs.append(f'<figure><img alt="rounds on {name}" src="data:image/png;base64,{png}">'
                            f"<figcaption>{name}: {gd.get('rounds') or '?'} rounds, block medians</figcaption></figure>")
        out.append('<div class="scroll"><table><thead><tr><th>device</th><th>metric</th><th>verdict</th>'
                   "<th>baseline</th><th>candidate</th><th>change (CI)</th><th>p</th><th>n</th><th>why</th>"
                   f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")
        if figs:
            out.append(f'<div class="plots">{"".join(figs)}</div>')
        out.append("</div>")
    return "\n".join(out)
