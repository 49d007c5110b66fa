"""Checks that cannot be fooled by an output's layout (issue 26, items 1a/1b): a YOLOv8-style head whose
concatenated output holds pixel coordinates beside 0-1 class scores, quantized by ONNX Runtime's own static
quantizer (per-tensor: the Concat's scale is ~4 px, every score becomes 0.0), keeps a whole-tensor cosine of
0.999 and must fail; the per-slice check fails it whatever its kind, the YOLO detection kind fails it on boxes."""

from __future__ import annotations

import numpy as np
import pytest

from edgeopt_agent.compare import (
    compare_outputs,
    infer_kind,
    parse_kind,
    slice_metrics,
    tolerance_for,
    yolo_boxes,
)

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

HW = 128


def yolov8_head(path, classes: int = 6, hw: int = HW, transpose: bool = False, seed: int = 0):
    """x [1, 3, hw, hw] -> three stride-2 Conv+Relu -> a box Conv (Sigmoid x 1024: pixel-scale centre/size) and
    a class Conv (Sigmoid: 0-1 scores) -> Concat on channels -> Reshape ``[1, 4 + C, anchors]`` (YOLOv8/v11's
    ``output0``), or Transpose to ``[1, anchors, 4 + C]``."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    anchors = (hw // 8) ** 2
    inits, nodes = [], []

    def conv(x, cin, cout, k, s, name, bias=0.0, gain=1.0):
        w = (rng.normal(size=(cout, cin, k, k)) * gain / np.sqrt(cin * k * k)).astype(np.float32)
        inits.extend([numpy_helper.from_array(w, name + "_w"),
                      numpy_helper.from_array(np.full(cout, bias, np.float32), name + "_b")])
        nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [name], kernel_shape=[k, k],
                                      strides=[s, s], pads=[k // 2] * 4))
        return name

    h = "images"
    for i, (cin, cout) in enumerate([(3, 16), (16, 32), (32, 32)]):
        h = conv(h, cin, cout, 3, 2, f"c{i}")
        nodes.append(helper.make_node("Relu", [h], [h + "r"]))
        h += "r"
    conv(h, 32, 4, 1, 1, "box")
    conv(h, 32, classes, 1, 1, "cls", bias=-3.0, gain=6.0)
    inits += [numpy_helper.from_array(np.array(1024, np.float32), "px"),
              numpy_helper.from_array(np.array([1, 4 + classes, anchors], np.int64), "shape")]
    nodes += [helper.make_node("Sigmoid", ["box"], ["box_s"]), helper.make_node("Mul", ["box_s", "px"], ["box_px"]),
              helper.make_node("Sigmoid", ["cls"], ["cls_s"]),
              helper.make_node("Concat", ["box_px", "cls_s"], ["cat"], axis=1),
              helper.make_node("Reshape", ["cat", "shape"], ["head" if transpose else "output0"])]
    shape = [1, 4 + classes, anchors]
    if transpose:
        nodes.append(helper.make_node("Transpose", ["head"], ["output0"], perm=[0, 2, 1]))
        shape = [1, anchors, 4 + classes]
    graph = helper.make_graph(nodes, "yolov8", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, hw, hw])],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, shape)], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return str(path)


def _images(n: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(0, 1, (1, 3, HW, HW)).astype(np.float32) for _ in range(n)]


def _run(path, feeds) -> np.ndarray:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.stack([sess.run(None, {"images": x})[0] for x in feeds])


def _quantize(src, dst, feeds, **kw) -> str:
    """ONNX Runtime's static quantizer (Q/DQ), as a user would call it."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"images": x} for x in feeds])

        def get_next(self):
            return next(self.it, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, **kw)
    return str(dst)


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    d = tmp_path_factory.mktemp("yolov8")
    model = yolov8_head(d / "yolov8.onnx")
    calib, val = _images(8, 1), _images(8, 2)
    ref = _run(model, val)
    per_tensor = _run(_quantize(model, d / "int8.onnx", calib), val)  # ORT's defaults: the Concat per-tensor
    convs = _run(_quantize(model, d / "int8-convs.onnx", calib, op_types_to_quantize=["Conv"], per_channel=True), val)
    return {"ref": ref, "per_tensor": per_tensor, "convs": convs}


def test_a_yolov8_head_is_inferred_as_a_detection_head_in_both_layouts(head, tmp_path):
    ref = head["ref"]
    assert ref.shape == (8, 1, 10, 256)
    assert infer_kind("output0", ref) == {"kind": "detection", "format": "yolov8"}
    rows = _run(yolov8_head(tmp_path / "t.onnx", transpose=True), _images(8, 2))
    assert rows.shape == (8, 1, 256, 10) and np.array_equal(rows, np.swapaxes(ref, 2, 3))
    assert infer_kind("output0", rows) == {"kind": "detection", "format": "yolov8"}
    # the same boxes decoded from either layout, and some to judge
    assert all(np.array_equal(yolo_boxes(a)[0], yolo_boxes(b)[0]) for a, b in zip(ref, rows))
    assert sum(len(yolo_boxes(a)[0]) for a in ref) >= 20
    # a plain probability table is not a detection head: its "coordinates" are not pixels
    probs = np.random.default_rng(0).uniform(0, 1, (4, 1, 10, 256)).astype(np.float32)
    assert infer_kind("y", probs)["kind"] != "detection"


def test_int8_whose_scores_collapse_fails_though_its_cosine_is_0999(head):
    ref, bad = head["ref"], head["per_tensor"]
    assert float(np.abs(bad[:, 0, 4:]).max()) == 0.0  # every class score of the artifact is exactly 0.0
    inferred = compare_outputs({"output0": bad}, {"output0": ref}, "int8")
    o = inferred["outputs"]["output0"]
    assert o["kind"] == "detection" and o["metrics"]["cosine"] > 0.99 and o["metrics"]["rel_l2"] < 0.25
    assert not inferred["passed"]
    assert {"slice_rel_l2", "slice_cosine", "box_match"} <= set(o["failed"])
    assert o["metrics"]["box_recall"] == 0.0 and o["metrics"]["boxes_out"] == 0
    # the kind unknown (judged as a map): the per-slice check alone still fails it, naming the score channel
    dense = compare_outputs({"output0": bad}, {"output0": ref}, "int8", kinds={"output0": "dense"})
    d = dense["outputs"]["output0"]
    assert not dense["passed"] and set(d["failed"]) == {"slice_rel_l2", "slice_cosine"}
    assert d["metrics"]["slice_axis"] == 1 and d["metrics"]["slice_index"] >= 4  # a score channel
    assert "of axis 1 (a slice judged against its own scale) rel_l2 1 > 0.5" in dense["summary"]


def test_fp32_copy_and_a_correct_int8_pass(head):
    ref = head["ref"]
    same = compare_outputs({"output0": ref.copy()}, {"output0": ref}, "fp32")
    assert same["passed"] and same["outputs"]["output0"]["metrics"]["box_match"] == 1.0
    # ONNX Runtime static Q/DQ quantizing only the Convs, per-channel: boxes kept, slices kept
    good = compare_outputs({"output0": head["convs"]}, {"output0": ref}, "int8")
    m = good["outputs"]["output0"]["metrics"]
    assert good["passed"], good["summary"]
    assert m["box_recall"] >= 0.9 and m["box_precision"] >= 0.9 and m["slice_cosine"] > 0.9


def test_yolo_decoding_keeps_classes_apart_and_applies_objectness():
    """Class-wise NMS (IoU 0.45): two overlapping boxes of one class -> one; of two classes -> both. YOLOv5's
    ``[anchors, 5 + C]``: score = objectness x class."""
    table = np.zeros((64, 4 + 2), np.float32)  # [anchors, 4 + C] rows, v8 transposed
    table[:, :4] = [500, 500, 10, 10]
    table[0, :4], table[0, 4] = [100, 100, 50, 50], 0.9
    table[1, :4], table[1, 4] = [105, 100, 50, 50], 0.8  # same class, IoU 0.82: suppressed
    table[2, :4], table[2, 5] = [105, 100, 50, 50], 0.7  # other class: kept
    boxes, cls = yolo_boxes(table)
    assert len(boxes) == 2 and sorted(cls.tolist()) == [0, 1]
    assert np.allclose(boxes[0], [75, 75, 125, 125])
    v5 = np.concatenate([table[:, :4], np.full((64, 1), 0.3, np.float32), table[:, 4:]], 1)  # objectness 0.3
    assert len(yolo_boxes(v5, "yolov5")[0]) == 1  # 0.9 x 0.3 passes 0.25; 0.7 x 0.3 does not
    v5[:, 4] = 0.2  # objectness below the threshold: nothing
    assert len(yolo_boxes(v5, "yolov5")[0]) == 0
    assert parse_kind("detection@yolov5") == {"kind": "detection", "format": "yolov5"}
    assert parse_kind("detection@yolov8") == {"kind": "detection", "format": "yolov8"}


def test_yolov5_layout_is_told_apart_by_the_anchor_count():
    rng = np.random.default_rng(0)
    hw = [64, 64]
    cells = 64 + 16 + 4
    t = rng.uniform(0, 1, (2, 1, 3 * cells, 5 + 3)).astype(np.float32)
    t[..., :4] *= 64  # pixel centres and sizes
    assert infer_kind("output", t, None, None, hw) == {"kind": "detection", "format": "yolov5"}
    assert infer_kind("output", t) == {"kind": "detection", "format": "yolov8"}  # no size: the v8 rule


def test_negligible_slices_carry_noise_without_failing():
    """A softmax over 20 classes of which most are never likely (~1e-4), read back through an output
    quantized with a 1/255 step: those classes are all noise relative to themselves, yet the output is fine.
    A slice that is 0 in the reference is judged against the output's scale."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(16, 1, 20)) * 1.5
    logits[..., :4] += 6
    ref = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    out = np.round(ref * 255) / 255
    res = compare_outputs({"p": out.astype(np.float32)}, {"p": ref.astype(np.float32)}, "int8")
    assert res["passed"], res["summary"]
    m = res["outputs"]["p"]["metrics"]
    assert m["slice_rel_l2"] < 0.5
    feat = rng.normal(size=(8, 1, 6, 16, 16)).astype(np.float32)  # an NCHW map of 6 channels
    feat[:, :, 2] = 0  # a channel that is 0 in the reference
    noisy = feat.copy()
    noisy[:, :, 2] = 1e-3  # tiny against the output's scale: passes
    assert slice_metrics(noisy, feat)["slice_rel_l2"] < 0.1
    noisy[:, :, 2] = 1.0  # the size of the output's values: fails
    assert not compare_outputs({"f": noisy}, {"f": feat}, "int8", kinds={"f": "dense"})["passed"]


def test_slice_bounds_follow_a_relaxed_whole_tensor_bound():
    """``int8_tolerance=cosine_min=0.93,rel_l2_max=0.4`` (PP-OCR det's) relaxes the per-slice bounds alike,
    unless they are given; ``off`` switches them off with the whole-tensor bound."""
    base = tolerance_for("int8")
    assert (base["slice_rel_l2_max"], base["slice_cosine_min"]) == (0.5, 0.9)
    t = tolerance_for("int8", {"cosine_min": 0.93, "rel_l2_max": 0.4})
    assert t["slice_rel_l2_max"] == pytest.approx(0.8) and t["slice_cosine_min"] == pytest.approx(1 - 0.07 / 0.03 * 0.1)
    t = tolerance_for("int8", {"rel_l2_max": 0.4, "slice_rel_l2_max": 0.6})
    assert t["slice_rel_l2_max"] == 0.6
    assert tolerance_for("int8", {"rel_l2_max": None})["slice_rel_l2_max"] is None
    assert tolerance_for("int8", {"rel_l2_max": 0.1})["slice_rel_l2_max"] == 0.5  # never tighter by derivation


def test_slices_are_cut_along_the_channel_like_axis_never_a_maps_rows():
    """Where outputs are concatenated: a head's channels, a table's columns, a vector's components, a map's
    channels (NCHW or NHWC). A one-channel probability map's rows are one quantity over space: noise in its
    background rows is not a lost sub-range."""
    from edgeopt_agent.compare import channel_axis

    assert channel_axis((1, 84, 8400)) == 1 and channel_axis((1, 8400, 84)) == 2
    assert channel_axis((1, 10)) == 1 and channel_axis((59, 1, 4)) == 2 and channel_axis((1, 64, 5)) == 2
    assert channel_axis((1, 3, 224, 224)) == 1 and channel_axis((1, 8, 8, 4)) == 3
    assert channel_axis((1, 1, 160, 160)) is None and channel_axis((1, 12, 40)) is None
    rng = np.random.default_rng(0)
    ref = np.zeros((4, 1, 1, 64, 64), np.float32)
    ref[:, :, :, 20:30, 10:50] = 0.9  # a text line on a background of 0
    out = np.clip(ref + rng.normal(scale=0.05, size=ref.shape), 0, 1).astype(np.float32)
    res = compare_outputs({"map": out}, {"map": ref}, "int8", kinds={"map": "dense"})
    assert "slice_rel_l2" not in res["outputs"]["map"]["metrics"]


def test_the_build_records_the_head_and_never_ships_an_int8_that_loses_its_boxes(tmp_path):
    """Through ``edgeopt build``: the manifest records the YOLO detection kind, the host check decodes boxes;
    the cpu INT8 search either ships an artifact that keeps >= 90% of FP32's boxes and every slice, or
    refuses naming what failed -- before, the head was 'dense' and an INT8 passed on its cosine alone."""
    from edgeopt.pipeline import build

    model = yolov8_head(tmp_path / "yolov8.onnx")
    fp32 = build(model, "cpu", ["fp32"], out=tmp_path / "out", jobs=1).results[0]
    assert fp32.status == "built", fp32.error
    assert fp32.manifest["output_kinds"]["output0"] == {"kind": "detection", "format": "yolov8", "source": "inferred"}
    m = fp32.manifest["host_check"]["outputs"]["output0"]["metrics"]
    assert m["box_match"] == 1.0 and m["slice_rel_l2"] < 1e-3
    int8 = build(model, "cpu", ["int8"], out=tmp_path / "out", jobs=1).results[0]
    if int8.status == "built":
        m = int8.manifest["host_check"]["outputs"]["output0"]["metrics"]
        assert m["box_match"] >= 0.9 and m["slice_rel_l2"] <= 0.5, m
    else:
        assert "box_match" in int8.error or "slice_" in int8.error, int8.error
