"""``edgeopt cluster status``: the workers of a Dask scheduler, what each can build and its converter versions."""

from __future__ import annotations

import click

from . import emit_json
from ._common import CONTEXT, examples, json_option, ns, verbosity


@click.group("cluster", context_settings=CONTEXT, short_help="The build cluster (Dask) behind --scheduler.",
             epilog=examples("""\
examples:
  edgeopt cluster status --scheduler tcp://10.0.0.5:8786
  EDGEOPT_SCHEDULER=tcp://10.0.0.5:8786 edgeopt cluster status --json"""))
def command() -> None:
    """The Dask scheduler and the `edgeopt worker`s that `edgeopt build --scheduler URL` builds on."""


@command.command("status", context_settings=CONTEXT, epilog=examples("""\
exit codes: 0 listed, 2 bad address, 4 the scheduler unreachable."""))
@click.option("--scheduler", default=None, metavar="URL", help="tcp://HOST:PORT or tls://HOST:PORT [$EDGEOPT_SCHEDULER].")
@json_option
@verbosity
def status_command(scheduler, **kw) -> int:
    """Every worker: its name, address, threads, the resources it offers (what it can build), the jobs running
    there, and the converter versions that differ from this host's (its bundles would get other cache keys, so
    no job of this host goes there)."""
    from edgeopt.api import cluster_status

    info = cluster_status(scheduler).to_dict()
    address = info["scheduler"]
    if ns(**kw).json:
        emit_json(info, "cluster-status")
        return 0
    from edgeopt.ui import table

    rows = [{"name": w["name"], "address": w["address"], "threads": w["nthreads"],
             "running": w["running"], "offers": ", ".join(w["builds"]) or "-",
             "versions": "same as this host" if not w["differs"] else "; ".join(w["differs"])}
            for w in info["workers"]]
    click.echo(f"scheduler {address}: {len(rows)} worker(s), {sum(r['threads'] for r in rows)} thread(s)")
    if rows:
        click.echo(table(rows, [("name", "worker"), ("address", "address"), ("threads", "threads"),
                                ("running", "running"), ("offers", "can build"), ("versions", "versions")]))
    for w in info["workers"]:
        if w["differs"]:
            click.echo(f"worker {w['name']}: converter versions or edgeopt code differ from this host's ("
                       + "; ".join(w["differs"]) + "): its bundles would not be this host's (other cache keys or "
                       "bundle ids); this host's jobs of those backends never go there")
    for b, names in info["nobody"].items():
        click.echo(f"no worker can build {b} jobs of this host ({names})")
    return 0


def status(address: str, timeout: float) -> dict:
    """The cluster as ``cluster status`` shows it (also its ``--json``)."""
    from edgeopt.cluster import facts as F
    from edgeopt.cluster.client import Session, connect

    client = connect(address, timeout)
    try:
        sess = Session(address, client, lambda s: None)
        workers = sess.workers()
        all_facts = sess.worker_facts()
        processing = {}
        try:
            processing = client.processing()
        except Exception:  # noqa: BLE001 - the count is a nicety
            pass
        out = []
        for addr, w in sorted(workers.items(), key=lambda kv: str(kv[1].get("name"))):
            fw = all_facts.get(addr) or {}
            builds, differs = [], []
            for r, n in sorted((w.get("resources") or {}).items()):
                backend, digest = F.split(r)
                if backend not in F.BACKENDS:
                    builds.append(f"{r}={n:g}")
                    continue
                same = digest == F.resource(backend, sess.chain(backend)).split("@")[1]
                builds.append(f"{backend}={n:g}" + ("" if same else " (other versions)"))
                if not same:
                    d = F.differences(sess.chain(backend), (fw.get("toolchains") or {}).get(backend, {}))
                    differs.append(f"{backend}: " + (", ".join(d) or "other versions"))
            out.append({"name": str(w.get("name")), "address": addr, "nthreads": int(w.get("nthreads") or 0),
                        "running": len(processing.get(addr, ())), "resources": dict(w.get("resources") or {}),
                        "builds": builds, "differs": differs, "edgeopt": fw.get("edgeopt"),
                        "python": fw.get("python"), "host": fw.get("host"),
                        "toolchains": fw.get("toolchains")})
        nobody = {}
        for b in F.BACKENDS:
            res = sess.resource(b)
            if not any(res in (w.get("resources") or {}) for w in workers.values()):
                nobody[b] = F.WHAT[b]
        return {"scheduler": address, "workers": out, "nobody": nobody,
                "host_resources": {b: sess.resource(b) for b in F.BACKENDS}}
    finally:
        client.close()
