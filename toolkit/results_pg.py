"""The results database on a PostgreSQL server that every rig writes to (``--db postgresql://user@host/db``),
through SQLAlchemy Core and psycopg 3 (``pip install 'edgeopt[results]'``; imported only here).

The schema and its migrations are ``edgeopt.results_schema``'s (the same as the SQLite file's); they run
under an advisory lock in one transaction, so rigs opening a fresh database at once migrate it once.
Each record is inserted once (``INSERT … ON CONFLICT (record_key) DO NOTHING``); a write that fails on a
dropped connection is retried on a fresh one (a retry of a record that did land is found, not doubled).

**The spool.** A rig that cannot reach the server keeps writing: its records go to the local spool (the
embedded SQLite, ``results_url.spool_path``) with one line on stderr; the next command that reaches the
server, or ``edgeopt results sync``, uploads them (each once) and empties the spool. Wrong credentials,
an unknown database or a newer schema are not spooled: they are bad input (exit 2), said before anything
is measured.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

from edgeopt.errors import DeviceError, MissingDependency, UsageError
from edgeopt.results import ResultsDB, _edgeopt_version, insert_once, prepare
from edgeopt.results_schema import MIGRATIONS_TABLE, SCHEMA_VERSION, identity_of, migrate, stored_version
from edgeopt.results_url import mask, parse

_LOCK_KEY = 4_301_843  # pg_advisory_xact_lock: one migrating rig at a time
RETRIES = 5  # a dropped connection: 5 tries over ~6 s (0.2, 0.4, 0.8, 1.6, 3.2 s apart)
_BAD_INPUT = ("password authentication failed", "no password supplied", "does not exist", "permission denied",
              "authentication failed", "pg_hba.conf", "invalid sslmode", "invalid connection option",
              "certificate", "sslmode value")



def _dropped(exc: BaseException) -> bool:
    """A connection that was made and then dropped (terminated by an administrator, closed by a restarting
    server) -- worth a fresh one at once; not a server that refuses or cannot be reached at all."""
    text = str(getattr(exc, "orig", None) or exc).lower()
    return bool(getattr(exc, "connection_invalidated", False)) or any(
        w in text for w in ("terminating connection", "closed the connection", "server closed", "connection lost",
                            "consuming input failed"))

class _PgRows:
    dialect = "postgresql"

    def __init__(self, conn) -> None:
        self.conn = conn

    def run(self, sql: str, args: tuple | list = ()) -> None:
        self.conn.exec_driver_sql(sql.replace("%", "%%").replace("?", "%s"), tuple(args))

    def rows(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        res = self.conn.exec_driver_sql(sql.replace("%", "%%").replace("?", "%s"), tuple(args))
        return [tuple(r) for r in res.fetchall()] if res.returns_rows else []


def _why(exc: BaseException) -> str:
    """The driver's own first line, without SQLAlchemy's wrapping (and never a password)."""
    orig = getattr(exc, "orig", None) or exc
    text = " ".join(str(orig).split()) or type(orig).__name__
    return mask(text.split(" (Background on this error")[0])[:300]


def _is_bad_input(exc: BaseException) -> bool:
    text = _why(exc).lower()
    return any(s in text for s in _BAD_INPUT)


class PgResultsDB(ResultsDB):
    """``ResultsDB`` on PostgreSQL (made by ``ResultsDB(url)``). ``create=False`` (a reading command): an
    unreachable server is exit 4. ``create=True`` (a writing command): an unreachable server spools."""

    def __init__(self, path: str | Path | None = None, create: bool = True) -> None:
        spec = parse(path)
        self.spec, self.path, self.shown = spec, spec.path, spec.shown
        self._lock = threading.Lock()
        self.unsaved: list[dict[str, Any]] = []
        self.write_error: str | None = None
        self.duplicates = 0
        self.spooled = 0
        self.synced = 0  # records uploaded from the spool by this object (on open and by sync)
        self.sync_duplicates = 0
        self.retries = 0  # writes and reads repeated on a fresh connection after a dropped one
        self.offline: str | None = None  # why the server could not be reached (records then go to the spool)
        self._spool: ResultsDB | None = None
        try:
            import sqlalchemy as sa
        except ImportError:
            raise MissingDependency("--db postgresql://… needs SQLAlchemy and psycopg 3",
                                    hint="pip install 'edgeopt[results]'") from None
        self._sa = sa
        self._engine = sa.create_engine(spec.url, pool_pre_ping=True, pool_size=2, max_overflow=2,
                                        connect_args={"connect_timeout": 10, "application_name": "edgeopt"})
        try:
            for attempt in range(RETRIES):
                try:
                    self._migrate()
                    break
                except sa.exc.DBAPIError as exc:  # a connection dropped while opening (a server restarting, an
                    if attempt == RETRIES - 1 or not _dropped(exc):  # admin terminating it): a fresh one
                        raise
                    self.retries += 1
                    time.sleep(0.2 * 2 ** attempt)
        except sa.exc.DBAPIError as exc:
            self._engine.dispose()
            if _is_bad_input(exc):
                raise UsageError(f"the results server {self.shown} refused edgeopt: {_why(exc)}",
                                 hint="check the user and database in --db, and the password in PGPASSWORD or "
                                      "~/.pgpass") from None
            if not isinstance(exc, (sa.exc.OperationalError, sa.exc.InterfaceError)):
                raise DeviceError(f"the results server {self.shown} failed to open the results schema: "
                                  f"{_why(exc)}") from None
            if not create:
                raise DeviceError(f"the results server {self.shown} cannot be reached: {_why(exc)}",
                                  hint="start it or check the network" + (
                                      f"; {self.spool().count()} record(s) wait in the spool {self.path}"
                                      if self._spool_waiting() else "")) from None
            self.offline = _why(exc)
            print(f"edgeopt: the results server {self.shown} cannot be reached ({self.offline}): records go to "
                  f"the local spool {self.path}; `edgeopt results sync` uploads them", file=sys.stderr)
            return
        if self._spool_waiting():
            res = self.sync()
            if res["uploaded"] or res["duplicates"]:
                print(f"edgeopt: uploaded {res['uploaded']} spooled record(s) to {self.shown}"
                      + (f" ({res['duplicates']} were there already)" if res["duplicates"] else ""), file=sys.stderr)

    # --- schema -------------------------------------------------------------------------------------

    def _migrate(self) -> None:
        with self._engine.connect() as conn:
            db = _PgRows(conn)
            found = stored_version(db) if self._has_migrations(db) else 0
            conn.rollback()
            if found > SCHEMA_VERSION:
                raise UsageError(f"the results database {self.shown} was written by a newer edgeopt (schema "
                                 f"{found}; this one knows {SCHEMA_VERSION})", hint="upgrade edgeopt on this rig")
            if found == SCHEMA_VERSION:
                return
        with self._engine.begin() as conn:
            db = _PgRows(conn)
            db.run("SELECT pg_advisory_xact_lock(?)", (_LOCK_KEY,))
            # the table made (or found) under the lock, before reading it: a catalog lookup alone
            # (to_regclass) can miss a table another rig's migration committed while this one waited
            db.run(MIGRATIONS_TABLE)
            found = stored_version(db)
            if found > SCHEMA_VERSION:
                raise UsageError(f"the results database {self.shown} was written by a newer edgeopt (schema "
                                 f"{found})", hint="upgrade edgeopt on this rig")
            if found < SCHEMA_VERSION:
                migrate(db, _edgeopt_version(), found)

    @staticmethod
    def _has_migrations(db: _PgRows) -> bool:
        return bool(db.rows("SELECT to_regclass('schema_migrations')")[0][0])

    @property
    def schema_version(self) -> int:
        with self._engine.connect() as conn:
            return stored_version(_PgRows(conn))

    def close(self) -> None:
        self.export_added()
        self._engine.dispose()
        if self._spool is not None:
            self._spool.close()

    # --- writing ------------------------------------------------------------------------------------

    def spool(self) -> ResultsDB:
        """The local spool (a SQLite results database), opened on first use."""
        if self._spool is None:
            self._spool = ResultsDB(self.path)
            self._spool.export_after = False  # what it holds is exported by this object
        return self._spool

    def _spool_waiting(self) -> bool:
        if not self.path.is_file():
            return False
        try:
            return self.spool().count() > 0
        except UsageError:
            return False

    def add(self, record: dict[str, Any]) -> int:
        """Store one record once (see ``ResultsDB.add``); the row id on the server, 0 when it went to the spool."""
        ident = self.adopt_identity(record) if self.offline is None else identity_of(record)
        row, text, key = prepare(record, ident)
        with self._lock:
            if self.offline is None:
                err = None
                for attempt in range(RETRIES):
                    try:
                        with self._engine.begin() as conn:
                            rid, dup = insert_once(_PgRows(conn).rows, row, text, key)
                        self.duplicates += dup
                        self._note_added(record, ident, row[-2])
                        return rid
                    except self._sa.exc.DBAPIError as exc:
                        if not self._lost(exc):
                            raise
                        err = exc
                        self.retries += 1
                        time.sleep(0.2 * 2 ** attempt)
                self.offline = _why(err)
                print(f"edgeopt: the results server {self.shown} was lost ({self.offline}): records go to the "
                      f"local spool {self.path}; `edgeopt results sync` uploads them", file=sys.stderr)
            rid = self.spool().add(record)
            if rid < 0:  # the spool itself could not be written: save_unsaved keeps it as JSON
                self.unsaved += self.spool().unsaved[len(self.unsaved):]
                self.write_error = self.spool().write_error
                return -1
            self.spooled += 1
            self._note_added(record, ident, row[-2])
            return 0

    def sync(self, batch: int = 200) -> dict[str, int]:
        """Upload the spool's records (each once) and remove them from it: ``{"uploaded", "duplicates",
        "left"}``. A server lost meanwhile leaves the rest in the spool (DeviceError, exit 4)."""
        if self.offline is not None:
            raise DeviceError(f"the results server {self.shown} cannot be reached: {self.offline}",
                              hint=f"the spooled records stay in {self.path}; run `edgeopt results sync` again")
        out = {"uploaded": 0, "duplicates": 0, "left": 0}
        if not self.path.is_file():
            return out
        sp = self.spool()
        while True:
            rows = sp._rows("SELECT id, json, identity, rig FROM runs ORDER BY id LIMIT ?", (batch,))
            if not rows:
                break
            import json

            try:
                with self._engine.begin() as conn:
                    db = _PgRows(conn)
                    for _rid, text, ident, rig in rows:  # the identity and rig the spool kept
                        rec = json.loads(text)
                        row, text2, key = prepare(rec, {"id": ident} if ident else None, rig)
                        _, dup = insert_once(db.rows, row, text2, key)
                        out["duplicates" if dup else "uploaded"] += 1
            except self._sa.exc.DBAPIError as exc:
                out["left"] = sp.count()
                raise DeviceError(f"the results server {self.shown} was lost during the sync: {_why(exc)}",
                                  hint=f"{out['left']} record(s) stay in the spool {self.path}; run "
                                       "`edgeopt results sync` again (nothing is uploaded twice)") from None
            with sp._lock:
                sp._conn.execute(f"DELETE FROM runs WHERE id IN ({','.join('?' * len(rows))})",
                                 [r[0] for r in rows])
                sp._conn.commit()
        self.synced += out["uploaded"]
        self.sync_duplicates += out["duplicates"]
        return out

    # --- reading ------------------------------------------------------------------------------------

    def _rows(self, sql: str, args: list | tuple = ()) -> list[tuple]:
        if self.offline is not None:
            raise DeviceError(f"the results server {self.shown} cannot be reached: {self.offline}")
        for attempt in range(RETRIES):
            try:
                with self._engine.connect() as conn:
                    return _PgRows(conn).rows(sql, args)
            except self._sa.exc.DBAPIError as exc:
                if attempt == RETRIES - 1 or not self._lost(exc):
                    raise DeviceError(f"the results server {self.shown} failed a query: {_why(exc)}") from None
                self.retries += 1
                time.sleep(0.2 * 2 ** attempt)  # a dropped connection: a fresh one (a read is safe to repeat)
        raise AssertionError("unreachable")

    def _lost(self, exc: BaseException) -> bool:
        """Whether an error is the connection's (dropped, server restarting), worth a retry on a fresh one."""
        sa = self._sa
        return not _is_bad_input(exc) and bool(getattr(exc, "connection_invalidated", False) or isinstance(
            exc, (sa.exc.OperationalError, sa.exc.InterfaceError)))

