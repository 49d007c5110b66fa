"""A build worker: ``python -m edgeopt.worker JOB.json RESULT.json``.

Each (target, precision) converts in its own process, so a converter that crashes (a native
abort) or hangs is killed and reported without touching the others.  Progress goes to stderr as
``progress: ...`` lines that the parent relays.
"""

from __future__ import annotations

import errno
import json
import sys
import threading
import traceback
from collections.abc import Callable, Iterable

PROGRESS = "progress: "  # the prefix of a progress line on a worker's stderr


def relay(stream: Iterable[str] | None, on_progress: Callable[[str], None],
          keep: int = 20) -> tuple[threading.Thread, list[str]]:
    """Read a build worker's stderr on a started daemon thread: each ``progress: ...`` line goes to
    ``on_progress`` (less the prefix) as it comes; the last ``keep`` other lines are kept in the returned list
    (a crash's last words). The one reader of both a local build's ``Popen`` (``pipeline._build_job``) and a
    cluster worker's (``cluster.task``)."""
    tail: list[str] = []

    def read() -> None:
        for line in stream or ():
            line = line.rstrip()
            if line.startswith(PROGRESS):
                on_progress(line[len(PROGRESS):])
            elif line:
                tail.append(line)
                del tail[:-keep]

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return reader, tail


def main(argv: list[str]) -> int:
    job_path, result_path = argv
    from edgeopt.errors import EdgeoptError
    from edgeopt.targets.base import BuildJob
    from edgeopt.targets.registry import get_backend

    with open(job_path) as f:
        job = BuildJob.from_dict(json.load(f))

    def progress(msg: str) -> None:
        print(f"{PROGRESS}{msg}", file=sys.stderr, flush=True)

    try:
        manifest = get_backend(job.target["backend"]).build(job, progress)
        result = {"ok": True, "manifest": manifest}
    except EdgeoptError as exc:
        result = {"ok": False, "user_error": True, "error": str(exc)}
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            result = {"ok": False, "user_error": True, "error": f"disk full while writing the bundle ({exc.filename})"}
        else:
            result = {"ok": False, "user_error": False, "error": f"{type(exc).__name__}: {exc}",
                      "traceback": traceback.format_exc()}
    except Exception as exc:  # a converter bug: keep the traceback for the report
        result = {"ok": False, "user_error": False, "error": f"{type(exc).__name__}: {exc}",
                  "traceback": traceback.format_exc()}
    with open(result_path, "w") as f:
        json.dump(result, f, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
