"""bench: latency percentiles, accuracy, rotating inputs, batches, crashes and hangs, run as on a device."""

from __future__ import annotations

import json
import shutil
import signal

import numpy as np
import pytest

from tests.agent.conftest import agent

PERCENTILES = ["min", "p50", "p90", "p95", "p99", "p99_9", "max"]


@pytest.fixture(scope="module")
def ocr_bench(ocr_cls_bundle):
    """One bench of the real OCR classifier, shared by the assertions below."""
    rc, reply = agent("bench", {"bundle": str(ocr_cls_bundle),
                                "options": {"duration_s": 0.5, "min_iters": 30, "warmup": 3, "return_samples": True,
                                            "limits": {"memory_mb": 8192, "cpu_s": 120}}})
    assert rc == 0, reply
    return reply["bench"]


def test_bench_reports_ordered_percentiles_and_throughput(ocr_bench):
    lat = ocr_bench["latency_ms"]
    values = [lat[k] for k in PERCENTILES]
    assert values == sorted(values) and values[0] > 0
    assert lat["min"] <= lat["mean"] <= lat["max"] and lat["std"] >= 0
    assert ocr_bench["iterations"] >= 30 and ocr_bench["duration_s"] >= 0.5
    assert ocr_bench["throughput_ips"] == pytest.approx(ocr_bench["iterations"] / ocr_bench["duration_s"])
    assert ocr_bench["load_s"] > 0 and ocr_bench["first_inference_s"] > 0
    samples = ocr_bench["samples_ms"]
    assert len(samples) == min(ocr_bench["iterations"], 2000)
    assert min(samples) == pytest.approx(lat["min"], abs=1e-3) and max(samples) <= lat["max"] + 1e-3
    print(f"ocr-cls cpu fp32: p50 {lat['p50']:.3f} ms p99 {lat['p99']:.3f} ms, load {ocr_bench['load_s']:.3f}s, "
          f"{ocr_bench['iterations']} iterations")


def test_bench_checks_accuracy_against_the_reference_by_the_host_rule(ocr_bench):
    acc = ocr_bench["accuracy"]
    assert acc["passed"] is True and acc["precision"] == "fp32" and acc["samples"] == 8
    (out,) = acc["outputs"].values()
    assert out["metrics"]["cosine"] > 0.99999 and out["metrics"]["top1"] == 1.0


def test_bench_rotates_over_distinct_validation_inputs(ocr_bench):
    inputs = ocr_bench["inputs"]
    assert inputs["validation_samples"] == 8 and inputs["feeds"] == 8
    assert inputs["distinct_in_loop"] == 8 > 1


def test_bench_records_memory_environment_runner_and_limits(ocr_bench):
    assert ocr_bench["peak_rss_mb"] >= ocr_bench["rss_after_load_mb"] > ocr_bench["rss_before_load_mb"] > 0
    env = ocr_bench["environment"]
    assert env["cores"] >= 1 and env["cpu_model"] and env["runtimes"]["onnxruntime"]
    assert {"governor", "freq_mhz", "temperature_c", "loadavg", "threads", "after"} <= set(env)
    assert env["limits"] == {"memory_mb": 8192, "cpu_s": 120}
    assert ocr_bench["runner"]["runtime"] == "onnxruntime" and ocr_bench["runner"]["providers"] == ["CPUExecutionProvider"]
    assert ocr_bench["model"] == "ch_ppocr_mobile_v2.0_cls_infer" and ocr_bench["target"] == "cpu"
    assert len(ocr_bench["bundle_id"]) == 64


def test_bench_threads_option_reaches_the_runtime(tiny_bundle):
    rc, reply = agent("bench", {"bundle": str(tiny_bundle),
                                "options": {"duration_s": 0.1, "min_iters": 10, "threads": 1}})
    assert rc == 0 and reply["bench"]["runner"]["threads"] == 1 and reply["bench"]["environment"]["threads"] == 1
    assert reply["bench"]["accuracy"]["passed"]


def test_timed_loop_rotates_over_every_feed_and_times_each_call(tiny_bundle):
    from edgeopt_agent.bench import make_batches, timed_loop
    from edgeopt_agent.bundle import load_manifest, to_artifact, validation_inputs
    from edgeopt_agent.runners import get_runner

    manifest = load_manifest(tiny_bundle)
    _, onnx_feeds = make_batches(validation_inputs(tiny_bundle, manifest), 1)
    feeds = [to_artifact(f, manifest["io"]["inputs"]) for f in onnx_feeds]
    runner = get_runner("onnxruntime")(tiny_bundle, manifest, {"threads": 1})
    runner.load()
    seen = []

    def run(feed):
        seen.append(id(feed))
        return runner.run(feed)

    ns = timed_loop(run, feeds, min_iters=20, duration_s=0.0, capacity=4)  # grows past its capacity
    assert len(ns) == len(seen) == 20 and ns.dtype == np.int64 and (ns > 0).all()
    assert seen == [id(feeds[i % len(feeds)]) for i in range(20)]
    assert len({f["x"].tobytes() for f in feeds}) == len(feeds) == 8
    seen.clear()
    assert len(timed_loop(run, feeds, min_iters=3, duration_s=60.0, max_iters=5)) == 5 == len(seen)


def test_run_bench_in_process_gives_the_same_report(tiny_bundle):
    from edgeopt_agent.bench import run_bench

    stages = []
    res = run_bench(tiny_bundle, {"duration_s": 0.05, "min_iters": 5, "warmup": 1},
                    stage=lambda name, data: stages.append(name))
    assert stages == ["prepare", "limits", "load", "first_inference", "accuracy", "warmup", "timed", "report"]
    assert res["accuracy"]["passed"] and res["iterations"] >= 5 and "samples_ms" not in res


def _dynamic_batch_copy(bundle, dest):
    """The tiny bundle with a dynamic batch dimension ``N`` in its artifact and manifest."""
    import onnx

    from edgeopt.targets.base import write_manifest

    shutil.copytree(bundle, dest)
    model = onnx.load(str(dest / "model.onnx"))
    del model.graph.value_info[:]  # static intermediate shapes from the build would contradict N
    for vi in [*model.graph.input, *model.graph.output]:
        vi.type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.save(model, str(dest / "model.onnx"))
    manifest = json.loads((dest / "manifest.json").read_text())
    for spec in manifest["io"]["inputs"] + manifest["io"]["outputs"]:
        spec["shape"][0] = "N"
    write_manifest(dest, manifest)
    return dest


def test_bench_batch_concatenates_samples_when_the_batch_dim_is_dynamic(tmp_path, tiny_bundle):
    b = _dynamic_batch_copy(tiny_bundle, tmp_path / "dyn")
    rc, reply = agent("bench", {"bundle": str(b), "options": {"duration_s": 0.1, "min_iters": 5, "batch": 4}})
    assert rc == 0, reply
    bench = reply["bench"]
    assert bench["inputs"] == {"validation_samples": 8, "batch": 4, "feeds": 2, "distinct_in_loop": 2}
    assert bench["accuracy"]["passed"] and bench["accuracy"]["samples"] == 8
    assert bench["throughput_ips"] == pytest.approx(4 * bench["iterations"] / bench["duration_s"])


def test_bench_refuses_a_batch_a_static_bundle_cannot_take(tiny_bundle):
    rc, reply = agent("bench", {"bundle": str(tiny_bundle), "options": {"batch": 4}})
    assert rc == 1 and reply["error"]["type"] == "BenchError"
    assert "static batch of 1" in reply["error"]["message"] and "'x'" in reply["error"]["message"]


@pytest.mark.parametrize("options, words", [
    ({"duration": 1}, "unknown bench option(s) duration"),
    ({"min_iters": 0}, "min_iters must be an integer >= 1"),
    ({"duration_s": 10, "timeout_s": 5}, "must be below timeout_s"),
    ({"limits": {"ram": 5}}, "unknown limit(s) ram"),
])
def test_bench_refuses_bad_options_with_one_clear_error(tiny_bundle, options, words):
    rc, reply = agent("bench", {"bundle": str(tiny_bundle), "options": options})
    assert rc == 1 and reply["error"]["type"] == "BenchError" and words in reply["error"]["message"]


@pytest.mark.skipif(not hasattr(signal, "SIGXCPU"), reason="RLIMIT_CPU/SIGXCPU are POSIX")
def test_a_runtime_killed_by_a_signal_is_reported_as_crashed(tiny_bundle):
    # ONNX Runtime turns RLIMIT_AS allocation failures into clean exceptions, so the honest way to
    # kill it mid-inference is the kernel: RLIMIT_CPU sends SIGXCPU once the child used 1 CPU second.
    rc, reply = agent("bench", {"bundle": str(tiny_bundle),
                                "options": {"duration_s": 60, "timeout_s": 120, "limits": {"cpu_s": 1}}})
    assert rc == 1 and reply["error"]["type"] == "RuntimeCrashed"
    assert f"signal {int(signal.SIGXCPU)} (SIGXCPU)" in reply["error"]["message"]
    assert reply["bench"]["signal"] == int(signal.SIGXCPU) and reply["bench"]["elapsed_s"] < 60
    assert reply["bench"]["stage"] in ("warmup", "timed", "accuracy") and reply["bench"]["load_s"] > 0


def test_a_runtime_that_overruns_timeout_is_killed_and_reported_as_hung(ocr_cls_bundle):
    # ~2 ms per inference x 10 million iterations: far beyond a 2.5 s timeout.
    rc, reply = agent("bench", {"bundle": str(ocr_cls_bundle),
                                "options": {"duration_s": 0.5, "min_iters": 10_000_000, "timeout_s": 2.5}})
    assert rc == 1 and reply["error"]["type"] == "RuntimeHung"
    assert "timeout_s=2.5" in reply["error"]["message"] and "the timed loop" in reply["error"]["message"]
    assert 2.5 <= reply["bench"]["elapsed_s"] < 30 and reply["bench"]["stage"] == "timed"


def test_memory_limit_below_the_agents_own_footprint_is_refused_clearly(tiny_bundle):
    rc, reply = agent("bench", {"bundle": str(tiny_bundle), "options": {"duration_s": 0.1, "limits": {"memory_mb": 16}}})
    assert rc == 1 and reply["error"]["type"] == "BenchError"
    assert "limits.memory_mb 16 is below the agent's own address space" in reply["error"]["message"]


def test_bench_resets_a_runners_own_timings_after_warmup(tiny_bundle, monkeypatch):
    """A runner's per-phase timings (TensorRT's H2D/compute/D2H) cover the timed runs only."""
    import edgeopt_agent.bench as bench
    from edgeopt_agent.runners.onnxruntime import OnnxRuntimeRunner

    class PhaseTimed(OnnxRuntimeRunner):
        runs = 0

        def run(self, feed):
            self.runs += 1
            return super().run(feed)

        def reset_timings(self) -> None:
            self.runs = 0

        def info(self):
            return {**super().info(), "timings_ms": {"runs": self.runs}}

    monkeypatch.setattr(bench, "open_runner", lambda bundle, manifest, opts: PhaseTimed(bundle, manifest, opts))
    res = bench.run_bench(tiny_bundle, {"duration_s": 0.05, "min_iters": 5, "warmup": 3})
    assert res["iterations"] >= 5
    assert res["runner"]["timings_ms"]["runs"] == res["iterations"]  # not + first run, accuracy pass, warm-up
