"""Every command teaches: --help exits 0 with defaults and an examples section; completion works."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from edgeopt.cli import COMMANDS, _load, main


@pytest.mark.parametrize("name", [n for n in COMMANDS if _load(n) is not None])
def test_every_command_has_help_with_examples(name, capsys):
    assert main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert "examples:" in out and f"edgeopt {name}" in out.split("examples:", 1)[1]


def test_verbosity_flags_go_before_or_after_the_command(capsys):
    assert main(["-q", "targets", "--json"]) == 0
    assert main(["targets", "-q", "-v", "--json"]) == 0


def test_no_command_exits_2_with_the_help(capsys):
    assert main([]) == 2
    assert "Commands:" in capsys.readouterr().out


def test_bash_completion_lists_commands_and_options():
    env = {**os.environ, "_EDGEOPT_COMPLETE": "bash_complete", "COMP_WORDS": "edgeopt bu", "COMP_CWORD": "1"}
    out = subprocess.run([sys.executable, "-c", "from edgeopt.cli import cli; cli(prog_name='edgeopt')"],
                         env=env, capture_output=True, text=True, timeout=60).stdout
    assert "build" in out
    env.update(COMP_WORDS="edgeopt bench --tar", COMP_CWORD="2")
    out = subprocess.run([sys.executable, "-c", "from edgeopt.cli import cli; cli(prog_name='edgeopt')"],
                         env=env, capture_output=True, text=True, timeout=60).stdout
    assert "--targets" in out
