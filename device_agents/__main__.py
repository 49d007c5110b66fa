"""``python3 -m edgeopt_agent VERB [--request FILE | JSON on stdin]`` -> one JSON object on stdout.

Every reply has ``{"schema": SCHEMA_VERSION, "agent": AGENT_VERSION, "verb": ..., "ok": bool}``
and, when ``ok`` is false, ``"error": {"type", "message"}``.  See SCHEMA.md.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

from . import AGENT_VERSION, SCHEMA_VERSION
from .verbs import VERBS


def _read_request(argv: list[str]) -> dict[str, Any]:
    if "--request" in argv:
        path = argv[argv.index("--request") + 1]
        with open(path) as f:
            return json.load(f)
    if not sys.stdin or sys.stdin.isatty():
        return {}
    text = sys.stdin.read()
    return json.loads(text) if text.strip() else {}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    import os
    import signal

    # The host runs the agent with -B; its children (the bench child, the watchdog) never write a
    # __pycache__ either: the host's preflight refuses any .pyc in the agent folder (issue 38).
    sys.dont_write_bytecode = True
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"

    signal.signal(signal.SIGTERM, _on_sigterm)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\nverbs: " + ", ".join(sorted(VERBS)))
        return 0
    verb = argv[0]
    reply: dict[str, Any] = {"schema": SCHEMA_VERSION, "agent": AGENT_VERSION, "verb": verb}
    try:
        if verb not in VERBS:
            raise ValueError(f"unknown verb {verb!r}; verbs: {', '.join(sorted(VERBS))}")
        request = _read_request(argv[1:])
        if not isinstance(request, dict):
            raise ValueError(f"the request must be a JSON object, got {type(request).__name__}")
        if "--request" in argv[1:] and verb == "watchdog":
            request["_request_file"] = argv[argv.index("--request") + 1]
        reply["trials_reverted"] = _expire_trials(request)
        if not reply["trials_reverted"]:
            del reply["trials_reverted"]
        reply.update(VERBS[verb](request))
        reply.setdefault("ok", True)
    except (Exception, KeyboardInterrupt) as exc:  # every failure becomes a JSON reply, never a bare traceback
        reply["ok"] = False
        reply["error"] = {"type": type(exc).__name__, "message": str(exc),
                          "traceback": traceback.format_exc(limit=6)}
    sys.stdout.write(_standard_json(reply) + "\n")
    return 0 if reply["ok"] else 1


def _expire_trials(request: dict[str, Any]) -> list[dict[str, Any]]:
    """Every agent call first reverts unconfirmed trials past their deadline (the watchdog's twin:
    whichever comes first does it, under the store lock)."""
    from .store import StoreError, agent_root, expire_trials

    try:
        return expire_trials(agent_root(request))
    except (StoreError, OSError):
        return []


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM (timeout, a CI cancel) ends the agent like Ctrl-C: children reaped


def _standard_json(reply: dict[str, Any]) -> str:
    """The reply as standard JSON: a float that is not finite is written as null, with
    ``<key>_null_reason`` beside it (the host refuses a bare NaN/Infinity as a reply it cannot believe)."""
    try:
        return json.dumps(reply, default=_json_default, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(json.loads(json.dumps(reply, default=_json_default))), allow_nan=False)


def _finite(x: Any) -> Any:
    import math

    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, list):
        return [_finite(v) for v in x]
    if isinstance(x, dict):
        out: dict[str, Any] = {}
        for k, v in x.items():
            if isinstance(v, float) and not math.isfinite(v):
                out.setdefault(f"{k}_null_reason", "not finite (%s)" % ("nan" if v != v else "inf" if v > 0 else "-inf"))
                out[k] = None
            else:
                out[k] = _finite(v)
        return out
    return x


def _json_default(o: Any) -> Any:
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:
        pass
    return str(o)


if __name__ == "__main__":
    sys.exit(main())
