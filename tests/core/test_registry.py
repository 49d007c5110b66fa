"""The target registry: aliases, typos, precisions, user-defined targets."""

from __future__ import annotations

import pytest

from edgeopt.errors import UsageError
from edgeopt.targets.registry import BACKENDS, BUILTIN, resolve_precisions, resolve_target, resolve_targets


def test_users_example_resolves_jetson_to_current_generation():
    specs = resolve_targets("jetson,h100,cpu")
    assert [s.name for s in specs] == ["jetson-orin", "h100", "cpu"]
    assert specs[1].profile["fp8"] is True


def test_unknown_target_suggests_closest():
    with pytest.raises(UsageError) as e:
        resolve_target("jetson-oron")
    assert "did you mean jetson-orin" in str(e.value)


def test_precision_auto_and_unsupported():
    cpu = resolve_target("cpu")
    assert resolve_precisions(cpu, ["auto"]) == ["fp32"]
    with pytest.raises(UsageError, match="does not offer fp8"):
        resolve_precisions(cpu, ["fp8"])
    with pytest.raises(UsageError, match="unknown precision"):
        resolve_precisions(cpu, ["int4"])


def test_every_builtin_target_has_a_backend_and_sane_default():
    for spec in BUILTIN.values():
        assert spec.backend in BACKENDS
        assert spec.default_precision in spec.precisions


def test_user_defined_target_inherits_and_refuses_unknown_keys(tmp_path):
    cfg = tmp_path / "edgeopt.yaml"
    cfg.write_text("targets:\n  lab-orin-nx:\n    base: jetson-orin\n    profile: {dla_cores: 1}\n")
    spec = resolve_target("lab-orin-nx", cfg)
    assert spec.backend == "tensorrt" and spec.profile["dla_cores"] == 1 and spec.user_defined
    cfg.write_text("targets:\n  x:\n    backend: onnxruntime\n    colour: red\n")
    with pytest.raises(UsageError, match="unknown key"):
        resolve_target("x", cfg)
