"""The history of a model's measured runs and where it changed (``edgeopt history``).

Series: every benched (``status: ok``) or gated (``status: gate-*``) run of a model in the results DB,
grouped per model x target x device (precision too, when a model has several), oldest first; one
metric per series (p50 by default). A gate record contributes the candidate's figure of that metric.

Change points (the method; checked by tests/hil/test_history.py):

* **Binary segmentation with a rank (Pettitt / Mann-Whitney) test.** In a segment of n runs, every
  split k with at least ``min_size`` runs on each side is scored by the standardised Mann-Whitney
  statistic of left vs right, ``z_k = (U_k - k(n-k)/2) / sqrt(k(n-k)(n+1)/12)`` (from the prefix sums of
  the segment's average ranks, O(n)); the largest ``|z_k|`` says whether the segment changes at all.
* Its significance is a **permutation p-value of the maximum** over all splits (the same statistic
  recomputed on ``permutations`` shuffles of the segment, seeded, so the scan over splits is paid for
  — a plain Mann-Whitney p-value at the best split would be far too small).
* Where: the split minimising the summed absolute deviations from each side's median (the L1 cost of
  binary segmentation; the rank statistic's maximum leans toward the middle of the segment).
* A change point is kept when ``p <= alpha`` **and** the medians of the two sides differ by at least
  ``min_shift`` (relative): significance and a practical change, as the gate demands. Then both sides
  are searched again (binary segmentation), each test at the same ``alpha``.
* Ranks make it robust to the outliers a shared machine produces; it finds shifts in level (a model
  that got slower and stayed slower), not single slow runs. A change is reported at the index of the
  first run after it, with the medians before and after (up to the neighbouring change points).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgeopt.errors import UsageError

# metric name -> (key of edgeopt.reporting.row_of, unit, higher is better, the gate's metric name)
METRICS: dict[str, tuple[str, str, bool, str | None]] = {
    "p50": ("p50_ms", "ms", False, "p50"), "p90": ("p90_ms", "ms", False, "p90"),
    "p95": ("p95_ms", "ms", False, None), "p99": ("p99_ms", "ms", False, "p99"),
    "p99_9": ("p99_9_ms", "ms", False, None), "mean": ("mean_ms", "ms", False, None),
    "min": ("min_ms", "ms", False, None), "max": ("max_ms", "ms", False, None),
    "throughput": ("throughput_ips", "inf/s", True, "throughput"),
    "load": ("load_s", "s", False, None), "cold_start": ("first_inference_ms", "ms", False, "cold_start"),
    "memory": ("peak_rss_mb", "MB", False, "memory"),
}
FORMATS = ("table", "csv", "json", "html")
METHOD = ("binary segmentation: a Pettitt/Mann-Whitney rank statistic with a permutation p-value of its max over "
          "splits, located at the least-absolute-deviation split; kept when p <= alpha and the medians differ "
          "by >= min_shift")


@dataclass
class ChangePoint:
    index: int  # the first run after the change
    before: float  # median of the segment before (back to the previous change point)
    after: float  # median of the segment after (up to the next change point)
    change: float  # after / before - 1
    p_value: float
    worse: bool  # a regression for this metric (slower, or less throughput)
    time: str | None = None
    run_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass
class Series:
    model: str
    target: str | None
    precision: str | None
    device: str | None
    metric: str
    unit: str
    points: list[dict[str, Any]] = field(default_factory=list)  # {time, run_id, kind, status, value, device, rig}
    changes: list[ChangePoint] = field(default_factory=list)
    identity: str | None = None  # the machine fingerprint the series is of (None: runs from before identities)
    note: str | None = None  # e.g. "new identity since …": a re-imaged rig starts a new series

    @property
    def values(self) -> list[float]:
        return [p["value"] for p in self.points]

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "target": self.target, "precision": self.precision, "device": self.device,
                "identity": self.identity, "note": self.note, "metric": self.metric, "unit": self.unit,
                "points": self.points,
                "changes": [c.as_dict() for c in self.changes]}


# --- change points ----------------------------------------------------------------------------------


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (1-based; ties share their mean rank)."""
    order = np.argsort(x, kind="mergesort")
    s = x[order]
    ranks = np.empty(len(x), dtype=float)
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _scan(ranks: np.ndarray, min_size: int) -> np.ndarray:
    """|z_k| for k = min_size .. n - min_size (rows of ``ranks`` scanned independently)."""
    n = ranks.shape[-1]
    k = np.arange(min_size, n - min_size + 1)
    csum = np.cumsum(ranks, axis=-1)[..., k - 1]
    u = csum - k * (k + 1) / 2
    sd = np.sqrt(k * (n - k) * (n + 1) / 12)
    return np.abs(u - k * (n - k) / 2) / sd


def best_split(x: np.ndarray, min_size: int, permutations: int, rng: np.random.Generator
               ) -> tuple[int, float] | None:
    """(split index within x, permutation p-value) of the strongest split, or None if x is too short."""
    n = len(x)
    if n < 2 * min_size or np.ptp(x) == 0:
        return None
    r = _ranks(x)
    zobs = float(_scan(r, min_size).max())
    shuffled = np.array([rng.permutation(r) for _ in range(permutations)])
    zmax = _scan(shuffled, min_size).max(axis=1)
    p = (1 + int(np.sum(zmax >= zobs - 1e-12))) / (permutations + 1)
    return locate(x, min_size), p


def locate(x: np.ndarray, min_size: int) -> int:
    """Where the level changes: the split minimising the absolute deviations from each side's median
    (the L1 cost of binary segmentation; the rank statistic's maximum leans toward the middle)."""
    costs = [np.abs(x[:k] - np.median(x[:k])).sum() + np.abs(x[k:] - np.median(x[k:])).sum()
             for k in range(min_size, len(x) - min_size + 1)]
    return min_size + int(np.argmin(costs))


def change_points(values: list[float] | np.ndarray, min_size: int = 5, min_shift: float = 0.05,
                  alpha: float = 0.01, permutations: int = 999, higher_is_better: bool = False,
                  seed: int = 20261122) -> list[ChangePoint]:
    """Change points of a series (see the module's doc for the method), sorted by index."""
    if min_size < 2:
        raise UsageError(f"--min-size must be at least 2, got {min_size}")
    if not 0 < alpha < 1:
        raise UsageError(f"--alpha must be between 0 and 1, got {alpha:g}")
    if min_shift < 0:
        raise UsageError(f"--min-shift must not be negative, got {min_shift:g}")
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    found: list[tuple[int, float]] = []
    todo = [(0, len(x))]
    while todo:
        a, b = todo.pop()
        hit = best_split(x[a:b], min_size, permutations, rng)
        if hit is None:
            continue
        k, p = hit
        left, right = np.median(x[a:a + k]), np.median(x[a + k:b])
        shift = abs(right / left - 1) if left else math.inf
        if p <= alpha and shift >= min_shift:
            found.append((a + k, p))
            todo += [(a, a + k), (a + k, b)]
    found.sort()
    bounds = [0] + [i for i, _ in found] + [len(x)]
    out = []
    for j, (i, p) in enumerate(found):
        before, after = float(np.median(x[bounds[j]:i])), float(np.median(x[i:bounds[j + 2]]))
        change = after / before - 1 if before else math.inf
        out.append(ChangePoint(i, before, after, change, p, worse=(change < 0) if higher_is_better else (change > 0)))
    return out


# --- series from the results DB ---------------------------------------------------------------------


def check_metric(metric: str) -> str:
    if metric in METRICS:
        return metric
    close = difflib.get_close_matches(metric, list(METRICS), n=1, cutoff=0.5)
    raise UsageError(f"unknown metric {metric!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                     + "; known: " + ", ".join(METRICS))


def _value(rec: dict[str, Any], metric: str) -> float | None:
    from edgeopt.reporting import row_of

    key, _, _, gate_name = METRICS[metric]
    status = str(rec.get("status") or "")
    if status.startswith("gate-"):
        if gate_name is None:
            return None
        v = next((v for v in (rec.get("gate") or {}).get("verdicts") or [] if v.get("metric") == gate_name), None)
        val = v.get("candidate") if v else None
    elif status == "ok":
        val = row_of(rec).get(key)
    else:
        return None
    return float(val) if isinstance(val, (int, float)) and not isinstance(val, bool) and math.isfinite(val) else None


def history(model: str, db: str | Path | None = None, target: str | None = None, device: str | None = None,
            precision: str | None = None, metric: str = "p50", since: str | None = None, min_size: int = 5,
            min_shift: float = 0.05, alpha: float = 0.01, permutations: int = 999, identity: str | None = None,
            label: str | None = None, rig: str | None = None, until: str | None = None) -> list[Series]:
    """The series of ``model``'s benched and gated runs per target x precision x machine, each with its
    change points. A machine is its identity (``results_schema.identity_of``: a renamed rig keeps its series,
    a re-imaged one starts a new one, noted); runs from before identities are per device name. ``target``
    accepts aliases; ``db`` (a file or ``postgresql://…``) must exist (one-line error otherwise);
    ``identity``/``label``/``rig``/``until`` filter as ``ResultsDB.query`` does."""
    from edgeopt.results import ResultsDB
    from edgeopt.results_url import exists, parse

    check_metric(metric)
    shown = parse(db).shown
    if not exists(db):
        raise UsageError(f"no results database at {shown!r} (run `edgeopt bench` or `edgeopt gate` first, "
                         "or pass --db)")
    from edgeopt.api import resolve_target_filter

    tfilter = resolve_target_filter(target)
    with ResultsDB(db, create=False) as rdb:
        records = rdb.query(model=model, target=tfilter, device=device, precision=precision, since=since,
                            identity=identity, label=label, rig=rig, until=until, annotate=True)
        models = rdb.models() if not records else []
    if not records:
        close = difflib.get_close_matches(model, models, n=1, cutoff=0.5)
        if model not in models:
            raise UsageError(f"no runs of model {model!r} in {shown!r}"
                             + (f" (did you mean {close[0]!r}?)" if close else
                                f"; its models: {', '.join(models[:8])}" if models else " (it is empty)"))
        raise UsageError(f"no runs of model {model!r} in {shown!r}"
                         + "".join(f" with {k} {v}" for k, v in (("target", tfilter), ("device", device),
                                                                    ("precision", precision), ("since", since),
                                                                    ("identity", identity), ("label", label),
                                                                    ("rig", rig), ("until", until)) if v))
    key, unit, higher, _ = METRICS[metric]
    groups: dict[tuple, Series] = {}
    for rec in records:
        v = _value(rec, metric)
        if v is None:
            continue
        b = rec.get("bundle") or {}
        dev = (rec.get("device") or {}).get("name")
        ident = (rec.get("identity") or {}).get("id") if isinstance(rec.get("identity"), dict) else None
        k = (b.get("model"), b.get("target"), b.get("precision"), ident or f"device:{dev}")
        s = groups.setdefault(k, Series(*k[:3], dev, metric=metric, unit=unit, identity=ident))
        if dev and dev not in str(s.device).split(", "):
            s.device = f"{s.device}, {dev}"  # a renamed rig: one machine, one series
        s.points.append({"time": rec.get("time"), "run_id": rec.get("run_id"),
                         "kind": "gate" if str(rec.get("status")).startswith("gate-") else "bench",
                         "status": rec.get("status"), "bundle_id": b.get("bundle_id"), "value": v,
                         "device": dev, "rig": rec.get("rig")})
    by_name: dict[tuple, list[Series]] = {}
    for s in groups.values():
        s.changes = change_points(s.values, min_size, min_shift, alpha, permutations, higher)
        for c in s.changes:
            c.time, c.run_id = s.points[c.index]["time"], s.points[c.index]["run_id"]
        by_name.setdefault((s.model, s.target, s.precision, s.points[0]["device"]), []).append(s)
    for same in by_name.values():  # one device name on several identities: re-imaged (a new driver, runtime)
        same.sort(key=lambda s: str(s.points[0]["time"]))
        for before, after in zip(same, same[1:]):
            after.note = (f"new identity {after.identity} since {after.points[0]['time']} (was {before.identity}): "
                          "a new series, not compared with the one before")
    if not groups:
        raise UsageError(f"no run of model {model!r} has a {metric} figure (failed runs, or a metric the gate "
                         "does not record)")
    return sorted(groups.values(), key=lambda s: tuple(str(x or "") for x in (s.target, s.precision, s.device,
                                                                           s.points[0]["time"])))


# --- output -----------------------------------------------------------------------------------------


def _title(s: Series) -> str:
    return (f"{s.model}  {s.target}-{s.precision}  on {s.device}" + (f" [{s.identity}]" if s.identity else "")
            + f"  ({s.metric}, {s.unit})" + (f"\n  note: {s.note}" if s.note else ""))


def _mark(s: Series, i: int) -> str:
    c = next((c for c in s.changes if c.index == i), None)
    if c is None:
        return ""
    return (f"<< change {c.change * 100:+.1f}% ({'worse' if c.worse else 'better'}; "
            f"{c.before:.4g} -> {c.after:.4g}, p={c.p_value:.3g})")


def render(series: list[Series], fmt: str = "table") -> str:
    from edgeopt import jsonsafe

    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    if fmt == "json":
        from edgeopt.api import envelope

        body = {"metric": series[0].metric if series else None, "method": METHOD,
                "series": [s.as_dict() for s in series]}
        return jsonsafe.dumps(envelope("history", body), indent=2, default=str) + "\n"
    if fmt == "csv":
        import csv
        import io

        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(["model", "target", "precision", "device", "metric", "unit", "index", "time", "run_id", "kind",
                    "status", "value", "change_point", "change", "p_value"])
        for s in series:
            for i, p in enumerate(s.points):
                c = next((c for c in s.changes if c.index == i), None)
                w.writerow([s.model, s.target, s.precision, s.device, s.metric, s.unit, i, p["time"], p["run_id"],
                            p["kind"], p["status"], f"{p['value']:.6g}", int(c is not None),
                            "" if c is None else f"{c.change:.4f}", "" if c is None else f"{c.p_value:.4g}"])
        return buf.getvalue()
    if fmt == "html":
        return _html(series)
    lines = []
    for s in series:
        lines.append(_title(s))
        lines.append(f"  {'#':>3}  {'measured (UTC)':<27} {'kind':<5} {'status':<17} {'value':>10}")
        for i, p in enumerate(s.points):
            lines.append(f"  {i:>3}  {str(p['time']):<27} {p['kind']:<5} {str(p['status']):<17} "
                         f"{p['value']:>10.4g}  {_mark(s, i)}".rstrip())
        n = len(s.changes)
        lines.append(f"  {n} change point{'s' if n != 1 else ''}" + ("" if n else " (no shift in level found)"))
        lines.append("")
    lines.append(f"change points: {METHOD}")
    return "\n".join(lines) + "\n"


def _svg(s: Series, w: int = 640, h: int = 140) -> str:
    v = s.values
    lo, hi = min(v), max(v)
    span = (hi - lo) or 1.0
    xs = [10 + (w - 20) * (i / max(1, len(v) - 1)) for i in range(len(v))]
    ys = [h - 10 - (h - 20) * (x - lo) / span for x in v]
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys))
    marks = "".join(f'<line x1="{(xs[c.index] + xs[c.index - 1]) / 2:.1f}" y1="0" '
                    f'x2="{(xs[c.index] + xs[c.index - 1]) / 2:.1f}" y2="{h}" stroke="#c00" stroke-dasharray="4"/>'
                    for c in s.changes)
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5"/>' for x, y in zip(xs, ys))
    return (f'<svg width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg">{marks}'
            f'<polyline fill="none" stroke="#246" points="{pts}"/>{dots}</svg>')


def _html(series: list[Series]) -> str:
    import html

    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>edgeopt history</title><style>"
             "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{padding:2px 8px;"
             "border-bottom:1px solid #ddd;text-align:left}tr.cp td{background:#fee;font-weight:bold}</style>"
             "</head><body><h1>edgeopt history</h1>", f"<p>Change points: {html.escape(METHOD)}.</p>"]
    for s in series:
        parts.append(f"<h2>{html.escape(_title(s))}</h2>{_svg(s)}")
        parts.append("<table><tr><th>#</th><th>measured (UTC)</th><th>kind</th><th>status</th><th>value</th>"
                     "<th>change</th></tr>")
        for i, p in enumerate(s.points):
            m = _mark(s, i)
            parts.append(f"<tr{' class=cp' if m else ''}><td>{i}</td><td>{html.escape(str(p['time']))}</td>"
                         f"<td>{p['kind']}</td><td>{html.escape(str(p['status']))}</td><td>{p['value']:.4g}</td>"
                         f"<td>{html.escape(m)}</td></tr>")
        parts.append("</table>")
    parts.append("</body></html>\n")
    return "".join(parts)
