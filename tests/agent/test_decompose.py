"""bench --profile: the stages of one request and the runtimes' own per-op profiles, on real bundles."""

from __future__ import annotations

import numpy as np
import pytest

import edgeopt
from edgeopt.fixtures import path as fixture


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("decomp")
    rep = edgeopt.build(fixture("ocr-cls"), "cpu,intel-cpu", precision="fp32", shape="x:1x3x48x192",
                        calib=str(fixture("images")), preprocess="preset=pm1", dist=tmp / "dist", calib_count=4)
    assert rep.ok, rep.results
    return tmp


def test_profile_splits_a_request_and_names_the_ops(dist):
    fleet = edgeopt.bench(dist=dist / "dist", duration=0.3, min_iters=10, warmup=2, profile=10,
                          db=str(dist / "r.db"))
    assert fleet.ok and len(fleet.records) == 2
    for rec in fleet.records:
        d = rec.bench["decomposition"]
        stages = {s["stage"]: s for s in d["stages"]}
        assert list(stages) == ["preprocess", "copy in", "compute", "copy out", "postprocess"]
        assert stages["preprocess"]["ms"] > 0 and "48x192" in stages["preprocess"]["how"]  # the declared resize
        assert stages["postprocess"]["ms"] > 0 and "argmax" in stages["postprocess"]["how"]
        assert stages["compute"]["ms"] == pytest.approx(rec.bench["latency_ms"]["p50"])
        p = d["profile"]
        want = {"cpu": "onnxruntime enable_profiling", "intel-cpu": "openvino PERF_COUNT"}[rec.bundle.target]
        assert p["profiler"] == want and p["iterations"] == 10
        assert sum(o["share"] for o in p["ops"]) == pytest.approx(1.0)
        # a CNN spends its time in convolutions: a Conv among the top 3 op types, or a fifth of the time (under
        # load a preempted op type can take two places of the top 3)
        conv = sum(o["share"] for o in p["ops"] if "Conv" in o["op"])
        assert any("Conv" in o["op"] for o in p["ops"][:3]) or conv >= 0.2, p["ops"]
        assert p["top_nodes"] and p["overhead_vs_p50"] is not None
    text = edgeopt.report(db=str(dist / "r.db"), format="table")
    assert "ms per request" in text and "top ops" in text
    page = edgeopt.report(db=str(dist / "r.db"), format="html")
    assert "Where one request's time goes" in page


def test_resize_matches_a_reference_bilinear():
    from edgeopt_agent.decompose import resize_bilinear

    img = np.arange(4 * 6 * 1, dtype=np.float32).reshape(4, 6, 1)
    out = resize_bilinear(img, 2, 3)  # exact halves: each output pixel averages a 2x2 block
    expect = img.reshape(2, 2, 3, 2, 1).mean(axis=(1, 3))
    assert np.allclose(out, expect)


def test_a_runner_without_a_profiler_says_so():
    from edgeopt_agent.runners import Runner

    class Bare(Runner):
        runtime = "bare"

        def __init__(self) -> None:  # no bundle needed for this
            self.options = {}

    assert Bare().profile([], 1) == {"available": False,
                                     "why": "bare: no per-op profiler in its Python API is wired up"}


def test_litert_says_its_python_api_has_no_op_profiler():
    from edgeopt_agent.runners.tflite import TfliteRunner

    r = TfliteRunner.__new__(TfliteRunner)  # the answer does not depend on a loaded model
    p = r.profile([], 1)
    assert p["available"] is False and "LiteRT" in p["why"] and "benchmark_model" in p["why"]


def test_postprocess_times_every_detection_format():
    """A YOLOv8 table ``[1, 4 + C, anchors]`` and an end-to-end ``[1, 300, 6]`` are decoded and timed (only YOLOX's
    grid was before); the stage names what it timed."""
    from edgeopt_agent.decompose import _postprocess_stage

    rng = np.random.default_rng(0)
    v8 = rng.random((1, 84, 8400), dtype=np.float32) * np.array([640, 640, 64, 64] + [0.1] * 80, np.float32)[None, :, None]
    v8[0, 4 + rng.integers(0, 80, 30), rng.integers(0, 8400, 30)] = 0.9  # 30 confident boxes, the rest below threshold
    e2e = np.zeros((1, 300, 6), np.float32)
    e2e[0, :5] = [[10, 10, 50, 50, 0.9 - i / 10, i] for i in range(5)]
    for out, kind, how in ((v8, "detection@yolov8", "yolov8 box decoding + NMS"),
                           (e2e, "detection@yolov10", "end-to-end rows: score threshold")):
        manifest = {"io": {"outputs": [{"name": "output0"}]}, "output_kinds": {"output0": kind}}
        st = _postprocess_stage(manifest, {"output0": out})
        assert st["ms"] is not None and st["ms"] > 0 and how in st["how"], st
