"""A build worker: ``python -m edgeopt.worker JOB.json RESULT.json``.

Each (target, precision) converts in its own process, so a converter that crashes (a native
abort) or hangs is killed and reported without touching the others.  Progress goes to stderr as
``progress: ...`` lines that the parent relays.
"""

from __future__ import annotations

import errno
import json
import sys
import traceback


def main(argv: list[str]) -> int:
    job_path, result_path = argv
    from edgeopt.errors import EdgeoptError
    from edgeopt.targets.base import BuildJob
    from edgeopt.targets.registry import get_backend

    with open(job_path) as f:
        job = BuildJob.from_dict(json.load(f))

    def progress(msg: str) -> None:
        print(f"progress: {msg}", file=sys.stderr, flush=True)

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
