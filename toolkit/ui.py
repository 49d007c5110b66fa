"""Plain-text output helpers: progress lines on stderr, tables on stdout (no heavy deps)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any


def terminal_width() -> int | None:
    """COLUMNS when set, the terminal's width on a terminal, else None (a pipe or file: no limit)."""
    import os
    import shutil

    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]], drop: list[str] | None = None,
          width: int | None = None) -> str:
    """Render rows as an aligned text table; ``columns`` is [(key, header)]. When it is wider than the
    terminal (``width``, default COLUMNS), the keys in ``drop`` go first, in that order, and a last
    line says which."""
    width = terminal_width() if width is None else width
    columns = list(columns)
    hidden: list[str] = []

    def render(cols: list[tuple[str, str]]) -> list[str]:
        cells = [[h for _, h in cols]] + [["" if r.get(k) is None else str(r.get(k)) for k, _ in cols] for r in rows]
        widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return lines

    lines = render(columns)
    for key in drop or []:
        if width is None or max(len(ln) for ln in lines) <= width:
            break
        gone = [c for c in columns if c[0] == key]
        if gone:
            columns.remove(gone[0])
            hidden.append(gone[0][1])
            lines = render(columns)
    if hidden:
        lines.append(f"({len(hidden)} column(s) hidden to fit {width} columns: {', '.join(hidden)}; "
                     "--format md/csv/json has them all)")
    return "\n".join(lines)


def clip(text: object, limit: int = 200) -> str:
    """``text`` on one line, at most ``limit`` characters, cut at a word boundary with an ellipsis (never
    mid-word: a reason cut at "permissi" reads as another word)."""
    t = " ".join(str(text).split())
    if len(t) <= limit:
        return t
    cut = t[:limit - 1]
    space = cut.rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:-(") + "…"


def size(n: int | float | None) -> str:
    """Bytes for people: ``1446647`` -> ``1.4 MB`` (decimal units, as ``ls -h --si`` and download meters)."""
    if n is None:
        return "-"
    v = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if abs(v) < 1000 or unit == "GB":
            return f"{int(v)} B" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1000
    return f"{v:.1f} GB"


def stderr_progress(quiet: bool = False) -> Callable[[str], None]:
    start = time.monotonic()

    def emit(msg: str) -> None:
        if not quiet:
            print(f"[{time.monotonic() - start:6.1f}s] {msg}", file=sys.stderr, flush=True)

    return emit


def fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return ""
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"
