"""PLACEHOLDER: being written (see the issue). Replaced by the real backend before landing."""

from .base import Target


class TensorRtTarget(Target):
    backend = "tensorrt"
    extra = "tensorrt"
    packages = ["__not_yet__"]
