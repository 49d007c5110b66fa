"""The build pipeline: inspect -> plan -> build (per target, in worker processes) -> host check -> bundle.

Bundles are written to a temp dir under ``--out`` and renamed into place only when complete, so a
failed or interrupted build never leaves a half-written bundle.  Finished bundles are kept in a
content-addressed cache (``$EDGEOPT_CACHE_DIR`` or ``~/.cache/edgeopt``): the same model, options,
data and toolchain give the same key and no rebuild.  So do the outcomes of builds that ran to the
end and failed their check (``<key>.failed.json`` beside the bundles): the same key reports the same
failure at once, until ``--force``.  Crashes and timeouts are never cached.

``--option KEY=VALUE`` values are build-wide: every target sees every key, reads its own and ignores
the others.  Before anything is built, each selected (target, precision) checks the values of its
keys (``Target.check_options``), and a key that no backend reads (a typo) is refused
(``Target.known_options``): both are usage errors (exit 2).
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeopt import __version__, cluster, killed, spec_check
from edgeopt.errors import UsageError
from edgeopt.targets.base import CHECK_FAILED_MARK, debug_command, with_debug_hint

if TYPE_CHECKING:
    from edgeopt.results import AccuracyInfo

STATUS_OK = ("built", "cached", "up-to-date")
GROUP_NODES_ABOVE = 8  # more unsupported nodes than this: grouped by op type on the first line, names after
CACHED_FAILURE = "[cached outcome of an identical earlier build; --force retries]"


@dataclass
class TargetResult:
    target: str
    precision: str
    backend: str
    status: str  # built | cached | up-to-date | failed | check-failed | unsupported | unavailable
    bundle: str | None = None
    time_s: float | None = None
    check: str = ""  # a one-line summary of the host check
    error: str | None = None
    manifest: dict[str, Any] | None = field(default=None, repr=False)
    refused: bool = False  # the build ran to the end and its check refused the artifact (not a crash)
    fallback_from: dict[str, str] | None = None  # auto's first choice, refused: {"precision", "error"}

    @property
    def ok(self) -> bool:
        return self.status in STATUS_OK

    @property
    def accuracy(self) -> AccuracyInfo | None:
        """The host check, typed (``results.AccuracyInfo``: passed, metric, k of n with its interval, data);
        None when no check ran."""
        from edgeopt.results import accuracy_info

        m = self.manifest or {}
        return accuracy_info(m.get("host_check"), (((m.get("validation") or {}).get("source")) or {}).get("kind"))


@dataclass
class BuildReport:
    model: str
    out: str
    results: list[TargetResult]
    warnings: list[str]
    time_s: float
    skipped: list[dict[str, str]] = field(default_factory=list)  # (target, precision) pairs not offered

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for r, res in zip(d["results"], self.results):
            r.pop("manifest", None)
            r["check"] = check_result(res.manifest, r["check"])
        d["ok"] = self.ok
        return d


def check_result(manifest: dict[str, Any] | None, summary: str = "") -> dict[str, Any] | None:
    """The host check as data for scripts: passed, kind, n samples, data source, per-output kind,
    metrics and the metrics that failed, the tolerance it was judged at; ``summary`` is the one line."""
    if not manifest:
        return {"passed": None, "summary": summary} if summary else None
    hc = manifest.get("host_check") or {}
    src = ((manifest.get("validation") or {}).get("source") or {})
    out = {"passed": hc.get("passed"), "kind": hc.get("kind"), "summary": summary or hc.get("summary"),
           "samples": hc.get("samples"), "data": src.get("kind"), "tolerance": hc.get("tolerance"),
           "outputs": {name: {k: o.get(k) for k in ("kind", "passed", "metrics", "failed")}
                       for name, o in (hc.get("outputs") or {}).items()}}
    if "error" in hc:
        out["error"] = hc["error"]
    pre = manifest.get("prepared_onnx_check")
    if hc.get("kind") == "device" and pre:  # passed stays null (the engine is checked on the device)
        out["prepared_onnx"] = {"passed": pre.get("passed"), "what": pre.get("what"), "error": pre.get("error")}
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("EDGEOPT_CACHE_DIR") or Path.home() / ".cache" / "edgeopt")


def _key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _check_summary(manifest: dict[str, Any]) -> str:
    hc = manifest.get("host_check") or {}
    if hc.get("kind") == "structural":
        return "structural " + ("ok" if hc.get("passed") else "FAILED") + "; numeric on device"
    from edgeopt_agent.compare import summary_line

    if hc.get("kind") == "device":  # h100 & co: the engine is checked on the device; the prepared ONNX was here
        pre = manifest.get("prepared_onnx_check")
        if not pre:
            return "on device"
        return ("prepared ONNX " + ("FAILED: " + str(pre["error"]) if "error" in pre else summary_line(pre))
                + " in ONNX Runtime on the host; engine checked on the device")
    if "error" in hc:
        return "FAILED: " + hc["error"]

    line = summary_line(hc)  # a failed output names the metric that failed, a passing one its figures
    return f"{line}; {hc['why']}" if hc.get("why") else line


def sweep_work_dirs(out: Path, progress: Callable[[str], None] = lambda s: None) -> list[str]:
    """Remove work folders a killed build left in ``out``: their owner process is gone (or, with no
    owner recorded, they are over an hour old). A running build's folder is never touched."""
    removed = []
    for d in out.glob(".edgeopt-work-*"):
        if not d.is_dir():
            continue
        try:
            pid = int((d / "owner.pid").read_text().strip())
        except (OSError, ValueError):
            pid = None
        if pid is not None:
            try:
                os.kill(pid, 0)
                continue  # alive
            except ProcessLookupError:
                pass
            except PermissionError:
                continue  # someone else's, alive
        elif time.time() - d.stat().st_mtime < 3600:
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d.name)
    if removed:
        progress(f"removed {len(removed)} work folder(s) left by an interrupted build")
    return removed


def _writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".edgeopt-probe-"):
            pass
    except OSError as exc:
        raise UsageError(f"--out {str(out)!r} is not writable: {exc.strerror or exc}") from None


def build(
    model: str | os.PathLike,
    targets: str | list[str],
    precisions: str | list[str] | None = None,
    shapes: dict[str, list[int]] | None = None,
    calib: str | None = None,
    preprocess: str | None = None,
    out: str | os.PathLike = "dist",
    jobs: int = 2,
    force: bool = False,
    allow_mismatch: bool = False,
    config: str | None = None,
    options: dict[str, Any] | None = None,
    timeout: float = 1800,
    n_calib: int = 32,
    n_val: int | None = None,
    progress: Callable[[str], None] = lambda s: None,
    accept: str | os.PathLike | dict[str, Any] | None = None,
    batch: int = 1,
    kinds: dict[str, dict[str, Any]] | None = None,
) -> BuildReport:
    """Build a bundle for every (target, precision); see ``edgeopt build --help``.  ``accept``: the accuracy
    policy's gate file (``--accept``; None: the gate's defaults) that every check and INT8 search judges by.

    ``batch`` (``build --batch B``, whose ``shapes`` carry B as every input's leading dimension): the data are
    read as single samples and packed B distinct samples to a feed (``calib.pack``), the checks count each
    distinct sample once; ``kinds``: the output kinds of the batch-1 build, carried to this one."""
    from edgeopt import calib as calibmod
    from edgeopt import model as modelmod
    from edgeopt.policy import accept as policy
    from edgeopt.targets.registry import get_backend, resolve_targets

    t_start = time.perf_counter()
    specs = resolve_targets(targets, config)
    auto: set[tuple[str, str]] = set()
    plans, skipped = plan_precisions(specs, precisions, config, auto=auto)
    for sk in skipped:
        progress(f"skipping {sk['target']} {sk['precision']}: {sk['reason']}")
    pre = calibmod.Preprocess.parse(preprocess)
    accept_map = policy.mapping_of(accept)  # a bad gate file: exit 2 before anything is built
    options = dict(options or {})
    check_options(plans, options)
    calibmod.check_source(calib, (n_calib, n_val or 1))  # before the cache lookup: a typo must not hit a cached bundle
    info = modelmod.inspect(model)
    static = modelmod.static_input_shapes(info, shapes or {})
    from edgeopt import shapes as shapesmod  # issue 42: a range/buckets in --shape (VarShape)

    if shapesmod.has_auto(static):  # lo..hi|auto: buckets from the --calib data's own lengths, before anything
        spec = [{"name": t.name, "shape": list(static[t.name]), "dtype": t.dtype,
                 "variable": shapesmod.spec_json(static[t.name])} for t in info.inputs]
        lengths_of = shapesmod.lengths_from_data(calib, spec, lambda c, i: calibmod.load_data(
            c, i, pre, n_calib, n_val, seed=options.get("seed", 0), split=options.get("split")))
        static, chosen = shapesmod.resolve_auto(static, lengths_of)
        for axis, why in chosen.items():
            progress(f"buckets for {axis} from {why['lengths']} samples' own lengths: {why['buckets']} (padding "
                     f"waste {why.get('padding_waste', 0):.0%} over the mix, cap {why['cap']:.0%})")
    from edgeopt.targets.base import shape_form_asked

    if shape_form_asked(options) == "buckets":  # a file per bucket needs buckets: said before anything is written
        ranges = [f"{n}[{v['axis']}]" for n, vs in shapesmod.describe(static).items() for v in vs if "range" in v]
        if ranges:
            raise UsageError(f"--option shape_form=buckets needs buckets on every variable axis; {', '.join(ranges)} "
                             "is a range", hint="declare buckets, e.g. --shape NAME:1x16|32|64 (or lo..hi|auto)")
    out = Path(out)
    _writable(out)
    sweep_work_dirs(out, progress)
    progress(f"model {info.name}: opset {info.opset}, {len(info.nodes)} nodes, inputs "
             + ", ".join(f"{n}{static[n]}" for n in static))

    non_tensor = non_tensor_outputs(model)  # skl2onnx's ZipMap: a sequence of maps, which only ORT runs
    variable = shapesmod.describe(static)
    io = io_spec(info, static, non_tensor, variable)
    unknown_ints = _integer_ranges(model, io, calib)
    data_fp = calibmod.fingerprint(calib, pre, static, (n_calib, n_val), options.get("seed", 0),
                                   options.get("split"))
    results: list[TargetResult] = []
    todo: list[tuple[Any, str, str, Path]] = []
    # a model where ONNX Runtime may differ from the spec: its reference may be the spec's (spec_check)
    spec_rev = {"spec_check": spec_check.REV} if (spec_check.may_deviate(info.op_histogram)
                                                  and spec_check.has_suspects(model)) else {}
    for spec, prec in plans:
        backend = get_backend(spec.backend)
        res = TargetResult(spec.name, prec, spec.backend, "pending")
        results.append(res)
        why = backend.available()
        if why:
            res.status, res.error = "unavailable", why
            continue
        bad = backend.unsupported_nodes(info, spec.as_dict())
        if bad:
            res.status = "unsupported"
            why = backend.unsupported_why(spec.as_dict(), bad)
            hint = ("\n  hint: " + "".join(f"{_non_tensor_hint(w)} (output {n!r} is {w}); "
                                          for n, w in list(non_tensor.items())[:1]
                                          if all("ZipMap" in op for op, _ in bad))  # re-export fixes it alone
                    + _unsupported_hint(info, spec.name, config))
            listed = ", ".join(f"{op} ({name})" for op, name in bad)
            head = f"{len(bad)} unsupported node(s)" + (f" ({why})" if why else "") + ": "
            if len(bad) > GROUP_NODES_ABOVE:  # by op type first, the hint next, every node last
                counts: dict[str, int] = {}
                for op, _ in bad:
                    counts[op] = counts.get(op, 0) + 1
                res.error = (head + ", ".join(f"{op} ×{k}" for op, k in counts.items()) + hint
                             + "\n  nodes: " + listed)
            else:
                res.error = head + listed + hint
            continue
        key = _key({"model": info.sha256, "name": info.name, "target": spec.as_dict(), "precision": prec, "shapes": static,
                    "data": data_fp, "options": backend_options(backend, options), "allow_mismatch": allow_mismatch,
                    "toolchain": backend.toolchain(), "edgeopt": __version__, **spec_rev,
                    "policy": policy.REV, **({"accept": accept_map} if accept_map else {}),
                    **({"batch": {"size": batch, "data": BATCH_DATA_REV}} if batch > 1 else {}),
                    **({"kinds": kinds} if kinds else {}),
                    **({"variable": {"inputs": variable, "rev": shapesmod.REV}} if variable else {})})
        final = out / info.name / f"{spec.name}-{prec}"
        if not force and _bundle_key(final) == key:
            res.status, res.bundle, res.time_s = "up-to-date", str(final), 0.0
            res.manifest = json.loads((final / "manifest.json").read_text())
            res.check = _check_summary(res.manifest)
            continue
        cached = cache_dir() / key[:2] / key
        if not force and _bundle_key(cached) == key:
            _install(cached, final, copy=True)
            res.status, res.bundle, res.time_s = "cached", str(final), 0.0
            res.manifest = json.loads((final / "manifest.json").read_text())
            res.check = _check_summary(res.manifest)
            continue
        failed = None if force else _cached_failure(key)
        if failed:
            res.status, res.time_s, res.manifest = failed["status"], 0.0, failed.get("manifest")
            res.error, res.refused = f"{CACHED_FAILURE} {failed['error']}", True
            res.check = f"{failed['check']} {CACHED_FAILURE}" if failed.get("check") else ""
            progress(f"{spec.name} {prec}: {res.error.splitlines()[0]}")
            continue
        todo.append((res, spec, key, final))
    if non_tensor:
        todo = _refuse_non_tensor(non_tensor, todo, bool(io["outputs"]))
    if todo and cluster.ACTIVE is not None:  # --scheduler: a job no worker can build is refused before preparing
        todo = cluster.ACTIVE.refuse(todo)

    warnings: list[str] = []
    if todo and unknown_ints:  # only when something is to be built (a cached or unsupported target needs no data)
        raise unknown_ints
    if todo:
        # absolute: converters may run in child processes with another working directory
        work = Path(tempfile.mkdtemp(prefix=".edgeopt-work-", dir=out)).resolve()
        (work / "owner.pid").write_text(str(os.getpid()))
        try:
            # a model newer than a runtime on the way reads (onnx's default opset 24): converted down when exact
            convert = modelmod.conversion_target(info.opset, info.ir_version,
                                                 [(spec.backend, spec.as_dict()) for _, spec, _, _ in todo])
            data_source = _prepare(work, model, info, static, io, calib, pre, n_calib, n_val, options, progress,
                                   convert, batch)
            if non_tensor:
                data_source["prepare_warnings"] = [_non_tensor_warning(name, what) for name, what in non_tensor.items()]
            from edgeopt.targets.support_rules import reference_doubts

            for d in reference_doubts(model):  # a check that passes against this reference may still be off the spec
                data_source.setdefault("prepare_warnings", []).append(
                    f"the FP32 reference every check compares with may be off the ONNX spec at node {d['node']!r} "
                    f"({d['op']}, {d['feature']}): {d['why']}")
            for w in ([data_source["warning"]] if data_source.get("warning") else []) + data_source.get(
                    "prepare_warnings", []):
                warnings.append(w)
                progress("WARNING: " + w)
            jobs_list = []
            for res, spec, key, final in todo:
                job = {
                    "model_name": info.name, "model_path": str(Path(model).resolve()), "model_sha256": info.sha256,
                    "prepared_path": str(work / "prepared.onnx"), "target": spec.as_dict(), "precision": res.precision,
                    "bundle_dir": str(work / f"{spec.name}-{res.precision}"), "io": io,
                    "calib_path": str(work / "calib.npz"), "validation_path": str(work / "validation.npz"),
                    "reference_path": str(work / "reference.npz"), "data_source": data_source,
                    "options": {**options, "allow_mismatch": allow_mismatch}, "cache_key": key,
                    "accept": accept_map, "carried_kinds": kinds or None,
                    **({"variable": variable} if variable else {}),
                }
                jobs_list.append((res, job, final))
            pool = ThreadPoolExecutor(max_workers=max(1, jobs))
            try:
                list(pool.map(lambda a: _run_job(*a, work=work, timeout=timeout, allow_mismatch=allow_mismatch,
                                                 progress=progress, force=force), jobs_list))
            except BaseException:  # Ctrl-C or SIGTERM: stop the workers now, not when they finish
                _stop_workers()
                pool.shutdown(wait=False, cancel_futures=True)
                raise
            pool.shutdown()
        finally:
            shutil.rmtree(work, ignore_errors=True)
    for r in results:  # bundles taken from the cache carry their warnings too
        for w in (r.manifest or {}).get("warnings", []):
            if w not in warnings:
                warnings.append(w)
    results = _auto_fallback(results, auto, specs, plans, dict(
        model=model, shapes=shapes, calib=calib, preprocess=preprocess, out=out, jobs=jobs, force=force,
        allow_mismatch=allow_mismatch, config=config, options=options, timeout=timeout, n_calib=n_calib,
        n_val=n_val, progress=progress, accept=accept, batch=batch, kinds=kinds), warnings)
    return BuildReport(str(model), str(out), results, warnings, time.perf_counter() - t_start, skipped)


def io_spec(info: Any, static: dict[str, list[int]], non_tensor: dict[str, str],
            variable: dict[str, list[dict[str, Any]]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """The jobs' IO spec: every input at its static shape (``variable``: its range/buckets axes), every tensor
    output (``non_tensor`` ones left out; their shapes come from the FP32 reference in ``_prepare``)."""
    variable = variable or {}
    return {"inputs": [{"name": t.name, "shape": list(static[t.name]), "dtype": t.dtype,
                        "layout": _layout(static[t.name]),
                        **({"variable": variable[t.name]} if t.name in variable else {})}
                       for t in info.inputs],
            "outputs": [{"name": t.name, "shape": None, "dtype": t.dtype} for t in info.outputs
                        if t.name not in non_tensor]}


def infer_output_kinds(model: str | os.PathLike, shapes: dict[str, list[int]] | None = None, calib: str | None = None,
                       preprocess: str | None = None, options: dict[str, Any] | None = None,
                       n_val: int = 16) -> dict[str, Any]:
    """What each output means, as a build of ``model`` would judge it (``inspect``): the model prepared as a
    build prepares it (static shapes, the ``calib`` data split as ``--split`` says, FP32 reference outputs on
    the validation samples) and ``targets.base.output_kinds`` -- the one function every build records in its
    manifest -- run on it; ``options["output_kind"]`` (``--output-kind``/``--decision``) overrides as in a
    build.  -> ``{"kinds": {output: kind}, "data": describe(source)}``; ``{"kinds": None, "why": ...}`` when
    no reference can be made here (a dynamic axis with no --shape, a model ONNX Runtime cannot run)."""
    from edgeopt import calib as calibmod
    from edgeopt import model as modelmod
    from edgeopt.errors import ModelError, UsageError
    from edgeopt.targets.base import BuildJob, output_kinds

    calibmod.check_source(calib, (1, n_val))  # a typo in --calib: the build's own one line
    info = modelmod.inspect(model)
    try:
        static = modelmod.static_input_shapes(info, shapes or {})
    except UsageError as exc:
        if shapes:
            raise  # a --shape naming no input: the build's own one line
        return {"kinds": None, "why": f"{str(exc).splitlines()[0]}: give --shape to see the output kinds"}
    static = {n: list(v) for n, v in static.items()}  # a range or buckets: judged at the top, as padded
    io = io_spec(info, static, non_tensor_outputs(model))
    options = dict(options or {})
    with tempfile.TemporaryDirectory(prefix="edgeopt-kinds-") as tmp:
        work = Path(tmp)
        try:
            source = _prepare(work, model, info, static, io, calib, calibmod.Preprocess.parse(preprocess), 1, n_val,
                              options, lambda s: None)
        except ModelError as exc:  # no FP32 reference here: nothing to infer a kind from
            return {"kinds": None, "why": str(exc).splitlines()[0]}
        job = BuildJob(model_name=info.name, model_path=str(Path(model).resolve()), model_sha256=info.sha256,
                       prepared_path=str(work / "prepared.onnx"), target={}, precision="fp32", bundle_dir=str(work),
                       io=io, calib_path=str(work / "calib.npz"), validation_path=str(work / "validation.npz"),
                       reference_path=str(work / "reference.npz"), data_source=source, options=options)
        kinds = output_kinds(job)
    return {"kinds": kinds, "data": calibmod.describe(source), "samples": n_val,
            **({"warning": source["warning"]} if source.get("warning") else {})}


def non_tensor_outputs(model: str | os.PathLike) -> dict[str, str]:
    """Graph outputs that are not tensors, name -> what they are ("a sequence of maps (int64 -> float)"):
    skl2onnx's default export ends in a ZipMap whose ``output_probability`` is a list of dicts, which
    ONNX Runtime runs and no other backend takes, and which no tensor metric can judge."""
    import onnx

    def noun(t) -> str:  # without an article: "map (int64 -> float32)", "sequence of maps (...)"
        kind = t.WhichOneof("value")
        if kind == "tensor_type":
            return f"tensor ({onnx.helper.tensor_dtype_to_np_dtype(t.tensor_type.elem_type).name})"
        if kind == "sequence_type":
            first, _, rest = noun(t.sequence_type.elem_type).partition(" ")
            return f"sequence of {first}s" + (f" {rest}" if rest else "")
        if kind == "map_type":
            val = t.map_type.value_type
            inner = (onnx.helper.tensor_dtype_to_np_dtype(val.tensor_type.elem_type).name
                     if val.WhichOneof("value") == "tensor_type" else noun(val))
            return f"map ({onnx.helper.tensor_dtype_to_np_dtype(t.map_type.key_type).name} -> {inner})"
        if kind == "optional_type":
            return "optional " + noun(t.optional_type.elem_type)
        return (kind or "value of no type").replace("_type", "")

    def what(t) -> str:
        n = noun(t)
        return ("an " if n[0] in "aeiou" else "a ") + n

    try:
        graph = onnx.load(str(model), load_external_data=False).graph
    except Exception:  # noqa: BLE001 - model.inspect has read it already; a reader error is reported there
        return {}
    return {o.name: what(o.type) for o in graph.output
            if o.type.WhichOneof("value") not in ("tensor_type", "sparse_tensor_type")}


def _non_tensor_hint(what: str) -> str:
    if "map" in what:  # skl2onnx's ZipMap
        return "re-export with zipmap=False (skl2onnx: to_onnx(..., options={'zipmap': False})) for a probability tensor"
    return "re-export the model with tensor outputs"


def _non_tensor_warning(name: str, what: str) -> str:
    return (f"output {name!r} is {what}, not a tensor: the cpu bundle returns it as ONNX Runtime does, but "
            f"the check judges only the tensor outputs and other targets refuse the model; {_non_tensor_hint(what)}")


def _refuse_non_tensor(non_tensor: dict[str, str], todo: list, any_tensor: bool) -> list:
    """Only ONNX Runtime runs a model with a non-tensor output (and only when a tensor output is left to
    check): every other (target, precision) still to build is refused in one line (and a hint) instead."""
    keep = []
    for res, spec, key, final in todo:
        if spec.backend == "onnxruntime" and any_tensor:
            keep.append((res, spec, key, final))
            continue
        res.status = "unsupported"
        res.error = ("; ".join(f"output {n!r} is {w}, not a tensor" + (" (skl2onnx's ZipMap)" if "map" in w else "")
                               for n, w in non_tensor.items())
                     + ("; only ONNX Runtime (cpu) runs such an output" if any_tensor else
                        "; no tensor output is left to check")
                     + f"\n  hint: {_non_tensor_hint(next(iter(non_tensor.values())))}")
    return keep


def fallback_precision(spec: Any, precision: str) -> str | None:
    """The precision ``auto`` falls back to when its first choice is refused on accuracy: INT8 -> FP16 on
    an accelerator that offers it (a CPU runs FP16 weights in FP32 anyway) -> FP32; None past FP32."""
    cpu = spec.backend == "onnxruntime" or str(spec.profile.get("device", "")).upper() == "CPU"
    order = [p for p in ("fp8", "int8", "fp16", "fp32") if p in spec.precisions and not (cpu and p == "fp16")]
    later = order[order.index(precision) + 1:] if precision in order else []
    return later[0] if later else None


def _auto_fallback(results: list[TargetResult], auto: set[tuple[str, str]], specs: list, plans: list,
                   args: dict[str, Any], warnings: list[str]) -> list[TargetResult]:
    """``auto`` means the most efficient precision the accuracy policy accepts: a choice refused on accuracy
    (the policy refused the host check, the INT8 search found no variant it accepts, FP16 overflowed, an
    already-quantized model) is built at the next wider precision -- int8 -> fp16 -> fp32, as far as it
    takes -- and the result says what was refused and why (the metric, its value, the threshold and the
    ``edgeopt debug`` command, from the refusal's own message). A crash, a hang, or a conversion that is
    wrong in float already is not retried at another precision."""
    by_name = {s.name: s for s in specs}
    planned = {(s.name, p) for s, p in plans}
    retry: dict[str, tuple[TargetResult, str]] = {}
    for res in results:
        if (res.ok or not res.refused or (res.target, res.precision) not in auto
                or "conversion itself is wrong" in (res.error or "")):
            continue
        fb = fallback_precision(by_name[res.target], res.precision)
        if fb and (res.target, fb) not in planned:
            retry[res.target] = (res, fb)
    if not retry:
        return results
    progress = args["progress"]
    for name, (res, fb) in retry.items():
        first = (res.error or res.check or "").splitlines()[0].rstrip(": ") if (res.error or res.check) else ""
        progress(f"{name} {res.precision} (auto) refused; building {fb} instead -- {first[:400]}")
    inner = dict(args)
    again = build(inner.pop("model"), list(retry), ",".join(f"{n}={fb}" for n, (_, fb) in retry.items()), **inner)
    chain = {(n, fb) for n, (_, fb) in retry.items()}
    more = _auto_fallback(again.results, chain, specs, plans + [(by_name[n], fb) for n, (_, fb) in retry.items()],
                          args, warnings)  # the fallback refused too: the next wider precision
    got = {r.target: r for r in more}
    out = []
    for res in results:
        new = got.get(res.target) if res.target in retry and retry[res.target][0] is res else None
        if new is None:
            out.append(res)
            continue
        first = (res.error or "").splitlines()[0].rstrip(": ") if res.error else res.check
        chain_from = [{"precision": res.precision, "error": first}] + list((new.fallback_from or {}).get("chain") or (
            [{"precision": new.fallback_from["precision"], "error": new.fallback_from["error"]}]
            if new.fallback_from else []))
        new.fallback_from = {"precision": res.precision, "error": first, "chain": chain_from}
        warnings.append(f"{res.target}: auto chose {res.precision}, which was refused ({first[:300]}); "
                        f"{'built' if new.ok else 'tried'} {new.precision} instead")
        out.append(new)
    warnings.extend(w for w in again.warnings if w not in warnings)
    return out


_WORKERS: set[subprocess.Popen] = set()  # converter processes running now (killed on Ctrl-C/SIGTERM)


def _stop_workers() -> None:
    for proc in list(_WORKERS):
        try:
            proc.kill()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass


def plan_precisions(specs: list, precisions: str | list[str] | None, config: Any = None,
                    auto: set[tuple[str, str]] | None = None) -> tuple[list[tuple[Any, str]], list[dict]]:
    """The (target, precision) pairs to build, and the pairs skipped because a target does not offer them.

    ``precisions``: ``"fp32,int8"`` for every target (each builds the subset it offers; an error only when
    no target offers a requested precision), or per target ``"cpu=fp32,int8,intel-cpu=int8"`` (a token
    with ``=`` starts a target's list; a target named there must offer everything it is given). A list
    of such strings is joined (repeated ``--precision``). ``auto``, when given, collects the (target,
    precision) pairs that ``auto`` chose (the build falls back from them when they are refused).
    """
    from edgeopt.targets.registry import resolve_precisions, resolve_target

    if isinstance(precisions, (list, tuple)):
        text = ",".join(str(p) for p in precisions)
    else:
        text = precisions or "auto"
    default: list[str] = []
    per: dict[str, list[str]] = {}
    current: list[str] = default
    for tok in (t.strip() for t in text.replace(";", ",").replace(" ", ",").split(",")):
        if not tok:
            continue
        if "=" in tok:
            name, _, tok = tok.partition("=")
            spec = resolve_target(name, config)
            if spec.name not in {s.name for s in specs}:
                raise UsageError(f"--precision names target {name!r}, which is not in --targets",
                                 hint=f"--targets has {', '.join(s.name for s in specs)}")
            current = per.setdefault(spec.name, [])
        if tok:
            current.append(tok)
    default = default or ["auto"]
    plans: list[tuple[Any, str]] = []
    skipped: list[dict[str, str]] = []
    offered_by_some: set[str] = set()
    for spec in specs:
        if spec.name in per:
            asked = per[spec.name] or ["auto"]
            plans += [(spec, p) for p in resolve_precisions(spec, asked)]
            if auto is not None and any(p.strip().lower() == "auto" for p in asked):
                auto.add((spec.name, spec.default_precision))
            continue
        for p in default:
            if auto is not None and p.strip().lower() == "auto":
                auto.add((spec.name, spec.default_precision))
            try:
                got = resolve_precisions(spec, [p])
            except UsageError:
                if p.strip().lower() not in _known_precisions():
                    raise
                skipped.append({"target": spec.name, "precision": p.strip().lower(),
                                "reason": f"{spec.name} offers {', '.join(spec.precisions)}"})
                continue
            offered_by_some.add(p.strip().lower())
            plans += [(spec, q) for q in got if (spec, q) not in plans]
    unoffered = [p.strip().lower() for p in default if p.strip().lower() != "auto"
                 and p.strip().lower() not in offered_by_some and any(s.name not in per for s in specs)]
    if unoffered:
        raise UsageError(f"no target in --targets offers {', '.join(dict.fromkeys(unoffered))}",
                         hint="; ".join(f"{s.name} offers {', '.join(s.precisions)}" for s in specs))
    if not plans:
        raise UsageError("nothing to build: no target offers the precisions asked for")
    return plans, skipped


def _known_precisions() -> tuple[str, ...]:
    from edgeopt.targets.registry import PRECISIONS

    return tuple(PRECISIONS)


def _unsupported_hint(info: Any, target: str, config: str | None) -> str:
    """What to do about a target that cannot take the model: the float model (for an already-quantized
    one), or the targets that take every node."""
    from edgeopt.targets.registry import all_targets, get_backend

    if info.quantized:
        ops = ", ".join(sorted(info.quantized))
        return (f"the model is already quantized ({ops}): {target} needs the float model it was made from; "
                "give that one, and edgeopt quantizes it for each target (--precision int8)")
    takes = [s.name for s in all_targets(config).values()
             if s.name != target and not get_backend(s.backend).unsupported_nodes(info, s.as_dict())]
    return ((f"targets that take every node: {', '.join(takes)}; " if takes else "")
            + "drop this target, or re-export the model without these ops (`edgeopt inspect MODEL` has the matrix)")


def backend_options(backend: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The options one backend reads (the cache key holds only these: a mobile-only option does not
    rebuild the cpu bundle). A backend that does not list its keys gets them all."""
    from edgeopt.targets.base import COMMON_OPTIONS

    keys = backend.known_options()
    if keys is None:
        return dict(options)
    return {k: v for k, v in options.items() if k in keys or k in COMMON_OPTIONS}


def check_options(plans: list[tuple[Any, str]], options: dict[str, Any]) -> None:
    """Refuse bad ``--option`` values before anything is built (UsageError: exit 2).

    Options are build-wide: a key another backend reads is ignored by the rest (so one set of
    options serves every target), and only a key that no backend reads is refused -- checked when
    every backend lists its keys (``Target.known_options``).  Then each selected (target, precision)
    whose backend can build here checks the values of its own keys (``Target.check_options``).
    """
    from edgeopt.targets.base import COMMON_OPTIONS, if_as_where_asked, shape_form_asked
    from edgeopt.targets.registry import BACKENDS, get_backend

    if_as_where_asked(options)  # a common option's value
    shape_form_asked(options)
    key_sets = [get_backend(name).known_options() for name in BACKENDS] if options else []
    if key_sets and all(k is not None for k in key_sets):
        known = set(COMMON_OPTIONS).union(*key_sets)
        unknown = sorted(set(options) - known)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(known), n=1, cutoff=0.75)
            raise UsageError(f"unknown --option {', '.join(unknown)}: no target reads it",
                             hint=(f"did you mean {close[0]}? " if close else "") + f"known: {', '.join(sorted(known))}")
    for spec, prec in plans:
        backend = get_backend(spec.backend)
        if backend.available() is None:
            backend.check_options(options, prec, spec.as_dict())


def _failure_path(key: str) -> Path:
    return cache_dir() / key[:2] / f"{key}.failed.json"


def _cached_failure(key: str) -> dict[str, Any] | None:
    """The recorded outcome of a build with this key that ran to the end and failed its check."""
    try:
        rec = json.loads(_failure_path(key).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("cache_key") == key and rec.get("status") else None


def _remember_failure(key: str, res: TargetResult, progress: Callable[[str], None]) -> None:
    """Cache the outcome (not the bundle) of a build that ran to the end and failed its check."""
    path = _failure_path(key)
    rec = {"cache_key": key, "status": res.status, "error": res.error, "check": res.check, "manifest": res.manifest}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        tmp.write_text(json.dumps(rec, default=str))
        os.replace(tmp, path)
    except OSError as exc:
        progress(f"{res.target} {res.precision}: could not write the cache ({exc}); continuing")


def _layout(shape: list[int]) -> str | None:
    if len(shape) == 4 and shape[1] in (1, 3) and shape[2] > 4 and shape[3] > 4:
        return "NCHW"
    return None


def _bundle_key(path: Path) -> str | None:
    try:
        return json.loads((path / "manifest.json").read_text())["build"]["cache_key"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _install(src: Path, final: Path, copy: bool) -> None:
    """Put a complete bundle at ``final`` atomically (temp sibling, then rename)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{threading.get_ident()}"
    if copy:
        shutil.copytree(src, tmp, copy_function=_hardlink_or_copy)
    else:
        os.replace(src, tmp)
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}-{threading.get_ident()}"
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _hardlink_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _prepare(work: Path, model, info, static, io, calib, pre, n_calib, n_val, options, progress,
             convert: tuple[int | None, int | None] | None = None, batch: int = 1) -> dict[str, Any]:
    """Static-shape model, calibration/validation data and FP32 reference outputs, shared by all jobs.
    ``convert``: the (opset, IR) to take the model down to (``model.conversion_target``), kept only when
    onnx.reference gives identical outputs before and after (``model.verify_conversion``).  ``batch`` > 1:
    the data of the batch-1 build, B distinct samples to a feed (``_batched_data``)."""
    import onnx

    from edgeopt import calib as calibmod
    from edgeopt import model as modelmod

    progress("preparing: static shapes, data, FP32 reference")
    original = modelmod.load(model)
    unconverted = None
    if convert:
        unconverted, original = original, modelmod.down_convert(original, *convert)
    m = modelmod.make_static(original, static)
    notes = []
    if dropped := modelmod.drop_initializer_inputs(m):  # IR 3: ORT's saved graph asked for them as feeds
        notes.append(f"{dropped} initializer(s) listed as graph inputs too (IR {m.ir_version}, as exports before IR 4 "
                     "wrote them) taken off the inputs, the model stamped IR 4")
        m.ir_version = 4
    big = m.ByteSize() > 1_900_000_000
    onnx.save(m, str(work / "prepared.onnx"), save_as_external_data=big)
    lowered = _fit_ir_version(work / "prepared.onnx", [m, original], big)
    if lowered:
        notes.append(lowered)
        progress(f"note: {lowered}")
    if not _ort_loads(work / "prepared.onnx"):
        # Fixing the input dims can break shape inference inside control flow (If branches whose
        # untaken side reshapes differently); then keep the model's own dims and feed static data.
        onnx.save(original, str(work / "prepared.onnx"), save_as_external_data=original.ByteSize() > 1_900_000_000)
        notes.append("input dims left dynamic in prepared.onnx: fixing them broke ONNX Runtime's shape "
                     "inference; the bundle's data has the static shapes")
    err = _ort_error(work / "prepared.onnx")
    engine = "onnxruntime"
    if err:
        from edgeopt.errors import ModelError

        spec_err = _spec_reference_error(work / "prepared.onnx")
        if spec_err:
            raise ModelError(f"ONNX Runtime cannot load the model, so no FP32 reference can be made: {err} "
                             f"(nor can onnx.reference: {spec_err})",
                             hint="`edgeopt inspect MODEL` lists what each target cannot take (ops in custom "
                             "domains, attributes, opset); re-export without them")
        engine = "onnx.reference"  # issue 32: the spec's own implementation, slower but right
        notes.append(f"ONNX Runtime cannot load the model ({err}): the FP32 reference is computed by "
                     "onnx.reference.ReferenceEvaluator, the ONNX spec's implementation (validation.reference_engine)")
        progress(f"note: {notes[-1]}")
    names = [t["name"] for t in io["inputs"]]
    seed, split = options.get("seed", 0), options.get("split")
    data = (_batched_data(calib, io["inputs"], pre, n_calib, n_val, seed, batch, split) if batch > 1
            else calibmod.load_data(calib, io["inputs"], pre, n_calib, n_val, seed=seed, split=split))
    progress(calibmod.describe(data.source))
    for w in ([data.source["note"]] if data.source.get("note") else []) + data.source.get("data_warnings", []):
        progress(f"WARNING: data: {w}")
    conversion = None
    if unconverted is not None:
        conversion = modelmod.verify_conversion(unconverted, original, data.validation)
        up = conversion["to_opset"] > conversion["from_opset"]
        notes.append(f"converted from ONNX opset {conversion['from_opset']} (IR {conversion['from_ir']}) to opset "
                     f"{conversion['to_opset']} (IR {conversion['to_ir']}), "
                     + ("the oldest ONNX Runtime implements" if up else "the newest every runtime on the way reads")
                     + f", with onnx.version_converter; verified: {conversion['verified']}")
        progress(f"note: {notes[-1]}")
    calibmod.save_stacked(work / "calib.npz", data.calibration, names, "in")
    from edgeopt.shapes import save_calib_shapes

    save_calib_shapes(work / "calib.npz", data.calibration)  # issue 42: INT8 calibrates at the own lengths
    calibmod.save_stacked(work / "validation.npz", data.validation, names, "in")
    refs = reference_outputs(work / "prepared.onnx", data.validation, engine)
    deviations = []
    if engine == "onnxruntime" and data.validation and spec_check.may_deviate(info.op_histogram):
        deviations = spec_check.deviations(work / "prepared.onnx", data.validation[0])
        if deviations:
            engine = "onnx.reference"
            notes.append(spec_check.describe(deviations))
            progress(f"note: {notes[-1]}")
            refs = reference_outputs(work / "prepared.onnx", data.validation, engine)
    for o in io["outputs"]:
        o["shape"] = list(refs[0][o["name"]].shape)
    out_names = [o["name"] for o in io["outputs"]]
    calibmod.save_stacked(work / "reference.npz", refs, out_names, "out")
    return {**data.source, **({"prepare_notes": notes} if notes else {}),
            **({"converted_from_opset": conversion["from_opset"], "opset_conversion": conversion} if conversion else {}),
            **({"spec_deviations": deviations} if deviations else {}),
            **({"reference_engine": engine} if engine != "onnxruntime" else {})}


# In the cache key of a `build --batch B` bundle: how its data are laid out (rev "distinct": B distinct
# samples to a feed, counted once; before, one sample repeated B times was B samples).
BATCH_DATA_REV = "distinct-1"


def _batched_data(calib, inputs, pre, n_calib, n_val, seed, batch: int, split: str | None = None):
    """The calibration and validation data of ``build --batch B``: the batch-1 build's samples (the same
    distinct samples at every batch size of a curve), packed B to a feed (``calib.pack``; the last feed
    filled up with repeats that count once: ``validation.source.batch`` and ``validation_samples`` say how,
    ``edgeopt_agent.compare.batch_rows`` reads them). Arrays given already batched (``[N, B, ...]``) are
    split into their rows first."""
    from edgeopt import calib as calibmod
    from edgeopt.errors import CalibrationError

    try:
        data = calibmod.load_data(calib, calibmod.one_sample_inputs(inputs), pre, n_calib, n_val, seed=seed,
                                  split=split)
    except CalibrationError:
        if not calib:
            raise
        data = calibmod.load_data(calib, inputs, pre, n_calib, n_val, seed=seed, split=split)  # [N, B, ...]
        data.calibration = calibmod.split_rows(data.calibration, batch)
        data.validation = calibmod.split_rows(data.validation, batch)
    n_cal, n_v = len(data.calibration), len(data.validation)
    data.calibration = calibmod.pack(data.calibration, batch)
    data.validation = calibmod.pack(data.validation, batch)
    data.source.update({"batch": batch, "calibration_samples": n_cal, "validation_samples": n_v,
                        "validation_batches": len(data.validation),
                        "validation_repeats": len(data.validation) * batch - n_v})
    return data


def _spec_reference_error(path: Path) -> str | None:
    """None when onnx.reference.ReferenceEvaluator can take the model, else the first line of why not."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    try:
        ReferenceEvaluator(onnx.load(str(path)))
        return None
    except Exception as exc:  # noqa: BLE001 - any refusal: the caller says both runtimes' reasons
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def _integer_ranges(model, io: dict[str, Any], calib: str | None) -> Exception | None:
    """Integer inputs get the value range the model implies (random data stays inside it); without
    --calib, an integer input whose range the model does not tell is an error, returned for the caller
    to raise before any work (only when there is work: an unsupported target still lists its nodes)."""
    import numpy as np

    from edgeopt import model as modelmod
    from edgeopt.errors import CalibrationError

    ints = [t for t in io["inputs"] if np.dtype(t["dtype"]).kind in "iu"]
    if not ints:
        return None
    ranges = modelmod.integer_input_ranges(model, [t["name"] for t in ints])
    for t in ints:
        if ranges.get(t["name"]):
            t["range"] = list(ranges[t["name"]])
    unknown = [t for t in ints if not ranges.get(t["name"])]
    if unknown and calib is None:
        return CalibrationError(
            "integer input(s) " + ", ".join(f"{t['name']!r} ({t['dtype']})" for t in unknown)
            + ": the model does not tell their valid values (they are not token ids into a table), so random "
            "data could be out of range or meaningless",
            hint="pass --calib with real inputs: a .npz keyed by input name (samples on axis 0)")
    return None


def _ort_error(path: Path) -> str | None:
    """None when ONNX Runtime loads the model, else the first line of its complaint."""
    import re

    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.log_severity_level = 3
    try:
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        return None
    except Exception as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)


def _ort_loads(path: Path) -> bool:
    return _ort_error(path) is None


def _fit_ir_version(path: Path, models: list, big: bool) -> str | None:
    """A model newer than this ONNX Runtime reads (the pinned onnx writes IR 12 by default, ORT 1.23
    reads <= 11) is saved at the newest IR it reads; the ops and opsets are unchanged. Returns a note."""
    import re

    import onnx

    err = _ort_error(path) or ""
    m = re.search(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)", err)
    if not m:
        return None
    have, top = int(m.group(1)), int(m.group(2))
    for model in models:
        model.ir_version = top
    onnx.save(models[0], str(path), save_as_external_data=big)
    return f"IR version {have} saved as {top}, the newest this ONNX Runtime reads (ops and opsets unchanged)"


def reference_outputs(model_path: Path, feeds: list[dict[str, Any]], engine: str = "onnxruntime"
                      ) -> list[dict[str, Any]]:
    """ONNX Runtime FP32 outputs with graph optimisations off: the reference every artifact is held to;
    ``engine="onnx.reference"``: the spec's ReferenceEvaluator (a model ONNX Runtime cannot load)."""
    import onnxruntime as ort

    from edgeopt.errors import CalibrationError

    if engine == "onnx.reference":
        import onnx
        from onnx.reference import ReferenceEvaluator

        m = onnx.load(str(model_path))
        ev = ReferenceEvaluator(m)
        names = [o.name for o in m.graph.output]
        outs = []
        for i, feed in enumerate(feeds):
            try:
                outs.append(dict(zip(names, ev.run(None, feed))))
            except Exception as exc:
                raise CalibrationError(f"the reference run (onnx.reference) failed on validation sample {i}: "
                                       f"{(str(exc).splitlines() or [type(exc).__name__])[0]}") from None
        return outs
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    outs = []
    for i, feed in enumerate(feeds):
        try:
            values = sess.run(names, feed)
        except Exception as exc:
            raise CalibrationError(f"the reference run failed on validation sample {i}: "
                                   f"{str(exc).splitlines()[0]}") from None
        outs.append(dict(zip(names, values)))
    return outs


@contextlib.contextmanager
def _key_lock(key: str, tag: str, progress: Callable[[str], None]):
    """Hold the cache key's lock (``<cache>/<key[:2]>/<key>.lock``, flock: freed when a process dies).
    A second build of the same key waits here instead of doing the work twice; yields whether it waited."""
    import fcntl

    path = cache_dir() / key[:2] / f"{key}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:  # a read-only cache: no lock, build as before
        yield False
        return
    waited = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            waited = True
            progress(f"{tag}: another build of the same model/target/options is running; waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield waited
    finally:
        os.close(fd)


def _run_job(res: TargetResult, job: dict[str, Any], final: Path, work: Path, timeout: float,
             allow_mismatch: bool, progress: Callable[[str], None], force: bool = False) -> None:
    tag = f"{res.target} {res.precision}"
    key = job["cache_key"]
    with _key_lock(key, tag, progress) as waited:
        cached = cache_dir() / key[:2] / key
        if waited and not force and _bundle_key(cached) == key:  # the other build finished it: take its bundle
            _install(cached, final, copy=True)
            res.status, res.bundle, res.time_s = "cached", str(final), 0.0
            res.manifest = json.loads((final / "manifest.json").read_text())
            res.check = _check_summary(res.manifest)
            progress(f"{tag}: taken from the build that ran beside this one")
            return
        failed = None if force or not waited else _cached_failure(key)
        if failed:
            res.status, res.time_s, res.manifest = failed["status"], 0.0, failed.get("manifest")
            res.error, res.refused = f"{CACHED_FAILURE} {failed['error']}", True
            res.check = f"{failed['check']} {CACHED_FAILURE}" if failed.get("check") else ""
            return
        _build_job(res, job, final, work, timeout, allow_mismatch, progress, tag)


def _build_job(res: TargetResult, job: dict[str, Any], final: Path, work: Path, timeout: float,
               allow_mismatch: bool, progress: Callable[[str], None], tag: str) -> None:
    job_file = work / f"job-{res.target}-{res.precision}.json"
    result_file = work / f"result-{res.target}-{res.precision}.json"
    job_file.write_text(json.dumps(job))
    progress(f"{tag}: building ({res.backend})")
    t0 = time.perf_counter()
    start = cluster.ACTIVE.popen if cluster.ACTIVE is not None else subprocess.Popen  # --scheduler: on a worker
    proc = start([sys.executable, "-m", "edgeopt.worker", str(job_file), str(result_file)],
                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _WORKERS.add(proc)
    from edgeopt.worker import relay

    reader, tail = relay(proc.stderr, lambda line: progress(f"{tag}: {line}"))
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        res.status, res.error = "failed", f"converter hung (> {timeout:.0f}s) and was killed"
        progress(f"{tag}: {res.error}")
        return
    finally:
        reader.join(timeout=5)
        _WORKERS.discard(proc)
    res.time_s = time.perf_counter() - t0
    if proc.returncode in (-signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP):
        res.status, res.error = "failed", (f"interrupted ({signal.Signals(-proc.returncode).name}) after "
                                           f"{res.time_s:.0f}s: the build was stopped, not crashed")
        progress(f"{tag}: {res.error}")
        return
    oom = killed.sigkill_words(proc.returncode, "the build worker") if not result_file.exists() else None
    if oom:
        res.status, res.error = "failed", f"{oom[0]}; {oom[1]}"
        progress(f"{tag}: {res.error}")
        return
    if proc.returncode != 0 or not result_file.exists():
        sig = f" (signal {-proc.returncode})" if proc.returncode < 0 else ""
        last = next((t for t in reversed(tail) if t.strip()), "")
        res.status, res.error = "failed", f"converter crashed: exit code {proc.returncode}{sig}" + (
            f"; last output: {last[:300]}" if last else "")
        progress(f"{tag}: {res.error}")
        return
    result = json.loads(result_file.read_text())
    if not result["ok"]:
        res.status, res.error = "failed", result["error"]
        progress(f"{tag}: FAILED: {result['error'].splitlines()[0]}")
        if result.get("traceback"):
            res.error += "\n" + result["traceback"]
        elif (Path(job["bundle_dir"]) / CHECK_FAILED_MARK).is_file():  # CheckFailed: no variant passed
            res.refused = True
            try:
                cacheable = json.loads((Path(job["bundle_dir"]) / CHECK_FAILED_MARK).read_text()).get("cacheable", True)
            except (OSError, ValueError):
                cacheable = True
            if cacheable:
                _remember_failure(job["cache_key"], res, progress)
            else:
                progress(f"{tag}: not cached: a time budget cut the search short (--force is not needed to retry)")
        return
    manifest = result["manifest"]
    res.manifest = manifest
    res.check = _check_summary(manifest)
    hc = manifest.get("host_check") or {}
    passed = hc.get("passed") is not False
    if not passed and not allow_mismatch:
        res.status = "check-failed"
        res.error = ("host check failed: " + res.check + " (use --allow-mismatch to keep it)\n  hint: "
                     + with_debug_hint(spec_check.hint(job["data_source"]), debug_command(job["model_path"], res.target, res.precision, job["io"],
                                                           job["data_source"], job["options"])))
        progress(f"{tag}: {res.error.splitlines()[0]}")
        if "error" not in hc:  # the check ran and the numbers missed: cache that outcome (not a crash or hang)
            res.refused = True
            _remember_failure(job["cache_key"], res, progress)
        return
    bundle = Path(job["bundle_dir"])
    if passed:  # only faithful bundles are cached
        key = job["cache_key"]
        cached = cache_dir() / key[:2] / key
        try:
            _install(bundle, cached, copy=True)
        except OSError as exc:
            progress(f"{tag}: could not write the cache ({exc}); continuing")
        with contextlib.suppress(OSError):  # --force rebuilt what had failed
            _failure_path(key).unlink(missing_ok=True)
    _install(bundle, final, copy=False)
    res.status, res.bundle = "built", str(final)
    progress(f"{tag}: done in {res.time_s:.1f}s, host check {res.check}")

