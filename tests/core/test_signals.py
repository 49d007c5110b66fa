"""SIGTERM (timeout, a CI cancel, kill) ends a build like Ctrl-C: no workers left, no work folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.conftest import fixture


def _children(pid: int) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(p))
            except (OSError, ValueError, IndexError):
                pass
    return out


def test_sigterm_stops_a_build_and_cleans_up(tmp_path):
    env = {**os.environ, "EDGEOPT_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "edgeopt", "build", str(fixture("ocr-cls")), "--targets",
                             "cpu,intel-cpu", "--precision", "int8", "--shape", "x:1x3x48x192", "--out",
                             str(tmp_path / "dist")], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not _children(proc.pid):  # wait until workers run
        time.sleep(0.1)
    workers = _children(proc.pid)
    assert workers, "no worker process started"
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    time.sleep(0.5)
    assert not [w for w in workers if os.path.exists(f"/proc/{w}") and
                open(f"/proc/{w}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"]
    assert not list((tmp_path / "dist").glob(".edgeopt-work-*")) if (tmp_path / "dist").exists() else True


def test_sigterm_under_json_prints_the_one_error_object(tmp_path):
    """`--json` promises one error object on stdout whatever ends the run; a stop (SIGTERM) too."""
    import json

    env = {**os.environ, "EDGEOPT_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-m", "edgeopt", "build", str(fixture("ocr-cls")), "--targets",
                             "cpu", "--precision", "int8", "--shape", "x:1x3x48x192", "--out",
                             str(tmp_path / "dist"), "--json"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not _children(proc.pid):
        time.sleep(0.1)
    assert _children(proc.pid), "no worker process started"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    obj = json.loads(out.strip().splitlines()[-1])
    assert obj["kind"] == "error" and obj["exit_code"] == 130 and obj["error"] == "Interrupted"
