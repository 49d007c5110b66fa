"""One name per concept (issue 40): ``--out`` is only a bundle folder (build, run, bench, push, debug). A file
written by ``report``, ``history`` and ``baseline export`` is ``-o/--output FILE``; the model repository of
``export triton`` is ``--repository DIR`` (its triton case is in tests/targets/test_tensorrt.py, which has the
bundle). The old ``--out`` still works for one release with one note on stderr; the API's old ``out=`` with a
DeprecationWarning. A real SQLite results database with bench records as ``edgeopt bench`` stores them."""

from __future__ import annotations

import json

import click
import pytest

import edgeopt
from edgeopt.cli import main, walk_commands
from edgeopt.results import ResultsDB
from tests.results.conftest import record

BUNDLE_COMMANDS = {"build", "run", "bench", "push", "debug"}


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    from edgeopt.hil.baseline import save

    path = str(tmp_path_factory.mktemp("outname") / "r.db")
    with ResultsDB(path) as rdb:
        for i in range(6):
            rdb.add(record(i, run_id=f"run-{i}", p50=2.0 + 0.01 * i))
    save("main", "latest", path)
    return path


def _note(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if "is now --" in ln]


@pytest.mark.parametrize("argv, new", [
    (["report", "--format", "csv"], "--output"),
    (["history", "cls", "--format", "json", "-q"], "--output"),
    (["baseline", "export", "main"], "--output"),
])
def test_a_file_is_output_and_the_old_out_still_writes_it_with_one_note(db, tmp_path, capsys, argv, new):
    outs = {}
    for flag in (new, "-o", "--out"):
        f = tmp_path / f"{flag.strip('-')}.txt"
        assert main([*argv, "--db", db, flag, str(f)]) == 0, capsys.readouterr().err
        err = capsys.readouterr().err
        outs[flag] = f.read_text()
        if flag == "--out":
            assert _note(err) == [f"edgeopt: note: --out is now {new} (one name per concept); --out goes in a "
                                  "later release"], err
        else:
            assert not _note(err), err
    assert outs["--out"] and outs["--out"] == outs[new] == outs["-o"]
    bad = ["--db", db, "--out", str(tmp_path)]  # a folder: the message names the flag of the concept
    assert main([*argv, *bad]) == 2
    err = capsys.readouterr().err
    assert f"{new} {str(tmp_path)!r} is a folder" in err and "Traceback" not in err


def test_the_api_keywords_follow_the_flags_and_out_still_works_with_a_warning(db, tmp_path):
    text = edgeopt.report(db=db, format="csv", output=tmp_path / "new.csv")
    with pytest.warns(DeprecationWarning, match=r"report\(out=\) is now output="):
        old = edgeopt.report(db=db, format="csv", out=str(tmp_path / "old.csv"))
    assert text == old == (tmp_path / "new.csv").read_text() == (tmp_path / "old.csv").read_text()
    edgeopt.baseline_export("main", db=db, output=tmp_path / "b.json")
    with pytest.warns(DeprecationWarning, match=r"baseline_export\(out=\) is now output="):
        edgeopt.baseline_export("main", db=db, out=tmp_path / "b-old.json")
    assert json.loads((tmp_path / "b.json").read_text()) == json.loads((tmp_path / "b-old.json").read_text())
    with pytest.raises(edgeopt.UsageError, match="both 'output' and its old name 'out'"):
        edgeopt.report(db=db, output="a.csv", out="b.csv")
    with pytest.raises(edgeopt.UsageError, match="--output '.*' is a folder"):
        edgeopt.report(db=db, output=tmp_path)
    with pytest.raises(edgeopt.UsageError, match="--repository '.*' is a file"):
        edgeopt.export("triton", tmp_path, repository=tmp_path / "b.json")
    with pytest.warns(DeprecationWarning, match=r"export\(out=\) is now repository="), \
            pytest.raises(edgeopt.UsageError, match="no manifest.json"):
        edgeopt.export("triton", tmp_path, out=tmp_path / "repo")




def test_out_is_a_bundle_folder_and_nothing_else():
    """Every visible ``--out`` is the bundle folder (DIR) of a bundle command; a hidden one is an old spelling
    whose help is the note; no file or repository flag is called ``--out``."""
    seen = set()
    for path, cmd in walk_commands():
        for p in cmd.params:
            if not isinstance(p, click.Option) or "--out" not in p.opts:
                continue
            where = " ".join(path)
            if p.hidden:
                assert where in {"report", "history", "baseline export", "export"}, where
                continue
            seen.add(where)
            assert p.metavar == "DIR" and "--dist" in p.opts, (where, p.opts, p.metavar)
    assert seen == BUNDLE_COMMANDS
    for argv, flag in ((["report"], "--output"), (["history"], "--output"), (["baseline", "export"], "--output"),
                       (["export"], "--repository")):
        text = _help(argv)
        assert flag in text and "--out " not in text and "--out," not in text, (argv, text)


def _help(argv: list[str]) -> str:
    from click.testing import CliRunner

    from edgeopt.cli import cli

    return CliRunner().invoke(cli, [*argv, "--help"]).output
