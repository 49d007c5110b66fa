"""One exception tree, mapped to exit codes in one place (``edgeopt.cli``).

User errors (bad model, bad flag, unknown target, unreachable device) print one clear
message and no traceback.  Anything else is an internal error and keeps its traceback.
"""

from __future__ import annotations

from typing import Any

# Exit codes: what each one means is part of the CLI's contract (README, --help).
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2  # bad input: model, flag, config, calibration data
EXIT_BUILD_FAILED = 3  # a target failed to build or its host check failed
EXIT_DEVICE_FAILED = 4  # a device was unreachable or a run on it failed
EXIT_GOAL_NOT_MET = 5  # ran fine, goal not met: gate regressed, SLO unmet, max-QPS bound unmet, rollout halted
EXIT_GATE_FAILED = EXIT_GOAL_NOT_MET  # the old name, kept as an alias
EXIT_INCONCLUSIVE = 6  # ran fine, but the evidence could not decide (e.g. a gate ended inconclusive)
EXIT_INTERRUPTED = 130  # stopped by Ctrl-C or SIGTERM (128 + SIGINT, the shell's convention)


class EdgeoptError(Exception):
    """A user-facing error: one message, an optional hint, no traceback."""

    exit_code = EXIT_USAGE
    #: the typed result of the run that failed (``edgeopt.build``'s BuildReport, ``bench``'s BenchResult ...),
    #: when the error ends a run that produced one; None otherwise
    result: Any = None

    def __init__(self, message: str, hint: str | None = None, result: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        if result is not None:
            self.result = result

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"

    def as_dict(self) -> dict[str, Any]:
        """The error as ``--json`` prints it: ``{"schema", "kind": "error", "exit_code", "message", "hint"}``."""
        return {"schema": "edgeopt/v1", "kind": "error", "exit_code": self.exit_code, "error": type(self).__name__,
                "message": self.message, "hint": self.hint}


class ModelError(EdgeoptError):
    """The model file is missing, not ONNX, truncated or invalid."""


class UsageError(EdgeoptError):
    """A flag, target name, precision, shape or config value is wrong."""


class CalibrationError(EdgeoptError):
    """Calibration data is missing, unreadable or does not match the model's inputs."""


class MissingDependency(EdgeoptError):
    """A backend's packages are not installed; the hint names the pip command."""


class UnsupportedOps(EdgeoptError):
    """Some nodes of the model cannot be handled by a target. Lists all of them."""

    def __init__(self, target: str, nodes: list[tuple[str, str]], why: str | None = None) -> None:
        """``why``: what refuses them (e.g. "refused by TensorRT 10.15's ONNX parser"), when known."""
        lines = [f"  {op} (node {name!r})" for op, name in nodes]
        super().__init__(
            f"target {target!r} cannot take {len(nodes)} node(s) of this model"
            + (f" ({why})" if why else "") + ":\n" + "\n".join(lines),
            hint="drop the target, or run `edgeopt inspect MODEL` for the full support matrix",
        )
        self.target = target
        self.nodes = nodes


class BuildFailed(EdgeoptError):
    """One or more targets failed to build or failed their host check."""

    exit_code = EXIT_BUILD_FAILED


class DeviceError(EdgeoptError):
    """A device could not be reached, refused us, or failed a run."""

    exit_code = EXIT_DEVICE_FAILED


class HostKeyError(DeviceError):
    """A host key is unknown (and trust-on-first-use was not asked for) or has changed."""


class GoalNotMet(EdgeoptError):
    """The run went fine but its goal was not met (an SLO, a max-QPS bound, a gate). Exit 5."""

    exit_code = EXIT_GOAL_NOT_MET


class GateFailed(GoalNotMet):
    """A regression gate tripped. Exit 5."""

    exit_code = EXIT_GATE_FAILED


class RolloutHalted(GoalNotMet):
    """A rollout halted: a device's gate or check failed beyond ``--max-fail``. Exit 5."""


class Inconclusive(EdgeoptError):
    """The run went fine but the evidence could not decide (a gate inconclusive, a rollout paused on an
    inconclusive verdict). Exit 6."""

    exit_code = EXIT_INCONCLUSIVE


def yaml_error(exc: Exception, src: str) -> str:
    """PyYAML's error as one line that keeps where it is: ``FILE:LINE:COL: not valid YAML: problem``."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    where = f"{src}:{mark.line + 1}:{mark.column + 1}" if mark is not None else src
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def user_text(text: str) -> str:
    """A runtime's message made fit for a user-facing line: a C++ source location and function signature
    (ONNX Runtime's ``/onnxruntime_src/...cc:181 onnxruntime::Model::Model(...)``) dropped, edgeopt's
    temporary work folders (``/tmp/.edgeopt-work-XXXX/prepared.onnx``) reduced to the file name."""
    import re

    out = text
    while True:
        m = re.search(r"/\S*?onnxruntime_src/\S+:\d+\s+", out)
        if not m:
            break
        start, i = m.start(), m.end()
        paren = out.find("(", i)
        if paren < 0 or paren - i > 300:  # no signature follows: drop the location only
            out = out[:start] + out[i:]
            continue
        depth, j = 0, paren
        while j < len(out):
            depth += {"(": 1, ")": -1}.get(out[j], 0)
            if depth == 0:
                break
            j += 1
        out = out[:start].rstrip(" ") + " " + out[j + 1:].lstrip()
    out = re.sub(r"(?:/[^\s'\"/]+)*/\.?edgeopt-work[^\s'\"/]*/((?:[^\s'\"/]+/)*[^\s'\"/]+)", r"\1", out)
    return out
