"""Putting the agent and bundles on a device, the same way for ``local`` and SSH devices.

The agent goes to ``<root>/agent/<version>-<hash of its files>/edgeopt_agent/`` (uploaded to a temp
name, then renamed), so several versions live side by side and a device never runs a half-copied
agent.  A bundle goes to ``<root>/staging/<id>.<random>/`` and the agent's ``install`` verb checks
every file's sha256 against the manifest before renaming it into ``<root>/store/<id>``: an
interrupted push never leaves a half-installed bundle, and a re-run skips what is already there.
A bundle's id is the sha256 of its ``manifest.json`` (which holds the sha256 of every other file).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import posixpath
import re
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgeopt.errors import DeviceError, UsageError
from edgeopt.inventory import DEFAULT_ROOT, Device
from edgeopt.replies import believe
from edgeopt.transport import ConnectionLost, Transport, connect

Progress = Callable[[str], None]
MIN_PYTHON = (3, 8)  # the oldest device Python the agent runs on


class BundleNotValid(UsageError):
    """A local bundle is incomplete or its manifest names unsafe paths."""


# --- local bundles --------------------------------------------------------------------------
@dataclass(frozen=True)
class LocalBundle:
    """A built bundle on this host, identified by the sha256 of its manifest."""

    path: Path
    bundle_id: str
    model: str
    target: str
    precision: str
    backend: str
    check_kind: str  # what the host check could do: numeric | structural | device
    files: tuple[tuple[str, int], ...]  # (relpath, size), manifest.json excluded

    @property
    def size(self) -> int:
        return sum(s for _, s in self.files)

    def describe(self) -> dict[str, Any]:
        return {"bundle_id": self.bundle_id, "path": str(self.path), "model": self.model, "target": self.target,
                "precision": self.precision, "backend": self.backend}


def _safe_rel(rel: str, bundle: Path) -> str:
    p = Path(rel)
    if not rel or p.is_absolute() or ".." in p.parts or "\\" in rel or "\x00" in rel or rel.startswith("/"):
        raise BundleNotValid(f"{bundle}: manifest names an unsafe path {rel!r}",
                             hint="a manifest lists relative paths inside the bundle only; rebuild it")
    return p.as_posix()


def load_bundle(path: str | Path) -> LocalBundle:
    """Read and check a bundle directory: manifest present, every listed file present, safe, right size."""
    path = Path(path)
    mpath = path / "manifest.json"
    if not mpath.is_file():
        raise BundleNotValid(f"{path} is not a bundle (no manifest.json)", hint="build it with `edgeopt build`")
    raw = mpath.read_bytes()
    try:
        m = json.loads(raw)
    except ValueError as exc:
        raise BundleNotValid(f"{mpath} is not valid JSON: {exc}") from None
    if not isinstance(m, dict) or m.get("kind") != "edgeopt.bundle" or not isinstance(m.get("files"), dict):
        raise BundleNotValid(f"{mpath} is not an edgeopt bundle manifest")
    base = path.resolve()
    files = []
    for rel, meta in m["files"].items():
        rel = _safe_rel(rel, path)
        fp = path / rel
        if fp.is_symlink() or (fp.exists() and not fp.resolve().is_relative_to(base)):
            raise BundleNotValid(f"{path}: {rel} is a link (to outside the bundle)",
                                 hint="a bundle holds plain files only; rebuild it")
        if not fp.is_file():
            raise BundleNotValid(f"{path}: {rel} is listed in the manifest but missing",
                                 hint="the bundle is incomplete; rebuild it")
        size = fp.stat().st_size
        if meta.get("size") is not None and size != meta["size"]:
            raise BundleNotValid(f"{path}: {rel} is {size} bytes, the manifest says {meta['size']}",
                                 hint="the bundle was changed after it was built; rebuild it")
        files.append((rel, size))
    _check_named_paths(m, path)
    hc = m.get("host_check") or {}
    return LocalBundle(path=path, bundle_id=hashlib.sha256(raw).hexdigest(), model=str(m["model"]["name"]),
                       target=str(m["target"]), precision=str(m["precision"]), backend=str(m.get("backend")),
                       check_kind=str(hc.get("kind", "numeric")), files=tuple(files))


def _check_named_paths(m: dict[str, Any], path: Path) -> None:
    """The paths the agent will open (``runtime.artifact``, validation data) must be listed, safe files of
    the bundle, checked here as the agent checks them (one rule: ``edgeopt_agent.bundle.listed_path``),
    so that a bad manifest is refused before anything is sent."""
    from edgeopt_agent.bundle import BundleError, listed_path, named_paths

    for key, rel in named_paths(m).items():
        try:
            listed_path(m, rel, key)
        except BundleError as exc:
            raise BundleNotValid(f"{path}: {exc}" if key in str(exc) else f"{path}: {key}: {exc}", hint="a manifest names relative paths inside the bundle, each "
                                                        "listed in `files`; rebuild it") from None


def find_bundles(dist: str | Path) -> list[LocalBundle]:
    """Every bundle under ``dist`` (found by its manifest; temp and hidden folders skipped)."""
    dist = Path(dist)
    if not dist.is_dir():
        raise UsageError(f"--dist {str(dist)!r} is not a folder", hint="build first: edgeopt build MODEL --out DIR")
    if (dist / "manifest.json").is_file():
        return [load_bundle(dist)]
    out = []
    for mpath in sorted(dist.rglob("manifest.json")):
        rel = mpath.parent.relative_to(dist)
        if any(part.startswith(".") for part in rel.parts):
            continue  # a build in progress or the pipeline's temp dirs
        out.append(load_bundle(mpath.parent))
    return out


# --- the agent's own files ------------------------------------------------------------------
@dataclass(frozen=True)
class AgentPackage:
    version: str
    digest: str  # sha256 over (relpath, sha256) of every file
    files: tuple[tuple[str, Path], ...]  # (relpath under edgeopt_agent/, local path)

    @property
    def dirname(self) -> str:
        return f"{self.version}-{self.digest[:12]}"


def agent_package() -> AgentPackage:
    """The agent as it would be copied: the ``edgeopt_agent`` package's sources, no caches."""
    import edgeopt_agent

    base = Path(edgeopt_agent.__file__).parent
    files, h = [], hashlib.sha256()
    for p in sorted(base.rglob("*")):
        rel = p.relative_to(base).as_posix()
        if not p.is_file() or "__pycache__" in p.parts or p.suffix not in (".py", ".md", ".json"):
            continue
        files.append((rel, p))
        h.update(rel.encode() + b"\0" + bytes.fromhex(file_sum(p)[0]))
    return AgentPackage(edgeopt_agent.AGENT_VERSION, h.hexdigest(), tuple(files))


_SUMS: dict[tuple, tuple[str, int]] = {}


def file_sum(p: Path) -> tuple[str, int]:
    """(sha256 hex, size) of a host file, hashed once per content: every session of a rollout checks the
    same agent files (200 devices hashed them 600 times). Keyed by the file's identity and its mtime/ctime in
    ns, so a file changed meanwhile is hashed again; a file changed in the last 2 s is never kept (as git's
    "racy" rule: a rewrite within one timestamp tick would not change the key)."""
    st = p.stat()
    key = (str(p), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key in _SUMS:
        return _SUMS[key]
    got = (hashlib.sha256(p.read_bytes()).hexdigest(), st.st_size)
    if time.time() - max(st.st_mtime, st.st_ctime) > 2.0:
        _SUMS[key] = got
    return got


# --- before any agent code runs on the device ---------------------------------------------------
# Sent inline as `python3 -I -c PREFLIGHT` (isolated: neither the working directory nor PYTHON* variables
# reach sys.path, so nothing planted on the device is imported) with a JSON request on stdin. It reports the
# device's Python, whether the agent root and every parent up to the home (or filesystem root) boundary is
# safe (ours or root's, not writable by group/others unless a sticky folder protects our child), and whether
# the agent copy is exactly the host's: every file's sha256 and size, nothing else in it, nothing foreign.
# Kept to syntax every Python 3 parses, so an old interpreter still says which version it is.
PREFLIGHT = r'''
import hashlib, json, os, stat, sys
out = {"python": list(sys.version_info[:2])}
req = json.loads(sys.stdin.read())
if tuple(sys.version_info[:2]) < (3, 8):
    print(json.dumps(out))
    sys.exit(0)
uid = os.getuid()
out["uid"] = uid

def who(u):
    try:
        import pwd
        return "%s (uid %d)" % (pwd.getpwuid(u).pw_name, u)
    except Exception:
        return "uid %d" % u

def lst(p):
    try:
        return os.lstat(p)
    except OSError:
        return None

def chain_problem(root):
    home = os.path.realpath(os.path.expanduser("~"))
    own = [os.path.join(root, "agent"), root]
    p, child = root, None
    chain = list(own)
    while True:
        parent = os.path.dirname(p)
        if p == home or parent == p:
            break
        chain.append(parent)
        p = parent
    child_st = None
    for p in chain:
        st = lst(p)
        if st is None:
            child_st = None
            continue
        what = "the agent root %s" % p if p == root else ("%s (a parent of the agent root)" % p if p not in own
                                                          else "%s (in the agent root)" % p)
        if p in own:
            if stat.S_ISLNK(st.st_mode) and p != root:
                return "%s is a symlink" % what
            if st.st_uid != uid:
                return "%s is owned by %s, not by %s who runs the agent" % (what, who(st.st_uid), who(uid))
            if st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode):
                return "%s is writable by %s (mode %04o)" % (
                    what, "group and others" if st.st_mode & 0o022 == 0o022 else
                    ("others" if st.st_mode & 0o002 else "its group"), stat.S_IMODE(st.st_mode))
        else:
            if st.st_uid not in (uid, 0):
                return "%s is owned by %s, neither by %s nor by root" % (what, who(st.st_uid), who(uid))
            if st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode):
                sticky = st.st_mode & stat.S_ISVTX
                if not sticky or (child_st is not None and child_st.st_uid not in (uid, 0)):
                    return "%s is writable by %s (mode %04o)%s" % (
                        what, "others" if st.st_mode & 0o002 else "its group", stat.S_IMODE(st.st_mode),
                        "" if not sticky else " and the folder in it is not ours")
        child_st = st
    return None

def agent_state(agent_dir, files):
    top = lst(agent_dir)
    if top is None:
        return "missing"
    if not stat.S_ISDIR(top.st_mode) or top.st_uid != uid:
        return "%s is not a folder of %s" % (agent_dir, who(uid))
    seen = set()
    for dirpath, dirnames, filenames in os.walk(agent_dir):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, agent_dir).replace(os.sep, "/")
            st = lst(p)
            if st is None:
                return "%s vanished while it was read" % rel
            if st.st_uid != uid:
                return "%s is owned by %s" % (rel, who(st.st_uid))
            if stat.S_ISDIR(st.st_mode):
                continue
            if not stat.S_ISREG(st.st_mode):
                return "%s is not a plain file" % rel
            if "__pycache__" in rel.split("/")[:-1]:  # the agent runs with -B: it never writes one
                return "%s is a cached .pyc the agent never writes (it runs with -B); Python would run it " \
                       "instead of the verified source" % rel
            want = files.get(rel[len("edgeopt_agent/"):]) if rel.startswith("edgeopt_agent/") else None
            if want is None:
                return "%s is not part of the agent" % rel
            if st.st_size != want[1]:
                return "%s is %d bytes, the agent's is %d" % (rel, st.st_size, want[1])
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            if h.hexdigest() != want[0]:
                return "%s differs from the agent's (sha256)" % rel
            seen.add(rel[len("edgeopt_agent/"):])
    missing = sorted(set(files) - seen)
    if missing:
        return "edgeopt_agent/%s is missing" % missing[0]
    return "ok"

out["root_problem"] = chain_problem(req["root"])
real = os.path.realpath(req["root"])
if out["root_problem"] is None and real != req["root"]:
    out["root_problem"] = chain_problem(real)
out["agent"] = agent_state(req["agent_dir"], req["files"]) if out["root_problem"] is None else None
print(json.dumps(out))
'''


# --- results --------------------------------------------------------------------------------
@dataclass
class BundlePush:
    bundle_id: str
    path: str
    model: str
    target: str
    precision: str
    status: str  # present | installed | repaired | failed
    bytes_sent: int = 0
    files_sent: int = 0
    time_s: float = 0.0
    error: str | None = None
    activated: str | None = None  # the slot it is now current in, with --activate


@dataclass
class PushResult:
    device: str
    ok: bool = True
    agent: dict[str, Any] = field(default_factory=dict)
    bundles: list[BundlePush] = field(default_factory=list)
    error: str | None = None
    time_s: float = 0.0

    @property
    def bytes_sent(self) -> int:
        return sum(b.bytes_sent for b in self.bundles)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["bytes_sent"] = self.bytes_sent
        return d


# --- one device, connected --------------------------------------------------------------------
class DeviceSession:
    """A connected device with the agent on it: run verbs, push bundles."""

    def __init__(self, device: Device, transport: Transport, progress: Progress = lambda s: None) -> None:
        self.device = device
        self.transport = transport
        self.progress = progress
        self.root = transport.expand(_root_of(device))
        self.package = agent_package()
        self.agent_dir = posixpath.join(self.root, "agent", self.package.dirname)
        self.python = _python_argv(device)
        self.agent_bytes_sent = 0
        self.agent_uploaded = False
        self.connect_s = 0.0
        self.free_mb: float | None = None  # free space under the root, as the last `has` saw it
        self.read_only = False  # the root's filesystem is mounted read-only, as the last `has` saw it
        self._tensorrt: dict[str, Any] | None = None  # edgeopt_agent.probe.tensorrt_runtime(), asked once
        self._has_answer: tuple[list[str], dict[str, Any]] | None = None  # `list` answered `has` (listing())

    @classmethod
    def open(cls, device: Device, trust_new_host_keys: bool = False, retries: int = 2,
             progress: Progress = lambda s: None) -> DeviceSession:
        """Connect (network errors retried), resolve the store root and make sure the agent is there."""
        t0 = time.perf_counter()
        tr = connect(device, trust_new_host_keys=trust_new_host_keys, retries=retries, progress=progress)
        try:
            sess = cls(device, tr, progress)
            sess.connect_s = time.perf_counter() - t0
            sess.ensure_agent()
        except BaseException:
            tr.close()
            raise
        return sess

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> DeviceSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # the agent ----------------------------------------------------------------------------
    def ensure_agent(self) -> None:
        """Make sure the device runs exactly this host's agent, from a root only its user controls.

        Before any agent code runs, an inline check (``python3 -I -c``: it imports nothing from the
        device's folders) compares every file of ``<root>/agent/<version>-<digest>/`` with the host's copy
        and refuses a root that another user owns or can write. A copy that differs (damaged, planted,
        partly deleted) is re-installed; the new copy is checked again before it is used."""
        state = self._preflight()
        if state == "ok":
            return
        tr = self.transport
        if state != "missing":
            self.progress(f"{self.device.name}: the agent in {self.agent_dir} is not this host's ({state}); "
                          "re-installing it")
        else:
            self.progress(f"{self.device.name}: installing agent {self.package.dirname} in {self.agent_dir}")
        parent = posixpath.dirname(self.agent_dir)
        tmp = posixpath.join(parent, f".tmp-{self.package.dirname}-{secrets.token_hex(4)}")
        try:
            for rel, local in self.package.files:
                dest = posixpath.join(tmp, "edgeopt_agent", rel)
                tr.mkdir(posixpath.dirname(dest))
                self.agent_bytes_sent += tr.put(local, dest)  # SFTP put confirms the size it wrote
            if state != "missing":  # move the bad copy aside first: a rename cannot replace a folder
                trash = posixpath.join(parent, f".trash-{self.package.dirname}-{secrets.token_hex(4)}")
                with contextlib.suppress(OSError):
                    tr.rename(self.agent_dir, trash)
                with contextlib.suppress(OSError, DeviceError):
                    tr.remove_tree(trash)
            try:
                tr.rename(tmp, self.agent_dir)
            except OSError:
                if tr.stat(self.agent_dir) is None:  # not a concurrent push that won the race
                    raise
                tr.remove_tree(tmp)
        except ConnectionLost:
            raise
        except OSError as exc:
            raise DeviceError(f"{self.device.name}: cannot install the agent in {self.agent_dir}: {exc}",
                              hint="check that the user can write the agent root (`root:` in the inventory)") from None
        self.agent_uploaded = True
        again = self._preflight()  # what runs is what was checked, whoever raced us to the folder
        if again != "ok":
            raise DeviceError(f"{self.device.name}: the agent installed in {self.agent_dir} does not match this "
                              f"host's copy ({again})",
                              hint=f"remove {self.agent_dir} on the device and push again")

    def _preflight(self) -> str:
        """Run PREFLIGHT on the device: the agent's state (``ok``, ``missing`` or what differs); raises
        one line when the device's Python is too old or the agent root is not safe to run code from."""
        files = {rel: list(file_sum(p)) for rel, p in self.package.files}
        argv = [*self.python, "-I", "-c", PREFLIGHT]
        rc, out, err = self.transport.run(argv, stdin=json.dumps({"root": self.root, "agent_dir": self.agent_dir,
                                                                  "files": files}),
                                          timeout=min(120.0, self.device.command_timeout))
        reply = _last_json(out)
        if (not isinstance(reply, dict) or "python" not in reply) and re.search(r"Unknown option:? -I", err or ""):
            # Python 2 (and 3 before 3.4) has no -I: it stops before running a line of ours
            raise DeviceError(f"{' '.join(self.python)} on {self.device.name} is older than Python 3.4 (it has no "
                              f"-I option; Python 2?): the agent needs Python ≥ {'.'.join(map(str, MIN_PYTHON))}",
                              hint="install a newer python3 there, or point `python:` in the inventory at one")
        if not isinstance(reply, dict) or "python" not in reply:
            raise self._no_reply("the agent's preflight check", rc, out, err)
        ver = ".".join(map(str, reply["python"]))
        if tuple(reply["python"]) < MIN_PYTHON:
            raise DeviceError(f"Python {ver} on {self.device.name} is older than the agent needs "
                              f"(≥ {'.'.join(map(str, MIN_PYTHON))})",
                              hint="install a newer python3 there, or point `python:` in the inventory at one")
        if reply.get("root_problem"):
            raise DeviceError(f"{self.device.name}: refusing to run the agent: {reply['root_problem']} — another "
                              "user could plant code that would run as this one",
                              hint=f"use a `root:` only this user owns and can write (the default ~/.edgeopt), or "
                                   f"fix it on the device: chown it to this user, chmod 700 {self.root}, "
                                   f"and remove {posixpath.join(self.root, 'agent')} so a clean agent is installed")
        return str(reply.get("agent"))

    def _no_reply(self, what: str, rc: int, out: str, err: str) -> DeviceError:
        tail = " | ".join((err or out).strip().splitlines()[-3:])[:400]
        hint = None
        if rc == 127 or "not found" in err:
            hint = f"is {self.python[0]!r} installed on the device? set `python:` in the inventory"
        elif "No module named" in err:
            hint = "the device's python lacks a module the agent needs (numpy, or the runtime)"
        return DeviceError(f"{self.device.name}: {what} gave no reply (exit code {rc}): {tail}", hint=hint)

    def agent(self, verb: str, request: dict[str, Any] | None = None, timeout: float | None = None) -> dict[str, Any]:
        """Run one agent verb; returns its reply (``ok`` may be false). Raises when there is no valid reply."""
        # -B: the agent never writes a __pycache__ (the preflight refuses any .pyc it finds there: a planted
        # one would run instead of the verified source).
        argv = [*self.python, "-B", "-m", "edgeopt_agent", verb]
        rc, out, err = self.transport.run(argv, stdin=json.dumps(request or {}), cwd=self.agent_dir,
                                          timeout=timeout)
        # One validator for every reply (edgeopt.replies): standard, bounded JSON whose numbers can be true;
        # anything else is this device's failure (ReplyNotBelievable), before any number of it is used.
        reply = believe(self.device.name, verb, out)
        if not isinstance(reply, dict) or "ok" not in reply:
            raise self._no_reply(f"the agent's `{verb}`", rc, out, err)
        return reply

    def probe(self) -> dict[str, Any]:
        reply = self.agent("probe", {"root": self.root}, timeout=min(120.0, self.device.command_timeout))
        if not reply.get("ok"):
            raise DeviceError(f"{self.device.name}: probe failed: {reply_error(reply)}")
        return reply.get("probe", {})

    def store_path(self, bundle_id: str) -> str:
        return posixpath.join(self.root, "store", bundle_id)

    # bundles ------------------------------------------------------------------------------
    def has(self, ids: list[str]) -> dict[str, bool]:
        if not ids:
            return {}
        kept, self._has_answer = self._has_answer, None
        reply = kept[1] if kept and kept[0] == sorted(ids) else self.agent("has", {"root": self.root, "bundle_ids": ids})
        if not reply.get("ok"):
            raise DeviceError(f"{self.device.name}: has failed: {reply_error(reply)}")
        self.free_mb = reply.get("free_mb")
        self.read_only = bool(reply.get("read_only"))
        return {k: bool(v) for k, v in reply.get("has", {}).items()}

    def verify(self, bundle_id: str) -> dict[str, Any]:
        """The agent's verify of an installed bundle: ``{"ok", "files", "problems"}``."""
        reply = self.agent("verify", {"root": self.root, "bundle_id": bundle_id})
        if "verify" in reply:
            return reply["verify"]
        raise DeviceError(f"{self.device.name}: verify failed: {reply_error(reply)}")

    def push(self, bundles: list[LocalBundle], verify: bool = False, activate: bool = False) -> PushResult:
        """Install every bundle the device lacks; with ``verify``, re-check present ones and repair them;
        with ``activate``, make each the current version of its slot (``<model>/<target>``) on the device."""
        t0 = time.perf_counter()
        res = PushResult(self.device.name, agent={"path": self.agent_dir, "uploaded": self.agent_uploaded,
                                                  "bytes_sent": self.agent_bytes_sent})
        refused = self.runtime_refusals(bundles)  # before anything is sent: a bundle this device cannot run
        present = self.has([b.bundle_id for b in bundles])
        need = sum(b.size for b in bundles if not present.get(b.bundle_id) and b.bundle_id not in refused) / (1 << 20)
        if need and self.read_only:
            raise DeviceError(f"{self.device.name}: the filesystem under {self.root} is read-only; nothing can be "
                              "installed there",
                              hint="remount it read-write, or set `root:` in the inventory to a writable folder")
        margin = space_margin_mb(need)
        if self.free_mb is not None and need and need + margin > self.free_mb:
            raise DeviceError(f"{self.device.name}: no space left on the device ({_mb(self.free_mb)} free under "
                              f"{self.root}; {_mb(need)} needed + a {_mb(margin)} margin for the store's own files)",
                              hint="free space there, or run `edgeopt devices gc` to remove old bundles")
        for b in bundles:
            bp = BundlePush(b.bundle_id, str(b.path), b.model, b.target, b.precision, "present")
            res.bundles.append(bp)
            if b.bundle_id in refused:
                bp.status, bp.error, res.ok = "failed", refused[b.bundle_id], False
                self.progress(f"{self.device.name}: {b.model} {b.target}-{b.precision}: REFUSED: {bp.error}")
                continue
            tb = time.perf_counter()
            try:
                if present.get(b.bundle_id) and verify:
                    v = self.verify(b.bundle_id)
                    if not v.get("ok"):
                        what = "; ".join(f"{p['file']}: {p['problem']}" for p in v.get("problems", [])[:3])
                        self.progress(f"{self.device.name}: {b.model} {b.target}-{b.precision} is corrupted on "
                                      f"the device ({what}); re-installing")
                        # Never delete first: the agent swaps the good copy in under its lock once the
                        # upload verified, so a slot pointing at this bundle never dangles.
                        present[b.bundle_id] = False
                        bp.status = "repaired"
                if not present.get(b.bundle_id):
                    repairing = bp.status == "repaired"
                    if not repairing:
                        bp.status = "installed"
                    self._upload(b, bp, replace=repairing)
                    if repairing:  # repaired means verified again, not "the agent said present"
                        v = self.verify(b.bundle_id)
                        if not v.get("ok"):
                            what = "; ".join(f"{p.get('file')}: {p.get('problem')}" for p in v.get("problems", [])[:3])
                            raise DeviceError(f"{self.device.name}: {b.model} {b.target}-{b.precision} is still "
                                              f"corrupted on the device after the repair ({what})",
                                              hint=f"remove {self.store_path(b.bundle_id)} on the device and push "
                                                   "again")
                        bp.status = "repaired"
                if activate:
                    bp.activated = self.activate(b.bundle_id).get("slot")
            except ConnectionLost as exc:  # the device is gone: what was done and sent so far stays on record
                bp.status, bp.error, res.ok = "failed", exc.message, False
                bp.time_s = res.time_s = round(time.perf_counter() - tb, 3)
                exc.result = res
                raise
            except DeviceError as exc:
                bp.status, bp.error = "failed", exc.message
                res.ok = False
            bp.time_s = round(time.perf_counter() - tb, 3)
        res.time_s = round(time.perf_counter() - t0, 3)
        return res

    def runtime_refusals(self, bundles: list[LocalBundle]) -> dict[str, str]:
        """bundle id -> why this device cannot run it, for what the device can tell before anything is sent:
        a TensorRT bundle where TensorRT (with its builder: the engine is built on the device) or cuda-python
        does not import. Asked of the device once per session, and only when a TensorRT bundle is pushed."""
        trt = [b for b in bundles if b.backend == "tensorrt"]
        if not trt:
            return {}
        if self._tensorrt is None:
            code = ("import json\nfrom edgeopt_agent.probe import tensorrt_runtime\n"
                    "print(json.dumps(tensorrt_runtime()))")
            rc, out, err = self.transport.run([*self.python, "-B", "-c", code], cwd=self.agent_dir,
                                              timeout=min(180.0, self.device.command_timeout))
            reply = _last_json(out)
            if not isinstance(reply, dict) or "tensorrt" not in reply:
                raise self._no_reply("the agent's TensorRT check", rc, out, err)
            self._tensorrt = reply
        out: dict[str, str] = {}
        for b in trt:
            why = tensorrt_refusal(self.device.name, b, self._tensorrt)
            if why:
                out[b.bundle_id] = why
        return out

    # slots --------------------------------------------------------------------------------
    def _verb(self, verb: str, **request: Any) -> dict[str, Any]:
        reply = self.agent(verb, {"root": self.root, **{k: v for k, v in request.items() if v is not None}})
        if not reply.get("ok"):
            raise DeviceError(f"{self.device.name}: {verb} failed: {reply_error(reply)}")
        return reply.get(verb) or {}

    def activate(self, bundle_id: str, slot: str | None = None,
                 confirm_within_s: float | None = None) -> dict[str, Any]:
        """Make an installed bundle its slot's current one; with ``confirm_within_s`` as a trial that
        the agent reverts by itself unless ``commit`` comes in time."""
        return self._verb("activate", bundle_id=bundle_id, slot=slot, confirm_within_s=confirm_within_s)

    def commit(self, slot: str, bundle_id: str) -> dict[str, Any]:
        return self._verb("commit", slot=slot, bundle_id=bundle_id)

    def rollback(self, slot: str, to_empty: bool = False) -> dict[str, Any]:
        return self._verb("rollback", slot=slot, **({"to_empty": True} if to_empty else {}))

    def gc(self, keep: int = 3, grace_s: float = 3600, dry_run: bool = False) -> dict[str, Any]:
        return self._verb("gc", keep=keep, grace_s=grace_s, dry_run=dry_run)

    def listing(self, bundle_ids: list[str] | None = None) -> dict[str, Any]:
        """Installed bundles and every slot (current, history, trial) as the agent sees them. With
        ``bundle_ids`` the same call answers ``has`` for them, kept for this session's next ``push`` of exactly
        those bundles (a rollout lists, then pushes: one agent process on the device less)."""
        reply = self.agent("list", {"root": self.root, **({"bundle_ids": bundle_ids} if bundle_ids else {})})
        if not reply.get("ok"):
            raise DeviceError(f"{self.device.name}: list failed: {reply_error(reply)}")
        if bundle_ids and "has" in reply:
            self._has_answer = (sorted(bundle_ids), reply)
        return reply.get("list") or {}

    def _upload(self, b: LocalBundle, bp: BundlePush, replace: bool = False) -> None:
        tr, name = self.transport, self.device.name
        staging = posixpath.join(self.root, "staging", f"{b.bundle_id}.{secrets.token_hex(6)}")
        self.progress(f"{name}: uploading {b.model} {b.target}-{b.precision} ({b.size / 1e6:.1f} MB)")
        for rel, _size in [*b.files, ("manifest.json", 0)]:
            dest = posixpath.join(staging, rel)
            tr.mkdir(posixpath.dirname(dest))
            moved = [0]

            def count(sent: int, total: int, moved=moved) -> None:
                moved[0] = sent

            try:
                bp.bytes_sent += tr.put(b.path / rel, dest, callback=count)
            except DeviceError as exc:
                bp.bytes_sent += moved[0]  # what went over the wire before the failure, not 0
                if not isinstance(exc, ConnectionLost):  # the link is up: free what the partial upload took
                    with contextlib.suppress(DeviceError, OSError):
                        tr.remove_tree(staging)
                raise
            bp.files_sent += 1
        reply = self.agent("install", {"root": self.root, "staging": staging, "bundle_id": b.bundle_id,
                                       "replace": replace})
        if not reply.get("ok"):
            tr.remove_tree(staging)  # the agent deletes a rejected upload; this covers other failures
            raise DeviceError(f"{name}: install of {b.model} {b.target}-{b.precision} failed: {reply_error(reply)}")
        if (reply.get("install") or {}).get("present"):
            bp.status = "present"  # another push installed it meanwhile


def _tensorrt_needed(b: LocalBundle) -> str:
    """The TensorRT a bundle's target names (``tensorrt: "10.3"`` in its profile) as ``10.x``; else ``8.5 or newer``."""
    from edgeopt_agent.trt_compile import MIN_TENSORRT

    try:
        spec = json.loads((b.path / "manifest.json").read_text()).get("target_spec") or {}
    except (OSError, ValueError):
        spec = {}
    prof = spec.get("profile") or {}
    version = str(prof.get("tensorrt") or prof.get("tensorrt_major") or "")
    return f"{version.split('.')[0]}.x" if version else f"{'.'.join(map(str, MIN_TENSORRT))} or newer"


def tensorrt_refusal(device: str, b: LocalBundle, facts: dict[str, Any]) -> str | None:
    """One line saying what a device lacks to run TensorRT bundle ``b`` (``facts``: the device's
    ``edgeopt_agent.probe.tensorrt_runtime()``), or None when it has it."""
    from edgeopt_agent.trt_compile import MIN_TENSORRT, version_tuple

    need = f"{b.target} bundles need TensorRT {_tensorrt_needed(b)}"
    if not facts.get("tensorrt"):
        lean = (f"; tensorrt_lean {facts['tensorrt_lean']} is, but a lean runtime cannot build the engine, which "
                "edgeopt builds on the device") if facts.get("tensorrt_lean") else ""
        what = "not installed" if facts.get("tensorrt_error") == "not installed" else \
            f"{facts.get('tensorrt_error') or 'import failed'}"
        return (f"{device} has no TensorRT runtime (tensorrt not importable: {what}{lean}; {need} with its "
                "builder and cuda-python)")
    if version_tuple(str(facts["tensorrt"])) < MIN_TENSORRT:
        return (f"TensorRT {facts['tensorrt']} on {device} is older than edgeopt's TensorRT runner needs "
                f"(≥ {'.'.join(map(str, MIN_TENSORRT))}); {need}")
    if not facts.get("cuda_python"):
        return (f"{device} has TensorRT {facts['tensorrt']} but no cuda-python (cuda.bindings / cuda.cudart not "
                f"importable: {facts.get('cuda_python_error') or 'import failed'}); {need} and cuda-python, the "
                "major of the device's CUDA")
    return None


def space_margin_mb(need_mb: float) -> float:
    """What a push keeps free beyond the bundles' bytes (state files, the agent's temp files): 5 % of
    the bundles plus 1 MB — stated in the message when it is what tips the balance."""
    return need_mb * 0.05 + 1.0


def _mb(x: float) -> str:
    return f"{x:.1f} MB" if x < 100 else f"{x:.0f} MB"


def _last_json(out: str) -> Any:
    """The last line of ``out`` that parses as standard, bounded JSON (``edgeopt.replies.last_json``; a login
    banner may precede it); None when there is none, or when it cannot be believed."""
    from edgeopt.replies import last_json

    try:
        return last_json(out)
    except ValueError:
        return None


def _root_of(device: Device) -> str:
    if device.root:
        return device.root
    if device.is_local:
        import os

        return os.environ.get("EDGEOPT_AGENT_ROOT") or DEFAULT_ROOT
    return DEFAULT_ROOT


def _python_argv(device: Device) -> list[str]:
    """The interpreter as argv (``python: "python3 -X faulthandler"`` is allowed); each part is quoted later."""
    import shlex

    if device.python:
        return shlex.split(device.python)
    return [sys.executable] if device.is_local else ["python3"]


def reply_error(reply: dict[str, Any]) -> str:
    """One line from an agent reply's ``error``: ``Type: message``."""
    e = reply.get("error") or {}
    return f"{e.get('type', 'error')}: {e.get('message', 'no message')}" if e else "no error given"


def push(devices: list[Device], bundles: list[LocalBundle], trust_new_host_keys: bool = False,
         verify: bool = False, activate: bool = False, jobs: int = 4,
         progress: Progress = lambda s: None) -> list[PushResult]:
    """Push bundles to several devices at once; a failing device is reported, the others go on.

    Ctrl-C (or SIGTERM) stops at once, even in a frozen upload: every open connection is closed (so
    no upload waits for its stall deadline), the devices that had finished are reported through
    ``progress``, and KeyboardInterrupt goes on to the caller (exit 130)."""
    live: dict[str, Transport] = {}
    done: dict[str, PushResult] = {}
    stopping = [False]

    def one(dev: Device) -> PushResult:
        t0 = time.perf_counter()
        try:
            if stopping[0]:
                raise DeviceError(f"{dev.name}: not started (interrupted)")
            tr = connect(dev, trust_new_host_keys=trust_new_host_keys, progress=progress)
            live[dev.name] = tr
            try:
                s = DeviceSession(dev, tr, progress)
                s.connect_s = time.perf_counter() - t0
                s.ensure_agent()
                r = s.push(bundles, verify=verify, activate=activate)
                if not stopping[0]:
                    done[dev.name] = r  # recorded before the connection closes
            finally:
                live.pop(dev.name, None)
                tr.close()
        except DeviceError as exc:  # a lost connection keeps the bundles (and bytes) it had done
            r = exc.result if isinstance(exc.result, PushResult) else PushResult(dev.name)
            r.ok, r.error = False, str(exc)
            if not stopping[0]:
                progress(f"{dev.name}: FAILED: {exc.message}")
        r.time_s = round(time.perf_counter() - t0, 3)
        if not stopping[0]:
            done[dev.name] = r
        return r

    try:
        return _in_daemon_threads(one, devices, jobs)
    except KeyboardInterrupt:
        stopping[0] = True
        for tr in list(live.values()):  # unblocks an upload stuck on a frozen link now, not at its deadline
            with contextlib.suppress(Exception):
                (getattr(tr, "abort", None) or tr.close)()
        for d in devices:
            r = done.get(d.name)
            if r is not None:
                sent = f", {r.bytes_sent} bytes sent" if r.bytes_sent else ""
                what = ", ".join(f"{b.model} {b.target}-{b.precision} {b.status}" for b in r.bundles) or "nothing"
                progress(f"{d.name}: {'done' if r.ok else 'FAILED'} before the interrupt: {what}{sent}")
            else:
                progress(f"{d.name}: interrupted (nothing half-installed: an unfinished upload never is)")
        raise


def _in_daemon_threads(fn: Callable[[Any], Any], items: list, jobs: int) -> list:
    """``[fn(x) for x in items]`` on up to ``jobs`` daemon threads, in order. Daemon threads, not a
    ThreadPoolExecutor: after Ctrl-C a worker still blocked on a frozen link must not hold the process at
    exit (the executor's threads are joined at interpreter exit, i.e. at the link's stall deadline). The
    wait is interruptible; an exception a worker raised is raised here."""
    import queue
    import threading

    todo: queue.Queue = queue.Queue()
    for i, x in enumerate(items):
        todo.put((i, x))
    out: dict[int, Any] = {}
    failed: list[BaseException] = []

    def work() -> None:
        while not failed:
            try:
                i, x = todo.get_nowait()
            except queue.Empty:
                return
            try:
                out[i] = fn(x)
            except BaseException as exc:  # handed to the caller's thread
                failed.append(exc)

    threads = [threading.Thread(target=work, daemon=True, name=f"edgeopt-push-{k}")
               for k in range(max(1, min(jobs, len(items) or 1)))]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)
    if failed:
        raise failed[0]
    return [out[i] for i in range(len(items))]
