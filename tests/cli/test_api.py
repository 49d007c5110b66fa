"""The Python API the scripts call: the same options as the CLI, typed results, EdgeoptError raised
(never sys.exit), and the same JSON shape as the CLI's --json."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest

import edgeopt
from edgeopt.errors import EdgeoptError, UsageError
from edgeopt.fixtures import path as fixture
from tests.hil.conftest import same_speed_gate


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("api")
    report = edgeopt.build(fixture("ocr-cls"), "cpu,intel-cpu", precision="cpu=fp32,intel-cpu=fp32",
                           shape={"x": [1, 3, 48, 192]}, calib=str(fixture("images")), preprocess="preset=pm1",
                           dist=tmp / "dist", calib_count=8, val_count=4)
    return tmp, report


def test_build_returns_the_report_the_cli_prints(built):
    tmp, report = built
    assert report.ok and [(r.target, r.precision) for r in report.results] == [("cpu", "fp32"), ("intel-cpu", "fp32")]
    assert all((tmp / "dist" / "ch_ppocr_mobile_v2.0_cls_infer" / f"{r.target}-fp32" / "manifest.json").is_file()
               for r in report.results)
    doc = json.loads(json.dumps(report.as_dict()))  # what --json prints
    check = doc["results"][0]["check"]  # data, not a formatted string
    assert check["passed"] is True and check["samples"] >= 1 and check["data"] in ("random", "images", "npz")
    out = next(iter(check["outputs"].values()))
    assert out["kind"] == "classification" and 0.99 < out["metrics"]["cosine"] <= 1.0 + 1e-6


def test_a_precision_one_target_lacks_is_skipped_and_said(built, tmp_path):
    report = edgeopt.build(fixture("ocr-cls"), "cpu,intel-cpu", precision="fp16", shape="x:1x3x48x192",
                           dist=tmp_path / "d", calib=str(fixture("images")), preprocess="preset=pm1",
                           calib_count=4, val_count=4)
    assert [(r.target, r.precision) for r in report.results] == [("intel-cpu", "fp16")]
    assert report.skipped == [{"target": "cpu", "precision": "fp16", "reason": "cpu offers fp32, int8"}]


def test_bench_and_report_through_the_api(built):
    tmp, _ = built
    db = str(tmp / "r.db")
    fleet = edgeopt.bench(dist=tmp / "dist", devices="local", duration=0.3, min_iters=5, warmup="0.1s", db=db)
    assert fleet.ok and {r.bundle.target for r in fleet.records} == {"cpu", "intel-cpu"}
    rows = json.loads(edgeopt.report(db=db, format="json", targets="intel-cpu"))
    assert rows["schema"] == "edgeopt/v1" and [r["target"] for r in rows["rows"]] == ["intel-cpu"]
    assert len(edgeopt.query(db=db)) == 2


def test_errors_are_raised_not_exited(built, tmp_path):
    tmp, _ = built
    with pytest.raises(UsageError, match="did you mean intel-cpu"):
        edgeopt.build(fixture("ocr-cls"), "intl-cpu", shape="x:1x3x48x192", dist=tmp_path)
    with pytest.raises(UsageError, match="static batch"):
        edgeopt.bench(dist=tmp / "dist", batch=4, db=str(tmp_path / "x.db"))
    with pytest.raises(EdgeoptError) as exc:
        edgeopt.bench(dist=tmp / "dist", devices=tmp_path / "nope.yaml")
    assert exc.value.exit_code == 2
    assert not (tmp_path / "x.db").exists()


def test_inspect_takes_shapes_and_lists_support():
    info = edgeopt.inspect(fixture("ocr-cls"), shape="x:1x3x48x192")
    assert info["shapes"] == {"x": [1, 3, 48, 192]} and info["flops"] > 0
    assert isinstance(info, edgeopt.InspectResult) and info.flops == info["flops"] and info.inputs[0].name == "x"
    assert "cpu" in info.supported_targets and info.to_dict()["support"] == info["support"]
    assert {r["target"] for r in info["support"]} >= {"cpu", "intel-cpu", "mobile", "jetson-orin"}


def test_gate_and_rollout_through_the_api(built, tmp_path):
    """The HIL gate and the fleet rollout are functions too: same checks, typed results, errors raised."""
    tmp, _ = built
    bundle = tmp / "dist" / "ch_ppocr_mobile_v2.0_cls_infer" / "cpu-fp32"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("devices:\n" + "".join(f"  d{i}: {{transport: local, target: cpu, root: {tmp_path / f'd{i}'}}}\n"
                                            for i in range(3)))
    plan = edgeopt.rollout(bundle, fleet, waves="1,100%", dry_run=True)
    assert [len(w) for w in plan["waves"]] == [1, 2] and plan["bytes"] > 0
    assert isinstance(plan, edgeopt.RolloutPlan) and sorted(plan.devices) == ["d0", "d1", "d2"] and plan.bytes > 0
    assert not any((tmp_path / f"d{i}").exists() for i in range(3))  # a dry run changes nothing
    with pytest.raises(UsageError, match="--max-fail"):
        edgeopt.rollout(bundle, fleet, max_fail="lots")
    with pytest.raises(UsageError, match="--budget"):
        edgeopt.gate(bundle, bundle, fleet, budget="0s")
    res = edgeopt.gate(bundle, bundle, fleet, limit="d0", budget="3s", db=None,  # A/A: the same bundle
                       gate=str(same_speed_gate(tmp_path)), raise_on_failure=False)  # inconclusive: returned
    assert res["schema"] == "edgeopt/v1" and res["kind"] == "gate" and [d["device"] for d in res["devices"]] == ["d0"]
    assert res["verdict"] in ("pass", "inconclusive") and res["exit_code"] in (0, 6)
    assert isinstance(res, edgeopt.GateResult) and res.devices[0].device == "d0" and res.ok == (res.exit_code == 0)
    assert {v.metric for v in res.devices[0].verdicts} and res.to_dict()["gate_id"] == res.gate_id


# --- the API raises what the CLI exits with (issue 27 item 6) -----------------------------------------------


def test_a_refused_build_raises_build_failed_with_the_report(tmp_path):
    """silero-vad keeps every weight inside If branches: its INT8 is refused (the CLI exits 3). The API
    raises BuildFailed carrying the BuildReport, or returns it with raise_on_failure=False."""
    from edgeopt.errors import BuildFailed
    from edgeopt.fixtures import audio_data

    data = audio_data("silero-vad", tmp_path / "sv.npz", count=16)
    kw = dict(precision="int8", shape={"input": [1, 576], "state": [2, 1, 128]}, calib=str(data), dist=tmp_path / "d")
    with pytest.raises(BuildFailed) as exc:
        edgeopt.build(fixture("silero-vad"), "cpu", **kw)
    err = exc.value
    assert err.exit_code == 3 and "cpu int8" in err.message and "quantized nothing" in err.message
    report = err.result
    assert report.ok is False and [(r.target, r.precision, r.status) for r in report.results] == [("cpu", "int8",
                                                                                                    "failed")]
    assert not (tmp_path / "d" / "silero_vad").exists()  # nothing shipped
    again = edgeopt.build(fixture("silero-vad"), "cpu", raise_on_failure=False, **kw)  # the cached refusal
    assert again.ok is False and "quantized nothing" in again.results[0].error


def _not_sshd() -> tuple[int, Callable[[], None]]:
    """A TCP port that answers with an SSH banner and then a malformed packet (a length no SSH packet has):
    paramiko's transport thread logs that as an ERROR with its traceback, one log record per line."""
    import socket
    import threading

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n" + b"\x7f\xff\xff\xff" + b"\x00" * 60)
                stop.wait(0.5)

    threading.Thread(target=serve, daemon=True).start()

    def close() -> None:
        stop.set()
        srv.close()
    return srv.getsockname()[1], close


def test_an_unreachable_device_raises_device_error_and_prints_no_traceback(built, tmp_path):
    """Through the API (a fresh interpreter, no logging configured: paramiko's records would reach stderr
    through Python's last-resort handler), a device whose port is not sshd: DeviceError (exit 4) with the
    FleetResult, one line, and nothing of paramiko's on stderr."""
    import subprocess
    import sys

    tmp, _ = built
    port, close = _not_sshd()
    try:
        (tmp_path / "rig.yaml").write_text(f"devices:\n  nuc-01: {{host: 127.0.0.1, port: {port}, user: ci, "
                                           f"target: intel-cpu, known_hosts: {tmp_path / 'kh'}}}\n")
        script = f"""
import edgeopt
try:
    edgeopt.bench(dist={str(tmp / 'dist')!r}, devices="rig.yaml", duration=0.3, db="r.db", trust_new_host_keys=True)
except edgeopt.DeviceError as exc:
    rec = exc.result.records[0]
    print("DeviceError", exc.exit_code, rec.status, "|", exc.message)
"""
        p = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    finally:
        close()
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("DeviceError 4 unreachable |") and "nuc-01" in p.stdout, p.stdout
    assert "Traceback" not in p.stderr and "paramiko" not in p.stderr and "Exception (client)" not in p.stderr, p.stderr
    assert (tmp_path / "r.db").is_file()  # the failed run is recorded, as the CLI records it


def test_an_unknown_keyword_is_a_usage_error_naming_the_closest(built):
    tmp, _ = built
    for call, kw, closest in ((edgeopt.bench, {"durtion": 1}, "duration"),
                              (edgeopt.build, {"precison": "fp32"}, "precision"),
                              (edgeopt.tune, {"latency_bounds": "p99=1ms"}, "latency_bound"),
                              (edgeopt.rollout, {"max_fial": "1"}, "max_fail"),
                              (edgeopt.report, {"target": "cpu"}, "targets")):
        args = {edgeopt.build: (fixture("ocr-cls"), "cpu"), edgeopt.tune: (fixture("ocr-cls"), "cpu"),
                edgeopt.rollout: (tmp / "dist", "local")}.get(call, ())
        with pytest.raises(UsageError) as exc:
            call(*args, **kw)
        msg = str(exc.value)
        assert f"edgeopt.{call.__name__}()" in msg and f"did you mean {closest!r}" in msg, msg
        assert "TypeError" not in msg and "_" + call.__name__ not in msg
    with pytest.raises(UsageError, match="missing a required argument: 'model'"):
        edgeopt.build(targets="cpu")


def test_dir_lists_the_api_and_public_functions_are_annotated():
    import inspect

    names = dir(edgeopt)
    for name in ("build", "bench", "push", "tune", "report", "gate", "rollout", "inspect", "query", "parse_duration",
                 "EdgeoptError", "BuildFailed", "DeviceError", "GoalNotMet", "UsageError", "GateFailed",
                 "Inconclusive", "RolloutHalted"):
        assert name in names and name in edgeopt.__all__, name
    for name in edgeopt.API:
        sig = inspect.signature(getattr(edgeopt, name))
        assert sig.return_annotation is not inspect.Signature.empty, name
        assert "raise_on_failure" in sig.parameters or name not in ("build", "bench", "push", "tune", "gate",
                                                                    "rollout"), name


def test_the_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    """README.md's Python example, its calls as written, in a folder laid out as it assumes: model.onnx,
    images/, rig.yaml with nuc-01. One change: the shape is ocr-cls's (the README's model takes 224x224), and
    images/ holds what that model reads (text-line pieces: calibrating an orientation classifier on photos,
    its INT8 was accepted or refused by which photos the split held out)."""
    import shutil

    shutil.copy(fixture("ocr-cls"), tmp_path / "model.onnx")
    from edgeopt.fixtures import ocr_lines

    (tmp_path / "images").symlink_to(ocr_lines())  # the model's own kind of images: text-line pieces
    (tmp_path / "rig.yaml").write_text(f"devices:\n  nuc-01: {{transport: local, root: {tmp_path / 'nuc'}}}\n")
    monkeypatch.chdir(tmp_path)
    # --- README.md: "Scripts call the same thing in Python" ---
    import edgeopt
    from edgeopt.errors import EdgeoptError

    try:
        built = edgeopt.build("model.onnx", "cpu,intel-cpu", precision="fp32,int8",
                              shape={"x": [1, 3, 48, 192]}, calib="images/")
        fleet = edgeopt.bench(dist="dist", devices="rig.yaml", limit="nuc-01", duration=5, warmup="2s")
    except EdgeoptError as exc:
        raise SystemExit(f"edgeopt: {exc} (exit {exc.exit_code})")  # noqa: B904 (as the README has it)
    for rec in fleet.records:  # typed: edgeopt.results.BenchRecord
        print(rec.device.name, rec.bundle.target, rec.bundle.precision, rec.status,
              f"p50 {rec.latency.p50_ms:.2f} ms" if rec.ok else rec.error.message)
    print(edgeopt.report(format="md", targets="intel-cpu"))
    # --- end of the example ---
    out = capsys.readouterr().out
    assert built.ok and len(built.results) == 4
    assert sorted(" ".join(ln.split()[:4]) for ln in out.splitlines()[:4]) == [
        "nuc-01 cpu fp32 ok", "nuc-01 cpu int8 ok", "nuc-01 intel-cpu fp32 ok", "nuc-01 intel-cpu int8 ok"]
    assert all(re.search(r" ok p50 \d+\.\d\d ms$", ln) for ln in out.splitlines()[:4]), out
    assert "intel-cpu" in "\n".join(out.splitlines()[4:])  # the report, filtered to intel-cpu


def test_inspect_and_build_know_the_newest_opset_onnx_runtime_reads(tmp_path):
    """A model stamped opset 24 / IR 12 (what onnx 1.19 writes by default): ONNX Runtime 1.23 reads opset
    <= 23 and IR <= 11 (asked, not assumed). inspect marks every target NO and says what to re-export with;
    build refuses before building anything (exit 2), no C++ signature, no temp path."""
    import subprocess
    import sys

    import onnx
    import onnxruntime

    from tests.conftest import tiny_cnn

    path = tiny_cnn(tmp_path / "new.onnx")
    m = onnx.load(str(path))
    m.opset_import[0].version, m.ir_version = 24, 12
    # Swish-24 has no earlier version: onnx.version_converter cannot take it down (a model it can is converted)
    next(n for n in m.graph.node if n.op_type == "Relu").op_type = "Swish"
    onnx.save(m, str(path))
    with pytest.raises(Exception) as ort_err:  # what the runtime itself says
        onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert "onnxruntime::" in str(ort_err.value)  # the C++ signature that must not reach the user
    newest = {"1.23": (23, 11)}.get(".".join(onnxruntime.__version__.split(".")[:2]))

    info = edgeopt.inspect(path)
    rows = {r["target"]: r for r in info["support"]}
    assert not any(r["supported"] for r in rows.values())
    cpu = rows["cpu"]["format"]
    assert f"ONNX Runtime {onnxruntime.__version__}" in cpu["message"] and "opset 24" in cpu["message"]
    assert "re-export with opset <=" in cpu["hint"] and "onnx.version_converter cannot" in cpu["message"]
    if newest:
        assert f"opset <= {newest[0]} and IR <= {newest[1]}" in cpu["message"]
    assert "opset <= 17" in rows["jetson-xavier"]["format"]["hint"]  # TensorRT 8.5's parser: 9..17

    p = subprocess.run([sys.executable, "-m", "edgeopt", "inspect", str(path)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "cpu" in p.stdout and "NO: opset 24, IR 12" in p.stdout
    assert "re-export with opset <=" in p.stdout and "onnxruntime::" not in p.stdout

    p = subprocess.run([sys.executable, "-m", "edgeopt", "build", str(path), "-t", "cpu", "--dist", str(tmp_path / "d")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "re-export with opset <=" in p.stderr, p.stderr
    assert "onnxruntime::" not in p.stderr and "/tmp" not in p.stderr.replace(str(path), "") \
        and "Traceback" not in p.stderr and "custom domain" not in p.stderr, p.stderr
    assert not (tmp_path / "d").exists()


def test_user_text_drops_onnx_runtimes_cpp_signature_and_work_folders(tmp_path):
    """ONNX Runtime's own refusal of a model in one of the build's work folders, made fit for one line."""
    import onnx
    import onnxruntime

    from edgeopt.errors import user_text
    from tests.conftest import tiny_cnn

    work = tmp_path / ".edgeopt-work-k2j9"
    work.mkdir()
    path = tiny_cnn(work / "prepared.onnx")
    m = onnx.load(str(path))
    m.ir_version = 99
    onnx.save(m, str(path))
    with pytest.raises(Exception) as exc:
        onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    raw = str(exc.value)
    assert "onnxruntime::" in raw and str(work) in raw
    line = user_text(raw)
    assert "onnxruntime::" not in line and "onnxruntime_src" not in line and str(tmp_path) not in line, line
    assert "prepared.onnx" in line and "IR version: 99" in line, line


def test_rollout_takes_the_names_the_other_commands_use(built, tmp_path):
    """label= (as bench and gate), device_budget= a duration (budget= its old name, with a DeprecationWarning:
    the gate's budget is a whole gate's time), fleet_engine=, on_inconclusive=pass."""
    tmp, _ = built
    bundle = tmp / "dist" / "ch_ppocr_mobile_v2.0_cls_infer" / "cpu-fp32"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("devices:\n" + "".join(
        f"  d{i}: {{transport: local, target: cpu, root: {tmp_path / f'd{i}'}, labels: [{'shop' if i else 'lab'}]}}\n"
        for i in range(3)))
    plan = edgeopt.rollout(bundle, fleet, waves="1,100%", label="shop", device_budget="30s",
                           fleet_engine="builtin", on_inconclusive="pass", dry_run=True)
    assert sorted(d["device"] for w in plan["waves"] for d in w) == ["d1", "d2"]
    with pytest.raises(UsageError, match="--device-budget"):
        edgeopt.rollout(bundle, fleet, device_budget="soon", dry_run=True)
    with pytest.warns(DeprecationWarning, match="device_budget"), pytest.raises(UsageError, match="--device-budget"):
        edgeopt.rollout(bundle, fleet, budget="soon", dry_run=True)
    with pytest.raises(UsageError, match="--fleet-engine"):
        edgeopt.rollout(bundle, fleet, fleet_engine="salt", dry_run=True)


# --- one failure convention: gate and rollout raise what the CLI exits with (issue 40) ----------------------


@pytest.fixture(scope="module")
def bad_bundle(built):
    """The same classifier with perturbed weights (other decisions, same speed), built as ``built``'s."""
    from tests.hil.models import perturbed

    tmp, _ = built
    src = fixture("ocr-cls")
    rep = edgeopt.build(perturbed(src, tmp / "bad" / src.name, scale=0.3), "cpu", precision="fp32",
                        shape={"x": [1, 3, 48, 192]}, calib=str(fixture("images")), preprocess="preset=pm1",
                        dist=tmp / "dist-bad", calib_count=4, val_count=8)
    return rep.results[0].bundle


def test_a_regressed_gate_raises_gate_failed_with_the_result(built, bad_bundle, tmp_path):
    """A script that writes ``except edgeopt.GateFailed`` stops a regressed candidate: the real perturbed
    bundle decides differently from the baseline (exit 5 in the CLI); the result is ``err.result``;
    ``raise_on_failure=False`` returns it."""
    tmp, _ = built
    base = tmp / "dist" / "ch_ppocr_mobile_v2.0_cls_infer" / "cpu-fp32"
    spec = tmp_path / "decisions.yaml"  # latency ungated: this test is about the accuracy regression
    spec.write_text("p50: off\np90: off\n")
    with pytest.raises(edgeopt.GateFailed) as exc:
        edgeopt.gate(bad_bundle, base, "local", budget="10s", db=None, gate=str(spec))
    err = exc.value
    assert isinstance(err, edgeopt.GoalNotMet) and err.exit_code == 5
    assert err.result["verdict"] == "regressed" and err.result["exit_code"] == 5
    assert "gate regressed: local: regressed (decisions regressed" in err.message, err.message
    res = edgeopt.gate(bad_bundle, base, "local", budget="10s", db=None, gate=str(spec), raise_on_failure=False)
    assert res["verdict"] == "regressed" and res["exit_code"] == 5


def test_gate_failure_maps_every_exit_code_to_its_exception():
    """``gate_failure``: the one mapping from a finished gate's exit code to the error the API raises."""
    from edgeopt.api import gate_failure

    def res(code: int, verdict: str) -> dict:
        return {"exit_code": code, "verdict": verdict,
                "devices": [{"device": "d0", "verdict": verdict, "error": "unreachable" if code == 4 else None,
                             "verdicts": [{"metric": "p50", "verdict": verdict, "ratio": 1.31}]}]}

    assert gate_failure(res(0, "pass")) is None
    failed = gate_failure(res(5, "regressed"))
    assert type(failed) is edgeopt.GateFailed and failed.exit_code == 5 and "p50 regressed x1.31" in failed.message
    inc = gate_failure(res(6, "inconclusive"))
    assert type(inc) is edgeopt.Inconclusive and inc.exit_code == 6 and inc.result["verdict"] == "inconclusive"
    dev = gate_failure(res(4, "error"))
    assert type(dev) is edgeopt.DeviceError and dev.exit_code == 4 and "unreachable" in dev.message


def test_a_halted_rollout_raises_rollout_halted_and_the_cli_exit_is_unchanged(built, tmp_path):
    """A device whose health check fails halts the rollout at the canary: RolloutHalted (exit 5, as the CLI
    exits) with the summary as ``err.result``; ``raise_on_failure=False`` returns the summary."""
    import subprocess
    import sys

    from edgeopt.api import rollout_failure

    tmp, _ = built
    bundle = tmp / "dist" / "ch_ppocr_mobile_v2.0_cls_infer" / "cpu-fp32"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"devices:\n  d0: {{transport: local, target: cpu, root: {tmp_path / 'd0'}, "
                     "health_cmd: [sh, -c, 'exit 3']}\n")
    with pytest.raises(edgeopt.RolloutHalted) as exc:
        edgeopt.rollout(bundle, fleet, waves="100%", db=str(tmp_path / "r.db"))
    err = exc.value
    assert err.exit_code == 5 and err.result["status"] == "halted" and "d0 failed" in err.message, err.message
    summary = edgeopt.rollout(bundle, fleet, waves="100%", db=str(tmp_path / "r.db"), raise_on_failure=False)
    assert summary["status"] == "halted"
    assert isinstance(summary, edgeopt.RolloutSummary) and not summary.ok and isinstance(err.result, edgeopt.RolloutSummary)
    assert [(o.device, o.status) for o in summary.outcomes] == [("d0", "failed")]
    p = subprocess.run([sys.executable, "-m", "edgeopt", "rollout", str(bundle), "--devices", str(fleet),
                        "--waves", "100%", "--db", str(tmp_path / "r.db")], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 5 and "Traceback" not in p.stderr, p.stdout + p.stderr
    paused = rollout_failure({"status": "paused", "rollout_id": "r1", "waves": []})
    assert type(paused) is edgeopt.Inconclusive and paused.exit_code == 6 and "--approve" in paused.hint
    down = rollout_failure({"status": "halted", "rollout_id": "r2",
                            "waves": [{"outcomes": [{"device": "d0", "status": "unreachable", "step": "push"}]}]})
    assert type(down) is edgeopt.DeviceError and down.exit_code == 4
    assert rollout_failure({"status": "done", "waves": []}) is None


# --- keywords named as the flags (issue 40 item 2) ----------------------------------------------------------


_CLI_OF = {"build": ["build"], "inspect": ["inspect"], "tune": ["tune"], "bench": ["bench"],
           "bench_options": ["bench"], "push": ["push"], "probe": ["devices"], "gc": ["devices", "gc"],
           "select_devices": ["bench"], "gate": ["gate"], "rollout": ["rollout", "start"], "query": ["report"],
           "report": ["report"], "rig_status": ["rig", "status"], "baseline_save": ["baseline", "save"],
           "baseline_import": ["baseline", "import"], "history": ["history"], "find_max_qps": ["bench"],
           "baseline_export": ["baseline", "export"], "export": ["export"]}


def test_every_renamed_keyword_is_its_flags_name_and_the_function_takes_it():
    """``edgeopt.api.RENAMED`` is the one table: each new keyword is a flag of the command (``shape`` is
    ``--shape``) and a keyword the function takes; the old name is no longer in its signature."""
    import importlib
    import inspect

    from edgeopt.api import RENAMED

    for fn, renames in RENAMED.items():
        path = _CLI_OF[fn]
        cmd = importlib.import_module(f"edgeopt.commands.{path[0]}").command
        for sub in path[1:]:
            cmd = cmd.commands[sub]
        flags = {o for p in cmd.params for o in getattr(p, "opts", [])}
        flags |= {"--" + p.name.replace("_", "-") for p in cmd.params if p.param_type_name == "argument"}
        f = getattr(edgeopt.api, fn)
        params = set(inspect.signature(f).parameters)
        for old, new in renames.items():
            assert "--" + new.replace("_", "-") in flags, (fn, new, sorted(flags))
            assert old not in params, (fn, old)
            if new not in params:  # taken through **kw (bench -> bench_options, tune -> edgeopt.tuning.tune)
                with pytest.raises(UsageError) as exc:
                    f(**{new: object(), "no_such_keyword_x": 1}) if fn != "tune" else f("m.onnx", "cpu", **{
                        new: object(), "no_such_keyword_x": 1})
                assert "'no_such_keyword_x'" in str(exc.value) and repr(new) not in str(exc.value).split(";")[0]


def test_old_keywords_still_work_with_a_deprecation_warning(built):
    """``shapes=`` (now ``shape=``), ``run_id=``/``all_runs=`` (``run=``/``all=``), ``labels=``: the same
    answer, a DeprecationWarning naming the new keyword; both at once is a UsageError; a typo of a new name
    gets did-you-mean the new name."""
    tmp, _ = built
    new = edgeopt.inspect(fixture("ocr-cls"), shape="x:1x3x48x192")
    with pytest.warns(DeprecationWarning, match=r"edgeopt.inspect\(shapes=\) is now shape="):
        old = edgeopt.inspect(fixture("ocr-cls"), shapes="x:1x3x48x192")
    assert old["shapes"] == new["shapes"] == {"x": [1, 3, 48, 192]} and old["flops"] == new["flops"]
    db = str(tmp / "kw.db")
    fleet = edgeopt.bench(dist=tmp / "dist", devices="local", label=None, duration=0.2, min_iters=3, warmup=0,
                          db=db, max_queue_delay=None)
    run = fleet.records[0].raw["run_id"]
    with pytest.warns(DeprecationWarning, match=r"edgeopt.query\((run_id|all_runs)=\) is now (run|all)="):
        old_q = edgeopt.query(db=db, run_id=run, all_runs=True)
    assert [r.to_dict() for r in old_q] == [r.to_dict() for r in edgeopt.query(db=db, run=run, all=True)]
    assert {r.bundle.target for r in old_q} == {"cpu", "intel-cpu"}
    with pytest.raises(UsageError, match="both 'shape' and its old name 'shapes'"):
        edgeopt.build(fixture("ocr-cls"), "cpu", shape="x:1x3x48x192", shapes="x:1x3x48x192")
    with pytest.raises(UsageError, match="did you mean 'build_timeout'"):
        edgeopt.build(fixture("ocr-cls"), "cpu", build_timout=10)
    with pytest.raises(UsageError, match="build_timeout must be above 0 s"), \
            pytest.warns(DeprecationWarning, match=r"\(timeout=\) is now build_timeout="):
        edgeopt.build(fixture("ocr-cls"), "cpu", timeout=0)


def test_help_shows_an_example_and_no_function_repr():
    import pydoc

    text = pydoc.render_doc(edgeopt.build, renderer=pydoc.plaintext)
    assert "report = edgeopt.build(" in text and "build_timeout=" in text and "shape=" in text
    assert "_quiet" not in text and " at 0x" not in text and "progress: 'Progress' = None" in text
    for name in ("gate", "rollout", "tune", "query", "inspect"):
        assert f"edgeopt.{name}(" in (getattr(edgeopt, name).__doc__ or ""), name
