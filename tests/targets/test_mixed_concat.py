"""INT8 never quantizes a concatenation of differently-scaled tensors per-tensor (issue 26, 1c).

A YOLOv8-style head ends in ``Concat([boxes in pixels, 0..1 class scores])``: with one per-tensor scale
(~4 px a step) every score became 0.0 and the detector found nothing while the whole-tensor cosine said
0999.  The model here is that head's mechanism, built with onnx.helper (Conv backbone -> box branch
scaled to 0..1024 px, score branch through a Sigmoid -> Concat), calibrated on real images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.conftest import fixture

CLASSES = 8


def yolov8_head(path: Path, classes: int = CLASSES, seed: int = 0, box_scale: float = 1024.0) -> Path:
    """images [1,3,64,64] -> Conv/Relu x2 -> box Conv -> Sigmoid -> x box_scale (pixels) -> [1,4,256];
    score Conv -> Sigmoid -> [1,C,256]; Concat on axis 1 -> output0 [1, 4+C, 256] (YOLOv8's layout)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def w(name: str, shape: tuple[int, ...], s: float):
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)

    inits = [w("w1", (16, 3, 3, 3), 0.3), w("b1", (16,), 0.1), w("w2", (16, 16, 3, 3), 0.15), w("b2", (16,), 0.1),
             w("wb", (4, 16, 1, 1), 0.3), w("bb", (4,), 0.1), w("wc", (classes, 16, 1, 1), 0.5),
             w("bc", (classes,), 0.2), numpy_helper.from_array(np.array(box_scale, np.float32), "px"),
             numpy_helper.from_array(np.array([1, 4, -1], np.int64), "sb"),
             numpy_helper.from_array(np.array([1, classes, -1], np.int64), "sc")]
    n = helper.make_node
    nodes = [n("Conv", ["images", "w1", "b1"], ["c1"], name="conv1", pads=[1] * 4, strides=[2, 2]),
             n("Relu", ["c1"], ["r1"], name="relu1"),
             n("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1] * 4, strides=[2, 2]),
             n("Relu", ["c2"], ["r2"], name="relu2"),
             n("Conv", ["r2", "wb", "bb"], ["cb"], name="box_conv"), n("Sigmoid", ["cb"], ["sb_"], name="box_sig"),
             n("Mul", ["sb_", "px"], ["boxes"], name="box_px"),
             n("Reshape", ["boxes", "sb"], ["box_flat"], name="box_reshape"),
             n("Conv", ["r2", "wc", "bc"], ["cc"], name="cls_conv"), n("Sigmoid", ["cc"], ["scores"], name="cls_sig"),
             n("Reshape", ["scores", "sc"], ["cls_flat"], name="cls_reshape"),
             n("Concat", ["box_flat", "cls_flat"], ["output0"], name="head_concat", axis=1)]
    g = helper.make_graph(nodes, "yolov8_head",
                          [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 64, 64])],
                          [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 4 + classes, 256])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def _image_feeds(n: int = 8) -> list[dict[str, np.ndarray]]:
    from edgeopt.calib import Preprocess, load_data

    ds = load_data(str(fixture("images")), [{"name": "images", "shape": [1, 3, 64, 64], "dtype": "float32"}],
                   Preprocess.parse("preset=unit"), n_calib=n, n_val=2)
    return ds.calibration


def test_find_flags_the_pixel_and_score_concat_and_its_readers(tmp_path):
    import onnx
    from onnx import helper

    from edgeopt.targets.mixed_concat import find, float_nodes, note

    model = onnx.load(str(yolov8_head(tmp_path / "head.onnx")))
    feeds = _image_feeds()
    found = find(model, feeds)
    assert [mc.node for mc in found] == ["head_concat"]
    mc = found[0]
    assert mc.ratio > 100  # 0..1024 px beside 0..1 scores
    assert set(mc.ranges) == {"box_flat", "cls_flat"} and mc.ranges["cls_flat"][1] <= 1.0
    assert mc.float_nodes == ["head_concat"]  # a graph output: nothing reads it
    assert "head_concat" in float_nodes(found) and "differ by more than 16x" in note(found)
    # A reader that only moves the values (Transpose) and what reads that are kept float too.
    model.graph.output[0].name = "out_t"
    model.graph.node.extend([helper.make_node("Transpose", ["output0"], ["t"], name="tr", perm=[0, 2, 1]),
                             helper.make_node("Sigmoid", ["t"], ["out_t"], name="after")])
    assert find(model, feeds)[0].float_nodes == ["head_concat", "tr", "after"]


def test_find_leaves_a_concat_of_like_ranges_alone(tmp_path):
    from edgeopt.targets.mixed_concat import find

    # the same head with boxes in 0..1 (normalised coordinates): nothing to keep float
    assert find(str(yolov8_head(tmp_path / "head.onnx", box_scale=1.0)), _image_feeds()) == []


@pytest.fixture(scope="module")
def head_int8(tmp_path_factory):
    from edgeopt.pipeline import build

    d = tmp_path_factory.mktemp("yolo-head")
    yolov8_head(d / "head.onnx")
    lines: list[str] = []
    res = build(str(d / "head.onnx"), "cpu", ["int8"], calib=str(fixture("images")), preprocess="preset=unit",
                out=d / "dist", force=True, jobs=1, progress=lines.append).results[0]
    return res, d, lines


def test_cpu_int8_keeps_the_concat_float_and_the_scores_survive(head_int8):
    import onnx
    import onnxruntime as ort

    res, d, _ = head_int8
    assert res.ok, res.error
    bundle = Path(res.bundle)
    model = onnx.load(str(bundle / "model.onnx"))
    # no QuantizeLinear reads the concatenated tensor, and the Concat reads float inputs
    assert not [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "output0"]
    concat = next(n for n in model.graph.node if n.name == "head_concat")
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    assert all(producers.get(t) != "QuantizeLinear" for t in concat.input)
    # ... while the convolutions are INT8
    assert sum(n.op_type == "DequantizeLinear" for n in model.graph.node) >= 4
    # The score channels of the shipped model against FP32 on the bundle's validation inputs.
    x = np.load(bundle / "validation" / "inputs.npz")["in0"]
    ref = np.load(bundle / "validation" / "reference.npz")["out0"]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(bundle / "model.onnx"), so, providers=["CPUExecutionProvider"],
                                disabled_optimizers=res.manifest["runtime"]["options"]["disabled_optimizers"])
    got = np.stack([sess.run(None, {"images": xi})[0] for xi in x])
    scores, ref_scores = got[:, :, 4:], ref[:, :, 4:]
    assert ref_scores.max() > 0.5  # the reference scores are there to lose
    assert np.abs(scores - ref_scores).max() < 0.05  # per-tensor over 0..1024 px rounded all of them to 0
    assert np.abs(got[:, :, :4] - ref[:, :, :4]).max() < 0.05 * 1024
    # the rule is recorded: the placement note and the node's reason
    info = res.manifest["options"]["int8"]
    assert [mc["node"] for mc in info["mixed_scale_concats"]] == ["head_concat"]
    assert "mixed-scale concat" in info["float_nodes"]["head_concat"]
    assert any(n.startswith("placement rule: a Concat whose inputs' calibrated ranges differ")
               for n in res.manifest["notes"])


def test_openvino_ignored_scope_names_the_concat_by_its_openvino_op(tmp_path):
    """NNCF is given the Concat as OpenVINO names it (the frontend names a graph-output op after its tensor)."""
    ov = pytest.importorskip("openvino")
    from edgeopt.targets.openvino.int8 import mixed_scale_ignored

    path = yolov8_head(tmp_path / "head.onnx")
    names, found = mixed_scale_ignored(ov.convert_model(str(path)), str(path), _image_feeds())
    assert [mc.node for mc in found] == ["head_concat"] and names == ["output0"]


def test_progress_lines_name_the_step_and_the_time_left(head_int8):
    """Each variant's lines say which step runs (grid k/n) and an estimate of the time left (issue 26, 5)."""
    import re

    res, _, lines = head_int8
    assert res.ok, res.error
    trying = [ln for ln in lines if re.search(r"\[grid \d+/\d+, [^\]]*left[^\]]*\] int8: trying ", ln)]
    done = [ln for ln in lines if re.search(r"\[grid \d+/\d+, [^\]]*left[^\]]*\] int8: (PASS|fail) ", ln)]
    assert trying and len(done) == len(trying)
    assert any(re.search(r"\[grid 2/\d+, ~\d+s left\]", ln) for ln in done)  # estimated from the first variant
    assert any("concat(s) of differently-scaled tensors kept float: head_concat" in ln for ln in lines)


def _concat_then_conv(path: Path) -> Path:
    """x -> Conv -> Relu -> {Conv -> x1000 (pixels), Conv -> Sigmoid (scores)} -> Concat -> Conv (reads it)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)

    def w(name: str, shape: tuple[int, ...], s: float):
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)

    n = helper.make_node
    inits = [w("w1", (8, 3, 3, 3), 0.3), w("wa", (2, 8, 1, 1), 0.3), w("wb", (4, 8, 1, 1), 0.5),
             w("wc", (6, 6, 1, 1), 0.3), numpy_helper.from_array(np.array(1000.0, np.float32), "k")]
    nodes = [n("Conv", ["images", "w1"], ["c1"], name="conv1", pads=[1] * 4), n("Relu", ["c1"], ["r1"], name="relu1"),
             n("Conv", ["r1", "wa"], ["a"], name="conv_a"), n("Sigmoid", ["a"], ["sa"], name="sig_a"),
             n("Mul", ["sa", "k"], ["pix"], name="to_pixels"),
             n("Conv", ["r1", "wb"], ["b"], name="conv_b"), n("Sigmoid", ["b"], ["scores"], name="sig_b"),
             n("Concat", ["pix", "scores"], ["cat"], name="cat", axis=1),
             n("Conv", ["cat", "wc"], ["y"], name="conv_reads_cat")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 64, 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 64, 64])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def test_tensorrt_search_gives_no_qdq_to_a_conv_reading_a_mixed_scale_concat(tmp_path):
    import onnx
    import onnxruntime as ort

    from edgeopt.targets.tensorrt.int8 import search_int8

    path = _concat_then_conv(tmp_path / "m.onnx")
    feeds = _image_feeds(10)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    val = feeds[6:]
    ref = {"y": np.stack([sess.run(None, f)[0] for f in val])}
    res = search_int8(onnx.load(str(path)), feeds[:6], val, ref, tmp_path, mode="quick", budget_s=60)
    placement = res.report["placement"]
    left = {e["node"]: e["why"] for e in placement["left_float"]}
    assert "mixed-scale concat 'cat'" in left.get("conv_reads_cat", ""), placement["left_float"]
    assert placement["mixed_scale_concats"][0]["node"] == "cat"
    readers = {c for p in placement["pairs"] for c in p["consumers"]}
    assert "conv_reads_cat" not in readers and {"conv1", "conv_a", "conv_b"} <= readers
