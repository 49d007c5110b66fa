"""Inventory parsing: edgeopt YAML, Ansible INI and YAML, secrets and unknown keys refused."""

from __future__ import annotations

import dataclasses

import pytest

from edgeopt.inventory import InventoryError, load_inventory


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_inventory_native_yaml_with_defaults(tmp_path):
    inv = load_inventory(_write(tmp_path, "devices.yaml", """
defaults: {user: pi, key_file: ~/.ssh/lab}
devices:
  rpi5: {host: 192.168.1.20, target: mobile, labels: [lab, arm64], bench: {threads: 4}}
  orin: {host: orin.lab, port: 2222, user: nvidia, target: jetson, python: /usr/bin/python3.10, root: /data/edgeopt}
"""))
    rpi, orin = inv.get("rpi5"), inv.get("orin")
    assert (rpi.host, rpi.port, rpi.user, rpi.key_file, rpi.target) == ("192.168.1.20", None, "pi", "~/.ssh/lab", "mobile")
    assert rpi.labels == ("lab", "arm64") and rpi.bench_options == {"threads": 4}
    assert (orin.port, orin.user, orin.target, orin.root) == (2222, "nvidia", "jetson-orin", "/data/edgeopt")
    with pytest.raises(dataclasses.FrozenInstanceError):
        rpi.host = "elsewhere"


def test_inventory_local_is_builtin_and_default(tmp_path):
    assert [d.name for d in load_inventory(None).devices] == ["local"]
    assert load_inventory("local").devices[0].is_local
    inv = load_inventory(_write(tmp_path, "d.yaml", "devices:\n  a: {host: h, target: cpu}\n"))
    assert inv.get("local").is_local and [d.name for d in inv.select(["a,local"])] == ["a", "local"]


def test_inventory_unknown_key_refused_with_suggestion(tmp_path):
    p = _write(tmp_path, "d.yaml", "devices:\n  a: {host: h, targt: cpu}\n")
    with pytest.raises(InventoryError) as e:
        load_inventory(p)
    assert "targt" in str(e.value) and "did you mean 'target'" in str(e.value)


@pytest.mark.parametrize("key", ["password", "ssh_pass", "passphrase", "api_token", "secret"])
def test_inventory_secret_refused_native(tmp_path, key):
    p = _write(tmp_path, "d.yaml", f"devices:\n  a: {{host: h, {key}: hunter2}}\n")
    with pytest.raises(InventoryError) as e:
        load_inventory(p)
    assert key in str(e.value) and "secret" in str(e.value) and "hunter2" not in str(e.value)


def test_inventory_ansible_ini_groups_vars_and_children(tmp_path):
    p = _write(tmp_path, "hosts.ini", """
# a lab
[edge]
rpi5 ansible_host=192.168.1.20 ansible_user=pi edgeopt_target=mobile
orin1 ansible_host=10.0.0.5 ansible_port=2222 edgeopt_target=jetson "edgeopt_labels=gpu,fast"

[edge:vars]
ansible_ssh_private_key_file=~/.ssh/lab
ansible_python_interpreter=/usr/bin/python3

[lab:children]
edge

[lab:vars]
ansible_user=admin

[controller]
ctl ansible_connection=local
""")
    inv = load_inventory(p)
    rpi, orin, ctl = inv.get("rpi5"), inv.get("orin1"), inv.get("ctl")
    assert (rpi.host, rpi.user, rpi.key_file, rpi.python, rpi.target) == (
        "192.168.1.20", "pi", "~/.ssh/lab", "/usr/bin/python3", "mobile")
    assert orin.user == "admin"  # the parent group's var where neither host nor child group sets it
    assert (orin.port, orin.target) == (2222, "jetson-orin")
    assert set(rpi.labels) == {"edge", "lab"} and {"gpu", "fast", "edge"} <= set(orin.labels)
    assert ctl.is_local


def test_inventory_ansible_yaml(tmp_path):
    p = _write(tmp_path, "inventory.yml", """
all:
  vars: {ansible_user: ops}
  children:
    jetsons:
      vars: {edgeopt_target: jetson-orin}
      hosts:
        orin-a: {ansible_host: 10.1.0.1}
        orin-b: {ansible_host: 10.1.0.2, ansible_user: nvidia, ansible_become: true}
    phones:
      hosts:
        pixel: {ansible_host: 10.2.0.9, edgeopt_target: android}
""")
    inv = load_inventory(p)
    assert [d.name for d in inv.select(labels=["jetsons"])] == ["orin-a", "orin-b"]
    assert inv.get("orin-a").user == "ops" and inv.get("orin-b").user == "nvidia"
    assert inv.get("pixel").target == "android" and inv.get("pixel").host == "10.2.0.9"


@pytest.mark.parametrize("text,name", [
    ("[edge]\nrpi ansible_host=h ansible_password=x\n", "hosts.ini"),
    ("[edge]\nrpi ansible_host=h\n[edge:vars]\nansible_become_pass=x\n", "hosts.ini"),
    ("all:\n  hosts:\n    rpi: {ansible_host: h, ansible_ssh_pass: x}\n", "inv.yml"),
])
def test_inventory_ansible_secrets_refused(tmp_path, text, name):
    with pytest.raises(InventoryError, match="secret"):
        load_inventory(_write(tmp_path, name, text))


def test_inventory_ansible_unknown_edgeopt_var_refused(tmp_path):
    with pytest.raises(InventoryError, match="edgeopt_targte"):
        load_inventory(_write(tmp_path, "hosts.ini", "[e]\nrpi edgeopt_targte=cpu\n"))


@pytest.mark.parametrize("text,msg", [
    ("devices:\n  a: {target: cpu}\n", "no host"),
    ("devices:\n  a: {host: h, port: 70000}\n", "port"),
    ("devices: [1, 2]\n", "mapping"),
    ("devices:\n  a: {host: h}\n  'b c': {host: h}\n", "bad device name"),
    (": : :\n", "YAML"),
    ("devices:\n  a: {host: h, bench: {fast: true}}\n", "bench option"),
])
def test_inventory_bad_input_one_clear_error(tmp_path, text, msg):
    with pytest.raises(InventoryError, match=msg):
        load_inventory(_write(tmp_path, "d.yaml", text))


def test_inventory_missing_file_and_unknown_device(tmp_path):
    with pytest.raises(InventoryError, match="does not exist"):
        load_inventory(tmp_path / "nope.yaml")
    inv = load_inventory(_write(tmp_path, "d.yaml", "devices:\n  rpi5: {host: h}\n"))
    with pytest.raises(InventoryError, match="did you mean 'rpi5'"):
        inv.get("rpi4")


def test_cli_devices_lists_inventory_and_refuses_secret(tmp_path, capsys):
    from edgeopt.cli import main

    p = _write(tmp_path, "d.yaml", "devices:\n  rpi5: {host: 10.0.0.2, user: pi, target: mobile, labels: [lab]}\n")
    assert main(["devices", "--devices", str(p)]) == 0
    out = capsys.readouterr().out
    assert "rpi5" in out and "ssh pi@10.0.0.2" in out and "mobile" in out
    bad = _write(tmp_path, "bad.yaml", "devices:\n  rpi5: {host: h, password: hunter2}\n")
    assert main(["devices", "--devices", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("edgeopt: error:") and "Traceback" not in err and "hunter2" not in err


@pytest.mark.parametrize("values, word", [
    ({"host": "root:hunter2@127.0.0.1"}, "'host'"),
    ({"host": "h", "private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA"}, "private_key"),
    ({"host": "h", "ssh_pw": "x"}, "ssh_pw"), ({"host": "h", "db_pwd": "x"}, "db_pwd"),
    ({"host": "h", "passcode": "1234"}, "passcode"),
    # issue 29 item 11: other spellings of the same credential
    ({"host": "ssh://root:hunter2@127.0.0.1"}, "'host'"), ({"host": "root:hun/ter2@127.0.0.1"}, "'host'"),
    ({"host": "root:hunter2@@127.0.0.1"}, "'host'"), ({"host": "root:hunt@er2@127.0.0.1"}, "'host'"),
    ({"host": "h", "user": "root:hunter2"}, "'user'"),
])
def test_credentials_are_refused_by_value_too_and_never_echoed(values, word):
    from edgeopt.inventory import InventoryError, make_device

    with pytest.raises(InventoryError, match=word) as e:
        make_device("d", values)
    assert "hunter2" not in str(e.value) and "AAAA" not in str(e.value)


def test_a_device_defined_twice_is_refused_with_both_line_numbers(tmp_path):
    text = "devices:\n  rpi5:\n    host: 10.0.0.1\n  orin:\n    host: 10.0.0.2\n  rpi5:\n    host: 10.0.0.3\n"
    with pytest.raises(InventoryError) as e:
        load_inventory(_write(tmp_path, "devices.yaml", text))
    assert "'rpi5' is defined twice, on lines 2 and 6" in str(e.value)
    # YAML anchors still work: an override after a merge key is not a duplicate
    inv = load_inventory(_write(tmp_path, "anchors.yaml", "devices:\n  a: &base {host: h1, user: pi}\n"
                                                          "  b:\n    <<: *base\n    host: h2\n"))
    assert [(d.name, d.host, d.user) for d in inv.devices] == [("a", "h1", "pi"), ("b", "h2", "pi")]


@pytest.mark.parametrize("text, where", [
    ("devices:\n  a: {host: 127.0.0.1, port: 22401, port: 22402}\n", "'port' is defined twice, on line 2 (columns"),
    ("devices: {a: {host: h1}, b: {host: h2}, a: {host: h3}}\n", "'a' is defined twice, on line 1 (columns 11 and 41)"),
    ("devices: {a: {host: h1},\n  a: {host: h3}}\n", "'a' is defined twice, on lines 1 and 2"),
    ("devices:\n  a: {host: h1}\n  a:\n    host: h2\n", "'a' is defined twice, on lines 2 and 3"),
])
def test_a_key_given_twice_in_flow_style_is_refused_too(tmp_path, text, where):
    """issue 38: flow style (`a: {port: 1, port: 2}`, the README's own inventories) kept the last key silently."""
    with pytest.raises(InventoryError) as e:
        load_inventory(_write(tmp_path, "devices.yaml", text))
    assert where in str(e.value), str(e.value)


def test_an_ansible_host_in_two_groups_is_one_device_with_both_groups(tmp_path):
    inv = load_inventory(_write(tmp_path, "hosts.ini", "[jetson]\norin1 ansible_host=10.0.0.5\n\n[lab]\n"
                                                       "orin1 ansible_user=pi\n\n[lab:vars]\nedgeopt_target=cpu\n"))
    (d,) = inv.devices
    assert (d.name, d.host, d.user, d.target, d.labels) == ("orin1", "10.0.0.5", "pi", "cpu", ("jetson", "lab"))


@pytest.mark.parametrize("host", ["ssh://pi@10.0.0.5:22", "pi@10.0.0.5", "fe80::1", "[::1]:2222", "rpi5.lab"])
def test_ordinary_hosts_are_not_taken_for_credentials(host):
    from edgeopt.inventory import make_device

    assert make_device("d", {"host": host}).host == host


def test_cli_devices_never_echoes_a_credential_in_another_spelling(tmp_path, capsys):
    from edgeopt.cli import main

    inv = _write(tmp_path, "d.yaml", "devices:\n  a: {host: 'ssh://root:hunt/er2@10.0.0.1'}\n")
    assert main(["devices", "--devices", str(inv)]) == 2
    out = capsys.readouterr()
    assert "hunt/er2" not in out.out + out.err and "credential" in out.err
