"""Integer inputs: random data only inside the range the model implies; otherwise real data is asked for."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeopt.errors import CalibrationError
from edgeopt.model import integer_input_ranges
from edgeopt.pipeline import build


def _token_model(path, vocab: int = 50, with_length: bool = False):
    """y = mean(Embedding[vocab, 8][ids]) * (mask), plus an int 'length' used in arithmetic if asked."""
    emb = numpy_helper.from_array(np.random.default_rng(0).normal(size=(vocab, 8)).astype(np.float32), "emb")
    nodes = [helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64),
             helper.make_node("Gather", ["emb", "ids64"], ["e"], name="embed"),
             helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["mf", "ax"], ["m3"]),
             helper.make_node("Mul", ["e", "m3"], ["em"]),
             helper.make_node("ReduceMean", ["em"], ["y"], keepdims=0, axes=[1])]
    inputs = [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 6]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, 6])]
    inits = [emb, numpy_helper.from_array(np.array([2], np.int64), "ax")]
    if with_length:
        nodes += [helper.make_node("Cast", ["length"], ["lf"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["y", "lf"], ["y2"])]
        inputs.append(helper.make_tensor_value_info("length", TensorProto.INT64, [1, 1]))
    out = "y2" if with_length else "y"
    g = helper.make_graph(nodes, "tok", inputs, [helper.make_tensor_value_info(out, TensorProto.FLOAT, [1, 8])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), path)
    return path


def test_ranges_come_from_the_table_the_ids_index(tmp_path):
    path = _token_model(tmp_path / "t.onnx", vocab=50, with_length=True)
    assert integer_input_ranges(str(path), ["ids", "attention_mask", "length"]) == {
        "ids": (0, 50), "attention_mask": (0, 2), "length": None}


def test_token_ids_build_on_random_data_inside_the_vocabulary(tmp_path):
    rep = build(str(_token_model(tmp_path / "t.onnx", vocab=50)), "cpu", ["fp32"], out=tmp_path / "d", jobs=1)
    assert rep.ok, rep.results
    bundle = tmp_path / "d" / "t" / "cpu-fp32"
    x = np.load(bundle / "validation" / "inputs.npz")
    ids = [x[k] for k in x.files][0]
    assert ids.min() >= 0 and ids.max() < 50 and ids.max() >= 4  # the whole vocabulary, not [0, 4)


def test_an_integer_input_of_unknown_meaning_asks_for_real_data(tmp_path):
    path = _token_model(tmp_path / "t.onnx", with_length=True)
    with pytest.raises(CalibrationError, match="'length' .*--calib|does not tell"):
        build(str(path), "cpu", ["fp32"], out=tmp_path / "d", jobs=1)
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").rglob("manifest.json"))
    rng = np.random.default_rng(1)
    np.savez(tmp_path / "data.npz", ids=rng.integers(0, 50, (12, 1, 6)).astype(np.int32),
             attention_mask=np.ones((12, 1, 6), np.int64), length=rng.integers(1, 7, (12, 1, 1)).astype(np.int64))
    rep = build(str(path), "cpu", ["fp32"], calib=str(tmp_path / "data.npz"), out=tmp_path / "d", jobs=1,
                n_calib=4)
    assert rep.ok, rep.results


def test_a_grayscale_input_records_the_preprocessing_that_was_done(tmp_path):
    """1-channel images: order gray and one mean/std (the preset's average) in the manifest, and the data
    really is that (not ImageNet's red-channel mean applied to luminance)."""
    import json

    from edgeopt.fixtures import path as fixture
    from tests.conftest import tiny_cnn

    model = tiny_cnn(tmp_path / "g.onnx", channels=1)
    rep = build(str(model), "cpu", ["fp32"], calib=str(fixture("images")), preprocess="preset=imagenet",
                out=tmp_path / "d", jobs=1, n_calib=4)
    assert rep.ok, rep.results
    m = json.loads((tmp_path / "d" / "g" / "cpu-fp32" / "manifest.json").read_text())
    pre = m["validation"]["source"]["preprocess"]
    assert pre["order"] == "gray" and pre["mean"] == [round((0.485 + 0.456 + 0.406) / 3, 6)] and len(pre["std"]) == 1


@pytest.mark.parametrize("form", ["constant", "range"])
def test_a_one_hot_written_as_equal_against_a_range_tells_the_inputs_values(tmp_path, form):
    """Issue 39, 8: byte ids compared with a broadcast 0..255 and cast (a one-hot as ``Equal``, not ``OneHot``)
    were refused without --calib as 'meaning unknown'; the range is [0, 256)."""
    nodes = [helper.make_node("Unsqueeze", ["ids", "ax"], ["u"])]
    inits = [numpy_helper.from_array(np.array([-1], np.int64), "ax"),
             numpy_helper.from_array(np.ones((256, 8), np.float32), "w")]
    if form == "constant":
        inits.append(numpy_helper.from_array(np.arange(256, dtype=np.int32).reshape(1, 1, 256), "r"))
    else:
        inits += [numpy_helper.from_array(np.array(v, np.int32), n) for n, v in (("s", 0), ("l", 256), ("d", 1))]
        nodes.append(helper.make_node("Range", ["s", "l", "d"], ["r"]))
    nodes += [helper.make_node("Equal", ["u", "r"], ["eq"]), helper.make_node("Cast", ["eq"], ["oh"], to=1),
              helper.make_node("MatMul", ["oh", "w"], ["y"])]
    g = helper.make_graph(nodes, "onehot", [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert integer_input_ranges(model, ["ids"]) == {"ids": (0, 256)}
