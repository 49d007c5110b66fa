"""One INT8 variant as a Dask task: a calibration method's independent variants made and judged on the cluster.

A build on a Dask cluster (``edgeopt build --scheduler``) runs each (target, precision) job as a task whose converter
is a child process (``edgeopt.cluster.task``).  For the cpu target's QDQ search that child gets the scheduler's address
(``EDGEOPT_VARIANT_SCHEDULER``, set by the job's task, which secedes from its worker's thread pool while it waits):
``QdqSearch.run_grid`` then hands each calibration method's variants (every setting but the weighted-ops-only
fallback) to ``Fanout.run`` at once.  Each is a task (``make_and_judge``): the variant's QDQ model made from the
float model and the method's ranges (computed once, in the job: ``OrtBackend.prepare``) and judged by the search's own
rule (``qdq_search.judge_session``) on the validation samples, untimed; the file and its figures come back.  Timing,
the k-fold cross-check, the float fallback and the pick stay in the job (latency is only comparable on one machine;
the fallback reads each step's result).  The search's shared inputs (the float model, validation and calibration
samples, FP32 outputs, bounds, kinds, policy) are scattered once per search.  Without the variable, or when the
scheduler does not answer, every variant is made in the job as before; the cache key does not change.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = "EDGEOPT_VARIANT_SCHEDULER"  # the scheduler's address, set by the job's Dask task for its converter
RESOURCE_ENV = "EDGEOPT_VARIANT_RESOURCE"  # the job's Dask resource (<backend>@<versions+code hash>)
CONNECT_S = 20.0
_FANOUT: dict[str, Fanout | None] = {}  # one client per converter process and address


class Fanout:
    """A Dask client of the job's scheduler, with the search's shared inputs scattered once."""

    def __init__(self, client: Any, address: str) -> None:
        self.client, self.address = client, address
        self._shared: Any = None
        self._for: Any = None

    def map(self, fn: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]], key: Any,
            shared: Callable[[], dict[str, Any]], specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``fn(shared, spec)`` for every spec as a task, the results in the specs' order; ``shared()`` is made and
        scattered once per ``key`` (one search)."""
        if self._for != key:
            self._shared = self.client.scatter([shared()], hash=False)[0]
            self._for = key
        # only workers that build this job's backend with the job's code and converter versions (its resource
        # name says both): a variant made elsewhere could differ, or not import the converter at all
        resource = os.environ.get(RESOURCE_ENV)
        workers = [a for a, w in self.client.scheduler_info(n_workers=-1)["workers"].items()
                   if resource in (w.get("resources") or {})] if resource else []
        futures = [self.client.submit(fn, self._shared, spec, pure=False, workers=workers or None,
                                      allow_other_workers=False) for spec in specs]
        return self.client.gather(futures)

    def run(self, specs: list[dict[str, Any]], search: Any) -> list[dict[str, Any]]:
        """``make_and_judge`` of every spec of a ``QdqSearch`` as a task; the results in the specs' order."""
        return self.map(make_and_judge, id(search), lambda: {
            "float_model": Path(search.backend.float_path).read_bytes(), "val": search.val,
            "reference": search.reference, "out_names": search.out_names, "tolerance": search.tolerance,
            "kinds": search.kinds, "rows": search.rows, "accept": search.accept,
            "calib_check": search.calib_check, "calib_reference": search.calib_reference}, specs)


def fanout(progress: Callable[[str], None] = lambda s: None) -> Fanout | None:
    """The cluster this converter may hand variants to (``ENV``); None without one, or when it does not answer
    (said once)."""
    address = os.environ.get(ENV)
    if not address:
        return None
    if address not in _FANOUT:
        try:
            from edgeopt.cluster.client import connect

            _FANOUT[address] = Fanout(connect(address, CONNECT_S), address)
        except Exception as exc:  # noqa: BLE001 - the variants are made here, as without a cluster
            progress(f"int8: variants made here: the scheduler {address} did not answer "
                     f"({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})")
            _FANOUT[address] = None
    return _FANOUT[address]


def worker_name() -> str:
    """The Dask worker this runs on (``local`` outside one)."""
    try:
        from distributed import get_worker

        return str(get_worker().name)
    except (ImportError, ValueError):
        return "local"


def make_and_judge(shared: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """On a worker: the variant ``spec`` (``OrtBackend.variant_spec``: settings, the method's ranges, the nodes kept
    float) made from the shared float model and judged (``judge_session``), untimed -> ``{"model": bytes, "result",
    "cal_err", "worker"}`` or ``{"error", "worker"}`` when the quantizer cannot make it."""
    import onnxruntime as ort

    from edgeopt.targets.onnxruntime.int8 import make_variant
    from edgeopt.targets.onnxruntime.quant import session
    from edgeopt.targets.qdq_search import _first, judge_session

    where = worker_name()
    with tempfile.TemporaryDirectory(prefix="edgeopt-variant-") as tmp:
        src, dst = Path(tmp) / "float.onnx", Path(tmp) / "variant.onnx"
        src.write_bytes(shared["float_model"])
        try:
            make_variant(src, spec["ranges"], spec["settings"], dst, spec["always"])
            sess = session(ort, dst)
        except Exception as exc:  # noqa: BLE001 - one variant the quantizer cannot make is one failed candidate
            return {"error": _first(exc), "worker": where}
        result, cal_err = judge_session(sess, shared["val"], shared["reference"], shared["out_names"],
                                        shared["tolerance"], shared["kinds"], shared["rows"], shared["accept"],
                                        shared["calib_check"], shared["calib_reference"])
        del sess
        return {"model": dst.read_bytes(), "result": result, "cal_err": cal_err, "worker": where}
