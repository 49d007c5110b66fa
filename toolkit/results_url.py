"""What ``--db`` names: a SQLite file (a path or ``sqlite:///path``, the embedded default) or a PostgreSQL
server (``postgresql://user@host:port/dbname``), also from ``EDGEOPT_DB``.

Credentials never come from the URL: a URL with a password in it is refused (the password masked in the
message), so a password is never printed, stored in a record or left in shell history. libpq's own
environment supplies it (``PGPASSWORD``, ``~/.pgpass``, ``PGSERVICE``); ``sslmode`` and the other libpq
query parameters pass through. Stdlib only: nothing here imports SQLAlchemy.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from edgeopt.errors import UsageError

DEFAULT_DB = "edgeopt-results.db"
ENV = "EDGEOPT_DB"
SPOOL_ENV = "EDGEOPT_SPOOL"
_PG_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")


@dataclass(frozen=True)
class DbSpec:
    """A parsed ``--db``: ``kind`` is ``sqlite`` or ``postgresql``; ``path`` the SQLite file (for a server:
    the local spool file); ``shown`` what messages print (never a password); ``url`` the SQLAlchemy URL."""

    kind: str
    path: Path
    shown: str
    url: str | None = None

    @property
    def is_server(self) -> bool:
        return self.kind == "postgresql"


def mask(text: str) -> str:
    """``scheme://user:secret@host`` -> ``scheme://user:***@host``, ``?password=x`` -> ``?password=***``."""
    text = re.sub(r"(\b[a-z][a-z0-9+.-]*://[^/:@\s]*):[^@/\s]*@", r"\1:***@", str(text), flags=re.I)
    return re.sub(r"([?&]password=)[^&\s'\"]*", r"\1***", text, flags=re.I)


def resolve(db: str | os.PathLike | None) -> str:
    """The ``--db`` in force: the one given, else ``EDGEOPT_DB``, else the embedded default."""
    if db is not None and str(db) != "":
        return str(db)
    return os.environ.get(ENV) or DEFAULT_DB


def spool_path(shown: str) -> Path:
    """The local SQLite file a server's records wait in when it cannot be reached (``EDGEOPT_SPOOL``, else
    ``~/.cache/edgeopt/spool/<host>-<db>-<hash>.db``): one per server URL, so ``results sync`` knows where
    each belongs."""
    if os.environ.get(SPOOL_ENV):
        return Path(os.environ[SPOOL_ENV])
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", shown.split("://", 1)[-1].split("?", 1)[0]).strip("-")[:60]
    digest = hashlib.sha256(shown.encode()).hexdigest()[:10]
    return Path(os.path.expanduser("~/.cache/edgeopt/spool")) / f"{slug}-{digest}.db"


def parse(db: str | os.PathLike | None) -> DbSpec:
    """A ``--db`` value (or ``EDGEOPT_DB``) as a :class:`DbSpec`; bad input is a one-line ``UsageError``."""
    text = resolve(db)
    m = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://", text)
    if not m:
        return DbSpec("sqlite", Path(text), text)
    scheme = m.group(1).lower()
    if scheme == "sqlite":
        rest = text[len("sqlite://"):]
        if not rest.startswith("/") or rest == "/":
            raise UsageError(f"bad --db {text!r}: a SQLite URL is sqlite:///relative/path or sqlite:////absolute/path")
        return DbSpec("sqlite", Path(rest[1:]), text)
    if scheme not in _PG_SCHEMES:
        raise UsageError(f"bad --db {mask(text)!r}: unknown scheme {scheme!r}",
                         hint="a file path, sqlite:///path, or postgresql://user@host:port/dbname")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise UsageError(f"bad --db {mask(text)!r}: {exc}") from None
    if parts.password is not None:
        raise UsageError(f"--db {mask(text)!r} has a password in it, which edgeopt refuses (it would be printed, "
                         "logged and kept in shell history)",
                         hint="drop it from the URL and give it through PGPASSWORD or ~/.pgpass (libpq's own)")
    dbname = parts.path.lstrip("/")
    if not dbname or "/" in dbname:
        raise UsageError(f"bad --db {mask(text)!r}: name one database (postgresql://user@host:port/dbname)")
    for key, _ in parse_qsl(parts.query, keep_blank_values=True):
        if key.lower() == "password":
            raise UsageError(f"--db {mask(text)!r} has a password in it, which edgeopt refuses",
                             hint="give it through PGPASSWORD or ~/.pgpass")
    host = parts.hostname or ""
    netloc = (f"{parts.username}@" if parts.username else "") + (f"[{host}]" if ":" in host else host) \
        + (f":{port}" if port else "")
    shown = f"postgresql://{netloc}/{dbname}" + (f"?{parts.query}" if parts.query else "")
    url = f"postgresql+psycopg://{netloc}/{dbname}" + (f"?{parts.query}" if parts.query else "")
    return DbSpec("postgresql", spool_path(shown), shown, url)


def local_path(db: str | os.PathLike | None) -> Path:
    """The SQLite file that holds a ``--db``'s local state (rollout journal, rig quarantine, baselines):
    the file itself, or, for a server, its spool file beside the records waiting to be uploaded."""
    spec = parse(db)
    if spec.is_server:
        spec.path.parent.mkdir(parents=True, exist_ok=True)
    return spec.path


def exists(db: str | os.PathLike | None) -> bool:
    """Whether there is something to read at ``db``: the SQLite file exists (a server: always, asked on open)."""
    spec = parse(db)
    return spec.is_server or spec.path.is_file()


def local_db_callback(ctx: object, param: object, value: str | None) -> str | None:
    """A click ``callback`` for a ``--db`` that only keeps local state (a rollout journal): a server URL
    becomes its spool file (``local_path``), a password in it is refused; a path is kept as given."""
    if value is None or not parse(value).is_server:
        return value
    return str(local_path(value))
