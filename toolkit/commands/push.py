"""``edgeopt push --devices FILE``: copy the agent and bundles to devices (what they lack only)."""

from __future__ import annotations

import sys

import click

from . import emit_json
from ._common import CONTEXT, device_options, examples, json_option, ns, targets_option, verbosity

HELP = """Copy the agent and bundles to devices (what they lack only).

Copy the agent (versioned by its content) and the bundles to every selected device over SFTP (a
plain copy for `local`). What a device already has, by sha256, is skipped. Each bundle is uploaded
to a temp folder and installed by the agent only after every file's sha256 matched the manifest,
so an interrupted push never leaves a half-installed bundle; re-run it to finish.
"""


EXAMPLES = examples("""\
examples:
  edgeopt push --devices lab.yaml                       # what each device lacks, from dist/
  edgeopt push dist/cls/jetson-orin-fp16 --devices lab.yaml --limit orin1 --activate
  edgeopt push --devices lab.yaml --verify --json        # re-hash what is there, repair damage

exit codes: 0 every device has its bundles, 2 bad input, 4 a device was unreachable or failed.""")


@click.command("push", help=HELP, epilog=EXAMPLES, context_settings=CONTEXT,
               short_help="Copy the agent and bundles to devices.")
@click.argument("bundles", nargs=-1, type=click.Path())
@device_options
@click.option("--dist", "--out", "dist", default="dist", metavar="DIR",
              help="Folder of built bundles (when no BUNDLES are given).")
@targets_option()
@click.option("--all-targets", is_flag=True,
              help="Push every bundle to every device, not only those matching the device's target.")
@click.option("--verify", is_flag=True,
              help="Re-verify bundles already on the device (sha256 of every file); repair corrupted ones.")
@click.option("--activate", is_flag=True,
              help="Make each pushed bundle the current version of its slot (<model>/<target>) on the device; "
                   "the one it replaces stays for `edgeopt rollback`.")
@json_option
@verbosity
def command(**kw) -> int:
    return run(ns(**kw))


def run(args) -> int:
    from edgeopt import api
    from edgeopt.errors import EXIT_DEVICE_FAILED
    from edgeopt.ui import size, stderr_progress, table

    results = api.push(list(args.bundles) or None, dist=args.dist, devices=args.devices, limit=list(args.only),
                       label=list(args.label), targets=args.targets, all_targets=args.all_targets,
                       trust_new_host_keys=args.trust_new_host_keys, parallel=args.parallel, verify=args.verify,
                       activate=args.activate, progress=stderr_progress(args.quiet), raise_on_failure=False)
    if args.json:
        emit_json([r.as_dict() for r in results], "push")
    else:
        rows = []
        for r in results:
            for b in r.bundles:
                status = b.status + (f", current in {b.activated}" if b.activated else "")
                rows.append({"device": r.device, "bundle": f"{b.model} {b.target}-{b.precision}", "status": status,
                             "bytes": size(b.bytes_sent), "time": f"{b.time_s:.2f}s", "id": b.bundle_id[:12],
                             "error": b.error or ""})
            if r.error:
                rows.append({"device": r.device, "status": "FAILED", "error": r.error.splitlines()[0]})
        print(table(rows, [("device", "device"), ("bundle", "bundle"), ("status", "status"), ("bytes", "sent"),
                           ("time", "time"), ("id", "bundle id"), ("error", "error")]))
        print(f"{size(sum(r.bytes_sent for r in results))} of bundles sent to {len(results)} device(s)")
        for r in results:  # the table keeps one line per failure; what to do about it follows
            rest = [x.strip() for x in (r.error or "").splitlines()[1:] if x.strip()]
            if rest:
                print(f"{r.device}: " + "; ".join(rest), file=sys.stderr)
    return 0 if all(r.ok for r in results) else EXIT_DEVICE_FAILED
