"""What the host believes of an agent's reply: one validator for every reply that comes from a device.

Every agent call goes through ``DeviceSession.agent`` (bench, pairbench for the gate and the rollout,
probe, has, list, verify, install, check, evaluate, slots), which hands the agent's stdout to ``believe``
before any number in it is used. A reply is believed only when

- it parses as *standard* JSON: no ``NaN``/``Infinity`` (the agent writes them as null with a
  ``<key>_null_reason``), no number that overflows a float (``1e400``), no integer longer than 30 digits;
- it is bounded: nesting at most ``MAX_DEPTH`` levels (checked before parsing: a 200 000-deep list would
  otherwise end in ``RecursionError``), at most ``MAX_NODES`` values, strings of at most ``MAX_STR``
  characters, every number within ±``MAX_ABS``;
- what the host reads has the type it reads (``ok`` a bool, ``error`` an object, ``bench`` /
  ``latency_ms`` / ``accuracy`` objects, latencies numbers …);
- numbers are physically possible: anything named as a time, size, rate, count, energy or power
  (``*_ms``, ``*_s``, ``*_mb``, ``*_ips``, ``*_qps``, ``*_bytes``, ``*_j``, ``*_w``, ``*_mhz``, ``*_pct``,
  ``iterations`` …, and everything under such a key) is ≥ 0; a latency's p50 / mean and every timed
  sample > 0; percentiles in order (min ≤ p50 ≤ … ≤ max); shares (top-1, flip rate, box match …) in
  [0, 1]; cosines in [-1, 1].

A reply that fails raises ``ReplyNotBelievable`` (a ``DeviceError``: exit 4) naming the device, the verb
and the field: ``a: the agent's bench reply is not believable: bench.latency_ms.p50 = -0.68 (a latency
must be > 0)``. The caller fails that device (``bench``: status ``refused``, nothing of the reply kept)
and goes on with the others.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from edgeopt.errors import DeviceError

MAX_DEPTH = 64  # the agent's deepest reply (probe / scenario) is < 10 levels
MAX_NODES = 2_000_000  # values in one reply (a bench with 2000 samples is ~3000)
MAX_STR = 16 << 20  # characters in one string (a TensorRT build log is the longest)
MAX_ABS = 1e15  # any number: a byte count of a petabyte, an epoch time in ms, fit
MAX_INT_DIGITS = 30

# Numbers under keys with these endings (or these names), and everything under such a key, are >= 0.
NONNEG_SUFFIXES = ("_ms", "_s", "_mb", "_ips", "_qps", "_bytes", "_j", "_w", "_mhz", "_uj", "_pct", "_kb")
NONNEG_KEYS = frozenset({
    "iterations", "samples", "inferences", "batch", "feeds", "validation_samples", "distinct_in_loop", "cores",
    "cores_usable", "cores_physical", "loadavg", "ms", "t", "rounds", "block_iters", "warmup", "n", "files",
    "top1_n", "flips", "boxes", "boxes_out", "boxes_ref", "sequences", "positions", "max_abs", "mean_abs",
    "rel_l2", "max_abs_norm", "max_abs_prob", "slice_rel_l2", "min_iters", "max_iters", "threads", "workers",
    "concurrency", "calls", "bytes_sent", "size", "after_blocks"})
SHARE_KEYS = frozenset({
    "top1", "top5_contains_ref_top1", "non_finite", "flip_rate", "box_match", "box_precision", "box_recall",
    "seq_match", "share", "images_equal", "windows_equal", "agreement", "ref_non_finite", "non_finite_as_ref"})
# the latency summary: p50 and mean of a timed loop cannot be 0 or less; the percentiles are ordered
_POSITIVE_LATENCY = ("p50", "mean")
_ORDER = ("min", "p50", "p90", "p95", "p99", "p99_9", "max")
_POSITIVE_LISTS = frozenset({"samples_ms", "ms"})  # every timed sample

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")


class ReplyNotBelievable(DeviceError):
    """An agent's reply that cannot be true (or cannot be read safely): that device's failure, in one line."""


class _Bad(ValueError):
    def __init__(self, where: str, value: Any, why: str) -> None:
        super().__init__(f"{where} = {_show(value)} ({why})" if where else why)


def _show(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (dict, list)):
        return f"a JSON {'object' if isinstance(v, dict) else 'list'}"
    s = json.dumps(v) if isinstance(v, str) else repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


# --- parsing: standard JSON only, bounded ---------------------------------------------------------------
def _constant(name: str) -> Any:
    raise _Bad("", None, f"a bare {name} in the reply (not standard JSON: a number that is not finite)")


def _float(s: str) -> float:
    x = float(s)
    if not math.isfinite(x):
        raise _Bad("", None, f"the number {s[:40]} overflows a float")
    return x


def _int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_INT_DIGITS:
        raise _Bad("", None, f"an integer of {len(s.lstrip('-'))} digits")
    return int(s)


def depth(text: str) -> int:
    """How deeply ``text``'s JSON nests (brackets outside strings), without parsing it."""
    best = level = 0
    for m in _BRACKETS.finditer(_STRING.sub('""', text)):
        if m.group() in "[{":
            level += 1
            if level > best:
                best = level
        else:
            level -= 1
    return best


def parse_line(line: str) -> Any:
    """One line as strict, bounded JSON; ``_Bad`` when it is JSON that cannot be believed, ``ValueError``
    (json's) when it is not JSON at all."""
    if depth(line) > MAX_DEPTH:
        raise _Bad("", None, f"the reply nests deeper than {MAX_DEPTH} levels")
    return json.loads(line, parse_constant=_constant, parse_float=_float, parse_int=_int)


def last_json(out: str) -> Any:
    """The last line of ``out`` that is JSON (the agent prints one; a login banner may precede it), parsed
    strictly; None when there is none. Raises ``_Bad`` when that line is JSON that cannot be believed."""
    for line in reversed((out or "").strip().splitlines()):
        s = line.strip()
        if not s:
            continue
        try:
            return parse_line(s)
        except _Bad:
            if s.startswith(("{", "[")):
                raise
        except (ValueError, RecursionError):
            continue
    return None


# --- the schema -------------------------------------------------------------------------------------
NUM = "number"
_T = {dict: "an object", list: "a list", str: "a string", bool: "true or false", NUM: "a number", None: "null"}


def _is(v: Any, t: Any) -> bool:
    if t is None:
        return v is None
    if t == NUM:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t is bool:
        return isinstance(v, bool)
    return isinstance(v, t)


def _want(v: Any, where: str, *types: Any) -> None:
    if not any(_is(v, t) for t in types):
        raise _Bad(where, v, "must be " + " or ".join(_T[t] for t in types))


_OUTPUT = {"passed": (bool, None), "reasons": (list, None), "metrics": (dict, None)}
_ACCURACY = {"passed": (bool, None), "outputs": (dict, None), "tolerance": (dict, None), "samples": (NUM, None),
             "precision": (str, None),
             "data": ((dict, None), {"n": (NUM, None), "kind": (str, None)})}
_ENV = {"emulated": (bool, None), "emulator": (str, None), "cpu_model": (str, None), "cores": (NUM, None),
        "cores_usable": (NUM, None), "freq_mhz": (NUM, None), "loadavg": (list, None),
        "after": ((dict, None), {"loadavg": (list, None), "freq_mhz": (NUM, None)})}
_ENERGY = {"joules_per_inference": (NUM, None), "mean_power_w": (NUM, None), "energy_j": (NUM, None),
           "window_s": (NUM, None), "inferences": (NUM, None), "samples": (NUM, None), "source": (str, None),
           "scope": (str, None), "why_not": (str, None), "resolution": (str, NUM, None), "rails": (dict, list, None),
           "others": (list, None), "unavailable": (dict, None)}
_BENCH = {"latency_ms": (dict,), "iterations": (NUM,), "throughput_ips": (NUM,), "duration_s": (NUM, None),
          "accuracy": ((dict, None), _ACCURACY), "energy": ((dict, None), _ENERGY),
          "environment": ((dict, None), _ENV), "inputs": ((dict, None), {"batch": (NUM, None)}),
          "runner": ((dict, None), {"runtime": (str, None), "version": (str, None)}),
          "artifact": ((dict, None), {"input_shapes": (dict, None), "artifact_bytes": (NUM, None),
                                      "build_warnings": (list, None)}),
          "options": (dict, None), "samples_ms": (list, None), "scenario": (dict, None),
          "load_s": (NUM, None), "first_inference_s": (NUM, None), "peak_rss_mb": (NUM, None),
          "model": (str, None), "target": (str, None), "precision": (str, None)}
_BENCH_FAILED = {"stage": (str, None), "elapsed_s": (NUM, None), "stderr_tail": (str, list, None)}
_PAIR = {"blocks": (list,), "arms": (list,), "calibration": (list, None), "environment": ((dict, None), _ENV),
         "budget_hit": (bool, None)}
_ARM = {"accuracy": ((dict, None), _ACCURACY), "decisions": (list, None), "decisions_kind": (str, None),
        "bundle_id": (str, None), "load_s": (NUM, None), "runner": (dict, None), "arm": (str, None)}


def _fields(d: Any, where: str, spec: dict[str, Any]) -> None:
    """``spec``: key -> allowed types, or (allowed types, the spec of the object it holds)."""
    for k, rule in spec.items():
        if k not in d:
            continue
        types, sub = (rule[0], rule[1]) if isinstance(rule[0], tuple) else (rule, None)
        _want(d[k], f"{where}.{k}", *types)
        if sub is not None and isinstance(d[k], dict):
            _fields(d[k], f"{where}.{k}", sub)


def _accuracy(acc: Any, where: str) -> None:
    if acc is None:
        return
    _fields(acc, where, _ACCURACY)
    for name, o in (acc.get("outputs") or {}).items():
        _want(o, f"{where}.outputs.{name}", dict)
        _fields(o, f"{where}.outputs.{name}", _OUTPUT)
        for i, r in enumerate(o.get("reasons") or []):
            _want(r, f"{where}.outputs.{name}.reasons[{i}]", str)
        for k, v in (o.get("metrics") or {}).items():
            _want(v, f"{where}.outputs.{name}.metrics.{k}", NUM, None)


def _latency(lat: dict[str, Any], where: str) -> None:
    for k in _POSITIVE_LATENCY:
        v = lat.get(k)
        if v is not None:
            _want(v, f"{where}.{k}", NUM)
            if v <= 0:
                raise _Bad(f"{where}.{k}", v, "a latency must be > 0")
    got = [(k, lat[k]) for k in _ORDER if _is(lat.get(k), NUM)]
    for (ka, a), (kb, b) in zip(got, got[1:]):
        if a > b * (1 + 1e-9) + 1e-12:
            raise _Bad(f"{where}.{ka}", a, f"above {where}.{kb} = {_show(b)}: percentiles out of order")


def _bench(b: Any, where: str, ok: bool) -> None:
    _want(b, where, dict)
    if not ok:
        _fields(b, where, _BENCH_FAILED)
        return
    _fields(b, where, _BENCH)
    if "latency_ms" not in b:
        raise _Bad(f"{where}.latency_ms", None, "missing: a bench reply without latencies")
    _latency(b["latency_ms"], f"{where}.latency_ms")
    _accuracy(b.get("accuracy"), f"{where}.accuracy")
    if isinstance(b.get("environment"), dict):
        _fields(b["environment"], f"{where}.environment", _ENV)
    if isinstance(b.get("energy"), dict):
        _fields(b["energy"], f"{where}.energy", _ENERGY)
    for i, s in enumerate(b.get("samples_ms") or []):
        _want(s, f"{where}.samples_ms[{i}]", NUM)
    sc = b.get("scenario")
    if isinstance(sc, dict) and isinstance(sc.get("latency_ms"), dict):
        _latency(sc["latency_ms"], f"{where}.scenario.latency_ms")
        _accuracy(sc.get("accuracy") if isinstance(sc.get("accuracy"), dict) else None, f"{where}.scenario.accuracy")


def _pairbench(p: Any, where: str, ok: bool) -> None:
    _want(p, where, dict)
    if not ok:
        _fields(p, where, _BENCH_FAILED)
        return
    _fields(p, where, _PAIR)
    for i, blk in enumerate(p.get("blocks") or []):
        w = f"{where}.blocks[{i}]"
        _want(blk, w, dict)
        if blk.get("arm") not in ("A", "B"):
            raise _Bad(f"{w}.arm", blk.get("arm"), 'must be "A" or "B"')
        _want(blk.get("ms"), f"{w}.ms", list)
        if not blk["ms"]:
            raise _Bad(f"{w}.ms", blk["ms"], "a block without a timed run")
        for j, s in enumerate(blk["ms"]):
            _want(s, f"{w}.ms[{j}]", NUM)
    arms = p.get("arms") or []
    if len(arms) != 2:
        raise _Bad(f"{where}.arms", arms, "must name the two arms (baseline, candidate)")
    for i, arm in enumerate(arms):
        _want(arm, f"{where}.arms[{i}]", dict)
        _fields(arm, f"{where}.arms[{i}]", _ARM)
        _accuracy(arm.get("accuracy"), f"{where}.arms[{i}].accuracy")
    for i, c in enumerate(p.get("calibration") or []):
        _want(c, f"{where}.calibration[{i}]", dict)


def _has(reply: dict[str, Any]) -> None:
    _want(reply.get("has"), "has", dict)
    for k, v in reply["has"].items():
        _want(v, f"has.{k[:16]}", bool)
    _want(reply.get("free_mb"), "free_mb", NUM, None)
    _want(reply.get("read_only"), "read_only", bool, None)


def _verify(v: Any) -> None:
    _want(v, "verify", dict)
    _want(v.get("ok"), "verify.ok", bool)
    _want(v.get("problems", []), "verify.problems", list)
    for i, p in enumerate(v.get("problems") or []):
        _want(p, f"verify.problems[{i}]", dict)
        _want(p.get("file"), f"verify.problems[{i}].file", str)
        _want(p.get("problem"), f"verify.problems[{i}].problem", str)


def _list(lst: Any) -> None:
    _want(lst, "list", dict)
    _want(lst.get("bundles", []), "list.bundles", list)
    for i, b in enumerate(lst.get("bundles") or []):
        _want(b, f"list.bundles[{i}]", dict)
        _want(b.get("bundle_id"), f"list.bundles[{i}].bundle_id", str)
    _want(lst.get("slots", {}), "list.slots", dict)
    for name, s in (lst.get("slots") or {}).items():
        _want(s, f"list.slots.{name}", dict)
        _want(s.get("current"), f"list.slots.{name}.current", str, None)
        _want(s.get("history", []), f"list.slots.{name}.history", list)


def _walk(x: Any, where: str, key: str, nonneg: bool, count: list[int]) -> None:
    """The rules every value follows wherever it is: bounded size, numbers in range, signs by name."""
    count[0] += 1
    if count[0] > MAX_NODES:
        raise _Bad("", None, f"more than {MAX_NODES} values in one reply")
    if isinstance(x, dict):
        for k, v in x.items():
            kn = nonneg or k.endswith(NONNEG_SUFFIXES) or k in NONNEG_KEYS
            _walk(v, f"{where}.{k}" if where else k, k, kn, count)
    elif isinstance(x, list):
        for i, v in enumerate(x):
            _walk(v, f"{where}[{i}]", key, nonneg, count)
    elif isinstance(x, str):
        if len(x) > MAX_STR:
            raise _Bad(where, x[:20], f"a string of {len(x)} characters")
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        if not math.isfinite(x) or abs(x) > MAX_ABS:
            raise _Bad(where, x, "out of any physical range")
        if nonneg and x < 0:
            raise _Bad(where, x, "a time, size, rate or count cannot be negative")
        if key in _POSITIVE_LISTS and where.endswith("]") and x <= 0:
            raise _Bad(where, x, "a timed run must take > 0 ms")
        if key in SHARE_KEYS and not 0 <= x <= 1:
            raise _Bad(where, x, "a share must be within [0, 1]")
        if "cosine" in key and not key.endswith("_index") and not -1 - 1e-6 <= x <= 1 + 1e-6:
            raise _Bad(where, x, "a cosine must be within [-1, 1]")


def check(verb: str, reply: Any) -> None:
    """Raise ``_Bad`` naming the first field of ``reply`` (an agent's reply to ``verb``) that cannot be true."""
    _want(reply, "the reply", dict)
    _walk(reply, "", "", False, [0])
    _want(reply.get("ok"), "ok", bool)
    ok = reply["ok"]
    err = reply.get("error")
    _want(err, "error", dict, None)
    if err is not None:
        _want(err.get("type"), "error.type", str, None)
        _want(err.get("message"), "error.message", str, None)
    if "bench" in reply and verb in ("bench", "pairbench"):
        if reply["bench"] is not None or ok:
            _bench(reply["bench"], "bench", ok)
    elif verb == "bench" and ok:
        raise _Bad("bench", None, "missing from a reply that says ok")
    if verb == "pairbench" and ("pairbench" in reply or ok):
        _pairbench(reply.get("pairbench"), "pairbench", ok)
    if verb == "has" and ok:
        _has(reply)
    if verb == "list":
        if ok:
            _list(reply.get("list"))
        if "has" in reply:
            _has(reply)
    if verb == "verify" and "verify" in reply:
        _verify(reply["verify"])
    for body in ("probe", "install", "check", "evaluate", "activate", "commit", "rollback", "gc", "compile"):
        if verb == body and ok:
            _want(reply.get(body, {}), body, dict)
    if verb == "check" and ok:
        _accuracy(reply.get("check"), "check")


def believe(device: str, verb: str, out: str) -> Any:
    """The agent's reply in ``out`` (its stdout), parsed and checked; None when ``out`` holds no JSON line.
    Raises ``ReplyNotBelievable`` (one line naming the field) when the reply cannot be true."""
    try:
        reply = last_json(out)
        if reply is not None:
            check(verb, reply)
        return reply
    except (_Bad, RecursionError) as exc:
        why = str(exc) if isinstance(exc, _Bad) else f"the reply nests too deeply to read ({type(exc).__name__})"
        raise ReplyNotBelievable(f"{device}: the agent's {verb} reply is not believable: {why}",
                                 hint="the device's agent or something between it and the host changed the reply; "
                                      "nothing of it was kept (edgeopt push --verify re-installs the agent)") from None
