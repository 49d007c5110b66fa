"""PLACEHOLDER: being written (see the issue). Replaced by the real backend before landing."""

from .base import Target


class CoreMlTarget(Target):
    backend = "coreml"
    extra = "coreml"
    packages = ["__not_yet__"]
