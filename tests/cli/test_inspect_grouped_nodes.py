"""``inspect``'s text output says a reason once per (op, reason) with the count and the node names, not once per
node (torchvision's s3d: 14 lines of one 3-D MaxPool reason on mobile); ``--json`` keeps one entry per node."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _save(path, nodes, x_shape, y, y_shape, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info(y, TensorProto.FLOAT, y_shape)], initializer=list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, str(path))
    return str(path)


def _inspect(capsys, *args) -> str:
    from edgeopt.cli import main

    assert main(["inspect", *map(str, args), "--no-kinds"]) == 0
    return capsys.readouterr().out


def _section(text: str, title: str) -> list[str]:
    """The lines of the paragraph that starts with ``title``."""
    lines = text.splitlines()
    start = lines.index(title)
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start + 1:end]


def test_probably_not_says_each_reason_once_with_the_count(tmp_path, capsys, monkeypatch):
    # five Acos and one Asin: mobile (onnx2tf) doubts both ops with one rule ("an input value of exactly 0 ...")
    monkeypatch.delenv("COLUMNS", raising=False)
    nodes = [helper.make_node("Acos", ["x" if i == 0 else f"a{i - 1}"], [f"a{i}"], name=f"acos_{i}")
             for i in range(5)] + [helper.make_node("Asin", ["a4"], ["y"], name="asin_0")]
    model = _save(tmp_path / "acos.onnx", nodes, [1, 4], "y", [1, 4])

    text = _inspect(capsys, model)
    assert "probably not: 6 node(s): Acos, Asin (see below)" in text  # the table's cell is as before
    lines = _section(text, "mobile: probably not (only converting can tell)")
    acos = [ln for ln in lines if ln.split()[0] == "Acos"]
    assert len(acos) == 1, lines  # one line for the five nodes, not five
    assert "5 nodes (acos_0, acos_1, acos_2 and 2 more): an input value of exactly 0 cannot be ruled out" in acos[0]
    assert "acos_3" not in text and "acos_4" not in text
    # one node alone keeps its own line; the same reason under another op is its own group
    (asin,) = [ln for ln in lines if ln.split()[0] == "Asin"]
    assert "asin_0: an input value of exactly 0 cannot be ruled out" in asin
    assert lines[-1].strip() == "(--json lists every node)"

    # --json: unchanged, one entry per node
    doc = json.loads(_inspect_json(capsys, model))
    mobile = next(r for r in doc["support"] if r["target"] == "mobile")
    assert mobile["supported"]
    assert [p["node"] for p in mobile["probably"]] == [f"acos_{i}" for i in range(5)] + ["asin_0"]
    assert {p["why"] for p in mobile["probably"]} == {acos[0].split("): ", 1)[1]}
    assert all(set(p) == {"op", "node", "why"} for p in mobile["probably"])


def test_four_nodes_are_all_named(tmp_path, capsys, monkeypatch):
    """"and 1 more" would be no shorter than the name: up to four names are shown."""
    monkeypatch.delenv("COLUMNS", raising=False)
    nodes = [helper.make_node("Acos", ["x" if i == 0 else f"a{i - 1}"], [f"a{i}" if i < 3 else "y"],
                              name=f"acos_{i}") for i in range(4)]
    text = _inspect(capsys, _save(tmp_path / "acos4.onnx", nodes, [1, 4], "y", [1, 4]))
    (line,) = _section(text, "mobile: probably not (only converting can tell)")
    assert "4 nodes (acos_0, acos_1, acos_2, acos_3): " in line and "more" not in line


def test_unsupported_nodes_grouped_with_every_name(tmp_path, capsys, monkeypatch):
    """A 3-D MaxPool is refused on mobile (FlexMaxPool3D): its long reason once, then every node named (inspect
    lists every unsupported node by name)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    names = [f"stage{i}/pool3d" for i in range(6)]
    nodes = [helper.make_node("MaxPool", ["x" if i == 0 else f"m{i - 1}"], [f"m{i}" if i < 5 else "y"],
                              kernel_shape=[1, 1, 1], name=n) for i, n in enumerate(names)]
    nodes.append(helper.make_node("Relu", ["y"], ["z"], name="relu"))
    model = _save(tmp_path / "pool3d.onnx", nodes, [1, 2, 3, 4, 5], "z", [1, 2, 3, 4, 5])

    text = _inspect(capsys, model)
    lines = _section(text, "mobile: unsupported nodes")
    assert len(lines) == 2, lines  # the label (op and reason) once, then the nodes
    assert lines[0].strip().startswith("MaxPool (3 spatial dimensions: ") and "FlexMaxPool3D" in lines[0]
    assert lines[1].strip() == "6 nodes: " + ", ".join(names)
    assert text.count("3 spatial dimensions") == 2 + 2  # android and mobile: the table's cell and the paragraph

    # on a narrow terminal the names wrap between names, every one still there
    monkeypatch.setenv("COLUMNS", "50")
    lines = _section(_inspect(capsys, model), "mobile: unsupported nodes")
    assert len(lines) > 2 and all(len(ln) <= 50 for ln in lines[1:]), lines
    listed = " ".join(ln.strip() for ln in lines[1:]).removeprefix("6 nodes: ").split(", ")
    assert listed == names

    monkeypatch.delenv("COLUMNS")
    doc = json.loads(_inspect_json(capsys, model))
    mobile = next(r for r in doc["support"] if r["target"] == "mobile")
    assert not mobile["supported"] and [u["node"] for u in mobile["unsupported"]] == names


def test_one_node_per_reason_reads_as_before(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    w = numpy_helper.from_array(np.ones((1, 1, 1, 1, 1), np.float32), "w")
    nodes = [helper.make_node("MaxPool", ["x"], ["m"], kernel_shape=[1, 1, 1], name="pool"),
             helper.make_node("Conv", ["m", "w"], ["y"], name="conv")]
    text = _inspect(capsys, _save(tmp_path / "one.onnx", nodes, [1, 1, 2, 2, 2], "y", [1, 1, 2, 2, 2], [w]))
    (line,) = _section(text, "mobile: unsupported nodes")
    assert line.startswith("  MaxPool (3 spatial dimensions: ") and line.endswith(") pool")


def _inspect_json(capsys, model) -> str:
    from edgeopt.cli import main

    assert main(["inspect", str(model), "--no-kinds", "--json"]) == 0
    return capsys.readouterr().out
