"""The whole path on emulated aarch64 boards: push, bench (cpu ORT, mobile LiteRT, intel-cpu OpenVINO where its
wheel installed) and the on-device check, `gate`, a mixed-fleet `rollout`, and a jetson-orin bundle refused where
TensorRT is missing, over real SSH, on Debian arm64 userlands run by qemu-user.

    sudo .venv/bin/python bench/bench_arm.py [--suites bookworm,bullseye] [--duration 2] [--no-write]

Each suite's root is brought up with scripts/make_device.py (built once, then cached; see its --help). The
ocr-cls model is built on this host for cpu fp32, mobile fp16, intel-cpu fp32 and jetson-orin fp16 (the
TensorRT build spec: the engine is built on the device, so a board without TensorRT refuses it), plus a
perturbed cpu fp32 candidate for the gate; the same cpu bundle is also benched on the host itself (``local``)
for comparison. Per board: bench of every bundle, the check verb, then `gate` (perturbed candidate vs the cpu
bundle: accuracy judged, latency not). Then one `rollout` of the cpu and intel-cpu bundles across a mixed
fleet: two x86 ``local``-transport devices (intel-cpu, cpu) and every board (cpu). Every latency from an
emulated board is qemu's speed, not the board's: the table says so in every row (``emulated``), as the
records' facts do. Writes the ``emulated-arm`` section of docs/BENCHMARKS.md.
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

TARGETS = {"cpu": "fp32", "mobile": "fp16", "intel-cpu": "fp32", "jetson-orin": "fp16"}
RUNTIME_DIST = {"cpu": "onnxruntime", "mobile": "ai-edge-litert", "intel-cpu": "openvino", "jetson-orin": "tensorrt"}


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
    from edgeopt.hil.gate import gate
    from edgeopt.inventory import load_inventory, local_device
    from edgeopt.pipeline import build
    from tests.hil.models import perturbed

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
    src = path("ocr-cls")
    rep = build(perturbed(src, work / "bad" / src.name, scale=0.3), "cpu", ["fp32"], shapes={"x": [1, 3, 48, 192]},
                calib=str(path("images")), preprocess="preset=pm1", out=work / "dist-bad", n_calib=4, n_val=4)
    bad = Path(rep.results[0].bundle) if rep.ok else None
    print(f"built {len(TARGETS) + 1} bundles in {time.monotonic() - t0:.0f} s")
    bundles = find_bundles(work / "dist")
    opts = {"duration_s": a.duration, "min_iters": 5, "max_iters": 500, "warmup": 2, "timeout_s": 600}

    rows: list[dict] = []
    ups: list[dict] = []
    fleet_boards: dict[str, dict] = {}
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
        cpu = next((b for b in bundles if b.target == "cpu"), None)
        if bad is not None and cpu is not None:
            rows.append(_gate_row(gate, bad, cpu.path, inv, f"{suite}-cpu", suite, info, work))
        fleet_boards[f"{suite}-arm64"] = {**entry, "target": "cpu"}
    # the same cpu bundle on this host, natively, for comparison
    cpu = [b for b in bundles if b.target == "cpu"]
    res = bench_fleet([local_device(str(work / "local-root"))], cpu, opts, jobs=1)
    for r in res.records:
        rows.append(_row(r, "host", None, "cpu", None, decide))
    if fleet_boards:
        rows.extend(_rollout_rows(bundles, fleet_boards, work))
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
            f"nothing of a real board. `gate` rows: a perturbed candidate against the cpu bundle on the board "
            f"(accuracy judged there, latency not: qemu's speed is no measurement). `rollout` rows: one rollout of "
            f"the cpu and intel-cpu bundles across two x86 `local`-transport devices and the boards, each device "
            f"on its own target's bundle. The jetson-orin rows are refused before anything is installed (no "
            f"TensorRT on these userlands).\n\n{roots}\n\n{table}\n")
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


def _gate_row(gate, candidate: Path, baseline: Path, inv: Path, device: str, suite: str, info: dict,
              work: Path) -> dict:
    """`edgeopt gate` of the perturbed candidate against the cpu bundle on one board: the verdict, each metric."""
    t = time.monotonic()
    try:
        res = gate(str(candidate), str(baseline), devices=str(inv), limit=[device], budget="60s",
                   db=str(work / "gate.db"), progress=lambda s: print("  [gate] " + s, flush=True))
    except Exception as exc:  # noqa: BLE001 - a bench row, not a crash
        return {"device": device, "bundle": "gate: perturbed cpu-fp32 vs cpu-fp32", "status": f"gate error: {exc}"}
    wall = time.monotonic() - t
    dev = (res.get("devices") or [{}])[0]
    emu = (dev.get("fingerprint") or {}).get("emulated")
    parts = []
    for v in dev.get("verdicts") or []:
        why = "not judged (emulated)" if "emulated" in (v.get("reason") or "") else v["verdict"]
        parts.append(f"{v['metric']} {why}" + (f" ({v['reason']})" if v["metric"] == "decisions" else ""))
    status = f"gate {res['verdict']} (exit {res['exit_code']}) in {wall:.0f} s: " + "; ".join(parts)
    if dev.get("error"):
        status += f"; error: {dev['error'][:160]}"
    return {"device": device, "userland": f"{suite} py{info['python']} np{info['numpy']}",
            "bundle": "gate: perturbed cpu-fp32 vs cpu-fp32", "runtime": "onnxruntime", "status": status,
            "truth": "emulated" if emu else "device"}


def _rollout_rows(bundles, boards: dict[str, dict], work: Path) -> list[dict]:
    """One `edgeopt rollout` of the cpu and intel-cpu bundles across x86 local devices and the boards."""
    import json
    import subprocess

    import yaml

    chosen = [b for b in bundles if b.target in ("cpu", "intel-cpu")]
    fleet = {"x86-intel": {"transport": "local", "root": str(work / "r-x86-intel"), "target": "intel-cpu"},
             "x86-cpu": {"transport": "local", "root": str(work / "r-x86-cpu"), "target": "cpu"}, **boards}
    (work / "fleet.yaml").write_text(yaml.safe_dump({"devices": fleet}, sort_keys=False))
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "edgeopt", "rollout", *[str(b.path) for b in chosen], "--devices",
                        "fleet.yaml", "--waves", "1,100%", "--json", "--db", "rollout.db"], cwd=work,
                       capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - t
    try:
        summary = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [{"device": "(fleet)", "bundle": "rollout", "status": f"rollout exit {p.returncode}: "
                 f"{(p.stderr or p.stdout).strip()[-200:]}"}]
    by_id = {b.bundle_id: f"{b.target}-{b.precision}" for b in chosen}
    rows = []
    for w, wave in enumerate(summary.get("waves") or []):
        for o in wave.get("outcomes") or []:
            name = o["device"]
            rows.append({"device": name, "userland": "emulated board" if name in boards else "host (native)",
                         "bundle": f"rollout: {by_id.get(o.get('after') or '', fleet[name]['target'])}",
                         "status": f"rollout wave {w}: {o['status']}" + (f" ({o.get('reason')})" if o.get("reason")
                                                                          else ""),
                         "truth": "emulated" if name in boards else "device"})
    rows.append({"device": "(fleet)", "bundle": "rollout", "status": f"rollout {summary.get('status')} (exit "
                 f"{p.returncode}) in {wall:.0f} s across {len(fleet)} devices"})
    return rows


def _row(r, suite: str, info: dict | None, target: str, checked: bool | None, decide) -> dict:
    b = r.bench or {}
    lat = b.get("latency_ms") or {}
    truth, _ = decide.device_truth(r.as_dict())
    runner = b.get("runner") or {}
    err = r.error or {}
    msg = err.get("message") or ""
    status = r.status if r.status == "ok" else (f"refused: {msg}" if "has no TensorRT runtime" in msg
                                                else f"{r.status}: {msg[:90]}")
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
