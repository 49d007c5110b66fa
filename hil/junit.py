"""Gate results as JUnit XML (Jenkins, GitLab, GitHub read it) and as Markdown for a PR comment.

One test case per model × target × device × metric: *failure* = regressed, *skipped* = inconclusive,
*error* = the device or rig failed; the figures, interval, p-value, n and the device fingerprint are
properties.  Files are written to a temporary name and renamed: an interrupted gate leaves no
half-written report that a later step could mistake for a finished one.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from edgeopt.jsonsafe import clean, dumps


def _atomic_write(path: Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def junit_xml(result: dict[str, Any]) -> str:
    result = clean(result)  # no "nan" property values: a non-finite figure is left out (its reason is in raw)
    suites = ET.Element("testsuites", name="edgeopt gate")
    for dev in result["devices"]:
        suite = ET.SubElement(suites, "testsuite", name=f"{result['model']}.{result['target']}.{dev['device']}")
        cases = dev.get("verdicts") or []
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        if dev.get("error"):
            case = ET.SubElement(suite, "testcase", classname=suite.get("name"), name="device")
            ET.SubElement(case, "error", message=dev["error"], type=dev.get("status", "device"))
            counts["tests"] += 1
            counts["errors"] += 1
        elif dev.get("status") == "quarantined":
            case = ET.SubElement(suite, "testcase", classname=suite.get("name"), name="device")
            ET.SubElement(case, "skipped", message=dev.get("skipped") or "quarantined", type="quarantined")
            counts["tests"] += 1
            counts["skipped"] += 1
        for v in cases:
            case = ET.SubElement(suite, "testcase", classname=suite.get("name"), name=v["metric"],
                                 time=f"{dev.get('elapsed_s', 0) / max(1, len(cases)):.3f}")
            props = ET.SubElement(case, "properties")
            for key in ("verdict", "ratio", "ci_low", "ci_high", "p_value", "n", "baseline", "candidate",
                        "threshold", "method"):
                if v.get(key) is not None:
                    ET.SubElement(props, "property", name=key, value=str(v[key]))
            ET.SubElement(props, "property", name="fingerprint", value=dumps(dev.get("fingerprint") or {}))
            ET.SubElement(props, "property", name="mode", value=dev.get("mode") or result.get("mode") or "paired")
            if dev.get("health"):
                ET.SubElement(props, "property", name="health", value=dumps(dev["health"]))
            if dev.get("attempts", 1) > 1:
                ET.SubElement(props, "property", name="attempts", value=str(dev["attempts"]))
            if result.get("data_note"):
                ET.SubElement(props, "property", name="data", value=result["data_note"])
            notes = [*([result["data_note"]] if result.get("data_note") else []), *(dev.get("warnings") or [])]
            if dev.get("warnings"):
                ET.SubElement(props, "property", name="warnings", value=" | ".join(dev["warnings"]))
            if notes:
                ET.SubElement(case, "system-out").text = "\n".join(f"WARNING: {w}" for w in notes)
            counts["tests"] += 1
            if v["verdict"] == "regressed":
                ET.SubElement(case, "failure", message=v.get("reason", ""), type="regressed")
                counts["failures"] += 1
            elif v["verdict"] == "inconclusive":
                reason = v.get("reason", "")
                ET.SubElement(case, "skipped", message=("latency " + reason) if reason.startswith("not judged")
                              else "inconclusive: " + reason)
                counts["skipped"] += 1
        for k, n in counts.items():
            suite.set(k, str(n))
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


ICON = {"pass": "✅ pass", "improved": "🟢 improved", "regressed": "❌ regressed", "inconclusive": "⚠️ inconclusive"}


def verdict_text(v: dict[str, Any]) -> str:
    """The verdict as shown: an inconclusive that was never judged says why (an emulated CPU's latency,
    another vendor's CPU)."""
    reason = v.get("reason") or ""
    if v.get("verdict") == "inconclusive" and reason.startswith("not judged"):
        return ("⚠️ not judged (emulated CPU)" if "emulated" in reason else
                "⚠️ not judged (another vendor's CPU)" if "another vendor's CPU" in reason else "⚠️ not judged")
    return ICON.get(v["verdict"], v["verdict"])


def not_judged_line(dev: dict[str, Any]) -> str:
    """``latency not judged: WHY`` when the device's latency metrics were not judged (emulated, another
    vendor's CPU), else ''."""
    for v in dev.get("verdicts") or []:
        reason = v.get("reason") or ""
        if v.get("metric") in ("p50", "p90", "p99", "throughput") and reason.startswith("not judged: "):
            return "latency " + reason.split(" (the rounds said")[0]
    return ""


def verdict_cells(v: dict[str, Any]) -> dict[str, str]:
    """One verdict as display text: baseline, candidate, change (95% CI), p, n (the Markdown summary's and
    the HTML report's cells); a non-finite figure shows as blank."""
    v = clean(v)
    ch = ""
    if v.get("ratio") is not None and v["metric"] not in ("accuracy", "decisions"):
        r, lo, hi = v["ratio"], v.get("ci_low"), v.get("ci_high")
        if v["metric"] == "throughput":  # stored as a latency ratio; shown as the throughput change
            r, lo, hi = 1 / r, (1 / hi if hi else None), (1 / lo if lo else None)
        ch = f"{(r - 1) * 100:+.1f}%"
        if lo is not None and hi is not None:
            ch += f" ({(lo - 1) * 100:+.1f}..{(hi - 1) * 100:+.1f}%)"
    elif v.get("ratio") is not None and v["metric"] == "decisions":  # a share, as a percentage
        ch = f"{v['ratio'] * 100:.1f}% differ"
    elif v.get("ratio") is not None:
        ch = f"{v['ratio'] * 100:.1f}%"

    def fmt(x: Any) -> str:
        return "" if x is None else f"{x:.4g}"

    return {"baseline": fmt(v.get("baseline")), "candidate": fmt(v.get("candidate")), "change": ch,
            "p": "" if v.get("p_value") is None else f"{v['p_value']:.3g}", "n": str(v.get("n", ""))}


def markdown(result: dict[str, Any]) -> str:
    result = clean(result)
    lines = [f"### edgeopt gate: {result['model']} on {result['target']} — **{result['verdict']}**", "",
             f"baseline `{result['baseline_id'][:40 if result.get('mode') == 'unpaired' else 12]}` vs candidate "
             f"`{result['candidate_id'][:12]}`" + (" — **unpaired** (stored rounds, widened 99% intervals)"
                                                  if result.get("mode") == "unpaired" else ""), "",
             "| device | metric | verdict | baseline | candidate | change (95% CI) | p | n |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for dev in result["devices"]:
        if dev.get("error"):
            lines.append(f"| {dev['device']} | — | 💥 {dev.get('status', 'error')} | | | {dev['error'][:80]} | | |")
        elif dev.get("status") == "quarantined":
            lines.append(f"| {dev['device']} | — | ⏸️ skipped (quarantined) | | | {dev.get('skipped', '')[:80]} | | |")
        for v in dev.get("verdicts") or []:
            c = verdict_cells(v)
            lines.append(f"| {dev['device']} | {v['metric']} | {verdict_text(v)} | "
                         f"{c['baseline']} | {c['candidate']} | {c['change']} | {c['p']} | {c['n']} |")
    warn = [f"- ⚠️ **{result['data_note']}**"] if result.get("data_note") else []
    warn += [f"- ⚠️ {d['device']}: {not_judged_line(d)}" for d in result["devices"] if not_judged_line(d)]
    warn += [f"- ⚠️ {d['device']}: {w}" for d in result["devices"] for w in d.get("warnings") or []]
    warn += [f"- ⏱️ {d['device']}: {d['budget_note']}" for d in result["devices"] if d.get("budget_note")]
    warn += [f"- ⏱️ {d['device']}: {d['noise_note']}" for d in result["devices"] if d.get("noise_note")]
    if warn:
        lines += ["", *warn]
    lines += ["", "Latency and cold start in ms, memory in MB (throughput in inferences/s). Verdicts: regressed = significant (Holm-corrected) "
              "and beyond the allowed change; pass = the 95% interval stays within it; inconclusive = "
              "neither, within the budget."]
    return "\n".join(lines) + "\n"


def write_outputs(result: dict[str, Any], junit: str | None, md: str | None, raw: str | None) -> None:
    if junit:
        _atomic_write(Path(junit), junit_xml(result))
    if md:
        _atomic_write(Path(md), markdown(result))
    if raw:
        _atomic_write(Path(raw), dumps(result, indent=1, default=str))
