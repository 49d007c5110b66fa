"""``edgeopt export triton BUNDLE --out DIR``: serve a TensorRT bundle with Triton Inference Server."""

from __future__ import annotations

import click

from . import emit_json
from ._common import CONTEXT, examples, json_option, ns, verbosity

HELP = """Export a bundle for a serving system (Triton).

Write a Triton model repository entry for a TensorRT bundle of a datacenter target (a100, h100,
l4, nvidia): DIR/<name>/config.pbtxt (platform tensorrt_plan, inputs and outputs, max batch size,
dynamic batching with the queue delay you set, instance groups) and DIR/<name>/1/ for the engine.
The engine is built on the serving GPU with the Triton container's TensorRT version: pass it with
--engine, or run the printed `edgeopt_agent compile` command there. Dynamic batching needs a bundle
built with a batch profile, e.g. --option trt_profile=x:1x3x224x224/8x3x224x224/32x3x224x224.
"""


def _ints(text: str | None, what: str) -> tuple[int, ...]:
    from edgeopt.errors import UsageError

    if not text:
        return ()
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UsageError(f"{what} takes comma-separated integers, got {text!r}") from None


@click.command("export", help=HELP, context_settings=CONTEXT,
               short_help="Export a bundle for a serving system (Triton).", epilog=examples("""\
examples:
  edgeopt export triton dist/resnet/h100-fp16 --out model_repository
  edgeopt export triton dist/resnet/h100-fp16 --out repo --name resnet --max-batch 32 --preferred-batch 8,16"""))
@click.argument("format", type=click.Choice(["triton"]))
@click.argument("bundle", type=click.Path())
@click.option("--out", "-o", required=True, metavar="DIR", help="The model repository folder.")
@click.option("--name", help="Model name in the repository [the model's name].")
@click.option("--max-batch", type=click.IntRange(min=0), help="max_batch_size [the profile's largest batch, 0 without one].")
@click.option("--queue-delay-us", type=click.IntRange(min=0), default=100,
              help="Dynamic batching: longest wait for more requests, microseconds.")
@click.option("--preferred-batch", metavar="LIST", help="Dynamic batching: preferred batch sizes, e.g. 4,8.")
@click.option("--no-dynamic-batching", is_flag=True, help="Leave dynamic batching off.")
@click.option("--instances", type=click.IntRange(min=1), default=1, help="Model instances per GPU.")
@click.option("--gpus", metavar="LIST", help="GPU indices for the instances, e.g. 0,1 [all].")
@click.option("--engine", type=click.Path(), help="An engine built for the serving GPU, copied to <name>/<version>/model.plan.")
@click.option("--version", type=click.IntRange(min=1), default=1, help="Model version folder.")
@click.option("--force", is_flag=True, help="Replace an existing <name> in the repository.")
@json_option
@verbosity
def command(**kw) -> int:
    return run(ns(**kw))


def run(args) -> int:
    from edgeopt.triton import TritonOptions, export_triton

    opts = TritonOptions(name=args.name, max_batch=args.max_batch, dynamic_batching=not args.no_dynamic_batching,
                         queue_delay_us=args.queue_delay_us,
                         preferred_batch=_ints(args.preferred_batch, "--preferred-batch"),
                         instances=args.instances, gpus=_ints(args.gpus, "--gpus"), engine=args.engine,
                         version=args.version, force=args.force)
    res = export_triton(args.bundle, args.out, opts)
    if args.json:
        emit_json({"model_dir": str(res.model_dir), "config": res.config, "engine_copied": res.engine_copied,
                   "next_steps": res.next_steps}, "export")
        return 0
    print(f"wrote {res.model_dir}/config.pbtxt:\n")
    print(res.config_text)
    if res.engine_copied:
        print(f"engine copied to {res.model_dir}/{args.version}/model.plan")
    for step in res.next_steps:
        print(f"next: {step}")
    return 0
