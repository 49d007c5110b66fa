"""``edgeopt debug MODEL --target T`` / ``edgeopt debug BUNDLE``: where the artifact departs from ONNX FP32."""

from __future__ import annotations

import click

from ._common import CONTEXT, config_option, examples, json_option, kind_flags, kind_kw, ns, verbosity

HELP = """Compare a target's artifact with the ONNX FP32 reference layer by layer.

SOURCE is a bundle folder (its source model found next to it, or --model) or an ONNX model, built
first for --target (into --dist, or a temporary folder; kept even when its check fails). Both run on
the bundle's validation inputs; intermediate tensors are read from each runtime (ONNX Runtime: graph
outputs with the bundle's session options; OpenVINO: add_outputs on the IR's ports, plus the precision
each layer really ran in; LiteRT: preserved tensors), mapped to the ONNX tensor they compute and
compared with the host check's metrics. Every ONNX node is listed in topological order and the FIRST
node whose error passes the precision's bound is named: errors accumulate, the first jump is the cause.
Tensors are read in windows that fit --max-memory, never all at once.

The bundle is also judged by the accuracy policy, as its host check is (the agent's check over the whole
validation set, with the gate file it was built under). When the policy refuses because decisions
flipped while the tensors stay within their bounds, debug names the validation samples whose decision
flipped and, for each, the first node where its error jumps: the layers compared on those samples
beside samples that kept their decision.
"""

EXAMPLES = examples("""\
examples:
  edgeopt debug dist/model/cpu-int8
  edgeopt debug dist/model/intel-cpu-int8 --model model.onnx --html debug.html
  edgeopt debug model.onnx --target mobile --precision fp16 --shape x:1x3x224x224 --reduce
  edgeopt debug model.onnx -t cpu -p int8 --calib images/ --json | jq .first_jump
  edgeopt debug model.onnx -t mobile -p int8 --scheduler tcp://buildhost:8786     # built on the workers

exit codes: 0 the policy accepts the artifact, 2 bad input (or no layer reader for that backend on this
host), 3 the build failed, 5 ran fine and the policy refuses the artifact (where it cannot be judged
here: a node passes the bound), 4 the --scheduler unreachable (nothing built).""")


@click.command("debug", help=HELP, epilog=EXAMPLES, context_settings=CONTEXT,
               short_help="Which layer departs from ONNX FP32 (first jump), per backend; --reduce.")
@click.argument("source", type=click.Path(exists=True))
@click.option("--target", "-t", default=None, help="Target to build MODEL for (one).")
@click.option("--precision", "-p", default="auto", help="Precision to build (fp32, fp16, int8, auto).")
@click.option("--model", "model", default=None, type=click.Path(dir_okay=False),
              help="The bundle's source ONNX (when it is not next to the bundle).")
@click.option("--shape", "--shapes", "shape", multiple=True, metavar="NAME:DIMS", help="As in build.")
@click.option("--calib", metavar="PATH", help="As in build: calibration/validation data.")
@click.option("--preprocess", metavar="SPEC", help="As in build.")
@click.option("--option", multiple=True, metavar="KEY=VALUE", help="Backend option, as in build (repeatable).")
@kind_flags
@click.option("--dist", "--out", "-o", "dist", default=None, metavar="DIR",
              help="Where MODEL's bundle is built (reused from the cache) [a temporary folder].")
@click.option("--force", is_flag=True, help="Rebuild MODEL's bundle even when cached.")
@click.option("--samples", type=click.IntRange(min=1), default=4, help="Validation samples compared.")
@click.option("--max-memory", default="1G", metavar="SIZE",
              help="Bytes of intermediate tensors held at once (both sides, all samples): 512M, 2G.")
@click.option("--all", "all_nodes", is_flag=True, help="List fused/unobserved nodes in the table too.")
@click.option("--reduce", "reduce_dir", is_flag=False, flag_value="reduced", default=None, metavar="[DIR]",
              help="Cut the smallest subgraph that still fails on this backend: DIR/reduced.onnx + "
                   "reduced_inputs.npz [./reduced].")
@click.option("--html", "html_path", default=None, metavar="FILE", help="Write an HTML report with the error plot.")
@click.option("--scheduler", default=None, metavar="URL",
              help="Build MODEL's bundle (and --reduce's subgraph) on Dask workers, as `edgeopt build --scheduler` "
                   "(tcp://, tls://, auto, local) [$EDGEOPT_SCHEDULER, else here]; a BUNDLE alone never asks.")
@config_option
@json_option
@verbosity
def command(**kw) -> int:
    return run(ns(**kw))


def run(args) -> int:
    import sys
    from pathlib import Path

    from edgeopt import debug
    from edgeopt.errors import EXIT_GOAL_NOT_MET, UsageError
    from edgeopt.jsonsafe import dumps
    from edgeopt.ui import stderr_progress

    progress = stderr_progress(args.quiet)
    from .report import check_writable, check_writable_dir

    if args.html_path:  # the output paths before the (long) comparison, not after it
        check_writable(args.html_path, "--html", "the page")
    if args.reduce_dir:
        check_writable_dir(args.reduce_dir, "--reduce")
    if args.dist is not None:
        from edgeopt.api import check_bundle_folder

        check_bundle_folder(args.dist)
    budget = debug.parse_size(args.max_memory)
    src = Path(args.source)
    if src.is_dir() and args.target:
        raise UsageError("--target is for a MODEL; a bundle already has its target", hint=f"edgeopt debug {src}")
    if not src.is_dir() and not args.target:
        raise UsageError("debugging a MODEL needs --target", hint=f"edgeopt debug {src} --target cpu")
    from edgeopt import cluster

    # --scheduler: the builds (MODEL's bundle, --reduce's subgraph) on Dask workers; unreachable: exit 4 here
    with cluster.session_if(not src.is_dir() or bool(args.reduce_dir), args.scheduler, progress):
        if src.is_dir():
            result = debug.debug_bundle(src, args.model, samples=args.samples, max_memory=budget, progress=progress)
        else:
            _, result = debug.debug_model(str(src), args.target, args.precision, dist=args.dist,
                                          samples=args.samples, max_memory=budget, progress=progress,
                                          shapes=list(args.shape), calib=args.calib, preprocess=args.preprocess,
                                          options=list(args.option), config=args.config, force=args.force,
                                          **kind_kw(args.output_kind, args.decision))
        if args.reduce_dir and result.first_jump is not None:
            result.reduced = debug.reduce(result, args.reduce_dir, options=list(args.option), progress=progress)
    if args.html_path:
        debug.write_text(args.html_path, debug.html(result))
    if args.json:
        sys.stdout.write(dumps(debug.as_json(result), indent=2, default=str) + "\n")
    else:
        print(debug.table(result, args.all_nodes))
        if result.reduced:
            r = result.reduced
            print(f"reduced: {r['model']} ({r['nodes']} node(s): {', '.join(r['ops'][:12])}) + {r['inputs_npz']}; "
                  + ("fails alone: " if r["reproduced"] else "did NOT fail alone: ") + str(r["check"])[:200])
        if args.html_path:
            print(f"html: {args.html_path}")
    return EXIT_GOAL_NOT_MET if debug.refused(result) else 0
