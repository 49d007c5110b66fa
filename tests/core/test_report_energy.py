"""Energy in the report and the typed record (issue 27 with issue 31 item 5): the agent's bench reply
carries ``energy`` (joules per inference, mean power, the source and its resolution) or
``{"source": None, "why_not": ...}``; the report shows a J/inf column (mean W and the source in the
cell's title and the notes), "—" with the reason where energy could not be read.

Real parts: a tiny CNN built for cpu and benched by the agent on the local device (its reply as it came);
the measured case is that real reply with a measured-looking ``energy`` put in (a fixture of the format:
no machine here exposes a power counter)."""

from __future__ import annotations

import copy
import csv
import io
import json
import re

import pytest

import edgeopt
from edgeopt.reporting import render
from edgeopt.results import Energy, record_from_dict
from tests.conftest import tiny_cnn

MEASURED = {"source": "rapl", "resolution": "RAPL counter in µJ (energy_uj), hardware updates about every 1 ms",
            "scope": "CPU package", "joules_per_inference": 0.00123, "mean_power_w": 7.9, "samples": 2,
            "rails": {"package-0": {"energy_j": 1.23, "mean_power_w": 7.9}}, "energy_j": 1.23, "window_s": 0.156,
            "inferences": 1000,
            "others": [{"source": "nvml", "joules_per_inference": 0.004, "mean_power_w": 25.0, "samples": 2}]}
ABSENT = {"source": None, "why_not": "not available on this device (rapl: no RAPL: /sys/class/powercap absent)"}


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("energy")
    edgeopt.build(tiny_cnn(tmp / "tiny.onnx"), "cpu", precision="fp32", dist=tmp / "dist", calib_count=4,
                  val_count=4)
    fleet = edgeopt.bench(dist=tmp / "dist", devices="local", duration=0.2, min_iters=5, warmup="0.05s",
                          db=str(tmp / "r.db"))
    return fleet.records[0].to_dict()


def _with(rec: dict, precision: str, energy: dict | None) -> dict:
    out = copy.deepcopy(rec)
    out["bundle"]["precision"] = precision  # two rows of one model on one device
    out["bench"].pop("energy", None)
    if energy is not None:
        out["bench"]["energy"] = copy.deepcopy(energy)
    return out


def test_the_real_reply_is_shown_as_it_says(real):
    """Whatever this machine's agent said about energy (a source read, why not, or nothing: an agent
    without energy support) is what the report and the typed record show."""
    e = real["bench"].get("energy")
    typed = record_from_dict(real).energy
    doc = json.loads(render([real], "json"))
    row = doc["rows"][0]
    table = render([real], "table")
    if e is None:
        assert typed is None and "J/inf" not in table and row["energy_source"] is None
    elif e.get("source") is None:
        assert typed.measured is False and typed.why_not == e["why_not"]
        assert row["energy_j"] is None and row["energy_why_not"] == e["why_not"]
        assert "J/inf" in table and re.search(r"\s—\s", table)
        assert f"J/inf — on local: {e['why_not']}" in doc["notes"]
    else:
        assert typed.measured and row["energy_j"] == pytest.approx(e["joules_per_inference"])
        assert row["energy_source"] == e["source"] and any(n.startswith("energy: cpu-fp32 @ local") for n in doc["notes"])


def test_a_measured_reply_and_one_without_a_source(real):
    recs = [_with(real, "fp32", ABSENT), _with(real, "int8", MEASURED)]
    rec = record_from_dict(recs[1])
    assert isinstance(rec.energy, Energy) and rec.energy.measured
    assert (rec.energy.source, rec.energy.joules_per_inference, rec.energy.mean_power_w, rec.energy.samples) == (
        "rapl", 0.00123, 7.9, 2)
    assert rec.energy.rails["package-0"]["mean_power_w"] == 7.9 and rec.energy.others[0].source == "nvml"
    none = record_from_dict(recs[0]).energy
    assert not none.measured and none.why_not == ABSENT["why_not"] and none.joules_per_inference is None
    assert record_from_dict(recs[1]).to_dict() == recs[1]

    table = render(recs, "table")
    head, *lines = table.splitlines()
    col = head.index("J/inf")
    by_prec = {ln.split()[2]: ln for ln in lines[1:3]}
    assert by_prec["int8"][col:].split()[0] == "0.00123" and by_prec["fp32"][col:].split()[0] == "—"
    assert "energy: cpu-int8 @ local: 0.00123 J/inf, 7.9 W mean, source rapl, resolution RAPL counter" in table
    assert f"J/inf — on local: {ABSENT['why_not']}" in table

    doc = json.loads(render(recs, "json"))
    rows = {r["precision"]: r for r in doc["rows"]}
    assert (rows["int8"]["energy_j"], rows["int8"]["energy_w"], rows["int8"]["energy_source"]) == (0.00123, 7.9, "rapl")
    assert rows["fp32"]["energy_j"] is None and rows["fp32"]["energy_why_not"] == ABSENT["why_not"]
    assert [r["energy_j"] for r in csv.DictReader(io.StringIO(render(recs, "csv")))] == ["", "0.00123"]

    page = render(recs, "html")
    assert "<th>J/inf</th>" in page
    assert re.search(r'<td class="num" title="7.9 W mean, source rapl, resolution RAPL counter[^"]*">0.00123</td>', page)
    assert re.search(r'<td class="num" title="energy: not available on this device[^"]*">—</td>', page)
    md = render(recs, "md")
    assert "| J/inf |" in md and "0.00123" in md


def test_no_energy_column_when_no_agent_reported_energy(real):
    table = render([_with(real, "fp32", None)], "table")
    assert "J/inf" not in table and "energy" not in table
