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
    from edgeopt.api import results_sync
    from edgeopt.commands import emit_json
    from edgeopt.results_url import parse

    spec = parse(db)
    res = results_sync(db).to_dict()
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
    from edgeopt.api import results_info
    from edgeopt.commands import emit_json
    from edgeopt.results_url import parse

    spec = parse(db)
    out = results_info(db).to_dict()
    if as_json:
        emit_json(out, "results-info")
    else:
        click.echo(f"{out['db']} ({out['db_kind']}, schema {out['schema_version']}): {out['records']} record(s), "
                   f"{out['identities']} machine identit{'y' if out['identities'] == 1 else 'ies'}, rigs: "
                   f"{', '.join(out['rigs']) or '-'}")
        if spec.is_server:
            click.echo(f"spool {out['spool']}: {out['spooled']} record(s) waiting")
    return 0
