"""The whole path on emulated aarch64 boards: push, bench (cpu ORT, mobile LiteRT, intel-cpu OpenVINO where its
wheel installed) and the on-device check, over real SSH, on Debian arm64 userlands run by qemu-user.

    sudo .venv/bin/python bench/bench_arm.py [--suites bookworm,bullseye] [--duration 2]

Each suite's root is brought up with scripts/make_device.py (built once, then cached; see its --help). The
ocr-cls model is built on this host for cpu fp32, mobile fp16 and intel-cpu fp32; the same cpu bundle is also
benched on the host itself (``local``) for comparison. Every latency from an emulated board is qemu's
speed, not the board's: the table says so in every row (``emulated``), as the records' facts do.
Writes the ``emulated-arm`` section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import ROOT, load, machine, md_table, stamp, write_section  # noqa: E402

TARGETS = {"cpu": "fp32", "mobile": "fp16", "intel-cpu": "fp32"}
RUNTIME_DIST = {"cpu": "onnxruntime", "mobile": "ai-edge-litert", "intel-cpu": "openvino"}


def _make_device():
    spec = importlib.util.spec_from_file_location("make_device", ROOT / "scripts" / "make_device.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suites", default="bookworm,bullseye")
    ap.add_argument("--duration", type=float, default=2.0, help="timed loop per bundle, seconds")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/BENCHMARKS.md alone")
    a = ap.parse_args(argv)

    import yaml

    from edgeopt import decide
    from edgeopt.deploy import DeviceSession, find_bundles
    from edgeopt.fixtures import path
    from edgeopt.fleetbench import bench_fleet
    from edgeopt.inventory import load_inventory, local_device
    from edgeopt.pipeline import build

    md = _make_device()
    work = Path(tempfile.mkdtemp(prefix="bench-arm-"))
    os.environ["EDGEOPT_CACHE_DIR"] = str(work / "cache")
    os.environ.pop("SSH_AUTH_SOCK", None)
    t0 = time.monotonic()
    for target, prec in TARGETS.items():
        rep = build(path("ocr-cls"), target, [prec], shapes={"x": [1, 3, 48, 192]}, calib=str(path("images")),
                    preprocess="preset=pm1", out=work / "dist", n_calib=4, n_val=4)
        if not rep.ok:
            print(f"build {target}-{prec} failed: {rep.results}", file=sys.stderr)
    print(f"built {len(TARGETS)} bundles in {time.monotonic() - t0:.0f} s")
    bundles = find_bundles(work / "dist")
    opts = {"duration_s": a.duration, "min_iters": 5, "max_iters": 500, "warmup": 2, "timeout_s": 600}

    rows: list[dict] = []
    ups: list[dict] = []
    for suite in [s for s in a.suites.split(",") if s]:
        try:
            out = md.up("arm64", suite, agent_root=f"/root/.edgeopt-bench-{suite}", state=work / f"{suite}-state")
        except md.DeviceError as e:
            rows.append({"device": f"{suite}-arm64", "bundle": "-", "status": f"no device: {e}"})
            continue
        ups.append(out)
        info = out["device"]
        entry = yaml.safe_load(Path(out["inventory"]).read_text())["devices"][out["name"]]
        devs = {f"{suite}-{t}": {**entry, "target": t} for t in TARGETS}
        inv = work / f"{suite}.yaml"
        inv.write_text(yaml.safe_dump({"devices": devs}, sort_keys=False))
        devices = load_inventory(inv).select()
        t = time.monotonic()
        res = bench_fleet(devices, bundles, opts, jobs=1, progress=lambda s: print("  " + s, flush=True))
        wall = time.monotonic() - t
        for r in res.records:
            target = r.bundle.get("target")
            checked = None
            if r.status == "ok":
                dev = next(d for d in devices if d.name == r.device["name"])
                with DeviceSession.open(dev) as sess:
                    rep = sess.agent("check", {"root": sess.root, "bundle_id": r.bundle["bundle_id"]}, timeout=600)
                checked = bool(rep.get("ok") and rep["check"].get("passed"))
            rows.append(_row(r, suite, info, target, checked, decide))
        for s in res.skipped:
            rows.append({"device": s["device"], "bundle": "-", "status": f"skipped: {s['reason']}"})
        rows.append({"device": f"{suite}-arm64", "bundle": "(all)", "status": f"whole path {wall:.0f} s"})
    # the same cpu bundle on this host, natively, for comparison
    cpu = [b for b in bundles if b.target == "cpu"]
    res = bench_fleet([local_device(str(work / "local-root"))], cpu, opts, jobs=1)
    for r in res.records:
        rows.append(_row(r, "host", None, "cpu", None, decide))
    for out in ups:
        md.down("arm64", out["device"]["suite"], port=out["port"])

    cols = [("device", "device"), ("userland", "userland"), ("bundle", "bundle"), ("runtime", "runtime"),
            ("status", "status"), ("p50", "p50 ms"), ("ips", "inf/s"), ("accuracy", "on-device accuracy"),
            ("check", "check verb"), ("truth", "measured on")]
    table = md_table(rows, cols)
    print(table)
    roots = "\n".join(
        f"- {u['name']}: Debian {u['device']['suite']} arm64, Python {u['device']['python']}, numpy "
        f"{u['device']['numpy']}; installed {', '.join(f'{k} {v}' for k, v in u['device']['runtimes'].items())}"
        + "".join(f"; not installed: {k} ({w})" for k, w in u['device'].get('refused', {}).items())
        + "".join(f"; {n}" for n in u['device'].get('notes', []))
        + f". Root built in {u['device']['build_s']:.0f} s (mmdebstrap {u['device']['mmdebstrap_s']:.0f} s), "
          f"cached start this run {u['up_s']:.1f} s" for u in ups)
    body = (f"## Emulated aarch64 boards (bench/bench_arm.py, {stamp()})\n\n"
            f"Host: {machine()}; {load()}. Debian arm64 userlands run by qemu-user on this host, reached over "
            f"real SSH (scripts/make_device.py). **Every latency of an `emulated` row is qemu's speed, not a "
            f"latency measurement of any board**; the `host` row is this x86 CPU natively. A runtime killed by "
            f"SIGILL there met an instruction this host's qemu ({_qemu_version()}) does not emulate: that says "
            f"nothing of a real board.\n\n{roots}\n\n{table}\n")
    if not a.no_write:
        write_section("emulated-arm", body)
    return 0


def _qemu_version() -> str:
    import subprocess

    try:
        out = subprocess.run(["qemu-aarch64-static", "--version"], capture_output=True, text=True).stdout
    except OSError:
        return "qemu-user"
    return out.splitlines()[0].replace("qemu-aarch64 version", "qemu-user").strip() if out else "qemu-user"


def _row(r, suite: str, info: dict | None, target: str, checked: bool | None, decide) -> dict:
    b = r.bench or {}
    lat = b.get("latency_ms") or {}
    truth, _ = decide.device_truth(r.as_dict())
    runner = b.get("runner") or {}
    err = r.error or {}
    status = r.status if r.status == "ok" else f"{r.status}: {(err.get('message') or '')[:90]}"
    acc = b.get("accuracy") or {}
    return {"device": r.device["name"], "userland": f"{suite} py{info['python']} np{info['numpy']}" if info else
            "host (native)", "bundle": f"{target}-{r.bundle.get('precision')}",
            "runtime": f"{runner.get('runtime', RUNTIME_DIST.get(target))} {runner.get('version') or ''}".strip(),
            "status": status, "p50": f"{lat['p50']:.2f}" + (" (emulated)" if truth == "emulated" else "")
            if lat.get("p50") is not None else "-",
            "ips": f"{b['throughput_ips']:.1f}" if b.get("throughput_ips") else "-",
            "accuracy": {True: "passed", False: "FAILED", None: "-"}[acc.get("passed")],
            "check": {True: "passed", False: "FAILED", None: "-"}[checked], "truth": truth}


if __name__ == "__main__":
    sys.exit(main())
