"""``--out``/``--dist`` is a bundle folder only, and every output path is checked before any work (issue 40
item 3): a folder named like a report file, or an existing file, is refused in one line (exit 2) with
nothing built or written; ``gate --junit/--md/--raw`` that cannot be written are refused before the gate
measures anything."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import edgeopt
from edgeopt.errors import UsageError
from edgeopt.fixtures import path as fixture


def _edgeopt(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def _one_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in p.stderr and 1 <= len(lines) <= 2, p.stderr  # the message (+ its hint)
    return p.stderr


@pytest.mark.parametrize("cmd, flag, name", [("run", "--out", "report.html"), ("run", "-o", "summary.md"),
                                             ("build", "--dist", "bundles.json"), ("build", "--out", "x.xml"),
                                             ("debug", "--dist", "layers.csv")])
def test_a_bundle_folder_named_like_a_file_is_refused_before_any_work(tmp_path, cmd, flag, name):
    extra = ["--target", "cpu"] if cmd == "debug" else ["-t", "cpu", "--shape", "x:1x3x48x192"]
    t0 = time.monotonic()
    p = _edgeopt(cmd, str(fixture("ocr-cls")), *extra, flag, name, cwd=tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    err = _one_line(p)
    assert f"{flag if flag != '-o' else '--out'} {name!r} names a {Path(name).suffix} file, not a bundle folder" in err
    assert list(tmp_path.iterdir()) == [] and time.monotonic() - t0 < 60  # nothing made, nothing built


def test_an_existing_file_as_the_bundle_folder_is_refused(tmp_path):
    (tmp_path / "dist").write_text("not a folder")
    p = _edgeopt("build", str(fixture("ocr-cls")), "-t", "cpu", "--shape", "x:1x3x48x192", cwd=tmp_path)
    assert p.returncode == 2 and "--dist 'dist' is a file, not a bundle folder" in _one_line(p)
    assert (tmp_path / "dist").read_text() == "not a folder"
    with pytest.raises(UsageError, match="names a .html file"):
        edgeopt.build(fixture("ocr-cls"), "cpu", shape="x:1x3x48x192", dist=tmp_path / "r.html")
    with pytest.raises(UsageError, match="names a .md file"):
        edgeopt.tune(fixture("ocr-cls"), "cpu", dist=str(tmp_path / "t.md"))
    (tmp_path / "report.html").mkdir()  # an existing folder of that name is a folder: taken
    edgeopt.api.check_bundle_folder(tmp_path / "report.html")
    assert not (tmp_path / "r.html").exists()


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("outpaths")
    rep = edgeopt.build(fixture("ocr-cls"), "cpu", precision="fp32", shape={"x": [1, 3, 48, 192]},
                        calib=str(fixture("images")), preprocess="preset=pm1", dist=tmp / "dist", calib_count=4,
                        val_count=4)
    return Path(rep.results[0].bundle)


def test_gate_output_files_are_checked_before_the_gate_measures(bundle, tmp_path):
    """Was: the whole budget measured, then a traceback and exit 1 (the verdict lost, CI reads "bug").
    Now: exit 2 at once, one line, no database written, nothing measured."""
    (tmp_path / "afolder").mkdir()
    cases = [(["--junit", "no/such/dir/gate.xml"], "cannot write --junit 'no/such/dir/gate.xml': the folder "
                                                   "'no/such/dir' does not exist"),
             (["--md", "afolder"], "--md 'afolder' is a folder"),
             (["--raw", "same.json", "--md", "same.json"], "the same file as --md"),
             (["--raw", "afolder/x.json/y.json"], "does not exist")]
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        cases.append((["--junit", str(ro / "g.xml")], "permission denied"))
    for extra, msg in cases:
        t0 = time.monotonic()
        p = _edgeopt("gate", str(bundle), "--baseline", str(bundle), "--budget", "60s", "--db", "r.db", *extra,
                     cwd=tmp_path)
        assert p.returncode == 2 and msg in _one_line(p), (extra, p.stderr)
        assert time.monotonic() - t0 < 30 and not (tmp_path / "r.db").exists(), extra
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted(["afolder"] + (["ro"] if os.geteuid() else []))


def test_every_other_output_path_is_checked_before_any_work(bundle, tmp_path):
    """``debug --html`` / ``--reduce`` (was: checked after the layer comparison), ``report --output``, ``history
    --output``, ``baseline export --output`` (was: a traceback after reading the database), a ``--dist`` that cannot be
    made (was: found when the first bundle was installed): exit 2 at once, the message naming the flag, nothing
    written."""
    (tmp_path / "afolder").mkdir()
    (tmp_path / "afile").write_text("x")
    cases = [(["debug", str(bundle), "--html", "afolder"], "--html 'afolder' is a folder"),
             (["debug", str(bundle), "--html", "afile/p.html"], "cannot write the page to 'afile/p.html'"),
             (["debug", str(bundle), "--reduce", "afile"], "--reduce 'afile' is a file"),
             (["debug", str(bundle), "--reduce", "afile/sub"], "cannot write --reduce 'afile/sub'"),
             (["report", "--db", "r.db", "--output", "afolder"], "--output 'afolder' is a folder"),
             (["history", "m", "--db", "r.db", "--output", "afile/h.json"], "cannot write the history to"),
             (["baseline", "export", "main", "--db", "r.db", "--output", "afolder"], "--output 'afolder' is a folder"),
             (["build", str(fixture("ocr-cls")), "-t", "cpu", "--shape", "x:1x3x48x192", "--dist", "afile/dist"],
              "cannot write --dist 'afile/dist'")]
    for argv, msg in cases:
        p = _edgeopt(*argv, cwd=tmp_path)
        assert p.returncode == 2 and msg in _one_line(p), (argv, p.stderr)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["afile", "afolder"] and not any((tmp_path / "afolder").iterdir())
    with pytest.raises(UsageError, match="--reduce '.*afile' is a file"):
        edgeopt.debug_layers(bundle, reduce=tmp_path / "afile")
    with pytest.raises(UsageError, match="--output '.*afolder' is a folder"):
        edgeopt.baseline_export("main", db=str(tmp_path / "r.db"), output=tmp_path / "afolder")


def test_rollout_events_file_is_checked_before_anything_runs(bundle, tmp_path):
    """Was: a traceback (exit 1) from opening --events, after the plan."""
    (tmp_path / "fleet.yaml").write_text(f"devices:\n  sim: {{transport: local, root: {tmp_path / 'sim'}, target: cpu}}\n")
    p = _edgeopt("rollout", str(bundle), "--devices", "fleet.yaml", "--events", "/proc/edgeopt-events.jsonl",
                 "--db", "j.db", cwd=tmp_path)
    assert p.returncode == 2 and "cannot write the events to '/proc/edgeopt-events.jsonl' (--events)" in _one_line(p)
    assert sorted(x.name for x in tmp_path.iterdir()) == ["fleet.yaml"]  # no journal, no device store
