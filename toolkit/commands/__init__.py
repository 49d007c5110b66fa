"""CLI commands (click), one module each exposing ``command``; bodies call ``edgeopt.api``."""

from __future__ import annotations

import json
import sys
from typing import Any


def emit_json(obj: Any, kind: str | None = None) -> None:
    """Print ``obj`` as JSON; with ``kind``, in the one envelope every command uses
    (``{"schema": "edgeopt/v1", "kind": KIND, ...}``; a list goes under ``items``)."""
    if kind is not None:
        from edgeopt.api import envelope

        obj = envelope(kind, obj)
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
