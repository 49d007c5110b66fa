"""Push over real SSH: agent and bundles installed once, re-push sends nothing, an interrupted push
leaves no half-installed bundle, a corrupted file on the device is caught by verify and repaired."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from edgeopt.deploy import DeviceSession, load_bundle, push
from edgeopt.inventory import local_device, make_device

from .conftest import device_entry, known_hosts


def _dev(ssh_env, server, tmp_path, name="box"):
    return make_device(name, device_entry(ssh_env, server, tmp_path / f"root-{name}",
                                          known_hosts(tmp_path / f"kh-{name}", server), target="cpu"))


def test_push_installs_then_second_push_sends_no_bundle_bytes(ssh_env, sshd, tmp_path, cls_bundle):
    dev, b = _dev(ssh_env, sshd, tmp_path), load_bundle(cls_bundle)
    first = push([dev], [b])[0]
    assert first.ok and first.bundles[0].status == "installed", first
    assert first.bytes_sent >= b.size and first.agent["uploaded"]
    store = tmp_path / "root-box" / "store" / b.bundle_id
    assert (store / "manifest.json").read_bytes() == (cls_bundle / "manifest.json").read_bytes()
    t0 = time.perf_counter()
    second = push([dev], [b])[0]
    assert second.ok and second.bundles[0].status == "present"
    assert second.bytes_sent == 0 and second.bundles[0].files_sent == 0 and not second.agent["uploaded"]
    print(f"\nfirst push {first.bytes_sent} bytes in {first.time_s:.2f}s; second push "
          f"{second.bytes_sent} bytes in {time.perf_counter() - t0:.2f}s")
    with DeviceSession.open(dev) as s:  # the agent runs from its versioned copy on the device
        rc, out, _ = s.transport.run([*s.python, "-c", "import edgeopt_agent; print(edgeopt_agent.__file__)"],
                                     cwd=s.agent_dir)
        assert rc == 0 and out.strip().startswith(s.agent_dir + "/edgeopt_agent/")
        assert s.has([b.bundle_id]) == {b.bundle_id: True}
        calls = []
        agent = s.agent
        s.agent = lambda verb, *a, **kw: calls.append(verb) or agent(verb, *a, **kw)
        s.listing([b.bundle_id])  # a rollout lists, then pushes: list answers has, one agent call less
        assert s.push([b]).bundles[0].status == "present" and calls == ["list"], calls
        assert s.has([b.bundle_id]) == {b.bundle_id: True} and calls == ["list", "has"]  # the answer is used once


def test_push_interrupted_by_dropped_connection_leaves_nothing_installed(ssh_env, tmp_path, big_bundle):
    server = ssh_env.make("interrupt")
    dev, b = _dev(ssh_env, server, tmp_path), load_bundle(big_bundle)
    root = tmp_path / "root-box"
    killed = threading.Event()

    def kill_mid_upload():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for f in (root / "staging").rglob("*.onnx") if (root / "staging").is_dir() else []:
                try:
                    if f.stat().st_size > 4 << 20:  # some MB of the artifact are on the device
                        server.kill()
                        killed.set()
                        return
                except FileNotFoundError:
                    pass
            time.sleep(0.005)

    watcher = threading.Thread(target=kill_mid_upload, daemon=True)
    watcher.start()
    res = push([dev], [b])[0]
    watcher.join(5)
    assert killed.is_set(), "the upload finished before it could be interrupted"
    assert not res.ok and "connection lost" in res.error, res
    reason = res.error.split("connection lost during", 1)[1].split("\n")[0].rsplit(": ", 1)[-1]
    assert reason.strip(), res.error  # never "connection lost …: " with nothing after it
    # what went over the wire before the drop is counted (it used to print "0 bytes sent")
    assert res.bundles and res.bundles[0].status == "failed" and res.bytes_sent >= 4 << 20, res
    assert not (root / "store" / b.bundle_id).exists()  # nothing half-installed
    partial = [p for p in (root / "staging").rglob("*.onnx")]
    assert partial and all(p.stat().st_size < b.size for p in partial)  # only the dead upload's temp file
    server.start()  # the device is back: a re-run completes
    again = push([dev], [b])[0]
    assert again.ok and again.bundles[0].status == "installed"
    with DeviceSession.open(dev) as s:
        assert s.verify(b.bundle_id)["ok"]


def test_push_corrupted_file_detected_by_verify_and_repaired(ssh_env, sshd, tmp_path, cls_bundle):
    dev, b = _dev(ssh_env, sshd, tmp_path, "corrupt"), load_bundle(cls_bundle)
    assert push([dev], [b])[0].ok
    model = tmp_path / "root-corrupt" / "store" / b.bundle_id / "model.onnx"
    os.chmod(model, 0o644)  # installed files are read-only; a disk error or a careless user does not care
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0xFF
    model.write_bytes(bytes(data))
    with DeviceSession.open(dev) as s:
        v = s.verify(b.bundle_id)
        assert not v["ok"] and v["problems"] == [{"file": "model.onnx", "problem": "sha256 mismatch"}]
    plain = push([dev], [b])[0]
    assert plain.bundles[0].status == "present"  # without --verify, `has` trusts the store
    fixed = push([dev], [b], verify=True)[0]
    assert fixed.ok and fixed.bundles[0].status == "repaired" and fixed.bytes_sent >= b.size
    with DeviceSession.open(dev) as s:
        assert s.verify(b.bundle_id)["ok"]


def test_push_local_device_shares_the_code_path(tmp_path, cls_bundle):
    dev, b = local_device(root=str(tmp_path / "local-root")), load_bundle(cls_bundle)
    r = push([dev], [b])[0]
    assert r.ok and r.bundles[0].status == "installed"
    assert (Path(tmp_path) / "local-root" / "store" / b.bundle_id / "model.onnx").is_file()
    again = push([dev], [b], activate=True)[0]
    assert again.bytes_sent == 0 and again.bundles[0].activated == f"{b.model}/cpu"
    current = Path(tmp_path) / "local-root" / "slots" / b.model / "cpu" / "current"
    assert current.resolve() == (Path(tmp_path) / "local-root" / "store" / b.bundle_id).resolve()


def test_push_refuses_manifest_with_unsafe_path(tmp_path, cls_bundle):
    import json
    import shutil

    from edgeopt.deploy import BundleNotValid

    bad = tmp_path / "bad"
    shutil.copytree(cls_bundle, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["files"]["../../etc/evil"] = {"sha256": "0" * 64, "size": 1}
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleNotValid, match="unsafe path"):
        load_bundle(bad)


def test_push_to_root_with_spaces_and_shell_characters(ssh_env, sshd, tmp_path, cls_bundle):
    root = tmp_path / "my root $HOME; touch pwned"
    entry = device_entry(ssh_env, sshd, root, known_hosts(tmp_path / "kh", sshd), target="cpu")
    r = push([make_device("odd", entry)], [load_bundle(cls_bundle)])[0]
    assert r.ok and (root / "store" / r.bundles[0].bundle_id / "manifest.json").is_file()
    assert not list(tmp_path.rglob("pwned"))


def test_missing_python_on_device_is_one_clear_error(ssh_env, sshd, tmp_path):
    from edgeopt.errors import DeviceError

    entry = device_entry(ssh_env, sshd, tmp_path / "r", known_hosts(tmp_path / "kh", sshd),
                         python="/nonexistent/python3")
    with pytest.raises(DeviceError) as e:  # found by the check that runs before any agent code
        DeviceSession.open(make_device("nopy", entry))
    assert "gave no reply" in str(e.value) and "python:" in str(e.value)


@pytest.mark.parametrize("artifact", ["/etc/passwd", "../../outside.onnx", "not-listed.onnx"])
def test_the_host_refuses_an_unsafe_runtime_artifact_before_sending(ssh_env, sshd, tmp_path, cls_bundle, artifact):
    import json
    import shutil
    import subprocess
    import sys

    from .conftest import write_inventory

    bad = tmp_path / "bad"
    shutil.copytree(cls_bundle, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["runtime"]["artifact"] = artifact
    (bad / "manifest.json").write_text(json.dumps(m))
    root = tmp_path / "root"
    inv = write_inventory(tmp_path / "inv.yaml", {"dev": device_entry(ssh_env, sshd, root,
                                                                      known_hosts(tmp_path / "kh", sshd),
                                                                      target="cpu")})
    p = subprocess.run([sys.executable, "-m", "edgeopt", "push", str(bad), "--devices", str(inv)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode == 2 and "runtime.artifact" in out and "Traceback" not in out, out
    assert not root.exists()  # nothing sent, not even the agent


def test_a_device_python_older_than_3_8_is_said_in_one_line(ssh_env, sshd, tmp_path):
    from edgeopt.errors import DeviceError

    old = Path.home() / ".pyenv" / "versions" / "3.6.15" / "bin" / "python3.6"
    if not old.exists():
        pytest.skip(f"no Python 3.6 here ({old}): pyenv install 3.6.15")
    entry = device_entry(ssh_env, sshd, tmp_path / "r", known_hosts(tmp_path / "kh", sshd), python=str(old))
    with pytest.raises(DeviceError) as e:
        DeviceSession.open(make_device("old", entry))
    assert e.value.message == "Python 3.6 on old is older than the agent needs (≥ 3.8)", e.value.message
    assert not (tmp_path / "r").exists()  # refused before anything was installed


def test_a_device_python_2_is_said_in_one_line_not_unknown_option(ssh_env, sshd, tmp_path):
    """Python 2.7 stops at ``-I`` before running a line of ours (issue 38, 13): named, not 'Unknown option'."""
    from edgeopt.errors import DeviceError

    old = Path.home() / ".pyenv" / "versions" / "2.7.18" / "bin" / "python2.7"
    if not old.exists():
        pytest.skip(f"no Python 2.7 here ({old}): pyenv install 2.7.18")
    entry = device_entry(ssh_env, sshd, tmp_path / "r", known_hosts(tmp_path / "kh", sshd), python=str(old))
    with pytest.raises(DeviceError) as e:
        DeviceSession.open(make_device("old2", entry))
    assert "older than Python 3.4" in e.value.message and "old2" in e.value.message, e.value.message
    assert "Unknown option" not in e.value.message
    assert not (tmp_path / "r").exists()


def test_the_push_command_prints_the_hint_of_a_failed_device(ssh_env, sshd, tmp_path, cls_bundle):
    """`edgeopt push`'s table keeps one line per failure; what to do about it (the error's hint) follows on
    stderr (issue 29 item 15: push printed no hints)."""
    import socket
    import subprocess
    import sys

    from .conftest import write_inventory

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    kh = known_hosts(tmp_path / "known_hosts", sshd)
    inv = write_inventory(tmp_path / "d.yaml", {
        "off": {**device_entry(ssh_env, sshd, tmp_path / "r", kh, target="cpu"), "port": dead, "connect_timeout": 2}})
    p = subprocess.run([sys.executable, "-m", "edgeopt", "push", str(cls_bundle), "--devices", str(inv)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 4 and "FAILED" in p.stdout, p.stdout + p.stderr
    assert "off: " in p.stderr and "hint:" in p.stderr and "Traceback" not in p.stderr, p.stderr
