"""--shape ranges and buckets (issue 42): parsing, the API's forms, the one-line refusals, inspect's
dynamic axes and suggested bounds. Fast: no conversion."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from edgeopt import api
from edgeopt.errors import UsageError
from edgeopt.model import inspect, parse_shapes, static_input_shapes
from edgeopt.shapes import Buckets, Range, VarShape, describe, suggest_buckets, variable_axes
from tests.conftest import fixture


def test_range_and_buckets_parse_to_the_top_with_bounds():
    s = parse_shapes(["input_ids:1x1..128", "mask:1x16|32|64|128", "x:1x3x224x224"])
    assert s["input_ids"] == [1, 128] and variable_axes(s["input_ids"]) == {1: Range(1, 128)}
    assert s["mask"] == [1, 128] and variable_axes(s["mask"]) == {1: Buckets((16, 32, 64, 128))}
    assert s["x"] == [1, 3, 224, 224] and not isinstance(s["x"], VarShape)
    assert repr(s["input_ids"]) == "1x1..128"
    # Polygraphy's and trtexec's spellings take them too
    assert variable_axes(parse_shapes(["ids:[1,8..64]"])["ids"]) == {1: Range(8, 64)}
    both = parse_shapes(["a:1x1..8,b:1x2|4"])
    assert describe(both) == {"a": [{"axis": 1, "range": [1, 8]}], "b": [{"axis": 1, "buckets": [2, 4]}]}


def test_api_takes_the_same_forms():
    s = api.parse_shapes({"ids": [1, "1..128"], "m": [1, (16, 32)], "r": [1, range(8, 65)], "x": [1, 3]})
    assert variable_axes(s["ids"]) == {1: Range(1, 128)}
    assert variable_axes(s["m"]) == {1: Buckets((16, 32))}
    assert variable_axes(s["r"]) == {1: Range(8, 64)}
    assert s["x"] == [1, 3]
    assert variable_axes(api.parse_shapes("ids:1x4..9")["ids"]) == {1: Range(4, 9)}


@pytest.mark.parametrize("spec, words", [
    ("ids:1x128..1", "min 128 > max 1"),
    ("ids:1x0..8", "positive"),
    ("ids:1x8|0", "positive"),
    ("ids:1xa..b", "integers, ranges"),
])
def test_bad_ranges_are_one_line_usage_errors(spec, words):
    with pytest.raises(UsageError, match=words.replace("|", r"\|")):
        parse_shapes([spec])


def test_buckets_or_range_on_a_fixed_dim_refused():
    info = inspect(fixture("ocr-cls"))  # x [?, 3, ?, ?]: the channel dim is fixed at 3
    with pytest.raises(UsageError, match="fixed at 3 in the model"):
        static_input_shapes(info, parse_shapes(["x:1x1|3x48x192"]))
    ok = static_input_shapes(info, parse_shapes(["x:1x3x48x32..320"]))
    assert variable_axes(ok["x"]) == {3: Range(32, 320)} and ok["x"] == [1, 3, 48, 320]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgeopt", *args], capture_output=True, text=True, timeout=300)


def test_cli_bad_range_and_static_dim_exit_2_in_one_line():
    model = str(fixture("ocr-cls"))
    for spec, words in (("x:1x3x48x320..32", "min 320 > max 32"), ("x:1x2|3x48x192", "fixed at 3")):
        p = _cli("inspect", model, "--shape", spec)
        assert p.returncode == 2, p.stderr
        first = p.stderr.strip().splitlines()[0]
        assert words in first and "Traceback" not in p.stderr


def _position_model(path, vocab=1000, positions=512, hidden=16):
    """A text-encoder front end: token + learned position embeddings (Gathers from [V, H] and [P, H])."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    tok = numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "tok")
    pos = numpy_helper.from_array(rng.standard_normal((positions, hidden)).astype(np.float32), "pos")
    nodes = [helper.make_node("Gather", ["tok", "input_ids"], ["t"]),
             helper.make_node("Shape", ["input_ids"], ["s"], start=1),
             helper.make_node("Squeeze", ["s"], ["n"]),
             helper.make_node("Range", ["zero", "n", "one"], ["idx"]),
             helper.make_node("Gather", ["pos", "idx"], ["p"]),
             helper.make_node("Add", ["t", "p"], ["y"])]
    g = helper.make_graph(nodes, "enc", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "seq"])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seq", hidden])],
                          [tok, pos, numpy_helper.from_array(np.array(0, np.int64), "zero"),
                           numpy_helper.from_array(np.array(1, np.int64), "one")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return path


def test_inspect_names_dynamic_axes_and_suggests_position_bound(tmp_path):
    model = _position_model(tmp_path / "enc.onnx")
    info = inspect(model)
    (axis,) = info.dynamic_axes
    assert axis["input"] == "input_ids" and axis["axis"] == 1 and axis["dim"] == "seq"
    assert axis["suggest"] == 512 and "position-embedding" in axis["why"]
    p = _cli("inspect", str(model))
    assert p.returncode == 0, p.stderr
    assert "at most 512" in p.stdout and "--shape input_ids:1x1..512" in p.stdout
    j = json.loads(_cli("inspect", str(model), "--json", "--shape", "input_ids:1x8..128").stdout)
    assert j["variable"] == {"input_ids": [{"axis": 1, "range": [8, 128]}]}
    # a CNN's width: dynamic, no bound in the model
    rec = inspect(fixture("ocr-rec"))
    assert [a["axis"] for a in rec.dynamic_axes] == [0, 2, 3] and all(a["suggest"] is None for a in rec.dynamic_axes)


def test_suggest_buckets_from_quantiles():
    lengths = list(range(8, 129))
    b = suggest_buckets(lengths)
    assert b[-1] == 128 and len(b) == 4 and b == sorted(b)


def test_bad_shape_form_option_exit_2():
    p = _cli("build", str(fixture("oww-melspec")), "-t", "cpu", "--shape", "input:1x4000..32000",
             "--option", "shape_form=padded", "--out", "/nonexistent-never-written")
    assert p.returncode == 2 and "shape_form" in p.stderr.strip().splitlines()[0]


def test_inspect_warns_when_the_math_sees_pads():
    p = _cli("inspect", str(fixture("ocr-rec")), "--shape", "x:1x3x48x32..320")
    assert p.returncode == 0, p.stderr
    assert "padding may change the answers" in p.stdout and "no mask input" in p.stdout


def test_auto_buckets_parse_and_cap_the_padding_waste():
    from edgeopt.shapes import AutoBuckets, choose_buckets, padding_waste

    s = parse_shapes(["ids:1x8..128|auto", "m:1x8..128|auto@10%"])
    assert variable_axes(s["ids"]) == {1: AutoBuckets(8, 128, 0.25)} and s["ids"] == [1, 128]
    assert variable_axes(s["m"])[1].cap == pytest.approx(0.10)
    lengths = [int(n) for n in np.random.default_rng(0).integers(8, 129, 300)]
    waste = {}
    for cap in (0.5, 0.25, 0.1):
        edges, why = choose_buckets(lengths, 8, 128, cap)
        assert edges[-1] == 128 and edges == sorted(edges) and why["met_cap"]
        assert padding_waste(lengths, edges)[0] == why["padding_waste"] <= cap
        assert set(edges[:-1]) <= set(lengths)  # each edge below the top is a real length
        assert sum(b["samples"] for b in why["per_bucket"].values()) == len(lengths)
        waste[cap] = (len(edges), why["padding_waste"])
    assert waste[0.5][0] < waste[0.25][0] < waste[0.1][0]  # a tighter cap, more buckets
    # every sample padded to 128 is far past the caps: one bucket would not do
    assert padding_waste(lengths, [128])[0] > 0.5
    # the mix decides: all short but one, the short ones get their own bucket
    edges, _ = choose_buckets([10] * 50 + [128], 8, 128, 0.25)
    assert edges == [10, 128]


@pytest.mark.parametrize("spec, words", [
    ("ids:1x8..128|auto@0", "padding-waste cap"),
    ("ids:1x8..128|auto@ten", "padding-waste cap"),
    ("ids:1x128..8|auto", "min 128 > max 8"),
])
def test_bad_auto_buckets_one_line(spec, words):
    with pytest.raises(UsageError, match=words):
        parse_shapes([spec])


def _static_model(path):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "static",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_cli_buckets_on_a_static_model_and_auto_without_lengths_exit_2(tmp_path):
    model = str(_static_model(tmp_path / "static.onnx"))
    p = _cli("build", model, "-t", "cpu", "--shape", "x:1x4|8|16", "--out", str(tmp_path / "never"))
    assert p.returncode == 2 and "fixed at 16 in the model" in p.stderr.strip().splitlines()[0], p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "never").exists()
    mel = str(fixture("oww-melspec"))
    p = _cli("build", mel, "-t", "cpu", "--shape", "input:1x4000..32000|auto", "--out", str(tmp_path / "never"))
    assert p.returncode == 2 and "give --calib data" in p.stderr.strip().splitlines()[0], p.stderr
    np.savez(tmp_path / "flat.npz", input=np.zeros((4, 32000), np.float32))  # every sample at the top
    p = _cli("build", mel, "-t", "cpu", "--shape", "input:1x4000..32000|auto", "--calib", str(tmp_path / "flat.npz"),
             "--out", str(tmp_path / "never"))
    assert p.returncode == 2 and "no samples of their own lengths" in p.stderr.strip().splitlines()[0], p.stderr
    assert "Traceback" not in p.stderr
    p = _cli("build", mel, "-t", "cpu", "--shape", "input:1x16000", "--buckets", "auto", "--out", str(tmp_path / "never"))
    assert p.returncode == 2 and "no --shape gives a range" in p.stderr.strip().splitlines()[0], p.stderr


def test_buckets_flag_is_the_auto_suffix_on_every_range():
    from edgeopt.shapes import with_auto_buckets

    assert with_auto_buckets(["input:1x4000..32000"], "auto") == ["input:1x4000..32000|auto"]
    assert with_auto_buckets(["a:1x8..16,b:1x2..4|auto", "c:1x3"], "auto@10%") == \
        ["a:1x8..16|auto@10%,b:1x2..4|auto", "c:1x3"]
    for args, words in ((["x:1x8..16"], "expected auto"), (["x:1x8"], "no --shape gives a range")):
        with pytest.raises(UsageError, match=words):
            with_auto_buckets(args, "bogus" if words == "expected auto" else "auto")
