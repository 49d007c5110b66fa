"""One comparison of runs: targets x devices x precisions, as a table, Markdown, CSV, JSON or HTML.

Rows come from the results database (by default the latest run of each (model, target, precision,
device)): latency percentiles, throughput, load time, memory, and accuracy against the FP32
reference; energy per inference and mean power where the device has a source the agent read ("—" and
the reason in a note where it has none).  The HTML page is self-contained: inline CSS and plots drawn by matplotlib (Agg) as
base64 PNG — the latency distribution of every artifact (from the bench's samples) and latency
against accuracy.
"""

from __future__ import annotations

import csv
import html
import io
import math
from typing import Any

from edgeopt import decide
from edgeopt.ui import clip

FORMATS = ("table", "md", "html", "json", "csv")

# (key, header) of the comparison, in order.
COLUMNS = [
    ("model", "model"), ("target", "target"), ("precision", "precision"), ("device", "device"),
    ("device_truth", "measured on"), ("status", "status"), ("ship", "ship"),
    ("gate_accepts", "accuracy policy vs FP32"),  # beside "ship": a refused row is seen as refused at once
    ("p50_ms", "p50 ms"), ("p90_ms", "p90 ms"), ("p99_ms", "p99 ms"),
    ("p99_9_ms", "p99.9 ms"), ("throughput_ips", "inf/s"), ("vs_fp32", "× fp32"), ("energy_j", "J/inf"),
    ("load_s", "load s"),
    ("first_inference_ms", "1st inf ms"), ("peak_rss_mb", "peak MB"), ("artifact_mb", "size MB"),
    ("agreement", "vs FP32 reference (n, data)"), ("cosine_min", "cosine"),
    ("agreement_ci", "agreement (k/n, 95% CI)"),
    ("runtime", "runtime"), ("time", "measured (UTC)"),
]
# Where a row was measured (edgeopt.decide.device_truth): only "device" rows can be the basis of a SHIP.
TRUTH_TEXT = {"device": "device", "build-host": "BUILD HOST", "other-vendor": "OTHER VENDOR", "emulated": "EMULATED"}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def records_of(records: list[Any]) -> list[dict[str, Any]]:
    """The records as dicts: ``results.BenchRecord`` (the API's typed records) read through its ``raw``,
    ``fleetbench.RunRecord`` through ``as_dict()``, dicts as they are."""
    from edgeopt.results import BenchRecord

    return [r.raw if isinstance(r, BenchRecord) else r if isinstance(r, dict) else r.as_dict() for r in records]


def row_of(rec: dict[str, Any]) -> dict[str, Any]:
    """The comparison row of one record (plain numbers; formatting is the output's job)."""
    from edgeopt.results import energy_of

    b, bench = rec.get("bundle") or {}, rec.get("bench") or {}
    lat = bench.get("latency_ms") or {}
    acc = bench.get("accuracy") or {}
    metrics = [o.get("metrics") or {} for o in (acc.get("outputs") or {}).values()]
    cos = [m["cosine"] for m in metrics if _num(m.get("cosine")) is not None]
    top1 = [m["top1"] for m in metrics if _num(m.get("top1")) is not None]
    runner = bench.get("runner") or {}
    err = rec.get("error") or {}
    first = _num(bench.get("first_inference_s"))
    dev = rec.get("device") or {}
    env = bench.get("environment") or {}
    art = bench.get("artifact") or {}
    data = acc.get("data") or {}
    n = acc.get("samples") or data.get("n")
    kind = data.get("kind")
    shapes = art.get("input_shapes") or {}
    load = (env.get("loadavg") or [None])[0]
    cores = env.get("cores_usable") or env.get("cores")
    p50, p90 = _num(lat.get("p50")), _num(lat.get("p90"))
    noise = []
    if _num(load) is not None and cores and load > cores:
        noise.append(f"load {load:.1f} above {cores} cores")
    if p50 and p90 and p90 / p50 > 1.5:
        noise.append(f"p90/p50 {p90 / p50:.1f}")
    target = b.get("target")
    truth, truth_why = decide.device_truth(rec)
    gate_ok, gate_why = decide.gate_defaults_accept(acc) if rec.get("status") == "ok" else (None, "")
    energy = energy_of(bench, rec)
    return {
        "model": b.get("model"), "target": target, "precision": b.get("precision"),
        "backend": b.get("backend"), "device": dev.get("name"), "status": rec.get("status"),
        "p50_ms": p50, "p90_ms": p90, "p95_ms": _num(lat.get("p95")),
        "p99_ms": _num(lat.get("p99")), "p99_9_ms": _num(lat.get("p99_9")), "mean_ms": _num(lat.get("mean")),
        "std_ms": _num(lat.get("std")), "min_ms": _num(lat.get("min")), "max_ms": _num(lat.get("max")),
        "throughput_ips": _num(bench.get("throughput_ips")), "iterations": bench.get("iterations"),
        "load_s": _num(bench.get("load_s")), "first_inference_ms": None if first is None else first * 1000,
        "peak_rss_mb": _num(bench.get("peak_rss_mb")),
        "artifact_mb": None if not art.get("artifact_bytes") else art["artifact_bytes"] / 1e6,
        "input_shape": ", ".join(f"{k}{v}" for k, v in shapes.items()) or None,
        "batch": (bench.get("inputs") or {}).get("batch"),
        "accuracy": None if "passed" not in acc else ("passed" if acc["passed"] else "FAILED"),
        "samples": n, "data_source": kind,
        "agreement": None if "passed" not in acc else (
            ("passed" if acc["passed"] else "FAILED") + (f", n={n}" if n else "")
            + (", RANDOM data" if kind == "random" else f", {kind}" if kind and kind != "unknown" else "")),
        "cosine_min": min(cos) if cos else None, "top1": min(top1) if top1 else None,
        "runtime": " ".join(str(x).split("-")[0] for x in (runner.get("runtime"), runner.get("version")) if x) or None,
        "time": rec.get("time"), "run_id": rec.get("run_id"), "bundle_id": b.get("bundle_id"),
        "error": (f"{err.get('type')}: {err.get('message')}" if err else None),
        "hint": err.get("hint") if err else None,
        "device_truth": truth, "device_truth_why": truth_why, "on_build_host": truth == "build-host",
        "agreement_ci": decide.agreement(acc), "gate_accepts": gate_ok, "gate_reason": gate_why,
        "noise": "; ".join(noise) or None, "loadavg": _num(load), "cores": cores,
        "threads": env.get("threads"), "cpu_model": env.get("cpu_model"),
        "build_warnings": art.get("build_warnings") or [],
        "ship": None, "vs_fp32": None,
        # energy (last: the CSV columns before it keep their places): J per inference and mean W where the
        # agent read a source; the source (None: not available, energy_why_not says why; all None: the
        # agent reported no energy at all)
        "energy_j": energy.joules_per_inference if energy else None,
        "energy_w": energy.mean_power_w if energy else None,
        "energy_source": energy.source if energy else None,
        "energy_resolution": energy.resolution if energy else None,
        "energy_samples": energy.samples if energy else None,
        "energy_why_not": (None if energy.measured else energy.why_not or "the agent gave no reading")
        if energy else None,
        # private (never written out): what the verdict resamples and the bundle's folder for its hint
        "_samples": [float(x) for x in (bench.get("samples_ms") or []) if _num(x) is not None],
        "_bundle_path": b.get("path"),
    }


def choose(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mark, per (model, device, batch), the artifact to ship (``edgeopt.decide``: the one comparison
    engine: intervals, noise, device truth, the gate's default accuracy rules) and return the verdicts as
    dicts.  Also the speed-up of each row over the FP32 bundle of the same runtime on the same device at
    the same batch (runtime vs precision effect)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["device"], r.get("batch") or 1), []).append(r)
    for rs in groups.values():
        for r in rs:
            base = next((x for x in rs if x["backend"] == r["backend"] and x["precision"] == "fp32"
                         and x["p50_ms"]), None)
            if base and r["p50_ms"] and r is not base:
                r["vs_fp32"] = base["p50_ms"] / r["p50_ms"]
    verdicts = decide.decide(rows)
    for v in verdicts:
        for r in rows:
            if (r["model"], r["device"], r.get("batch") or 1, f"{r['target']}-{r['precision']}", r.get("time")) == (
                    v.model, v.device, v.batch, v.ship, v.measured) and r["status"] == "ok":
                r["ship"] = "SHIP"
    return [v.as_dict() for v in verdicts]


def rows_of(records: list[Any]) -> list[dict[str, Any]]:
    """Rows sorted model, target, precision, batch, device; the ship marks and × fp32 filled in (records:
    typed or dicts, see ``records_of``)."""
    rows = [row_of(r) for r in records_of(records)]
    rows = sorted(rows, key=lambda r: (*(str(r.get(k) or "") for k in ("model", "target", "precision")),
                                       r.get("batch") or 1, str(r.get("device") or "")))
    choose(rows)
    return rows


def public(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows as written out (JSON, CSV): without the private keys (samples, local paths)."""
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


def notes_of(rows: list[dict[str, Any]]) -> list[str]:
    """What a reader must know before trusting the table: the verdict per (device, batch), rows that are
    not device truth, random data, noise and build warnings."""
    out = [v["line"] for v in choose([dict(r) for r in rows])]
    for truth in ("build-host", "other-vendor", "emulated"):
        these = sorted({f"{r['target']}-{r['precision']} @ {r['device']}" for r in rows
                        if r.get("device_truth") == truth})
        if these:
            what = {"build-host": "measured on the build host, not on the target device",
                    "other-vendor": "measured on another vendor's hardware than the target's",
                    "emulated": "measured under emulation"}[truth]
            out.append(f"{what}: {', '.join(these)} (its speed here says little about the device; never a SHIP)")
    rnd = sorted({f"{r['target']}-{r['precision']}" for r in rows if r["data_source"] == "random"})
    if rnd:
        out.append(f"validated on RANDOM data (no --calib): {', '.join(rnd)}")
    for r in rows:
        if r["noise"]:
            out.append(f"noisy: {r['device']} {r['target']}-{r['precision']}"
                       + (f" batch {r['batch']}" if (r.get("batch") or 1) > 1 else "") + f": {r['noise']}")
    for w in sorted({w for r in rows for w in r["build_warnings"]}):
        out.append(f"build warning: {w}")
    return out + energy_notes(rows)


def _has_energy(r: dict[str, Any]) -> bool:
    """The agent reported on energy for this row (measured, or said why not)."""
    return r.get("energy_source") is not None or r.get("energy_why_not") is not None


def energy_detail(r: dict[str, Any]) -> str:
    """What stands behind a J/inf cell: mean power, the source, its resolution and readings (or why not)."""
    if r.get("energy_j") is None:
        return f"energy: {r.get('energy_why_not')}" if _has_energy(r) else ""
    res = r.get("energy_resolution")
    bits = [f"{r['energy_w']:.3g} W mean" if r.get("energy_w") is not None else None,
            f"source {r.get('energy_source')}",
            f"resolution {res:g}" if isinstance(res, (int, float)) else f"resolution {res}" if res else None,
            f"{r['energy_samples']} readings" if r.get("energy_samples") else None]
    return ", ".join(b for b in bits if b)


def energy_notes(rows: list[dict[str, Any]]) -> list[str]:
    """The footnotes of the J/inf column: per measured row its mean power and source; where energy could
    not be read, why (once per device and reason)."""
    out, seen = [], set()
    for r in rows:
        if r.get("energy_j") is not None:
            out.append(f"energy: {r['target']}-{r['precision']} @ {r['device']}: {_fmt('energy_j', r['energy_j'])} "
                       f"J/inf, {energy_detail(r)}")
    for r in rows:
        if r.get("energy_j") is None and _has_energy(r) and (r["device"], r["energy_why_not"]) not in seen:
            seen.add((r["device"], r["energy_why_not"]))
            out.append(f"J/inf — on {r['device']}: {r['energy_why_not']}")
    return out


def accepted(r: dict[str, Any]) -> bool:
    """A row the accuracy policy accepts: within its bound and not refused by the policy
    (``edgeopt.policy.accept``, through ``decide.gate_defaults_accept``): the one word the report's
    colours, the SHIP line and the build share."""
    return r.get("accuracy") == "passed" and r.get("gate_accepts") is not False


def _fmt(key: str, v: Any) -> str:
    """One format per column."""
    if v is None:
        return ""
    if key == "cosine_min":
        return f"{v:.6f}"
    if key == "top1":
        return f"{v:.1%}"
    if key == "agreement_ci":
        return decide.agreement_text(v)
    if key == "gate_accepts":
        return "accept" if v else "REFUSE"
    if key == "device_truth":
        return TRUTH_TEXT.get(v, str(v))
    if key == "vs_fp32":
        return f"{v:.2f}x"
    if key == "energy_j":
        return f"{v:.3g}"
    if key == "time":
        return str(v)[:16].replace("T", " ")
    if key == "throughput_ips":
        return f"{v:,.0f}"
    if key.endswith("_ms") or key.endswith("_s"):
        return f"{v:.2f}"
    if key.endswith("_mb"):
        return f"{v:.1f}"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


# Columns a narrow terminal loses first (COLUMNS, or the terminal's width).
DROP_ORDER = ["time", "runtime", "cosine_min", "energy_j", "first_inference_ms", "load_s", "p99_9_ms", "peak_rss_mb",
              "artifact_mb", "p90_ms", "vs_fp32", "model"]


def columns_for(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """COLUMNS, with a batch column after precision when some run used a batch above 1 (a batch curve), and
    the J/inf column only when some agent reported on energy (measured, or why not)."""
    cols = COLUMNS if any(map(_has_energy, rows)) else [c for c in COLUMNS if c[0] != "energy_j"]
    if not any((r.get("batch") or 1) > 1 for r in rows):
        return cols
    i = [k for k, _ in cols].index("precision") + 1
    return [*cols[:i], ("batch", "batch"), *cols[i:]]


def _cells(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    out = []
    for r in rows:
        c = {k: _fmt(k, r.get(k)) for k, _ in columns_for(rows)}
        if r.get("error") and r["status"] != "ok":
            c["status"] = f"{r['status']}"
        if "energy_j" in c and r.get("energy_j") is None and _has_energy(r):
            c["energy_j"] = "—"  # the agent could not read energy there: why is in the notes
        out.append(c)
    return out


def _errors(rows: list[dict[str, Any]]) -> list[str]:
    """One line per failed run, with what to do about it where the error says (its hint), once per device
    and hint (a dead device's hint is not repeated for each of its bundles)."""
    out, hinted = [], set()
    for r in rows:
        if not r.get("error") or r.get("status") == "ok":
            continue
        line = f"{r['device']} / {r['model']} {r['target']}-{r['precision']}: {r['error']}"
        key = (r["device"], r.get("hint"))
        if r.get("hint") and key not in hinted:
            hinted.add(key)
            line += f"\n    hint: {r['hint']}"
        out.append(line)
    return out


def render(records: list[Any], fmt: str = "table", title: str = "edgeopt report",
           filters: dict[str, Any] | None = None) -> str:
    """The report of these records in one format (see ``FORMATS``); gate verdicts (``edgeopt gate``) get
    their own baseline-vs-candidate section (``edgeopt.gate_report``), bench runs the comparison table."""
    from edgeopt import gate_report
    from edgeopt.report_varlen import varlen_rows, varlen_text

    records = records_of(records)
    gates = [r for r in records if gate_report.is_gate(r)]
    records = [r for r in records if not gate_report.is_gate(r)]
    rows = rows_of(records)
    if fmt == "json":
        from edgeopt import jsonsafe

        return jsonsafe.dumps({"schema": "edgeopt/v1", "kind": "report", "title": title, "filters": filters or {},
                               "count": len(rows), "rows": public(rows), "ship": choose([dict(r) for r in rows]),
                               "notes": notes_of(rows), "gates": gate_report.as_json(gates),
                               **({"per_bucket": varlen_rows(records)} if varlen_rows(records) else {})},
                              indent=2, default=str) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        out_rows = public(rows)
        for r in out_rows:
            a = r.get("agreement_ci")
            r["agreement_ci"] = decide.agreement_text(a) if a else None
        keys = list(out_rows[0]) if out_rows else [k for k, _ in COLUMNS]
        w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
        w.writeheader()
        w.writerows(out_rows)
        return buf.getvalue()
    if fmt == "table":
        from edgeopt.ui import table

        gate_lines = gate_report.text(gates)
        if not rows:
            return (gate_lines + "\n") if gate_lines else "no runs match\n"
        text = table(_cells(rows), columns_for(rows), drop=DROP_ORDER)
        errs = _errors(rows)
        notes = notes_of(rows)
        dec = decomposition_text(records)
        from edgeopt.report_scenarios import scenario_text

        scen = scenario_text(records)
        buckets = varlen_text(records)  # issue 42: per bucket, so the longest one's regression shows
        return (text + ("\n\n" + "\n".join(notes) if notes else "") + ("\n\n" + scen.rstrip() if scen else "")
                + ("\n\n" + buckets if buckets else "")
                + ("\n\n" + dec if dec else "")
                + ("\n\nfailures:\n  " + "\n  ".join(errs) if errs else "")
                + ("\n\n" + gate_lines if gate_lines else "") + "\n")
    if fmt == "md":
        gate_lines = gate_report.text(gates)
        from edgeopt.report_scenarios import scenario_md

        return _markdown(rows, title) + scenario_md(records) + ("\n## Gates\n\n" + "\n".join(f"- {x}" for x in gate_lines.splitlines())
                                         + "\n" if gate_lines else "")
    if fmt == "html":
        return _html(rows, records, title, filters or {}, gates)
    from edgeopt.errors import UsageError

    raise UsageError(f"unknown report format {fmt!r}", hint="one of: " + ", ".join(FORMATS))


def _markdown(rows: list[dict[str, Any]], title: str) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", " ")

    lines = [f"# {title}", ""]
    if not rows:
        return "\n".join(lines + ["No runs match.", ""])
    cols = columns_for(rows)
    lines.append("| " + " | ".join(h for _, h in cols) + " |")
    lines.append("|" + "|".join("---:" if k.endswith(("_ms", "_s", "_mb", "_ips")) or k == "energy_j" else "---"
                                for k, _ in cols)
                 + "|")
    for c in _cells(rows):
        lines.append("| " + " | ".join(esc(c[k]) for k, _ in cols) + " |")
    notes = notes_of(rows)
    if notes:
        lines += [""] + [f"- {esc(n)}" for n in notes]
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
tr.ship td{background:#dafbe1} tr.ship td.ship{color:#1a7f37;font-weight:700} tr.host td.device{color:#9a6700}
tr.untrue td{color:#6e7781;font-style:italic} tr.untrue td.device_truth{color:#9a6700;font-weight:700;font-style:normal}
th{white-space:normal;max-width:90px;vertical-align:bottom} ul.notes{margin:6px 0 10px;padding-left:18px}
dl.meta{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;font-size:12px;margin:0 0 10px}
dl.meta dt{color:#57606a} dl.meta dd{margin:0}
td.refuse{color:#cf222e;font-weight:700} td.accept{color:#1a7f37}
.verdicts{display:flex;flex-wrap:wrap;gap:12px;margin:10px 0 14px}
.verdict{border:2px solid #1a7f37;border-radius:6px;padding:10px 14px;background:#f6fff8;max-width:860px;
 flex:1 1 360px;overflow-wrap:anywhere}
.verdict.nowinner{border-color:#9a6700;background:#fffbeb} .verdict.noship{border-color:#cf222e;background:#fff5f5}
.verdict .pick{font-size:17px;font-weight:700} .verdict .pick .tag{color:#1a7f37}
.verdict.nowinner .pick .tag{color:#9a6700} .verdict.noship .pick .tag{color:#cf222e}
.verdict .crit,.verdict .ratio{margin-top:4px} .verdict .crit{color:#57606a;font-size:13px}
.verdict ul{margin:6px 0 0;padding-left:18px} .verdict code{font-size:12px;background:#eaeef2;padding:1px 4px;
 border-radius:3px} .legend{color:#57606a;font-size:12px;margin:-12px 0 16px;padding-top:14px}
h1,dl.meta dd{overflow-wrap:anywhere}
@media (max-width:600px){body{margin:10px} .verdict{flex-basis:100%;padding:8px 10px} .verdict .pick{font-size:15px}}
"""


def _meta_html(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> str:
    """Where and how it was measured: per device its CPU, cores, memory, OS, load during the run;
    threads, warm-up, duration and iterations of the runs."""
    import sys

    items = []
    seen = set()
    for rec in records:
        dev = (rec.get("device") or {}).get("name")
        bench = rec.get("bench") or {}
        env = bench.get("environment") or {}
        if dev in seen or not env:
            continue
        seen.add(dev)
        probe = rec.get("probe") or {}
        mem = probe.get("memory_mb")
        mem = mem.get("total") if isinstance(mem, dict) else mem
        load = env.get("loadavg") or []
        after = (env.get("after") or {}).get("loadavg") or []
        bits = [f"{env.get('cpu_model') or '?'} × {env.get('cores_usable') or env.get('cores') or '?'} cores",
                f"{mem / 1024:.0f} GiB" if isinstance(mem, (int, float)) else "",
                f"{env.get('os') or ''} {env.get('kernel') or ''} {env.get('arch') or ''}".strip(),
                f"load {load[0]:.2f} → {after[0]:.2f} during the runs" if load and after else ""]
        items.append((f"device {dev}", " · ".join(b for b in bits if b)))
    opts = [(rec.get("bench") or {}).get("options") or {} for rec in records]
    if opts:
        o = opts[0]
        iters = [r.get("iterations") for r in rows if r.get("iterations")]
        items.append(("runs", f"threads {o.get('threads') or 'runtime default'}, warm-up "
                      + (f"{o['warmup_s']:g} s" if o.get("warmup_s") else f"{o.get('warmup')} iterations")
                      + f", {o.get('duration_s')} s timed, "
                      + _batch_label(sorted({int(x.get("batch") or 1) for x in opts})).strip(" —")
                      + (f", {min(iters)}–{max(iters)} iterations per artifact" if iters else "")))
    shapes = sorted({r["input_shape"] for r in rows if r.get("input_shape")})
    if shapes:
        items.append(("inputs", "; ".join(shapes)))
    items.append(("report made by", " ".join(["edgeopt", *(portable(a) for a in sys.argv[1:])])[:300]))
    return '<dl class="meta">' + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>" for k, v in items) + "</dl>"


LEGEND = ("ship: the artifact to deploy on that device at that batch (the verdict above says why); accuracy policy "
          "vs FP32: the gate defaults' word (accept / REFUSE: a refused row is never shipped); × fp32: the same "
          "runtime's FP32 p50 over this row's (2.00x = twice as fast; empty on the FP32 row itself); measured on: "
          "rows not measured on their own device are greyed and never shipped.")


def _batch_label(batches: list[int]) -> str:
    """`` — batch curve: 1, 4, 8`` (latency per call of B inputs), `` — batch 4``, or ``batch 1``."""
    if len(batches) > 1:
        return " — batch curve: " + ", ".join(map(str, batches)) + " (latency per call of B inputs)"
    if batches and batches[0] > 1:
        return f" — batch {batches[0]} (latency per call of {batches[0]} inputs)"
    return "batch 1"


def _why_not(r: dict[str, Any], v: dict[str, Any]) -> str:
    """Why row ``r`` is not the pick of verdict ``v`` (one line)."""
    name = decide._name(r)
    if r.get("status") != "ok":
        return f"{r.get('status')}" + (f": {clip(r.get('error'), 160)}" if r.get("error") else "")
    if r.get("accuracy") != "passed":
        return f"outside its own bound vs FP32 ({r.get('agreement') or 'not measured'})"
    truth = r.get("device_truth") or "device"
    if truth != "device":
        where = {"build-host": "on the build host", "other-vendor": "on another vendor's hardware",
                 "emulated": "under emulation"}.get(truth, truth)
        return "never a SHIP: " + (r.get("device_truth_why") or f"measured {where}, not on its own device")
    if r.get("gate_accepts") is False:
        return f"REFUSED by the accuracy policy (gate defaults vs FP32): {r.get('gate_reason')}"
    c = next((c for c in v.get("compared") or [] if c.get("name") == name), None)
    if c is None and name == v.get("runner_up") and v.get("ratio") is not None:  # the fastest, not picked
        return (f"fastest p50 ({_fmt('p50_ms', r.get('p50_ms'))} ms), but {v['ship']} is not separated from it "
                f"(ratio {v['ratio']:.2f}x, 99% CI {v['ci_low']:.2f}–{v['ci_high']:.2f}x) and is more faithful")
    if c is None or c.get("ratio") is None:
        return "not compared (no latency samples)"
    ratio = f"{c['ratio']:.2f}x the p50 of {_fastest(v)} (99% CI {c['ci_low']:.2f}–{c['ci_high']:.2f}x)"
    if c.get("separated"):
        return f"slower: {ratio}"
    return f"not separated on this evidence: {ratio}; less faithful than {v['ship']}" if v.get("basis") == \
        "fidelity" else f"not separated: {ratio}"


def _fastest(v: dict[str, Any]) -> str:
    """The candidate every ``compared`` ratio is measured against (the fastest p50)."""
    names = {c.get("name") for c in v.get("compared") or []}
    return v["ship"] if v.get("ship") not in names else (v.get("runner_up") or "the fastest")


def verdict_boxes(rows: list[dict[str, Any]], verdicts: list[dict[str, Any]]) -> str:
    """One box per (model, device, batch) above the table: the pick, the criterion, the ratio with its 99%
    interval (printed when it is not conclusive too), and one line per other artifact saying why not."""
    out = []
    for v in verdicts:
        group = [r for r in rows if (r["model"], r["device"], int(r.get("batch") or 1)) ==
                 (v["model"], v["device"], int(v["batch"] or 1))]
        latest: dict[str, dict[str, Any]] = {}
        for r in group:  # `report --all`: each artifact once, its latest run
            if decide._name(r) not in latest or str(r.get("time") or "") > str(latest[decide._name(r)].get("time") or ""):
                latest[decide._name(r)] = r
        where = f"on {v['device']} · batch {v['batch']}" + (f" · {v['model']}" if len({r['model'] for r in rows}) > 1
                                                            else "")
        if not v.get("ship"):
            kind, head = "noship", f'<span class="tag">No SHIP</span> {html.escape(where)}'
        elif v.get("basis") == "fidelity":
            kind, head = "nowinner", (f'<span class="tag">No clear winner</span> {html.escape(where)}: ship '
                                      f'<b>{html.escape(v["ship"])}</b>, the more faithful')
        else:
            kind, head = "ship", f'<span class="tag">SHIP</span> <b>{html.escape(v["ship"])}</b> {html.escape(where)}'
        crit = (f"criterion: {v['criterion']}, among the rows measured on their own device that the accuracy policy "
                "(gate defaults vs FP32) accepts")
        if v.get("basis") == "only candidate":
            ratio = f"the only candidate: {v['p50_ms']:.3g} ms p50"
        elif v.get("ratio") is not None:
            slow, quick = ((v["runner_up"], v["ship"]) if v.get("basis") == "speed" or _fastest(v) == v["ship"]
                           else (v["ship"], v["runner_up"]))
            ratio = (f"{slow} / {quick} p50: {v['ratio']:.2f}x (99% CI {v['ci_low']:.2f}–{v['ci_high']:.2f}x"
                     + (f", Holm p={v['p_value']:.2g}" if v.get("p_value") is not None else "") + ")"
                     + ("" if v.get("clear") else " — not conclusive on this evidence"))
        else:
            ratio = ""
        reason = ""
        if kind == "nowinner":
            m = v["line"].split("no clear winner on ", 1)[-1]
            reason = m[m.find("(") + 1:m.find("): ship")] if "): ship" in m else ""
        others = [r for n, r in sorted(latest.items()) if n != v.get("ship")]
        items = "".join(f"<li><b>{html.escape(decide._name(r))}</b>: {html.escape(_why_not(r, v))}</li>"
                        for r in others)
        policy = ("" if v.get("gate_accepts") is None else
                  "accuracy policy: accepts it against FP32" if v["gate_accepts"] else
                  f"accuracy policy: REFUSES it ({v.get('gate_reason')})")
        out.append(f'<section class="verdict {kind}"><div class="pick">{head}</div>'
                   f'<div class="crit">{html.escape(crit)}</div>'
                   + (f'<div class="ratio">{html.escape(ratio)}</div>' if ratio else "")
                   + (f'<div class="crit">why not conclusive: {html.escape(reason)}</div>' if reason else "")
                   + (f'<div class="crit">{html.escape(policy)}'
                      + (" — on RANDOM data" if v.get("random_data") else "") + "</div>" if policy else "")
                   + (f"<ul>{items}</ul>" if items else "")
                   + (f'<div class="crit">to separate them, measured interleaved on the device: '
                      f'<code>{html.escape(v["paired"])}</code></div>' if v.get("paired") else "")
                   + "</section>")
    return f'<div class="verdicts">{"".join(out)}</div>' if out else ""


def _html(rows: list[dict[str, Any]], records: list[dict[str, Any]], title: str, filters: dict[str, Any],
          gates: list[dict[str, Any]] | None = None) -> str:
    from edgeopt import __version__, gate_report

    models = sorted({str(r["model"]) for r in rows})
    # One model: say it once in the heading and give its column's width to the numbers.
    cols = [c for c in columns_for(rows) if not (c[0] == "model" and len(models) == 1)]
    num = {k for k, _ in cols if k.endswith(("_ms", "_s", "_mb", "_ips"))
           or k in ("cosine_min", "top1", "vs_fp32", "energy_j")}
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h in cols)
    body = []
    for r, c in zip(rows, _cells(rows)):
        cls = ("ok" if r["status"] == "ok" else "bad") + (" ship" if r.get("ship") else "") + (
            " host" if r.get("on_build_host") else "") + (
            " untrue" if r.get("device_truth") not in (None, "device") else "")
        tip = {"energy_j": energy_detail(r),  # the J/inf cell's title: mean W, source, resolution (or why not)
               "gate_accepts": r.get("gate_reason") or ""}
        policy = {True: " accept", False: " refuse"}.get(r.get("gate_accepts"), "")
        tds = "".join(f'<td class="{"num" if k in num else k}{policy if k == "gate_accepts" else ""}"'
                      + (f' title="{html.escape(tip[k])}"' if tip.get(k) else "") + f">{html.escape(c[k])}</td>"
                      for k, _ in cols)
        body.append(f'<tr class="{cls}">{tds}</tr>')
    verdicts = choose([dict(r) for r in rows]) if rows else []
    lines = {v["line"] for v in verdicts}
    notes = [n for n in notes_of(rows) if n not in lines] if rows else []  # the verdicts are in their boxes
    batches = sorted({int(r.get("batch") or 1) for r in rows})
    curve = len(batches) > 1 or batches not in ([], [1])
    errs = _errors(rows)
    note = html_dependency_note()
    plots = _plots(rows, records) if rows and not note else []
    figs = (f'<p class="meta">{html.escape(note)}</p>' if note and rows else "") + "".join(f'<figure><img alt="{html.escape(cap)}" src="data:image/png;base64,{data}">'
                   f"<figcaption>{html.escape(cap)}</figcaption></figure>" for cap, data in plots)
    shown = ", ".join(f"{k}={v}" for k, v in filters.items() if v) or "latest run of each artifact on each device"
    model_line = f"model {html.escape(models[0])} &middot; " if len(models) == 1 else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{_CSS}{gate_report.CSS}</style></head><body>
<h1>{html.escape(title)}{html.escape(_batch_label(batches)) if curve else ''}</h1>
<div class="meta">{model_line}{len(rows)} run(s) &middot; {html.escape(shown)} &middot; edgeopt {html.escape(__version__)}</div>
{_meta_html(rows, records)}
{verdict_boxes(rows, verdicts)}
<div class="scroll"><table id="comparison"><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>
<div class="legend">{html.escape(LEGEND)}</div>
{('<ul class="notes">' + ''.join(f'<li>{html.escape(n)}</li>' for n in notes) + '</ul>') if notes else ''}
{('<h2>Failures</h2><ul class="err">' + ''.join(f'<li>{html.escape(e)}</li>' for e in errs) + '</ul>') if errs else ''}
<div class="plots">{figs}</div>
{_scenarios_html(records)}
{_decomposition_html(records)}
{gate_report.section_html(gates or [], plots=note is None)}
</body></html>
"""


def _scenarios_html(records: list[dict[str, Any]]) -> str:
    from edgeopt.report_scenarios import scenario_html

    return scenario_html(records)


def decompositions(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records benched with ``--profile``: label, stages and top ops (see device_agents/decompose.py)."""
    out = []
    for rec in records:
        d = (rec.get("bench") or {}).get("decomposition")
        if not d:
            continue
        b, dev = rec.get("bundle") or {}, rec.get("device") or {}
        out.append({"label": f"{b.get('target')}-{b.get('precision')} @ {dev.get('name')}", **d})
    return out


def decomposition_text(records: list[dict[str, Any]], top: int = 5) -> str:
    """Where one request's time goes, per profiled artifact, as text lines."""
    lines = []
    for d in decompositions(records):
        st = "  ".join(f"{s['stage']} {s['ms']:.3f}" if s.get("ms") is not None else f"{s['stage']} -"
                       for s in d["stages"])
        lines.append(f"{d['label']}: ms per request: {st}")
        p = d.get("profile") or {}
        if p.get("ops"):
            ov = p.get("overhead_vs_p50")
            lines.append(f"  top ops ({p['profiler']}, {p['iterations']} runs"
                         + (f", profiled runs {ov:+.0%} vs p50" if ov is not None else "") + "): "
                         + ", ".join(f"{o['op']} {o['share']:.0%}" for o in p["ops"][:top]))
        elif p:
            lines.append(f"  per-op profile: {p.get('why')}")
    return "\n".join(lines)


_STAGE_COLOURS = {"preprocess": "#7aa6c2", "copy in": "#c9b458", "compute": "#5a8f5a", "copy out": "#c98f58",
                  "postprocess": "#a77bb0"}


def _decomposition_html(records: list[dict[str, Any]]) -> str:
    ds = decompositions(records)
    if not ds:
        return ""
    parts = ["<h2>Where one request's time goes</h2>"]
    for d in ds:
        known = [s for s in d["stages"] if s.get("ms")]
        total = sum(s["ms"] for s in known) or 1e-12
        bar = "".join(f'<span title="{html.escape(s["stage"])}: {s["ms"]:.3f} ms ({html.escape(s["how"])})" '
                      f'style="display:inline-block;height:14px;width:{max(0.5, 100 * s["ms"] / total):.2f}%;'
                      f'background:{_STAGE_COLOURS.get(s["stage"], "#999")}"></span>' for s in known)
        legend = " &middot; ".join(f'{html.escape(s["stage"])} {s["ms"]:.3f} ms' if s.get("ms") is not None
                                   else f'{html.escape(s["stage"])}: {html.escape(s["how"])}' for s in d["stages"])
        p = d.get("profile") or {}
        ops = ""
        if p.get("ops"):
            ov = p.get("overhead_vs_p50")
            ops = (f'<div class="meta">top ops ({html.escape(p["profiler"])}, {p["iterations"]} runs'
                   + (f", profiled runs {ov:+.0%} vs the p50" if ov is not None else "") + "): "
                   + ", ".join(f'{html.escape(o["op"])} {o["share"]:.0%}' for o in p["ops"][:6]) + "</div>")
        elif p:
            ops = f'<div class="meta">per-op profile: {html.escape(str(p.get("why")))}</div>'
        parts.append(f'<div class="decomp"><b>{html.escape(d["label"])}</b><div style="width:60%;white-space:nowrap">'
                     f'{bar}</div><div class="meta">{legend}</div>{ops}</div>')
    return "\n".join(parts)


def html_dependency_note() -> str | None:
    """Why the HTML page comes without plots on this install (None: it has them)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return "no plots: matplotlib is not installed (pip install 'edgeopt[report]')"
    return None


def _log_ms(ax) -> None:
    """A log latency axis with plain numbers (0.5, 1, 2 ms), not powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_xscale("log")
    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(fmt)
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def portable(arg: str) -> str:
    """A command-line word without the directories of an absolute path (``/home/me/x/m.onnx`` -> ``m.onnx``):
    a report names no path of the machine it was made on."""
    import re

    return re.sub(r"(?<![\w.~-])(?:[A-Za-z]:)?[/\\](?:[^/\\\s,=:]+[/\\])+(?=[^/\\\s,=:])", "", arg)


def _label(r: dict[str, Any], with_model: bool = True) -> str:
    """An artifact's label in a plot: target-precision, its batch when above 1, device, and a mark when
    it was not measured on its device (the label then says where)."""
    batch = r.get("batch") or 1
    truth = r.get("device_truth") or "device"
    return (f"{r['target']}-{r['precision']}" + (f" batch {batch}" if batch > 1 else "") + f" @ {r['device']}"
            + ("" if truth == "device" else f" ({TRUTH_TEXT.get(truth, truth).lower()})")
            + (f"\n{r['model']}" if with_model else ""))


GREY = "#8c959f"


def _true(r: dict[str, Any]) -> bool:
    return (r.get("device_truth") or "device") == "device"


def _unoverlap(fig, anns: list) -> None:
    """Move each label down (in steps of a line) until it overlaps no label placed before it: labels of
    points on one level (every artifact at 100% agreement) are stacked, never drawn over each other."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    step = 11 * fig.dpi / 72  # one line of 8-point text, in pixels
    placed = []
    for a in anns:
        dx, dy = a.xyann
        bb = a.get_window_extent(renderer).padded(1)
        k = 0
        while k < 60 and any(bb.translated(0, -k * step).overlaps(p) for p in placed):
            k += 1
        a.xyann = (dx, dy - 11 * k)
        placed.append(bb.translated(0, -k * step))


# Plot colours by verdict: the pick, the others the policy accepts, refused/failed; rows not measured on their
# own device are drawn hollow grey whatever their verdict.
VERDICT_COLOURS = {"ship": "#1a7f37", "other": "#2f81f7", "refused": "#cf222e"}
VERDICT_LEGEND = "green: SHIP, blue: accepted but not picked, red: refused or failed"


def verdict_of(r: dict[str, Any]) -> str:
    """``ship`` | ``other`` | ``refused`` | ``untrue`` (not measured on its device): a row's colour."""
    if not _true(r):
        return "untrue"
    if r.get("ship"):
        return "ship"
    return "other" if r.get("status") == "ok" and accepted(r) else "refused"


def median_ci(samples: list[float] | None, level: float = 0.99) -> tuple[float, float] | None:
    """The median latency's ``level`` interval: a seeded bootstrap over the run's contiguous blocks (the unit
    the verdict resamples, ``decide.blocks_of``); None with too few samples."""
    import numpy as np

    blocks = decide.blocks_of(samples)
    if not blocks:
        return None
    meds = np.asarray([float(np.median(b)) for b in blocks])
    boot = np.median(meds[np.random.default_rng(0).integers(0, len(meds), (2000, len(meds)))], axis=1)
    a = (1 - level) / 2 * 100
    return float(np.percentile(boot, a)), float(np.percentile(boot, 100 - a))


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
            lab = ("★ SHIP  " if r.get("ship") else "") + _label(r, many)
            if len(samples) >= 5:
                stats.append(("samples", lab, samples))
            else:  # no samples kept: draw the box from the percentiles
                stats.append(("pct", lab, r))
            colours.append(VERDICT_COLOURS.get(verdict_of(r)))
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
            if col is None:  # not measured on its device: hollow and grey
                patch.set_facecolor("none")
                patch.set_edgecolor(GREY)
                patch.set_hatch("//")
                patch.set_linestyle("--")
            else:
                patch.set_facecolor(col)
                patch.set_alpha(0.55)
        for i, (kind, _, v) in enumerate(stats, start=1):
            if kind == "samples":  # the samples themselves, jittered, over the box
                import numpy as np

                a = np.asarray(v, dtype=float)[:2000]
                jitter = np.random.default_rng(i).uniform(-0.18, 0.18, a.size)
                ax.scatter(a, i + jitter, s=3, alpha=0.25, color="#1b1f24" if colours[i - 1] else GREY,
                           linewidths=0)
                ci = median_ci(v)
                if ci:  # the median's 99% interval: a thick bar across the box's middle
                    ax.plot(ci, [i, i], color="#1b1f24", lw=4, solid_capstyle="butt", zorder=4)
            if ok[i - 1].get("ship"):
                parts["boxes"][i - 1].set_linewidth(2.5)
        for tick, r in zip(ax.get_yticklabels(), ok):
            if r.get("ship"):
                tick.set_color(VERDICT_COLOURS["ship"])
                tick.set_fontweight("bold")
        _log_ms(ax)
        curve = any((r.get("batch") or 1) > 1 for r in ok)
        ax.set_xlabel(("latency per call (ms, log scale; a call is one batch of B inputs)" if curve else
                       "latency per inference (ms, log scale)")
                      + ", box = quartiles, whiskers = p1..p99, black bar = the median's 99% interval")
        ax.set_title("Latency per artifact (" + VERDICT_LEGEND
                     + ("" if all(map(_true, ok)) else "; hollow grey: not measured on its device") + ")",
                     fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        ax.invert_yaxis()
        out.append(("Latency distribution per artifact and device", png(fig)))

        fig, ax = plt.subplots(figsize=(8, 4.6))
        lo, hi = min(r["p50_ms"] for r in ok), max(r["p50_ms"] for r in ok)
        anns = []
        ys = []
        for r in sorted(ok, key=lambda r: r["p50_ms"]):
            y = r["top1"] if r["top1"] is not None else r["cosine_min"]
            if y is None:
                continue
            ys.append(y)
            col = "#2f81f7" if accepted(r) else "#cf222e"  # the accuracy policy's word (edgeopt.policy)
            rec = by_key.get((r["model"], r["target"], r["precision"], r["device"], r["time"])) or {}
            ci = median_ci((rec.get("bench") or {}).get("samples_ms"))
            a = r.get("agreement_ci") or {}
            yerr = ([[max(0.0, y - a["ci_low"])], [max(0.0, a["ci_high"] - y)]]
                    if r["top1"] is not None and a.get("metric") == "top-1" else None)
            bar = {"fmt": "none", "ecolor": col if _true(r) else GREY, "elinewidth": 1.2, "capsize": 3, "zorder": 2}
            if ci:  # the median's 99% interval across: drawn as the interval itself, for the pooled median can
                # lie just outside a bootstrap over block medians (a 21-us p50 one microsecond above it did)
                ax.errorbar([(ci[0] + ci[1]) / 2], [y], xerr=[[(ci[1] - ci[0]) / 2]] * 2, **bar)
            if yerr:  # agreement's 95% Wilson interval up and down
                ax.errorbar([r["p50_ms"]], [y], yerr=yerr, **bar)
            if yerr:
                ys.append(y - yerr[0][0])  # the axis holds the interval's low end too
            if _true(r) and r.get("ship"):
                ax.scatter([r["p50_ms"]], [y], s=220, marker="*", color=VERDICT_COLOURS["ship"],
                           edgecolors="#1b1f24", zorder=4, clip_on=False)
            elif _true(r):
                ax.scatter([r["p50_ms"]], [y], s=60, color=col, edgecolors="#1b1f24", zorder=3, clip_on=False)
            else:  # hollow grey: not evidence of the device's speed
                ax.scatter([r["p50_ms"]], [y], s=60, facecolors="none", edgecolors=GREY, linewidths=1.5,
                           linestyle="--", zorder=3, clip_on=False)
            right = math.log(r["p50_ms"]) > (math.log(lo) + math.log(hi)) / 2  # labels point inwards
            anns.append(ax.annotate(("★ SHIP " if r.get("ship") else "") + _label(r, False), (r["p50_ms"], y),
                                    fontsize=8, fontweight="bold" if r.get("ship") else "normal",
                                    color="#1b1f24" if _true(r) else GREY, xytext=(-6 if right else 6, -12),
                                    textcoords="offset points", ha="right" if right else "left",
                                    arrowprops={"arrowstyle": "-", "color": "#afb8c1", "lw": 0.6,
                                                "shrinkA": 0, "shrinkB": 4}))
        _log_ms(ax)
        ax.set_xlabel("median latency (ms, log scale)")
        use_top1 = any(r["top1"] is not None for r in ok)
        ax.set_ylabel("top-1 agreement with FP32 reference" if use_top1 else "cosine similarity to FP32 reference")
        ax.set_title("Latency vs accuracy (★: SHIP, blue: the accuracy policy accepts, red: refuses"
                     + ("" if all(map(_true, ok)) else "; hollow grey: not measured on its device")
                     + ";\nbars: the median's 99% interval, agreement's 95% interval)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.margins(x=0.25, y=0.15)
        if ys:  # agreement cannot pass 1.0: the axis does not either
            low = min(ys)
            ax.set_ylim(max(0.0, low - max(0.02, (1 - low) * 0.5)), 1.0)
        _unoverlap(fig, anns)
        out.append(("Latency vs accuracy against the FP32 reference", png(fig)))

        fig, ax = plt.subplots(figsize=(8, 0.45 * len(ok) + 1.4))
        labels = [_label(r, many).replace("\n", " · ") for r in ok]
        vals = [r["throughput_ips"] or 0 for r in ok]
        labels = [("★ SHIP  " if r.get("ship") else "") + lab for r, lab in zip(ok, labels)]
        xerr = [[0.0] * len(ok), [0.0] * len(ok)]
        for i, r in enumerate(ok):  # inferences/s at the median's 99% interval (batch B per call)
            rec = by_key.get((r["model"], r["target"], r["precision"], r["device"], r["time"])) or {}
            ci = median_ci((rec.get("bench") or {}).get("samples_ms"))
            if ci and vals[i] and r.get("p50_ms"):
                per = vals[i] * r["p50_ms"]  # inferences/s x ms at the median: the same scale at the bounds
                xerr[0][i], xerr[1][i] = max(0.0, vals[i] - per / ci[1]), max(0.0, per / ci[0] - vals[i])
        bars = ax.barh(labels, vals, color=[VERDICT_COLOURS.get(verdict_of(r), GREY) for r in ok],
                       xerr=xerr, error_kw={"ecolor": "#1b1f24", "capsize": 3, "lw": 1})
        for bar, r in zip(bars, ok):
            if not _true(r):  # hollow grey: not the device's throughput
                bar.set_facecolor("none")
                bar.set_edgecolor(GREY)
                bar.set_hatch("//")
                bar.set_linestyle("--")
        ax.invert_yaxis()
        ax.set_xlabel("inferences per second")
        for tick, r in zip(ax.get_yticklabels(), ok):
            if r.get("ship"):
                tick.set_color(VERDICT_COLOURS["ship"])
                tick.set_fontweight("bold")
        ax.set_title("Throughput (" + VERDICT_LEGEND + ("" if all(map(_true, ok)) else
                                                        "; hollow grey: not measured on its device")
                     + "; bars: from the median's 99% interval)", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
        out.append(("Throughput per artifact and device", png(fig)))
    return out
