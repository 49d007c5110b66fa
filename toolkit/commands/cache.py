"""``edgeopt cache list|clean``: the build cache, which otherwise grows without bound."""

from __future__ import annotations

import click

from . import emit_json
from ._common import CONTEXT, examples, json_option, ns, verbosity


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _age(s: float) -> str:
    return f"{s / 86400:.1f} d" if s >= 86400 else f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min"


@click.group("cache", context_settings=CONTEXT, short_help="List or clean the build cache.",
             epilog=examples("""\
examples:
  edgeopt cache list
  edgeopt cache clean --older-than 30d
  edgeopt cache clean --max-size 5G --dry-run
  edgeopt cache clean --all

The cache lives in $EDGEOPT_CACHE_DIR, or ~/.cache/edgeopt."""))
def command() -> None:
    """The build cache: one entry per (model, target, precision, options, data, toolchain) built, and
    the remembered outcome of builds that failed their check."""


@command.command("list", context_settings=CONTEXT)
@json_option
@verbosity
def list_command(**kw) -> int:
    """Every cache entry, newest first, with its size and age."""
    from edgeopt.cache import entries
    from edgeopt.pipeline import cache_dir
    from edgeopt.ui import table

    args = ns(**kw)
    items = entries()
    if args.json:
        emit_json({"root": str(cache_dir()), "entries": [e.as_dict() for e in items],
                   "size_bytes": sum(e.size_bytes for e in items)}, "cache")
        return 0
    rows = [{**e.as_dict(), "size": _mb(e.size_bytes), "age": _age(e.age_s), "key": e.key[:12]} for e in items]
    click.echo(table(rows, [("key", "key"), ("kind", "kind"), ("model", "model"), ("target", "target"),
                            ("precision", "precision"), ("size", "size"), ("age", "age")]))
    click.echo(f"{len(items)} entr{'y' if len(items) == 1 else 'ies'}, {_mb(sum(e.size_bytes for e in items))} "
               f"in {cache_dir()}")
    return 0


@command.command("clean", context_settings=CONTEXT)
@click.option("--older-than", metavar="SPAN", help="Remove entries not written for this long (12h, 7d, 2w).")
@click.option("--max-size", metavar="SIZE", help="Remove the oldest entries until the cache fits (500M, 5G).")
@click.option("--all", "all_", is_flag=True, help="Remove everything.")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@json_option
@verbosity
def clean_command(**kw) -> int:
    """Remove cache entries (bundles already copied to a --dist folder are not touched)."""
    from edgeopt.cache import clean

    args = ns(**kw)
    res = clean(args.older_than, args.max_size, args.all_, args.dry_run)
    if args.json:
        emit_json(res, "cache-clean")
        return 0
    verb = "would remove" if args.dry_run else "removed"
    click.echo(f"{verb} {len(res['removed'])} entr{'y' if len(res['removed']) == 1 else 'ies'} "
               f"({_mb(res['freed_bytes'])}); {res['left']} left ({_mb(res['left_bytes'])})")
    return 0
