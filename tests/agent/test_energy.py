"""Energy per inference (edgeopt_agent.energy): each source's parser on files laid out as its kernel
driver or tool writes them, the integrator, the counters' wraparound, and a real bench on `local`
whose reply carries `energy` with this machine's own reason per source."""

from __future__ import annotations

import ctypes
import glob
import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from edgeopt_agent import energy
from tests.agent.conftest import agent

# ---- fixture trees as the kernel lays them out -------------------------------------------------------


def _write(base: Path, files: dict[str, str], mode: int = 0o444) -> None:
    for rel, text in files.items():
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists():
            p.chmod(0o644)
        p.write_text(text + "\n")  # sysfs attributes end with a newline
        p.chmod(mode)


def _ina3221_hwmon(base: Path, chip: str, hwmon: str, rails: dict[int, tuple[str, int, int]],
                   disabled: tuple[int, ...] = ()) -> None:
    """drivers/hwmon/ina3221.c's attributes (Documentation/hwmon/ina3221.rst): in[123]_label, in[123]_input
    (bus mV), curr[123]_input (mA), in[123]_enable, shunt[123]_resistor (µΩ), in[456]_input (shunt µV),
    in7 = sum of shunt voltages, update_interval (ms); the driver folder also holds bind/unbind/uevent."""
    drv = "sys/bus/i2c/drivers/ina3221"
    _write(base, {f"{drv}/bind": "", f"{drv}/unbind": "", f"{drv}/uevent": ""}, 0o200)
    d = f"{drv}/{chip}/hwmon/{hwmon}"
    files = {f"{d}/name": "ina3221", f"{d}/update_interval": "33", f"{d}/in7_label": "sum of shunt voltages",
             f"{d}/in7_input": "0", f"{drv}/{chip}/name": "ina3221"}
    for ch, (label, mv, ma) in rails.items():
        files.update({f"{d}/in{ch}_label": label, f"{d}/in{ch}_input": str(mv), f"{d}/curr{ch}_input": str(ma),
                      f"{d}/in{ch}_enable": "0" if ch in disabled else "1", f"{d}/shunt{ch}_resistor": "5000",
                      f"{d}/in{ch + 3}_input": str(ma * 5), f"{d}/curr{ch}_crit": "32760", f"{d}/curr{ch}_max": "32760"})
    _write(base, files)


def test_jetson_orin_nano_hwmon_rails_and_the_module_input_as_total(tmp_path):
    """JetPack 6 on an Orin Nano: one INA3221 at 1-0040; VDD_IN is the module's input, the others its parts."""
    _ina3221_hwmon(tmp_path, "1-0040", "hwmon3", {1: ("VDD_IN", 5064, 1080), 2: ("VDD_CPU_GPU_CV", 5056, 160),
                                                  3: ("VDD_SOC", 5056, 384)})
    src = energy.Ina3221Hwmon(tmp_path)
    watts = src.read()
    assert watts == pytest.approx({"VDD_IN": 5.064 * 1.080, "VDD_CPU_GPU_CV": 5.056 * 0.160, "VDD_SOC": 5.056 * 0.384})
    assert src.total_rails == ["VDD_IN"] and "module's input" in src.scope
    assert src.kind == "sampled" and "update interval 33 ms" in src.resolution


def test_probe_lists_the_sources_present(tmp_path):
    """What the probe reports: the INA3221 of a fixture tree with its rails, and why RAPL is not there."""
    _ina3221_hwmon(tmp_path, "1-0040", "hwmon3", {1: ("VDD_IN", 5064, 1080), 2: ("VDD_SOC", 5056, 384)})
    found = energy.available(tmp_path)
    (ina,) = [s for s in found["sources"] if s["source"] == "ina3221"]
    assert ina["rails"] == ["VDD_IN", "VDD_SOC"] and ina["kind"] == "sampled" and "VDD_IN" in ina["scope"]
    assert "powercap absent" in found["unavailable"]["rapl"]
    rc, reply = agent("probe", {"import_fallback": False})  # the probe verb on this machine: one entry per source
    assert rc == 0 and set(reply["probe"]["energy"]["unavailable"]) | {
        _family(s["source"]) for s in reply["probe"]["energy"]["sources"]} >= set(energy.SOURCES)


def test_jetson_agx_orin_two_chips_not_connected_and_disabled_channels(tmp_path):
    """AGX Orin: two INA3221s (1-0040, 1-0041), 'NC' channels, no VDD_IN: the total is the sum of the rails."""
    _ina3221_hwmon(tmp_path, "1-0040", "hwmon1", {1: ("VDD_GPU_SOC", 5008, 2000), 2: ("VDD_CPU_CV", 5008, 800),
                                                  3: ("VIN_SYS_5V0", 5000, 400)})
    _ina3221_hwmon(tmp_path, "1-0041", "hwmon2", {1: ("NC", 0, 0), 2: ("VDDQ_VDD2_1V8AO", 4992, 200),
                                                  3: ("NC", 0, 0)})
    _ina3221_hwmon(tmp_path, "1-0042", "hwmon4", {1: ("VDD_OFF", 5000, 100)}, disabled=(1,))
    src = energy.Ina3221Hwmon(tmp_path)
    assert sorted(src.read()) == sorted(src.total_rails) == ["VDDQ_VDD2_1V8AO", "VDD_CPU_CV", "VDD_GPU_SOC",
                                                              "VIN_SYS_5V0"]
    assert src.scope.startswith("sum of the rails")


def test_jetson_l4t_iio_layout(tmp_path):
    """JetPack 4 (ina3221x, iio): rail_name_N and in_power<N>_input in mW, as on a Jetson Nano."""
    d = "sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0"
    _write(tmp_path, {f"{d}/name": "ina3221x", f"{d}/rail_name_0": "POM_5V_IN", f"{d}/rail_name_1": "POM_5V_GPU",
                      f"{d}/rail_name_2": "POM_5V_CPU", f"{d}/in_power0_input": "2345", f"{d}/in_power1_input": "40",
                      f"{d}/in_power2_input": "612", f"{d}/in_current0_input": "468", f"{d}/in_voltage0_input": "5008"})
    with pytest.raises(energy.Unavailable, match="no INA3221"):
        energy.Ina3221Hwmon(tmp_path)  # the hwmon layout is absent: the iio one is read instead
    src = energy._ina3221(tmp_path)
    assert isinstance(src, energy.Ina3221Iio)
    assert src.read() == pytest.approx({"POM_5V_IN": 2.345, "POM_5V_GPU": 0.040, "POM_5V_CPU": 0.612})
    assert src.total_rails == ["POM_5V_IN"]


def test_sampled_source_integrates_to_power_times_window(tmp_path):
    """The sampling thread over a real-format hwmon tree: a steady 5.4 W rail integrates to exactly
    5.4 W x the window, whatever the number of samples the machine's load allowed."""
    _ina3221_hwmon(tmp_path, "1-0040", "hwmon0", {1: ("VDD_IN", 5000, 1080), 2: ("VDD_SOC", 5000, 200)})
    meter = energy.Meter([energy.Ina3221Hwmon(tmp_path)], {"rapl": "absent here"})
    meter.start()
    time.sleep(0.15)
    rep = meter.stop(inferences=30)
    assert rep["source"] == "ina3221" and rep["samples"] >= 2
    assert rep["mean_power_w"] == pytest.approx(5.4)
    assert rep["energy_j"] == pytest.approx(5.4 * rep["window_s"]) and rep["window_s"] > 0
    assert rep["joules_per_inference"] == pytest.approx(rep["energy_j"] / 30)
    assert rep["rails"]["VDD_SOC"]["mean_power_w"] == pytest.approx(1.0)
    assert "sampled every 20 ms" in rep["resolution"] and rep["unavailable"] == {"rapl": "absent here"}
    assert not any(t.name.startswith("energy-") for t in threading.enumerate())


def test_integrator_is_the_trapezoid_rule():
    assert energy.integrate([0.0, 1.0, 3.0], [2.0, 2.0, 2.0]) == pytest.approx(6.0)
    assert energy.integrate([0.0, 2.0], [0.0, 4.0]) == pytest.approx(4.0)  # a ramp: its mean x its time
    assert energy.integrate([0.0, 0.5, 1.0], [1.0, 3.0, 1.0]) == pytest.approx(2.0)
    assert energy.integrate([1.0], [9.0]) == 0.0


# ---- RAPL (powercap) -----------------------------------------------------------------------------------

RANGE_UJ = 262143328850  # a package zone's max_energy_range_uj as Intel parts report it


def _powercap(base: Path, pkg_uj: int, dram_uj: int, core_uj: int, energy_mode: int = 0o444) -> None:
    """Documentation/power/powercap/powercap.rst: intel-rapl:0 (package-0) with subzones intel-rapl:0:0
    (core) and intel-rapl:0:1 (dram); energy_uj root-only (0400) since 5.10, the rest world-readable."""
    pc = "sys/class/powercap"
    _write(base, {f"{pc}/intel-rapl/enabled": "1"})
    for zone, name, uj in (("intel-rapl:0", "package-0", pkg_uj), ("intel-rapl:0:0", "core", core_uj),
                           ("intel-rapl:0:1", "dram", dram_uj)):
        _write(base, {f"{pc}/{zone}/name": name, f"{pc}/{zone}/max_energy_range_uj": str(RANGE_UJ),
                      f"{pc}/{zone}/enabled": "1"})
        _write(base, {f"{pc}/{zone}/energy_uj": str(uj)}, energy_mode)


def test_rapl_counter_wraps_around_its_range(tmp_path):
    """Read before and after: package-0 wraps past max_energy_range_uj (1 J before the wrap + 2 J after);
    DRAM adds to the total, the core subzone (part of the package) does not."""
    _powercap(tmp_path, RANGE_UJ - 1_000_000, 5_000_000, 7_000_000)
    src = energy.Rapl(tmp_path)
    assert src.kind == "counter" and src.total_rails == ["package-0", "package-0/dram"]
    meter = energy.Meter([src], {})
    meter.start()
    _powercap(tmp_path, 2_000_000, 5_500_000, 7_250_000)  # the counters moved on during the "loop"
    rep = meter.stop(inferences=100)
    assert rep["source"] == "rapl" and rep["samples"] == 2
    assert rep["energy_j"] == pytest.approx(3.5) and rep["joules_per_inference"] == pytest.approx(0.035)
    assert rep["rails"]["package-0"]["energy_j"] == pytest.approx(3.0)
    assert rep["rails"]["package-0/core"]["energy_j"] == pytest.approx(0.25)
    assert energy.counter_delta(10.0, 4.0, 12.0) == pytest.approx(6.0) and energy.counter_delta(1, 3, None) == 2


def test_a_long_window_sums_every_step_of_the_counter():
    """Read every COUNTER_POLL_S, a counter that wraps twice over the window still adds up: 8 + 10 + 6 J
    on a 12 J range."""
    reads = [2.0, 10.0, 8.0, 2.0]  # +8, wrap (+10), wrap (+6)
    assert energy.counter_energy(reads, lambda a, b: energy.counter_delta(a, b, 12.0)) == pytest.approx(24.0)


def test_a_counter_that_did_not_move_is_no_measurement(tmp_path):
    _powercap(tmp_path, 1_000, 1_000, 1_000)
    meter = energy.Meter([energy.Rapl(tmp_path)], {})
    meter.start()
    rep = meter.stop(inferences=10)
    assert rep["source"] is None and "counter did not advance" in rep["why_not"]


def test_rapl_root_only_says_so(tmp_path):
    """energy_uj 0400 root:root as kernels >= 5.10 make it: read by another user (a forked child that
    became nobody, when the tests run as root), RAPL is refused with the reason."""
    base = Path(tempfile.mkdtemp(prefix="edgeopt-rapl-"))
    try:
        _powercap(base, 5, 5, 5, energy_mode=0o400 if os.geteuid() == 0 else 0o000)
        for d in [base, *(p for p in base.rglob("*") if p.is_dir())]:
            d.chmod(0o755)
        if os.geteuid() != 0:
            with pytest.raises(energy.Unavailable) as exc:
                energy.Rapl(base)
            assert str(exc.value) == energy.RAPL_ROOT_ONLY
            return
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: another user (nobody), the module already imported
            try:
                try:
                    os.setgid(65534)
                    os.setuid(65534)
                except OSError as e:  # a root without CAP_SETUID (some containers)
                    os.write(w, f"SKIP: cannot become nobody: {e}".encode())
                    os._exit(0)
                try:
                    energy.Rapl(base)
                    msg = "read"
                except energy.Unavailable as e:
                    msg = str(e)
                os.write(w, msg.encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            said = f.read()
        os.waitpid(pid, 0)
        if said.startswith("SKIP: "):
            pytest.skip(said[6:])
        assert said == energy.RAPL_ROOT_ONLY
    finally:
        shutil.rmtree(base)


# ---- Raspberry Pi 5 PMIC, nvidia-smi ---------------------------------------------------------------------

# `vcgencmd pmic_read_adc` on a Raspberry Pi 5 (firmware 2024+): currents then voltages, right-aligned
# names, channel numbers not in order, EXT5V_V and BATT_V with a voltage only.
PMIC_OUTPUT = """\
 3V7_WL_SW_A current(0)=0.00195186A
   3V3_SYS_A current(1)=0.12687090A
   1V8_SYS_A current(2)=0.18835450A
  DDR_VDD2_A current(3)=0.02147046A
  DDR_VDDQ_A current(4)=0.00000000A
   1V1_SYS_A current(5)=0.17957110A
    0V8_SW_A current(6)=0.25959740A
  VDD_CORE_A current(7)=2.47170000A
   3V3_DAC_A current(17)=0.00000000A
   3V3_ADC_A current(18)=0.00000000A
   0V8_AON_A current(16)=0.00293040A
      HDMI_A current(22)=0.02551890A
 3V7_WL_SW_V volt(8)=3.70720000V
   3V3_SYS_V volt(9)=3.32580900V
   1V8_SYS_V volt(10)=1.80415000V
  DDR_VDD2_V volt(11)=1.11135400V
  DDR_VDDQ_V volt(12)=0.60329610V
   1V1_SYS_V volt(13)=1.11282000V
    0V8_SW_V volt(14)=0.80512740V
  VDD_CORE_V volt(15)=0.87000000V
   3V3_DAC_V volt(20)=3.32142500V
   3V3_ADC_V volt(21)=3.32966700V
   0V8_AON_V volt(19)=0.80175740V
      HDMI_V volt(23)=5.11746000V
     EXT5V_V volt(24)=5.14158000V
      BATT_V volt(25)=3.28033900V
"""


def test_pmic_output_gives_volts_times_amps_per_rail():
    rails = energy.parse_pmic(PMIC_OUTPUT)
    assert len(rails) == 14 and rails["EXT5V"] == {"V": 5.14158} and rails["BATT"] == {"V": 3.280339}
    watts = energy.pmic_watts(rails)
    assert len(watts) == 12 and "EXT5V" not in watts and "BATT" not in watts
    assert watts["VDD_CORE"] == pytest.approx(2.4717 * 0.87)
    assert sum(watts.values()) == pytest.approx(
        0.00195186 * 3.7072 + 0.1268709 * 3.325809 + 0.1883545 * 1.80415 + 0.02147046 * 1.111354
        + 0.1795711 * 1.11282 + 0.2595974 * 0.8051274 + 2.4717 * 0.87 + 0.0029304 * 0.8017574
        + 0.0255189 * 5.11746)


def test_pmic_on_a_pi_without_it_says_why():
    """Other Pis' firmware answers the command with error=1 and exit status 0."""
    with pytest.raises(energy.Unavailable, match="Command not registered.*not a Raspberry Pi 5"):
        energy.Pmic(["echo", 'error=1 error_msg="Command not registered"'])


def test_nvidia_smi_power_draw_csv():
    text = "0, 71.23\n1, [N/A]\n2, 301.50\n"  # --query-gpu=index,power.draw --format=csv,noheader,nounits
    assert energy.parse_nvidia_smi_power(text) == {"gpu0": 71.23, "gpu2": 301.5}


def test_an_emulated_cpu_reads_no_sensor():
    rep = energy.start(emulated="qemu-user")
    assert rep == {"source": None, "why_not": "not available on this device (emulated CPU (qemu-user): the power "
                                              "sensors visible here are the host's, not this device's)"}
    assert set(energy.available(emulated="qemu-user")["unavailable"]) == set(energy.SOURCES)


# ---- a real bench on `local` ------------------------------------------------------------------------------


def _family(source: str) -> str:
    """The discovery slot a source fills (NVML's fallbacks are NVML's)."""
    return {"nvml-power": "nvml", "nvidia-smi": "nvml"}.get(source, source)


def _expected_here() -> dict[str, str | None]:
    """What this machine offers, judged from the filesystem (not from the code under test): the phrase
    each source's reason must carry, or None where the source is present and may measure."""
    nvml = True
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        nvml = False
    rapl = glob.glob("/sys/class/powercap/intel-rapl:*/energy_uj")
    return {
        "ina3221": None if glob.glob("/sys/bus/i2c/drivers/ina3221*/*") else "no INA3221 power monitor",
        "nvml": None if nvml or shutil.which("nvidia-smi") else "no NVIDIA driver",
        "rapl": ("powercap absent" if not os.path.isdir("/sys/class/powercap") else
                 "intel-rapl:* absent" if not rapl else
                 None if os.access(rapl[0], os.R_OK) else "readable by root only"),
        "pmic": None if shutil.which("vcgencmd") else "vcgencmd not found",
    }


def test_bench_on_local_carries_energy_or_why_not(tiny_bundle, tmp_path, capsys):
    """edgeopt bench on the built-in `local` device: the agent's reply, the results DB and what `edgeopt
    bench` prints carry `energy`; where this machine has no source, each source's own reason."""
    import edgeopt
    from edgeopt.commands.bench import print_fleet

    db = str(tmp_path / "r.db")
    fleet = edgeopt.bench(dist=tiny_bundle.parent.parent, devices="local", duration=0.5, min_iters=10, warmup="0",
                          db=db)
    assert fleet.ok and len(fleet.records) == 1
    rec = fleet.records[0]
    e = rec.bench["energy"]
    expected = _expected_here()
    print("energy on local:", json.dumps(e))
    if e["source"] is None:
        assert e["why_not"].startswith("not available on this device (")
        for name, phrase in expected.items():
            assert f"{name}: " in e["why_not"], name
            if phrase:
                assert phrase in e["unavailable"][name], (name, e["unavailable"][name])
        assert all(expected[name] is None for name in energy.SOURCES if name not in e["unavailable"])
    else:  # a source this machine really offers (RAPL as root, a GPU's NVML): a real measurement
        assert expected[_family(e["source"])] is None
        assert e["joules_per_inference"] > 0 and e["mean_power_w"] > 0 and e["samples"] >= 2
        assert e["inferences"] == rec.bench["iterations"] * rec.bench["inputs"]["batch"]
    stored = edgeopt.query(db=db)[0].to_dict()
    assert stored["bench"]["energy"] == e
    capsys.readouterr()
    print_fleet(fleet)  # what `edgeopt bench` prints: the J/inf column and its note
    out = capsys.readouterr().out
    assert "J/inf" in out and (e["why_not"] in out if e["source"] is None else e["source"] in out)


def test_absurd_rail_values_are_no_measurement_never_infinity(tmp_path):
    """A rail reading 10^12 mA x mV, or 'nan', is not a figure (issue 38, 10): the source says why, nothing
    reads Infinity or NaN J per inference."""
    _ina3221_hwmon(tmp_path, "1-0040", "hwmon0", {1: ("VDD_IN", 5000, 10 ** 12)})
    meter = energy.Meter([energy.Ina3221Hwmon(tmp_path)], {})
    meter.start()
    time.sleep(0.1)
    rep = meter.stop(inferences=10)
    assert rep["source"] is None and "ina3221" in rep["unavailable"], rep
    _ina3221_hwmon(tmp_path, "1-0040", "hwmon0", {1: ("VDD_IN", 5000, 1000)})
    (tmp_path / "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon0/curr1_input").write_text("nan\n")
    with pytest.raises(energy.Unavailable):  # the only rail reads NaN: no source, said so
        energy.Ina3221Hwmon(tmp_path)


def test_a_fifo_at_a_sensor_path_is_refused_not_read_for_ever(tmp_path):
    """A FIFO planted where a sensor attribute was blocked the reader for ever (issue 38, 10): only regular
    files are read, without blocking."""
    import os

    _powercap(tmp_path, 1_000, 1_000, 1_000)
    ej = tmp_path / "sys/class/powercap/intel-rapl:0/energy_uj"
    ej.unlink()
    os.mkfifo(ej)
    done: list[object] = []
    t = threading.Thread(target=lambda: done.append(_try(lambda: energy._number(ej))), daemon=True)
    t.start()
    t.join(timeout=20)
    assert done and isinstance(done[0], ValueError) and "not a regular file" in str(done[0])


def _try(f):
    try:
        return f()
    except Exception as exc:  # the error is the answer
        return exc
