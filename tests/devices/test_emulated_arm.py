"""Emulated aarch64 boards: the probe's emulation facts (on /proc and /sys trees laid out as the kernel and
qemu-user show them) and the whole path on a real Debian bookworm arm64 userland run by qemu-user, reached
over real SSH (scripts/make_device.py): push, bench, the on-device check, and the record saying emulated.

The device test needs root (binfmt_misc, mmdebstrap, chroot) and Debian's and PyPI's registries the first
time (the root is then cached under ~/.cache/edgeopt/devices); it skips with the reason otherwise.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from edgeopt_agent.probe import emulation

REPO = Path(__file__).resolve().parents[2]

# ---- the probe, on files laid out as /proc and /sys show them ------------------------------------------------

X86_CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
stepping\t: 8
cpu MHz\t\t: 2000.000
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep sse sse2 ssse3 sse4_1 sse4_2 avx avx2 hypervisor
bogomips\t: 4000.00

"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x4
CPU part\t: 0xd0b
CPU revision\t: 1

"""
TCG_CPUINFO = X86_CPUINFO.replace("Intel(R) Xeon(R) Platinum 8480+", "QEMU Virtual CPU version 2.5+").replace(
    " hypervisor", "")
BINFMT = """enabled
interpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P
flags: PF
offset 0
magic 7f454c460201010000000000000000000200b700
mask ffffffffffffff00fffffffffffffffffeffffff
"""


def lay_out(tmp: Path, cpuinfo: str, links: dict[str, str] = (), files: dict[str, str] = ()) -> Path:
    root = tmp / "fs"
    (root / "proc").mkdir(parents=True)
    (root / "proc/cpuinfo").write_text(cpuinfo)
    for rel, target in dict(links).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, root / rel)
    for rel, text in dict(files).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_qemu_user_seen_through_the_kernels_exe_link(tmp_path):
    # qemu >= 8.1 shows an arm64 /proc/cpuinfo to the guest: the exe link of the thread still names qemu
    fs = lay_out(tmp_path, ARM_CPUINFO, links={"proc/thread-self/exe": "/usr/libexec/qemu-binfmt/aarch64-binfmt-P"},
                 files={"proc/sys/fs/binfmt_misc/qemu-aarch64": BINFMT})
    e = emulation(fs, machine="aarch64", pid=40, ppid=39)
    assert e["emulated"] is True and e["emulator"] == "qemu-user"
    assert any("aarch64-binfmt-P" in x for x in e["evidence"])
    assert any(x.startswith("binfmt_misc qemu-aarch64 enabled") for x in e["evidence"])


def test_qemu_user_seen_through_the_parents_exe_and_a_foreign_cpuinfo(tmp_path):
    # a kernel without /proc/thread-self: the parent's exe link (an emulated shell) and the host's cpuinfo
    fs = lay_out(tmp_path, X86_CPUINFO, links={"proc/39/exe": "/usr/bin/qemu-aarch64-static"})
    e = emulation(fs, machine="aarch64", pid=40, ppid=39)
    assert e["emulated"] is True and e["emulator"] == "qemu-user"
    assert "/proc/39/exe -> /usr/bin/qemu-aarch64-static" in e["evidence"]
    assert any("x86 kernel's" in x for x in e["evidence"])
    # the cpuinfo mismatch alone (qemu < 8.1 with no readable exe link) says so too
    e = emulation(lay_out(tmp_path / "b", X86_CPUINFO), machine="aarch64", pid=40, ppid=39)
    assert e["emulated"] is True and e["emulator"] == "qemu-user"


def test_native_boards_and_kvm_guests_are_not_emulated(tmp_path):
    # a real arm64 board, even one with binfmt handlers for other arches, its python's own exe link
    fs = lay_out(tmp_path / "arm", ARM_CPUINFO, links={"proc/thread-self/exe": "/usr/bin/python3.11",
                                                        "proc/39/exe": "/usr/bin/bash"},
                 files={"proc/sys/fs/binfmt_misc/qemu-x86_64": BINFMT})
    e = emulation(fs, machine="aarch64", pid=40, ppid=39)
    assert e == {"emulated": False, "emulator": None, "virtualization": None, "evidence": []}
    # qemu-system as a parent is no user-mode emulation; nor is an emulated parent of a native thread
    fs = lay_out(tmp_path / "x86", X86_CPUINFO, links={"proc/thread-self/exe": "/usr/bin/python3.11",
                                                        "proc/39/exe": "/usr/bin/qemu-aarch64-static"})
    assert emulation(fs, machine="x86_64", pid=40, ppid=39)["emulated"] is False
    fs = lay_out(tmp_path / "x86b", X86_CPUINFO, links={"proc/39/exe": "/usr/bin/qemu-system-x86_64"})
    assert emulation(fs, machine="x86_64", pid=40, ppid=39)["emulated"] is False
    # a binfmt handler for this very arch (a host that could emulate it) is never evidence on its own
    fs = lay_out(tmp_path / "arm2", ARM_CPUINFO, files={"proc/sys/fs/binfmt_misc/qemu-aarch64": BINFMT})
    assert emulation(fs, machine="aarch64", pid=40, ppid=39)["emulated"] is False
    # a KVM guest: QEMU machine, hypervisor flag, kvm-clock: virtualised, not emulated
    fs = lay_out(tmp_path / "kvm", X86_CPUINFO, files={
        "sys/class/dmi/id/sys_vendor": "QEMU\n", "sys/class/dmi/id/product_name": "Standard PC (Q35 + ICH9, 2009)\n",
        "sys/devices/system/clocksource/clocksource0/available_clocksource": "kvm-clock tsc acpi_pm \n"})
    e = emulation(fs, machine="x86_64", pid=40, ppid=39)
    assert e["emulated"] is False and e["virtualization"] == "kvm"


def test_without_proc_emulation_is_unknown(tmp_path):
    (tmp_path / "empty").mkdir()
    assert emulation(tmp_path / "empty", machine="aarch64", pid=40, ppid=39)["emulated"] is None


def test_full_system_qemu_without_kvm_is_emulated(tmp_path):
    fs = lay_out(tmp_path, TCG_CPUINFO, files={
        "sys/class/dmi/id/sys_vendor": "QEMU\n", "sys/class/dmi/id/product_name": "Standard PC (i440FX + PIIX, 1996)\n",
        "sys/devices/system/clocksource/clocksource0/available_clocksource": "tsc hpet acpi_pm \n"})
    e = emulation(fs, machine="x86_64", pid=40, ppid=39)
    assert e["emulated"] is True and e["emulator"] == "qemu-system (TCG)"


def test_this_host_is_not_emulated():
    """The test machine runs natively (or under KVM): its own facts must not say emulated."""
    e = emulation()
    assert e["emulated"] is False, e


# ---- the whole path on an emulated Debian bookworm arm64 board ---------------------------------------------

def _root_cached(suite: str) -> bool:
    spec = importlib.util.spec_from_file_location("make_device", REPO / "scripts" / "make_device.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.root_info(mod.default_root(suite, "arm64")) is not None


# Building a root the first time took 17-19 min on the 2-core CI machine under load (11-13 min mmdebstrap,
# 6 min wheels + venv + imports under emulation): that is a `slow` test. Once built, the root is cached and
# the test takes under a minute, so on a machine that has it, the README's test command runs it.
# bookworm: Python 3.11, numpy 1.24 (Raspberry Pi OS); bullseye: Python 3.9, numpy 1.19 (the agent's oldest here).
SUITES = [pytest.param(s, marks=[] if _root_cached(s) else [pytest.mark.slow]) for s in ("bookworm", "bullseye")]
EXPECT = {"bookworm": ("3.11.", "1.24.", "Debian GNU/Linux 12"), "bullseye": ("3.9.", "1.19.", "Debian GNU/Linux 11")}

FAST = {"duration_s": 1.0, "min_iters": 5, "max_iters": 200, "warmup": 1, "timeout_s": 240}


def _make_device():
    spec = importlib.util.spec_from_file_location("make_device", REPO / "scripts" / "make_device.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def running_board(suite: str, state: Path, target: str | None = None, store: str = "test"):
    """A running emulated arm64 board of one Debian userland (root built once, then cached): ``make_device.up``'s
    record, for a fixture to yield; its sshd is stopped and this run's agent store removed after. Skips where
    qemu-user or a registry is not available."""
    import shutil

    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("needs root on Linux (binfmt_misc, mmdebstrap, chroot)")
    md = _make_device()
    try:
        md.host_tools(install=True)
        md.binfmt("arm64")
    except md.DeviceError as e:
        pytest.skip(f"qemu-user cannot run here: {e}")
    port = md.free_port()
    try:
        out = md.up("arm64", suite, port=port, state=state, name="arm64-emu", target=target,
                    agent_root=f"/root/.edgeopt-{store}-{port}")
    except md.DeviceError as e:
        if any(k in str(e).lower() for k in ("could not resolve", "connection", "network is unreachable",
                                               "temporary failure", "name resolution", "failed to fetch")):
            pytest.skip(f"a registry is unreachable: {e}")
        raise
    if "onnxruntime" not in out["device"]["runtimes"]:
        pytest.fail(f"onnxruntime did not install in the arm64 root: {out['device']['refused']}")
    try:
        yield out
    finally:
        md.down("arm64", suite, port=port)
        shutil.rmtree(Path(out["root"]) / out["agent_root"].lstrip("/"), ignore_errors=True)  # this run's store


@pytest.fixture(scope="module", params=SUITES)
def arm_device(request, tmp_path_factory):
    """A running emulated arm64 device of one Debian userland, its inventory."""
    yield from running_board(request.param, tmp_path_factory.mktemp("arm"), target="cpu")


def test_push_bench_check_on_emulated_arm64_over_ssh(arm_device, cls_bundle, tmp_path):
    from edgeopt import decide
    from edgeopt.deploy import DeviceSession, load_bundle
    from edgeopt.fleetbench import bench_fleet
    from edgeopt.inventory import load_inventory
    from edgeopt.results import ResultsDB

    dev = load_inventory(arm_device["inventory"]).select()
    assert [d.name for d in dev] == ["arm64-emu"] and dev[0].known_hosts  # strict: only its own host key
    bundle = load_bundle(cls_bundle)
    with ResultsDB(tmp_path / "results.db") as db:
        res = bench_fleet(dev, [bundle], FAST, db=db, jobs=1)
        stored = db.query()
    (rec,) = res.records
    assert rec.status == "ok", rec.error
    probe, bench = rec.probe, rec.bench
    py, np_, distro = EXPECT[arm_device["device"]["suite"]]  # the distribution's own Python and numpy
    assert probe["arch"] == "aarch64" and probe["python"].startswith(py) and probe["numpy"].startswith(np_)
    assert probe["os_release"].startswith(distro) and probe["runtimes"]["onnxruntime"]
    assert probe["emulated"] is True and probe["emulator"] == "qemu-user", probe.get("emulation_evidence")
    env = bench["environment"]
    assert env["arch"] == "aarch64" and env["emulated"] is True and env["emulator"] == "qemu-user"
    assert bench["accuracy"]["passed"] and bench["iterations"] >= 5 and bench["latency_ms"]["p50"] > 0
    # the sensors visible under qemu are the host's: no energy read, and the reply says why
    assert bench["energy"]["source"] is None and "emulated CPU (qemu-user)" in bench["energy"]["why_not"]
    assert stored[0]["status"] == "ok"
    assert decide.device_truth(rec.as_dict())[0] == "emulated"
    # the on-device accuracy check, on its own verb, of the bundle just pushed
    with DeviceSession.open(dev[0]) as sess:
        reply = sess.agent("check", {"root": sess.root, "bundle_id": bundle.bundle_id}, timeout=300)
    assert reply["ok"] and reply["check"]["passed"], reply
