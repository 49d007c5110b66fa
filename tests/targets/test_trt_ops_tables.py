"""One ONNX operator table per TensorRT release edgeopt has onnx-tensorrt's matrix for, picked by the TensorRT
version a target profile names: jetson-xavier (JetPack 5, TensorRT 8.5) reads 8.5's, jetson-orin (JetPack 6,
TensorRT 10.3) the 10.1 matrix (the newest at or below 10.3), nvidia and callers without a target 10.15's,
a100/h100/l4 (TensorRT 11) 11.0's; inspect, the build's refusal and the in-build preflight use the target's
table."""

from __future__ import annotations

import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402

from edgeopt.errors import ModelError, UnsupportedOps, UsageError  # noqa: E402
from edgeopt.targets.registry import BUILTIN, get_backend  # noqa: E402
from edgeopt.targets.tensorrt import prep as trt_prep  # noqa: E402
from edgeopt.targets.tensorrt import refusal_note  # noqa: E402


def _swish_model(path):
    """Relu -> Swish (ONNX opset 24): Swish is the op TensorRT 11.0's parser added over 10.15's."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                           helper.make_node("Swish", ["r"], ["y"], name="swish_node")], "swish",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 24)], ir_version=10)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_both_real_tables_parse_with_their_version_and_source():
    t10, t11 = trt_prep.ops_table(tensorrt_major=10), trt_prep.ops_table(tensorrt_major=11)

    assert (t10.tensorrt_version, t10.file) == ("10.15", "tensorrt_onnx_ops.txt")
    assert (t11.tensorrt_version, t11.file) == ("11.0", "tensorrt11_onnx_ops.txt")
    assert t11.source_commit == "2f3fa349247d9ff52d7662cb995c82278df31a86" and t11.source_commit in t11.source
    assert (t10.opset_min, t10.opset_max) == (t11.opset_min, t11.opset_max) == (9, 24)
    assert len(t10.ops) > 190 and len(t11.ops) == len(t10.ops) + 1
    # 11.0's matrix is 10.15's plus Swish: a model the default (10.x) table takes, every table takes
    assert t11.supported() - t10.supported() == {"Swish"} and t10.supported() <= t11.supported()
    assert {k: v for k, v in t11.ops.items() if k != "Swish"} == t10.ops
    assert trt_prep.ops_table() is t10  # callers without a target


def test_each_tensorrt_target_reads_the_table_of_its_tensorrt_version():
    tables = {n: trt_prep.table_for_target(BUILTIN[n].as_dict())
              for n in ("jetson-orin", "jetson-xavier", "a100", "h100", "l4", "nvidia")}

    assert {n: (t.tensorrt_version, t.for_tensorrt) for n, t in tables.items()} == {
        "jetson-orin": ("10.1", "10.3"), "jetson-xavier": ("8.5", None), "a100": ("11.0", None),
        "h100": ("11.0", None), "l4": ("11.0", None), "nvidia": ("10.15", None)}
    assert tables["jetson-orin"].parser == "TensorRT 10.3's ONNX parser (onnx-tensorrt's 10.1 matrix)"
    with pytest.raises(UsageError, match="no ONNX operator table for TensorRT 12.*8.5, 10.1, 10.15, 11.0"):
        trt_prep.table_for_target({"name": "future", "profile": {"tensorrt_major": 12}})


def test_swish_is_taken_by_h100_and_refused_by_jetson_with_the_node_and_parser_named(tmp_path):
    from edgeopt.model import inspect

    info = inspect(_swish_model(tmp_path / "s.onnx"))
    backend = get_backend("tensorrt")
    orin, h100 = BUILTIN["jetson-orin"].as_dict(), BUILTIN["h100"].as_dict()

    bad = backend.unsupported_nodes(info, orin)

    assert bad == [("Swish", "swish_node")]
    assert backend.unsupported_nodes(info, h100) == []
    why = backend.unsupported_why(orin, bad)
    assert why == ("refused by TensorRT 10.3's ONNX parser (onnx-tensorrt's 10.1 matrix); "
                   "TensorRT 11.0's ONNX parser takes Swish (a100, h100, l4)")
    message = str(UnsupportedOps("jetson-orin", bad, why))
    assert "'jetson-orin' cannot take 1 node(s)" in message and "TensorRT 10.3" in message
    assert "Swish (node 'swish_node')" in message


def test_in_build_preflight_and_opset_check_use_the_target_table(tmp_path):
    model = onnx.load(str(_swish_model(tmp_path / "s.onnx")))
    nodes = trt_prep.model_nodes(model)
    orin = trt_prep.table_for_target(BUILTIN["jetson-orin"].as_dict())
    h100 = trt_prep.table_for_target(BUILTIN["h100"].as_dict())

    assert trt_prep.preflight(nodes, orin) == [("Swish", "swish_node")]
    assert trt_prep.preflight(nodes, h100) == []
    model.opset_import[0].version = 25
    with pytest.raises(UsageError, match="TensorRT 11.0's parser takes opsets 9..24") as exc:
        trt_prep.ensure_opset(model, table=h100)
    assert "tensorrt11_onnx_ops.txt" in exc.value.hint


def test_refusal_names_no_other_parser_when_none_takes_the_op():
    table = trt_prep.ops_table(tensorrt_major=11)
    assert refusal_note(table, ["Unique"]) == "refused by TensorRT 11.0's ONNX parser"


def test_inspect_and_build_agree_on_which_tensorrt_target_takes_swish(tmp_path):
    from edgeopt.api import inspect
    from edgeopt.pipeline import build

    path = _swish_model(tmp_path / "s.onnx")

    rows = {r["target"]: r for r in inspect(path)["support"]}
    orin = build(str(path), "jetson-orin", ["fp16"], out=tmp_path / "out", jobs=1).results[0]

    assert rows["jetson-orin"]["supported"] is False
    assert rows["jetson-orin"]["unsupported"] == [{"op": "Swish", "node": "swish_node"}]
    assert "TensorRT 10.3's ONNX parser" in rows["jetson-orin"]["why"]
    assert orin.status == "unsupported"
    assert "Swish (swish_node)" in orin.error and "refused by TensorRT 10.3's ONNX parser" in orin.error
    # h100's parser takes Swish (no operator refusal), but ONNX Runtime 1.23 reads opsets up to 23 and makes
    # every build's FP32 reference: inspect says no for the format, not for an operator
    assert rows["h100"]["unsupported"] == [] and rows["h100"]["why"] is None
    assert rows["h100"]["supported"] is False and "opset 24" in rows["h100"]["format"]["message"]
    # the build goes on past the operator check, to the opset down-conversion it cannot make for this
    # opset-24 model (Swish has no earlier version) -- a model error, not an operator refusal
    try:
        h100 = build(str(path), "h100", ["fp16"], out=tmp_path / "out11", jobs=1).results[0]
    except ModelError as exc:
        assert "cannot take the model from opset 24 to 23" in exc.message, exc.message
    else:
        assert h100.status != "unsupported", h100.error


# --------------------------------------------------------------------------------------------
# Versions finer than the major: jetson-orin (TensorRT 10.3) and jetson-xavier (TensorRT 8.5)
# --------------------------------------------------------------------------------------------
def _stft_model(path):
    """Relu -> STFT (ONNX opset 17): onnx-tensorrt's parser takes STFT from TensorRT 10.5 on (Changelog),
    so the 10.15 and 11.0 tables take it and TensorRT 10.3 (JetPack 6) refuses it."""
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"], name="relu"),
         helper.make_node("STFT", ["r", "step", "", "length"], ["y"], name="spectrogram", onesided=1)], "stft",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 9, 2])],
        initializer=[helper.make_tensor("step", TensorProto.INT64, [], [8]),
                     helper.make_tensor("length", TensorProto.INT64, [], [16])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path


def test_the_jetson_tables_are_onnx_tensorrt_matrices_and_differ_by_the_ops_added_since():
    t85, t101, t1015 = (trt_prep.ops_table(tensorrt=v) for v in ("8.5", "10.1", "10.15"))

    assert (t85.tensorrt_version, t85.file, (t85.opset_min, t85.opset_max)) == ("8.5", "tensorrt8_5_onnx_ops.txt", (9, 17))
    assert (t101.tensorrt_version, t101.file, (t101.opset_min, t101.opset_max)) == (
        "10.1", "tensorrt10_1_onnx_ops.txt", (9, 20))
    assert t85.source_commit == "fd119fec8565264add819f8edc801066116a32dd" and t85.source_commit in t85.source
    assert t101.source_commit == "96e781103cfc4adf4a6bb557e94bac8e693f6f4c" and t101.source_commit in t101.source
    assert t1015.source_commit == "fa5aa9f61e7781d2ca8f5351d42c1f19525a6124" and t1015.source_commit in t1015.source
    # what onnx-tensorrt's Changelog says the parser gained after 10.3 (10.4 windows, 10.5 STFT, 10.14
    # Attention, 10.15 RMSNormalization/RotaryEmbedding/TensorScatter), and nothing was taken away
    assert t1015.supported() - t101.supported() == {
        "Attention", "BlackmanWindow", "HammingWindow", "HannWindow", "STFT", "RMSNormalization",
        "RotaryEmbedding", "TensorScatter"}
    assert t101.supported() - t85.supported() == {
        "CastLike", "DeformConv", "Gelu", "GroupNormalization", "Hardmax", "IsInf", "LayerNormalization", "Mish"}
    assert t85.supported() <= t101.supported() <= t1015.supported()
    assert {"HardSwish", "Mod", "OneHot"} <= t85.supported()  # marked Y from 8.5.2.2 (JetPack 5.1.x) on


@pytest.mark.parametrize("version, table, stands_for", [
    ("10.3", "10.1", "10.3"), ("10.9", "10.1", "10.9"), ("10.15", "10.15", None), ("10.16", "10.15", "10.16"),
    ("10", "10.15", None), (10, "10.15", None), ("11", "11.0", None), ("11.4.1", "11.0", "11.4.1"),
    ("8.5", "8.5", None), ("8.5.2", "8.5", None), ("8.6", "8.5", "8.6"),
])
def test_a_profile_version_reads_the_newest_table_of_its_major_at_or_below_it(version, table, stands_for):
    t = trt_prep.table_for_target({"name": "t", "profile": {"tensorrt": version}})
    assert (t.tensorrt_version, t.for_tensorrt) == (table, stands_for)
    assert trt_prep.table_for_target({"name": "t", "profile": {"tensorrt_major": 11}}).tensorrt_version == "11.0"


@pytest.mark.parametrize("profile, message", [
    ({"tensorrt": "10.0"}, "no ONNX operator table for TensorRT 10.0: edgeopt has"),
    ({"tensorrt": "9.3"}, "no ONNX operator table for TensorRT 9.3"),
    ({"tensorrt": "12.1"}, "no ONNX operator table for TensorRT 12.1"),
    ({"tensorrt": 10.1}, "is a number; write the version as a string"),
    ({"tensorrt": "ten"}, "expected a TensorRT version"),
    ({"tensorrt": "10.3", "tensorrt_major": 11}, "names TensorRT 10.3 .tensorrt. but tensorrt_major 11"),
])
def test_a_profile_version_with_no_table_is_refused_in_one_line(profile, message):
    with pytest.raises(UsageError, match=message):
        trt_prep.table_for_target({"name": "mine", "profile": profile})


def test_user_targets_name_their_tensorrt_version_or_keep_a_major(tmp_path):
    from edgeopt.targets.registry import resolve_target
    from edgeopt.targets.tensorrt import build_spec, resolve_options

    cfg = tmp_path / "edgeopt.yaml"
    cfg.write_text('targets:\n  orin-jp7:\n    base: jetson-orin\n    profile: {tensorrt: "10.16"}\n'
                   "  old-box:\n    backend: tensorrt\n    profile: {tensorrt_major: 10}\n"
                   '  thor:\n    base: h100\n    profile: {tensorrt: "11.4.1", fp8: true}\n'
                   '  future:\n    base: h100\n    profile: {tensorrt: "12.0"}\n')
    specs = {n: resolve_target(n, cfg).as_dict() for n in ("orin-jp7", "old-box", "thor", "future")}

    assert trt_prep.table_for_target(specs["orin-jp7"]).parser == "TensorRT 10.16's ONNX parser (onnx-tensorrt's 10.15 matrix)"
    assert trt_prep.table_for_target(specs["old-box"]).parser == "TensorRT 10.15's ONNX parser"  # as before
    assert trt_prep.table_for_target(specs["thor"]).tensorrt_version == "11.0"
    with pytest.raises(UsageError, match="no ONNX operator table for TensorRT 12.0"):
        trt_prep.table_for_target(specs["future"])
    # the major still decides the typing: builder flags below 11, strongly typed from 11
    for name, strong, major in (("orin-jp7", False, 10), ("old-box", False, 10), ("thor", True, 11)):
        bs = build_spec("fp16", resolve_options({}, specs[name], "fp16"), specs[name], {}, {})
        assert (bs["strongly_typed"], bs["tensorrt_major"]) == (strong, major), name


@pytest.mark.parametrize("target, version, major, strong", [
    ("jetson-orin", "10.3", 10, False), ("jetson-xavier", "8.5", 8, False), ("h100", "11", 11, True),
    ("nvidia", None, None, True),
])
def test_build_spec_carries_the_profile_version_and_the_major_decides_typing(target, version, major, strong):
    from edgeopt.targets.tensorrt import build_spec, resolve_options

    spec = BUILTIN[target].as_dict()
    bs = build_spec("fp16", resolve_options({}, spec, "fp16"), spec, {}, {})
    assert (bs["tensorrt"], bs["tensorrt_major"], bs["strongly_typed"]) == (version, major, strong)
    assert bs["flags"] == ([] if strong else ["FP16"])


def test_stft_is_refused_for_jetson_orin_with_node_and_parser_and_taken_by_a100_h100(tmp_path):
    from edgeopt.model import inspect

    info = inspect(_stft_model(tmp_path / "stft.onnx"))
    backend = get_backend("tensorrt")
    specs = {n: BUILTIN[n].as_dict() for n in ("jetson-orin", "jetson", "a100", "h100", "nvidia")
             if n in BUILTIN}
    from edgeopt.targets.registry import resolve_target

    specs["jetson"] = resolve_target("jetson").as_dict()  # the alias is jetson-orin

    for name in ("jetson-orin", "jetson"):
        bad = backend.unsupported_nodes(info, specs[name])
        assert bad == [("STFT", "spectrogram")]
        why = backend.unsupported_why(specs[name], bad)
        assert why.startswith("refused by TensorRT 10.3's ONNX parser (onnx-tensorrt's 10.1 matrix); ")
        assert "TensorRT 11.0's ONNX parser takes STFT (a100, h100, l4)" in why
        message = str(UnsupportedOps("jetson-orin", bad, why))
        assert "STFT (node 'spectrogram')" in message and "TensorRT 10.3" in message
    for name in ("a100", "h100", "nvidia"):
        assert backend.unsupported_nodes(info, specs[name]) == [], name


def test_layer_normalization_is_refused_for_jetson_xavier_by_tensorrt_8_5(tmp_path):
    g = helper.make_graph([helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="ln", axis=-1)], "ln",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                          initializer=[helper.make_tensor("s", TensorProto.FLOAT, [4], [1.0] * 4)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    nodes = trt_prep.model_nodes(model)
    xavier = trt_prep.table_for_target(BUILTIN["jetson-xavier"].as_dict())
    orin = trt_prep.table_for_target(BUILTIN["jetson-orin"].as_dict())

    assert trt_prep.preflight(nodes, xavier) == [("LayerNormalization", "ln")]
    assert trt_prep.preflight(nodes, orin) == []
    assert refusal_note(xavier, ["LayerNormalization"]).startswith(
        "refused by TensorRT 8.5's ONNX parser; TensorRT 10.3's ONNX parser (onnx-tensorrt's 10.1 matrix) takes "
        "LayerNormalization (jetson-orin)")
    model.opset_import[0].version = 18
    with pytest.raises(UsageError, match="TensorRT 8.5's parser takes opsets 9..17"):
        trt_prep.ensure_opset(model, table=xavier)


def test_inspect_and_build_agree_on_which_tensorrt_target_takes_stft(tmp_path):
    from edgeopt.api import inspect
    from edgeopt.pipeline import build

    path = _stft_model(tmp_path / "stft.onnx")

    rows = {r["target"]: r for r in inspect(path)["support"]}
    orin = build(str(path), "jetson-orin", ["fp32"], out=tmp_path / "out", jobs=1).results[0]
    h100 = build(str(path), "h100", ["fp32"], out=tmp_path / "out11", jobs=1).results[0]

    assert rows["jetson-orin"]["supported"] is False
    assert rows["jetson-orin"]["unsupported"] == [{"op": "STFT", "node": "spectrogram"}]
    assert "TensorRT 10.3's ONNX parser" in rows["jetson-orin"]["why"]
    assert orin.status == "unsupported"
    assert "STFT (spectrogram)" in orin.error and "refused by TensorRT 10.3's ONNX parser" in orin.error
    assert rows["h100"]["supported"] is True and rows["a100"]["supported"] is True
    assert h100.status != "unsupported", h100.error
