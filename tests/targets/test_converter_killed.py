"""A converter killed by SIGKILL -- on Linux most often the kernel's out-of-memory killer (onnx2tf grew to 22.5 GB
converting the zoo's vgg19 on a 24 GB machine) -- is said so, with the machine's memory, not as "exit code -9"."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest


def test_sigkill_words_name_the_oom_killer_and_the_machines_memory():
    from edgeopt.killed import sigkill_words

    assert sigkill_words(0, "x") is None and sigkill_words(-signal.SIGTERM, "x") is None and sigkill_words(None, "x") is None
    msg, hint = sigkill_words(-signal.SIGKILL, "the TFLite converter (onnx2tf)", 548 * 2**20)
    assert msg.startswith("the TFLite converter (onnx2tf) was killed (SIGKILL, signal 9), most likely by the kernel's "
                          "out-of-memory killer") and "GB of memory" in msg and "the model is 548 MB" in msg
    assert "more memory" in hint and "-j 1" in hint


def _converter_pids(marker: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "edgeopt.targets.tflite.convert" in cmd and marker in cmd:
                out.append(int(d.name))
    return out


def test_a_mobile_build_whose_converter_is_sigkilled_says_out_of_memory(tmp_path):  # ~10 s
    """The converter child of a real mobile build is sent SIGKILL (as the OOM killer would) while it converts:
    the result names the OOM killer and the machine's memory; the run ends with a failed result, no traceback."""
    pytest.importorskip("onnx2tf")
    from edgeopt import api
    from tests.conftest import tiny_cnn

    model = tiny_cnn(tmp_path / "m.onnx")
    done = threading.Event()
    killed: list[int] = []

    def kill_the_converter() -> None:
        while not done.wait(0.1):
            pids = _converter_pids(str(tmp_path))
            if pids:
                time.sleep(0.5)  # inside its conversion, as a memory-hungry step would be
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                    except ProcessLookupError:
                        pass
                return

    t = threading.Thread(target=kill_the_converter, daemon=True)
    t.start()
    try:
        rep = api.build(str(model), "mobile", precision="fp32", dist=str(tmp_path / "d"), raise_on_failure=False,
                        val_count=2, calib_count=2)
    finally:
        done.set()
        t.join()
    assert killed, "the converter was never seen running: the test did not test anything"
    r = rep.results[0]
    assert r.status == "failed", (r.status, r.error)
    assert "was killed (SIGKILL, signal 9), most likely by the kernel's out-of-memory killer" in (r.error or ""), r.error
    assert "GB of memory" in r.error and "exit code -9" not in r.error
