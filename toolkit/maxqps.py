"""``bench --find-max-qps``: the highest server rate a device sustains within a latency bound.

Per (device, bundle): a short single-stream bench gives the service time (a bound below its p50 is not met
at any rate: said at once, no probe); the search starts at half
the rate that service time allows and bisects on the *server* scenario (LoadGen's own VALID/INVALID
when installed on the device, else the agent's open-loop Poisson server, labelled), each probe long
enough for the percentile's sample minimum (662 queries for p99, 64 for p90) where the rate allows,
never past ``max_probe_s``. It stops when the valid and invalid rates are within ``resolution``
(default 10%) or after ``max_probes``; the answer is the highest VALID rate found, with every probe.
A probe that times out (an overloaded device) counts as invalid.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgeopt.errors import DeviceError


def _probe(sess, bundle_id: str, options: dict[str, Any], timeout: float) -> dict[str, Any]:
    r = sess.agent("bench", {"root": sess.root, "bundle_id": bundle_id, "options": options}, timeout=timeout)
    if not r.get("ok"):
        e = r.get("error") or {}
        raise DeviceError(f"{sess.device.name}: bench failed: {e.get('type')}: {e.get('message')}")
    return r["bench"]


def search(sess, bundle_id: str, bound_ms: float, percentile: float = 99.0, engine: str | None = None,
           threads: int | None = None, resolution: float = 0.10, max_probes: int = 10, max_probe_s: float = 20.0,
           progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Bisection on the server scenario; ``{"max_qps", "probes": [...], "engine", "service_ms"}``."""
    base = {"timeout_s": 600, "min_iters": 1, **({"threads": threads} if threads else {}),
            **({"engine": engine} if engine else {})}
    ss = _probe(sess, bundle_id, {**base, "duration_s": 1.0, "min_iters": 20}, 660)
    service = float(ss["latency_ms"]["p50"])
    need = 662 if percentile >= 99 else 64 if percentile >= 90 else 1
    q_min = 1.2 * need / max_probe_s  # below this rate a probe cannot collect the percentile's samples in time
    lo, hi, probes, engine_used, note = 0.0, None, [], None, None
    if percentile >= 50 and service > bound_ms:
        # half the queries take longer than the bound with nothing queued: queueing only adds to that, so no
        # rate can keep pNN (NN >= 50) within it -- said now, not after minutes of probes
        note = (f"the bound is not met at any rate: one query at a time already takes {service:.3g} ms (p50, "
                f"single-stream) > p{percentile:g} <= {bound_ms:g} ms")
        progress(f"{sess.device.name}: {note}")
        return {"max_qps": None, "verdict": "not met", "bound": {"percentile": percentile, "ms": bound_ms},
                "service_p50_ms": service, "engine": engine, "probes": [], "resolution": resolution,
                "converged": False, "note": note}
    q = max(q_min, 500.0 / max(service, 1e-3))  # half the rate the service time allows
    while len(probes) < max_probes:
        dur = min(max_probe_s, max(2.0, (1.2 * need + 40) / q))  # Poisson arrivals: a margin over the minimum
        opts = {**base, "scenario": "server", "target_qps": round(q, 3), "latency_bound_ms": bound_ms,
                "latency_percentile": percentile, "duration_s": dur, "timeout_s": dur * 6 + 60}
        try:
            sc = _probe(sess, bundle_id, opts, opts["timeout_s"] + 30)["scenario"]
            valid = bool(sc.get("valid"))
            engine_used = engine_used or sc.get("engine")
            measured = (sc.get("latency_ms") or {}).get(f"p{percentile:g}")
            why = ", ".join(f"{r}: NO" for r in sc.get("invalid_reasons") or []) or None
        except DeviceError as exc:
            sc, valid, measured, why = {}, False, None, f"probe failed: {exc.message}"[:200]
        over = measured is None or measured > bound_ms or "Performance constraints satisfied" in (why or "")
        # enough queries, p99 within the bound, yet LoadGen's early-stopping estimate says NO: the tail sits so
        # close to the bound that LoadGen cannot vouch for it at this rate -- a rate too high, not a probe too short
        over = over or (not valid and int(sc.get("samples_served") or 0) >= need)
        probes.append({"qps": round(q, 2), "valid": valid, f"p{percentile:g}_ms": measured, "seconds": round(dur, 1),
                       **({"why": why or ("latency over the bound" if over else "too few queries")}
                          if not valid else {})})
        progress(f"{sess.device.name}: {q:.1f} QPS -> {'VALID' if valid else 'INVALID'}"
                 + (f" (p{percentile:g} {measured:.2f} ms)" if measured is not None else ""))
        if valid:
            lo = q
            q = q * 2 if hi is None else (q + hi) / 2
        elif over:  # the device could not keep the bound at this rate
            hi = q
            q = (lo + hi) / 2 if lo else q / 2
        else:  # within the bound but too few queries to judge the percentile: more time would be needed
            note = (f"at {q:.1f} QPS a {dur:.0f}s probe holds too few queries for p{percentile:g} "
                    f"({need} needed); raise the probe time")
            break
        if hi is not None and lo and hi / lo <= 1 + resolution:
            break
        if q < q_min:
            note = (f"the bound is not met even at {q_min:.1f} QPS, the lowest rate whose p{percentile:g} a "
                    f"{max_probe_s:g}s probe can judge")
            break
    # met: a rate kept the bound; not met: the bound failed down to the lowest rate a probe can judge (or every
    # probe was over it); undetermined: the search stopped before any probe could judge the percentile
    verdict = "met" if lo else ("undetermined" if note and "too few queries" in note else "not met")
    return {"max_qps": round(lo, 2) if lo else None, "verdict": verdict,
            "bound": {"percentile": percentile, "ms": bound_ms},
            "service_p50_ms": service, "engine": engine_used, "probes": probes,
            "resolution": resolution, "converged": bool(hi is not None and lo and hi / lo <= 1 + resolution),
            **({"note": note} if note else {})}


def find_max_qps(devices: list, bundles: list, bound_ms: float, percentile: float = 99.0, engine: str | None = None,
                 threads: int | None = None, trust_new_host_keys: bool = False, targets: list[str] | None = None,
                 progress: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
    """For every matching (device, bundle): push what is missing, then :func:`search`."""
    from edgeopt.deploy import DeviceSession
    from edgeopt.errors import UsageError
    from edgeopt.fleetbench import plan

    work, skipped = plan(devices, bundles, targets)
    if not work:
        raise UsageError("nothing to measure: " + "; ".join(f"{s['device']}: {s['reason']}" for s in skipped))
    rows = []
    for dev, bs in work:
        try:
            with DeviceSession.open(dev, trust_new_host_keys) as sess:
                push = sess.push(bs)
                failed = {p.bundle_id: p.error for p in push.bundles if p.status == "failed"}
                for b in bs:
                    row = {"device": dev.name, "target": b.target, "precision": b.precision, "model": b.model,
                           "bundle_id": b.bundle_id}
                    if b.bundle_id in failed:
                        rows.append({**row, "status": "failed", "error": failed[b.bundle_id]})
                        continue
                    try:
                        rows.append({**row, "status": "ok", **search(sess, b.bundle_id, bound_ms, percentile, engine,
                                                                     threads, progress=progress)})
                    except DeviceError as exc:
                        rows.append({**row, "status": "failed", "error": exc.message})
        except DeviceError as exc:
            rows += [{"device": dev.name, "target": b.target, "precision": b.precision, "model": b.model,
                      "bundle_id": b.bundle_id, "status": "unreachable", "error": exc.message} for b in bs]
    return rows
