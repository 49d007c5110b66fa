"""Issue 39, the rest of 2 and 3: ``--output-kind``/``--decision`` (one line, exit 2 for a bad value), coordinates
judged in their own units with a bound (``regression:px=N``, ``px_max``/``px_share_max``), and anchor heads
(``detection@anchors``) judged on their decoded, NMS'd detections instead of every anchor.

The anchor-head cases use BlazeFace's real anchor grid (MediaPipe's short-range face detector: 128 px, strides
8 and 16 with 2 and 6 anchors per cell = 896 anchors) with constructed outputs: no real anchor-head model
installs offline in CI (the one checked by hand -- MediaPipe 0.10.14's ``face_detection_short_range.tflite``
through tf2onnx -- is named in docs/TOLERANCES.md)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from edgeopt_agent.compare import anchor_centres, compare_outputs, parse_kind
from edgeopt_agent.paired import decision_kind, decisions_of

ANCHORS = "detection@anchors:boxes=regressors:anchors=8x2+16x6:input=128x128"


def test_flags_map_onto_the_kinds_and_bad_values_are_one_line():
    from edgeopt.errors import UsageError
    from edgeopt.targets.base import parse_kind_flags

    got = parse_kind_flags(["landmarks=regression:px=2", "a=b=decision@0", f"classificators={ANCHORS}"],
                           ["score=0.2,0.8", "logit=0", "band=-1,1"])
    assert got["landmarks"] == {"kind": "regression", "px": 2.0, "source": "option"}
    assert got["a=b"]["kind"] == "decision" and got["a=b"]["threshold"] == 0.0  # a name holding '='
    assert got["classificators"]["format"] == "anchors" and got["classificators"]["anchors"] == [[8, 2], [16, 6]]
    assert got["score"]["kind"] == "probability" and got["score"]["thresholds"] == [0.2, 0.8]
    assert got["logit"] == {"kind": "decision", "threshold": 0.0, "source": "option", "decision": [0.0]}
    assert got["band"]["kind"] == "decision" and got["band"]["thresholds"] == [-1.0, 1.0]
    assert parse_kind_flags({"x": "regression:px=1"}, {"s": [0.3]})["s"]["kind"] == "probability"  # the API's
    for bad in (["landmarks=regresion"], ["landmarks"], ["x=regression:px=-1"], ["x=regression:pix=2"],
                ["s=detection@anchors:anchors=8x2"], ["s=detection@anchors:boxes=b:encoding=polar"]):
        with pytest.raises(UsageError) as err:
            parse_kind_flags(bad)
        assert "\n" not in err.value.message
    with pytest.raises(UsageError, match="kinds: classification"):
        parse_kind_flags(["landmarks=regresion"])
    with pytest.raises(UsageError, match="thresholds are numbers"):
        parse_kind_flags(None, ["score=high"])


def test_build_refuses_a_bad_output_kind_with_one_line_and_exit_2(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    for flag, want in ((["--output-kind", "y=coords"], "kinds: classification, probability"),
                       (["--output-kind", "z=regression"], "not an output of the model (outputs: y)"),
                       (["--decision", "y=a,b"], "thresholds are numbers")):
        p = subprocess.run([sys.executable, "-m", "edgeopt", "build", str(model), "-t", "cpu", "--dist",
                            str(tmp_path / "d"), *flag], capture_output=True, text=True, timeout=120)
        assert p.returncode == 2, p.stderr
        assert want in p.stderr and "Traceback" not in p.stderr
        assert len([ln for ln in p.stderr.splitlines() if "error:" in ln]) == 1  # one line (and its hint)
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").rglob("manifest.json"))


def test_coordinates_in_their_own_units_with_a_bound():
    """``regression:px=2``: the worst element and the share beyond the bound decide, whatever the cosine."""
    rng = np.random.default_rng(1)
    ref = rng.uniform(0, 200, (20, 1, 30)).astype(np.float32)
    kinds = {"pts": "regression:px=2"}
    out = ref + rng.normal(0, 0.3, ref.shape).astype(np.float32)  # INT8-like noise, well within 2 px
    ok = compare_outputs({"pts": out}, {"pts": ref}, "int8", kinds=kinds)
    assert ok["passed"], ok["summary"]
    m = ok["outputs"]["pts"]["metrics"]
    assert m["px_bound"] == 2.0 and m["elements"] == 600 and m["over_px"] == 0
    out2 = out.copy()
    out2[:, 0, :3] += 3.0  # 60 of 600 coordinates 3 px off: cosine still ~1, 10% beyond the bound
    bad = compare_outputs({"pts": out2}, {"pts": ref}, "int8", kinds=kinds)
    assert not bad["passed"] and bad["outputs"]["pts"]["metrics"]["cosine"] > 0.999
    assert "px: 60 of 600 coordinates off by more than 2 px" in bad["summary"]
    out3 = out.copy()
    out3[5, 0, 7] += 9.0  # one coordinate beyond 4 x the bound
    worst = compare_outputs({"pts": out3}, {"pts": ref}, "int8", kinds=kinds)
    assert [r.split(":")[0] for r in worst["outputs"]["pts"]["reasons"]] == ["px_worst"]
    # FP32's default bound is 0.1 px with none beyond it
    fp32 = compare_outputs({"pts": out}, {"pts": ref}, "fp32", kinds={"pts": "regression@1"})
    assert "px" in fp32["outputs"]["pts"]["failed"]
    assert compare_outputs({"pts": ref + np.float32(0.01)}, {"pts": ref}, "fp32",
                           kinds={"pts": "regression@1"})["passed"]


def _blazeface_like(rng: np.random.Generator, n: int = 8):
    """Outputs shaped as BlazeFace's over its real anchor grid: logits [n, 1, 896, 1] (one face
    per image on a few neighbouring anchors; background ~-10) and regressors [n, 1, 896, 16] (dx, dy, w, h and 6 keypoints,
    pixels relative to the anchor's centre)."""
    c = anchor_centres([128, 128], [[8, 2], [16, 6]])
    scores = rng.normal(-10, 1.5, (n, 1, 896, 1)).astype(np.float32)
    regs = rng.normal(0, 20, (n, 1, 896, 16)).astype(np.float32)  # background regressors: anything
    faces = []
    for i in range(n):
        cx, cy, s = rng.uniform(40, 88), rng.uniform(40, 88), rng.uniform(30, 50)
        near = np.flatnonzero(np.hypot(c[:, 0] - cx, c[:, 1] - cy) < 6)[:4]
        for a in near:
            scores[i, 0, a, 0] = rng.uniform(1.0, 3.0)
            regs[i, 0, a, :4] = [cx - c[a, 0], cy - c[a, 1], s, s]
            regs[i, 0, a, 4:] = np.tile([cx - c[a, 0], cy - c[a, 1]], 6) + rng.normal(0, 5, 12)
        faces.append((cx, cy, s))
    return scores, regs, faces


def test_anchor_head_is_judged_on_its_detections_not_every_anchor():
    assert len(anchor_centres([128, 128], [[8, 2], [16, 6]])) == 896  # BlazeFace short range's grid
    rng = np.random.default_rng(2)
    scores, regs, _ = _blazeface_like(rng)
    refs = {"regressors": regs, "classificators": scores}
    # INT8-like: the background anchors' regressors and logits move a lot (nobody reads them), the faces little
    out_s, out_r = scores.copy(), regs.copy()
    bg = scores < -2
    out_s[bg] += rng.normal(0, 1.0, int(bg.sum())).astype(np.float32)
    bgr = np.broadcast_to(bg, regs.shape)
    out_r[bgr] += rng.normal(0, 15, int(bgr.sum())).astype(np.float32)
    out_r[~bgr] += rng.normal(0, 0.3, int((~bgr).sum())).astype(np.float32)
    outs = {"regressors": out_r, "classificators": out_s}
    plain = compare_outputs(outs, refs, "int8")  # every anchor: the background's noise refuses it
    assert not plain["passed"]
    kinds = {"classificators": parse_kind(ANCHORS)}
    res = compare_outputs(outs, refs, "int8", kinds=kinds)
    assert res["passed"], res["summary"]
    d = res["outputs"]["classificators"]["metrics"]
    assert d["box_match"] == 1.0 and d["boxes_ref"] == 8 and d["anchors"] == 896 and d["detections_compared"] == 8
    assert res["outputs"]["regressors"]["kind"] == "regression"
    assert res["outputs"]["regressors"]["metrics"]["elements"] == 8 * 16  # the decoded detections' values only
    # a face lost (its logits under the threshold) and one moved off its place: box_match says so
    lost_s, moved_r = out_s.copy(), out_r.copy()
    lost_s[0][scores[0] > 0] = -3.0
    moved_r[1, 0, :, :2][scores[1, 0, :, 0] > 0] += 40.0
    res = compare_outputs({"regressors": moved_r, "classificators": lost_s}, refs, "int8", kinds=kinds)
    d = res["outputs"]["classificators"]["metrics"]
    assert not res["passed"] and d["box_recall"] == pytest.approx(6 / 8) and d["boxes_out"] == 7
    assert "box_match" in res["outputs"]["classificators"]["failed"]
    # the user's pixel bound on the boxes and keypoints of the matched detections
    bounded = compare_outputs(outs, refs, "int8", kinds={"classificators": parse_kind(ANCHORS + ":px=0.5")})
    assert "px" in bounded["outputs"]["regressors"]["failed"]
    # anchors that do not make the outputs' 896: refused with the counts, never a silent pass
    wrong = compare_outputs(outs, refs, "int8", kinds={"classificators": parse_kind(
        "detection@anchors:boxes=regressors:anchors=8x2:input=128x128")})
    assert not wrong["passed"] and "make 512 anchors, the outputs have 896" in wrong["summary"]


def test_the_gate_counts_bands_and_anchor_detections():
    """The gate's decisions (``paired.decisions_of``) follow the manifest's kinds: a band change is a changed
    decision; an anchor head's decisions are its decoded boxes."""
    k = parse_kind({"kind": "probability", "threshold": 0.2, "thresholds": [0.2, 0.8]})
    a = [np.array([[0.1]]), np.array([[0.5]]), np.array([[0.9]])]
    b = [np.array([[0.15]]), np.array([[0.79]]), np.array([[0.81]])]
    assert decisions_of(a, k) == decisions_of(b, k)
    assert decisions_of(a, k) != decisions_of([np.array([[0.1]]), np.array([[0.85]]), np.array([[0.9]])], k)
    rng = np.random.default_rng(3)
    scores, regs, faces = _blazeface_like(rng, 2)
    man = {"io": {"outputs": [{"name": "regressors", "shape": [1, 896, 16]},
                              {"name": "classificators", "shape": [1, 896, 1]}]},
           "output_kinds": {"regressors": {"kind": "regression", "anchors_of": "classificators"},
                            "classificators": parse_kind(ANCHORS)}}
    kind = decision_kind(man)
    assert kind["output"] == "classificators" and kind["classes"] == 1
    raws = [np.concatenate([scores[i], regs[i]], -1) for i in range(2)]  # what the gate's _raw_outputs pairs
    got = decisions_of(raws, kind)
    assert [len(d) // 5 for d in got] == [1, 1]  # one face each: class and corners
    cx, cy, s = faces[0]
    assert got[0][1:] == [round(cx - s / 2), round(cy - s / 2), round(cx + s / 2), round(cy + s / 2)]


def test_a_mediapipe_grid_is_inferred_only_where_its_detections_decode():
    from edgeopt_agent.compare import infer_kinds

    rng = np.random.default_rng(4)
    scores, regs, _ = _blazeface_like(rng, 4)
    k = infer_kinds({"regressors": regs, "classificators": scores}, None, [128, 128])
    assert k["classificators"]["format"] == "anchors" and k["classificators"]["anchors"] == [[8, 2], [16, 6]]
    assert k["classificators"]["boxes"] == "regressors" and k["regressors"]["anchors_of"] == "classificators"
    assert infer_kinds({"regressors": regs, "classificators": scores}, None, [224, 224])[
        "classificators"]["kind"] != "detection"  # 896 anchors are no MediaPipe grid over 224 px
    quiet = infer_kinds({"regressors": regs, "classificators": scores - 20}, None, [128, 128])  # nothing detected
    assert quiet["classificators"].get("format") != "anchors"


def test_points_behind_a_presence_logit_are_judged_where_it_keeps_them():
    """A face mesh ``[1, 1, 1, 1404]`` (468 x, y, z in a 192-px crop, a TFLite conv head's 1 x 1 axes) beside a
    presence logit ``[1, 1, 1, 1]``: regression in pixels and a decision at 0 (not two dense maps), and the points
    judged on the samples whose FP32 presence is positive -- a mesh on a non-face is discarded, whatever it
    says."""
    from edgeopt_agent.compare import infer_kinds

    rng = np.random.default_rng(5)
    pts = np.concatenate([rng.uniform(30, 160, (20, 468, 2)), rng.normal(0, 8, (20, 468, 1))], -1)
    mesh = pts.reshape(20, 1, 1, 1, 1404).astype(np.float32)
    logit = np.where(np.arange(20) % 2 == 0, 9.0, -8.0).reshape(20, 1, 1, 1, 1).astype(np.float32)
    kinds = infer_kinds({"mesh": mesh, "presence": logit}, None, [192, 192])
    assert kinds["presence"]["kind"] == "decision" and kinds["presence"]["threshold"] == 0.0
    assert kinds["mesh"] == {"kind": "regression", "guess": "coordinates", "when": "presence"}
    out = mesh + rng.normal(0, 0.2, mesh.shape).astype(np.float32)
    out[1::2] += rng.normal(0, 6, out[1::2].shape).astype(np.float32)  # non-faces: the mesh wanders
    res = compare_outputs({"mesh": out, "presence": logit}, {"mesh": mesh, "presence": logit}, "int8", kinds=kinds)
    m = res["outputs"]["mesh"]["metrics"]
    assert res["passed"], res["summary"]
    assert m["samples_judged"] == 10 and m["elements"] == 10 * 1404 and "on 10 of 20 samples" in res["summary"]
    ungated = compare_outputs({"mesh": out, "presence": logit}, {"mesh": mesh, "presence": logit}, "int8",
                              kinds={**kinds, "mesh": {"kind": "regression", "guess": "coordinates"}})
    assert not ungated["passed"]  # over every sample the wandering meshes fail the pixel bound
    out[0, 0, 0, 0, :30] += 9.0  # a face's points 9 px off: refused
    bad = compare_outputs({"mesh": out, "presence": logit}, {"mesh": mesh, "presence": logit}, "int8", kinds=kinds)
    assert "px_worst" in bad["outputs"]["mesh"]["failed"]


def test_a_model_candidate_is_judged_by_the_baselines_own_kinds(tmp_path):
    """gate's model CANDIDATE is built like the baseline bundle, with the kinds its user gave (--output-kind /
    --decision, ``source: option``) -- recorded in the candidate's manifest, which the gate's decisions follow."""
    import json

    import onnx
    from onnx import TensorProto, helper

    from edgeopt import api
    from edgeopt.hil.gate import build_candidate

    g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["score"]), helper.make_node("Relu", ["x"], ["pts"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6])],
                          [helper.make_tensor_value_info("score", TensorProto.FLOAT, [1, 6]),
                           helper.make_tensor_value_info("pts", TensorProto.FLOAT, [1, 6])])
    model = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    rep = api.build(model, "cpu", precision="fp32", dist=tmp_path / "base", output_kind=["pts=regression:px=1"],
                    decision={"score": [0.2, 0.8]})
    base = rep.results[0].bundle
    kinds = json.loads((tmp_path / base / "manifest.json").read_text())["output_kinds"]
    assert kinds["score"]["kind"] == "probability" and kinds["score"]["thresholds"] == [0.2, 0.8]
    assert kinds["pts"] == {"kind": "regression", "px": 1.0, "source": "option"}
    cand = build_candidate(model, base, None, None, tmp_path / "cand", lambda s: None)
    got = json.loads((cand / "manifest.json").read_text())["output_kinds"]
    assert got["score"]["thresholds"] == [0.2, 0.8] and got["score"]["source"] == "option"
    assert got["pts"]["px"] == 1.0
