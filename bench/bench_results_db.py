"""Shared results on a real PostgreSQL server and a real MLflow server (issue 43).

    EDGEOPT_TEST_PG=postgresql://edgeopt@localhost:5432/edgeopt_test PGPASSWORD=… \\
        .venv/bin/python bench/bench_results_db.py [--records 200] [--skip-main] [--skip-arm]

What it does, each on a fresh database created on EDGEOPT_TEST_PG's server (the role needs CREATEDB):
1. four rig processes write 200 records each at once; each, at its record 100, terminates every other
   edgeopt connection (forced reconnects in the middle); each rig then writes all its records again:
   rows, distinct keys, duplicates found;
2. a rig with the server stopped (`pg_ctlcluster … stop`, root) writes 50 records: spooled; the server
   started again, `edgeopt results sync`: counts equal;
3. write and query time per record, PostgreSQL vs SQLite, interleaved rounds in one process;
4. the README's main job (`edgeopt run` of ocr-cls on `local`, cpu,intel-cpu,mobile, auto) with
   --db on the server, as rig `x86-host`; the cpu bundle benched on an emulated arm64 board (qemu-user,
   scripts/make_device.py, cached root) as rig `arm-emulated`: `report` across both, side by side;
5. a gate baseline from the shared history (`baseline save --identity`), then `gate --baseline results:NAME`;
6. the main job's records exported to a real `mlflow server` (tests/results/test_mlflow.py's venv) and
   read back over REST (run count, p50 of one run compared);
7. the bad-input lines (a password in the URL, wrong credentials, unreachable, newer schema).
Writes section `results-db` of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._common import load, machine, md_table, stamp, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EDGEOPT = [sys.executable, "-m", "edgeopt"]
WRITER = ROOT / "tests" / "results" / "writer.py"


def admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(os.environ["EDGEOPT_TEST_PG"], autocommit=True, connect_timeout=10) as c:
        c.execute(sql)


def fresh_db(tag: str) -> str:
    name = f"edgeopt_bench_{tag}_{uuid.uuid4().hex[:6]}"
    admin(f"CREATE DATABASE {name}")
    return os.environ["EDGEOPT_TEST_PG"].rpartition("/")[0] + "/" + name


def cli(*args: str, env: dict | None = None, cwd: str | None = None, timeout: int = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([*EDGEOPT, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, **(env or {})})


def step_writers(n: int, spool: Path) -> dict:
    from edgeopt.results import ResultsDB

    url = fresh_db("writers")
    env = {**os.environ, "EDGEOPT_SPOOL": str(spool)}
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, str(WRITER), url, f"rig-{k}", str(n), str(n // 2)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(4)]
    outs = [p.communicate(timeout=1800) for p in procs]
    wall = time.perf_counter() - t0
    res = [json.loads(o[0].strip().splitlines()[-1]) for o in outs]
    with ResultsDB(url) as db:
        rows, keys, rigs = db._rows("SELECT COUNT(*), COUNT(DISTINCT record_key), COUNT(DISTINCT rig) FROM runs")[0]
        suffixed = db._rows("SELECT COUNT(*) FROM runs WHERE record_key LIKE '%#%'")[0][0]
    return {"url": url, "rows": rows, "keys": keys, "rigs": rigs, "suffixed": suffixed, "wall_s": wall,
            "dups": [r["duplicates"] for r in res], "spooled": sum(r["spooled"] for r in res),
            "killed": sum(r.get("killed", 0) for r in res), "retries": [r.get("retries", 0) for r in res],
            "write_s": [r["write_s"] for r in res], "stderr": [o[1].strip() for o in outs if o[1].strip()]}


def pg_cluster(action: str) -> None:
    ver = sorted(os.listdir("/usr/lib/postgresql"), key=lambda v: [int(x) for x in v.split(".")])[-1]
    subprocess.run(["pg_ctlcluster", ver, "main", action], check=True, capture_output=True, timeout=120)


def step_spool(url: str, spool: Path) -> dict:
    from edgeopt.results import ResultsDB

    before = ResultsDB(url).count()
    pg_cluster("stop")
    try:
        p = subprocess.run([sys.executable, str(WRITER), url, "rig-offline", "50"], capture_output=True, text=True,
                           env={**os.environ, "EDGEOPT_SPOOL": str(spool)}, timeout=600)
        wrote = json.loads(p.stdout.strip().splitlines()[-1])
        spooled = ResultsDB(str(spool)).count()
        down = cli("results", "sync", "--db", url, env={"EDGEOPT_SPOOL": str(spool)})
    finally:
        pg_cluster("start")
    time.sleep(2)
    up = cli("results", "sync", "--db", url, "--json", env={"EDGEOPT_SPOOL": str(spool)})
    out = json.loads(up.stdout)
    return {"before": before, "spooled": spooled, "writer_line": p.stderr.strip().splitlines()[0],
            "wrote_spooled": wrote["spooled"], "sync_down_rc": down.returncode, "sync_down": down.stderr.strip(),
            "uploaded": out["uploaded"], "after": out["rows"], "left": ResultsDB(str(spool)).count()}


def step_speed(rounds: int, per_round: int, tmp: Path) -> dict:
    """Interleaved: each round writes per_round records to SQLite then to PostgreSQL (order alternating),
    then times three queries on each."""
    from edgeopt.results import ResultsDB
    from tests.results.conftest import record

    url = fresh_db("speed")
    lite_path = tmp / "speed.db"
    w = {"sqlite": [], "postgresql": []}
    q = {"sqlite": [], "postgresql": []}
    qf = {"sqlite": [], "postgresql": []}
    with ResultsDB(str(lite_path)) as lite, ResultsDB(url) as pg:
        dbs = {"sqlite": lite, "postgresql": pg}
        i = 0
        for r in range(rounds):
            recs = [record(i + k, run_id=f"speed-{r}", device=f"dev-{k % 4}") for k in range(per_round)]
            i += per_round
            for name in (("sqlite", "postgresql") if r % 2 == 0 else ("postgresql", "sqlite")):
                t0 = time.perf_counter()
                for rec in recs:
                    dbs[name].add(json.loads(json.dumps(rec)))
                w[name].append((time.perf_counter() - t0) / per_round * 1000)
            for name in (("sqlite", "postgresql") if r % 2 else ("postgresql", "sqlite")):
                t0 = time.perf_counter()
                got = dbs[name].query()
                q[name].append((time.perf_counter() - t0) / len(got) * 1000)
                t0 = time.perf_counter()
                got = dbs[name].query(device="dev-1", latest=True)
                qf[name].append((time.perf_counter() - t0) * 1000)
        n = {k: v.count() for k, v in dbs.items()}
    admin(f"DROP DATABASE IF EXISTS {url.rpartition('/')[2]} WITH (FORCE)")
    return {"rows": n, "write_ms": {k: statistics.median(v) for k, v in w.items()},
            "query_ms": {k: statistics.median(v) for k, v in q.items()},
            "query_latest_ms": {k: statistics.median(v) for k, v in qf.items()},
            "rounds": rounds, "per_round": per_round}


def step_main_job(url: str, work: Path) -> dict:
    fx = subprocess.run([sys.executable, "-m", "edgeopt.fixtures", "ocr-cls"], capture_output=True, text=True,
                        check=True).stdout.strip()
    lines = subprocess.run([sys.executable, "-m", "edgeopt.fixtures", "ocr-lines"], capture_output=True, text=True,
                           check=True).stdout.strip()
    t0 = time.perf_counter()
    p = cli("run", fx, "--shape", "x:1x3x48x192", "--calib", lines, "--preprocess", "preset=pm1 order=bgr",
            "--targets", "cpu,intel-cpu,mobile", "--precision", "auto", "--report", "report.html", "--db", url,
            cwd=str(work), env={"EDGEOPT_RIG": "x86-host"})
    return {"rc": p.returncode, "s": time.perf_counter() - t0, "tail": p.stderr.strip().splitlines()[-3:],
            "stdout_tail": p.stdout.strip().splitlines()[-6:]}


def step_arm(url: str, work: Path) -> dict:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_device", ROOT / "scripts" / "make_device.py")
    md = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(md)
    if md.root_info(md.default_root("bookworm", "arm64")) is None:
        return {"skipped": "no cached bookworm arm64 root (scripts/make_device.py builds one)"}
    md.host_tools(install=False)
    md.binfmt("arm64")
    port = md.free_port()
    out = md.up("arm64", "bookworm", port=port, state=work / "arm", name="arm64-emu", target="cpu",
                agent_root=f"/root/.edgeopt-bench43-{port}")
    try:
        bundle = next(p for p in sorted((work / "dist").glob("*/cpu-*")) if p.is_dir())
        t0 = time.perf_counter()
        p = cli("bench", "--dist", "dist", "--targets", "cpu", "--devices", out["inventory"], "--db", url,
                "--duration", "2", cwd=str(work), env={"EDGEOPT_RIG": "arm-emulated"}, timeout=1800)
        return {"rc": p.returncode, "s": time.perf_counter() - t0, "bundle": str(bundle.relative_to(work)),
                "tail": (p.stderr.strip().splitlines() or [""])[-2:]}
    finally:
        md.down("arm64", "bookworm", port=port)
        shutil.rmtree(Path(out["root"]) / out["agent_root"].lstrip("/"), ignore_errors=True)


def step_report(url: str) -> dict:
    from edgeopt.results import ResultsDB

    with ResultsDB(url, create=False) as db:
        rows = db._rows("SELECT rig, device, identity, COUNT(*) FROM runs GROUP BY rig, device, identity "
                        "ORDER BY rig, device")
        recs = db.query(latest=True, annotate=True)
    facts = {}
    for r in recs:
        ident = r.get("identity") or {}
        if ident.get("id"):
            facts[ident["id"]] = ident.get("facts")
    p = cli("report", "--db", url, "--format", "md")
    return {"groups": rows, "facts": facts, "report_rc": p.returncode, "report": p.stdout}


def step_gate(url: str, work: Path) -> dict:
    from edgeopt.results import ResultsDB

    with ResultsDB(url, create=False) as db:
        rec = next(r for r in reversed(db.query(target="cpu", rig="x86-host", annotate=True)) if r.get("status") == "ok")
    ident, model = rec["identity"]["id"], rec["bundle"]["model"]
    s = cli("baseline", "save", "shared", "--from", "latest", "--identity", ident, "--model", model,
            "--targets", "cpu", "--db", url, "--force", "--json")
    bundle = next(p for p in sorted((work / "dist").glob("*/cpu-*")) if p.is_dir())
    t0 = time.perf_counter()
    g = cli("gate", str(bundle), "--baseline", "results:shared", "--devices", "local", "--db", url,
            "--budget", "40s", "--json", cwd=str(work), env={"EDGEOPT_RIG": "x86-host"}, timeout=900)
    try:
        verdict = json.loads(g.stdout)
    except ValueError:
        verdict = {}
    dev = (verdict.get("devices") or [{}])[0]
    return {"identity": ident, "save_rc": s.returncode, "save": json.loads(s.stdout) if s.returncode == 0 else
            s.stderr.strip(), "gate_rc": g.returncode, "verdict": verdict.get("verdict"), "s": time.perf_counter() - t0,
            "verdicts": [(v.get("metric"), v.get("verdict")) for v in dev.get("verdicts") or []],
            "warnings": dev.get("warnings"), "stderr": g.stderr.strip().splitlines()[-2:]}


def step_mlflow(url: str, tmp: Path) -> dict:
    from edgeopt.results import ResultsDB
    from tests.results.test_mlflow import rest, start_server, stop_server

    with ResultsDB(url, create=False) as db:
        main = [r for r in db.query(rig="x86-host", annotate=True) if not str(r.get("status")).startswith("gate-")]
    run_id = main[0]["run_id"]
    main = [r for r in main if r["run_id"] == run_id]
    t0 = time.perf_counter()
    proc, uri = start_server(tmp / "mlflow")
    up_s = time.perf_counter() - t0
    try:
        t0 = time.perf_counter()
        p = cli("export", "mlflow", "--tracking-uri", uri, "--db", url, "--run", run_id, "--experiment",
                "edgeopt-main-job", "--json")
        export_s = time.perf_counter() - t0
        out = json.loads(p.stdout)
        again = json.loads(cli("export", "mlflow", "--tracking-uri", uri, "--db", url, "--run", run_id,
                               "--experiment", "edgeopt-main-job", "--json").stdout)
        exp = rest(uri, "experiments/get-by-name?experiment_name=edgeopt-main-job", method="GET")["experiment"]
        runs = rest(uri, "runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 1000})["runs"]
        ok = [r for r in main if r.get("status") == "ok"]
        one = ok[0]
        key = next(t["value"] for r in runs for t in r["data"]["tags"]
                   if t["key"] == "edgeopt.record_key" and _key(one) == t["value"])
        run = next(r for r in runs if any(t["value"] == key for t in r["data"]["tags"]))
        p50 = next(m["value"] for m in run["data"]["metrics"] if m["key"] == "latency_p50_ms")
        samples = rest(uri, f"metrics/get-history?run_id={run['info']['run_id']}&metric_key=latency_sample_ms"
                            "&max_results=25000", method="GET").get("metrics") or []
        refused = cli("export", "mlflow", "--tracking-uri", uri.replace(uri.rsplit(":", 1)[1], "9"), "--db", url)
        return {"records": len(main), "ok": len(ok), "exported": out["exported"], "batches": out["batches"],
                "calls": out["calls"], "export_s": export_s, "up_s": up_s, "again_skipped": again["skipped"],
                "again_exported": again["exported"], "runs": len(runs),
                "p50_db": one["bench"]["latency_ms"]["p50"], "p50_mlflow": p50,
                "samples_db": len(one["bench"].get("samples_ms") or []), "samples_mlflow": len(samples),
                "which": f"{one['bundle']['target']}-{one['bundle']['precision']} on {one['device']['name']}",
                "unreachable_line": refused.stderr.strip().splitlines()[0], "unreachable_rc": refused.returncode}
    finally:
        stop_server(proc)


def _key(rec: dict) -> str:
    from edgeopt.results_schema import record_key

    return record_key(rec)


def step_bad_input(url: str, tmp: Path) -> list[dict]:
    head, _, name = url.rpartition("/")
    user, host = head.split("://", 1)[1].split("@")
    newer = fresh_db("newer")
    from edgeopt.results import ResultsDB

    with ResultsDB(newer) as db, db._engine.begin() as conn:
        conn.exec_driver_sql("INSERT INTO schema_migrations (version, applied_at) VALUES (99, 'x')")
    cases = [("a password in the URL", ["report", "--db", f"postgresql://{user}:hunter2@{host}/{name}"], {}),
             ("wrong credentials", ["report", "--db", url], {"PGPASSWORD": "wrong", "PGPASSFILE": "/dev/null"}),
             ("unreachable server (report)", ["report", "--db", f"postgresql://{user}@127.0.0.1:9/{name}"], {}),
             ("a database of a newer schema", ["report", "--db", newer], {})]
    out = []
    for what, args, env in cases:
        p = cli(*args, env={"EDGEOPT_SPOOL": str(tmp / "bad-spool.db"), **env})
        out.append({"case": what, "rc": p.returncode, "line": p.stderr.strip().splitlines()[0],
                    "lines": len(p.stderr.strip().splitlines()), "leak": "hunter2" in p.stderr + p.stdout})
    admin(f"DROP DATABASE IF EXISTS {newer.rpartition('/')[2]} WITH (FORCE)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=200)
    ap.add_argument("--skip-main", action="store_true")
    ap.add_argument("--skip-arm", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--render", metavar="JSON", help="only write the section from a results.json of a run")
    a = ap.parse_args()
    if a.render:
        R = json.loads(Path(a.render).read_text())
        write_section("results-db", render(R, R["started"], R["load0"]))
        return
    if not os.environ.get("EDGEOPT_TEST_PG"):
        sys.exit("set EDGEOPT_TEST_PG (a PostgreSQL URL whose role may CREATE DATABASE), password in PGPASSWORD")
    tmp = Path(tempfile.mkdtemp(prefix="bench-results-"))
    started, ld0 = stamp(), load()
    R: dict = {"started": started, "load0": ld0}
    R["writers"] = step_writers(a.records, tmp / "writers-spool.db")
    print("writers", {k: v for k, v in R["writers"].items() if k != "stderr"}, flush=True)
    R["spool"] = step_spool(R["writers"]["url"], tmp / "offline-spool.db")
    print("spool", R["spool"], flush=True)
    R["speed"] = step_speed(6, 100, tmp)
    print("speed", R["speed"], flush=True)
    shared = fresh_db("shared")
    if not a.skip_main:
        R["main"] = step_main_job(shared, tmp)
        print("main", R["main"], flush=True)
        if not a.skip_arm:
            R["arm"] = step_arm(shared, tmp)
            print("arm", R["arm"], flush=True)
        R["report"] = step_report(shared)
        print("report", {k: v for k, v in R["report"].items() if k != "report"}, flush=True)
        R["gate"] = step_gate(shared, tmp)
        print("gate", R["gate"], flush=True)
        R["mlflow"] = step_mlflow(shared, tmp)
        print("mlflow", R["mlflow"], flush=True)
    R["bad"] = step_bad_input(shared, tmp)
    print("bad", R["bad"], flush=True)
    for url in (R["writers"]["url"], shared):  # the server left as found
        admin(f"DROP DATABASE IF EXISTS {url.rpartition('/')[2]} WITH (FORCE)")
    (tmp / "results.json").write_text(json.dumps(R, indent=1, default=str))
    print("raw:", tmp / "results.json")
    if not a.no_write:
        write_section("results-db", render(R, started, ld0))


def render(R: dict, started: str, ld0: str) -> str:
    w, s, sp = R["writers"], R["spool"], R["speed"]
    out = [f"### Shared results: PostgreSQL, spool, identities, MLflow (`bench/bench_results_db.py`, {started}"
           f" to {stamp()})", "",
           f"{machine()}; {ld0} at the start, {load()} at the end (the machine is shared by five sessions). "
           "PostgreSQL 15 (Debian) on this host, SQLAlchemy 2.1 + psycopg 3.3; MLflow 3.17.2 on SQLite in its "
           "own venv.", "",
           f"**Four rigs at once.** 4 processes x {w['rows'] // 4 if w['rows'] else '?'} records to one fresh database; "
           "each rig, at its middle record, terminated every other edgeopt connection "
           f"(`pg_terminate_backend`: {w.get('killed', '?')} connections terminated; writes and reads retried on a "
           f"fresh connection per rig: {', '.join(map(str, w.get('retries', [])))}), then each rig wrote all its "
           "records again: "
           f"**{w['rows']} rows, {w['keys']} distinct keys, {w['rigs']} rigs, {w['suffixed']} stored twice**; "
           f"the second pass found {sum(w['dups'])} duplicates ({', '.join(map(str, w['dups']))} per rig), "
           f"{w['spooled']} spooled; {w['wall_s']:.1f} s wall for all four "
           f"(first pass per rig {', '.join(f'{x:.1f}' for x in w['write_s'])} s).", "",
           f"**Server stopped.** `pg_ctlcluster 15 main stop`, then a rig wrote 50 records and all 50 again: "
           f"{s['wrote_spooled']} writes went to the spool, which held {s['spooled']} (each once); its one line: "
           f"`{s['writer_line']}`. "
           f"`results sync` while down: exit {s['sync_down_rc']} (`{s['sync_down'].splitlines()[0]}`). Server "
           f"started, `edgeopt results sync`: {s['uploaded']} uploaded, {s['before']} rows before, "
           f"**{s['after']} after ({s['after'] - s['before']} added), spool left {s['left']}**.", "",
           f"**Write and query time per record** (one process, {sp['rounds']} interleaved rounds of "
           f"{sp['per_round']} records, engine order alternating; medians over rounds; "
           f"{sp['rows']['sqlite']} and {sp['rows']['postgresql']} rows at the end; "
           "a write is one transaction each, `INSERT … ON CONFLICT DO NOTHING RETURNING id`):", "",
           md_table([{"what": "write, ms per record", "sqlite": f"{sp['write_ms']['sqlite']:.2f}",
                      "pg": f"{sp['write_ms']['postgresql']:.2f}",
                      "ratio": f"{sp['write_ms']['postgresql'] / sp['write_ms']['sqlite']:.2f}"},
                     {"what": "query all, ms per record returned", "sqlite": f"{sp['query_ms']['sqlite']:.3f}",
                      "pg": f"{sp['query_ms']['postgresql']:.3f}",
                      "ratio": f"{sp['query_ms']['postgresql'] / sp['query_ms']['sqlite']:.2f}"},
                     {"what": "query one device, latest (ms per query)",
                      "sqlite": f"{sp['query_latest_ms']['sqlite']:.1f}",
                      "pg": f"{sp['query_latest_ms']['postgresql']:.1f}",
                      "ratio": f"{sp['query_latest_ms']['postgresql'] / sp['query_latest_ms']['sqlite']:.2f}"}],
                    [("what", ""), ("sqlite", "SQLite file"), ("pg", "PostgreSQL (localhost TCP)"),
                     ("ratio", "PG / SQLite")]), "",
           "Reading: a write is a commit each; SQLite's default (rollback journal, `synchronous=FULL`) syncs "
           "the journal and the file per commit, PostgreSQL one WAL flush, so on this disk the server is the "
           "faster writer even over TCP. Reading costs about the same per record on both: it is parsing each "
           "record's JSON (`json.loads`), not the engine. The 'latest of one device' query reads every row of "
           "that device and keeps the newest per key in Python (as `report` does), so it grows with the "
           "device's history on both engines.", ""]
    if "main" in R:
        m, rp, g, ml = R["main"], R["report"], R["gate"], R["mlflow"]
        out += [f"**The README's main job** with `--db postgresql://…` as rig `x86-host`: exit {m['rc']} in "
                f"{m['s']:.0f} s (its builds come from edgeopt's build cache when an earlier run made them; the "
                "benches are measured each time)."]
        if "arm" in R:
            a = R["arm"]
            out += ["The cpu bundle benched on the emulated arm64 board (qemu-user, bookworm) as rig `arm-emulated`: "
                    + (f"exit {a['rc']} in {a['s']:.0f} s." if "rc" in a else a.get("skipped", ""))]
        out += ["", "Rows by rig, device and machine identity in the shared database:", "",
                md_table([{"rig": r[0], "device": r[1], "identity": r[2], "n": r[3]} for r in rp["groups"]],
                         [("rig", "rig"), ("device", "device"), ("identity", "identity"), ("n", "records")]), "",
                "Identities: " + "; ".join(f"`{k}` = {json.dumps(v, sort_keys=True)}" for k, v in rp["facts"].items()),
                "", "`edgeopt report --db postgresql://… --format md` (both rigs side by side):", "", "<details>",
                "", rp["report"].strip(), "", "</details>", "",
                f"**Gate baseline from the shared history.** `baseline save shared --from latest --identity "
                f"{g['identity']}` (exit {g['save_rc']}), then `gate <cpu bundle> --baseline results:shared "
                f"--devices local --db postgresql://…`: exit {g['gate_rc']}, verdict **{g['verdict']}** in "
                f"{g['s']:.0f} s; per metric {g['verdicts']}; warnings {g['warnings']}. The candidate is the "
                "baseline's own bundle: whatever the verdict says beyond `pass`/`inconclusive` is the unpaired "
                "gate reading this machine's load between the two sessions (the gate's business, issue 10's "
                "figures), not the shared history, which supplied the rounds and the fingerprint.", "",
                f"**MLflow.** `mlflow server` ready in {ml['up_s']:.0f} s. `export mlflow --run <main job run>`: "
                f"{ml['records']} records ({ml['ok']} ok) -> **{ml['exported']} runs** in {ml['export_s']:.1f} s "
                f"({ml['batches']} log-batch calls, {ml['calls']} REST calls); read back over `runs/search`: "
                f"**{ml['runs']} runs**; {ml['which']}: p50 {ml['p50_db']} ms in the database, "
                f"**{ml['p50_mlflow']} ms in MLflow**; its samples {ml['samples_db']} vs {ml['samples_mlflow']} "
                f"points of `latency_sample_ms`. Exported again: {ml['again_exported']} exported, "
                f"{ml['again_skipped']} skipped. Unreachable tracking server: exit {ml['unreachable_rc']}, "
                f"`{ml['unreachable_line']}`.", ""]
    out += ["**Bad input** (one message and its hint; nothing written):", "",
            md_table([{**b, "line": f"`{b['line']}`", "leak": "no" if not b["leak"] else "YES"} for b in R["bad"]],
                     [("case", "input"), ("rc", "exit"), ("line", "message"), ("leak", "password printed")])]
    return "\n".join(out)


if __name__ == "__main__":
    main()
