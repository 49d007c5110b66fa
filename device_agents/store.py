"""The device's content-addressed bundle store: install, has, activate, rollback, gc.

Layout under the agent root (request key ``root``, else ``$EDGEOPT_AGENT_ROOT``, else ``~/.edgeopt``)::

    staging/<anything>/            uploads in progress (written by the host)
    store/<bundle_id>/             installed bundles; bundle_id = sha256(manifest.json), 64 hex chars
    slots/<model>/<target>/state.json   {"current": id, "history": [previous ids, newest first]}
    slots/<model>/<target>/current -> ../../../store/<id>   (and ``previous``), for applications
    .lock                          serialises every verb that changes the store

An install is atomic: the staging directory is checked file by file against its manifest, and the
manifest against the bundle id, then renamed into ``store/``.  A bundle that fails is deleted, so
the store never holds a half-written or tampered bundle.  ``state.json`` is the truth about a slot
(replaced atomically); the ``current``/``previous`` links are refreshed from it after every change.
Standard library only (plus ``bundle`` for hashing).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .bundle import MANIFEST, BundleError, load_manifest, sha256_file, verify

ID_RE = re.compile(r"^[0-9a-f]{64}$")
_SLOT_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]{0,127}$")
STATE = "state.json"
MANIFEST_SCHEMAS = (1,)  # manifest schema versions this agent can run
LOCK_TIMEOUT_S = 60.0


class StoreError(Exception):
    """A store request that cannot be done: bad id, path outside the root, bundle not installed."""


class InstallRejected(StoreError):
    """An uploaded bundle failed verification; it has been deleted."""

    def __init__(self, message: str, problems: list[dict[str, str]]) -> None:
        super().__init__(message)
        self.problems = problems


# ---- paths ------------------------------------------------------------------------------------


def agent_root(req: dict[str, Any]) -> Path:
    """The store root of a request: ``root``, ``$EDGEOPT_AGENT_ROOT`` or ``~/.edgeopt`` (absolute)."""
    root = req.get("root") or os.environ.get("EDGEOPT_AGENT_ROOT") or "~/.edgeopt"
    if not isinstance(root, str):
        raise StoreError(f"root must be a path string, got {type(root).__name__}")
    return Path(root).expanduser().absolute()


def check_id(bundle_id: Any) -> str:
    """A bundle id is the sha256 of a manifest: exactly 64 lowercase hex characters."""
    if not isinstance(bundle_id, str) or not ID_RE.match(bundle_id.lower()):
        raise StoreError(f"bad bundle id {bundle_id!r}: expected 64 hex characters (sha256 of manifest.json)")
    return bundle_id.lower()


def check_slot(slot: Any) -> str:
    """``<model>/<target>``: 1 to 4 parts of letters, digits and ``._+-``; never ``..`` or absolute."""
    if not isinstance(slot, str) or not slot:
        raise StoreError(f"bad slot {slot!r}: expected '<model>/<target>'")
    parts = slot.split("/")
    if not 1 <= len(parts) <= 4 or not all(_SLOT_PART.match(p) and p not in (".", "..") for p in parts):
        raise StoreError(f"bad slot {slot!r}: expected '<model>/<target>' made of letters, digits and ._+-")
    return slot


SLOT_PART_MAX = 128  # what check_slot takes of one part


def _slot_part(name: Any) -> str:
    """A manifest value made safe for a default slot name.  A name longer than a slot part may be keeps its
    first characters and a hash of the whole name, so two long names with one prefix never share a slot
    (cutting them at 128 characters made the second displace the first)."""
    raw = str(name or "unnamed")
    s = re.sub(r"[^A-Za-z0-9._+-]", "_", raw)
    s = "_" + s if s.startswith((".", "-", "+")) else s
    if len(s) > SLOT_PART_MAX:
        digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        s = f"{s[:SLOT_PART_MAX - 17]}-{digest}"
    return s


def _within(path: Path, parent: Path) -> bool:
    try:
        path.relative_to(parent)
        return True
    except ValueError:
        return False


def store_path(root: Path, bundle_id: str) -> Path:
    return root / "store" / check_id(bundle_id)


def entry_problem(root: Path, bundle_id: str) -> str | None:
    """Why ``store/<id>`` is not that bundle (None when it is): a store entry *is* its id, so the
    sha256 of its manifest must equal the id; an edited manifest is a different bundle."""
    mpath = store_path(root, bundle_id) / MANIFEST
    if not mpath.is_file():
        return "missing" if not mpath.parent.exists() else "no manifest.json"
    actual = sha256_file(mpath)
    if actual != bundle_id:
        return f"manifest.json changed after install (sha256 {actual[:12]}… is not the id {bundle_id[:12]}…)"
    return None


def entry_damage(root: Path, bundle_id: str) -> list[dict[str, str]]:
    """Everything wrong with an installed entry's files: ``verify``'s problems (missing, size, sha256) and
    anything that is not the plain file install made (a symlink, even to identical bytes; a hard link; a
    fifo), the entry itself included. Read with ``lstat``: nothing is followed. ``[]``: as installed."""
    path = store_path(root, bundle_id)
    try:
        st = os.lstat(path)
    except OSError:
        return [{"file": ".", "problem": "missing"}]
    if not stat.S_ISDIR(st.st_mode):
        return [{"file": ".", "problem": "the store entry is a symlink" if stat.S_ISLNK(st.st_mode)
                 else "the store entry is not a folder"}]
    odd = _unsafe_entries(path)
    try:
        found = verify(path)["problems"]
    except (BundleError, OSError, ValueError) as exc:
        found = [{"file": MANIFEST, "problem": str(exc)}]
    seen = {p["file"] for p in odd}
    return odd + [p for p in found if p["file"] not in seen]


def installed(root: Path, bundle_id: str) -> bool:
    """The entry exists and its manifest hashes to its id (files are checked by ``verify``)."""
    return entry_problem(root, check_id(bundle_id)) is None


def resolve_bundle(req: dict[str, Any]) -> Path:
    """The bundle a request names: ``bundle`` (a path) or ``bundle_id`` (installed in the store)."""
    if req.get("bundle"):
        path = Path(str(req["bundle"])).expanduser()
        if not path.is_dir():
            raise BundleError(f"bundle {str(path)!r} is not a directory")
        return path
    if req.get("bundle_id"):
        root = agent_root(req)
        bid = check_id(req["bundle_id"])
        problem = entry_problem(root, bid)
        if problem == "missing":
            raise StoreError(f"bundle {bid[:12]}… is not installed in {root / 'store'}; install it first")
        if problem:
            raise StoreError(f"store entry {bid[:12]}… is not that bundle: {problem}; "
                             "re-push it with `edgeopt push --verify` to repair")
        path = store_path(root, bid)
        odd = [] if stat.S_ISDIR(os.lstat(path).st_mode) else [{"file": ".", "problem": "not a folder"}]
        odd = odd or _unsafe_entries(path)  # a file swapped for a link is never followed, even to the same bytes
        if odd:
            raise StoreError(f"store entry {bid[:12]}… is not as installed ("
                             + "; ".join(f"{p['file']}: {p['problem']}" for p in odd[:3])
                             + "); re-push it with `edgeopt push --verify` to repair")
        return path
    raise StoreError("the request needs 'bundle' (a path) or 'bundle_id' (installed in the store)")


def _private(root: Path) -> None:
    """One rule for the agent's tree, whoever created it (the host over SFTP, a user's mkdir): the
    root and its store/staging/slots folders are 0700 — bundles and models are not for other users."""
    for p in (root, root / "store", root / "staging", root / "slots"):
        try:
            st = p.stat()
            if st.st_mode & 0o077 and st.st_uid == os.getuid():
                os.chmod(p, 0o700)
        except (OSError, AttributeError):
            pass


@contextlib.contextmanager
def locked(root: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the store's lock (an flock on ``<root>/.lock``); several agents may run at once."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    _private(root)
    try:
        import fcntl
    except ImportError:  # not a POSIX system: no concurrent agents to guard against there
        yield
        return
    try:
        f = open(root / ".lock", "a+")
    except OSError:
        if not read_only(root):
            raise
        # A read-only filesystem: no one can change this store, so there is nothing to serialise. A verb that
        # would write fails at its first write with EROFS; a reader (bench, check) goes on.
        yield
        return
    with f:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StoreError(f"the store {root} is locked by another agent for > {timeout_s:.0f}s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk: no 0-byte temp file left behind, the old state stays
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _remove_tree(path: Path) -> None:
    """Move aside first (one rename), then delete: a half-deleted bundle never keeps its name."""
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return
    trash = path.with_name(f".trash-{path.name}-{os.getpid()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


# ---- install / has ----------------------------------------------------------------------------


def _staging_dir(root: Path, staging: Any) -> Path:
    """The upload to install; it must lie inside ``<root>/staging/`` (symlinks and ``..`` resolved)."""
    if not isinstance(staging, str) or not staging:
        raise StoreError("install needs 'staging': the directory the bundle was uploaded to")
    base = (root / "staging").resolve()
    p = Path(staging).expanduser()
    p = (p if p.is_absolute() else root / p).resolve()
    if not _within(p, base) or p == base:
        raise StoreError(f"staging {staging!r} is not inside {base}; uploads must go under <root>/staging/")
    return p


# The build host's own record beside the manifest (when and how long the build took: outside the bundle id,
# not listed, never pushed by edgeopt). A bundle folder copied by hand may carry it: dropped, never installed.
HOST_RECORDS = ("build-times.json",)


def _drop_host_records(staging: Path) -> None:
    for name in HOST_RECORDS:
        p = staging / name
        if p.is_file() and not p.is_symlink():  # a link or a folder of that name stays, and is refused below
            p.unlink()


def _inspect_upload(staging: Path, bundle_id: str) -> list[dict[str, str]]:
    """Every problem with an upload: id, manifest, each file's hash and size, symlinks, extra files."""
    mpath = staging / MANIFEST
    if not mpath.is_file():
        return [{"file": MANIFEST, "problem": "missing"}]
    actual = sha256_file(mpath)
    if actual != bundle_id:
        return [{"file": MANIFEST, "problem": f"sha256 {actual[:12]}… is not the bundle id {bundle_id[:12]}…"}]
    try:
        manifest = load_manifest(staging)
    except BundleError as exc:
        return [{"file": MANIFEST, "problem": str(exc)}]
    if manifest.get("schema") not in MANIFEST_SCHEMAS:
        return [{"file": MANIFEST, "problem": f"manifest schema {manifest.get('schema')!r} is not one this "
                                              f"agent runs ({', '.join(map(str, MANIFEST_SCHEMAS))}); update the agent"}]
    problems = verify(staging, manifest)["problems"]
    listed = set(manifest.get("files", {})) | {MANIFEST}
    for dirpath, dirnames, filenames in os.walk(staging):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = p.relative_to(staging).as_posix()
            if p.is_symlink():
                problems.append({"file": rel, "problem": "symlink (a bundle holds plain files only)"})
            elif p.is_file() and rel not in listed:
                problems.append({"file": rel, "problem": "not in the manifest"})
    return problems


def _unsafe_entries(top: Path) -> list[dict[str, str]]:
    """What under ``top`` is not a folder or a plain file with a single name: symlinks, hard links,
    fifos, devices, sockets. Read with ``lstat`` only; ``os.walk`` never descends into a symlinked folder."""
    problems = []
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = Path(p).relative_to(top).as_posix()
            try:
                st = os.lstat(p)
            except OSError as exc:
                problems.append({"file": rel, "problem": f"unreadable ({exc.strerror})"})
                continue
            problem = _not_plain(st)
            if problem and not stat.S_ISDIR(st.st_mode):
                problems.append({"file": rel, "problem": problem})
    return problems


def _not_plain(st: os.stat_result) -> str | None:
    """Why a file's stat is not a bundle's plain file (None when it is one)."""
    if stat.S_ISLNK(st.st_mode):
        return "symlink (a bundle holds plain files only)"
    if stat.S_ISDIR(st.st_mode):
        return "a folder"
    if not stat.S_ISREG(st.st_mode):
        return "not a plain file (a fifo, socket or device node)"
    if st.st_nlink > 1:
        return f"hard link ({st.st_nlink} names share this file; a bundle holds its own copies only)"
    return None


def _freeze(top: Path) -> list[dict[str, str]]:
    """Make every file read-only through a descriptor opened without following links, after checking
    (on that descriptor) that it is still a plain file with one name: never a chmod through a link."""
    problems = []
    for dirpath, _, filenames in os.walk(top):
        for name in filenames:
            p = os.path.join(dirpath, name)
            rel = Path(p).relative_to(top).as_posix()
            try:
                fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
            except OSError as exc:
                problems.append({"file": rel, "problem": "symlink (a bundle holds plain files only)"
                                 if os.path.islink(p) else f"unreadable ({exc.strerror})"})
                continue
            try:
                problem = _not_plain(os.fstat(fd))
                if problem:
                    problems.append({"file": rel, "problem": problem})
                else:
                    os.fchmod(fd, 0o444)  # installed content never changes: read-only files
            finally:
                os.close(fd)
    return problems


def _writers(top: Path, any_use: bool = False) -> list[dict[str, str]]:
    """Files under ``top`` that another process still holds open for writing, or maps shared and writable
    (read from ``/proc``: ``fd/`` and ``maps``; none are found where there is no ``/proc``).  Checked after
    ``_freeze``: no new writer can open them then (read-only), but one that opened a file before (a stale
    upload's sftp-server), or mapped it with ``MAP_SHARED`` and closed the descriptor, could still change the
    bytes after they were hashed, so such an upload is refused instead of installed.  ``any_use``: any open
    descriptor or mapping counts (gc: an upload some process still holds is not stale, whatever its times)."""
    prefix, found = str(top) + os.sep, []
    if not os.path.isdir("/proc"):
        return found

    def add(target: str, pid: str, how: str) -> None:
        found.append({"file": Path(target).relative_to(top).as_posix(),
                      "problem": f"still {how} by process {pid} (an upload that has not ended?); its bytes "
                                 "could change after they were checked"})

    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or another user's process we may not look into
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if not target.startswith(prefix):
                continue
            try:
                with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                    flags = int(re.search(r"^flags:\s*([0-7]+)", f.read(), re.M).group(1), 8)
            except (OSError, AttributeError, ValueError):
                flags = os.O_RDWR  # cannot tell: assume the worst
            writing = bool(flags & (os.O_WRONLY | os.O_RDWR))
            if any_use or writing:
                add(target, pid, "open for writing" if writing else "open")
        try:
            with open(f"/proc/{pid}/maps") as f:
                maps = f.read()
        except OSError:
            continue
        for line in maps.splitlines():
            parts = line.split(None, 5)
            if len(parts) < 6:
                continue
            target = parts[5][:-10] if parts[5].endswith(" (deleted)") else parts[5]  # (3.8: no removesuffix)
            shared_writable = "w" in parts[1] and "s" in parts[1]
            if target.startswith(prefix) and (any_use or shared_writable):
                add(target, pid, "mapped shared and writable" if shared_writable else "mapped")
    return found


def install(root: Path, staging: Any, bundle_id: Any, req_replace: bool = False) -> dict[str, Any]:
    """Verify an upload and rename it into ``store/<bundle_id>``; delete it when it fails.

    An existing entry under that id that is not the bundle (edited manifest, missing manifest) is
    replaced; with ``req_replace`` one whose files fail ``verify`` is replaced too (push --verify's
    repair).  The replacement is complete before the damaged copy leaves: no dangling slot."""
    bid = check_id(bundle_id)
    src = _staging_dir(root, staging)
    dest = store_path(root, bid)
    with locked(root):
        swept = sweep_staging(root, keep=src)
        replace = bool(req_replace)
        if installed(root, bid) and not (replace and entry_damage(root, bid)):
            if src.exists():  # a redundant upload of what is already there
                shutil.rmtree(src, ignore_errors=True)
            return {"bundle_id": bid, "path": str(dest), "present": True}
        if not src.is_dir():
            raise StoreError(f"staging directory {str(src)!r} does not exist")
        # Inspect before touching anything: a symlink, a hard link or a device node in the upload would
        # make the chmod below change a file outside the root. Nothing is followed (lstat only).
        problems = _unsafe_entries(src)
        if problems:
            shutil.rmtree(src, ignore_errors=True)  # removes the links themselves, never what they point at
            raise InstallRejected(f"bundle {bid[:12]}… refused ({len(problems)} problem(s): "
                                  + "; ".join(f"{p['file']}: {p['problem']}" for p in problems[:5])
                                  + "); the upload was deleted", problems)
        # Freeze first, then hash: the bytes checked are the bytes kept (a writer still holding the
        # staging files open can no longer change them once they are read-only and owned by the store).
        incoming = root / "store" / f".incoming-{bid}-{os.getpid()}"
        incoming.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _drop_host_records(src)
        os.rename(src, incoming)
        problems = _freeze(incoming) or _writers(incoming) or _inspect_upload(incoming, bid)
        if problems:
            shutil.rmtree(incoming, ignore_errors=True)
            raise InstallRejected(f"bundle {bid[:12]}… failed verification ({len(problems)} problem(s): "
                                  + "; ".join(f"{p['file']}: {p['problem']}" for p in problems[:5])
                                  + "); the upload was deleted", problems)
        os.utime(incoming)  # the install time, which gc's grace period counts from
        repaired = None
        if dest.exists() or dest.is_symlink():
            # A damaged or foreign entry under this id: the good copy is complete beside it before the
            # bad one is moved aside, so a slot pointing at this id is never left dangling.
            repaired = entry_problem(root, bid) or "files failed verification"
            quarantine = root / "store" / f".trash-{bid}-{os.getpid()}"
            os.replace(dest, quarantine)  # a link is moved as a link: nothing it points at is touched
            os.rename(incoming, dest)
            _remove_tree(quarantine)
        else:
            os.rename(incoming, dest)
    manifest = load_manifest(dest)
    return {"bundle_id": bid, "path": str(dest), "present": False, "repaired": repaired, "staging_swept": swept,
            "files": len(manifest.get("files", {})),
            "model": manifest.get("model", {}).get("name"), "target": manifest.get("target"),
            "precision": manifest.get("precision")}


# ---- leases: a bundle in use (a bench, a check) is never removed by gc -------------------------


@contextlib.contextmanager
def lease(root: Path, bundle_ids: list[str]) -> Iterator[None]:
    """Hold ``bundle_ids`` for the length of a verb: a file ``leases/<pid>-<n>.json`` written under the store
    lock after checking that every entry is there (so gc, which reads leases under the same lock, either
    ran before — and the verb finds the bundle missing — or keeps them). A lease whose process is gone
    (killed, host rebooted) is ignored and swept by the next gc."""
    ids = [check_id(b) for b in bundle_ids]
    with locked(root):
        for bid in ids:
            problem = entry_problem(root, bid)
            if problem == "missing":
                raise StoreError(f"bundle {bid[:12]}… is not installed in {root / 'store'}; install it first")
        if read_only(root):  # nothing can be removed from a read-only store: no lease is needed (or writable)
            path = None
        else:
            path = _write_lease(root, ids)
    try:
        yield
    finally:
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()


def _write_lease(root: Path, ids: list[str]) -> Path:
    d = root / "leases"
    d.mkdir(exist_ok=True, mode=0o700)
    path = d / f"{os.getpid()}-{time.monotonic_ns()}.json"
    _write_json_atomic(path, {"pid": os.getpid(), "boot": _boot_id(), "bundle_ids": ids, "since": _now_iso()})
    return path


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _live_leases(root: Path, drop_stale: bool = True) -> set[str]:
    """Bundle ids held by leases whose process still runs (same boot); stale lease files are removed."""
    held: set[str] = set()
    d = root / "leases"
    boot = _boot_id()
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            data = json.loads(f.read_text())
            pid = int(data["pid"])
            alive = data.get("boot") == boot
            if alive:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    alive = False
                except PermissionError:
                    pass  # someone else's process with that pid: keep the lease, to be safe
        except (OSError, ValueError, KeyError, TypeError):
            alive = False  # unreadable: a half-written lease of a dead writer (leases are written atomically)
            data = {}
        if alive:
            held |= {b for b in data.get("bundle_ids", []) if isinstance(b, str)}
        elif drop_stale:
            with contextlib.suppress(OSError):
                f.unlink()
    return held


def free_mb(root: Path) -> float | None:
    """Free space (MB) where the store lives (its nearest existing parent when not created yet)."""
    p = root
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except (OSError, AttributeError):
        return None
    return round(st.f_bavail * st.f_frsize / (1 << 20), 1)


def read_only(root: Path) -> bool:
    """Whether the filesystem where the store lives (or would be created) is mounted read-only."""
    p = root
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return bool(os.statvfs(p).f_flag & getattr(os, "ST_RDONLY", 1))
    except (OSError, AttributeError):
        return False


STALE_UPLOAD_S = 900.0  # an upload untouched this long was interrupted: its bytes are reclaimed


def _last_write(entry: Path) -> float:
    """When anything in an upload was last written: the newest mtime of the folder and every file in it
    (a file being written keeps its own mtime fresh; the folder's alone does not change then)."""
    times = [entry.lstat().st_mtime]
    for p in entry.rglob("*"):
        with contextlib.suppress(OSError):
            times.append(p.lstat().st_mtime)
    return max(times)


def sweep_staging(root: Path, keep: Path | None = None, stale_s: float = STALE_UPLOAD_S) -> list[str]:
    """Remove interrupted uploads: staging folders with no file written for ``stale_s`` seconds."""
    staging, now, removed = root / "staging", time.time(), []
    for entry in sorted(staging.iterdir()) if staging.is_dir() else []:
        if keep is not None and entry == keep:
            continue
        if now - _last_write(entry) >= stale_s and not _writers(entry, any_use=True):
            _remove_tree(entry)
            removed.append(entry.name)
    return removed


def has(root: Path, bundle_ids: Any) -> dict[str, bool]:
    """Which of these bundles are installed."""
    if not isinstance(bundle_ids, list):
        raise StoreError("has needs 'bundle_ids': a list of bundle ids")
    return {check_id(b): installed(root, b) for b in bundle_ids}


# ---- slots ------------------------------------------------------------------------------------


def _slot_dir(root: Path, slot: str) -> Path:
    return root / "slots" / check_slot(slot)


def read_slot(root: Path, slot: str) -> dict[str, Any]:
    """``{"current": id|None, "history": [ids], "trial": {...}|None, "reverted": {...}|None}``."""
    path = _slot_dir(root, slot) / STATE
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return {"current": None, "history": [], "trial": None, "reverted": None}
    except (OSError, ValueError) as exc:
        raise StoreError(f"slot state {path} is unreadable: {exc}") from None
    return {"current": state.get("current"), "history": list(state.get("history") or []),
            "trial": state.get("trial"), "reverted": state.get("reverted")}


def _link(slot_dir: Path, name: str, root: Path, bundle_id: str | None) -> None:
    """Point ``slot_dir/name`` at the store entry (relative, so the root can move), atomically."""
    link = slot_dir / name
    if bundle_id is None:
        with contextlib.suppress(FileNotFoundError):
            link.unlink()
        return
    tmp = slot_dir / f".{name}.tmp-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.symlink(os.path.relpath(store_path(root, bundle_id), slot_dir), tmp)
        os.replace(tmp, link)
    except OSError:  # a filesystem without symlinks (FAT): state.json stays the truth
        with contextlib.suppress(OSError):
            tmp.unlink()


def _now_iso(t: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _write_slot(root: Path, slot: str, current: str | None, history: list[str],
                trial: dict[str, Any] | None = None, reverted: dict[str, Any] | None = None) -> dict[str, Any]:
    d = _slot_dir(root, slot)
    level = root
    for part in ("slots", *check_slot(slot).split("/")):  # every level private (0700), as the root is
        level = level / part
        level.mkdir(exist_ok=True, mode=0o700)
    _write_json_atomic(d / STATE, {"current": current, "history": history, "trial": trial,
                                   "reverted": reverted, "updated_at": _now_iso()})
    _link(d, "previous", root, history[0] if history else None)
    _link(d, "current", root, current)
    return {"slot": slot, "current": current, "previous": history[0] if history else None, "history": history,
            "trial": trial}


def default_slot(root: Path, bundle_id: str) -> str:
    m = load_manifest(store_path(root, bundle_id))
    return f"{_slot_part(m.get('model', {}).get('name'))}/{_slot_part(m.get('target'))}"


def activate(root: Path, bundle_id: Any, slot: Any = None, confirm_within_s: Any = None) -> dict[str, Any]:
    """Make an installed bundle the slot's current one; the one it replaces becomes ``previous``.

    With ``confirm_within_s`` the activation is a *trial*: unless ``commit`` confirms it within that
    many seconds, the agent puts the previous bundle back by itself (see ``expire_trials``)."""
    bid = check_id(bundle_id)
    if confirm_within_s is not None and (not isinstance(confirm_within_s, (int, float))
                                         or isinstance(confirm_within_s, bool) or not 0 < confirm_within_s <= 7 * 86400):
        raise StoreError(f"confirm_within_s must be a number of seconds in (0, 604800], got {confirm_within_s!r}")
    with locked(root):  # the check and the change under one lock: gc cannot remove it in between
        problem = entry_problem(root, bid)
        if problem:
            raise StoreError(f"bundle {bid[:12]}… is not installed ({problem}); install it before activating")
        slot = check_slot(slot) if slot is not None else default_slot(root, bid)
        state = read_slot(root, slot)
        cur = state["current"]
        trial = None
        if confirm_within_s is not None:
            deadline = time.time() + float(confirm_within_s)
            prev = state["trial"]["previous"] if state["trial"] and cur == bid else cur
            trial = {"bundle_id": bid, "previous": prev, "deadline": deadline, "deadline_at": _now_iso(deadline),
                     "armed_at": _now_iso()}
        if cur == bid:
            res = _write_slot(root, slot, cur, state["history"], trial or state["trial"])
            changed = False
        else:
            history = ([cur] if cur else []) + [h for h in state["history"] if h not in (bid, cur)]
            res = _write_slot(root, slot, bid, history, trial)
            changed = True
    if trial is not None:
        res["watchdog"] = _spawn_watchdog(root, slot, trial["deadline"])
    return {**res, "changed": changed}


def commit(root: Path, slot: Any, bundle_id: Any) -> dict[str, Any]:
    """Confirm a trial activation: the slot keeps ``bundle_id`` for good."""
    slot, bid = check_slot(slot), check_id(bundle_id)
    with locked(root):
        _expire_locked(root, time.time())
        state = read_slot(root, slot)
        trial = state["trial"]
        if trial and trial.get("bundle_id") == bid:
            res = _write_slot(root, slot, state["current"], state["history"], None)
            return {**res, "committed": True}
        if state["current"] == bid and not trial:
            return {**_write_slot(root, slot, bid, state["history"]), "committed": False,
                    "note": "already the confirmed current bundle"}
        rev = state.get("reverted") or {}
        if rev.get("bundle_id") == bid:
            raise StoreError(f"the trial of {bid[:12]}… in slot {slot!r} expired and was reverted at "
                             f"{rev.get('at')} ({rev.get('reason')}); activate it again")
        raise StoreError(f"slot {slot!r} has no trial of {bid[:12]}… to commit (current: "
                         f"{(state['current'] or 'none')[:12]})")


def _expire_locked(root: Path, now: float) -> list[dict[str, Any]]:
    out = []
    for name, state in slots(root).items():
        trial = state.get("trial")
        if not trial or float(trial.get("deadline", 0)) > now:
            continue
        prev = trial.get("previous")
        if prev and not installed(root, prev):
            prev = None
        history = [h for h in state["history"] if h not in (prev, trial["bundle_id"])]
        history = ([trial["bundle_id"]] if state["current"] == trial["bundle_id"] else []) + history
        reverted = {"bundle_id": trial["bundle_id"], "to": prev, "at": _now_iso(now),
                    "reason": f"not committed by {trial.get('deadline_at')}"}
        _write_slot(root, name, prev, history, None, reverted)
        out.append({"slot": name, **reverted})
    return out


def expire_trials(root: Path) -> list[dict[str, Any]]:
    """Revert every trial past its deadline (run at the start of every agent call and by the watchdog)."""
    if not (root / "slots").is_dir():
        return []
    with locked(root):
        return _expire_locked(root, time.time())


def _spawn_watchdog(root: Path, slot: str, deadline: float) -> dict[str, Any]:
    """A detached process that reverts the trial at its deadline even if no agent call comes; it exits
    right after (a commit made meanwhile leaves it nothing to do).  No daemon is left running."""
    import subprocess
    import sys

    req = root / f".watchdog-{os.getpid()}-{int(deadline * 1000)}.json"
    _write_json_atomic(req, {"root": str(root), "slot": slot, "deadline": deadline})
    pkg_parent = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": pkg_parent + (os.pathsep + os.environ["PYTHONPATH"]
                                                     if os.environ.get("PYTHONPATH") else "")}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "edgeopt_agent", "watchdog", "--request", str(req)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True, env=env, cwd=str(root))
    except OSError as exc:  # the next agent call reverts it anyway
        return {"pid": None, "error": str(exc)}
    return {"pid": proc.pid}


WATCHDOG_POLL_S = 1.0  # how often a watchdog looks whether its trial is still pending


def _trial_pending(root: Path, slot: str, deadline: float) -> bool:
    """The slot still holds the trial this watchdog was spawned for (not committed, rolled back,
    reverted, or replaced by a newer trial, which has a watchdog of its own)."""
    try:
        trial = read_slot(root, slot)["trial"]
    except StoreError:
        return True  # unreadable now: keep watching, the deadline decides
    return bool(trial) and abs(float(trial.get("deadline", 0)) - float(deadline)) < 1e-3


def watchdog(root: Path, slot: Any, deadline: Any, request_file: str | None = None) -> dict[str, Any]:
    """Wait until the deadline, then revert the trial if it is still unconfirmed; exit as soon as the
    trial is committed (or rolled back, or re-armed by a newer trial): no idle watchdog is left behind."""
    slot = check_slot(slot)
    if request_file:
        with contextlib.suppress(OSError):
            os.unlink(request_file)
    while True:
        delay = float(deadline) - time.time()
        if not _trial_pending(root, slot, float(deadline)):
            return {"reverted": [], "exited": "the trial is no longer pending (committed, rolled back or re-armed)"}
        if delay <= 0:
            break
        time.sleep(min(WATCHDOG_POLL_S, delay + 0.05))
    return {"reverted": expire_trials(root)}


def rollback(root: Path, slot: Any, to_empty: bool = False) -> dict[str, Any]:
    """current <- previous; the rolled-back bundle leaves the history (gc may then remove it).
    ``to_empty``: a slot with no previous version goes back to nothing active (a rollout halted after a
    device's first install puts it back as it was); without it that is refused."""
    slot = check_slot(slot)
    with locked(root):
        state = read_slot(root, slot)
        trial = state.get("trial")
        if trial:  # undoing a trial puts back exactly what it replaced (nothing, on a first activation)
            prev = trial.get("previous") if trial.get("previous") and installed(root, trial["previous"]) else None
            history = [h for h in state["history"] if h not in (prev, trial["bundle_id"])]
            reverted = {"bundle_id": trial["bundle_id"], "to": prev, "at": _now_iso(), "reason": "rolled back"}
            res = _write_slot(root, slot, prev, history, None, reverted)
            return {**res, "rolled_back": state["current"]}
        if state["current"] is None:
            raise StoreError(f"slot {slot!r} has never been activated")
        history = [h for h in state["history"] if installed(root, h)]
        if not history and not to_empty:
            raise StoreError(f"slot {slot!r} has no previous version to roll back to")
        res = _write_slot(root, slot, history[0], history[1:]) if history else _write_slot(root, slot, None, [])
    return {**res, "rolled_back": state["current"]}


def slots(root: Path) -> dict[str, dict[str, Any]]:
    """Every slot's state, keyed by slot name."""
    base = root / "slots"
    out = {}
    for state in sorted(base.rglob(STATE)) if base.is_dir() else []:
        name = state.parent.relative_to(base).as_posix()
        out[name] = read_slot(root, name)
    return out


def _size_mb(path: Path) -> float:
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    return round(total / (1 << 20), 3)


def gc(root: Path, keep: Any = 3, grace_s: Any = 3600, dry_run: bool = False) -> dict[str, Any]:
    """Keep each slot's current version, its armed trial, bundles a running verb holds (``lease``) and
    ``keep`` previous versions besides them
    (the rollback targets: ``keep=1`` keeps exactly the one ``rollback`` goes back to, ``keep=0`` none);
    remove store entries nothing refers to (older than ``grace_s``: a bundle just installed for a bench
    is not yet in any slot) and stale uploads in ``staging/``."""
    if not isinstance(keep, int) or isinstance(keep, bool) or keep < 0:
        raise StoreError(f"keep must be an integer >= 0 (previous versions kept per slot besides the current "
                         f"one), got {keep!r}")
    if not isinstance(grace_s, (int, float)) or isinstance(grace_s, bool) or grace_s < 0:
        raise StoreError(f"grace_s must be a number >= 0, got {grace_s!r}")
    now = time.time()
    removed, kept, staging_removed = [], [], []
    freed = 0.0
    with locked(root):
        referenced = set()
        for name, state in slots(root).items():
            trial = state.get("trial") or {}
            history = state["history"][:keep]
            if trial.get("previous") and trial["previous"] not in history:
                history = [trial["previous"], *history]  # an armed trial's way back is never trimmed
            if history != state["history"] and not dry_run:
                _write_slot(root, name, state["current"], history, state.get("trial"), state.get("reverted"))
            referenced |= {state["current"], *history, trial.get("bundle_id"), trial.get("previous")} - {None}
        leased = _live_leases(root, drop_stale=not dry_run)
        store = root / "store"
        for entry in sorted(store.iterdir()) if store.is_dir() else []:
            if entry.name.startswith((".trash-", ".incoming-")):  # an earlier gc/install was interrupted
                if not dry_run:
                    shutil.rmtree(entry, ignore_errors=True)
                continue
            if not ID_RE.match(entry.name):
                continue
            if entry.name in referenced or entry.name in leased or now - entry.stat().st_mtime < grace_s:
                kept.append(entry.name)
                continue
            freed += _size_mb(entry)
            removed.append(entry.name)
            if not dry_run:
                _remove_tree(entry)
        staging = root / "staging"
        for entry in sorted(staging.iterdir()) if staging.is_dir() else []:
            # by its newest file, and never one a process still holds open (a clock step can make a file
            # being written look old; the SFTP server's descriptor says it is not)
            if now - _last_write(entry) >= grace_s and not _writers(entry, any_use=True):
                staging_removed.append(entry.name)
                if not dry_run:
                    _remove_tree(entry)
    return {"removed": removed, "kept": kept, "staging_removed": staging_removed,
            "freed_mb": round(freed, 3), "dry_run": bool(dry_run), "keep": keep}


def listing(root: Path) -> dict[str, Any]:
    """Installed bundles (id, model, target, precision, size, install time) and every slot."""
    bundles = []
    store = root / "store"
    for entry in sorted(store.iterdir()) if store.is_dir() else []:
        if not ID_RE.match(entry.name) or not (entry / MANIFEST).is_file():
            continue
        try:
            m = load_manifest(entry)
        except BundleError:
            m = {}
        bundles.append({"bundle_id": entry.name, "model": m.get("model", {}).get("name"),
                        "target": m.get("target"), "precision": m.get("precision"), "size_mb": _size_mb(entry),
                        "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry.stat().st_mtime))})
    return {"root": str(root), "bundles": bundles, "slots": slots(root)}
