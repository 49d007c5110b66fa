"""The SSH transport against a real OpenSSH server: host keys, authentication, ~/.ssh/config, quoting."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from edgeopt.errors import DeviceError, HostKeyError
from edgeopt.inventory import make_device
from edgeopt.transport import AuthFailed, SshTransport, connect

from .conftest import device_entry, keygen, known_hosts


def _dev(ssh_env, sshd, tmp_path, known, **extra):
    return make_device("box", device_entry(ssh_env, sshd, tmp_path / "root", known, **extra))


def test_ssh_connects_with_known_host_key_and_runs_quoted_command(ssh_env, sshd, tmp_path):
    dev = _dev(ssh_env, sshd, tmp_path, known_hosts(tmp_path / "known_hosts", sshd))
    t0 = time.perf_counter()
    with connect(dev) as tr:
        connect_s = time.perf_counter() - t0
        weird = "it's $HOME; `id` && echo pwned | cat"
        rc, out, err = tr.run(["printf", "%s|", weird, "a b"], stdin=None)
        assert (rc, out) == (0, f"{weird}|a b|"), err  # nothing was expanded or executed by the shell
        rc, out, _ = tr.run(["cat"], stdin="from stdin\n")
        assert (rc, out) == (0, "from stdin\n")
        rc, _, _ = tr.run(["sh", "-c", "exit 7"])
        assert rc == 7
    print(f"paramiko connect + auth: {connect_s:.3f}s")


def test_ssh_unknown_host_key_refused_unless_trusted_then_recorded(ssh_env, sshd, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    dev = _dev(ssh_env, sshd, tmp_path, known)
    with pytest.raises(HostKeyError) as e:
        connect(dev)
    assert "not in" in str(e.value) and "--trust-new-host-keys" in str(e.value) and "SHA256:" in str(e.value)
    assert known.read_text() == ""  # refusing records nothing
    tr = SshTransport(dev, trust_new_host_keys=True).connect()
    tr.close()
    assert tr.new_host_key and known.read_text() == sshd.host_key_line  # recorded exactly
    connect(dev).close()  # and now trusted without the flag


def test_ssh_changed_host_key_always_refused(ssh_env, sshd, tmp_path):
    other = keygen(tmp_path / "other_host_key")
    kind, b64 = (tmp_path / "other_host_key.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {kind} {b64}\n")
    dev = _dev(ssh_env, sshd, tmp_path, known)
    for trust in (False, True):
        with pytest.raises(HostKeyError, match="CHANGED") as e:
            SshTransport(dev, trust_new_host_keys=trust).connect()
        assert "ssh-keygen -R" in str(e.value)
    assert known.read_text() == f"[127.0.0.1]:{sshd.port} {kind} {b64}\n"
    assert other.exists()


def test_ssh_wrong_key_refused(ssh_env, sshd, tmp_path):
    dev = _dev(ssh_env, sshd, tmp_path, known_hosts(tmp_path / "kh", sshd), key_file=str(ssh_env.wrong_key))
    said: list[str] = []
    with pytest.raises(AuthFailed, match="authentication") as e:
        connect(dev, retries=2, progress=said.append)
    assert said == []  # an auth failure is final: no "retrying" (unlike a network error)
    assert e.value.exit_code == 4 and "authorized_keys" in str(e.value)


def test_ssh_unreachable_port_is_a_device_error(ssh_env, sshd, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dev = make_device("gone", {"host": "127.0.0.1", "port": port, "ssh_config": "none", "connect_timeout": 2,
                               "known_hosts": str(tmp_path / "kh")})
    said: list[str] = []
    with pytest.raises(DeviceError, match="cannot connect"):
        connect(dev, retries=1, progress=said.append)
    assert len(said) == 1 and "retrying" in said[0]  # network errors are retried


def test_ssh_config_supplies_hostname_port_user_key(ssh_env, sshd, tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host labbox\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {ssh_env.user}\n"
                   f"  IdentityFile {ssh_env.user_key}\n  UserKnownHostsFile {known_hosts(tmp_path / 'kh', sshd)}\n")
    dev = make_device("labbox", {"host": "labbox", "ssh_config": str(cfg)})
    with connect(dev) as tr:
        assert tr.params.port == sshd.port and tr.params.hostname == "127.0.0.1"
        assert tr.run(["true"])[0] == 0


def test_ssh_command_timeout(ssh_env, sshd, tmp_path):
    from edgeopt.transport import DeviceTimeout

    dev = _dev(ssh_env, sshd, tmp_path, known_hosts(tmp_path / "kh", sshd))
    with connect(dev) as tr:
        with pytest.raises(DeviceTimeout, match="ran past 1s"):
            tr.run(["sleep", "30"], timeout=1)
        assert tr.run(["true"])[0] == 0  # the connection is still usable


def test_a_missing_key_file_is_refused_at_once_not_retried_as_a_network_error(ssh_env, sshd, tmp_path):
    dev = _dev(ssh_env, sshd, tmp_path, known_hosts(tmp_path / "kh", sshd), key_file=str(tmp_path / "nope"))
    said: list[str] = []
    t0 = time.perf_counter()
    with pytest.raises(AuthFailed, match="key file .*nope not found"):
        connect(dev, retries=2, progress=said.append)
    assert said == [] and time.perf_counter() - t0 < 2


def test_a_port_that_never_speaks_ssh_is_reported_once(tmp_path):
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held = []
    threading.Thread(target=lambda: [held.append(srv.accept()) for _ in range(4)], daemon=True).start()
    dev = make_device("silent", {"host": "127.0.0.1", "port": srv.getsockname()[1], "ssh_config": "none",
                                 "connect_timeout": 2, "known_hosts": str(tmp_path / "kh")})
    said: list[str] = []
    t0 = time.perf_counter()
    with pytest.raises(DeviceError, match="never spoke SSH"):
        connect(dev, retries=2, progress=said.append)
    assert said == [] and time.perf_counter() - t0 < 5  # was 3 tries x the banner timeout
    srv.close()


def test_known_hosts_markers_are_read_as_openssh_reads_them(ssh_env, sshd, tmp_path):
    """A corporate known_hosts: @cert-authority and @revoked lines for other hosts, a hashed line, a line that
    does not parse; none of them breaks this host (it used to: "Error('Incorrect padding')")."""
    import subprocess

    other = keygen(tmp_path / "other_ca")
    ca_pub = " ".join(Path(f"{other}.pub").read_text().split()[:2])
    known = tmp_path / "known_hosts"
    known.write_text(f"@cert-authority *.corp.example {ca_pub}\n"
                     f"@revoked * {ca_pub}\n"
                     "broken-line ssh-ed25519 !!!not-base64!!!\n"
                     "# a comment\n" + sshd.host_key_line)
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], check=True, capture_output=True)  # hash the names
    assert "[127.0.0.1]" not in known.read_text()
    with connect(_dev(ssh_env, sshd, tmp_path, known)) as tr:
        assert tr.run(["true"])[0] == 0
    # The device's own key marked @revoked: refused, even beside its plain line, even with trust on first use.
    host_pub = " ".join(sshd.host_key_line.split()[1:3])
    known.write_text(f"@revoked * {host_pub}\n" + sshd.host_key_line)
    with pytest.raises(HostKeyError, match="marked @revoked"):
        connect(_dev(ssh_env, sshd, tmp_path, known))
    known.write_text(f"@revoked * {host_pub}\n")
    with pytest.raises(HostKeyError, match="marked @revoked"):
        connect(_dev(ssh_env, sshd, tmp_path, known), trust_new_host_keys=True)
    assert known.read_text() == f"@revoked * {host_pub}\n"  # not recorded
    # A @cert-authority for this very host: paramiko cannot check host certificates; said in the refusal.
    known.write_text(f"@cert-authority [127.0.0.1]:{sshd.port} {ca_pub}\n")
    with pytest.raises(HostKeyError, match="cert-authority for it, but edgeopt cannot verify host certificates"):
        connect(_dev(ssh_env, sshd, tmp_path, known))


def test_proxyjump_is_honoured_never_bypassed(ssh_env, tmp_path, cls_bundle):
    """ProxyJump in the ssh config: the device is reached through the jump host (its sshd logs the forward),
    two hops work, the jump host's key is checked too, and with the jump host down the push fails in one line
    instead of going to the device directly (it used to ignore ProxyJump and connect directly)."""
    from edgeopt.deploy import load_bundle, push

    from .conftest import Sshd

    device = ssh_env.make("behind-jump")
    jump = Sshd(tmp_path / "jump", [ssh_env.user_key])
    jump.config.write_text(jump.config.read_text().replace("LogLevel VERBOSE", "LogLevel DEBUG1"))
    jump.start()
    try:
        cfg = tmp_path / "ssh_config"
        cfg.write_text(f"Host jumpbox\n  HostName 127.0.0.1\n  Port {jump.port}\n  User {ssh_env.user}\n"
                       f"  IdentityFile {ssh_env.user_key}\n"
                       f"Host devbox devbox2\n  HostName 127.0.0.1\n  Port {device.port}\n"
                       "Host devbox\n  ProxyJump jumpbox\nHost devbox2\n  ProxyJump jumpbox,jumpbox\n")
        both = known_hosts(tmp_path / "kh", device, jump)

        def dev(alias, root, known=both):
            entry = {**device_entry(ssh_env, device, tmp_path / root, known), "host": alias, "ssh_config": str(cfg)}
            entry.pop("port")
            return make_device(alias, entry)

        r = push([dev("devbox", "r1")], [load_bundle(cls_bundle)])[0]
        assert r.ok and r.bundles[0].status == "installed", r.error
        log = (jump.dir / "sshd.log").read_text()
        assert f"target 127.0.0.1 port {device.port}" in log  # the jump host forwarded it
        with connect(dev("devbox2", "r2")) as tr:  # two hops: jump -> jump -> device
            assert [h.port for h in tr.params.jumps] == [jump.port, jump.port] and tr.run(["true"])[0] == 0
        assert (jump.dir / "sshd.log").read_text().count(f"target 127.0.0.1 port {jump.port}") >= 1
        with pytest.raises(HostKeyError) as e:  # the jump host's key is checked like the device's
            connect(dev("devbox", "r3", known_hosts(tmp_path / "kh-dev-only", device)))
        assert f"[127.0.0.1]:{jump.port}" in str(e.value)
    finally:
        jump.stop()
    r = push([dev("devbox", "r4")], [load_bundle(cls_bundle)])[0]  # the jump host is down
    assert not r.ok and "jump host jumpbox" in r.error and "not contacted directly" in r.error, r.error
    assert not (tmp_path / "r4").exists()
