"""A real Dask cluster for the tests: `dask scheduler` and `edgeopt worker` processes with different resources,
started once per session (each worker with its own input store, as on separate machines).

A worker's resources carry a hash of edgeopt's code as it was when the worker started (`facts.code_hash`): a
package file edited while these tests run (a shared working tree) makes the host's jobs go to none of them --
refused with "none offers the resource ... (edgeopt code ...)", as a real cluster should. Run them on a tree that
holds still (CI's checkout)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="the cluster extra is not installed (pip install 'edgeopt[cluster]')")

EDGEOPT = [sys.executable, "-m", "edgeopt.cli"]
READY_S = 180  # how long a process may take to start on a loaded machine before the fixture gives up


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A scheduler and its workers, each a process group of its own (killed whole, as a machine dies)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"tcp://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        log = open(root / "scheduler.log", "w")  # noqa: SIM115 - closed with the process
        self.procs["scheduler"] = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
             str(self.port), "--no-dashboard"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.client = None

    def worker(self, name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        store = self.root / f"store-{name}"
        store.mkdir(exist_ok=True)
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([*EDGEOPT, "worker", "--scheduler", self.url, "--name", name, *args],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "EDGEOPT_CACHE_DIR": str(store), **(env or {})})
        self.procs[name] = proc
        return proc

    def connect(self):
        from distributed import Client

        if self.client is None:
            deadline = time.monotonic() + READY_S
            while True:
                try:
                    self.client = Client(self.url, timeout=10, set_as_default=False)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
        return self.client

    def wait_for(self, *names: str) -> dict[str, dict]:
        """Block until these workers are registered; their scheduler_info entries by name."""
        client = self.connect()
        deadline = time.monotonic() + READY_S
        while True:
            by_name = {str(w["name"]): {**w, "address": a} for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
            if all(n in by_name for n in names):
                return by_name
            for n in names:
                p = self.procs.get(n)
                if p is not None and p.poll() is not None:
                    raise RuntimeError(f"worker {n} exited: {(self.root / f'{n}.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers {names} not registered after {READY_S} s")
            time.sleep(0.3)

    def wait_gone(self, name: str) -> None:
        client = self.connect()
        deadline = time.monotonic() + READY_S
        while any(str(w["name"]) == name for w in client.scheduler_info(n_workers=-1)["workers"].values()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {name} still registered")
            time.sleep(0.3)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs[name]
        os.killpg(proc.pid, sig)
        if sig == signal.SIGKILL:
            proc.wait(timeout=60)

    def events(self) -> list[dict]:
        from edgeopt.cluster.task import TOPIC

        return [msg for _, msg in self.connect().get_events(TOPIC)]

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        for _name, proc in reversed(list(self.procs.items())):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(timeout=60)


@pytest.fixture(scope="module")  # gone before the rest of the suite runs (four processes, ~600 MB)
def cluster(tmp_path_factory):
    """Scheduler + three workers: `wa` offers every backend that builds here, `wb` ONNX Runtime (and OpenVINO at
    other versions: never given this host's jobs), `wt` only one TensorRT engine slot (declared: no GPU here) with
    2 threads."""
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        c.connect()
        c.worker("wa")
        # wb also offers OpenVINO under another version hash: as a worker with other converter versions shows
        c.worker("wb", "--only", "onnxruntime", "--resources", "openvino@00000000=1")
        c.worker("wt", "--only", "onnxruntime", "--resources", "onnxruntime=0 tensorrt=1", "--nthreads", "2")
        c.wait_for("wa", "wb", "wt")
        yield c
    finally:
        c.close()


@pytest.fixture
def own_cluster(tmp_path):
    """A scheduler of the test's own, for faults that end workers."""
    c = Cluster(tmp_path)
    try:
        c.connect()
        yield c
    finally:
        c.close()
