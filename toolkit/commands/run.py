"""``edgeopt run MODEL --targets ... --devices ...``: build, push, bench and report in one command."""

from __future__ import annotations

import argparse

from . import emit_json
from .bench import add_bench_args, add_device_args

HELP = """\
The whole job: build a bundle per (target, precision) as `edgeopt build` does, push the bundles
to the devices (`local`, this host, by default), bench each where its target matches, store the
runs in the results database and print the comparison (or write it with --report FILE, e.g.
report.html). Exit 3 when a build failed (the bundles that built are still measured), 4 when a
device was unreachable or a run failed, 0 when all is well.
"""


def add_parser(sub) -> None:
    from .build import add_build_args

    p = sub.add_parser("run", help="build + push + bench + report in one command", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_args(p)
    add_device_args(p)
    add_bench_args(p)
    p.add_argument("--report", metavar="FILE", help="also write the report to FILE (format from the extension)")
    p.add_argument("--report-format", choices=["table", "md", "html", "json", "csv"], help="format of --report")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from edgeopt.errors import EXIT_BUILD_FAILED, EXIT_DEVICE_FAILED
    from edgeopt.push import load_bundle
    from edgeopt.report import render
    from edgeopt.ui import stderr_progress

    from .bench import print_fleet, run_bench
    from .build import build_from_args, print_report
    from .report import guess_format, write_report

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
        fleet = run_bench(args, bundles, stderr_progress(args.quiet))
    records = [r.as_dict() for r in fleet.records] if fleet else []
    if args.report:
        write_report(records, guess_format(args.report_format, args.report), args.report,
                     f"edgeopt run: {Path(report.model).stem}", {"run_id": fleet.run_id if fleet else None})
    if args.json:
        emit_json({"build": report.as_dict(), "bench": fleet.as_dict() if fleet else None,
                   "report": __import__("json").loads(render(records, "json"))["rows"]})
    elif fleet:
        print_fleet(fleet)
    else:
        print("nothing was benchmarked: no target built")
    if not report.ok:
        return EXIT_BUILD_FAILED
    return 0 if fleet is None or fleet.ok else EXIT_DEVICE_FAILED
