"""Builds past one host: ``--scheduler tcp://HOST:PORT`` runs each (target, precision) job as a Dask task on a
worker that can build it (``edgeopt worker``), and the bundle comes back to be checked and installed here.

Light on purpose: ``edgeopt.pipeline`` imports this module, and dask is imported only when a session opens
(``client.py``).  While a session is open, ``ACTIVE`` is it: ``pipeline.build`` asks it which jobs no worker can
take (``refuse``) and starts each job through it (``popen``, the shape of ``subprocess.Popen``) instead of a
local ``python -m edgeopt.worker``; everything else (cache keys, preparation, the host check's verdict, the
atomic install in ``--out`` and the cache) is the local build's own code.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from edgeopt.errors import DeviceError, UsageError

if TYPE_CHECKING:
    from .client import Session

ENV = "EDGEOPT_SCHEDULER"  # the scheduler when --scheduler is not given
ENV_TIMEOUT = "EDGEOPT_SCHEDULER_TIMEOUT"  # seconds to reach it [10; auto: 3]
DEFAULT_AUTO = "tcp://127.0.0.1:8786"  # --scheduler auto without $EDGEOPT_SCHEDULER: dask scheduler's default
LOCAL = ("local", "none", "off")

ACTIVE: Session | None = None  # the open session (one per process): read by pipeline.build
_HERE = False  # inside a session that fell back to this host (auto): every build inside stays here

_URL = re.compile(r"^(tcp|tls)://(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})$")


class ClusterUnreachable(DeviceError):
    """The scheduler could not be reached (exit 4, before anything is prepared)."""


def check_url(url: str) -> str:
    """``tcp://HOST:PORT`` or ``tls://HOST:PORT`` (``HOST:PORT`` reads as tcp://); else a one-line UsageError."""
    text = url.strip()
    if "://" not in text:
        text = "tcp://" + text
    m = _URL.match(text)
    if not m or not 0 < int(m.group(3)) < 65536:
        raise UsageError(f"--scheduler {url!r} is not a scheduler address",
                         hint="give tcp://HOST:PORT or tls://HOST:PORT (dask scheduler's address), 'auto', or 'local'")
    return text


def resolve(scheduler: str | None) -> str | None:
    """The scheduler a build uses: ``--scheduler``, else ``$EDGEOPT_SCHEDULER``; None = build here
    (``local``/``none``/``off``/unset); ``auto`` as is; an address checked (exit 2 when malformed)."""
    if _HERE:
        return None
    value = scheduler if scheduler not in (None, "") else os.environ.get(ENV, "")
    value = (value or "").strip()
    if not value or value.lower() in LOCAL:
        return None
    if value.lower() == "auto":
        return "auto"
    return check_url(value)


def connect_timeout(auto: bool = False) -> float:
    try:
        return max(0.5, float(os.environ.get(ENV_TIMEOUT, "")))
    except ValueError:
        return 3.0 if auto else 10.0


@contextlib.contextmanager
def session(scheduler: str | None, progress: Callable[[str], None] = lambda s: None) -> Iterator[Session | None]:
    """Open the Dask session every build inside the block goes through (None: build here). The scheduler is
    reached first: unreachable = ``ClusterUnreachable`` (exit 4) before anything is prepared, except with
    ``auto``, which builds here and says so in one line."""
    global ACTIVE, _HERE
    address = resolve(scheduler)
    if address is None or ACTIVE is not None:  # local, or nested (tune -> build): the open session serves
        yield ACTIVE
        return
    from .client import Session

    auto = address == "auto"
    if auto:
        env = (os.environ.get(ENV) or "").strip()
        address = check_url(env) if env and env.lower() not in ("auto", *LOCAL) else DEFAULT_AUTO
    try:
        sess = Session.open(address, connect_timeout(auto), progress)
    except ClusterUnreachable as exc:
        if not auto:
            raise
        progress(f"scheduler {address} unreachable ({exc.message.split(': ', 1)[-1]}): building on this host "
                 "(--scheduler auto)")
        _HERE = True
        try:
            yield None
        finally:
            _HERE = False
        return
    ACTIVE = sess
    try:
        yield sess
    finally:
        ACTIVE = None
        sess.close()


def session_if(builds: bool, scheduler: str | None, progress: Callable[[str], None] = lambda s: None
               ) -> contextlib.AbstractContextManager:
    """``session(scheduler)`` around a command that may build (``debug`` of a MODEL or with ``--reduce``; ``run``),
    else nothing: a bundle debugged as it is never reaches for a scheduler (``$EDGEOPT_SCHEDULER`` included)."""
    return session(scheduler, progress) if builds else contextlib.nullcontext()


def summary_notes(report: Any, sess: Session | None) -> None:
    """Put what the cluster did that the summary must say (a job run again after its worker died, a bundle
    refused for its hashes) into the report's warnings."""
    if sess is None:
        return
    for note in sess.notes:
        if note not in report.warnings:
            report.warnings.append(note)


IN_FLIGHT = 64  # jobs the host keeps submitted at once with --scheduler: the scheduler places them


def build_on(scheduler: str | None, build: Callable[..., Any], args: dict[str, Any]) -> Any:
    """``edgeopt.build(**args)`` with every job on the cluster (``api.build``'s ``scheduler=``): the session opened
    around it, every job submitted at once, what the cluster did added to the report's warnings."""
    from edgeopt.errors import EdgeoptError

    progress = args.get("progress") or (lambda s: None)
    with session(scheduler, progress) as sess:
        args = {k: v for k, v in args.items() if k != "scheduler"}  # inside: the open session (or here)
        if sess is not None:
            args["jobs"] = max(int(args.get("jobs") or 1), IN_FLIGHT)
        try:
            report = build(**args)
        except EdgeoptError as exc:
            if exc.result is not None:
                summary_notes(exc.result, sess)
            raise
        summary_notes(report, sess)
        return report
