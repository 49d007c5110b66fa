"""edgeopt: one ONNX model in; a faithful, measured artifact for every target out.

The API mirrors the CLI: ``edgeopt.inspect``, ``edgeopt.build`` ...; heavy modules load on use.
"""

__version__ = "0.1.0"


def inspect(path):
    """Inspect an ONNX model (see ``edgeopt.model.inspect``)."""
    from .model import inspect as _inspect

    return _inspect(path)


def build(model, targets, **kwargs):
    """Build bundles for targets (see ``edgeopt.build.build``)."""
    from .build import build as _build

    return _build(model, targets, **kwargs)
