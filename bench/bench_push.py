"""Push over real SSH: the first push of ocr-cls bundles, then a second push of the same, unchanged.

    .venv/bin/python bench/bench_push.py

Starts a real OpenSSH server on 127.0.0.1 (a free port, generated host and user keys; needs
/usr/sbin/sshd), pushes with `edgeopt.deploy.push` as `edgeopt push` does, and reports the bytes and
time of each push (and paramiko's connect time). Writes the `push` section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import getpass
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import load, machine, md_table, stamp, write_section  # noqa: E402


def main() -> int:
    import yaml

    from edgeopt.deploy import find_bundles, push
    from edgeopt.fixtures import path
    from edgeopt.inventory import load_inventory
    from edgeopt.pipeline import build
    from tests.devices.conftest import Sshd, keygen, known_hosts

    work = Path(tempfile.mkdtemp(prefix="bench-push-"))
    os.environ["EDGEOPT_CACHE_DIR"] = str(work / "cache")
    os.environ.pop("SSH_AUTH_SOCK", None)
    if os.geteuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)
    report = build(path("ocr-cls"), "cpu,intel-cpu", ["fp32", "int8"], shapes={"x": [1, 3, 48, 192]},
                   calib=str(path("images")), preprocess="preset=pm1", out=work / "dist")
    bundles = find_bundles(work / "dist")
    key = keygen(work / "id_ed25519")
    server = Sshd(work / "sshd", [key]).start()
    try:
        inv = work / "devices.yaml"
        inv.write_text(yaml.safe_dump({"devices": {"dev": {
            "host": "127.0.0.1", "port": server.port, "user": getpass.getuser(), "key_file": str(key),
            "python": sys.executable, "root": str(work / "device-root"),
            "known_hosts": str(known_hosts(work / "known_hosts", server)), "ssh_config": "none"}}}))
        devices = load_inventory(inv).select()
        rows = []
        for label in ("first push", "second push (unchanged)"):
            t0 = time.perf_counter()
            res = push(devices, bundles)[0]
            wall = time.perf_counter() - t0
            assert res.ok, res.error
            statuses = sorted({b.status for b in res.bundles})
            rows.append({"push": label, "bundles": len(res.bundles), "status": ", ".join(statuses),
                         "bytes": f"{res.bytes_sent:,}", "agent": "uploaded" if res.agent.get("uploaded") else
                         "already there", "wall": f"{wall:.2f} s"})
            print(rows[-1], flush=True)
    finally:
        server.stop()
    body = ("## Push over SSH: first and second push\n\n"
            f"Measured {stamp()} by `bench/bench_push.py` on {machine()}; {load()}. A real OpenSSH server on "
            f"127.0.0.1, paramiko client, {len(bundles)} bundles of ocr-cls (cpu and intel-cpu, fp32 and int8; "
            f"{sum(r.ok for r in report.results)} built). Bytes are artifact/bundle file bytes sent by SFTP.\n\n"
            + md_table(rows, [("push", "push"), ("bundles", "bundles"), ("status", "bundle status"),
                              ("bytes", "bundle bytes sent"), ("agent", "agent"), ("wall", "wall time")]))
    write_section("push", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
