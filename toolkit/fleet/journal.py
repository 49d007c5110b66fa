"""The rollout journal: every step of every device, written as it happens, in the results DB's file.

``rollouts`` holds one row per rollout (its plan and options, its status); ``rollout_events`` one row
per step (rollout, wave, device, step, status, figures, bundle ids before/after).  Each event is also
handed to a listener (JSON lines on ``--events FILE`` or stdout), so other tools can follow a rollout.
Secrets never reach it: devices are written with ``Device.public()``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeopt.errors import UsageError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    id TEXT PRIMARY KEY, time TEXT NOT NULL, model TEXT, status TEXT NOT NULL, json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rollout_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id TEXT NOT NULL, time TEXT NOT NULL, wave INTEGER,
    device TEXT, step TEXT NOT NULL, status TEXT NOT NULL, json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rollout_events_key ON rollout_events (rollout_id, device, seq);
"""


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Journal:
    def __init__(self, path: str | Path, listener: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.path = str(path)
        self._conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
        self._conn.executescript(_SCHEMA)
        self._lock = threading.Lock()
        self.listener = listener

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def create(self, rollout_id: str, model: str, spec: dict[str, Any]) -> None:
        with self._lock:
            self._conn.execute("INSERT INTO rollouts (id, time, model, status, json) VALUES (?,?,?,?,?)",
                               (rollout_id, now_iso(), model, "running", json.dumps(spec, default=str)))
            self._conn.commit()

    def set_status(self, rollout_id: str, status: str, extra: dict[str, Any] | None = None) -> None:
        with self._lock:
            row = self._conn.execute("SELECT json FROM rollouts WHERE id=?", (rollout_id,)).fetchone()
            spec = json.loads(row[0]) if row else {}
            if extra:
                spec.update(extra)
            self._conn.execute("UPDATE rollouts SET status=?, json=? WHERE id=?",
                               (status, json.dumps(spec, default=str), rollout_id))
            self._conn.commit()
        self.event(rollout_id, None, None, "rollout", status, extra or {})

    def event(self, rollout_id: str, wave: int | None, device: str | None, step: str, status: str,
              data: dict[str, Any] | None = None) -> dict[str, Any]:
        ev = {"rollout_id": rollout_id, "time": now_iso(), "wave": wave, "device": device, "step": step,
              "status": status, **(data or {})}
        with self._lock:
            self._conn.execute("INSERT INTO rollout_events (rollout_id, time, wave, device, step, status, json) "
                               "VALUES (?,?,?,?,?,?,?)", (rollout_id, ev["time"], wave, device, step, status,
                                                          json.dumps(ev, default=str)))
            self._conn.commit()
        if self.listener:
            self.listener(ev)
        return ev

    def rollout(self, rollout_id: str) -> dict[str, Any]:
        row = self._conn.execute("SELECT id, time, model, status, json FROM rollouts WHERE id=?",
                                 (rollout_id,)).fetchone()
        if row is None:
            ids = [r[0] for r in self._conn.execute("SELECT id FROM rollouts ORDER BY time DESC LIMIT 5")]
            raise UsageError(f"no rollout {rollout_id!r} in {self.path}",
                             hint=("recent: " + ", ".join(ids)) if ids else "no rollout has been started here")
        return {"id": row[0], "time": row[1], "model": row[2], "status": row[3], "spec": json.loads(row[4])}

    def events(self, rollout_id: str) -> list[dict[str, Any]]:
        return [json.loads(r[0]) for r in self._conn.execute(
            "SELECT json FROM rollout_events WHERE rollout_id=? ORDER BY seq", (rollout_id,))]

    def last_seq(self) -> int:
        return int(self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM rollout_events").fetchone()[0])

    def forward(self, rollout_id: str, after_seq: int, devices: set[str]) -> int:
        """Hand to the listener the events other processes (an engine's per-device steps) wrote for
        ``devices`` since ``after_seq``; returns the new last seq."""
        rows = self._conn.execute("SELECT seq, json FROM rollout_events WHERE rollout_id=? AND seq>? ORDER BY seq",
                                  (rollout_id, after_seq)).fetchall()
        for _, js in rows:
            ev = json.loads(js)
            if self.listener and ev.get("device") in devices and ev.get("step") != "ansible":
                self.listener(ev)
        return rows[-1][0] if rows else after_seq

    def device_states(self, rollout_id: str) -> dict[str, dict[str, Any]]:
        """The last outcome per device: {device: {"status", "step", "wave", "before", "after"}}."""
        out: dict[str, dict[str, Any]] = {}
        for ev in self.events(rollout_id):
            if ev.get("device") and ev["step"] == "device":
                out[ev["device"]] = ev
        return out
