"""One comparison of runs: targets x devices x precisions, as a table, Markdown, CSV, JSON or HTML.

Rows come from the results database (by default the latest run of each (model, target, precision,
device)): latency percentiles, throughput, load time, memory, and accuracy against the FP32
reference.  The HTML page is self-contained: inline CSS and plots drawn by matplotlib (Agg) as
base64 PNG — the latency distribution of every artifact (from the bench's samples) and latency
against accuracy.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
from typing import Any

FORMATS = ("table", "md", "html", "json", "csv")

# (key, header) of the comparison, in order.
COLUMNS = [
    ("model", "model"), ("target", "target"), ("precision", "precision"), ("device", "device"),
    ("status", "status"), ("p50_ms", "p50 ms"), ("p90_ms", "p90 ms"), ("p99_ms", "p99 ms"),
    ("mean_ms", "mean ms"), ("throughput_ips", "inf/s"), ("load_s", "load s"),
    ("first_inference_ms", "1st inf ms"), ("peak_rss_mb", "peak MB"), ("accuracy", "accuracy"),
    ("cosine_min", "cosine"), ("top1", "top-1"), ("runtime", "runtime"), ("time", "measured (UTC)"),
]


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def row_of(rec: dict[str, Any]) -> dict[str, Any]:
    """The comparison row of one record (plain numbers; formatting is the output's job)."""
    b, bench = rec.get("bundle") or {}, rec.get("bench") or {}
    lat = bench.get("latency_ms") or {}
    acc = bench.get("accuracy") or {}
    metrics = [o.get("metrics") or {} for o in (acc.get("outputs") or {}).values()]
    cos = [m["cosine"] for m in metrics if _num(m.get("cosine")) is not None]
    top1 = [m["top1"] for m in metrics if _num(m.get("top1")) is not None]
    runner = bench.get("runner") or {}
    err = rec.get("error") or {}
    first = _num(bench.get("first_inference_s"))
    return {
        "model": b.get("model"), "target": b.get("target"), "precision": b.get("precision"),
        "backend": b.get("backend"), "device": (rec.get("device") or {}).get("name"), "status": rec.get("status"),
        "p50_ms": _num(lat.get("p50")), "p90_ms": _num(lat.get("p90")), "p95_ms": _num(lat.get("p95")),
        "p99_ms": _num(lat.get("p99")), "mean_ms": _num(lat.get("mean")), "std_ms": _num(lat.get("std")),
        "min_ms": _num(lat.get("min")), "max_ms": _num(lat.get("max")),
        "throughput_ips": _num(bench.get("throughput_ips")), "iterations": bench.get("iterations"),
        "load_s": _num(bench.get("load_s")), "first_inference_ms": None if first is None else first * 1000,
        "peak_rss_mb": _num(bench.get("peak_rss_mb")),
        "accuracy": None if "passed" not in acc else ("passed" if acc["passed"] else "FAILED"),
        "cosine_min": min(cos) if cos else None, "top1": min(top1) if top1 else None,
        "runtime": " ".join(str(x) for x in (runner.get("runtime"), runner.get("version")) if x) or None,
        "time": rec.get("time"), "run_id": rec.get("run_id"), "bundle_id": b.get("bundle_id"),
        "error": (f"{err.get('type')}: {err.get('message')}" if err else None),
    }


def rows_of(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows sorted model, target, precision, device."""
    rows = [row_of(r) for r in records]
    return sorted(rows, key=lambda r: tuple(str(r.get(k) or "") for k in ("model", "target", "precision", "device")))


def _fmt(key: str, v: Any) -> str:
    if v is None:
        return ""
    if key in ("cosine_min",):
        return f"{v:.6f}"
    if key == "top1":
        return f"{v:.1%}"
    if key == "time":
        return str(v)[:16].replace("T", " ")
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) >= 1000 or abs(v) < 0.01 else f"{v:.2f}"
    return str(v)


def _cells(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    out = []
    for r in rows:
        c = {k: _fmt(k, r.get(k)) for k, _ in COLUMNS}
        if r.get("error") and r["status"] != "ok":
            c["status"] = f"{r['status']}"
        out.append(c)
    return out


def _errors(rows: list[dict[str, Any]]) -> list[str]:
    return [f"{r['device']} / {r['model']} {r['target']}-{r['precision']}: {r['error']}"
            for r in rows if r.get("error") and r.get("status") != "ok"]


def render(records: list[dict[str, Any]], fmt: str = "table", title: str = "edgeopt report",
           filters: dict[str, Any] | None = None) -> str:
    """The report of these records in one format (see ``FORMATS``)."""
    rows = rows_of(records)
    if fmt == "json":
        return json.dumps({"schema": "edgeopt/v1", "kind": "report", "title": title, "filters": filters or {}, "count": len(rows), "rows": rows},
                          indent=2, default=str) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        keys = list(rows[0]) if rows else [k for k, _ in COLUMNS]
        w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        return buf.getvalue()
    if fmt == "table":
        from edgeopt.ui import table

        if not rows:
            return "no runs match\n"
        text = table(_cells(rows), COLUMNS)
        errs = _errors(rows)
        return text + ("\n\nfailures:\n  " + "\n  ".join(errs) if errs else "") + "\n"
    if fmt == "md":
        return _markdown(rows, title)
    if fmt == "html":
        return _html(rows, records, title, filters or {})
    from edgeopt.errors import UsageError

    raise UsageError(f"unknown report format {fmt!r}", hint="one of: " + ", ".join(FORMATS))


def _markdown(rows: list[dict[str, Any]], title: str) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    lines = [f"# {title}", ""]
    if not rows:
        return "\n".join(lines + ["No runs match.", ""])
    lines.append("| " + " | ".join(h for _, h in COLUMNS) + " |")
    lines.append("|" + "|".join("---:" if k.endswith(("_ms", "_s", "_mb", "_ips")) else "---" for k, _ in COLUMNS)
                 + "|")
    for c in _cells(rows):
        lines.append("| " + " | ".join(esc(c[k]) for k, _ in COLUMNS) + " |")
    errs = _errors(rows)
    if errs:
        lines += ["", "## Failures", ""] + [f"- {esc(e)}" for e in errs]
    return "\n".join(lines) + "\n"


# --- HTML ---------------------------------------------------------------------------------------
_CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1b1f24;background:#fff}
h1{font-size:22px;margin:0 0 4px} .meta{color:#57606a;margin-bottom:16px}
table{border-collapse:collapse;font-size:12px;margin:8px 0 20px}
th,td{border:1px solid #d0d7de;padding:3px 6px;text-align:left;white-space:nowrap}
th{background:#f6f8fa} td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.ok td.status{color:#1a7f37;font-weight:600} tr.bad td{background:#fff5f5} tr.bad td.status{color:#cf222e;font-weight:600}
.plots{display:flex;flex-wrap:wrap;gap:16px} figure{margin:0} figcaption{color:#57606a;font-size:12px}
img{max-width:100%;border:1px solid #d0d7de} ul.err{color:#cf222e} .scroll{overflow-x:auto}
"""


def _html(rows: list[dict[str, Any]], records: list[dict[str, Any]], title: str, filters: dict[str, Any]) -> str:
    from edgeopt import __version__

    models = sorted({str(r["model"]) for r in rows})
    # One model: say it once in the heading and give its column's width to the numbers.
    cols = [c for c in COLUMNS if not (c[0] == "model" and len(models) == 1)]
    num = {k for k, _ in cols if k.endswith(("_ms", "_s", "_mb", "_ips")) or k in ("cosine_min", "top1")}
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h in cols)
    body = []
    for r, c in zip(rows, _cells(rows)):
        cls = "ok" if r["status"] == "ok" else "bad"
        tds = "".join(f'<td class="{"num" if k in num else k}">{html.escape(c[k])}</td>' for k, _ in cols)
        body.append(f'<tr class="{cls}">{tds}</tr>')
    errs = _errors(rows)
    note = html_dependency_note()
    plots = _plots(rows, records) if rows and not note else []
    figs = (f'<p class="meta">{html.escape(note)}</p>' if note and rows else "") + "".join(f'<figure><img alt="{html.escape(cap)}" src="data:image/png;base64,{data}">'
                   f"<figcaption>{html.escape(cap)}</figcaption></figure>" for cap, data in plots)
    shown = ", ".join(f"{k}={v}" for k, v in filters.items() if v) or "latest run of each artifact on each device"
    model_line = f"model {html.escape(models[0])} &middot; " if len(models) == 1 else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_CSS}</style></head><body>
<h1>{html.escape(title)}</h1>
<div class="meta">{model_line}{len(rows)} run(s) &middot; {html.escape(shown)} &middot; edgeopt {html.escape(__version__)}</div>
<div class="scroll"><table id="comparison"><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>
{('<h2>Failures</h2><ul class="err">' + ''.join(f'<li>{html.escape(e)}</li>' for e in errs) + '</ul>') if errs else ''}
<div class="plots">{figs}</div>
</body></html>
"""


def html_dependency_note() -> str | None:
    """Why the HTML page comes without plots on this install (None: it has them)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return "no plots: matplotlib is not installed (pip install 'edgeopt[report]')"
    return None


def _label(r: dict[str, Any], with_model: bool = True) -> str:
    return f"{r['target']}-{r['precision']} @ {r['device']}" + (f"\n{r['model']}" if with_model else "")


def _plots(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """[(caption, base64 PNG)]: latency distributions and latency vs accuracy."""
    import base64

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_key = {}
    for rec in records:
        r = row_of(rec)
        by_key[(r["model"], r["target"], r["precision"], r["device"], r["time"])] = rec
    ok = [r for r in rows if r["status"] in ("ok", "mismatch") and r["p50_ms"] is not None]
    many = len({r["model"] for r in ok}) > 1  # name the model on each artifact only when it varies
    out = []

    def png(fig) -> str:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
        plt.close(fig)
        return base64.b64encode(buf.getvalue()).decode()

    if ok:
        stats, colours = [], []
        for r in ok:
            rec = by_key.get((r["model"], r["target"], r["precision"], r["device"], r["time"])) or {}
            samples = [s for s in ((rec.get("bench") or {}).get("samples_ms") or []) if _num(s) is not None]
            lab = _label(r, many)
            if len(samples) >= 5:
                stats.append(("samples", lab, samples))
            else:  # no samples kept: draw the box from the percentiles
                stats.append(("pct", lab, r))
            colours.append("#2f81f7" if r["status"] == "ok" else "#cf222e")
        fig, ax = plt.subplots(figsize=(8, 0.6 * len(stats) + 1.6))
        bxp = []
        for kind, lab, v in stats:
            if kind == "samples":
                import numpy as np

                a = np.asarray(v, dtype=float)
                q1, med, q3 = np.percentile(a, [25, 50, 75])
                lo, hi = np.percentile(a, [1, 99])
                bxp.append({"label": lab, "med": med, "q1": q1, "q3": q3, "whislo": lo, "whishi": hi,
                            "fliers": a[(a < lo) | (a > hi)][:200], "mean": float(a.mean())})
            else:
                bxp.append({"label": lab, "med": v["p50_ms"], "q1": v["min_ms"] or v["p50_ms"],
                            "q3": v["p90_ms"] or v["p50_ms"], "whislo": v["min_ms"] or v["p50_ms"],
                            "whishi": v["p99_ms"] or v["p50_ms"], "fliers": []})
        parts = ax.bxp(bxp, orientation="horizontal", patch_artist=True, showfliers=True,
                       flierprops={"markersize": 2, "alpha": 0.4})
        for patch, col in zip(parts["boxes"], colours):
            patch.set_facecolor(col)
            patch.set_alpha(0.55)
        for i, (kind, _, v) in enumerate(stats, start=1):
            if kind == "samples":  # the samples themselves, jittered, over the box
                import numpy as np

                a = np.asarray(v, dtype=float)[:2000]
                jitter = np.random.default_rng(i).uniform(-0.18, 0.18, a.size)
                ax.scatter(a, i + jitter, s=3, alpha=0.25, color="#1b1f24", linewidths=0)
        ax.set_xlabel("latency per inference (ms), box = quartiles, whiskers = p1..p99")
        ax.set_title("Latency distribution per artifact")
        ax.grid(axis="x", alpha=0.3)
        ax.invert_yaxis()
        out.append(("Latency distribution per artifact and device", png(fig)))

        fig, ax = plt.subplots(figsize=(8, 4.6))
        lo, hi = min(r["p50_ms"] for r in ok), max(r["p50_ms"] for r in ok)
        for r in ok:
            y = r["top1"] if r["top1"] is not None else r["cosine_min"]
            if y is None:
                continue
            col = "#2f81f7" if r["accuracy"] == "passed" else "#cf222e"
            ax.scatter([r["p50_ms"]], [y], s=60, color=col, edgecolors="#1b1f24", zorder=3)
            right = r["p50_ms"] > (lo + hi) / 2  # labels point inwards so none runs off the plot
            ax.annotate(f"{r['target']}-{r['precision']} @ {r['device']}", (r["p50_ms"], y), fontsize=8,
                        xytext=(-6 if right else 6, 4), textcoords="offset points", ha="right" if right else "left")
        ax.set_xlabel("median latency (ms)")
        use_top1 = any(r["top1"] is not None for r in ok)
        ax.set_ylabel("top-1 agreement with FP32 reference" if use_top1 else "cosine similarity to FP32 reference")
        ax.set_title("Latency vs accuracy (blue: within tolerance, red: not)")
        ax.grid(alpha=0.3)
        ax.margins(x=0.25, y=0.15)
        out.append(("Latency vs accuracy against the FP32 reference", png(fig)))

        fig, ax = plt.subplots(figsize=(8, 0.45 * len(ok) + 1.4))
        labels = [_label(r, many).replace("\n", " · ") for r in ok]
        vals = [r["throughput_ips"] or 0 for r in ok]
        ax.barh(labels, vals, color=["#1a7f37" if r["status"] == "ok" else "#cf222e" for r in ok])
        ax.invert_yaxis()
        ax.set_xlabel("inferences per second")
        ax.set_title("Throughput")
        ax.grid(axis="x", alpha=0.3)
        out.append(("Throughput per artifact and device", png(fig)))
    return out
