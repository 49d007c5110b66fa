"""What this device is: OS, CPU, memory, disk, GPUs/NPUs, Jetson release, runtimes and their versions.

Standard library only (numpy is reported, not needed).  Everything is read from ``/proc``, ``/sys``,
``sysctl`` or ``nvidia-smi`` where present; anything unreadable is ``null`` rather than an error, so
the probe works on any Linux board, a Jetson, a Mac or a cloud VM.  Runtime versions come from
package metadata without importing the runtime; only when a runtime has no metadata (a vendor
install) is it imported, in a child process, so a broken runtime cannot take the probe down.

The sampling helpers (governor, frequency, temperature, load) are shared with ``bench`` to record
the environment a measurement was taken in.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import AGENT_VERSION

# runtime key -> (distributions that provide it, module name for the import fallback)
RUNTIMES: dict[str, tuple[tuple[str, ...], str]] = {
    "onnxruntime": (("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml",
                     "onnxruntime-qnn", "onnxruntime-silicon", "ort-nightly"), "onnxruntime"),
    "openvino": (("openvino", "openvino-nightly"), "openvino"),
    "tflite_runtime": (("tflite-runtime",), "tflite_runtime"),
    "ai_edge_litert": (("ai-edge-litert", "ai-edge-litert-nightly"), "ai_edge_litert"),
    "tensorrt": (("tensorrt", "tensorrt-cu12", "tensorrt-cu11", "tensorrt-cu13", "tensorrt-lean",
                  "tensorrt-cu12-bindings"), "tensorrt"),
    "coremltools": (("coremltools",), "coremltools"),
    # tf.lite.Interpreter is the last-resort TFLite interpreter on a device with full TensorFlow.
    "tensorflow": (("tensorflow", "tensorflow-cpu", "tensorflow-aarch64", "tf-nightly"), "tensorflow"),
}

# CPU features that decide which kernels a runtime uses (VNNI/AMX for INT8, fp16/dotprod on ARM).
_FLAGS = {
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
    "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16",
    "neon", "asimd", "asimdhp", "asimddp", "asimdfhm", "fphp", "sve", "sve2", "i8mm", "bf16",
}


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text(errors="replace").strip()
    except OSError:
        return None


def _run(cmd: list[str], timeout: float = 10) -> str | None:
    """stdout of a command, or None when it is absent, fails or hangs."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _cpuinfo() -> list[dict[str, str]]:
    """/proc/cpuinfo as one dict per processor block (plus the trailing ARM header block)."""
    text = _read("/proc/cpuinfo") or ""
    blocks = []
    for chunk in text.split("\n\n"):
        d = {}
        for line in chunk.splitlines():
            k, sep, v = line.partition(":")
            if sep:
                d[k.strip()] = v.strip()
        if d:
            blocks.append(d)
    return blocks


def _sysctl(name: str) -> str | None:
    return _run(["sysctl", "-n", name]) if sys.platform == "darwin" else None


def cpu_info() -> dict[str, Any]:
    """CPU model, logical/usable/physical core counts and the feature flags that matter to runtimes."""
    blocks = _cpuinfo()
    model = None
    for key in ("model name", "Hardware", "Processor", "cpu model", "uarch"):
        model = next((b[key] for b in blocks if b.get(key)), None)
        if model:
            break
    model = model or _sysctl("machdep.cpu.brand_string") or platform.processor() or None
    flags: set[str] = set()
    for b in blocks:
        flags |= set((b.get("flags") or b.get("Features") or "").split())
    if sys.platform == "darwin":  # Apple silicon: hw.optional.arm.FEAT_* = 1
        for line in (_run(["sysctl", "hw.optional"]) or "").splitlines():
            k, _, v = line.partition(":")
            if v.strip() == "1":
                flags.add(k.strip().rsplit(".", 1)[-1].lower())
    physical = {(b.get("physical id"), b.get("core id")) for b in blocks if "core id" in b}
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    board = _read("/proc/device-tree/model")
    return {
        "model": model,
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "cores_physical": len(physical) or None,
        "flags_subset": sorted(flags & _FLAGS | {f for f in flags if f.startswith("feat_")}),
        "board": board.rstrip("\x00") if board else None,
    }


def memory_mb() -> dict[str, int | None]:
    """Total and available memory in MiB."""
    info = {}
    for line in (_read("/proc/meminfo") or "").splitlines():
        k, _, v = line.partition(":")
        if v.strip().endswith("kB"):
            info[k] = int(v.split()[0]) // 1024
    total = info.get("MemTotal")
    if total is None and (b := _sysctl("hw.memsize")):
        total = int(b) // (1 << 20)
    return {"total": total, "available": info.get("MemAvailable")}


def disk_free_mb(path: str | Path) -> int | None:
    """Free space where ``path`` is (or would be: its nearest existing parent)."""
    p = Path(path).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free // (1 << 20)
    except OSError:
        return None


def gpus() -> list[dict[str, Any]]:
    """NVIDIA GPUs from nvidia-smi, then other GPUs seen in /sys/class/drm (Intel, AMD)."""
    found: list[dict[str, Any]] = []
    if shutil.which("nvidia-smi"):
        fields = "index,name,memory.total,driver_version,compute_cap"
        out = _run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
        if out is None:  # drivers older than ~510 lack compute_cap
            fields = "index,name,memory.total,driver_version"
            out = _run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
        for line in (out or "").splitlines():
            vals = [v.strip() for v in line.split(",")]
            row = dict(zip(fields.split(","), vals))
            found.append({"vendor": "nvidia", "index": _int(row.get("index")), "name": row.get("name"),
                          "memory_mb": _int(row.get("memory.total")), "driver": row.get("driver_version"),
                          "compute_capability": row.get("compute_cap")})
    vendors = {"0x8086": "intel", "0x1002": "amd", "0x10de": "nvidia"}
    for card in sorted(Path("/sys/class/drm").glob("card[0-9]*")):
        if "-" in card.name:  # connectors such as card0-HDMI-A-1
            continue
        vendor = vendors.get(_read(card / "device" / "vendor") or "")
        if vendor is None or (vendor == "nvidia" and any(g["vendor"] == "nvidia" for g in found)):
            continue
        found.append({"vendor": vendor, "index": _int(card.name[4:]), "name": None,
                      "device_id": _read(card / "device" / "device"), "drm": card.name})
    return found


def npus() -> list[dict[str, Any]]:
    """Accelerators under /sys/class/accel (Intel NPU on Core Ultra, others)."""
    out = []
    for acc in sorted(Path("/sys/class/accel").glob("accel*")):
        out.append({"name": acc.name, "vendor_id": _read(acc / "device" / "vendor"),
                    "device_id": _read(acc / "device" / "device")})
    return out


def jetson(base: str | Path = "/") -> dict[str, Any] | None:
    """L4T release, board model and power state on an NVIDIA Jetson, else None. ``base`` is the file
    system root the files are read under (``/`` on the device)."""
    b = Path(base)
    release = _read(b / "etc/nv_tegra_release")
    if release is None:
        return None
    first = release.splitlines()[0] if release else ""
    m = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", first)
    model = _read(b / "proc/device-tree/model")
    return {"l4t": f"{m.group(1)}.{m.group(2)}" if m else None, "release": first.lstrip("# "),
            "model": model.rstrip("\x00") if model else None,
            "chip_id": _read(b / "sys/module/tegra_fuse/parameters/tegra_chip_id"), **jetson_power(b)}


_GPU_DEVFREQ = re.compile(r"gpu|ga10b|gv11b|gp10b|gb10b", re.I)


def jetson_power(base: str | Path = "/") -> dict[str, Any]:
    """The Jetson's power mode and whether its clocks are locked, read without root and without running
    ``nvpmodel``: the active mode from ``/var/lib/nvpmodel/status`` (``pmode:0002``, written by nvpmodel),
    its name and the boot default from ``/etc/nvpmodel.conf`` (``< POWER_MODEL ID=2 NAME=MAXN >``,
    ``< PM_CONFIG DEFAULT=2 >``); ``clocks_locked`` is what ``jetson_clocks`` does: every online CPU's
    and the GPU's minimum frequency raised to its maximum (None where neither is exposed)."""
    b = Path(base)
    conf = _read(b / "etc/nvpmodel.conf") or ""
    modes = {int(i): n for i, n in re.findall(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)", conf)}
    d = re.search(r"<\s*PM_CONFIG\s+DEFAULT=(\d+)", conf)
    default = int(d.group(1)) if d else None
    st = re.search(r"pmode:0*(\d+)", _read(b / "var/lib/nvpmodel/status") or "")
    mode = int(st.group(1)) if st else default  # no status file yet: the board runs its boot default
    pairs: list[tuple[str, int | None, int | None]] = []
    for cpu in sorted((b / "sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq")):
        pairs.append((cpu.parent.name, _int(_read(cpu / "scaling_min_freq")), _int(_read(cpu / "scaling_max_freq"))))
    for dev in sorted((b / "sys/class/devfreq").glob("*")):
        if _GPU_DEVFREQ.search(dev.name):
            pairs.append(("gpu", _int(_read(dev / "min_freq")), _int(_read(dev / "max_freq"))))
    known = [(n, lo, hi) for n, lo, hi in pairs if lo is not None and hi is not None]
    unlocked = [n for n, lo, hi in known if lo < hi]
    return {"power_mode": modes.get(mode) if mode is not None else None, "power_mode_id": mode,
            "power_mode_default_id": default, "power_modes": {str(k): v for k, v in sorted(modes.items())},
            "clocks_locked": (not unlocked) if known else None, "clocks_unlocked": sorted(set(unlocked))}


def _int(s: Any) -> int | None:
    try:
        return int(float(s))
    except (TypeError, ValueError):
        return None


def runtime_versions(import_fallback: bool = True) -> dict[str, str | None]:
    """Version of each runtime (``None`` when absent), from metadata; no runtime is imported here."""
    versions: dict[str, str | None] = {}
    for key, (dists, module) in RUNTIMES.items():
        version = None
        for dist in dists:
            try:
                version = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        if version is None and import_fallback and importlib.util.find_spec(module) is not None:
            version = _version_by_import(module)
        versions[key] = version
    return versions


def _version_by_import(module: str) -> str | None:
    """Import in a child process: a runtime without metadata (apt, vendor SDK) may also be broken."""
    code = f"import {module} as m; print(getattr(m, '__version__', None) or 'unknown')"
    out = _run([sys.executable, "-c", code], timeout=60)
    return out.splitlines()[-1] if out else None


def numpy_version() -> str | None:
    try:
        return importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        return None


def os_release() -> str | None:
    """The distribution's PRETTY_NAME (or macOS product version)."""
    for line in (_read("/etc/os-release") or "").splitlines():
        if line.startswith("PRETTY_NAME="):
            return line.split("=", 1)[1].strip().strip('"')
    if sys.platform == "darwin":
        return "macOS " + platform.mac_ver()[0]
    return None


# ---- environment sampling, shared with bench ------------------------------------------------


def governors() -> str | dict[str, str] | None:
    """The cpufreq governor: one string when all CPUs agree, else per CPU; None when not exposed."""
    found = {}
    for p in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor")):
        if (g := _read(p)) is not None:
            found[p.parent.parent.name] = g
    if not found:
        return None
    values = set(found.values())
    return values.pop() if len(values) == 1 else found


def freq_mhz() -> dict[str, float | None]:
    """Current CPU frequency (mean, min and max over CPUs) from cpufreq, else /proc/cpuinfo."""
    vals = []
    for p in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq"):
        if (v := _int(_read(p))) is not None:
            vals.append(v / 1000.0)
    if not vals:
        vals = [float(b["cpu MHz"]) for b in _cpuinfo() if _float(b.get("cpu MHz")) is not None]
    if not vals:
        return {"mean": None, "min": None, "max": None}
    return {"mean": round(sum(vals) / len(vals), 1), "min": round(min(vals), 1), "max": round(max(vals), 1)}


def _float(s: Any) -> float | None:
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def temperatures_c() -> dict[str, float]:
    """Thermal zones (type -> degrees C) where readable."""
    out = {}
    for zone in sorted(Path("/sys/class/thermal").glob("thermal_zone*")):
        t = _int(_read(zone / "temp"))
        if t is None:
            continue
        name = _read(zone / "type") or zone.name
        if name in out:
            name = f"{name}.{zone.name}"
        out[name] = round(t / 1000.0, 1)
    return out


def calibration_ms(iterations: int = 150_000, repeats: int = 5) -> float:
    """A fixed pure-Python workload (no numpy, no runtime), the best of ``repeats`` runs in ms: same code,
    same interpreter, same device, so when it gets slower the CPU was throttled (or something else took
    it). The host runs this function's own source on the device (``hil.rig.calibrate``); ``pairbench``
    runs a short one between blocks. Self-contained (its import inside) for that reason."""
    import time

    best = 1e9
    for _ in range(repeats):
        t = time.perf_counter()
        s = 0
        for i in range(iterations):
            s += i * i % 7
        best = min(best, time.perf_counter() - t)
    return round(best * 1000, 3)


# ---- emulation and virtualisation ------------------------------------------------------------------

# platform.machine() -> the /proc/cpuinfo keys only that architecture's kernel writes.
_ARCH_FAMILY = {"x86_64": "x86", "amd64": "x86", "i686": "x86", "i386": "x86", "aarch64": "arm", "arm64": "arm",
                "armv7l": "arm", "armv8l": "arm", "armv6l": "arm", "riscv64": "riscv", "ppc64le": "power",
                "s390x": "s390"}


def _cpuinfo_family(text: str) -> str | None:
    """The architecture family whose kernel wrote this /proc/cpuinfo (None when it cannot be told)."""
    keys = {line.partition(":")[0].strip() for line in text.splitlines() if ":" in line}
    if "vendor_id" in keys and "flags" in keys:
        return "x86"
    if "CPU implementer" in keys or "CPU architecture" in keys:
        return "arm"
    if "isa" in keys and "mmu" in keys:
        return "riscv"
    if "timebase" in keys:
        return "power"
    if "bogomips per cpu" in keys:
        return "s390"
    return None


# a qemu user-mode interpreter (qemu-aarch64, qemu-aarch64-static, Debian's qemu-binfmt/aarch64-binfmt-P), not
# qemu-system-*, qemu-img and the other tools
_QEMU_USER = re.compile(r"(^|/)qemu-(?!system|img|nbd|io|storage|ga|pr-helper|edid|keymap)[\w.]+(-static)?$|"
                        r"/qemu-binfmt/")


def _link(path: Path) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def emulation(base: str | Path = "/", machine: str | None = None, pid: int | None = None,
              ppid: int | None = None) -> dict[str, Any]:
    """Is this CPU emulated? ``{"emulated": True|False|None, "emulator": "qemu-user"|"qemu-system (TCG)"|None,
    "virtualization": "kvm"|"qemu"|...|None, "evidence": [...]}`` (``None``: could not be told).

    qemu-user (a foreign-arch binary run through binfmt_misc) rewrites what this process reads of its own
    /proc entries (``/proc/self/{exe,maps,auxv,cmdline}`` and ``/proc/<own pid>/...``), so those cannot tell.
    What can: ``/proc/thread-self/exe`` (not rewritten: the kernel's link names the qemu interpreter
    binfmt_misc started; the parent's ``/proc/<ppid>/exe`` where thread-self is not there, kernels < 3.17), and ``/proc/cpuinfo`` when it describes another
    architecture than ``platform.machine()`` (qemu before 8.1 passes the host's through). An enabled
    ``binfmt_misc`` handler for this very architecture is supporting evidence only (never alone).
    Full-system qemu without KVM (TCG): DMI says QEMU and neither the ``hypervisor`` CPU flag nor the
    ``kvm-clock`` clocksource is there; with them it is a KVM guest (virtualised, not emulated).
    ``base`` is the file-system root the files are read under (``/`` on the device; a laid-out tree in tests).
    """
    b = Path(base)
    machine = (machine or platform.machine() or "").lower()
    pid = os.getpid() if pid is None else pid
    ppid = os.getppid() if ppid is None else ppid
    evidence: list[str] = []
    emulator: str | None = None
    # 1. qemu-user: the kernel's own exe link of this thread; the parent's only where that cannot be read
    #    (an emulated parent alone does not make this process emulated)
    own = _link(b / "proc/thread-self/exe")
    for rel, target in (("proc/thread-self/exe", own),
                        (f"proc/{ppid}/exe", _link(b / f"proc/{ppid}/exe") if own is None else None)):
        if target and _QEMU_USER.search(target):
            evidence.append(f"/{rel} -> {target}")
            emulator = "qemu-user"
    # 2. /proc/cpuinfo written by another architecture's kernel
    info = _read(b / "proc/cpuinfo") or ""
    fam, want = _cpuinfo_family(info), _ARCH_FAMILY.get(machine)
    if fam and want and fam != want:
        evidence.append(f"/proc/cpuinfo is an {fam} kernel's, the process runs {machine}")
        emulator = emulator or "qemu-user"
    # 3. binfmt_misc handler for this architecture (supporting only)
    handler = b / "proc/sys/fs/binfmt_misc" / f"qemu-{'aarch64' if machine == 'arm64' else machine}"
    htext = _read(handler) or ""
    if htext.startswith("enabled") and emulator:
        interp = next((ln.split(None, 1)[1] for ln in htext.splitlines() if ln.startswith("interpreter ")), "")
        evidence.append(f"binfmt_misc {handler.name} enabled ({interp})")
    if emulator:
        return {"emulated": True, "emulator": emulator, "virtualization": None, "evidence": evidence}
    if not info and own is None:  # no /proc to read (not Linux, or a chroot without it): cannot be told
        return {"emulated": None, "emulator": None, "virtualization": None,
                "evidence": ["neither /proc/cpuinfo nor /proc/thread-self/exe is readable"]}
    # 4. full-system virtual machines
    dmi = " ".join(_read(b / f"sys/class/dmi/id/{k}") or "" for k in ("sys_vendor", "product_name", "bios_vendor"))
    flags = set()
    model = ""
    for block in info.split("\n\n"):
        for line in block.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in ("flags", "Features"):
                flags |= set(v.split())
            elif k.strip() == "model name" and not model:
                model = v.strip()
    clocks = (_read(b / "sys/devices/system/clocksource/clocksource0/available_clocksource") or "").split()
    qemu = "QEMU" in dmi or "QEMU" in model
    kvm = "kvm-clock" in clocks or "KVM" in dmi
    if qemu and not kvm and "hypervisor" not in flags and want == "x86":
        evidence.append(f"QEMU machine ({(dmi.strip() or model)[:60]}) without the hypervisor flag or kvm-clock")
        return {"emulated": True, "emulator": "qemu-system (TCG)", "virtualization": "qemu", "evidence": evidence}
    virt = None
    if kvm:
        virt = "kvm"
        evidence.append("kvm-clock clocksource" if "kvm-clock" in clocks else "DMI says KVM")
    elif qemu:
        virt = "qemu"
        evidence.append("QEMU machine; KVM or TCG could not be told")
    else:
        for name in ("VMware", "Xen", "Microsoft", "VirtualBox", "Amazon EC2", "Google"):
            if name in dmi:
                virt = name.lower()
                evidence.append(f"DMI says {name}")
                break
        if virt is None and "hypervisor" in flags:
            virt = "unknown hypervisor"
            evidence.append("hypervisor CPU flag")
    if qemu and not kvm and want != "x86":
        return {"emulated": None, "emulator": None, "virtualization": virt, "evidence": evidence}
    return {"emulated": False, "emulator": None, "virtualization": virt, "evidence": evidence}


_EMULATION: dict[str, Any] | None = None


def emulation_cached() -> dict[str, Any]:
    """``emulation()`` of this process, computed once (it does not change while the process lives)."""
    global _EMULATION
    if _EMULATION is None:
        _EMULATION = emulation()
    return dict(_EMULATION)


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def sample_environment() -> dict[str, Any]:
    """What can change between runs: governor, frequency, temperature, load; and whether the CPU is
    emulated (``emulated``, ``emulator``: a latency measured there is no latency of the hardware)."""
    temps = temperatures_c()
    freq = freq_mhz()
    emu = emulation_cached()
    return {"governor": governors(), "freq_mhz": freq["mean"], "freq_mhz_range": freq,
            "temperature_c": max(temps.values()) if temps else None, "temperatures_c": temps,
            "loadavg": loadavg(), "emulated": emu["emulated"], "emulator": emu["emulator"]}


def _emulation_facts() -> dict[str, Any]:
    emu = emulation_cached()
    return {"emulated": emu["emulated"], "emulator": emu["emulator"], "virtualization": emu["virtualization"],
            "emulation_evidence": emu["evidence"]}


def energy_sources() -> dict[str, Any]:
    """The energy sources a bench can read here (``energy.py``: Jetson INA3221, NVML, RAPL, Raspberry
    Pi 5 PMIC) and, for each one absent, why; ``{"error": ...}`` if looking failed."""
    try:
        from .energy import available

        return available(emulated=emulation_cached()["emulator"] or None)
    except Exception as exc:  # the probe never fails on a fact it cannot read
        return {"sources": [], "unavailable": {}, "error": f"{type(exc).__name__}: {exc}"}


def probe(root: str | Path, import_fallback: bool = True) -> dict[str, Any]:
    """The whole probe reply (see SCHEMA.md)."""
    cpu = cpu_info()
    mem = memory_mb()
    return {
        "os": platform.system(),
        "os_release": os_release(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "numpy": numpy_version(),
        "cpu": cpu,
        "memory_mb": mem["total"],
        "memory_available_mb": mem["available"],
        "root": str(Path(root).expanduser().absolute()),
        "disk_free_mb": disk_free_mb(root),
        "gpus": gpus(),
        "npus": npus(),
        "jetson": jetson(),
        **_emulation_facts(),
        "runtimes": runtime_versions(import_fallback),
        "environment": sample_environment(),
        "energy": energy_sources(),
        "agent": AGENT_VERSION,
        "agent_path": str(Path(__file__).resolve().parent),
    }


# ---- TensorRT on this device (issue 31: a TensorRT bundle is refused before it is pushed where it cannot run) --

def tensorrt_runtime() -> dict[str, Any]:
    """What a TensorRT bundle needs here, each imported for real (a package can be installed and still not
    load: libnvinfer or the CUDA driver missing): ``tensorrt`` with its builder (the agent builds the engine on
    the device, ``trt_compile``), ``tensorrt_lean`` (a runtime only: it cannot build one) and cuda-python's
    runtime API (the runner's buffers and streams). ``{"tensorrt": version|None, "tensorrt_error": why, ...}``.
    Not part of ``probe()``: importing TensorRT takes seconds; the host asks only before a TensorRT push."""
    out: dict[str, Any] = {}
    for key in ("tensorrt", "tensorrt_lean"):
        out[key], out[f"{key}_error"] = _import_version(key)
    out["cuda_python"], out["cuda_python_error"] = None, None
    for module in ("cuda.bindings.runtime", "cuda.cudart"):  # cuda-python >= 12.6, then older
        version, why = _import_version(module, dist="cuda-python")
        if version is not None:
            out["cuda_python"], out["cuda_python_error"] = version, None
            break
        out["cuda_python_error"] = out["cuda_python_error"] or why
    return out


def _import_version(module: str, dist: str | None = None) -> tuple[str | None, str | None]:
    """(version, None) when ``module`` imports, else (None, why in one line)."""
    import importlib

    try:
        if importlib.util.find_spec(module.split(".")[0]) is None:
            return None, "not installed"
        m = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken install (missing shared library, driver) says why
        return None, (f"{type(exc).__name__}: {exc}".splitlines() or ["import failed"])[0][:300]
    version = getattr(m, "__version__", None)
    if version is None and dist:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = None
    return str(version or "unknown"), None
