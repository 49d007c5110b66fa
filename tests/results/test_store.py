"""The results database on both engines (SQLite file, real PostgreSQL server): one schema, its version and
migrations, records inserted once, machine identity on every record, filters across rigs, history per
identity, a gate baseline from the shared history."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys

import pytest

from edgeopt.errors import UsageError
from edgeopt.results import ResultsDB
from edgeopt.results_schema import COLUMNS, SCHEMA_VERSION, V2_COLUMNS, record_key
from tests.results.conftest import record


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "edgeopt", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_each_record_once_and_read_back_whole(db_url):
    with ResultsDB(db_url) as db:
        assert db.schema_version == SCHEMA_VERSION
        recs = [record(i) for i in range(5)]
        ids = [db.add(r) for r in recs]
        again = [db.add(json.loads(json.dumps(r))) for r in recs]  # a retry (after a lost acknowledgement)
        assert ids == again and db.count() == 5 and db.duplicates == 5
        other = record(0, p50=9.0)  # the same run, device and bundle, another measurement: kept, not dropped
        assert record_key(other) == record_key(recs[0]) and db.add(other) not in ids and db.count() == 6
        got = db.query(annotate=True)
        assert db.query()[0] == json.loads(json.dumps(recs[0]))  # the record as written, nothing added
        assert len(got) == 6 and got[0]["bench"]["samples_ms"] == recs[0]["bench"]["samples_ms"]  # samples kept
        ident = got[0]["identity"]
        assert len(ident["id"]) == 12 and ident["facts"]["cpu"] == "Intel Xeon" and ident["facts"]["cores"] == 8
        assert got[0]["rig"]  # the writing rig (EDGEOPT_RIG or the host name)


def test_identity_rename_and_reimage(db_url):
    """A renamed rig keeps its identity; a new driver makes a new one; the name never enters it."""
    with ResultsDB(db_url) as db:
        a = record(0, device="rig-a", driver="535.1")
        renamed = record(1, device="rig-a-renamed", driver="535.1")
        reimaged = record(2, device="rig-a", driver="550.2")
        for r in (a, renamed, reimaged):
            db.add(r)
        ia, ir, ii = (r["identity"]["id"] for r in db.query(annotate=True))
        assert ia == ir != ii
        assert [r["device"]["name"] for r in db.query(identity=ia[:6])] == ["rig-a", "rig-a-renamed"]
        assert db.count(identity=ii) == 1


def test_filters_across_rigs(db_url, monkeypatch):
    with ResultsDB(db_url) as db:
        monkeypatch.setenv("EDGEOPT_RIG", "x86-rig")
        for i in range(4):
            db.add(record(i, device="xeon-1", labels=("x86", "lab")))
        monkeypatch.setenv("EDGEOPT_RIG", "arm-rig")
        for i in range(4, 7):
            db.add(record(i, device="orin-1", cpu="ARMv8 Processor rev 1", cores=12, labels=("jetson",)))
        assert db.count(rig="arm-rig") == 3 and db.count(rig="x86-rig,arm-rig") == 7
        assert [len(db.query(label=x)) for x in ("lab", "jetson", "x86,jetson", "none")] == [4, 3, 7, 0]
        assert len(db.query(since="2026-11-01T00:05:00", until="2026-11-01T00:06:00")) == 1
        assert len(db.query(latest=True)) == 2  # the newest of each machine


def test_report_and_history_side_by_side(db_url, monkeypatch):
    """Two rigs of different identities in one database: `report` shows both side by side, `--identity`
    keeps one; `history` has one series per identity."""
    with ResultsDB(db_url) as db:
        for i in range(6):
            db.add(record(i, device="xeon-1", p50=2.0 + 0.01 * i))
            db.add(record(100 + i, device="orin-1", cpu="ARMv8 Processor rev 1", cores=12, p50=5.0 + 0.01 * i))
        ids = {r["device"]["name"]: r["identity"]["id"] for r in db.query(latest=True, annotate=True)}
    env = {"EDGEOPT_DB": db_url}
    p = _cli("report", "--format", "csv", env=env)
    assert p.returncode == 0, p.stderr
    rows = [r for r in p.stdout.splitlines()[1:] if r]
    assert len(rows) == 2 and any("xeon-1" in r for r in rows) and any("orin-1" in r for r in rows)
    p = _cli("report", "--format", "csv", "--identity", ids["orin-1"], env=env)
    assert p.returncode == 0 and "orin-1" in p.stdout and "xeon-1" not in p.stdout
    p = _cli("history", "cls", "--json", env=env)
    assert p.returncode == 0, p.stderr
    series = json.loads(p.stdout)["series"]
    assert sorted((s["device"], s["identity"], len(s["points"])) for s in series) == \
        sorted([("orin-1", ids["orin-1"], 6), ("xeon-1", ids["xeon-1"], 6)])


def test_gate_baseline_from_shared_history(db_url):
    """`baseline save --from latest --identity ID` takes the newest run of that machine identity, whichever
    rig wrote it, from the shared database; the gate then compares with its rounds (results:NAME)."""
    from edgeopt.hil.baseline import save, show

    with ResultsDB(db_url) as db:
        db.add(record(0, run_id="r-a", device="xeon-1"))
        db.add(record(1, run_id="r-b", device="orin-1", cpu="ARMv8 Processor rev 1", cores=12))
        ident = db.query(device="xeon-1", annotate=True)[0]["identity"]["id"]
    res = save("main", "latest", db_url, identity=ident)
    assert res["run_id"] == "r-a" and [e["device"] for e in res["entries"]] == ["xeon-1"]
    (e,) = show("main", db_url)["entries"]
    assert e["figures"]["rounds"] == 2 and e["figures"]["n"] == 40


def test_one_schema_on_both(pg_url, tmp_path):
    from edgeopt.results_pg import PgResultsDB

    with ResultsDB(str(tmp_path / "a.db")) as lite, ResultsDB(pg_url) as pg:
        assert isinstance(pg, PgResultsDB)
        want = [c for c, _, _ in COLUMNS] + [c for c, _ in V2_COLUMNS]
        assert [r[1] for r in lite._rows("PRAGMA table_info(runs)")] == want
        assert [r[0] for r in pg._rows("SELECT column_name FROM information_schema.columns WHERE table_name = "
                                       "'runs' ORDER BY ordinal_position")] == want
        assert [r[0] for r in lite._rows("SELECT version FROM schema_migrations ORDER BY version")] == [1, 2]
        assert [r[0] for r in pg._rows("SELECT version FROM schema_migrations ORDER BY version")] == [1, 2]


def test_a_v1_file_is_migrated_in_place(tmp_path):
    """A results file an edgeopt before schema 2 wrote (user_version 1, no record_key): migrated on open,
    its rows kept, keyed and fingerprinted."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript("""CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL,
        time TEXT NOT NULL, model TEXT, target TEXT, precision TEXT, backend TEXT, device TEXT NOT NULL,
        bundle_id TEXT, status TEXT NOT NULL, error TEXT, p50_ms REAL, throughput_ips REAL, accuracy_passed INTEGER,
        json TEXT NOT NULL); PRAGMA user_version = 1;""")
    for i in (0, 1, 1):  # the same record twice: both rows kept (a key each)
        r = record(i)
        conn.execute("INSERT INTO runs (run_id, time, device, status, json) VALUES (?,?,?,?,?)",
                     (r["run_id"], r["time"], r["device"]["name"], "ok", json.dumps(r)))
    conn.commit()
    conn.close()
    with ResultsDB(path) as db:
        assert db.schema_version == SCHEMA_VERSION and db.count() == 3
        keys = [r[0] for r in db._rows("SELECT record_key FROM runs ORDER BY id")]
        assert len(set(keys)) == 3 and keys[0] == record_key(record(0))
        assert all(r[0] for r in db._rows("SELECT identity FROM runs"))
        db.add(record(0))  # the migrated row's key makes a new write of it a duplicate
        assert db.count() == 3 and db.duplicates == 1
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_newer_schema_is_refused(db_url):
    with ResultsDB(db_url) as db:
        db.add(record(0))
        if db_url.startswith("postgresql"):
            with db._engine.begin() as conn:
                conn.exec_driver_sql("INSERT INTO schema_migrations (version, applied_at) VALUES (99, 'x')")
        else:
            db._conn.execute("PRAGMA user_version = 99")
            db._conn.commit()
    with pytest.raises(UsageError, match="newer edgeopt"):
        ResultsDB(db_url)
    p = _cli("report", "--db", db_url)
    assert p.returncode == 2 and "newer edgeopt" in p.stderr and "Traceback" not in p.stderr


def test_history_one_series_per_identity(db_url):
    """A re-imaged rig (new driver) starts a new series, noted, and its step is not a change point; a renamed
    one keeps its series."""
    from edgeopt.hil.history import history

    with ResultsDB(db_url) as db:
        for i in range(6):
            db.add(record(i, device="rig-a", driver="535", p50=2.0 + 0.001 * i))
        for i in range(6, 12):
            db.add(record(i, device="rig-a", driver="550", p50=2.5 + 0.001 * i))
        for i in range(12, 15):
            db.add(record(i, device="rig-a-renamed", driver="550", p50=2.5))
    old, new = history("cls", db=db_url, min_size=3, permutations=199)
    assert (old.device, len(old.points), old.note) == ("rig-a", 6, None)
    assert new.device == "rig-a, rig-a-renamed" and len(new.points) == 9 and new.identity != old.identity
    assert new.note.startswith(f"new identity {new.identity}") and not old.changes and not new.changes
