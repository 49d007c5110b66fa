"""``edgeopt export triton BUNDLE --repository DIR``: serve a TensorRT bundle with Triton Inference Server;
``edgeopt export mlflow --tracking-uri URL``: the results database's records as MLflow runs."""

from __future__ import annotations

import click

from . import emit_json
from ._common import CONTEXT, deprecated, examples, json_option, ns, verbosity

HELP = """Export a bundle for a serving system (Triton), or the measured runs to MLflow.

Write a Triton model repository entry for a TensorRT bundle of a datacenter target (a100, h100,
l4, nvidia): DIR/<name>/config.pbtxt (platform tensorrt_plan, inputs and outputs, max batch size,
dynamic batching with the queue delay you set, instance groups) and DIR/<name>/1/ for the engine.
The engine is built on the serving GPU with the Triton container's TensorRT version: pass it with
--engine-file, or run the printed `edgeopt_agent compile` command there. Dynamic batching needs a bundle
built with a batch profile, e.g. --option trt_profile=x:1x3x224x224/8x3x224x224/32x3x224x224.

`export mlflow --tracking-uri URL` logs each record of the results database (--db, filtered like
`report --all`) as an MLflow run through the server's REST API (no mlflow package needed): params
(model, target, precision, backend, device, identity, bundle id), metrics (p50..p99.9, throughput,
load, first inference, peak memory, accuracy, energy, and each latency sample at its step), tags
(device truth, run id, verdict). Experiment: --experiment, else edgeopt-<model>. Records already
exported are skipped; a refusal is one line (exit 4). Credentials: MLFLOW_TRACKING_TOKEN, or
MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD.
"""


@click.command("export", help=HELP, context_settings=CONTEXT,
               short_help="Export a bundle for Triton, or measured runs to MLflow.", epilog=examples("""\
examples:
  edgeopt export triton dist/resnet/h100-fp16 --repository model_repository
  edgeopt export mlflow --tracking-uri http://mlflow.lab:5000 --experiment edge-latency
  edgeopt export mlflow --tracking-uri http://mlflow.lab:5000 --db postgresql://rig@db.lab/edgeopt --since 7d
  edgeopt export triton dist/resnet/h100-fp16 --repository repo --name resnet --max-batch 32 --preferred-batch 8,16"""))
@click.argument("format", type=click.Choice(["triton", "mlflow"]))
@click.argument("bundle", type=click.Path(), required=False)
@click.option("--repository", metavar="DIR", help="triton: the model repository folder (made when missing).")
@deprecated("--out", "--repository", "out_old", "-o", metavar="DIR")
@click.option("--tracking-uri", metavar="URL", envvar="MLFLOW_TRACKING_URI",
              help="mlflow: the tracking server [$MLFLOW_TRACKING_URI].")
@click.option("--experiment", metavar="NAME", help="mlflow: the experiment [edgeopt-<model>].")
@click.option("--db", envvar="EDGEOPT_DB", default=None, metavar="FILE|URL",
              help="mlflow: the results database [$EDGEOPT_DB, else ./edgeopt-results.db].")
@click.option("--model", help="mlflow: only this model.")
@click.option("--device", "device_", help="mlflow: only these devices.")
@click.option("--since", help="mlflow: only runs since a date/time or a span ago (12h, 7d).")
@click.option("--run", "run_id", help="mlflow: only the records of one run id.")
@click.option("--name", help="Model name in the repository [the model's name].")
@click.option("--max-batch", type=click.IntRange(min=0), help="max_batch_size [the profile's largest batch, 0 without one].")
@click.option("--queue-delay-us", type=click.IntRange(min=0), default=100,
              help="Dynamic batching: longest wait for more requests, microseconds.")
@click.option("--preferred-batch", metavar="LIST", help="Dynamic batching: preferred batch sizes, e.g. 4,8.")
@click.option("--no-dynamic-batching", is_flag=True, help="Leave dynamic batching off.")
@click.option("--instances", type=click.IntRange(min=1), default=1, help="Model instances per GPU.")
@click.option("--gpus", metavar="LIST", help="GPU indices for the instances, e.g. 0,1 [all].")
@click.option("--engine-file", type=click.Path(), help="An engine built for the serving GPU, copied to "
              "<name>/<version>/model.plan.")
@deprecated("--engine", "--engine-file", "engine_alias", type=click.Path())
@click.option("--version", type=click.IntRange(min=1), default=1, help="Model version folder.")
@click.option("--force", is_flag=True, help="Replace an existing <name> in the repository.")
@json_option
@verbosity
def command(**kw) -> int:
    return run(ns(**kw))


def run(args) -> int:
    import sys

    from edgeopt.api import export

    quiet = getattr(args, "quiet", False)
    repository = args.repository if args.repository is not None else args.out_old
    res = export(args.format, args.bundle, repository=repository, tracking_uri=args.tracking_uri,
                 experiment=args.experiment, db=args.db, model=args.model, device=args.device_, since=args.since, run=args.run_id, name=args.name,
                 max_batch=args.max_batch, queue_delay_us=args.queue_delay_us, preferred_batch=args.preferred_batch,
                 no_dynamic_batching=args.no_dynamic_batching, instances=args.instances, gpus=args.gpus,
                 engine_file=args.engine_file or args.engine_alias, version=args.version, force=args.force,
                 progress=None if quiet or args.json or args.format != "mlflow"
                 else (lambda m: print(m, file=sys.stderr)))
    if args.format == "mlflow":
        if args.json:
            emit_json(res.to_dict(), "export-mlflow")
        else:
            exps = ", ".join(f"{n} (id {i})" for n, i in res.experiments.items())
            print(f"{res.exported} record(s) exported to {res.tracking_uri} as runs, {res.skipped} already there; "
                  f"experiment {exps}; {res.batches} log-batch call(s)")
        return 0
    if args.json:
        emit_json(res.to_dict(), "export")
        return 0
    print(f"wrote {res.model_dir}/config.pbtxt:\n")
    print(res.config_text)
    if res.engine_copied:
        print(f"engine copied to {res.model_dir}/{args.version}/model.plan")
    for step in res.next_steps:
        print(f"next: {step}")
    return 0
