"""The ``edgeopt`` command line (click): a thin skin over the API.  ``main(argv) -> exit code``.

Each command lives in ``edgeopt.commands.<module>`` and exposes ``command`` (a click command or
group). Modules are imported only when their command runs (or ``--help`` lists them), and import
nothing heavy at module level, so ``--help`` is fast and works without any backend installed.
"""

from __future__ import annotations

import difflib
import importlib
import logging
import sys
from collections.abc import Iterator

import click

from edgeopt import __version__
from edgeopt.commands._common import CONTEXT, examples
from edgeopt.errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_USAGE, EdgeoptError

# command name -> module, in the order of --help
COMMANDS = {
    "inspect": "inspect", "build": "build", "targets": "targets", "export": "export", "push": "push",
    "bench": "bench", "report": "report", "run": "run", "devices": "devices", "cache": "cache",
    "gate": "gate", "rig": "rig", "baseline": "baseline", "history": "history", "rollout": "rollout",
    "rollback": "rollback", "fleet": "fleet", "tune": "tune", "ocr-check": "ocr", "debug": "debug",
    "results": "results", "worker": "worker", "cluster": "cluster",
}
EPILOG = examples("""\
examples:
  edgeopt inspect model.onnx
  edgeopt build model.onnx --targets jetson,h100,cpu --precision auto
  edgeopt build model.onnx --targets cpu,intel-cpu --precision fp32,int8 --calib images/ --shape x:1x3x224x224
  edgeopt run model.onnx --targets cpu --devices local --report report.html
  edgeopt gate dist/new/m/cpu-fp32 --baseline dist/old/m/cpu-fp32 --devices rig.yaml

exit codes: 0 ok, 1 internal error, 2 bad input (model, flag, data; nothing written), 3 a target
failed to build or its check failed, 4 a device was unreachable or failed, 5 ran fine but the goal
was not met (a gate regressed, tune's SLO or find-max-qps' bound unmet, a rollout halted by its
gate), 6 inconclusive (a gate could not decide), 130 interrupted. With --json an error is one
object on stdout: {"schema": "edgeopt/v1", "kind": "error", "exit_code": N, "message": ..., "hint": ...}.

shell completion (bash; zsh and fish alike):
  eval "$(_EDGEOPT_COMPLETE=bash_source edgeopt)"
""")


def _load(name: str) -> click.Command | None:
    module = COMMANDS.get(name)
    if module is None:
        return None
    try:
        mod = importlib.import_module(f"edgeopt.commands.{module}")
    except ModuleNotFoundError as exc:
        if exc.name == f"edgeopt.commands.{module}":
            return None  # not present in this build
        raise
    return getattr(mod, "command", None)


def walk_commands() -> Iterator[tuple[list[str], click.Command]]:
    """Every command and subcommand the CLI has, as (``["rollout", "status"]``, command): each loaded; a group
    that runs on its own (``edgeopt devices --devices FILE``) is listed too.  The flag table, the API walk
    test and the one-name-per-concept test read the CLI through it."""
    def walk(cmd: click.Command, path: list[str]) -> Iterator[tuple[list[str], click.Command]]:
        if isinstance(cmd, click.Group):
            if cmd.invoke_without_command:
                yield path, cmd
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield path, cmd

    for name in COMMANDS:
        if (cmd := _load(name)) is not None:
            yield from walk(cmd, [name])


class LazyGroup(click.Group):
    """Commands imported on use; an unknown command suggests the closest."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [n for n in COMMANDS if _load(n) is not None]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        return _load(name)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0]
        if self.get_command(ctx, name) is None and not name.startswith("-"):
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=2, cutoff=0.6)
            hint = f" Did you mean {' or '.join(close)}?" if close else ""
            raise click.UsageError(f"no such command {name!r}.{hint}", ctx)
        return super().resolve_command(ctx, args)


@click.group("edgeopt", cls=LazyGroup, context_settings=CONTEXT, epilog=EPILOG, invoke_without_command=True)
@click.version_option(__version__, "--version", prog_name="edgeopt", message="%(prog)s %(version)s")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging (also accepted after the command).")
@click.option("-q", "--quiet", is_flag=True, help="No progress lines (also accepted after the command).")
@click.pass_context
def cli(ctx: click.Context, verbose: bool, quiet: bool) -> int | None:
    """Compile one ONNX model for every target (ONNX Runtime, OpenVINO, TFLite, Core ML, TensorRT),
    prove each artifact faithful, measure it on the real devices, gate regressions on rigs and roll
    it out to fleets."""
    from edgeopt.commands._common import set_verbose

    ctx.obj = {"verbose": verbose, "quiet": quiet}
    set_verbose(verbose)
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())  # the commands on stdout, and on stderr the one line a missing command gets
        click.echo("edgeopt: error: no command given (the commands are listed above; `edgeopt COMMAND --help`)",
                   err=True)
        return EXIT_USAGE
    return None


def _sigterm_as_interrupt() -> None:
    """SIGTERM (`timeout`, a CI cancel, `kill PID`) ends a run like Ctrl-C: workers stopped, work
    folders removed, exit 130."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _usage_line(exc: click.UsageError) -> str:
    cmd = exc.ctx.command_path if exc.ctx is not None else "edgeopt"
    return f"{cmd}: error: {exc.format_message()} (see `{cmd} --help`)"


def _wants_json(argv: list[str]) -> bool:
    """``--json`` (or ``--format json``) among the command's options: errors go to stdout as one object."""
    for i, a in enumerate(argv):
        if a == "--":
            break
        if a == "--json" or a in ("--format=json", "-fjson") or (a in ("--format", "-f") and argv[i + 1:i + 2] == ["json"]):
            return True
    return False


def _json_error(exit_code: int, message: str, hint: str | None = None, error: str = "UsageError") -> None:
    """The error object of conventions.md on stdout (one line), for scripts that parse ``--json``."""
    from edgeopt.jsonsafe import dumps

    try:
        sys.stdout.write(dumps({"schema": "edgeopt/v1", "kind": "error", "exit_code": exit_code, "error": error,
                                "message": message, "hint": hint}, default=str) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # the reader left or stdout is closed: stderr has the line
        pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not any(a in ("-v", "--verbose") for a in argv):
        # paramiko logs its own tracebacks; our one-line message says what happened
        logging.getLogger("paramiko").setLevel(logging.CRITICAL + 1)
    _sigterm_as_interrupt()
    as_json = _wants_json(argv)
    try:
        rv = cli.main(args=argv, prog_name="edgeopt", standalone_mode=False)
        return int(rv or 0)
    except click.exceptions.Exit as exc:  # --help, --version
        return int(exc.exit_code or 0)
    except click.exceptions.UsageError as exc:
        print(_usage_line(exc), file=sys.stderr)
        if as_json:
            _json_error(EXIT_USAGE, exc.format_message(), f"see `{exc.ctx.command_path if exc.ctx else 'edgeopt'} --help`")
        return EXIT_USAGE
    except click.exceptions.Abort:
        print("edgeopt: interrupted", file=sys.stderr)
        if as_json:
            _json_error(EXIT_INTERRUPTED, "interrupted", "the run was stopped (Ctrl-C or SIGTERM); run it again", "Interrupted")
        return EXIT_INTERRUPTED
    except click.exceptions.ClickException as exc:
        print(f"edgeopt: error: {exc.format_message()}", file=sys.stderr)
        if as_json:
            _json_error(int(exc.exit_code or 1), exc.format_message(), None, type(exc).__name__)
        return int(exc.exit_code or 1)
    except EdgeoptError as exc:
        from edgeopt.errors import user_text

        print(f"edgeopt: error: {user_text(str(exc))}", file=sys.stderr)
        if as_json:
            _json_error(exc.exit_code, user_text(exc.message), exc.hint, type(exc).__name__)
        return exc.exit_code
    except BrokenPipeError:  # `edgeopt inspect m.onnx | head`: the reader left; not an error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("edgeopt: interrupted", file=sys.stderr)
        if as_json:  # a script parsing --json gets its one error object on a stop too (SIGTERM, Ctrl-C)
            _json_error(EXIT_INTERRUPTED, "interrupted", "the run was stopped (Ctrl-C or SIGTERM); run it again", "Interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:
        import traceback

        traceback.print_exc()
        print("edgeopt: internal error (the traceback above is a bug; please report it)", file=sys.stderr)
        if as_json:
            _json_error(EXIT_INTERNAL, f"internal error: {type(exc).__name__}: {exc}",
                        "the traceback on stderr is a bug; please report it", "InternalError")
        return EXIT_INTERNAL


def entry() -> None:
    code = main()
    if code == EXIT_INTERRUPTED:
        import threading

        if any(t.is_alive() and t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
            # Ctrl-C left worker threads blocked on a device (a frozen upload): everything to keep is written
            # and said; finalizing the interpreter under them crashed (SIGSEGV at exit after `bench`'s summary)
            import os

            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
