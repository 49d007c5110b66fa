"""Standard JSON only (RFC 8259): no bare NaN / Infinity anywhere edgeopt writes JSON.

``clean(obj)`` returns a copy of ``obj`` in which every non-finite float is ``None``; where a dict
held it, the dict also gets ``"<key>_null_reason": "not finite (nan|inf|-inf)"`` so a reader can tell
"not measured" from "measured, but not a number". ``dumps(obj, **kw)`` is ``json.dumps(clean(obj),
allow_nan=False, **kw)``: it can never emit ``NaN``.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["clean", "dumps", "null_reason"]


def null_reason(x: float) -> str:
    """The reason recorded beside a non-finite float replaced by null."""
    if math.isnan(x):
        return "not finite (nan)"
    return "not finite (inf)" if x > 0 else "not finite (-inf)"


def _bad(x: Any) -> bool:
    return isinstance(x, float) and not math.isfinite(x)


def clean(obj: Any) -> Any:
    """A copy of ``obj`` (dicts, lists, tuples, scalars) with every non-finite float turned into None.

    Numpy scalars and arrays are converted to plain Python values first; other objects are returned
    unchanged (``json.dumps(default=...)`` still decides what to do with them).
    """
    if isinstance(obj, float):
        return None if not math.isfinite(obj) else obj
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    if isinstance(obj, dict):
        out: dict = {}
        for k, v in obj.items():
            v = _plain(v)
            if _bad(v):
                out[k] = None
                rk = f"{k}_null_reason"
                if rk not in obj:
                    out[rk] = null_reason(v)
            else:
                out[k] = clean(v)
        return out
    if isinstance(obj, (list, tuple)):
        return [clean(_plain(v)) for v in obj]
    p = _plain(obj)
    return obj if p is obj else clean(p)


def _plain(v: Any) -> Any:
    """numpy scalar/array → Python float/int/list; anything else unchanged (no numpy import needed)."""
    tolist = getattr(v, "tolist", None)
    if tolist is not None and type(v).__module__ == "numpy":
        try:
            return tolist()
        except Exception:  # noqa: BLE001 - leave unknown objects to json's default=
            return v
    return v


def dumps(obj: Any, **kw: Any) -> str:
    """``json.dumps`` of ``clean(obj)`` with ``allow_nan=False``: always standard JSON."""
    kw.pop("allow_nan", None)
    default = kw.get("default")
    if default is not None:
        # objects turned into JSON by `default` may hold non-finite floats of their own
        kw["default"] = lambda o: clean(default(o))
    return json.dumps(clean(obj), allow_nan=False, **kw)
