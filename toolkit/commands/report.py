"""``edgeopt report``: compare runs from the results database (targets x devices x precisions)."""

from __future__ import annotations

import click

from ._common import CONTEXT, deprecated, examples, ns, verbosity

HELP = """Compare measured runs from the results database.

One comparison of the runs in the results database: latency percentiles, throughput, load time,
memory and accuracy against the FP32 reference, per model, target, precision and device. By
default the latest run of each; --all for every run. Formats: table (default), md, html (a
self-contained page with plots: latency distribution per artifact, latency vs accuracy), json, csv.

Under the table, one verdict per model, device and batch: the artifact to ship by the lowest p50, with
the ratio to the runner-up and its 99% interval, or "no clear winner" (intervals that include no
difference, a noisy device, too few samples) with the more faithful artifact and the `edgeopt gate`
command that measures the two interleaved. Only rows measured on their own device (column "measured
on") and accepted by the gate's default accuracy rules against FP32 are shipped (docs/TOLERANCES.md,
"One accuracy policy").
"""


EXAMPLES = examples("""\
examples:
  edgeopt report                                     # the latest run of each artifact, as a table
  edgeopt report --output report.html                # a page with plots (format from the extension)
  edgeopt report --targets jetson,cpu --since 7d --format csv
  edgeopt report --run 20261122-154105-ab12 --json""")


@click.command("report", help=HELP, epilog=EXAMPLES, context_settings=CONTEXT,
               short_help="Compare measured runs (table, md, html, json, csv).")
@click.option("--db", envvar="EDGEOPT_DB", default=None, metavar="FILE", help="Results database [./edgeopt-results.db].")
@click.option("--format", "-f", "format_", type=click.Choice(["table", "md", "html", "json", "csv"]), default=None,
              help="Output format [table, or from --output's extension].")
@click.option("--output", "-o", metavar="FILE", help="Write to FILE instead of stdout (written atomically).")
@deprecated("--out", "--output", "out_old", metavar="FILE")
@click.option("--title", default="edgeopt report", help="Title of md/html reports.")
@click.option("--model", help="Only this model (comma-separated for several).")
@click.option("--targets", "--target", "target", metavar="LIST",
              help="Only these targets (aliases resolve: jetson = jetson-orin).")
@click.option("--device", help="Only these devices.")
@click.option("--precision", help="Only these precisions.")
@click.option("--since", help="Only runs since a date/time (2025-01-31, 2025-01-31T12:00) or a span ago (12h, 7d).")
@click.option("--run", "run_id", help="Only the runs of one `edgeopt bench` invocation (its run id).")
@click.option("--identity", help="Only runs on machines of this identity (fingerprint or its prefix).")
@click.option("--label", help="Only devices with one of these labels.")
@click.option("--rig", help="Only runs written by these rigs (EDGEOPT_RIG or the host name).")
@click.option("--all", "all_", is_flag=True, help="Every run, not only the latest of each.")
@click.option("--json", "json_", is_flag=True, help="Same as --format json.")
@verbosity
def command(**kw) -> int:
    return run(ns(**kw))


def guess_format(fmt: str | None, out: str | None, json_flag: bool = False) -> str:
    if json_flag:
        return "json"
    if fmt:
        return fmt
    ext = (out or "").rsplit(".", 1)[-1].lower() if out and "." in out else ""
    return {"html": "html", "htm": "html", "md": "md", "markdown": "md", "json": "json", "csv": "csv"}.get(ext, "table")


def write_report(records: list, fmt: str, out: str | None, title: str, filters: dict) -> None:
    """Render and write atomically (a temp file renamed), or print."""
    import os
    import sys
    import tempfile
    from pathlib import Path

    from edgeopt.errors import UsageError
    from edgeopt.reporting import render

    text = render(records, fmt, title=title, filters=filters)
    if not out:
        sys.stdout.write(text)
        return
    path = Path(out)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private; a report is an ordinary file
        os.replace(tmp, path)
    except OSError as exc:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)
        raise UsageError(f"cannot write the report to {out!r}: {exc.strerror or exc}") from None
    print(f"report written to {path}", file=sys.stderr)


def check_writable(out: str, flag: str = "--report", what: str = "the report") -> None:
    """Refuse an unwritable output file before any work (run builds and benches first): ``flag`` names the option
    in the message (``--out``, ``--html`` ...), ``what`` the file (``the report``, ``the page``)."""
    import os
    from pathlib import Path

    from edgeopt.errors import UsageError

    path = Path(out)
    parent = path.parent if str(path.parent) else Path(".")
    probe = parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"cannot write {what} to {out!r} ({flag}): {str(probe)!r} is not a folder")
    if path.is_dir():
        example = {"--report": "report.html", "--html": "debug.html"}.get(flag, "out" + (path.suffix or ".json"))
        raise UsageError(f"{flag} {out!r} is a folder", hint=f"give a file name, e.g. {example}")
    if not os.access(probe, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"cannot write {what} to {out!r} ({flag}): permission denied")
    # the access bits can say yes where a write fails (root, /proc, a read-only mount): make and remove a
    # file where the report will go (write_report makes the missing folders, then writes beside the target)
    import tempfile

    try:
        fd, tmp = tempfile.mkstemp(dir=probe, prefix=".edgeopt-write-check.")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise UsageError(f"cannot write {what} to {out!r} ({flag}): {exc.strerror or exc}") from None


def check_writable_dir(out: str, flag: str) -> None:
    """Refuse an output FOLDER (``debug --reduce DIR``) that cannot be made or written, before any work: a file
    of that name, a file on the way, no permission."""
    import os
    import tempfile
    from pathlib import Path

    from edgeopt.errors import UsageError

    path = Path(out)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {out!r} is a file", hint="give a folder (made when missing)")
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"cannot write {flag} {out!r}: {str(probe)!r} is not a folder")
    try:
        fd, tmp = tempfile.mkstemp(dir=probe, prefix=".edgeopt-write-check.")
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        raise UsageError(f"cannot write {flag} {out!r}: {exc.strerror or exc}") from None


def run(args) -> int:
    from edgeopt import api
    from edgeopt.errors import UsageError

    if args.json and args.format_ not in (None, "json"):
        raise UsageError(f"--json and --format {args.format_} ask for two formats",
                         hint="drop one: --json is --format json")
    out = args.output if args.output is not None else args.out_old
    if out:
        check_writable(out, "--output")
    filters = {"model": args.model, "targets": args.target, "device": args.device, "precision": args.precision,
               "since": args.since, "run_id": args.run_id, "identity": args.identity, "label": args.label,
               "rig": args.rig}
    records = api.query(args.db, **{k: v for k, v in filters.items() if k != "run_id"}, run=args.run_id, all=args.all_)
    shown = {**{k: v for k, v in filters.items() if k != "targets"}, "target": api.resolve_target_filter(args.target)}
    write_report(records, guess_format(args.format_, out, args.json), out, args.title, shown)
    return 0
