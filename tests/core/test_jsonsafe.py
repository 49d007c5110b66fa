"""edgeopt.jsonsafe: non-finite floats become null with a reason, output is always standard JSON."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from edgeopt.jsonsafe import clean, dumps


def _strict_loads(s: str):
    def refuse(tok):
        raise ValueError(f"non-standard JSON token {tok}")
    return json.loads(s, parse_constant=refuse)


def test_clean_replaces_non_finite_with_null_and_reason():
    doc = {"ratio": float("nan"), "ci_low": float("-inf"), "ci_high": float("inf"), "n": 1,
           "nested": {"p50": [1.0, float("nan")], "ok": 2.5}, "tup": (float("inf"), "x")}
    out = clean(doc)
    assert out["ratio"] is None and out["ratio_null_reason"] == "not finite (nan)"
    assert out["ci_low"] is None and out["ci_low_null_reason"] == "not finite (-inf)"
    assert out["ci_high_null_reason"] == "not finite (inf)"
    assert out["nested"] == {"p50": [1.0, None], "ok": 2.5}
    assert out["tup"] == [None, "x"]
    assert math.isnan(doc["ratio"]), "clean must not modify its input"


def test_clean_keeps_an_existing_reason():
    out = clean({"ratio": float("nan"), "ratio_null_reason": "one paired round"})
    assert out == {"ratio": None, "ratio_null_reason": "one paired round"}


def test_dumps_is_standard_json_with_numpy_values():
    doc = {"a": np.float64("nan"), "b": np.float32(1.5), "c": np.array([1.0, np.inf]), "d": np.int64(3)}
    s = dumps(doc, indent=1)
    assert "NaN" not in s and "Infinity" not in s
    back = _strict_loads(s)
    assert back["a"] is None and back["a_null_reason"] == "not finite (nan)"
    assert back["b"] == 1.5 and back["c"] == [1.0, None] and back["d"] == 3


def test_dumps_cleans_what_default_produces():
    class Obj:
        pass
    s = dumps({"x": Obj()}, default=lambda o: {"v": float("nan")})
    assert _strict_loads(s) == {"x": {"v": None, "v_null_reason": "not finite (nan)"}}


def test_plain_json_dumps_would_have_written_nan():
    # the failure jsonsafe exists for: Python's json writes bare NaN that RFC 8259 parsers reject
    with pytest.raises(ValueError):
        _strict_loads(json.dumps({"r": float("nan")}))
    assert _strict_loads(dumps({"r": float("nan")}))["r"] is None
