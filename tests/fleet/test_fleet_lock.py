"""One rollout per device at a time (issue 38, 9): two rollouts of one fleet at once both gated every
device under each other's load and both said DONE.  The journal's lock, taken by real processes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from edgeopt.fleet.journal import FleetBusy, Journal

HOLD = """
import sys, time
from edgeopt.fleet.journal import Journal
j = Journal(sys.argv[1])
j.claim("first", ["a", "b", "c"])
print("held", flush=True)
time.sleep(float(sys.argv[2]))
j.release("first")
"""


def _holder(db, seconds: float) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(db), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_rollout_on_a_shared_device_is_refused_naming_the_first(tmp_path):
    db = tmp_path / "journal.db"
    p = _holder(db, 60)
    try:
        with Journal(db) as j:
            with pytest.raises(FleetBusy) as e:
                j.claim("second", ["c", "d"])
            assert "rollout first" in e.value.message and f"pid {p.pid}" in e.value.message
            assert "c" in e.value.message and e.value.exit_code == 4
            j.claim("third", ["d", "e"])  # other devices of the fleet: allowed
            j.release("third")
    finally:
        p.kill()
        p.wait()


def test_a_holder_that_died_holds_nothing_and_a_released_lock_is_free(tmp_path):
    db = tmp_path / "journal.db"
    p = _holder(db, 60)
    p.kill()
    p.wait()
    with Journal(db) as j:
        j.claim("second", ["a"])  # its pid is gone: the lock is stale, taken
        j.release("second")
    p = _holder(db, 0.2)
    p.wait(timeout=60)
    with Journal(db) as j:
        t0 = time.monotonic()
        j.claim("fourth", ["a", "b"])
        assert time.monotonic() - t0 < 30
