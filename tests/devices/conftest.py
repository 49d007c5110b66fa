"""Fixtures for the device tests: real OpenSSH servers on 127.0.0.1 with generated keys, real bundles.

Each ``Sshd`` is ``/usr/sbin/sshd -D -e -f CONFIG`` with its own host key, port, authorized_keys and
pid file, key authentication only.  Tests run as root in CI, so the config permits root logins by
key (never by password); as another user, sshd logs in that same user.  The device's python is
this interpreter (it has numpy and the runtimes) and every agent root lives in ``tmp_path``.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import fixture

SSHD = "/usr/sbin/sshd"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def keygen(path: Path, kind: str = "ed25519") -> Path:
    """A new passphrase-less key pair at ``path`` / ``path.pub``."""
    path.unlink(missing_ok=True)
    Path(f"{path}.pub").unlink(missing_ok=True)
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "edgeopt-test", "-f", str(path)], check=True)
    return path


def _release_pyenv_lock() -> None:
    """A session SIGKILLed while its login shell ran ``pyenv rehash`` (this image's .bashrc runs it at every
    login) leaves pyenv's lock file behind, and every later login waits on it (seen: a gate test hung 300 s).
    Remove it when no rehash is running. Test machinery only: nothing of edgeopt's runs pyenv."""
    lock = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "shims" / ".pyenv-shim"
    if not lock.exists():
        return
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and b"pyenv-rehash" in Path(f"/proc/{d}/cmdline").read_bytes():
                return
        except OSError:
            continue
    lock.unlink(missing_ok=True)


class Sshd:
    """One sshd on 127.0.0.1: start, stop (the whole process tree, as a crash would), restart."""

    def __init__(self, workdir: Path, authorized: list[Path], port: int | None = None) -> None:
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or _free_port()
        self.host_key = self.dir / "host_ed25519"
        if not self.host_key.exists():
            keygen(self.host_key)
        (self.dir / "authorized_keys").write_text("".join(Path(f"{k}.pub").read_text() for k in authorized))
        self.config = self.dir / "sshd_config"
        self.config.write_text("\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {self.host_key}",
            f"PidFile {self.dir / 'sshd.pid'}", f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
            "UsePAM no", "StrictModes no", "PermitRootLogin prohibit-password", "PubkeyAuthentication yes",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "Subsystem sftp internal-sftp",
            "MaxStartups 100", "MaxSessions 100", "LogLevel VERBOSE",
            # this image's .bashrc runs `pyenv rehash` at every login; never wait a minute on its lock
            "SetEnv PYENV_REHASH_TIMEOUT=1", ""]))
        self.proc: subprocess.Popen | None = None

    @property
    def host_key_line(self) -> str:
        """This server's known_hosts line."""
        kind, b64 = Path(f"{self.host_key}.pub").read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {b64}\n"

    def start(self) -> Sshd:
        log = open(self.dir / "sshd.log", "ab")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)], stdout=log, stderr=log)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.dir / 'sshd.log').read_text()[-800:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not come up")

    def descendants(self) -> list[int]:
        """Pids of the session processes this sshd forked (read from /proc)."""
        if self.proc is None:
            return []
        children: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    stat = Path(f"/proc/{d}/stat").read_text()
                except OSError:
                    continue
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(d))
        out, todo = [], [self.proc.pid]
        while todo:
            for c in children.get(todo.pop(), []):
                out.append(c)
                todo.append(c)
        return out

    def kill(self) -> None:
        """SIGKILL the listener and every session it forked: every connection drops at once."""
        if self.proc is None:
            return
        pids = self.descendants()
        for pid in [self.proc.pid, *pids]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.proc = None
        _release_pyenv_lock()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


@pytest.fixture(scope="session")
def ssh_env(tmp_path_factory):
    """Skip unless a real sshd can run here; the user key, a wrong key, and a factory of servers."""
    if not os.path.exists(SSHD) or not shutil.which("ssh-keygen"):
        pytest.skip("OpenSSH server not installed (apt-get install openssh-server; .ci/run does it)")
    if os.geteuid() == 0 and not os.path.isdir("/run/sshd"):
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation dir (made by its package)
    base = tmp_path_factory.mktemp("ssh")
    user_key = keygen(base / "id_ed25519")
    wrong_key = keygen(base / "wrong_ed25519")
    servers: list[Sshd] = []

    def make(name: str) -> Sshd:
        s = Sshd(base / name, [user_key])
        servers.append(s)
        return s.start()

    env = type("SshEnv", (), {"base": base, "user_key": user_key, "wrong_key": wrong_key, "make": staticmethod(make),
                              "user": getpass.getuser()})
    yield env
    for s in servers:
        s.stop()


@pytest.fixture(scope="session")
def sshd(ssh_env) -> Sshd:
    """A server shared by the tests that only read from it."""
    return ssh_env.make("main")


@pytest.fixture(autouse=True)
def _no_ssh_agent(monkeypatch):
    """Auth must come from the inventory's key, not from a developer's running ssh-agent."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def known_hosts(path: Path, *servers: Sshd) -> Path:
    path.write_text("".join(s.host_key_line for s in servers))
    return path


def device_entry(ssh_env, server: Sshd, root: Path, known: Path, **extra) -> dict:
    """One inventory entry for ``server``: key auth, this interpreter, a tmp agent root, no ~/.ssh/config."""
    return {"host": "127.0.0.1", "port": server.port, "user": ssh_env.user, "key_file": str(ssh_env.user_key),
            "python": sys.executable, "root": str(root), "known_hosts": str(known), "ssh_config": "none",
            "connect_timeout": 5, **extra}


def write_inventory(path: Path, devices: dict[str, dict]) -> Path:
    path.write_text(yaml.safe_dump({"devices": devices}, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def cls_bundle(tmp_path_factory) -> Path:
    """The real text-orientation classifier built for `cpu` fp32 from real images (shared, built once)."""
    from edgeopt.pipeline import build

    out = tmp_path_factory.mktemp("dist")
    rep = build(fixture("ocr-cls"), "cpu", shapes={"x": [1, 3, 48, 192]}, calib=str(fixture("images")),
                preprocess="preset=pm1", out=out, n_calib=4, n_val=4)
    assert rep.ok, rep.results
    return Path(rep.results[0].bundle)


@pytest.fixture(scope="session")
def big_bundle(tmp_path_factory, images_dir) -> Path:
    """A real bundle with a 25 MB artifact (an ONNX MatMul with a large weight), to interrupt uploads."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgeopt.pipeline import build

    d = tmp_path_factory.mktemp("big")
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array((rng.standard_normal((3 * 32 * 32, 2048)) * 0.02).astype(np.float32), "w")
    nodes = [helper.make_node("Flatten", ["x"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "w"], ["y"], name="matmul")]
    g = helper.make_graph(nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2048])], initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(d / "big.onnx"))
    rep = build(d / "big.onnx", "cpu", calib=str(images_dir), preprocess="preset=unit", out=d / "dist",
                n_calib=2, n_val=2)
    assert rep.ok, rep.results
    return Path(rep.results[0].bundle)


@pytest.fixture
def small_fs(tmp_path):
    """A callable mounting a tmpfs of ``mb`` megabytes at ``tmp_path/small`` (skips without root)."""
    mnt = tmp_path / "small"
    mnt.mkdir()

    def mount(mb: int) -> Path:
        p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(mnt)], capture_output=True,
                           text=True)
        if p.returncode:
            pytest.skip(f"cannot mount a small tmpfs here (needs root): {p.stderr.strip()[:200]}")
        return mnt

    yield mount
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
