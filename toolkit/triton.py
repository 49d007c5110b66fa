"""A Triton Inference Server model repository from a TensorRT bundle (datacenter GPU targets).

``edgeopt export triton BUNDLE --repository REPO`` writes::

    REPO/<name>/config.pbtxt      platform tensorrt_plan, inputs/outputs, max batch, dynamic batching,
                                  instance groups, default_model_filename
    REPO/<name>/1/model.plan      the engine (--engine FILE), else built there on the Triton host
    REPO/<name>/edgeopt.json      where it came from (bundle, model sha256, target, precision)

The engine itself is built on the GPU that serves it, with the TensorRT version of the Triton
container (engines are tied to both): ``python3 -m edgeopt_agent compile`` with
``{"options": {"copy_to": "REPO/<name>/1/model.plan"}}`` does it from the same bundle.

Batching: Triton's ``max_batch_size > 0`` needs a dynamic leading (batch) dim in the engine, i.e. a
bundle built with ``--option trt_profile=x:1x.../8x.../32x...`` whose profile starts at batch 1;
``dims`` then leave the batch dim out.  A static bundle exports with ``max_batch_size: 0``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeopt.errors import UsageError

TRITON_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16", "float64": "TYPE_FP64",
                "int8": "TYPE_INT8", "uint8": "TYPE_UINT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32",
                "int64": "TYPE_INT64", "bool": "TYPE_BOOL"}
PLAN_FILE = "model.plan"


class Ident(str):
    """An enum value written bare in protobuf text format (``TYPE_FP32``, not ``"TYPE_FP32"``)."""


@dataclass(frozen=True)
class TritonOptions:
    """Choices for the exported model; None means "derive it from the bundle"."""

    name: str | None = None
    max_batch: int | None = None
    dynamic_batching: bool = True
    queue_delay_us: int = 100
    preferred_batch: tuple[int, ...] = ()
    instances: int = 1
    gpus: tuple[int, ...] = ()
    engine: str | None = None
    version: int = 1
    force: bool = False


@dataclass
class TritonExport:
    """What ``export_triton`` wrote."""

    model_dir: Path
    config: dict[str, Any]
    config_text: str
    engine_copied: bool
    next_steps: list[str] = field(default_factory=list)


def _load_bundle(bundle: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from edgeopt_agent.bundle import BundleError, load_manifest

    if not bundle.is_dir():
        raise UsageError(f"bundle {str(bundle)!r} is not a directory", hint="pass OUT/<model>/<target>-<precision>")
    try:
        manifest = load_manifest(bundle)
    except BundleError as exc:
        raise UsageError(f"{bundle}: {exc}") from None
    if manifest.get("backend") != "tensorrt" or (manifest.get("runtime") or {}).get("name") != "tensorrt":
        raise UsageError(f"{bundle} is a {manifest.get('backend')} bundle; Triton export takes TensorRT bundles",
                         hint="build with --targets a100, h100, l4 or nvidia")
    profile = (manifest.get("target_spec") or {}).get("profile") or {}
    if profile.get("jetson"):
        raise UsageError(f"{bundle} targets {manifest.get('target')} (a Jetson); the Triton export is for "
                         "datacenter GPU targets", hint="build for a100, h100, l4 or nvidia")
    spec_rel = (manifest["runtime"].get("options") or {}).get("build_spec", "trt_build.json")
    try:
        spec = json.loads((bundle / spec_rel).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{bundle}: cannot read its build spec {spec_rel} ({exc})") from None
    return manifest, spec


def _output_dynamic_axes(bundle: Path, manifest: dict[str, Any]) -> dict[str, set[int]]:
    """Which output dims are not fixed in the prepared ONNX (they follow a dynamic input dim)."""
    import onnx

    m = onnx.load(str(bundle / manifest["runtime"]["artifact"]), load_external_data=False)
    out = {}
    for vi in m.graph.output:
        dims = vi.type.tensor_type.shape.dim
        out[vi.name] = {i for i, d in enumerate(dims) if not (d.HasField("dim_value") and d.dim_value > 0)}
    return out


def model_name(manifest: dict[str, Any], given: str | None) -> str:
    name = given or f"{manifest['model']['name']}"
    if not re.fullmatch(r"[A-Za-z0-9_.\-]+", name) or name in (".", ".."):
        raise UsageError(f"Triton model name {name!r} may hold only letters, digits, '_', '-' and '.'",
                         hint="pass --name")
    return name


def model_config(manifest: dict[str, Any], spec: dict[str, Any], out_dynamic: dict[str, set[int]],
                 opts: TritonOptions) -> dict[str, Any]:
    """The model configuration as plain data (``to_pbtxt`` writes it)."""
    io = manifest["io"]
    profiles = spec.get("profiles") or []
    prof = profiles[0] if profiles else {}

    def dynamic_axes(name: str) -> set[int]:
        p = prof.get(name)
        return {i for i, (a, b) in enumerate(zip(p["min"], p["max"])) if a != b} if p else set()

    batchable = bool(io["inputs"]) and all(0 in dynamic_axes(t["name"]) and prof[t["name"]]["min"][0] == 1
                                           for t in io["inputs"])
    limit = min(prof[t["name"]]["max"][0] for t in io["inputs"]) if batchable else 0
    max_batch = limit if opts.max_batch is None else opts.max_batch
    if max_batch < 0:
        raise UsageError(f"--max-batch must be >= 0, got {max_batch}")
    if max_batch > 0 and not batchable:
        raise UsageError(f"--max-batch {max_batch} needs a dynamic batch dim starting at 1 in the engine; "
                         "this bundle has " + ("no optimization profile" if not prof else "a profile without one"),
                         hint="rebuild with --option trt_profile=NAME:1x.../OPTx.../MAXx... (batch first), "
                              "or export with --max-batch 0")
    if max_batch > limit:
        raise UsageError(f"--max-batch {max_batch} exceeds the profile's largest batch {limit}",
                         hint=f"use --max-batch {limit} or rebuild with a larger profile")
    if any(b < 1 or b > max_batch for b in opts.preferred_batch):
        raise UsageError(f"--preferred-batch sizes must lie in 1..{max_batch}")
    if opts.instances < 1:
        raise UsageError(f"--instances must be >= 1, got {opts.instances}")
    if opts.queue_delay_us < 0:
        raise UsageError(f"--queue-delay-us must be >= 0, got {opts.queue_delay_us}")

    def tensor(t: dict[str, Any], dyn: set[int]) -> dict[str, Any]:
        if t["dtype"] not in TRITON_TYPES:
            raise UsageError(f"tensor {t['name']!r} has dtype {t['dtype']}, which Triton cannot carry")
        dims = [-1 if i in dyn else int(d) for i, d in enumerate(t["shape"])]
        return {"name": t["name"], "data_type": Ident(TRITON_TYPES[t["dtype"]]),
                "dims": dims[1:] if max_batch > 0 else dims}

    cfg: dict[str, Any] = {
        "name": None,  # filled by the caller
        "platform": "tensorrt_plan",
        "default_model_filename": PLAN_FILE,
        "max_batch_size": max_batch,
        "input": [tensor(t, dynamic_axes(t["name"])) for t in io["inputs"]],
        "output": [tensor(t, out_dynamic.get(t["name"], set())) for t in io["outputs"]],
    }
    if max_batch > 0 and opts.dynamic_batching:
        db: dict[str, Any] = {}
        if opts.preferred_batch:
            db["preferred_batch_size"] = list(opts.preferred_batch)
        db["max_queue_delay_microseconds"] = int(opts.queue_delay_us)
        cfg["dynamic_batching"] = db
    group: dict[str, Any] = {"count": int(opts.instances), "kind": Ident("KIND_GPU")}
    if opts.gpus:
        group["gpus"] = list(opts.gpus)
    cfg["instance_group"] = [group]
    return cfg


def _scalar(v: Any) -> str:
    if isinstance(v, Ident):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return str(v)
    return json.dumps(str(v))  # a JSON string literal is a valid protobuf text string


def to_pbtxt(cfg: dict[str, Any], indent: int = 0) -> str:
    """Protobuf text format of a config dict (messages, repeated messages and scalars)."""
    pad = "  " * indent
    lines = []
    for key, value in cfg.items():
        if value is None:
            continue
        if isinstance(value, dict):
            lines.append(f"{pad}{key} {{")
            lines.append(to_pbtxt(value, indent + 1))
            lines.append(f"{pad}}}")
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines.append(f"{pad}{key} [")
            for i, v in enumerate(value):
                lines.append(f"{pad}  {{")
                lines.append(to_pbtxt(v, indent + 2))
                lines.append(f"{pad}  }}" + ("," if i < len(value) - 1 else ""))
            lines.append(f"{pad}]")
        elif isinstance(value, list):
            lines.append(f"{pad}{key}: [ " + ", ".join(_scalar(v) for v in value) + " ]")
        else:
            lines.append(f"{pad}{key}: {_scalar(value)}")
    return "\n".join(line for line in lines if line)


def export_triton(bundle: str | os.PathLike, out: str | os.PathLike, opts: TritonOptions | None = None) -> TritonExport:
    """Write ``out/<name>/`` (config.pbtxt, version folder, engine when given) atomically."""
    opts = opts or TritonOptions()
    bundle = Path(bundle)
    manifest, spec = _load_bundle(bundle)
    name = model_name(manifest, opts.name)
    if opts.version < 1:
        raise UsageError(f"--version must be >= 1, got {opts.version}")
    engine = Path(opts.engine) if opts.engine else None
    if engine is not None and (not engine.is_file() or engine.stat().st_size == 0):
        raise UsageError(f"--engine-file {str(engine)!r} is not a non-empty file",
                         hint="the engine path printed by `python3 -m edgeopt_agent compile` on the Triton host")
    cfg = model_config(manifest, spec, _output_dynamic_axes(bundle, manifest), opts)
    cfg["name"] = name
    cfg = {"name": name, **{k: v for k, v in cfg.items() if k != "name"}}
    text = to_pbtxt(cfg) + "\n"
    out = Path(out)
    final = out / name
    if final.exists() and not opts.force:
        raise UsageError(f"{final} exists", hint="pass --force to replace it, or --name for another model name")
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=out))
    except OSError as exc:
        raise UsageError(f"--repository {str(out)!r} is not writable: {exc.strerror or exc}") from None
    try:
        (tmp / "config.pbtxt").write_text(text)
        (tmp / str(opts.version)).mkdir()
        if engine is not None:
            shutil.copyfile(engine, tmp / str(opts.version) / PLAN_FILE)
        (tmp / "edgeopt.json").write_text(json.dumps({
            "bundle": str(bundle.resolve()), "model": manifest.get("model"), "target": manifest.get("target"),
            "precision": manifest.get("precision"), "build_spec": spec, "engine_from": str(engine) if engine else None,
        }, indent=2, default=str) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    steps = []
    plan = final / str(opts.version) / PLAN_FILE
    if engine is None:
        request = json.dumps({"bundle": str(bundle.resolve()), "options": {"copy_to": str(plan.resolve())}})
        steps.append("build the engine on the Triton host (same GPU model and the TensorRT version of the "
                     f"tritonserver container): echo '{request}' | python3 -m edgeopt_agent compile")
    steps.append(f"serve: tritonserver --model-repository {out.resolve()}")
    return TritonExport(final, cfg, text, engine is not None, steps)
