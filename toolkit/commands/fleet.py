"""``edgeopt fleet status``: which bundle each device runs, from the agents, against the journal (click)."""

from __future__ import annotations

import click

from ._common import verbosity


def _local_db(ctx, param, value):
    """The rollout journal is local state: a server --db (postgresql://...) keeps it in that URL's spool file."""
    from edgeopt.results_url import local_db_callback

    return local_db_callback(ctx, param, value)

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
@click.option("--db", envvar="EDGEOPT_DB", default="edgeopt-results.db", show_default=True,
              callback=_local_db)
@click.option("--parallel", default=16, show_default=True, type=int)
@click.option("--trust-new-host-keys", is_flag=True)
@click.option("--json", "as_json", is_flag=True)
@verbosity
def status(devices_file, limit, rollout_id, db, parallel, trust_new_host_keys, as_json, verbose, quiet) -> int:
    """Every device's slots (current, trial) as its agent reports them; with --rollout, drift from
    what the journal believes each device runs is flagged."""
    from edgeopt import api
    from edgeopt.commands import emit_json
    from edgeopt.errors import EXIT_DEVICE_FAILED

    st = api.fleet_status(devices_file, list(limit), rollout_id, db, parallel, trust_new_host_keys)
    rows, drift = st.devices, st.drift
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
    return 0 if st.ok else EXIT_DEVICE_FAILED
