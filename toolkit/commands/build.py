"""``edgeopt build MODEL --targets ...``: compile, check and bundle for every target."""

from __future__ import annotations

import argparse
import os

from . import emit_json

HELP = """\
Build one bundle per (target, precision) under OUT/<model>/<target>-<precision>/: the artifact,
manifest.json, validation inputs and the ONNX Runtime FP32 reference outputs. Every artifact the
host can run is checked against the reference with precision-aware tolerances (docs/TOLERANCES.md);
a failed check fails that target (exit 3) unless --allow-mismatch. Targets build in parallel worker
processes; a crash or hang in one converter is reported and the others go on. Same model + options
+ data + toolchain = cache hit, no rebuild; a build that ran and failed its check is remembered too
(reported at once as a cached result until --force).
"""


def add_build_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--targets", "-t", required=True,
                   help="comma-separated targets, e.g. cpu,intel-cpu,jetson,h100 (see `edgeopt targets`)")
    p.add_argument("--precision", "-p", default="auto",
                   help="comma-separated: fp32,fp16,int8,fp8 or auto (the target's default) [auto]")
    p.add_argument("--shape", action="append", metavar="NAME:DIMS",
                   help="concrete shape of an input with dynamic dims, e.g. x:1x3x640x640 (repeatable)")
    p.add_argument("--calib", metavar="PATH",
                   help="calibration/validation data: a folder of images, a .npy or .npz (keys = input names); "
                        "without it, random data is used with a loud warning")
    p.add_argument("--preprocess", metavar="SPEC",
                   help="how images become tensors, e.g. 'preset=imagenet resize=256 crop=1 order=rgb "
                        "layout=nchw' (presets: imagenet, unit, pm1, raw)")
    p.add_argument("--calib-count", type=int, default=32, help="calibration samples at most [32]")
    p.add_argument("--val-count", type=int, default=8, help="validation samples held out [8]")
    p.add_argument("--out", "-o", default="dist", help="output folder [dist]")
    p.add_argument("--jobs", "-j", type=int, default=min(2, os.cpu_count() or 1),
                   help="targets built at once, each in its own process [2]")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before a hung converter is killed [1800]")
    p.add_argument("--force", action="store_true",
                   help="rebuild even when the cache has the bundle, or has this build's failed check")
    p.add_argument("--allow-mismatch", action="store_true",
                   help="keep bundles whose host check fails (marked failed in the manifest)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE", default=[],
                   help="backend option (repeatable). Common: int8_tolerance=cosine_min=0.95,top1_min=0.98 "
                        "(any INT8), int8_search=quick|full and int8_budget_s=N (cpu, intel-*), "
                        "int8_mode=auto|full|dynamic and io_dtype=float32|int8 (mobile), "
                        "min_deployment_target=iOS17 and compute_units=ALL (apple). Every target reads its "
                        "own keys and ignores the rest; bad values, and keys no target reads, are refused "
                        "before anything is built")
    p.add_argument("--config", help="config file with user-defined targets (default ./edgeopt.yaml)")
    p.add_argument("--json", action="store_true", help="print the build report as JSON on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")


def add_parser(sub) -> None:
    p = sub.add_parser("build", help="compile and check the model for targets", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_build_args(p)
    p.set_defaults(func=run)


def parse_options(items: list[str]) -> dict:
    from edgeopt.errors import UsageError

    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise UsageError(f"bad --option {item!r}", hint="use KEY=VALUE")
        out[k.strip()] = _value(v.strip())
    return out


def _value(v: str):
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(v.lower(), v)


def build_from_args(args: argparse.Namespace):
    from edgeopt.model import parse_shapes
    from edgeopt.pipeline import build
    from edgeopt.ui import stderr_progress

    return build(args.model, args.targets, precisions=args.precision.split(","), shapes=parse_shapes(args.shape),
                 calib=args.calib, preprocess=args.preprocess, out=args.out, jobs=args.jobs, force=args.force,
                 allow_mismatch=args.allow_mismatch, config=args.config, options=parse_options(args.option),
                 timeout=args.timeout, n_calib=args.calib_count, n_val=args.val_count,
                 progress=stderr_progress(args.quiet))


def print_report(report) -> None:
    from edgeopt.ui import fmt_s, table

    rows = [{"target": r.target, "precision": r.precision, "backend": r.backend, "status": r.status,
             "time": fmt_s(r.time_s), "check": r.check or (r.error or "").splitlines()[0][:100],
             "bundle": r.bundle or ""} for r in report.results]
    print(table(rows, [("target", "target"), ("precision", "precision"), ("backend", "backend"),
                       ("status", "status"), ("time", "time"), ("check", "host check / error"),
                       ("bundle", "bundle")]))
    for r in report.results:
        if r.error and (r.status not in ("check-failed",)):
            print(f"\n{r.target} {r.precision}: {r.error}")
    notes = {n for r in report.results if r.manifest for n in r.manifest.get("notes", [])}
    for n in sorted(notes):
        print(f"note: {n}")
    for w in report.warnings:
        print(f"WARNING: {w}")
    cached = sum(r.status in ("cached", "up-to-date") for r in report.results)
    if cached:
        print(f"{cached} of {len(report.results)} bundle(s) taken from the cache (no rebuild)")
    print(f"done in {report.time_s:.2f}s: {sum(r.ok for r in report.results)} ok, "
          f"{sum(not r.ok for r in report.results)} failed")


def run(args: argparse.Namespace) -> int:
    from edgeopt.errors import EXIT_BUILD_FAILED

    report = build_from_args(args)
    if args.json:
        emit_json(report.as_dict())
    else:
        print_report(report)
    return 0 if report.ok else EXIT_BUILD_FAILED
