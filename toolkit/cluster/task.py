"""The task a Dask worker runs for one (target, precision) job: the same ``python -m edgeopt.worker`` as a local
build, on inputs fetched content-addressed (what this worker lacks, once), the bundle sent back whole.

Runs inside ``edgeopt worker`` (a ``dask worker``); imported there by name when the first job arrives.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TOPIC = "edgeopt-progress"  # the events every job sends the host (start, progress lines, finish)
FETCH_TIMEOUT_S = 300.0


class InputsLost(RuntimeError):
    """An input this worker lacks is no longer held anywhere in the cluster (the worker that held it died):
    the host ships it again and resubmits."""


def store_dir() -> Path:
    """This worker's content-addressed input store: ``$EDGEOPT_CACHE_DIR/cluster-inputs/<sha[:2]>/<sha>``."""
    root = Path(os.environ.get("EDGEOPT_CACHE_DIR") or Path.home() / ".cache" / "edgeopt")
    return root / "cluster-inputs"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fetch(name: str) -> bytes:
    """The bytes the host scattered and published as dataset ``name``, from whichever worker holds them."""
    from distributed import get_client

    client = get_client()
    try:
        fut = client.get_dataset(name)
    except KeyError:
        raise InputsLost(name) from None
    deadline = time.monotonic() + FETCH_TIMEOUT_S
    nowhere = 0
    while True:
        if fut.status in ("lost", "cancelled", "error"):
            raise InputsLost(name)
        try:
            return fut.result(timeout=2.0)
        except TimeoutError:
            # held by no worker (its holder died): the host ships it again
            nowhere = 0 if client.who_has([fut]).get(fut.key) else nowhere + 1
            if nowhere >= 2 or time.monotonic() > deadline:
                raise InputsLost(name) from None


def _stored(sha: str, size: int, key: str) -> tuple[Path, bool]:
    """The input's path in the store, fetching it first when missing; (path, fetched)."""
    path = store_dir() / sha[:2] / sha
    if path.is_file() and path.stat().st_size == size:
        return path, False
    data = _fetch(key)
    if sha256_bytes(data) != sha:
        raise RuntimeError(f"input {key} arrived with another sha256 than the host's")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{sha}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path, True


def _die_with_parent() -> None:  # the converter must not outlive a killed worker
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def _gpu_slot(slots: int):
    """One of this worker's TensorRT engine slots (one per GPU), held by a file lock for the whole job."""
    import fcntl

    lock_dir = Path(tempfile.gettempdir()) / f"edgeopt-gpu-slots-{os.getuid()}"
    lock_dir.mkdir(parents=True, exist_ok=True)
    while True:
        for i in range(max(1, int(slots))):
            fd = os.open(lock_dir / f"gpu{i}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield i
            finally:
                os.close(fd)
            return
        time.sleep(0.2)


def run_job(job: dict[str, Any], inputs: dict[str, list], timeout: float, job_id: str,
            resource: str) -> dict[str, Any]:
    """``_run_job``, its failures made plain (an exception Dask cannot pickle would leave the host waiting)."""
    try:
        return _run_job(job, inputs, timeout, job_id, resource)
    except InputsLost:
        raise
    except Exception as exc:  # noqa: BLE001 - sent to the host as one line
        raise RuntimeError(f"{type(exc).__name__}: {str(exc)[:500]}") from None


def _run_job(job: dict[str, Any], inputs: dict[str, list], timeout: float, job_id: str,
             resource: str) -> dict[str, Any]:
    """Build one job here. ``inputs``: file name -> [sha256, size, dask key] (the host's work folder files and,
    under ``model/``, the user's model); ``job``'s paths are the host's and are pointed at this worker's copies.
    Returns the worker's result, its exit code, the last stderr lines and the bundle's files (bytes, or only
    the sha256 for files the host shipped here itself: the validation inputs and reference). ``resource``: the one
    Dask resource the job holds (``<backend>@<toolchain hash>``; TensorRT's: an engine slot per GPU)."""
    from distributed import get_worker

    worker = get_worker()
    who = {"worker": worker.address, "name": str(worker.name)}

    def event(kind: str, **kw: Any) -> None:
        worker.log_event(TOPIC, {"job": job_id, "kind": kind, "t": time.time(), **who, **kw})

    event("start")
    fetched: list[str] = []
    local: dict[str, Path] = {}
    size_fetched = 0
    for name, (sha, size, key) in inputs.items():
        local[name], got = _stored(sha, int(size), key)
        if got:
            fetched.append(name)
            size_fetched += int(size)
    event("progress", line=f"on worker {who['name']} ({who['worker']}): fetched {len(fetched)} input(s) "
                           f"({size_fetched / 1e6:.1f} MB), had {len(inputs) - len(fetched)}")
    work = Path(tempfile.mkdtemp(prefix="edgeopt-job-", dir=store_dir().parent))
    try:
        for name, path in local.items():
            dst = work / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, dst)
            except OSError:
                shutil.copyfile(path, dst)
        host_work = str(Path(job["prepared_path"]).parent)
        host_model = job["model_path"]
        mine = dict(job)
        mine["model_path"] = str(work / "model" / Path(host_model).name)
        for k in ("prepared_path", "calib_path", "validation_path", "reference_path", "bundle_dir"):
            mine[k] = str(work / Path(job[k]).name)
        (work / "job.json").write_text(json.dumps(mine))
        env = dict(os.environ)
        slot = contextlib.nullcontext(None)
        if resource.startswith("tensorrt"):
            slot = _gpu_slot(worker.state.total_resources.get(resource, 1))
        fans_out = job["target"]["backend"] in ("onnxruntime", "openvino") and job["precision"] == "int8"
        if fans_out:  # its INT8 search makes and judges its variants as tasks (edgeopt.targets.qdq_variant)
            from edgeopt.targets import qdq_variant

            env[qdq_variant.ENV] = worker.scheduler.address
            env[qdq_variant.RESOURCE_ENV] = resource  # variants go only to workers offering it
        with slot as gpu:
            if gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = str(gpu)
                event("slot", slot=f"gpu{gpu}", phase="acquired")
            if fans_out:  # this thread only waits now: its slot runs variant tasks (the job keeps its resource)
                from distributed import rejoin, secede

                secede()
            try:
                out = _convert(work, timeout, env, event)
            finally:
                if fans_out:
                    rejoin()
            if gpu is not None:
                event("slot", slot=f"gpu{gpu}", phase="released")
        out["fetched"], out["inputs"] = fetched, len(inputs)
        out.update(who)
        out["toolchain"] = _toolchain(job["target"]["backend"])
        bundle = Path(mine["bundle_dir"])
        shipped = {sha for sha, _, _ in inputs.values()}
        out["files"] = _pack(bundle, shipped)
        # the worker's paths in messages read as the host's
        for k in ("tail",):
            out[k] = [_host_paths(t, work, host_work, mine["model_path"], host_model) for t in out[k]]
        if out.get("result") is not None:
            out["result"] = json.loads(_host_paths(json.dumps(out["result"]), work, host_work,
                                                   mine["model_path"], host_model))
        event("finish", rc=out["rc"])
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _toolchain(backend: str) -> dict[str, str]:
    from edgeopt.targets.registry import get_backend

    return get_backend(backend).toolchain()


def _host_paths(text: str, work: Path, host_work: str, model: str, host_model: str) -> str:
    return text.replace(model, host_model).replace(str(work), host_work)


def _convert(work: Path, timeout: float, env: dict[str, str], event) -> dict[str, Any]:
    """``python -m edgeopt.worker`` on the job, its progress lines sent to the host as they come."""
    proc = subprocess.Popen([sys.executable, "-m", "edgeopt.worker", str(work / "job.json"), str(work / "result.json")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_die_with_parent)
    from edgeopt.worker import relay

    reader, tail = relay(proc.stderr, lambda line: event("progress", line=line))
    t0 = time.perf_counter()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        reader.join(timeout=5)
        return {"rc": None, "hung": True, "tail": tail, "result": None, "time_s": time.perf_counter() - t0}
    reader.join(timeout=5)
    result = None
    with contextlib.suppress(OSError, ValueError):
        result = json.loads((work / "result.json").read_text())
    return {"rc": proc.returncode, "hung": False, "tail": tail, "result": result, "time_s": time.perf_counter() - t0}


def _read(path: Path) -> bytes:
    return path.read_bytes()


def _pack(bundle: Path, shipped: set[str]) -> dict[str, dict[str, Any]]:
    """Every file of the bundle: ``{rel: {"sha256", "size", "data"}}``, ``data`` None for a file the host has
    (it shipped those bytes here)."""
    files: dict[str, dict[str, Any]] = {}
    if not bundle.is_dir():
        return files
    for p in sorted(bundle.rglob("*")):
        if p.is_file():
            data = _read(p)
            sha = sha256_bytes(data)
            files[p.relative_to(bundle).as_posix()] = {"sha256": sha, "size": len(data),
                                                      "data": None if sha in shipped else data}
    return files
