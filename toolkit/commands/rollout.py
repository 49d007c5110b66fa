"""``edgeopt rollout``: ship a model version to a fleet in waves, gated on each device (click)."""

from __future__ import annotations

import sys

import click

from edgeopt.ui import clip

from ._common import deprecated, verbosity

EXAMPLES = """\b
examples:
  edgeopt rollout dist/cls --devices fleet.yaml --waves 1,10%,50%,100% --dry-run
  edgeopt rollout dist/cls --devices fleet.yaml --gate gate.yaml --max-fail 10% --parallel 16
  edgeopt rollout dist/cls/cpu-fp32 --devices fleet.yaml --label shop --health-watch 30 --device-budget 30s
  edgeopt rollout dist/cls --devices inventory.ini --fleet-engine ansible --parallel 50 --waves 1,5%,25%,100%
  edgeopt rollout status 3f2a9c1d0b7e
  edgeopt rollout resume 3f2a9c1d0b7e --approve

\b
Per device: push -> gate on the device (fidelity vs its FP32 reference; decisions and latency vs the
bundle it replaces, measured interleaved) -> activate as a trial -> activate_cmd -> health_cmd ->
commit. A device that fails ends on its previous bundle; an unconfirmed trial reverts on its own
(health-watch + health timeout + 60 s + step-timeout after its activation, if this host stops).
A wave fails when its failures EXCEED --max-fail (Ansible's rule); then no further wave starts.
Every wave adds at least one device and at most its cap; waves that stop below 100% leave the rest out.
The planned bundles are kept with the journal: `resume` installs exactly those (checked by id).

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




def _local_db(ctx, param, value):
    """The rollout journal is local state: a server --db (postgresql://...) keeps it in that URL's spool file."""
    from edgeopt.results_url import local_db_callback

    return local_db_callback(ctx, param, value)

@click.group("rollout", cls=_DefaultGroup, epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]},
             short_help="Roll a model version out to a fleet in waves, gated on each device")
def command() -> None:
    """Roll bundles out to a fleet in waves (start is the default subcommand), see a rollout's status,
    resume one after a pause or a crash of this host."""


def _progress(quiet: bool):
    from ._common import quiet as said_quiet

    quiet = said_quiet(click.get_current_context(silent=True), quiet)  # -q on the command or before it
    return (lambda s: None) if quiet else (lambda s: print(f"[rollout] {s}", file=sys.stderr, flush=True))


def _listener(events: str | None, as_json: bool):
    import threading

    from edgeopt.jsonsafe import dumps

    lock = threading.Lock()  # devices report from their own threads: one whole line at a time, never "}{"

    def line_to(stream):
        def write(ev) -> None:
            text = dumps(ev, default=str) + "\n"
            with lock:
                stream.write(text)
                stream.flush()
        return write

    if events:
        from .report import check_writable

        check_writable(str(events), "--events", "the events")  # one line, exit 2, before anything runs
        return line_to(open(events, "a", buffering=1))  # noqa: SIM115 - lives as long as the command
    if as_json:
        return line_to(sys.stdout)
    return None


def _emit(obj: dict, kind: str) -> None:
    """One JSON object (standard JSON: no NaN) in the common envelope."""
    from edgeopt.api import envelope
    from edgeopt.jsonsafe import dumps

    click.echo(dumps(envelope(kind, obj), indent=2, default=str))


def _summary_line(summary: dict) -> None:
    """--json: the summary as ONE compact line after the event lines (JSON lines, standard JSON only)."""
    from edgeopt.jsonsafe import dumps

    print(dumps(summary, default=str), flush=True)


class _Policy(click.Choice):
    """--on-inconclusive: fail | pass | pause; the old spellings (continue, exit6) are read silently."""

    ALIASES = {"continue": "pass", "exit6": "pause"}

    def __init__(self) -> None:
        super().__init__(["pause", "pass", "fail"])

    def convert(self, value, param, ctx):
        return super().convert(self.ALIASES.get(str(value), value), param, ctx)


def _api_policy(policy: str) -> str:
    """edgeopt.api.rollout_options still spells pass `continue`."""
    return "continue" if policy == "pass" else policy


def _budget(budget: str, gate_budget: str | None) -> float:
    from edgeopt.api import parse_duration

    return parse_duration(gate_budget if gate_budget is not None else budget, "--device-budget")


def _exit(summary: dict) -> int:
    """The exit code of the error ``edgeopt.api.rollout`` raises for this summary (0 when done)."""
    from edgeopt.api import rollout_failure

    err = rollout_failure(summary)
    return 0 if err is None else err.exit_code


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
                click.echo(f"    {o['device']}: {o['status']} at {o['step']}: {clip(o['reason'], 200)}")
    for s in summary.get("skipped", []):
        if s["reason"] != "beyond the last wave":
            click.echo(f"  skipped {s['device']}: {s['reason']}")
    if summary.get("left_out"):
        click.echo(f"  {summary['left_out']} device(s) stay out: the waves stop below the whole fleet")
    if summary.get("rolled_back"):
        click.echo("  rolled back: " + ", ".join(f"{d} -> {str(v)[:12]}" for d, v in summary["rolled_back"].items()))


@command.command("start", epilog=EXAMPLES)
@click.argument("bundles", nargs=-1, required=True)
@click.option("--devices", "devices_file", required=True, help="The fleet: devices YAML or Ansible inventory.")
@click.option("--limit", multiple=True, help="Only these devices (names, comma-separated).")
@click.option("--label", "labels", multiple=True, help="Only devices with this label (comma-separated, repeatable).")
@click.option("--select", multiple=True, help="label=NAME, target=NAME, name=NAME (comma-separated, repeatable).")
@click.option("--waves", default="1,10%,50%,100%", show_default=True, help="Cumulative wave sizes: counts or %.")
@click.option("--gate", "gate_file", type=click.Path(), help="Thresholds (the HIL gate's file format).")
@click.option("--device-budget", "budget", default="20s", show_default=True,
              help="Time for each device's interleaved latency measurement against its incumbent (500ms, 20s, 2m). "
                   "(The gate's --budget is a whole gate's wall time.)")
@deprecated("--budget", "--device-budget", "budget_old")
@deprecated("--gate-budget", "--device-budget", "gate_budget")
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
              "(Ansible's forks with --fleet-engine ansible).")
@click.option("--fleet-engine", "engine", type=click.Choice(["builtin", "ansible"]), default=None,
              help="builtin (default): a thread pool in this process (up to a few hundred devices); ansible: each "
                   "wave an Ansible play run by ansible-runner (forks, max_fail_percentage, its event stream in the "
                   "journal; needs edgeopt[fleet]). Both run the same steps per device.")
@deprecated("--engine", "--fleet-engine", "engine_alias", type=click.Choice(["builtin", "ansible"]))
@click.option("--retries", default=2, show_default=True, type=int,
              help="Retries of a device that was unreachable or lost its connection before its trial activation "
                   "(with a growing delay); a failed gate, hook or health check is never retried.")
@click.option("--step-timeout", default=600.0, show_default=True, type=float,
              help="Seconds one agent call of a device's steps may take (a hung device is timed-out).")
@click.option("--bake", default=0.0, show_default=True, type=float, help="Seconds to wait between waves.")
@click.option("--health-watch", default=0.0, show_default=True, type=float,
              help="Seconds health_cmd is re-run after activation before the bundle is committed.")
@click.option("--on-inconclusive", type=_Policy(), default="pause", show_default=True,
              help="An inconclusive latency verdict: pause the rollout for approval (exit 6), fail the device, "
                   "or pass (go on).")
@click.option("--on-halt", type=click.Choice(["keep", "rollback-all"]), default="keep", show_default=True,
              help="On a halt the failing wave rolls back; earlier waves stay (keep) or roll back too.")
@click.option("--dry-run", is_flag=True, help="Print the plan (waves, devices, bytes) and change nothing.")
@click.option("--events", type=click.Path(), help="Append every event as a JSON line to this file.")
@click.option("--db", envvar="EDGEOPT_DB", default="edgeopt-results.db", show_default=True,
              callback=_local_db, help="Journal / results database.")
@click.option("--trust-new-host-keys", is_flag=True)
@click.option("--json", "as_json", is_flag=True, help="Events as JSON lines on stdout, then the summary as one "
              "line.")
@verbosity
def start(bundles, devices_file, limit, labels, select, waves, gate_file, budget, budget_old, gate_budget,
          max_disagreement,
          eval_data, eval_max_drop, no_latency_gate, max_fail, parallel, engine, engine_alias, retries, step_timeout,
          bake, health_watch, on_inconclusive, on_halt, dry_run, events, db, trust_new_host_keys, as_json, verbose,
          quiet) -> int:
    """Roll BUNDLES (bundle folders or a dist/<model>/ folder) out to the fleet; each device gets the
    bundle of its own target."""
    from edgeopt.api import rollout

    select = [*select, *(f"label={x.strip()}" for item in labels for x in item.split(",") if x.strip())]
    result = rollout(list(bundles), devices_file, waves=waves, select=select, limit=list(limit),
                     dry_run=dry_run, db=db, on_event=_listener(events, as_json), progress=_progress(quiet),
                     eval=eval_data, eval_max_drop=eval_max_drop,
                     gate=gate_file, device_budget=_budget(budget, budget_old if budget_old is not None else gate_budget),
                     max_fail=max_fail, parallel=parallel,
                     bake=bake, on_inconclusive=_api_policy(on_inconclusive), on_halt=on_halt,
                     health_watch=health_watch,
                     trust_new_host_keys=trust_new_host_keys, max_disagreement=max_disagreement,
                     no_latency_gate=no_latency_gate, fleet_engine=engine or engine_alias or "builtin",
                     step_timeout=step_timeout, retries=retries, raise_on_failure=False).to_dict()
    if dry_run:
        if as_json:
            _emit(result, "rollout-plan")
            return 0
        click.echo(f"plan for {result['model']}: {sum(len(w) for w in result['waves'])} device(s) in "
                   f"{len(result['waves'])} wave(s), up to {result['bytes'] / 1e6:.1f} MB to send (less what "
                   "devices already hold)")
        for i, wave in enumerate(result["waves"]):
            click.echo(f"  wave {i + 1}: " + ", ".join(f"{w['device']} ({w['target']}, {w['bundle_id'][:12]})"
                                                       for w in wave))
        for s in result["skipped"]:
            if s["reason"] != "beyond the last wave":
                click.echo(f"  skipped {s['device']}: {s['reason']}")
        if result.get("left_out"):
            click.echo(f"  {result['left_out']} device(s) stay out: the last wave ({result['wave_specs'][-1]}) "
                       "stops below the whole fleet")
        return 0
    if as_json:
        _summary_line(result)
    else:
        _print_summary(result)
    return _exit(result)


@command.command("list")
@click.option("--db", envvar="EDGEOPT_DB", default="edgeopt-results.db", show_default=True,
              callback=_local_db)
@click.option("--last", default=20, show_default=True, help="How many rollouts, newest first.")
@click.option("--json", "as_json", is_flag=True)
@verbosity
def list_(db, last, as_json, verbose, quiet) -> int:
    """The rollouts journalled here, newest first; one whose host process is gone reads `interrupted`
    (resumable with `edgeopt rollout resume ID`)."""
    from edgeopt.api import rollout_list

    rows = [r.to_dict() for r in rollout_list(db, last)]
    if as_json:
        _emit({"rollouts": rows}, "rollout-list")
        return 0
    if not rows:
        click.echo(f"no rollout journalled in {db}")
    for r in rows:
        click.echo(f"{r['id']}  {r['time']}  {r['model']}  {r['status']}"
                   + (f" ({r['stale_reason']}; `edgeopt rollout resume {r['id']}`)" if r.get("stale_reason") else ""))
    return 0


@command.command("status")
@click.argument("rollout_id")
@click.option("--db", envvar="EDGEOPT_DB", default="edgeopt-results.db", show_default=True,
              callback=_local_db)
@click.option("--json", "as_json", is_flag=True)
@verbosity
def status(rollout_id, db, as_json, verbose, quiet) -> int:
    """A rollout's status and each device's last outcome, from the journal; a rollout whose host process
    died is `stale`, with the devices left in an unconfirmed trial and when their agents revert them."""
    from edgeopt.api import rollout_status

    r = rollout_status(rollout_id, db).to_dict()
    stale, states, trials = r.get("stale_reason"), r["devices"], r["unconfirmed_trials"]
    if as_json:
        _emit(r, "rollout-status")
        return 0
    click.echo(f"rollout {r['id']} of {r['model']} started {r['time']}: {stale or r['journal_status']}"
               + (f" — {r['spec'].get('reason')}" if r["spec"].get("reason") else ""))
    for name, ev in sorted(states.items()):
        if name in trials:
            continue
        click.echo(f"  {name}: {ev['status']}" + (f" at {ev.get('at')}: {clip(ev.get('reason'), 200)}"
                                                  if ev.get("reason") else ""))
    for name, ev in sorted(trials.items()):
        how = ("its agent reverts it to the previous bundle at " if stale or r["journal_status"] != "running"
               else "committed after its health window, else reverted by its agent at ")
        click.echo(f"  {name}: in an unconfirmed trial of {str(ev.get('bundle_id'))[:12]} since {ev['time']}; "
                   f"{how}{ev.get('revert_at')}")
    if stale:
        click.echo(f"  `edgeopt rollout resume {r['id']}` finishes it")
    return 0


@command.command("resume")
@click.argument("rollout_id")
@click.option("--approve", is_flag=True, help="Approve the inconclusive latency verdicts that paused the rollout "
              "(those devices go on); later devices pause again on theirs.")
@click.option("--db", envvar="EDGEOPT_DB", default="edgeopt-results.db", show_default=True,
              callback=_local_db)
@click.option("--events", type=click.Path())
@click.option("--json", "as_json", is_flag=True)
@verbosity
def resume(rollout_id, approve, db, events, as_json, verbose, quiet) -> int:
    """Finish a rollout that paused, or whose host died mid-wave: devices already on the candidate are
    not touched again; half-done ones are finished (their unconfirmed trial reverts on its own). It
    installs exactly the bundles the plan names, from the copies kept with the journal."""
    from edgeopt.api import rollout_resume

    summary = rollout_resume(rollout_id, approve=approve, db=db, on_event=_listener(events, as_json),
                             progress=_progress(quiet), raise_on_failure=False).to_dict()
    if as_json:
        _summary_line(summary)
    else:
        _print_summary(summary)
    return _exit(summary)
