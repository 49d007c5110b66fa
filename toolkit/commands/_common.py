"""Shared click pieces: verbosity options accepted on every command, the option groups that several
commands share (devices, bench, build), examples epilogs, and the args namespace the command bodies use.

Nothing heavy is imported here: ``edgeopt --help`` must stay fast on a bare install.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import click

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110, "show_default": True}


def examples(text: str) -> str:
    """An epilog click prints as written (``\\b`` stops re-wrapping)."""
    blocks = [b for b in text.strip("\n").split("\n\n")]
    return "\n\n".join("\b\n" + b for b in blocks)


def set_verbose(enabled: bool) -> None:
    root = logging.getLogger()
    if enabled:
        root.setLevel(logging.DEBUG)
        logging.getLogger("paramiko").setLevel(logging.DEBUG)


def _verbose_cb(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        set_verbose(True)
    return value


def verbosity(f: Callable) -> Callable:
    """-v/--verbose and -q/--quiet on a command (also accepted before the command name)."""
    f = click.option("-q", "--quiet", is_flag=True, help="No progress lines on stderr.")(f)
    return click.option("-v", "--verbose", is_flag=True, expose_value=True, callback=_verbose_cb,
                        help="Debug logging (paramiko, converters).")(f)


def quiet(ctx: click.Context | None, local: bool) -> bool:
    """-q given on the command or before it."""
    root = ctx.find_root() if ctx else None
    return bool(local or (root is not None and (root.obj or {}).get("quiet")))


def json_option(f: Callable) -> Callable:
    return click.option("--json", "json_", is_flag=True,
                        help="Print the result as JSON on stdout (an object with a `schema` key).")(f)


def ns(**kw: Any) -> SimpleNamespace:
    """The parsed options as an attribute namespace (the command bodies read ``args.x``)."""
    ctx = click.get_current_context(silent=True)
    kw["quiet"] = quiet(ctx, kw.get("quiet", False))
    if "json_" in kw:
        kw["json"] = kw.pop("json_")
    if "engine_old" in kw:  # bench's --engine, the old name of --load-generator
        old = kw.pop("engine_old")
        kw["engine"] = kw.get("engine") if kw.get("engine") is not None else old
    if "target_alias" in kw:  # --target, the hidden spelling of --targets
        alias, dest = kw.pop("target_alias"), "targets" if "targets" in kw else "target"
        if alias:
            kw[dest] = ",".join(x for x in (kw.get(dest), alias) if x)
    return SimpleNamespace(**kw)


def deprecated(old: str, new: str, dest: str, *also: str, **kw: Any) -> Callable:
    """A hidden old spelling of ``new`` (one name per concept): still taken for one release, with one line on
    stderr naming the new one. ``also``: more old spellings of it (a short form: export's ``-o``). The command
    reads ``dest`` and prefers the new flag's value."""
    shown = "/".join((old, *also))

    def said(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value not in (None, (), False):
            click.echo(f"edgeopt: note: {shown} is now {new} (one name per concept); {shown} goes in a later "
                       "release", err=True)
        return value
    return click.option(old, *also, dest, hidden=True, default=None, callback=said, expose_value=True, **kw)


def targets_option(help_text: str = "Only bundles of these targets (comma-separated; aliases work: jetson = "
                                    "jetson-orin).", dest: str = "targets", short: bool = True) -> Callable:
    """``--targets LIST`` (``-t``), the one name of the target filter, with ``--target`` as a hidden spelling
    (``ns`` joins the two)."""
    def deco(f: Callable) -> Callable:
        f = click.option("--target", "target_alias", metavar="LIST", hidden=True, default=None)(f)
        names = ["--targets", "-t"] if short else ["--targets"]
        return click.option(*names, dest, metavar="LIST", default=None, help=help_text)(f)
    return deco


def _positive_float(ctx, param, value):
    if value is not None and not value > 0:
        raise click.BadParameter(f"must be above 0, got {value:g}")
    return value


positive = _positive_float


def config_option(f: Callable) -> Callable:
    return click.option("--config", type=click.Path(), default=None, show_default=False,
                        help="Config file with user-defined targets [./edgeopt.yaml when present].")(f)


def device_options(f: Callable) -> Callable:
    """--devices / --limit (alias --only) / --label / --trust-new-host-keys / --parallel."""
    opts = [
        click.option("--devices", "-d", default="local", metavar="FILE",
                     help="Inventory: a devices YAML or an Ansible inventory (INI/YAML); `local` is this host."),
        click.option("--limit", "--only", "only", multiple=True, metavar="NAMES",
                     help="Only these devices (comma-separated, repeatable; Ansible's --limit)."),
        click.option("--label", multiple=True, metavar="LABEL",
                     help="Only devices with one of these labels (Ansible groups become labels)."),
        click.option("--trust-new-host-keys", is_flag=True,
                     help="Accept and record the host key of a device not yet in known_hosts (trust on first "
                          "use); a CHANGED key is always refused."),
        click.option("--parallel", type=click.IntRange(min=1), default=4, metavar="N",
                     help="Devices worked on at once, each over its own SSH session (4: a lab's devices share the "
                          "build host's uplink for pushes; rollout, whose devices mostly wait on gates, takes more)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def warmup_value(text: str) -> tuple[int | None, float | None]:
    """``--warmup 10`` (iterations) or ``--warmup 2s`` / ``500ms`` (time, as trtexec/benchmark_app)."""
    t = str(text).strip().lower()
    try:
        if t.endswith("ms"):
            v = float(t[:-2]) / 1000
        elif t.endswith("s"):
            v = float(t[:-1])
        else:
            n = int(t)
            if n < 0:
                raise ValueError
            return n, None
    except ValueError:
        raise click.BadParameter(f"expected iterations (10) or a time (2s, 500ms), got {text!r}") from None
    if v < 0:
        raise click.BadParameter(f"must not be negative, got {text!r}")
    return None, v


def bench_options(f: Callable) -> Callable:
    """The measuring options sent to the agent, plus --db and --verify."""
    opts = [
        click.option("--duration", type=float, default=3.0, metavar="S", callback=positive,
                     help="Seconds of timed runs per bundle."),
        click.option("--min-iters", type=click.IntRange(min=1), default=50, help="Timed iterations at least."),
        click.option("--warmup", default="10", metavar="N|TIME",
                     help="Untimed runs first: iterations (10) or a time (2s, 500ms)."),
        click.option("--threads", type=click.IntRange(min=1), default=None, show_default=False,
                     help="Runtime threads [the runtime's choice]."),
        click.option("--batch", default="1", metavar="N|LIST",
                     help="Batch size; a list (1,4,8) benches each size on the bundles that take it (built with "
                          "`build --batch`, or a dynamic batch) and gives the latency/throughput curve."),
        click.option("--bench-timeout", type=float, default=300, metavar="S", callback=positive,
                     help="Seconds before a hung runtime is killed on the device."),
        click.option("--limit-memory", type=float, metavar="MB", callback=positive,
                     help="Address-space limit of the runtime process on the device (a runtime over it fails)."),
        click.option("--limit-cpu", type=float, metavar="S", callback=positive,
                     help="CPU-seconds limit of the runtime process."),
        click.option("--no-samples", is_flag=True, help="Don't keep per-iteration latencies (no distribution plot)."),
        click.option("--verify", is_flag=True,
                     help="Re-verify bundles already on the device (sha256 of every file); repair corrupted ones."),
        click.option("--db", envvar="EDGEOPT_DB", default=None, metavar="FILE", help="Results database [./edgeopt-results.db]."),
        click.option("--scenario", type=click.Choice(["single-stream", "multi-stream", "server", "offline",
                                                      "concurrency"]),
                     help="Also run this load scenario (before the timed loop): MLPerf's (LoadGen on the device), or "
                          "concurrency: a closed loop of --concurrency clients (the agent's own; queueing hidden)."),
        click.option("--workers", type=click.IntRange(1, 256), default=None, metavar="N",
                     help="Threads serving queries at once in the scenario, each with its own infer request or "
                          "model instance (the shared session on ONNX Runtime) [1; concurrency: one per client]."),
        click.option("--concurrency", type=click.IntRange(1, 256), default=None, metavar="C",
                     help="concurrency scenario: clients, each sending its next query when the last is answered."),
        click.option("--target-qps", type=float, metavar="QPS", help="server: arrival rate; offline: expected rate."),
        click.option("--latency-bound", metavar="pNN=MS", help="E.g. p99=20ms: the bound LoadGen judges VALID by."),
        click.option("--samples-per-query", type=int, metavar="N", help="multi-stream: samples per query."),
        click.option("--max-queue-delay", "max_queue_delay_ms", type=float, metavar="MS",
                     help="server: dynamic batching — a worker waits up to MS ms for more queries and runs up to "
                          "--batch of them at once (each query's latency still counts from its arrival)."),
        click.option("--lengths", default=None, metavar="LIST",
                     help="Variable-length bundles (--shape with a range/buckets): bench the validation samples cut or "
                          "zero-padded to these sizes on the variable axis (16,64,128) [each sample at its own "
                          "length, in a seeded order]. A size outside the built bounds is refused (exit 2)."),
        click.option("--profile", type=click.IntRange(min=0), default=0, metavar="N",
                     help="After the timed loop: where one request's time goes (preprocess, copies, compute, "
                          "postprocess) and the runtime's own per-op profile over N runs (ONNX Runtime, "
                          "OpenVINO, TensorRT) [0: off]."),
        click.option("--load-generator", "engine", type=click.Choice(["loadgen", "edgeopt"]),
                     help="Who sends the scenario's queries: loadgen (MLPerf LoadGen; needed for multi-stream/offline) "
                          "or edgeopt (the agent's own loops) [loadgen if installed on the device]."),
        deprecated("--engine", "--load-generator", "engine_old", type=click.Choice(["loadgen", "edgeopt"])),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def out_flag() -> str:
    """How the command line spelled the bundle folder option (``--out``/``-o`` or ``--dist``), to name it."""
    import sys

    said = [a.split("=")[0] for a in sys.argv[1:]]
    return "--out" if "--out" in said or "-o" in said else "--dist"


def kind_options() -> list[Callable]:
    """``--output-kind`` and ``--decision``: what outputs mean, for every command that builds a model."""
    return [
        click.option("--output-kind", "output_kind", multiple=True, metavar="NAME=KIND",
                     help="What an output means, over the kind inferred from its shape and values (repeatable): "
                          "landmarks=regression:px=2 (coordinates judged in pixels), logit=decision@0, "
                          "probs=probability@0.2/0.8, scores=detection@anchors:boxes=regressors:anchors=8x2+16x6 "
                          "(an anchor head decoded, thresholded and NMS'd before it is judged); the kinds are in "
                          "docs/TOLERANCES.md."),
        click.option("--decision", "decision", multiple=True, metavar="NAME=T[,T]",
                     help="The application's thresholds on an output (repeatable): score=0.2,0.8 judges the samples "
                          "whose score changes band and how far a probability moves; thresholds outside 0..1 are "
                          "decisions on a logit (logit=0)."),
    ]


def kind_flags(f: Callable) -> Callable:
    """``kind_options`` as a decorator (debug, tune)."""
    for o in reversed(kind_options()):
        f = o(f)
    return f


def kind_kw(output_kind: Any, decision: Any) -> dict[str, Any]:
    """The parsed flags as ``edgeopt.build``'s keywords (none when neither was given)."""
    return {k: list(v) for k, v in (("output_kind", output_kind), ("decision", decision)) if v}


def build_options(f: Callable) -> Callable:
    """What `build` and `run` share."""
    jobs = min(2, os.cpu_count() or 1)
    opts = [
        click.argument("model", type=click.Path(dir_okay=False)),
        click.option("--targets", "-t", required=True, metavar="LIST",
                     help="Comma-separated targets, e.g. cpu,intel-cpu,jetson,h100 (see `edgeopt targets`)."),
        click.option("--precision", "-p", multiple=True, default=["auto"], metavar="LIST",
                     help="fp32,fp16,int8,fp8 or auto (each target's default; refused on accuracy, the next wider "
                          "precision is built and the refusal shown); each target builds what it "
                          "offers of the list (the rest is listed as skipped). Per target: "
                          "cpu=fp32,int8,intel-cpu=int8 (or --precision repeated)."),
        click.option("--shape", "--shapes", "shape", multiple=True, metavar="NAME:DIMS",
                     help="Concrete shape of inputs with dynamic dims: x:1x3x640x640, Polygraphy's "
                          "x:[1,3,640,640] or trtexec's x:1x3x640x640,y:1x2 (repeatable); a dim kept variable "
                          "as a range (input_ids:1x1..128) or buckets (input_ids:1x16|32|64|128)."),
        click.option("--calib", metavar="PATH",
                     help="Calibration/validation data: a folder of images, a .npy or .npz (keys = input "
                          "names); without it random data is used, with a loud warning and a mark on every "
                          "result."),
        click.option("--preprocess", metavar="SPEC",
                     help="How images become tensors, e.g. 'preset=imagenet resize=256 crop=1 order=rgb "
                          "layout=nchw' (presets: imagenet, unit, pm1, raw) [from the input's range: pm1 "
                          "for 3-channel NCHW float inputs]."),
        click.option("--calib-count", type=click.IntRange(min=1), default=32, help="Calibration samples at most."),
        click.option("--val-count", type=click.IntRange(min=1), default=None,
                     help="Validation samples held out [8; up to 32 when --calib has more samples than "
                          "calibration takes, and at least 20 when it has 40 or more (calibration then takes "
                          "fewer): below 20 the accuracy policy refuses on a single differing decision]."),
        click.option("--split", default=None, metavar="HOW",
                     help="How --calib data is split into calibration and validation: shuffle (seeded, "
                          "shuffle:SEED for another seed), stride (evenly spaced) or head-tail (first N "
                          "calibrate, last M validate) [shuffle: data ordered by class still calibrates and "
                          "validates on every class]. The indices are in the manifest; fewer than 20 "
                          "validation samples get a warning."),
        *kind_options(),
        click.option("--dist", "--out", "-o", "out", default="dist", metavar="DIR",
                     help="Bundle folder: DIST/<model>/<target>-<precision>/."),
        click.option("--jobs", "-j", type=click.IntRange(min=1), default=jobs,
                     help="Targets built at once, each in its own process."),
        click.option("--build-timeout", "--timeout", "timeout", type=float, default=1800, metavar="S",
                     callback=positive, help="Seconds before a hung converter is killed."),
        click.option("--force", is_flag=True,
                     help="Rebuild even when the cache has the bundle, or has this build's failed check."),
        click.option("--allow-mismatch", is_flag=True,
                     help="Keep bundles whose host check fails (marked failed in the manifest)."),
        click.option("--accept", metavar="GATE.yaml", default=None,
                     help="The accuracy policy's thresholds (the keys of a gate file: decisions.max_disagreement, "
                          "accuracy.top1_min ...). Default: the gate's defaults -- the artifact's own bound, and at "
                          "most 5% of decisions differing from FP32 on distinct validation samples. Every host "
                          "check, INT8 search and auto fallback judges by it (docs/TOLERANCES.md)."),
        click.option("--option", multiple=True, metavar="KEY=VALUE",
                     help="Backend option (repeatable). Common: int8_tolerance=cosine_min=0.95,top1_min=0.98 "
                          "(any INT8), int8_search=quick|full and int8_budget_s=N (cpu, intel-*), "
                          "int8_mode=auto|full|dynamic and io_dtype=float32|int8 (mobile), "
                          "min_deployment_target=iOS17 and compute_units=ALL (apple), if_as_where=true (any: an If "
                          "as both branches and a Where, as mobile and apple always do, and INT8 does by itself "
                          "when no calibration sample takes a branch; false: never). Keys no target reads "
                          "are refused before anything is built."),
        config_option,
    ]
    for o in reversed(opts):
        f = o(f)
    return f
