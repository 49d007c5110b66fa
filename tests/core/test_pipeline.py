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


def test_two_builds_of_the_same_key_at_once_do_the_work_once(tmp_path):
    """Two processes, one cache, the same model/target/options: one builds, the other waits for it and takes
    its bundle (the cache key's lock), instead of both running the INT8 search. (Real photos: on random
    data the INT8 cross-check rightly refuses this model, 34/40.)"""
    import subprocess
    import sys

    model = fixture("ocr-cls")
    # 8 photos validate: the policy is widened to what these photos' INT8 reaches (the test is about the lock)
    (tmp_path / "accept.yaml").write_text("decisions: {max_disagreement: 15%}\n")
    procs = [subprocess.Popen([sys.executable, "-m", "edgeopt", "build", str(model), "-t", "cpu", "-p", "int8",
                               "--shape", "x:1x3x48x192", "--calib", str(fixture("images")), "--preprocess",
                               "preset=pm1", "--dist", str(tmp_path / f"d{i}"), "--json", "-v",
                               "--accept", str(tmp_path / "accept.yaml")],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "EDGEOPT_CACHE_DIR": str(tmp_path / "cache")})  # theirs alone
             for i in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [e[-800:] for _, e in outs]
    statuses = sorted(json.loads(o)["results"][0]["status"] for o, _ in outs)
    assert statuses == ["built", "cached"], statuses
    assert any("waiting for it" in e or "taken from the cache" in e or "cached" in e for _, e in outs)


def test_random_data_is_loud(tmp_path):
    report = build(tiny_cnn(tmp_path / "t.onnx"), "cpu", ["fp32"], out=tmp_path / "d")
    assert any("RANDOM" in w for w in report.warnings)
    m = json.loads((Path(report.results[0].bundle) / "manifest.json").read_text())
    assert any("RANDOM" in w for w in m["warnings"])


@pytest.mark.parametrize("argv,needle", [
    (["--targets", "cpu,jetsn"], "did you mean jetson"),
    (["--targets", "cpu", "--precision", "fp33"], "unknown precision"),
    (["--targets", "cpu", "--shape", "y:1x3x32x32"], "unknown input"),
    (["--targets", "cpu", "--option", "if_as_where=maybe"], "expected true or false"),
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
    assert "out-of-memory killer" in crashed[0].error and "GB of memory" in crashed[0].error  # what it most likely was
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


# --- --option values are checked before anything is built -----------------------------------------
TFLITE_KEYS = frozenset({"int8_mode", "io_dtype", "replace_ops", "int8_tolerance", "convert_timeout"})


def _no_build(monkeypatch) -> None:
    """Fail the test if the pipeline gets as far as preparing data or starting a worker."""
    import edgeopt.pipeline as pipeline

    def started(*args, **kwargs):
        raise AssertionError("a build started despite a bad --option")

    monkeypatch.setattr(pipeline, "_prepare", started)
    monkeypatch.setattr(pipeline, "_run_job", started)


def _tflite_lists_its_keys(monkeypatch) -> None:
    """Unknown keys are refused only when every backend lists its keys: stand in for the TFLite target's
    list where it has none yet."""
    from edgeopt.targets.registry import get_backend

    tflite = get_backend("tflite")
    if tflite.known_options() is None:
        monkeypatch.setattr(type(tflite), "known_options", lambda self: TFLITE_KEYS, raising=False)


@pytest.mark.parametrize("target,precision,options,needle", [
    ("cpu", "int8", {"int8_search": "fast"}, "int8_search"),
    ("cpu", "fp32", {"int8_tolerance": "cosine_min=high"}, "int8_tolerance"),
    ("cpu", "int8", {"int8_serach": "full"}, "did you mean int8_search"),
    ("cpu", "fp32", {"colour": "red"}, "no target reads it"),
    ("intel-cpu", "int8", {"int8_budget_s": "soon"}, "int8_budget_s"),
    ("intel-cpu", "int8", {"int8_max_reverts": "many"}, "int8_max_reverts"),
    ("apple", "fp16", {"compute_units": "NPU"}, "compute_units"),
    ("apple", "fp16", {"min_deployment_target": "iOS14"}, "iOS14"),
    ("h100", "fp16", {"trt_opt_level": 9}, "0..5"),
    ("h100", "int8", {"trt_calibration": "entropyy"}, "unknown calibration method"),
    ("a100", "fp16", {"trt_dla_core": 0}, "has no DLA"),
])
def test_bad_option_value_is_a_usage_error_before_any_build(tmp_path, monkeypatch, target, precision, options,
                                                            needle):
    from edgeopt.targets.registry import get_backend, resolve_target

    why = get_backend(resolve_target(target).backend).available()
    if why:
        pytest.skip(why)
    _no_build(monkeypatch)
    _tflite_lists_its_keys(monkeypatch)
    out = tmp_path / "d"
    with pytest.raises(UsageError, match=needle):
        build(tiny_cnn(tmp_path / "t.onnx"), target, [precision], out=out, options=options)
    assert not out.exists()


def test_bad_option_value_exits_2_with_one_message(tmp_path, capsys, monkeypatch):
    _no_build(monkeypatch)
    model = tiny_cnn(tmp_path / "t.onnx")
    code = main(["build", str(model), "--targets", "cpu", "--precision", "int8", "--option", "int8_search=fast",
                 "--out", str(tmp_path / "d"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "int8_search" in err and "Traceback" not in err
    assert err.startswith("edgeopt: error: ") and err.count("edgeopt: error") == 1


def test_options_are_build_wide_each_target_reads_its_own(monkeypatch):
    """`--targets cpu,mobile --option int8_mode=dynamic`: the TFLite key is no error for cpu; one set of
    options serves every target, one at a time too; only a key no backend reads is refused."""
    from edgeopt.pipeline import check_options
    from edgeopt.targets.registry import resolve_target

    cpu, mobile, apple = resolve_target("cpu"), resolve_target("mobile"), resolve_target("apple")
    both = {"int8_mode": "dynamic", "int8_search": "full", "compute_units": "CPU_ONLY"}
    check_options([(cpu, "int8"), (mobile, "int8")], both)
    _tflite_lists_its_keys(monkeypatch)
    check_options([(cpu, "int8"), (mobile, "int8")], both)
    check_options([(cpu, "int8")], both)  # another backend's keys are ignored, not refused
    check_options([(apple, "fp16")], {"int8_tolerance": "cosine_min=0.9"})
    check_options([(cpu, "int8")], {"seed": 3, "check_timeout": 60})  # the pipeline's own keys
    with pytest.raises(UsageError, match=r"int8_mod\b.*no target reads it"):
        check_options([(cpu, "int8"), (mobile, "int8")], {"int8_mod": "dynamic"})


# --- failed checks are cached as outcomes -------------------------------------------------------
def _noisy(path: Path) -> Path:
    """x + RandomNormalLike(x): every run differs from the reference, so the host check always fails."""
    import onnx
    from onnx import TensorProto, helper

    nodes = [helper.make_node("RandomNormalLike", ["x"], ["n"], name="noise"),
             helper.make_node("Add", ["x", "n"], ["y"], name="add")]
    graph = helper.make_graph(nodes, "noisy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_failed_host_check_is_cached_as_an_outcome_until_force(tmp_path, monkeypatch):
    # a random op is refused up front by the support rules (no reference can match it); these tests need
    # it built so that its host check fails, so the rules are set aside as bench_conformance does
    monkeypatch.setenv("EDGEOPT_SUPPORT_RULES", "off")
    model, out = _noisy(tmp_path / "noisy.onnx"), tmp_path / "d"
    first = build(model, "cpu", ["fp32"], out=out).results[0]
    assert first.status == "check-failed" and "cached" not in first.error
    t0 = time.perf_counter()
    again = build(model, "cpu", ["fp32"], out=out).results[0]
    assert time.perf_counter() - t0 < 5
    assert again.status == "check-failed" and again.time_s == 0.0 and not again.ok
    assert "cached" in again.error and "--force" in again.error and "cached" in again.check
    assert first.error in again.error
    assert not (out / "noisy").exists() and _leftovers(out) == []  # nothing installed
    forced = build(model, "cpu", ["fp32"], out=out, force=True).results[0]
    assert forced.status == "check-failed" and "cached" not in forced.error and forced.time_s > 0
    # --allow-mismatch is another build (another key): it keeps the bundle as before
    kept = build(model, "cpu", ["fp32"], out=out, allow_mismatch=True).results[0]
    assert kept.status == "built" and kept.manifest["host_check"]["passed"] is False


def test_cached_check_failure_exits_3_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("EDGEOPT_SUPPORT_RULES", "off")  # see above
    args = ["build", str(_noisy(tmp_path / "noisy.onnx")), "--targets", "cpu", "--precision", "fp32",
            "--out", str(tmp_path / "d"), "-q"]
    assert main(args) == 3
    capsys.readouterr()
    assert main(args) == 3
    assert "cached" in capsys.readouterr().out


def test_int8_search_with_no_passing_variant_is_cached_until_force(tmp_path):
    model, out = tiny_cnn(tmp_path / "t.onnx"), tmp_path / "d"
    opts = {"int8_tolerance": "cosine_min=1,rel_l2_max=0", "int8_budget_s": 5}
    first = build(model, "cpu", ["int8"], out=out, options=opts).results[0]
    assert first.status == "failed" and "no INT8 variant the accuracy policy accepts" in first.error and "cached" not in first.error
    again = build(model, "cpu", ["int8"], out=out, options=opts).results[0]
    assert again.status == "failed" and again.time_s == 0.0
    assert again.error.startswith("[cached") and "no INT8 variant the accuracy policy accepts" in again.error
    assert [p for p in out.rglob("*") if p.is_file()] == []
    forced = build(model, "cpu", ["int8"], out=out, options=opts, force=True).results[0]
    assert forced.status == "failed" and "cached" not in forced.error and forced.time_s > 0


def test_a_hung_host_check_is_not_cached(tmp_path):
    model, out = tiny_cnn(tmp_path / "t.onnx"), tmp_path / "d"
    for _ in range(2):  # a timeout may be transient: the second build runs again
        r = build(model, "cpu", ["fp32"], out=out, options={"check_timeout": 0.001}).results[0]
        assert r.status == "check-failed" and "hung" in r.error and "cached" not in r.error


def test_a_hung_converter_is_not_cached(tmp_path):
    model, out = tiny_cnn(tmp_path / "t.onnx", seed=11), tmp_path / "d"  # weights no other test caches
    for _ in range(2):
        r = build(model, "cpu", ["fp32"], out=out, timeout=0.2).results[0]
        assert r.status == "failed" and "hung" in r.error and "cached" not in r.error


def test_a_calib_typo_after_a_random_data_build_is_an_error_not_a_cache_hit(tmp_path, monkeypatch):
    """Issue 15: build without --calib, then with a typo'd or empty --calib: exit 2, never 'cached'."""
    import subprocess
    import sys

    from tests.conftest import tiny_cnn

    monkeypatch.setenv("EDGEOPT_CACHE_DIR", str(tmp_path / "cache"))
    model = tiny_cnn(tmp_path / "m.onnx")
    run = [sys.executable, "-m", "edgeopt", "build", str(model), "-t", "cpu", "-p", "fp32", "--out",
           str(tmp_path / "d"), "-q"]
    assert subprocess.run(run, capture_output=True, text=True, timeout=300).returncode == 0
    (tmp_path / "empty").mkdir()
    for calib, msg in [(tmp_path / "nothere", "not found"), (tmp_path / "empty", "holds no images")]:
        p = subprocess.run([*run, "--calib", str(calib)], capture_output=True, text=True, timeout=300)
        assert p.returncode == 2 and msg in p.stderr and "cached" not in p.stderr + p.stdout, p.stderr



def test_an_unsupported_target_says_what_would_fix_it(tmp_path):
    """Every node named, then a way out: for an already-quantized model (ORT's dynamic quantization:
    ConvInteger, DynamicQuantizeLinear) the float model it was made from; else the targets that take it."""
    from onnxruntime.quantization import quantize_dynamic

    tiny_cnn(tmp_path / "m.onnx")
    quantize_dynamic(str(tmp_path / "m.onnx"), str(tmp_path / "q.onnx"), op_types_to_quantize=["Conv"])
    r = build(str(tmp_path / "q.onnx"), "apple", ["fp32"], out=tmp_path / "d1").results[0]
    assert r.status == "unsupported" and "ConvInteger (" in r.error, r.error
    assert "hint: the model is already quantized (" in r.error and "needs the float model it was made from" in r.error
    r = build(str(fixture("silero-vad")), "apple", ["fp32"], shapes={"input": [1, 576], "state": [2, 1, 128]},
              out=tmp_path / "d2").results[0]
    assert r.status == "unsupported" and "If (" in r.error
    hint = r.error.split("hint: ", 1)[1]
    assert hint.startswith("targets that take every node: cpu, intel-cpu") and "apple" not in hint.split(";")[0]
