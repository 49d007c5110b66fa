"""Real bundles for the agent tests (built once per session) and a helper that runs the agent as a
device does: ``python -m edgeopt_agent VERB`` with JSON on stdin, one JSON object on stdout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import fixture, tiny_cnn


def agent(verb: str, request: dict[str, Any] | None = None, *, cwd: Path | None = None,
          env: dict[str, str] | None = None, timeout: float = 120) -> tuple[int, dict[str, Any]]:
    """Run the agent in a child process; the exit code and its single JSON reply."""
    proc = subprocess.run([sys.executable, "-m", "edgeopt_agent", verb], input=json.dumps(request or {}),
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, f"expected one JSON line on stdout, got {proc.stdout!r} (stderr {proc.stderr[-500:]!r})"
    reply = json.loads(lines[0])
    assert reply["schema"] == 1 and reply["verb"] == verb and isinstance(reply["ok"], bool)
    assert proc.returncode == (0 if reply["ok"] else 1)
    if not reply["ok"]:
        assert set(reply["error"]) >= {"type", "message"}
    return proc.returncode, reply


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory) -> Path:
    """cpu fp32 bundle of tests/conftest.py's tiny CNN (random validation data: it has no real input)."""
    from edgeopt.pipeline import build

    d = tmp_path_factory.mktemp("agent-tiny")
    report = build(tiny_cnn(d / "tiny.onnx"), "cpu", ["fp32"], out=d / "dist")
    assert report.ok, report.results
    return Path(report.results[0].bundle)


@pytest.fixture(scope="session")
def ocr_cls_bundle(tmp_path_factory, images_dir) -> Path:
    """cpu fp32 bundle of the real PP-OCR text-orientation classifier, validated on real images."""
    from edgeopt.pipeline import build

    d = tmp_path_factory.mktemp("agent-ocr-cls")
    report = build(fixture("ocr-cls"), "cpu", ["fp32"], shapes={"x": [1, 3, 48, 192]}, calib=str(images_dir),
                   preprocess="preset=pm1", out=d / "dist")
    assert report.ok, report.results
    return Path(report.results[0].bundle)
