"""Fixtures of the results tests: a fresh database per test on SQLite and on a real PostgreSQL server
(``EDGEOPT_TEST_PG=postgresql://user@host:port/db``, the password from PGPASSWORD or ~/.pgpass; `.ci/run`
starts the machine's PostgreSQL and sets it), and a TCP relay in front of the server that a test can cut
(the server unreachable, as from a rig whose network went down) or whose connections it can drop."""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Iterator

import pytest

PG = os.environ.get("EDGEOPT_TEST_PG")
NEEDS_PG = pytest.mark.skipif(not PG, reason="EDGEOPT_TEST_PG is not set (a PostgreSQL URL: .ci/run starts the "
                                             "server and sets it)")


def _admin(sql: str) -> None:
    import psycopg

    base = PG.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(base, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql)


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty database on the test server (dropped afterwards)."""
    if not PG:
        pytest.skip("EDGEOPT_TEST_PG is not set (a PostgreSQL URL: .ci/run starts the server and sets it)")
    name = f"edgeopt_t_{uuid.uuid4().hex[:10]}"
    _admin(f"CREATE DATABASE {name}")
    head, _, _ = PG.rpartition("/")
    try:
        yield f"{head}/{name}"
    finally:
        _admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path, monkeypatch) -> str:
    """A fresh results database on each engine; the spool (for the server) in tmp_path."""
    monkeypatch.setenv("EDGEOPT_SPOOL", str(tmp_path / "spool.db"))
    if request.param == "sqlite":
        return str(tmp_path / "runs.db")
    return request.getfixturevalue("pg_url")


class Relay:
    """A TCP relay to the server: ``port`` to connect to; ``cut()`` stops it (refused, as a server down),
    ``drop()`` closes the connections through it (as a network blip), ``restore()`` listens again."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listening = False
        self.restore()

    def restore(self) -> None:
        if self.listening:
            return
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", self.port))
        self.sock.listen(16)
        self.listening = True
        threading.Thread(target=self._accept, args=(self.sock,), daemon=True).start()

    def _accept(self, lsock: socket.socket) -> None:
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            try:
                s = socket.create_connection(self.target, timeout=10)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.conns += [c, s]
            for a, b in ((c, s), (s, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
        except OSError:
            pass
        for x in (a, b):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def drop(self) -> None:
        with self.lock:
            conns, self.conns = self.conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass

    def cut(self) -> None:
        self.listening = False
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread: new connections are refused
        except OSError:
            pass
        self.sock.close()
        self.drop()


@pytest.fixture
def relay(pg_url) -> Iterator[tuple[Relay, str]]:
    """(the relay, the fresh database's URL through it)."""
    from urllib.parse import urlsplit

    parts = urlsplit(pg_url)
    r = Relay(parts.hostname or "localhost", parts.port or 5432)
    netloc = (f"{parts.username}@" if parts.username else "") + f"127.0.0.1:{r.port}"
    try:
        yield r, f"postgresql://{netloc}{parts.path}"
    finally:
        r.cut()


def record(i: int, run_id: str = "run-1", device: str = "rig-a", cpu: str = "Intel Xeon", cores: int = 8,
           labels: tuple[str, ...] = ("lab",), p50: float | None = None, driver: str | None = None,
           model: str = "cls", status: str = "ok") -> dict:
    """A bench record as the fan-out stores it (what `edgeopt bench` writes), with a probe and samples."""
    p = 1.0 + (i % 7) * 0.01 if p50 is None else p50
    return {"run_id": run_id, "time": f"2026-11-{1 + i // 1440 % 28:02d}T{i // 60 % 24:02d}:{i % 60:02d}:00.000000Z",
            "device": {"name": device, "transport": "ssh", "labels": list(labels)},
            "bundle": {"model": model, "target": "cpu", "precision": "fp32", "backend": "onnxruntime",
                       "bundle_id": f"b{i:05d}"},
            "status": status, "error": None,
            "bench": {"latency_ms": {"p50": p, "p90": p * 1.1, "p99": p * 1.3, "p99_9": p * 1.5},
                      "throughput_ips": 1000 / p, "samples_ms": [round(p + (k % 5) * 0.01, 4) for k in range(40)],
                      "load_s": 0.05, "first_inference_ms": 3.0, "inputs": {"batch": 1}},
            "probe": {"arch": "x86_64", "cpu": {"model": cpu, "cores": cores}, "memory_mb": 16000,
                      "gpus": [{"name": "T4", "driver": driver}] if driver else [],
                      "runtimes": {"onnxruntime": "1.20.1"}, "kernel": "6.1"}}
