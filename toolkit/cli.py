"""The ``edgeopt`` command line: a thin skin over the API.  ``main(argv) -> exit code``.

Each command lives in ``edgeopt.commands.<name>`` with ``add_parser(subparsers)`` and
``run(args) -> int``; modules there import nothing heavy at module level, so ``--help`` is fast
and works without any backend installed.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from edgeopt import __version__
from edgeopt.errors import EXIT_INTERNAL, EdgeoptError

# Order is the order in --help.
COMMANDS = ["inspect", "build", "targets", "export", "push", "bench", "report", "run", "devices", "ocr"]
# Commands written on click (the CLI's move from argparse): each module exposes ``command``.
CLICK_COMMANDS = ["gate", "rig", "baseline", "history", "rollout", "rollback", "fleet", "cache", "tune"]


def _click_command(name: str):
    try:
        mod = importlib.import_module(f"edgeopt.commands.{name}")
    except ModuleNotFoundError as exc:
        if exc.name == f"edgeopt.commands.{name}":
            return None  # not present in this build
        raise
    return getattr(mod, "command", None)

EPILOG = """\
examples:
  edgeopt inspect model.onnx
  edgeopt build model.onnx --targets jetson,h100,cpu --precision auto
  edgeopt build model.onnx --targets cpu,intel-cpu --precision fp32,int8 --calib images/ --shape x:1x3x224x224
  edgeopt run model.onnx --targets cpu --devices local

exit codes: 0 ok, 1 internal error, 2 bad input (model, flag, data), 3 a target failed to build or
its check failed, 4 a device was unreachable or failed, 5 a regression gate tripped.
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="edgeopt",
        description="Compile one ONNX model for every target (ONNX Runtime, OpenVINO, TFLite, Core ML, "
                    "TensorRT), prove each artifact faithful, and measure it on the real devices.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"edgeopt {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"edgeopt.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"edgeopt.commands.{name}":
                continue  # command not present in this build
            raise
        mod.add_parser(sub)
    for name in CLICK_COMMANDS:
        cmd = _click_command(name)
        if cmd is not None:
            sub.add_parser(name, help=cmd.get_short_help_str(limit=90), add_help=False)
    return p


def _run_click(cmd, args: list[str]) -> int:
    import click

    try:
        rv = cmd.main(args=args, prog_name=f"edgeopt {cmd.name}", standalone_mode=False)
    except click.exceptions.Exit as exc:  # --help
        return int(exc.exit_code or 0)
    except click.exceptions.Abort:
        raise KeyboardInterrupt from None
    except click.exceptions.ClickException as exc:
        exc.show()
        return 2 if isinstance(exc, click.exceptions.UsageError) else int(exc.exit_code or 1)
    return int(rv or 0)


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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    first = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    click_cmd = _click_command(argv[first]) if first is not None and argv[first] in CLICK_COMMANDS else None
    if click_cmd is None:
        parser = _parser()
        args = parser.parse_args(argv)
        verbose = args.verbose
    else:
        verbose = any(a in ("-v", "--verbose") for a in argv[:first])
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if not verbose:  # paramiko logs its own tracebacks; our one-line message says what happened
        logging.getLogger("paramiko").setLevel(logging.CRITICAL + 1)
    _sigterm_as_interrupt()
    if click_cmd is None and not args.command:
        parser.print_help()
        return 2
    try:
        if click_cmd is not None:
            return _run_click(click_cmd, argv[first + 1:])
        return int(args.func(args) or 0)
    except EdgeoptError as exc:
        print(f"edgeopt: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:  # `edgeopt inspect m.onnx | head`: the reader left; not an error of ours
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("edgeopt: interrupted", file=sys.stderr)
        return 130
    except Exception:
        import traceback

        traceback.print_exc()
        print("edgeopt: internal error (the traceback above is a bug; please report it)", file=sys.stderr)
        return EXIT_INTERNAL


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
