"""The results DB holds only standard JSON, and ``edgeopt report`` survives rows it cannot read.

Issue 27 item 5: after a gate ended *inconclusive*, ``edgeopt report --json`` died with
``sqlite3.OperationalError: malformed JSON`` — a NaN (a ratio from one paired round) reached the DB.
Real parts: a real gate on ``local`` (the PP-OCR classifier and its slower variant), ``judge`` on that
gate's own blocks cut to one pair (what gives the non-finite figures), the DB writer, the CLI.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

from edgeopt.policy.gatefile import load_gate
from edgeopt.policy.stats import PairedRun, judge


def _strict(text: str):
    def refuse(tok):
        raise ValueError(f"non-standard JSON token {tok}")
    return json.loads(text, parse_constant=refuse)


def test_an_inconclusive_gate_with_non_finite_figures_and_a_bad_row_do_not_break_the_report(gate_bundles, tmp_path):
    from edgeopt.deploy import load_bundle
    from edgeopt.hil.gate import _record, run_gate
    from edgeopt.inventory import local_device
    from edgeopt.results import ResultsDB

    db = tmp_path / "r.db"
    spec = load_gate(None)
    res = run_gate(gate_bundles["slow"], gate_bundles["base"], [local_device(str(tmp_path / "root"))], spec,
                   budget_s=1.0, db_path=db)
    assert res["verdict"] == "inconclusive"
    dev = res["devices"][0]
    # the same gate judged from its first pair only: p50's ratio and interval are NaN, as one paired round gives
    one = PairedRun("local", dev["raw"]["blocks"][:2], arms=dev["raw"]["arms"], calls=1, min_calls=2)
    verdicts = [v.as_dict() for v in judge(one, spec)]
    p50 = next(v for v in verdicts if v["metric"] == "p50")
    assert p50["ratio"] != p50["ratio"] and p50["verdict"] == "inconclusive"  # NaN
    nan_gate = {**res, "gate_id": "nan0gate0000"}
    with ResultsDB(db) as rdb:
        rdb.add(_record(nan_gate, {**dev, "verdicts": verdicts, "verdict": "inconclusive"},
                        load_bundle(gate_bundles["slow"])))
    with sqlite3.connect(db) as conn:
        texts = [r[0] for r in conn.execute("SELECT json FROM runs")]
        assert texts and all("NaN" not in t and "Infinity" not in t for t in texts)
        assert all(conn.execute("SELECT json_valid(json) FROM runs").fetchall()[i][0] == 1 for i in range(len(texts)))
        # what an older edgeopt wrote (a bare NaN), and a damaged row
        old = json.loads(texts[-1])
        old["gate_id"] = "old0nan00000"
        old["gate"]["verdicts"][0]["ratio"] = float("nan")
        conn.execute("INSERT INTO runs (run_id, time, model, target, precision, device, status, json) "
                     "VALUES (?,?,?,?,?,?,?,?)", ("gate-old", old["time"], old["bundle"]["model"],
                                                  old["bundle"]["target"], old["bundle"]["precision"], "local",
                                                  "gate-inconclusive", json.dumps(old)))
        conn.execute("INSERT INTO runs (run_id, time, model, target, precision, device, status, json) "
                     "VALUES ('gate-cut', ?, ?, ?, ?, 'local', 'gate-inconclusive', '{\"run_id\": \"gate-cu')",
                     (old["time"], old["bundle"]["model"], old["bundle"]["target"], old["bundle"]["precision"]))
    r = subprocess.run([sys.executable, "-m", "edgeopt", "report", "--db", str(db), "--json", "--all"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    rep = _strict(r.stdout)
    assert sum("skipped row" in line for line in r.stderr.splitlines()) == 1, r.stderr
    gates = {g["gate_id"]: g for g in rep["gates"]}
    assert {res["gate_id"], "nan0gate0000", "old0nan00000"} <= set(gates)
    stored = next(v for v in gates["nan0gate0000"]["devices"][0]["verdicts"] if v["metric"] == "p50")
    assert stored["ratio"] is None and stored["ratio_null_reason"] == "not finite (nan)"
    assert next(v for v in gates["old0nan00000"]["devices"][0]["verdicts"])["ratio"] is None
    # the default view (the latest of each) is where SQLite's json_extract met the NaN and failed the query
    r = subprocess.run([sys.executable, "-m", "edgeopt", "report", "--db", str(db), "--json"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "malformed JSON" not in r.stderr, r.stderr[-2000:]
    assert _strict(r.stdout)["gates"]
