"""``edgeopt tune``: pick the best configuration of a model per device, measured there (click)."""

from __future__ import annotations

import sys

import click

from ._common import CONTEXT, deprecated, examples, kind_flags, kind_kw

EXAMPLES = examples("""\
examples:
  edgeopt tune model.onnx --targets cpu,intel-cpu --shape x:1x3x224x224 --devices local
  edgeopt tune model.onnx -t intel-cpu -p fp32,int8 --batch 1,2,4,8 --latency-bound p99=20ms --objective throughput
  edgeopt tune model.onnx -t cpu --threads 1,2,4 --min-accuracy top1=0.99 --exhaustive --json
  edgeopt tune model.onnx -t cpu,intel-cpu --batch 1,4,8 --scenario offline   # LoadGen offline images/s
  edgeopt tune model.onnx -t cpu,intel-cpu --scenario server --latency-bound p99=20ms    # most QPS within p99 20 ms

The space: targets × precisions × batch sizes (one bundle per batch) × threads. Threads are swept
upward and a sweep stops when a step improves the objective by less than 3%; batches stop at the
first that misses the SLO or after two that stop paying (--exhaustive measures everything). The 3
best points are then re-measured in --confirm interleaved rounds and the pick is made on their medians. The winner per device is
written as a tuned bundle (the threads in runtime.options) under DIST/<model>/tuned/<device>/ —
bench or roll out that folder.

Only device truth is picked, by the report's rule: a target measured on the build host (mobile,
jetson-* on `local`), on another vendor's CPU (intel-cpu on an AMD CPU) or under emulation is never
built, measured or picked on that device, and tune says so. A point is accepted by the accuracy
policy (--accept, as for build; default: the gate's rule against FP32 on the device's validation
run). With no clear winner, the runner-up is written too (DIST/<model>/tuned/<device>-rival/) and the
paired `edgeopt gate` between the two tuned bundles is printed -- only when gate takes that pair (one
target, the same inputs).

exit codes: 0 a winner on every device, 2 bad input (nothing built; also: no target is device truth on
any device), 3 no candidate built, 4 a device failed (nothing measured on it), 5 measured, but no
configuration meets the SLO/accuracy on some device (the closest is shown).
""")


@click.command("tune", context_settings=CONTEXT, epilog=EXAMPLES,
               short_help="Pick the fastest configuration per device under an SLO")
@click.argument("model", type=click.Path())
@click.option("--targets", "-t", required=True, help="Targets to consider (comma-separated; aliases work).")
@click.option("--precision", "-p", default="fp32,int8", show_default=True, help="Precisions to consider.")
@click.option("--batch", "batches", default="1", show_default=True, help="Batch sizes (comma-separated).")
@click.option("--threads", default=None, help="Thread counts to try [1, 2, 4 … up to the device's cores].")
@click.option("--latency-bound", "slo", default=None, metavar="pNN=MS",
              help="Latency bound, e.g. p99=20ms (per request): the one name of the bound in bench and tune.")
@deprecated("--slo", "--latency-bound", "slo_old")
@click.option("--min-accuracy", default=None, help="Agreement with the FP32 reference on the device, e.g. "
              "top1=0.99 or cosine=0.999 (besides each bundle's own bound).")
@click.option("--accept", metavar="GATE.yaml", default=None,
              help="The accuracy policy's thresholds (the keys of a gate file), as for build: the candidates are "
                   "built and every point judged by it. Default: the gate's defaults.")
@click.option("--objective", type=click.Choice(["latency", "throughput"]), default=None,
              help="latency: lowest p50 at batch 1; throughput: most inferences/s [throughput when --batch "
                   "has more than 1, else latency].")
@click.option("--scenario", type=click.Choice(["offline", "server"]), default=None,
              help="offline: throughput is MLPerf LoadGen's offline burst (images/s, served in each point's "
                   "batch); server: the highest server rate whose --latency-bound percentile holds (a max-QPS search per "
                   "point). Default: the single-stream loop.")
@click.option("--shape", "shapes", multiple=True, help="Input shape NAME:1x3x224x224 (the batch is replaced "
              "by each --batch value).")
@click.option("--calib", default=None, help="Calibration/validation data (as for build).")
@click.option("--preprocess", default=None, help="Image preprocessing (as for build).")
@click.option("--devices", default="local", show_default=True, help="Inventory or `local`.")
@click.option("--limit", "--only", "limit", multiple=True, help="Only these devices (comma-separated names).")
@click.option("--label", multiple=True, metavar="LABEL",
              help="Only devices with one of these labels (Ansible groups become labels).")
@click.option("--duration", default=1.0, show_default=True, type=float, help="Seconds per measured point.")
@click.option("--exhaustive", is_flag=True, help="Measure every point (no pruning).")
@click.option("--confirm", "confirm_rounds", default=2, show_default=True, type=click.IntRange(min=0),
              help="Interleaved re-measuring rounds of the 3 best points; the pick is on their medians.")
@click.option("--dist", default="dist", show_default=True, help="Where candidate and tuned bundles go.")
@click.option("--db", envvar="EDGEOPT_DB", default="edgeopt-results.db", show_default=True, help="Results database (every point).")
@click.option("--jobs", "-j", default=2, show_default=True, type=click.IntRange(min=1), help="Parallel builds.")
@click.option("--trust-new-host-keys", is_flag=True)
@click.option("--scheduler", default=None, metavar="URL",
              help="Build the candidates on Dask workers, as `edgeopt build --scheduler` (tcp://, tls://, auto, local) "
                   "[$EDGEOPT_SCHEDULER, else here].")
@kind_flags
@click.option("--json", "as_json", is_flag=True, help="The whole sweep and the winners as JSON.")
@click.option("-v", "--verbose", is_flag=True)
@click.option("-q", "--quiet", is_flag=True)
def command(model, targets, precision, batches, threads, slo, slo_old, min_accuracy, accept, objective, scenario, shapes, calib,
            preprocess, devices, limit, label, duration, exhaustive, confirm_rounds, dist, db, jobs, trust_new_host_keys, scheduler, as_json,
            verbose, quiet, output_kind=(), decision=()) -> int:
    """Build MODEL's candidates for --targets, sweep them on each device, and write the winner per device."""
    from edgeopt.api import tune_failure
    from edgeopt.commands import emit_json
    from edgeopt.errors import UsageError
    from edgeopt.tuning import tune

    def ints(text: str | None, what: str) -> list[int] | None:
        if not text:
            return None
        try:
            return [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise UsageError(f"{what}: expected comma-separated integers, got {text!r}") from None

    slo = slo if slo is not None else slo_old  # --slo: the old name of --latency-bound
    progress = (lambda s: None) if quiet else (lambda s: print(f"[tune] {s}", file=sys.stderr, flush=True))
    from edgeopt.api import check_bundle_folder

    check_bundle_folder(dist)
    kinds = kind_kw(output_kind, decision)
    if kinds:  # a bad --output-kind/--decision: one line, before any build
        from edgeopt.targets.base import parse_kind_flags

        parse_kind_flags(**kinds)
    from edgeopt import cluster

    with cluster.session(scheduler, progress):  # --scheduler: the candidates build on Dask workers
        res = tune(model, targets, devices=devices, limit=list(limit) or None, labels=list(label) or None,
                   precision=precision,
                   batches=ints(batches, "--batch"), threads=ints(threads, "--threads"), slo=slo,
                   min_accuracy=min_accuracy, objective=objective, shapes=list(shapes) or None, calib=calib,
                   preprocess=preprocess, dist=dist, duration=duration, exhaustive=exhaustive, db=db, jobs=jobs,
                   confirm_rounds=confirm_rounds, scenario=scenario, accept=accept,
                   trust_new_host_keys=trust_new_host_keys, progress=progress, **kinds)
    err = tune_failure(res)  # GoalNotMet (exit 5) or DeviceError (exit 4), as edgeopt.tune raises them
    if as_json:  # one object: the sweep, with what it failed at
        emit_json({**res.as_dict(), "exit_code": err.exit_code if err else 0,
                   "error": {"kind": type(err).__name__, "message": err.message, "hint": err.hint} if err else None},
                  "tune")
        return err.exit_code if err else 0
    _print(res)
    if err is not None:
        raise err
    return 0


def _print(res) -> None:
    from edgeopt.ui import table

    server = any(p.max_qps is not None for p in res.points)  # --scenario server: the searched rate
    rows = [{"device": p.device, "target": p.target, "prec": p.precision, "batch": str(p.batch),
             "threads": str(p.threads), "p50 ms": f"{p.p50_ms:.2f}" if p.p50_ms else "-",
             "p99 ms": f"{p.p99_ms:.2f}" if p.p99_ms else "-",
             "inf/s": f"{p.throughput_ips:.1f}" if p.throughput_ips else "-",
             **({"max QPS": f"{p.max_qps:.1f}" if p.max_qps else "-"} if server else {}),
             "agree": f"{p.agreement:.4f}" if p.agreement is not None else "-",
             "ok": "yes" if p.feasible else (p.why_not or p.status)[:40]} for p in res.points]
    cols = [(k, k) for k in rows[0]] if rows else []
    if rows:
        click.echo(table(rows, cols))
    for d, p in res.winners.items():
        click.echo(f"{d}: {p.target} {p.precision} batch {p.batch} threads {p.threads} — p50 {p.p50_ms:.2f} ms, "
                   f"p99 {p.p99_ms:.2f} ms, "
                   + (f"{p.max_qps:.1f} QPS within the SLO (server)" if p.max_qps else f"{p.throughput_ips:.1f} inf/s")
                   + f" → {res.tuned[d]}")
    for d, v in res.verdicts.items():
        click.echo(f"{d}: {v.get('line')}")
        if d in res.rivals:
            click.echo(f"{d}: runner-up written as a tuned bundle too → {res.rivals[d]}")
    for x in res.not_truth:
        click.echo(f"{x['device']}: {x['target']} not measured, never picked: not device truth there "
                   f"({x['truth']}: {x['why']})")
    for d, p in res.closest.items():
        click.echo(f"{d}: nothing meets the goals; closest {p.target} {p.precision} batch {p.batch} threads "
                   f"{p.threads}: {p.why_not}")
    for s in res.skipped:
        click.echo("skipped " + ", ".join(f"{k} {v}" for k, v in s.items()))
    click.echo(f"{len(res.points)} points measured ({'exhaustive' if res.exhaustive else 'pruned'}); "
               f"build {res.build_s:.1f}s, sweep {res.sweep_s:.1f}s")
