"""Fixtures for rollout tests: a mixed fleet (local devices + real sshd devices), real bundle versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import fixture
from tests.devices.conftest import _no_ssh_agent, ssh_env, sshd  # noqa: F401 - shared fixtures
from tests.hil.models import perturbed


def _build(model: Path, out: Path, n_val: int = 8) -> Path:
    from edgeopt.pipeline import build

    rep = build(model, "cpu", ["fp32"], shapes={"x": [1, 3, 48, 192]}, calib=str(fixture("images")),
                preprocess="preset=pm1", out=out, n_calib=4, n_val=n_val)
    assert rep.ok, rep.results
    return Path(rep.results[0].bundle)


@pytest.fixture(scope="session")
def versions(tmp_path_factory) -> dict[str, Path]:
    """v1 = the PP-OCR classifier; v2 = the same model rebuilt as a new version (another manifest: a
    new bundle id, same speed and decisions); bad = perturbed weights (other decisions)."""
    d = tmp_path_factory.mktemp("versions")
    src = Path(fixture("ocr-cls"))
    return {"v1": _build(src, d / "v1"), "v2": _build(src, d / "v2", n_val=7),
            "bad": _build(perturbed(src, d / "bad" / src.name, scale=0.3), d / "dist-bad")}
