"""bench/bench_unseen.py's table marks each row that an earlier run measured with that run's own time and
machine (issue 26): it had marked every row read back from the committed table as "measured until
2026-11-23 08:36 on another machine (avx512)", whatever run had measured it, and a ``--render`` header named
the rendering machine and results.json's time for all rows."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("bench_unseen_under_test", ROOT / "bench" / "bench_unseen.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(model: str, when: str | None, where: str | None, secs: float = 1.5) -> dict:
    return {"model": model, "target": "cpu", "precision": "auto", "outcome": "built", "task": "", "kinds": "y=label",
            "check": "passed", "time_s": secs, "traceback": False, "measured": when, "machine": where}


def test_rows_of_earlier_runs_carry_their_own_run_and_machine(bench):
    here = "AMD EPYC, 2 cores (avx2), Linux x86_64, Python 3.11.7"
    there = "Intel Xeon, 4 cores (avx2, avx512f), Linux x86_64, Python 3.11.7"
    rows = [_row("a", "2026-11-25 02:00 UTC", here), _row("b", "2026-11-25 02:00 UTC", here),
            _row("c", "until 2026-11-23 20:35 UTC", here), _row("d", "2026-11-22 10:00 UTC", there),
            _row("e", None, None)]
    (when, where), marks = bench.provenance(rows)
    assert (when, where) == ("2026-11-25 02:00 UTC", here)  # the newest run: its rows are unmarked
    assert marks == {("until 2026-11-23 20:35 UTC", here): "*", ("2026-11-22 10:00 UTC", there): "†",
                     (None, None): "‡"}
    header = bench.header_text(rows)
    assert header.startswith(f"Measured 2026-11-25 02:00 UTC on {here}")
    assert f"`*`: measured until 2026-11-23 20:35 UTC on {here} (1 rows)" in header  # same machine: not "another"
    assert f"`†`: measured 2026-11-22 10:00 UTC on {there} (1 rows, another machine" in header
    assert "`‡`: measured at a time not recorded on a machine not recorded" in header
    text = bench.render(rows, header)
    secs = {line.split(" | ")[0].strip("| "): line.rsplit(" | ", 1)[1].strip(" |")
            for line in text.splitlines() if line.startswith("| ") and " | cpu | " in line}
    assert secs == {"a": "1.5", "b": "1.5", "c": "1.5*", "d": "1.5†", "e": "1.5‡"}
    # read back from the rendered section (a machine without results.json): the same provenance per row
    latest, marked = bench._doc_provenance(text)
    assert latest == (when, where)
    assert marked["*"] == ("until 2026-11-23 20:35 UTC", here) and marked["†"] == ("2026-11-22 10:00 UTC", there)
    assert marked["‡"] == (None, None)


def test_the_older_header_format_is_read_back(bench):
    old = ("Measured until 2026-11-23 20:35 UTC on AMD EPYC, 2 cores (avx2), Linux x86_64, Python 3.11.7 (shared "
           "machine: other jobs ran). Rows marked `*` in the s column were read back from the committed table "
           "(measured until 2026-11-23 08:36 UTC on AMD EPYC, 2 cores with avx512f/avx512_vnni, another machine "
           "than the rest); the others were measured here.\n\n| model | target |")
    latest, marked = bench._doc_provenance(old)
    assert latest == ("until 2026-11-23 20:35 UTC", "AMD EPYC, 2 cores (avx2), Linux x86_64, Python 3.11.7")
    assert marked == {"*": ("until 2026-11-23 08:36 UTC", "AMD EPYC, 2 cores with avx512f/avx512_vnni")}
