"""``edgeopt results sync|info``: the results database a rig writes to, and its local spool (click)."""

from __future__ import annotations

import click

DB = click.option("--db", envvar="EDGEOPT_DB", default=None, metavar="FILE|URL",
                  help="Results database: a file, sqlite:///path or postgresql://user@host:port/dbname "
                       "[$EDGEOPT_DB, else ./edgeopt-results.db].")
JSON = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")


@click.group("results", short_help="The results database: upload the spool (sync), show where it stands (info).",
             context_settings={"help_option_names": ["-h", "--help"]}, epilog="""\b
examples:
  export EDGEOPT_DB=postgresql://rig@results.lab:5432/edgeopt   # the password: PGPASSWORD or ~/.pgpass
  edgeopt results info
  edgeopt results sync
""")
def command() -> None:
    """Many rigs can share one PostgreSQL database (--db postgresql://…); a rig that cannot reach it keeps
    its records in a local spool and `edgeopt results sync` (or the next command that reaches it) uploads
    them, each once."""


@command.command("sync")
@DB
@JSON
def sync(db, as_json) -> int:
    """Upload the records spooled while the server could not be reached (each once), then empty the spool."""
    from edgeopt.commands import emit_json
    from edgeopt.errors import UsageError
    from edgeopt.results import ResultsDB
    from edgeopt.results_url import parse

    spec = parse(db)
    if not spec.is_server:
        raise UsageError(f"--db {spec.shown!r} is a local file: there is nothing to sync",
                         hint="give the server: --db postgresql://user@host:port/dbname (or EDGEOPT_DB)")
    # create=False: an unreachable server is exit 4 in one line (not a spool); opening it uploads the spool
    with ResultsDB(db, create=False) as rdb:
        rdb.sync()
        res = {"uploaded": rdb.synced, "duplicates": rdb.sync_duplicates, "left": 0}
        res.update({"db": spec.shown, "spool": str(spec.path), "rows": rdb.count()})
    if as_json:
        emit_json(res, "results-sync")
    else:
        click.echo(f"{res['uploaded']} spooled record(s) uploaded to {spec.shown}"
                   + (f", {res['duplicates']} there already" if res["duplicates"] else "")
                   + f"; the server holds {res['rows']} record(s); the spool {spec.path} is empty")
    return 0


@command.command("info")
@DB
@JSON
def info(db, as_json) -> int:
    """Where records go: the database, its schema version, how many records it holds and how many wait in
    the spool."""
    from edgeopt.commands import emit_json
    from edgeopt.results import ResultsDB
    from edgeopt.results_schema import SCHEMA_VERSION
    from edgeopt.results_url import parse

    spec = parse(db)
    out = {"db": spec.shown, "kind": spec.kind, "schema_version": None, "edgeopt_schema": SCHEMA_VERSION,
           "records": None, "identities": None, "rigs": None}
    with ResultsDB(db, create=False) as rdb:
        out["schema_version"] = rdb.schema_version
        out["records"] = rdb.count()
        out["identities"] = int(rdb._rows("SELECT COUNT(DISTINCT identity) FROM runs")[0][0])
        out["rigs"] = sorted(r[0] for r in rdb._rows("SELECT DISTINCT rig FROM runs WHERE rig IS NOT NULL"))
        if spec.is_server:
            out["spool"] = str(spec.path)
            out["spooled"] = rdb.spool().count() if spec.path.is_file() else 0
    if as_json:
        emit_json(out, "results-info")
    else:
        click.echo(f"{out['db']} ({out['kind']}, schema {out['schema_version']}): {out['records']} record(s), "
                   f"{out['identities']} machine identit{'y' if out['identities'] == 1 else 'ies'}, rigs: "
                   f"{', '.join(out['rigs']) or '-'}")
        if spec.is_server:
            click.echo(f"spool {out['spool']}: {out['spooled']} record(s) waiting")
    return 0
