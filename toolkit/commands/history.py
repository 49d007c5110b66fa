"""``edgeopt history``: the series of a model's benched and gated runs, with change points flagged."""

from __future__ import annotations

import click

from ._common import CONTEXT, deprecated, examples, ns, targets_option, verbosity

HELP = """The series of MODEL's benched and gated runs, and where it changed.

Every run of MODEL in the results database that has the metric (`edgeopt bench`: its figure;
`edgeopt gate`: the candidate's), oldest first, one series per target x precision x device.

Change points: binary segmentation with a rank test. In each segment, every
split leaving at least --min-size runs on both sides is scored by the standardised
Mann-Whitney (Pettitt) statistic; the largest score's significance is a permutation
p-value of the maximum over all splits (999 shuffles, seeded), so scanning many splits
does not make noise look like a change. The change is placed at the split minimising
the absolute deviations from each side's median, and kept when p <= --alpha AND the
medians on its two sides differ by at least --min-shift; both sides are then searched
again. Ranks make it robust to single slow runs: it finds shifts in level, and
reports each at the first run after it, with the medians before and after.
Measured on 200 synthetic series of 40 runs each: a 10% step among 2% noise is found
every time, at its exact run 97.5% of the time (4% noise: 99.5%, 71.5% exact, 87.5%
within one run); flat series with 2-8% noise are flagged 0-1.5% of the time (about
--alpha). A step no larger than --min-shift is found about half the time.
"""

EXAMPLES = examples("""\
examples:
  edgeopt history ch_ppocr_mobile_v2.0_cls                   # p50 per target x device, changes flagged
  edgeopt history MODEL --targets jetson --device orin-1 --metric p99
  edgeopt history MODEL --format html --output history.html
  edgeopt history MODEL --min-shift 2% --min-size 8 --format csv""")

METRIC_NAMES = "p50, p90, p95, p99, p99_9, mean, min, max, throughput, load, cold_start, memory"


def _fraction(ctx, param, value):
    if value is None:
        return value
    t = str(value).strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise click.BadParameter(f"expected a fraction (0.05) or a percentage (5%), got {value!r}") from None
    if not 0 <= v < 10:
        raise click.BadParameter(f"must be between 0 and 1000%, got {value!r}")
    return v


@click.command("history", help=HELP, epilog=EXAMPLES, context_settings=CONTEXT,
               short_help="A model's runs over time, with change points flagged.")
@click.argument("model")
@targets_option("Only these targets (aliases resolve: jetson = jetson-orin).", dest="target", short=False)
@click.option("--device", help="Only these devices (comma-separated).")
@click.option("--precision", help="Only these precisions.")
@click.option("--metric", default="p50", metavar="NAME", help=f"The figure followed: {METRIC_NAMES}.")
@click.option("--since", help="Only runs since a date/time or a span ago (12h, 7d).")
@click.option("--until", help="Only runs before a date/time or a span ago.")
@click.option("--identity", help="Only machines of this identity (fingerprint or its prefix).")
@click.option("--label", help="Only devices with one of these labels.")
@click.option("--rig", help="Only runs written by these rigs (EDGEOPT_RIG or the host name).")
@click.option("--db", envvar="EDGEOPT_DB", default=None, metavar="FILE", help="Results database [./edgeopt-results.db].")
@click.option("--format", "-f", "format_", type=click.Choice(["table", "csv", "json", "html"]), default="table",
              help="Output format.")
@click.option("--output", "-o", metavar="FILE", help="Write to FILE instead of stdout.")
@deprecated("--out", "--output", "out_old", metavar="FILE")
@click.option("--min-size", type=click.IntRange(min=2), default=5, help="Runs on each side of a change point, at least.")
@click.option("--min-shift", default="5%", callback=_fraction, metavar="PCT",
              help="Smallest relative change of the median that counts.")
@click.option("--alpha", type=click.FloatRange(min=0, max=1, min_open=True, max_open=True), default=0.01,
              help="Significance level of each split's permutation test.")
@click.option("--json", "json_", is_flag=True, help="Same as --format json.")
@verbosity
def command(**kw) -> int:
    return run(ns(**kw))


def run(args) -> int:
    import sys

    from edgeopt.hil.history import check_metric, history, render

    from .report import check_writable

    check_metric(args.metric)
    out = args.output if args.output is not None else args.out_old
    if out:
        check_writable(out, "--output", "the history")
    series = history(args.model, db=args.db, target=args.target, device=args.device, precision=args.precision,
                     metric=args.metric, since=args.since, min_size=args.min_size, min_shift=args.min_shift,
                     alpha=args.alpha, identity=args.identity, label=args.label, rig=args.rig, until=args.until)
    text = render(series, "json" if args.json else args.format_)
    if out:
        from pathlib import Path

        Path(out).write_text(text, encoding="utf-8")
        print(f"history written to {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if not args.quiet:
        for s in series:
            for c in s.changes:
                print(f"{s.model} {s.target}-{s.precision} on {s.device}: {s.metric} changed "
                      f"{c.change * 100:+.1f}% at run {c.index} ({c.run_id}, {c.time})", file=sys.stderr)
    return 0
