"""PLACEHOLDER: being written (see the issue). Replaced by the real backend before landing."""

from .base import Target


class TfliteTarget(Target):
    backend = "tflite"
    extra = "tflite"
    packages = ["__not_yet__"]
