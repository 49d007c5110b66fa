#!/usr/bin/env python3
"""Bring up an emulated aarch64 board on this host: a Debian arm64 userland run by qemu-user, reached over SSH.

    python scripts/make_device.py --arch arm64 --suite bookworm            # build (or reuse) + start sshd
    python scripts/make_device.py --arch arm64 --suite bookworm --down     # stop sshd, unmount, keep the root
    python scripts/make_device.py --arch arm64 --suite bookworm --purge    # ... and delete the cached root
    python scripts/make_device.py --arch arm64 --suite bookworm --build-only  # build/cache the root (CI setup)

Everything comes from the registries: Debian's packages (``qemu-user-static``, ``binfmt-support`` and
``mmdebstrap`` on the host; ``python3``, ``python3-numpy``, ``python3-venv`` and ``openssh-server`` in the
root, so the device runs the distribution's own Python and numpy) and PyPI (the runtimes' aarch64 wheels,
fetched on the host with ``pip download --platform ...`` and installed ``--no-index`` into a venv inside
the root with ``--system-site-packages``). Root only: binfmt_misc, mmdebstrap's root mode, bind mounts and
chroot need it.

What it does, in order: host tools (apt-get when missing), ``binfmt_misc`` mounted and ``qemu-aarch64``
enabled, the root (built once, then cached under ``$EDGEOPT_DEVICE_CACHE`` or ``~/.cache/edgeopt/devices/``
``<suite>-<arch>/``: a second run reuses it in seconds), /proc, /sys and /dev bind-mounted into it
(ONNX Runtime aborts without /sys/devices/system/cpu), ``sshd`` started in the root on 127.0.0.1:PORT with
its own host key and one authorized key, then an edgeopt inventory (``known_hosts`` strict, that host key
only) written beside the client key. The device's facts then say ``emulated: true`` (the agent's probe
detects qemu-user), so nothing measured there is taken for a latency.

``--json`` prints one object: name, inventory, port, root, python, timings, wheels installed and refused.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ARCHES = {"arm64": {"qemu": "qemu-aarch64", "machine": "aarch64", "wheel": "aarch64"}}
SUITES = {
    # suite -> the distribution's python (for pip download) and the runtimes tried, newest that installs.
    # "pin" is tried first (the host's version where the host has one), then the newest for that Python.
    "bookworm": {"python": "3.11", "glibc": 36},
    "bullseye": {"python": "3.9", "glibc": 31},
}
PACKAGES = ["python3", "python3-numpy", "python3-venv", "openssh-server"]
# The runtimes' pure-Python (or any-platform) dependencies, installed --no-deps so that the distribution's
# numpy stays the one in use (pip would otherwise want a newer numpy than Debian's for some runtimes).
RUNTIMES: dict[str, list[str]] = {
    "onnxruntime": ["coloredlogs", "humanfriendly", "flatbuffers", "packaging", "protobuf", "sympy", "mpmath"],
    "ai-edge-litert": ["backports.strenum", "flatbuffers", "tqdm", "typing-extensions", "protobuf"],
    "openvino": ["openvino-telemetry", "packaging"],
}
VENV = "/opt/edgeopt/venv"
SPEC_VERSION = 1  # bump when what goes into a root changes: an older cached root is rebuilt
HOST_TOOLS = {"mmdebstrap": "mmdebstrap", "update-binfmts": "binfmt-support", "qemu-aarch64-static": "qemu-user-static"}


class DeviceError(Exception):
    """One line for the user (and a hint)."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


def cache_dir() -> Path:
    """Where roots are cached: ``$EDGEOPT_DEVICE_CACHE``, else ``~/.cache/edgeopt/devices`` (not under
    ``$EDGEOPT_CACHE_DIR``, the bundle cache, which tests point at a fresh folder every session)."""
    return Path(os.environ.get("EDGEOPT_DEVICE_CACHE") or Path.home() / ".cache" / "edgeopt" / "devices")


def default_root(suite: str, arch: str) -> Path:
    return cache_dir() / f"{suite}-{arch}"


def _run(cmd: list[str], log: Path | None = None, timeout: float = 3600, **kw: Any) -> subprocess.CompletedProcess:
    """Run a command; on failure raise DeviceError with the tail of its output (kept in ``log`` too)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if log is not None:
        with open(log, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}\n")
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise DeviceError(f"{Path(cmd[0]).name} failed (exit {proc.returncode}): {' | '.join(tail)}",
                          f"full output in {log}" if log else "")
    return proc


# ---- host preparation --------------------------------------------------------------------------------------

def require_root() -> None:
    if os.geteuid() != 0:
        raise DeviceError("make_device needs root (binfmt_misc, mmdebstrap, bind mounts, chroot)",
                          "run it with sudo, or in CI as root")


def host_tools(install: bool = True) -> None:
    """qemu-user-static, binfmt-support and mmdebstrap from Debian's registry, when one is missing."""
    missing = sorted({pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None})
    if not missing:
        return
    if not install or shutil.which("apt-get") is None:
        raise DeviceError(f"missing host packages: {' '.join(missing)}", f"apt-get install {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    _run(["apt-get", "update", "-qq"], env=env)
    _run(["apt-get", "install", "-y", "-qq", *missing], env=env)


def binfmt(arch: str) -> Path:
    """binfmt_misc mounted and the arch's qemu handler enabled; returns the handler's file."""
    qemu = ARCHES[arch]["qemu"]
    mnt = Path("/proc/sys/fs/binfmt_misc")
    if not (mnt / "status").exists():
        try:
            _run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(mnt)])
        except DeviceError as e:
            raise DeviceError(f"binfmt_misc cannot be mounted here: {e}",
                              "a container needs --privileged (or the host's binfmt_misc) for qemu-user") from None
    entry = mnt / qemu
    if not entry.exists() or not entry.read_text().startswith("enabled"):
        subprocess.run(["update-binfmts", "--enable", qemu], capture_output=True, text=True)
    if not entry.exists() or not entry.read_text().startswith("enabled"):
        raise DeviceError(f"the {qemu} binfmt handler is not enabled", f"update-binfmts --enable {qemu}")
    return entry


# ---- the root ------------------------------------------------------------------------------------------------

def _platforms(arch: str, glibc: int) -> list[str]:
    """pip --platform tags this userland's glibc accepts (pip does not expand a manylinux tag itself)."""
    w = ARCHES[arch]["wheel"]
    return [f"manylinux_2_{v}_{w}" for v in range(glibc, 16, -1)] + [f"manylinux2014_{w}", "any"]


def _host_version(dist: str) -> str | None:
    try:
        import importlib.metadata as md

        return md.version(dist)
    except Exception:  # noqa: BLE001 - absent on the host: newest then
        return None


def download_wheels(suite: str, arch: str, dest: Path, log: Path, runtimes: list[str]) -> dict[str, Any]:
    """The runtimes' aarch64 wheels for the suite's Python, each the host's version or else the newest that
    has a wheel for it; returns {"installed": {dist: version}, "refused": {dist: why}}."""
    py = SUITES[suite]["python"]
    plat = [a for p in _platforms(arch, SUITES[suite]["glibc"]) for a in ("--platform", p)]
    base = [sys.executable, "-m", "pip", "download", "-q", "--isolated", "--only-binary=:all:", *plat,
            "--python-version", py, "--no-deps", "-d", str(dest)]
    dest.mkdir(parents=True, exist_ok=True)
    got: dict[str, str] = {}
    refused: dict[str, str] = {}
    for dist in runtimes:
        tries = [f"{dist}=={v}" for v in [_host_version(dist)] if v] + [dist]
        why = ""
        for req in tries:
            try:
                _run([*base, req], log=log, timeout=900)
            except DeviceError as e:
                why = str(e).split(": ", 1)[-1]
                continue
            whl = sorted(dest.glob(f"{dist.replace('-', '_')}-*.whl"))
            got[dist] = whl[-1].name.split("-")[1] if whl else "?"
            break
        if dist not in got:
            refused[dist] = f"no {ARCHES[arch]['wheel']} wheel for Python {py}: {why}"
            continue
        for dep in RUNTIMES.get(dist, []):
            _run([*base, dep], log=log, timeout=900)
    return {"installed": got, "refused": refused}


def _chroot(root: Path, cmd: list[str], log: Path, timeout: float = 3600) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
    return _run(["chroot", str(root), *cmd], log=log, timeout=timeout, env=env)


def apt_sources(suite: str) -> list[str]:
    """sources.list lines for the root from the host's own apt sources (the mirror it is set up to reach),
    main, updates and security; [] (mmdebstrap's defaults) when the host has none to copy."""
    text = ""
    for p in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            text += p.read_text() + "\n"
        except OSError:
            continue
    uris = [u.rstrip("/") for u in re.findall(r"^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+)", text, re.M)]
    main = next((u for u in uris if u.endswith("/debian")), None)
    security = next((u for u in uris if u.endswith("/debian-security")), None)
    if main is None:
        return []
    lines = [f"deb {main} {suite} main", f"deb {main} {suite}-updates main"]
    return lines + ([f"deb {security} {suite}-security main"] if security else [])


def build_root(suite: str, arch: str, root: Path, runtimes: list[str]) -> dict[str, Any]:
    """mmdebstrap the userland, then the venv with the runtimes; built in ROOT.partial, renamed when done."""
    partial = root.with_name(root.name + ".partial")
    log = root.with_name(root.name + ".build.log")
    stage = partial / "etc/edgeopt-userland.json"  # mmdebstrap finished: an interrupted build resumes after it
    t0 = time.monotonic()
    try:
        done = json.loads(stage.read_text())
        assert done["suite"] == suite and done["arch"] == arch and done["packages"] == PACKAGES
        t_debootstrap = float(done["mmdebstrap_s"])
        notes = list(done.get("notes") or [])
        unmount(partial)
    except (OSError, ValueError, KeyError, AssertionError):
        notes = []
        remove_tree(partial)
        log.write_text("")
        sources = apt_sources(suite)
        cmd = ["mmdebstrap", f"--arch={arch}", "--variant=apt", f"--include={','.join(PACKAGES)}", suite, str(partial)]
        try:
            _run([*cmd, *sources], log=log, timeout=3600)
        except DeviceError:
            # the mirror here may not carry the security suite for this arch (bullseye-security arm64: 404):
            # the userland then comes from main + updates alone, said in the root's facts
            if not any("-security" in s for s in sources) or not re.search(r"-security\S* .*\n\s+404", log.read_text()):
                raise
            remove_tree(partial)
            sources = [s for s in sources if "-security" not in s]
            notes.append(f"{suite}-security for {arch} is not on this mirror (404): built from main + updates only")
            _run([*cmd, *sources], log=log, timeout=3600)
        t_debootstrap = time.monotonic() - t0
        stage.write_text(json.dumps({"suite": suite, "arch": arch, "packages": PACKAGES,
                                     "mmdebstrap_s": round(t_debootstrap, 1), "notes": notes}))
    t1 = time.monotonic()
    wheels = partial / "opt/edgeopt/wheels"
    found = download_wheels(suite, arch, wheels, log, runtimes)
    mount_binds(partial)
    try:
        _chroot(partial, ["python3", "-m", "venv", "--system-site-packages", VENV], log)
        names = [f"/opt/edgeopt/wheels/{w.name}" for w in sorted(wheels.glob("*.whl"))]
        if names:
            _chroot(partial, [f"{VENV}/bin/python", "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                              "--disable-pip-version-check", *names], log)
        # each runtime imported once under emulation: one that installs but cannot load is refused, not kept
        for dist in list(found["installed"]):
            module = {"onnxruntime": "onnxruntime", "ai-edge-litert": "ai_edge_litert.interpreter",
                      "openvino": "openvino"}.get(dist, dist.replace("-", "_"))
            try:
                _chroot(partial, [f"{VENV}/bin/python", "-c", f"import {module}"], log, timeout=600)
            except DeviceError as e:
                found["refused"][dist] = f"installed but does not import: {e}"
                del found["installed"][dist]
        facts = json.loads(_chroot(partial, [f"{VENV}/bin/python", "-c",
                                             "import json, platform, numpy; print(json.dumps({'python': "
                                             "platform.python_version(), 'numpy': numpy.__version__, "
                                             "'machine': platform.machine()}))"], log).stdout)
    finally:
        unmount(partial)
    info = {"spec": SPEC_VERSION, "suite": suite, "arch": arch, "packages": PACKAGES, **facts,
            "runtimes": found["installed"], "refused": found["refused"], "notes": notes,
            "build_s": round(t_debootstrap + time.monotonic() - t1, 1), "mmdebstrap_s": round(t_debootstrap, 1),
            "rest_s": round(time.monotonic() - t1, 1),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (partial / "etc/edgeopt-device.json").write_text(json.dumps(info, indent=1))
    remove_tree(root)
    partial.rename(root)
    return info


def root_info(root: Path) -> dict[str, Any] | None:
    try:
        info = json.loads((root / "etc/edgeopt-device.json").read_text())
    except (OSError, ValueError):
        return None
    return info if info.get("spec") == SPEC_VERSION else None


# ---- mounts and sshd ------------------------------------------------------------------------------------------

BINDS = ("proc", "sys", "dev", "dev/pts")


def _mounted(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path``, deepest first (mountinfo escapes spaces as \\040)."""
    base = str(path.resolve())
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4].replace("\\040", " ") for line in f]
    return sorted({p for p in points if p == base or p.startswith(base + "/")}, key=len, reverse=True)


def remove_tree(path: Path) -> None:
    """Delete a root, never through a mount: everything mounted below it is unmounted first, and a mount
    that stays is an error (rmtree would otherwise walk into the host's /dev or /sys)."""
    if not path.exists():
        return
    for p in _mounts_under(path):
        if subprocess.run(["umount", p], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", p], capture_output=True)
    left = _mounts_under(path)
    if left:
        raise DeviceError(f"{path} still has mounts ({', '.join(left)}); not deleting it", "umount them first")
    shutil.rmtree(path)


def mount_binds(root: Path) -> None:
    for b in BINDS:
        p = root / b
        p.mkdir(parents=True, exist_ok=True)
        if not _mounted(p):
            _run(["mount", "--bind", f"/{b}", str(p)])


def unmount(root: Path) -> None:
    for b in reversed(BINDS):
        p = root / b
        if p.exists() and _mounted(p):
            if subprocess.run(["umount", str(p)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(p)], capture_output=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    for p in (path, Path(f"{path}.pub")):
        p.unlink(missing_ok=True)
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "edgeopt-emulated", "-f", str(path)])


def _pid_alive(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError, IndexError):
        return None


def start_sshd(root: Path, port: int, state: Path) -> dict[str, Any]:
    """sshd inside the root on 127.0.0.1:port; its config, host key and pid under the root's
    /etc/edgeopt/sshd-PORT, the client key and known_hosts in ``state`` on the host."""
    inst = Path(f"/etc/edgeopt/sshd-{port}")
    d = root / inst.relative_to("/")
    d.mkdir(parents=True, exist_ok=True)
    (root / "run/sshd").mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    client = state / "id_ed25519"
    if not client.exists():
        _keygen(client)
    if not (d / "host_ed25519").exists():
        _keygen(d / "host_ed25519")
    (d / "authorized_keys").write_text(Path(f"{client}.pub").read_text())
    (d / "sshd_config").write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {inst}/host_ed25519", f"PidFile {inst}/sshd.pid",
        f"AuthorizedKeysFile {inst}/authorized_keys", "UsePAM no", "StrictModes no",
        "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "Subsystem sftp internal-sftp", "MaxStartups 100", "MaxSessions 100",
        "LogLevel VERBOSE", ""]))
    if _pid_alive(d / "sshd.pid") is None:
        _chroot(root, ["/usr/sbin/sshd", "-f", f"{inst}/sshd_config", "-E", f"{inst}/sshd.log"], state / "sshd.log",
                timeout=120)
    deadline = time.monotonic() + 60  # sshd starts under emulation: seconds, not milliseconds
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                if s.recv(64).startswith(b"SSH-"):
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            log = (d / "sshd.log").read_text()[-400:] if (d / "sshd.log").exists() else ""
            raise DeviceError(f"sshd in {root} did not answer on 127.0.0.1:{port}: {log}")
        time.sleep(0.2)
    kind, b64 = Path(f"{d / 'host_ed25519'}.pub").read_text().split()[:2]
    known = state / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {kind} {b64}\n")
    return {"key_file": str(client), "known_hosts": str(known), "pid": _pid_alive(d / "sshd.pid")}


def stop_sshd(root: Path, port: int | None = None) -> list[int]:
    """Stop the root's sshd (the one on ``port``, or all of them); returns the ports stopped."""
    stopped = []
    for d in sorted((root / "etc/edgeopt").glob("sshd-*")):
        p = int(d.name.split("-", 1)[1])
        if port is not None and p != port:
            continue
        pid = _pid_alive(d / "sshd.pid")
        if pid is not None:
            os.kill(pid, 15)
            for _ in range(50):
                if _pid_alive(d / "sshd.pid") is None:
                    break
                time.sleep(0.1)
            stopped.append(p)
        if _pid_alive(d / "sshd.pid") is None:  # its host key and config go with it: a port is not reused
            shutil.rmtree(d, ignore_errors=True)
    return stopped


def _any_sshd(root: Path) -> bool:
    return any(_pid_alive(d / "sshd.pid") for d in (root / "etc/edgeopt").glob("sshd-*"))


# ---- up / down ---------------------------------------------------------------------------------------------

def ensure_root(arch: str = "arm64", suite: str = "bookworm", root: Path | None = None, rebuild: bool = False,
                install: bool = True, runtimes: list[str] | None = None) -> dict[str, Any]:
    """Host tools, binfmt, and the root built (or found in the cache); returns {"root", "device", "built"}."""
    if arch not in ARCHES:
        raise DeviceError(f"unknown arch {arch!r}", f"one of: {', '.join(ARCHES)}")
    if suite not in SUITES:
        raise DeviceError(f"unknown suite {suite!r}", f"one of: {', '.join(SUITES)}")
    require_root()
    host_tools(install)
    binfmt(arch)
    root = Path(root or default_root(suite, arch)).absolute()
    root.parent.mkdir(parents=True, exist_ok=True)
    info = None if rebuild else root_info(root)
    built = info is None
    if built:
        if rebuild:
            stop_sshd(root)
            unmount(root)
        info = build_root(suite, arch, root, runtimes or ["onnxruntime", "ai-edge-litert", "openvino"])
    return {"root": str(root), "device": info, "built": built}


def up(arch: str = "arm64", suite: str = "bookworm", port: int | None = None, root: Path | None = None,
       state: Path | None = None, name: str | None = None, agent_root: str = "/root/.edgeopt",
       target: str | None = None, rebuild: bool = False, install: bool = True,
       runtimes: list[str] | None = None) -> dict[str, Any]:
    """Build or reuse the root, start its sshd, write the inventory; returns what was done (see --json)."""
    t0 = time.monotonic()
    got = ensure_root(arch, suite, root, rebuild, install, runtimes)
    root, info, built = Path(got["root"]), got["device"], got["built"]
    t_root = time.monotonic() - t0
    mount_binds(root)
    port = port or free_port()
    name = name or f"{suite}-{arch}"
    state = Path(state or cache_dir() / f"{name}-{port}").absolute()
    ssh = start_sshd(root, port, state)
    labels = ["emulated", arch, suite, "qemu-user"]
    entry: dict[str, Any] = {"host": "127.0.0.1", "port": port, "user": "root", "key_file": ssh["key_file"],
                             "python": f"{VENV}/bin/python", "root": agent_root, "known_hosts": ssh["known_hosts"],
                             "ssh_config": "none", "connect_timeout": 30, "labels": labels,
                             "description": f"Debian {suite} {arch} under qemu-user on this host "
                                            f"(Python {info.get('python')}, numpy {info.get('numpy')}): emulated"}
    if target:
        entry["target"] = target
    inv = state / "inventory.yaml"
    inv.write_text(_yaml({"devices": {name: entry}}))
    return {"name": name, "inventory": str(inv), "port": port, "root": str(root), "state": str(state),
            "python": entry["python"], "agent_root": agent_root, "built": built,
            "root_s": round(t_root, 1), "up_s": round(time.monotonic() - t0, 1), "device": info,
            "sshd_pid": ssh["pid"]}


def down(arch: str = "arm64", suite: str = "bookworm", port: int | None = None, root: Path | None = None,
         purge: bool = False) -> dict[str, Any]:
    """Stop sshd (one port or all), unmount when no sshd is left; ``purge`` deletes the cached root."""
    require_root()
    root = Path(root or default_root(suite, arch)).absolute()
    stopped = stop_sshd(root, port) if root.exists() else []
    unmounted = False
    if root.exists() and not _any_sshd(root):
        unmount(root)
        unmounted = True
    if purge and unmounted:
        remove_tree(root)
    return {"root": str(root), "stopped_ports": stopped, "unmounted": unmounted, "purged": purge and unmounted}


def _yaml(obj: Any) -> str:
    try:
        import yaml

        return yaml.safe_dump(obj, sort_keys=False)
    except ImportError:  # JSON is YAML
        return json.dumps(obj, indent=1) + "\n"


class _Parser(argparse.ArgumentParser):
    """A bad argument is one line (and a hint), as edgeopt's own commands say it, not the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"make_device: error: {message}\n  hint: {self.prog} --help lists the options", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="arm64", choices=sorted(ARCHES))
    ap.add_argument("--suite", default="bookworm", choices=sorted(SUITES))
    ap.add_argument("--port", type=int, help="sshd's loopback port (default: a free one)")
    ap.add_argument("--root", type=Path, help="the root's directory (default: the cache's <suite>-<arch>)")
    ap.add_argument("--state", type=Path, help="where the client key, known_hosts and inventory go")
    ap.add_argument("--name", help="the device's name in the inventory (default: <suite>-<arch>)")
    ap.add_argument("--agent-root", default="/root/.edgeopt", help="the agent's store on the device")
    ap.add_argument("--target", help="the edgeopt target of this device in the inventory")
    ap.add_argument("--runtimes", default="onnxruntime,ai-edge-litert,openvino",
                    help="PyPI runtimes to try (each: the host's version, else the newest with a wheel)")
    ap.add_argument("--rebuild", action="store_true", help="build the root again even when cached")
    ap.add_argument("--no-install", action="store_true", help="never apt-get install the host tools")
    ap.add_argument("--build-only", action="store_true", help="build (or check) the cached root; start nothing")
    ap.add_argument("--down", action="store_true", help="stop sshd and unmount (the root stays cached)")
    ap.add_argument("--purge", action="store_true", help="with --down: delete the cached root too")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    a = ap.parse_args(argv)
    try:
        if a.down or a.purge:
            out = down(a.arch, a.suite, a.port, a.root, a.purge)
        elif a.build_only:
            out = ensure_root(a.arch, a.suite, a.root, a.rebuild, not a.no_install,
                              [r for r in a.runtimes.split(",") if r])
        else:
            out = up(a.arch, a.suite, a.port, a.root, a.state, a.name, a.agent_root, a.target, a.rebuild,
                     not a.no_install, [r for r in a.runtimes.split(",") if r])
    except DeviceError as e:
        if a.json:
            print(json.dumps({"kind": "error", "exit_code": 4, "message": str(e), "hint": e.hint}))
        else:
            print(f"error: {e}" + (f"\n  hint: {e.hint}" if e.hint else ""), file=sys.stderr)
        return 4
    if a.json:
        print(json.dumps(out))
    elif a.build_only:
        d = out["device"]
        print(f"{out['root']}: {'built' if out['built'] else 'cached'} (Python {d.get('python')}, numpy "
              f"{d.get('numpy')}, {', '.join(f'{k} {v}' for k, v in d.get('runtimes', {}).items()) or 'no runtime'})")
    elif "inventory" in out:
        d = out["device"]
        print(f"{out['name']}: Debian {a.suite} {a.arch} (Python {d.get('python')}, numpy {d.get('numpy')}, "
              f"{', '.join(f'{k} {v}' for k, v in d.get('runtimes', {}).items()) or 'no runtime'}) "
              f"on 127.0.0.1:{out['port']} — {'built' if out['built'] else 'cached root'}, up in {out['up_s']} s")
        for k, why in d.get("refused", {}).items():
            print(f"  not installed: {k}: {why}")
        print(f"  inventory: {out['inventory']}\n  try: edgeopt bench --dist DIST --devices {out['inventory']}")
        print(f"  stop: python {sys.argv[0]} --arch {a.arch} --suite {a.suite} --down --port {out['port']}")
    else:
        print(f"stopped sshd on {out['stopped_ports'] or 'nothing'}; unmounted: {out['unmounted']}"
              + ("; root deleted" if out["purged"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
