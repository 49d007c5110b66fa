"""``edgeopt rig status|release``: the HIL rig's devices — health, last seen, quarantine (click)."""

from __future__ import annotations

import click


@click.group("rig", short_help="HIL rig: device health and quarantine (status, release)",
             context_settings={"help_option_names": ["-h", "--help"]}, epilog="""\b
examples:
  edgeopt rig status --devices rig.yaml
  edgeopt rig status --devices rig.yaml --no-probe --json
  edgeopt rig release jetson-2 --db edgeopt-results.db
""")
def command() -> None:
    """The rig file's devices as the gate sees them: fit or not under the `rig:` policy, quarantine."""


@command.command("status", epilog="""\b
examples:
  edgeopt rig status --devices rig.yaml
  edgeopt rig status --devices rig.yaml --no-probe --json
""")
@click.option("--devices", "devices_file", default="local", show_default=True,
              help="The rig file (an inventory with a `rig:` section), or `local`.")
@click.option("--db", envvar="EDGEOPT_DB", default="edgeopt-results.db", show_default=True, help="Results database (quarantine state).")
@click.option("--probe/--no-probe", default=True, show_default=True,
              help="Probe every device now and judge it against the policy (else: the last state recorded).")
@click.option("--limit", default=None, metavar="NAMES", help="Only these devices (comma-separated), as bench and gate.")
@click.option("--label", "labels", default=None, metavar="LABELS", help="Only devices with one of these labels.")
@click.option("--trust-new-host-keys", is_flag=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def status(devices_file, db, probe, limit, labels, trust_new_host_keys, as_json) -> int:
    """Every device: health now (fit / unfit and why / unreachable), last seen, quarantined or not, recent
    failures. Exit 0; 4 when a device is unfit, unreachable or quarantined (a rig needing attention)."""
    from edgeopt.commands import emit_json
    from edgeopt.hil.rig import status as rig_status

    res = rig_status(devices_file, db, probe, trust_new_host_keys, limit=limit, labels=labels)
    if as_json:
        emit_json(res, "rig-status")
    else:
        click.echo(f"rig {res['rig']} (state in {res['db']})")
        click.echo(f"{'device':<16} {'health':<12} {'load':>5} {'free MB':>8} {'temp C':>6} {'governor':<12} "
                   f"{'last seen':<20} {'quarantine':<10} failures")
        for r in res["devices"]:
            f = r.get("figures") or {}
            gov = f.get("governor")
            gov = gov if isinstance(gov, str) or gov is None else "mixed"

            def num(x, fmt):
                return "-" if x is None else format(x, fmt)
            click.echo(f"{r['device']:<16} {r['health']:<12} {num(f.get('load'), '.2f'):>5} "
                       f"{num(f.get('free_mb'), 'd'):>8} {num(f.get('temp_c'), '.1f'):>6} {str(gov or '-'):<12} "
                       f"{(r['last_seen'] or 'never')[:19]:<20} {'YES' if r['quarantined'] else 'no':<10} "
                       f"{r['consecutive_failures']}")
            for p in r.get("problems") or []:
                click.echo(f"    problem: {p}")
            for w in r.get("warnings") or []:
                click.echo(f"    warning: {w}")
            if r["quarantined"]:
                click.echo(f"    quarantined: {r['quarantine_reason']} (edgeopt rig release {r['device']})")
            for e in (r.get("recent_failures") or [])[:3]:
                click.echo(f"    {e['time'][:19]} {e['kind']}: {(e['detail'] or '')[:100]}")
    from edgeopt.errors import EXIT_DEVICE_FAILED

    bad = any(r["quarantined"] or r["health"] in ("unfit", "unreachable") for r in res["devices"])
    return EXIT_DEVICE_FAILED if bad else 0


@command.command("release", epilog="""\b
examples:
  edgeopt rig release jetson-2
  edgeopt rig release jetson-2 --db ci/results.db
""")
@click.argument("device")
@click.option("--db", envvar="EDGEOPT_DB", default="edgeopt-results.db", show_default=True, help="Results database (quarantine state).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def release(device, db, as_json) -> int:
    """Lift DEVICE's quarantine and clear its failure count: the next gate measures it again."""
    from edgeopt.commands import emit_json
    from edgeopt.hil.rig import release as rig_release

    res = rig_release(device, db)
    if as_json:
        emit_json(res, "rig-release")
    else:
        click.echo(f"{device}: " + ("released from quarantine" if res["was_quarantined"] else "was not quarantined")
                   + f"; {res['failures_cleared']} failure(s) cleared")
    return 0
