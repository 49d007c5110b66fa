"""The agent's verbs, each ``request dict -> reply dict``. Registered in ``VERBS`` (see SCHEMA.md).

A verb returns the reply's body (``{"ok": ..., "<verb>": {...}}``); a failure it can describe
returns ``"ok": False`` with ``"error": {"type", "message"}``, anything else raises and
``__main__`` turns the exception into the same shape.  Heavy work is imported inside each verb.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from .bundle import load_manifest, verify


@contextlib.contextmanager
def _held(req: dict[str, Any], ids: Any) -> Iterator[None]:
    """While a verb uses installed bundles, ``gc`` keeps them (a lease under the store lock)."""
    if not isinstance(ids, list) or not ids:
        yield
        return
    from .store import agent_root, lease

    with lease(agent_root(req), ids):
        yield


def _ids_of(req: dict[str, Any]) -> list[Any]:
    return [req["bundle_id"]] if req.get("bundle_id") and not req.get("bundle") else []


def verb_check(req: dict[str, Any]) -> dict[str, Any]:
    """Accuracy of a bundle's artifact against its reference outputs (no timing loop)."""
    from .check import check_bundle
    from .store import resolve_bundle

    with _held(req, _ids_of(req)):
        result = check_bundle(resolve_bundle(req), req.get("options"))
    return {"ok": True, "check": result}


def verb_verify(req: dict[str, Any]) -> dict[str, Any]:
    """A bundle's files against its manifest's sha256."""
    from .store import agent_root, check_id, entry_problem, resolve_bundle

    if req.get("bundle_id") and not req.get("bundle"):
        root, bid = agent_root(req), check_id(req["bundle_id"])
        problem = entry_problem(root, bid)
        if problem:  # the entry is not its id: report it as a verify failure, not a crash
            return {"ok": False, "verify": {"ok": False, "files": 0, "problems": [{"file": "manifest.json",
                                                                                   "problem": problem}]},
                    "error": {"type": "VerifyFailed", "message": f"manifest.json: {problem}"}}
    if req.get("bundle_id") and not req.get("bundle"):
        # A store entry holds plain files only, as install made it: a file swapped for a link (even to
        # identical bytes elsewhere) or a fifo is not what was installed. One rule with install's repair.
        from .store import entry_damage

        problems = entry_damage(root, bid)
        result = {"ok": not problems, "files": len(load_manifest(root / "store" / bid).get("files", {})),
                  "problems": problems}
    else:
        bundle = resolve_bundle(req)
        result = verify(bundle, load_manifest(bundle))
    reply: dict[str, Any] = {"ok": result["ok"], "verify": result}
    if not result["ok"]:
        reply["error"] = {"type": "VerifyFailed", "message": f"{len(result['problems'])} problem(s): " + "; ".join(
            f"{p['file']}: {p['problem']}" for p in result["problems"][:5])}
    return reply


def verb_probe(req: dict[str, Any]) -> dict[str, Any]:
    """The device: OS, CPU, memory, disk, GPUs, Jetson, runtimes (no runtime imported in-process)."""
    from .probe import probe
    from .store import agent_root

    return {"ok": True, "probe": probe(agent_root(req), import_fallback=req.get("import_fallback", True))}


def verb_bench(req: dict[str, Any]) -> dict[str, Any]:
    """Latency, memory and accuracy of a bundle, measured in a child process with a timeout."""
    from .bench import bench
    from .store import resolve_bundle

    with _held(req, _ids_of(req)):  # a bench in flight keeps its bundle, whatever gc is asked meanwhile
        return bench(resolve_bundle(req), req.get("options"))


def verb_pairbench(req: dict[str, Any]) -> dict[str, Any]:
    """Two installed bundles (baseline, candidate) timed interleaved A B B A … in one child process."""
    from .bench import BenchError
    from .store import agent_root

    ids = req.get("bundle_ids")
    if not isinstance(ids, list) or len(ids) != 2:
        raise BenchError("pairbench needs 'bundle_ids': [baseline id, candidate id]")
    root = agent_root(req)
    with _held(req, ids):
        return _pairbench(req, root, ids)


def _verified_bundles(root: Any, ids: list[Any], error: type[Exception]) -> list[Any]:
    """The installed bundles ``ids`` under ``root``, each verified (``error`` names the first that fails)."""
    from .store import resolve_bundle

    paths = [resolve_bundle({"root": str(root), "bundle_id": b}) for b in ids]
    for p in paths:
        v = verify(p, load_manifest(p))
        if not v["ok"]:
            raise error(f"bundle {p.name[:12]}… fails verification: "
                        + "; ".join(f"{x['file']}: {x['problem']}" for x in v["problems"][:5]))
    return paths


def _pairbench(req: dict[str, Any], root: Any, ids: list[Any]) -> dict[str, Any]:
    from .bench import BenchError, bench_in_child, parse_options

    paths = _verified_bundles(root, ids, BenchError)
    o = dict(req.get("options") or {})
    opts = parse_options({"timeout_s": o.pop("timeout_s", 600), "limits": o.pop("limits", {})})
    reply = bench_in_child(paths[0], opts, pair=paths, pair_options=o)
    if "bench" in reply and not reply.get("ok"):
        reply["pairbench"] = reply.pop("bench")
    return reply


def verb_evaluate(req: dict[str, Any]) -> dict[str, Any]:
    """Installed bundles' decisions on an evaluation set already on the device (a rollout's --eval)."""
    from .evaluate import evaluate
    from .store import agent_root

    ids, data = req.get("bundle_ids"), req.get("data")
    if not isinstance(ids, list) or not ids or not isinstance(data, str):
        raise ValueError("evaluate needs 'bundle_ids': [id, ...] and 'data': the .npz's path under <root>/eval")
    root = agent_root(req)
    path = (root / "eval" / data.replace("\\", "/").rsplit("/", 1)[-1]).resolve()
    if path.parent != (root / "eval").resolve() or not path.is_file():
        raise ValueError(f"evaluation data {data!r} is not a file under {root / 'eval'}")
    with _held(req, ids):
        paths = _verified_bundles(root, ids, ValueError)
        return {"ok": True, "evaluate": evaluate(paths, path, req.get("threads"))}


def verb_install(req: dict[str, Any]) -> dict[str, Any]:
    """Verify an uploaded bundle in ``<root>/staging/`` and move it into the store."""
    from .store import InstallRejected, agent_root, install

    try:
        return {"ok": True, "install": install(agent_root(req), req.get("staging"), req.get("bundle_id"),
                                                     bool(req.get("replace", False)))}
    except InstallRejected as exc:
        return {"ok": False, "install": {"bundle_id": req.get("bundle_id"), "problems": exc.problems,
                                         "staging_removed": True},
                "error": {"type": "InstallRejected", "message": str(exc)}}


def verb_has(req: dict[str, Any]) -> dict[str, Any]:
    """Which bundle ids are installed."""
    from .store import agent_root, free_mb, has, read_only

    root = agent_root(req)
    return {"ok": True, "has": has(root, req.get("bundle_ids")), "free_mb": free_mb(root),
            "read_only": read_only(root)}


def verb_activate(req: dict[str, Any]) -> dict[str, Any]:
    """Point a slot's ``current`` at an installed bundle."""
    from .store import activate, agent_root

    return {"ok": True, "activate": activate(agent_root(req), req.get("bundle_id"), req.get("slot"),
                                             req.get("confirm_within_s"))}


def verb_commit(req: dict[str, Any]) -> dict[str, Any]:
    """Confirm a trial activation (``activate`` with ``confirm_within_s``) before its deadline."""
    from .store import agent_root, commit

    return {"ok": True, "commit": commit(agent_root(req), req.get("slot"), req.get("bundle_id"))}


def verb_watchdog(req: dict[str, Any]) -> dict[str, Any]:
    """(Spawned detached by a trial activation) revert the trial at its deadline unless committed."""
    from .store import agent_root, watchdog

    return {"ok": True, "watchdog": watchdog(agent_root(req), req.get("slot"), req.get("deadline", 0),
                                             req.get("_request_file"))}


def verb_rollback(req: dict[str, Any]) -> dict[str, Any]:
    """A slot's current <- previous."""
    from .store import agent_root, rollback

    return {"ok": True, "rollback": rollback(agent_root(req), req.get("slot"), bool(req.get("to_empty", False)))}


def verb_gc(req: dict[str, Any]) -> dict[str, Any]:
    """Remove store entries no slot keeps."""
    from .store import agent_root, gc

    return {"ok": True, "gc": gc(agent_root(req), req.get("keep", 3), req.get("grace_s", 3600),
                                 bool(req.get("dry_run", False)))}


def verb_list(req: dict[str, Any]) -> dict[str, Any]:
    """Installed bundles and slots; with ``bundle_ids``, ``has``'s answer too (one agent call for both)."""
    from .store import agent_root, listing

    root = agent_root(req)
    reply = {"ok": True, "list": listing(root)}
    if req.get("bundle_ids"):
        reply.update({k: v for k, v in verb_has(req).items() if k != "ok"})
    return reply


def verb_compile(req: dict[str, Any]) -> dict[str, Any]:
    """Build (or reuse from the engine cache) a TensorRT bundle's engine on this device."""
    from .store import resolve_bundle
    from .trt_compile import compile_bundle

    return {"ok": True, "compile": compile_bundle(resolve_bundle(req), req.get("options"))}


VERBS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "probe": verb_probe,
    "check": verb_check,
    "verify": verb_verify,
    "bench": verb_bench,
    "pairbench": verb_pairbench,
    "evaluate": verb_evaluate,
    "install": verb_install,
    "has": verb_has,
    "activate": verb_activate,
    "commit": verb_commit,
    "watchdog": verb_watchdog,
    "rollback": verb_rollback,
    "gc": verb_gc,
    "list": verb_list,
    "compile": verb_compile,
}
