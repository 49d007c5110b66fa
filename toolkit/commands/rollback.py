"""``edgeopt rollback``: put devices back on the previous bundle of a model (click)."""

from __future__ import annotations

import click


@click.command("rollback", short_help="Put devices back on a model's previous bundle",
               context_settings={"help_option_names": ["-h", "--help"]}, epilog="""\b
examples:
  edgeopt rollback --devices fleet.yaml --model ch_ppocr_mobile_v2.0_cls_infer
  edgeopt rollback --devices fleet.yaml --model cls --target intel-cpu --limit shop-07
""")
@click.option("--devices", "devices_file", required=True, help="Devices YAML or Ansible inventory.")
@click.option("--model", required=True, help="The model name (as in the bundles' manifest).")
@click.option("--target", default=None, help="Only devices of this target.")
@click.option("--limit", multiple=True, help="Only these devices (names, comma-separated).")
@click.option("--trust-new-host-keys", is_flag=True)
@click.option("--json", "as_json", is_flag=True)
def command(devices_file, model, target, limit, trust_new_host_keys, as_json) -> int:
    """Each selected device's slot <model>/<target> goes back to its previous bundle (the agent's
    rollback, under its store lock)."""
    from edgeopt.commands import emit_json
    from edgeopt.errors import UsageError
    from edgeopt.fleet.rollout import rollback_devices
    from edgeopt.inventory import canonical_target, load_inventory

    devs = load_inventory(devices_file).select(list(limit) or None)
    if target:
        devs = [d for d in devs if d.target and canonical_target(d.target) == canonical_target(target)]
    devs = [d for d in devs if d.target]
    if not devs:
        raise UsageError("no device with a target matches", hint="check --target/--limit and the inventory")
    res = rollback_devices(devs, model, {d.name: d.target for d in devs}, trust_new_host_keys,
                           lambda *a, **k: None)
    if as_json:
        emit_json({"model": model, "devices": res}, "rollback")
    else:
        for name, cur in res.items():
            click.echo(f"{name}: {cur if str(cur).startswith('failed') else 'now on ' + str(cur)[:12]}")
    return 4 if any(str(v).startswith("failed") for v in res.values()) else 0
