"""``edgeopt export triton BUNDLE --out DIR``: serve a TensorRT bundle with Triton Inference Server."""

from __future__ import annotations

import argparse

from . import emit_json

HELP = """\
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


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="export a bundle for a serving system (Triton)", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("format", choices=["triton"], help="what to export to")
    p.add_argument("bundle", help="a TensorRT bundle folder (OUT/<model>/<target>-<precision>)")
    p.add_argument("--out", "-o", required=True, help="the model repository folder")
    p.add_argument("--name", help="model name in the repository [the model's name]")
    p.add_argument("--max-batch", type=int, help="max_batch_size [the profile's largest batch, 0 without one]")
    p.add_argument("--queue-delay-us", type=int, default=100,
                   help="dynamic batching: longest wait for more requests, microseconds [100]")
    p.add_argument("--preferred-batch", help="dynamic batching: preferred batch sizes, e.g. 4,8")
    p.add_argument("--no-dynamic-batching", action="store_true", help="leave dynamic batching off")
    p.add_argument("--instances", type=int, default=1, help="model instances per GPU [1]")
    p.add_argument("--gpus", help="GPU indices for the instances, e.g. 0,1 [all]")
    p.add_argument("--engine", help="an engine built for the serving GPU, copied to <name>/<version>/model.plan")
    p.add_argument("--version", type=int, default=1, help="model version folder [1]")
    p.add_argument("--force", action="store_true", help="replace an existing <name> in the repository")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from edgeopt.triton import TritonOptions, export_triton

    opts = TritonOptions(name=args.name, max_batch=args.max_batch, dynamic_batching=not args.no_dynamic_batching,
                         queue_delay_us=args.queue_delay_us,
                         preferred_batch=_ints(args.preferred_batch, "--preferred-batch"),
                         instances=args.instances, gpus=_ints(args.gpus, "--gpus"), engine=args.engine,
                         version=args.version, force=args.force)
    res = export_triton(args.bundle, args.out, opts)
    if args.json:
        emit_json({"model_dir": str(res.model_dir), "config": res.config, "engine_copied": res.engine_copied,
                   "next_steps": res.next_steps})
        return 0
    print(f"wrote {res.model_dir}/config.pbtxt:\n")
    print(res.config_text)
    if res.engine_copied:
        print(f"engine copied to {res.model_dir}/{args.version}/model.plan")
    for step in res.next_steps:
        print(f"next: {step}")
    return 0
