"""``edgeopt report``: compare runs from the results database (targets x devices x precisions)."""

from __future__ import annotations

import argparse

HELP = """\
One comparison of the runs in the results database: latency percentiles, throughput, load time,
memory and accuracy against the FP32 reference, per model, target, precision and device. By
default the latest run of each; --all for every run. Formats: table (default), md, html (a
self-contained page with plots: latency distribution per artifact, latency vs accuracy), json, csv.
"""


def add_report_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="only this model (comma-separated for several)")
    p.add_argument("--target", help="only these targets")
    p.add_argument("--device", help="only these devices")
    p.add_argument("--precision", help="only these precisions")
    p.add_argument("--since", help="only runs since a date/time (2025-01-31, 2025-01-31T12:00) or a span ago (12h, 7d)")
    p.add_argument("--run", dest="run_id", help="only the runs of one `edgeopt bench` invocation (its run id)")
    p.add_argument("--all", action="store_true", help="every run, not only the latest of each")


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="compare measured runs (table, md, html, json, csv)", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default=None, metavar="FILE", help="results database [./edgeopt-results.db]")
    p.add_argument("--format", "-f", choices=["table", "md", "html", "json", "csv"], default=None,
                   help="output format [table, or from --out's extension]")
    p.add_argument("--out", "-o", metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--title", default="edgeopt report", help="title of md/html reports")
    add_report_filters(p)
    p.add_argument("--json", action="store_true", help="same as --format json")
    p.set_defaults(func=run)


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
    from edgeopt.report import render

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


def run(args: argparse.Namespace) -> int:
    from edgeopt.results import DEFAULT_DB, ResultsDB

    filters = {k: getattr(args, k) for k in ("model", "target", "device", "precision", "since", "run_id")}
    with ResultsDB(args.db or DEFAULT_DB, create=False) as db:
        records = db.query(**filters, latest=not args.all)
    write_report(records, guess_format(args.format, args.out, args.json), args.out, args.title, filters)
    return 0
