"""The build cache (``$EDGEOPT_CACHE_DIR`` or ``~/.cache/edgeopt``): list it, clean it.

Layout (written by ``edgeopt.pipeline``): ``<key[:2]>/<key>/`` a bundle, ``<key[:2]>/<key>.failed.json``
the remembered outcome of a build that failed its check.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edgeopt.errors import UsageError


@dataclass
class CacheEntry:
    key: str
    kind: str  # bundle | failure
    model: str
    target: str
    precision: str
    size_bytes: int
    age_s: float
    path: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def entries(root: Path | None = None) -> list[CacheEntry]:
    """Everything in the cache, newest first."""
    from edgeopt.pipeline import cache_dir

    root = Path(root or cache_dir())
    out: list[CacheEntry] = []
    now = time.time()
    for shard in sorted(root.iterdir()) if root.is_dir() else []:
        if not (shard.is_dir() and re.fullmatch(r"[0-9a-f]{2}", shard.name)):
            continue
        for p in shard.iterdir():
            kind = "failure" if p.name.endswith(".failed.json") else "bundle" if p.is_dir() else None
            if kind is None:
                continue
            man: dict[str, Any] = {}
            try:
                if kind == "bundle":
                    man = json.loads((p / "manifest.json").read_text())
                else:
                    man = json.loads(p.read_text()).get("manifest") or {}
            except (OSError, ValueError, AttributeError):
                man = {}
            out.append(CacheEntry(p.name.split(".")[0], kind, str(man.get("model", {}).get("name", "?")
                                                                  if isinstance(man.get("model"), dict)
                                                                  else man.get("model", "?")),
                                  str(man.get("target", "?")), str(man.get("precision", "?")), _size(p),
                                  now - p.stat().st_mtime, str(p)))
    return sorted(out, key=lambda e: e.age_s)


SPAN = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?", re.I)


def parse_span(text: str) -> float:
    m = SPAN.fullmatch(text.strip().lower())
    if not m:
        raise UsageError(f"expected a span like 12h, 7d or 2w, got {text!r}")
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]


def parse_size(text: str) -> int:
    m = SIZE.fullmatch(text.strip())
    if not m:
        raise UsageError(f"expected a size like 500M or 5G, got {text!r}")
    return int(float(m.group(1)) * 1024 ** " kmgt".index((m.group(2) or " ").lower()))


def clean(older_than: str | None = None, max_size: str | None = None, all_: bool = False,
          dry_run: bool = False, root: Path | None = None) -> dict[str, Any]:
    """Remove cache entries: every one (``all_``), those older than a span, and/or the oldest until the
    cache fits ``max_size``. Returns what was (or would be) removed."""
    if not (all_ or older_than or max_size):
        raise UsageError("say what to clean: --all, --older-than SPAN or --max-size SIZE")
    items = entries(root)
    doomed: dict[str, CacheEntry] = {}
    if all_:
        doomed = {e.path: e for e in items}
    if older_than:
        limit = parse_span(older_than)
        doomed.update({e.path: e for e in items if e.age_s > limit})
    if max_size:
        cap = parse_size(max_size)
        kept = [e for e in items if e.path not in doomed]  # newest first
        total = 0
        for e in kept:
            total += e.size_bytes
            if total > cap:
                doomed[e.path] = e
    if not dry_run:
        for e in doomed.values():
            p = Path(e.path)
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
    left = [e for e in items if e.path not in doomed]
    return {"removed": [e.as_dict() for e in doomed.values()], "freed_bytes": sum(e.size_bytes for e in doomed.values()),
            "left": len(left), "left_bytes": sum(e.size_bytes for e in left), "dry_run": dry_run}
