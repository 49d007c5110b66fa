"""``edgeopt bench --devices FILE``: push what is missing and measure every bundle on its devices."""

from __future__ import annotations

import argparse

from . import emit_json

HELP = """\
Find the bundles under --dist (by their manifests), match them to devices (a device's `target` in
the inventory picks its bundles; `local` takes every bundle this host can run), push what each
device lacks and run the agent's bench there: load time, first inference, latency percentiles,
throughput, memory and accuracy against the FP32 reference. Devices run in parallel; a dead, slow
or failing device is reported and the others finish. Every run goes to the results database
(--db) with its full JSON; `edgeopt report` compares them. Exit 4 when any device or run failed.
"""


def add_device_args(p: argparse.ArgumentParser) -> None:
    """--devices / --only / --label / --trust-new-host-keys / --parallel (shared by push, bench, run, devices)."""
    p.add_argument("--devices", "-d", default="local", metavar="FILE",
                   help="inventory: a devices YAML or an Ansible inventory (INI/YAML); `local` (default) is this host")
    p.add_argument("--only", action="append", metavar="NAME",
                   help="only these devices (comma-separated, repeatable); `local` is always available")
    p.add_argument("--label", action="append", metavar="LABEL",
                   help="only devices with one of these labels (Ansible groups become labels)")
    p.add_argument("--trust-new-host-keys", action="store_true",
                   help="accept and record the host key of a device not yet in known_hosts (trust on first use); "
                        "a CHANGED key is always refused")
    p.add_argument("--parallel", type=int, default=4, metavar="N", help="devices worked on at once [4]")


def add_bench_args(p: argparse.ArgumentParser) -> None:
    """The bench options sent to the agent, plus --db and --verify."""
    p.add_argument("--duration", type=float, default=3.0, metavar="S", help="seconds of timed runs per bundle [3]")
    p.add_argument("--min-iters", type=int, default=50, help="timed iterations at least [50]")
    p.add_argument("--warmup", type=int, default=10, help="untimed iterations first [10]")
    p.add_argument("--threads", type=int, default=None, help="runtime threads (default: the runtime's choice)")
    p.add_argument("--batch", type=int, default=1, help="batch size [1]")
    p.add_argument("--bench-timeout", type=float, default=300, metavar="S",
                   help="seconds before a hung runtime is killed on the device [300]")
    p.add_argument("--limit-memory", type=float, metavar="MB",
                   help="address-space limit of the runtime process on the device (a runtime over it fails)")
    p.add_argument("--limit-cpu", type=float, metavar="S", help="CPU-seconds limit of the runtime process")
    p.add_argument("--no-samples", action="store_true", help="don't keep per-iteration latencies (no distribution plot)")
    p.add_argument("--verify", action="store_true",
                   help="re-verify bundles already on the device (sha256 of every file); repair corrupted ones")
    p.add_argument("--db", default=None, metavar="FILE", help="results database [./edgeopt-results.db]")
    g = p.add_argument_group("load scenarios (MLPerf LoadGen on the device when installed there)")
    g.add_argument("--scenario", choices=["single-stream", "multi-stream", "server", "offline"],
                   help="also run this scenario after the timed loop (its results under 'scenario')")
    g.add_argument("--target-qps", type=float, metavar="QPS", help="server: arrival rate; offline: expected rate")
    g.add_argument("--latency-bound", metavar="pNN=MS", help="e.g. p99=20ms: the bound LoadGen judges VALID by")
    g.add_argument("--samples-per-query", type=int, metavar="N", help="multi-stream: samples per query")
    g.add_argument("--engine", choices=["loadgen", "edgeopt"],
                   help="loadgen (required for multi-stream/offline) or the agent's own loops [loadgen if installed]")


def parse_latency_bound(text: str | None) -> tuple[float | None, float | None]:
    """``p99=20ms`` -> (99.0, 20.0); refuses percentiles outside (0, 100) and non-positive bounds."""
    import re

    from edgeopt.errors import UsageError

    if not text:
        return None, None
    m = re.fullmatch(r"p(\d+(?:\.\d+)?)=(\d+(?:\.\d+)?)(ms|s)?", text.strip())
    if not m or not 0 < float(m.group(1)) < 100 or float(m.group(2)) <= 0:
        raise UsageError(f"--latency-bound: expected pNN=MS like p99=20ms (a percentile in (0, 100)), got {text!r}")
    return float(m.group(1)), float(m.group(2)) * (1000 if m.group(3) == "s" else 1)


def bench_options(args: argparse.Namespace) -> dict:
    from edgeopt.errors import UsageError

    if args.duration <= 0 or args.min_iters < 1 or args.warmup < 0 or args.batch < 1 or args.bench_timeout <= 0:
        raise UsageError("bench options must be positive (--duration, --min-iters, --batch, --bench-timeout)")
    limits = {k: v for k, v in (("memory_mb", args.limit_memory), ("cpu_s", args.limit_cpu)) if v}
    opts = {"duration_s": args.duration, "min_iters": args.min_iters, "warmup": args.warmup,
            "threads": args.threads, "batch": args.batch, "timeout_s": args.bench_timeout,
            "return_samples": not args.no_samples, "limits": limits}
    scenario = getattr(args, "scenario", None)
    pct, bound = parse_latency_bound(getattr(args, "latency_bound", None))
    if not scenario:
        if any(getattr(args, k, None) is not None for k in ("target_qps", "samples_per_query", "engine")) or bound:
            raise UsageError("--target-qps/--latency-bound/--samples-per-query/--engine need --scenario")
        return opts
    if scenario == "server" and not (args.target_qps and args.target_qps > 0):
        raise UsageError("--scenario server needs --target-qps > 0")
    if args.target_qps is not None and args.target_qps <= 0:
        raise UsageError(f"--target-qps must be above 0, got {args.target_qps:g}")
    if args.samples_per_query is not None and (scenario != "multi-stream" or args.samples_per_query < 1):
        raise UsageError("--samples-per-query takes an integer >= 1 and only with --scenario multi-stream")
    if scenario in ("multi-stream", "offline") and args.engine == "edgeopt":
        raise UsageError(f"the {scenario} scenario needs LoadGen (--engine loadgen; pip install mlcommons-loadgen "
                         "on the device)")
    if scenario == "single-stream" and args.target_qps is not None:
        raise UsageError("--target-qps applies to the server and offline scenarios")
    opts.update({"scenario": scenario, "target_qps": args.target_qps, "samples_per_query": args.samples_per_query,
                 "latency_bound_ms": bound, "latency_percentile": pct, "engine": args.engine})
    return opts


def select_devices(args: argparse.Namespace) -> list:
    from edgeopt.inventory import load_inventory

    inv = load_inventory(args.devices)
    return inv.select(args.only, args.label)


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="push bundles and measure them on devices", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_args(p)
    p.add_argument("--dist", default="dist", help="folder of built bundles [dist]")
    p.add_argument("--targets", "-t", help="only bundles of these targets (comma-separated)")
    add_bench_args(p)
    p.add_argument("--json", action="store_true", help="print the runs as JSON on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def run_bench(args: argparse.Namespace, bundles: list, progress):
    """Shared by ``bench`` and ``run``: bench ``bundles`` on the selected devices, record in the database."""
    from edgeopt.fleetbench import bench_fleet
    from edgeopt.results import DEFAULT_DB, ResultsDB

    devices = select_devices(args)
    targets = [t for t in (getattr(args, "bench_targets", None) or "").split(",") if t] or None
    with ResultsDB(args.db or DEFAULT_DB) as db:
        return bench_fleet(devices, bundles, bench_options(args), targets=targets,
                           trust_new_host_keys=args.trust_new_host_keys, jobs=args.parallel, verify=args.verify,
                           db=db, progress=progress)


def print_fleet(result) -> None:
    from edgeopt.report import render

    print(render([r.as_dict() for r in result.records], "table"), end="")
    for s in result.skipped:
        print(f"skipped {s['device']}: {s['reason']}")
    for p in result.pushes:
        n = sum(b["status"] in ("installed", "repaired") for b in p["bundles"])
        print(f"{p['device']}: pushed {n} bundle(s), {p['bytes_sent']} bytes"
              + (", agent installed" if p["agent"].get("uploaded") else ""))
    for r in result.records:
        sc = (r.bench or {}).get("scenario") if hasattr(r, "bench") else None
        if sc:
            lat = sc.get("latency_ms") or {}
            valid = {True: "VALID", False: "INVALID", None: "not judged"}[sc.get("valid")]
            rate = sc.get("completed_qps") or sc.get("samples_per_second") or sc.get("queries_per_second")
            print(f"{r.device['name']}: {sc['scenario']} ({sc['engine']}): {valid}"
                  + (f" ({', '.join(sc['invalid_reasons'])})" if sc.get("invalid_reasons") else "")
                  + f"; p50 {lat.get('p50', float('nan')):.2f} ms, p99 {lat.get('p99', float('nan')):.2f} ms"
                  + (f", {rate:.1f}/s" if rate else ""))
    bad = sum(not r.ok for r in result.records)
    print(f"done in {result.time_s:.1f}s: {len(result.records) - bad} ok, {bad} failed (run {result.run_id})")


def run(args: argparse.Namespace) -> int:
    from edgeopt.errors import EXIT_DEVICE_FAILED
    from edgeopt.push import find_bundles
    from edgeopt.ui import stderr_progress

    args.bench_targets = args.targets
    bundles = find_bundles(args.dist)
    result = run_bench(args, bundles, stderr_progress(args.quiet))
    if args.json:
        emit_json(result.as_dict())
    else:
        print_fleet(result)
    return 0 if result.ok else EXIT_DEVICE_FAILED
