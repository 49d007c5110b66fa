"""``edgeopt devices --devices FILE [--probe]``: list the inventory; probe each device."""

from __future__ import annotations

import argparse

from . import emit_json
from .bench import add_device_args, select_devices

HELP = """\
List the devices of an inventory (edgeopt YAML or Ansible INI/YAML) with how they are reached and
which target they run. With --probe, connect to each (host keys checked), install the agent if
needed and show what the device is: OS, CPU, memory, disk, GPUs, runtimes. Exit 4 when a probe fails.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("devices", help="list the inventory; probe devices", description=HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_device_args(p)
    p.add_argument("--probe", action="store_true", help="connect and show each device's probe")
    p.add_argument("--json", action="store_true", help="print as JSON on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines")
    p.set_defaults(func=run)


def _probe(dev, trust: bool, progress) -> dict:
    from edgeopt.errors import DeviceError
    from edgeopt.push import DeviceSession

    try:
        with DeviceSession.open(dev, trust, progress=progress) as s:
            return {"ok": True, "probe": s.probe(), "agent_path": s.agent_dir,
                    "connect_s": round(getattr(s, "connect_s", 0.0), 3)}
    except DeviceError as exc:
        progress(f"{dev.name}: FAILED: {exc.message}")
        return {"ok": False, "error": str(exc)}


def _summary(p: dict) -> str:
    if not p.get("ok"):
        return "FAILED: " + p["error"].splitlines()[0]
    pr = p["probe"]
    cpu = pr.get("cpu") or {}
    mem = pr.get("memory_mb")
    mem = mem.get("total") if isinstance(mem, dict) else mem
    rts = ", ".join(f"{k} {v}" for k, v in (pr.get("runtimes") or {}).items() if v)
    gpus = ", ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in pr.get("gpus") or [])
    bits = [f"{pr.get('os')} {pr.get('arch')}", f"{cpu.get('model') or cpu.get('name') or ''} x{cpu.get('count') or cpu.get('cores') or '?'}",
            f"{mem} MB" if mem else "", f"GPU {gpus}" if gpus else "", rts or "no runtimes"]
    return "; ".join(b for b in bits if b.strip())


def run(args: argparse.Namespace) -> int:
    from concurrent.futures import ThreadPoolExecutor

    from edgeopt.errors import EXIT_DEVICE_FAILED
    from edgeopt.ui import stderr_progress, table

    devices = select_devices(args)
    progress = stderr_progress(args.quiet)
    probes: dict[str, dict] = {}
    if args.probe:
        with ThreadPoolExecutor(max_workers=max(1, min(args.parallel, len(devices)))) as pool:
            probes = dict(zip([d.name for d in devices],
                              pool.map(lambda d: _probe(d, args.trust_new_host_keys, progress), devices)))
    if args.json:
        emit_json([{**d.public(), "python": d.python, "root": d.root, **({"probe": probes[d.name]} if probes else {})}
                   for d in devices])
    else:
        rows = [{"name": d.name, "via": "local" if d.is_local else
                 f"ssh {d.user + '@' if d.user else ''}{d.host}{':' + str(d.port) if d.port else ''}",
                 "target": d.target or ("(any runnable)" if d.is_local else "(none)"), "labels": ",".join(d.labels),
                 "probe": _summary(probes[d.name]) if probes else ""} for d in devices]
        cols = [("name", "device"), ("via", "reached by"), ("target", "target"), ("labels", "labels")]
        print(table(rows, cols + ([("probe", "probe")] if probes else [])))
    return EXIT_DEVICE_FAILED if any(not p["ok"] for p in probes.values()) else 0
