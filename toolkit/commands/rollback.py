"""``edgeopt rollback``: put devices back on the previous bundle of a model (click)."""

from __future__ import annotations

import click

from ._common import verbosity


@click.command("rollback", short_help="Put devices back on a model's previous bundle",
               context_settings={"help_option_names": ["-h", "--help"]}, epilog="""\b
examples:
  edgeopt rollback --devices fleet.yaml --model ch_ppocr_mobile_v2.0_cls_infer
  edgeopt rollback --devices fleet.yaml --model cls --target intel-cpu --limit shop-07

\b
exit codes: 0 every device that has the model is back on its previous bundle, 2 bad input (a model no
selected device has: the line names the models they have), 4 a device was unreachable or had no
previous bundle.
""")
@click.option("--devices", "devices_file", required=True, help="Devices YAML or Ansible inventory.")
@click.option("--model", required=True, help="The model name (as in the bundles' manifest).")
@click.option("--target", default=None, help="Only devices of this target.")
@click.option("--limit", multiple=True, help="Only these devices (names, comma-separated).")
@click.option("--trust-new-host-keys", is_flag=True)
@click.option("--json", "as_json", is_flag=True)
@verbosity
def command(devices_file, model, target, limit, trust_new_host_keys, as_json, verbose, quiet) -> int:
    """Each selected device's slot <model>/<target> goes back to its previous bundle (the agent's
    rollback, under its store lock). Devices that never activated the model are skipped."""
    from edgeopt import api
    from edgeopt.commands import emit_json
    from edgeopt.commands._common import quiet as is_quiet
    from edgeopt.errors import EXIT_DEVICE_FAILED
    from edgeopt.ui import stderr_progress

    res = api.rollback(devices_file, model, target=target, limit=list(limit),
                       trust_new_host_keys=trust_new_host_keys,
                       progress=stderr_progress(is_quiet(click.get_current_context(), quiet)),
                       raise_on_failure=False)
    if as_json:
        emit_json(res.as_dict(), "rollback")
    else:
        for d in res.devices:
            click.echo(f"{d.device}: " + (f"now on {str(d.current)[:12]}" if d.status == "rolled-back"
                                          else f"{d.status}: {d.error}"))
    return 0 if res.ok else EXIT_DEVICE_FAILED
