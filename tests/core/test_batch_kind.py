"""`build --batch B` keeps the batch-1 model's output kind: a [B, 2] softmax is B samples' classes,
not [T, K] positions of one sample (issue 27 item 4: the ocr-cls batch-4 bundle was judged per position)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeopt.targets.base import BuildJob, output_kinds


def _classifier(path, batch_dim):
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(8, 2)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)],
        "cls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch_dim, 8])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch_dim, 2])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)
    return model


def _job(tmp_path, batch_dim, batch):
    import onnxruntime as ort

    src = tmp_path / "m.onnx"
    _classifier(src, batch_dim)
    sess = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).normal(size=(16, batch, 8)).astype(np.float32)
    ref = np.stack([sess.run(None, {"x": s})[0] for s in x])
    np.savez(tmp_path / "reference.npz", out0=ref)
    np.savez(tmp_path / "validation.npz", in0=x)
    return BuildJob(model_name="m", model_path=str(src), model_sha256="", prepared_path=str(src), target={},
                    precision="fp32", bundle_dir=str(tmp_path), io={
                        "inputs": [{"name": "x", "shape": [batch, 8], "dtype": "float32"}],
                        "outputs": [{"name": "probs", "shape": [batch, 2], "dtype": "float32"}]},
                    calib_path=None, validation_path=str(tmp_path / "validation.npz"),
                    reference_path=str(tmp_path / "reference.npz"), data_source={"kind": "random"})


def test_a_batch_4_softmax_is_classification_as_at_batch_1(tmp_path):
    k4 = output_kinds(_job(tmp_path, "N", 4))["probs"]
    (tmp_path / "b1").mkdir()
    k1 = output_kinds(_job(tmp_path / "b1", "N", 1))["probs"]
    assert k1["kind"] == "classification"
    assert k4["kind"] == "classification", k4


def test_a_static_leading_dimension_is_not_folded(tmp_path):
    # [4, 2] fixed by the model itself: no batch this build chose, the data decide as before
    kind = output_kinds(_job(tmp_path, 4, 4))["probs"]
    assert kind["kind"] == "per_position", kind


def test_a_minus_one_leading_dimension_is_a_batch_too(tmp_path):
    # Paddle's exports (ocr-cls) write the batch as dim_value -1: dynamic, so batch 4 is folded as "N" is
    kind = output_kinds(_job(tmp_path, -1, 4))["probs"]
    assert kind["kind"] == "classification", kind
