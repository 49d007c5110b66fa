"""The cpu INT8 search's per-node sensitivity runs through ``edgeopt debug``'s per-layer machinery (issue 30 item 5):
windows do not change its figures, and a node's figure is the SQNR that ``layerdiff.node_metrics`` gives the same
tensors (so the search ranks nodes on the error ``edgeopt debug`` shows).  Real model and data: PP-OCR's
text-orientation classifier on text-line crops of skimage's scanned page, quantized by ONNX Runtime (MinMax,
per-tensor, the QDQ the search's first variants are)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.conftest import fixture


@pytest.fixture(scope="module")
def qdq(tmp_path_factory) -> tuple[Path, Path, list[dict[str, np.ndarray]]]:
    from edgeopt import model as modelmod
    from edgeopt.targets.onnxruntime import quant
    from tests.targets.test_tensorrt import text_line_crops

    work = tmp_path_factory.mktemp("sens")
    m = modelmod.make_static(modelmod.load(fixture("ocr-cls")), {"x": [1, 3, 48, 192]})
    onnx.save(m, str(work / "static.onnx"))
    quant.preprocess(str(work / "static.onnx"), work / "f.onnx", [])
    feeds = [{"x": c} for c in text_line_crops(4)]
    ranges = quant.calibrate(work / "f.onnx", "minmax", feeds, work)
    quant.quantize(work / "f.onnx", ranges, quant.QuantSettings("minmax", False), work / "q.onnx")
    return work / "f.onnx", work / "q.onnx", feeds


def test_windows_do_not_change_the_ranking(qdq, tmp_path):
    from edgeopt.layerdiff import tensor_bytes, windows
    from edgeopt.targets.onnxruntime.quant import sensitivity

    fp, qp, feeds = qdq
    whole = sensitivity(ort, fp, qp, feeds, tmp_path)
    small = sensitivity(ort, fp, qp, feeds, tmp_path, max_memory=4 << 20)
    fm = onnx.load(str(fp))
    names = sorted({o for n in fm.graph.node for o in n.output})
    assert len(windows(names, tensor_bytes(fm, names, feeds[0]), 1, 4 << 20)) > 3  # really windowed
    assert len(whole) > 50
    assert small == whole  # the same nodes, order and figures, to the bit


def test_a_nodes_figure_is_the_sqnr_node_metrics_gives_its_tensors(qdq, tmp_path):
    """The top node's figure = SQNR(worst input) - SQNR(worst output), each SQNR being node_metrics' snr_db
    of the stacked tensor read as edgeopt debug reads it (the QDQ value after its DequantizeLinear)."""
    from edgeopt.layerdiff import OrtSource, node_metrics
    from edgeopt.targets.onnxruntime.quant import sensitivity

    fp, qp, feeds = qdq
    ranked = sensitivity(ort, fp, qp, feeds, tmp_path)
    fm, qm = onnx.load(str(fp)), onnx.load(str(qp))
    q_of = {n.input[0]: n.output[0] for n in qm.graph.node if n.op_type == "QuantizeLinear"}
    dq_of = {n.input[0]: n.output[0] for n in qm.graph.node if n.op_type == "DequantizeLinear"}
    q_made = {o for n in qm.graph.node for o in n.output}
    inits = {i.name for i in fm.graph.initializer}
    nodes = {n.name: n for n in fm.graph.node}
    # the most sensitive node whose own output the QDQ model keeps (no folded activation to look through)
    name, _, drop = next(r for r in ranked if all(o in q_made for o in nodes[r[0]].output))
    node = nodes[name]
    ins = [t for t in node.input if t and t not in inits]
    outs = list(node.output)

    def plain(data: bytes):
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])

    alias = {t: dq_of[q_of[t]] for t in ins + outs if t in q_of and q_of[t] in dq_of}
    ref = OrtSource(fm, plain).run(ins + outs, feeds)
    got = OrtSource(qm, plain, alias=alias).run(ins + outs, feeds)
    snr = {t: node_metrics(got[t], ref[t], "int8")[0]["snr_db"] for t in ins + outs}
    assert drop == pytest.approx(min(snr[t] for t in ins) - min(snr[t] for t in outs), abs=1e-6)
    # and edgeopt debug's rel_l2 of that output is the same error: rel_l2 = 10^(-SQNR/20)
    t = outs[0]
    m = node_metrics(got[t], ref[t], "int8")[0]
    assert m["rel_l2"] == pytest.approx(10 ** (-m["snr_db"] / 20), rel=1e-9)
