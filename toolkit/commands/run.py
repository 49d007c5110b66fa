"""``edgeopt run MODEL --targets ... --devices ...``: build, push, bench and report in one command."""

from __future__ import annotations

import click

from . import emit_json
from ._common import CONTEXT, build_options, device_options, examples, ns, verbosity
from ._common import bench_options as bench_options_decorator

HELP = """Build, push, bench and report in one command.

The whole job: build a bundle per (target, precision) as `edgeopt build` does, push the bundles
to the devices (`local`, this host, by default), bench each where its target matches, store the
runs in the results database and print the comparison (or write it with --report FILE, e.g.
report.html). The inventory, the bench options and the report path are checked before anything
is built.
"""

EXAMPLES = examples("""\
examples:
  edgeopt run model.onnx --targets cpu,intel-cpu --precision fp32,int8 --calib images/ --report report.html
  edgeopt run model.onnx -t jetson,cpu --devices lab.yaml --limit orin1,local --duration 5
  edgeopt run model.onnx -t cpu --json > run.json     # build, bench and report rows as one JSON object

exit codes: 0 all built and measured, 2 bad input (nothing built), 3 a build failed (the bundles that
built are still measured), 4 a device was unreachable or a run failed.""")


@click.command("run", help=HELP, epilog=EXAMPLES, context_settings=CONTEXT,
               short_help="Build + push + bench + report in one command.")
@build_options
@device_options
@bench_options_decorator
@click.option("--report", metavar="FILE", help="Also write the report to FILE (format from the extension).")
@click.option("--report-format", type=click.Choice(["table", "md", "html", "json", "csv"]),
              help="Format of --report [from its extension].")
@click.option("--json", "json_", is_flag=True,
              help="Print build, bench and the report rows as one JSON object on stdout.")
@click.option("--scheduler", default=None, metavar="URL",
              help="Build on the Dask workers, as `edgeopt build --scheduler` (tcp://, tls://, auto, local); push and "
                   "bench stay here [$EDGEOPT_SCHEDULER, else here]. Unreachable: exit 4 before anything is built.")
@verbosity
def command(**kw) -> int:
    return run(ns(**kw))


def run(args) -> int:
    import sys
    from pathlib import Path

    from edgeopt import api
    from edgeopt.deploy import load_bundle
    from edgeopt.errors import EXIT_BUILD_FAILED, EXIT_DEVICE_FAILED, UsageError
    from edgeopt.reporting import render
    from edgeopt.ui import stderr_progress

    from ._common import out_flag
    from .bench import bench_kwargs, print_fleet, run_bench
    from .build import build_from_args, print_report
    from .report import check_writable, guess_format, write_report

    # everything that can be wrong with the input is refused before the (long) build
    api.check_bundle_folder(args.out, out_flag())
    batches = api.parse_batches(args.batch)
    if len(batches) > 1:
        raise UsageError("run takes one --batch; for a batch curve: edgeopt build --batch 1,4,8, then "
                         "edgeopt bench --batch 1,4,8")
    args.batch = batches[0]
    api.bench_options(**bench_kwargs(args))
    api.select_devices(args.devices, list(args.only), list(args.label))
    if args.report:
        fmt = guess_format(args.report_format, args.report)
        check_writable(args.report)
        if fmt == "html":
            from edgeopt.reporting import html_dependency_note

            note = html_dependency_note()
            if note:
                print(f"edgeopt: note: {note}", file=sys.stderr)
    if args.batch > 1:
        _check_batch_shapes(args)
    report = build_from_args(args)
    if not args.json:
        # stdout carries the final comparison; the build table goes with the progress on stderr
        stdout, sys.stdout = sys.stdout, sys.stderr
        try:
            print_report(report)
        finally:
            sys.stdout = stdout
    bundles = [load_bundle(r.bundle) for r in report.results if r.ok and r.bundle]
    fleet = None
    if bundles:
        api.check_batch(bundles, args.batch)
        fleet = run_bench(args, bundles, stderr_progress(args.quiet))
    records = [r.as_dict() for r in fleet.records] if fleet else []
    if args.report:
        write_report(records, guess_format(args.report_format, args.report), args.report,
                     f"edgeopt run: {Path(report.model).stem}", {"run_id": fleet.run_id if fleet else None})
    if args.json:
        rep = __import__("json").loads(render(records, "json"))
        emit_json({"build": report.as_dict(), "bench": fleet.as_dict() if fleet else None,
                   "report": rep["rows"], "ship": rep["ship"]}, "run")
    elif fleet:
        print_fleet(fleet)
    else:
        print("nothing was benchmarked: no target built")
    if fleet is not None and getattr(fleet, "unsaved", None):  # the results database filled: kept elsewhere
        print(f"edgeopt: {fleet.unsaved}", file=sys.stderr)
    if not report.ok:
        return EXIT_BUILD_FAILED
    return 0 if fleet is None or (fleet.ok and not getattr(fleet, "unsaved", None)) else EXIT_DEVICE_FAILED


def _check_batch_shapes(args) -> None:
    """--batch N needs inputs whose leading dim will be N (bundles are built at the given shapes)."""
    from edgeopt.errors import UsageError
    from edgeopt.model import inspect, parse_shapes, static_input_shapes

    info = inspect(args.model)
    static = static_input_shapes(info, parse_shapes(list(args.shape)))
    for name, shape in static.items():
        if shape and shape[0] != args.batch:
            raise UsageError(f"--batch {args.batch}: input {name!r} will be built at {shape} (batch {shape[0]})",
                             hint=f"add --shape {name}:{'x'.join(str(d) for d in [args.batch, *shape[1:]])}")
