"""The rig file: health policy, prepare/restore, power_cycle + one retry, quarantine — on real devices
(the local agent and a real sshd that is SIGKILLed mid-gate and brought back by a real power_cycle script)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from edgeopt.errors import UsageError
from edgeopt.hil.rig import Policy, fitness, load_rig, parse_rig
from tests.devices.conftest import device_entry, known_hosts
from tests.hil.conftest import same_speed_gate


def _edgeopt(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


def _rig_file(path: Path, devices: dict, rig: dict | None) -> Path:
    data = {"devices": devices}
    if rig is not None:
        data["rig"] = rig
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _local(tmp: Path) -> dict:
    return {"local": {"transport": "local", "root": str(tmp / "agent-root")}}


# --- the rig file ------------------------------------------------------------------------------
@pytest.mark.parametrize("rig, message", [
    ({"max_tmp_c": 70}, "did you mean 'max_temp_c'"),
    ({"max_load": "high"}, "expected a number"),
    ({"quarantine_after": 1.5}, "expected an integer"),
    ({"prepare": [["echo", 1], {"x": 1}]}, "prepare[1]"),
    ({"devices": {"lokal": {"max_load": 1}}}, "did you mean 'local'"),
    ({"devices": {"local": {"governer": "performance"}}}, "did you mean 'governor'"),
])
def test_bad_rig_sections_are_refused(rig, message):
    with pytest.raises(UsageError) as e:
        parse_rig(rig, "rig.yaml", ["local"])
    assert message in e.value.message


def test_rig_file_parses_with_per_device_overrides(tmp_path):
    f = _rig_file(tmp_path / "rig.yaml", _local(tmp_path),
                  {"max_load": 2, "governor": "performance", "prepare": ["echo 'a b'", ["true"]],
                   "power_cycle": "relay cycle {device}", "devices": {"local": {"max_load": 5}}})
    rig = load_rig(f)
    assert rig.policy.max_load == 2 and rig.for_device("local").max_load == 5
    assert rig.for_device("local").governor == "performance"  # overrides inherit the rig's defaults
    assert rig.policy.prepare == (("echo", "a b"), ("true",)) and rig.policy.power_cycle == ("relay", "cycle", "{device}")
    assert rig.for_device("other").max_load == 2


def test_fitness_names_every_problem_and_what_it_cannot_check():
    probe = {"memory_available_mb": 300,
             "environment": {"loadavg": [3.5, 1, 1], "temperature_c": 81.0, "governor": "powersave"}}
    problems, warnings = fitness(probe, Policy(max_load=2, min_free_mb=500, max_temp_c=75, governor="performance"))
    assert len(problems) == 4 and not warnings
    assert any("load average 3.50 > max_load 2" in p for p in problems)
    assert any("powersave != performance" in p for p in problems)
    problems, warnings = fitness({"environment": {"loadavg": [0.1]}}, Policy(max_load=2, max_temp_c=75, governor="x"))
    assert not problems and len(warnings) == 2  # no sensor / no cpufreq: said, not silently passed
    assert fitness(probe, Policy()) == ([], [])


def test_bad_rig_files_are_one_line_exit_2_nothing_measured(tmp_path):
    (tmp_path / "yaml-error.yaml").write_text("devices:\n  local: {transport: local}\nrig: {max_load: [1, 2}\n")
    _rig_file(tmp_path / "typo.yaml", _local(tmp_path), {"max_lod": 1})
    (tmp_path / "toplevel.yaml").write_text("devices:\n  local: {transport: local}\nrgi: {max_load: 1}\n")
    for name, msg in [("yaml-error.yaml", "yaml-error.yaml:3:"), ("typo.yaml", "did you mean 'max_load'"),
                      ("toplevel.yaml", "did you mean 'rig'")]:
        for args in (["gate", "cand", "--baseline", "base", "--devices", name], ["rig", "status", "--devices", name]):
            p = _edgeopt(*args, cwd=tmp_path)
            assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, (name, p.stderr)
            assert len([x for x in p.stderr.splitlines() if not x.startswith("  hint")]) == 1, p.stderr
    assert not (tmp_path / "edgeopt-results.db").exists()


# --- health, prepare/restore, quarantine on the local device ------------------------------------
def test_unfit_device_is_an_error_then_quarantined_skipped_and_released(gate_bundles, tmp_path):
    from junitparser import JUnitXml, Skipped

    marks = tmp_path / "marks"
    marks.mkdir()
    rig = _rig_file(tmp_path / "rig.yaml", _local(tmp_path), {
        "max_load": 0.0, "min_free_mb": 1, "wait_s": 1.5, "settle_s": 0.5, "quarantine_after": 2,
        "prepare": [["touch", str(marks / "prepared")]], "restore": [["touch", str(marks / "restored")]]})
    base = str(gate_bundles["base"])
    args = [base, "--baseline", base, "--devices", str(rig), "--budget", "3s", "--db", "r.db", "--junit", "g.xml"]
    t0 = time.monotonic()
    p = _edgeopt("gate", *args, cwd=tmp_path)
    assert p.returncode == 4, p.stdout + p.stderr  # an unfit device is infrastructure, never measured
    assert "unfit for measuring after waiting 1.5s" in p.stderr and "max_load 0" in p.stderr
    assert (marks / "prepared").exists() and (marks / "restored").exists()  # restore runs after a failure too
    assert "measuring baseline" not in p.stderr and time.monotonic() - t0 < 60
    xml = (tmp_path / "g.xml").read_text()
    assert 'type="unfit"' in xml and "<failure" not in xml

    p = _edgeopt("gate", *args, cwd=tmp_path)  # 2nd failure in a row: quarantined
    assert p.returncode == 4 and "QUARANTINED after 2 failures" in p.stderr, p.stderr
    p = _edgeopt("gate", *args, cwd=tmp_path)  # now skipped, not probed; nothing left to gate: exit 4
    assert p.returncode == 4 and "SKIPPED: quarantined" in p.stderr and "connecting" not in p.stderr, p.stderr
    cases = [c for s in JUnitXml.fromfile(str(tmp_path / "g.xml")) for c in s]
    assert len(cases) == 1 and isinstance(cases[0].result[0], Skipped) and "quarantined" in cases[0].result[0].message
    with sqlite3.connect(tmp_path / "r.db") as c:  # the skipped run left no gate record
        assert c.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 2

    p = _edgeopt("rig", "status", "--devices", str(rig), "--db", "r.db", "--json", cwd=tmp_path)
    assert p.returncode == 4, p.stderr
    row = json.loads(p.stdout)["devices"][0]
    assert row["quarantined"] and row["health"] == "unfit" and row["consecutive_failures"] == 2
    assert any("max_load" in e["detail"] for e in row["recent_failures"])
    p = _edgeopt("rig", "status", "--devices", str(rig), "--db", "r.db", "--no-probe", "--limit", "local", "--json",
                 cwd=tmp_path)  # picked as bench and gate pick devices
    assert [r["device"] for r in json.loads(p.stdout)["devices"]] == ["local"], p.stderr
    p = _edgeopt("rig", "status", "--devices", str(rig), "--db", "r.db", "--label", "nosuch", cwd=tmp_path)
    assert p.returncode == 2 and "--label nosuch" in p.stderr and "Traceback" not in p.stderr, p.stderr
    p = _edgeopt("rig", "release", "lokal", "--db", "r.db", cwd=tmp_path)
    assert p.returncode == 2 and "did you mean 'local'" in p.stderr
    p = _edgeopt("rig", "release", "local", "--db", "r.db", cwd=tmp_path)
    assert p.returncode == 0 and "released from quarantine" in p.stdout

    _rig_file(rig, _local(tmp_path), {"max_load": 1000, "quarantine_after": 2})  # a policy it meets
    p = _edgeopt("gate", *args, "--on-inconclusive", "pass", "--gate", str(same_speed_gate(tmp_path)), cwd=tmp_path)
    assert p.returncode == 0, p.stderr  # measured again after the release
    p = _edgeopt("rig", "status", "--devices", str(rig), "--db", "r.db", cwd=tmp_path)
    assert p.returncode == 0 and "local " in p.stdout and " fit " in p.stdout, p.stdout


# --- power_cycle: a real sshd SIGKILLed mid-gate, restarted by the rig's host command ------------------
def _sshd_daemon_pid(server) -> int | None:
    try:
        return int((server.dir / "sshd.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def test_device_killed_mid_gate_is_power_cycled_and_retried_once(gate_bundles, ssh_env, tmp_path):
    victim = ssh_env.make("victim")
    kh = known_hosts(tmp_path / "known_hosts", victim)
    script = tmp_path / "power_cycle.sh"  # the "relay": starts the device's sshd again (it daemonizes)
    script.write_text(f"#!/bin/sh\necho \"cycling $1\" >> {tmp_path / 'cycles.log'}\n"
                      f"exec /usr/sbin/sshd -f {victim.config} -E {victim.dir / 'sshd-cycled.log'}\n")
    script.chmod(0o755)
    rig = _rig_file(tmp_path / "rig.yaml", {"victim": device_entry(ssh_env, victim, tmp_path / "root", kh, target="cpu")},
                    {"power_cycle": [str(script), "{device}"], "power_cycle_wait_s": 20,
                     "prepare": [["sh", "-c", f"echo 'prepared it' >> {tmp_path / 'hooks.log'}"]],
                     "restore": [f"sh -c \"echo 'restored it' >> {tmp_path / 'hooks.log'}\""]})
    killed = threading.Event()

    def kill_mid_gate() -> None:  # once the agent's pairbench runs on the device, pull the plug
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed.is_set():
            for pid in victim.descendants():
                try:
                    if b"pairbench" in Path(f"/proc/{pid}/cmdline").read_bytes() or \
                            b"edgeopt_agent.bench" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        time.sleep(0.5)
                        victim.kill()
                        killed.set()
                        return
                except OSError:
                    continue
            time.sleep(0.1)

    t = threading.Thread(target=kill_mid_gate, daemon=True)
    t.start()
    base = str(gate_bundles["base"])
    try:
        p = _edgeopt("gate", base, "--baseline", base, "--devices", str(rig), "--budget", "3s", "--db", "r.db",
                     "--on-inconclusive", "pass", "--gate", str(same_speed_gate(tmp_path)), "--json", cwd=tmp_path)
    finally:
        killed.set()
        t.join(5)
        pid = _sshd_daemon_pid(victim)
        if pid and victim.proc is None:
            try:
                os.kill(pid, signal.SIGTERM)  # the daemon the power-cycle script started
            except ProcessLookupError:
                pass
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    dev = json.loads(p.stdout)["devices"][0]
    assert dev["attempts"] == 2 and dev["status"] == "ok" and dev["power_cycle"]["command"][-1] == "victim"
    assert (tmp_path / "cycles.log").read_text() == "cycling victim\n"
    assert "retrying once" in p.stderr and dev["verdicts"]
    # prepare/restore ran over SSH, quoted: prepare on both attempts, restore once (the first link was dead)
    assert (tmp_path / "hooks.log").read_text() == "prepared it\nprepared it\nrestored it\n"
    with sqlite3.connect(tmp_path / "r.db") as c:
        kinds = [k for (k,) in c.execute("SELECT kind FROM rig_events WHERE device = 'victim' ORDER BY id")]
        state = c.execute("SELECT consecutive_failures, quarantined FROM rig_state WHERE device='victim'").fetchone()
    assert kinds == ["failure", "power_cycle"] and state == (0, 0)  # recovered: the streak is not counted


# --- throttling: the calibration workload between measuring calls -----------------------------------
def test_a_device_slowed_mid_gate_is_caught_by_the_calibration_check(gate_bundles, tmp_path):
    """CPU hogs started once measuring begins take the 2 cores: the fixed calibration workload gets far
    slower than at the session's start (androidx.benchmark's > 1.10x rule), the gate backs off for wait_s
    and then reports an infrastructure error, not a verdict. The budget leaves room for a second call (the check
    runs between calls): with 3 s, a loaded machine spent it on the agent's install and the first call, and the
    gate stopped as inconclusive before any check (seen in the suite at load 5)."""
    rig = _rig_file(tmp_path / "rig.yaml", _local(tmp_path), {"throttle": 1.10, "wait_s": 1, "settle_s": 0.5})
    base = str(gate_bundles["base"])
    proc = subprocess.Popen([sys.executable, "-m", "edgeopt", "gate", base, "--baseline", base, "--devices", str(rig),
                             "--budget", "40s", "--db", "r.db", "--json"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    hogs: list[subprocess.Popen] = []
    err_lines = []
    try:
        for line in proc.stderr:
            err_lines.append(line)
            if "measuring baseline" in line and not hogs:
                hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(6)]
        out = proc.stdout.read()
        proc.wait(120)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        if proc.poll() is None:
            proc.kill()
    err = "".join(err_lines)
    assert hogs, err
    assert proc.returncode == 4, err
    assert "throttled" in err and "backing off" in err and "Traceback" not in err
    dev = json.loads(out)["devices"][0]
    assert dev["status"] == "unfit" and "slower than at the session's start" in dev["error"]


def _descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (from /proc's parent links)."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def _agent_processes() -> list[int]:
    """This test's agent (``python -m edgeopt_agent``, run by the local transport) and everything below it;
    not the suite's other children (sshd servers of other tests)."""
    out = []
    for p in _descendants(os.getpid()):
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if b"edgeopt_agent" in f.read():
                    out += [p, *_descendants(p)]
        except OSError:
            continue
    return sorted(set(out))


_DUTY = """
import os, signal, sys, time
path, parent, run_s, stop_s = sys.argv[1], os.getppid(), float(sys.argv[2]), float(sys.argv[3])
def realtime():
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
        return True
    except OSError:
        pass
    try:  # a user without CAP_SYS_NICE may still be granted a real-time priority by RLIMIT_RTPRIO
        import resource
        hard = resource.getrlimit(resource.RLIMIT_RTPRIO)[1]
        if hard == resource.RLIM_INFINITY or hard > 0:
            resource.setrlimit(resource.RLIMIT_RTPRIO, (hard, hard))
            prio = 50 if hard == resource.RLIM_INFINITY else min(50, hard)
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))
            return True
    except (OSError, ValueError):
        pass
    return False
print("realtime" if realtime() else "not realtime", flush=True)
pids, seen, live = [], None, [True]
signal.signal(signal.SIGTERM, lambda *_: live.clear())
def send(sig):
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass
while live and os.getppid() == parent:  # the test gone: nothing stays stopped
    try:
        st = os.stat(path)
        if (st.st_ino, st.st_mtime_ns, st.st_size) != seen:
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            pids = [int(x) for x in open(path).read().split()]
            send(signal.SIGSTOP)  # stopped from the moment they are named
    except (OSError, ValueError):
        pass
    if not pids:
        time.sleep(0.002)
        continue
    time.sleep(stop_s)
    send(signal.SIGCONT)
    time.sleep(run_s)
    send(signal.SIGSTOP)
send(signal.SIGCONT)
"""


class _Throttle:
    """A hot SoC's slowdown on some processes, whatever else runs: a real-time (SCHED_FIFO) controller process
    lets them run 1 ms of every 10 and stops them (SIGSTOP) the rest.  The in-call calibration's repeats
    (~3 ms each here, best of three) cannot fit one running window, so every check under it is ~10x slower
    (a repeat needs 3-4 windows: ~30 ms) -- more than load alone slows the checks before it, which set the
    reference (the fastest check of the session): at 1 ms of every 4, the agent, sharing 2 cores with 8
    busy loops, ran its checks at ~9 ms both before and under the throttle (ratios ~1.0).

    The controller is started, made real-time and confirmed so *before* the measured call (``start``), and
    stops named processes within one cycle: started at the moment of throttling (at the suite's nice, among
    the load), its interpreter's start-up took seconds and the agent ran free the while.  Only real-time
    priority holds: a SCHED_OTHER controller, even at nice -20 or in a scheduler autogroup of its own, wakes
    late at load 5-10 (measured on 2 cores: 20-70% of the checks under it as fast as before) -- so where
    real-time is refused, ``start`` says so and the test skips rather than measure a throttle that does not
    hold.  Nor did nice 10 beside busy loops (the bench child runs in an autogroup of its own), or a CFS quota
    of 1 ms per 10 ms (the kernel lets a task overrun its quota to the next tick: 3.2-ms checks went through
    whole)."""

    RUN_S, STOP_S = 0.001, 0.009

    def __init__(self) -> None:
        fd, name = tempfile.mkstemp(prefix="edgeopt-throttle-", suffix=".pids")
        os.close(fd)
        self.pid_file = Path(name)
        self.pids: set[int] = set()
        self.controller: subprocess.Popen | None = None

    def start(self, timeout: float = 120.0) -> bool:
        """Start the controller (nothing named yet: nothing stopped); True once it runs real-time."""
        self.controller = subprocess.Popen([sys.executable, "-c", _DUTY, str(self.pid_file), str(self.RUN_S),
                                            str(self.STOP_S)], stdout=subprocess.PIPE, text=True,
                                           start_new_session=True)  # its start-up is not starved in the suite's group
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self.controller.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        return bool(line) and line[0].strip() == "realtime"

    def add(self, pids: list[int]) -> None:
        if set(pids) - self.pids:
            self.pids |= set(pids)
            tmp = self.pid_file.with_suffix(".new")
            tmp.write_text(" ".join(map(str, sorted(self.pids))))
            tmp.replace(self.pid_file)

    def close(self) -> None:
        if self.controller is not None:
            self.controller.terminate()
            self.controller.wait()
            self.controller.stdout.close()
        for p in self.pids:  # whatever the controller did last, nothing stays stopped
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGCONT)
        self.pid_file.unlink(missing_ok=True)


def test_throttling_between_blocks_drops_the_rounds_measured_after_it(gate_bundles, tmp_path, monkeypatch):
    """One long pairbench call with a short calibration every 2 rounds; 2 s into its timed loop the agent's
    processes are throttled (``_Throttle``: stopped 9 ms of every 10 by a real-time controller started before
    the call), so every later calibration is many times slower whatever else runs here.  The watch drops every
    round measured once the throttle held, keeps none measured after it, and cuts at the first of two slow
    checks in a row -- at any load: rounds a loaded machine slowed before the throttle may go too."""
    from edgeopt.deploy import DeviceSession, load_bundle
    from edgeopt.hil.rig import ThrottleWatch
    from edgeopt.inventory import local_device

    quota = _Throttle()
    base = load_bundle(gate_bundles["base"])
    scratch = tmp_path / "tmp"  # the agent's bench child makes its work dir (and stage file) here
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    done = threading.Event()
    throttled_at: list[float] = []

    def throttle_when_timed() -> None:
        while not done.wait(0.05):
            if any('"timed"' in f.read_text() for f in scratch.glob("edgeopt-bench-*/stages.jsonl")):
                break
        if done.wait(2.0):
            return
        quota.add(_agent_processes())
        throttled_at.append(time.time())
        while not done.wait(0.2):  # a child started later joins its parent's group by itself; be sure
            quota.add(_agent_processes())

    try:
        if not quota.start():
            pytest.skip("the throttle needs a real-time controller (SCHED_FIFO) to hold at any load, and this machine "
                        "refuses one (no CAP_SYS_NICE, RLIMIT_RTPRIO 0, or a cgroup without real-time runtime)")
        with DeviceSession.open(local_device(str(tmp_path / "root"))) as sess:
            sess.push([base])
            watch = ThrottleWatch(sess, Policy(throttle=1.10))
            # one slow check alone (a shared box's hiccup) drops nothing; two in a row do
            lone = ThrottleWatch(sess, Policy(throttle=1.10))
            cal = [{"after_blocks": a, "ms": m} for a, m in ((0, 3.0), (4, 4.5), (8, 3.1), (12, 3.0))]
            assert lone.within_call({"blocks": [{}] * 12, "calibration": cal}) == 12 and lone.dropped_blocks == 0
            cal = [{"after_blocks": a, "ms": m} for a, m in ((0, 3.0), (4, 3.1), (8, 4.5), (12, 4.4), (16, 4.6))]
            assert lone.within_call({"blocks": [{}] * 16, "calibration": cal}) == 4 and lone.dropped_blocks == 12
            watcher = threading.Thread(target=throttle_when_timed, daemon=True)
            watcher.start()
            try:  # one thread: with two, each op waited for both to get a running window at once, and at load 10
                # four blocks took 17 s under the throttle (no check after it before the budget ran out); one: 1.6 s
                reply = sess.agent("pairbench", {"root": sess.root, "bundle_ids": [base.bundle_id, base.bundle_id],
                                                 "options": {"rounds": 400, "block_iters": 20, "budget_s": 14,
                                                             "warmup": 10, "calibrate_every": 2, "timeout_s": 120,
                                                             "threads": 1}},
                                   timeout=300)
            finally:
                done.set()
                watcher.join()
    finally:
        quota.close()
    assert reply.get("ok"), reply
    assert throttled_at, "the call ended before the throttle began: the test did not test anything"
    pb = reply["pairbench"]
    after = [c["after_blocks"] for c in pb["calibration"]]
    assert after[0] == 0 and all(b - a == 4 for a, b in zip(after[:-2], after[1:-1]))  # every 2 rounds
    assert after[-1] == len(pb["blocks"]) and pb["options"]["calibrate_every"] == 2
    keep = watch.within_call(pb)
    ratios = [c["ratio"] for c in watch.in_call]
    assert keep < len(pb["blocks"]) and keep % 2 == 0, (keep, len(pb["blocks"]), ratios)
    assert min(ratios[:2]) == 1.0, ratios
    cut = next(i for i, c in enumerate(watch.in_call) if c["after_blocks"] > keep)  # the first check dropped
    assert ratios[cut] > 1.10 and (all(r > 1.10 for r in ratios[cut + 1:cut + 2]) or cut == len(ratios) - 1), \
        (keep, ratios)  # dropped from the first of the slow checks that ended the call's kept rounds
    assert all(r > 1.10 for r in ratios[-2:]), ratios  # the throttle held to the end: so did the verdict
    assert watch.dropped_blocks == len(pb["blocks"]) - keep
    assert watch.as_dict()["between_blocks"]["dropped_blocks"] == watch.dropped_blocks


def test_rig_status_shows_an_unreachable_device(ssh_env, sshd, tmp_path):
    kh = known_hosts(tmp_path / "known_hosts", sshd)
    rig = _rig_file(tmp_path / "rig.yaml", {
        "up": device_entry(ssh_env, sshd, tmp_path / "r1", kh, target="cpu"),
        "down": {**device_entry(ssh_env, sshd, tmp_path / "r2", kh, target="cpu"), "port": 1}},
        {"max_load": 1000, "min_free_mb": 1})
    p = _edgeopt("rig", "status", "--devices", str(rig), "--json", cwd=tmp_path)
    assert p.returncode == 4, p.stderr
    rows = {r["device"]: r for r in json.loads(p.stdout)["devices"]}
    assert rows["up"]["health"] == "fit" and rows["up"]["figures"]["free_mb"] > 1
    assert rows["down"]["health"] == "unreachable" and "cannot connect" in rows["down"]["problems"][0]
    assert "Errno None" not in rows["down"]["problems"][0]  # paramiko's placeholder errno is not shown
    assert not (tmp_path / "edgeopt-results.db").exists()  # status reads the state, never creates it


def _jetson_tree(root, mode: int | None, cpu_min: int, gpu_min: int):
    """The files an Orin Nano's L4T exposes (no Jetson here: the agent reads a copy of them under a root)."""
    files = {
        "etc/nv_tegra_release": "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64\n",
        "proc/device-tree/model": "NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super\x00",
        "etc/nvpmodel.conf": "< POWER_MODEL ID=0 NAME=15W >\nCPU_ONLINE CORE_0 1\n< POWER_MODEL ID=1 NAME=25W >\n"
                             "< POWER_MODEL ID=2 NAME=MAXN_SUPER >\nGPU MAX_FREQ 1020000000\n"
                             "< PM_CONFIG DEFAULT=2 >\n",
        "sys/class/devfreq/17000000.gpu/min_freq": f"{gpu_min}\n",
        "sys/class/devfreq/17000000.gpu/max_freq": "1020000000\n",
        "sys/class/devfreq/other.emc/min_freq": "204000000\n",  # not the GPU: not judged
        "sys/class/devfreq/other.emc/max_freq": "3199000000\n",
    }
    if mode is not None:
        files["var/lib/nvpmodel/status"] = f"pmode:{mode:04d} fmode:quiet\n"
    for i in range(6):
        files[f"sys/devices/system/cpu/cpu{i}/cpufreq/scaling_min_freq"] = f"{cpu_min if i else 1728000}\n"
        files[f"sys/devices/system/cpu/cpu{i}/cpufreq/scaling_max_freq"] = "1728000\n"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_jetson_power_mode_and_clocks_are_read_and_judged(tmp_path):
    from edgeopt_agent.probe import jetson

    assert jetson(tmp_path / "not-a-jetson") is None
    j = jetson(_jetson_tree(tmp_path / "a", mode=0, cpu_min=729600, gpu_min=306000000))
    assert (j["l4t"], j["power_mode"], j["power_mode_id"], j["power_mode_default_id"]) == ("36.4.3", "15W", 0, 2)
    assert j["power_modes"] == {"0": "15W", "1": "25W", "2": "MAXN_SUPER"} and j["model"].endswith("Super")
    assert j["clocks_locked"] is False and j["clocks_unlocked"] == ["cpu1", "cpu2", "cpu3", "cpu4", "cpu5", "gpu"]
    # jetson_clocks applied, mode 2 (no status file: the board runs its boot default)
    k = jetson(_jetson_tree(tmp_path / "b", mode=None, cpu_min=1728000, gpu_min=1020000000))
    assert (k["power_mode"], k["power_mode_id"], k["clocks_locked"]) == ("MAXN_SUPER", 2, True)

    policy = Policy(power_mode="MAXN_SUPER", clocks_locked=True)
    problems, warnings = fitness({"jetson": j}, policy)
    assert not warnings and len(problems) == 2, problems
    assert "power mode 15W (id 0) != power_mode MAXN_SUPER" in problems[0] and "MAXN_SUPER (2)" in problems[0]
    assert "jetson_clocks not applied" in problems[1] and "gpu" in problems[1]
    assert fitness({"jetson": k}, policy) == ([], [])
    assert fitness({"jetson": k}, Policy(power_mode="2")) == ([], [])  # by id
    problems, _ = fitness({"jetson": k}, Policy(power_mode="MAXN"))
    assert "'MAXN' is none of them" in problems[0]
    problems, warnings = fitness({"jetson": None}, policy)  # an x86 box in a Jetson rig: said, not passed
    assert not problems and len(warnings) == 2 and "not a Jetson" in warnings[0]
    for bad, msg in (({"power_mode": True}, "nvpmodel mode"), ({"clocks_locked": "yes"}, "true or false")):
        with pytest.raises(UsageError, match=msg):
            parse_rig(bad)
    assert parse_rig({"power_mode": 0, "clocks_locked": True}).policy.power_mode == "0"
