"""`edgeopt build --scheduler`: a real Dask scheduler, real `edgeopt worker` processes, real converters."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import fixture, tiny_cnn

from .conftest import EDGEOPT, Cluster, free_port

MODEL_ARGS = ["--shape", "x:1x3x48x192", "--preprocess", "preset=pm1 order=bgr"]


def edgeopt(args: list[str], cache: Path, env: dict[str, str] | None = None, timeout: float = 600):
    return subprocess.run([*EDGEOPT, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "EDGEOPT_CACHE_DIR": str(cache), **(env or {})})


def manifests(dist: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in dist.glob("*/*/manifest.json")}


def bundle_ids(dist: Path) -> dict[str, str]:
    from edgeopt.deploy import find_bundles

    return {b.path.name: b.bundle_id for b in find_bundles(dist)}


def test_readme_model_builds_on_the_workers_with_the_local_bundles(cluster: Cluster, tmp_path):
    """cpu fp32 and intel-cpu fp32 through the scheduler: the bundle id (sha256 of manifest.json, the agent's), every
    file's sha256 and the cache key equal to a local build's, and the local build's own again (rebuilt with --force);
    intel-cpu went to the only worker offering OpenVINO; the bundles are in --out and the cache; the timings are
    beside the manifest (build-times.json)."""
    from edgeopt.fixtures import ocr_lines
    from edgeopt.targets.base import build_times

    model, lines = str(fixture("ocr-cls")), str(ocr_lines())
    common = ["build", model, *MODEL_ARGS, "--calib", lines, "-t", "cpu,intel-cpu", "-p", "fp32"]
    remote = edgeopt([*common, "--out", str(tmp_path / "remote"), "--scheduler", cluster.url], tmp_path / "c1")
    assert remote.returncode == 0, remote.stderr[-3000:]
    assert "intel-cpu fp32: on worker wa " in remote.stderr
    local = edgeopt([*common, "--out", str(tmp_path / "local")], tmp_path / "c2")
    assert local.returncode == 0, local.stderr[-3000:]
    again = edgeopt([*common, "--out", str(tmp_path / "local2"), "--force"], tmp_path / "c2")
    assert again.returncode == 0 and "taken from the cache" not in again.stdout, again.stderr[-3000:]
    r, lo = manifests(tmp_path / "remote"), manifests(tmp_path / "local")
    assert sorted(r) == ["cpu-fp32", "intel-cpu-fp32"]
    ids = [bundle_ids(tmp_path / d) for d in ("remote", "local", "local2")]
    assert ids[0] == ids[1] == ids[2] and sorted(ids[0]) == sorted(r), ids
    for name in r:
        assert r[name]["files"] == lo[name]["files"], name
        assert r[name]["build"]["cache_key"] == lo[name]["build"]["cache_key"]
        times = [build_times(next((tmp_path / d).glob(f"*/{name}"))) for d in ("remote", "local2")]
        assert all(t["build"]["time_s"] > 0 and t["host_check"]["load_s"] > 0 and t["build"]["host"]["node"]
                   for t in times), times
        key = r[name]["build"]["cache_key"]
        assert (tmp_path / "c1" / key[:2] / key / "manifest.json").is_file()  # installed in the host's cache
    # the same build again: taken from the host's cache, nothing sent to the cluster
    again = edgeopt([*common, "--out", str(tmp_path / "remote2"), "--scheduler", cluster.url], tmp_path / "c1")
    assert again.returncode == 0 and "on worker" not in again.stderr
    assert "2 of 2 bundle(s) taken from the cache" in again.stdout


def test_tensorrt_jobs_never_share_the_engine_slot_and_inputs_come_once(cluster: Cluster, tmp_path):
    """`wt` has 2 threads but one TensorRT slot: its two TensorRT jobs run one after the other (on the worker's
    clock); the first fetches the 5 inputs, the second finds them in the worker's store."""
    model = tiny_cnn(tmp_path / "tiny.onnx", seed=12)
    out = edgeopt(["build", str(model), "-t", "jetson-orin,h100", "-p", "fp32", "--out", str(tmp_path / "d"),
                   "--scheduler", cluster.url], tmp_path / "c")
    assert out.returncode == 0, out.stderr[-3000:]
    fetched = [ln for ln in out.stderr.splitlines() if ": on worker wt " in ln]
    assert len(fetched) == 2, out.stderr
    assert sum("fetched 5 input(s)" in ln for ln in fetched) == 1
    assert sum("fetched 0 input(s)" in ln and "had 5" in ln for ln in fetched) == 1
    jobs: dict[str, dict[str, float]] = {}
    for e in cluster.events():
        if e.get("name") == "wt" and e["kind"] in ("start", "finish"):
            jobs.setdefault(e["job"], {})[e["kind"]] = e["t"]
    spans = sorted((j["start"], j["finish"]) for j in jobs.values() if len(j) == 2)[-2:]
    assert len(spans) == 2
    assert spans[0][1] <= spans[1][0], spans  # the second started after the first finished


def test_no_worker_offers_the_resource_refused_in_one_line(cluster: Cluster, tmp_path):
    """A job whose resource no worker offers (here: a scheduler without workers) is refused in one line naming
    the resource, before anything is prepared (exit 3, as a target that cannot build here)."""
    model = tiny_cnn(tmp_path / "tiny.onnx", seed=13)
    bare = Cluster(tmp_path)
    try:
        bare.connect()
        out = edgeopt(["build", str(model), "-t", "cpu", "-p", "fp32", "--out", str(tmp_path / "d")],
                      tmp_path / "c", {"EDGEOPT_SCHEDULER": bare.url})  # the variable, as --scheduler
    finally:
        bare.close()
    assert out.returncode == 3, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("cpu fp32: "))
    assert "none offers the resource onnxruntime@" in line and "0 worker(s) connected" in line
    assert "preparing" not in out.stderr and "Traceback" not in out.stderr + out.stdout


def test_debug_run_and_tune_take_the_scheduler(cluster: Cluster, tmp_path):
    """`debug MODEL --scheduler`: its build runs on a worker; `debug BUNDLE` builds nothing and never asks a
    scheduler ($EDGEOPT_SCHEDULER unreachable: untouched); `run --scheduler` and `tune --scheduler` unreachable: exit 4
    before anything is prepared."""
    model = tiny_cnn(tmp_path / "tiny.onnx", seed=20)
    dbg = edgeopt(["debug", str(model), "-t", "cpu", "-p", "fp32", "--dist", str(tmp_path / "d"), "--scheduler",
                   cluster.url], tmp_path / "c")
    assert dbg.returncode == 0, dbg.stderr[-3000:]
    assert "cpu fp32: on worker w" in dbg.stderr, dbg.stderr[-3000:]
    bundle = next((tmp_path / "d").glob("*/cpu-fp32"))
    gone = {"EDGEOPT_SCHEDULER": f"tcp://127.0.0.1:{free_port()}", "EDGEOPT_SCHEDULER_TIMEOUT": "2"}
    again = edgeopt(["debug", str(bundle), "--model", str(model)], tmp_path / "c", gone)
    assert again.returncode == 0 and "unreachable" not in again.stderr, again.stderr[-2000:]
    run = edgeopt(["run", str(model), "-t", "cpu", "-p", "fp32", "--out", str(tmp_path / "r"), "--db",
                   str(tmp_path / "r.db"), "--scheduler", gone["EDGEOPT_SCHEDULER"]], tmp_path / "c", gone)
    tune = edgeopt(["tune", str(model), "-t", "cpu", "--dist", str(tmp_path / "t"), "--db", str(tmp_path / "t.db"),
                    "--scheduler", gone["EDGEOPT_SCHEDULER"]], tmp_path / "c", gone)
    for out in (run, tune):
        assert out.returncode == 4, out.stderr[-2000:]
        assert f"scheduler {gone['EDGEOPT_SCHEDULER']} unreachable" in out.stderr
        assert "preparing" not in out.stderr and "Traceback" not in out.stderr


def test_unreachable_scheduler_exit_4_before_preparing(tmp_path):
    model = tiny_cnn(tmp_path / "tiny.onnx", seed=14)
    url = f"tcp://127.0.0.1:{free_port()}"
    env = {"EDGEOPT_SCHEDULER_TIMEOUT": "2"}
    out = edgeopt(["build", str(model), "-t", "cpu", "--out", str(tmp_path / "d"), "--scheduler", url],
                  tmp_path / "c", env)
    assert out.returncode == 4, out.stderr
    assert sum(f"scheduler {url} unreachable" in ln for ln in out.stderr.splitlines()) == 1, out.stderr
    assert "preparing" not in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").rglob("manifest.json"))
    # auto: the line, then the build here
    auto = edgeopt(["build", str(model), "-t", "cpu", "-p", "fp32", "--out", str(tmp_path / "d"),
                    "--scheduler", "auto"], tmp_path / "c", {**env, "EDGEOPT_SCHEDULER": url})
    assert auto.returncode == 0, auto.stderr
    assert f"scheduler {url} unreachable" in auto.stderr and "building on this host (--scheduler auto)" in auto.stderr
    # a malformed address: bad input
    bad = edgeopt(["build", str(model), "-t", "cpu", "--scheduler", "http://x"], tmp_path / "c")
    assert bad.returncode == 2 and "is not a scheduler address" in bad.stderr and "Traceback" not in bad.stderr


def test_worker_resources_and_cluster_status(cluster: Cluster, tmp_path):
    dry = subprocess.run([*EDGEOPT, "worker", "--scheduler", cluster.url, "--only", "onnxruntime,openvino",
                          "--resources", "tensorrt=1", "--dry-run"], capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "distributed.cli.dask_worker" in dry.stdout
    res = dry.stdout.split("--resources ")[1]
    assert "onnxruntime@" in res and "openvino@" in res and "tensorrt@" in res and "tflite@" not in res
    st = subprocess.run([*EDGEOPT, "cluster", "status", "--scheduler", cluster.url, "--json"], capture_output=True,
                        text=True, timeout=120)
    assert st.returncode == 0, st.stderr
    info = json.loads(st.stdout)
    by = {w["name"]: w for w in info["workers"]}
    assert set(by) >= {"wa", "wb", "wt"}
    assert by["wb"]["builds"] == ["onnxruntime=1", "openvino=1 (other versions)"]
    assert by["wb"]["differs"] and by["wb"]["differs"][0].startswith("openvino")
    assert by["wt"]["builds"] == ["tensorrt=1"] and by["wt"]["nthreads"] == 2
    assert any(b.startswith("openvino=") for b in by["wa"]["builds"])
    assert not by["wa"]["differs"] and not by["wt"]["differs"]
    text = subprocess.run([*EDGEOPT, "cluster", "status", "--scheduler", cluster.url], capture_output=True, text=True,
                          timeout=120).stdout
    assert "worker wb: converter versions or edgeopt code differ from this host's" in text
    bad = subprocess.run([*EDGEOPT, "worker", "--scheduler", cluster.url, "--only", "tpu", "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "not a backend" in bad.stderr and "Traceback" not in bad.stderr


def test_a_worker_running_other_edgeopt_code_gets_no_job(own_cluster: Cluster, tmp_path):
    """A worker whose edgeopt code differs from the host's (here: a copy of the package with one line added, imported
    through PYTHONPATH, as a worker not restarted after a change): named by `cluster status`, offered nothing this host
    builds -- a job is refused in one line (exit 3), not built into a bundle that is not the host's."""
    import importlib
    import shutil

    c = own_cluster
    py = tmp_path / "py"
    shutil.copytree(Path(importlib.import_module("edgeopt").__path__[0]), py / "edgeopt", ignore=shutil.ignore_patterns("__pycache__"))
    with open(py / "edgeopt" / "ui.py", "a") as f:
        f.write("\n# a local change this worker runs and the host does not\n")
    c.worker("patched", "--only", "onnxruntime", env={"PYTHONPATH": str(py)})
    c.wait_for("patched")
    st = edgeopt(["cluster", "status", "--scheduler", c.url, "--json"], tmp_path / "c")
    assert st.returncode == 0, st.stderr
    w = next(w for w in json.loads(st.stdout)["workers"] if w["name"] == "patched")
    assert w["builds"] == ["onnxruntime=1 (other versions)"] and "edgeopt code" in w["differs"][0], w
    model = tiny_cnn(tmp_path / "tiny.onnx", seed=21)
    out = edgeopt(["build", str(model), "-t", "cpu", "-p", "fp32", "--out", str(tmp_path / "d"), "--scheduler", c.url],
                  tmp_path / "c")
    assert out.returncode == 3, out.stderr[-2000:]
    assert "none offers the resource onnxruntime@" in out.stdout and "edgeopt code" in out.stdout, out.stdout


def test_worker_killed_mid_build_job_runs_again_elsewhere(own_cluster: Cluster, tmp_path):
    """The only worker is frozen then killed once the job has started on it; a second worker joins; the job
    runs again there, the build completes, and the summary says so."""
    c = own_cluster
    c.worker("k1", "--only", "onnxruntime")
    c.wait_for("k1")
    model = tiny_cnn(tmp_path / "tiny.onnx", seed=15)
    proc = subprocess.Popen([*EDGEOPT, "build", str(model), "-t", "cpu", "-p", "fp32", "--out", str(tmp_path / "d"),
                             "--scheduler", c.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "EDGEOPT_CACHE_DIR": str(tmp_path / "c")})
    lines: list[str] = []
    killed = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if ": on worker k1 " in line and not killed.is_set():
                c.kill("k1", signal.SIGSTOP)  # frozen at once: the build cannot finish before the kill
                if not any("cpu fp32: done" in ln for ln in lines):
                    c.kill("k1")
                    killed.set()
                    c.worker("k2", "--only", "onnxruntime")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert proc.stdout is not None
    stdout = proc.stdout.read()  # (stderr is the reader's alone)
    proc.wait(timeout=600)
    reader.join(timeout=60)
    assert killed.is_set(), "".join(lines)
    assert proc.returncode == 0, "".join(lines) + stdout
    assert any(": on worker k2 " in ln for ln in lines), "".join(lines)
    # the inputs were held by k1 alone (the only worker when they were shipped): shipped again for k2
    assert any("shipping the inputs again" in ln for ln in lines), "".join(lines)
    assert "worker k1" in stdout and "was lost mid-build; the job runs again on k2" in stdout
    assert (tmp_path / "d" / "tiny" / "cpu-fp32" / "manifest.json").is_file() or any(
        (tmp_path / "d").glob("*/cpu-fp32/manifest.json"))


@pytest.mark.slow  # ~30 s: two more workers and two builds; the refusal path is plain code beside the CI ones
def test_a_bundle_that_does_not_match_its_manifest_is_refused_and_rebuilt(own_cluster: Cluster, tmp_path):
    """A worker whose bundles come back damaged (its preload flips a byte of every artifact it sends) next to a
    sound one: its bundle is refused on the manifest's hashes and built again on the sound worker."""
    c = own_cluster
    preload = Path(__file__).with_name("damaging_worker.py")
    c.worker("bad", "--only", "onnxruntime", "--", "--preload", str(preload))
    c.worker("good", "--only", "onnxruntime")
    c.wait_for("bad", "good")
    model = tiny_cnn(tmp_path / "tiny.onnx", seed=16)
    d1 = tiny_cnn(tmp_path / "other.onnx", seed=17)
    outs = []

    def build(m: Path, out: str) -> None:
        outs.append(edgeopt(["build", str(m), "-t", "cpu", "-p", "fp32", "--out", str(tmp_path / out),
                             "--scheduler", c.url], tmp_path / f"c-{out}"))

    # two builds at once: the scheduler gives each idle worker one
    ts = [threading.Thread(target=build, args=(model, "d1")), threading.Thread(target=build, args=(d1, "d2"))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=600)
    assert all(o.returncode == 0 for o in outs), [o.stderr[-2000:] for o in outs]
    refused = [o for o in outs if "refused the bundle from worker bad" in o.stdout]
    if not refused and not any(": on worker bad " in o.stderr for o in outs):
        pytest.skip("the scheduler gave the damaging worker no job this time (both went to the other)")
    assert refused, [o.stdout for o in outs]
    assert "sha256 does not match the manifest" in refused[0].stdout
    assert ": on worker good " in refused[0].stderr


def test_help_stays_light():
    """`edgeopt --help` and `edgeopt build --help` never import dask."""
    code = ("import sys; from edgeopt.cli import main\n"
            "try:\n    main(['build', '--help'])\nexcept SystemExit:\n    pass\n"
            "print('distributed' in sys.modules, 'dask' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "False False", out.stdout + out.stderr


@pytest.mark.slow  # ~20 s: a TLS scheduler and worker of its own
def test_tls_scheduler_worker_and_build(tmp_path):
    """tls://: a scheduler, an `edgeopt worker` and a build with certificates from a CA made here (openssl); a plain
    tcp:// client of that scheduler is refused (exit 4), a tls:// one without certificates is bad input (exit 2)."""
    import shutil

    if not shutil.which("openssl"):
        pytest.skip("no openssl to make the test CA")
    d = tmp_path / "pki"
    d.mkdir()

    def ssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=120)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=edgeopt-test-ca")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr", "-subj", "/CN=127.0.0.1")
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "node.pem",
        "-days", "2", "-extfile", "ext.cnf")
    tls = {"EDGEOPT_TLS_CA": str(d / "ca.pem"), "EDGEOPT_TLS_CERT": str(d / "node.pem"),
           "EDGEOPT_TLS_KEY": str(d / "node.key")}
    port = free_port()
    url = f"tls://127.0.0.1:{port}"
    procs = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                               str(port), "--protocol", "tls", "--tls-ca-file", tls["EDGEOPT_TLS_CA"], "--tls-cert",
                               tls["EDGEOPT_TLS_CERT"], "--tls-key", tls["EDGEOPT_TLS_KEY"], "--no-dashboard"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)]
    try:
        procs.append(subprocess.Popen([*EDGEOPT, "worker", "--scheduler", url, "--name", "tw", "--only", "onnxruntime"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                      env={**os.environ, **tls, "EDGEOPT_CACHE_DIR": str(tmp_path / "store")}))
        import time

        deadline = time.monotonic() + 180
        while True:  # the worker registered (status over TLS)
            st = edgeopt(["cluster", "status", "--scheduler", url, "--json"], tmp_path / "c", tls, timeout=300)
            if st.returncode == 0 and any(w["name"] == "tw" for w in json.loads(st.stdout)["workers"]):
                break
            assert time.monotonic() < deadline, st.stdout + st.stderr
            time.sleep(1)
        model = tiny_cnn(tmp_path / "tiny.onnx", seed=18)
        out = edgeopt(["build", str(model), "-t", "cpu", "-p", "fp32", "--out", str(tmp_path / "d"), "--scheduler", url],
                      tmp_path / "c", tls)
        assert out.returncode == 0 and ": on worker tw (tls://" in out.stderr, out.stderr[-2000:]
        plain = edgeopt(["cluster", "status", "--scheduler", f"tcp://127.0.0.1:{port}"], tmp_path / "c",
                        {"EDGEOPT_SCHEDULER_TIMEOUT": "3"})
        assert plain.returncode == 4 and "unreachable" in plain.stderr
        bare = edgeopt(["cluster", "status", "--scheduler", url], tmp_path / "c",
                       {k: "" for k in tls})
        assert bare.returncode == 2 and "tls:// scheduler needs" in bare.stderr and "Traceback" not in bare.stderr
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=60)


def test_python_api_builds_on_the_cluster(cluster: Cluster, tmp_path, monkeypatch):
    """``edgeopt.build(..., scheduler=URL)``: the same session path as the CLI; the progress lines name the worker."""
    import edgeopt

    monkeypatch.setenv("EDGEOPT_CACHE_DIR", str(tmp_path / "c"))
    lines: list[str] = []
    report = edgeopt.build(tiny_cnn(tmp_path / "tiny.onnx", seed=19), "cpu", precision="fp32", dist=str(tmp_path / "d"),
                           scheduler=cluster.url, progress=lines.append)
    assert report.ok and report.results[0].status == "built"
    assert any(": on worker w" in ln for ln in lines), lines
    from edgeopt import cluster as mod

    assert mod.ACTIVE is None  # the session is closed with the build


def test_int8_variants_are_made_and_judged_on_the_workers(cluster: Cluster, tmp_path):
    """The cpu INT8 search's grid (issue 44): a calibration method's variants are Dask tasks (made from the float
    model and the method's ranges, judged by the search's own rule), each variant's record names the worker that
    made it, and each judges exactly as in a local build (the same QDQ models: equal metrics and verdicts); the pick
    is timed in the job."""
    model = tiny_cnn(tmp_path / "tiny.onnx", seed=31)
    common = ["build", str(model), "-t", "cpu", "-p", "int8", "--calib-count", "16", "--val-count", "8",
              "--option", "int8_budget_s=300"]
    remote = edgeopt([*common, "--out", str(tmp_path / "remote"), "--scheduler", cluster.url], tmp_path / "c1")
    assert remote.returncode == 0, remote.stderr[-3000:]
    assert "made and judged on the cluster's workers" in remote.stderr, remote.stderr[-3000:]
    local = edgeopt([*common, "--out", str(tmp_path / "local")], tmp_path / "c2")
    assert local.returncode == 0, local.stderr[-3000:]

    def variants(dist: Path) -> list[dict]:
        return manifests(dist)["cpu-int8"]["options"]["int8"]["variants"]  # the search's record of each

    far, near = variants(tmp_path / "remote"), variants(tmp_path / "local")
    grid = [v for v in far if v["step"] == "grid"]
    assert len(grid) >= 2 and all(v.get("made_on") in ("wa", "wb", "wt") for v in grid), grid
    assert not any("made_on" in v for v in near)
    by_label = {v["label"]: v for v in near}
    for v in grid:
        assert (v["passed"], v["metrics"]) == (by_label[v["label"]]["passed"], by_label[v["label"]]["metrics"]), v


def test_openvino_int8_variants_are_made_on_the_workers_that_offer_openvino(cluster: Cluster, tmp_path):
    """intel-cpu INT8 (NNCF) through the scheduler: every planned variant made and judged as a task, only on a
    worker offering this host's OpenVINO resource (`wa`: `wb` offers another version, `wt` none), each judged
    as a local build judges it (the same verdicts), the job's record naming where each was made."""
    model = tiny_cnn(tmp_path / "tiny.onnx", seed=32)
    common = ["build", str(model), "-t", "intel-cpu", "-p", "int8", "--calib-count", "16", "--val-count", "8",
              "--option", "int8_search=full"]
    remote = edgeopt([*common, "--out", str(tmp_path / "remote"), "--scheduler", cluster.url], tmp_path / "c1")
    local = edgeopt([*common, "--out", str(tmp_path / "local")], tmp_path / "c2")
    assert "NNCF variant(s) made and judged on the cluster's workers" in remote.stderr, remote.stderr[-3000:]
    assert remote.returncode == local.returncode, (remote.stderr[-2000:], local.stderr[-2000:])

    def tried(dist: Path, err: str) -> list[dict]:
        m = manifests(dist).get("intel-cpu-int8")
        if m is not None:
            return m["options"]["int8"]["tried"]
        return [{"variant": ln.split("INT8 variant ", 1)[1].split(":")[0].split(" ")[0],
                 "passed": "accepted by the accuracy policy" in ln}
                for ln in err.splitlines() if "INT8 variant " in ln and "by the accuracy policy" in ln]

    far, near = tried(tmp_path / "remote", remote.stderr), tried(tmp_path / "local", local.stderr)
    ran = [t for t in far if "passed" in t]
    assert len(ran) >= 2, far
    if manifests(tmp_path / "remote"):
        assert all(t.get("made_on") == "wa" for t in ran), ran
    else:
        assert all("(made on wa)" in ln for ln in remote.stderr.splitlines() if "by the accuracy policy" in ln)
    assert [(t["variant"], t["passed"]) for t in ran] == [(t["variant"], t["passed"]) for t in near if "passed" in t]

