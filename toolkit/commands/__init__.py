"""CLI commands (click), one module each exposing ``command``; bodies call ``edgeopt.api``."""

from __future__ import annotations

import sys
from typing import Any


def emit_json(obj: Any, kind: str | None = None) -> None:
    """Print ``obj`` as JSON; with ``kind``, in the one envelope every command uses
    (``{"schema": "edgeopt/v1", "kind": KIND, ...}``; a list goes under ``items``)."""
    if kind is not None:
        from edgeopt.api import envelope

        obj = envelope(kind, obj)
    from edgeopt.jsonsafe import dumps  # standard JSON: a NaN/Infinity is null with its reason

    sys.stdout.write(dumps(obj, indent=2, default=str) + "\n")
