"""``edgeopt baseline save|list|show|export|import``: named baselines for the gate (click)."""

from __future__ import annotations

import click

from ._common import deprecated

DB = click.option("--db", envvar="EDGEOPT_DB", default="edgeopt-results.db", show_default=True, help="Results database.")
JSON = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")


@click.group("baseline", short_help="Named baselines: a run's figures and rounds kept for `edgeopt gate`",
             context_settings={"help_option_names": ["-h", "--help"]}, epilog="""\b
examples:
  edgeopt baseline save main --from latest
  edgeopt baseline save v1.4 --from gate-3f2a9c1d0b7e
  edgeopt baseline list
  edgeopt baseline export main -o models/cls.baseline.json
  edgeopt baseline import models/cls.baseline.json
  edgeopt gate dist/cls/cpu-fp32 --baseline results:main --devices rig.yaml
""")
def command() -> None:
    """A baseline is a run's per-round latencies, figures and device fingerprint (per model × target ×
    device), kept under a name; `edgeopt gate --baseline results:NAME` compares a candidate with it."""


@command.command("save", epilog="""\b
examples:
  edgeopt baseline save main --from latest
  edgeopt baseline save main --from latest --model cls --device jetson-1 --force
""")
@click.argument("name")
@click.option("--from", "source", required=True, metavar="RUN_ID|latest",
              help="The run to keep: a gate (its candidate's rounds) or a bench run (its samples).")
@click.option("--model", default=None, help="With `latest`: the newest run of this model.")
@click.option("--targets", "target", default=None, metavar="TARGET",
              help="With `latest`: the newest run of this target (one; aliases work).")
@click.option("--target", "target_alias", default=None, hidden=True)  # the old spelling of --targets
@click.option("--device", default=None, help="With `latest`: the newest run on this device.")
@click.option("--identity", default=None, metavar="ID",
              help="With `latest`: the newest run on a machine of this identity (any rig of a shared --db).")
@click.option("--force", is_flag=True, help="Replace entries NAME already has.")
@DB
@JSON
def save(name, source, model, target, target_alias, device, identity, force, db, as_json) -> int:
    """Keep run RUN_ID (or the latest) under NAME."""
    from edgeopt.api import resolve_target_filter
    from edgeopt.commands import emit_json
    from edgeopt.errors import UsageError
    from edgeopt.hil.baseline import save as do_save

    target = resolve_target_filter(",".join(x for x in (target, target_alias) if x)) if (target or target_alias) \
        else None
    if target and "," in target:
        raise UsageError(f"baseline save --targets takes one target (the newest run of it), got {target!r}")

    res = do_save(name, source, db, model, target, device, force, identity=identity)
    if as_json:
        emit_json(res, "baseline-save")
    else:
        for e in res["entries"]:
            f = e["figures"]
            click.echo(f"{name}: {e['model']} / {e['target']} / {e['device']}: {f['rounds']} rounds, p50 {f['p50']} ms, "
                       f"p90 {f['p90']} ms (from {e['kind']} run {e['source_run']})")
        if res["replaced"]:
            click.echo(f"replaced: {', '.join(res['replaced'])}")
    return 0


@command.command("list")
@DB
@JSON
def list_(db, as_json) -> int:
    """Every named baseline in the database."""
    from edgeopt.commands import emit_json
    from edgeopt.hil.baseline import list_baselines

    rows = list_baselines(db)
    if as_json:
        emit_json({"baselines": rows}, "baseline-list")
    elif not rows:
        click.echo(f"no baselines in {db} (edgeopt baseline save NAME --from latest)")
    else:
        for r in rows:
            click.echo(f"{r['name']:<20} {r['entries']} entr{'y' if r['entries'] == 1 else 'ies'}  "
                       f"models {','.join(r['models'])}  devices {','.join(r['devices'])}  saved {r['created'][:19]}")
    return 0


@command.command("show")
@click.argument("name")
@DB
@JSON
def show(name, db, as_json) -> int:
    """NAME's entries: figures, source run and device fingerprint."""
    import json

    from edgeopt.commands import emit_json
    from edgeopt.hil.baseline import show as do_show

    res = do_show(name, db)
    if as_json:
        emit_json(res, "baseline")
    else:
        for e in res["entries"]:
            f = e["figures"]
            click.echo(f"{e['model']} / {e['target']} / {e['device']}: {f['rounds']} rounds ({f['n']} samples), "
                       f"p50 {f['p50']} p90 {f['p90']} p99 {f['p99']} ms; from {e['kind']} run {e['source_run']} "
                       f"({e['source_verdict']}), saved {e['created'][:19]}")
            click.echo(f"    fingerprint: {json.dumps(e['fingerprint'], sort_keys=True)}")
    return 0


@command.command("export", epilog="""\b
examples:
  edgeopt baseline export main -o models/cls.baseline.json
""")
@click.argument("name")
@click.option("-o", "--output", default="-", show_default=True, metavar="FILE",
              help="File to write (written atomically); - = stdout.")
@deprecated("--out", "--output", "out_old", metavar="FILE")
@DB
def export(name, output, out_old, db) -> int:
    """NAME as a JSON file (rounds included) to commit next to the model."""

    from edgeopt.hil.baseline import export as do_export
    from edgeopt.hil.baseline import write_export

    out = out_old if output == "-" and out_old is not None else output
    if out != "-":
        from .report import check_writable

        check_writable(out, "--output", "the baseline")  # before the database is read
    doc = do_export(name, db)
    if out == "-":
        from edgeopt.jsonsafe import dumps

        click.echo(dumps(doc, indent=1))
    else:
        write_export(doc, out)
        click.echo(f"{name}: {len(doc['entries'])} entr{'y' if len(doc['entries']) == 1 else 'ies'} -> {out}",
                   err=True)
    return 0


@command.command("import")
@click.argument("file", type=click.Path())
@click.option("--name", default=None, help="Store under this name (default: the file's).")
@click.option("--force", is_flag=True, help="Replace entries the name already has.")
@DB
@JSON
def import_(file, name, force, db, as_json) -> int:
    """Load an exported baseline FILE into the database."""
    from edgeopt.commands import emit_json
    from edgeopt.hil.baseline import import_file

    res = import_file(file, db, name, force)
    if as_json:
        emit_json(res, "baseline-import")
    else:
        click.echo(f"{res['name']}: {len(res['entries'])} entr{'y' if len(res['entries']) == 1 else 'ies'} imported"
                   + (f" (replaced {', '.join(res['replaced'])})" if res["replaced"] else ""))
    return 0
