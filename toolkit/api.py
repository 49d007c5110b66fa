"""The Python API: one function per command, with the command's options as keyword arguments named as
the flags (``--shape`` -> ``shape=``, ``--build-timeout`` -> ``build_timeout=``; the old names in ``RENAMED``
still work with a DeprecationWarning).

Each returns the typed result the command's ``--json`` output serialises and raises the
``edgeopt.errors.EdgeoptError`` classes (``.exit_code`` says what the CLI would exit with); none
calls ``sys.exit``. A run that went through but failed raises too, as the CLI exits: ``build`` ->
``BuildFailed`` (3), ``bench``/``push`` -> ``DeviceError`` (4), ``tune`` -> ``GoalNotMet`` (5) or
``DeviceError``, ``gate`` -> ``GateFailed`` (5) / ``Inconclusive`` (6) / ``DeviceError`` (4), ``rollout`` ->
``RolloutHalted`` (5) / ``DeviceError`` (4) / ``Inconclusive`` (6, paused), each with the typed result as
``err.result``; ``raise_on_failure=False`` returns it instead. An unknown keyword is a ``UsageError`` naming the closest one. The CLI
(``edgeopt.commands``) is a thin layer over these (it passes ``raise_on_failure=False`` and prints).

    import edgeopt

    report = edgeopt.build("model.onnx", "cpu,intel-cpu", precision="fp32,int8", calib="images/")
    fleet = edgeopt.bench(dist="dist", devices="rig.yaml", duration=2)
    for rec in fleet.records:  # typed: edgeopt.results.BenchRecord
        print(rec.device.name, rec.bundle.target, rec.bundle.precision, rec.status,
              f"p50 {rec.latency.p50_ms:.2f} ms" if rec.ok else rec.error.message)

``bench`` returns ``edgeopt.results.BenchResult``; its records (and ``query``'s) are
``edgeopt.results.BenchRecord``: ``device: DeviceInfo`` (name, host, arch, emulated, device_truth ...),
``bundle: BundleInfo`` (id, target, precision, batch ...), ``latency: Latency | None`` (p50_ms ... p999_ms,
throughput_ips, cold_start_ms ...), ``accuracy: AccuracyInfo | None`` (passed, metric, k, n, interval ...),
``energy: Energy | None`` (joules_per_inference, mean_power_w, source, or why_not), ``error: ErrorInfo | None``
and ``raw`` (the whole record, the agent's reply in ``raw["bench"]``), made by ``results.record_from_dict``;
``to_dict()`` is the JSON the CLI prints. Reading one as a dict (``rec.device["name"]``) still works and
warns (DeprecationWarning).

Heavy modules load on use.
"""

from __future__ import annotations

import difflib
import functools
import inspect as _pyinspect
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from edgeopt.errors import BuildFailed, DeviceError, EdgeoptError, GoalNotMet, UsageError, user_text

if TYPE_CHECKING:
    from edgeopt.api_types import (
        Baseline,
        BaselineSummary,
        CacheCleanResult,
        ClusterStatus,
        DeviceEntry,
        DeviceGc,
        DeviceProbe,
        GateResult,
        InspectResult,
        MaxQpsRow,
        MlflowExportResult,
        OcrCheckResult,
        ResultsInfo,
        ResultsSyncResult,
        RigRelease,
        RigStatus,
        RolloutPlan,
        RolloutRecord,
        RolloutStatus,
        RolloutSummary,
        TargetInfo,
        TritonExportResult,
        WorkerProcess,
    )
    from edgeopt.cache import CacheEntry
    from edgeopt.debug import DebugResult
    from edgeopt.deploy import PushResult
    from edgeopt.fleet.rollout import Options
    from edgeopt.fleetbench import FleetResult
    from edgeopt.hil.history import ChangePoint, Series
    from edgeopt.inventory import Device
    from edgeopt.pipeline import BuildReport
    from edgeopt.results import BenchRecord, BenchResult
    from edgeopt.tuning import TuneResult

Progress = Callable[[str], None]
JSON_SCHEMA = "edgeopt/v1"
F = TypeVar("F", bound=Callable[..., Any])


def _quiet_third_party() -> None:
    """paramiko logs a failed handshake as an ERROR with its traceback, one record per line (21 lines on
    stderr through Python's last-resort handler); the API raises DeviceError with one line instead. Its
    logger is silenced unless the caller set a level on it (``logging.getLogger("paramiko").setLevel``)
    or asked for debug logging on the root logger."""
    lg = logging.getLogger("paramiko")
    if not any(isinstance(h, logging.NullHandler) for h in lg.handlers):
        lg.addHandler(logging.NullHandler())  # no last-resort printing when nothing is configured
    if lg.level == logging.NOTSET and logging.getLogger().level > logging.DEBUG:
        lg.setLevel(logging.CRITICAL + 1)


def _keywords_of(target: str) -> Callable[[], set[str]]:
    """The keyword names of ``module:function`` (loaded on first use): what a ``**kw`` pass-through takes."""
    def names() -> set[str]:
        import importlib

        mod, _, fn = target.partition(":")
        sig = _pyinspect.signature(getattr(importlib.import_module(mod), fn))
        return {n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return names


#: The one table of renamed keywords: per API function, an old keyword -> the name of the CLI flag it stands
#: for (``--shape`` -> ``shape=``, ``--build-timeout`` -> ``build_timeout=``, ``--run`` -> ``run=``). The old
#: name keeps working for one release with a DeprecationWarning naming the new one (``_api`` reads this).
RENAMED: dict[str, dict[str, str]] = {
    "build": {"shapes": "shape", "batches": "batch", "timeout": "build_timeout", "options": "option"},
    "inspect": {"shapes": "shape"},
    "tune": {"shapes": "shape", "batches": "batch", "labels": "label", "confirm_rounds": "confirm",
             "slo": "latency_bound"},
    "bench": {"labels": "label", "max_queue_delay_ms": "max_queue_delay", "engine": "load_generator"},
    "bench_options": {"max_queue_delay_ms": "max_queue_delay", "engine": "load_generator"},
    "find_max_qps": {"engine": "load_generator"},
    **{f: {"labels": "label"} for f in ("push", "probe", "gc", "select_devices", "gate", "rollout")},
    "query": {"run_id": "run", "all_runs": "all"},
    "report": {"run_id": "run", "all_runs": "all", "out": "output"},
    "rig_status": {"labels": "label"},
    "baseline_save": {"target": "targets"},
    "baseline_export": {"out": "output"},
    "baseline_import": {"path": "file"},
    "history": {"target": "targets"},
    "rollout": {"gate_budget": "device_budget", "budget": "device_budget", "engine": "fleet_engine"},
    "export": {"out": "repository"},
}


def _api(extra: Callable[[], Iterable[str]] | None = None) -> Callable[[F], F]:
    """A public API function: an unknown keyword (or a missing/extra argument) is a ``UsageError`` naming
    the function and the closest keyword it takes (difflib), not a TypeError from an internal helper.
    ``extra``: the keywords a ``**kw`` parameter passes on (checked too); without it ``**kw`` takes any.
    A keyword of ``RENAMED`` is taken under its old name with a DeprecationWarning; ``progress=None`` is
    the default (no progress)."""
    def deco(fn: F) -> F:
        sig = _pyinspect.signature(fn)
        own = [n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        open_kw = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()) and extra is None
        renamed = RENAMED.get(fn.__name__, {})

        @functools.wraps(fn)
        def wrapper(*args: Any, **kw: Any) -> Any:
            for old in [k for k in kw if k in renamed]:
                new = renamed[old]
                if new in kw:
                    raise UsageError(f"edgeopt.{fn.__name__}() got both {new!r} and its old name {old!r}",
                                     hint=f"give {new}= only")
                import warnings

                warnings.warn(f"edgeopt.{fn.__name__}({old}=) is now {new}= (the flag's own name); "
                              f"{old}= goes in a later release", DeprecationWarning, stacklevel=2)
                kw[new] = kw.pop(old)
            if "progress" in own and kw.get("progress", _quiet) is None:
                kw["progress"] = _quiet
            if not open_kw:
                known = (set(own) | (set(extra()) if extra is not None else set())) - set(renamed)
                for k in kw:
                    if k not in known:
                        close = difflib.get_close_matches(k, sorted(known), n=1, cutoff=0.5)
                        raise UsageError(f"edgeopt.{fn.__name__}() has no keyword {k!r}"
                                         + (f"; did you mean {close[0]!r}?" if close else ""),
                                         hint=f"help(edgeopt.{fn.__name__}) lists what it takes")
            try:
                sig.bind(*args, **kw)
            except TypeError as exc:
                raise UsageError(f"edgeopt.{fn.__name__}(): {exc}",
                                 hint=f"help(edgeopt.{fn.__name__}) lists what it takes") from None
            _quiet_third_party()
            return fn(*args, **kw)

        def keywords() -> set[str] | None:
            """The keywords this function takes: its own and those its ``**kw`` passes on (None: any)."""
            return None if open_kw else (set(own) | (set(extra()) if extra is not None else set())) - set(renamed)

        wrapper.keywords = keywords  # type: ignore[attr-defined]  # read by tests/cli/test_api_walk.py
        return wrapper  # type: ignore[return-value]
    return deco


class _Quiet:
    """The default ``progress``: says nothing (shown as ``None`` in ``help()``; ``progress=None`` is the same)."""

    def __call__(self, s: str) -> None:
        return None

    def __repr__(self) -> str:
        return "None"


_quiet = _Quiet()


def _split(value: str | Iterable[str] | None) -> list[str] | None:
    """``"a,b"`` or ``["a", "b,c"]`` -> ``["a", "b", "c"]``; None/empty -> None."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else list(value)
    out = [p.strip() for item in items for p in str(item).split(",") if p.strip()]
    return out or None


def envelope(kind: str, body: Any) -> dict[str, Any]:
    """The one shape of every ``--json`` output: ``{"schema": "edgeopt/v1", "kind": ..., ...}``."""
    if isinstance(body, dict):
        return {"schema": JSON_SCHEMA, "kind": kind, **body}
    return {"schema": JSON_SCHEMA, "kind": kind, "items": body}


# --- model -----------------------------------------------------------------------------------------


def kind_option(model: str | os.PathLike, output_kind: Any = None, decision: Any = None,
                current: Any = None) -> dict[str, Any] | None:
    """``--output-kind``/``--decision`` (``output_kind=``/``decision=``) over ``--option output_kind=...``
    (``current``) -> the ``output_kind`` option of a build (None when neither flag was given); a name that is
    not an output of ``model``: UsageError naming the outputs, before anything is prepared."""
    if output_kind is None and decision is None:
        return None
    from edgeopt.targets.base import check_kind_names, parse_kind_flags, parse_output_kind_option

    flags = parse_kind_flags(output_kind, decision)
    if Path(model).is_file():
        check_kind_names(flags, model)
    return {**parse_output_kind_option(current), **flags} if flags else None


@_api()
def inspect(model: str | os.PathLike, config: str | None = None,
            shape: dict[str, list[int]] | list[str] | str | None = None, kinds: bool = True,
            calib: str | os.PathLike | None = None, preprocess: str | None = None, split: str | None = None,
            output_kind: str | list[str] | dict[str, Any] | None = None,
            decision: str | list[str] | dict[str, Any] | None = None) -> InspectResult:
    """What is in the model and which targets can take it (``edgeopt inspect``); ``shape`` as ``--shape`` ->
    ``edgeopt.api_types.InspectResult`` (inputs, outputs, op histogram, parameters, ``flops``, ``support`` per
    target; ``to_dict()`` is ``edgeopt inspect --json``, and ``info["support"]`` still reads it as that dict).

    ``kinds``: also run the model as a build would (``calib``/``preprocess``/``split`` as ``--calib``,
    ``--preprocess``, ``--split``; random data without ``calib``) and give ``output_kinds``, what each output
    means and so how every check judges it (``output_kind``/``decision`` override, as in ``build``);
    ``output_kinds_note``: the data they were inferred on, or why there are none (a dynamic axis with no
    ``shape``).

        info = edgeopt.inspect("model.onnx", shape="x:1x3x224x224", calib="images/")
        print(info.supported_targets, info.flops, info.output_kinds, [(t.name, t.shape) for t in info.inputs])"""
    from edgeopt.api_types import inspect_result
    from edgeopt.model import inspect as _inspect

    info = _inspect(model)
    static = None
    given = parse_shapes(shape) if shape else None
    if given:
        from edgeopt.model import static_input_shapes

        static = static_input_shapes(info, given)
    out = {**info.as_dict(), "support": support_matrix(info, config)}
    if static is not None:
        from edgeopt.model import flops_for

        out["shapes"] = static
        out["flops"] = flops_for(model, static)
    if kinds:
        out.update(inspect_kinds(model, given, calib, preprocess, split, output_kind, decision))
    return inspect_result(out)


def inspect_kinds(model: str | os.PathLike, shapes: dict[str, Any] | None = None, calib: Any = None,
                  preprocess: str | None = None, split: str | None = None, output_kind: Any = None,
                  decision: Any = None) -> dict[str, Any]:
    """``{"output_kinds": {output: kind} | None, "output_kinds_note": the data, or why none}``: the kinds a
    build of ``model`` with these flags would judge by (``pipeline.infer_output_kinds``), for ``inspect``."""
    from edgeopt.pipeline import infer_output_kinds

    options: dict[str, Any] = {}
    if split is not None:
        from edgeopt.calib import parse_split

        parse_split(split)
        options["split"] = split
    flags = kind_option(model, output_kind, decision)
    if flags:
        options["output_kind"] = flags
    got = infer_output_kinds(model, shapes, str(calib) if calib is not None else None, preprocess, options)
    return {"output_kinds": got["kinds"], "output_kinds_note": got.get("why") or got.get("data") or ""}


def support_matrix(info: Any, config: str | None = None) -> list[dict[str, Any]]:
    """Per target: can it take the model (``supported``), the nodes it cannot (``unsupported``), why
    (``why``), ``probably``: nodes only a conversion can tell about (``{"op", "node", "why"}``: what the
    converter failed on in the conformance run; ``supported`` stays true), and ``format``: the opset/IR refusal when a runtime on the way cannot read the model's
    ONNX opset or IR version (``{"message", "hint"}``; None when every runtime reads it)."""
    from edgeopt.model import format_refusal
    from edgeopt.targets.registry import all_targets, get_backend

    rows = []
    for spec in all_targets(config).values():
        backend = get_backend(spec.backend)
        bad = backend.unsupported_nodes(info, spec.as_dict())
        fmt = format_refusal(info.opset, info.ir_version, spec.backend, spec.as_dict(), model=info.path)
        rows.append({"target": spec.name, "backend": spec.backend, "supported": not bad and fmt is None,
                     "unsupported": [{"op": op, "node": n} for op, n in bad],
                     "why": backend.unsupported_why(spec.as_dict(), bad) if bad else None,
                     "probably": [] if bad else backend.probable_refusals(info, spec.as_dict()),
                     "format": {"message": fmt[0], "hint": fmt[1]} if fmt else None,
                     "builds_here": backend.available() is None, "host_check": backend.check_kind})
    return rows


def check_model_format(model: str | os.PathLike) -> None:
    """Refuse (exit 2, before anything is built) a model the installed ONNX Runtime cannot read: it computes
    the FP32 reference of every target, so no target could be built."""
    import onnx

    from edgeopt.errors import ModelError
    from edgeopt.model import format_refusal

    try:
        m = onnx.load(str(model), load_external_data=False)
    except Exception:  # not ONNX, truncated ...: the pipeline's own message says it
        return
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 0)
    fmt = format_refusal(opset, m.ir_version, "onnxruntime", model=model)  # convertible down: build converts it
    if fmt is not None:
        raise ModelError(f"{Path(model).name}: {fmt[0]}", hint=fmt[1])


def parse_shapes(shapes: dict[str, list[int]] | str | list[str] | None) -> dict[str, list[int]]:
    from edgeopt.model import parse_shapes as _parse

    if isinstance(shapes, dict):  # values: [1, 3, 224, 224], or with a range/buckets ([1, "1..128"], [1, (16, 32)])
        from edgeopt.shapes import from_value

        return {k: from_value(k, v) for k, v in shapes.items()}
    if isinstance(shapes, str):
        shapes = [shapes]
    return _parse(list(shapes or []))


@_api()
def list_targets(config: str | None = None) -> list[TargetInfo]:
    """Every target, built-in and from the config file (``edgeopt targets``; ``edgeopt.targets`` is the
    package of backends, so the function has this name) -> ``[TargetInfo]`` (name, backend, precisions,
    aliases, builds_here / why_not; ``to_dict()`` as ``edgeopt targets --json``).

        names = [t.name for t in edgeopt.list_targets() if t.builds_here]"""
    from edgeopt.api_types import target_info
    from edgeopt.targets.registry import ALIASES, all_targets, get_backend

    rows = []
    for s in all_targets(config).values():
        why = get_backend(s.backend).available()
        rows.append(target_info({**s.as_dict(), "aliases": [a for a, t in ALIASES.items() if t == s.name],
                                 "builds_here": why is None, "why_not": why}))
    return rows


def parse_options(items: dict[str, Any] | Iterable[str] | None) -> dict[str, Any]:
    """``["k=v", ...]`` -> ``{"k": v}`` (ints, floats and booleans cast); a dict is taken as is."""
    if isinstance(items, dict):
        return dict(items)
    out: dict[str, Any] = {}
    for item in items or []:
        k, sep, v = str(item).partition("=")
        if not sep or not k.strip():
            raise UsageError(f"bad --option {item!r}", hint="use KEY=VALUE")
        out[k.strip()] = _value(v.strip())
    return out


def _value(v: str) -> Any:
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(v.lower(), v)


@_api()
def build(model: str | os.PathLike, targets: str | list[str], precision: str | list[str] = "auto",
          shape: dict[str, list[int]] | list[str] | str | None = None, calib: str | None = None,
          preprocess: str | None = None, dist: str | os.PathLike = "dist", jobs: int = 2,
          build_timeout: float = 1800, force: bool = False, allow_mismatch: bool = False,
          option: dict[str, Any] | list[str] | None = None, config: str | None = None,
          calib_count: int = 32, val_count: int | None = None, batch: int | str | list[int] | None = None,
          progress: Progress = _quiet, raise_on_failure: bool = True,
          accept: str | os.PathLike | dict[str, Any] | None = None, split: str | None = None,
          scheduler: str | None = None, output_kind: str | list[str] | dict[str, Any] | None = None,
          decision: str | list[str] | dict[str, Any] | None = None, buckets: str | None = None) -> BuildReport:
    """Compile and check ``model`` for every target (``edgeopt build``) -> ``pipeline.BuildReport``.

        report = edgeopt.build("model.onnx", "cpu,intel-cpu", precision="fp32,int8", shape="x:1x3x224x224",
                               calib="images/", dist="dist", build_timeout=900, option=["int8_tolerance=0.02"])
        for r in report.results:
            print(r.target, r.precision, r.status, r.bundle)

    The keywords are the flags' names (``shape`` ``--shape``, ``batch`` ``--batch``, ``build_timeout``
    ``--build-timeout``, ``option`` ``--option``); the old ``shapes``/``batches``/``timeout``/``options``
    still work with a DeprecationWarning. ``progress``: called with each progress line (None: silent).

    ``accept``: the accuracy policy's gate file (``--accept``; the keys of ``GATE.yaml``), None for the
    gate's defaults: every host check, INT8 search and ``auto`` fallback judges by it.

    A target that failed to build or whose check refused the artifact (the CLI's exit 3) raises
    ``BuildFailed`` with the report as ``err.result`` (the targets that built are installed); with
    ``raise_on_failure=False`` the report is returned and ``report.ok`` says it.

    ``batch``: ``"1,4,8"`` or ``[1, 4, 8]``, one build per batch size, the batch in the artifact's shape (batch 1 under ``dist``,
    batch B under ``dist/batchB``), reported together; every size judged by the first size's output kinds,
    on the same distinct samples (B to a feed, counted once each), at one precision per target.
    ``val_count``: validation samples; ``None`` = 8, or up to 32 when the data has samples to spare, and at
    least 20 when it has 40 or more (calibration yields: below 20 the policy refuses on one flip).
    ``split``: how ``calib`` is split into calibration and validation (``--split``): ``"shuffle"`` (default,
    seeded; ``"shuffle:7"``), ``"stride"`` or ``"head-tail"``; the indices are recorded in the manifest.
    ``precision``: ``"fp32,int8"`` (each target builds what it offers of the list) or per target
    ``"cpu=fp32,int8,intel-cpu=int8"``. ``shape``: ``{"x": [1, 3, 224, 224]}`` or ``"x:1x3x224x224"``.
    ``scheduler``: ``"tcp://HOST:PORT"``/``"tls://…"`` (``--scheduler``; None: ``$EDGEOPT_SCHEDULER``, else here):
    each job a Dask task on a worker that can build it (``edgeopt.cluster``), ``"auto"`` falls back to here.
    ``output_kind``: what outputs mean (``--output-kind``): ``"landmarks=regression:px=2"``, a list of those, or
    ``{"landmarks": "regression:px=2"}``; ``decision``: the application's thresholds (``--decision``):
    ``"score=0.2,0.8"`` or ``{"score": [0.2, 0.8]}`` (docs/TOLERANCES.md). Both are recorded in the manifest's
    ``output_kinds``, which the device check, gate and rollout judge by.
    """
    from edgeopt.pipeline import build as _build

    check_bundle_folder(dist)
    for name, v, low in (("jobs", jobs, 1), ("calib_count", calib_count, 1), ("val_count", val_count, 1)):
        if v is not None and int(v) < low:
            raise UsageError(f"{name} must be at least {low}, got {v}")
    if not build_timeout > 0:
        raise UsageError(f"build_timeout must be above 0 s, got {build_timeout}")
    shapes, timeout = shape, build_timeout
    if buckets:  # --buckets auto[@CAP]: every range in --shape gets its buckets from the --calib lengths
        from edgeopt.shapes import with_auto_buckets

        if isinstance(shapes, dict):
            shapes = {k: [f"{d}|{buckets}" if isinstance(d, str) and ".." in d and "|" not in d else d for d in v]
                      for k, v in shapes.items()}
        else:
            shapes = with_auto_buckets([shapes] if isinstance(shapes, str) else list(shapes or []), buckets)
    batches = None if batch is None else parse_batches(batch)
    if Path(model).is_file():  # (a missing file: the pipeline's own message)
        check_model_format(model)
    options = parse_options(option)
    if split is not None:
        from edgeopt.calib import parse_split

        parse_split(split)  # a bad value: one line, before anything is prepared
        options["split"] = split
    given = kind_option(model, output_kind, decision, options.get("output_kind"))
    if given:
        options["output_kind"] = given
    from edgeopt import cluster

    if cluster.ACTIVE is None and cluster.resolve(scheduler) is not None:  # each job a Dask task on a worker
        params = _pyinspect.signature(build).parameters
        return cluster.build_on(scheduler, build, {k: v for k, v in locals().items() if k in params})
    kw = dict(precisions=precision, calib=calib, preprocess=preprocess, jobs=jobs, force=force,
              allow_mismatch=allow_mismatch, config=config, options=options, timeout=timeout,
              n_calib=calib_count, n_val=val_count, progress=progress, accept=accept)
    if not batches or list(batches) == [1]:
        return _build_checked(_build(model, targets, shapes=parse_shapes(shapes), out=dist, **kw), raise_on_failure)
    if any(int(b) < 1 for b in batches):
        raise UsageError(f"--batch values must be at least 1, got {','.join(map(str, batches))}")
    from dataclasses import replace

    from edgeopt.model import inspect, static_input_shapes

    base = static_input_shapes(inspect(model), parse_shapes(shapes) or {})
    sizes = sorted({int(x) for x in batches})
    reports: dict[int, BuildReport] = {}
    kinds: dict[str, dict[str, Any]] | None = None
    for b in sizes:
        progress(f"batch {b}")
        reports[b] = _build(model, targets, shapes=batch_shapes(base, b), out=batch_dist(dist, b), batch=b,
                            kinds=kinds, **kw)
        # the output kinds are inferred once, on the first batch size's samples one at a time (batch 1's), and
        # every larger batch is judged by them: a [B, 2] softmax stays a classifier, never B "positions"
        kinds = kinds or _curve_kinds(reports[b], b)
    extra = _one_precision(model, targets, base, dist, sizes, reports, kinds, kw, progress)
    first = reports[sizes[0]]
    every = [reports[b] for b in sizes]
    return _build_checked(
        replace(first, out=str(dist), results=[r for rep in every for r in rep.results],
                warnings=list(dict.fromkeys([w for rep in every for w in rep.warnings] + extra)),
                time_s=sum(rep.time_s for rep in every), skipped=[s for rep in every for s in rep.skipped]),
        raise_on_failure)


#: file suffixes a bundle folder (``--dist``/``--out`` of build, run, debug, tune, gate) is refused with: such a
#: name is a report or data file meant for another flag (``run --out report.html`` made a folder of that name)
FILE_SUFFIXES = (".html", ".htm", ".md", ".json", ".jsonl", ".xml", ".csv", ".txt", ".yaml", ".yml", ".png",
                 ".svg", ".pdf", ".onnx", ".npz", ".npy", ".db")


def check_bundle_folder(path: str | os.PathLike, flag: str = "--dist") -> None:
    """A bundle folder's path checked before any work (``UsageError``, exit 2): not an existing file, and,
    unless it already is a folder, no file suffix (``.html``, ``.md``, ``.json`` ...: ``FILE_SUFFIXES``)."""
    p = Path(path)
    if not p.is_dir():
        if p.exists():
            raise UsageError(f"{flag} {str(path)!r} is a file, not a bundle folder",
                             hint=f"{flag} names the folder bundles go in (DIST/<model>/<target>-<precision>/)")
        if p.suffix.lower() in FILE_SUFFIXES:
            report = " (a report file is --report FILE)" if p.suffix.lower() in (".html", ".htm", ".md", ".csv",
                                                                                  ".json") else ""
            raise UsageError(f"{flag} {str(path)!r} names a {p.suffix} file, not a bundle folder{report}",
                             hint=f"{flag} names the folder bundles go in, e.g. {flag} dist")
    # written into after the build: a folder that cannot be made or written is refused now, not after the build
    from edgeopt.commands.report import check_writable_dir

    check_writable_dir(str(p), flag)


def bundles_under(dist: str | os.PathLike, flag: str = "--dist") -> list:
    """The bundles under ``dist`` (``deploy.find_bundles``); a folder that holds none is a UsageError naming
    ``flag`` and the folder (bench, push, find-max-qps: nothing to measure is bad input, exit 2)."""
    from edgeopt.deploy import find_bundles

    if not Path(dist).is_dir():
        raise UsageError(f"{flag} {str(dist)!r} is not a folder",
                         hint=f"build first: edgeopt build MODEL {flag} {dist}")
    found = find_bundles(dist)
    if not found:
        raise UsageError(f"no bundle under {flag} {str(dist)!r} (no manifest.json below it)",
                         hint=f"build first: edgeopt build MODEL {flag} {dist}")
    return found


def batch_dist(dist: str | os.PathLike, batch: int) -> Path:
    """Where ``build --batch`` installs batch ``batch``'s bundles: ``dist`` for 1, ``dist/batchB`` above."""
    return Path(dist) if batch == 1 else Path(dist) / f"batch{batch}"


def _curve_kinds(report: BuildReport, batch: int) -> dict[str, dict[str, Any]] | None:
    """The output kinds a batch curve carries from its first batch size's build (any bundle's: one model, one
    data set), marked where they came from; None when no bundle of it recorded kinds."""
    for r in report.results:
        got = (r.manifest or {}).get("output_kinds")
        if isinstance(got, dict) and got:
            src = "batch 1" if batch == 1 else f"batch {batch}, sample by sample"
            return {n: {**k, "source": k.get("source") if k.get("source") == "option" else src}
                    for n, k in got.items() if isinstance(k, dict)}
    return None


def _one_precision(model, targets, base, dist, sizes: list[int], reports: dict[int, BuildReport],
                   kinds, kw: dict[str, Any], progress: Progress) -> list[str]:
    """One precision per target across a batch curve: where ``auto`` fell back at one batch size (intel-cpu
    int8 accepted at batch 1, refused at 4), that target is built at the precision it fell back to at every
    batch size (the narrower bundle the curve had is removed from ``dist``: it is no longer ``auto``'s pick),
    so the curve compares batch sizes, not precisions. A size where even that precision is refused walks on
    (int8 -> fp16 -> fp32) and the whole curve with it. Returns the warnings that say what changed; a target
    whose precision still differs between sizes is named there."""
    import shutil

    from edgeopt.pipeline import fallback_precision, plan_precisions
    from edgeopt.targets.registry import resolve_targets

    specs = {s.name: s for s in resolve_targets(targets, kw.get("config"))}
    auto: set[tuple[str, str]] = set()
    plan_precisions(list(specs.values()), kw.get("precisions"), kw.get("config"), auto=auto)
    auto_targets = {t for t, _ in auto}
    order = ("fp8", "int8", "fp16", "fp32")

    def chosen(b: int) -> dict[str, Any]:  # target -> auto's result at batch b
        return {r.target: r for r in reports[b].results
                if r.target in auto_targets and (r.fallback_from or (r.target, r.precision) in auto)}

    notes: list[str] = []
    for _ in range(len(order)):
        redo: dict[str, str] = {}
        for t in auto_targets:
            got = {b: chosen(b).get(t) for b in sizes}
            # a size refused on accuracy at what it was built at counts as its next wider precision
            precs = {(fallback_precision(specs[t], r.precision) if r.refused and not r.ok else None) or r.precision
                     for r in got.values() if r is not None}
            if len(precs) > 1:
                redo[t] = max(precs, key=lambda p: order.index(p) if p in order else -1)
        if not redo:
            return notes
        origin = {t: next((f"batch {c}" for c in sizes if chosen(c).get(t) and chosen(c)[t].precision == w
                           and not (chosen(c)[t].fallback_from or {}).get("curve")),
                          "the curve's other sizes") for t, w in redo.items()}
        for b in sizes:
            mine = chosen(b)
            todo = {t: w for t, w in redo.items() if mine.get(t) is not None and mine[t].precision != w}
            if not todo:
                continue
            why = {t: origin[t] for t in todo}
            progress(f"batch {b}: one precision per target across the curve: "
                     + ", ".join(f"{t} {w} (as at {why[t]}; {mine[t].precision} here)" for t, w in todo.items()))
            again = _build_one(model, list(todo), ",".join(f"{t}={w}" for t, w in todo.items()), base, dist, b,
                               kinds, kw)
            new = {r.target: r for r in again.results}
            results = []
            for r in reports[b].results:
                n = new.get(r.target) if r is mine.get(r.target) else None
                if n is None:
                    results.append(r)
                    continue
                n.fallback_from = {"precision": r.precision, "curve": True,
                                   "error": f"{r.precision} {'accepted' if r.ok else 'refused'} at batch {b}, but "
                                            f"{why[r.target]} needed {n.precision}: one precision per target "
                                            "across the batch curve"}
                if r.ok and r.bundle and Path(r.bundle).resolve() != Path(n.bundle or "").resolve():
                    shutil.rmtree(r.bundle, ignore_errors=True)  # the curve's narrower bundle: not auto's pick
                notes.append(f"{r.target} batch {b}: {n.precision}, not {r.precision}, as at {why[r.target]} "
                             "(one precision per target across the batch curve)"
                             + ("" if n.ok else f"; {n.precision} failed here too"))
                results.append(n)
            reports[b].results = results
            reports[b].time_s += again.time_s
            reports[b].warnings.extend(w for w in again.warnings if w not in reports[b].warnings)
    for t in auto_targets:  # still more than one: say so (each row of the curve carries its own precision)
        precs = {b: chosen(b)[t].precision for b in sizes if chosen(b).get(t) is not None}
        if len(set(precs.values())) > 1:
            notes.append(f"{t}: the batch curve mixes precisions ("
                         + ", ".join(f"batch {b} {p}" for b, p in precs.items()) + ")")
    return notes


def _build_one(model, targets: list[str], precision: str, base, dist, batch: int, kinds, kw: dict[str, Any]
               ) -> BuildReport:
    from edgeopt.pipeline import build as _build

    return _build(model, targets, **{**kw, "precisions": precision}, shapes=batch_shapes(base, batch),
                  out=batch_dist(dist, batch), batch=batch, kinds=kinds)


def _build_checked(report: BuildReport, raise_on_failure: bool) -> BuildReport:
    """``BuildFailed`` (exit 3, the report as ``.result``) when a target failed, as the CLI exits."""
    if raise_on_failure and not report.ok:
        bad = [r for r in report.results if not r.ok]
        first = user_text(((bad[0].error or bad[0].check or "").strip().splitlines() or [""])[0])[:300]
        raise BuildFailed(f"{len(bad)} of {len(report.results)} build(s) failed: "
                          + ", ".join(f"{r.target} {r.precision} ({r.status})" for r in bad)
                          + (f"; {bad[0].target} {bad[0].precision}: {first}" if first else ""),
                          hint="the BuildReport is err.result (the targets that built are installed); "
                               "raise_on_failure=False returns it instead", result=report)
    return report


def batch_shapes(shapes: dict[str, list[int]], batch: int) -> dict[str, list[int]]:
    """Every input's leading (batch) dimension set to ``batch`` (scalars kept)."""
    return {k: [batch, *v[1:]] if v else v for k, v in shapes.items()}


# --- devices ---------------------------------------------------------------------------------------


@_api()
def select_devices(devices: str | os.PathLike | None = "local", limit: str | list[str] | None = None,
                   label: str | list[str] | None = None) -> list[Device]:
    """The inventory's devices picked by name (``limit``) and/or label; an empty pick is an error.

        devs = edgeopt.select_devices("lab.yaml", label="jetson")"""
    from edgeopt.inventory import load_inventory

    inv = load_inventory(devices or "local")
    chosen = inv.select(_split(limit), _split(label))
    if not chosen:
        raise UsageError(f"no device of {str(devices)!r} matches "
                         + " and ".join(x for x in (f"--limit {','.join(_split(limit) or [])}" if limit else "",
                                                     f"--label {','.join(_split(label) or [])}" if label else "")
                                        if x),
                         hint="`edgeopt devices --devices FILE` lists the devices and their labels")
    check_device_targets(chosen)
    if any(not d.is_local for d in chosen):
        from edgeopt.transport import require_paramiko

        require_paramiko()  # a core install without the devices extra: one line now, not after the build
    return chosen


def check_device_targets(devices: list) -> None:
    """A device's `target` must be a known target (a typo suggests the closest)."""
    from edgeopt.targets.registry import resolve_target

    for d in devices:
        if d.target:
            try:
                resolve_target(d.target)
            except UsageError as exc:
                raise UsageError(f"device {d.name!r}: {exc.message}", hint=exc.hint) from None


def check_bench_targets(names: str | list[str] | None) -> list[str] | None:
    """``--targets`` filter of bench/push: each a known target or alias (did-you-mean otherwise)."""
    from edgeopt.targets.registry import resolve_target

    picked = _split(names)
    if picked:
        for n in picked:
            resolve_target(n)
    return picked


@_api()
def bench_options(duration: float = 3.0, min_iters: int = 50, warmup: int | str = 10, threads: int | None = None,
                  batch: int | str | list[int] = 1, bench_timeout: float = 300, limit_memory: float | None = None,
                  limit_cpu: float | None = None, no_samples: bool = False, scenario: str | None = None,
                  target_qps: float | None = None, latency_bound: str | None = None,
                  samples_per_query: int | None = None, load_generator: str | None = None, profile: int = 0,
                  workers: int | None = None, concurrency: int | None = None,
                  max_queue_delay: float | None = None, lengths: str | list[int] | None = None) -> dict[str, Any]:
    """The options the agent's bench takes, checked (UsageError before any device is touched), e.g.
    ``edgeopt.bench_options(scenario="server", target_qps=200, latency_bound="p99=20ms")``.
    ``workers``: threads serving the scenario's queries at once; ``concurrency``: clients of the closed-loop
    ``concurrency`` scenario; ``max_queue_delay`` (ms, ``--max-queue-delay``): dynamic batching in the server scenario (up to
    ``batch`` queries per run, waiting this long for them); ``load_generator``: ``loadgen`` | ``edgeopt`` (who sends
    the scenario's queries; ``engine=`` is its old name)."""
    from types import SimpleNamespace

    from edgeopt.commands.bench import bench_options as _opts

    batch = parse_batches(batch)[0] if not isinstance(batch, int) else batch
    warm_iters, warm_s = _warmup(warmup)
    if threads is not None and threads < 1:
        raise UsageError(f"--threads must be at least 1, got {threads}")
    args = SimpleNamespace(duration=duration, min_iters=min_iters, warmup=warm_iters if warm_iters is not None else 0,
                           threads=threads, batch=batch, bench_timeout=bench_timeout, limit_memory=limit_memory,
                           limit_cpu=limit_cpu, no_samples=no_samples, scenario=scenario, target_qps=target_qps,
                           latency_bound=latency_bound, samples_per_query=samples_per_query, engine=load_generator,
                           profile=profile, workers=workers, concurrency=concurrency,
                           max_queue_delay_ms=max_queue_delay, lengths=lengths)
    opts = _opts(args)
    if warm_s is not None:
        opts["warmup_s"] = warm_s
    return opts


def _warmup(value: int | str) -> tuple[int | None, float | None]:
    if isinstance(value, int):
        if value < 0:
            raise UsageError(f"--warmup must not be negative, got {value}")
        return value, None
    import click

    from edgeopt.commands._common import warmup_value

    try:
        return warmup_value(value)
    except click.BadParameter as exc:
        raise UsageError(f"--warmup: {exc.message}") from None


def check_lengths(bundles: list, lengths: list[int] | None) -> None:
    """Refuse up front (exit 2) ``--lengths`` a bundle cannot take: a bundle with no variable axis, or a size
    outside the bounds it was built for (the agent's own rule, ``edgeopt_agent.varlen.run_size``)."""
    import json

    from edgeopt_agent import varlen

    if not lengths:
        return
    for b in bundles:
        m = json.loads((b.path / "manifest.json").read_text())
        var = [(s["name"], v) for s in m["io"]["inputs"] for v in s.get("variable") or []]
        if not var:
            raise UsageError(f"--lengths: {b.model} {b.target}-{b.precision} has no variable axis (built from a "
                             "static --shape)", hint="build with a range or buckets in --shape, e.g. x:1x1..128")
        for size in lengths:
            for name, v in var:
                try:
                    varlen.run_size(v, size, varlen.form_of(m))
                except varlen.OutOfBounds:
                    raise UsageError(f"--lengths {size}: {b.model} {b.target}-{b.precision} was built for "
                                     f"{name}[{v['axis']}] {varlen.bounds_text(v)}; {size} is outside the built "
                                     "bounds", hint="rebuild with wider bounds in --shape") from None


def check_batch(bundles: list, batch: int) -> None:
    """Refuse up front a batch a bundle cannot take (the agent's own rule, run on the host)."""
    import json

    from edgeopt_agent.bench import BenchError
    from edgeopt_agent.bench import check_batch as _check

    if batch <= 1:
        return
    for b in bundles:
        try:
            _check(json.loads((b.path / "manifest.json").read_text()), batch)
        except BenchError as exc:
            raise UsageError(f"--batch {batch}: {b.model} {b.target}-{b.precision}: {exc}") from None


@_api(extra=_keywords_of("edgeopt.api:bench_options"))
def bench(dist: str | os.PathLike = "dist", devices: str | os.PathLike = "local", limit: str | list[str] | None = None,
          label: str | list[str] | None = None, targets: str | list[str] | None = None,
          bundles: list | None = None, trust_new_host_keys: bool = False, parallel: int = 4,
          verify: bool = False, db: str | None = None, progress: Progress = _quiet, raise_on_failure: bool = True,
          **options: Any) -> BenchResult:
    """Push what is missing and measure every bundle on its devices (``edgeopt bench``), e.g.
    ``edgeopt.bench(dist="dist", devices="lab.yaml", duration=5, threads=2)``
    -> ``results.BenchResult`` (``records``: typed ``results.BenchRecord``). ``options``: see
    :func:`bench_options`.

    A device that was unreachable or a run that failed (the CLI's exit 4) raises ``DeviceError`` with the
    BenchResult as ``err.result`` (the other devices finished, every run is in the database); with
    ``raise_on_failure=False`` it is returned and ``result.ok`` says it. Bad input (``UsageError``) is
    raised before the results database is opened: nothing is written."""
    from edgeopt.results import BenchResult

    res = BenchResult.from_fleet(_bench(dist, devices, limit, label, targets, bundles, trust_new_host_keys, parallel,
                                        verify, db, progress, options))
    if raise_on_failure and not res.ok:
        bad = [r for r in res.records if not r.ok]
        first = bad[0]
        msg = ((first.error.message if first.error else "") or first.status).strip().splitlines()[0][:300]
        raise DeviceError(f"{len(bad)} of {len(res.records)} run(s) failed: "
                          + ", ".join(sorted({f"{r.device.name} ({r.status})" for r in bad}))
                          + f"; {first.device.name}: {msg}",
                          hint="the BenchResult is err.result (the other runs are in it and in the results "
                               "database); raise_on_failure=False returns it instead", result=res)
    if raise_on_failure and res.unsaved:  # measured, but the results database could not take the records
        raise DeviceError(res.unsaved, hint="free space where the results database lives; the BenchResult is "
                                            "err.result", result=res)
    return res


def _bench(dist, devices, limit, labels, targets, bundles, trust_new_host_keys, parallel, verify, db, progress,
           options: dict[str, Any], run_id: str | None = None) -> FleetResult:
    from edgeopt.fleetbench import bench_fleet, plan
    from edgeopt.results import DEFAULT_DB, ResultsDB

    options = dict(options)
    batches = parse_batches(options.get("batch", 1))
    picked = check_bench_targets(targets)
    if len(batches) > 1:
        return _bench_batches(batches, dist, devices, limit, labels, targets, bundles, trust_new_host_keys, parallel,
                              verify, db, progress, options)
    options["batch"] = batches[0]
    opts = bench_options(**options)
    devs = select_devices(devices, limit, labels)
    found = bundles if bundles is not None else bundles_under(dist)
    if not found:
        raise UsageError("no bundle to bench", hint="give bundles, or a --dist folder that holds some")
    check_target_filter(found, picked, dist)
    own = sorted({_static_batch(b) or 1 for b in found})
    if opts["batch"] == 1 and own != [1]:  # bundles built at other batches (build --batch): each at its own
        return _bench_batches(own, dist, devices, limit, labels, targets, found, trust_new_host_keys, parallel,
                              verify, db, progress, options, exact=True)
    check_batch(found, opts["batch"])
    check_lengths(found, opts.get("lengths"))
    work, skipped = plan(devs, found, picked)
    if not work:  # before the database is opened: bad input writes nothing
        raise UsageError("nothing to bench: " + "; ".join(f"{s['device']}: {s['reason']}" for s in skipped),
                         hint="check the devices' `target` against the bundles under --dist (edgeopt devices)")
    with ResultsDB(db or DEFAULT_DB) as rdb:
        return bench_fleet(devs, found, opts, targets=picked, trust_new_host_keys=trust_new_host_keys,
                           jobs=parallel, verify=verify, db=rdb, progress=progress, run_id=run_id)


def check_target_filter(bundles: list, picked: list[str] | None, dist: str | os.PathLike | None = None) -> None:
    """``--targets jetson`` with no jetson bundle among ``bundles`` is bad input (exit 2), said before
    anything is pushed or written, with the targets there are."""
    if not picked:
        return
    from edgeopt.inventory import canonical_target

    want = {canonical_target(t) for t in picked}
    if not any(canonical_target(b.target) in want for b in bundles):
        have = sorted({b.target for b in bundles})
        raise UsageError(f"no bundle of --targets {','.join(picked)}"
                         + (f" under {str(dist)!r}" if dist is not None else "")
                         + (f" (there are: {', '.join(have)})" if have else " (there is no bundle)"),
                         hint=f"build it first: edgeopt build MODEL --targets {','.join(picked)}")


def parse_batches(value: int | str | list[int] | None) -> list[int]:
    """``4``, ``"1,4,8"`` or ``[1, 4, 8]`` -> sorted batch sizes (each >= 1)."""
    if value is None:
        return [1]
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    try:
        vals = sorted({int(str(x).strip()) for x in items if str(x).strip()})
    except ValueError:
        vals = []
    if not vals or vals[0] < 1:
        raise UsageError(f"--batch takes batch sizes >= 1 separated by commas (1,4,8), got {value!r}")
    return vals


def _static_batch(bundle) -> int | None:
    """The batch a bundle was built at (its inputs' static leading dimension), None when dynamic."""
    import json

    from edgeopt_agent.bench import _dynamic

    dims = {s["shape"][0] for s in json.loads((bundle.path / "manifest.json").read_text())["io"]["inputs"]
            if s.get("shape") and not _dynamic(s["shape"][0])}
    return int(max(dims)) if dims else None


def _bench_batches(batches, dist, devices, limit, labels, targets, bundles, trust_new, parallel, verify, db, progress,
                   options, exact: bool = False):
    """``bench --batch 1,4,8``: each batch size on the bundles that take it (their batch is that size, or
    dynamic), one fleet run per size, reported together: the latency/throughput curve per artifact.
    ``exact``: each bundle at its own batch only (a dynamic one at 1)."""
    import json
    import uuid

    from edgeopt_agent.bench import _dynamic

    run_id = uuid.uuid4().hex[:12]  # one run for the whole curve: every batch's records are stored under it

    for b in batches:
        bench_options(**{**options, "batch": b})  # every size's options checked before any work
    found = bundles if bundles is not None else bundles_under(dist)

    def takes(bundle, b: int) -> bool:  # every input's leading dimension is b, or dynamic
        if exact:
            return (_static_batch(bundle) or 1) == b
        inputs = json.loads((bundle.path / "manifest.json").read_text())["io"]["inputs"]
        return all((_dynamic(s["shape"][0]) or int(s["shape"][0]) == b) if s.get("shape") else b == 1 for s in inputs)

    merged: FleetResult | None = None
    for b in batches:
        mine = [x for x in found if takes(x, b)]
        if not mine:
            if merged is not None:
                merged.skipped.append({"device": "-", "reason": f"batch {b}: no bundle takes it (build with --batch)"})
            continue
        progress(f"batch {b}: {len(mine)} bundle(s)")
        res = _bench(dist, devices, limit, labels, targets, mine, trust_new, parallel, verify, db, progress,
                     {**options, "batch": b}, run_id=run_id)
        if merged is None:
            merged = res
        else:
            merged.records += res.records
            merged.pushes += res.pushes
            merged.skipped += res.skipped
            merged.time_s += res.time_s
    if merged is None:
        raise UsageError(f"--batch {','.join(map(str, batches))}: no bundle under {str(dist)!r} takes any of these "
                         "batch sizes", hint="build them: edgeopt build MODEL --batch 1,4,8 ...")
    return merged


@_api()
def push(bundles: list[str] | None = None, dist: str | os.PathLike = "dist", devices: str | os.PathLike = "local",
         limit: str | list[str] | None = None, label: str | list[str] | None = None,
         targets: str | list[str] | None = None, all_targets: bool = False, trust_new_host_keys: bool = False,
         parallel: int = 4, verify: bool = False, activate: bool = False, progress: Progress = _quiet,
         raise_on_failure: bool = True) -> list[PushResult]:
    """Copy the agent and bundles to devices, what they lack only (``edgeopt push``) -> [PushResult], e.g.
    ``edgeopt.push(dist="dist", devices="lab.yaml", limit="orin1", activate=True)``.
    A device that failed (the CLI's exit 4) raises ``DeviceError`` with the list as ``err.result``, unless
    ``raise_on_failure=False``."""
    from edgeopt.deploy import load_bundle
    from edgeopt.deploy import push as _push
    from edgeopt.fleetbench import plan

    found = [load_bundle(b) for b in bundles] if bundles else bundles_under(dist)
    picked = check_bench_targets(targets)
    devs = select_devices(devices, limit, label)
    if not all_targets:
        check_target_filter(found, picked, None if bundles else dist)
    if all_targets:
        work = [(d, found) for d in devs]
    else:
        work, skipped = plan(devs, found, picked)
        for s in skipped:
            progress(f"skipping {s['device']}: {s['reason']}")
    if not work:
        raise UsageError("nothing to push", hint="check the devices' `target` and --dist, or use --all-targets")
    results = []
    for group in {tuple(b.bundle_id for b in bs): bs for _, bs in work}.values():
        devs_g = [d for d, bs in work if bs == group]
        results += _push(devs_g, group, trust_new_host_keys=trust_new_host_keys, verify=verify,
                         activate=activate, jobs=parallel, progress=progress)
    bad = [r for r in results if not r.ok]
    if raise_on_failure and bad:
        raise DeviceError(f"{len(bad)} of {len(results)} device(s) failed: "
                          + "; ".join(f"{r.device}: {(r.error or 'failed').splitlines()[0][:200]}" for r in bad),
                          hint="the PushResults are err.result; raise_on_failure=False returns them instead",
                          result=results)
    return results


@_api()
def probe(devices: str | os.PathLike = "local", limit: str | list[str] | None = None,
          label: str | list[str] | None = None, trust_new_host_keys: bool = False, parallel: int = 4,
          progress: Progress = _quiet) -> dict[str, DeviceProbe]:
    """Connect to each device (host keys checked), install the agent if needed, and return its probe
    (``edgeopt devices --probe``): device name -> ``DeviceProbe`` (``ok``, else ``error``; the agent's report in
    ``raw["probe"]``).

        cpus = {n: p.raw["probe"]["cpu"] for n, p in edgeopt.probe("lab.yaml").items() if p.ok}"""
    from concurrent.futures import ThreadPoolExecutor

    from edgeopt.api_types import device_probe
    from edgeopt.deploy import DeviceSession
    from edgeopt.errors import DeviceError

    devs = select_devices(devices, limit, label)

    def one(dev) -> dict[str, Any]:
        try:
            with DeviceSession.open(dev, trust_new_host_keys, progress=progress) as s:
                return {"ok": True, "probe": s.probe(), "agent_path": s.agent_dir,
                        "connect_s": round(getattr(s, "connect_s", 0.0), 3)}
        except DeviceError as exc:
            progress(f"{dev.name}: FAILED: {exc.message}")
            return {"ok": False, "error": str(exc)}

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(devs)))) as pool:
        return {n: device_probe(p) for n, p in zip([d.name for d in devs], pool.map(one, devs))}


@_api()
def gc(devices: str | os.PathLike = "local", limit: str | list[str] | None = None,
       label: str | list[str] | None = None, trust_new_host_keys: bool = False, keep: int = 3,
       dry_run: bool = False, progress: Progress = _quiet, parallel: int = 4) -> dict[str, DeviceGc]:
    """Remove bundles no slot refers to from each device's store (``edgeopt devices gc``), ``parallel``
    devices at once -> device name -> ``DeviceGc`` (``ok``/``error``, ``removed``, ``kept``, ``freed_mb``).

        would = {n: g.removed for n, g in edgeopt.gc("lab.yaml", keep=1, dry_run=True).items()}"""
    from concurrent.futures import ThreadPoolExecutor

    from edgeopt.api_types import device_gc
    from edgeopt.deploy import DeviceSession
    from edgeopt.errors import DeviceError

    def one(dev) -> tuple[str, dict[str, Any]]:
        try:
            with DeviceSession.open(dev, trust_new_host_keys, progress=progress) as s:
                return dev.name, {"ok": True, **s.gc(keep=keep, dry_run=dry_run)}
        except DeviceError as exc:
            progress(f"{dev.name}: FAILED: {exc.message}")
            return dev.name, {"ok": False, "error": str(exc)}

    devs = select_devices(devices, limit, label)
    with ThreadPoolExecutor(max_workers=max(1, min(int(parallel), len(devs)))) as pool:
        return {n: device_gc(g) for n, g in pool.map(one, devs)}


# --- results ---------------------------------------------------------------------------------------


def resolve_target_filter(value: str | list[str] | None) -> str | None:
    """Report filters take aliases (`jetson` -> jetson-orin); unknown names are refused."""
    from edgeopt.targets.registry import resolve_target

    names = _split(value)
    if not names:
        return None
    return ",".join(resolve_target(n).name for n in names)


@_api()
def query(db: str | None = None, model: str | None = None, targets: str | list[str] | None = None,
          device: str | None = None, precision: str | None = None, since: str | None = None,
          run: str | None = None, all: bool = False, identity: str | None = None, label: str | None = None,
          rig: str | None = None) -> list[BenchRecord]:
    """Run records from the results database (the latest of each unless ``all``, ``--all``; ``run``: one run's
    id, ``--run``; ``identity``/``label``/``rig``: a machine fingerprint, a device label, the writing rig, on
    a database many rigs share), typed (``results.BenchRecord``; ``rec.to_dict()`` is the stored JSON).

        for rec in edgeopt.query(model="cls", targets="intel-cpu", all=True):
            print(rec.bundle.precision, rec.latency.p50_ms if rec.ok else rec.status)"""
    from edgeopt.results import DEFAULT_DB, ResultsDB, record_from_dict

    target = resolve_target_filter(targets)
    with ResultsDB(db or DEFAULT_DB, create=False) as rdb:
        return [record_from_dict(r) for r in rdb.query(model=model, target=target, device=device,
                                                       precision=precision, since=since, run_id=run,
                                                       latest=not all, identity=identity, label=label, rig=rig)]


@_api(extra=_keywords_of("edgeopt.api:query"))
def report(db: str | None = None, format: str = "table", title: str = "edgeopt report", output: str | None = None,
           **filters: Any) -> str:
    """The comparison of measured runs as text in one format (``edgeopt report``); with ``output`` (a file) also
    written there (atomically; the path is checked before the database is read; ``out=`` is its old name).

        page = edgeopt.report(format="html", output="report.html", model="cls", targets="cpu,intel-cpu")"""
    from edgeopt.commands.report import check_writable, write_report
    from edgeopt.reporting import render

    if output:
        check_writable(str(output), "--output")
    records = query(db, **filters)
    text = render(records, format, title=title, filters=filters)
    if output:
        write_report(records, format, str(output), title, filters)
    return text


# --- HIL gate and fleet rollout --------------------------------------------------------------------


@_api()
def parse_duration(text: str | float, what: str = "--budget") -> float:
    """A duration -> seconds above 0: ``250ms``, ``60s``, ``2m``, ``1h``; a bare number is seconds.

        assert edgeopt.parse_duration("2m") == 120.0"""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        v = float(text)
    else:
        t = str(text).strip().lower().replace(" ", "")
        mult = 1.0
        for suffix, m in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
            if t.endswith(suffix):
                t, mult = t[: -len(suffix)], m
                break
        try:
            v = float(t) * mult
        except ValueError:
            raise UsageError(f"{what}: expected a duration like 500ms, 60s, 2m or 1h, got {text!r}") from None
    if not v > 0 or v != v or v == float("inf"):
        raise UsageError(f"{what} must be a finite duration above 0 s, got {text!r}")
    return v


@_api(extra=_keywords_of("edgeopt.hil.gate:gate"))
def gate(candidate: str | os.PathLike, baseline: str | os.PathLike, devices: str | os.PathLike | None = "local",
         limit: str | list[str] | None = None, label: str | list[str] | None = None, gate: str | None = None,
         budget: str | float = "60s", on_inconclusive: str = "pause", db: str | None = "edgeopt-results.db",
         trust_new_host_keys: bool = False, progress: Progress = _quiet, raise_on_failure: bool = True,
         junit: str | None = None, md: str | None = None, raw: str | None = None, **build: Any) -> GateResult:
    """Did CANDIDATE regress against BASELINE on the rig? (``edgeopt gate``) -> ``edgeopt.api_types.GateResult``:
    ``verdict`` (pass/regressed/improved/inconclusive/error), ``exit_code``, per device the verdicts
    with ratios and intervals (``res.devices[0].verdicts[0].ratio``; ``to_dict()`` is ``edgeopt gate --json``). BASELINE: a bundle folder (paired, interleaved) or ``results:NAME`` (a
    stored baseline: unpaired). The rig file's ``rig:`` policy applies (health, prepare/restore, power
    cycle, quarantine). ``on_inconclusive``: ``pause`` (exit 6) | ``fail`` (exit 5) | ``pass`` (exit 0)
    folds the exit code (``exit6`` is the old spelling of ``pause``).
    CANDIDATE may be a model ``.onnx``: built first like the baseline bundle (``build``: calib, preprocess,
    dist).

    A gate that did not pass raises what the CLI exits with, the result as ``err.result``: regressed (or
    inconclusive under ``on_inconclusive="fail"``) ``GateFailed`` (5), inconclusive ``Inconclusive`` (6), a
    device or rig failure ``DeviceError`` (4); ``raise_on_failure=False`` returns the result instead.

        try:
            edgeopt.gate("dist/new/cls/cpu-int8", "dist/old/cls/cpu-int8", devices="rig.yaml", budget="60s")
        except edgeopt.GateFailed as err:
            raise SystemExit(f"regressed: {err}")"""
    from edgeopt.api_types import gate_result
    from edgeopt.commands.gate import check_output_files
    from edgeopt.hil.gate import gate as _gate
    from edgeopt.hil.junit import write_outputs

    check_output_files(junit=junit, md=md, raw=raw)  # ``junit``/``md``/``raw``: files written, checked first
    res = _gate(candidate, baseline, devices, limit, label, gate, budget, on_inconclusive, db,
                trust_new_host_keys, progress, **build)
    if junit or md or raw:
        write_outputs(res, junit, md, raw)
    typed = gate_result(res)
    err = gate_failure(typed)
    if raise_on_failure and err is not None:
        raise err
    return typed


def gate_failure(res: GateResult | dict[str, Any]) -> EdgeoptError | None:
    """A finished gate's result as the error its exit code means: 5 ``GateFailed``, 6 ``Inconclusive``, 4
    ``DeviceError`` (each with the result as ``err.result``); None when it exits 0."""
    from edgeopt.errors import (
        EXIT_DEVICE_FAILED,
        EXIT_GATE_FAILED,
        EXIT_INCONCLUSIVE,
        GateFailed,
        Inconclusive,
    )

    code = res.get("exit_code", 0)
    if not code:
        return None
    lines = []
    for d in res.get("devices") or []:
        why = d.get("error") or d.get("skipped") or ", ".join(
            f"{v['metric']} {v['verdict']}" + (f" x{v['ratio']:.3g}" if isinstance(v.get("ratio"), (int, float)) else "")
            for v in d.get("verdicts") or [] if v.get("verdict") not in ("pass", "improved"))
        lines.append(f"{d.get('device')}: {d.get('verdict')}" + (f" ({str(why)[:160]})" if why else ""))
    msg = f"gate {res.get('verdict')}: " + ("; ".join(lines) or "no device judged")
    hint = "the gate's result is err.result; raise_on_failure=False returns it instead"
    cls = {EXIT_GATE_FAILED: GateFailed, EXIT_INCONCLUSIVE: Inconclusive, EXIT_DEVICE_FAILED: DeviceError}.get(code)
    if cls is None:
        return EdgeoptError(msg, hint=hint, result=res)
    return cls(msg, hint=hint, result=res)


@_api(extra=_keywords_of("edgeopt.hil.rig:status"))
def rig_status(devices: str | os.PathLike | None = "local", db: str = "edgeopt-results.db",
               probe: bool = True, label: str | list[str] | None = None, **kw: Any) -> RigStatus:
    """Every rig device's health, last seen, quarantine and recent failures (``edgeopt rig status``) ->
    ``RigStatus`` (``devices``: ``RigDevice``); ``limit``/``label`` pick devices as bench and gate do.

        bad = [d.device for d in edgeopt.rig_status("rig.yaml").devices if d.quarantined]"""
    from edgeopt.api_types import rig_status_of
    from edgeopt.hil.rig import status

    return rig_status_of(status(devices, db, probe, labels=label, **kw))


@_api()
def rig_release(device: str, db: str = "edgeopt-results.db") -> RigRelease:
    """Take a device out of quarantine (``edgeopt rig release``) -> ``RigRelease`` (was it quarantined, the
    failures cleared).

        edgeopt.rig_release("orin-1").was_quarantined"""
    from edgeopt.api_types import RigRelease
    from edgeopt.hil.rig import release

    r = release(device, db)
    return RigRelease(device=str(r.get("device")), was_quarantined=bool(r.get("was_quarantined")),
                      failures_cleared=int(r.get("failures_cleared") or 0), raw=r)


@_api(extra=_keywords_of("edgeopt.hil.baseline:save"))
def baseline_save(name: str, source: str, db: str = "edgeopt-results.db", targets: str | None = None,
                  **kw: Any) -> Baseline:
    """Keep a gate's or bench's rounds as a named baseline (``edgeopt baseline save NAME --from RUN|latest``;
    ``source`` is ``--from``, a Python keyword). ``model``, ``targets``, ``device``, ``identity``, ``force``.

        saved = edgeopt.baseline_save("main", "latest", model="cls", targets="cpu")
        print([(e.target, e.device) for e in saved.entries])"""
    from edgeopt.api_types import baseline_of
    from edgeopt.hil.baseline import save

    return baseline_of(save(name, source, db, target=targets, **kw))


@_api()
def baseline_list(db: str = "edgeopt-results.db") -> list[BaselineSummary]:
    """The stored baselines (``edgeopt baseline list``) -> ``[BaselineSummary]``: name, entries, their models,
    targets and devices, when saved.

        names = [b.name for b in edgeopt.baseline_list()]"""
    from edgeopt.api_types import baseline_summary
    from edgeopt.hil.baseline import list_baselines

    return [baseline_summary(b) for b in list_baselines(db)]


@_api()
def baseline_show(name: str, db: str = "edgeopt-results.db") -> Baseline:
    """One stored baseline with its entries (model x target x device, rounds) (``edgeopt baseline show``) ->
    ``Baseline``.

        main = edgeopt.baseline_show("main")
        print([(e.model, e.target, e.device) for e in main.entries])"""
    from edgeopt.api_types import baseline_of
    from edgeopt.hil.baseline import show

    return baseline_of(show(name, db))


@_api()
def baseline_export(name: str, db: str = "edgeopt-results.db", output: str | os.PathLike | None = None) -> Baseline:
    """A stored baseline as the file ``baseline import`` reads (``edgeopt baseline export``) -> ``Baseline``
    (``to_dict()`` is the file, rounds included); with ``output`` also written there (``out=``: its old name).

        edgeopt.baseline_export("main", output="cls.baseline.json")"""
    from edgeopt.hil.baseline import export, write_export

    if output is not None:
        from edgeopt.commands.report import check_writable

        check_writable(str(output), "--output", "the baseline")  # before the database is read
    from edgeopt.api_types import baseline_of

    doc = export(name, db)
    if output is not None:
        write_export(doc, output)
    return baseline_of(doc)


@_api(extra=_keywords_of("edgeopt.hil.baseline:import_file"))
def baseline_import(file: str | os.PathLike, db: str = "edgeopt-results.db", **kw: Any) -> Baseline:
    """Load an exported baseline file (``edgeopt baseline import FILE``; ``name``, ``force``) -> ``Baseline``
    (``replaced``: the entries it replaced).

        edgeopt.baseline_import("cls.baseline.json", name="main", force=True)"""
    from edgeopt.api_types import baseline_of
    from edgeopt.hil.baseline import import_file

    return baseline_of(import_file(file, db, **kw))


def rollout_inputs(bundles: str | list[str], devices: str | os.PathLike, select: str | list[str] | None = None,
                   waves: str = "1,10%,50%,100%", limit: str | list[str] | None = None):
    """The plan of a rollout and what it needs: ``(plan, devices by name, bundle per device)``."""
    from pathlib import Path

    from edgeopt.deploy import find_bundles, load_bundle
    from edgeopt.fleet.plan import make_plan, parse_select, parse_waves
    from edgeopt.inventory import canonical_target, load_inventory

    bundles = [bundles] if isinstance(bundles, (str, os.PathLike)) else list(bundles)
    wave_specs = parse_waves(waves)
    sel = parse_select(_split(select))
    found = []
    for b in bundles:
        p = Path(b)
        if not p.is_dir():
            raise UsageError(f"bundle folder {str(b)!r} " + ("is a file" if p.exists() else "does not exist"),
                             hint="give bundle folders (dist/<model>/<target>-<precision>) or a dist/<model>/ "
                                  "folder")
        found.extend([load_bundle(p)] if (p / "manifest.json").is_file() else find_bundles(p))
    if not found:
        raise UsageError(f"no bundle in {', '.join(map(str, bundles))}",
                         hint="give bundle folders or a dist/<model>/ folder")
    devs = load_inventory(devices).select(_split(limit))
    plan = make_plan(devs, found, wave_specs, sel)
    by_target = {canonical_target(b.target): b for b in found}
    devmap = {d.name: d for d in devs}
    bmap = {w["device"]: by_target[canonical_target(w["target"])] for wave in plan.waves for w in wave}
    return plan, devmap, bmap


def rollout_options(gate: str | None = None, gate_budget: float = 20.0, max_fail: str | int = "0", parallel: int = 8,
                    bake: float = 0.0, on_inconclusive: str = "pause", on_halt: str = "keep",
                    health_watch: float = 0.0, trust_new_host_keys: bool = False,
                    max_disagreement: str | float | None = None, latency_gate: bool = True,
                    engine: str = "builtin", step_timeout: float = 600.0, retries: int = 2,
                    budget: str | float | None = None, fleet_engine: str | None = None,
                    no_latency_gate: bool | None = None, device_budget: str | float | None = None) -> Options:
    """A rollout's options checked (``edgeopt.fleet.rollout.Options``). The names the CLI uses are taken
    too: ``device_budget`` (a duration, ``"20s"``: each device's interleaved measurement; ``budget`` and
    ``gate_budget`` its older names), ``fleet_engine`` (of ``engine``), ``no_latency_gate``; ``on_inconclusive``:
    ``pause`` | ``fail`` | ``pass`` (``continue`` the old name of pass)."""
    from edgeopt.fleet.plan import parse_max_fail
    from edgeopt.fleet.rollout import Options
    from edgeopt.policy.gatefile import load_gate, parse_fraction

    if int(parallel) < 1:
        raise UsageError(f"--parallel must be >= 1, got {parallel}")
    for name, v in (("--bake", bake), ("--health-watch", health_watch)):
        if float(v) < 0:
            raise UsageError(f"{name} must be >= 0 s, got {v}")
    given = device_budget if device_budget is not None else budget if budget is not None else gate_budget
    gate_budget = parse_duration(given, "--device-budget")
    engine = fleet_engine if fleet_engine is not None else engine
    if no_latency_gate is not None:  # --no-latency-gate, the flag's own name of latency_gate=False
        latency_gate = not no_latency_gate
    on_inconclusive = {"pass": "continue", "exit6": "pause"}.get(str(on_inconclusive), str(on_inconclusive))
    if on_inconclusive not in ("pause", "continue", "fail") or on_halt not in ("keep", "rollback-all"):
        raise UsageError(f"on_inconclusive must be pause|fail|pass and on_halt keep|rollback-all, "
                         f"not {on_inconclusive!r}/{on_halt!r}")
    if engine not in ("builtin", "ansible"):
        raise UsageError(f"--fleet-engine must be builtin or ansible, not {engine!r}")
    if engine == "ansible":
        from edgeopt.fleet.ansible_engine import require_ansible

        require_ansible()
    if not float(step_timeout) > 0:
        raise UsageError(f"--step-timeout must be above 0 s, got {step_timeout}")
    spec = load_gate(gate)
    if max_disagreement is not None:
        spec.max_disagreement = parse_fraction(str(max_disagreement), "--max-disagreement")
    if int(retries) < 0:
        raise UsageError(f"--retries must be >= 0, got {retries}")
    return Options(engine=engine, step_timeout_s=float(step_timeout), retries=int(retries), gate=spec, gate_budget_s=float(gate_budget), max_fail=parse_max_fail(max_fail),
                   parallel=int(parallel), bake_s=float(bake), on_inconclusive=on_inconclusive, on_halt=on_halt,
                   health_watch_s=float(health_watch), trust_new_host_keys=trust_new_host_keys,
                   latency_gate=latency_gate)


@_api(extra=_keywords_of("edgeopt.api:rollout_options"))
def rollout(bundles: str | list[str], devices: str | os.PathLike, waves: str = "1,10%,50%,100%",
            select: str | list[str] | None = None, limit: str | list[str] | None = None,
            label: str | list[str] | None = None, dry_run: bool = False,
            db: str = "edgeopt-results.db", on_event: Callable[[dict], None] | None = None,
            progress: Progress = _quiet, eval: str | os.PathLike | None = None, eval_max_drop: float = 0.01,
            raise_on_failure: bool = True, events: str | os.PathLike | None = None,
            **options: Any) -> RolloutSummary | RolloutPlan:
    """Ship BUNDLES to the fleet in waves, gated on each device (``edgeopt rollout``) ->
    ``edgeopt.api_types.RolloutSummary`` (``status`` done/halted/paused, ``waves`` with each device's outcome,
    ``rolled_back``); with ``dry_run`` a ``RolloutPlan`` (waves of devices, ``bytes``) and nothing changed.
    ``to_dict()`` is what ``--json`` prints. ``label``: only devices with one of
    these labels (as ``select=["label=L"]``). ``options``: those of ``rollout_options`` (gate, budget,
    max_fail, parallel, bake, health_watch, on_inconclusive pause|fail|pass, on_halt, fleet_engine, device_budget …).
    ``eval``: a labelled ``.npz`` scored on each device beside the incumbent (``edgeopt.fleet.evalset``);
    the candidate may score at most ``eval_max_drop`` below it.

    A rollout that did not finish raises what the CLI exits with, the summary as ``err.result``: halted on a
    device's gate or check ``RolloutHalted`` (5), halted on device failures ``DeviceError`` (4), paused on an
    inconclusive verdict ``Inconclusive`` (6); ``raise_on_failure=False`` returns the summary instead.

        plan = edgeopt.rollout("dist/new/cls", "fleet.yaml", waves="1,10%,100%", dry_run=True)
        done = edgeopt.rollout("dist/new/cls", "fleet.yaml", waves="1,10%,100%", max_fail="5%", gate="gate.yaml")"""
    from pathlib import Path

    from edgeopt.api_types import rollout_plan, rollout_summary
    from edgeopt.fleet.journal import Journal
    from edgeopt.fleet.rollout import run_rollout

    if events is not None and not dry_run:  # the events file before anything (``--events``)
        from edgeopt.commands.report import check_writable

        check_writable(str(events), "--events", "the events")
    opts = rollout_options(**options)
    if label:  # --label L: the devices --select label=L picks
        select = [*(_split(select) or []), *(f"label={x}" for x in _split(label) or [])]
    plan, devmap, bmap = rollout_inputs(bundles, devices, select, waves, limit)
    if eval is not None:
        from edgeopt.fleet.evalset import load_eval

        opts.eval_set = load_eval(eval, list({b.bundle_id: b for b in bmap.values()}.values()), eval_max_drop)
    if dry_run:
        return rollout_plan({**plan.as_dict(), "bytes": sum(w["bytes"] for wave in plan.waves for w in wave)})
    bl = [bundles] if isinstance(bundles, (str, os.PathLike)) else list(bundles)
    spec = {"bundles": [str(Path(b).resolve()) for b in bl],
            "devices": "local" if str(devices) == "local" else str(Path(devices).resolve()),
            "limit": _split(limit) or [], "select": _split(select) or [], "waves": waves,
            "gate": str(Path(options["gate"]).resolve()) if options.get("gate") else None,
            "gate_budget": opts.gate_budget_s, "max_fail": str(options.get("max_fail", "0")),
            "parallel": opts.parallel, "bake": opts.bake_s, "health_watch": opts.health_watch_s,
            "on_inconclusive": opts.on_inconclusive, "on_halt": opts.on_halt,
            "max_disagreement": options.get("max_disagreement"), "no_latency_gate": not opts.latency_gate,
            "engine": opts.engine, "step_timeout": opts.step_timeout_s, "retries": opts.retries,
            "eval": str(Path(eval).resolve()) if eval is not None else None, "eval_max_drop": eval_max_drop}
    with Journal(db, _with_events_file(on_event, events)) as j:
        summary = rollout_summary(run_rollout(plan, devmap, bmap, opts, j, spec=spec, progress=progress))
    err = rollout_failure(summary)
    if raise_on_failure and err is not None:
        raise err
    return summary


def _with_events_file(on_event: Callable[[dict], None] | None, events: str | os.PathLike | None
                      ) -> Callable[[dict], None] | None:
    """``events``: every event also appended to that file as a JSON line (``--events FILE``)."""
    if events is None:
        return on_event
    import threading

    from edgeopt.jsonsafe import dumps

    Path(events).touch()  # an unwritable path fails here, before anything runs
    lock = threading.Lock()

    def both(ev: dict) -> None:
        with lock, open(events, "a") as f:
            f.write(dumps(ev, default=str) + "\n")
        if on_event is not None:
            on_event(ev)
    return both


def rollout_failure(summary: RolloutSummary | dict[str, Any]) -> EdgeoptError | None:
    """A finished rollout's summary as the error the CLI exits with: halted with a device's gate or check
    failed ``RolloutHalted`` (5), halted on device failures only ``DeviceError`` (4), paused ``Inconclusive``
    (6), any other status not ``done`` an internal ``EdgeoptError`` (1); None when done."""
    from edgeopt.errors import EXIT_INTERNAL, Inconclusive, RolloutHalted

    st = summary.get("status")
    if st == "done":
        return None
    outs = [o for w in summary.get("waves", []) for o in w.get("outcomes", [])]
    bad = [o for o in outs if o.get("status") not in ("done", "already")]
    msg = (f"rollout {summary.get('rollout_id')} {st}" + (f": {summary['reason']}" if summary.get("reason") else "")
           + ("" if not bad else " (" + "; ".join(f"{o['device']} {o['status']} at {o.get('step')}" for o in bad[:5])
                                 + (f"; {len(bad) - 5} more" if len(bad) > 5 else "") + ")"))
    hint = "the summary is err.result; raise_on_failure=False returns it instead"
    if st == "paused":
        return Inconclusive(msg, hint="`edgeopt rollout resume ID --approve` goes on; " + hint, result=summary)
    if st == "halted":
        if any(o.get("status") == "failed" for o in outs):
            return RolloutHalted(msg, hint=hint, result=summary)
        return DeviceError(msg, hint=hint, result=summary)
    err = EdgeoptError(msg, hint=hint, result=summary)
    err.exit_code = EXIT_INTERNAL
    return err


_TUNE_FLAGS = {"shape": "shapes", "batch": "batches", "label": "labels", "confirm": "confirm_rounds",
               "latency_bound": "slo"}


def _tune_keywords() -> set[str]:
    """``edgeopt.tuning.tune``'s keywords under their flags' names (``shape``, ``batch``, ``label``, ``confirm``)."""
    inner = {v: k for k, v in _TUNE_FLAGS.items()}
    return {inner.get(n, n) for n in _keywords_of("edgeopt.tuning:tune")()} | {"scheduler"}  # edgeopt.cluster


@_api(extra=_tune_keywords)
def tune(model: str | os.PathLike, targets: str, devices: str | os.PathLike = "local", raise_on_failure: bool = True,
         **options: Any) -> TuneResult:
    """The best configuration per device under an SLO (``edgeopt tune``) -> ``edgeopt.tuning.TuneResult``.
    ``options``: the flags' names: limit, label, precision, batch, threads, latency_bound, min_accuracy, objective, shape,
    calib, preprocess, dist, duration, exhaustive, confirm, db, progress (see ``edgeopt tune --help``); scheduler
    (``--scheduler``: the candidates built on Dask workers, as ``edgeopt.build(scheduler=)``).

        res = edgeopt.tune("model.onnx", "cpu,intel-cpu", devices="rig.yaml", latency_bound="p99=20ms",
                           batch=[1, 4])
        print({d: (p.target, p.precision, p.batch) for d, p in res.winners.items()})

    Measured, but no configuration met the SLO/accuracy on some device (the CLI's exit 5): ``GoalNotMet``
    with the TuneResult as ``err.result`` (``result.closest`` the nearest miss); every run failed on a
    device: ``DeviceError``. ``raise_on_failure=False`` returns the result instead."""
    from edgeopt.tuning import tune as _tune

    if options.get("batch") is not None:
        options["batch"] = parse_batches(options["batch"])
    check_bundle_folder(options.get("dist", "dist"))
    from edgeopt import cluster

    with cluster.session(options.pop("scheduler", None), options.get("progress") or _quiet):  # builds on Dask workers
        res = _tune(str(model), targets, devices=str(devices), **{_TUNE_FLAGS.get(k, k): v for k, v in options.items()})
    err = tune_failure(res)
    if raise_on_failure and err is not None:
        raise err
    return res


def tune_failure(res: TuneResult) -> GoalNotMet | DeviceError | None:
    """What a finished tune failed at, as the error the CLI exits with: the SLO/accuracy missed on a device
    that measured (``GoalNotMet``, exit 5), or a device where no point could be measured (``DeviceError``,
    exit 4); None when every device has a winner."""
    if res.closest:
        d, p = next(iter(res.closest.items()))
        return GoalNotMet(f"no configuration meets the goals on {', '.join(res.closest)}; closest on {d}: "
                          f"{p.target} {p.precision} batch {p.batch} threads {p.threads} ({p.why_not})",
                          hint="loosen --latency-bound/--min-accuracy, or try more targets/precisions/batches", result=res)
    failed = [p for p in res.points if p.status != "ok"]
    devices = {p.device for p in res.points}
    lost = sorted(d for d in devices if d not in res.winners)
    if failed and lost:
        return DeviceError(f"no point could be measured on {', '.join(lost)}: "
                           f"{(failed[0].why_not or failed[0].status)[:200]}", result=res)
    return None


@_api(extra=_keywords_of("edgeopt.hil.history:history"))
def history(model: str, db: str | None = None, targets: str | None = None, **kw: Any) -> list[Series]:
    """The series of benched/gated runs of a model with change points flagged (``edgeopt history``) ->
    ``[hil.history.Series]``; ``kw``: device, precision, metric, since, until, min_size, min_shift, alpha,
    identity, label, rig (see ``edgeopt history --help``).

        for s in edgeopt.history("cls", targets="cpu", metric="p99"):
            print(s.target, s.device, [c.at for c in s.change_points])"""
    from edgeopt.hil.history import history as _history

    return _history(model, db, target=targets, **kw)


@_api(extra=_keywords_of("edgeopt.hil.history:change_points"))
def change_points(values: list[float], **kw: Any) -> list[ChangePoint]:
    """Change points of one series of figures (``edgeopt.hil.history.change_points``).

        cps = edgeopt.change_points([4.1, 4.0, 4.2, 4.1, 4.0, 5.1, 5.0, 5.2, 5.1, 5.0])"""
    from edgeopt.hil.history import change_points as _cp

    return _cp(values, **kw)


# --- fleet views and rollback (the CLI's rollback / fleet status / rollout list|status) -----------------


@dataclass
class RollbackDevice:
    """One device of :func:`rollback`: ``status`` rolled-back | skipped (the model was never activated
    there) | failed (unreachable, or no previous bundle); ``current`` the bundle id it runs now."""

    device: str
    status: str
    current: str | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device, "status": self.status, "current": self.current, "error": self.error}


@dataclass
class RollbackResult:
    """What :func:`rollback` did per device; ``ok`` when no device failed."""

    model: str
    devices: list[RollbackDevice]

    @property
    def ok(self) -> bool:
        return all(d.status != "failed" for d in self.devices)

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "ok": self.ok, "items": [d.as_dict() for d in self.devices],
                # the older --json shape: device -> the bundle id it runs now, or "failed: why"
                "devices": {d.device: d.current if d.status == "rolled-back" else f"{d.status}: {d.error}"
                            for d in self.devices}}


def _without_device(name: str, message: str) -> str:
    """A device error's text without the device name in front (the caller names the device once)."""
    return message[len(name) + 2:] if message.startswith(f"{name}: ") else message


def _slots(devs: list, trust_new_host_keys: bool, parallel: int = 16) -> dict[str, dict[str, Any] | str]:
    """Each device's slots as its agent lists them (``{slot: {current, trial, ...}}``), or the error text."""
    from concurrent.futures import ThreadPoolExecutor

    from edgeopt.deploy import DeviceSession

    def one(dev) -> tuple[str, dict[str, Any] | str]:
        try:
            with DeviceSession.open(dev, trust_new_host_keys) as s:
                return dev.name, s.listing().get("slots", {}) or {}
        except DeviceError as exc:
            return dev.name, _without_device(dev.name, exc.message)

    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(devs) or 1))) as pool:
        return dict(pool.map(one, devs))


@_api()
def rollback(devices: str | os.PathLike, model: str, target: str | None = None,
             limit: str | list[str] | None = None, trust_new_host_keys: bool = False, progress: Progress = _quiet,
             raise_on_failure: bool = True) -> RollbackResult:
    """Put each selected device's slot ``<model>/<target>`` back on its previous bundle (``edgeopt rollback``).

    A model that no selected device has ever activated is bad input (``UsageError``, exit 2) naming the
    models those devices have; a device without it is skipped; a device that could not be reached or has
    no previous bundle is ``failed`` and raises ``DeviceError`` (exit 4) with the result as ``err.result``
    unless ``raise_on_failure=False``.

    >>> edgeopt.rollback("fleet.yaml", model="ch_ppocr_mobile_v2.0_cls_infer", limit="shop-07")  # doctest: +SKIP
    """
    from edgeopt.fleet.rollout import rollback_devices, slot_of
    from edgeopt.inventory import canonical_target, load_inventory

    devs = load_inventory(devices).select(_split(limit))
    have_targets = sorted({canonical_target(d.target) for d in devs if d.target})
    if target:
        devs = [d for d in devs if d.target and canonical_target(d.target) == canonical_target(target)]
    devs = [d for d in devs if d.target]
    if not devs:
        if target:
            close = difflib.get_close_matches(canonical_target(target), have_targets, n=1, cutoff=0.6)
            raise UsageError(f"--target {target}: no selected device has that target"
                             + (f"; did you mean {close[0]}?" if close else ""),
                             hint="their targets: " + (", ".join(have_targets) or "none (set `target:` in the "
                                                                                  "inventory)"))
        raise UsageError("no selected device has a target", hint="set `target:` for the devices in the inventory")
    slots = _slots(devs, trust_new_host_keys)
    out: dict[str, RollbackDevice] = {}
    have = []
    for d in devs:
        s = slots[d.name]
        if isinstance(s, str):
            out[d.name] = RollbackDevice(d.name, "failed", error=s)
        elif slot_of(model, d.target) in s:
            have.append(d)
        else:
            out[d.name] = RollbackDevice(d.name, "skipped", error=f"{model} was never activated here")
    reached = [s for s in slots.values() if isinstance(s, dict)]
    if reached and not have:
        models = sorted({k.split("/")[0] for s in reached for k in s})
        raise UsageError(f"no selected device has model {model!r}: "
                         + (f"the models they have: {', '.join(models)}" if models
                            else "no model has been activated on them"),
                         hint="--model takes the name in the bundles' manifest (edgeopt fleet status lists them)")
    progress(f"rolling back {model} on {len(have)} device(s)" + (f"; {len(devs) - len(have)} without it skipped"
                                                                 if len(devs) > len(have) else ""))
    res = rollback_devices(have, model, {d.name: d.target for d in have}, trust_new_host_keys,
                           lambda *a, **k: None)
    for d in have:
        cur = str(res.get(d.name))
        out[d.name] = (RollbackDevice(d.name, "failed", error=_without_device(d.name, cur[len("failed: "):]))
                       if cur.startswith("failed: ") else RollbackDevice(d.name, "rolled-back", current=cur))
    result = RollbackResult(model, [out[d.name] for d in devs])
    if raise_on_failure and not result.ok:
        bad = [d for d in result.devices if d.status == "failed"]
        raise DeviceError(f"rollback failed on {len(bad)} device(s): {bad[0].device}: {bad[0].error}",
                          hint="the RollbackResult is err.result", result=result)
    return result


@dataclass
class FleetStatus:
    """What each device runs, read from its agent (:func:`fleet_status`): ``devices`` name -> ``{"slots":
    {slot: {current, trial, history ...}}}`` or ``{"error": why}``; ``drift`` name -> ``{"journal", "device"}``
    where the rollout's journal expects another bundle. ``ok``: every device answered and none drifted."""

    devices: dict[str, dict[str, Any]]
    drift: dict[str, dict[str, Any]]

    @property
    def ok(self) -> bool:
        return not self.drift and not any("error" in r for r in self.devices.values())

    def as_dict(self) -> dict[str, Any]:
        return {"devices": self.devices, "drift": self.drift}


@_api()
def fleet_status(devices: str | os.PathLike, limit: str | list[str] | None = None, rollout: str | None = None,
                 db: str = "edgeopt-results.db", parallel: int = 16,
                 trust_new_host_keys: bool = False) -> FleetStatus:
    """Every device's slots as its agent reports them (``edgeopt fleet status``); with ``rollout`` (an id),
    drift from what that rollout's journal believes each device runs. Unreachable devices are in the result
    (``{"error": ...}``), not raised: a status is a report.

        st = edgeopt.fleet_status("fleet.yaml", rollout="3f2a9c1d0b7e")
        print(st.ok, st.drift)"""
    from edgeopt.inventory import load_inventory

    devs = load_inventory(devices).select(_split(limit))
    expect = {}
    if rollout:
        from edgeopt.fleet.journal import Journal

        with Journal(db) as j:
            j.rollout(rollout)
            expect = {d: ev.get("after") for d, ev in j.device_states(rollout).items()}
    listed = _slots(devs, trust_new_host_keys, parallel)
    rows = {n: ({"error": v} if isinstance(v, str) else {"slots": v}) for n, v in listed.items()}
    drift = {}
    for name, want in expect.items():
        got = {s.get("current") for s in (rows.get(name) or {}).get("slots", {}).values()}
        if want and want not in got:
            drift[name] = {"journal": want, "device": sorted(x for x in got if x)}
    return FleetStatus(rows, drift)


def _stale(r: dict[str, Any], host: dict[str, Any] | None) -> str | None:
    """Why a rollout the journal says is running is not: its host process is gone or silent."""
    if r["status"] != "running" or host is None or not host["stale"]:
        return None
    if host["alive"] is False:
        return f"stale (host process gone: pid {host['pid']} on {host['host']})"
    return f"stale (no heartbeat from pid {host['pid']} on {host['host']} for {host['heartbeat_age_s']:.0f} s)"


@_api()
def rollout_list(db: str = "edgeopt-results.db", last: int = 20) -> list[RolloutRecord]:
    """The rollouts journalled in ``db``, newest first (``edgeopt rollout list``) -> ``[RolloutRecord]``: id,
    time, model, status (``interrupted`` with ``stale_reason`` when its host process is gone; ``journal_status``
    as written).

        for r in edgeopt.rollout_list(last=5):
            print(r.id, r.status, r.stale_reason or "")"""
    from edgeopt.api_types import rollout_record
    from edgeopt.fleet.journal import Journal

    if not Path(db).is_file():
        return []
    with Journal(db) as j:
        rows = j.rollouts(last)
        for r in rows:
            stale = _stale(r, j.host(r["id"]))
            r["journal_status"] = r["status"]
            if stale:
                r["status"], r["stale_reason"] = "interrupted", stale
    return [rollout_record(r) for r in rows]


@_api()
def rollout_status(rollout_id: str, db: str = "edgeopt-results.db") -> RolloutStatus:
    """One rollout from its journal (``edgeopt rollout status ID``) -> ``RolloutStatus``: its record, ``status``
    (``stale`` when its host process died, with ``stale_reason``), ``devices`` (each device's last outcome) and
    ``unconfirmed_trials`` (devices left in a trial, with when their agents revert them: ``revert_at``).

        st = edgeopt.rollout_status("3f2a9c1d0b7e")
        print(st.status, {d: t.revert_at for d, t in st.unconfirmed_trials.items()})"""
    from edgeopt.api_types import rollout_status_of
    from edgeopt.fleet.journal import Journal

    if not Path(db).is_file():
        raise UsageError(f"no journal at {db!r}: no rollout has been started here")
    with Journal(db) as j:
        r = j.rollout(rollout_id)
        states = j.device_states(rollout_id)
        trials = j.open_trials(rollout_id)
        host = j.host(rollout_id)
    stale = _stale(r, host)
    return rollout_status_of({**r, "status": "stale" if stale else r["status"], "journal_status": r["status"],
                              "host": host, "devices": states, "unconfirmed_trials": trials,
                              **({"stale_reason": stale} if stale else {})})


@_api()
def rollout_resume(rollout_id: str, approve: bool = False, db: str = "edgeopt-results.db",
                   events: str | os.PathLike | None = None, on_event: Callable[[dict], None] | None = None,
                   progress: Progress = _quiet, raise_on_failure: bool = True) -> RolloutSummary:
    """Finish a rollout that paused or whose host died (``edgeopt rollout resume ID``) -> a ``RolloutSummary``
    as :func:`rollout`'s: installs exactly the planned bundles kept with the journal; ``approve`` approves the
    inconclusive verdicts that paused it.
    Raises as :func:`rollout` does (``RolloutHalted``, ``DeviceError``, ``Inconclusive``) with the summary as
    ``err.result`` unless ``raise_on_failure=False``.

        summary = edgeopt.rollout_resume("3f2a9c1d0b7e", approve=True)"""
    from edgeopt.fleet.journal import Journal
    from edgeopt.fleet.plan import Plan
    from edgeopt.fleet.rollout import planned_bundles, run_rollout
    from edgeopt.inventory import load_inventory

    if not Path(db).is_file():
        raise UsageError(f"no journal at {db!r}: no rollout has been started here")
    if events is not None:
        from edgeopt.commands.report import check_writable

        check_writable(str(events), "--events", "the events")
    with Journal(db, _with_events_file(on_event, events)) as j:
        r = j.rollout(rollout_id)
        if r["status"] in ("done", "halted"):
            raise UsageError(f"rollout {rollout_id} is {r['status']}: nothing to resume",
                             hint="start a new rollout" if r["status"] == "halted" else None)
        host = j.host(rollout_id)
        if r["status"] == "running" and host is not None and not host["stale"]:
            raise UsageError(f"rollout {rollout_id} is running (pid {host['pid']} on {host['host']}, heartbeat "
                             f"{host['heartbeat_age_s']:.0f} s ago)", hint="wait for it, or stop that process first")
        if r["status"] == "paused" and not approve:
            raise UsageError(f"rollout {rollout_id} is paused on an inconclusive verdict; add --approve to go on")
        s = r["spec"]
        states = j.device_states(rollout_id)
        approved = frozenset(d for d, ev in states.items() if ev["status"] == "paused") if approve else frozenset()
        opts = rollout_options(s.get("gate"), s["gate_budget"], s["max_fail"], s["parallel"], s["bake"],
                               {"continue": "pass", "exit6": "pause"}.get(s["on_inconclusive"], s["on_inconclusive"]),
                               s["on_halt"], s["health_watch"], False, s.get("max_disagreement"),
                               not s.get("no_latency_gate", False), s.get("engine", "builtin"),
                               s.get("step_timeout", 600.0), s.get("retries", 2))
        opts.approved = approved
        plan = Plan.from_dict(s["plan"])
        inv = {d.name: d for d in load_inventory(s["devices"]).select(None)}
        gone = [w["device"] for wave in plan.waves for w in wave if w["device"] not in inv]
        if gone:
            raise UsageError(f"rollout {rollout_id}: {len(gone)} planned device(s) are not in {s['devices']} any "
                             f"more: {', '.join(gone[:5])}", hint="put them back in the inventory or start a new "
                             "rollout")
        bmap = planned_bundles(plan, s, rollout_id)
        if s.get("eval"):
            from edgeopt.fleet.evalset import load_eval

            opts.eval_set = load_eval(s["eval"], list({b.bundle_id: b for b in bmap.values()}.values()),
                                      s.get("eval_max_drop", 0.01))
        done = {d: ev["status"] for d, ev in states.items()}
        for d in sorted(approved):
            j.event(rollout_id, None, d, "approve", "ok", {"reason": "resume --approve: this device's inconclusive "
                                                           "latency verdict is approved"})
        j.set_status(rollout_id, "running", {"resumed": True, "approved": sorted(approved)})
        from edgeopt.api_types import rollout_summary

        summary = rollout_summary(run_rollout(plan, inv, bmap, opts, j, rollout_id=rollout_id, done=done,
                                              progress=progress))
    err = rollout_failure(summary)
    if raise_on_failure and err is not None:
        raise err
    return summary


# --- host-side commands: cache, devices, ocr-check, debug, find-max-qps, run ------------------------------


@_api()
def cache_list() -> list[CacheEntry]:
    """Every build-cache entry, newest first (``edgeopt cache list``) -> ``[edgeopt.cache.CacheEntry]`` (key,
    kind, model, target, precision, size_bytes, age_s; ``as_dict()``).

        print(sum(e.size_bytes for e in edgeopt.cache_list()) / 1e9, "GB")"""
    from edgeopt.cache import entries

    return entries()


@_api()
def cache_clean(older_than: str | None = None, max_size: str | None = None, all: bool = False,
                dry_run: bool = False) -> CacheCleanResult:
    """Remove build-cache entries (``edgeopt cache clean``): not written for ``older_than`` (``"7d"``), the
    oldest until the cache fits ``max_size`` (``"5G"``), or ``all``; ``dry_run`` only says what would go ->
    ``CacheCleanResult`` (``removed``: the entries' keys, ``freed_bytes``, ``left``).

        print(len(edgeopt.cache_clean(older_than="30d", dry_run=True).removed), "would go")"""
    from edgeopt.api_types import CacheCleanResult
    from edgeopt.cache import clean

    res = clean(older_than, max_size, all, dry_run)
    return CacheCleanResult(removed=tuple(str(e.get("key")) for e in res["removed"]),
                            freed_bytes=int(res["freed_bytes"]), left=int(res["left"]),
                            left_bytes=int(res["left_bytes"]), dry_run=bool(res["dry_run"]), raw=res)


@_api()
def devices(devices: str | os.PathLike = "local", limit: str | list[str] | None = None,
            label: str | list[str] | None = None, trust_new_host_keys: bool = False, parallel: int = 4,
            probe: bool = False, progress: Progress = _quiet) -> list[DeviceEntry]:
    """The inventory's devices as ``edgeopt devices --json`` lists them -> ``[DeviceEntry]`` (name, how reached,
    target, labels, python, root); with ``probe`` each device's probe too (``DeviceProbe``: ``ok``, else
    ``error``; the agent's report in ``raw["probe"]``: connects, installs the agent if needed).

        for d in edgeopt.devices("lab.yaml", probe=True):
            print(d.name, d.target, d.probe.ok)"""
    from edgeopt.api_types import device_entry

    chosen = select_devices(devices, limit, label)
    probes = globals()["probe"](devices, limit, label, trust_new_host_keys, parallel, progress) if probe else {}
    return [device_entry({**d.public(), "python": d.python, "root": d.root,
                          **({"probe": probes[d.name].to_dict()} if probes else {})}) for d in chosen]


@_api()
def ocr_check(det: str | os.PathLike, rec: str | os.PathLike, image: str | os.PathLike, expect: str | None = None,
              min_words: float = 1.0, reference: tuple[str, str] | list[str] | None = None,
              min_similarity: float = 0.9, raise_on_failure: bool = True) -> OcrCheckResult:
    """Read ``image`` with a PP-OCR det + rec pair (bundle folders or .onnx) and judge the reading
    (``edgeopt ocr-check``): ``expect``'s words found, and/or the FP32 ``reference`` pair's reading matched.
    -> ``OcrCheckResult`` (the lines read, ``passed``, ``expect_words``, ``reference_similarity``). A reading
    that misses raises ``BuildFailed`` (the CLI's exit 3) with the result as ``err.result``.

        res = edgeopt.ocr_check("dist/det/cpu-int8", "dist/rec/cpu-int8", "page.png", expect="Let us first")
        print(res.lines, res.expect_words)"""
    from edgeopt.api_types import OcrCheckResult
    from edgeopt.tasks.ocr import check_pair

    raw = check_pair(str(det), str(rec), str(image), expect, tuple(reference) if reference else None, min_words,
                     min_similarity)
    res = OcrCheckResult(image=str(raw.get("image")), det=str(raw.get("det")), rec=str(raw.get("rec")),
                         lines=tuple(str(x) for x in raw.get("lines") or ()), passed=bool(raw.get("passed")),
                         expect_words=(raw.get("expect") or {}).get("words"),
                         reference_similarity=(raw.get("reference") or {}).get("similarity"), raw=raw)
    if raise_on_failure and not res.passed:
        raise BuildFailed(f"ocr-check: the pair's reading of {image} missed the bound",
                          hint="the result is err.result; raise_on_failure=False returns it instead", result=res)
    return res


@_api()
def debug_layers(source: str | os.PathLike, target: str | None = None, precision: str = "auto",
                 model: str | None = None, shape: str | list[str] | None = None, calib: str | None = None,
                 preprocess: str | None = None, option: str | list[str] | None = None,
                 dist: str | os.PathLike | None = None, force: bool = False, samples: int = 4,
                 max_memory: str | int = "1G", reduce: str | os.PathLike | None = None,
                 html: str | os.PathLike | None = None, config: str | None = None, progress: Progress = _quiet,
                 raise_on_failure: bool = True, scheduler: str | None = None,
                 output_kind: str | list[str] | dict[str, Any] | None = None,
                 decision: str | list[str] | dict[str, Any] | None = None) -> DebugResult:
    """Where an artifact departs from ONNX FP32, layer by layer (``edgeopt debug``; ``edgeopt.debug`` is the
    module that does it, so the function has its own name) -> ``edgeopt.debug.DebugResult`` (``first_jump``,
    per-node rows, the policy's word, ``reduced`` with ``reduce=DIR``). SOURCE is a bundle folder, or a model
    built first for ``target``. Refused by the accuracy policy: ``GoalNotMet`` (exit 5) with the result as
    ``err.result``, unless ``raise_on_failure=False``. ``scheduler``: the model's build and ``reduce``'s on Dask
    workers, as ``build(scheduler=)``; ``output_kind``/``decision``: as ``build``'s, for the model's build.

        res = edgeopt.debug_layers("model.onnx", target="cpu", precision="int8", shape="x:1x3x224x224",
                                   calib="images/")
        print(res.first_jump)"""
    from edgeopt import cluster
    from edgeopt import debug as _debug
    from edgeopt.commands.report import check_writable, check_writable_dir

    if dist is not None:
        check_bundle_folder(dist)
    if html:
        check_writable(str(html), "--html", "the page")  # before the (long) comparison, not after it
    if reduce:
        check_writable_dir(str(reduce), "--reduce")
    budget = _debug.parse_size(str(max_memory)) if not isinstance(max_memory, int) else max_memory
    src = Path(source)
    if not src.exists():
        raise UsageError(f"{str(source)!r} does not exist", hint="give a bundle folder or an ONNX model")
    if src.is_dir() and target:
        raise UsageError("target is for a MODEL; a bundle already has its target")
    if not src.is_dir() and not target:
        raise UsageError("debugging a MODEL needs target=", hint=f"edgeopt.debug_layers({str(src)!r}, target='cpu')")
    with cluster.session_if(not src.is_dir() or bool(reduce), scheduler, progress):  # builds on Dask workers
        if src.is_dir():
            result = _debug.debug_bundle(src, model, samples=samples, max_memory=budget, progress=progress)
        else:
            _, result = _debug.debug_model(str(src), target, precision, dist=dist, samples=samples,
                                           max_memory=budget, progress=progress,
                                           shapes=_split(shape) if isinstance(shape, str) else list(shape or []),
                                           calib=calib, preprocess=preprocess,
                                           options=list(option or []) if not isinstance(option, str) else [option],
                                           config=config, force=force,
                                           **{k: v for k, v in (("output_kind", output_kind), ("decision", decision))
                                              if v is not None})
        if reduce and result.first_jump is not None:
            result.reduced = _debug.reduce(result, str(reduce), options=list(option or [])
                                           if not isinstance(option, str) else [option], progress=progress)
    if html:
        _debug.write_text(str(html), _debug.html(result))
    if raise_on_failure and _debug.refused(result):
        raise GoalNotMet("the accuracy policy refuses the artifact" + (
            f"; first jump at {result.first_jump}" if getattr(result, "first_jump", None) is not None else ""),
            hint="the result is err.result; raise_on_failure=False returns it instead", result=result)
    return result


@_api()
def find_max_qps(dist: str | os.PathLike = "dist", latency_bound: str = "p99=20ms", devices: str | os.PathLike = "local",
                 limit: str | list[str] | None = None, label: str | list[str] | None = None,
                 targets: str | list[str] | None = None, load_generator: str | None = None, threads: int | None = None,
                 trust_new_host_keys: bool = False, progress: Progress = _quiet,
                 raise_on_failure: bool = True) -> list[MaxQpsRow]:
    """The highest server rate each device sustains within ``latency_bound`` (``edgeopt bench --find-max-qps
    --latency-bound p99=20ms``) -> ``[MaxQpsRow]``, one per (device, bundle) with ``max_qps``, ``verdict`` met /
    not met / undetermined and every probe (``MaxQpsProbe``). Raises what the CLI exits with, the rows as ``err.result``: a device failed
    ``DeviceError`` (4), a bound not met at any rate ``GoalNotMet`` (5), undetermined ``Inconclusive`` (6).

        rows = edgeopt.find_max_qps("dist", "p99=20ms", devices="lab.yaml", raise_on_failure=False)"""
    from edgeopt.commands.bench import max_qps_exit, parse_latency_bound
    from edgeopt.errors import EXIT_DEVICE_FAILED, EXIT_GOAL_NOT_MET, Inconclusive
    from edgeopt.maxqps import find_max_qps as _find

    pct, bound = parse_latency_bound(latency_bound)
    if bound is None:
        raise UsageError("find_max_qps needs latency_bound, e.g. 'p99=20ms'")
    picked = check_bench_targets(targets)
    found = bundles_under(dist)
    devs = select_devices(devices, limit, label)
    check_target_filter(found, picked, dist)
    from edgeopt.api_types import max_qps_row

    raw_rows = _find(devs, found, bound, pct, load_generator, threads, trust_new_host_keys, picked, progress)
    code = max_qps_exit(raw_rows)
    rows = [max_qps_row(r) for r in raw_rows]
    if raise_on_failure and code:
        cls = {EXIT_DEVICE_FAILED: DeviceError, EXIT_GOAL_NOT_MET: GoalNotMet}.get(code, Inconclusive)
        raise cls(f"find-max-qps: {len(rows)} row(s), " + ", ".join(
            f"{r.device} {r.target}-{r.precision}: {r.verdict or r.status}" for r in rows),
            hint="the rows are err.result; raise_on_failure=False returns them instead", result=rows)
    return rows


@dataclass
class RunResult:
    """What :func:`run` did: the build's ``BuildReport``, the ``BenchResult`` of the bundles that built (None
    when none did), and the report file written (or None)."""

    build: BuildReport
    bench: BenchResult | None
    report: str | None = None

    @property
    def ok(self) -> bool:
        return self.build.ok and (self.bench is None or self.bench.ok)


def _run_keywords() -> set[str]:
    return ((build.keywords() or set()) | (bench.keywords() or set())) - {"bundles", "progress", "raise_on_failure"}


@_api(extra=_run_keywords)
def run(model: str | os.PathLike, targets: str | list[str], devices: str | os.PathLike = "local",
        report: str | os.PathLike | None = None, report_format: str | None = None, progress: Progress = _quiet,
        raise_on_failure: bool = True, **kw: Any) -> RunResult:
    """The whole job (``edgeopt run``): build each target, push and bench what built on the devices, and
    write the comparison to ``report`` (format from its extension or ``report_format``). ``kw``: the keywords
    of :func:`build` (precision, shape, calib, preprocess, dist, ...) and :func:`bench` (limit, label, duration,
    threads, batch, db, ...). The report path, devices and bench options are checked before anything is built.
    A failed build raises ``BuildFailed`` (3), a failed device ``DeviceError`` (4), the ``RunResult`` as
    ``err.result``, unless ``raise_on_failure=False``.

        res = edgeopt.run("model.onnx", "cpu,intel-cpu", precision="auto", shape="x:1x3x224x224",
                          calib="images/", report="report.html")
        print(res.build.ok, [r.latency.p50_ms for r in res.bench.records])"""
    import inspect as _inspect

    from edgeopt.commands.report import check_writable, guess_format, write_report
    from edgeopt.deploy import load_bundle

    bkw = {k: v for k, v in kw.items() if k in (build.keywords() or set())}
    benchkw = {k: v for k, v in kw.items() if k in (bench.keywords() or set()) and k not in ("dist",)}
    fmt = None
    if report is not None:
        fmt = guess_format(report_format, str(report))
        check_writable(str(report))
    check_bundle_folder(kw.get("dist", "dist"))
    opts = {k: v for k, v in benchkw.items() if k in _inspect.signature(bench_options).parameters}
    if isinstance(opts.get("batch"), (list, tuple)) or "," in str(opts.get("batch", "")):
        raise UsageError("run takes one batch; for a batch curve: edgeopt.build(batch=[1, 4, 8]), then "
                         "edgeopt.bench(batch=[1, 4, 8])")
    bench_options(**opts)
    select_devices(devices, benchkw.get("limit"), benchkw.get("label"))
    rep = build(model, targets, progress=progress, raise_on_failure=False, **bkw)
    bundles = [load_bundle(r.bundle) for r in rep.results if r.ok and r.bundle]
    res = None
    if bundles:
        res = bench(bundles=bundles, devices=devices, progress=progress, raise_on_failure=False, **benchkw)
    if report is not None:
        write_report(list(res.records) if res else [], fmt, str(report), f"edgeopt run: {Path(str(model)).stem}",
                     {"run_id": res.run_id if res else None})
    out = RunResult(rep, res, str(report) if report is not None else None)
    if raise_on_failure and not rep.ok:
        raise BuildFailed(f"{sum(not r.ok for r in rep.results)} of {len(rep.results)} target build(s) failed",
                          hint="the RunResult is err.result (what built was benched)", result=out)
    if raise_on_failure and res is not None and not res.ok:
        raise DeviceError(f"{sum(not r.ok for r in res.records)} of {len(res.records)} run(s) failed",
                          hint="the RunResult is err.result", result=out)
    return out


# --- export, results database, build cluster, worker ---------------------------------------------------------


def _ints(value: str | int | Iterable[int] | None, what: str) -> tuple[int, ...]:
    """``"4,8"``, ``8`` or ``[4, 8]`` -> ``(4, 8)``; a non-integer is a UsageError naming the flag."""
    if value is None or value == "":
        return ()
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    items = [p for item in ([value] if isinstance(value, str) else list(value)) for p in str(item).split(",")]
    try:
        return tuple(int(v) for v in items if v.strip())
    except ValueError:
        raise UsageError(f"{what} takes comma-separated integers, got {value!r}") from None


@_api()
def export(format: str, bundle: str | os.PathLike | None = None, repository: str | os.PathLike | None = None,
           tracking_uri: str | None = None, experiment: str | None = None, db: str | None = None,
           model: str | None = None, device: str | None = None, since: str | None = None, run: str | None = None,
           name: str | None = None, max_batch: int | None = None, queue_delay_us: int = 100,
           preferred_batch: str | list[int] | None = None, no_dynamic_batching: bool = False, instances: int = 1,
           gpus: str | list[int] | None = None, engine_file: str | os.PathLike | None = None, version: int = 1,
           force: bool = False, progress: Progress = _quiet) -> TritonExportResult | MlflowExportResult:
    """Export a TensorRT bundle as a Triton model repository entry, or the results database's records as MLflow
    runs (``edgeopt export triton|mlflow``).

    ``format="triton"``: BUNDLE and ``repository`` (the model repository folder; ``out=``: its old name) ->
    ``TritonExportResult`` (the
    ``model_dir`` written, ``config``, ``next_steps``); ``name``, ``max_batch``, ``queue_delay_us``,
    ``preferred_batch``, ``no_dynamic_batching``, ``instances``, ``gpus``, ``engine_file`` (an engine built for
    the serving GPU, copied in), ``version``, ``force`` as the flags. ``format="mlflow"``: ``tracking_uri``
    (else ``$MLFLOW_TRACKING_URI``), ``experiment``, and the records of ``db`` filtered by ``model``, ``device``,
    ``since``, ``run`` -> ``MlflowExportResult`` (``exported``, ``skipped``). Bad input is a ``UsageError``
    (exit 2), a refusing or unreachable server a ``DeviceError`` (exit 4).

        res = edgeopt.export("triton", "dist/resnet/h100-fp16", repository="model_repository", max_batch=32)
        print(res.model_dir, res.next_steps[0])"""
    from edgeopt.api_types import MlflowExportResult, TritonExportResult

    if format not in ("triton", "mlflow"):
        close = difflib.get_close_matches(str(format), ["triton", "mlflow"], n=1)
        raise UsageError(f"export format {format!r}: not triton or mlflow"
                         + (f"; did you mean {close[0]!r}?" if close else ""))
    if format == "mlflow":
        from edgeopt.results import ResultsDB
        from edgeopt.results_mlflow import export as _export
        from edgeopt.results_url import exists, parse

        if bundle:
            raise UsageError("export mlflow takes no BUNDLE: it exports the results database's records (--db)")
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            raise UsageError("export mlflow needs --tracking-uri URL (or MLFLOW_TRACKING_URI)")
        if not exists(db):
            raise UsageError(f"no results database at {parse(db).shown!r}", hint="pass --db, or bench first")
        with ResultsDB(db, create=False) as rdb:
            records = rdb.query(model=model, device=device, since=since, run_id=run, annotate=True)
        if not records:
            raise UsageError("no records to export" + (" matching the filters" if any((model, device, since, run))
                                                        else ""))
        res = _export(records, uri, experiment, progress=None if progress is _quiet else progress)
        return MlflowExportResult(tracking_uri=uri, exported=int(res["exported"]), skipped=int(res["skipped"]),
                                  batches=int(res["batches"]),
                                  experiments={str(k): str(v) for k, v in res["experiments"].items()}, raw=res)
    from edgeopt.triton import TritonOptions, export_triton

    if not bundle or not repository:
        raise UsageError("export triton takes a BUNDLE and --repository DIR")
    for flag, v, low in (("--max-batch", max_batch, 0), ("--queue-delay-us", queue_delay_us, 0),
                         ("--instances", instances, 1), ("--version", version, 1)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < low):
            raise UsageError(f"{flag} must be an integer >= {low}, got {v!r}")
    from edgeopt.commands.report import check_writable_dir

    check_writable_dir(str(repository), "--repository")  # before the bundle is read
    opts = TritonOptions(name=name, max_batch=max_batch, dynamic_batching=not no_dynamic_batching,
                         queue_delay_us=int(queue_delay_us),
                         preferred_batch=_ints(preferred_batch, "--preferred-batch"), instances=int(instances),
                         gpus=_ints(gpus, "--gpus"), engine=str(engine_file) if engine_file else None,
                         version=int(version), force=force)
    res = export_triton(bundle, repository, opts)
    return TritonExportResult(model_dir=res.model_dir, config=res.config, config_text=res.config_text,
                              engine_copied=res.engine_copied, next_steps=tuple(res.next_steps),
                              raw={"model_dir": str(res.model_dir), "config": res.config,
                                   "engine_copied": res.engine_copied, "next_steps": list(res.next_steps)})


@_api()
def results_sync(db: str | None = None) -> ResultsSyncResult:
    """Upload the records spooled while the results server could not be reached, each once, and empty the spool
    (``edgeopt results sync``) -> ``ResultsSyncResult`` (``uploaded``, ``duplicates``, ``rows`` on the server).
    ``db``: the server (``postgresql://user@host:port/db``; else ``$EDGEOPT_DB``); a local file is a
    ``UsageError`` (nothing to sync), an unreachable server a ``DeviceError`` (exit 4).

        res = edgeopt.results_sync("postgresql://rig@results.lab:5432/edgeopt")
        print(res.uploaded, "uploaded;", res.rows, "on the server")"""
    from edgeopt.api_types import ResultsSyncResult
    from edgeopt.results import ResultsDB
    from edgeopt.results_url import parse

    spec = parse(db)
    if not spec.is_server:
        raise UsageError(f"--db {spec.shown!r} is a local file: there is nothing to sync",
                         hint="give the server: --db postgresql://user@host:port/dbname (or EDGEOPT_DB)")
    # create=False: an unreachable server is exit 4 in one line (not a spool); opening it uploads the spool
    with ResultsDB(db, create=False) as rdb:
        rdb.sync()
        res = {"uploaded": rdb.synced, "duplicates": rdb.sync_duplicates, "left": 0, "db": spec.shown,
               "spool": str(spec.path), "rows": rdb.count()}
    return ResultsSyncResult(db=spec.shown, spool=str(spec.path), uploaded=int(res["uploaded"]),
                             duplicates=int(res["duplicates"]), rows=int(res["rows"]), raw=res)


@_api()
def results_info(db: str | None = None) -> ResultsInfo:
    """Where records go (``edgeopt results info``) -> ``ResultsInfo``: the database (shown without a password),
    its kind (``db_kind`` sqlite | postgresql) and schema version, how many records, machine identities and rigs it holds, and on a server how
    many records wait in the local spool. A missing file is a ``UsageError`` (exit 2).

        info = edgeopt.results_info("edgeopt-results.db")
        print(info.records, info.rigs)"""
    from edgeopt.api_types import ResultsInfo
    from edgeopt.results import ResultsDB
    from edgeopt.results_schema import SCHEMA_VERSION
    from edgeopt.results_url import parse

    spec = parse(db)
    # db_kind, not kind: the --json envelope's "kind" says what the object is (results-info)
    out: dict[str, Any] = {"db": spec.shown, "db_kind": spec.kind, "schema_version": None,
                           "edgeopt_schema": SCHEMA_VERSION, "records": None, "identities": None, "rigs": None}
    with ResultsDB(db, create=False) as rdb:
        out["schema_version"] = rdb.schema_version
        out["records"] = rdb.count()
        out["identities"] = int(rdb._rows("SELECT COUNT(DISTINCT identity) FROM runs")[0][0])
        out["rigs"] = sorted(r[0] for r in rdb._rows("SELECT DISTINCT rig FROM runs WHERE rig IS NOT NULL"))
        if spec.is_server:
            out["spool"] = str(spec.path)
            out["spooled"] = rdb.spool().count() if spec.path.is_file() else 0
    return ResultsInfo(db=out["db"], db_kind=str(out["db_kind"]), schema_version=out["schema_version"],
                       edgeopt_schema=int(SCHEMA_VERSION), records=int(out["records"]),
                       identities=int(out["identities"]), rigs=tuple(out["rigs"]), spool=out.get("spool"),
                       spooled=out.get("spooled"), raw=out)


@_api()
def cluster_status(scheduler: str | None = None) -> ClusterStatus:
    """The Dask build cluster behind ``build(scheduler=)`` (``edgeopt cluster status``) -> ``ClusterStatus``:
    each worker's address, threads, running jobs, what it can build for this host and the converter versions
    that differ from this host's; ``nobody``: the backends no worker can build. ``scheduler``:
    ``tcp://HOST:PORT`` or ``tls://HOST:PORT`` (else ``$EDGEOPT_SCHEDULER``); a malformed or missing address is
    a ``UsageError`` (exit 2), an unreachable scheduler a ``DeviceError`` (exit 4).

        st = edgeopt.cluster_status("tcp://10.0.0.5:8786")
        print([(w.name, w.builds) for w in st.workers], st.nobody)"""
    from edgeopt.api_types import cluster_status_of
    from edgeopt.cluster import connect_timeout, resolve
    from edgeopt.commands.cluster import status

    address = resolve(scheduler)
    if address in (None, "auto"):
        raise UsageError("edgeopt cluster status needs --scheduler tcp://HOST:PORT (or $EDGEOPT_SCHEDULER)")
    return cluster_status_of(status(address, connect_timeout()))


@_api()
def start_worker(scheduler: str | None = None, nthreads: int = 1, name: str | None = None, only: str | None = None,
           resources: str | None = None, dry_run: bool = False, dask_args: Iterable[str] = ()) -> WorkerProcess:
    """Offer this machine's converters to a Dask scheduler for ``build(scheduler=)`` (``edgeopt worker``; ``edgeopt.worker`` is the
    module a build job runs in, so the function has this name): starts ``dask worker`` as a child process with one resource per backend that can build here and returns
    a ``WorkerProcess`` (``argv``, ``resources``, ``process``; ``stop()`` ends it). ``dry_run``: the command line
    only, nothing started. ``only`` cuts the backends offered, ``resources`` adds or sets some
    (``"tensorrt=1"``), ``dask_args`` go to ``dask worker`` as they are. Bad input (an address, an ``only``
    backend, a ``resources`` entry, nothing to offer) is a ``UsageError``; dask missing ``MissingDependency``.

        w = edgeopt.start_worker("tcp://10.0.0.5:8786", nthreads=2, only="onnxruntime,openvino")
        ...  # edgeopt.build(..., scheduler="tcp://10.0.0.5:8786") builds there
        w.stop()"""
    import subprocess
    from importlib.util import find_spec

    from edgeopt.api_types import WorkerProcess
    from edgeopt.commands.worker import worker_argv
    from edgeopt.errors import MissingDependency

    url, argv, offer = worker_argv(scheduler, nthreads, name, only, resources, list(dask_args))
    if dry_run:
        return WorkerProcess(url, argv, offer)
    if find_spec("distributed") is None:
        raise MissingDependency("dask distributed is not installed", hint="pip install 'edgeopt[cluster]'")
    return WorkerProcess(url, argv, offer, subprocess.Popen(argv))
