"""The agent's verbs, each ``request dict -> reply dict``. Registered in ``VERBS``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .bundle import load_manifest, verify


def verb_check(req: dict[str, Any]) -> dict[str, Any]:
    """Accuracy of a bundle's artifact against its reference outputs (no timing loop)."""
    from .check import check_bundle

    result = check_bundle(req["bundle"], req.get("options"))
    return {"ok": True, "check": result}


def verb_verify(req: dict[str, Any]) -> dict[str, Any]:
    """A bundle's files against its manifest's sha256."""
    bundle = req["bundle"]
    result = verify(bundle, load_manifest(bundle))
    return {"ok": result["ok"], "verify": result}


VERBS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "check": verb_check,
    "verify": verb_verify,
}
