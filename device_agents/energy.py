"""Energy per inference, measured on the device over the bench's timed loop — never estimated.

Sources, each read in the format its kernel driver or tool documents:

* ``ina3221`` — the INA3221 power monitors of NVIDIA Jetson boards, through hwmon (JetPack 5/6:
  ``/sys/bus/i2c/drivers/ina3221/<bus>-<addr>/hwmon/hwmon*/in[123]_label``, ``in[123]_input`` bus
  voltage in mV, ``curr[123]_input`` current in mA; ``in7`` is the "sum of shunt voltages", not a
  rail) or the older L4T iio driver (JetPack 4: ``/sys/bus/i2c/drivers/ina3221x/<bus>-<addr>/
  iio:device*/rail_name_N``, ``in_power<N>_input`` in mW).  Readable without root.  Sampled.
* ``pmic`` — the Raspberry Pi 5's PMIC ADC, ``vcgencmd pmic_read_adc``: lines such as
  ``VDD_CORE_A current(7)=2.47170000A`` and ``VDD_CORE_V volt(15)=0.87000000V``; a rail's power is
  its volts times its amps (rails with a voltage only, EXT5V_V and BATT_V, carry no power figure).
  Needs access to ``/dev/vcio`` (the ``video`` group).  Sampled.
* ``nvml`` — NVIDIA's total energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the
  driver loaded; Volta and newer) through ``libnvidia-ml.so.1`` with ctypes.  Read before and after.
  Where the counter is not supported, ``nvml-power`` samples ``nvmlDeviceGetPowerUsage`` (mW); where
  the library cannot be loaded but ``nvidia-smi`` runs, ``nvidia-smi`` samples ``power.draw``.
* ``rapl`` — Intel/AMD RAPL through powercap, ``/sys/class/powercap/intel-rapl:*/energy_uj`` (µJ,
  wrapping at ``max_energy_range_uj``).  Root-only since Linux 5.10 (CVE-2020-8694).  Read before and after.

A *counter* source is read right before and right after the timed loop (and, by a thread, every
``COUNTER_POLL_S`` in between, so that a long loop sees every wraparound); a *sampled* source is read
by a thread every ``interval_s`` (and once at each end of the window) and integrated with the
trapezoid rule.  The energy is the whole rail's over the window — the device's idle draw included,
nothing subtracted, nothing modelled.  ``joules_per_inference`` = that energy / (timed calls x batch).

Standard library only (numpy not needed).
"""

from __future__ import annotations

import ctypes
import glob
import math
import os
import re
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SOURCES = ("ina3221", "nvml", "rapl", "pmic")
# a Jetson rail that is the module's whole input: the total, the others are its parts
INA_TOTAL_RAILS = ("VDD_IN", "POM_5V_IN")
INTERVALS = {"ina3221": 0.02, "pmic": 0.1, "nvml-power": 0.05, "nvidia-smi": 0.1}
# a counter is also read every this often during the window, so that a long loop sees each wraparound
# (an AMD package's RAPL range is about 65 kJ: 5 minutes at 200 W)
COUNTER_POLL_S = 10.0
RAPL_ROOT_ONLY = "energy_uj readable by root only (kernel ≥ 5.10 restricts RAPL, CVE-2020-8694)"


class Unavailable(Exception):
    """A source that this device does not offer (the message says why)."""


READ_MAX_BYTES = 4096  # a sysfs attribute is one line; more is not a sensor
MAX_POWER_W = 20_000.0  # above any one device (an 8-GPU node draws ~10 kW): a rail reading more is not believed


def _text(path: str | Path) -> str:
    """A sensor file's text.  Only a regular file (sysfs attributes are) is read, non-blocking and bounded: a
    FIFO or a device node planted at a sensor's path would block the reader for ever."""
    fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        return os.read(fd, READ_MAX_BYTES).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def _number(path: str | Path) -> float:
    v = float(_text(path).split()[0])
    if not math.isfinite(v):
        raise ValueError(f"{path} reads {v}")
    return v


# ---- sources ----------------------------------------------------------------------------------


class Source:
    """One energy source: ``read()`` gives, per rail, cumulative joules (``kind == "counter"``) or
    watts now (``kind == "sampled"``); ``total_rails`` are the rails whose sum is the total."""

    name = ""
    kind = "sampled"
    resolution = ""
    scope = ""
    interval_s: float | None = None
    total_rails: list[str] = []

    def read(self) -> dict[str, float]:
        raise NotImplementedError

    def delta(self, rail: str, before: float, after: float) -> float:
        return after - before

    def close(self) -> None:
        pass


class Ina3221Hwmon(Source):
    """Jetson INA3221 rails through the hwmon driver (JetPack 5 and 6)."""

    name = "ina3221"

    def __init__(self, root: str | Path = "/"):
        dirs = sorted(glob.glob(os.path.join(str(root), "sys/bus/i2c/drivers/ina3221*/*/hwmon/hwmon*")))
        self.channels: list[tuple[str, str, str]] = []
        update: list[float] = []
        for d in dirs:
            chip = Path(d).parent.parent.name  # <bus>-<addr>, e.g. 1-0040
            for label_file in sorted(glob.glob(os.path.join(d, "in[0-9]*_label"))):
                n = re.match(r"in(\d+)_label$", os.path.basename(label_file))
                if not n:
                    continue
                ch = n.group(1)
                try:
                    label = _text(label_file)
                except OSError:
                    continue
                volt, curr = os.path.join(d, f"in{ch}_input"), os.path.join(d, f"curr{ch}_input")
                # in7 is the "sum of shunt voltages" (µV, no current): not a rail; NC = not connected
                if "sum of shunt" in label.lower() or label.upper() == "NC" or not os.path.isfile(curr):
                    continue
                enable = os.path.join(d, f"in{ch}_enable")
                try:
                    if os.path.isfile(enable) and _text(enable) == "0":
                        continue
                    _number(volt), _number(curr)  # a disabled channel answers ENODATA
                except (OSError, ValueError):
                    continue
                if any(label == c[0] for c in self.channels):
                    label = f"{label}@{chip}"
                self.channels.append((label, volt, curr))
            try:
                update.append(_number(os.path.join(d, "update_interval")))
            except (OSError, ValueError):
                pass
        if not self.channels:
            raise Unavailable("no INA3221 rail readable under /sys/bus/i2c/drivers/ina3221*/*/hwmon/"
                              if dirs else "no INA3221 power monitor (/sys/bus/i2c/drivers/ina3221*/.../hwmon absent)")
        labels = [c[0] for c in self.channels]
        total = [r for r in INA_TOTAL_RAILS if r in labels]
        self.total_rails = total[:1] or labels
        self.scope = (f"{self.total_rails[0]} (the module's input rail)" if total
                      else "sum of the rails " + ", ".join(labels))
        self.resolution = "INA3221 via hwmon: mV x mA readings" + (
            f", chip update interval {max(update):g} ms" if update else "")
        self.interval_s = INTERVALS["ina3221"]

    def read(self) -> dict[str, float]:
        return {label: _number(volt) * _number(curr) / 1e6 for label, volt, curr in self.channels}


class Ina3221Iio(Source):
    """Jetson INA3221 rails through the older L4T iio driver (``ina3221x``, JetPack 4)."""

    name = "ina3221"

    def __init__(self, root: str | Path = "/"):
        names = sorted(glob.glob(os.path.join(str(root), "sys/bus/i2c/drivers/ina3221x/*/iio:device*/rail_name_*")))
        self.channels: list[tuple[str, str]] = []
        for nf in names:
            n = re.match(r"rail_name_(\d+)$", os.path.basename(nf))
            power = os.path.join(os.path.dirname(nf), f"in_power{n.group(1)}_input") if n else ""
            try:
                label = _text(nf)
                _number(power)
            except (OSError, ValueError):
                continue
            if label.upper() == "NC":
                continue
            if any(label == c[0] for c in self.channels):
                label = f"{label}@{Path(nf).parent.parent.name}"
            self.channels.append((label, power))
        if not self.channels:
            raise Unavailable("no INA3221 power monitor (/sys/bus/i2c/drivers/ina3221x/.../iio:device* absent)")
        labels = [c[0] for c in self.channels]
        total = [r for r in INA_TOTAL_RAILS if r in labels]
        self.total_rails = total[:1] or labels
        self.scope = (f"{self.total_rails[0]} (the module's input rail)" if total
                      else "sum of the rails " + ", ".join(labels))
        self.resolution = "INA3221 via iio: in_power mW readings"
        self.interval_s = INTERVALS["ina3221"]

    def read(self) -> dict[str, float]:
        return {label: _number(power) / 1e3 for label, power in self.channels}


_PMIC_LINE = re.compile(r"^\s*(\S+)_([AV])\s+(current|volt)\(\d+\)=([-+0-9.eE]+)[AV]\s*$")


def parse_pmic(text: str) -> dict[str, dict[str, float]]:
    """``vcgencmd pmic_read_adc`` output -> ``{rail: {"V": volts, "A": amps}}`` (lines it does not
    recognise are skipped; a rail may carry one of the two only)."""
    rails: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        m = _PMIC_LINE.match(line)
        if m:
            rails.setdefault(m.group(1), {})[m.group(2)] = float(m.group(4))
    return rails


def pmic_watts(rails: dict[str, dict[str, float]]) -> dict[str, float]:
    """Power per rail that has both a voltage and a current: V x A."""
    return {name: r["V"] * r["A"] for name, r in rails.items() if "V" in r and "A" in r}


class Pmic(Source):
    """Raspberry Pi 5 PMIC rails through ``vcgencmd pmic_read_adc``."""

    name = "pmic"

    def __init__(self, command: list[str] | None = None):
        self.command = command or ["vcgencmd", "pmic_read_adc"]
        if not shutil.which(self.command[0]):
            raise Unavailable(f"{self.command[0]} not found (not a Raspberry Pi)")
        t0 = time.perf_counter()
        rails = pmic_watts(parse_pmic(self._run()))
        self.call_s = time.perf_counter() - t0
        if not rails:
            raise Unavailable("vcgencmd pmic_read_adc gave no rail with volts and amps (not a Raspberry Pi 5)")
        self.total_rails = sorted(rails)
        self.scope = ("sum of the PMIC's output rails (SoC core, DRAM, I/O); not the 5 V input: "
                      "conversion losses and USB devices are outside it")
        self.resolution = f"PMIC ADC via vcgencmd (one call {self.call_s * 1e3:.0f} ms)"
        self.interval_s = max(INTERVALS["pmic"], self.call_s)

    def _run(self) -> str:
        try:
            proc = subprocess.run(self.command, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Unavailable(f"{' '.join(self.command)} failed: {exc}") from None
        out = (proc.stdout or "") + (proc.stderr or "")
        err = re.search(r'error_msg="([^"]*)"', out)
        if err:  # vcgencmd answers rc 0 with error=N error_msg="Command not registered" on other Pis
            raise Unavailable(f"vcgencmd pmic_read_adc: {err.group(1)} (not a Raspberry Pi 5)")
        if proc.returncode != 0:
            last = out.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            hint = " (needs /dev/vcio: the video group)" if "vcio" in out or "VCHI" in out else ""
            raise Unavailable(f"vcgencmd pmic_read_adc: {last[0][:200]}{hint}")
        return proc.stdout

    def read(self) -> dict[str, float]:
        rails = pmic_watts(parse_pmic(self._run()))
        return {k: rails[k] for k in self.total_rails if k in rails}


class Rapl(Source):
    """Intel/AMD RAPL counters through powercap (µJ, wrapping at ``max_energy_range_uj``)."""

    name = "rapl"
    kind = "counter"

    def __init__(self, root: str | Path = "/"):
        base = os.path.join(str(root), "sys/class/powercap")
        if not os.path.isdir(base):
            raise Unavailable("no RAPL: /sys/class/powercap absent (no powercap driver; usual in a VM)")
        zones = sorted(glob.glob(os.path.join(base, "intel-rapl:*")))
        if not zones:
            raise Unavailable("no RAPL zone under /sys/class/powercap (intel-rapl:* absent)")
        self.zones: dict[str, tuple[str, float]] = {}  # rail -> (energy_uj path, range in µJ)
        self.total_rails = []
        denied = False
        names: dict[str, str] = {}
        for z in zones:
            zid = os.path.basename(z)[len("intel-rapl:"):]
            try:
                name = _text(os.path.join(z, "name"))
            except OSError:
                continue
            names[zid] = name
            parent = names.get(zid.split(":")[0]) if ":" in zid else None
            rail = f"{parent}/{name}" if parent else name
            try:
                _number(os.path.join(z, "energy_uj"))
                rng = _number(os.path.join(z, "max_energy_range_uj"))
            except PermissionError:
                denied = True
                continue
            except (OSError, ValueError):
                continue
            self.zones[rail] = (os.path.join(z, "energy_uj"), rng)
            # packages, plus DRAM (outside the package domain); core/uncore are parts of a package, psys overlaps
            if (parent is None and name.startswith("package")) or name == "dram":
                self.total_rails.append(rail)
        if not self.zones:
            raise Unavailable(RAPL_ROOT_ONLY if denied else "no readable RAPL energy_uj under /sys/class/powercap")
        if not self.total_rails:
            self.total_rails = [r for r in self.zones if "/" not in r]
        self.scope = "sum of " + ", ".join(self.total_rails) + " (CPU package and DRAM domains)"
        self.resolution = "RAPL counter in µJ (energy_uj), hardware updates about every 1 ms"

    def read(self) -> dict[str, float]:
        return {rail: _number(path) / 1e6 for rail, (path, _) in self.zones.items()}

    def delta(self, rail: str, before: float, after: float) -> float:
        return counter_delta(before, after, self.zones[rail][1] / 1e6)


def counter_delta(before: float, after: float, wrap: float | None) -> float:
    """after - before for a counter that wraps to 0 after ``wrap`` (at most once in between)."""
    d = after - before
    if d < 0 and wrap:
        d += wrap
    return d


_NVML_SUCCESS, _NVML_NOT_SUPPORTED = 0, 3


class _Nvml:
    """The few NVML calls needed, through ctypes on ``libnvidia-ml.so.1`` (no pynvml)."""

    def __init__(self, library: str = "libnvidia-ml.so.1"):
        try:
            self.lib = ctypes.CDLL(library)
        except OSError as exc:
            raise Unavailable(f"no NVIDIA driver ({exc})") from None
        self.lib.nvmlErrorString.restype = ctypes.c_char_p
        self._check(self.lib.nvmlInit_v2(), "nvmlInit")
        count = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount")
        self.handles: list[tuple[str, ctypes.c_void_p]] = []
        for i in range(count.value):
            h = ctypes.c_void_p()
            self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)), "nvmlDeviceGetHandleByIndex")
            buf = ctypes.create_string_buffer(96)
            self.lib.nvmlDeviceGetName(h, buf, 96)
            self.handles.append((f"gpu{i} {buf.value.decode(errors='replace')}".strip(), h))
        if not self.handles:
            self.close()
            raise Unavailable("NVML found no NVIDIA GPU")

    def _check(self, rc: int, what: str) -> None:
        if rc != _NVML_SUCCESS:
            msg = self.lib.nvmlErrorString(rc)
            raise Unavailable(f"{what}: {msg.decode() if msg else rc}")

    def energy_mj(self, h: ctypes.c_void_p) -> int:
        e = ctypes.c_ulonglong()
        rc = self.lib.nvmlDeviceGetTotalEnergyConsumption(h, ctypes.byref(e))
        self._check(rc, "nvmlDeviceGetTotalEnergyConsumption")
        return int(e.value)

    def power_mw(self, h: ctypes.c_void_p) -> int:
        p = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetPowerUsage(h, ctypes.byref(p)), "nvmlDeviceGetPowerUsage")
        return int(p.value)

    def close(self) -> None:
        try:
            self.lib.nvmlShutdown()
        except (AttributeError, OSError):
            pass


class NvmlEnergy(Source):
    """NVML's total energy counter of every NVIDIA GPU (mJ)."""

    name = "nvml"
    kind = "counter"

    def __init__(self, nvml: _Nvml):
        self.nvml = nvml
        for _, h in nvml.handles:
            nvml.energy_mj(h)  # Unavailable when the GPU has no counter (before Volta)
        self.total_rails = [n for n, _ in nvml.handles]
        self.scope = ("the GPU board" if len(nvml.handles) == 1
                      else f"all {len(nvml.handles)} GPU boards summed (idle ones included)")
        self.resolution = "NVML total energy counter in mJ (refreshed by the driver at its own rate)"

    def read(self) -> dict[str, float]:
        return {n: self.nvml.energy_mj(h) / 1e3 for n, h in self.nvml.handles}

    def close(self) -> None:
        self.nvml.close()


class NvmlPower(Source):
    """NVML's power reading (mW), sampled, where the energy counter is not supported."""

    name = "nvml-power"

    def __init__(self, nvml: _Nvml):
        self.nvml = nvml
        for _, h in nvml.handles:
            nvml.power_mw(h)
        self.total_rails = [n for n, _ in nvml.handles]
        self.scope = ("the GPU board" if len(nvml.handles) == 1
                      else f"all {len(nvml.handles)} GPU boards summed (idle ones included)")
        self.resolution = "NVML power in mW (nvmlDeviceGetPowerUsage)"
        self.interval_s = INTERVALS["nvml-power"]

    def read(self) -> dict[str, float]:
        return {n: self.nvml.power_mw(h) / 1e3 for n, h in self.nvml.handles}

    def close(self) -> None:
        self.nvml.close()


def parse_nvidia_smi_power(text: str) -> dict[str, float]:
    """``nvidia-smi --query-gpu=index,power.draw --format=csv,noheader,nounits`` -> {"gpuN": watts};
    GPUs answering ``[N/A]``/``[Not Supported]`` are left out."""
    out = {}
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2:
            try:
                out[f"gpu{int(parts[0])}"] = float(parts[1])
            except ValueError:
                continue
    return out


class NvidiaSmi(Source):
    """``nvidia-smi`` power.draw, sampled (where NVML cannot be loaded through ctypes)."""

    name = "nvidia-smi"
    command = ["nvidia-smi", "--query-gpu=index,power.draw", "--format=csv,noheader,nounits"]

    def __init__(self):
        if not shutil.which("nvidia-smi"):
            raise Unavailable("nvidia-smi not found")
        first = self.read()
        if not first:
            raise Unavailable("nvidia-smi reports no power.draw ([N/A])")
        self.total_rails = sorted(first)
        self.scope = "the GPU board" if len(first) == 1 else f"all {len(first)} GPU boards summed"
        self.resolution = "nvidia-smi power.draw in 0.01 W"
        self.interval_s = INTERVALS["nvidia-smi"]

    def read(self) -> dict[str, float]:
        try:
            proc = subprocess.run(self.command, capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise Unavailable(f"nvidia-smi failed: {exc}") from None
        if proc.returncode != 0:
            raise Unavailable("nvidia-smi: " + ((proc.stdout + proc.stderr).strip().splitlines() or ["failed"])[-1][:200])
        return parse_nvidia_smi_power(proc.stdout)


def _nvidia() -> Source:
    try:
        nvml = _Nvml()
    except Unavailable as exc:
        if shutil.which("nvidia-smi"):
            try:
                return NvidiaSmi()
            except Unavailable as exc2:
                raise Unavailable(f"{exc}; {exc2}") from None
        raise Unavailable(f"{exc}; no nvidia-smi") from None
    try:
        return NvmlEnergy(nvml)
    except Unavailable as counter:
        try:
            return NvmlPower(nvml)
        except Unavailable as power:
            nvml.close()
            raise Unavailable(f"{counter}; {power}") from None


def _ina3221(root: str | Path) -> Source:
    try:
        return Ina3221Hwmon(root)
    except Unavailable as hwmon:
        try:
            return Ina3221Iio(root)
        except Unavailable:
            raise hwmon from None


def discover(root: str | Path = "/", only: list[str] | None = None) -> tuple[list[Source], dict[str, str]]:
    """The energy sources this device offers, and for each one it does not, why."""
    makers: dict[str, Callable[[], Source]] = {"ina3221": lambda: _ina3221(root), "nvml": _nvidia,
                                                "rapl": lambda: Rapl(root), "pmic": lambda: Pmic()}
    found: list[Source] = []
    why: dict[str, str] = {}
    for name in only or SOURCES:
        try:
            found.append(makers[name]())
        except Unavailable as exc:
            why[name] = str(exc)
        except Exception as exc:  # a source must never take the bench down
            why[name] = f"{type(exc).__name__}: {exc}"
    return found, why


def available(root: str | Path = "/", emulated: str | None = None) -> dict[str, Any]:
    """For the probe: the sources present (name, resolution, scope, rails) and why the others are not."""
    if emulated:
        return {"sources": [], "unavailable": {name: _emulated(emulated) for name in SOURCES}}
    found, why = discover(root)
    sources = []
    for s in found:
        try:
            rails = sorted(s.read())
        except Exception as exc:  # present a moment ago, unreadable now: say so
            why[s.name] = f"{type(exc).__name__}: {exc}"
            continue
        finally:
            s.close()
        sources.append({"source": s.name, "kind": s.kind, "resolution": s.resolution, "scope": s.scope,
                        "rails": rails})
    return {"sources": sources, "unavailable": why}


# ---- measuring --------------------------------------------------------------------------------


def integrate(times: list[float], watts: list[float]) -> float:
    """Joules from power samples (s, W) by the trapezoid rule."""
    return float(sum((times[i] - times[i - 1]) * (watts[i] + watts[i - 1]) / 2 for i in range(1, len(times))))


def counter_energy(reads: list[float], delta: Callable[[float, float], float]) -> float:
    """Joules from successive reads of a counter: the sum of each step's ``delta`` (a counter read
    every COUNTER_POLL_S wraps at most once per step, however long the window)."""
    return float(sum(delta(reads[i - 1], reads[i]) for i in range(1, len(reads))))


class _Sampler(threading.Thread):
    """Reads one source every ``interval_s`` until stopped (a counter: to see every wraparound)."""

    def __init__(self, source: Source, interval_s: float | None):
        super().__init__(name=f"energy-{source.name}", daemon=True)
        self.source = source
        self.interval_s = interval_s or 0.1
        self.times: list[float] = []
        self.values: list[dict[str, float]] = []
        self.errors = 0
        self.stop_event = threading.Event()

    def sample(self) -> None:
        try:
            v = self.source.read()
            if not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 and
                       (self.source.kind == "counter" or x <= MAX_POWER_W) for x in v.values()):
                raise ValueError(f"a reading that cannot be: {v}")
        except Exception:  # a missed sample; the integral spans the ones read
            self.errors += 1
            return
        self.times.append(time.perf_counter())
        self.values.append(v)

    def run(self) -> None:
        while not self.stop_event.wait(self.interval_s):
            self.sample()


class Meter:
    """Energy over a window: ``start()`` right before the timed loop, ``stop(inferences)`` right after."""

    def __init__(self, sources: list[Source], why_not: dict[str, str], prefer: list[str] | None = None):
        self.sources = sources
        self.why_not = dict(why_not)
        self.prefer = prefer or []
        self._samplers: dict[str, _Sampler] = {}
        self._closed = False

    def start(self) -> None:
        for s in self.sources:
            sampler = _Sampler(s, COUNTER_POLL_S if s.kind == "counter" else s.interval_s)
            sampler.sample()
            if s.kind == "counter" and not sampler.times:
                self.why_not[s.name] = "the counter could not be read at the start"
                continue
            sampler.start()
            self._samplers[s.name] = sampler

    def stop(self, inferences: int) -> dict[str, Any]:
        """The energy report (the bench reply's ``energy``), sources closed."""
        measured: list[dict[str, Any]] = []
        for s in self.sources:
            try:
                m = self._finish(s, inferences)
            except Exception as exc:
                m = None
                self.why_not[s.name] = f"{type(exc).__name__}: {exc}"
            if m is not None:
                measured.append(m)
        self.abort()
        return report(measured, self.why_not, self.prefer)

    def abort(self) -> None:
        """Stop the sampling threads and close the sources (also when the bench failed; idempotent)."""
        for sampler in self._samplers.values():
            sampler.stop_event.set()
            sampler.join(timeout=5)
        if not self._closed:
            self._closed = True
            for s in self.sources:
                try:
                    s.close()
                except Exception:
                    pass

    def _finish(self, s: Source, inferences: int) -> dict[str, Any] | None:
        sampler = self._samplers.get(s.name)
        if sampler is None:
            return None
        sampler.stop_event.set()
        sampler.join(timeout=10)
        sampler.sample()
        times, values = sampler.times, sampler.values
        if len(times) < 2:
            self.why_not[s.name] = f"fewer than 2 readings over the window ({sampler.errors} failed)"
            return None
        window = times[-1] - times[0]
        samples = len(times)
        rails: dict[str, dict[str, float]] = {}
        for rail in values[0]:
            pts = [(t, v[rail]) for t, v in zip(times, values) if rail in v]
            if s.kind == "counter":  # consecutive reads' differences: each spans at most one wraparound
                j = counter_energy([p[1] for p in pts], lambda a, b, rail=rail: s.delta(rail, a, b))
            else:
                j = integrate([p[0] for p in pts], [p[1] for p in pts])
            rails[rail] = {"energy_j": j, "mean_power_w": j / window if window > 0 else None}
        if s.kind == "counter":
            resolution = s.resolution
        else:
            resolution = (f"{s.resolution}; sampled every {s.interval_s * 1e3:.0f} ms "
                          f"(mean gap {window / (samples - 1) * 1e3:.1f} ms, {samples} samples"
                          + (f", {sampler.errors} failed reads" if sampler.errors else "") + ")")
        total = sum(rails[r]["energy_j"] for r in s.total_rails if r in rails)
        if not rails or window <= 0:
            self.why_not[s.name] = "no reading over the window"
            return None
        if not math.isfinite(total) or total / window > MAX_POWER_W:
            self.why_not[s.name] = (f"readings not believable: {total:.6g} J over {window:.3f} s "
                                    f"(more than {MAX_POWER_W:.0f} W, or not a number)")
            return None
        if total <= 0:
            self.why_not[s.name] = (f"the counter did not advance over the {window:.3f} s window "
                                    "(shorter than its update interval: bench longer)" if s.kind == "counter"
                                    else f"the rails read no power over the {window:.3f} s window")
            return None
        return {"source": s.name, "resolution": resolution, "scope": s.scope,
                "joules_per_inference": total / inferences if inferences else None,
                "mean_power_w": total / window, "samples": samples,
                "rails": {r: {k: round(v, 6) if isinstance(v, float) else v for k, v in d.items()}
                          for r, d in rails.items()},
                "energy_j": total, "window_s": window, "inferences": inferences}


ORDER = ("ina3221", "pmic", "rapl", "nvml", "nvml-power", "nvidia-smi")
GPU_ORDER = ("ina3221", "pmic", "nvml", "nvml-power", "nvidia-smi", "rapl")


def report(measured: list[dict[str, Any]], why_not: dict[str, str], prefer: list[str] | None = None) -> dict[str, Any]:
    """One source's figures at the top (the first of ``prefer`` measured), the others under
    ``others``; or ``{"source": null, "why_not": ...}``."""
    order = list(prefer or ORDER)
    if not measured:
        reasons = "; ".join(f"{k}: {v}" for k, v in why_not.items()) or "no energy source known to the agent"
        return {"source": None, "why_not": f"not available on this device ({reasons})", "unavailable": why_not}
    measured.sort(key=lambda m: order.index(m["source"]) if m["source"] in order else len(order))
    out = dict(measured[0])
    if len(measured) > 1:
        out["others"] = measured[1:]
    if why_not:
        out["unavailable"] = why_not
    return out


def _emulated(emulator: str) -> str:
    return f"emulated CPU ({emulator}): the power sensors visible here are the host's, not this device's"


def not_measured(why: str) -> dict[str, Any]:
    return {"source": None, "why_not": f"not available on this device ({why})"}


def prepare(gpu: bool = False, emulated: str | None = None, root: str | Path = "/",
            only: list[str] | None = None) -> Meter | dict[str, Any]:
    """Find the sources (NVML's initialisation can take a second: done before the warm-up), a meter not
    yet started; a report dict instead when nothing can be measured here (``emulated``: the emulator's
    name — the sensors seen there are the host's).  ``gpu``: NVIDIA sources before RAPL."""
    if emulated:
        return not_measured(_emulated(emulated))
    found, why = discover(root, only)
    if not found:
        return report([], why)
    return Meter(found, why, list(GPU_ORDER if gpu else ORDER))


def start(gpu: bool = False, emulated: str | None = None, root: str | Path = "/",
          only: list[str] | None = None) -> Meter | dict[str, Any]:
    """``prepare`` and start measuring at once."""
    meter = prepare(gpu, emulated, root, only)
    if isinstance(meter, Meter):
        meter.start()
    return meter
