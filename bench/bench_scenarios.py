"""Load scenarios on `local`: MLPerf LoadGen's four scenarios (with its AccuracyOnly check), max server
QPS under a p99 bound (``edgeopt.maxqps.search``, the one `bench --find-max-qps` runs), and the
agreement of the agent's own single-stream p50 with LoadGen's single-stream p50.  Writes section
`scenarios` of docs/BENCHMARKS.md.

Agreement is measured in pairs inside one bench child (a LoadGen single-stream run, then the agent's
timed loop, same bundle, same warm process), repeated ``--pairs`` times; the figure is the median of
the per-pair ratios.  Two separate processes of one bundle can differ by a few percent for their
whole life (docs/BENCHMARKS.md `gate`), which pairs in one process do not see.

    .venv/bin/python bench/bench_scenarios.py [--targets cpu,intel-cpu,mobile] [--models ocr-cls,ocr-rec]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import load, machine, md_table, stamp, write_section  # noqa: E402


def bench(sess, bid: str, **opts) -> dict:
    r = sess.agent("bench", {"root": sess.root, "bundle_id": bid,
                             "options": {"duration_s": 2.0, "timeout_s": 300, **opts}}, timeout=400)
    if not r.get("ok"):
        raise RuntimeError(r.get("error"))
    return r["bench"]


def _acc(s: dict) -> str:
    a = s.get("accuracy")
    if not a:
        return ""
    return ("passed" if a.get("passed") else "FAILED") + ("" if a.get("same_as_direct") else " (differs from direct)")


def _rate(s: dict) -> str:
    r = s.get("completed_qps") or s.get("samples_per_second")
    return f"{r:.1f}" if r else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="cpu,intel-cpu,mobile")
    ap.add_argument("--bound-ms", default="ocr-cls=20,ocr-rec=100",
                    help="the p99 bound of the server scenario and the max-QPS search, per model (MODEL=MS,...)")
    ap.add_argument("--probe-s", type=float, default=30.0, help="longest max-QPS probe (p99 needs 662 queries)")
    ap.add_argument("--models", default="ocr-cls,ocr-rec")
    ap.add_argument("--pairs", type=int, default=9)
    ap.add_argument("--agree-threads", type=int, default=1,
                    help="runtime threads in the agreement pairs (1: another job on the other core cannot stall "
                         "a parallel op; 0: the runtime's default)")
    ap.add_argument("--agree-only", action="store_true",
                    help="only the agreement pairs (written to section scenarios-agree)")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    bounds = {k: float(v) for k, _, v in (x.partition("=") for x in a.bound_ms.split(","))}

    from edgeopt.deploy import DeviceSession, load_bundle
    from edgeopt.fixtures import path as fixture_path
    from edgeopt.inventory import local_device
    from edgeopt.maxqps import search
    from edgeopt.pipeline import build

    work = Path(tempfile.mkdtemp(prefix="edgeopt-bench-scen-"))
    models = {"ocr-cls": ({"x": [1, 3, 48, 192]}, "preset=pm1"), "ocr-rec": ({"x": [1, 3, 48, 320]}, "preset=pm1")}
    rows, agree = [], []
    load_before = load()
    dev = local_device(str(work / "root"))
    with DeviceSession.open(dev) as sess:
        for name, (shape, pre) in ((k, v) for k, v in models.items() if k in a.models.split(",")):
            rep = build(fixture_path(name), a.targets.split(","), ["fp32"], shapes=shape,
                        calib=str(fixture_path("images")), preprocess=pre, out=work / "dist", n_calib=8, n_val=8)
            for res in rep.results:
                if not res.bundle:
                    print(f"{name} {res.target}: not built ({res.status})", flush=True)
                    continue
                b = load_bundle(res.bundle)
                sess.push([b])
                own, lg = [], []
                for _ in range(a.pairs):  # one child each: LoadGen's single-stream run, then the agent's loop
                    r = bench(sess, b.bundle_id, scenario="single-stream", engine="loadgen", min_iters=1,
                              loadgen_accuracy=False, **({"threads": a.agree_threads} if a.agree_threads else {}))
                    own.append(r["latency_ms"]["p50"])
                    lg.append(r["scenario"]["latency_ms"]["p50"])
                ratios = sorted(x / y for x, y in zip(lg, own))
                po = statistics.median(own)
                agree.append({"model": name, "target": res.target, "agent p50 ms (median)": f"{po:.3f}",
                              "LoadGen p50 ms (median)": f"{statistics.median(lg):.3f}",
                              "LoadGen / agent, median of pairs": f"{statistics.median(ratios):.3f}",
                              "pairs' range": f"{ratios[0]:.3f}–{ratios[-1]:.3f}"})
                print(agree[-1], flush=True)
                if a.agree_only:
                    continue
                t0 = time.perf_counter()
                for sc, extra in (("single-stream", {}), ("multi-stream", {"samples_per_query": 4}),
                                  ("server", {"target_qps": max(5.0, 0.5 * 1000 / po), "latency_bound_ms": bounds[name],
                                              "latency_percentile": 99}),
                                  ("offline", {"target_qps": 1000 / po})):
                    s = bench(sess, b.bundle_id, scenario=sc, engine="loadgen", min_iters=1, **extra)["scenario"]
                    lat = s["latency_ms"]
                    rows.append({"model": name, "target": res.target, "scenario": sc,
                                 "LoadGen verdict": "VALID" if s["valid"] else "INVALID: " + ", ".join(
                                     f"{r}: NO" for r in s.get("invalid_reasons") or []),
                                 "p50 ms": f"{lat.get('p50', float('nan')):.2f}", "p99 ms": f"{lat.get('p99', float('nan')):.2f}",
                                 "rate /s": _rate(s),
                                 "accuracy (AccuracyOnly)": _acc(s),
                                 "settings": ", ".join(f"{k}={v:g}" for k, v in extra.items())})
                    print(rows[-1], flush=True)
                m = search(sess, b.bundle_id, bounds[name], 99.0, engine="loadgen", max_probe_s=a.probe_s)
                rows.append({"model": name, "target": res.target, "scenario": f"server, max QPS with p99 <= {bounds[name]:g} ms",
                             "LoadGen verdict": f"{m['max_qps']:.1f} QPS VALID" if m["max_qps"] else
                             ("no VALID rate found" + (f" ({m['note']})" if m.get("note") else "")),
                             "p50 ms": "", "p99 ms": "", "rate /s": f"{m['max_qps'] or 0:.1f}", "accuracy (AccuracyOnly)": "",
                             "settings": f"{len(m['probes'])} probes, {time.perf_counter() - t0:.0f}s for this bundle"})
                print(rows[-1], flush=True)
    if a.agree_only:
        body = (f"#### Agreement of methods: agent vs LoadGen single-stream p50 (`bench/bench_scenarios.py "
                f"--agree-only`)\n\n{stamp()} · {machine()} · load before: {load_before} · load after: {load()}\n\n"
                f"{a.pairs} pairs per fp32 bundle, each pair in one bench child (LoadGen's single-stream run, then "
                f"the agent's own timed loop, 2 s each; runtime threads: {a.agree_threads or 'default'}); the "
                "figure is the median of the per-pair ratios (goal: within 3%).\n\n"
                + md_table(agree, [(k, k) for k in agree[0]]) + "\n")
        print(body)
        if not a.no_write:
            write_section("scenarios-agree", body)
        return
    body = (f"### Load scenarios (`bench/bench_scenarios.py`)\n\n{stamp()} · {machine()} · load before: {load_before}"
            f" · load after: {load()}\n\n"
            "MLPerf LoadGen (mlcommons-loadgen 6.0.17) in the agent's bench child on `local`, fp32 bundles of the "
            f"PP-OCR {', '.join(a.models.split(','))}; short runs (2 s), so tail percentiles are often INVALID by "
            "LoadGen's early-stopping rule — reported, never rounded up. \"accuracy (AccuracyOnly)\": the bench's "
            "accuracy check run again through LoadGen's AccuracyOnly mode in that scenario, outputs carried in "
            "its accuracy log (\"differs\" would mean its verdict is not the agent's own pass's). Max QPS: "
            f"`edgeopt.maxqps.search` (bisection on LoadGen's server VALID, probes ≤ {a.probe_s:g} s). Server bounds: "
            + ", ".join(f"{k} p99 ≤ {v:g} ms" for k, v in bounds.items()) + ". \"rate /s\": completed queries "
            "per second (server), samples per second (offline); single- and multi-stream have none.\n\n"
            + md_table(rows, [(k, k) for k in rows[0]])
            + f"\n\nAgreement of methods ({a.pairs} pairs per bundle, each pair in one bench child: LoadGen's "
            "single-stream run, then the agent's own timed loop, 2 s each; runtime threads: "
            f"{a.agree_threads or 'default'}):\n\n"
            + md_table(agree, [(k, k) for k in agree[0]]) + "\n")
    print(body)
    if not a.no_write:
        write_section("scenarios", body)


if __name__ == "__main__":
    main()
