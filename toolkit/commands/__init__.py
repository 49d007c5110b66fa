"""CLI commands, one module each: ``add_parser(subparsers)`` and ``run(args) -> int``."""

from __future__ import annotations

import json
import sys
from typing import Any


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
