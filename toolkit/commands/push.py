"""``edgeopt push --devices FILE``: copy the agent and bundles to devices (what they lack only)."""

from __future__ import annotations

import argparse

from . import emit_json
from .bench import add_device_args, select_devices

HELP = """\
Copy the agent (versioned by its content) and the bundles to every selected device over SFTP (a
plain copy for `local`). What a device already has, by sha256, is skipped. Each bundle is uploaded
to a temp folder and installed by the agent only after every file's sha256 matched the manifest,
so an interrupted push never leaves a half-installed bundle; re-run it to finish.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("push", help="copy the agent and bundles to devices", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bundles", nargs="*", help="bundle folders (default: every bundle under --dist)")
    add_device_args(p)
    p.add_argument("--dist", default="dist", help="folder of built bundles [dist]")
    p.add_argument("--targets", "-t", help="only bundles of these targets (comma-separated)")
    p.add_argument("--all-targets", action="store_true",
                   help="push every bundle to every device, not only those matching the device's target")
    p.add_argument("--verify", action="store_true",
                   help="re-verify bundles already on the device (sha256 of every file); repair corrupted ones")
    p.add_argument("--activate", action="store_true",
                   help="make each pushed bundle the current version of its slot (<model>/<target>) on the device; "
                        "the one it replaces stays for rollback")
    p.add_argument("--json", action="store_true", help="print the push results as JSON on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgeopt.errors import EXIT_DEVICE_FAILED, UsageError
    from edgeopt.fleetbench import plan
    from edgeopt.push import find_bundles, load_bundle, push
    from edgeopt.ui import stderr_progress, table

    progress = stderr_progress(args.quiet)
    bundles = [load_bundle(b) for b in args.bundles] if args.bundles else find_bundles(args.dist)
    devices = select_devices(args)
    targets = [t for t in (args.targets or "").split(",") if t] or None
    if args.all_targets:
        work = [(d, bundles) for d in devices]
    else:
        work, skipped = plan(devices, bundles, targets)
        for s in skipped:
            progress(f"skipping {s['device']}: {s['reason']}")
    if not work:
        raise UsageError("nothing to push", hint="check the devices' `target` and --dist, or use --all-targets")
    results = []
    for group in {tuple(b.bundle_id for b in bs): bs for _, bs in work}.values():
        devs = [d for d, bs in work if bs == group]
        results += push(devs, group, trust_new_host_keys=args.trust_new_host_keys, verify=args.verify,
                        activate=args.activate, jobs=args.parallel, progress=progress)
    if args.json:
        emit_json([r.as_dict() for r in results])
    else:
        rows = []
        for r in results:
            for b in r.bundles:
                status = b.status + (f", current in {b.activated}" if b.activated else "")
                rows.append({"device": r.device, "bundle": f"{b.model} {b.target}-{b.precision}", "status": status,
                             "bytes": b.bytes_sent, "time": f"{b.time_s:.2f}s", "id": b.bundle_id[:12],
                             "error": b.error or ""})
            if r.error:
                rows.append({"device": r.device, "status": "FAILED", "error": r.error.splitlines()[0]})
        print(table(rows, [("device", "device"), ("bundle", "bundle"), ("status", "status"), ("bytes", "bytes sent"),
                           ("time", "time"), ("id", "bundle id"), ("error", "error")]))
        print(f"{sum(r.bytes_sent for r in results)} bytes of bundles sent to {len(results)} device(s)")
    return 0 if all(r.ok for r in results) else EXIT_DEVICE_FAILED
