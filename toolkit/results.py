"""The results database: SQLite, one row per (device, bundle) run with its full JSON.

Columns hold what queries filter and sort on (model, target, precision, device, status, time and a
few headline numbers); ``json`` holds the whole record (bench reply, probe, push, error), so nothing
measured is ever lost to a schema.  Failed runs are rows too.  Times are ISO 8601 UTC strings, which
sort as text.  Only standard JSON is stored (``edgeopt.jsonsafe``: NaN/Infinity become null with a
``<key>_null_reason``); a row that cannot be read back (written by an older edgeopt, or damaged) is
skipped with one line on stderr, never the whole query.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

from edgeopt.errors import UsageError
from edgeopt.jsonsafe import clean, dumps

DEFAULT_DB = "edgeopt-results.db"
SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    time TEXT NOT NULL,
    model TEXT, target TEXT, precision TEXT, backend TEXT,
    device TEXT NOT NULL, bundle_id TEXT,
    status TEXT NOT NULL, error TEXT,
    p50_ms REAL, throughput_ips REAL, accuracy_passed INTEGER,
    json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_key ON runs (model, target, precision, device, time);
CREATE INDEX IF NOT EXISTS runs_time ON runs (time);
CREATE INDEX IF NOT EXISTS runs_device ON runs (device, time);
"""
FILTERS = ("model", "target", "precision", "device", "status", "run_id")


class ResultsDB:
    """Append records, query them back. Safe to share between threads (one lock)."""

    def __init__(self, path: str | Path = DEFAULT_DB, create: bool = True) -> None:
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise UsageError(f"no results database at {str(self.path)!r}",
                             hint="run `edgeopt bench` or `edgeopt run` first, or pass --db")
        try:
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise UsageError(f"{self.path} was written by a newer edgeopt (schema {version})",
                                 hint="upgrade edgeopt, or use another --db")
            self._conn.executescript(_SCHEMA)
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._conn.commit()
        except sqlite3.DatabaseError as exc:
            raise UsageError(f"{str(self.path)!r} is not a usable results database: {exc}") from None
        self._lock = threading.Lock()

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ResultsDB:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def add(self, record: dict[str, Any]) -> int:
        """Store one record (``RunRecord.as_dict()``); returns its row id."""
        b, bench = record.get("bundle") or {}, record.get("bench") or {}
        acc = (bench.get("accuracy") or {}).get("passed")
        err = record.get("error") or None
        row = (record["run_id"], record["time"], b.get("model"), b.get("target"), b.get("precision"),
               b.get("backend"), (record.get("device") or {}).get("name"), b.get("bundle_id"), record["status"],
               dumps(err, default=str) if err else None, _finite((bench.get("latency_ms") or {}).get("p50")),
               _finite(bench.get("throughput_ips")), None if acc is None else int(bool(acc)),
               dumps(record, default=str))
        with self._lock:
            cur = self._conn.execute(
                "INSERT INTO runs (run_id, time, model, target, precision, backend, device, bundle_id, status, "
                "error, p50_ms, throughput_ips, accuracy_passed, json) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", row)
            self._conn.commit()
            return int(cur.lastrowid)

    def query(self, model: str | None = None, target: str | None = None, precision: str | None = None,
              device: str | None = None, status: str | None = None, run_id: str | None = None,
              since: str | None = None, latest: bool = False) -> list[dict[str, Any]]:
        """Records matching every filter given (``since``: ISO date/time or ``30m``/``12h``/``7d`` ago), oldest
        first; ``latest`` keeps the newest of each (model, target, precision, device, batch), bench runs and
        gate verdicts (``status`` ``gate-*``) apart."""
        where, args = [], []
        for col, val in (("model", model), ("target", target), ("precision", precision), ("device", device),
                         ("status", status), ("run_id", run_id)):
            if val:
                vals = [v.strip() for v in str(val).split(",") if v.strip()]
                where.append(f"{col} IN ({','.join('?' * len(vals))})")
                args += vals
        if since:
            where.append("time >= ?")
            args.append(parse_since(since))
        cond = ("WHERE " + " AND ".join(where)) if where else ""
        sql = f"SELECT id, json, model, target, precision, device, status FROM runs {cond} ORDER BY time, id"
        with self._lock:
            rows = self._conn.execute(sql, args).fetchall()
        out: list[tuple[tuple, dict[str, Any]]] = []
        for row_id, text, *cols in rows:
            try:
                rec = json.loads(text)
                if not isinstance(rec, dict):
                    raise ValueError(f"a JSON {type(rec).__name__}, not an object")
            except (ValueError, TypeError) as exc:
                print(f"edgeopt: {self.path}: skipped row {row_id}, which cannot be read ({str(exc)[:120]})",
                      file=sys.stderr)
                continue
            batch = ((rec.get("bench") or {}).get("inputs") or {}).get("batch") if isinstance(rec.get("bench"), dict) \
                else None
            key = (*cols[:4], 1 if batch is None else batch, str(cols[4] or "").startswith("gate-"))
            out.append((key, clean(rec)))  # a NaN an older edgeopt stored comes back as null with its reason
        if latest:
            # the newest bench run and the newest gate verdict of each (model, target, precision, device,
            # batch): a gate does not hide a bench. Done here, not in SQL: SQLite's json_extract fails the
            # whole query on one row an older edgeopt wrote with a bare NaN ("malformed JSON"), and a
            # damaged newest row must not hide the last good one.
            newest = {}
            for i, (key, _rec) in enumerate(out):
                newest[_hashable(key)] = i
            keep = set(newest.values())
            return [rec for i, (_key, rec) in enumerate(out) if i in keep]
        return [rec for _key, rec in out]

    def count(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0])


def _hashable(key: tuple) -> tuple:
    return tuple(json.dumps(k, sort_keys=True, default=str) if isinstance(k, (dict, list)) else k for k in key)


def _finite(x: Any) -> Any:
    """A headline column value: a non-finite float is stored as NULL."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def parse_since(text: str) -> str:
    """``2025-01-31``, ``2025-01-31T12:00``, or a span ago (``45m``, ``12h``, ``7d``, ``2w``) -> ISO UTC."""
    text = text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", text)
    if m:
        secs = float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]
        t = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(seconds=secs)
    else:
        try:
            t = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise UsageError(f"bad --since {text!r}", hint="use a date (2025-01-31), a time (2025-01-31T12:00) "
                                                            "or a span ago (45m, 12h, 7d)") from None
        if t.tzinfo is None:
            t = t.replace(tzinfo=_dt.timezone.utc)
    return t.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
