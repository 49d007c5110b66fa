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
CONNECT_S = 20.0
_FANOUT: dict[str, Fanout | None] = {}  # one client per converter process and address


class Fanout:
    """A Dask client of the job's scheduler, with the search's shared inputs scattered once."""

    def __init__(self, client: Any, address: str) -> None:
        self.client, self.address = client, address
        self._shared: Any = None
        self._for: int | None = None

    def _scatter(self, search: Any) -> Any:
        if self._for != id(search):
            shared = {"float_model": Path(search.backend.float_path).read_bytes(), "val": search.val,
                      "reference": search.reference, "out_names": search.out_names, "tolerance": search.tolerance,
                      "kinds": search.kinds, "rows": search.rows, "accept": search.accept,
                      "calib_check": search.calib_check, "calib_reference": search.calib_reference}
            self._shared = self.client.scatter([shared], hash=False)[0]
            self._for = id(search)
        return self._shared

    def run(self, specs: list[dict[str, Any]], search: Any) -> list[dict[str, Any]]:
        """``make_and_judge`` of every spec as a task; the results in the specs' order."""
        shared = self._scatter(search)
        futures = [self.client.submit(make_and_judge, shared, spec, pure=False) for spec in specs]
        return self.client.gather(futures)


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


def make_and_judge(shared: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    """On a worker: the variant ``spec`` (``OrtBackend.variant_spec``: settings, the method's ranges, the nodes kept
    float) made from the shared float model and judged (``judge_session``), untimed -> ``{"model": bytes, "result",
    "cal_err", "worker"}`` or ``{"error", "worker"}`` when the quantizer cannot make it."""
    import onnxruntime as ort

    from edgeopt.targets.onnxruntime.int8 import make_variant
    from edgeopt.targets.onnxruntime.quant import session
    from edgeopt.targets.qdq_search import _first, judge_session

    try:
        from distributed import get_worker

        where = str(get_worker().name)
    except (ImportError, ValueError):  # run in a plain process (a test of the function itself)
        where = "local"
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
