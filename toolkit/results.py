"""The results database: one row per (device, bundle) run with its full JSON, in a SQLite file (the
embedded default) or on a PostgreSQL server that every rig writes to (``--db postgresql://…``,
``edgeopt.results_pg``).

Columns hold what queries filter and sort on (model, target, precision, device, status, time, a few
headline numbers, the machine ``identity``, the writing ``rig`` and the device's labels); ``json`` holds
the whole record (bench reply with its per-iteration samples, probe, push, error), so nothing measured is
ever lost to a schema. Failed runs are rows too. Each row has an idempotent ``record_key`` (run id, device,
bundle): a record written twice (a retry after a dropped connection, a spool uploaded again) is stored once.
The schema, its version and migrations are ``edgeopt.results_schema``'s, the same on both engines. The
database and the fan-out hand records around as dicts; the Python API hands them out typed
(``BenchRecord``, made by ``record_from_dict`` from a stored or freshly benched dict; ``to_dict()`` gives
the dict back as it was, the JSON the CLI prints). Times are ISO 8601 UTC strings, which sort as text.
Only standard JSON is stored (``edgeopt.jsonsafe``: NaN/Infinity become null with a
``<key>_null_reason``); a row that cannot be read back (written by an older edgeopt, or damaged) is
skipped with one line on stderr, never the whole query.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import json
import math
import os
import re
import socket
import sqlite3
import sys
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeopt.errors import UsageError
from edgeopt.jsonsafe import clean, dumps
from edgeopt.results_schema import (
    INSERT_COLUMNS,
    SCHEMA_VERSION,
    identity_of,
    labels_of,
    record_key,
    same_record,
)
from edgeopt.results_url import DEFAULT_DB, parse

__all__ = ["DEFAULT_DB", "SCHEMA_VERSION", "FILTERS", "ResultsDB", "parse_since", "record_from_dict"]
FILTERS = ("model", "target", "precision", "device", "status", "run_id", "identity", "rig", "label")
RIG_ENV = "EDGEOPT_RIG"
MLFLOW_ENV = "EDGEOPT_MLFLOW_URI"  # set: what a command stores is also logged to that MLflow server, on close


def rig_name() -> str:
    """The rig that writes a record: ``EDGEOPT_RIG``, else this host's name."""
    return os.environ.get(RIG_ENV) or socket.gethostname()


def prepare(record: dict[str, Any], identity: dict[str, Any] | None = None,
            rig: str | None = None) -> tuple[tuple, str, str]:
    """The row of a record (``INSERT_COLUMNS`` order), its JSON and its key. The JSON is the record as given
    (what ``--json`` printed); the machine identity (``identity``, else ``identity_of``) and the writing
    ``rig`` (else ``EDGEOPT_RIG``, else the host name) go to their columns (``query(annotate=True)`` puts
    them back on the record)."""
    ident = identity if identity is not None else identity_of(record)
    b, bench = record.get("bundle") or {}, record.get("bench") or {}
    acc = (bench.get("accuracy") or {}).get("passed")
    err = record.get("error") or None
    key, text = record_key(record), dumps(record, default=str)
    row = (record["run_id"], record["time"], b.get("model"), b.get("target"), b.get("precision"),
           b.get("backend"), (record.get("device") or {}).get("name"), b.get("bundle_id"), record["status"],
           dumps(err, default=str) if err else None, _finite((bench.get("latency_ms") or {}).get("p50")),
           _finite(bench.get("throughput_ips")), None if acc is None else int(bool(acc)), text,
           key, ident["id"] if ident else None, rig or str(record.get("rig") or "") or rig_name(), labels_of(record))
    return row, text, key


_INSERT = (f"INSERT INTO runs ({', '.join(INSERT_COLUMNS)}) VALUES ({', '.join('?' * len(INSERT_COLUMNS))}) "
           "ON CONFLICT (record_key) DO NOTHING RETURNING id")


def insert_once(rows, row: tuple, text: str, key: str) -> tuple[int, bool]:
    """Insert one prepared row exactly once; ``rows(sql, args)`` runs SQL (``?`` placeholders) in the caller's
    transaction and returns its rows. Returns (row id, whether it was there already). The same key with
    the same record is a retry (not stored again); the same key with another record (two records of one run,
    device and bundle that differ) is stored under ``key#2``, ``#3``…: nothing is dropped."""
    kpos = INSERT_COLUMNS.index("record_key")
    for n in range(1, 1000):
        k = key if n == 1 else f"{key}#{n}"
        got = rows(_INSERT, (*row[:kpos], k, *row[kpos + 1:]))
        if got:
            return int(got[0][0]), False
        have = rows("SELECT id, json FROM runs WHERE record_key = ?", (k,))
        if have and same_record(have[0][1], text):
            return int(have[0][0]), True
    raise RuntimeError(f"record key {key} taken 1000 times")


def where_of(model: str | None = None, target: str | None = None, precision: str | None = None,
             device: str | None = None, status: str | None = None, run_id: str | None = None,
             since: str | None = None, identity: str | None = None, rig: str | None = None,
             label: str | None = None, until: str | None = None) -> tuple[str, list]:
    """The WHERE clause (``?`` placeholders) of a query's filters: each comma-separated list is an IN;
    ``identity`` matches a prefix of the fingerprint; ``label`` any one of the labels given."""
    where: list[str] = []
    args: list[Any] = []
    for col, val in (("model", model), ("target", target), ("precision", precision), ("device", device),
                     ("status", status), ("run_id", run_id), ("rig", rig)):
        if val:
            vals = [v.strip() for v in str(val).split(",") if v.strip()]
            where.append(f"{col} IN ({','.join('?' * len(vals))})")
            args += vals
    if identity:
        vals = [v.strip() for v in str(identity).split(",") if v.strip()]
        where.append("(" + " OR ".join("identity LIKE ?" for _ in vals) + ")")
        args += [v.replace("%", "").replace("_", "") + "%" for v in vals]
    if label:
        vals = [v.strip() for v in str(label).split(",") if v.strip()]
        where.append("(" + " OR ".join("labels LIKE ?" for _ in vals) + ")")
        args += [f"%,{v.replace('%', '')},%" for v in vals]
    if since:
        where.append("time >= ?")
        args.append(parse_since(since))
    if until:
        where.append("time < ?")
        args.append(parse_since(until))
    return ("WHERE " + " AND ".join(where)) if where else "", args


class _SqliteRows:
    dialect = "sqlite"

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def run(self, sql: str, args: tuple | list = ()) -> None:
        self.conn.execute(sql, tuple(args))

    def rows(self, sql: str, args: tuple | list = ()) -> list[tuple]:
        return self.conn.execute(sql, tuple(args)).fetchall()


class ResultsDB:
    """Append records, query them back. Safe to share between threads (one lock). ``path``: a ``--db``
    (a file, ``sqlite:///…``, or ``postgresql://…``, which opens an ``edgeopt.results_pg.PgResultsDB``;
    None: ``EDGEOPT_DB``, else ``edgeopt-results.db``)."""

    def __new__(cls, path: str | Path | None = None, create: bool = True) -> ResultsDB:
        if cls is ResultsDB and parse(path).is_server:
            from edgeopt.results_pg import PgResultsDB

            return super().__new__(PgResultsDB)
        return super().__new__(cls)

    def __init__(self, path: str | Path | None = None, create: bool = True) -> None:
        spec = parse(path)
        self.path = spec.path
        self.shown = spec.shown
        self.duplicates = 0  # records add() found stored already (a retry)
        if not create and not self.path.is_file():
            raise UsageError(f"no results database at {str(self.path)!r}",
                             hint="run `edgeopt bench` or `edgeopt run` first, or pass --db")
        try:
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(str(self.path), check_same_thread=False, timeout=30)
            self._open()
        except sqlite3.DatabaseError as exc:
            raise UsageError(f"{str(self.path)!r} is not a usable results database: {exc}") from None
        self._lock = threading.Lock()
        self.unsaved: list[dict[str, Any]] = []  # records add() could not write (save_unsaved keeps them)
        self.write_error: str | None = None

    def _open(self) -> None:
        from edgeopt.results_schema import migrate, stored_version

        db = _SqliteRows(self._conn)
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        if max(version, stored_version(db)) > SCHEMA_VERSION:
            raise UsageError(f"{self.path} was written by a newer edgeopt (schema "
                             f"{max(version, stored_version(db))}; this one knows {SCHEMA_VERSION})",
                             hint="upgrade edgeopt, or use another --db")
        if max(version, stored_version(db)) == SCHEMA_VERSION:
            return
        self._conn.execute("BEGIN IMMEDIATE")  # one writer migrates; the others wait, then see it done
        try:
            start = max(self._conn.execute("PRAGMA user_version").fetchone()[0], stored_version(db))
            if start < SCHEMA_VERSION:
                migrate(db, _edgeopt_version(), start)
                self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._conn.commit()
        except BaseException:
            self._conn.rollback()
            raise

    def close(self) -> None:
        self.export_added()
        self._conn.close()

    def _note_added(self, record: dict[str, Any], ident: dict[str, Any] | None, rig: str | None) -> None:
        """Keep what this object stored, for ``export_added`` (only when ``EDGEOPT_MLFLOW_URI`` is set)."""
        if os.environ.get(MLFLOW_ENV) and getattr(self, "export_after", True):
            self._added = getattr(self, "_added", [])
            self._added.append({**record, **({"identity": ident} if ident else {}), "rig": rig})

    def export_added(self) -> None:
        """With ``EDGEOPT_MLFLOW_URI`` set (and ``EDGEOPT_MLFLOW_EXPERIMENT``, else ``edgeopt-<model>``): log the
        records this object stored (a bench, a run, a gate) to that MLflow server, on close. The records are
        in the database whatever happens there: a refusal is one stderr line naming `edgeopt export mlflow`."""
        added, self._added = getattr(self, "_added", []), []
        uri = os.environ.get(MLFLOW_ENV)
        if not added or not uri:
            return
        from edgeopt.errors import EdgeoptError
        from edgeopt.results_mlflow import export

        try:
            res = export(added, uri, os.environ.get("EDGEOPT_MLFLOW_EXPERIMENT") or None)
            print(f"edgeopt: {res['exported']} record(s) logged to MLflow at {uri}"
                  + (f" ({res['skipped']} there already)" if res["skipped"] else ""), file=sys.stderr)
        except EdgeoptError as exc:
            print(f"edgeopt: the records were not logged to MLflow ({exc.message}); they are in the results "
                  f"database: `edgeopt export mlflow --tracking-uri {uri}` logs them", file=sys.stderr)

    def __enter__(self) -> ResultsDB:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        from edgeopt.results_schema import stored_version

        with self._lock:
            return stored_version(_SqliteRows(self._conn))

    def add(self, record: dict[str, Any]) -> int:
        """Store one record (``RunRecord.as_dict()``) once; returns its row id (the stored one's when the same
        record is there already: a retry), -1 when it could not be written (``save_unsaved`` keeps it)."""
        ident = self.adopt_identity(record)
        row, text, key = prepare(record, ident)
        with self._lock:
            try:
                rid, dup = insert_once(_SqliteRows(self._conn).rows, row, text, key)
                self._conn.commit()
                self.duplicates += dup
                self._note_added(record, ident, row[-2])
                return rid
            except sqlite3.Error as exc:  # the disk filled (or went read-only) since the database was opened
                with contextlib.suppress(sqlite3.Error):
                    self._conn.rollback()
                self.unsaved.append(clean(record))  # the measurement is kept: save_unsaved() writes it out
                self.write_error = self.write_error or str(exc)
                return -1

    def adopt_identity(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """The record's machine identity; one that knows its machine only in part (a gate's: no probe) takes
        the identity of the same device's latest fuller one when every fact it knows agrees, so a gate joins
        its device's series."""
        from edgeopt.results_schema import adopts

        ident = identity_of(record)
        dev = (record.get("device") or {}).get("name") if isinstance(record.get("device"), dict) else None
        if ident is None or record.get("probe") or not dev or isinstance(record.get("identity"), dict):
            return ident
        try:
            rows = self._rows("SELECT identity, json FROM runs WHERE device = ? AND identity IS NOT NULL AND "
                              "identity <> ? ORDER BY id DESC LIMIT 20", (dev, ident["id"]))
        except Exception:  # an unreadable row, a server lost: the record keeps its own
            return ident
        for other_id, text in rows:
            try:
                other = identity_of(json.loads(text))
            except (ValueError, TypeError, AttributeError):
                continue
            if other and adopts(ident["facts"], other["facts"]):
                return {"id": other_id, "facts": other["facts"], "from": "the device's earlier runs"}
        return ident

    def save_unsaved(self, run_id: str) -> str | None:
        """When ``add`` could not write some records: save them as JSON beside the database (else in the
        working folder, else the temp folder) and return the one line that says where; None when all were
        written. The file (``<db name>.unsaved-<run id>.json``) holds ``{"db", "error", "records"}``."""
        if not self.unsaved:
            return None
        import tempfile

        n, why = len(self.unsaved), self.write_error or "unknown error"
        body = dumps({"db": str(self.shown), "error": why, "records": self.unsaved}, default=str)
        name = f"{self.path.name}.unsaved-{run_id}.json"
        tried = []
        for folder in (self.path.parent, Path.cwd(), Path(tempfile.gettempdir())):
            dest, tmp = folder / name, None
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=folder)
                with os.fdopen(fd, "w") as f:
                    f.write(body)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, dest)
                return (f"the results database {self.shown} could not be written ({why}): {n} record(s) kept in "
                        f"{dest} instead")
            except OSError as exc:
                tried.append(f"{folder}: {exc.strerror or exc}")
                if tmp is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
        return (f"the results database {self.shown} could not be written ({why}), nor could {n} record(s) be kept "
                f"as JSON ({'; '.join(tried)}); they are in the output above (--json prints them whole)")

    def _rows(self, sql: str, args: list | tuple = ()) -> list[tuple]:
        with self._lock:
            return self._conn.execute(sql, tuple(args)).fetchall()

    def query(self, model: str | None = None, target: str | None = None, precision: str | None = None,
              device: str | None = None, status: str | None = None, run_id: str | None = None,
              since: str | None = None, latest: bool = False, identity: str | None = None,
              rig: str | None = None, label: str | None = None, until: str | None = None,
              annotate: bool = False) -> list[dict[str, Any]]:
        """Records matching every filter given (``since``/``until``: ISO date/time or ``30m``/``12h``/``7d``
        ago; ``identity``: a machine fingerprint or its prefix; ``rig``: the writing rig; ``label``: a device
        label), oldest first; ``latest`` keeps the newest of each (model, target, precision, device, machine
        identity, batch), bench runs and gate verdicts (``status`` ``gate-*``) apart. ``annotate``: each record
        also carries its ``identity`` (``{"id", "facts"}``) and ``rig`` (kept in columns, not in the record
        as it was written)."""
        cond, args = where_of(model, target, precision, device, status, run_id, since, identity, rig, label, until)
        sql = (f"SELECT id, json, rig, model, target, precision, device, identity, status FROM runs {cond} "
               "ORDER BY time, id")
        rows = self._rows(sql, args)
        out: list[tuple[tuple, dict[str, Any]]] = []
        for row_id, text, rig_col, *cols in rows:
            try:
                rec = json.loads(text)
                if not isinstance(rec, dict):
                    raise ValueError(f"a JSON {type(rec).__name__}, not an object")
            except (ValueError, TypeError) as exc:
                print(f"edgeopt: {self.shown}: skipped row {row_id}, which cannot be read ({str(exc)[:120]})",
                      file=sys.stderr)
                continue
            if annotate:
                ident = identity_of(rec)
                if cols[4]:
                    rec["identity"] = {"id": cols[4], "facts": (ident or {}).get("facts") or {}}
                elif ident is not None:  # a row from before identities: computed now
                    rec["identity"] = ident
                if rig_col:
                    rec["rig"] = rig_col
            batch = ((rec.get("bench") or {}).get("inputs") or {}).get("batch") if isinstance(rec.get("bench"), dict) \
                else None
            key = (*cols[:5], 1 if batch is None else batch, str(cols[5] or "").startswith("gate-"))
            out.append((key, clean(rec)))  # a NaN an older edgeopt stored comes back as null with its reason
        if latest:
            # the newest bench run and the newest gate verdict of each (model, target, precision, device,
            # identity, batch): a gate does not hide a bench. Done here, not in SQL: SQLite's json_extract
            # fails the whole query on one row an older edgeopt wrote with a bare NaN ("malformed JSON"),
            # and a damaged newest row must not hide the last good one.
            newest = {}
            for i, (key, _rec) in enumerate(out):
                newest[_hashable(key)] = i
            keep = set(newest.values())
            return [rec for i, (_key, rec) in enumerate(out) if i in keep]
        return [rec for _key, rec in out]

    def models(self) -> list[str]:
        """The models with runs stored, sorted."""
        return [r[0] for r in self._rows("SELECT DISTINCT model FROM runs WHERE model IS NOT NULL ORDER BY model")]

    def count(self, **filters: Any) -> int:
        """How many rows (matching ``query``'s filters, when given)."""
        cond, args = where_of(**filters)
        return int(self._rows(f"SELECT COUNT(*) FROM runs {cond}", args)[0][0])


def _edgeopt_version() -> str:
    try:
        from importlib.metadata import version

        return version("edgeopt")
    except Exception:  # not installed (a source checkout on sys.path)
        return "unknown"


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


# --- typed records: what the Python API hands out ------------------------------------------------------


def _fnum(v: Any) -> float | None:
    """A finite number as float, else None (a stored null, a string, a bool)."""
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _inum(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


class _DictCompat:
    """``x["key"]`` / ``x.get("key")`` as when records held plain dicts: the raw dict's value, with a
    DeprecationWarning naming the typed attribute to read instead. Kept for scripts written against the
    dict records; nothing in edgeopt's own code reads a record this way."""

    raw: dict[str, Any]
    _RENAMED: dict[str, str] = {}

    def _warn(self, key: str) -> None:
        attr = self._RENAMED.get(key, key)
        typed = attr in getattr(self, "__dataclass_fields__", {}) or isinstance(getattr(type(self), attr, None), property)
        use = f".{attr}" if typed and attr not in ("raw", "get") else f".raw[{key!r}]"
        warnings.warn(f"{type(self).__name__}[{key!r}] reads the record as a dict, which is deprecated: use "
                      f"the typed attribute ({type(self).__name__}{use})", DeprecationWarning, stacklevel=3)

    def __getitem__(self, key: str) -> Any:
        self._warn(key)
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        self._warn(key)
        return self.raw.get(key, default)

    def to_dict(self) -> dict[str, Any]:
        """The dict this was read from, as it was (a copy)."""
        return copy.deepcopy(self.raw)


@dataclass(frozen=True)
class DeviceInfo(_DictCompat):
    """The device a record was measured on: the inventory's entry and the facts the agent found there.
    ``device_truth``: ``device`` (the hardware the target is for), ``build-host``, ``other-vendor`` or
    ``emulated`` (``edgeopt.decide.device_truth``; only ``device`` can be the basis of a SHIP)."""

    name: str
    transport: str | None = None
    host: str | None = None
    target: str | None = None
    labels: tuple[str, ...] = ()
    arch: str | None = None
    cpu_model: str | None = None
    cores: int | None = None
    os: str | None = None
    emulated: bool = False
    emulator: str | None = None
    device_truth: str = "device"
    device_truth_why: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class BundleInfo(_DictCompat):
    """The bundle a record measured: ``id`` is its content hash (``bundle_id``); ``batch`` the batch it ran
    at (None when it was not benched)."""

    id: str | None
    model: str | None = None
    target: str | None = None
    precision: str | None = None
    backend: str | None = None
    path: str | None = None
    batch: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    _RENAMED = {"bundle_id": "id"}


@dataclass(frozen=True)
class Latency(_DictCompat):
    """Latency per inference (per batch when ``batch`` > 1) over the timed loop, and what a cold start costs:
    ``load_s`` (loading the artifact), ``first_inference_ms``, ``cold_start_ms`` = both together (a fresh
    process's time to its first answer). ``raw``: the agent's ``latency_ms``; ``samples_ms``: each timed
    inference (empty when the bench ran with ``no_samples``)."""

    p50_ms: float | None
    p90_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    p999_ms: float | None = None
    mean_ms: float | None = None
    std_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    throughput_ips: float | None = None
    iterations: int | None = None
    duration_s: float | None = None
    load_s: float | None = None
    first_inference_ms: float | None = None
    cold_start_ms: float | None = None
    peak_rss_mb: float | None = None
    samples_ms: tuple[float, ...] = field(default=(), repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    _RENAMED = {"p50": "p50_ms", "p90": "p90_ms", "p95": "p95_ms", "p99": "p99_ms", "p99_9": "p999_ms",
                "mean": "mean_ms", "std": "std_ms", "min": "min_ms", "max": "max_ms"}


@dataclass(frozen=True)
class AccuracyInfo(_DictCompat):
    """The on-device check against the FP32 reference. ``passed``: within the precision's tolerances;
    ``metric``/``k``/``n``/``interval``: the task agreement of the worst output (``top-1``, ``decoded equal``,
    ``boxes matched`` or ``decisions kept``: k of n, 95% Wilson interval; None when the outputs have no
    such count); ``data``: where the validation inputs came from (``random`` means not representative)."""

    passed: bool | None
    precision: str | None = None
    summary: str | None = None
    metric: str | None = None
    output: str | None = None
    share: float | None = None
    k: int | None = None
    n: int | None = None
    interval: tuple[float, float] | None = None
    samples: int | None = None
    data: str | None = None
    cosine_min: float | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def outputs(self) -> dict[str, Any]:
        """Per output: passed, reasons, metrics (the agent's own dicts)."""
        return dict(self.raw.get("outputs") or {})


@dataclass(frozen=True)
class Energy(_DictCompat):
    """Energy over the timed loop, where the device exposes a source (the agent reads it, never estimates;
    ``edgeopt_agent.energy``): ``source`` names it (None: not available, ``why_not`` says why),
    ``resolution`` is the source's own (as the agent words it), ``scope`` what it covers (package, board,
    GPU), ``samples`` how many readings, ``rails`` per rail ``{"energy_j", "mean_power_w"}``, ``energy_j``
    the total over ``window_s`` for ``inferences``; ``others``: the other sources measured at once;
    ``unavailable``: per source known to the agent, why it was not read."""

    source: str | None
    joules_per_inference: float | None = None
    mean_power_w: float | None = None
    resolution: str | float | None = None
    scope: str | None = None
    samples: int | None = None
    rails: dict[str, dict[str, Any]] = field(default_factory=dict)
    energy_j: float | None = None
    window_s: float | None = None
    inferences: int | None = None
    why_not: str | None = None
    others: tuple[Energy, ...] = ()
    unavailable: dict[str, str] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def measured(self) -> bool:
        """A source was read and gave joules per inference."""
        return self.source is not None and self.joules_per_inference is not None


@dataclass(frozen=True)
class ErrorInfo(_DictCompat):
    """Why a run has no measurement (or failed its check): the error's type, one-line message and hint."""

    type: str | None
    message: str = ""
    hint: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class BenchRecord(_DictCompat):
    """One (device, bundle) run: measured (``status`` ``ok``, or ``mismatch`` when the device's outputs failed
    the check) or the reason there is none (``error``: set on every run that is not ok, a gate's verdict
    aside, so ``rec.error.message`` can be read whenever ``not rec.ok``). A gate's stored verdict is a record too
    (``is_gate``; its figures in ``gate``). ``raw`` is the whole record as stored, the agent's full bench
    reply in ``raw["bench"]`` (also ``.bench``): nothing measured is lost to the typed view.
    ``to_dict()`` gives it back (the JSON ``edgeopt bench --json`` prints per record)."""

    run_id: str
    time: str
    status: str
    device: DeviceInfo
    bundle: BundleInfo
    latency: Latency | None = None
    accuracy: AccuracyInfo | None = None
    energy: Energy | None = None
    error: ErrorInfo | None = None
    agent: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def is_gate(self) -> bool:
        return self.status.startswith("gate-") and isinstance(self.raw.get("gate"), dict)

    @property
    def bench(self) -> dict[str, Any] | None:
        """The agent's bench reply as it sent it (scenario, decomposition, environment, options ...)."""
        return self.raw.get("bench")

    @property
    def probe(self) -> dict[str, Any] | None:
        return self.raw.get("probe")

    @property
    def push(self) -> dict[str, Any] | None:
        return self.raw.get("push")

    @property
    def gate(self) -> dict[str, Any] | None:
        return self.raw.get("gate") if self.is_gate else None

    def as_dict(self) -> dict[str, Any]:
        """The same as ``to_dict()`` (the name ``fleetbench.RunRecord`` used)."""
        return self.to_dict()


@dataclass(frozen=True)
class BundlePushInfo(_DictCompat):
    """One bundle of a push: ``status`` present (the device had it) | installed | repaired | failed."""

    bundle_id: str
    status: str
    model: str | None = None
    target: str | None = None
    precision: str | None = None
    path: str | None = None
    bytes_sent: int = 0
    files_sent: int = 0
    time_s: float | None = None
    error: str | None = None
    activated: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class PushInfo(_DictCompat):
    """What one device was sent before its runs (``deploy.PushResult`` as ``bench`` keeps it): the agent
    (``agent``: uploaded or not, its path) and each bundle."""

    device: str
    ok: bool
    bundles: tuple[BundlePushInfo, ...] = ()
    bytes_sent: int = 0
    error: str | None = None
    time_s: float | None = None
    agent: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)


def push_from_dict(p: dict[str, Any]) -> PushInfo:
    """A push as ``deploy.PushResult.as_dict()`` wrote it, typed (``to_dict()`` gives it back)."""
    bundles = tuple(BundlePushInfo(bundle_id=str(b.get("bundle_id") or ""), status=str(b.get("status") or ""),
                                   model=_str(b.get("model")), target=_str(b.get("target")),
                                   precision=_str(b.get("precision")), path=_str(b.get("path")),
                                   bytes_sent=_inum(b.get("bytes_sent")) or 0, files_sent=_inum(b.get("files_sent")) or 0,
                                   time_s=_fnum(b.get("time_s")), error=_str(b.get("error")),
                                   activated=_str(b.get("activated")), raw=b)
                    for b in p.get("bundles") or () if isinstance(b, dict))
    return PushInfo(device=str(p.get("device") or ""), ok=bool(p.get("ok", True)), bundles=bundles,
                    bytes_sent=_inum(p.get("bytes_sent")) or sum(b.bytes_sent for b in bundles),
                    error=_str(p.get("error")), time_s=_fnum(p.get("time_s")),
                    agent=dict(p.get("agent") or {}), raw=p)


@dataclass
class BenchResult:
    """What ``edgeopt.bench`` returns: every (device, bundle) run of one invocation under ``run_id`` (one id
    for a whole ``--batch 1,4,8`` curve), the pushes made on the way, the devices that had nothing to run.
    ``as_dict()`` is what ``edgeopt bench --json`` prints."""

    run_id: str
    records: list[BenchRecord] = field(default_factory=list)
    pushes: list[PushInfo] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)  # {"device", "reason"}: nothing to run there
    time_s: float = 0.0
    unsaved: str | None = None  # the results database could not take the records: where they were kept instead

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.records)

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "ok": self.ok, "time_s": self.time_s,
                "records": [r.as_dict() for r in self.records], "pushes": [p.to_dict() for p in self.pushes],
                "skipped": [dict(s) for s in self.skipped], **({"unsaved": self.unsaved} if self.unsaved else {})}

    to_dict = as_dict

    @classmethod
    def from_fleet(cls, fleet: Any) -> BenchResult:
        """From ``fleetbench.FleetResult`` (records and pushes as dicts)."""
        return cls(fleet.run_id, [record_from_dict(r) for r in fleet.records],
                   [p if isinstance(p, PushInfo) else push_from_dict(p) for p in fleet.pushes],
                   list(fleet.skipped), float(fleet.time_s), getattr(fleet, "unsaved", None))


def energy_of(bench: dict[str, Any] | None, rec: dict[str, Any] | None = None) -> Energy | None:
    """The energy figures of one bench reply (``bench["energy"]``; a record-level ``energy`` is read too),
    None when the reply has none (an agent that does not read energy)."""
    e = bench.get("energy") if isinstance(bench, dict) else None
    if not isinstance(e, dict):
        e = (rec or {}).get("energy")
    return _energy(e) if isinstance(e, dict) else None


def _energy(e: dict[str, Any]) -> Energy:
    res = e.get("resolution")
    rails = e.get("rails") if isinstance(e.get("rails"), dict) else {}
    return Energy(source=_str(e.get("source")) if e.get("source") else None,
                  joules_per_inference=_fnum(e.get("joules_per_inference")), mean_power_w=_fnum(e.get("mean_power_w")),
                  resolution=res if isinstance(res, (str, int, float)) and not isinstance(res, bool) else None,
                  scope=_str(e.get("scope")), samples=_inum(e.get("samples")),
                  rails={str(k): dict(v) if isinstance(v, dict) else {"value": v} for k, v in rails.items()},
                  energy_j=_fnum(e.get("energy_j")), window_s=_fnum(e.get("window_s")),
                  inferences=_inum(e.get("inferences")), why_not=_str(e.get("why_not")),
                  others=tuple(_energy(o) for o in e.get("others") or () if isinstance(o, dict)),
                  unavailable={str(k): str(v) for k, v in (e.get("unavailable") or {}).items()}
                  if isinstance(e.get("unavailable"), dict) else {}, raw=e)


def accuracy_info(acc: dict[str, Any] | None, data_kind: str | None = None) -> AccuracyInfo | None:
    """A check against the FP32 reference, typed: the agent's ``accuracy`` in a bench reply, or a bundle's
    ``host_check`` (``data_kind``: its validation data's kind, which the manifest keeps apart). None when
    no check ran."""
    if not isinstance(acc, dict) or "passed" not in acc:
        return None
    from edgeopt import decide

    a = decide.agreement(acc) or {}
    cos = [_fnum(((o or {}).get("metrics") or {}).get("cosine")) for o in (acc.get("outputs") or {}).values()]
    cos = [c for c in cos if c is not None]
    data = acc.get("data") if isinstance(acc.get("data"), dict) else {}
    return AccuracyInfo(
        passed=None if acc.get("passed") is None else bool(acc["passed"]), precision=_str(acc.get("precision")),
        summary=_str(acc.get("summary")), metric=a.get("metric"), output=a.get("output"), share=a.get("share"),
        k=a.get("k"), n=a.get("n"), interval=(a["ci_low"], a["ci_high"]) if a else None,
        samples=_inum(acc.get("samples") or data.get("n")), data=_str(data.get("kind") or data_kind),
        cosine_min=min(cos) if cos else None, raw=acc)


def record_from_dict(rec: dict[str, Any] | Any) -> BenchRecord:
    """The one way a record becomes typed: a results-database row's JSON, ``fleetbench.RunRecord`` (or its
    ``as_dict()``), or a ``BenchRecord`` (returned as is). Missing parts are None, never an error: a failed
    run has no latency, a gate verdict only a p50."""
    if isinstance(rec, BenchRecord):
        return rec
    if not isinstance(rec, dict):
        rec = rec.as_dict()
    from edgeopt import decide

    dev, b = rec.get("device") or {}, rec.get("bundle") or {}
    bench = rec.get("bench") if isinstance(rec.get("bench"), dict) else {}
    env = bench.get("environment") or {}
    probe = rec.get("probe") or {}
    pcpu = probe.get("cpu") if isinstance(probe.get("cpu"), dict) else {}
    truth, why = decide.device_truth(rec)
    device = DeviceInfo(
        name=str(dev.get("name") or ""), transport=_str(dev.get("transport")), host=_str(dev.get("host")),
        target=_str(dev.get("target")), labels=tuple(str(x) for x in dev.get("labels") or ()),
        arch=_str(env.get("arch") or probe.get("arch")), cpu_model=_str(env.get("cpu_model") or pcpu.get("model")),
        cores=_inum(env.get("cores_usable") or env.get("cores") or pcpu.get("cores_usable") or pcpu.get("cores")),
        os=_str(probe.get("os_release") or env.get("os") or probe.get("os")), emulated=truth == "emulated",
        emulator=_str(env.get("emulator") or probe.get("emulator") or dev.get("emulator")) if truth == "emulated"
        else None, device_truth=truth, device_truth_why=why, raw=dev)
    bundle = BundleInfo(id=_str(b.get("bundle_id")), model=_str(b.get("model")), target=_str(b.get("target")),
                        precision=_str(b.get("precision")), backend=_str(b.get("backend")), path=_str(b.get("path")),
                        batch=_inum((bench.get("inputs") or {}).get("batch")) if bench else None, raw=b)
    lat = bench.get("latency_ms") if isinstance(bench.get("latency_ms"), dict) else None
    latency = None
    if lat is not None:
        load, first = _fnum(bench.get("load_s")), _fnum(bench.get("first_inference_s"))
        latency = Latency(
            p50_ms=_fnum(lat.get("p50")), p90_ms=_fnum(lat.get("p90")), p95_ms=_fnum(lat.get("p95")),
            p99_ms=_fnum(lat.get("p99")), p999_ms=_fnum(lat.get("p99_9")), mean_ms=_fnum(lat.get("mean")),
            std_ms=_fnum(lat.get("std")), min_ms=_fnum(lat.get("min")), max_ms=_fnum(lat.get("max")),
            throughput_ips=_fnum(bench.get("throughput_ips")), iterations=_inum(bench.get("iterations")),
            duration_s=_fnum(bench.get("duration_s")), load_s=load,
            first_inference_ms=None if first is None else first * 1000,
            cold_start_ms=None if load is None or first is None else (load + first) * 1000,
            peak_rss_mb=_fnum(bench.get("peak_rss_mb")),
            samples_ms=tuple(x for x in (_fnum(v) for v in bench.get("samples_ms") or ()) if x is not None), raw=lat)
    accuracy = accuracy_info(bench.get("accuracy"))
    err = rec.get("error") if isinstance(rec.get("error"), dict) else None
    status = str(rec.get("status") or "")
    error = None if not err else ErrorInfo(type=_str(err.get("type")), message=str(err.get("message") or status),
                                           hint=_str(err.get("hint")), raw=err)
    if error is None and status != "ok" and not status.startswith("gate-"):  # a failed run always says so
        error = ErrorInfo(type=None, message=f"{status or 'failed'} (no error recorded)")
    return BenchRecord(run_id=str(rec.get("run_id") or ""), time=str(rec.get("time") or ""), status=status, device=device, bundle=bundle, latency=latency,
                       accuracy=accuracy, energy=energy_of(bench, rec), error=error, agent=_str(rec.get("agent")),
                       raw=rec)
