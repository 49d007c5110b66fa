"""``edgeopt gate``: a noise-aware regression gate for hardware-in-the-loop CI (click)."""

from __future__ import annotations

import sys

import click

EXAMPLES = """\b
examples:
  edgeopt gate dist/new/cls/cpu-fp32 --baseline dist/old/cls/cpu-fp32 --devices rig.yaml
  edgeopt gate CAND --baseline BASE --devices rig.yaml --gate gate.yaml --junit gate.xml --md gate.md
  edgeopt gate CAND --baseline BASE --budget 2m --on-inconclusive pass --json
  edgeopt gate CAND --baseline results:main --devices rig.yaml   # against stored rounds (unpaired)

\b
rig.yaml: the inventory plus a `rig:` policy (see docs/HIL.md):
  rig: {max_load: 1.5, max_temp_c: 70, governor: performance, settle_s: 5, wait_s: 60,
        prepare: ["sudo jetson_clocks"], restore: ["sudo jetson_clocks --restore"],
        power_cycle: [relayctl, cycle, "{device}"], quarantine_after: 3}

\b
gate.yaml (defaults shown; each key keeps its default unless given; `p90: off` ungates one):
  p50: {max_slowdown: 5%}         # percentages with %; a bare number is a fraction (0.05), above 1 refused
  p90: {max_slowdown: 10%}        # p99 needs >= 662 samples per arm to be judged
  throughput: {max_drop: 5%}      # opt-in (not gated unless given)
  decisions: {max_disagreement: 5%} # the default accuracy rule: at most 5% of the validation samples'
                                  # decisions (argmax, labels, CTC text, thresholds; a detector's boxes)
                                  # differ from the baseline's; each bundle's own FP32 bound always applies
  # accuracy: {top1_min: 0.99}    # opt-in, NO default (also cosine_min, seq_match_min)
  level: 0.05                     # Holm-corrected across the latency metrics
  rounds: {start: 10, max: 320}
  cold_start: {max_slowdown: 20%} # opt-in: load + first inference, fresh processes A B B A ...
  memory: {max_increase: 10%}     # opt-in: peak RSS of those processes
  fresh_runs: 6

\b
--budget bounds the gate's wall time (connect, push, loading, accuracy pass, rounds, fresh processes;
not the build of a model CANDIDATE). Latency needs 2 agent calls and 6 paired rounds: a budget too
short for that model is inconclusive, and the gate says which budget would do.

\b
exit codes: 0 pass or improved, 5 regressed, 4 a device or rig failure (never a regression),
6 inconclusive (fold it with --on-inconclusive pass|fail), 2 bad input.
"""


@click.command("gate", epilog=EXAMPLES, context_settings={"help_option_names": ["-h", "--help"]},
               short_help="Did a candidate regress against a baseline on the rig? (CI gate)")
@click.argument("candidate", type=click.Path())
@click.option("--baseline", required=True, type=click.Path(),
              help="The bundle folder to compare against, or results:NAME (a stored baseline: unpaired).")
@click.option("--devices", "devices", default="local", show_default=True,
              help="The rig file: a devices inventory (its `rig:` section: health policy, prepare/restore, "
                   "power_cycle, quarantine), an Ansible inventory, or `local`.")
@click.option("--limit", "limit", multiple=True, help="Only these devices (comma-separated names).")
@click.option("--label", "labels", multiple=True, help="Only devices with this label (comma-separated).")
@click.option("--gate", "gate_file", type=click.Path(), help="Thresholds per metric (see below).")
@click.option("--budget", default="60s", show_default=True, help="Wall time of the whole gate: 500ms, 60s, 2m, "
              "1h (sequential rounds stop earlier once every metric is decided).")
@click.option("--on-inconclusive", type=click.Choice(["pause", "fail", "pass", "exit6"], case_sensitive=False),
              default="pause", show_default=True,
              help="What an inconclusive verdict exits with: pause = 6 (default), fail = 5, pass = 0 "
                   "(exit6: old name of pause).")
@click.option("--junit", type=click.Path(), help="Write JUnit XML here (one test case per device × metric).")
@click.option("--md", type=click.Path(), help="Write a Markdown summary here (for a PR comment).")
@click.option("--raw", type=click.Path(), help="Write every round's samples and the verdicts as JSON here.")
@click.option("--db", envvar="EDGEOPT_DB", default="edgeopt-results.db", show_default=True, help="Results database.")
@click.option("--calib", default=None, help="CANDIDATE a model: its calibration/validation data (as for build) "
              "[the baseline bundle's recorded data source; exit 2 when it cannot be found].")
@click.option("--preprocess", default=None, help="CANDIDATE a model: image preprocessing (as for build) "
              "[the baseline bundle's recorded preprocessing].")
@click.option("--dist", default="dist-gate", show_default=True, help="CANDIDATE a model: where it is built.")
@click.option("--trust-new-host-keys", is_flag=True, help="Accept and record unknown host keys (TOFU).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole result as JSON on stdout.")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
def command(candidate, baseline, devices, limit, labels, gate_file, budget, on_inconclusive, junit, md, raw, db,
            calib, preprocess, dist, trust_new_host_keys, as_json, verbose, quiet) -> int:
    """Gate CANDIDATE (a bundle folder, or a model .onnx: then built first for the baseline bundle's target,
    precision, shapes and calibration/validation data) against --baseline on every rig device that takes
    its target.

    Baseline and candidate are measured interleaved (A B B A …) in one process on each device, so
    drift and background load hit both alike; each metric gets a ratio with a 95% interval and a
    Holm-corrected test, and one of pass / regressed / improved / inconclusive. Accuracy is exact.
    With --baseline results:NAME only the candidate is measured and compared with NAME's stored
    rounds (unpaired: 99% intervals; a changed device fingerprint is a warning). Unfit, unreachable
    or quarantined devices are infrastructure errors or skipped, never regressions.
    """
    import logging

    from edgeopt.commands import emit_json
    from edgeopt.hil.gate import gate
    from edgeopt.hil.junit import markdown, not_judged_line, write_outputs
    from edgeopt.jsonsafe import clean

    check_output_files(junit=junit, md=md, raw=raw)  # before anything is measured: the verdict must not be lost
    if str(candidate).lower().endswith(".onnx"):
        from edgeopt.api import check_bundle_folder

        check_bundle_folder(dist)
    if verbose:
        logging.getLogger().setLevel(logging.DEBUG)
    progress = (lambda s: None) if quiet else (lambda s: print(f"[gate] {s}", file=sys.stderr, flush=True))
    result = gate(candidate, baseline, devices, list(limit), list(labels), gate_file, budget, on_inconclusive, db,
                  trust_new_host_keys, progress, calib=calib, preprocess=preprocess, dist=dist)
    code = result["exit_code"]
    write_outputs(result, junit, md, raw)
    for dev in result["devices"]:
        line = dev.get("error") or dev.get("skipped") or ", ".join(
            f"{v['metric']} {v['verdict']}" for v in dev.get("verdicts") or [])
        for note in ("budget_note", "noise_note"):
            if dev.get(note):
                line += f" ({dev[note]})"
        if not_judged_line(dev):
            line += f" ({not_judged_line(dev)})"
        if result.get("data_note"):
            line += f" ({result['data_note']})"
        if dev.get("warnings"):
            line += f" ({len(dev['warnings'])} warning(s): {dev['warnings'][0][:120]})"
        print(f"edgeopt gate: {dev['device']}: {dev.get('verdict')}: {line}", file=sys.stderr)
    if as_json:
        emit_json(clean(result | {"devices": [{k: v for k, v in d.items() if k not in ("raw", "samples")}
                                              for d in result["devices"]]}))
    else:
        click.echo(markdown(result))
        if raw:
            click.echo(f"raw rounds: {raw}")
    return code


def check_output_files(**paths: str | None) -> None:
    """``--junit``/``--md``/``--raw`` refused (``UsageError``, exit 2) before the gate runs when they cannot be
    written: a folder that does not exist, the path itself a folder, no write permission, or two flags on one file."""
    import os
    from pathlib import Path

    from edgeopt.errors import UsageError

    seen: dict[Path, str] = {}
    for flag, out in paths.items():
        if not out:
            continue
        path = Path(out)
        parent = path.parent if str(path.parent) else Path(".")
        where = f"--{flag} {out!r}"
        if path.resolve() in seen:
            raise UsageError(f"{where}: the same file as --{seen[path.resolve()]}", hint="give each its own file")
        seen[path.resolve()] = flag
        if path.is_dir():
            example = {"junit": "gate.xml", "md": "gate.md", "raw": "gate.json"}.get(flag, "gate.out")
            raise UsageError(f"{where} is a folder", hint=f"give a file name, e.g. --{flag} {example}")
        if not parent.is_dir():
            raise UsageError(f"cannot write {where}: the folder {str(parent)!r} does not exist"
                             if not parent.exists() else f"cannot write {where}: {str(parent)!r} is not a folder")
        if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise UsageError(f"cannot write {where}: permission denied")
        import tempfile

        try:  # the access bits can say yes where a write fails (root, /proc, a read-only mount): try one
            fd, tmp = tempfile.mkstemp(dir=parent, prefix=".edgeopt-write-check.")
            os.close(fd)
            os.unlink(tmp)
        except OSError as exc:
            raise UsageError(f"cannot write {where}: {exc.strerror or exc}") from None
