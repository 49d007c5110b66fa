"""``edgeopt rollout``: ship a model version to a fleet in waves, gated on each device (click)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

EXAMPLES = """\b
examples:
  edgeopt rollout dist/cls --devices fleet.yaml --waves 1,10%,50%,100% --dry-run
  edgeopt rollout dist/cls --devices fleet.yaml --gate gate.yaml --max-fail 10% --parallel 16
  edgeopt rollout dist/cls/cpu-fp32 --devices fleet.yaml --select label=shop --health-watch 30
  edgeopt rollout dist/cls --devices inventory.ini --engine ansible --parallel 50 --waves 1,5%,25%,100%
  edgeopt rollout status 3f2a9c1d0b7e
  edgeopt rollout resume 3f2a9c1d0b7e --approve

\b
Per device: push -> gate on the device (fidelity vs its FP32 reference; decisions and latency vs the
bundle it replaces, measured interleaved) -> activate as a trial -> activate_cmd -> health_cmd ->
commit. A device that fails ends on its previous bundle; an unconfirmed trial reverts on its own.
A wave fails when its failures EXCEED --max-fail (Ansible's rule); then no further wave starts.

\b
exit codes: 0 done, 5 halted (a gate or health check failed beyond --max-fail), 6 paused
(inconclusive latency), 4 devices unreachable beyond --max-fail, 2 bad input (nothing changed).
"""


class _DefaultGroup(click.Group):
    """``edgeopt rollout BUNDLES…`` means ``edgeopt rollout start BUNDLES…``."""

    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["start", *args]
        return super().resolve_command(ctx, args)


@click.group("rollout", cls=_DefaultGroup, epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]},
             short_help="Roll a model version out to a fleet in waves, gated on each device")
def command() -> None:
    """Roll bundles out to a fleet in waves (start is the default subcommand), see a rollout's status,
    resume one after a pause or a crash of this host."""


def _progress(quiet: bool):
    return (lambda s: None) if quiet else (lambda s: print(f"[rollout] {s}", file=sys.stderr, flush=True))


def _listener(events: str | None, as_json: bool):
    if events:
        f = open(events, "a", buffering=1)  # noqa: SIM115 - lives as long as the command
        return lambda ev: f.write(json.dumps(ev, default=str) + "\n")
    if as_json:
        return lambda ev: print(json.dumps(ev, default=str), flush=True)
    return None


def _exit(summary: dict) -> int:
    st = summary.get("status")
    if st == "done":
        return 0
    if st == "paused":
        return 6
    if st == "halted":
        outs = [o for w in summary.get("waves", []) for o in w.get("outcomes", [])]
        gate_like = any(o["status"] == "failed" for o in outs)
        return 5 if gate_like else 4
    return 1


def _print_summary(summary: dict) -> None:
    click.echo(f"rollout {summary['rollout_id']} of {summary['model']}: {summary['status'].upper()}"
               + (f" — {summary['reason']}" if summary.get("reason") else ""))
    for w in summary["waves"]:
        if "outcomes" not in w:
            click.echo(f"  wave {w['wave'] + 1}: {w['devices']} device(s) already done (resume)")
            continue
        click.echo(f"  wave {w['wave'] + 1}: " + ", ".join(f"{k} {v}" for k, v in sorted(w["counts"].items())))
        for o in w["outcomes"]:
            if o["status"] not in ("done", "already"):
                click.echo(f"    {o['device']}: {o['status']} at {o['step']}: {o['reason'][:200]}")
    for s in summary.get("skipped", []):
        click.echo(f"  skipped {s['device']}: {s['reason']}")
    if summary.get("rolled_back"):
        click.echo("  rolled back: " + ", ".join(f"{d} -> {str(v)[:12]}" for d, v in summary["rolled_back"].items()))


def _load(bundles, devices_file, select, waves_text, limit=None):
    from edgeopt.api import rollout_inputs

    return rollout_inputs(list(bundles), devices_file, list(select), waves_text, list(limit or []) or None)


def _options(gate_file, gate_budget, max_fail, parallel, bake, on_inconclusive, on_halt, health_watch, trust,
             max_disagreement, no_latency_gate, engine="builtin", step_timeout=600.0, retries=2):
    from edgeopt.api import rollout_options

    return rollout_options(gate_file, gate_budget, max_fail, parallel, bake, on_inconclusive, on_halt, health_watch,
                           trust, max_disagreement, not no_latency_gate, engine, step_timeout, retries)


@command.command("start", epilog=EXAMPLES)
@click.argument("bundles", nargs=-1, required=True)
@click.option("--devices", "devices_file", required=True, help="The fleet: devices YAML or Ansible inventory.")
@click.option("--limit", multiple=True, help="Only these devices (names, comma-separated).")
@click.option("--select", multiple=True, help="label=NAME, target=NAME, name=NAME (comma-separated, repeatable).")
@click.option("--waves", default="1,10%,50%,100%", show_default=True, help="Cumulative wave sizes: counts or %.")
@click.option("--gate", "gate_file", type=click.Path(), help="Thresholds (the HIL gate's file format).")
@click.option("--gate-budget", default=20.0, show_default=True, type=float,
              help="Seconds of interleaved latency measurement per device against its incumbent.")
@click.option("--max-disagreement", default=None, help="Allowed share of decisions differing from the "
              "incumbent on the same inputs (e.g. 2%).")
@click.option("--eval", "eval_data", type=click.Path(), help="Labelled evaluation set (.npz: the model's inputs, "
              "samples on axis 0, and `labels`): scored on each device beside the bundle it replaces.")
@click.option("--eval-max-drop", default=0.01, show_default=True, type=float,
              help="How far the candidate's top-1 on --eval may fall below the incumbent's (0.01 = 1 point).")
@click.option("--no-latency-gate", is_flag=True, help="Skip the comparison with the incumbent (fidelity only).")
@click.option("--max-fail", default="0", show_default=True, help="Failures a wave may have (count or %); "
              "more halts the rollout.")
@click.option("--parallel", default=8, show_default=True, type=int, help="Devices worked on at once "
              "(Ansible's forks with --engine ansible).")
@click.option("--engine", type=click.Choice(["builtin", "ansible"]), default="builtin", show_default=True,
              help="builtin: a thread pool in this process (up to a few hundred devices); ansible: each wave "
                   "an Ansible play run by ansible-runner (forks, max_fail_percentage, its event stream in the "
                   "journal; needs edgeopt[fleet]). Both run the same steps per device.")
@click.option("--retries", default=2, show_default=True, type=int,
              help="Retries of a device that was unreachable or lost its connection before its trial activation "
                   "(with a growing delay); a failed gate, hook or health check is never retried.")
@click.option("--step-timeout", default=600.0, show_default=True, type=float,
              help="Seconds one agent call of a device's steps may take (a hung device is timed-out).")
@click.option("--bake", default=0.0, show_default=True, type=float, help="Seconds to wait between waves.")
@click.option("--health-watch", default=0.0, show_default=True, type=float,
              help="Seconds health_cmd is re-run after activation before the bundle is committed.")
@click.option("--on-inconclusive", type=click.Choice(["pause", "continue", "fail"]), default="pause",
              show_default=True)
@click.option("--on-halt", type=click.Choice(["keep", "rollback-all"]), default="keep", show_default=True,
              help="On a halt the failing wave rolls back; earlier waves stay (keep) or roll back too.")
@click.option("--dry-run", is_flag=True, help="Print the plan (waves, devices, bytes) and change nothing.")
@click.option("--events", type=click.Path(), help="Append every event as a JSON line to this file.")
@click.option("--db", default="edgeopt-results.db", show_default=True, help="Journal / results database.")
@click.option("--trust-new-host-keys", is_flag=True)
@click.option("--json", "as_json", is_flag=True, help="Events as JSON lines on stdout, then the summary.")
@click.option("-v", "--verbose", is_flag=True)
@click.option("-q", "--quiet", is_flag=True)
def start(bundles, devices_file, limit, select, waves, gate_file, gate_budget, max_disagreement, eval_data,
          eval_max_drop, no_latency_gate,
          max_fail, parallel, engine, retries, step_timeout, bake, health_watch, on_inconclusive, on_halt, dry_run, events, db,
          trust_new_host_keys, as_json, verbose, quiet) -> int:
    """Roll BUNDLES (bundle folders or a dist/<model>/ folder) out to the fleet; each device gets the
    bundle of its own target."""
    from edgeopt.api import rollout
    from edgeopt.commands import emit_json

    result = rollout(list(bundles), devices_file, waves=waves, select=list(select), limit=list(limit),
                     dry_run=dry_run, db=db, on_event=_listener(events, as_json), progress=_progress(quiet),
                     eval=eval_data, eval_max_drop=eval_max_drop,
                     gate=gate_file, gate_budget=gate_budget, max_fail=max_fail, parallel=parallel, bake=bake,
                     on_inconclusive=on_inconclusive, on_halt=on_halt, health_watch=health_watch,
                     trust_new_host_keys=trust_new_host_keys, max_disagreement=max_disagreement,
                     latency_gate=not no_latency_gate, engine=engine, step_timeout=step_timeout, retries=retries)
    if dry_run:
        if as_json:
            emit_json(result, "rollout-plan")
            return 0
        click.echo(f"plan for {result['model']}: {sum(len(w) for w in result['waves'])} device(s) in "
                   f"{len(result['waves'])} wave(s), up to {result['bytes'] / 1e6:.1f} MB to send (less what "
                   "devices already hold)")
        for i, wave in enumerate(result["waves"]):
            click.echo(f"  wave {i + 1}: " + ", ".join(f"{w['device']} ({w['target']}, {w['bundle_id'][:12]})"
                                                       for w in wave))
        for s in result["skipped"]:
            click.echo(f"  skipped {s['device']}: {s['reason']}")
        return 0
    if as_json:
        emit_json(result)
    else:
        _print_summary(result)
    return _exit(result)


@command.command("status")
@click.argument("rollout_id")
@click.option("--db", default="edgeopt-results.db", show_default=True)
@click.option("--json", "as_json", is_flag=True)
def status(rollout_id, db, as_json) -> int:
    """A rollout's status and each device's last outcome, from the journal."""
    from edgeopt.commands import emit_json
    from edgeopt.errors import UsageError
    from edgeopt.fleet.journal import Journal

    if not Path(db).is_file():
        raise UsageError(f"no journal at {db!r}: no rollout has been started here")
    with Journal(db) as j:
        r = j.rollout(rollout_id)
        states = j.device_states(rollout_id)
    if as_json:
        emit_json({**r, "devices": states}, "rollout-status")
        return 0
    click.echo(f"rollout {r['id']} of {r['model']} started {r['time']}: {r['status']}"
               + (f" — {r['spec'].get('reason')}" if r["spec"].get("reason") else ""))
    for name, ev in sorted(states.items()):
        click.echo(f"  {name}: {ev['status']}" + (f" at {ev.get('at')}: {str(ev.get('reason'))[:160]}"
                                                  if ev.get("reason") else ""))
    return 0


@command.command("resume")
@click.argument("rollout_id")
@click.option("--approve", is_flag=True, help="Go on past an inconclusive latency verdict (a paused rollout).")
@click.option("--db", default="edgeopt-results.db", show_default=True)
@click.option("--events", type=click.Path())
@click.option("--json", "as_json", is_flag=True)
@click.option("-q", "--quiet", is_flag=True)
def resume(rollout_id, approve, db, events, as_json, quiet) -> int:
    """Finish a rollout that paused, or whose host died mid-wave: devices already on the candidate are
    not touched again; half-done ones are finished (their unconfirmed trial reverts on its own)."""
    from edgeopt.commands import emit_json
    from edgeopt.errors import UsageError
    from edgeopt.fleet.journal import Journal
    from edgeopt.fleet.rollout import run_rollout

    if not Path(db).is_file():
        raise UsageError(f"no journal at {db!r}: no rollout has been started here")
    with Journal(db, _listener(events, as_json)) as j:
        r = j.rollout(rollout_id)
        if r["status"] in ("done", "halted"):
            raise UsageError(f"rollout {rollout_id} is {r['status']}: nothing to resume",
                             hint="start a new rollout" if r["status"] == "halted" else None)
        if r["status"] == "paused" and not approve:
            raise UsageError(f"rollout {rollout_id} is paused on an inconclusive verdict; add --approve to go on")
        s = r["spec"]
        opts = _options(s.get("gate"), s["gate_budget"], s["max_fail"], s["parallel"], s["bake"],
                        "continue" if approve else s["on_inconclusive"], s["on_halt"], s["health_watch"], False,
                        s.get("max_disagreement"), s.get("no_latency_gate", False), s.get("engine", "builtin"),
                        s.get("step_timeout", 600.0), s.get("retries", 2))
        plan, devmap, bmap = _load(s["bundles"], s["devices"], s["select"], s["waves"], s.get("limit"))
        if s.get("eval"):
            from edgeopt.fleet.evalset import load_eval

            opts.eval_set = load_eval(s["eval"], list({b.bundle_id: b for b in bmap.values()}.values()),
                                      s.get("eval_max_drop", 0.01))
        done = {d: ev["status"] for d, ev in j.device_states(rollout_id).items()}
        j.set_status(rollout_id, "running", {"resumed": True})
        summary = run_rollout(plan, devmap, bmap, opts, j, rollout_id=rollout_id, done=done,
                              progress=_progress(quiet))
    if as_json:
        emit_json(summary)
    else:
        _print_summary(summary)
    return _exit(summary)
