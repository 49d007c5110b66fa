"""How the host reaches a device: one interface, two transports (``local`` subprocess, SSH).

``Transport.run(argv, stdin) -> (rc, out, err)`` runs a command (each argument quoted with
``shlex.quote`` on SSH), and ``put / stat / mkdir / rename / listdir / remove_tree`` move files.
Everything above this module (push, bench) is shared by both transports.

SSH (paramiko): host keys are checked against known_hosts; an unknown key is refused unless trust
on first use was asked for (then it is recorded), a changed key is always refused.  Authentication
is by key file or ssh-agent, never by password.  ``~/.ssh/config`` is honoured (HostName, Port,
User, IdentityFile, UserKnownHostsFile, ProxyCommand, ProxyJump with any number of hops, each hop's key
checked like the device's, ConnectTimeout).
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import shlex
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgeopt.errors import DeviceError, HostKeyError, MissingDependency
from edgeopt.inventory import Device

log = logging.getLogger(__name__)

Callback = Callable[[int, int], None]  # (bytes sent so far, total)


class DeviceTimeout(DeviceError):
    """A command on the device ran past its timeout."""


class ConnectionLost(DeviceError):
    """The connection dropped in the middle of an operation."""


class SilentPort(DeviceError):
    """The port accepted TCP but no SSH banner came: reported once, not retried like a booting device."""


class AuthFailed(DeviceError):
    """The device refused our key (or the key cannot be used): retrying will not help."""


@dataclass(frozen=True)
class RemoteStat:
    size: int
    is_dir: bool
    mtime: float


class Transport:
    """The common interface; paths are POSIX paths on the device."""

    device: Device

    def run(self, argv: list[str], stdin: str | bytes | None = None, cwd: str | None = None,
            timeout: float | None = None) -> tuple[int, str, str]:
        """Run ``argv`` (in ``cwd``) and return ``(exit code, stdout, stderr)``; raises DeviceTimeout."""
        raise NotImplementedError

    def put(self, local: str | os.PathLike, remote: str, callback: Callback | None = None) -> int:
        """Copy one file to the device; returns the bytes sent."""
        raise NotImplementedError

    def stat(self, remote: str) -> RemoteStat | None:
        raise NotImplementedError

    def mkdir(self, remote: str) -> None:
        """Create a directory and its parents (no error when it exists)."""
        raise NotImplementedError

    def rename(self, src: str, dst: str) -> None:
        """Atomic rename on the device; fails when ``dst`` exists."""
        raise NotImplementedError

    def listdir(self, remote: str) -> list[str]:
        raise NotImplementedError

    def remove_tree(self, remote: str) -> None:
        raise NotImplementedError

    def home(self) -> str:
        raise NotImplementedError

    def expand(self, path: str) -> str:
        """An absolute path on the device (``~`` expanded): quoted paths are never expanded by a shell."""
        if path == "~" or path.startswith("~/"):
            path = self.home() + path[1:]
        if not path.startswith("/"):
            path = posixpath.join(self.home(), path)
        return posixpath.normpath(path)

    def close(self) -> None:
        pass

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def require_paramiko():
    """paramiko, or one line naming the extra that brings it (a core install has no SSH)."""
    try:
        import paramiko
    except ImportError:
        raise MissingDependency("SSH devices need paramiko, which is not installed",
                                hint="pip install 'edgeopt[devices]' (or use `--devices local`)") from None
    return paramiko


def shell_command(argv: list[str], cwd: str | None = None) -> str:
    """One POSIX shell line with every argument quoted."""
    cmd = " ".join(shlex.quote(a) for a in argv)
    return f"cd {shlex.quote(cwd)} && {cmd}" if cwd else cmd


# --- local ----------------------------------------------------------------------------------
class LocalTransport(Transport):
    """The ``local`` device: commands are subprocesses of this host, files are copied."""

    def __init__(self, device: Device) -> None:
        self.device = device

    def run(self, argv, stdin=None, cwd=None, timeout=None):
        data = stdin.encode() if isinstance(stdin, str) else stdin
        limit = timeout or self.device.command_timeout
        if cwd and not os.path.isdir(cwd):
            return 1, "", f"cd: {cwd}: No such file or directory"  # what a shell would say
        try:
            proc = subprocess.run(argv, input=data, cwd=cwd, capture_output=True, timeout=limit)
        except subprocess.TimeoutExpired:
            raise DeviceTimeout(f"{self.device.name}: `{shell_command(argv)}` ran past {limit:.0f}s "
                                "and was killed") from None
        except FileNotFoundError as exc:
            return 127, "", f"{argv[0]}: {exc.strerror}: not found"
        return proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")

    def put(self, local, remote, callback=None):
        shutil.copyfile(local, remote)
        size = os.path.getsize(remote)
        if callback:
            callback(size, size)
        return size

    def stat(self, remote):
        try:
            st = os.stat(remote)
        except FileNotFoundError:
            return None
        import stat as st_mod

        return RemoteStat(st.st_size, st_mod.S_ISDIR(st.st_mode), st.st_mtime)

    def mkdir(self, remote):
        try:
            os.makedirs(remote, exist_ok=True, mode=0o700)  # the agent's tree is private to its user
        except OSError as exc:  # as over SSH: the device's problem, one line, not a crash of the whole run
            raise DeviceError(f"{self.device.name}: cannot create {remote}: {exc.strerror or exc}",
                              hint="check the permissions of the agent root (`root:` in the inventory)") from None

    def rename(self, src, dst):
        if os.path.exists(dst):
            raise FileExistsError(dst)
        os.rename(src, dst)

    def listdir(self, remote):
        return sorted(os.listdir(remote))

    def remove_tree(self, remote):
        shutil.rmtree(remote, ignore_errors=True)

    def home(self):
        return str(Path.home())


# --- SSH ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SshParams:
    """Where and how to connect, after ``~/.ssh/config`` has filled what the inventory left out."""

    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]
    known_hosts: str
    connect_timeout: float
    proxy_command: str | None = None
    jumps: tuple[JumpHop, ...] = ()  # ProxyJump hops, first to last (the device is reached through the last)


@dataclass(frozen=True)
class JumpHop:
    """One ProxyJump host, as ``~/.ssh/config`` resolves it (its own HostName/Port/User/IdentityFile)."""

    spec: str
    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]


def ssh_params(device: Device) -> SshParams:
    """Merge the inventory entry with ``~/.ssh/config`` (the inventory wins, as ``ssh -p`` would)."""
    import getpass

    cfg: dict = {}
    cfg_path = device.ssh_config or "~/.ssh/config"
    if cfg_path != "none" and Path(cfg_path).expanduser().is_file():
        paramiko = require_paramiko()

        try:
            cfg = paramiko.SSHConfig.from_path(str(Path(cfg_path).expanduser())).lookup(device.host or "")
        except Exception as exc:  # paramiko raises several kinds on a malformed file
            raise DeviceError(f"cannot read ssh config {cfg_path}: {exc}") from None
    hostname = cfg.get("hostname") or device.host or ""
    try:
        port = device.port or int(cfg.get("port", 22))
    except ValueError:
        raise DeviceError(f"{device.name}: bad Port in {cfg_path}") from None
    keys = [device.key_file] if device.key_file else list(cfg.get("identityfile") or [])
    known = device.known_hosts or (cfg.get("userknownhostsfile") or "~/.ssh/known_hosts").split()[0]
    timeout = device.connect_timeout
    if "connecttimeout" in cfg and device.connect_timeout == Device.connect_timeout:
        timeout = float(cfg["connecttimeout"])
    user = device.user or cfg.get("user") or getpass.getuser()
    key_files = tuple(str(Path(k).expanduser()) for k in keys)
    jumps: tuple[JumpHop, ...] = ()
    jump_spec = cfg.get("proxyjump")
    if jump_spec and jump_spec.strip().lower() != "none" and not cfg.get("proxycommand"):
        jumps = tuple(_jump_hop(h.strip(), cfg_path, user, key_files, device.name)
                      for h in jump_spec.split(",") if h.strip())
    return SshParams(hostname=hostname, port=port, user=user, key_files=key_files,
                     known_hosts=str(Path(known).expanduser()), connect_timeout=timeout,
                     proxy_command=cfg.get("proxycommand"), jumps=jumps)


def _jump_hop(spec: str, cfg_path: str, user: str, key_files: tuple[str, ...], name: str) -> JumpHop:
    """``[user@]host[:port]`` (or ``ssh://user@host:port``), completed from the ssh config's entry for host."""
    import re

    m = re.fullmatch(r"(?:ssh://)?(?:([^@\s]+)@)?(\[[^\]]+\]|[^:@\s]+)(?::(\d+))?", spec)
    if not m:
        raise DeviceError(f"{name}: cannot read the ProxyJump hop {spec!r} in {cfg_path}",
                          hint="ProxyJump takes [user@]host[:port], comma-separated")
    hop_user, host, hop_port = m.group(1), m.group(2).strip("[]"), m.group(3)
    cfg: dict = {}
    if Path(cfg_path).expanduser().is_file():
        paramiko = require_paramiko()
        with contextlib.suppress(Exception):
            cfg = paramiko.SSHConfig.from_path(str(Path(cfg_path).expanduser())).lookup(host)
    keys = tuple(str(Path(k).expanduser()) for k in cfg.get("identityfile") or []) or key_files
    try:
        port = int(hop_port or cfg.get("port", 22))
    except ValueError:
        raise DeviceError(f"{name}: bad Port for the jump host {host} in {cfg_path}") from None
    return JumpHop(spec=spec, hostname=cfg.get("hostname") or host, port=port,
                   user=hop_user or cfg.get("user") or user, key_files=keys)


def _known_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


def _names_match(patterns: list[str], *names: str) -> bool:
    """Whether a known_hosts line's host patterns (``*``/``?`` wildcards, ``!`` negation) name this host."""
    import re

    hit = False
    for pat in patterns:
        neg = pat.startswith("!")
        rx = re.escape(pat.lstrip("!").lower()).replace(r"\*", ".*").replace(r"\?", ".")  # only * and ?, as ssh
        if any(re.fullmatch(rx, n.lower()) for n in names):
            if neg:
                return False
            hit = True
    return hit


def _fingerprint(key) -> str:
    import base64
    import hashlib

    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


class SshTransport(Transport):
    """A device over SSH: one connection for commands (exec channels) and files (SFTP)."""

    def __init__(self, device: Device, trust_new_host_keys: bool = False) -> None:
        self.device = device
        self.params = ssh_params(device)
        self.trust_new = trust_new_host_keys
        self.new_host_key: str | None = None  # the fingerprint recorded on first use, if any
        self._client = None
        self._sftp = None
        self._home: str | None = None
        self.ca_skipped: list[int] = []  # known_hosts lines (@cert-authority for this host) that could not be used
        self.revoked: list = []  # keys known_hosts marks @revoked: never accepted, never recorded
        self._jump_clients: list = []  # ProxyJump hops, closed with the connection

    # connection ---------------------------------------------------------------------------
    def connect(self) -> SshTransport:
        """Open the connection; host key and authentication failures raise at once (no retry)."""
        try:
            return self._connect()
        except BaseException:
            self._close_jumps()
            raise

    def _connect(self) -> SshTransport:
        paramiko = require_paramiko()

        p, name = self.params, self.device.name
        missing = [k for k in p.key_files if self.device.key_file and not os.path.isfile(k)]
        if missing:  # a configuration error, not a network one: refused at once, never retried
            raise AuthFailed(f"{name}: key file {missing[0]} not found",
                             hint="fix key_file / ansible_ssh_private_key_file in the inventory")
        client = paramiko.SSHClient()
        revoked: list = []
        if os.path.isfile(p.known_hosts):
            try:
                revoked = self.revoked = self._load_known_hosts(client.get_host_keys())
            except OSError as exc:
                raise HostKeyError(f"{name}: cannot read known_hosts {p.known_hosts}: {exc}") from None
        client.set_missing_host_key_policy(_TrustOnFirstUse(self) if self.trust_new else _Refuse(self))
        sock = paramiko.ProxyCommand(p.proxy_command) if p.proxy_command else None
        if p.jumps:  # ProxyJump: the device is reached only through the jump host(s), never directly
            sock = self._through_jumps(paramiko, revoked)
        t0 = time.perf_counter()
        try:
            client.connect(p.hostname, port=p.port, username=p.user, key_filename=list(p.key_files) or None,
                           timeout=p.connect_timeout, banner_timeout=p.connect_timeout,
                           auth_timeout=p.connect_timeout, channel_timeout=p.connect_timeout,
                           allow_agent=True, look_for_keys=not p.key_files, sock=sock)
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(
                f"{name}: the host key of {_known_name(p.hostname, p.port)} has CHANGED "
                f"(now {exc.key.get_name()} {_fingerprint(exc.key)}); refusing to connect",
                hint=f"if the device was really reinstalled, remove its old line from {p.known_hosts} "
                     f"(ssh-keygen -R '{_known_name(p.hostname, p.port)}' -f {p.known_hosts}); "
                     "otherwise someone may be intercepting the connection") from None
        except HostKeyError:
            client.close()
            raise
        except paramiko.PasswordRequiredException:
            client.close()
            raise AuthFailed(f"{name}: the key file {', '.join(p.key_files)} is encrypted",
                              hint="load it into ssh-agent (ssh-add); edgeopt never asks for passphrases") from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise AuthFailed(f"{name}: authentication as {p.user!r} on {p.hostname}:{p.port} failed ({exc})",
                              hint="check key_file / ansible_ssh_private_key_file and the device's "
                                   "authorized_keys, or load the key into ssh-agent") from None
        except TimeoutError as exc:
            client.close()
            raise DeviceError(f"{name}: no answer from {p.hostname}:{p.port} within {p.connect_timeout:.0f}s "
                              f"({exc or 'timed out'})", hint="is the device on and reachable?") from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            client.close()
            waited = time.perf_counter() - t0
            if "protocol banner" in str(exc) or (isinstance(exc, paramiko.SSHException) and
                                                 waited >= 0.9 * p.connect_timeout):
                # TCP answered, SSH never did within the timeout: retrying will not help
                raise SilentPort(f"{name}: {p.hostname}:{p.port} accepted the connection but never spoke SSH "
                                 f"within {p.connect_timeout:.0f}s",
                                 hint="is this the device's SSH port? something else listens there") from None
            raise DeviceError(f"{name}: cannot connect to {p.hostname}:{p.port}: {exc}",
                              hint="is the device on, is sshd running, is the port right?") from None
        except Exception as exc:  # paramiko on a malformed packet (an empty one: IndexError in packet.py)
            client.close()
            raise DeviceError(f"{name}: the SSH handshake with {p.hostname}:{p.port} failed "
                              f"({type(exc).__name__}: {exc})",
                              hint="is this the device's SSH port? something that is not sshd answers there") from None
        tr = client.get_transport()
        offered = tr.get_remote_server_key() if tr is not None else None
        if offered is not None and any(k == offered for k in revoked):
            client.close()
            raise HostKeyError(f"{name}: the host key of {_known_name(p.hostname, p.port)} ({offered.get_name()} "
                               f"{_fingerprint(offered)}) is marked @revoked in {p.known_hosts}; refusing to connect",
                               hint="the key was revoked on purpose: give the device a new host key and record it "
                                    "(ssh-keyscan), or ask who revoked it")
        log.debug("%s: connected in %.3fs", name, time.perf_counter() - t0)
        if tr is not None:
            tr.set_keepalive(15)
        self._client = client
        return self

    def _through_jumps(self, paramiko, revoked: list):
        """Connect hop by hop (each jump host's key checked against the same known_hosts, the same
        trust rules) and return a channel to the device from the last hop."""
        p, name = self.params, self.device.name
        sock = None
        for i, hop in enumerate(p.jumps):
            nxt = p.jumps[i + 1] if i + 1 < len(p.jumps) else None
            dest = (nxt.hostname, nxt.port) if nxt else (p.hostname, p.port)
            client = paramiko.SSHClient()
            if os.path.isfile(p.known_hosts):
                self._load_known_hosts(client.get_host_keys(), hop.hostname, hop.port)
            client.set_missing_host_key_policy(_TrustOnFirstUse(self) if self.trust_new else _Refuse(self))
            self._jump_clients.append(client)
            try:
                client.connect(hop.hostname, port=hop.port, username=hop.user,
                               key_filename=list(hop.key_files) or None, timeout=p.connect_timeout,
                               banner_timeout=p.connect_timeout, auth_timeout=p.connect_timeout,
                               channel_timeout=p.connect_timeout, allow_agent=True,
                               look_for_keys=not hop.key_files, sock=sock)
                offered = client.get_transport().get_remote_server_key()
                if any(k == offered for k in self.revoked):
                    raise HostKeyError(f"{name}: the host key of the jump host {hop.spec} ({_fingerprint(offered)}) "
                                       f"is marked @revoked in {p.known_hosts}; refusing to connect")
                sock = client.get_transport().open_channel("direct-tcpip", dest, ("127.0.0.1", 0),
                                                           timeout=p.connect_timeout)
            except HostKeyError:
                self._close_jumps()
                raise
            except paramiko.BadHostKeyException as exc:
                self._close_jumps()
                raise HostKeyError(f"{name}: the host key of the jump host {hop.spec} has CHANGED (now "
                                   f"{exc.key.get_name()} {_fingerprint(exc.key)}); refusing to connect",
                                   hint="if it was really reinstalled, remove its old line from "
                                        f"{p.known_hosts}") from None
            except paramiko.AuthenticationException as exc:
                self._close_jumps()
                raise AuthFailed(f"{name}: authentication as {hop.user!r} on the jump host {hop.spec} failed ({exc})",
                                 hint="check the jump host's IdentityFile/User in the ssh config") from None
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self._close_jumps()
                what = f"cannot connect to the jump host {hop.spec} ({hop.hostname}:{hop.port})"
                if isinstance(exc, paramiko.ChannelException) or "forward" in str(exc).lower():
                    what = f"the jump host {hop.spec} would not forward to {dest[0]}:{dest[1]}"
                raise DeviceError(f"{name}: {what}: {str(exc).strip() or type(exc).__name__}; the device is not contacted "
                                  "directly (ProxyJump)",
                                  hint="is the jump host up, does it allow TCP forwarding (AllowTcpForwarding)?"
                                  ) from None
        return sock

    def _close_jumps(self) -> None:
        for c in reversed(self._jump_clients):
            with contextlib.suppress(Exception):
                c.close()
        self._jump_clients = []

    def _load_known_hosts(self, host_keys, hostname: str | None = None, port: int | None = None) -> list:
        """Read known_hosts as OpenSSH does: plain and hashed lines are host keys; ``@revoked`` lines are
        keys never accepted (returned); ``@cert-authority`` lines need host certificates, which paramiko
        cannot verify: skipped, with a warning when they name this host (its own key line still works);
        a line that does not parse is skipped, as OpenSSH skips it, and never breaks the other hosts."""
        from paramiko.hostkeys import HostKeyEntry

        p, revoked = self.params, []
        hostname, port = hostname or p.hostname, port or p.port
        me = _known_name(hostname, port)
        with open(p.known_hosts, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
        for lineno, raw in enumerate(lines, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            marker = None
            if line.startswith("@"):
                marker, _, line = line.partition(" ")
                line = line.strip()
            try:
                entry = HostKeyEntry.from_line(" ".join(line.split()), lineno)
            except Exception as exc:  # a key paramiko cannot decode: OpenSSH skips the line too
                log.warning("%s: line %d of %s skipped: %s", self.device.name, lineno, p.known_hosts,
                            str(exc).strip() or type(exc).__name__)
                continue
            if entry is None or entry.key is None:
                continue
            if marker == "@revoked":
                revoked.append(entry.key)
            elif marker == "@cert-authority":
                if _names_match(entry.hostnames, me, hostname):
                    self.ca_skipped.append(lineno)
                    log.warning("%s: line %d of %s is a @cert-authority for this host; edgeopt cannot verify host "
                                "certificates, so only a plain key line for it is accepted", self.device.name,
                                lineno, p.known_hosts)
            elif marker is None:
                for host in entry.hostnames:
                    host_keys.add(host, entry.key.get_name(), entry.key)
            else:
                log.warning("%s: line %d of %s has an unknown marker %s; skipped", self.device.name, lineno,
                            p.known_hosts, marker)
        return revoked

    def close(self) -> None:
        for obj in (self._sftp, self._client):
            try:
                if obj is not None:
                    obj.close()
            except Exception:  # closing a dead connection must not mask the real error
                pass
        self._sftp = self._client = None
        self._close_jumps()

    def abort(self) -> None:
        """Drop the connection at once (used to interrupt an upload from another thread)."""
        if self._client is not None and self._client.get_transport() is not None:
            self._client.get_transport().close()

    @property
    def sftp(self):
        if self._client is None:
            raise ConnectionLost(f"{self.device.name}: not connected")
        if self._sftp is None:
            try:
                self._sftp = self._client.open_sftp()
            except Exception as exc:
                raise ConnectionLost(f"{self.device.name}: cannot open SFTP: {exc}",
                                     hint="the device's sshd needs the sftp subsystem") from None
        return self._sftp

    def _lost(self, what: str, exc: BaseException) -> ConnectionLost:
        return ConnectionLost(f"{self.device.name}: connection lost during {what}: "
                              f"{str(exc).strip() or type(exc).__name__}",
                              hint="re-run: finished parts are skipped, unfinished ones were never installed")

    def _link_gone(self, wait_s: float = 1.0) -> bool:
        """Whether the SSH connection is dead (given a moment for paramiko to notice the closed socket).
        A command killed by a signal on a live link also ends without an exit status: that is not this."""
        deadline = time.monotonic() + wait_s
        while True:
            t = self._client.get_transport() if self._client is not None else None
            if t is None or not t.is_active():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    # commands -----------------------------------------------------------------------------
    def run(self, argv, stdin=None, cwd=None, timeout=None):
        paramiko = require_paramiko()

        timeout = timeout or self.device.command_timeout
        cmd = shell_command(argv, cwd)
        if self._client is None or self._client.get_transport() is None:
            raise ConnectionLost(f"{self.device.name}: not connected")
        try:
            chan = self._client.get_transport().open_session(timeout=self.params.connect_timeout)
            chan.settimeout(0.2)
            chan.exec_command(cmd)
            if stdin is not None:
                chan.sendall(stdin.encode() if isinstance(stdin, str) else stdin)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout
            while True:
                got = False
                while chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if chan.closed and not got:
                    break
                if time.monotonic() > deadline:
                    chan.close()
                    raise DeviceTimeout(f"{self.device.name}: `{cmd}` ran past {timeout:.0f}s; gave up on it",
                                        hint="raise command_timeout for this device or --timeout")
                if not got:
                    time.sleep(0.01)
            rc = chan.recv_exit_status() if chan.exit_status_ready() else -1
            chan.close()
            if rc == -1 and self._link_gone():  # no exit status because sshd or the link died, not the command
                raise self._lost(f"`{cmd}`", EOFError("the session closed before the command finished"))
        except DeviceError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise self._lost(f"`{cmd}`", exc) from None
        return rc, out.decode(errors="replace"), err.decode(errors="replace")

    # files --------------------------------------------------------------------------------
    def put(self, local, remote, callback=None):
        """SFTP upload with a progress deadline: when no byte moves for ``transfer_stall_timeout`` seconds
        (a device whose network froze: TCP alone notices after minutes), the connection is closed, the
        upload fails as a lost connection, and the staging rules leave nothing half-installed."""
        size = os.path.getsize(local)
        stall = float(self.device.transfer_stall_timeout)
        last = [time.monotonic(), 0]
        stalled = threading.Event()
        done = threading.Event()

        def progress(sent: int, total: int) -> None:
            last[0], last[1] = time.monotonic(), sent
            if callback:
                callback(sent, total)

        def watch() -> None:
            while not done.wait(min(1.0, stall / 4)):
                if time.monotonic() - last[0] > stall:
                    stalled.set()
                    with contextlib.suppress(Exception):  # unblocks the put: its socket is gone
                        self._client.get_transport().close()
                    return

        threading.Thread(target=watch, name=f"stall-{self.device.name}", daemon=True).start()
        name = os.path.basename(str(local))
        try:
            self.sftp.put(str(local), remote, callback=progress, confirm=True)
        except DeviceError:
            raise
        except Exception as exc:  # paramiko/socket errors of many kinds: the connection is gone
            if stalled.is_set():
                raise ConnectionLost(
                    f"{self.device.name}: the upload of {name} made no progress for {stall:g}s ({last[1]} of "
                    f"{size} bytes sent); the connection was closed",
                    hint="the device or its network froze; re-run when it answers (nothing was half-installed), "
                         "or raise transfer_stall_timeout for a slow link") from None
            t = self._client.get_transport() if self._client is not None else None
            if isinstance(exc, OSError) and t is not None and t.is_active():
                # the link is fine: the device could not write (SFTP says only "Failure" for ENOSPC/EACCES)
                raise DeviceError(f"{self.device.name}: the device could not write {name} after {last[1]} of "
                                  f"{size} bytes ({str(exc).strip() or type(exc).__name__})",
                                  hint="is its disk full or the agent root read-only? nothing was half-installed; "
                                       "`edgeopt devices gc` frees space") from None
            raise self._lost(f"the upload of {name}", exc) from None
        finally:
            done.set()
        return size

    def stat(self, remote):
        import stat as st_mod

        try:
            st = self.sftp.stat(remote)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if getattr(exc, "errno", None) == 2:
                return None
            raise self._lost(f"stat {remote}", exc) from None
        except Exception as exc:
            raise self._lost(f"stat {remote}", exc) from None
        return RemoteStat(st.st_size or 0, st_mod.S_ISDIR(st.st_mode or 0), float(st.st_mtime or 0))

    def mkdir(self, remote):
        parts, path = [], remote
        while path not in ("", "/") and self.stat(path) is None:
            parts.append(path)
            path = posixpath.dirname(path)
        for p in reversed(parts):
            try:
                self.sftp.mkdir(p, mode=0o700)  # the agent's tree is private to its user
            except OSError:
                if self.stat(p) is None or not self.stat(p).is_dir:
                    raise DeviceError(f"{self.device.name}: cannot create {p}",
                                      hint="check the permissions of the agent root (`root:` in the inventory)") from None
            except Exception as exc:
                raise self._lost(f"mkdir {p}", exc) from None

    def rename(self, src, dst):
        try:
            self.sftp.rename(src, dst)  # SFTP rename refuses an existing target: what we want
        except OSError:
            raise
        except Exception as exc:
            raise self._lost(f"rename {src}", exc) from None

    def listdir(self, remote):
        try:
            return sorted(self.sftp.listdir(remote))
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise self._lost(f"listdir {remote}", exc) from None

    def remove_tree(self, remote):
        import stat as st_mod

        try:
            for attr in self.sftp.listdir_attr(remote):
                child = posixpath.join(remote, attr.filename)
                if st_mod.S_ISDIR(attr.st_mode or 0):
                    self.remove_tree(child)
                else:
                    self.sftp.remove(child)
            self.sftp.rmdir(remote)
        except FileNotFoundError:
            pass

    def home(self):
        if self._home is None:
            try:
                self._home = self.sftp.normalize(".")
            except Exception as exc:
                raise self._lost("the home-directory lookup", exc) from None
        return self._home


class _Refuse:
    """known_hosts is strict: an unknown key is refused with the fingerprint and how to accept it."""

    def __init__(self, tr: SshTransport) -> None:
        self.tr = tr

    def missing_host_key(self, client, hostname, key) -> None:
        p = self.tr.params
        ca = (f" (line {', '.join(map(str, self.tr.ca_skipped))} names a @cert-authority for it, but edgeopt "
              "cannot verify host certificates)") if self.tr.ca_skipped else ""
        raise HostKeyError(
            f"{self.tr.device.name}: host {hostname} is not in {p.known_hosts}{ca} "
            f"(it offers {key.get_name()} {_fingerprint(key)}); refusing an unknown host key",
            hint="check the fingerprint on the device (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then re-run "
                 "with --trust-new-host-keys to record it, or add it with ssh-keyscan")


class _TrustOnFirstUse:
    """Asked for explicitly: record an unknown key in known_hosts (a changed one is still refused)."""

    def __init__(self, tr: SshTransport) -> None:
        self.tr = tr

    def missing_host_key(self, client, hostname, key) -> None:
        if any(k == key for k in self.tr.revoked):
            raise HostKeyError(f"{self.tr.device.name}: host {hostname} offers {key.get_name()} {_fingerprint(key)}, "
                               f"a key marked @revoked in {self.tr.params.known_hosts}; not recorded, refusing to "
                               "connect", hint="give the device a new host key, or ask who revoked this one")
        path = Path(self.tr.params.known_hosts)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(path, "a") as f:  # append: never rewrite the user's file (comments, hashed entries)
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.tr.new_host_key = f"{key.get_name()} {_fingerprint(key)}"
        log.warning("%s: recorded new host key %s for %s in %s", self.tr.device.name, self.tr.new_host_key,
                    hostname, path)


def connect(device: Device, trust_new_host_keys: bool = False, retries: int = 2,
            progress: Callable[[str], None] = lambda s: None) -> Transport:
    """A connected transport for ``device``; network errors are retried, key errors are not."""
    if device.is_local:
        return LocalTransport(device)
    delay = 1.0
    for attempt in range(retries + 1):
        try:
            return SshTransport(device, trust_new_host_keys).connect()
        except (HostKeyError, AuthFailed, SilentPort):
            raise
        except DeviceError as exc:
            if attempt == retries:
                raise
            progress(f"{device.name}: {exc.message.split(': ', 1)[-1]}; retrying in {delay:.0f}s")
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")
