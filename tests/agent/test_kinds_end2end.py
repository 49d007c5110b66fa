"""YOLOv10-style end-to-end detection output (issue 26): ``[1, 300, 6]`` rows ``x1, y1, x2, y2, score, class``,
NMS-free, sorted by score, is a detection kind -- inferred from its values, or named by option -- judged on
``box_match`` like the other detection kinds, and the gate's per-sample decisions on a detector follow the
build check's rule (boxes matched one to one, same class, IoU >= 0.5), through ``compare``'s own decoder.

The model is real: the YOLOv8-style conv head of test_layout_checks with a real end-to-end post-processing
graph after it (corners, best class, TopK 300, Gather), run by ONNX Runtime on images of bright squares;
its INT8 versions are ONNX Runtime's own static quantizer's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeopt_agent.compare import (
    compare_outputs,
    detection_metrics,
    end2end_boxes,
    infer_kind,
    parse_kind,
    yolo_boxes,
)
from edgeopt_agent.paired import pair_decisions
from tests.agent.test_layout_checks import _quantize, yolov8_head

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

HW, K = 160, 300


def yolov10_end2end(path, hw: int = HW, k: int = K, classes: int = 6, cls_bias: float = -2.2) -> str:
    """images [1, 3, hw, hw] -> the YOLOv8-style head ``[1, 4 + C, anchors]`` -> Transpose, Split into
    centre/size and class scores, corners, best score and its class (ReduceMax, ArgMax), TopK ``k`` (sorted),
    Gather -> ``output0 [1, k, 6]`` (YOLOv10's / YOLO26's end-to-end layout).  ``cls_bias`` puts the score
    threshold (0.25) between the background's and the squares' responses."""
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(yolov8_head(str(path) + ".head.onnx", classes=classes, hw=hw))
    g = model.graph
    for init in g.initializer:
        if init.name == "cls_b":
            init.CopyFrom(numpy_helper.from_array(np.full(classes, cls_bias, np.float32), "cls_b"))
    for n in g.node:
        n.output[:] = ["raw" if o == "output0" else o for o in n.output]
    for arr, name in ((np.array([4, classes], np.int64), "split_bc"), (np.array([2, 2], np.int64), "split_xy"),
                      (np.array(0.5, np.float32), "half"), (np.array([k], np.int64), "k"),
                      (np.array([0], np.int64), "ax0"), (np.array([1], np.int64), "ax1")):
        g.initializer.append(numpy_helper.from_array(arr, name))
    n = helper.make_node
    g.node.extend([
        n("Transpose", ["raw"], ["rows"], perm=[0, 2, 1]),
        n("Split", ["rows", "split_bc"], ["cxcywh", "scores"], axis=2),
        n("Split", ["cxcywh", "split_xy"], ["cxcy", "wh"], axis=2),
        n("Mul", ["wh", "half"], ["half_wh"]),
        n("Sub", ["cxcy", "half_wh"], ["x1y1"]), n("Add", ["cxcy", "half_wh"], ["x2y2"]),
        n("Concat", ["x1y1", "x2y2"], ["xyxy"], axis=2),
        n("ReduceMax", ["scores"], ["best"], axes=[2], keepdims=0),
        n("ArgMax", ["scores"], ["best_class"], axis=2, keepdims=0),
        n("TopK", ["best", "k"], ["top_v", "top_i"], axis=1, largest=1, sorted=1),
        n("Squeeze", ["xyxy", "ax0"], ["xyxy0"]), n("Squeeze", ["top_i", "ax0"], ["idx"]),
        n("Squeeze", ["best_class", "ax0"], ["class0"]), n("Squeeze", ["top_v", "ax0"], ["v0"]),
        n("Gather", ["xyxy0", "idx"], ["b_sel"], axis=0), n("Gather", ["class0", "idx"], ["c_sel"], axis=0),
        n("Cast", ["c_sel"], ["c_self"], to=TensorProto.FLOAT),
        n("Unsqueeze", ["c_self", "ax1"], ["c_col"]), n("Unsqueeze", ["v0", "ax1"], ["v_col"]),
        n("Concat", ["b_sel", "v_col", "c_col"], ["det"], axis=1),
        n("Unsqueeze", ["det", "ax0"], ["output0"]),
    ])
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, k, 6]))
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


def squares(n: int, seed: int) -> list[np.ndarray]:
    """Dark noisy images with 2-5 bright squares (16-48 px): the objects."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.uniform(0, 0.2, (1, 3, HW, HW)).astype(np.float32)
        for _ in range(int(rng.integers(2, 6))):
            size = int(rng.integers(16, 48))
            y0, x0 = rng.integers(0, HW - size, 2)
            x[0, :, y0:y0 + size, x0:x0 + size] = rng.uniform(0.7, 1.0, (3, 1, 1))
        out.append(x)
    return out


def _run(path, feeds) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.stack([sess.run(None, {"images": x})[0] for x in feeds])


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    d = tmp_path_factory.mktemp("yolov10")
    model = yolov10_end2end(d / "yolov10.onnx")
    calib, val = squares(8, 1), squares(8, 2)
    (d / "int8").mkdir()  # the same model's name: a gate compares two versions of one model
    per_tensor = _quantize(model, d / "int8" / "yolov10.onnx", calib)  # ORT's defaults: the Concat per-tensor
    return {"dir": d, "model": model, "per_tensor_model": per_tensor, "calib": calib, "ref": _run(model, val),
            "per_tensor": _run(per_tensor, val),
            "convs": _run(_quantize(model, d / "int8-convs.onnx", calib, op_types_to_quantize=["Conv"],
                                    per_channel=True), val)}


def test_end2end_output_is_inferred_from_its_values_and_named_by_option(e2e):
    ref = e2e["ref"]
    assert ref.shape == (8, 1, K, 6)
    assert np.all(np.diff(ref[..., 4], axis=-1) <= 0)  # sorted by score (TopK)
    assert infer_kind("output0", ref) == {"kind": "detection", "format": "yolov10"}
    assert infer_kind("output0", ref[:, 0]) == {"kind": "detection", "format": "yolov10"}  # no leading 1
    for spec in ("detection@yolov10", "detection@end2end", "detection@yolo26"):
        assert parse_kind(spec) == {"kind": "detection", "format": "yolov10"}
    assert parse_kind("detection@yolov8") == {"kind": "detection", "format": "yolov8"}
    boxes = [end2end_boxes(r) for r in ref]
    assert 20 <= sum(len(b) for b, _ in boxes) < 8 * K  # boxes to judge, not every row
    assert all(np.all(b[:, 2:] >= b[:, :2]) for b, _ in boxes)
    # the same rows read as a YOLOv8 head would be wrong: a class id is not a class score
    assert not np.array_equal(yolo_boxes(ref[0], channels_first=False)[0], boxes[0][0])
    # not evident: scores not in order, or a fractional "class" column
    shuffled = ref[:, :, ::-1].copy()
    assert infer_kind("output0", shuffled)["kind"] != "detection" or infer_kind("output0", shuffled)["format"] != "yolov10"
    frac = ref.copy()
    frac[..., 5] += 0.5
    assert infer_kind("output0", frac).get("format") != "yolov10"


def test_int8_that_loses_every_box_fails_a_correct_one_passes(e2e):
    ref = e2e["ref"]
    bad = compare_outputs({"output0": e2e["per_tensor"]}, {"output0": ref}, "int8")
    o = bad["outputs"]["output0"]
    assert o["kind"] == "detection" and not bad["passed"] and "box_match" in o["failed"]
    assert o["metrics"]["boxes_out"] == 0 and o["metrics"]["box_recall"] == 0.0
    good = compare_outputs({"output0": e2e["convs"]}, {"output0": ref}, "int8")
    m = good["outputs"]["output0"]["metrics"]
    assert good["passed"], good["summary"]
    assert m["box_recall"] >= 0.9 and m["box_precision"] >= 0.9 and m["detections_compared"] > 0
    # the option names the kind whatever inference says; judged alike
    named = compare_outputs({"output0": e2e["convs"]}, {"output0": ref}, "int8", kinds={"output0": "detection@yolov10"})
    assert named["passed"] and named["outputs"]["output0"]["metrics"]["box_match"] == m["box_match"]


def test_rows_swapped_by_a_near_tie_are_the_same_detections(e2e):
    """Two rows of (nearly) equal score swap places under any noise: row by row the tensor differs, the
    detections do not. The tensor and per-slice figures are the matched detections'."""
    ref = e2e["ref"]
    out = ref.copy()
    out[:, :, [0, 1]] = out[:, :, [1, 0]]
    out[:, :, 0, 4] = out[:, :, 1, 4]  # a tie: still sorted
    res = compare_outputs({"output0": out}, {"output0": ref}, "fp32")
    assert res["passed"], res["summary"]
    assert res["outputs"]["output0"]["metrics"]["box_match"] == 1.0
    raw = compare_outputs({"output0": out}, {"output0": ref}, "fp32", kinds={"output0": "dense"})
    assert not raw["passed"]  # what judging the rows as a map would have said


def test_gate_decisions_on_a_detector_follow_the_build_checks_rule(e2e):
    """``pair_decisions`` counts a detector by the box, as the build check's ``box_match`` does (boxes matched one
    to one, over the larger set of each image), with compare's own decoder: the plain comparison the host makes
    counts exactly the boxes that differ."""
    kind = {"kind": "detection", "format": "yolov10"}
    ref = list(e2e["ref"][:, 0])
    for cand in (e2e["per_tensor"], e2e["convs"]):
        da, db = pair_decisions(ref, list(cand[:, 0]), kind)
        m = detection_metrics(cand[:, 0], e2e["ref"][:, 0], kind)
        assert len(da) == len(db) == m["boxes"]
        assert sum(a != b for a, b in zip(da, db)) == round((1 - m["box_match"]) * m["boxes"])
    da, db = pair_decisions(ref, list(e2e["per_tensor"][:, 0]), kind)
    assert da and all(b == [0] for b in db)  # every box lost
    da, db = pair_decisions(ref, list(e2e["convs"][:, 0]), kind)
    assert 0 < sum(a != b for a, b in zip(da, db)) <= 0.05 * len(da)  # 98% of the boxes kept
    swapped = e2e["ref"].copy()
    swapped[:, :, [0, 1]] = swapped[:, :, [1, 0]]
    da, db = pair_decisions(ref, list(swapped[:, 0]), kind)
    assert da == db


def test_a_gate_on_the_detector_counts_the_boxes_that_differ(e2e, tmp_path):
    """Real bundles (cpu fp32 of the detector, and of the INT8 model whose scores collapsed -- a bundle that
    passes against its own reference), real ``edgeopt gate`` on ``local``: the kind is inferred at build and
    the decisions verdict counts every box of the 8 images, all lost."""
    from edgeopt.api import build

    np.savez(tmp_path / "squares.npz", images=np.concatenate(e2e["calib"]))
    common = {"calib": str(tmp_path / "squares.npz"), "val_count": 8, "calib_count": 8}
    base = build(e2e["model"], "cpu", ["fp32"], dist=str(tmp_path / "base"), **common).results[0]
    cand = build(e2e["per_tensor_model"], "cpu", ["fp32"], dist=str(tmp_path / "cand"), raise_on_failure=False,
                 **common).results[0]
    assert base.ok and cand.ok, (base.error, cand.error)
    kinds = json.loads((Path(base.bundle) / "manifest.json").read_text())["output_kinds"]
    assert kinds["output0"]["kind"] == "detection" and kinds["output0"]["format"] == "yolov10"
    p = subprocess.run([sys.executable, "-m", "edgeopt", "gate", str(cand.bundle), "--baseline", str(base.bundle),
                        "--budget", "3s", "--db", str(tmp_path / "r.db"), "--json", "-q"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 5, p.stderr[-2000:]
    dec = next(v for v in json.loads(p.stdout)["devices"][0]["verdicts"] if v["metric"] == "decisions")
    from edgeopt_agent.bundle import load_manifest, reference_outputs

    ref = reference_outputs(Path(base.bundle), load_manifest(Path(base.bundle)))["output0"]  # the baseline's images
    boxes = detection_metrics(ref, ref, {"kind": "detection", "format": "yolov10"})["boxes"]
    assert dec["verdict"] == "regressed" and dec["n"] == boxes and dec["ratio"] == 1.0, dec
    assert "box_match" in dec["method"] and f"{int(boxes)} of {int(boxes)} boxes" in dec["reason"], dec


def test_the_reports_gate_prediction_counts_a_detectors_boxes_as_the_gate_does(e2e):
    """``decide.gate_defaults_accept`` (what report/run's SHIP must pass) counts the boxes, as the gate and the
    build check do: the Conv-only INT8 keeps 98% of the boxes, so the build passes it and the gate's default
    (5% may differ) accepts it (counted by image, 7 of the 8 images lose or gain a box near the threshold,
    which refused what the build had shipped)."""
    from edgeopt.decide import gate_defaults_accept
    from edgeopt.policy.accept import decisions_of as _decisions_of

    acc = {**compare_outputs({"output0": e2e["convs"]}, {"output0": e2e["ref"]}, "int8"), "samples": 8}
    assert acc["passed"]
    diff, n, kind = _decisions_of(acc)
    da, db = pair_decisions(list(e2e["ref"][:, 0]), list(e2e["convs"][:, 0]), {"kind": "detection", "format": "yolov10"})
    assert (diff, n, kind) == (sum(a != b for a, b in zip(da, db)), len(da), "detection")
    ok, why = gate_defaults_accept(acc)
    assert ok is True and diff <= 0.05 * n and "boxes decided differently" in why, why
