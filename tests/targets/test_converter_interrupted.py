"""A converter child stopped by SIGTERM is reported as interrupted, not as a crash (issue 26, 5)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

import edgeopt.targets.tflite as tflite_target
from edgeopt.errors import BuildFailed
from edgeopt.targets.tflite import interrupted_by, run_converter


def test_interrupted_by_names_the_stopping_signals_only():
    assert interrupted_by(-signal.SIGTERM) == "SIGTERM" and interrupted_by(-signal.SIGINT) == "SIGINT"
    assert interrupted_by(-signal.SIGSEGV) is None and interrupted_by(-signal.SIGKILL) is None
    assert interrupted_by(1) is None and interrupted_by(0) is None and interrupted_by(None) is None


def _children_running(marker: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and marker in cmd:
            out.append(int(d.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc to find the child")
def test_a_converter_child_stopped_by_sigterm_is_interrupted(tmp_path, monkeypatch):
    # The child waits at start-up (a sitecustomize on its PYTHONPATH) until the test stops it.
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text("import time\ntime.sleep(120)\n")
    monkeypatch.setenv("PYTHONPATH", str(hold))
    work = tmp_path / "work"
    work.mkdir()
    killed: list[int] = []
    lines: list[str] = []

    def stop() -> None:  # announce a step as the converter does, wait for a heartbeat naming it, then stop
        t_end = time.monotonic() + 60
        announced = False
        while time.monotonic() < t_end and not killed:
            pids = _children_running("edgeopt.targets.tflite.convert")
            if pids and not announced:
                with open(work / "progress.txt", "a") as f:
                    f.write("onnx2tf: ONNX -> SavedModel (NCHW -> NHWC); the slow step\n")
                announced = True
            if pids and any(ln.startswith("still converting: onnx2tf: ONNX -> SavedModel") for ln in lines):
                for pid in pids:
                    os.kill(pid, signal.SIGTERM)
                    killed.append(pid)
            time.sleep(0.05)

    monkeypatch.setattr(tflite_target, "HEARTBEAT_S", 0.5)
    t = threading.Thread(target=stop, daemon=True)
    t.start()
    with pytest.raises(BuildFailed) as e:
        run_converter({}, work, timeout=90, progress=lines.append)
    t.join(timeout=5)
    assert killed
    assert "interrupted (SIGTERM)" in str(e.value) and "crashed" not in str(e.value)
    beat = next(ln for ln in lines if ln.startswith("still converting: "))
    assert "for " in beat and "of the 90s limit (convert_timeout)" in beat
