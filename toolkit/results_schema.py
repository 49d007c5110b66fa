"""The results schema, one for SQLite and PostgreSQL: its columns, its versions and the migrations between
them, the machine identity of a record and its idempotent key. Stdlib only (the SQLite default never
imports SQLAlchemy).

**Migrations: a small versioned table, not Alembic.** ``schema_migrations (version, applied_at, edgeopt)``
holds one row per migration applied; ``MIGRATIONS`` is the ordered list (a version, what it does, and a
function run on either engine through a two-method adapter). Why not Alembic: the schema is one table
and its indexes; the embedded SQLite default opens the database through the stdlib ``sqlite3`` (no
SQLAlchemy import on the default path, and the same runner must serve it); Alembic would add a script
folder and an ``env.py`` to the package and a dependency for the SQLite path, for nothing we need (no
autogenerate, no branches, no downgrades: a database written by a newer edgeopt is refused). On SQLite
``PRAGMA user_version`` follows the same number, so an edgeopt from before this table refuses a newer
file as it always did. On PostgreSQL the migrations run under an advisory lock, in one transaction:
many rigs opening a fresh database at once migrate it once.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from collections.abc import Callable
from typing import Any, Protocol

SCHEMA_VERSION = 2

#: the ``runs`` table: (name, SQLite type, PostgreSQL type). ``id`` first; the rest in insert order.
COLUMNS: list[tuple[str, str, str]] = [
    ("id", "INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY"),
    ("run_id", "TEXT NOT NULL", "TEXT NOT NULL"),
    ("time", "TEXT NOT NULL", "TEXT NOT NULL"),
    ("model", "TEXT", "TEXT"), ("target", "TEXT", "TEXT"), ("precision", "TEXT", "TEXT"), ("backend", "TEXT", "TEXT"),
    ("device", "TEXT NOT NULL", "TEXT NOT NULL"), ("bundle_id", "TEXT", "TEXT"),
    ("status", "TEXT NOT NULL", "TEXT NOT NULL"), ("error", "TEXT", "TEXT"),
    ("p50_ms", "REAL", "DOUBLE PRECISION"), ("throughput_ips", "REAL", "DOUBLE PRECISION"),
    ("accuracy_passed", "INTEGER", "INTEGER"),
    ("json", "TEXT NOT NULL", "TEXT NOT NULL"),
]
#: added by version 2: the idempotent key, the machine identity, the writing rig and the device's labels
V2_COLUMNS: list[tuple[str, str]] = [("record_key", "TEXT"), ("identity", "TEXT"), ("rig", "TEXT"), ("labels", "TEXT")]
INSERT_COLUMNS = [c for c, _, _ in COLUMNS[1:]] + [c for c, _ in V2_COLUMNS]
FILTERS = ("model", "target", "precision", "device", "status", "run_id", "identity", "rig")


class Adapter(Protocol):
    dialect: str

    def run(self, sql: str, args: tuple | list = ()) -> None: ...

    def rows(self, sql: str, args: tuple | list = ()) -> list[tuple]: ...


def _v1(db: Adapter) -> None:
    sqlite = db.dialect == "sqlite"
    cols = ", ".join(f"{n} {s if sqlite else p}" for n, s, p in COLUMNS)
    db.run(f"CREATE TABLE IF NOT EXISTS runs ({cols})")
    db.run("CREATE INDEX IF NOT EXISTS runs_key ON runs (model, target, precision, device, time)")
    db.run("CREATE INDEX IF NOT EXISTS runs_time ON runs (time)")
    db.run("CREATE INDEX IF NOT EXISTS runs_device ON runs (device, time)")


def _v2(db: Adapter) -> None:
    have = {c.lower() for c in _columns(db)}
    for name, typ in V2_COLUMNS:
        if name not in have:
            db.run(f"ALTER TABLE runs ADD COLUMN {name} {typ}")
    seen: set[str] = set()
    for row_id, text in db.rows("SELECT id, json FROM runs WHERE record_key IS NULL ORDER BY id"):
        try:
            rec = json.loads(text)
            rec = rec if isinstance(rec, dict) else {}
        except (ValueError, TypeError):
            rec = {}
        key = record_key(rec) if rec else f"row-{row_id}"
        if key in seen:
            key = f"{key}#row-{row_id}"
        seen.add(key)
        ident = identity_of(rec) if rec else None
        db.run("UPDATE runs SET record_key = ?, identity = ?, labels = ? WHERE id = ?",
               (key, ident["id"] if ident else None, labels_of(rec), row_id))
    db.run("CREATE UNIQUE INDEX IF NOT EXISTS runs_record_key ON runs (record_key)")
    db.run("CREATE INDEX IF NOT EXISTS runs_identity ON runs (identity, time)")


def _columns(db: Adapter) -> list[str]:
    if db.dialect == "sqlite":
        return [r[1] for r in db.rows("PRAGMA table_info(runs)")]
    return [r[0] for r in db.rows("SELECT column_name FROM information_schema.columns WHERE table_name = 'runs' "
                                  "AND table_schema = current_schema()")]


MIGRATIONS: list[tuple[int, str, Callable[[Adapter], None]]] = [
    (1, "the runs table (one row per device x bundle run, its JSON whole)", _v1),
    (2, "record_key (idempotent, unique), identity (machine fingerprint), rig, labels", _v2),
]


MIGRATIONS_TABLE = ("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
                    "applied_at TEXT NOT NULL, edgeopt TEXT, description TEXT)")


def migrate(db: Adapter, edgeopt_version: str, start: int) -> int:
    """Bring the database from version ``start`` to SCHEMA_VERSION (the caller has refused a newer one
    and holds the lock/transaction); returns the version it is at."""
    db.run(MIGRATIONS_TABLE)
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    for version, what, fn in MIGRATIONS:
        if version <= start:
            continue
        fn(db)
        db.run("INSERT INTO schema_migrations (version, applied_at, edgeopt, description) VALUES (?, ?, ?, ?)",
               (version, now, edgeopt_version, what))
    return SCHEMA_VERSION


def stored_version(db: Adapter) -> int:
    """The version recorded in ``schema_migrations`` (0 when the table is absent or empty)."""
    try:
        rows = db.rows("SELECT MAX(version) FROM schema_migrations")
    except Exception:  # the table is absent (each engine raises its own error class)
        return 0
    return int(rows[0][0] or 0) if rows else 0


# --- what each record carries -----------------------------------------------------------------------


def _canon(x: Any) -> str:
    return json.dumps(x, sort_keys=True, default=str, separators=(",", ":"))


def record_key(rec: dict[str, Any]) -> str:
    """The idempotent key of a record: its run id, device and bundle (and the batch it ran at, and whether it
    is a gate verdict, which one run can hold beside a bench of the same bundle). A retry of the same record
    has the same key and the same JSON, and is not stored twice."""
    b = rec.get("bundle") if isinstance(rec.get("bundle"), dict) else {}
    bench = rec.get("bench") if isinstance(rec.get("bench"), dict) else {}
    batch = (bench.get("inputs") or {}).get("batch") if isinstance(bench.get("inputs"), dict) else None
    dev = rec.get("device") if isinstance(rec.get("device"), dict) else {}
    parts = [rec.get("run_id"), dev.get("name"), b.get("bundle_id"), b.get("model"), b.get("target"),
             b.get("precision"), batch or 1, "gate" if str(rec.get("status") or "").startswith("gate-") else "run"]
    return hashlib.sha256(_canon(parts).encode()).hexdigest()[:32]


def identity_facts(rec: dict[str, Any]) -> dict[str, Any]:
    """The hardware and software facts of the machine a record was measured on, without its name: CPU,
    cores, memory, GPUs and their driver, runtime versions, the Jetson's L4T and power mode, emulated or not.
    From the agent's probe, else the gate's fingerprint, else the inventory's entry."""
    p = rec.get("probe") if isinstance(rec.get("probe"), dict) else {}
    fp = ((rec.get("gate") or {}).get("fingerprint") or {}) if isinstance(rec.get("gate"), dict) else {}
    dev = rec.get("device") if isinstance(rec.get("device"), dict) else {}
    cpu = p.get("cpu") if isinstance(p.get("cpu"), dict) else {}
    jet = p.get("jetson") if isinstance(p.get("jetson"), dict) else {}
    mem = p.get("memory_mb")
    gpus = sorted(f"{g.get('name')} (driver {g.get('driver')})" if g.get("driver") else str(g.get("name"))
                  for g in p.get("gpus") or [] if isinstance(g, dict) and g.get("name"))
    runtimes = p.get("runtimes") if isinstance(p.get("runtimes"), dict) else fp.get("runtimes")
    facts = {"arch": p.get("arch") or dev.get("arch"),
             "cpu": cpu.get("model") or fp.get("cpu") or dev.get("cpu_model"),
             "cores": cpu.get("cores") or dev.get("cores"),
             "memory_gb": round(mem / 1024) if isinstance(mem, (int, float)) and mem > 0 else None,
             "gpus": gpus or None,
             "runtimes": {k: v for k, v in sorted((runtimes or {}).items()) if v} or None,
             "l4t": jet.get("l4t"),
             "power_mode": jet.get("power_mode") or fp.get("power_mode"),
             "emulated": bool(p.get("emulated") or fp.get("emulated") or dev.get("emulated"))}
    return {k: v for k, v in facts.items() if v is not None}


def identity_of(rec: dict[str, Any]) -> dict[str, Any] | None:
    """``{"id": 12 hex digits, "facts": {...}}``: a stable fingerprint of the machine (a renamed rig keeps
    it; a new driver or runtime makes a new one); None when nothing is known of the machine (a device that
    could not be reached). A record that already carries one keeps it."""
    have = rec.get("identity")
    if isinstance(have, dict) and have.get("id"):
        return have
    facts = identity_facts(rec)
    if not facts.get("cpu") and not facts.get("arch"):
        return None
    return {"id": hashlib.sha256(_canon(facts).encode()).hexdigest()[:12], "facts": facts}


def adopts(partial: dict[str, Any], full: dict[str, Any]) -> bool:
    """Whether identity facts known in part (a gate's record: no probe, so no cores or memory) are those of a
    fuller identity: every fact known is the same there, and it knows more."""
    return set(partial) < set(full) and all(full.get(k) == v for k, v in partial.items())


def labels_of(rec: dict[str, Any]) -> str | None:
    """The device's labels as stored for filtering: ``,a,b,`` (so ``LIKE '%,a,%'`` finds one)."""
    dev = rec.get("device") if isinstance(rec.get("device"), dict) else {}
    labels = [str(x) for x in dev.get("labels") or [] if str(x)]
    return ("," + ",".join(sorted(labels)) + ",") if labels else None


def same_record(a: str, b: str) -> bool:
    """Whether two stored JSON texts hold the same record (a retry), whatever their key order and whatever
    the writer added (``identity``, ``rig``: a row from before schema 2 has neither)."""
    if a == b:
        return True
    try:
        x, y = json.loads(a), json.loads(b)
    except (ValueError, TypeError):
        return False
    if not isinstance(x, dict) or not isinstance(y, dict):
        return x == y
    return {k: v for k, v in x.items() if k not in _ADDED} == {k: v for k, v in y.items() if k not in _ADDED}


_ADDED = ("identity", "rig")
