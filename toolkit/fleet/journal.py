"""The rollout journal: every step of every device, written as it happens, in the results DB's file.

``rollouts`` holds one row per rollout (its plan and options, its status); ``rollout_events`` one row
per step (rollout, wave, device, step, status, figures, bundle ids before/after).  Each event is also
handed to a listener (JSON lines on ``--events FILE`` or stdout), so other tools can follow a rollout.
Secrets never reach it: devices are written with ``Device.public()``.

``rollout_hosts`` holds the process running a rollout (host name, pid, a heartbeat every few seconds):
``rollout status`` tells a rollout whose host died (``stale``) from one still running.  The bundles a
rollout plans are kept beside the journal (``<db>.rollouts/<id>/<bundle id>/``: hard links where the
filesystem allows, copies otherwise) so a resume installs exactly the planned bundles, whatever the
bundle paths hold by then; they are removed when the rollout is done or halted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeopt.errors import DeviceError, UsageError
from edgeopt.jsonsafe import dumps


class FleetBusy(DeviceError):
    """Another running rollout holds some of these devices (exit 4; the message names it)."""

HEARTBEAT_S = 5.0  # how often a running rollout's host writes its heartbeat
FLUSH_S = 0.1  # while a rollout runs, its events are committed in groups at most this often (see start_heartbeat)
STALE_AFTER_S = 120.0  # a heartbeat older than this: the host process is gone, stopped or cut off

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    id TEXT PRIMARY KEY, time TEXT NOT NULL, model TEXT, status TEXT NOT NULL, json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rollout_events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, rollout_id TEXT NOT NULL, time TEXT NOT NULL, wave INTEGER,
    device TEXT, step TEXT NOT NULL, status TEXT NOT NULL, json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS rollout_events_key ON rollout_events (rollout_id, device, seq);
CREATE TABLE IF NOT EXISTS fleet_locks (
    rollout_id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, since REAL NOT NULL,
    devices TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rollout_hosts (
    rollout_id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, started REAL NOT NULL,
    heartbeat REAL NOT NULL
);
"""


_INSERT = ("INSERT INTO rollout_events (rollout_id, time, wave, device, step, status, json) "
           "VALUES (?,?,?,?,?,?,?)")


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Journal:
    def __init__(self, path: str | Path, listener: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.path = str(path)
        self._conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
        self._conn.executescript(_SCHEMA)
        self._lock = threading.Lock()
        self.listener = listener
        self._beat: tuple[threading.Thread, threading.Event] | None = None
        self._grouped = False  # events written by the heartbeat thread in groups, not one by one
        self._pending = 0
        self._queue: list[tuple] = []  # events not yet written (grouped mode), in order
        self._qlock = threading.Lock()

    def close(self) -> None:
        self.stop_heartbeat()
        self._conn.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def create(self, rollout_id: str, model: str, spec: dict[str, Any]) -> None:
        with self._lock:
            self._conn.execute("INSERT INTO rollouts (id, time, model, status, json) VALUES (?,?,?,?,?)",
                               (rollout_id, now_iso(), model, "running", dumps(spec, default=str)))
            self._conn.commit()

    def set_status(self, rollout_id: str, status: str, extra: dict[str, Any] | None = None,
                   event: bool = True) -> None:
        with self._lock:
            self._flush_locked()  # the events before this status are in the file before it
            row = self._conn.execute("SELECT json FROM rollouts WHERE id=?", (rollout_id,)).fetchone()
            spec = json.loads(row[0]) if row else {}
            if extra:
                spec.update(extra)
            self._conn.execute("UPDATE rollouts SET status=?, json=? WHERE id=?",
                               (status, dumps(spec, default=str), rollout_id))
            self._conn.commit()
        if event:
            self.event(rollout_id, None, None, "rollout", status, extra or {})

    def event(self, rollout_id: str, wave: int | None, device: str | None, step: str, status: str,
              data: dict[str, Any] | None = None) -> dict[str, Any]:
        ev = {"rollout_id": rollout_id, "time": now_iso(), "wave": wave, "device": device, "step": step,
              "status": status, **(data or {})}
        row = (rollout_id, ev["time"], wave, device, step, status, dumps(ev, default=str))
        with self._qlock:
            grouped = self._grouped
            if grouped:  # the heartbeat thread writes it within FLUSH_S; no worker waits for a commit
                self._queue.append(row)
        if not grouped:
            with self._lock:
                self._conn.execute(_INSERT, row)
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

    def rollouts(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest rollouts first: id, time, model, status (as journalled)."""
        rows = self._conn.execute("SELECT id, time, model, status FROM rollouts ORDER BY time DESC LIMIT ?",
                                  (int(limit),)).fetchall()
        return [{"id": r[0], "time": r[1], "model": r[2], "status": r[3]} for r in rows]

    def events(self, rollout_id: str) -> list[dict[str, Any]]:
        self.flush()
        return [json.loads(r[0]) for r in self._conn.execute(
            "SELECT json FROM rollout_events WHERE rollout_id=? ORDER BY seq", (rollout_id,))]

    def last_seq(self) -> int:
        self.flush()
        return int(self._conn.execute("SELECT COALESCE(MAX(seq), 0) FROM rollout_events").fetchone()[0])

    def forward(self, rollout_id: str, after_seq: int, devices: set[str]) -> int:
        """Hand to the listener the events other processes (an engine's per-device steps) wrote for
        ``devices`` since ``after_seq``; returns the new last seq."""
        self.flush()
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

    def open_trials(self, rollout_id: str) -> dict[str, dict[str, Any]]:
        """Devices whose last step is a trial activation with no outcome after it: they serve the candidate
        unconfirmed, until the rollout commits it or their agent reverts it (``revert_at``)."""
        out: dict[str, dict[str, Any]] = {}
        for ev in self.events(rollout_id):
            dev = ev.get("device")
            if not dev:
                continue
            if ev["step"] == "activate" and ev["status"] == "trial":
                out[dev] = ev
            elif ev["step"] == "device":
                out.pop(dev, None)
        return out

    # --- the host running a rollout: pid and heartbeat ------------------------------------------------
    def start_heartbeat(self, rollout_id: str, every_s: float = HEARTBEAT_S, flush_s: float = FLUSH_S) -> None:
        """Record this process as the rollout's host and refresh its heartbeat every ``every_s`` seconds
        (a daemon thread) until ``stop_heartbeat``/``close``.

        Meanwhile events are committed by that thread in groups, every ``flush_s`` (and by ``set_status``):
        one commit (an fsync) per event, under the journal's lock, was the largest per-device cost of the
        host — ~24 ms each, 6 per device, serialised across every worker of the pool. An event reaches the
        file at most ``flush_s`` late; a host killed meanwhile loses at most that much, which a resume
        tells from the device itself (a device already on the candidate is "already")."""
        self.stop_heartbeat()
        now = time.time()
        with self._lock:
            self._conn.execute("INSERT OR REPLACE INTO rollout_hosts (rollout_id, host, pid, started, heartbeat) "
                               "VALUES (?,?,?,?,?)", (rollout_id, socket.gethostname(), os.getpid(), now, now))
            self._conn.commit()
            self._grouped = True
        stop = threading.Event()

        def beat() -> None:
            last = time.monotonic()
            while not stop.wait(flush_s):
                with contextlib.suppress(sqlite3.Error), self._lock:
                    if time.monotonic() - last >= every_s:
                        last = time.monotonic()
                        self._conn.execute("UPDATE rollout_hosts SET heartbeat=? WHERE rollout_id=? AND pid=?",
                                           (time.time(), rollout_id, os.getpid()))
                        self._pending += 1
                    self._flush_locked()

        t = threading.Thread(target=beat, name=f"rollout-heartbeat-{rollout_id}", daemon=True)
        t.start()
        self._beat = (t, stop)

    def _flush_locked(self) -> None:
        with self._qlock:
            rows, self._queue = self._queue, []
        if rows:
            self._conn.executemany(_INSERT, rows)
        if rows or self._pending:
            self._conn.commit()
            self._pending = 0

    def flush(self) -> None:
        """Write the queued events now (readers in this process see every event so far)."""
        with self._lock:
            self._flush_locked()

    def stop_heartbeat(self) -> None:
        if self._beat is not None:
            t, stop = self._beat
            stop.set()
            t.join(timeout=5)
            self._beat = None
        with self._lock:
            with self._qlock:
                self._grouped = False
            self._flush_locked()

    def host(self, rollout_id: str) -> dict[str, Any] | None:
        """The process that runs (or last ran) the rollout: host, pid, heartbeat age, and whether it is
        ``alive`` (True/False; None when it runs on another host and only its heartbeat can tell)."""
        row = self._conn.execute("SELECT host, pid, started, heartbeat FROM rollout_hosts WHERE rollout_id=?",
                                 (rollout_id,)).fetchone()
        if row is None:
            return None
        host, pid, started, heartbeat = row
        age = max(0.0, time.time() - float(heartbeat))
        alive: bool | None = None
        if host == socket.gethostname():
            alive = _pid_alive(int(pid))
        return {"host": host, "pid": int(pid), "started": started, "heartbeat_age_s": round(age, 1),
                "alive": alive, "stale": alive is False or age > STALE_AFTER_S}

    # --- one rollout per fleet at a time ---------------------------------------------------------------
    def claim(self, rollout_id: str, devices: list[str] | set[str]) -> None:
        """Take ``devices`` for this rollout, or refuse (``FleetBusy``) naming the rollout that holds any of
        them, its host, pid and since when.  Two rollouts of one fleet at once both gated every device under
        each other's load and both reported DONE.  A holder whose process is gone (same host: its pid; another
        host: no heartbeat for ``STALE_AFTER_S``) no longer holds anything.  Atomic: check and take in one
        ``BEGIN IMMEDIATE`` transaction, so two hosts starting at once cannot both win."""
        want = set(devices)
        with self._lock:
            self._flush_locked()
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                for rid, host, pid, since, devs in self._conn.execute(
                        "SELECT rollout_id, host, pid, since, devices FROM fleet_locks WHERE rollout_id != ?",
                        (rollout_id,)).fetchall():
                    shared = sorted(want & set(json.loads(devs)))
                    if not shared or not self._holder_alive(rid, host, int(pid), float(since)):
                        continue
                    self._conn.rollback()
                    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(since)))
                    raise FleetBusy(f"rollout {rid} (on {host}, pid {pid}, since {when}) is rolling out to "
                                    f"{', '.join(shared[:5])}{' …' if len(shared) > 5 else ''}: one rollout per "
                                    "device at a time (both would gate under each other's load)",
                                    hint=f"wait for it (`edgeopt rollout status {rid}`), or `edgeopt rollout "
                                         f"abort {rid}`")
                self._conn.execute("INSERT OR REPLACE INTO fleet_locks (rollout_id, host, pid, since, devices) "
                                   "VALUES (?,?,?,?,?)", (rollout_id, socket.gethostname(), os.getpid(),
                                                          time.time(), json.dumps(sorted(want))))
                self._conn.commit()
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.rollback()
                raise

    def release(self, rollout_id: str) -> None:
        """Give the devices back (the rollout ended, paused or this process stops)."""
        with self._lock:
            self._flush_locked()
            self._conn.execute("DELETE FROM fleet_locks WHERE rollout_id=? AND pid=?", (rollout_id, os.getpid()))
            self._conn.commit()

    def _holder_alive(self, rollout_id: str, host: str, pid: int, since: float) -> bool:
        if host == socket.gethostname():
            return _pid_alive(pid)
        row = self._conn.execute("SELECT heartbeat FROM rollout_hosts WHERE rollout_id=?", (rollout_id,)).fetchone()
        last = float(row[0]) if row else since
        return time.time() - last <= STALE_AFTER_S

    # --- the planned bundles, kept with the journal -------------------------------------------------
    def kept_dir(self, rollout_id: str) -> Path:
        return Path(self.path).parent / f"{Path(self.path).name}.rollouts" / rollout_id

    def keep_bundles(self, rollout_id: str, bundles: list) -> dict[str, str]:
        """A copy of each bundle (``deploy.LocalBundle``) under ``kept_dir``, checked by id: hard links for
        the payload where the filesystem allows (a rebuild that writes new files and renames them leaves
        the link on the old content), the manifest always copied. ``{bundle_id: kept path}``."""
        try:
            return self._keep(rollout_id, bundles)
        except OSError as exc:
            raise UsageError(f"cannot keep a copy of the planned bundles beside the journal in "
                             f"{self.kept_dir(rollout_id).parent}: {exc.strerror or exc}",
                             hint="give --db a file in a folder this user can write, with room for the bundles") \
                from None

    def _keep(self, rollout_id: str, bundles: list) -> dict[str, str]:
        from edgeopt.deploy import load_bundle

        base = self.kept_dir(rollout_id)
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        out: dict[str, str] = {}
        for b in {b.bundle_id: b for b in bundles}.values():
            dest = base / b.bundle_id
            if not dest.is_dir():
                tmp = base / f".tmp-{b.bundle_id}-{os.getpid()}"
                shutil.rmtree(tmp, ignore_errors=True)
                for rel, _size in b.files:
                    src, dst = Path(b.path) / rel, tmp / rel
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        os.link(src, dst)
                    except OSError:  # another filesystem, or links not allowed: a copy
                        shutil.copy2(src, dst)
                shutil.copy2(Path(b.path) / "manifest.json", tmp / "manifest.json")
                os.replace(tmp, dest)
            kept = load_bundle(dest)
            if kept.bundle_id != b.bundle_id:
                shutil.rmtree(dest, ignore_errors=True)
                raise UsageError(f"{b.path} changed while the rollout kept a copy of it (bundle {b.bundle_id[:12]} "
                                 f"became {kept.bundle_id[:12]})", hint="start the rollout again once the build is done")
            out[b.bundle_id] = str(dest)
        return out

    def drop_kept(self, rollout_id: str) -> None:
        """The rollout is over (done or halted): its kept bundles go."""
        d = self.kept_dir(rollout_id)
        shutil.rmtree(d, ignore_errors=True)
        with contextlib.suppress(OSError):
            d.parent.rmdir()  # only when no other rollout keeps anything


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (dead, not yet reaped by its parent) is gone for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return True
