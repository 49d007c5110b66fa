"""The target registry: name -> backend + device profile + defaults.

Capabilities are data.  A target is one line here (or an entry in a user config file); a
backend is one module under ``edgeopt.targets`` registered by dotted path, so nothing heavy is
imported until a target of that backend is used.

User-defined targets: a YAML file (``--config``, ``$EDGEOPT_CONFIG`` or ``./edgeopt.yaml``)::

    targets:
      my-orin-nx:
        backend: tensorrt
        base: jetson-orin            # inherit profile and defaults
        profile: {dla_cores: 1, workspace_mb: 2048}
        description: Orin NX 8GB in the lab
"""

from __future__ import annotations

import difflib
import importlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgeopt.errors import UsageError, yaml_error

# backend name -> "module:Class" of its Target implementation.
BACKENDS: dict[str, str] = {
    "onnxruntime": "edgeopt.targets.onnxruntime:OnnxRuntimeTarget",
    "openvino": "edgeopt.targets.openvino:OpenVinoTarget",
    "tflite": "edgeopt.targets.tflite:TfliteTarget",
    "coreml": "edgeopt.targets.coreml:CoreMlTarget",
    "tensorrt": "edgeopt.targets.tensorrt:TensorRtTarget",
}


@dataclass(frozen=True)
class TargetSpec:
    """One named hardware target."""

    name: str
    backend: str
    description: str
    default_precision: str
    precisions: tuple[str, ...]
    profile: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    user_defined: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "backend": self.backend, "description": self.description,
                "default_precision": self.default_precision, "precisions": list(self.precisions),
                "profile": dict(self.profile), "user_defined": self.user_defined}


def _t(name, backend, description, default, precisions, **profile) -> TargetSpec:
    return TargetSpec(name, backend, description, default, tuple(precisions), profile)


_TRT = ("fp32", "fp16", "int8")
# `tensorrt`: the TensorRT the target's devices run -- it picks the ONNX operator table (tensorrt.prep.ops_table)
# and, by its major, the typing (strongly typed from 11).  JetPack 6.x (Orin) ships 10.3; Xavier's last
# JetPack (5.1.x) ships 8.5; the data-centre GPUs name only the major (any 11.x).  User targets may give
# `tensorrt_major` alone instead, as before.
BUILTIN: dict[str, TargetSpec] = {t.name: t for t in [
    _t("cpu", "onnxruntime", "any x86-64/arm64 CPU, ONNX Runtime", "fp32", ("fp32", "int8")),
    _t("intel-cpu", "openvino", "Intel CPU, OpenVINO", "int8", ("fp32", "fp16", "int8"), device="CPU"),
    _t("intel-gpu", "openvino", "Intel integrated/discrete GPU, OpenVINO", "fp16", ("fp32", "fp16", "int8"),
       device="GPU"),
    _t("intel-npu", "openvino", "Intel NPU (Core Ultra), OpenVINO", "fp16", ("fp16", "int8"), device="NPU"),
    _t("android", "tflite", "Android phone, LiteRT (XNNPACK; GPU/NNAPI delegates where present)", "int8",
       ("fp32", "fp16", "int8"), delegates=["xnnpack", "gpu", "nnapi"]),
    _t("mobile", "tflite", "generic mobile/embedded CPU, LiteRT (XNNPACK)", "fp16", ("fp32", "fp16", "int8"),
       delegates=["xnnpack"]),
    _t("apple", "coreml", "Apple silicon / iOS, Core ML ML Program", "fp16", ("fp32", "fp16"),
       minimum_deployment_target="iOS16"),
    _t("jetson-orin", "tensorrt", "NVIDIA Jetson Orin (Ampere, sm_87), TensorRT", "fp16", _TRT,
       compute_capability="8.7", dla_cores=2, fp8=False, workspace_mb=2048, jetson=True, tensorrt="10.3"),
    _t("jetson-xavier", "tensorrt", "NVIDIA Jetson AGX Xavier (Volta, sm_72), TensorRT", "fp16", _TRT,
       compute_capability="7.2", dla_cores=2, fp8=False, workspace_mb=1024, jetson=True, tensorrt="8.5"),
    _t("a100", "tensorrt", "NVIDIA A100 (Ampere, sm_80), TensorRT", "fp16", _TRT,
       compute_capability="8.0", dla_cores=0, fp8=False, workspace_mb=8192, tensorrt="11"),
    _t("h100", "tensorrt", "NVIDIA H100 (Hopper, sm_90), TensorRT", "fp16", _TRT + ("fp8",),
       compute_capability="9.0", dla_cores=0, fp8=True, workspace_mb=8192, tensorrt="11"),
    _t("l4", "tensorrt", "NVIDIA L4 (Ada, sm_89), TensorRT", "fp16", _TRT + ("fp8",),
       compute_capability="8.9", dla_cores=0, fp8=True, workspace_mb=4096, tensorrt="11"),
    _t("nvidia", "tensorrt", "any NVIDIA GPU with TensorRT (profile read on the device)", "fp16", _TRT,
       compute_capability=None, dla_cores=0, fp8=False, workspace_mb=4096),
]}

# Names users type that mean another target. `jetson` is the current generation.
ALIASES: dict[str, str] = {
    "jetson": "jetson-orin",
    "orin": "jetson-orin",
    "xavier": "jetson-xavier",
    "tflite": "mobile",
    "coreml": "apple",
    "openvino": "intel-cpu",
    "onnxruntime": "cpu",
    "ort": "cpu",
    "tensorrt": "nvidia",
    "trt": "nvidia",
}

PRECISIONS = ("fp32", "fp16", "int8", "fp8")
_ALLOWED_USER_KEYS = {"backend", "base", "description", "default_precision", "precisions", "profile"}


def config_path(explicit: str | os.PathLike | None = None) -> Path | None:
    if explicit:
        return Path(explicit)
    env = os.environ.get("EDGEOPT_CONFIG")
    if env:
        return Path(env)
    local = Path("edgeopt.yaml")
    return local if local.is_file() else None


def load_user_targets(path: Path | None) -> dict[str, TargetSpec]:
    """Parse the ``targets:`` section of a config file; unknown keys are refused."""
    if path is None:
        return {}
    if not path.is_file():
        raise UsageError(f"config file {str(path)!r} does not exist")
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UsageError(yaml_error(exc, str(path))) from None
    entries = data.get("targets") or {}
    if not isinstance(entries, dict):
        raise UsageError(f"{path}: `targets` must be a mapping of name -> settings")
    out: dict[str, TargetSpec] = {}
    for name, entry in entries.items():
        where = f"{path}: target {name!r}"
        if not isinstance(entry, dict):
            raise UsageError(f"{where} must be a mapping")
        unknown = set(entry) - _ALLOWED_USER_KEYS
        if unknown:
            raise UsageError(f"{where}: unknown key(s) {sorted(unknown)}",
                             hint=f"allowed keys: {sorted(_ALLOWED_USER_KEYS)}")
        base = entry.get("base")
        if base is not None:
            if base not in BUILTIN and base not in out:
                raise UsageError(f"{where}: base {base!r} is not a known target")
            parent = out.get(base) or BUILTIN[base]
        else:
            backend = entry.get("backend")
            if backend not in BACKENDS:
                raise UsageError(f"{where}: backend must be one of {sorted(BACKENDS)}, got {backend!r}")
            parent = TargetSpec(name, backend, "", "fp32", ("fp32",))
        precisions = tuple(entry.get("precisions", parent.precisions))
        bad = [p for p in precisions if p not in PRECISIONS]
        if bad:
            raise UsageError(f"{where}: unknown precision(s) {bad}")
        spec = replace(
            parent, name=name, backend=entry.get("backend", parent.backend),
            description=entry.get("description", parent.description or f"user target ({parent.backend})"),
            default_precision=entry.get("default_precision", parent.default_precision),
            precisions=precisions, profile={**parent.profile, **(entry.get("profile") or {})},
            user_defined=True)
        if spec.backend not in BACKENDS:
            raise UsageError(f"{where}: backend must be one of {sorted(BACKENDS)}")
        out[name] = spec
    return out


def all_targets(config: str | os.PathLike | None = None) -> dict[str, TargetSpec]:
    """Built-in targets plus the user's, by name."""
    return {**BUILTIN, **load_user_targets(config_path(config))}


def resolve_target(name: str, config: str | os.PathLike | None = None) -> TargetSpec:
    """A target by name or alias; an unknown name suggests the closest ones."""
    targets = all_targets(config)
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in targets:
        return targets[key]
    candidates = list(targets) + list(ALIASES)
    close = difflib.get_close_matches(key, candidates, n=3, cutoff=0.5)
    close = [ALIASES.get(c, c) if c in ALIASES else c for c in close]
    hint = f"did you mean {' or '.join(dict.fromkeys(close))}?" if close else None
    raise UsageError(f"unknown target {name!r}",
                     hint=(hint + " " if hint else "") + "`edgeopt targets` lists them all")


def resolve_targets(names: str | list[str], config: str | os.PathLike | None = None) -> list[TargetSpec]:
    """Parse ``jetson,h100,cpu``; duplicates (also through aliases) are dropped in order."""
    if isinstance(names, str):
        names = [n for n in names.split(",")]
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise UsageError("no target given", hint="e.g. --targets cpu,intel-cpu")
    seen: dict[str, TargetSpec] = {}
    for n in names:
        spec = resolve_target(n, config)
        seen.setdefault(spec.name, spec)
    return list(seen.values())


def resolve_precisions(spec: TargetSpec, requested: list[str]) -> list[str]:
    """``auto`` -> the target's default; a precision the target lacks is an error."""
    out: list[str] = []
    for p in requested:
        p = p.strip().lower()
        if p == "auto":
            p = spec.default_precision
        if p not in PRECISIONS:
            close = difflib.get_close_matches(p, PRECISIONS + ("auto",), n=1)
            raise UsageError(f"unknown precision {p!r}",
                             hint=(f"did you mean {close[0]}? " if close else "") + "one of fp32, fp16, int8, fp8, auto")
        if p not in spec.precisions:
            raise UsageError(f"target {spec.name!r} does not offer {p}",
                             hint=f"{spec.name} offers {', '.join(spec.precisions)}")
        if p not in out:
            out.append(p)
    return out


_loaded: dict[str, Any] = {}


def get_backend(name: str):
    """The Target instance of a backend (imported on first use)."""
    if name not in _loaded:
        module, _, cls = BACKENDS[name].partition(":")
        _loaded[name] = getattr(importlib.import_module(module), cls)()
    return _loaded[name]
