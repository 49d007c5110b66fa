"""``edgeopt bench --devices FILE``: push what is missing and measure every bundle on its devices."""

from __future__ import annotations

import sys

import click

from . import emit_json
from ._common import CONTEXT, device_options, examples, json_option, ns, targets_option, verbosity
from ._common import bench_options as bench_options_decorator

HELP = """Push bundles and measure them on devices.

Find the bundles under --dist (by their manifests), match them to devices (a device's `target` in
the inventory picks its bundles; `local` takes every bundle this host can run), push what each
device lacks and run the agent's bench there: load time, first inference, latency percentiles,
throughput, memory and accuracy against the FP32 reference. Devices run in parallel; a dead, slow
or failing device is reported and the others finish. Every run goes to the results database
(--db) with its full JSON; `edgeopt report` compares them. Exit 4 when any device or run failed.
"""


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


def bench_options(args) -> dict:
    from edgeopt.errors import UsageError

    if args.duration <= 0 or args.min_iters < 1 or args.warmup < 0 or args.batch < 1 or args.bench_timeout <= 0:
        raise UsageError("bench options must be positive (--duration, --min-iters, --batch, --bench-timeout)")
    limits = {k: v for k, v in (("memory_mb", args.limit_memory), ("cpu_s", args.limit_cpu)) if v}
    opts = {"duration_s": args.duration, "min_iters": args.min_iters, "warmup": args.warmup,
            "threads": args.threads, "batch": args.batch, "timeout_s": args.bench_timeout,
            "return_samples": not args.no_samples, "limits": limits}
    if getattr(args, "profile", 0):
        opts["profile"] = int(args.profile)
    if getattr(args, "lengths", None):
        opts["lengths"] = parse_lengths(args.lengths)
    scenario = getattr(args, "scenario", None)
    pct, bound = parse_latency_bound(getattr(args, "latency_bound", None))
    workers, clients = getattr(args, "workers", None), getattr(args, "concurrency", None)
    delay = getattr(args, "max_queue_delay_ms", None)
    if not scenario:
        if any(getattr(args, k, None) is not None for k in ("target_qps", "samples_per_query", "engine", "workers",
                                                             "concurrency", "max_queue_delay_ms")) or bound:
            raise UsageError("--target-qps/--latency-bound/--samples-per-query/--load-generator/--workers/"
                             "--concurrency/"
                             "--max-queue-delay need --scenario")
        return opts
    if delay is not None:
        if scenario != "server" or args.batch < 2 or delay < 0 or args.engine == "edgeopt":
            raise UsageError("--max-queue-delay is dynamic batching in the server scenario: it needs --scenario "
                             "server, --batch >= 2 (the largest batch formed), a delay >= 0 and LoadGen")
        opts["max_queue_delay_ms"] = float(delay)
    for flag, v in (("--workers", workers), ("--concurrency", clients)):
        if v is not None and not 1 <= v <= 256:
            raise UsageError(f"{flag} takes an integer from 1 to 256, got {v}")
    if scenario == "concurrency":
        if not clients:
            raise UsageError("--scenario concurrency needs --concurrency C (clients each keeping one query "
                             "outstanding)")
        if args.engine == "loadgen" or bound or args.target_qps is not None:
            raise UsageError("--scenario concurrency is the agent's own closed loop: LoadGen, --latency-bound and "
                             "--target-qps belong to the server scenario")
        opts.update({"scenario": scenario, "concurrency": clients, "workers": workers, "engine": "edgeopt"})
        return opts
    if clients is not None:
        raise UsageError("--concurrency applies to --scenario concurrency; the threads serving the other "
                         "scenarios are --workers")
    if scenario == "single-stream" and workers and workers > 1:
        raise UsageError("single-stream sends one query at a time: --workers cannot serve it (server, offline "
                         "or multi-stream can)")
    if scenario == "server" and not (args.target_qps and args.target_qps > 0):
        raise UsageError("--scenario server needs --target-qps > 0")
    if args.target_qps is not None and args.target_qps <= 0:
        raise UsageError(f"--target-qps must be above 0, got {args.target_qps:g}")
    if args.samples_per_query is not None and (scenario != "multi-stream" or args.samples_per_query < 1):
        raise UsageError("--samples-per-query takes an integer >= 1 and only with --scenario multi-stream")
    if scenario in ("multi-stream", "offline") and args.engine == "edgeopt":
        raise UsageError(f"the {scenario} scenario needs LoadGen (--load-generator loadgen; pip install mlcommons-loadgen "
                         "on the device)")
    if scenario == "single-stream" and args.target_qps is not None:
        raise UsageError("--target-qps applies to the server and offline scenarios")
    opts.update({"scenario": scenario, "target_qps": args.target_qps, "samples_per_query": args.samples_per_query,
                 "latency_bound_ms": bound, "latency_percentile": pct, "engine": args.engine, "workers": workers})
    return opts


EXAMPLES = examples("""\
examples:
  edgeopt bench                                   # every bundle under dist/ on this host
  edgeopt bench --devices lab.yaml --limit orin1,orin2 --duration 10 --warmup 2s
  edgeopt bench --devices lab.yaml --label jetson --targets jetson --json > runs.json
  edgeopt bench --scenario server --target-qps 200 --latency-bound p99=20ms
  edgeopt bench --find-max-qps --latency-bound p99=20ms --targets intel-cpu

exit codes: 0 every run ok, 2 bad input (nothing measured, nothing written), 4 a device was
unreachable or a run failed (the other devices finish); --find-max-qps: 5 a bound not met at any
rate, 6 a search that could not judge the percentile.""")


@click.command("bench", help=HELP, epilog=EXAMPLES, context_settings=CONTEXT,
               short_help="Push bundles and measure them on devices.")
@device_options
@click.option("--dist", "--out", "dist", default="dist", metavar="DIR", help="Folder of built bundles.")
@targets_option()
@click.option("--find-max-qps", is_flag=True,
              help="Search the highest server QPS each device sustains within --latency-bound (bisection on "
                   "the server scenario: LoadGen's VALID where installed, else the agent's open-loop server).")
@bench_options_decorator
@json_option
@verbosity
def command(**kw) -> int:
    args = ns(**kw)
    if args.find_max_qps:
        return run_max_qps(args)
    return run(args)


def run_max_qps(args) -> int:
    from edgeopt import api
    from edgeopt.errors import UsageError
    from edgeopt.maxqps import find_max_qps
    from edgeopt.ui import stderr_progress, table

    pct, bound = parse_latency_bound(args.latency_bound)
    if bound is None:
        raise UsageError("--find-max-qps needs --latency-bound, e.g. p99=20ms")
    if args.target_qps is not None or args.scenario not in (None, "server"):
        raise UsageError("--find-max-qps searches the server scenario's rate: drop --target-qps/--scenario")
    picked = api.check_bench_targets(args.targets)
    found = api.bundles_under(args.dist)
    devs = api.select_devices(args.devices, list(args.only), list(args.label))
    api.check_target_filter(found, picked, args.dist)
    rows = find_max_qps(devs, found, bound, pct, args.engine, args.threads,
                        args.trust_new_host_keys, picked, stderr_progress(args.quiet))
    code = max_qps_exit(rows)
    if args.json:
        emit_json({"items": rows, "exit_code": code}, "max-qps")
    else:
        cols = [("device", "device"), ("target", "target"), ("precision", "precision"), ("qps", "max QPS"),
                ("bound", "within"), ("engine", "engine"), ("probes", "probes"), ("note", "note")]
        click.echo(table([{"device": r["device"], "target": r["target"], "precision": r["precision"],
                           "qps": f"{r['max_qps']:.1f}" if r.get("max_qps") else "-",
                           "bound": f"p{pct:g} <= {bound:g} ms", "engine": r.get("engine") or "-",
                           "probes": str(len(r.get("probes") or [])),
                           "note": r.get("error") or r.get("note")
                           or ("the bound is not met at any rate probed" if r.get("verdict") == "not met" else "")
                           or ("" if r.get("converged") else "not converged")}
                          for r in rows], cols))
    return code


def max_qps_exit(rows: list[dict]) -> int:
    """4 when a device or probe failed, else 5 when a bound was not met at any rate (goal not met), else 6
    when a search could not judge the percentile (inconclusive), else 0."""
    from edgeopt.errors import EXIT_DEVICE_FAILED, EXIT_GOAL_NOT_MET, EXIT_INCONCLUSIVE

    if any(r["status"] != "ok" for r in rows):
        return EXIT_DEVICE_FAILED
    verdicts = {r.get("verdict") or ("met" if r.get("max_qps") else "not met") for r in rows}
    return EXIT_GOAL_NOT_MET if "not met" in verdicts else EXIT_INCONCLUSIVE if "undetermined" in verdicts else 0


def parse_lengths(value) -> list[int]:
    """``--lengths 16,64,128`` (or a list) -> [16, 64, 128]; anything else is exit 2."""
    from edgeopt.errors import UsageError

    items = value if isinstance(value, (list, tuple)) else str(value).replace(" ", "").split(",")
    try:
        out = [int(v) for v in items if str(v) != ""]
    except ValueError:
        raise UsageError(f"--lengths takes sizes like 16,64,128, got {value!r}") from None
    if not out or any(v <= 0 for v in out):
        raise UsageError(f"--lengths takes positive sizes like 16,64,128, got {value!r}")
    return out


def bench_kwargs(args) -> dict:
    """The bench options of parsed CLI args, as ``edgeopt.api.bench_options`` takes them."""
    return {k: getattr(args, k) for k in ("duration", "min_iters", "warmup", "threads", "batch", "bench_timeout",
                                          "limit_memory", "limit_cpu", "no_samples", "scenario", "target_qps",
                                          "latency_bound", "samples_per_query", "profile", "workers",
                                          "concurrency")} | {"max_queue_delay": args.max_queue_delay_ms,
                                                             "load_generator": args.engine,
                                                             "lengths": getattr(args, "lengths", None)}


def run_bench(args, bundles: list, progress):
    """Shared by ``bench`` and ``run``: bench ``bundles`` on the selected devices, record in the database."""
    from edgeopt import api

    return api.bench(getattr(args, "dist", "dist"), devices=args.devices, limit=list(args.only), label=list(args.label),
                     targets=getattr(args, "bench_targets", None), bundles=bundles,
                     trust_new_host_keys=args.trust_new_host_keys, parallel=args.parallel, verify=args.verify,
                     db=args.db, progress=progress, raise_on_failure=False, **bench_kwargs(args))


def print_fleet(result) -> None:
    from edgeopt.reporting import render
    from edgeopt.ui import size

    print(render([r.as_dict() for r in result.records], "table"), end="")
    for s in result.skipped:
        print(f"skipped {s['device']}: {s['reason']}")
    for p in result.pushes:
        n = sum(b.status in ("installed", "repaired") for b in p.bundles)
        print(f"{p.device}: pushed {n} bundle(s), {size(p.bytes_sent)}"
              + (", agent installed" if p.agent.get("uploaded") else ""))
    for r in result.records:
        sc = (r.bench or {}).get("scenario") if hasattr(r, "bench") else None
        if sc:
            lat = sc.get("latency_ms") or {}
            valid = {True: "VALID", False: "INVALID", None: "not judged"}[sc.get("valid")]
            rate = sc.get("completed_qps") or sc.get("samples_per_second") or sc.get("queries_per_second")
            who = (f", {sc['concurrency']} clients" if sc.get("concurrency") else "") + \
                (f", {sc['workers']} workers" if (sc.get("workers") or 1) > 1 else "")
            print(f"{r.device.name}: {sc['scenario']} ({sc['engine']}{who}): {valid}"
                  + (f" ({', '.join(r + ': NO' for r in sc['invalid_reasons'])})" if sc.get("invalid_reasons") else "")
                  + f"; p50 {lat.get('p50', float('nan')):.2f} ms, p99 {lat.get('p99', float('nan')):.2f} ms"
                  + (f", {rate:.1f}/s" if rate else ""))
            dyn = sc.get("dynamic_batching")
            if dyn:
                print(f"  dynamic batching: mean batch {dyn['mean_batch']} of {dyn['max_batch']} over {dyn['batches']} "
                      f"runs (queue delay {dyn['max_queue_delay_ms']:g} ms; partial batches {dyn['partial_batches']})")
            acc = sc.get("accuracy")
            if acc:  # the accuracy check again, its outputs carried by LoadGen's AccuracyOnly run
                from edgeopt_agent.compare import summary_line

                print(f"  accuracy through {acc['harness']}: {summary_line(acc)}"
                      + ("" if acc.get("same_as_direct") else " (differs from the agent's own pass)"))
    bad = sum(not r.ok for r in result.records)
    print(f"done in {result.time_s:.1f}s: {len(result.records) - bad} ok, {bad} failed (run {result.run_id})")


def run(args) -> int:
    from edgeopt import api
    from edgeopt.errors import EXIT_DEVICE_FAILED
    from edgeopt.ui import stderr_progress

    args.bench_targets = args.targets
    api.bench_options(**bench_kwargs(args))  # refuse bad options before reading the bundles
    api.check_bench_targets(args.targets)
    bundles = api.bundles_under(args.dist)
    result = run_bench(args, bundles, stderr_progress(args.quiet))
    if args.json:
        emit_json(result.as_dict(), "bench")
    else:
        print_fleet(result)
    if getattr(result, "unsaved", None):  # the results database filled: the measurements were kept elsewhere
        print(f"edgeopt: {result.unsaved}", file=sys.stderr)
        return EXIT_DEVICE_FAILED
    return 0 if result.ok else EXIT_DEVICE_FAILED
