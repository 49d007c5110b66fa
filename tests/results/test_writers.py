"""Many rigs writing to one real PostgreSQL server at once, connections dropped in the middle; a rig that
cannot reach the server spools and syncs; bad input in one line. (The 4 x 200 run is bench/bench_results_db.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from edgeopt.results import ResultsDB
from tests.results.conftest import record

WRITER = Path(__file__).with_name("writer.py")


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_four_rigs_at_once_with_connections_killed(pg_url, tmp_path):
    """4 processes x 40 records at once; each, at its record 20, terminates every other writer's connection;
    each then writes all its records again. 160 rows, each once."""
    env = {**os.environ, "EDGEOPT_SPOOL": str(tmp_path / "spool.db")}
    procs = [subprocess.Popen([sys.executable, str(WRITER), pg_url, f"rig-{k}", "40", "20"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(4)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    res = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    assert sum(r["spooled"] for r in res) == 0 and all(r["duplicates"] >= 40 for r in res)
    with ResultsDB(pg_url) as db:
        assert db.count() == 160
        assert db._rows("SELECT COUNT(DISTINCT record_key), COUNT(DISTINCT rig) FROM runs")[0] == (160, 4)
        assert db._rows("SELECT COUNT(*) FROM runs WHERE record_key LIKE '%#%'")[0][0] == 0


def test_a_rig_without_its_server_spools_then_syncs(relay, tmp_path, monkeypatch):
    """The server unreachable (the relay cut): records go to the local spool, one line says so; the server
    back: `edgeopt results sync` uploads each once and empties the spool; counts equal."""
    r, url = relay
    monkeypatch.setenv("EDGEOPT_SPOOL", str(tmp_path / "spool.db"))
    with ResultsDB(url) as db:
        for i in range(5):
            db.add(record(i))
        assert db.count() == 5
        r.drop()  # connections dropped under a live writer: re-made, nothing lost or doubled
        db.add(record(5))
        r.cut()  # then the server is gone for good: the next writes spool
        for i in range(6, 12):
            assert db.add(record(i)) == 0
        assert db.spooled == 6 and db.offline
    with ResultsDB(url) as db:  # still unreachable on open: spools from the start
        db.add(record(12))
        db.add(record(6))  # one already spooled: not spooled twice
        assert db.offline and db.spooled == 2
    assert ResultsDB(str(tmp_path / "spool.db")).count() == 7
    p = _cli("results", "sync", "--db", url)
    assert p.returncode == 4 and "cannot be reached" in p.stderr and "Traceback" not in p.stderr
    r.restore()
    p = _cli("results", "sync", "--db", url, "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert (out["uploaded"], out["rows"]) == (7, 13)
    assert ResultsDB(str(tmp_path / "spool.db")).count() == 0
    p = _cli("results", "sync", "--db", url, "--json")  # again: nothing to do, nothing doubled
    assert p.returncode == 0 and json.loads(p.stdout)["rows"] == 13


def test_the_next_command_uploads_the_spool(relay, tmp_path, monkeypatch):
    r, url = relay
    monkeypatch.setenv("EDGEOPT_SPOOL", str(tmp_path / "spool.db"))
    r.cut()
    with ResultsDB(url) as db:
        db.add(record(0))
    r.restore()
    with ResultsDB(url) as db:  # e.g. the next `edgeopt bench`
        assert db.synced == 1 and db.count() == 1


def test_bad_input_one_line(pg_url, tmp_path):
    """A password in the URL (masked), wrong credentials, an unknown database: exit 2; an unreachable server
    for a reading command: exit 4; one message each, no traceback, nothing written."""
    head, _, name = pg_url.rpartition("/")
    user_host = head.split("://", 1)[1]
    user, host = user_host.split("@")
    cases = [(["report", "--db", f"postgresql://{user}:pw-9z@{host}/{name}"], 2, "password"),
             (["report", "--db", f"postgresql://no_such_role@{host}/{name}"], 2, "refused"),
             (["history", "m", "--db", f"postgresql://{user}@{host}/no_such_db"], 2, "does not exist"),
             (["report", "--db", f"postgresql://{user}@127.0.0.1:9/{name}"], 4, "cannot be reached"),
             (["results", "info", "--db", "mysql://x@h/db"], 2, "unknown scheme")]
    for args, code, words in cases:
        p = _cli(*args, env={"PGPASSWORD": "wrong-pw", "EDGEOPT_SPOOL": str(tmp_path / "s.db")}
                 if "no_such_role" in args[-1] else {"EDGEOPT_SPOOL": str(tmp_path / "s.db")})
        assert p.returncode == code, (args, p.stderr)
        assert words in p.stderr and "Traceback" not in p.stderr and "pw-9z" not in p.stderr + p.stdout, p.stderr
        assert p.stderr.startswith("edgeopt: error:") and len(p.stderr.strip().splitlines()) <= 2
    assert not (tmp_path / "s.db").exists()
