"""``edgeopt build MODEL --targets ...``: compile, check and bundle for every target."""

from __future__ import annotations

import click

from . import emit_json
from ._common import CONTEXT, build_options, examples, json_option, ns, verbosity

HELP = """Compile and check MODEL for every target.

Build one bundle per (target, precision) under DIST/<model>/<target>-<precision>/: the artifact,
manifest.json, validation inputs and the ONNX Runtime FP32 reference outputs. Every artifact the
host can run is checked against the reference with precision-aware tolerances (docs/TOLERANCES.md);
a failed check fails that target (exit 3) unless --allow-mismatch. Targets build in parallel worker
processes; a crash or hang in one converter is reported and the others go on. Same model + options
+ data + toolchain = cache hit, no rebuild; a build that ran and failed its check is remembered too
(reported at once as a cached result until --force).
"""

EXAMPLES = examples("""\
examples:
  edgeopt build model.onnx --targets jetson,h100,cpu
  edgeopt build model.onnx -t cpu,intel-cpu -p fp32,int8 --calib images/ --shape x:1x3x224x224
  edgeopt build model.onnx -t cpu,intel-cpu -p cpu=fp32,int8,intel-cpu=int8 --calib data.npz
  edgeopt build yolo.onnx -t mobile --shapes=images:1x3x640x640 --option int8_mode=full --json
  edgeopt build model.onnx -t cpu,intel-cpu --shape x:1x3x224x224 --batch 1,4,8   # one bundle per batch
  edgeopt build face.onnx -t cpu -p int8 --calib faces/ --output-kind landmarks=regression:px=2 --decision presence=0
  edgeopt build model.onnx -t cpu,intel-cpu,mobile --scheduler tcp://buildhost:8786   # on the workers

exit codes: 0 every target built and passed its check, 2 bad input (nothing built), 3 a target
failed to build or failed its check (the others are kept), 4 the --scheduler unreachable (nothing
prepared).""")


@click.command("build", help=HELP, epilog=EXAMPLES, context_settings=CONTEXT,
               short_help="Compile and check the model for targets.")
@build_options
@click.option("--batch", "batches", default=None, metavar="LIST",
              help="Build one bundle per batch size, e.g. 1,4,8 (the batch in the artifact's shape; batch B "
                   "goes under DIST/batchB/); `edgeopt bench --batch 1,4,8` then gives the curve.")
@click.option("--scheduler", default=None, metavar="URL",
              help="Build each (target, precision) on the Dask workers that can build it: tcp://HOST:PORT or "
                   "tls://HOST:PORT (`edgeopt worker --scheduler URL` on each build machine); auto = "
                   "$EDGEOPT_SCHEDULER or tcp://127.0.0.1:8786, else here with a line; local = here "
                   "[$EDGEOPT_SCHEDULER, else here]. Unreachable: exit 4 before anything is prepared.")
@click.option("--buckets", "buckets", default=None, metavar="auto[@CAP]",
              help="Variable axes given as a range in --shape (x:1x8..128) are built in buckets picked from the "
                   "--calib samples' own lengths: the fewest quantile edges whose padding waste over the mix is at "
                   "most CAP (default 25%, e.g. auto@10%); the same as x:1x8..128|auto in --shape.")
@json_option
@verbosity
def command(**kw) -> int:
    return run(ns(**kw))


def parse_options(items) -> dict:
    from edgeopt.api import parse_options as _parse

    return _parse(items)


def build_from_args(args):
    from edgeopt import api
    from edgeopt.ui import stderr_progress

    from ._common import out_flag

    api.check_bundle_folder(args.out, out_flag())
    kw = dict(model=args.model, targets=args.targets,
              precision=list(args.precision) if not isinstance(args.precision, str) else args.precision,
              shape=list(args.shape), buckets=getattr(args, "buckets", None), calib=args.calib, preprocess=args.preprocess,
              dist=args.out, jobs=args.jobs, force=args.force, allow_mismatch=args.allow_mismatch,
              config=args.config, option=list(args.option), build_timeout=args.timeout,
              calib_count=args.calib_count, val_count=args.val_count,
              batch=parse_batches(getattr(args, "batches", None)), progress=stderr_progress(args.quiet),
              accept=getattr(args, "accept", None), split=getattr(args, "split", None), raise_on_failure=False,
              output_kind=list(getattr(args, "output_kind", None) or []) or None,
              decision=list(getattr(args, "decision", None) or []) or None)
    from edgeopt import cluster

    if cluster.resolve(getattr(args, "scheduler", None)) is not None:  # each job a Dask task (edgeopt.cluster)
        return cluster.build_on(getattr(args, "scheduler", None), api.build, kw)
    return api.build(**kw)


def parse_batches(text: str | None) -> list[int] | None:
    """``1,4,8`` -> [1, 4, 8]; one line for anything else."""
    from edgeopt.errors import UsageError

    if not text:
        return None
    try:
        vals = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        vals = []
    if not vals or any(v < 1 for v in vals):
        raise UsageError(f"--batch takes batch sizes >= 1 separated by commas (1,4,8), got {text!r}")
    return sorted(set(vals))


def print_report(report) -> None:
    from edgeopt.errors import user_text
    from edgeopt.ui import fmt_s, table

    rows = [{"target": r.target, "precision": r.precision, "backend": r.backend, "status": r.status,
             "time": fmt_s(r.time_s), "check": r.check or user_text((r.error or "").splitlines()[0])[:100],
             "bundle": r.bundle or ""} for r in report.results]
    print(table(rows, [("target", "target"), ("precision", "precision"), ("backend", "backend"),
                       ("status", "status"), ("time", "time"), ("check", "host check / error"),
                       ("bundle", "bundle")]))
    for r in report.results:
        if r.error and (r.status not in ("check-failed",)):
            print(f"\n{r.target} {r.precision}: {user_text(r.error)}")
    notes = {n for r in report.results if r.manifest for n in r.manifest.get("notes", [])}
    for n in sorted(notes):
        print(f"note: {n}")
    for w in report.warnings:
        print(f"WARNING: {w}")
    for sk in report.skipped:
        print(f"skipped {sk['target']} {sk['precision']}: {sk['reason']}")
    cached = sum(r.status in ("cached", "up-to-date") for r in report.results)
    if cached:
        print(f"{cached} of {len(report.results)} bundle(s) taken from the cache (no rebuild)")
    print(f"done in {report.time_s:.2f}s: {sum(r.ok for r in report.results)} ok, "
          f"{sum(not r.ok for r in report.results)} failed")


def run(args) -> int:
    from edgeopt.errors import EXIT_BUILD_FAILED

    report = build_from_args(args)
    if args.json:
        emit_json(report.as_dict(), "build")
    else:
        print_report(report)
    return 0 if report.ok else EXIT_BUILD_FAILED
