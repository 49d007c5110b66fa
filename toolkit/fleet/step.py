"""``python -m edgeopt.fleet.step JOB DEVICE``: one device's rollout steps, the task Ansible runs per host.

The job (written by ``ansible_engine.run_wave`` into its private folder) carries the rollout's options,
the wave's devices and their bundles. This runs the builtin engine's ``roll_device`` for DEVICE, writes
every step to the rollout's journal, prints the outcome as one JSON line, and exits 0 (done/already),
3 (paused on an inconclusive verdict) or 1 (failed: Ansible counts the host as failed).
"""

from __future__ import annotations

import json
import pickle
import sys


def main(argv: list[str]) -> int:
    from edgeopt.fleet.ansible_engine import STEP_EXIT
    from edgeopt.fleet.journal import Journal
    from edgeopt.fleet.rollout import roll_device

    job_path, name = argv
    with open(job_path, "rb") as f:
        job = pickle.load(f)  # noqa: S301 - our own file, in a 0700 folder made for this wave
    with Journal(job["db"]) as journal:
        def emit(device, step, status, **data):
            journal.event(job["rollout_id"], job["wave"], device, step, status, data)

        out = roll_device(job["devices"][name], job["bundles"][name], job["opts"], emit)
    print(json.dumps(out.as_dict(), default=str), flush=True)
    return STEP_EXIT.get(out.status, 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
