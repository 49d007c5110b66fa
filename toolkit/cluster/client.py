"""The host side of a ``--scheduler`` build: the Dask client, the inputs shipped content-addressed, and
``RemoteProc``, a job on a worker in the shape of the ``subprocess.Popen`` the local pipeline runs."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from edgeopt.errors import UsageError
from edgeopt.worker import PROGRESS

from . import ClusterUnreachable, facts
from .task import TOPIC, InputsLost, sha256_file

NO_WORKER_GRACE_S = float(os.environ.get("EDGEOPT_CLUSTER_NO_WORKER_S", "120"))  # none can take it this long: failed
NOT_INPUTS = ("owner.pid",)


def dataset(sha: str) -> str:
    """The name an input is published under in the scheduler (its content's sha256)."""
    return f"edgeopt-input-{sha}"


def security(address: str) -> Any:
    """Dask's ``Security`` for a ``tls://`` scheduler: ``$EDGEOPT_TLS_CA``/``_CERT``/``_KEY`` (PEM files), else
    dask's own ``distributed.comm.tls`` configuration; None for ``tcp://`` (no encryption, no authentication)."""
    if not address.startswith("tls://"):
        return None
    from distributed.security import Security

    ca, cert, key = (os.environ.get(f"EDGEOPT_TLS_{k}") for k in ("CA", "CERT", "KEY"))
    if ca or cert or key:
        missing = [n for n, v in (("EDGEOPT_TLS_CA", ca), ("EDGEOPT_TLS_CERT", cert), ("EDGEOPT_TLS_KEY", key))
                   if not v]
        if missing:
            raise UsageError(f"a tls:// scheduler needs {', '.join(missing)} too (PEM files)")
        for n, v in (("EDGEOPT_TLS_CA", ca), ("EDGEOPT_TLS_CERT", cert), ("EDGEOPT_TLS_KEY", key)):
            if not Path(v).is_file():
                raise UsageError(f"{n}={v}: no such file")
        return Security(tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, require_encryption=True)
    sec = Security()
    if not sec.tls_ca_file:
        raise UsageError("a tls:// scheduler needs a CA and a client certificate",
                         hint="set EDGEOPT_TLS_CA, EDGEOPT_TLS_CERT and EDGEOPT_TLS_KEY (PEM files), or dask's "
                              "distributed.comm.tls configuration")
    return sec


def connect(address: str, timeout: float) -> Any:
    """A Dask client of the scheduler at ``address``; ``ClusterUnreachable`` (exit 4) when it does not answer."""
    import logging

    from distributed import Client

    sec = security(address)
    quiet = logging.getLogger("distributed")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # its own multi-line log of the failed connect: the one line below says it
    try:
        return Client(address, timeout=timeout, security=sec, set_as_default=False)
    except (OSError, TimeoutError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ClusterUnreachable(f"scheduler {address} unreachable: {why}",
                                 hint="start one (`dask scheduler`, then `edgeopt worker --scheduler URL` on each "
                                      "build machine), or build here: --scheduler auto falls back, --scheduler "
                                      "local never asks") from None
    finally:
        quiet.setLevel(level)


class Session:
    """One Dask client for a build (and the builds of its ``auto`` fallback, ``--batch`` sizes, tune's
    candidates). Thread-safe: the pipeline's pool runs one ``RemoteProc`` per job from its threads."""

    def __init__(self, address: str, client: Any, progress: Callable[[str], None]) -> None:
        self.address, self.client, self.progress = address, client, progress
        self.notes: list[str] = []
        self._lock = threading.Lock()  # notes and the job table (the client's event thread takes it too)
        self._ship_lock = threading.Lock()  # held across scatters: never taken on the event thread
        self._procs: dict[str, RemoteProc] = {}
        self._scattered: dict[str, Any] = {}  # sha256 -> the Future holding those bytes in the cluster
        self._sha: dict[tuple[str, int, int], str] = {}
        self._facts: dict[str, dict[str, Any]] = {}
        self._chains: dict[str, dict[str, str]] = {}
        client.subscribe_topic(TOPIC, self._on_event)

    @classmethod
    def open(cls, address: str, timeout: float, progress: Callable[[str], None]) -> Session:
        client = connect(address, timeout)
        sess = cls(address, client, progress)
        workers = sess.workers()
        progress(f"scheduler {address}: {len(workers)} worker(s)"
                 + (": " + "; ".join(f"{w.get('name')} [{', '.join(sorted(w.get('resources') or {}))}]"
                                     for w in workers.values()) if workers else ""))
        return sess

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.unsubscribe_topic(TOPIC)
        for sha in list(self._scattered):  # the inputs leave the workers' memory (their stores keep them)
            with contextlib.suppress(Exception):
                self.client.unpublish_dataset(dataset(sha))
        with contextlib.suppress(Exception):
            self.client.close(timeout=10)

    # --- the cluster as it is now ---------------------------------------------------------------
    def workers(self) -> dict[str, dict[str, Any]]:
        return dict(self.client.scheduler_info(n_workers=-1).get("workers", {}))

    def chain(self, backend: str) -> dict[str, str]:
        if backend not in self._chains:
            self._chains[backend] = facts.toolchain(backend)
        return self._chains[backend]

    def resource(self, backend: str) -> str:
        return facts.resource(backend, self.chain(backend))

    def offering(self, resource: str, exclude: set[str] | frozenset = frozenset()) -> list[str]:
        return [a for a, w in self.workers().items() if (w.get("resources") or {}).get(resource) and a not in exclude]

    def slots(self) -> int:
        """Jobs the workers run at once (their threads): how many the host keeps in flight."""
        return sum(int(w.get("nthreads") or 1) for w in self.workers().values())

    def worker_facts(self) -> dict[str, dict[str, Any]]:
        """``facts.worker_facts`` of every worker (asked once per worker)."""
        addrs = [a for a in self.workers() if a not in self._facts]
        if addrs:
            with contextlib.suppress(Exception):
                self._facts.update(self.client.run(facts.worker_facts, workers=addrs))
        return self._facts

    def missing(self, backend: str) -> str | None:
        """Why no worker can build ``backend``'s jobs now (one line), or None."""
        res = self.resource(backend)
        if self.offering(res):
            return None
        workers = self.workers()
        others = []
        all_facts = self.worker_facts()
        for a, w in workers.items():
            if any(facts.split(r)[0] == backend for r in (w.get("resources") or {})):
                diff = facts.differences(self.chain(backend), (all_facts.get(a) or {}).get("toolchains", {}).get(backend, {}))
                others.append(f"{w.get('name')} offers {backend} at other versions ({', '.join(diff) or 'other'})")
        return (f"no worker of {self.address} can build it: none offers the resource {res} ({facts.WHAT[backend]} at "
                f"this host's versions and edgeopt code; {len(workers)} worker(s) connected)" + ("; " + "; ".join(others) if others else ""))

    # --- the pipeline's two hooks ---------------------------------------------------------------
    def refuse(self, todo: list) -> list:
        """Mark the jobs no worker can take now (status ``unavailable``, one line naming the resource) and
        return the others: before anything is prepared."""
        keep = []
        for item in todo:
            res, spec = item[0], item[1]
            why = self.missing(spec.backend)
            if why:
                res.status, res.error = "unavailable", why
                self.progress(f"{res.target} {res.precision}: {why}")
            else:
                keep.append(item)
        return keep

    def popen(self, argv: list[str], **_: Any) -> RemoteProc:
        """``subprocess.Popen([python, -m, edgeopt.worker, JOB, RESULT])``, run on a worker instead."""
        return RemoteProc(self, Path(argv[-2]), Path(argv[-1]))

    # --- inputs, content-addressed ----------------------------------------------------------------
    def _sha_of(self, path: Path) -> str:
        st = path.stat()
        k = (str(path), st.st_size, st.st_mtime_ns)
        if k not in self._sha:
            self._sha[k] = sha256_file(path)
        return self._sha[k]

    def ship(self, job: dict[str, Any], again: bool = False) -> tuple[dict[str, list], dict[str, Path]]:
        """The job's inputs (the prepared work folder's files and the user's model) as name -> [sha256, size,
        dataset name], each held once in the cluster (scattered under its content: a worker fetches only what its
        store lacks); ``again``: a worker found one missing (its holder died, or another host that shipped the same
        bytes unpublished them): scattered again where lost, published again. Also sha256 -> the host's path."""
        work = Path(job["prepared_path"]).parent
        paths = {p.name: p for p in sorted(work.iterdir()) if p.is_file() and p.name not in NOT_INPUTS
                 and not (p.name.startswith(("job-", "result-")) and p.suffix == ".json")}
        paths["model/" + Path(job["model_path"]).name] = Path(job["model_path"])
        inputs, by_sha = {}, {}
        with self._ship_lock:
            held: dict[str, Any] = {}
            if again:  # which of ours no worker holds any more
                with contextlib.suppress(Exception):
                    held = self.client.who_has(list(self._scattered.values()))
            for name, p in paths.items():
                sha = self._sha_of(p)
                fut = self._scattered.get(sha)
                if fut is None or fut.status != "finished" or again:
                    if fut is None or fut.status != "finished" or not held.get(fut.key):
                        # again: under a new key (the lost one may linger in the scheduler's books)
                        fut = self.client.scatter(p.read_bytes(), hash=not again)
                        self._scattered[sha] = fut
                    # published: a worker's task finds it by name (a Future made from a bare key never updates)
                    self.client.publish_dataset(**{dataset(sha): fut}, override=True)
                inputs[name] = [sha, p.stat().st_size, dataset(sha)]
                by_sha[sha] = p
        return inputs, by_sha

    # --- events from the workers ------------------------------------------------------------------
    def _on_event(self, event: tuple[float, dict[str, Any]]) -> None:
        msg = event[1] if isinstance(event, (tuple, list)) and len(event) == 2 else event
        if not isinstance(msg, dict):
            return
        proc = self._procs.get(msg.get("job", ""))
        if proc is not None:
            proc.on_event(msg)

    def register(self, job_id: str, proc: RemoteProc | None) -> None:
        with self._lock:
            if proc is None:
                self._procs.pop(job_id, None)
            else:
                self._procs[job_id] = proc

    def note(self, text: str) -> None:
        with self._lock:
            self.notes.append(text)
        self.progress(text)


class _Lines:
    """``proc.stderr``: the progress lines streamed from the worker, ending when the job does."""

    def __init__(self) -> None:
        self.q: queue.Queue[str | None] = queue.Queue()

    def __iter__(self) -> Iterator[str]:
        while True:
            line = self.q.get()
            if line is None:
                return
            yield line + "\n"


class RemoteProc:
    """One job on a Dask worker, driven like the local ``Popen`` of ``edgeopt.worker``: ``wait()`` returns when
    the job's result and bundle are here (``RESULT.json`` written, the bundle in the job's ``bundle_dir``,
    checked against its manifest's hashes) or raises ``subprocess.TimeoutExpired``; ``kill()`` cancels."""

    def __init__(self, sess: Session, job_file: Path, result_file: Path) -> None:
        self.sess, self.job_file, self.result_file = sess, job_file, result_file
        self.job = json.loads(job_file.read_text())
        self.backend = self.job["target"]["backend"]
        self.tag = f"{self.job['target']['name']} {self.job['precision']}"
        self.resource = sess.resource(self.backend)
        self.stderr = _Lines()
        self.returncode: int | None = None
        self.pid = 0
        self.args = ["edgeopt.worker", str(job_file), str(result_file)]
        self._killed = False
        self._future: Any = None
        self._job_id = ""
        self._excluded: set[str] = set()
        self._reships = 0
        self._starts: list[dict[str, Any]] = []
        self._finished = threading.Event()
        self.timeline: list[dict[str, Any]] = []  # every start/finish/slot event, for the record

    # events arrive on the client's thread: quick
    def on_event(self, msg: dict[str, Any]) -> None:
        kind = msg.get("kind")
        if kind == "progress":
            self.stderr.q.put(PROGRESS + str(msg.get("line", "")))
            return
        self.timeline.append(dict(msg))
        if kind == "start":
            if self._starts and not self._finished.is_set():
                prev = self._starts[-1]
                self.sess.note(f"cluster: {self.tag}: worker {prev['name']} ({prev['worker']}) was lost mid-build; "
                               f"the job runs again on {msg.get('name')} ({msg.get('worker')})")
            self._starts.append(msg)
        elif kind == "finish":
            self._finished.set()

    def _submit(self, timeout: float, workers: list[str] | None = None) -> None:
        from .task import run_job

        if self._job_id:
            self.sess.register(self._job_id, None)
        self._job_id = uuid.uuid4().hex
        self._starts, self._finished = [], threading.Event()
        self.sess.register(self._job_id, self)
        self._inputs, self._by_sha = self.sess.ship(self.job)
        self._timeout = timeout
        self._future = self.sess.client.submit(
            run_job, self.job, self._inputs, timeout, self._job_id, self.resource,
            key=f"edgeopt-{self.tag.replace(' ', '-')}-{self._job_id[:12]}", pure=False,
            resources={self.resource: 1}, workers=workers, allow_other_workers=False)

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self._killed = True
        if self._future is not None:
            with contextlib.suppress(Exception):
                self._future.cancel()
        if self.returncode is None:
            self.returncode = -9

    terminate = kill

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            self._end()
            return self.returncode
        try:
            return self._wait(timeout)
        finally:
            if self.returncode is not None:
                self._end()

    def _end(self) -> None:
        self.sess.register(self._job_id, None)
        self.stderr.q.put(None)

    def _fail(self, error: str, user_error: bool = True) -> int:
        """End the job as failed with one line (the pipeline reports it as the worker's own error)."""
        self.result_file.write_text(json.dumps({"ok": False, "user_error": user_error, "error": error}))
        self.returncode = 0
        return 0

    def _wait(self, timeout: float | None) -> int:
        from distributed import CancelledError, KilledWorker

        budget = timeout if timeout is not None else 1e9
        if self._future is None:
            self._submit(budget)
        no_worker_since: float | None = None
        last_look = 0.0
        while True:
            try:
                out = self._future.result(timeout=1.0)
            except TimeoutError:
                if self._killed:
                    return self.returncode or -9
                now = time.time()
                started = self._starts[-1]["t"] if self._starts else None
                if started is not None and now - started > budget + 60:  # the worker's own timeout did not answer
                    raise subprocess.TimeoutExpired(self.args, budget) from None
                if now - last_look > 2.0:
                    last_look = now
                    if self.sess.offering(self.resource, self._excluded):
                        no_worker_since = None
                    else:
                        no_worker_since = no_worker_since or now
                        if now - no_worker_since > NO_WORKER_GRACE_S:
                            with contextlib.suppress(Exception):
                                self._future.cancel()
                            return self._fail(f"no worker of {self.sess.address} offers {self.resource} any more "
                                              f"({facts.WHAT[self.backend]}; waited {NO_WORKER_GRACE_S:.0f} s)")
                continue
            except CancelledError:
                if self._killed:
                    return self.returncode or -9
                return self._fail(f"the scheduler {self.sess.address} cancelled the job (it restarted or lost it)")
            except KilledWorker as exc:
                return self._fail(f"the job's workers died while running it, too often for Dask to try again "
                                  f"(distributed.scheduler.allowed-failures): {str(exc).splitlines()[0]}")
            except InputsLost:
                self._reships += 1
                if self._reships > 3:
                    return self._fail("a worker could not fetch the job's inputs from the cluster 3 times")
                self.stderr.q.put(PROGRESS + "an input was no longer held in the cluster: shipping the inputs again")
                self.sess.ship(self.job, again=True)
                self._submit(budget, self._workers())
                continue
            except Exception as exc:  # noqa: BLE001 - the task itself failed on the worker
                return self._fail(f"the cluster task failed on a worker: {type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''}", user_error=False)
            self._finished.wait(timeout=0.2)  # its last progress lines travel beside the result (ahead, as a rule)
            verdict = self._take(out)
            if verdict is None:
                return self.returncode if self.returncode is not None else 0
            # refused: built again on another worker that offers the resource
            self._excluded.add(out["worker"])
            self.sess.note(f"cluster: {self.tag}: refused the bundle from worker {out['name']} ({out['worker']}): "
                           f"{verdict}; building it again on another worker")
            others = self._workers()
            if not others:
                return self._fail(f"refused the bundle from worker {out['name']}: {verdict}; no other worker "
                                  f"offers {self.resource}")
            self._submit(budget, others)

    def _workers(self) -> list[str] | None:
        """Where a resubmitted job may go: any worker with the resource but the excluded ones (None: any)."""
        return self.sess.offering(self.resource, self._excluded) if self._excluded else None

    def _take(self, out: dict[str, Any]) -> str | None:
        """Put the worker's outcome where the pipeline reads it; a reason when the bundle is refused."""
        if out.get("hung"):
            raise subprocess.TimeoutExpired(self.args, self._timeout)
        if len(self._starts) > 1 and not any("runs again" in n and self.tag in n for n in self.sess.notes):
            self.sess.note(f"cluster: {self.tag}: ran {len(self._starts)} times (a worker was lost mid-build); "
                           f"built on {out['name']}")
        for line in out.get("tail") or []:
            self.stderr.q.put(line)
        bundle = Path(self.job["bundle_dir"])
        shutil.rmtree(bundle, ignore_errors=True)
        bundle.mkdir(parents=True)
        for rel, f in (out.get("files") or {}).items():
            dst = bundle / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if f["data"] is None:
                src = self._by_sha.get(f["sha256"])
                if src is None:
                    return f"{rel}: sent as the host's own file, but the host has no file of that sha256"
                try:
                    os.link(src, dst)
                except OSError:
                    shutil.copyfile(src, dst)
            else:
                dst.write_bytes(f["data"])
        result = out.get("result")
        if result is not None and result.get("ok"):
            why = verify(bundle, result.get("manifest") or {})
            if why:
                shutil.rmtree(bundle, ignore_errors=True)
                return why
        if result is not None:
            self.result_file.write_text(json.dumps(result))
        self.returncode = int(out["rc"]) if out.get("rc") is not None else 1
        return None


def verify(bundle: Path, manifest: dict[str, Any]) -> str | None:
    """Why the bundle that came back is not the one its manifest describes (a file missing, extra, or of
    another sha256 or size), or None. ``BUILD_TIMES`` (the worker's timings, in no id) is not checked."""
    from edgeopt.targets.base import BUILD_TIMES, split_times

    try:
        written = json.loads((bundle / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        return f"manifest.json unreadable ({exc})"
    reported = json.loads(json.dumps(manifest, default=str))
    split_times(reported)  # the timings are in BUILD_TIMES, outside the bundle's id
    if written != reported:
        return "manifest.json differs from the manifest the worker reported"
    table = written.get("files") or {}
    present = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()} - {"manifest.json",
                                                                                           BUILD_TIMES}
    if set(table) - present:
        return f"{sorted(set(table) - present)[0]} is missing"
    if present - set(table):
        return f"{sorted(present - set(table))[0]} is not in the manifest"
    for rel, f in table.items():
        p = bundle / rel
        if p.stat().st_size != f.get("size") or sha256_file(p) != f.get("sha256"):
            return f"{rel}'s sha256 does not match the manifest's"
    return None
