"""``edgeopt fleet status``: which bundle each device runs, from the agents, against the journal (click)."""

from __future__ import annotations

import click

from ._common import verbosity


@click.group("fleet", short_help="What the fleet runs, read from the devices themselves",
             context_settings={"help_option_names": ["-h", "--help"]}, epilog="""\b
examples:
  edgeopt fleet status --devices fleet.yaml
  edgeopt fleet status --devices fleet.yaml --rollout 3f2a9c1d0b7e --json
""")
def command() -> None:
    """Fleet views read from the devices' agents."""


@command.command("status", epilog="""\b
examples:
  edgeopt fleet status --devices fleet.yaml
  edgeopt fleet status --devices fleet.yaml --rollout 3f2a9c1d0b7e --json
""")
@click.option("--devices", "devices_file", required=True, help="Devices YAML or Ansible inventory.")
@click.option("--limit", multiple=True)
@click.option("--rollout", "rollout_id", default=None, help="Compare with what this rollout's journal expects.")
@click.option("--db", envvar="EDGEOPT_DB", default="edgeopt-results.db", show_default=True)
@click.option("--parallel", default=16, show_default=True, type=int)
@click.option("--trust-new-host-keys", is_flag=True)
@click.option("--json", "as_json", is_flag=True)
@verbosity
def status(devices_file, limit, rollout_id, db, parallel, trust_new_host_keys, as_json, verbose, quiet) -> int:
    """Every device's slots (current, trial) as its agent reports them; with --rollout, drift from
    what the journal believes each device runs is flagged."""
    from concurrent.futures import ThreadPoolExecutor

    from edgeopt.commands import emit_json
    from edgeopt.deploy import DeviceSession
    from edgeopt.errors import EXIT_DEVICE_FAILED, DeviceError
    from edgeopt.inventory import load_inventory

    devs = load_inventory(devices_file).select(list(limit) or None)
    expect = {}
    if rollout_id:
        from edgeopt.fleet.journal import Journal

        with Journal(db) as j:
            j.rollout(rollout_id)
            expect = {d: ev.get("after") for d, ev in j.device_states(rollout_id).items()}

    def one(dev):
        try:
            with DeviceSession.open(dev, trust_new_host_keys) as s:
                return dev.name, {"slots": s.listing().get("slots", {})}
        except DeviceError as exc:
            return dev.name, {"error": exc.message}

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        rows = dict(pool.map(one, devs))
    drift = {}
    for name, want in expect.items():
        got = {s.get("current") for s in (rows.get(name) or {}).get("slots", {}).values()}
        if want and want not in got:
            drift[name] = {"journal": want, "device": sorted(x for x in got if x)}
    if as_json:
        emit_json({"devices": rows, "drift": drift}, "fleet-status")
    else:
        for name, r in rows.items():
            if "error" in r:
                click.echo(f"{name}: UNREACHABLE: {r['error']}")
                continue
            if not r["slots"]:
                flag = "  DRIFT: journal expects " + drift[name]["journal"][:12] if name in drift else ""
                click.echo(f"{name}: no slot (no bundle has been activated on this device){flag}")
            for slot, st in sorted(r["slots"].items()):
                tr = st.get("trial") or {}
                trial = (f" (trial, unconfirmed: its agent reverts it to {str(tr.get('previous') or 'nothing')[:12]} at "
                         f"{tr.get('deadline_at')} unless committed)" if tr else "")
                flag = "  DRIFT: journal expects " + drift[name]["journal"][:12] if name in drift else ""
                click.echo(f"{name}: {slot}: {str(st.get('current'))[:12]}{trial}{flag}")
    return EXIT_DEVICE_FAILED if drift or any("error" in r for r in rows.values()) else 0
