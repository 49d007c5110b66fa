"""A per-token tagger is judged per position, not as CTC (issue 26 item 2): its "no tag" class dominates
and the tags come in short runs, which looks like a CTC blank on the values alone; the integer token-id
input of the same length says what it is."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgeopt.targets.base import BuildJob, output_kinds
from edgeopt_agent.compare import infer_kinds

T, V, K = 64, 50, 4


def _tagger(tmp_path):
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    table = np.zeros((V, K), np.float32)
    table[:, 0] = 4.0  # most tokens: "no tag"
    for v in rng.choice(V, 6, replace=False):  # a few tokens carry a tag
        table[v] = 0.0
        table[v, 1 + v % 3] = 4.0
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb", "ids"], ["logits"]), helper.make_node("Softmax", ["logits"], ["tags"], axis=-1)],
        "tagger", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, T])],
        [helper.make_tensor_value_info("tags", TensorProto.FLOAT, [1, T, K])], [numpy_helper.from_array(table, "emb")])
    src = tmp_path / "tagger.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), src)
    sess = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    ids = rng.integers(0, V, size=(12, 1, T)).astype(np.int64)
    ref = np.stack([sess.run(None, {"ids": x})[0] for x in ids])
    np.savez(tmp_path / "reference.npz", out0=ref)
    np.savez(tmp_path / "validation.npz", in0=ids)
    job = BuildJob(model_name="tagger", model_path=str(src), model_sha256="", prepared_path=str(src), target={},
                   precision="fp32", bundle_dir=str(tmp_path), io={
                       "inputs": [{"name": "ids", "shape": [1, T], "dtype": "int64"}],
                       "outputs": [{"name": "tags", "shape": [1, T, K], "dtype": "float32"}]},
                   calib_path=None, validation_path=str(tmp_path / "validation.npz"),
                   reference_path=str(tmp_path / "reference.npz"), data_source={"kind": "random"})
    return job, ref


def test_a_tagger_over_token_ids_is_per_position_not_ctc(tmp_path):
    job, ref = _tagger(tmp_path)
    assert infer_kinds({"tags": ref}, {"tags": ("Softmax", -1)})["tags"]["kind"] == "ctc_batch_major"  # values alone
    assert output_kinds(job)["tags"]["kind"] == "per_position"
