#!/usr/bin/env python3
"""Print the table of every CLI flag (Markdown), made from the click commands themselves.

    .venv/bin/python scripts/flag_table.py > /tmp/flags.md   # then paste it under docs/ARCHITECTURE.md "Every flag"

Per command: each visible flag with its short form, the keyword of its ``edgeopt`` function (the same name:
tests/cli/test_api_walk.py holds that), and the first sentence of its help. Hidden old spellings are listed
last in their row (they still work, with a deprecation line).
"""

from __future__ import annotations

import click

import edgeopt
from edgeopt.cli import walk_commands

# as in tests/cli/test_api_walk.py
FUNCTION = {"targets": "list_targets", "rollout start": "rollout", "devices gc": "gc", "debug": "debug_layers",
            "worker": "start_worker"}


def _api_keyword(path: str, kw: str) -> str:
    """The keyword as the API spells it, or what stands in for it."""
    if (path, kw) == ("bench", "find_max_qps"):
        return "`edgeopt.find_max_qps()`"
    fn = getattr(edgeopt, FUNCTION.get(path, path.replace("-", "_").replace(" ", "_")), None)
    kws = fn.keywords() if fn is not None and hasattr(fn, "keywords") else None
    name = {"from": "source"}.get(kw, kw)
    if fn is None or (kws is not None and name not in kws):
        return "— (CLI only)"
    return f"`{name}`"




def _first(text: str | None, limit: int = 110) -> str:
    import re

    t = " ".join((text or "").split())
    m = re.search(r"(?<!e\.g)(?<!i\.e)(?<!etc)\.\s+(?=[A-Z`\[])", t)
    t = t if m is None else t[:m.start() + 1]
    return (t if len(t) <= limit else t[:limit - 1].rsplit(" ", 1)[0] + "…").replace("|", "\\|")


def rows() -> list[str]:
    out = ["| command | flag | API keyword | what |", "|---|---|---|---|"]
    for path, c in walk_commands():
        shown = [p for p in c.params if not getattr(p, "hidden", False)]
        old = [o for p in c.params if getattr(p, "hidden", False) for o in p.opts]
        for p in shown:
            if isinstance(p, click.Argument):
                flag, kw = p.name.upper(), p.name
            else:
                longs = [o for o in p.opts if o.startswith("--")]
                flag = ", ".join(p.opts + list(p.secondary_opts))
                kw = longs[0][2:].replace("-", "_") if longs else p.name
                if kw in ("json", "verbose", "quiet"):
                    continue  # on every command: said once above the table
            out.append(f"| {' '.join(path)} | `{flag}` | {_api_keyword(' '.join(path), kw)} | "
                       f"{_first(getattr(p, 'help', None))} |")
        if old:
            out.append(f"| {' '.join(path)} | old: {', '.join(f'`{o}`' for o in old)} | | still taken (hidden) |")
    return out


if __name__ == "__main__":
    print("\n".join(rows()))
