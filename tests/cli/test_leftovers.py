"""Issue 40's leftovers, one test each: every case runs the installed CLI (``python -m edgeopt``) on real
bundles of the PP-OCR classifier and simulated devices (``transport: local``), and checks the one line, the
exit code and that nothing was written where the input was bad."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import edgeopt
from edgeopt.fixtures import path as fixture

MODEL = "ch_ppocr_mobile_v2.0_cls_infer"


def _edgeopt(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout)


def _one_error(p: subprocess.CompletedProcess, code: int = 2) -> str:
    """The run ended with ``code`` and one error line (and at most its hint), no traceback."""
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == code, (p.returncode, p.stdout[-1500:], p.stderr[-1500:])
    assert "Traceback" not in p.stderr and 1 <= len(lines) <= 2, p.stderr
    assert lines[0].startswith("edgeopt"), p.stderr
    return p.stderr


def _fleet(root: Path, names: tuple[str, ...] = ("sim-1", "sim-2")) -> Path:
    (root / "fleet.yaml").write_text("devices:\n" + "".join(
        f"  {n}: {{transport: local, root: {root / 'roots' / n}, target: cpu}}\n" for n in names))
    return root / "fleet.yaml"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """dist/ with the classifier for cpu fp32, an empty folder, and a fleet of two simulated cpu devices."""
    root = tmp_path_factory.mktemp("leftovers")
    rep = edgeopt.build(fixture("ocr-cls"), "cpu", precision="fp32", shape="x:1x3x48x192", dist=root / "dist",
                        val_count=4, calib_count=4)
    assert rep.ok, rep.results
    (root / "empty").mkdir()
    _fleet(root)
    return root


def test_rollback_of_a_model_no_device_has_is_bad_input_naming_the_models_there(world, tmp_path):
    fleet = _fleet(tmp_path)
    p = _edgeopt("push", "--dist", str(world / "dist"), "--devices", str(fleet), "--activate", "-q", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    p = _edgeopt("rollback", "--devices", str(fleet), "--model", "nosuchmodel", cwd=tmp_path)
    err = _one_error(p, 2)  # was exit 4 with "sim-1: failed: sim-1: rollback failed: ..." per device
    assert "nosuchmodel" in err and MODEL in err, err
    # a model the devices have but with no previous bundle: exit 4, each device named once on its line
    p = _edgeopt("rollback", "--devices", str(fleet), "--model", MODEL, "-q", cwd=tmp_path)
    assert p.returncode == 4, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["sim-1", "sim-2"], p.stdout
    assert all(ln.count("sim-") == 1 and "no previous version" in ln for ln in lines), p.stdout
    p = _edgeopt("rollback", "--devices", str(fleet), "--model", MODEL, "--json", "-v", cwd=tmp_path)
    doc = json.loads(p.stdout)
    assert p.returncode == 4 and doc["kind"] == "rollback" and not doc["ok"], p.stdout
    assert [d["status"] for d in doc["items"]] == ["failed", "failed"]


def test_api_rollback_raises_usage_error_for_a_model_nobody_has(world, tmp_path):
    fleet = _fleet(tmp_path, ("only",))
    edgeopt.push(dist=world / "dist", devices=fleet, activate=True)
    with pytest.raises(edgeopt.UsageError, match=MODEL):
        edgeopt.rollback(fleet, model="nosuchmodel")
    res = edgeopt.rollback(fleet, model=MODEL, raise_on_failure=False)
    assert isinstance(res, edgeopt.RollbackResult) and not res.ok and res.devices[0].status == "failed"


def test_reasons_are_cut_at_a_word_in_rollout_summaries_and_status(world, tmp_path):
    """A health check whose output is long: the summary line and `rollout status` end on a whole word and an
    ellipsis, never mid-word."""
    words = "alpha beta gamma delta epsilon "
    cmd = [sys.executable, "-c", f"import sys; print({words!r} * 40); sys.exit(1)"]
    (tmp_path / "fleet.yaml").write_text(
        f"devices:\n  sim-h: {{transport: local, root: {tmp_path / 'r'}, target: cpu, health_cmd: {json.dumps(cmd)}}}\n")
    p = _edgeopt("rollout", str(world / "dist"), "--devices", "fleet.yaml", "--waves", "100%", "--no-latency-gate",
                 "-q", cwd=tmp_path)
    assert p.returncode == 5, p.stdout + p.stderr
    rid = p.stdout.split()[1]
    st = _edgeopt("rollout", "status", rid, "-v", cwd=tmp_path)
    assert st.returncode == 0, st.stderr
    vocab = set(words.split())
    for out in (p.stdout, st.stdout):
        line = next(ln for ln in out.splitlines() if "sim-h:" in ln and "alpha" in ln)
        assert line.endswith("…"), line
        tail = line.rstrip("…").split("alpha", 1)[1]
        assert all(w.strip("|") in vocab for w in ("alpha" + tail).split() if w != "|"), line


def test_bench_on_an_empty_dist_names_dist_and_that_folder(world):
    p = _edgeopt("bench", "--dist", str(world / "empty"), cwd=world)
    err = _one_error(p, 2)
    assert "--dist" in err and "empty" in err and "--batch" not in err and "'dist'" not in err, err
    p = _edgeopt("push", "--dist", str(world / "empty"), cwd=world)
    assert "no bundle under --dist" in _one_error(p, 2)
    assert not (world / "edgeopt-results.db").exists()


def test_limit_names_each_device_once_and_only_those_of_the_file(world):
    err = _one_error(_edgeopt("bench", "--dist", str(world / "dist"), "--limit", "nosuch", cwd=world), 2)
    assert err.count("'local'") == 1 and "local, local" not in err, err
    err = _one_error(_edgeopt("bench", "--dist", str(world / "dist"), "--devices", "fleet.yaml", "--limit", "nosuch",
                              cwd=world), 2)
    assert "sim-1, sim-2" in err and "sim-1, sim-2, local" not in err and "always there" in err, err


def test_rollout_of_a_missing_folder_does_not_name_dist(world):
    err = _one_error(_edgeopt("rollout", "missing", "--devices", "fleet.yaml", cwd=world), 2)
    assert "'missing' does not exist" in err and "--dist" not in err, err


def test_report_json_with_another_format_is_refused(world):
    p = _edgeopt("report", "--json", "--format", "md", cwd=world)
    err = _one_error(p, 2)
    assert "--json" in err and "--format md" in err, err
    assert json.loads(p.stdout)["exit_code"] == 2  # --json: the error object on stdout


def test_fixtures_help_and_a_typo(tmp_path):
    p = subprocess.run([sys.executable, "-m", "edgeopt.fixtures", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and "usage: python -m edgeopt.fixtures" in p.stdout and "ocr-lines" in p.stdout, p
    p = subprocess.run([sys.executable, "-m", "edgeopt.fixtures", "ocr-cl"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and "did you mean 'ocr-cls'" in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("argv", [["rollback", "--devices", "fleet.yaml", "--model", "x"],
                                  ["fleet", "status", "--devices", "fleet.yaml"],
                                  ["rollout", "list"], ["rollout", "status", "nope"],
                                  ["rollout", "resume", "nope"]])
def test_verbose_and_quiet_are_taken_by_every_fleet_command(world, tmp_path, argv):
    _fleet(tmp_path)
    for flag in ("-v", "-q"):
        p = _edgeopt(*argv, flag, "--db", str(tmp_path / "j.db"), cwd=tmp_path) if argv[0] == "rollout" else \
            _edgeopt(*argv, flag, cwd=tmp_path)
        assert "No such option" not in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_push_prints_sizes_for_people(world, tmp_path):
    p = _edgeopt("push", "--dist", str(world / "dist"), "--devices", str(_fleet(tmp_path, ("one",))), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    from edgeopt.deploy import load_bundle

    bid = load_bundle(world / "dist" / MODEL / "cpu-fp32").bundle_id
    shown = p.stdout.replace(bid[:12], "")  # a hex bundle id can be all digits (this one once was)
    assert re.search(r"\b\d+\.\d (kB|MB)\b", shown) and not re.search(r"\b\d{6,}\b", shown), p.stdout


def test_every_exit_code_lives_in_errors():
    """No module defines an EXIT_* number of its own, and the CLI returns 130 by its name."""
    import edgeopt.errors as errors

    src = Path(errors.__file__).parent
    pkgs = [src, src.parent / "hil", src.parent / "targets"]
    for f in (p for d in pkgs for p in d.rglob("*.py")):
        if f.name == "errors.py" and f.parent == src:
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                    isinstance(node.value.value, int):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                assert not any(n.startswith("EXIT_") for n in names), f"{f}: {names} (define it in errors.py)"
    assert errors.EXIT_INTERRUPTED == 130
    cli = (src / "cli.py").read_text()
    assert not re.search(r"return 130\b|_json_error\(130", cli)


def test_run_report_to_a_path_that_cannot_be_written_is_refused_before_the_build(tmp_path):
    for bad in ("/proc/edgeopt-report.html", str(tmp_path)):
        p = _edgeopt("run", str(fixture("ocr-cls")), "-t", "cpu", "--shape", "x:1x3x48x192", "--report", bad,
                     cwd=tmp_path)
        assert "report" in _one_error(p, 2)
        assert not (tmp_path / "dist").exists() and not (tmp_path / "edgeopt-results.db").exists()


def test_rollout_of_a_model_folder_with_two_bundles_for_one_target_names_the_commands(world, tmp_path):
    """The README's `build -p fp32,int8` then `rollout dist/m`: two bundles for cpu; the refusal gives the
    commands that ship either (it used to say only "give one per target")."""
    other = edgeopt.build(fixture("ocr-cls"), "cpu", precision="fp32", shape="x:1x3x48x192", dist=tmp_path / "d2",
                          val_count=3, calib_count=4)  # another manifest: another bundle id
    assert other.ok, other.results
    b1 = world / "dist" / MODEL / "cpu-fp32"
    b2 = tmp_path / "d2" / MODEL / "cpu-fp32"
    p = _edgeopt("rollout", str(b1), str(b2), "--devices", str(world / "fleet.yaml"), "--dry-run", cwd=tmp_path)
    err = _one_error(p, 2)
    assert "two bundles for target 'cpu'" in err and "hint: name the one to ship: edgeopt rollout" in err, err
    assert err.count("edgeopt rollout ") == 2 and "--devices FILE" in err, err
