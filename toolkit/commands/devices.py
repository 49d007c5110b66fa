"""``edgeopt devices --devices FILE [--probe]``: list the inventory; probe each device."""

from __future__ import annotations

import click

from . import emit_json
from ._common import CONTEXT, device_options, examples, json_option, ns, verbosity

HELP = """List the inventory; probe devices.

List the devices of an inventory (edgeopt YAML or Ansible INI/YAML) with how they are reached and
which target they run. With --probe, connect to each (host keys checked), install the agent if
needed and show what the device is: OS, CPU, memory, disk, GPUs, runtimes. Exit 4 when a probe fails.
"""


EXAMPLES = examples("""\
examples:
  edgeopt devices --devices lab.yaml                 # who is in the inventory, how reached, which target
  edgeopt devices --devices lab.yaml --probe --limit orin1,orin2
  edgeopt devices gc --devices lab.yaml --dry-run    # what the stores would free
  edgeopt devices --devices hosts.ini --label jetson --probe --json

exit codes: 0 ok, 2 bad inventory or selection, 4 a probe (or gc) failed on a device.""")


@click.group("devices", help=HELP, epilog=EXAMPLES, context_settings=CONTEXT, invoke_without_command=True,
             short_help="List the inventory; probe devices; clean their stores.")
@device_options
@click.option("--probe", is_flag=True, help="Connect and show each device's probe.")
@json_option
@verbosity
@click.pass_context
def command(ctx: click.Context, **kw) -> int | None:
    if ctx.invoked_subcommand is not None:
        return None
    return run(ns(**kw))


@command.command("gc", context_settings=CONTEXT, epilog=examples("""\
examples:
  edgeopt devices gc --devices lab.yaml --dry-run
  edgeopt devices gc --devices lab.yaml --limit orin1 --keep 1"""))
@device_options
@click.option("--keep", type=click.IntRange(min=0), default=3,
              help="Previous versions kept per slot besides the current one and armed trials (the agent counts "
                   "the same way): 1 keeps the version `edgeopt rollback` goes back to, 0 keeps none.")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@json_option
@verbosity
def gc_command(**kw) -> int:
    """Remove bundles no slot needs from each device's store (current, history up to --keep and armed
    trials stay), and interrupted uploads."""
    from edgeopt import api
    from edgeopt.errors import EXIT_DEVICE_FAILED
    from edgeopt.ui import stderr_progress, table

    args = ns(**kw)
    res = {n: g.to_dict() for n, g in api.gc(args.devices, list(args.only), list(args.label),
                                             args.trust_new_host_keys, keep=args.keep, dry_run=args.dry_run,
                                             progress=stderr_progress(args.quiet)).items()}
    if args.json:
        emit_json(res, "devices-gc")
    else:
        rows = []
        for name, r in res.items():
            if not r.get("ok"):
                rows.append({"device": name, "removed": "FAILED: " + r["error"].splitlines()[0]})
                continue
            removed = r.get("removed") or r.get("would_remove") or []
            freed = r.get("freed_mb", r.get("freed_bytes"))
            rows.append({"device": name, "removed": f"{len(removed)} bundle(s)" + (" (dry run)" if args.dry_run else ""),
                         "freed": "" if freed is None else str(freed), "kept": str(len(r.get("kept") or []))})
        click.echo(table(rows, [("device", "device"), ("removed", "removed"), ("freed", "freed"), ("kept", "kept")]))
    return EXIT_DEVICE_FAILED if any(not r.get("ok") for r in res.values()) else 0


def _summary(p: dict) -> str:
    if not p.get("ok"):
        return "FAILED: " + p["error"].splitlines()[0]
    pr = p["probe"]
    cpu = pr.get("cpu") or {}
    mem = pr.get("memory_mb")
    mem = mem.get("total") if isinstance(mem, dict) else mem
    rts = ", ".join(f"{k} {v}" for k, v in (pr.get("runtimes") or {}).items() if v)
    gpus = ", ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in pr.get("gpus") or [])
    bits = [f"{pr.get('os')} {pr.get('arch')}", f"{cpu.get('model') or cpu.get('name') or ''} x{cpu.get('count') or cpu.get('cores') or '?'}",
            f"{mem} MB" if mem else "", f"GPU {gpus}" if gpus else "", rts or "no runtimes"]
    return "; ".join(b for b in bits if b.strip())


def run(args) -> int:
    from edgeopt import api
    from edgeopt.errors import EXIT_DEVICE_FAILED
    from edgeopt.ui import stderr_progress, table

    devices = api.select_devices(args.devices, list(args.only), list(args.label))
    progress = stderr_progress(args.quiet)
    probes: dict[str, dict] = {}
    if args.probe:
        probes = {n: p.to_dict() for n, p in api.probe(args.devices, list(args.only), list(args.label),
                                                        args.trust_new_host_keys, args.parallel, progress).items()}
    if args.json:
        emit_json([{**d.public(), "python": d.python, "root": d.root, **({"probe": probes[d.name]} if probes else {})}
                   for d in devices], "devices")
    else:
        rows = [{"name": d.name, "via": "local" if d.is_local else
                 f"ssh {d.user + '@' if d.user else ''}{d.host}{':' + str(d.port) if d.port else ''}",
                 "target": d.target or ("(any runnable)" if d.is_local else "(none)"), "labels": ",".join(d.labels),
                 "probe": _summary(probes[d.name]) if probes else ""} for d in devices]
        cols = [("name", "device"), ("via", "reached by"), ("target", "target"), ("labels", "labels")]
        print(table(rows, cols + ([("probe", "probe")] if probes else [])))
    return EXIT_DEVICE_FAILED if any(not p["ok"] for p in probes.values()) else 0
