"""mobile's buckets form (issue 42): one static TFLite file per bucket where one file cannot take the variable
axis (onnx2tf on MiniLM, the OCR recogniser), every request run by the file of its bucket (``BucketRunner``)
and checked at its own length against FP32 run unpadded. Built here on the melspectrogram (three onnx2tf
conversions, ~40 s) with ``--option shape_form=buckets``; ``auto`` choosing it for MiniLM is in
docs/BENCHMARKS.md (bench:varlen-buckets: MiniLM converts for minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import edgeopt
from edgeopt.errors import BuildFailed
from edgeopt.targets.buckets import combos, tag
from tests.conftest import fixture
from tests.shapes import data


def test_axes_with_the_same_buckets_vary_together_others_combine():
    same = {"input_ids": [{"axis": 1, "buckets": [32, 16]}], "attention_mask": [{"axis": 1, "buckets": [16, 32]}]}
    plan = combos(same)
    assert plan == [{("input_ids", 1): 16, ("attention_mask", 1): 16}, {("input_ids", 1): 32, ("attention_mask", 1): 32}]
    assert [tag(c) for c in plan] == ["bucket-16", "bucket-32"]
    two = combos({"x": [{"axis": 2, "buckets": [16, 32]}, {"axis": 3, "buckets": [64, 96, 128]}]})
    assert len(two) == 6 and tag(two[-1]) == "bucket-32x128"
    with pytest.raises(BuildFailed, match="range 1..128"):
        combos({"input_ids": [{"axis": 1, "range": [1, 128]}]})
    with pytest.raises(BuildFailed, match="9 files"):
        combos({"x": [{"axis": 2, "buckets": [1, 2, 3]}, {"axis": 3, "buckets": [4, 5, 6]}]})


@pytest.fixture(scope="module")
def bucketed(tmp_path_factory):
    pytest.importorskip("onnx2tf")
    d = tmp_path_factory.mktemp("buckets")
    mel = data.melspec(d / "mel.npz", count=16)
    rep = edgeopt.build(fixture("oww-melspec"), "mobile", precision="fp32", shape="input:1x8000|16000|32000",
                        calib=str(mel), calib_count=6, val_count=10, dist=str(d / "dist"),
                        option=["shape_form=buckets"])
    r = rep.results[0]
    assert r.status == "built", r.error
    return Path(r.bundle), json.loads((Path(r.bundle) / "manifest.json").read_text())


def test_a_static_file_per_bucket_each_request_at_its_bucket_matches_fp32(bucketed):
    from ai_edge_litert.interpreter import Interpreter

    bundle, m = bucketed
    assert m["shape_form"]["form"] == "buckets" and m["host_check"]["passed"]
    listed = m["runtime"]["buckets"]
    assert [b["shapes"]["input"] for b in listed] == [[1, 8000], [1, 16000], [1, 32000]]
    assert m["runtime"]["artifact"] == listed[-1]["artifact"]  # the top bucket's file: the IO spec's shape
    for b in listed:  # each file static at its own bucket, hashed in the bundle's file table
        it = Interpreter(model_path=str(bundle / b["artifact"]))
        assert list(it.get_input_details()[0]["shape_signature"]) == b["shapes"]["input"]
        assert b["artifact"] in m["files"]
    per = m["host_check"]["per_length"]
    own = {int(p["length"].split("=")[1]): int(p["ran_at"].split("=")[1]) for p in per}
    assert len(set(own.values())) >= 2  # several buckets ran
    assert all(at == min(b for b in (8000, 16000, 32000) if b >= size) for size, at in own.items())
    assert min(p["cosine"] for p in per) > 0.9999


def test_the_agent_benches_each_bucket_in_its_own_file(bucketed):
    from edgeopt_agent.bench import BenchError, run_bench
    from edgeopt_agent.runners import BucketRunner, open_runner

    bundle, m = bucketed
    b = run_bench(str(bundle), {"duration_s": 0.5, "min_iters": 12, "warmup": 2, "seed": 0,
                                "lengths": [6000, 12000, 30000]})
    assert sorted(b["varlen"]["buckets"]) == ["input[1]=16000", "input[1]=32000", "input[1]=8000"]
    runner = open_runner(bundle, m)
    assert isinstance(runner, BucketRunner) and len(runner.inner) == 3
    runner.load()
    try:
        out = runner.run({"input": np.zeros((1, 16000), np.float32)})
        assert next(iter(out.values())).shape[-2] < runner.run({"input": np.zeros((1, 32000), np.float32)})[
            next(iter(out))].shape[-2]
        with pytest.raises(ValueError, match="no bucket's file takes input shapes input\\[1, 12000\\]"):
            runner.run({"input": np.zeros((1, 12000), np.float32)})
    finally:
        runner.close()
    with pytest.raises(BenchError, match="past the largest bucket 32000"):
        run_bench(str(bundle), {"duration_s": 0.2, "min_iters": 2, "warmup": 0, "lengths": [40000]})


def test_intel_cpu_int8_a_calibrated_ir_per_bucket(tmp_path):
    """OpenVINO offers the form too (auto: only where its bounded dynamic IR fails): each bucket's IR calibrated
    by NNCF on the samples cut or padded to it and judged by the INT8 rule, the agent running each request in
    its bucket's IR."""
    pytest.importorskip("openvino")
    mel = data.melspec(tmp_path / "mel.npz", count=16)
    rep = edgeopt.build(fixture("oww-melspec"), "intel-cpu", precision="int8", shape="input:1x8000|16000|32000",
                        calib=str(mel), calib_count=6, val_count=10, dist=str(tmp_path / "dist"),
                        option=["shape_form=buckets", "int8_tolerance=rel_l2_max=0.5,cosine_min=0.95"])
    r = rep.results[0]
    assert r.status == "built", r.error
    m = json.loads((Path(r.bundle) / "manifest.json").read_text())
    assert m["shape_form"]["form"] == "buckets" and m["host_check"]["passed"]
    assert [b["artifact"] for b in m["runtime"]["buckets"]] == [f"bucket-{n}/model.xml" for n in (8000, 16000, 32000)]
    assert all((Path(r.bundle) / b["artifact"]).with_suffix(".bin").is_file() for b in m["runtime"]["buckets"])
    ran = {p["ran_at"] for p in m["host_check"]["per_length"]}
    assert len(ran) >= 2 and ran <= {"input[1]=8000", "input[1]=16000", "input[1]=32000"}


def test_pushed_to_the_local_device_and_benched_per_bucket(bucketed, tmp_path):
    """The whole path: the bundle's bucket folders pushed into the device's store (every file verified by
    hash) and benched there, each bucket in its own file."""
    bundle, _ = bucketed
    res = edgeopt.bench(dist=str(bundle.parents[1]), targets="mobile", duration=0.3, min_iters=12, warmup=2,
                        db=str(tmp_path / "r.db"))
    (rec,) = res.records
    assert sorted(rec.raw["bench"]["varlen"]["buckets"]) == ["input[1]=16000", "input[1]=32000", "input[1]=8000"]
    assert rec.raw["bench"]["runner"]["buckets"] == 3


def test_buckets_form_on_a_range_is_refused_in_one_line(tmp_path):
    """A file per bucket needs buckets: asked on a range it is exit 2 in one line, before anything is written."""
    import subprocess
    import sys

    dist = tmp_path / "dist"
    p = subprocess.run([sys.executable, "-m", "edgeopt", "build", str(fixture("oww-melspec")), "-t", "mobile", "-p",
                        "fp32", "--shape", "input:1x4000..32000", "--option", "shape_form=buckets", "-o", str(dist)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    assert "needs buckets on every variable axis; input[1] is a range" in p.stderr.strip().splitlines()[0]
    assert "Traceback" not in p.stderr and not dist.exists()
