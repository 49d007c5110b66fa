"""Builds through a real Dask scheduler and `edgeopt worker` processes (issue 44), beside local builds.

  python bench/bench_cluster.py [--write] [--parts readme,kill,slot,scale]

readme: the README model for cpu (fp32, int8), intel-cpu (fp32, fp16, int8) and mobile (fp16) through a scheduler
        with two workers, then locally with -j 2 (the same cores): the bundle id (sha256 of manifest.json), every
        file's sha256 and the cache key compared, the host checks compared, each job's time in both;
kill:   a worker frozen and killed once a job (cpu int8) has started on it, a second worker joining: the build
        completes there;
slot:   four TensorRT jobs on a worker with 2 threads and one declared engine slot: start/finish on the worker's
        clock, never overlapping (no GPU here: the slot is declared with --resources tensorrt=1);
scale:  12 jobs (7 targets x fp32/fp16) locally with -j 1 and -j 2, and with 1, 2 and 4 workers (--workers);
overhead: (--parts overhead alone, section `cluster-overhead`) one job at a time, local vs a warm worker;
variants: (--parts variants alone, section `cluster-variants`) the README model's cpu INT8 full search through two
        workers, each calibration method's variants Dask tasks (targets/qdq_variant.py), against a local build:
        where each variant was made, its verdict and metrics against the local one's, the wall times.
Writes docs/BENCHMARKS.md section `cluster` with --write (the four parts; other --parts: `cluster-<parts>`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import load, machine, md_table, stamp, write_section  # noqa: E402
from tests.cluster.conftest import EDGEOPT, Cluster  # noqa: E402

README_ARGS = ["--shape", "x:1x3x48x192", "--preprocess", "preset=pm1 order=bgr"]
DETERMINISTIC = {"cpu-fp32", "intel-cpu-fp32", "intel-cpu-fp16"}
PARTS = "readme,kill,slot,scale"


def bundle_ids(dist: Path) -> dict[str, str]:
    """The agent's bundle id (sha256 of manifest.json) of every bundle under ``dist``, by folder name."""
    from edgeopt.deploy import find_bundles

    return {b.path.name: b.bundle_id for b in find_bundles(dist)} if dist.is_dir() else {}


def build(args: list[str], cache: Path, scheduler: str | None = None) -> tuple[dict, float, str]:
    t0 = time.perf_counter()
    p = subprocess.run([*EDGEOPT, "build", *args, "--json", *(["--scheduler", scheduler] if scheduler else [])],
                       capture_output=True, text=True, env={**os.environ, "EDGEOPT_CACHE_DIR": str(cache)})
    wall = time.perf_counter() - t0
    try:
        rep = json.loads(p.stdout)
    except ValueError:
        rep = {"results": [], "error": p.stdout[-500:] + p.stderr[-1500:]}
    return rep, wall, p.stderr


def manifests(dist: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in dist.glob("*/*/manifest.json")}


def part_readme(tmp: Path, out: dict) -> str:
    from edgeopt.fixtures import ocr_lines, path

    model, lines = str(path("ocr-cls")), str(ocr_lines())
    args = [model, *README_ARGS, "--calib", lines, "-t", "cpu,intel-cpu,mobile",
            "-p", "cpu=fp32,int8,intel-cpu=fp32,fp16,int8,mobile=fp16"]
    c = Cluster(tmp / "readme")
    try:
        c.connect()
        c.worker("w1")
        c.worker("w2")
        c.wait_for("w1", "w2")
        remote, remote_wall, remote_err = build([*args, "--out", str(tmp / "remote")], tmp / "rc", c.url)
    finally:
        c.close()
    local, local_wall, _ = build([*args, "--out", str(tmp / "local"), "-j", "2"], tmp / "lc")
    rm, lm = manifests(tmp / "remote"), manifests(tmp / "local")
    rid, lid = bundle_ids(tmp / "remote"), bundle_ids(tmp / "local")
    rt = {f"{r['target']}-{r['precision']}": r for r in remote.get("results", [])}
    lt = {f"{r['target']}-{r['precision']}": r for r in local.get("results", [])}
    where = {}
    for ln in remote_err.splitlines():
        if ": on worker " in ln:
            tag = ln.split("] ", 1)[1].split(":")[0]
            where[tag.replace(" ", "-")] = ln.split(": on worker ")[1].split(" ")[0]
    rows = []
    for name in sorted(set(rm) | set(lm)):
        a, b = rm.get(name, {}), lm.get(name, {})
        same_files = a.get("files") == b.get("files") and bool(a)
        hc = lambda m: {k: v for k, v in (m.get("host_check") or {}).items() if k not in ("load_s", "validation_s")}  # noqa: E731
        rows.append({"bundle": name, "worker": where.get(name, "-"),
                     "cache key": "equal" if a.get("build", {}).get("cache_key") == b.get("build", {}).get("cache_key") else "DIFFERS",
                     "files (sha256)": "equal" if same_files else "differ",
                     "bundle id": "equal" if rid.get(name) and rid.get(name) == lid.get(name) else "differs",
                     "host check": ("equal" if hc(a) == hc(b) else "differs") + f" (passed: {(a.get('host_check') or {}).get('passed')})",
                     "job s (cluster / local)": f"{(rt.get(name) or {}).get('time_s') or 0:.1f} / {(lt.get(name) or {}).get('time_s') or 0:.1f}"})
    out["readme"] = {"rows": rows, "remote_wall": remote_wall, "local_wall": local_wall,
                     "remote_error": remote.get("error"), "local_error": local.get("error")}
    return (f"**The README model through a scheduler with two workers** (`w1`, `w2`: each offers every backend "
            f"that builds here, 1 thread) vs locally with `-j 2`: wall {remote_wall:.1f} s vs {local_wall:.1f} s "
            "(both include the preparation, ~1 s).\n\n"
            + md_table(rows, [(k, k) for k in rows[0]] if rows else [("bundle", "bundle")])
            + "\n\n`bundle id` = sha256(manifest.json), the id the agent's store, push and the results use; the "
              "build's and the host check's timings and the build host are in `build-times.json` beside it, outside "
              "the id (`targets.base.VOLATILE`).\n")


def part_kill(tmp: Path, out: dict) -> str:
    from edgeopt.fixtures import ocr_lines, path

    c = Cluster(tmp / "kill")
    lines: list[str] = []
    try:
        c.connect()
        c.worker("k1", "--only", "onnxruntime")
        c.wait_for("k1")
        t0 = time.perf_counter()
        proc = subprocess.Popen([*EDGEOPT, "build", str(path("ocr-cls")), *README_ARGS, "--calib", str(ocr_lines()),
                                 "-t", "cpu", "-p", "int8", "--out", str(tmp / "kd"), "--scheduler", c.url],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "EDGEOPT_CACHE_DIR": str(tmp / "kc")})
        killed_at = [None]

        def read() -> None:
            for line in proc.stderr:
                lines.append(line.rstrip())
                seen = any(": on worker k1 " in ln for ln in lines[:-1])
                if killed_at[0] is None and seen and "cpu int8: " in line:  # the converter is running on k1
                    c.kill("k1", signal.SIGSTOP)
                    c.kill("k1")
                    killed_at[0] = time.perf_counter() - t0
                    c.worker("k2", "--only", "onnxruntime")

        r = threading.Thread(target=read, daemon=True)
        r.start()
        stdout = proc.stdout.read()
        proc.wait()
        r.join(timeout=60)
        wall = time.perf_counter() - t0
    finally:
        c.close()
    notes = [ln for ln in stdout.splitlines() if "cluster:" in ln]
    out["kill"] = {"rc": proc.returncode, "killed_at": killed_at[0], "wall": wall, "notes": notes}
    return (f"**A worker killed mid-build** (`k1`, the only worker, frozen with SIGSTOP then SIGKILLed as a "
            f"process group {killed_at[0] or 0:.1f} s into `build -t cpu -p int8` of the README model, while its "
            f"INT8 search ran; `k2` started then): exit {proc.returncode} after {wall:.1f} s; the summary said:\n\n"
            + "\n".join(f"    {n}" for n in notes) + "\n")


def part_slot(tmp: Path, out: dict) -> str:
    from edgeopt.fixtures import path

    c = Cluster(tmp / "slot")
    try:
        c.connect()
        c.worker("gpu", "--only", "onnxruntime", "--resources", "onnxruntime=0 tensorrt=1", "--nthreads", "2")
        c.wait_for("gpu")
        rep, wall, err = build([str(path("ocr-cls")), "--shape", "x:1x3x48x192", "-t", "jetson-orin,h100",
                                "-p", "fp32,fp16", "--out", str(tmp / "sd")], tmp / "sc", c.url)
        ev = c.events()
    finally:
        c.close()
    jobs: dict[str, dict] = {}
    for e in ev:
        if e["kind"] in ("start", "finish"):
            jobs.setdefault(e["job"], {})[e["kind"]] = e["t"]
    spans = sorted((j["start"], j["finish"]) for j in jobs.values() if len(j) == 2)
    t0 = spans[0][0] if spans else 0
    overlap = any(spans[i][1] > spans[i + 1][0] for i in range(len(spans) - 1))
    rows = [{"job": i + 1, "start s": f"{s - t0:.2f}", "finish s": f"{f - t0:.2f}"} for i, (s, f) in enumerate(spans)]
    out["slot"] = {"spans": spans, "overlap": overlap, "ok": sum(r.get("status") in ("built",) for r in rep.get("results", []))}
    return (f"**Two TensorRT jobs never share one engine slot**: a worker with 2 threads declaring one slot "
            f"(`--resources tensorrt=1`; no GPU here, so the jobs are edgeopt's host side of TensorRT builds -- "
            f"the engine itself is built on the device) ran {len(spans)} TensorRT jobs "
            f"(jetson-orin, h100 x fp32, fp16) in {wall:.1f} s; on the worker's clock "
            f"{'SOME OVERLAPPED' if overlap else 'none overlapped'}:\n\n"
            + md_table(rows, [("job", "job"), ("start s", "start (s)"), ("finish s", "finish (s)")]) + "\n")


def part_scale(tmp: Path, out: dict, workers: tuple[int, ...] = (1, 2, 4)) -> str:
    from edgeopt.fixtures import path

    args = [str(path("ocr-cls")), "--shape", "x:1x3x48x192", "-t",
            "cpu,intel-cpu,intel-gpu,intel-npu,apple,jetson-orin,h100", "-p", "fp32,fp16"]
    rows = []
    for label, n in (("local -j 1", 0), ("local -j 2", 0),
                     *((f"{w} worker{'s' if w > 1 else ''}", w) for w in workers)):
        at_start = os.getloadavg()[0]
        if n == 0:
            rep, wall, _ = build([*args, "--out", str(tmp / f"s{label[-1]}"), "-j", label[-1]], tmp / f"lc{label[-1]}")
        else:
            c = Cluster(tmp / f"scale{n}")
            try:
                c.connect()
                names = [f"s{i}" for i in range(n)]
                for nm in names:
                    c.worker(nm, "--resources", "tensorrt=1")
                c.wait_for(*names)
                rep, wall, _ = build([*args, "--out", str(tmp / f"sw{n}")], tmp / f"wc{n}", c.url)
            finally:
                c.close()
        res = rep.get("results", [])
        rows.append({"how": label, "jobs": len(res), "ok": sum(r["status"] == "built" for r in res),
                     "wall s": f"{wall:.1f}", "sum of job times s": f"{sum(r.get('time_s') or 0 for r in res):.1f}",
                     "load (1 min) before / after": f"{at_start:.1f} / {os.getloadavg()[0]:.1f}"})
    out["scale"] = rows
    return (f"**12 jobs** (the README model for cpu fp32, intel-cpu/intel-gpu/apple/jetson-orin/h100 fp32 + fp16, "
            f"intel-npu fp16; each worker 1 thread, every backend + a declared TensorRT slot; all on this machine's "
            f"{os.cpu_count()} cores), wall time of the whole `edgeopt build` including preparation:\n\n"
            + md_table(rows, [(k, k) for k in rows[0]]) + "\n")


def part_overhead(tmp: Path, out: dict, rounds: int = 3) -> str:
    """One job at a time (nothing queued), local and through a 1-thread worker, interleaved rounds: the job's time as
    the build reports it (the host's clock from start to installed bundle)."""
    from edgeopt.fixtures import ocr_lines, path

    c = Cluster(tmp / "overhead")
    rows = []
    try:
        c.connect()
        c.worker("o1")
        c.wait_for("o1")
        for target in ("cpu", "intel-cpu"):
            times: dict[str, list[float]] = {"local": [], "cluster": []}
            for _ in range(rounds):
                for how in ("local", "cluster"):
                    rep, _, _ = build([str(path("ocr-cls")), *README_ARGS, "--calib", str(ocr_lines()), "-t", target,
                                       "-p", "fp32", "--force", "--out", str(tmp / f"o-{how}")], tmp / f"oc-{how}",
                                      c.url if how == "cluster" else None)
                    times[how] += [r["time_s"] for r in rep.get("results", []) if r.get("time_s")]
            lo, cl = sorted(times["local"]), sorted(times["cluster"])
            med = lambda v: v[len(v) // 2] if v else float("nan")  # noqa: E731
            rows.append({"job": f"{target} fp32", "local s (median)": f"{med(lo):.2f}",
                         "cluster s (median)": f"{med(cl):.2f}", "overhead s": f"{med(cl) - med(lo):+.2f}",
                         "overhead %": f"{(med(cl) / med(lo) - 1) * 100:+.0f}%",
                         "local s (all)": " ".join(f"{t:.1f}" for t in times["local"]),
                         "cluster s (all)": " ".join(f"{t:.1f}" for t in times["cluster"])})
    finally:
        c.close()
    out["overhead"] = rows
    return (f"**Overhead per job** ({rounds} interleaved rounds, one job at a time, `--force`, the README model; the "
            "job's time as the summary gives it: from the start of its converter process (local) or its submission "
            "(cluster) to the bundle checked and installed; the cluster's includes shipping the inputs, the "
            "worker's fetch from its store, the bundle's way back and its hash check; the worker already warm):\n\n"
            + md_table(rows, [(k, k) for k in rows[0]]) + "\n")


def part_variants(tmp: Path, out: dict) -> str:
    """The cpu INT8 full search with its variants fanned out to two workers, beside a local build of the same."""
    from edgeopt.fixtures import ocr_lines, path

    args = [str(path("ocr-cls")), *README_ARGS, "--calib", str(ocr_lines()), "-t", "cpu,intel-cpu", "-p", "int8",
            "--option", "int8_search=full"]
    c = Cluster(tmp / "variants")
    try:
        c.connect()
        c.worker("v1")
        c.worker("v2")
        c.wait_for("v1", "v2")
        remote, remote_wall, remote_err = build([*args, "--out", str(tmp / "vr")], tmp / "vrc", c.url)
    finally:
        c.close()
    local, local_wall, _ = build([*args, "--out", str(tmp / "vl")], tmp / "vlc")

    def search(dist: Path, bundle: str) -> dict:
        return ((manifests(dist).get(bundle) or {}).get("options") or {}).get("int8") or {}

    def variants(dist: Path) -> dict[str, dict]:  # cpu's QDQ search: each variant's record
        return {v["label"]: v for v in search(dist, "cpu-int8").get("variants") or []}

    rv, lv = variants(tmp / "vr"), variants(tmp / "vl")
    rows = []
    for label, v in rv.items():
        w = lv.get(label)
        rows.append({"variant": label, "step": v["step"], "made on": v.get("made_on") or "the job",
                     "passed (cluster / local)": f"{v['passed']} / {w['passed'] if w else '-'}",
                     "metrics": "equal" if w and w["metrics"] == v["metrics"] else ("-" if not w else "DIFFER"),
                     "ms (cluster / local, timed in the job)": f"{v.get('latency_ms')} / {(w or {}).get('latency_ms')}"})
    def nncf(dist: Path) -> dict[str, dict]:  # intel-cpu's NNCF search: each variant that ran
        return {t["variant"]: t for t in search(dist, "intel-cpu-int8").get("tried") or [] if "passed" in t}

    for name, v in nncf(tmp / "vr").items():  # intel-cpu: NNCF's variants
        w = nncf(tmp / "vl").get(name)
        rows.append({"variant": f"intel-cpu {name}", "step": "nncf", "made on": v.get("made_on") or "the job",
                     "passed (cluster / local)": f"{v['passed']} / {w['passed'] if w else '-'}",
                     "metrics": "equal" if w and w.get("metrics") == v.get("metrics") else ("-" if not w else "DIFFER"),
                     "ms (cluster / local, timed in the job)": f"{v.get('latency_ms')} / {(w or {}).get('latency_ms')}"})
    chosen = {how: search(tmp / d, "cpu-int8").get("chosen", {}).get("label") for how, d in (("cluster", "vr"),
                                                                                            ("local", "vl"))}
    fanned = sum(1 for ln in remote_err.splitlines() if "made and judged on the cluster's workers" in ln)
    # the README model for both targets in one build: each job's own wall is in the summary's job times
    out["variants"] = {"rows": rows, "remote_wall": remote_wall, "local_wall": local_wall, "chosen": chosen,
                       "fan_outs": fanned, "remote_error": remote.get("error"), "local_error": local.get("error")}
    return (f"**The INT8 searches' variants as Dask tasks** (the README model, cpu and intel-cpu, `--option "
            "int8_search=full`; rows without a target are cpu's QDQ grid, `intel-cpu` rows NNCF's variants; two "
            f"workers `v1`, `v2`, 1 thread each, on this machine's 2 cores): {fanned} fan-out(s); wall {remote_wall:.1f} s through the cluster vs {local_wall:.1f} s locally; chosen: "
            f"{chosen.get('cluster')} (cluster) / {chosen.get('local')} (local; cpu's pick, by latency timed in the "
            "job).\n\n" + md_table(rows, [(k, k) for k in rows[0]] if rows else [("variant", "variant")]) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--parts", default=PARTS)
    ap.add_argument("--workers", default="1,2,4", help="scale: the worker counts [1,2,4]")
    a = ap.parse_args()
    workers = tuple(int(w) for w in a.workers.split(",") if w.strip())
    out: dict = {}
    body = [f"Measured {stamp()} on {machine()}; {load()} at the start (5 engineers share these 2 cores: wall "
            "times carry their load). A real `dask scheduler` and `edgeopt worker` processes on 127.0.0.1, each "
            "worker with its own input store, as on separate machines.\n"]
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as d:
        tmp = Path(d)
        for part in a.parts.split(","):
            body.append({"readme": part_readme, "kill": part_kill, "slot": part_slot,
                         "scale": lambda t, o: part_scale(t, o, workers), "overhead": part_overhead,
                         "variants": part_variants}[part](tmp, out))
            print(body[-1], flush=True)
            Path(tempfile.gettempdir(), f"bench_cluster-{a.parts}.json").write_text(json.dumps(out, indent=2, default=str))
            if a.write:  # after each part: a long part cut short keeps the ones before
                title = ("## Builds on a Dask cluster (bench/bench_cluster.py)" if a.parts == PARTS else
                         "## Builds on a Dask cluster: overhead per job (bench/bench_cluster.py --parts overhead)"
                         if a.parts == "overhead" else "## Builds on a Dask cluster: INT8 variants as tasks "
                         "(bench/bench_cluster.py --parts variants)" if a.parts == "variants" else
                         f"## Builds on a Dask cluster (bench/bench_cluster.py --parts "
                         f"{a.parts})")
                write_section("cluster" if a.parts == PARTS else f"cluster-{a.parts.replace(',', '-')}",
                              title + "\n\n" + "\n".join([*body, f"Load after the {part} part: {load()}.\n"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
