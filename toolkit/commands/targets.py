"""``edgeopt targets``: the registry, built-in and user-defined."""

from __future__ import annotations

import argparse

from . import emit_json


def add_parser(sub) -> None:
    p = sub.add_parser("targets", help="list the known targets and their backends",
                       description="List every target (built-in and from the config file), its backend, "
                                   "precisions, default precision, and whether it builds on this machine.")
    p.add_argument("--json", action="store_true")
    p.add_argument("--config", help="config file with user-defined targets (default ./edgeopt.yaml)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
        emit_json([{k: v for k, v in r.items() if not k.endswith("_s") and k != "here"} for r in rows])
        return 0
    print(table(rows, [("name", "target"), ("backend", "backend"), ("precisions_s", "precisions"),
                       ("default_precision", "auto"), ("here", "builds here"), ("alias_s", "aliases"),
                       ("description", "description")]))
    return 0
