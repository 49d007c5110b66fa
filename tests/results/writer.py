"""One rig process for the many-writers test and bench: ``python tests/results/writer.py URL RIG N [KILL_AT]``
writes N records of run ``RIG`` through ``ResultsDB``; at record KILL_AT it terminates every other edgeopt
connection to the server (the other rigs' writes in flight fail and are retried on fresh connections), and
at the end it writes all N again (a retry of a whole batch, as after a lost acknowledgement). Prints one
JSON line: rows it inserted, duplicates found, spooled."""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> None:
    from edgeopt.results import ResultsDB
    from tests.results.conftest import record

    url, rig, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    kill_at = int(sys.argv[4]) if len(sys.argv) > 4 else -1
    os.environ["EDGEOPT_RIG"] = rig
    recs = [record(i, run_id=f"run-{rig}", device=rig) for i in range(n)]
    t0 = time.perf_counter()
    with ResultsDB(url) as db:
        killed = 0
        for i, rec in enumerate(recs):
            if i == kill_at:
                killed = db._rows("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                                  "application_name = 'edgeopt' AND pid <> pg_backend_pid()")[0][0]
            db.add(rec)
        write_s = time.perf_counter() - t0
        for rec in recs:
            db.add(rec)
        print(json.dumps({"rig": rig, "duplicates": db.duplicates, "spooled": getattr(db, "spooled", 0),
                          "write_s": write_s, "killed": killed, "retries": getattr(db, "retries", 0)}))


if __name__ == "__main__":
    main()
