"""What more workers buy on `local`: the closed-loop ``concurrency`` scenario (C clients) and the server
scenario with N workers, ONNX Runtime (the shared session) and OpenVINO (an infer request per worker),
one runtime thread per call so that workers, not intra-op threads, use the cores.  Configurations are
measured in interleaved rounds (every configuration once per round, the order rotated), medians of
the rounds reported.  Writes section `concurrency` of docs/BENCHMARKS.md.

    .venv/bin/python bench/bench_concurrency.py [--rounds 3] [--duration 2] [--model ocr-cls]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import load, machine, md_table, stamp, write_section  # noqa: E402

# (label, options): C clients served by W workers; a server rate near the single worker's capacity
CONFIGS = [
    ("concurrency C=1", {"scenario": "concurrency", "concurrency": 1}),
    ("concurrency C=2, 1 worker", {"scenario": "concurrency", "concurrency": 2, "workers": 1}),
    ("concurrency C=2, 2 workers", {"scenario": "concurrency", "concurrency": 2}),
    ("concurrency C=4, 2 workers", {"scenario": "concurrency", "concurrency": 4, "workers": 2}),
]


def bench(sess, bid: str, opts: dict, duration: float) -> dict:
    r = sess.agent("bench", {"root": sess.root, "bundle_id": bid,
                             "options": {"min_iters": 5, "threads": 1, "timeout_s": 300, "engine": "edgeopt", **opts,
                                         "duration_s": duration}},
                   timeout=400)
    if not r.get("ok"):
        raise RuntimeError(r.get("error"))
    return r["bench"]["scenario"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--model", default="ocr-cls")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()

    from edgeopt.deploy import DeviceSession, load_bundle
    from edgeopt.fixtures import path as fixture_path
    from edgeopt.inventory import local_device
    from edgeopt.pipeline import build

    work = Path(tempfile.mkdtemp(prefix="edgeopt-bench-conc-"))
    shapes = {"ocr-cls": {"x": [1, 3, 48, 192]}, "ocr-rec": {"x": [1, 3, 48, 320]}}[a.model]
    before = load()
    rows = []
    with DeviceSession.open(local_device(str(work / "root"))) as sess:
        rep = build(fixture_path(a.model), ["cpu", "intel-cpu"], ["fp32"], shapes=shapes,
                    calib=str(fixture_path("images")), preprocess="preset=pm1", out=work / "dist", n_calib=8, n_val=8)
        bundles = [load_bundle(r.bundle) for r in rep.results if r.bundle]
        sess.push(bundles)
        for b in bundles:
            # the server rate: 1.5x what one worker serves in a closed loop, so one worker queues
            one = bench(sess, b.bundle_id, CONFIGS[0][1], a.duration)["completed_qps"]
            configs = CONFIGS + [(f"server {1.5 * one:.0f}/s, {w} worker(s)",
                                  {"scenario": "server", "target_qps": round(1.5 * one, 1), "workers": w})
                                 for w in (1, 2)]
            if b.backend == "openvino":  # under the LATENCY hint one stream serves every infer request
                tput = {"runner": {"hint": "THROUGHPUT"}, "threads": None}
                configs += [("concurrency C=2, 2 workers, THROUGHPUT hint", {**CONFIGS[2][1], **tput}),
                            (f"server {1.5 * one:.0f}/s, 2 workers, THROUGHPUT hint",
                             {"scenario": "server", "target_qps": round(1.5 * one, 1), "workers": 2, **tput})]
            got: dict[str, list[dict]] = {label: [] for label, _ in configs}
            for r in range(a.rounds):
                k = r % len(configs)
                for label, opts in configs[k:] + configs[:k]:  # rotated: no configuration always first
                    got[label].append(bench(sess, b.bundle_id, opts, a.duration))
                    print(b.target, label, f"{got[label][-1]['completed_qps']:.1f}/s", flush=True)
            base = statistics.median(x["completed_qps"] for x in got[configs[0][0]])
            for label, _ in configs:
                runs = got[label]
                qps = statistics.median(x["completed_qps"] for x in runs)
                rows.append({"target": b.target, "backend": b.backend, "configuration": label,
                             "completed /s": f"{qps:.1f}", "vs C=1": f"{qps / base:.2f}x",
                             "p50 ms": f"{statistics.median(x['latency_ms']['p50'] for x in runs):.2f}",
                             "p99 ms": f"{statistics.median(x['latency_ms']['p99'] for x in runs):.2f}",
                             "queries": str(sum(x["queries"] for x in runs))})
    body = (f"### Workers and closed-loop concurrency (`bench/bench_concurrency.py`)\n\n{stamp()} · {machine()} · "
            f"load before: {before}\n\nPP-OCR {a.model} fp32 on `local`, one runtime thread per call, {a.rounds} "
            f"interleaved rounds of {a.duration:g} s per configuration (medians). `concurrency` is a closed loop "
            "(each client sends its next query when the last is answered: the queueing an open arrival process "
            "builds is hidden); `server` is the agent's open-loop Poisson server at 1.5x one worker's closed-loop "
            "rate, latency from each query's scheduled arrival. OpenVINO's LATENCY hint (the bundles' default) "
            "compiles one stream, so its infer requests take turns; the THROUGHPUT rows let it choose streams "
            "and threads.\n\n"
            + md_table(rows, [(k, k) for k in rows[0]]) + "\n")
    print(body)
    if not a.no_write:
        write_section("concurrency", body)


if __name__ == "__main__":
    main()
