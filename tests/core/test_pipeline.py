"""The build pipeline end to end on the `cpu` target: bundles, cache, bad input, crashes and hangs."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from edgeopt.cli import main
from edgeopt.errors import CalibrationError, UsageError
from edgeopt.pipeline import build
from tests.conftest import fixture, tiny_cnn


def _leftovers(out: Path) -> list[str]:
    return [p.name for p in out.rglob("*") if p.name.startswith(".")]


def test_build_cpu_fp32_real_model_writes_complete_bundle(tmp_path, images_dir):
    report = build(fixture("ocr-cls"), "cpu", ["fp32"], shapes={"x": [1, 3, 48, 192]}, calib=str(images_dir),
                   preprocess="preset=pm1", out=tmp_path / "dist")
    assert report.ok, report.results
    r = report.results[0]
    bundle = Path(r.bundle)
    m = json.loads((bundle / "manifest.json").read_text())
    assert m["schema"] == 1 and m["target"] == "cpu" and m["precision"] == "fp32"
    assert m["host_check"]["passed"] is True and m["host_check"]["samples"] == 8
    assert m["validation"]["source"]["kind"] == "images"
    assert set(m["files"]) == {"model.onnx", "validation/inputs.npz", "validation/reference.npz"}
    assert m["toolchain"]["onnxruntime"] != "missing"
    assert _leftovers(tmp_path / "dist") == []


def test_rebuild_uses_cache_and_says_so(tmp_path, capsys):
    model = tiny_cnn(tmp_path / "t.onnx")
    args = ["build", str(model), "--targets", "cpu", "--precision", "fp32", "--out", str(tmp_path / "d"), "-q"]
    assert main(args) == 0
    capsys.readouterr()
    t0 = time.perf_counter()
    assert main(args) == 0
    elapsed = time.perf_counter() - t0
    out = capsys.readouterr().out
    assert "up-to-date" in out and "taken from the cache" in out
    print(f"in-process cached rebuild: {elapsed:.3f}s")
    # A fresh --out is filled from the content-addressed cache, not rebuilt.
    args[-2] = str(tmp_path / "d2")
    assert main(args) == 0
    assert "cached" in capsys.readouterr().out


def test_random_data_is_loud(tmp_path):
    report = build(tiny_cnn(tmp_path / "t.onnx"), "cpu", ["fp32"], out=tmp_path / "d")
    assert any("RANDOM" in w for w in report.warnings)
    m = json.loads((Path(report.results[0].bundle) / "manifest.json").read_text())
    assert any("RANDOM" in w for w in m["warnings"])


@pytest.mark.parametrize("argv,needle", [
    (["--targets", "cpu,jetsn"], "did you mean jetson"),
    (["--targets", "cpu", "--precision", "fp33"], "unknown precision"),
    (["--targets", "cpu", "--shape", "y:1x3x32x32"], "unknown input"),
])
def test_bad_flags_one_line_exit_2(tmp_path, capsys, argv, needle):
    model = tiny_cnn(tmp_path / "t.onnx")
    assert main(["build", str(model), "--out", str(tmp_path / "d"), *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_unwritable_out_is_a_clear_error(tmp_path):
    model = tiny_cnn(tmp_path / "t.onnx")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UsageError, match="not writable"):
        build(model, "cpu", ["fp32"], out=blocker / "sub")


def test_calibration_shape_mismatch_leaves_nothing(tmp_path):
    model = tiny_cnn(tmp_path / "t.onnx")
    bad = tmp_path / "calib.npy"
    np.save(bad, np.zeros((4, 1, 3, 16, 16), np.float32))
    out = tmp_path / "d"
    with pytest.raises(CalibrationError, match="shape"):
        build(model, "cpu", ["fp32"], calib=str(bad), out=out)
    assert list(out.iterdir()) == []


def test_hung_converter_is_killed_and_reported(tmp_path):
    report = build(tiny_cnn(tmp_path / "t.onnx"), "cpu", ["fp32"], out=tmp_path / "d", timeout=0.2, force=True)
    r = report.results[0]
    assert r.status == "failed" and "hung" in r.error
    assert not (tmp_path / "d" / "t").exists() and _leftovers(tmp_path / "d") == []


def test_crashed_converter_reported_while_other_targets_finish(tmp_path):
    """SIGKILL the first worker mid-build (as the OOM killer would); the second target still builds."""
    psutil = pytest.importorskip("psutil")
    model = fixture("ocr-cls")
    killed: list[int] = []

    def kill_first_worker() -> None:
        me = psutil.Process()
        deadline = time.time() + 60
        while time.time() < deadline and not killed:
            for child in me.children(recursive=True):
                try:
                    if "edgeopt.worker" in " ".join(child.cmdline()):
                        child.kill()
                        killed.append(child.pid)
                        return
                except psutil.Error:
                    pass
            time.sleep(0.01)

    t = threading.Thread(target=kill_first_worker)
    t.start()
    report = build(model, "cpu,intel-cpu", ["fp32"], shapes={"x": [1, 3, 48, 192]}, out=tmp_path / "d", jobs=1,
                   force=True)
    t.join()
    assert killed
    statuses = {r.target: r for r in report.results}
    crashed = [r for r in report.results if r.status == "failed"]
    assert len(crashed) == 1 and "signal 9" in crashed[0].error
    assert sum(r.ok for r in statuses.values()) == 1
    assert _leftovers(tmp_path / "d") == []


def test_build_exit_code_3_when_a_target_fails(tmp_path, capsys):
    model = tiny_cnn(tmp_path / "t.onnx")
    code = main(["build", str(model), "--targets", "cpu", "--precision", "fp32", "--timeout", "0.2", "--force",
                 "--out", str(tmp_path / "d"), "-q"])
    assert code == 3
    assert "hung" in capsys.readouterr().out


def test_nothing_from_a_failed_build_is_left_in_out(tmp_path):
    out = tmp_path / "d"
    build(tiny_cnn(tmp_path / "t.onnx"), "cpu", ["fp32"], out=out, timeout=0.2, force=True)
    assert [p for p in out.rglob("*") if p.is_file()] == []
    assert os.listdir(out) == []
