"""``--fleet-engine ansible``: each wave of a rollout is an Ansible play, run by ansible-runner.

What Ansible does and what it does not:

- the wave's devices are the play's hosts; ``--parallel`` is Ansible's ``forks``; ``--max-fail`` is
  the play's ``max_fail_percentage`` (the same *exceed* rule as the builtin engine, computed for the
  wave's size); the per-device step timeout is the task's ``timeout``;
- the task on each host is ``python -m edgeopt.fleet.step JOB DEVICE``: the builtin engine's own
  ``roll_device`` (push, fidelity gate, decisions and latency against the incumbent, trial activation,
  hooks, health window, commit, rollback), so both engines share one implementation of a device's
  steps. Ansible runs it on the controller (``ansible_connection: local``); the step connects to the
  device with edgeopt's transport (host keys verified, agent verbs, content-addressed push), so a
  device needs nothing for Ansible — no Python modules copied over, no second SSH configuration;
- ansible-runner's event stream (task start, ok/failed per host, the play's stats) is written into
  the rollout's journal beside the device's own steps;
- waves, halts, rollbacks, pauses and resume are decided by ``run_rollout``, as for the builtin engine.

Ansible (``ansible-core`` 2.19, ``ansible-runner``) comes with the ``fleet`` extra.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeopt.errors import MissingDependency

STEP_EXIT = {"done": 0, "already": 0, "paused": 3}  # anything else: 1 (the host failed, for Ansible)


def require_ansible() -> None:
    import importlib.util

    if importlib.util.find_spec("ansible_runner") is None or importlib.util.find_spec("ansible") is None:
        raise MissingDependency("--fleet-engine ansible needs ansible-core and ansible-runner, which are not installed",
                                hint="pip install 'edgeopt[fleet]' (or use --fleet-engine builtin)")
    if shutil.which("ansible-playbook", path=_path()) is None:
        raise MissingDependency("--fleet-engine ansible: ansible-playbook is not on PATH",
                                hint="pip install 'edgeopt[fleet]' into the environment edgeopt runs from")


def _path() -> str:
    return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def max_fail_percentage(max_fail: tuple[float, bool], size: int) -> float:
    """``--max-fail`` for a wave of ``size`` as Ansible's percentage (Ansible aborts when failed hosts
    are *more than* this share of the batch: the same rule as ``plan.wave_failed``)."""
    value, pct = max_fail
    return min(100.0, value if pct else 100.0 * value / max(1, size))


def _playbook(rollout_id: str, wave: int, job: Path, opts, size: int) -> list[dict[str, Any]]:
    timeout = int(opts.step_timeout_s + opts.gate_budget_s + opts.health_watch_s + 120)
    return [{
        "name": f"edgeopt rollout {rollout_id} wave {wave + 1}",
        "hosts": "wave",
        "gather_facts": False,
        "max_fail_percentage": max_fail_percentage(opts.max_fail, size),
        "tasks": [{
            "name": "edgeopt device steps (push, gate, trial activation, hooks, health, commit)",
            "ansible.builtin.command": {"argv": [sys.executable, "-m", "edgeopt.fleet.step", str(job),
                                                 "{{ inventory_hostname }}"],
                                        "chdir": os.getcwd()},  # bundle and inventory paths as the user gave them
            "register": "step",
            "timeout": timeout,
            "changed_when": "step.rc == 0",
            "failed_when": "step.rc not in [0, 3]",
        }],
    }]


def _outcome_from(event: dict[str, Any], name: str) -> dict[str, Any]:
    """The step's outcome (its last stdout line), or a failure saying what Ansible saw."""
    data = event.get("event_data") or {}
    res = data.get("res") or {}
    for line in reversed(str(res.get("stdout") or "").splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    kind = event.get("event")
    status = "unreachable" if kind == "runner_on_unreachable" else "failed"
    tail = (res.get("stderr") or "").strip().splitlines()[-1:]
    msg = (f"{res.get('msg') or 'failed'}: {tail[0]}" if tail else str(res.get("msg") or "no outcome"))
    if "expected time frame" in msg:
        status = "timed-out"
    return {"device": name, "status": status, "step": "ansible", "reason": f"ansible: {msg}"[:500]}


def run_wave(rollout_id: str, wave: int, todo: list[dict[str, Any]], devices: dict[str, Any],
             bundles: dict[str, Any], opts, journal, progress: Callable[[str], None] = lambda s: None) -> list:
    """Run one wave as an Ansible play; the devices' ``Outcome`` list, in ``todo``'s order."""
    import ansible_runner

    from edgeopt.fleet.rollout import Outcome

    require_ansible()
    names = [w["device"] for w in todo]
    work = Path(tempfile.mkdtemp(prefix=f"edgeopt-ansible-{rollout_id}-"))  # 0700: holds the job
    try:
        job = work / "job.pickle"
        with open(job, "wb") as f:  # read back only by our own step process, from this private folder
            pickle.dump({"db": journal.path, "rollout_id": rollout_id, "wave": wave, "opts": opts,
                         "devices": {n: devices[n] for n in names}, "bundles": {n: bundles[n] for n in names}}, f)
        (work / "project").mkdir()
        (work / "project" / "rollout.yml").write_text(json.dumps(_playbook(rollout_id, wave, job, opts, len(todo)),
                                                                 indent=2))
        inventory = {"all": {"children": {"wave": {"hosts": {
            n: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable} for n in names}}}}}
        outcomes: dict[str, dict[str, Any]] = {}
        seq = [journal.last_seq()]

        def on_event(ev: dict[str, Any]) -> bool:
            seq[0] = journal.forward(rollout_id, seq[0], set(names))  # the steps' own events, as they come
            kind = ev.get("event", "")
            data = ev.get("event_data") or {}
            host = data.get("host")
            if kind in ("runner_on_ok", "runner_on_failed", "runner_on_unreachable") and host in names:
                outcomes[host] = _outcome_from(ev, host)
                res = data.get("res") or {}
                journal.event(rollout_id, wave, host, "ansible", kind.replace("runner_on_", ""),
                              {"task": data.get("task"), "rc": res.get("rc"), "changed": res.get("changed")})
            elif kind == "playbook_on_stats":
                journal.event(rollout_id, wave, None, "ansible", "stats",
                              {k: data.get(k) for k in ("ok", "failures", "dark", "changed", "skipped")})
            return True

        t0 = time.perf_counter()
        r = ansible_runner.run(private_data_dir=str(work), playbook="rollout.yml", inventory=inventory,
                               forks=max(1, min(opts.parallel, len(names))), quiet=True, event_handler=on_event,
                               envvars={"PATH": _path(), "ANSIBLE_NOCOLOR": "1", "LC_ALL": "C.UTF-8",
                                        "LANG": "C.UTF-8", "ANSIBLE_HOST_KEY_CHECKING": "True"},
                               settings={"suppress_ansible_output": True})
        journal.forward(rollout_id, seq[0], set(names))
        progress(f"  ansible: {r.status} (rc {r.rc}) in {time.perf_counter() - t0:.1f}s")
        out = []
        for n in names:
            o = outcomes.get(n) or {"device": n, "status": "failed", "step": "ansible",
                                    "reason": f"ansible ran no step on this device (run {r.status}, rc {r.rc})"}
            out.append(Outcome(**{k: v for k, v in o.items() if k in Outcome.__dataclass_fields__}))
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)
