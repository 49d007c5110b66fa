"""``edgeopt targets``: the registry, built-in and user-defined."""

from __future__ import annotations

import click

from . import emit_json
from ._common import CONTEXT, config_option, examples, json_option, ns, verbosity


@click.command("targets", context_settings=CONTEXT, short_help="List the known targets and their backends.",
               epilog=examples("""\
examples:
  edgeopt targets
  edgeopt targets --config edgeopt.yaml --json"""))
@config_option
@json_option
@verbosity
def command(**kw) -> int:
    """List every target (built-in and from the config file), its backend, precisions, default
    precision, aliases, and whether it builds on this machine."""
    return run(ns(**kw))


def run(args) -> int:
    from edgeopt.targets.registry import ALIASES, all_targets, get_backend
    from edgeopt.ui import table

    specs = all_targets(args.config)
    rows = []
    for s in specs.values():
        why = get_backend(s.backend).available()
        aliases = [a for a, t in ALIASES.items() if t == s.name]
        rows.append({**s.as_dict(), "aliases": aliases, "builds_here": why is None, "why_not": why,
                     "precisions_s": ",".join(s.precisions), "alias_s": ",".join(aliases),
                     "here": "yes" if why is None else "no"})
    if args.json:
        emit_json([{k: v for k, v in r.items() if not k.endswith("_s") and k != "here"} for r in rows], "targets")
        return 0
    print(table(rows, [("name", "target"), ("backend", "backend"), ("precisions_s", "precisions"),
                       ("default_precision", "auto"), ("here", "builds here"), ("alias_s", "aliases"),
                       ("description", "description")]))
    return 0
