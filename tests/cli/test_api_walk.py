"""Every CLI command has a function in ``edgeopt`` and every flag a keyword of the same name (issue 40).

The walk goes over the click objects themselves (``edgeopt.cli.COMMANDS`` -> ``edgeopt.commands.<module>.command``,
groups recursed, a group that runs on its own counted as a command): ``edgeopt rollout list`` must be
``edgeopt.rollout_list``, its ``--last`` a keyword ``last=``. A function's keywords are what it takes, with
those its ``**kw`` passes on (``_api``'s ``keywords()``). What is deliberately CLI-only is listed below, each
with why; a new command or flag fails this test until it has its keyword or its line here.
"""

from __future__ import annotations

import inspect

import click
import pytest

import edgeopt
from edgeopt.cli import walk_commands

# A command path whose function has another name than its words joined by "_".
FUNCTION = {
    "targets": "list_targets",  # `edgeopt targets`: edgeopt.targets is the targets package
    "rollout start": "rollout",  # start is the default subcommand: `edgeopt rollout DIST`
    "devices gc": "gc",
    "debug": "debug_layers",  # edgeopt.debug is the module that does it (toolkit/debug.py)
    "worker": "start_worker",  # edgeopt.worker is the module a build job runs in (python -m edgeopt.worker)
}

# A flag that switches the command to another result: its own function (same keywords otherwise).
FLAG_FUNCTION = {("bench", "find_max_qps"): "find_max_qps"}

# A flag spelled as a Python keyword cannot be one: its keyword.
PY_KEYWORD = {"from": "source"}  # baseline save --from RUN: baseline_save(name, source)

# Flags every command may have that the API expresses otherwise: ``--json`` (a function returns the object the
# JSON is made of), ``-v/-q`` (logging is the caller's; progress=callable, silent by default).
OUTPUT_FLAGS = {"json", "verbose", "quiet"}

# Deliberately CLI-only, with why.
CLI_ONLY: dict[str, str | set[str]] = {
    # flags of commands that have a function
    "history": {"format", "output"},  # the API returns the series (hil.history.Series); rendering is the CLI's
    "debug": {"all"},  # "list fused/unobserved nodes in the table too": the result holds every node
}




def _flags(cmd: click.Command) -> list[str]:
    """Each visible parameter by its keyword name: the long flag with '-' as '_', or the argument's name."""
    out = []
    for p in cmd.params:
        if isinstance(p, click.Option):
            if p.hidden:  # an old spelling kept for scripts (--gate-budget, --engine of rollout ...)
                continue
            long = [o for o in p.opts if o.startswith("--")]
            out.append(long[0][2:].replace("-", "_") if long else p.name)
        else:
            out.append(p.name)
    return out


def _keywords(fn) -> set[str] | None:
    if hasattr(fn, "keywords"):
        return fn.keywords()
    return {n for n, p in inspect.signature(fn).parameters.items() if p.kind != p.VAR_POSITIONAL}


COMMAND_PATHS = [(" ".join(path), cmd) for path, cmd in walk_commands()]


@pytest.mark.parametrize("path, cmd", COMMAND_PATHS, ids=[p for p, _ in COMMAND_PATHS])
def test_every_command_has_a_function_and_every_flag_a_keyword(path, cmd):
    only = CLI_ONLY.get(path)
    if isinstance(only, str):
        assert only, path
        return
    name = FUNCTION.get(path, path.replace("-", "_").replace(" ", "_"))
    fn = getattr(edgeopt, name, None)
    assert callable(fn), f"`edgeopt {path}` has no function edgeopt.{name} (toolkit/api.py, toolkit/__init__.py)"
    assert name in edgeopt.__all__ and name in dir(edgeopt)
    kws = _keywords(fn)
    assert kws is not None, f"edgeopt.{name} takes any keyword (**kw with no list): give _api(extra=...)"
    missing = []
    for flag in _flags(cmd):
        if flag in OUTPUT_FLAGS or flag in (only or set()):
            continue
        if (path, flag) in FLAG_FUNCTION:
            other = getattr(edgeopt, FLAG_FUNCTION[path, flag], None)
            assert callable(other), f"`edgeopt {path} --{flag}` has no function {FLAG_FUNCTION[path, flag]}"
            continue
        if PY_KEYWORD.get(flag, flag) not in kws:
            missing.append(flag)
    assert not missing, (f"`edgeopt {path}`: flags with no keyword of the same name in edgeopt.{name}: "
                         + ", ".join(f"--{m.replace('_', '-')}" for m in missing))


def test_the_allow_list_names_only_what_exists():
    paths = {p for p, _ in COMMAND_PATHS}
    assert set(CLI_ONLY) <= paths | set(FUNCTION), set(CLI_ONLY) - paths
    assert set(FUNCTION) <= paths


@pytest.mark.parametrize("name", [n for n in edgeopt.API if n[0].islower()])
def test_every_api_function_says_what_it_does_with_an_example(name):
    """help(edgeopt.X) starts with what it does and holds one call of it."""
    fn = getattr(edgeopt, name)
    doc = inspect.getdoc(fn) or ""
    assert doc, name
    assert f"{name}(" in doc, f"edgeopt.{name}'s docstring has no example call"
