"""Integer class ids are labels, not a regression (issue 26): scikit-learn's ``output_label`` (skl2onnx) and an
ArgMax output (also cast to float) are judged on exact agreement counted k of n, like top-1 agreement, with
its Wilson interval; the gate's decisions for labels and for ``probability@T`` count a sample as decided
differently by the build check's own rule.

Real parts: two scikit-learn logistic regressions on the digits data set (one trained on 1000 images, one on
150: two versions of one classifier), converted by skl2onnx and run by ONNX Runtime on 64 held-out images;
a cpu fp32 build of an ArgMax model made with onnx.helper."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgeopt_agent.compare import compare_outputs, infer_kind, probability_metrics, top1_allowed
from edgeopt_agent.paired import decision_kind, decisions_of, pair_decisions

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("sklearn")
pytest.importorskip("skl2onnx")


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> dict[str, np.ndarray]:
    from skl2onnx import to_onnx
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    x = (x / 16).astype(np.float32)
    out = {}
    for name, n in (("v1", 1000), ("v2", 150)):
        clf = LogisticRegression(max_iter=500).fit(x[:n], y[:n])
        onx = to_onnx(clf, x[:1], options={id(clf): {"zipmap": False}}, target_opset=15)
        sess = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        runs = [sess.run(None, {sess.get_inputs()[0].name: x[i:i + 1]}) for i in range(1100, 1164)]
        out[name + "_label"] = np.stack([r[names.index("label")] for r in runs])  # [64, 1] int64
        out[name + "_probs"] = np.stack([r[names.index("probabilities")] for r in runs])  # [64, 1, 10]
    return out


def test_an_int64_label_output_is_judged_as_labels_k_of_n(digits):
    from edgeopt.decide import agreement

    ref, cand = digits["v1_label"], digits["v2_label"]
    assert ref.dtype == np.int64 and ref.shape == (64, 1)
    assert infer_kind("label", ref) == {"kind": "label"}  # was "regression"
    differ = int(np.sum(ref != cand))
    assert 0 < differ < 20  # two real versions of one classifier: mostly the same labels
    res = compare_outputs({"label": cand, "probabilities": digits["v2_probs"]},
                          {"label": ref, "probabilities": digits["v1_probs"]}, "int8")
    o = res["outputs"]["label"]
    assert o["kind"] == "label"
    assert o["metrics"]["top1_n"] == 64 and round(o["metrics"]["top1"] * 64) == 64 - differ
    assert o["passed"] == (differ <= top1_allowed(64, 0.9))
    if not o["passed"]:
        assert o["failed"] == ["labels"] and f"labels: {64 - differ}/64 equal to FP32's" in o["reasons"][0]
    a = agreement(res)  # the one agreement figure: k of n with its 95% Wilson interval
    assert a["output"] in ("label", "probabilities") and a["n"] == 64 and a["ci"] == "95% Wilson"
    same = compare_outputs({"label": ref.copy()}, {"label": ref}, "fp32")
    assert same["passed"] and "label: labels 100% (64/64)" in same["summary"]
    # an artifact that returns the ids as floats is read rounded
    assert compare_outputs({"label": ref.astype(np.float32)}, {"label": ref}, "fp32")["passed"]
    # at FP32 on 8 samples no label may differ
    one = ref[:8].copy()
    one[0] = (one[0] + 1) % 10
    bad = compare_outputs({"label": one}, {"label": ref[:8]}, "fp32")
    assert not bad["passed"] and "labels: 7/8 equal to FP32's" in bad["summary"]


def test_gate_decisions_for_labels_and_probability_at_a_threshold(digits):
    ref_l, cand_l = list(digits["v1_label"]), list(digits["v2_label"])
    da, db = pair_decisions(ref_l, cand_l, {"kind": "label"})
    assert sum(a != b for a, b in zip(da, db)) == int(np.sum(digits["v1_label"] != digits["v2_label"]))
    kind = {"kind": "probability", "threshold": 0.2}
    da, db = pair_decisions(list(digits["v1_probs"]), list(digits["v2_probs"]), kind)
    flips = probability_metrics(digits["v2_probs"], digits["v1_probs"], 0.2)["flips"]
    assert sum(a != b for a, b in zip(da, db)) == int(flips) > 0
    # the same samples judged by argmax (the old rule) differ less often: a threshold is another decision
    argmax = decisions_of(list(digits["v1_probs"]), None), decisions_of(list(digits["v2_probs"]), None)
    assert sum(a != b for a, b in zip(*argmax)) < flips


def test_decision_kind_picks_the_first_output_that_carries_decisions():
    io = {"outputs": [{"name": "box"}, {"name": "landmarks"}, {"name": "prob"}]}
    m = {"io": io, "output_kinds": {"box": {"kind": "regression"}, "landmarks": {"kind": "regression"},
                                    "prob": {"kind": "probability", "threshold": 0.7}}}
    assert decision_kind(m) == {"kind": "probability", "threshold": 0.7, "output": "prob"}
    m["output_kinds"]["prob"] = {"kind": "dense"}
    assert decision_kind(m) == {"kind": "regression", "output": "box"}  # no decisions: none compared
    assert decisions_of([np.zeros((1, 4), np.float32)], decision_kind(m)) is None
    assert decision_kind({"io": io}) is None  # no kinds recorded: the first output's argmax, as before


def test_an_argmax_output_is_inferred_as_labels_at_build(tmp_path):
    """targets/base.py output_kinds: an int64 ArgMax output and the same ids cast to float are labels."""
    from onnx import TensorProto, helper, numpy_helper

    from edgeopt.api import build

    w = np.random.default_rng(0).normal(size=(16, 5)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]),
         helper.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=1),
         helper.make_node("Cast", ["label"], ["label_f"], to=TensorProto.FLOAT)],
        "argmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, [1, 1]),
         helper.make_tensor_value_info("label_f", TensorProto.FLOAT, [1, 1])], [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), tmp_path / "am.onnx")
    np.savez(tmp_path / "x.npz", x=np.random.default_rng(1).normal(size=(12, 1, 16)).astype(np.float32))
    res = build(str(tmp_path / "am.onnx"), "cpu", ["fp32"], dist=str(tmp_path / "dist"), calib=str(tmp_path / "x.npz"),
                val_count=8, calib_count=4).results[0]
    assert res.ok, res.error
    kinds = json.loads((Path(res.bundle) / "manifest.json").read_text())["output_kinds"]
    assert kinds["label"]["kind"] == "label" and kinds["label_f"]["kind"] == "label"
    # rollout --eval scores the class ids a label output gives (it took the argmax of a [1, 1] id: always 0)
    from edgeopt_agent.evaluate import evaluate

    xs = np.random.default_rng(2).normal(size=(20, 1, 16)).astype(np.float32)
    np.savez(tmp_path / "eval.npz", x=xs)
    arm = evaluate([Path(res.bundle)], tmp_path / "eval.npz")["arms"][0]
    want = np.argmax(xs[:, 0] @ w, axis=1)
    assert [int(np.ravel(d)[0]) for d in arm["decisions"]] == want.tolist() and len(set(want.tolist())) > 1
