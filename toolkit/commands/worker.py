"""``edgeopt worker --scheduler URL``: offer this machine's converters to a Dask scheduler (a thin wrapper over
``dask worker``, its resources from what can build here)."""

from __future__ import annotations

import os
import sys

import click

from ._common import CONTEXT, examples, verbosity

HELP = """Offer this machine's converters to the Dask scheduler at URL, for `edgeopt build --scheduler URL`.

Runs `dask worker URL` with one resource per backend that can build here (ONNX Runtime, OpenVINO,
TFLite/onnx2tf, Core ML; TensorRT: one engine slot per GPU, only where `tensorrt` imports and
`nvidia-smi` lists a GPU), each named <backend>@<hash of its converter versions>: a job goes only to
a worker whose bundle would get the host's cache key. Each backend gets --nthreads slots (jobs at
once). Arguments after `--` go to `dask worker` as they are (--preload, --memory-limit, ...).

A plain tcp:// scheduler has no authentication: anyone who reaches it runs code on every worker.
Use it only where the team trusts everyone on the network; else tls:// with EDGEOPT_TLS_CA,
EDGEOPT_TLS_CERT and EDGEOPT_TLS_KEY (PEM files) set on the workers and the hosts.
"""

EPILOG = examples("""\
examples:
  dask scheduler --host 10.0.0.5 --port 8786            # once, on any machine
  edgeopt worker --scheduler tcp://10.0.0.5:8786        # on each build machine
  edgeopt worker --scheduler tcp://10.0.0.5:8786 --only onnxruntime,openvino --nthreads 2
  edgeopt worker --scheduler tcp://10.0.0.5:8786 --resources tensorrt=1   # declare an engine slot
  edgeopt worker --scheduler tls://10.0.0.5:8786 --dry-run                 # print the dask command

exit codes: dask worker's own; 2 bad input (a scheduler address, an --only backend, a --resources
entry), dask not installed (pip install 'edgeopt[cluster]').""")


@click.command("worker", help=HELP, epilog=EPILOG, context_settings=CONTEXT,
               short_help="Offer this machine's converters to a Dask scheduler.")
@click.option("--scheduler", default=None, metavar="URL",
              help="The scheduler: tcp://HOST:PORT or tls://HOST:PORT [$EDGEOPT_SCHEDULER].")
@click.option("--nthreads", type=click.IntRange(min=1), default=1, help="Jobs this worker builds at once.")
@click.option("--name", default=None, help="The worker's name in `edgeopt cluster status` [dask's: its address].")
@click.option("--only", default=None, metavar="LIST",
              help="Offer only these backends of those that can build here (onnxruntime,openvino,tflite,coreml,"
                   "tensorrt).")
@click.option("--resources", "extra", default=None, metavar="'NAME=N ...'",
              help="Add or set resources: a backend's name is given its version hash (tensorrt=1: one engine "
                   "slot); other names are passed as they are.")
@click.option("--dry-run", is_flag=True, help="Print the dask worker command line and exit.")
@click.argument("dask_args", nargs=-1, type=click.UNPROCESSED)
@verbosity
def command(scheduler, nthreads, name, only, extra, dry_run, dask_args, **_) -> int:
    import shlex
    from importlib.util import find_spec

    from edgeopt.errors import MissingDependency

    url, argv, resources = worker_argv(scheduler, nthreads, name, only, extra, list(dask_args))
    offer = offer_line(resources)
    if dry_run:
        click.echo(shlex.join(argv))
        return 0
    if find_spec("distributed") is None:
        raise MissingDependency("dask distributed is not installed", hint="pip install 'edgeopt[cluster]'")
    click.echo(f"edgeopt worker{' ' + name if name else ''}: offering {offer} to {url}", err=True)
    sys.stderr.flush()
    sys.stdout.flush()
    os.execv(sys.executable, argv)
    return 0  # not reached


def offer_line(resources: dict[str, float]) -> str:
    from edgeopt.cluster import facts as F

    return ", ".join(f"{k}={v:g} ({F.WHAT.get(F.split(k)[0], 'as given')})" for k, v in resources.items())


def worker_argv(scheduler: str | None, nthreads: int, name: str | None, only: str | None, extra: str | None,
                dask_args: list[str]) -> tuple[str, list[str], dict[str, float]]:
    """The scheduler URL, the ``dask worker`` command line and the resources it offers (``edgeopt.worker`` and
    the CLI alike); every input checked (UsageError, exit 2)."""
    from edgeopt.cluster import ENV, check_url
    from edgeopt.errors import UsageError

    if isinstance(nthreads, bool) or not isinstance(nthreads, int) or nthreads < 1:
        raise UsageError(f"--nthreads must be an integer >= 1, got {nthreads!r}")
    url = scheduler or os.environ.get(ENV, "")
    if not url or url.lower() in ("auto", "local", "none", "off"):
        raise UsageError("edgeopt worker needs --scheduler tcp://HOST:PORT (or $EDGEOPT_SCHEDULER)")
    url = check_url(url)
    resources = offered(nthreads, only, extra)
    if not resources:
        raise UsageError("nothing to offer: no backend can build here"
                         + (f" among --only {only}" if only else ""),
                         hint="pip install 'edgeopt[openvino,tflite]' (or give --resources)")
    argv = [sys.executable, "-m", "distributed.cli.dask_worker", url, "--nthreads", str(nthreads),
            "--resources", " ".join(f"{k}={v:g}" for k, v in resources.items()), "--no-dashboard"]
    if name:
        argv += ["--name", name]
    if url.startswith("tls://"):
        for flag, env in (("--tls-ca-file", "EDGEOPT_TLS_CA"), ("--tls-cert", "EDGEOPT_TLS_CERT"),
                          ("--tls-key", "EDGEOPT_TLS_KEY")):
            if os.environ.get(env):
                argv += [flag, os.environ[env]]
    return url, argv + list(dask_args), resources


def offered(nthreads: int, only: str | None, extra: str | None) -> dict[str, float]:
    """The resources this worker declares: detected (``facts.detect``), cut to ``--only``, then ``--resources``."""
    from edgeopt.cluster import facts as F
    from edgeopt.errors import UsageError

    res = F.detect(nthreads)
    if only:
        wanted = [b.strip() for b in only.split(",") if b.strip()]
        bad = [b for b in wanted if b not in F.BACKENDS]
        if bad:
            raise UsageError(f"--only {','.join(bad)}: not a backend", hint=f"backends: {', '.join(F.BACKENDS)}")
        res = {k: v for k, v in res.items() if F.split(k)[0] in wanted}
    for item in (extra or "").replace(",", " ").split():
        key, eq, value = item.partition("=")
        try:
            amount = float(value)
        except ValueError:
            amount = -1.0
        if not eq or not key or amount < 0:
            raise UsageError(f"--resources {item!r}: expected NAME=N (e.g. tensorrt=1)")
        if key in F.BACKENDS:
            res = {k: v for k, v in res.items() if F.split(k)[0] != key}
            key = F.resource(key)
        res[key] = amount
    return {k: v for k, v in res.items() if v > 0}
