"""The agent's comparison by output kind: CTC decoding, decisions, embeddings, classification axis."""

from __future__ import annotations

import numpy as np
import pytest

from edgeopt_agent.compare import compare_outputs, ctc_metrics, infer_kind, parse_kind, tensor_metrics


def _ctc(steps: list[list[int]], classes: int = 6) -> np.ndarray:
    """[N, 1, T, C] probabilities with the given argmax per position (0 = blank)."""
    probs = np.full((len(steps), 1, len(steps[0]), classes), 0.02, np.float32)
    for n, seq in enumerate(steps):
        probs[n, 0, np.arange(len(seq)), seq] = 1 - 0.02 * (classes - 1)
    return probs


def test_one_flipped_space_fails_the_ctc_check_at_high_cosine():
    # "ab cd" vs "abcd": one position of 12 flips from space (5) to blank; the tensor barely moves.
    ref = _ctc([[1, 0, 2, 0, 5, 0, 3, 3, 0, 4, 0, 0], [1, 1, 0, 2, 0, 0, 3, 0, 0, 4, 0, 0]])
    out = ref.copy()
    out[0, 0, 4] = out[0, 0, 3]
    assert infer_kind("y", ref)["kind"] == "ctc_batch_major"
    m = tensor_metrics(out, ref, "ctc_batch_major")
    assert m["seq_match"] == 0.5 and m["ctc_blank"] == 0
    res = compare_outputs({"y": out}, {"y": ref}, "int8", {"rel_l2_max": 1.0, "cosine_min": 0.5})
    assert not res["passed"] and res["outputs"]["y"]["failed"] == ["seq_match"]
    assert "seq_match: CTC decoding equal on 50.0% of 2 sequences" in res["summary"]


def test_time_major_ctc_is_decoded_per_sequence():
    ref_bm = _ctc([[1, 0, 2, 0, 3, 0, 0, 4], [2, 2, 0, 1, 0, 0, 3, 0]])  # [N, 1, T, C]
    ref = np.swapaxes(ref_bm, 1, 2).copy()  # time-major [N, T, 1, C]
    out = ref.copy()
    out[1, 3, 0] = out[1, 2, 0]  # drops the "1" of the second sequence
    assert infer_kind("logits", ref)["kind"] == "ctc_time_major"
    assert tensor_metrics(out, ref, "ctc_time_major")["seq_match"] == 0.5
    # read batch-major, the same tensor decodes [T] sequences of length 1: nothing is caught
    assert ctc_metrics(out, ref, time_major=False) == {}


def test_repeats_split_by_blank_and_blank_runs_decode_alike():
    ref = _ctc([[1, 1, 0, 2, 0, 0, 3, 0]])
    out = _ctc([[1, 0, 0, 2, 2, 0, 3, 3]])
    assert ctc_metrics(out, ref)["seq_match"] == 1.0


def test_outputs_without_a_dominant_blank_are_not_ctc():
    ref = _ctc([[1, 2, 3, 4, 5, 0] * 2])  # every class 1/6 of the positions: no blank to decode with
    assert ctc_metrics(ref, ref) == {}
    assert infer_kind("y", ref)["kind"] == "per_position"  # per-position classes: judged per position (issue 26)


def test_per_position_decisions_are_judged_on_flips():
    rng = np.random.default_rng(0)
    ref = rng.uniform(0, 1, (4, 368, 1)).astype(np.float32)  # [N, positions, 1] sigmoid
    out = ref.copy()
    near = np.argsort(np.abs(ref - 0.5).ravel())[:22]  # 22 of 1,472 boundaries flip, like the segmenter
    out.reshape(-1)[near] = 1 - out.reshape(-1)[near]
    assert infer_kind("y", ref, "Sigmoid")["kind"] == "decision"
    res = compare_outputs({"y": out}, {"y": ref}, "int8")
    o = res["outputs"]["y"]
    assert o["metrics"]["cosine"] > 0.97 and o["metrics"]["flips"] == 22
    assert not res["passed"] and o["failed"] == ["flip_rate"]


def test_embeddings_have_no_top1_and_are_judged_per_vector():
    rng = np.random.default_rng(1)
    ref = rng.normal(size=(8, 1, 256)).astype(np.float32)
    out = ref + rng.normal(scale=0.01, size=ref.shape).astype(np.float32)
    m = compare_outputs({"emb": out}, {"emb": ref}, "int8", kinds={"emb": "embedding"})["outputs"]["emb"]
    assert m["passed"] and "top1" not in m["metrics"] and m["metrics"]["vector_cosine_min"] > 0.99
    # without a kind, [1, 256] reads as classification: argmax over dimensions (what refused TRT INT8)
    assert "top1" in compare_outputs({"emb": out}, {"emb": ref}, "int8")["outputs"]["emb"]["metrics"]
    out[3] = -ref[3]  # one vector turned round
    res = compare_outputs({"emb": out}, {"emb": ref}, "int8", {"cosine_min": 0.0, "rel_l2_max": 10},
                          kinds={"emb": "embedding"})
    assert res["outputs"]["emb"]["failed"] == ["vector_cosine_min"]


def test_classification_over_a_named_axis():
    rng = np.random.default_rng(2)
    ref = rng.normal(size=(6, 1, 10, 7)).astype(np.float32)  # classes on axis 1 of [1, 10, 7]
    out = ref.copy()
    out[:, 0, 0, :] = ref[:, 0].max(1) + 1  # argmax over axis 1 (10 classes) now 0 everywhere
    m1 = tensor_metrics(out, ref, "classification@1")
    m_last = tensor_metrics(out, ref, "classification")
    assert m1["top1"] < 0.5 and m_last["top1"] >= 0.9  # only row 0 of 10 moved along the last axis
    assert infer_kind("p", ref, "Softmax", 1)["kind"] == "dense"
    assert infer_kind("p", rng.normal(size=(3, 1, 5)), "Softmax", -1) == {"kind": "classification", "axis": 1}


def test_bool_outputs_are_compared_exactly():
    ref = np.array([[True, False, True]] * 3)
    res = compare_outputs({"m": ref.copy()}, {"m": ref}, "fp16")
    assert res["passed"] and "cos" not in res["summary"] and "exact 100%" in res["summary"]
    flipped = ref.copy()
    flipped[0, 0] = False
    bad = compare_outputs({"m": flipped.astype(np.float32)}, {"m": ref}, "fp16")
    assert not bad["passed"] and bad["outputs"]["m"]["failed"] == ["exact_match"]


def test_summary_names_the_failed_metric_not_cosine():
    rng = np.random.default_rng(3)
    ref = rng.normal(size=(2, 8, 8, 4)).astype(np.float32)
    out = ref * 1.01  # cosine 1.0, rel_l2 0.01 > fp32's 1e-3
    res = compare_outputs({"map": out}, {"map": ref}, "fp32")
    assert res["outputs"]["map"]["failed"] == ["rel_l2", "max_abs_norm"]
    assert res["summary"].startswith("FAILED (map: rel_l2 0.01 > 0.001")


def test_parse_kind():
    assert parse_kind("decision@0") == {"kind": "decision", "threshold": 0.0}
    assert parse_kind("classification@-1") == {"kind": "classification", "axis": -1}
    with pytest.raises(ValueError, match="unknown output kind 'ctc'"):
        parse_kind("ctc")


def _kinds_model(path):
    """x [1, 8, 4] -> seg = Sigmoid(x·w)[1, 8, 1] (decisions), ctc = Softmax(x·v)[8, 1, 5] (time-major)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    v = rng.normal(size=(4, 5)).astype(np.float32)
    v[:, 0] += 3.0  # blank-dominated, like a real CTC head
    inits = [numpy_helper.from_array(rng.normal(size=(4, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(v, "v"), numpy_helper.from_array(np.array([1, 0, 2]), "perm")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Sigmoid", ["h"], ["seg"]),
             helper.make_node("MatMul", ["x", "v"], ["l"]), helper.make_node("Transpose", ["l"], ["lt"], perm=[1, 0, 2]),
             helper.make_node("Softmax", ["lt"], ["ctc"], axis=2)]
    graph = helper.make_graph(nodes, "kinds", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4])],
                              [helper.make_tensor_value_info("seg", TensorProto.FLOAT, [1, 8, 1]),
                               helper.make_tensor_value_info("ctc", TensorProto.FLOAT, [8, 1, 5])], inits[:2])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def test_build_records_output_kinds_and_the_option_overrides(tmp_path):
    pytest.importorskip("onnxruntime")
    from edgeopt.pipeline import build

    model = _kinds_model(tmp_path / "kinds.onnx")
    rep = build(str(model), "cpu", ["fp32"], out=tmp_path / "out", jobs=1)
    res = rep.results[0]
    assert res.status == "built", res.error
    kinds = res.manifest["output_kinds"]
    assert kinds["seg"]["kind"] == "decision" and kinds["ctc"]["kind"] == "ctc_time_major"
    outs = res.manifest["host_check"]["outputs"]
    assert outs["seg"]["kind"] == "decision" and "flip_rate" in outs["seg"]["metrics"]
    assert "seq_match" in outs["ctc"]["metrics"]
    rep = build(str(model), "cpu", ["fp32"], out=tmp_path / "out2", jobs=1,
                options={"output_kind": "ctc:classification@2,seg:regression"})
    kinds = rep.results[0].manifest["output_kinds"]
    assert kinds["ctc"] == {"kind": "classification", "axis": 2, "source": "option"}
    assert "top1" in rep.results[0].manifest["host_check"]["outputs"]["ctc"]["metrics"]
    bad = build(str(model), "cpu", ["fp32"], out=tmp_path / "out3", jobs=1, options={"output_kind": "nope:dense"})
    assert bad.results[0].status == "failed" and "'nope', which is not an output" in bad.results[0].error
    assert "Traceback" not in bad.results[0].error


def test_time_major_ctc_logits_are_recognised():
    # ddddocr's recogniser leaves the softmax to its decoder: [T, 1, C] logits, mostly blank
    rng = np.random.default_rng(4)
    ref = rng.normal(size=(5, 20, 1, 50)).astype(np.float32)
    ref[..., 0] += 4.0
    assert infer_kind("387", ref, "Add")["kind"] == "ctc_time_major"
    # no blank: a time-major per-frame classifier, judged per frame (issue 26), not CTC
    assert infer_kind("387", rng.normal(size=(5, 20, 1, 50)), "Add")["kind"] == "per_position"


def _logits(n: int, flips: int, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of class logits; the first ``flips`` have their top class moved (barely)."""
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(n, 1, classes)).astype(np.float32)  # [N, 1, classes]: a classifier's logits
    out = ref.copy()
    for i in range(flips):
        a, b = np.argsort(-ref[i, 0])[:2]
        out[i, 0, b] = ref[i, 0, a] + 1e-3
    return out, ref


def test_top1_bound_is_applied_to_a_count_with_n_shown():
    from edgeopt_agent.compare import top1_allowed

    assert (top1_allowed(8, 0.90), top1_allowed(32, 0.90), top1_allowed(8, 0.99), top1_allowed(10, 0.95)) == (1, 3, 0, 1)
    loose = {"rel_l2_max": 1.0, "cosine_min": 0.5}
    out, ref = _logits(8, 1)  # 87.5%: one sample's step below 90%, within half a step of the bound
    res = compare_outputs({"y": out}, {"y": ref}, "int8", loose)
    assert res["passed"] and "top1 88% (7/8)" in res["summary"]
    out, ref = _logits(8, 2)  # 75%: two of eight differ
    res = compare_outputs({"y": out}, {"y": ref}, "int8", loose)
    assert not res["passed"] and res["outputs"]["y"]["failed"] == ["top1"]
    assert "(6/8) < 90%: 2 of 8 decisions differ, at most 1 allowed" in res["summary"]
    out, ref = _logits(32, 4)  # 87.5% again, but now 4 of 32: more than the 3 allowed
    assert not compare_outputs({"y": out}, {"y": ref}, "int8", loose)["passed"]


def test_a_failed_summary_names_the_metric_that_failed():
    out, ref = _logits(8, 0)
    out = out + np.float32(0.4) * np.abs(ref).mean()  # shift every logit: ranks kept, rel_l2 breaks
    res = compare_outputs({"y": out}, {"y": ref}, "fp16")
    assert not res["passed"] and res["summary"].startswith("FAILED (y: rel_l2")


def test_a_sigmoid_reshaped_to_one_axis_is_still_per_position_decisions(tmp_path):
    """silero-vad's speech_probs: Sigmoid [16, 1] -> Reshape [16]; judged as decisions, not as a regression."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    from edgeopt.pipeline import build

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(4, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([8]), "flat")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Sigmoid", ["h"], ["s"]),
             helper.make_node("Reshape", ["s", "flat"], ["probs"])]
    graph = helper.make_graph(nodes, "vad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 4])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [8])], inits)
    path = tmp_path / "vad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    assert infer_kind("probs", rng.uniform(0, 1, (4, 8)), "Sigmoid")["kind"] == "decision"
    assert infer_kind("probs", rng.uniform(0, 1, (4, 8)))["kind"] == "regression"  # no producer: not guessed
    rep = build(str(path), "cpu", ["fp32"], out=tmp_path / "out", jobs=1)
    assert rep.results[0].status == "built", rep.results[0].error
    assert rep.results[0].manifest["output_kinds"]["probs"]["kind"] == "decision"


def _yolox_table(rng, boxes: list[tuple[int, float, int]], cells: int = 84, classes: int = 2) -> np.ndarray:
    """A 64x64 input's YOLOX table ([cells, 4 + 1 + classes], stride 8/16/32: 64 + 16 + 4 = 84 rows) with
    the given (row, objectness, class) objects on a background of low scores."""
    t = np.zeros((cells, 5 + classes), np.float32)
    t[:, :2] = rng.uniform(0, 1, (cells, 2))
    t[:, 2:4] = rng.normal(0.5, 0.2, (cells, 2))
    t[:, 4] = rng.uniform(0, 0.05, cells)
    t[:, 5:] = rng.uniform(0, 0.3, (cells, classes))
    for row, obj, cls in boxes:
        t[row, 4], t[row, 5 + cls] = obj, 0.95
    return t


def test_a_yolox_head_is_judged_on_its_boxes():
    """A detector that loses a box keeps its tensor's cosine: the check decodes the boxes as YOLOX does."""
    rng = np.random.default_rng(0)
    ref = np.stack([_yolox_table(rng, [(3, 0.9, 0), (40, 0.8, 1), (70, 0.7, 0)])[None] for _ in range(4)])
    kind = infer_kind("output", ref, None, None, [64, 64])
    assert kind == {"kind": "detection", "format": "yolox", "input_hw": [64, 64]}
    assert infer_kind("output", ref)["kind"] == "dense"  # without the input's size: not guessed
    assert parse_kind("detection@64x64") == kind
    with pytest.raises(ValueError, match="needs the input's size"):
        parse_kind("detection")
    same = compare_outputs({"output": ref.copy()}, {"output": ref}, "int8", kinds={"output": kind})
    assert same["passed"] and same["outputs"]["output"]["metrics"]["box_match"] == 1.0
    lost = ref.copy()
    lost[:2, 0, 40, 4] = 0.05  # two of the four images lose their class-1 object
    res = compare_outputs({"output": lost}, {"output": ref}, "int8", kinds={"output": kind})
    o = res["outputs"]["output"]
    assert o["metrics"]["cosine"] > 0.99 and o["metrics"]["box_match"] == pytest.approx(10 / 12)
    assert o["metrics"]["images_equal"] == 0.5
    assert not res["passed"] and o["failed"] == ["box_match"]
    assert "boxes" in res["summary"] or "box_match" in res["summary"]


def test_build_infers_a_yolox_head_from_the_input_size(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    from edgeopt.pipeline import build

    table = _yolox_table(np.random.default_rng(1), [(3, 0.9, 0), (40, 0.8, 1)])[None]
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0), helper.make_node("Mul", ["m", "zero"], ["z"]),
             helper.make_node("Add", ["table", "z"], ["output"])]
    graph = helper.make_graph(nodes, "yolox", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 64, 64])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 84, 7])],
                              [numpy_helper.from_array(table, "table"),
                               numpy_helper.from_array(np.array(0, np.float32), "zero")])
    path = tmp_path / "yolox.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    rep = build(str(path), "cpu", ["fp32"], out=tmp_path / "out", jobs=1)
    res = rep.results[0]
    assert res.status == "built", res.error
    assert res.manifest["output_kinds"]["output"]["kind"] == "detection"
    assert res.manifest["host_check"]["outputs"]["output"]["metrics"]["box_match"] == 1.0


def test_an_if_whose_branches_both_end_in_a_sigmoid_is_a_decision(tmp_path):
    """openwakeword's wake-word heads: a score Sigmoid, then If(score >= t) -> a verifier's Sigmoid, else
    Identity(score). The output comes from the If, yet both branches give a probability."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    from edgeopt.pipeline import build

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(4, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=(4, 1)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array(0.5, np.float32), "t")]
    then = helper.make_graph([helper.make_node("MatMul", ["x", "w2"], ["h2"]), helper.make_node("Sigmoid", ["h2"], ["p2"])],
                             "then", [], [helper.make_tensor_value_info("p2", TensorProto.FLOAT, [1, 1])])
    other = helper.make_graph([helper.make_node("Identity", ["p1"], ["p1b"])], "else", [],
                              [helper.make_tensor_value_info("p1b", TensorProto.FLOAT, [1, 1])])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Sigmoid", ["h"], ["p1"]),
             helper.make_node("ReduceMax", ["p1"], ["pm"], keepdims=0),
             helper.make_node("GreaterOrEqual", ["pm", "t"], ["c"]),
             helper.make_node("If", ["c"], ["score"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "wakeword", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("score", TensorProto.FLOAT, [1, 1])], inits)
    path = tmp_path / "wakeword.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)], ir_version=8), path)
    rep = build(str(path), "cpu", ["fp32"], out=tmp_path / "out", jobs=1)
    assert rep.results[0].status == "built", rep.results[0].error
    assert rep.results[0].manifest["output_kinds"]["score"]["kind"] == "decision"


def test_a_greedy_decoder_is_judged_on_whole_sequences_not_steps():
    """g2p-like: 12 decoder steps over 40 phonemes; one step changed in 2 of 12 words is 98% per step but
    two wrong words: 'sequence' refuses it at the INT8 bound, 'classification' over the steps would not."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((12, 1, 12, 40)).astype(np.float32)
    out = ref.copy()
    for i in (0, 3):
        out[i, 0, 5] = 0
        out[i, 0, 5, (ref[i, 0, 5].argmax() + 1) % 40] = 10
    seq = compare_outputs({"y": out}, {"y": ref}, "int8", None, {"y": parse_kind("sequence")})
    m = seq["outputs"]["y"]["metrics"]
    assert not seq["passed"] and m["seq_match"] == 10 / 12 and m["top1"] > 0.98
    assert "greedy decoding (every step) equal on 83.3% of 12 sequences" in seq["summary"]
    steps = compare_outputs({"y": out}, {"y": ref}, "int8", None, {"y": parse_kind("classification@2")})
    assert steps["outputs"]["y"]["metrics"]["top1"] > 0.98 and "seq_match" not in steps["outputs"]["y"]["metrics"]
    same = compare_outputs({"y": ref.copy()}, {"y": ref}, "int8", None, {"y": parse_kind("sequence")})
    assert same["passed"] and "seq-equal 100%" in same["summary"]


def test_near_zero_probabilities_are_judged_against_a_floor_not_their_own_tiny_norm():
    """A wake-word score of ~1e-5 (no wake word heard) that differs by float32 rounding (6e-8) passed every
    task figure but failed FP32's rel_l2 <= 1e-3 relative to its own norm; relative to 1e-3 of the [0, 1]
    scale it passes, while a real error on such scores (0.05) still fails."""
    rng = np.random.default_rng(0)
    ref = (rng.random((40, 1, 1)) * 2e-5).astype(np.float32)
    kind = {"y": {"kind": "decision", "threshold": 0.5}}
    noisy = (ref + rng.uniform(-6e-8, 6e-8, ref.shape)).astype(np.float32)
    assert compare_outputs({"y": noisy}, {"y": ref}, "fp32", None, kind)["passed"]
    assert tensor_metrics(noisy, ref, "regression")["rel_l2"] > 1e-3  # what it was judged on before
    wrong = (ref + rng.uniform(0, 0.1, ref.shape)).astype(np.float32)
    res = compare_outputs({"y": wrong}, {"y": ref}, "int8", None, kind)
    assert not res["passed"] and "rel_l2" in res["summary"]


def test_task_agreement_is_the_worst_task_figure_of_an_output():
    from edgeopt_agent.compare import task_agreement

    assert task_agreement({"cosine": 0.99, "rel_l2": 0.1}) == 1.0  # a dense map: no task figure
    assert task_agreement({"cosine": 0.99, "top1": 0.75, "top1_n": 8}) == 0.75
    assert task_agreement({"seq_match": 0.9, "top1": 0.97}) == 0.9
    assert task_agreement({"flip_rate": 0.005}) == 0.995
    assert task_agreement({"box_match": 0.94, "column_cosine_min": 0.5}) == 0.94


def test_nan_where_the_fp32_model_makes_them_is_said_and_still_refused():
    """sqrt of a negative input: the FP32 model's own outputs hold NaN (onnx's operator_sqrt test). An artifact with
    NaN at exactly those positions is faithful but not deployable: still refused, and the reason says the model
    makes them, not the conversion; NaN elsewhere says where the reference's were."""
    ref = np.array([[1.0, np.nan, 2.0, np.inf]], np.float32)
    same = compare_outputs({"y": ref.copy()}, {"y": ref}, "fp32")
    assert not same["passed"] and "exactly where the FP32 model's own are" in same["summary"]
    m = tensor_metrics(ref.copy(), ref)
    assert m["non_finite"] == 0.5 and m["ref_non_finite"] == 0.5 and m["non_finite_as_ref"] == 1.0
    other = np.array([[np.nan, 1.0, 2.0, np.inf]], np.float32)
    moved = compare_outputs({"y": other}, {"y": ref}, "fp32")
    assert not moved["passed"] and "(the FP32 model's own: 50.0%, elsewhere)" in moved["summary"]
    assert "ref_non_finite" not in tensor_metrics(other, np.ones_like(other))
