"""`edgeopt history`: the change-point method on synthetic series, and end to end on a results DB filled
by real short benches of a real model and of its really slower variant."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeopt.hil.history import change_points


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", "history", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def _noisy(n: int, sd: float, seed: int) -> np.ndarray:
    return 10.0 * (1 + sd * np.random.default_rng(seed).standard_normal(n))


def test_a_ten_percent_step_is_found_at_its_index():
    """A 10% step at run 25 of 40 among 2% noise (100 seeded series): one change point each time, at 25
    (the noise can blur where a step lies by one run, rarely)."""
    found = []
    for seed in range(100):
        x = _noisy(40, 0.02, seed)
        x[25:] *= 1.10
        cps = change_points(x)
        assert len(cps) == 1, (seed, cps)
        assert 0.07 < cps[0].change < 0.13 and cps[0].worse and cps[0].p_value <= 0.01
        found.append(cps[0].index)
    assert all(abs(i - 25) <= 1 for i in found) and found.count(25) >= 97, found


def test_a_flat_noisy_series_has_none():
    """200 flat series with 4% noise and one run 80% slower somewhere (a single slow run is not a change
    in level): change points in at most 2% of them (the test's level is 1%)."""
    flagged = []
    for seed in range(200):
        rng = np.random.default_rng(1000 + seed)
        x = 10.0 * (1 + 0.04 * rng.standard_normal(40))
        x[rng.integers(0, 40)] *= 1.8
        flagged += [seed] if change_points(x) else []
    assert len(flagged) <= 4, flagged
    assert change_points(_noisy(40, 0.04, 1)) == [] and change_points(np.full(30, 5.0)) == []


def test_two_steps_and_the_direction_of_throughput():
    x = _noisy(60, 0.02, 7)
    x[20:] *= 1.15
    x[40:] /= 1.15 * 1.10  # back down, and 10% below the start
    cps = change_points(x)
    assert [c.index for c in cps] == [20, 40]
    assert [c.worse for c in cps] == [True, False]
    # the same figures as a throughput: higher is better, so going up is an improvement
    assert [c.worse for c in change_points(x, higher_is_better=True)] == [False, True]


def test_min_shift_and_min_size():
    x = _noisy(40, 0.002, 3)
    x[20:] *= 1.02  # significant, but only 2%
    assert change_points(x, min_shift=0.05) == []
    assert [c.index for c in change_points(x, min_shift=0.01)] == [20]
    y = _noisy(40, 0.02, 4)
    y[35:] *= 1.3  # 5 runs after the step: enough for --min-size 5; 6 cannot place it there
    assert all(6 <= c.index <= 34 for c in change_points(y, min_size=6))
    assert [c.index for c in change_points(y, min_size=5)] == [35]


def test_bad_input_one_line_exit_2(tmp_path):
    p = _cli("m", "--metric", "througput", "--db", str(tmp_path / "x.db"))
    assert p.returncode == 2 and "did you mean 'throughput'" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = _cli("m", "--db", str(tmp_path / "missing.db"))
    assert p.returncode == 2 and "no results database" in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    p = _cli("m", "--db", str(tmp_path / "missing.db"), "--min-shift", "5 %")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "missing.db").exists()


@pytest.fixture(scope="module")
def bench_db(tmp_path_factory) -> tuple[Path, str]:
    """8 real 0.3-s benches of the PP-OCR classifier, then 8 of the same model with an extra branch
    (a real build of the same model name, ~3x slower) on the local device, one runtime thread. This box
    is shared: the load can move the level by 1.6x between two runs (seen in CI), which is a real change
    of level the method may also report; the model's own step must stand out of it."""
    from edgeopt import api
    from tests.conftest import fixture
    from tests.hil.conftest import _build
    from tests.hil.models import slower

    d = tmp_path_factory.mktemp("history")
    src = Path(fixture("ocr-cls"))
    base = _build(src, d / "dist-base")
    slow = _build(slower(src, d / "slow" / src.name, channels=32, convs=2), d / "dist-slow")
    rig = d / "rig.yaml"
    rig.write_text(f"devices:\n  box:\n    transport: local\n    root: {d / 'root'}\n    target: cpu\n")
    db = d / "runs.db"
    for bundle in [base] * 8 + [slow] * 8:
        res = api.bench(bundle, devices=str(rig), db=str(db), duration=0.3, min_iters=5, warmup=2, threads=1)
        assert res.ok, res.as_dict()
    # a gated run joins the series (the budget bounds the whole gate: room for its rounds under load)
    gated = api.gate(slow, slow, devices=str(rig), budget="12s", db=str(db), raise_on_failure=False)
    assert gated["verdict"] in ("pass", "inconclusive"), gated["verdict"]
    model = res.records[0].bundle.model
    return db, model


def test_history_end_to_end_on_real_benches(bench_db):
    db, model = bench_db
    p = _cli(model, "--db", str(db), "--target", "ort", "--min-size", "4", "--json")  # ort: an alias of cpu
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["schema"] == "edgeopt/v1" and out["kind"] == "history"
    (s,) = out["series"]
    assert (s["target"], s["device"], s["metric"]) == ("cpu", "box", "p50") and len(s["points"]) == 17
    assert [p["kind"] for p in s["points"]] == ["bench"] * 16 + ["gate"]
    # the gate's candidate p50, in ms like the benches (a unit slip would be 1000x; load moved it 3.9x once)
    assert 0.1 < s["points"][-1]["value"] / s["points"][-2]["value"] < 10
    values = [round(p["value"], 3) for p in s["points"]]
    at8 = [c for c in s["changes"] if c["index"] == 8]
    assert len(at8) == 1, (values, s["changes"])  # the figures, should this fail on a loaded box
    assert at8[0]["worse"] and at8[0]["change"] > 0.5, (values, s["changes"])
    assert "changed" in p.stderr and "at run 8" in p.stderr

    table = _cli(model, "--db", str(db), "--min-size", "4")
    assert table.returncode == 0 and "<< change +" in table.stdout and "Mann-Whitney" in table.stdout
    rows = list(csv.DictReader(io.StringIO(_cli(model, "--db", str(db), "--min-size", "4", "-f", "csv", "-q").stdout)))
    assert len(rows) == 17 and rows[8]["change_point"] == "1"
    assert sum(r["change_point"] == "1" for r in rows) == len(s["changes"])
    html = _cli(model, "--db", str(db), "--min-size", "4", "-f", "html", "-q").stdout
    assert html.startswith("<!doctype html>") and "<svg" in html and "class=cp" in html
    # a device filter that matches nothing, and an unknown target: one line, exit 2
    p = _cli(model, "--db", str(db), "--device", "nope")
    assert p.returncode == 2 and "no runs of model" in p.stderr
    p = _cli(model[:-2], "--db", str(db))
    assert p.returncode == 2 and f"did you mean {model!r}" in p.stderr, p.stderr
    p = _cli(model, "--db", str(db), "--target", "jetsn")
    assert p.returncode == 2 and "Traceback" not in p.stderr
