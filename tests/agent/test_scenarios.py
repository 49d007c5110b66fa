"""Load scenarios on the device: MLPerf LoadGen for real (short runs), the agent's own loops without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agent.conftest import agent


def _bench(bundle, **opts):
    rc, reply = agent("bench", {"bundle": str(bundle), "options": {"duration_s": 1.0, "timeout_s": 120, **opts}})
    return rc, reply


@pytest.mark.parametrize("scenario, extra", [
    ("single-stream", {}), ("server", {"target_qps": 50, "latency_bound_ms": 200, "latency_percentile": 90}),
    ("offline", {"target_qps": 200}), ("multi-stream", {"samples_per_query": 2}),
])
def test_loadgen_scenarios_run_and_report_loadgens_own_verdict(tiny_bundle, scenario, extra):
    pytest.importorskip("mlperf_loadgen")
    rc, reply = _bench(tiny_bundle, scenario=scenario, engine="loadgen", **extra)
    assert rc == 0, reply
    sc = reply["bench"]["scenario"]
    assert sc["engine"] == "loadgen" and sc["scenario"] == scenario and sc["valid"] in (True, False)
    assert "MLPerf Results Summary" in sc["summary_log"] and sc["latency_ms"]["p50"] > 0
    assert sc["samples_served"] > 0 and sc["seeds"]
    if scenario == "server":
        assert 20 < sc["scheduled_qps"] < 100  # Poisson arrivals at 50/s over ~1 s
        # ~50 queries in 1 s are short of LoadGen's early-stopping minimum for p90 (64): never rounded up
        if sc["completed_qps"] * 1.0 < 64:
            assert sc["valid"] is False and "Early stopping satisfied" in sc["invalid_reasons"]


def test_without_loadgen_the_agents_own_server_loop_counts_the_queue(tiny_bundle):
    rc, reply = _bench(tiny_bundle, scenario="server", engine="edgeopt", target_qps=100, latency_bound_ms=1000,
                       latency_percentile=99)
    assert rc == 0, reply
    sc = reply["bench"]["scenario"]
    assert sc["engine"] == "edgeopt" and "not LoadGen" in sc["note"]
    assert sc["bound"]["samples_needed"] == 662 and sc["valid"] is (sc["bound"]["samples"] >= 662)


@pytest.mark.parametrize("opts, msg", [
    ({"scenario": "server"}, "target_qps > 0"), ({"scenario": "server", "target_qps": 0}, "target_qps > 0"),
    ({"scenario": "burst"}, "unknown scenario"), ({"scenario": "single-stream", "samples_per_query": 4},
                                                  "multi-stream scenario only"),
    ({"scenario": "offline", "engine": "edgeopt"}, "needs LoadGen"),
    ({"scenario": "server", "target_qps": 5, "latency_percentile": 101}, "latency_percentile"),
    ({"scenario": "concurrency", "concurrency": 2, "engine": "loadgen"}, "LoadGen has no closed-loop"),
    ({"scenario": "server", "target_qps": 5, "concurrency": 2}, "concurrency scenario only"),
    ({"scenario": "concurrency", "concurrency": 0}, "from 1 to 256"),
    ({"scenario": "server", "target_qps": 5, "workers": True}, "workers must be an integer"),
    ({"scenario": "single-stream", "workers": 2, "engine": "edgeopt"}, "one query at a time"),
])
def test_scenario_options_that_make_no_sense_are_refused(tiny_bundle, opts, msg):
    rc, reply = _bench(tiny_bundle, **opts)
    assert rc == 1 and msg in reply["error"]["message"]


def test_a_closed_loop_of_clients_counts_the_wait_for_a_worker(tiny_bundle):
    """4 clients, 1 worker: every query waits for the other clients' queries, so by Little's law the
    mean latency is ~4 / throughput (it would be ~1 / throughput if the wait were not counted); with a
    worker per client each client calls the runtime itself."""
    rc, reply = _bench(tiny_bundle, scenario="concurrency", concurrency=4, workers=1)
    assert rc == 0, reply
    sc = reply["bench"]["scenario"]
    assert (sc["scenario"], sc["engine"], sc["concurrency"], sc["workers"]) == ("concurrency", "edgeopt", 4, 1)
    assert "closed loop" in sc["note"] and "not a server-scenario result" in sc["note"]
    assert len(sc["per_client_queries"]) == 4 and min(sc["per_client_queries"]) >= 16
    assert sum(sc["per_client_queries"]) == sc["queries"]
    outstanding = sc["latency_ms"]["mean"] / 1000 * sc["completed_qps"]
    assert 3.0 < outstanding <= 4.05, sc  # Little's law: L = lambda * W, L = 4 clients
    rc, reply = _bench(tiny_bundle, scenario="concurrency", concurrency=2)
    assert rc == 0 and reply["bench"]["scenario"]["workers"] == 2  # one per client by default


def test_server_workers_share_the_queue_with_and_without_loadgen(tiny_bundle):
    rc, reply = _bench(tiny_bundle, scenario="server", engine="edgeopt", target_qps=200, workers=3)
    assert rc == 0, reply
    sc = reply["bench"]["scenario"]
    assert sc["workers"] == 3 and sc["queries"] >= 64 and sc["latency_ms"]["p50"] > 0
    pytest.importorskip("mlperf_loadgen")
    rc, reply = _bench(tiny_bundle, scenario="offline", engine="loadgen", target_qps=500, workers=2)
    assert rc == 0, reply
    sc = reply["bench"]["scenario"]
    assert sc["workers"] == 2 and len(sc["served_per_worker"]) == 2 and sum(sc["served_per_worker"]) == sc[
        "samples_served"]
    assert min(sc["served_per_worker"]) > 0, sc["served_per_worker"]  # the offline burst was shared


def test_each_runtime_gives_workers_its_own_unit_of_concurrency(tiny_bundle, tmp_path):
    """ONNX Runtime: the shared session (thread-safe run); OpenVINO: a new infer request on the same
    compiled model; a runtime without either: a second loaded instance, closed with the first."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from edgeopt.pipeline import build
    from edgeopt_agent.runners import get_runner
    from tests.conftest import tiny_cnn

    def load(bundle):
        manifest = json.loads((bundle / "manifest.json").read_text())
        r = get_runner(manifest["runtime"]["name"])(bundle, manifest)
        r.load()
        return r, manifest

    ort_runner, manifest = load(tiny_bundle)
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in manifest["io"]["inputs"][0]["shape"]]
    feed = {manifest["io"]["inputs"][0]["name"]: np.random.default_rng(0).random(shape, dtype=np.float32)}
    assert ort_runner.worker() == ort_runner.run  # the same session
    ort_runner.concurrent_calls = False  # as for a runtime whose instance serves one thread
    twin = ort_runner.worker()
    assert len(ort_runner._twins) == 1 and twin != ort_runner.run
    np.testing.assert_allclose(next(iter(twin(feed).values())), next(iter(ort_runner.run(feed).values())))
    ort_runner.close_workers()
    assert ort_runner._twins == []

    rep = build(tiny_cnn(tmp_path / "tiny.onnx"), "intel-cpu", ["fp32"], out=tmp_path / "dist")
    assert rep.ok, rep.results
    ov_runner, _ = load(Path(rep.results[0].bundle))
    fns = [ov_runner.run] + [ov_runner.worker() for _ in range(3)]
    want = next(iter(ov_runner.run(feed).values()))
    with ThreadPoolExecutor(4) as pool:  # four threads at once, each calling its own infer request
        outs = [o for got in pool.map(lambda f: [next(iter(f(feed).values())) for _ in range(8)], fns) for o in got]
    assert len(outs) == 32
    for out in outs:
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scenario, extra", [("single-stream", {}), ("offline", {"target_qps": 200, "workers": 2})])
def test_loadgens_accuracy_mode_feeds_the_same_accuracy_check(ocr_cls_bundle, scenario, extra):
    """AccuracyOnly issues every validation sample through LoadGen; the outputs come back through its
    accuracy log and the host check's rule judges them: the metrics equal those of the agent's own pass."""
    pytest.importorskip("mlperf_loadgen")
    rc, reply = _bench(ocr_cls_bundle, scenario=scenario, engine="loadgen", **extra)
    assert rc == 0, reply
    b = reply["bench"]
    acc = b["scenario"]["accuracy"]
    assert acc["harness"] == f"LoadGen AccuracyOnly ({scenario})" and acc["samples"] == b["accuracy"]["samples"] >= 8
    assert acc["queries_logged"] == b["inputs"]["feeds"] and acc["same_as_direct"] and acc["passed"]
    for name, out in b["accuracy"]["outputs"].items():  # the very same outputs: the same figures
        assert acc["outputs"][name]["metrics"] == pytest.approx(out["metrics"], rel=1e-6)
    rc, reply = _bench(ocr_cls_bundle, scenario=scenario, engine="loadgen", loadgen_accuracy=False, **extra)
    assert rc == 0 and "accuracy" not in reply["bench"]["scenario"]


def test_offline_with_a_batch_counts_images_and_runs_them_batched(tiny_bundle, tmp_path):
    """Offline at batch 4: LoadGen's samples are images, served 4 per run of the batched artifact, so its
    samples/s are images/s; a server request carries one batch of 4, so its rate is x4 in images."""
    pytest.importorskip("mlperf_loadgen")
    from tests.agent.test_agent_bench import _dynamic_batch_copy

    b = _dynamic_batch_copy(tiny_bundle, tmp_path / "dyn")
    rc, reply = _bench(b, scenario="offline", engine="loadgen", target_qps=400, batch=4)
    assert rc == 0, reply
    sc = reply["bench"]["scenario"]
    assert sc["batch"] == 4 and sc["sample_is"].startswith("an image")
    assert sc["images_per_second"] == sc["samples_per_second"] and sc["samples_served"] >= 4
    assert reply["bench"]["scenario"]["accuracy"]["passed"]  # accuracy mode: one sample per batched feed
    rc, reply = _bench(b, scenario="server", engine="loadgen", target_qps=50, batch=4)
    sc = reply["bench"]["scenario"]
    assert rc == 0 and sc["sample_is"] == "a request of 4 images"
    assert sc["images_per_second"] == pytest.approx(4 * sc["completed_qps"])


def test_server_dynamic_batching_forms_batches_within_the_delay(tiny_bundle, tmp_path):
    """Server with max_queue_delay_ms: queries are images; a worker waits up to the delay for more and
    runs up to `batch` of them at once (a dynamic-batch artifact runs a partial batch as is)."""
    pytest.importorskip("mlperf_loadgen")
    from tests.agent.test_agent_bench import _dynamic_batch_copy

    b = _dynamic_batch_copy(tiny_bundle, tmp_path / "dyn")
    rc, reply = _bench(b, scenario="server", engine="loadgen", target_qps=400, batch=8, max_queue_delay_ms=20,
                       latency_bound_ms=500, latency_percentile=90)
    assert rc == 0, reply
    sc = reply["bench"]["scenario"]
    db = sc["dynamic_batching"]
    assert db["max_batch"] == 8 and db["partial_batches"] == "run as is"
    assert 1 < db["mean_batch"] <= 8  # at 400/s, a 20 ms wait gathers several queries
    assert db["batches"] < sc["samples_served"] and sc["sample_is"] == "an image (batched by the server)"
    rc, reply = _bench(b, scenario="server", engine="loadgen", target_qps=400, batch=8, max_queue_delay_ms=0)
    assert rc == 0 and reply["bench"]["scenario"]["dynamic_batching"]["mean_batch"] < db["mean_batch"]
    for opts, msg in (({"scenario": "offline", "max_queue_delay_ms": 5, "batch": 8}, "server scenario only"),
                      ({"scenario": "server", "target_qps": 10, "max_queue_delay_ms": 5}, "batch >= 2")):
        rc, reply = _bench(b, engine="loadgen", **opts)
        assert rc != 0 and msg in reply["error"]["message"], reply


def test_loadgens_logs_are_removed_once_read(tiny_bundle, tmp_path):
    """LoadGen writes its logs (a detail log of tens of MB on a long run) to a temp folder: read, then removed,
    so repeated benches cannot fill a device's disk."""
    import os

    pytest.importorskip("mlperf_loadgen")
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    rc, reply = agent("bench", {"bundle": str(tiny_bundle), "options": {
        "duration_s": 0.5, "timeout_s": 120, "scenario": "single-stream", "engine": "loadgen"}},
        env={**os.environ, "TMPDIR": str(tmp)})
    assert rc == 0, reply
    assert "MLPerf Results Summary" in reply["bench"]["scenario"]["summary_log"]
    assert reply["bench"]["scenario"]["accuracy"]["passed"]  # the AccuracyOnly run's log too
    assert not list(tmp.glob("edgeopt-loadgen-*"))
