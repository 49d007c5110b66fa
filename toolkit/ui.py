"""Plain-text output helpers: progress lines on stderr, tables on stdout (no heavy deps)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """Render rows as an aligned text table; ``columns`` is [(key, header)]."""
    cells = [[h for _, h in columns]] + [["" if r.get(k) is None else str(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


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
