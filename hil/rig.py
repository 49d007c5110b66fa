"""The rig file: an inventory plus a ``rig:`` section — device health, prepare/restore, power cycling,
quarantine (``edgeopt rig status|release``).

```yaml
devices:                      # the inventory, as everywhere else
  jetson-1: {host: 10.0.0.5, target: tensorrt}
rig:
  max_load: 1.5               # 1-minute load average above this: unfit
  min_free_mb: 500            # available memory below this: unfit
  max_temp_c: 70              # hottest thermal zone above this: unfit
  governor: performance       # cpufreq governor other than this: unfit
  power_mode: MAXN            # Jetson: nvpmodel mode other than this (its name or id): unfit
  clocks_locked: true         # Jetson: clocks not pinned at their maximum (jetson_clocks not applied): unfit
  settle_s: 5                 # pause after prepare, and between re-checks of an unfit device
  wait_s: 60                  # how long an unfit device is waited for before it is an error (exit 4)
  prepare: ["sudo jetson_clocks"]          # run on the device (over SSH, each argument quoted) before
  restore: ["sudo jetson_clocks --restore"] # ... and after measuring (also after a failure)
  power_cycle: [relayctl, cycle, "{device}"]  # run on the HOST when a device is unreachable or hangs
  power_cycle_wait_s: 120     # then wait this long for its SSH to answer, and retry once
  quarantine_after: 3         # consecutive infrastructure failures before a device is quarantined
  devices:                    # per-device overrides of any of the above
    jetson-1: {max_temp_c: 80}
```

Every key is checked (did-you-mean for typos); a bad rig file is exit 2 before anything is measured.
``{device}``, ``{host}`` and ``{port}`` in ``power_cycle`` are replaced by the device's values; the
command runs without a shell.  Quarantine state and recent failures live in the results DB
(tables ``rig_state`` and ``rig_events``, created beside ``runs``).
"""

from __future__ import annotations

import difflib
import json
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgeopt import jsonsafe
from edgeopt.errors import DeviceError, UsageError, yaml_error

POLICY_KEYS = ("max_load", "min_free_mb", "max_temp_c", "governor", "power_mode", "clocks_locked", "settle_s",
               "wait_s", "throttle", "prepare", "restore", "power_cycle", "power_cycle_wait_s", "power_cycle_timeout_s", "quarantine_after")
RIG_KEYS = (*POLICY_KEYS, "devices")


class RigUnfit(DeviceError):
    """The device stayed outside the rig's health policy for the whole wait: never measured."""


class HookFailed(DeviceError):
    """A prepare/restore command failed on the device, or power_cycle on the host."""


@dataclass(frozen=True)
class Policy:
    max_load: float | None = None
    min_free_mb: float | None = None
    max_temp_c: float | None = None
    governor: str | None = None
    power_mode: str | None = None  # a Jetson nvpmodel mode, by name or id
    clocks_locked: bool | None = None
    settle_s: float = 0.0
    wait_s: float = 60.0
    throttle: float | None = None  # calibration slower than this x the session's first: throttled (1.10)
    prepare: tuple[tuple[str, ...], ...] = ()
    restore: tuple[tuple[str, ...], ...] = ()
    power_cycle: tuple[str, ...] = ()
    power_cycle_wait_s: float = 120.0
    power_cycle_timeout_s: float = 60.0
    quarantine_after: int = 3

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(map(list, v)) if k in ("prepare", "restore") else list(v) if k == "power_cycle" else v)
                for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class Rig:
    policy: Policy = field(default_factory=Policy)
    per_device: dict[str, Policy] = field(default_factory=dict)
    source: str = "<none>"

    def for_device(self, name: str) -> Policy:
        return self.per_device.get(name, self.policy)


def tidy(message: str) -> str:
    """A device error as shown to the user: paramiko's meaningless ``[Errno None]`` dropped."""
    return str(message).replace("[Errno None] ", "").replace("[Errno None]", "").strip()


def _dym(word: str, choices: Any) -> str:
    close = difflib.get_close_matches(str(word), list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _num(v: Any, where: str, lo: float, integer: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (integer and int(v) != v) or v < lo:
        raise UsageError(f"{where}: expected {'an integer' if integer else 'a number'} >= {lo:g}, got {v!r}")
    return int(v) if integer else float(v)


def _argv(value: Any, where: str) -> tuple[str, ...]:
    from edgeopt.inventory import _argv as inv_argv

    return inv_argv(value, where)


def _commands(value: Any, where: str) -> tuple[tuple[str, ...], ...]:
    """A list of commands; each a string (split like a shell would, no shell runs it) or an argv list."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise UsageError(f"{where}: expected a list of commands (strings or argv lists)")
    return tuple(_argv(c, f"{where}[{i}]") for i, c in enumerate(value))


def _policy(data: Any, base: Policy, where: str) -> Policy:
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a mapping of policy settings")
    kw: dict[str, Any] = {}
    for key, v in data.items():
        w = f"{where}.{key}"
        if key not in POLICY_KEYS:
            raise UsageError(f"{where}: unknown key {key!r}{_dym(key, POLICY_KEYS)}; known: {', '.join(POLICY_KEYS)}")
        if v is None:
            kw[key] = None if key in ("max_load", "min_free_mb", "max_temp_c", "governor", "power_mode",
                                      "clocks_locked", "throttle") else \
                getattr(Policy(), key)
        elif key in ("max_load", "min_free_mb", "max_temp_c", "settle_s", "wait_s", "power_cycle_wait_s"):
            kw[key] = _num(v, w, 0 if key != "max_temp_c" else -273)
        elif key == "throttle":
            kw[key] = _num(v, w, 1.0)
            if kw[key] <= 1.0:
                raise UsageError(f"{w}: a slowdown factor above 1 (e.g. 1.10), got {v!r}")
        elif key == "power_cycle_timeout_s":
            kw[key] = _num(v, w, 1)
        elif key == "quarantine_after":
            kw[key] = _num(v, w, 0, integer=True)
        elif key == "governor":
            if not isinstance(v, str) or not v.strip():
                raise UsageError(f"{w}: expected a governor name like performance, got {v!r}")
            kw[key] = v.strip()
        elif key == "power_mode":
            if isinstance(v, bool) or not isinstance(v, (str, int)) or not str(v).strip():
                raise UsageError(f"{w}: expected an nvpmodel mode name like MAXN or its id like 0, got {v!r}")
            kw[key] = str(v).strip()
        elif key == "clocks_locked":
            if not isinstance(v, bool):
                raise UsageError(f"{w}: expected true or false, got {v!r}")
            kw[key] = v
        elif key in ("prepare", "restore"):
            kw[key] = _commands(v, w)
        elif key == "power_cycle":
            kw[key] = _argv(v, w)
    return replace(base, **kw)


def parse_rig(data: Any, src: str = "<rig>", device_names: list[str] | None = None) -> Rig:
    """The ``rig:`` section of an inventory (``None``: defaults). Bad keys/values: UsageError (exit 2)."""
    if data is None:
        return Rig(source=src)
    if not isinstance(data, dict):
        raise UsageError(f"{src}: `rig` must be a mapping of policy settings")
    for key in data:
        if key not in RIG_KEYS:
            raise UsageError(f"{src}: rig: unknown key {key!r}{_dym(key, RIG_KEYS)}; known: {', '.join(RIG_KEYS)}")
    base = _policy({k: v for k, v in data.items() if k != "devices"}, Policy(), f"{src}: rig")
    per: dict[str, Policy] = {}
    devs = data.get("devices") or {}
    if not isinstance(devs, dict):
        raise UsageError(f"{src}: rig.devices must be a mapping of device name -> policy overrides")
    for name, over in devs.items():
        if device_names is not None and str(name) not in device_names:
            raise UsageError(f"{src}: rig.devices: no device {name!r} in the inventory{_dym(name, device_names)}")
        per[str(name)] = _policy(over or {}, base, f"{src}: rig.devices.{name}")
    return Rig(base, per, src)


def load_rig(spec: str | Path | None) -> Rig:
    """The rig section of an inventory file (read again: the inventory loader checks the devices). ``local``,
    ``None`` and Ansible inventories have no rig section: the default policy (nothing checked, no hooks)."""
    if spec is None or str(spec) == "local":
        return Rig(source="local")
    path = Path(spec).expanduser()
    if not path.is_file():
        return Rig(source=str(spec))  # the inventory loader says what is wrong with it
    import yaml

    text = path.read_text(errors="replace")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        if path.suffix.lower() in (".yaml", ".yml"):
            raise UsageError(yaml_error(exc, str(path))) from None
        return Rig(source=str(path))  # an INI inventory
    if not isinstance(data, dict) or "devices" not in data:
        return Rig(source=str(path))
    near = [k for k in data if k not in ("devices", "defaults", "version", "rig")
            and difflib.get_close_matches(str(k), ["rig"], n=1, cutoff=0.6)]
    if near:
        raise UsageError(f"{path}: unknown top-level key {near[0]!r} (did you mean 'rig'?)")
    devs = data.get("devices")
    names = [str(d.get("name")) for d in devs if isinstance(d, dict)] if isinstance(devs, list) else \
        [str(k) for k in (devs or {})]
    return parse_rig(data.get("rig"), str(path), names + ["local"])


# --- health ---------------------------------------------------------------------------------
def fitness(probe: dict[str, Any], policy: Policy) -> tuple[list[str], list[str]]:
    """(problems, warnings) of a probe against the policy. A limit the device cannot report (no thermal
    zone, no cpufreq) is a warning, not a problem: said in the verdict, never silently ignored."""
    env = probe.get("environment") or {}
    problems: list[str] = []
    warnings: list[str] = []
    load = (env.get("loadavg") or [None])[0]
    if policy.max_load is not None:
        if load is None:
            warnings.append("max_load set but the device reports no load average")
        elif load > policy.max_load:
            problems.append(f"load average {load:.2f} > max_load {policy.max_load:g}")
    free = probe.get("memory_available_mb")
    if policy.min_free_mb is not None:
        if free is None:
            warnings.append("min_free_mb set but the device reports no available memory")
        elif free < policy.min_free_mb:
            problems.append(f"available memory {free} MiB < min_free_mb {policy.min_free_mb:g}")
    temp = env.get("temperature_c")
    if policy.max_temp_c is not None:
        if temp is None:
            warnings.append("max_temp_c set but the device reports no temperature")
        elif temp > policy.max_temp_c:
            problems.append(f"temperature {temp:.1f} C > max_temp_c {policy.max_temp_c:g}")
    gov = env.get("governor")
    if policy.governor is not None:
        if gov is None:
            warnings.append(f"governor: {policy.governor} set but the device exposes no cpufreq governor")
        elif gov != policy.governor:
            shown = gov if isinstance(gov, str) else ",".join(sorted(set(gov.values())))
            problems.append(f"cpufreq governor {shown} != {policy.governor}")
    _jetson_fitness(probe.get("jetson"), policy, problems, warnings)
    return problems, warnings


def _jetson_fitness(jet: dict[str, Any] | None, policy: Policy, problems: list[str], warnings: list[str]) -> None:
    """``power_mode`` / ``clocks_locked`` against the probe's Jetson power state (see device_agents/probe)."""
    if policy.power_mode is not None:
        name, mode_id = (jet or {}).get("power_mode"), (jet or {}).get("power_mode_id")
        if mode_id is None and name is None:
            warnings.append(f"power_mode: {policy.power_mode} set but the device reports no nvpmodel mode"
                            + ("" if jet else " (not a Jetson)"))
        elif policy.power_mode.lower() not in {str(name).lower(), str(mode_id)}:
            modes = (jet or {}).get("power_modes") or {}
            want = policy.power_mode
            offered = f"; this board offers {', '.join(f'{v} ({k})' for k, v in modes.items())}" if modes else ""
            if modes and want.lower() not in {str(v).lower() for v in modes.values()} | set(modes):
                offered += f" — {want!r} is none of them"
            problems.append(f"power mode {name or '?'} (id {mode_id}) != power_mode {want}{offered}")
    if policy.clocks_locked is not None:
        locked = (jet or {}).get("clocks_locked")
        if locked is None:
            warnings.append("clocks_locked set but the device exposes no CPU/GPU frequency limits"
                            + ("" if jet else " (not a Jetson)"))
        elif locked != policy.clocks_locked:
            loose = ", ".join((jet or {}).get("clocks_unlocked") or [])
            problems.append("clocks not locked at their maximum (jetson_clocks not applied; below max: "
                            f"{loose})" if policy.clocks_locked else "clocks locked (jetson_clocks applied), "
                            "the rig asks for them unlocked")


def health_summary(probe: dict[str, Any]) -> dict[str, Any]:
    env = probe.get("environment") or {}
    return {"load": (env.get("loadavg") or [None])[0], "free_mb": probe.get("memory_available_mb"),
            "temp_c": env.get("temperature_c"), "governor": env.get("governor"), "freq_mhz": env.get("freq_mhz"),
            **({"power_mode": jet.get("power_mode"), "clocks_locked": jet.get("clocks_locked")}
               if (jet := probe.get("jetson")) else {})}


def wait_until_fit(sess: Any, policy: Policy, probe: dict[str, Any],
                   progress: Callable[[str], None] = lambda s: None) -> tuple[dict[str, Any], list[str]]:
    """Re-probe an unfit device every ``settle_s`` (at least 1 s) for up to ``wait_s``; returns the fit probe
    and the warnings, or raises RigUnfit naming what stayed wrong."""
    deadline = time.monotonic() + policy.wait_s
    while True:
        problems, warnings = fitness(probe, policy)
        if not problems:
            return probe, warnings
        left = deadline - time.monotonic()
        if left <= 0:
            raise RigUnfit(f"{sess.device.name}: unfit for measuring after waiting {policy.wait_s:g}s: "
                           + "; ".join(problems),
                           hint="see `edgeopt rig status`; the policy is the rig file's `rig:` section")
        pause = min(left, max(1.0, policy.settle_s))
        progress(f"{sess.device.name}: unfit ({'; '.join(problems)}); re-checking in {pause:.0f}s")
        time.sleep(pause)
        probe = sess.probe()


def calibration_source() -> str:
    """What the device runs: the agent's own calibration function, from its source (nothing imported)."""
    import inspect

    from edgeopt_agent.probe import calibration_ms

    return inspect.getsource(calibration_ms) + "\nprint(calibration_ms())\n"


def calibrate(sess: Any) -> float:
    """The calibration workload's time on the device (ms)."""
    rc, out, err = sess.transport.run([*sess.python, "-c", calibration_source()], timeout=120)
    try:
        if rc != 0:
            raise ValueError
        return float(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = " | ".join((err or out).strip().splitlines()[-2:])[:300]
        raise DeviceError(f"{sess.device.name}: the calibration workload failed (exit {rc}): {tail}") from None


class ThrottleWatch:
    """androidx.benchmark's rule: the calibration workload > ``policy.throttle`` x its time at the session's
    start = throttled. Between blocks: ``pairbench`` runs a short calibration every ``calibrate_every``
    rounds, and ``within_call`` keeps only the rounds measured before the first slow one (the rest are
    dropped, and measured again). Between measuring calls (``__call__``): back off (``settle_s`` at a
    time, up to ``wait_s``) until the device is back at speed, else RigUnfit. Every check is kept."""

    calibrate_every = 5  # rounds between in-call calibrations (~10 ms each)

    def __init__(self, sess: Any, policy: Policy, progress: Callable[[str], None] = lambda s: None) -> None:
        self.sess, self.policy, self.progress = sess, policy, progress
        self.reference_ms = calibrate(sess)
        self.checks: list[dict[str, Any]] = []
        self.block_reference_ms: float | None = None  # the fastest in-call check of the session so far
        self.in_call: list[dict[str, Any]] = []
        self.dropped_blocks = 0

    def within_call(self, pb: dict[str, Any]) -> int:
        """How many of this pairbench call's blocks to keep: all, unless the calibration between blocks was
        over the limit; then whole rounds up to the last calibration at speed. Throttling is a sustained
        slowdown: two checks in a row over the limit (one short check on a shared box can be 1.5x slow
        alone), or the call's last check (nothing after it to confirm or clear it)."""
        limit = self.policy.throttle or float("inf")
        blocks = len(pb.get("blocks") or [])
        cal = pb.get("calibration") or []
        keep, slow = 0, 0
        for j, c in enumerate(cal):
            # The reference is the fastest check the session has seen: the device's own speed. (The best of
            # the first two was the reference before: a run that started starved -- load 15 on 2 cores, both
            # first checks 10x slow -- read every later check as faster, and a real throttle as none.)
            if c["ms"] > 0 and (self.block_reference_ms is None or c["ms"] < self.block_reference_ms):
                self.block_reference_ms = c["ms"]
            ratio = c["ms"] / self.block_reference_ms if self.block_reference_ms else 1.0
            self.in_call.append({"after_blocks": c["after_blocks"], "ms": c["ms"], "ratio": round(ratio, 3)})
            if ratio <= limit:
                keep, slow = min(blocks, int(c["after_blocks"])), 0
                continue
            slow += 1
            if slow >= 2 or j == len(cal) - 1:
                keep -= keep % 2
                if keep < blocks:
                    self.dropped_blocks += blocks - keep
                    self.progress(f"{self.sess.device.name}: throttled between blocks ({ratio:.2f}x the "
                                  f"fastest calibration of the session, after block {c['after_blocks']}): {blocks - keep} "
                                  f"of this call's {blocks} blocks dropped")
                return keep
        return blocks if not cal else keep - keep % 2

    def __call__(self) -> None:
        limit = self.policy.throttle or float("inf")
        deadline = time.monotonic() + self.policy.wait_s
        while True:
            ms = calibrate(self.sess)
            ratio = ms / self.reference_ms if self.reference_ms > 0 else 1.0
            self.checks.append({"ms": ms, "ratio": round(ratio, 3)})
            if ratio <= limit:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise RigUnfit(f"{self.sess.device.name}: throttled: the calibration workload is {ratio:.2f}x slower "
                               f"than at the session's start (limit {limit:g}x) after backing off "
                               f"{self.policy.wait_s:g}s", hint="cool the device down, or lock its clocks in `prepare:`")
            pause = min(left, max(1.0, self.policy.settle_s))
            self.progress(f"{self.sess.device.name}: throttled ({ratio:.2f}x the calibration at the start); "
                          f"backing off {pause:.0f}s")
            time.sleep(pause)

    def as_dict(self) -> dict[str, Any]:
        return {"reference_ms": self.reference_ms, "limit": self.policy.throttle, "checks": self.checks,
                "between_blocks": {"reference_ms": self.block_reference_ms, "every_rounds": self.calibrate_every,
                                   "checks": self.in_call, "dropped_blocks": self.dropped_blocks}}


def run_hooks(sess: Any, commands: tuple[tuple[str, ...], ...], what: str, timeout: float = 300.0) -> None:
    """Run each command on the device over its transport (arguments quoted); the first failure raises."""
    for argv in commands:
        rc, out, err = sess.transport.run(list(argv), timeout=timeout)
        if rc != 0:
            tail = " | ".join((err or out).strip().splitlines()[-2:])[:300]
            raise HookFailed(f"{sess.device.name}: {what} command `{' '.join(argv)}` exited {rc}: {tail}")


def power_cycle(dev: Any, policy: Policy, progress: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Run ``power_cycle`` on the host, then wait for the device's SSH banner (``power_cycle_wait_s``)."""
    values = {"{device}": dev.name, "{host}": dev.host or "", "{port}": str(dev.port or 22)}
    argv = []
    for a in policy.power_cycle:
        for k, v in values.items():
            a = a.replace(k, v)
        argv.append(a)
    progress(f"{dev.name}: power cycling: {' '.join(argv)}")
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=policy.power_cycle_timeout_s)
    except FileNotFoundError:
        raise HookFailed(f"{dev.name}: power_cycle command {argv[0]!r} not found on this host") from None
    except subprocess.TimeoutExpired:
        raise HookFailed(f"{dev.name}: power_cycle ran past {policy.power_cycle_timeout_s:g}s") from None
    if p.returncode != 0:
        tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-2:])[:300]
        raise HookFailed(f"{dev.name}: power_cycle exited {p.returncode}: {tail}")
    if not dev.is_local:
        wait_for_ssh(dev, policy.power_cycle_wait_s)
    return {"command": argv, "elapsed_s": round(time.monotonic() - t0, 3)}


def wait_for_ssh(dev: Any, timeout_s: float) -> None:
    """Until the device's port answers with an SSH banner, or HookFailed after ``timeout_s``."""
    from edgeopt.transport import ssh_params

    p = ssh_params(dev)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((p.hostname, p.port), timeout=2) as s:
                s.settimeout(2)
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        if time.monotonic() >= deadline:
            raise HookFailed(f"{dev.name}: no SSH on {p.hostname}:{p.port} within {timeout_s:g}s of the power cycle")
        time.sleep(0.25)


# --- state in the results DB ------------------------------------------------------------------
_SCHEMA = """
CREATE TABLE IF NOT EXISTS rig_state (
    device TEXT PRIMARY KEY, consecutive_failures INTEGER NOT NULL DEFAULT 0, quarantined INTEGER NOT NULL DEFAULT 0,
    quarantined_at TEXT, reason TEXT, last_seen TEXT, last_status TEXT, last_health TEXT
);
CREATE TABLE IF NOT EXISTS rig_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time TEXT NOT NULL, device TEXT NOT NULL, kind TEXT NOT NULL, detail TEXT
);
CREATE INDEX IF NOT EXISTS rig_events_device ON rig_events (device, time);
"""


def _now() -> str:
    from edgeopt.fleetbench import now_iso

    return now_iso()


class RigState:
    """Quarantine and health per device, in the results DB file (its own tables)."""

    def __init__(self, path: str | Path) -> None:
        from edgeopt.results import ResultsDB

        ResultsDB(path).close()  # the file is a results DB (creates/validates it)
        from edgeopt.results_url import local_path

        self.conn = sqlite3.connect(str(local_path(path)), timeout=30)  # a server's: beside its spool
        self.conn.executescript(_SCHEMA)
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> RigState:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def get(self, device: str) -> dict[str, Any] | None:
        cur = self.conn.execute("SELECT device, consecutive_failures, quarantined, quarantined_at, reason, last_seen, "
                                "last_status, last_health FROM rig_state WHERE device = ?", (device,))
        row = cur.fetchone()
        return _state_row(row) if row else None

    def all(self) -> list[dict[str, Any]]:
        rows = self.conn.execute("SELECT device, consecutive_failures, quarantined, quarantined_at, reason, last_seen, "
                                 "last_status, last_health FROM rig_state ORDER BY device").fetchall()
        return [_state_row(r) for r in rows]

    def events(self, device: str, limit: int = 5) -> list[dict[str, Any]]:
        rows = self.conn.execute("SELECT time, kind, detail FROM rig_events WHERE device = ? ORDER BY id DESC LIMIT ?",
                                 (device, limit)).fetchall()
        return [{"time": t, "kind": k, "detail": d} for t, k, d in rows]

    def _ensure(self, device: str) -> None:
        self.conn.execute("INSERT OR IGNORE INTO rig_state (device) VALUES (?)", (device,))

    def record_ok(self, device: str, health: dict[str, Any] | None = None) -> None:
        with self.conn:
            self._ensure(device)
            self.conn.execute("UPDATE rig_state SET consecutive_failures = 0, last_seen = ?, last_status = 'ok', "
                              "last_health = ? WHERE device = ?", (_now(), jsonsafe.dumps(health or {}), device))

    def record_failure(self, device: str, reason: str, quarantine_after: int, kind: str = "failure",
                       seen: bool = False, health: dict[str, Any] | None = None) -> bool:
        """Count one infrastructure failure; True when this one quarantines the device."""
        now = _now()
        with self.conn:
            self._ensure(device)
            self.conn.execute("UPDATE rig_state SET consecutive_failures = consecutive_failures + 1, last_status = ?"
                              + (", last_seen = ?" if seen else "") + (", last_health = ?" if health else "")
                              + " WHERE device = ?",
                              (kind, *([now] if seen else []), *([jsonsafe.dumps(health)] if health else []), device))
            self.conn.execute("INSERT INTO rig_events (time, device, kind, detail) VALUES (?,?,?,?)",
                              (now, device, kind, reason[:500]))
            n, q = self.conn.execute("SELECT consecutive_failures, quarantined FROM rig_state WHERE device = ?",
                                     (device,)).fetchone()
            if quarantine_after and n >= quarantine_after and not q:
                self.conn.execute("UPDATE rig_state SET quarantined = 1, quarantined_at = ?, reason = ? "
                                  "WHERE device = ?", (now, f"{n} failures in a row; last: {reason}"[:500], device))
                self.conn.execute("INSERT INTO rig_events (time, device, kind, detail) VALUES (?,?,?,?)",
                                  (now, device, "quarantined", f"after {n} failures in a row"))
                return True
        return False

    def event(self, device: str, kind: str, detail: str) -> None:
        with self.conn:
            self.conn.execute("INSERT INTO rig_events (time, device, kind, detail) VALUES (?,?,?,?)",
                              (_now(), device, kind, detail[:500]))

    def release(self, device: str) -> dict[str, Any]:
        st = self.get(device)
        if st is None:
            known = [s["device"] for s in self.all()]
            raise UsageError(f"no rig state for device {device!r}{_dym(device, known)}",
                             hint=("devices with state: " + ", ".join(known)) if known else
                             "no device has failed or been gated with this --db yet")
        with self.conn:
            self.conn.execute("UPDATE rig_state SET quarantined = 0, consecutive_failures = 0, quarantined_at = NULL, "
                              "reason = NULL WHERE device = ?", (device,))
            self.conn.execute("INSERT INTO rig_events (time, device, kind, detail) VALUES (?,?,?,?)",
                              (_now(), device, "released", "by edgeopt rig release"))
        return {"device": device, "was_quarantined": st["quarantined"], "failures_cleared": st["consecutive_failures"]}


def _state_row(r: tuple) -> dict[str, Any]:
    return {"device": r[0], "consecutive_failures": r[1], "quarantined": bool(r[2]), "quarantined_at": r[3],
            "reason": r[4], "last_seen": r[5], "last_status": r[6], "last_health": json.loads(r[7]) if r[7] else None}


def quarantined(db_path: str | Path | None, names: list[str]) -> dict[str, dict[str, Any]]:
    """The quarantined devices among ``names`` (read-only: a DB that does not exist is not created)."""
    from edgeopt.results_url import local_path

    if db_path is None or not local_path(db_path).is_file():
        return {}
    try:
        conn = sqlite3.connect(f"file:{local_path(db_path).absolute()}?mode=ro", uri=True, timeout=30)
        try:
            rows = conn.execute("SELECT device, consecutive_failures, quarantined, quarantined_at, reason, last_seen, "
                                "last_status, last_health FROM rig_state WHERE quarantined = 1").fetchall()
        finally:
            conn.close()
    except sqlite3.OperationalError:
        return {}  # no rig_state table yet
    return {r[0]: _state_row(r) for r in rows if r[0] in names}


# --- edgeopt rig status / release ----------------------------------------------------------------
def status(devices: str | Path | None = "local", db: str | Path = "edgeopt-results.db", probe: bool = True,
           trust_new_host_keys: bool = False, jobs: int = 8, limit: str | list[str] | None = None,
           labels: str | list[str] | None = None) -> dict[str, Any]:
    """Every device of the rig (or those picked by ``limit``/``labels``, as bench and gate pick them): its
    health now (probed, judged against the policy), last seen, quarantine and recent failures
    (``edgeopt rig status``)."""
    from concurrent.futures import ThreadPoolExecutor

    from edgeopt.inventory import load_inventory

    rig = load_rig(devices)
    inv = load_inventory(devices or "local")
    devs = list(inv.devices)
    if limit or labels:
        from edgeopt.api import select_devices

        picked = {d.name for d in select_devices(devices, limit, labels)}
        devs = [d for d in devs if d.name in picked]
    state: dict[str, dict[str, Any]] = {}
    events: dict[str, list[dict[str, Any]]] = {}
    from edgeopt.results_url import local_path

    if local_path(db).is_file():  # a server's rig state lives beside its spool
        with RigState(db) as st:
            state = {s["device"]: s for s in st.all()}
            events = {d.name: st.events(d.name) for d in devs}

    def one(dev) -> dict[str, Any]:
        pol = rig.for_device(dev.name)
        s = state.get(dev.name) or {}
        row: dict[str, Any] = {"device": dev.name, "target": dev.target, "quarantined": bool(s.get("quarantined")),
                               "quarantine_reason": s.get("reason"), "consecutive_failures": s.get("consecutive_failures", 0),
                               "last_seen": s.get("last_seen"), "last_status": s.get("last_status"),
                               "recent_failures": [e for e in events.get(dev.name, []) if e["kind"] not in ("released",)],
                               "policy": pol.as_dict()}
        if not probe:
            row["health"] = "not probed"
            row["figures"] = s.get("last_health")
            return row
        from edgeopt.deploy import DeviceSession

        try:
            with DeviceSession.open(dev, trust_new_host_keys, retries=0) as sess:
                p = sess.probe()
            problems, warnings = fitness(p, pol)
            row.update({"health": "unfit" if problems else "fit", "problems": problems, "warnings": warnings,
                        "figures": health_summary(p)})
        except DeviceError as exc:
            row.update({"health": "unreachable", "problems": [tidy(exc.message)], "figures": s.get("last_health")})
        return row

    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(devs)))) as pool:
        rows = list(pool.map(one, devs))
    return {"rig": rig.source, "db": str(db), "devices": rows}


def release(device: str, db: str | Path = "edgeopt-results.db") -> dict[str, Any]:
    """Lift a device's quarantine and clear its failure count (``edgeopt rig release``)."""
    from edgeopt.results_url import local_path, mask

    if not local_path(db).is_file():
        raise UsageError(f"no results database at {mask(str(db))!r}", hint="pass the --db the gates wrote to")
    with RigState(db) as st:
        return st.release(device)
