"""Device inventories: edgeopt's own YAML, and Ansible inventories (INI or YAML) read as they are.

Every device becomes a frozen ``Device``; unknown keys are refused (a typo must not silently turn
into a default), and secret-like keys (``password``, ``ansible_password``, ``ansible_become_pass``
...) are refused outright: secrets never live in an inventory, key files and ssh-agent do the job.

edgeopt's format::

    defaults:                       # optional, applied to every device
      user: pi
      key_file: ~/.ssh/id_ed25519
    devices:
      rpi5:
        host: 192.168.1.20
        port: 22
        target: mobile              # bundles of this target are benchmarked here
        labels: [lab, arm64]
        python: python3             # the interpreter on the device
        root: ~/.edgeopt            # the agent's store on the device
        bench: {threads: 4, limits: {memory_mb: 1500}}   # bench options for this device only

Ansible: ``ansible_host``, ``ansible_port``, ``ansible_user``, ``ansible_ssh_private_key_file``,
``ansible_python_interpreter`` and ``ansible_connection=local`` map onto the same fields, the
groups a host belongs to become its labels, and ``edgeopt_target`` / ``edgeopt_root`` /
``edgeopt_labels`` ... carry edgeopt's own settings.  Other Ansible variables belong to other tools
and are ignored (but never a secret).

``local`` is a built-in device: the agent run as a subprocess on this host.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from edgeopt.errors import UsageError, yaml_error

LOCAL = "local"
DEFAULT_ROOT = "~/.edgeopt"

# A key that looks like it holds a secret.  "key_file" is a path, not a secret, so it does not match.
_SECRET = re.compile(r"pass(word|wd|phrase|code)?($|_)|(^|_)pass$|(^|_)(pw|pwd)($|_)|passcode|secret|token|"
                     r"api_?key|credential|private_key$", re.I)
# Values that are credentials whatever their key: userinfo with a password in a host, PEM key blocks.
# (``ssh://root:pw@host`` and passwords holding ``/`` or ``@`` too; ``ssh://user@host:22`` is no credential.)
_SECRET_VALUE = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*://)?[^\s/@:]+:(?!//)\S*@\S+$|-----BEGIN [A-Z ]*PRIVATE KEY-----")
# A user name never holds a colon: ``user: "root:pw"`` is a password.
_USER_KEYS = ("user", "ansible_user", "ansible_ssh_user", "edgeopt_user")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$")


class InventoryError(UsageError):
    """The inventory file is missing, malformed, holds a secret or an unknown key."""


@dataclass(frozen=True)
class Device:
    """One device: where it is, how to reach it, what it runs."""

    name: str
    transport: str = "ssh"  # ssh | local
    host: str | None = None
    port: int | None = None  # None: ~/.ssh/config's or 22
    user: str | None = None  # None: ~/.ssh/config's or the local user name
    key_file: str | None = None  # None: ~/.ssh/config's IdentityFile, ssh-agent, default keys
    target: str | None = None  # the edgeopt target whose bundles run here; None on `local` = every runnable one
    labels: tuple[str, ...] = ()
    python: str | None = None  # the device's interpreter; None: python3 (this interpreter for `local`)
    root: str | None = None  # the agent's store; None: ~/.edgeopt ($EDGEOPT_AGENT_ROOT for `local`)
    known_hosts: str | None = None  # None: ~/.ssh/known_hosts
    ssh_config: str | None = None  # None: ~/.ssh/config when it exists; "none" to ignore it
    connect_timeout: float = 10.0
    command_timeout: float = 900.0
    transfer_stall_timeout: float = 30.0  # an upload that moves no byte for this long is given up
    description: str = ""
    bench: tuple[tuple[str, Any], ...] = ()  # bench options for this device (threads, limits ...), as items
    # Rollout hooks, run on the device exactly as written (an argv; a string is split with shlex, never
    # given to a shell built from device data): after a new bundle is activated, and to check health.
    activate_cmd: tuple[str, ...] = ()
    health_cmd: tuple[str, ...] = ()
    health_timeout: float = 60.0

    @property
    def is_local(self) -> bool:
        return self.transport == "local"

    @property
    def bench_options(self) -> dict[str, Any]:
        """Per-device bench options; they override the command line's for this device."""
        return dict(self.bench)

    def public(self) -> dict[str, Any]:
        """The device as plain data for results and reports (nothing secret exists to leave out)."""
        return {"name": self.name, "transport": self.transport, "host": self.host, "port": self.port,
                "user": self.user, "target": self.target, "labels": list(self.labels)}


# The keys edgeopt's own format accepts for a device (everything but the name).
DEVICE_KEYS = tuple(f.name for f in fields(Device) if f.name != "name")


def local_device(root: str | None = None) -> Device:
    """The built-in ``local`` device: the agent as a subprocess of this host."""
    return Device(name=LOCAL, transport="local", labels=("local",), root=root,
                  description="this host (the agent as a subprocess)")


@dataclass(frozen=True)
class Inventory:
    """The devices of one inventory file (or just ``local``)."""

    devices: tuple[Device, ...]
    source: str = "<built-in>"
    _by_name: dict[str, Device] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._by_name.update({d.name: d for d in self.devices})

    def names(self) -> list[str]:
        return [d.name for d in self.devices]

    def get(self, name: str) -> Device:
        if name in self._by_name:
            return self._by_name[name]
        if name == LOCAL:
            return local_device()
        import difflib

        names = self.names()
        close = difflib.get_close_matches(name, names + ([] if LOCAL in names else [LOCAL]), n=1)
        if close:
            hint = f"did you mean {close[0]!r}?"
        elif self.source == "<built-in>":
            raise InventoryError(f"no device {name!r}: without --devices FILE the only device is {LOCAL!r} "
                                 "(this host)", hint="pass the inventory that has it: --devices FILE")
        else:  # the file's own devices; `local` (this host) always resolves, but it is not in the file
            hint = (f"devices in {self.source}: " + ", ".join(names)
                    + ("" if LOCAL in names else f"; `{LOCAL}` (this host) is always there"))
        raise InventoryError(f"no device {name!r} in {self.source}", hint=hint)

    def select(self, only: list[str] | None = None, labels: list[str] | None = None) -> list[Device]:
        """Devices by name (``--only``; ``local`` always resolves) and/or by label; all when neither."""
        chosen = [self.get(n) for n in _split(only)] if only else list(self.devices)
        if labels:
            want = set(_split(labels))
            chosen = [d for d in chosen if want & set(d.labels)]
        seen: set[str] = set()
        return [d for d in chosen if not (d.name in seen or seen.add(d.name))]


def _split(items: list[str] | None) -> list[str]:
    return [p.strip() for item in items or [] for p in item.split(",") if p.strip()]


def load_inventory(spec: str | Path | None) -> Inventory:
    """``None`` or ``"local"``: just the built-in ``local`` device; else parse the file (format sniffed)."""
    if spec is None or str(spec) == LOCAL:
        return Inventory((local_device(),))
    path = Path(spec).expanduser()
    if not path.is_file():
        raise InventoryError(f"inventory {str(spec)!r} does not exist",
                             hint="pass a devices YAML or an Ansible inventory, or `--devices local`")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(f"cannot read inventory {str(path)!r}: {exc}") from None
    src = str(path)
    if path.suffix.lower() in (".ini", ".cfg", "") and _looks_ini(text):
        devices = _from_ansible_ini(text, src)
    else:
        data = _yaml(text, src)
        _near_devices_key(data, src)
        if isinstance(data, dict) and "devices" in data:
            devices = _from_native(data, src)
        elif isinstance(data, dict) and data and all(isinstance(v, (dict, type(None))) for v in data.values()):
            devices = _from_ansible_yaml(data, src)
        elif _looks_ini(text):
            devices = _from_ansible_ini(text, src)
        else:
            raise InventoryError(f"{src}: not a devices inventory",
                                 hint="expected a top-level `devices:` mapping, or an Ansible inventory "
                                      "(`all:` with `hosts:`/`children:`, or INI `[group]` sections)")
    names = [d.name for d in devices]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InventoryError(f"{src}: device name(s) defined twice: {', '.join(dupes)}")
    if not devices:
        raise InventoryError(f"{src}: no devices in the inventory")
    return Inventory(tuple(devices), src)


def _looks_ini(text: str) -> bool:
    return bool(re.search(r"^\s*\[[^\]\n]+\]\s*$", text, re.M))


def _yaml(text: str, src: str) -> Any:
    """YAML as ``safe_load`` reads it, except that a key given twice in one mapping is refused with both
    line numbers (YAML would keep the last one: a device defined twice would silently disappear)."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
        seen: dict[Any, int] = {}
        for knode, _ in node.value:
            if knode.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *defaults` then an override is how YAML anchors are meant to be used
            key = loader.construct_object(knode, deep=True)
            at = (knode.start_mark.line + 1, knode.start_mark.column + 1)
            try:
                first = seen.setdefault(key, at)
            except TypeError:  # an unhashable key: safe_load refuses it with its own message
                continue
            if first != at:  # block style (one key a line) and flow style ({port: 1, port: 2}) alike
                where = (f"on lines {first[0]} and {at[0]}" if first[0] != at[0] else
                         f"on line {at[0]} (columns {first[1]} and {at[1]})")
                raise InventoryError(f"{src}: {key!r} is defined twice, {where} (YAML would silently keep only "
                                     "the last)", hint="give each device its own name, or merge the two entries")
        return loader.construct_mapping(node, deep=deep)

    UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        return yaml.load(text, Loader=UniqueKeys)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise InventoryError(yaml_error(exc, src)) from None


def _near_devices_key(data: Any, src: str) -> None:
    """``device:`` / ``Devices:`` for ``devices:`` is a typo, not an Ansible inventory: say so."""
    import difflib

    if not isinstance(data, dict) or "devices" in data:
        return
    for key in map(str, data):
        if key != "devices" and difflib.get_close_matches(key.lower(), ["devices"], n=1, cutoff=0.7):
            raise InventoryError(f"{src}: unknown top-level key {key!r}; did you mean 'devices'?",
                                 hint="an edgeopt inventory has a top-level `devices:` mapping")


def _refuse_secrets(keys, where: str, src: str) -> None:
    bad = sorted(k for k in keys if _SECRET.search(str(k)))
    if isinstance(keys, dict):
        vals = sorted(str(k) for k, v in keys.items() if isinstance(v, str) and (
            _SECRET_VALUE.search(v.strip()) or (k in _USER_KEYS and ":" in v)))
        if vals:  # never echo the value itself
            raise InventoryError(
                f"{src}: {where} has a credential in the value of {', '.join(map(repr, vals))} (a password in "
                "user:password@host, or a private key); secrets never go in an inventory",
                hint="remove it and use key authentication (key_file / ansible_ssh_private_key_file) or ssh-agent")
    if bad:
        raise InventoryError(
            f"{src}: {where} has secret-like key(s) {', '.join(map(repr, bad))}; secrets never go in an inventory",
            hint="remove them and use key authentication (key_file / ansible_ssh_private_key_file) or ssh-agent")


# --- edgeopt's own YAML -----------------------------------------------------------------
_TOP_KEYS = {"devices", "defaults", "version", "rig"}  # rig: the HIL policy (edgeopt.hil.rig)


def _from_native(data: dict[str, Any], src: str) -> list[Device]:
    _refuse_secrets(data, "the top level", src)
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise InventoryError(f"{src}: unknown top-level key(s) {', '.join(sorted(map(str, unknown)))}",
                             hint="allowed: " + ", ".join(sorted(_TOP_KEYS)))
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise InventoryError(f"{src}: `defaults` must be a mapping")
    _refuse_secrets(defaults, "`defaults`", src)
    raw = data.get("devices") or {}
    if isinstance(raw, list):  # a list of {name: ..., host: ...}
        items = []
        for i, d in enumerate(raw):
            if not isinstance(d, dict) or "name" not in d:
                raise InventoryError(f"{src}: devices[{i}] must be a mapping with a `name`")
            d = dict(d)
            items.append((str(d.pop("name")), d))
    elif isinstance(raw, dict):
        items = [(str(k), v if v is not None else {}) for k, v in raw.items()]
    else:
        raise InventoryError(f"{src}: `devices` must be a mapping of name -> settings")
    out = []
    for name, d in items:
        if not isinstance(d, dict):
            raise InventoryError(f"{src}: device {name!r} must be a mapping of settings")
        _refuse_secrets(d, f"device {name!r}", src)
        out.append(make_device(name, {**defaults, **d}, src))
    return out


def make_device(name: str, values: dict[str, Any], src: str = "<inventory>") -> Device:
    """Validate one device's settings into a ``Device``; unknown keys and bad values are refused."""
    import difflib

    if not _NAME.match(name):
        raise InventoryError(f"{src}: bad device name {name!r}", hint="use letters, digits, '_', '.', '@', '-'")
    _refuse_secrets(values, f"device {name!r}", src)
    unknown = sorted(set(values) - set(DEVICE_KEYS))
    if unknown:
        sugg = [difflib.get_close_matches(str(k), DEVICE_KEYS, n=1) for k in unknown]
        hint = "; ".join(f"{k!r}: did you mean {s[0]!r}?" for k, s in zip(unknown, sugg) if s)
        raise InventoryError(f"{src}: device {name!r} has unknown key(s) {', '.join(map(repr, unknown))}",
                             hint=hint or "allowed: " + ", ".join(DEVICE_KEYS))
    v = dict(values)
    transport = str(v.pop("transport", None) or (LOCAL if name == LOCAL and not v.get("host") else "ssh"))
    if transport not in ("ssh", LOCAL):
        raise InventoryError(f"{src}: device {name!r}: transport must be ssh or local, not {transport!r}")
    if transport == "ssh" and not v.get("host"):
        raise InventoryError(f"{src}: device {name!r} has no host", hint="add `host: <address or ssh alias>`")
    port = v.pop("port", None)
    if port is not None:
        try:
            port = int(port)
        except (TypeError, ValueError):
            port = -1
        if not 0 < port < 65536:
            raise InventoryError(f"{src}: device {name!r}: port must be 1..65535, not {values['port']!r}")
    labels = v.pop("labels", None) or ()
    if isinstance(labels, str):
        labels = [p.strip() for p in labels.split(",") if p.strip()]
    if not isinstance(labels, (list, tuple)) or not all(isinstance(x, (str, int)) for x in labels):
        raise InventoryError(f"{src}: device {name!r}: labels must be a list of names")
    floats = {}
    for k in ("connect_timeout", "command_timeout", "transfer_stall_timeout"):
        if k in v:
            try:
                floats[k] = float(v.pop(k))
                if floats[k] <= 0:
                    raise ValueError
            except (TypeError, ValueError):
                raise InventoryError(f"{src}: device {name!r}: {k} must be a positive number of seconds") from None
    strings = {}
    for k in ("host", "user", "key_file", "target", "python", "root", "known_hosts", "ssh_config", "description"):
        if k in v and v[k] is not None:
            if not isinstance(v[k], (str, int, float)):
                raise InventoryError(f"{src}: device {name!r}: {k} must be a string")
            strings[k] = str(v[k])
    if "target" in strings:
        strings["target"] = canonical_target(strings["target"])
    bench = _bench_options(v.pop("bench", None), name, src)
    hooks = {}
    for k in ("activate_cmd", "health_cmd"):
        if v.get(k) is not None:
            hooks[k] = _argv(v[k], f"{src}: device {name!r}: {k}")
    if "health_timeout" in v:
        try:
            floats["health_timeout"] = float(v["health_timeout"])
            if floats["health_timeout"] <= 0:
                raise ValueError
        except (TypeError, ValueError):
            raise InventoryError(f"{src}: device {name!r}: health_timeout must be a positive number of seconds") \
                from None
    return Device(name=name, transport=transport, port=port, labels=tuple(str(x) for x in labels),
                  bench=tuple(sorted(bench.items())), **strings, **floats, **hooks)


def _argv(value: Any, where: str) -> tuple[str, ...]:
    """A hook command as an argv: a list of strings, or a string split like a shell would (no shell runs it)."""
    import shlex

    if isinstance(value, str):
        try:
            parts = shlex.split(value)
        except ValueError as exc:
            raise InventoryError(f"{where}: cannot split {value!r}: {exc}") from None
    elif isinstance(value, (list, tuple)) and all(isinstance(x, (str, int, float)) for x in value):
        parts = [str(x) for x in value]
    else:
        raise InventoryError(f"{where}: expected a command (a string or a list of strings)")
    if not parts:
        raise InventoryError(f"{where}: empty command")
    return tuple(parts)


# Bench options a device may set for itself (the agent checks their values).
BENCH_KEYS = ("duration_s", "min_iters", "max_iters", "warmup", "threads", "batch", "timeout_s", "limits", "runner")


def _bench_options(value: Any, name: str, src: str) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, str):  # an Ansible INI value: JSON
        import json

        try:
            value = json.loads(value)
        except ValueError:
            raise InventoryError(f"{src}: device {name!r}: bench must be a mapping (JSON in an INI file)") from None
    if not isinstance(value, dict):
        raise InventoryError(f"{src}: device {name!r}: bench must be a mapping of bench options")
    unknown = sorted(set(value) - set(BENCH_KEYS))
    if unknown:
        raise InventoryError(f"{src}: device {name!r}: unknown bench option(s) {', '.join(map(repr, unknown))}",
                             hint="known: " + ", ".join(BENCH_KEYS))
    return dict(value)


def canonical_target(name: str) -> str:
    """A target's canonical name (aliases such as ``jetson`` -> ``jetson-orin``); light import."""
    from edgeopt.targets.registry import ALIASES

    return ALIASES.get(name, name)


# --- Ansible ------------------------------------------------------------------------------
_ANSIBLE_MAP = {
    "ansible_host": "host", "ansible_ssh_host": "host",
    "ansible_port": "port", "ansible_ssh_port": "port",
    "ansible_user": "user", "ansible_ssh_user": "user",
    "ansible_ssh_private_key_file": "key_file", "ansible_private_key_file": "key_file",
    "ansible_python_interpreter": "python",
}
_EDGEOPT_VARS = {f"edgeopt_{k}": k for k in DEVICE_KEYS if k != "transport"}


class _Group:
    def __init__(self, name: str) -> None:
        self.name = name
        self.vars: dict[str, Any] = {}
        self.hosts: dict[str, dict[str, Any]] = {}
        self.children: list[str] = []


def _from_ansible_ini(text: str, src: str) -> list[Device]:
    groups: dict[str, _Group] = {"all": _Group("all"), "ungrouped": _Group("ungrouped")}
    section, kind = "ungrouped", "hosts"
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        m = re.fullmatch(r"\[([^\]:]+)(?::(\w+))?\]", line)
        if m:
            section, kind = m.group(1).strip(), (m.group(2) or "hosts")
            if kind not in ("hosts", "vars", "children"):
                raise InventoryError(f"{src}:{lineno}: unknown section kind {kind!r}")
            groups.setdefault(section, _Group(section))
            continue
        try:
            toks = shlex.split(line, comments=True)
        except ValueError as exc:
            raise InventoryError(f"{src}:{lineno}: cannot parse {line!r}: {exc}") from None
        if not toks:
            continue
        g = groups[section]
        if kind == "children":
            g.children.append(toks[0])
            groups.setdefault(toks[0], _Group(toks[0]))
        elif kind == "vars":
            k, sep, val = line.partition("=")
            if not sep:
                raise InventoryError(f"{src}:{lineno}: expected KEY=VALUE in [{section}:vars]")
            g.vars[k.strip()] = _ini_value(val.strip())
        else:
            host, hv = toks[0], {}
            if re.search(r"\[[^\]]*:[^\]]*\]", host):
                raise InventoryError(f"{src}:{lineno}: host ranges such as {host!r} are not supported",
                                     hint="list the hosts one per line")
            for tok in toks[1:]:
                k, sep, val = tok.partition("=")
                if not sep:
                    raise InventoryError(f"{src}:{lineno}: expected KEY=VALUE after the host name, got {tok!r}")
                hv[k] = _ini_value(val)
            g.hosts.setdefault(host, {}).update(hv)
    return _ansible_devices(groups, src)


def _ini_value(v: str) -> Any:
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    return v


def _from_ansible_yaml(data: dict[str, Any], src: str) -> list[Device]:
    groups: dict[str, _Group] = {"all": _Group("all"), "ungrouped": _Group("ungrouped")}

    def walk(name: str, body: Any, parent: str | None) -> None:
        g = groups.setdefault(name, _Group(name))
        if parent is not None and name not in groups[parent].children:
            groups[parent].children.append(name)
        if body is None:
            return
        if not isinstance(body, dict):
            raise InventoryError(f"{src}: group {name!r} must be a mapping")
        unknown = set(body) - {"hosts", "vars", "children"}
        if unknown:
            raise InventoryError(f"{src}: group {name!r} has unknown key(s) {', '.join(sorted(map(str, unknown)))}",
                                 hint="an Ansible group holds hosts:, vars: and children:")
        g.vars.update(body.get("vars") or {})
        for host, hv in (body.get("hosts") or {}).items():
            if hv is not None and not isinstance(hv, dict):
                raise InventoryError(f"{src}: host {host!r} must map to its variables")
            g.hosts.setdefault(str(host), {}).update(hv or {})
        for child, cbody in (body.get("children") or {}).items():
            walk(str(child), cbody, name)

    for name, body in data.items():
        walk(str(name), body, None if name == "all" else "all")
    return _ansible_devices(groups, src)


def _ansible_devices(groups: dict[str, _Group], src: str) -> list[Device]:
    for g in groups.values():
        _refuse_secrets(g.vars, f"group {g.name!r} vars", src)
        for host, hv in g.hosts.items():
            _refuse_secrets(hv, f"host {host!r}", src)
    # Groups from the top down (all, then its children ...): deeper groups' vars win, host vars win last.
    depth: dict[str, int] = {}

    def visit(name: str, d: int, stack: tuple[str, ...]) -> None:
        if name in stack:
            raise InventoryError(f"{src}: group cycle through {name!r}")
        depth[name] = max(depth.get(name, -1), d)
        for c in groups[name].children:
            visit(c, d + 1, stack + (name,))

    for name in list(groups):
        if name not in depth:
            visit(name, 0 if name == "all" else 1, ())
    parents: dict[str, set[str]] = {n: set() for n in groups}
    for g in groups.values():
        for c in g.children:
            parents[c].add(g.name)

    def ancestors(name: str) -> set[str]:
        out, todo = set(), [name]
        while todo:
            for p in parents[todo.pop()]:
                if p not in out:
                    out.add(p)
                    todo.append(p)
        return out

    hosts: dict[str, set[str]] = {}
    host_vars: dict[str, dict[str, Any]] = {}
    for g in groups.values():
        for host, hv in g.hosts.items():
            hosts.setdefault(host, set()).update({g.name} | ancestors(g.name))
            host_vars.setdefault(host, {}).update(hv)
    devices = []
    for host, member in hosts.items():
        member.add("all")
        merged: dict[str, Any] = {}
        for gname in sorted(member, key=lambda n: (depth.get(n, 1), n)):
            merged.update(groups[gname].vars)
        merged.update(host_vars[host])
        devices.append(_ansible_device(host, merged, sorted(member - {"all", "ungrouped"}), src))
    return devices


def _ansible_device(host: str, v: dict[str, Any], groups: list[str], src: str) -> Device:
    out: dict[str, Any] = {}
    for k, val in v.items():
        if k in _ANSIBLE_MAP:
            out[_ANSIBLE_MAP[k]] = val
        elif k in _EDGEOPT_VARS:
            out[_EDGEOPT_VARS[k]] = val
        elif k.startswith("edgeopt_"):
            import difflib

            close = difflib.get_close_matches(k, list(_EDGEOPT_VARS), n=1)
            raise InventoryError(f"{src}: host {host!r} has unknown edgeopt variable {k!r}",
                                 hint=f"did you mean {close[0]!r}?" if close else
                                 "known: " + ", ".join(sorted(_EDGEOPT_VARS)))
        # Any other variable belongs to Ansible or a playbook: not ours to judge (secrets were refused above).
    conn = str(v.get("ansible_connection", "ssh"))
    if conn == "local":
        out["transport"] = LOCAL
    elif conn not in ("ssh", "paramiko", "smart"):
        raise InventoryError(f"{src}: host {host!r} uses ansible_connection={conn}; edgeopt reaches devices "
                             "over ssh (or local)")
    else:
        out.setdefault("host", host)  # Ansible's rule: the inventory name is the address by default
    labels = out.pop("labels", None) or []
    if isinstance(labels, str):
        labels = [p.strip() for p in labels.split(",") if p.strip()]
    out["labels"] = list(dict.fromkeys([*groups, *labels]))
    return make_device(host, out, src)
