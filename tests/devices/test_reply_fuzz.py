"""Mutated agent replies through the host's one validator (``edgeopt.replies``), the results database and
the report (issue 38): no mutation may end in a traceback, and none may be stored as ``ok`` with a number
that cannot be true. Seeded (reproducible); hypothesis is not a dependency of edgeopt, so the mutations are
drawn with ``random``: each run draws ``RUNS`` mutations per seed from the corpus, the real replies of the
agent's ``bench`` and ``pairbench`` kept in ``tests/devices/data/replies/``."""

from __future__ import annotations

import copy
import json
import math
import random
from pathlib import Path

import pytest

from edgeopt.fleetbench import RunRecord
from edgeopt.replies import ReplyNotBelievable, believe
from edgeopt.reporting import render
from edgeopt.results import ResultsDB

CORPUS = Path(__file__).parent / "data" / "replies"
RUNS = 150


def _paths(x, at=()):
    yield at
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _paths(v, (*at, k))
    elif isinstance(x, list):
        for i, v in enumerate(x[:8]):
            yield from _paths(v, (*at, i))


def _set(x, at, value):
    for k in at[:-1]:
        x = x[k]
    x[at[-1]] = value


def _get(x, at):
    for k in at:
        x = x[k]
    return x


def mutate(reply: dict, rng: random.Random) -> str:
    r = copy.deepcopy(reply)
    paths = [p for p in _paths(r) if p]
    for _ in range(rng.randint(1, 3)):
        at = rng.choice(paths)
        try:
            old = _get(r, at)
        except (TypeError, IndexError, KeyError):  # an earlier mutation replaced what held it
            continue
        kind = rng.choice(["nan", "inf", "neg", "huge", "str", "list", "dict", "none", "bool", "zero", "deep",
                           "tiny"])
        new = {"nan": math.nan, "inf": -math.inf if rng.random() < 0.5 else math.inf,
               "neg": -old if isinstance(old, (int, float)) and not isinstance(old, bool) else -1.5,
               "huge": 1e300, "str": "x", "list": [1, "a"], "dict": {"a": {}}, "none": None, "bool": True,
               "zero": 0, "deep": "DEEP", "tiny": 1e-300}[kind]
        try:
            _set(r, at, new)
        except (TypeError, IndexError, KeyError):
            continue
    text = json.dumps(r)
    return text.replace('"DEEP"', "[" * 5000 + "]" * 5000)


def _record(verb: str, reply: dict) -> dict:
    bench = reply.get("bench") if verb == "bench" else None
    return RunRecord("fuzz", "2026-01-01T00:00:00.000000Z", {"name": "d"}, {"bundle_id": "x" * 64, "model": "m",
                     "target": "cpu", "precision": "fp32", "backend": "onnxruntime"},
                     "ok" if reply.get("ok") else "failed", None if reply.get("ok") else reply.get("error"),
                     bench=bench).as_dict()


@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.glob("*.json")))
@pytest.mark.parametrize("seed", [1, 2])
def test_mutated_replies_are_refused_or_read_without_a_traceback(name, seed, tmp_path):
    verb = name.split(".")[0]
    reply = json.loads((CORPUS / name).read_text())
    assert believe("d", verb, json.dumps(reply)) == reply  # the real reply is believed as it is
    rng = random.Random(seed)
    refused = kept = 0
    with ResultsDB(tmp_path / "r.db") as db:
        for _ in range(RUNS):
            text = mutate(reply, rng)
            try:
                got = believe("d", verb, text)
            except ReplyNotBelievable as exc:
                assert exc.message.startswith("d: the agent's ") and "\n" not in exc.message
                refused += 1
                continue
            kept += 1
            assert isinstance(got, dict)
            if verb == "bench" and got.get("ok"):
                lat = got["bench"]["latency_ms"]
                assert all(v is None or v >= 0 for v in lat.values() if not isinstance(v, (dict, list, str)))
            db.add(_record(verb, got))
        stored = db.query()
    assert refused and kept, (refused, kept)  # the mutations reach both sides of the rule
    for fmt in ("table", "json", "md", "csv"):
        render(stored, fmt)  # the report reads whatever was believed: no traceback
    for rec in stored:
        json.dumps(rec, allow_nan=False)
