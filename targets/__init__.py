"""Targets: one module per backend, one common interface (``base.Target``), one registry."""

from .registry import TargetSpec, all_targets, get_backend, resolve_target, resolve_targets

__all__ = ["TargetSpec", "all_targets", "get_backend", "resolve_target", "resolve_targets"]
