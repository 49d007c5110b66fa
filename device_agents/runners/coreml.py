"""Core ML runner: a bundle's ``.mlpackage`` through coremltools' ``MLModel.predict`` (macOS only).

Core ML itself exists only on Apple platforms; coremltools installs on Linux but cannot predict
there ("Model prediction is only supported on macOS"), so ``load()`` refuses early with the
reason instead of failing on the first ``run``.  Compute units come from the options
(``compute_units``: ALL, CPU_ONLY, CPU_AND_GPU, CPU_AND_NE), else from the bundle's runtime
options, else ALL.  Standard library + numpy at import time; coremltools inside ``load``.
"""

from __future__ import annotations

import platform
import sys
from typing import Any

import numpy as np

from . import Runner, RunnerUnavailable

COMPUTE_UNITS = ("ALL", "CPU_ONLY", "CPU_AND_GPU", "CPU_AND_NE")


class CoreMlRunner(Runner):
    """Runs an ML Program package with Core ML on macOS."""

    runtime = "coreml"

    def compute_units(self) -> str:
        """The compute units asked for (options first, then the bundle's runtime options)."""
        value = self.options.get("compute_units") or self.manifest["runtime"].get("options", {}).get("compute_units")
        units = str(value or "ALL").upper()
        if units not in COMPUTE_UNITS:
            raise ValueError(f"compute_units {value!r} is not one of {', '.join(COMPUTE_UNITS)}")
        return units

    def load(self) -> None:
        if sys.platform != "darwin":
            raise RunnerUnavailable(f"Core ML runs only on macOS (this machine is {platform.system()}); "
                                    "run this bundle on a Mac or an iOS device agent")
        units = self.compute_units()
        try:
            import coremltools as ct
        except ImportError as exc:
            raise RunnerUnavailable(f"coremltools is not installed: {exc} (pip install coremltools)") from None
        if not self.artifact.is_dir():
            raise RunnerUnavailable(f"the bundle has no Core ML package at {self.artifact}")
        self._ct = ct
        self._units = units
        self.model = ct.models.MLModel(str(self.artifact), compute_units=ct.ComputeUnit[units])
        self._outputs = [o.name for o in self.model.get_spec().description.output]

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = self.model.predict(feed)
        return {name: np.asarray(out[name]) for name in self._outputs}

    def info(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "version": getattr(self._ct, "__version__", "?"),
                "compute_units": self._units, "macos": platform.mac_ver()[0]}
