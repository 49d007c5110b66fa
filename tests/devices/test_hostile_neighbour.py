"""The device side against a careless or hostile neighbour (issue 29), over a real sshd on 127.0.0.1:
a planted agent never runs (the agent is checked file by file against the host's copy, from a root only
its user controls, before any of its code runs), a damaged agent is repaired by push, and `devices gc
--keep N` keeps N rollback targets besides the current bundle."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgeopt.deploy import agent_package, load_bundle, push
from edgeopt.inventory import make_device

from .conftest import device_entry, known_hosts, write_inventory


def _dev(ssh_env, server, tmp_path, root: Path, name="box"):
    return make_device(name, device_entry(ssh_env, server, root, known_hosts(tmp_path / f"kh-{name}", server),
                                          target="cpu"))


def _plant(root: Path, proof: Path, agent_dir: Path | None = None) -> Path:
    """What user B leaves: this version's agent folder, complete, whose ``__init__`` records who ran it."""
    pkg = agent_package()
    pkg_dir = (agent_dir or root / "agent" / pkg.dirname) / "edgeopt_agent"
    for rel, local in pkg.files:
        (pkg_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, pkg_dir / rel)
    init = pkg_dir / "__init__.py"
    init.write_text(init.read_text() + f"\nimport os as _o\nopen({str(proof)!r}, 'a').write(str(_o.getuid()))\n")
    return pkg_dir


def test_a_planted_agent_in_a_root_others_can_write_never_runs(ssh_env, sshd, tmp_path, cls_bundle):
    root, proof = tmp_path / "shared" / "edgeopt", tmp_path / "proof"
    _plant(root, proof)
    for p in (root, root / "agent", *(root / "agent").rglob("*")):
        os.chmod(p, 0o777 if p.is_dir() else 0o666)  # B made it for everyone
    r = push([_dev(ssh_env, sshd, tmp_path, root)], [load_bundle(cls_bundle)], activate=True)[0]
    assert not r.ok and "refusing to run the agent" in r.error and "writable by group and others (mode 0777)" \
        in r.error and "chmod 700" in r.error, r.error
    assert len(r.error.splitlines()) <= 2 and "Traceback" not in r.error  # one line + its hint
    assert not proof.exists()  # B's code never ran
    assert not (root / "store").exists()


@pytest.fixture
def neighbour():
    """A real second local user (created for the test, removed after); needs root to create it."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("creating a second local user needs root and useradd")
    name = f"eo-nb{os.getpid() % 100000}"
    p = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], capture_output=True,
                       text=True)
    if p.returncode:
        pytest.skip(f"useradd failed: {p.stderr.strip()[:200]}")
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def test_a_planted_agent_in_a_root_another_user_owns_never_runs(ssh_env, sshd, tmp_path, cls_bundle, neighbour):
    root, proof = tmp_path / "edgeopt", tmp_path / "proof"
    _plant(root, proof)
    for p in (root, *root.rglob("*")):  # B's folders, modes as careful as can be: only ownership is wrong
        os.chown(p, neighbour.pw_uid, neighbour.pw_gid)
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    r = push([_dev(ssh_env, sshd, tmp_path, root)], [load_bundle(cls_bundle)], activate=True)[0]
    assert not r.ok and "refusing to run the agent" in r.error and f"owned by {neighbour.pw_name}" in r.error, r.error
    assert not proof.exists()
    # A parent another user owns is refused the same way, even when the root itself is ours.
    parent = tmp_path / "theirs"
    parent.mkdir()
    own_root = parent / "edgeopt"
    _plant(own_root, proof)
    os.chown(parent, neighbour.pw_uid, neighbour.pw_gid)
    r = push([_dev(ssh_env, sshd, tmp_path, own_root, "b")], [load_bundle(cls_bundle)])[0]
    assert not r.ok and f"{parent} (a parent of the agent root) is owned by {neighbour.pw_name}" in r.error, r.error
    assert not proof.exists()


def test_a_sticky_world_writable_parent_is_fine_for_our_own_private_root(ssh_env, sshd, tmp_path, cls_bundle):
    shared = tmp_path / "tmp-like"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # like /tmp: others cannot rename or delete our folder in it
    r = push([_dev(ssh_env, sshd, tmp_path, shared / "edgeopt")], [load_bundle(cls_bundle)])[0]
    assert r.ok and r.bundles[0].status == "installed", r.error
    os.chmod(shared, 0o777)  # without the sticky bit, anyone can swap our root for theirs
    r = push([_dev(ssh_env, sshd, tmp_path, shared / "edgeopt")], [load_bundle(cls_bundle)])[0]
    assert not r.ok and "a parent of the agent root) is writable by others (mode 0777)" in r.error, r.error


def _pinned_agent(tmp_path: Path, monkeypatch) -> None:
    """This checkout's agent, copied once: its digest cannot change under the test while someone edits
    device_agents/ (the real files, only frozen in time)."""
    import edgeopt.deploy as deploy

    pkg = agent_package()
    snap = tmp_path / "agent-snapshot"
    files = []
    for rel, local in pkg.files:
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, snap / rel)
        files.append((rel, snap / rel))
    pinned = deploy.AgentPackage(pkg.version, pkg.digest, tuple(files))
    monkeypatch.setattr(deploy, "agent_package", lambda: pinned)


def test_a_damaged_or_altered_agent_is_reinstalled_before_it_runs(ssh_env, sshd, tmp_path, cls_bundle,
                                                                   monkeypatch):
    _pinned_agent(tmp_path, monkeypatch)
    root, proof = tmp_path / "root", tmp_path / "proof"
    dev, b = _dev(ssh_env, sshd, tmp_path, root), load_bundle(cls_bundle)
    first = push([dev], [b])[0]
    assert first.ok
    agent_dir = Path(first.agent["path"])
    store_py = agent_dir / "edgeopt_agent" / "store.py"
    store_py.write_bytes(store_py.read_bytes()[:500])  # truncated: a SyntaxError for every verb
    r = push([dev], [b], verify=True)[0]
    assert r.ok and r.agent["uploaded"] and r.agent["path"] == str(agent_dir), r.error
    import edgeopt.deploy as deploy

    assert store_py.read_bytes() == dict(deploy.agent_package().files)["store.py"].read_bytes()
    # Our own private root, but agent files that are not the host's: replaced before anything is imported.
    _plant(root, proof, agent_dir)
    (agent_dir / "numpy.py").write_text(f"open({str(proof)!r}, 'a').write('numpy')\n")
    r = push([dev], [b], activate=True)[0]
    assert r.ok and r.agent["uploaded"] and r.bundles[0].activated, r.error
    assert not proof.exists() and not (agent_dir / "numpy.py").exists()
    assert not [p for p in (root / "agent").iterdir() if p.name.startswith((".tmp-", ".trash-"))]
    r = push([dev], [b])[0]
    assert r.ok and not r.agent["uploaded"]  # a verified agent is used as it is


def _edgeopt(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_gc_keep_1_keeps_the_rollback_target_through_the_cli(ssh_env, sshd, tmp_path, cls_bundle):
    v2 = tmp_path / "dist2" / "v2"
    shutil.copytree(cls_bundle, v2)
    m = json.loads((v2 / "manifest.json").read_text())
    m["notes"] = [*(m.get("notes") or []), "v2: same files, another manifest, another id"]
    (v2 / "manifest.json").write_text(json.dumps(m, indent=1))
    b1, b2 = load_bundle(cls_bundle), load_bundle(v2)
    assert b1.bundle_id != b2.bundle_id
    inv = write_inventory(tmp_path / "inv.yaml", {"dev": device_entry(ssh_env, sshd, tmp_path / "root",
                                                                      known_hosts(tmp_path / "kh", sshd),
                                                                      target="cpu")})
    for dist in (cls_bundle, v2):
        p = _edgeopt("push", str(dist), "--devices", str(inv), "--activate", cwd=tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
    p = _edgeopt("devices", "gc", "--devices", str(inv), "--keep", "1", "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert '"keep": 1' in p.stdout and json.loads(p.stdout), p.stdout
    state = json.loads((tmp_path / "root" / "slots" / b1.model / "cpu" / "state.json").read_text())
    assert state["current"] == b2.bundle_id and state["history"] == [b1.bundle_id]
    p = _edgeopt("rollback", "--devices", str(inv), "--model", b1.model, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    state = json.loads((tmp_path / "root" / "slots" / b1.model / "cpu" / "state.json").read_text())
    assert state["current"] == b1.bundle_id
    # --keep 0 works too (no rollback target is kept): said by the agent, not refused on every device
    p = _edgeopt("devices", "gc", "--devices", str(inv), "--keep", "0", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
