"""PLACEHOLDER: being written (see the issue). Replaced by the real backend before landing."""

from .base import Target


class OpenVinoTarget(Target):
    backend = "openvino"
    extra = "openvino"
    packages = ["__not_yet__"]
