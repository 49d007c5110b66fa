"""--fleet-engine ansible against the same mixed fleet (local devices + real sshd devices) as the builtin engine:
each wave a real ansible-runner play; the same faults give the same per-device outcomes."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.fleet.test_rollout import _bid, _current, _edgeopt, _fleet

pytestmark = pytest.mark.skipif(shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)) is None,
                                reason="ansible-core / ansible-runner not installed (the fleet extra)")


def _outcomes(stdout: str) -> dict[str, tuple[str, str]]:
    """The summary: the last of the JSON lines (events first, then the summary on one line)."""
    summary = json.loads(stdout.splitlines()[-1])
    return {o["device"]: (o["status"], o["step"]) for w in summary["waves"] for o in w.get("outcomes", [])}


@pytest.mark.parametrize("engine", ["builtin", "ansible"])
def test_same_faults_same_outcomes_with_either_engine(engine, versions, ssh_env, sshd, tmp_path):
    # one device's health check fails; --max-fail 1 lets the rollout go on past it
    _fleet(tmp_path, ssh_env, sshd, n_local=3, **{"ssh-1": {"health_cmd": ["sh", "-c", "exit 3"]}})
    args = ["--devices", "fleet.yaml", "--waves", "1,50%,100%", "--max-fail", "1", "--no-latency-gate",
            "--fleet-engine", engine, "--json", "--events", "ev.jsonl"]
    p = _edgeopt("rollout", str(versions["v1"]), *args, cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    got = _outcomes(p.stdout)
    assert got == {"loc-0": ("done", "commit"), "loc-1": ("done", "commit"), "loc-2": ("done", "commit"),
                   "ssh-0": ("done", "commit"), "ssh-1": ("failed", "health_cmd")}, got
    v1 = _bid(versions["v1"])
    assert _current(tmp_path) == {"loc-0": v1, "loc-1": v1, "loc-2": v1, "ssh-0": v1, "ssh-1": None}
    events = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text().splitlines()]
    steps = {e["step"] for e in events}
    assert {"push", "gate-fidelity", "activate", "device"} <= steps
    if engine == "ansible":  # ansible-runner's own events are in the same journal
        assert {(e["device"], e["status"]) for e in events if e["step"] == "ansible" and e["device"]} == {
            ("loc-0", "ok"), ("loc-1", "ok"), ("loc-2", "ok"), ("ssh-0", "ok"), ("ssh-1", "failed")}
    # a bad candidate halts at the canary with either engine; nobody else is touched
    p = _edgeopt("rollout", str(versions["bad"]), "--devices", "fleet.yaml", "--waves", "1,50%,100%",
                 "--budget", "4s", "--engine", engine, "--json", cwd=tmp_path)  # --engine: the old name
    assert p.returncode == 5, p.stdout[-2000:] + p.stderr[-2000:]
    got = _outcomes(p.stdout)
    assert len(got) == 1 and next(iter(got.values())) == ("failed", "gate"), got
    assert _current(tmp_path) == {"loc-0": v1, "loc-1": v1, "loc-2": v1, "ssh-0": v1, "ssh-1": None}


def test_ansible_engine_is_refused_in_one_line_without_ansible(versions, tmp_path):
    block = ("import sys; sys.modules['ansible_runner'] = None; from edgeopt.cli import main; "
             "sys.exit(main(sys.argv[1:]))")
    import subprocess

    (tmp_path / "fleet.yaml").write_text(f"devices:\n  a: {{transport: local, target: cpu, root: {tmp_path / 'a'}}}\n")
    p = subprocess.run([sys.executable, "-c", block, "rollout", str(versions["v1"]), "--devices", "fleet.yaml",
                        "--fleet-engine", "ansible"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "edgeopt[fleet]" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "a").exists()
