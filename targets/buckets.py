"""One static artifact per bucket: the ``buckets`` form of a variable axis (issue 42).

Where a converter cannot take the variable axis free (onnx2tf on MiniLM's attention, on the OCR recogniser's
width), a model declared with buckets (``--shape input_ids:1x16|32|64|128``) is still served at each request's
bucket rather than padded to the top: the prepared model is made static at every bucket (``make_static`` of
``free_model``: the same two steps a build's preparation and the dynamic form take) and converted once per
bucket, each conversion an ordinary static build of its own job (the data cut or zero-padded to the bucket on
the variable axes, the FP32 reference run at that shape, the output kinds those of the whole model). The
files go into one bundle, ``bucket-<sizes>/<artifact>`` each, listed in ``runtime.buckets``; the agent's
``BucketRunner`` loads them all and runs each request by the file of its bucket.

Axes whose bucket lists are equal (``input_ids`` and ``attention_mask`` of one text) vary together: one file per
bucket, not per combination; otherwise every combination, at most ``MAX_FILES``.
"""

from __future__ import annotations

import dataclasses
import itertools
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeopt.errors import BuildFailed

MAX_FILES = 8  # a file per bucket: conversions and memory grow with the count


def combos(variable: dict[str, list[dict[str, Any]]]) -> list[dict[tuple[str, int], int]]:
    """The buckets to build, smallest first: ``[{(input, axis): size}]``, or BuildFailed (a range, too many)."""
    axes = [(name, int(v["axis"])) for name, vs in variable.items() for v in vs]
    lists = []
    for name, vs in variable.items():
        for v in vs:
            if "buckets" not in v:
                raise BuildFailed(f"the buckets form needs buckets on every variable axis; {name}[{v['axis']}] is a "
                                  f"range {v['range'][0]}..{v['range'][1]}",
                                  hint=f"declare buckets, e.g. --shape {name}:..x16|32|64 (or |auto)")
            lists.append(sorted(int(b) for b in v["buckets"]))
    if all(li == lists[0] for li in lists):
        sizes = [tuple(li[k] for li in lists) for k in range(len(lists[0]))]
    else:
        sizes = list(itertools.product(*lists))
    if len(sizes) > MAX_FILES:
        raise BuildFailed(f"the buckets form would make {len(sizes)} files (one per combination of "
                          f"{', '.join(f'{n}[{a}]' for n, a in axes)}); at most {MAX_FILES}",
                          hint="fewer buckets, or the same bucket list on axes that vary together")
    return [dict(zip(axes, s)) for s in sizes]


def tag(combo: dict[tuple[str, int], int]) -> str:
    """``bucket-32`` (one size for all axes) or ``bucket-32x96``: the folder of a bucket's file."""
    sizes = list(dict.fromkeys(combo.values()))
    return "bucket-" + "x".join(str(s) for s in sizes)


def _fit_stacked(a: Any, combo: dict[tuple[str, int], int], name: str) -> Any:
    """A stacked array (samples first) cut or zero-padded on ``name``'s variable axes to the bucket."""
    from edgeopt_agent import varlen

    shape = list(a.shape)
    for (n, ax), size in combo.items():
        if n == name:
            shape[ax + 1] = size
    return varlen.pad(varlen.crop(a, [min(x, y) for x, y in zip(a.shape, shape)]), shape)


def bucket_job(job: Any, combo: dict[tuple[str, int], int], work: Path, kinds: dict[str, Any]) -> Any:
    """The static job of one bucket: its model, data and FP32 reference in ``work``."""
    import numpy as np
    import onnx

    from edgeopt.model import make_static
    from edgeopt.pipeline import reference_outputs
    from edgeopt.shapes import free_model

    work.mkdir(parents=True, exist_ok=True)
    names = [s["name"] for s in job.io["inputs"]]
    outs = [s["name"] for s in job.io["outputs"]]
    shapes = {}
    for s in job.io["inputs"]:
        shape = list(s["shape"])
        for (n, ax), size in combo.items():
            if n == s["name"]:
                shape[ax] = size
        shapes[s["name"]] = shape
    model = make_static(free_model(onnx.load(job.prepared_path), job.variable or {}), shapes)
    onnx.save(model, str(work / "prepared.onnx"))

    def fitted(path: str, prefix: str, out: Path) -> list[Any]:
        with np.load(path, allow_pickle=False) as data:
            arrays = [_fit_stacked(data[f"{prefix}{i}"], combo, n) for i, n in enumerate(names)]
        np.savez(out, **{f"{prefix}{i}": a for i, a in enumerate(arrays)})
        return arrays

    calib = None
    if job.calib_path:
        calib = work / "calib.npz"
        fitted(job.calib_path, "in", calib)
    val = fitted(job.validation_path, "in", work / "validation.npz")
    # the build's own FP32 reference, by the engine the preparation chose (onnx.reference where ORT is off-spec)
    rows = reference_outputs(work / "prepared.onnx", [{n: a[i] for n, a in zip(names, val)}
                                                     for i in range(val[0].shape[0])],
                             job.data_source.get("reference_engine", "onnxruntime"))
    refs = [np.stack([r[o] for r in rows]) for o in outs]
    np.savez(work / "reference.npz", **{f"out{j}": r for j, r in enumerate(refs)})
    io = {"inputs": [{**{k: v for k, v in s.items() if k != "variable"}, "shape": shapes[s["name"]]}
                     for s in job.io["inputs"]],
          "outputs": [{**s, "shape": list(r.shape[1:])} for s, r in zip(job.io["outputs"], refs)]}
    source = {k: v for k, v in job.data_source.items() if k not in ("validation_shapes", "calib_shapes")}
    return dataclasses.replace(
        job, prepared_path=str(work / "prepared.onnx"), bundle_dir=str(work / "bundle"), io=io,
        calib_path=str(calib) if calib else None, validation_path=str(work / "validation.npz"),
        reference_path=str(work / "reference.npz"), data_source=source, variable=None, shape_form=None,
        carried_kinds={n: {**k, "source": "bucket: the whole model's"} for n, k in kinds.items()})


def _io_same(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """Why two bucket files cannot share one IO spec (names, layouts, dtypes, quantization), or None."""
    keys = ("name", "artifact_name", "perm", "dtype", "artifact_dtype", "quant")
    for side in ("inputs", "outputs"):
        for x, y in zip(a[side], b[side]):
            for k in keys:
                if x.get(k) != y.get(k):
                    return f"{side[:-1]} {x.get('name')}: {k} {x.get(k)} vs {y.get(k)}"
    return None


def build_per_bucket(target: Any, job: Any, progress: Callable[[str], None]) -> tuple[Any, list[str], bool]:
    """``(output, Ifs selected, retried)`` of the buckets form: every bucket built by ``target._build_ifs`` on
    its own static job, the files moved under ``job.bundle_dir``; the output is the top bucket's with
    ``runtime.buckets`` listing every file and the shapes (ONNX layout) it takes."""
    from edgeopt.targets.base import output_kinds

    bundle = Path(job.bundle_dir)
    kinds = output_kinds(job)
    plan = combos(job.variable or {})
    scratch = bundle.parent / f"{bundle.name}.buckets"
    shutil.rmtree(scratch, ignore_errors=True)
    made: list[tuple[dict[tuple[str, int], int], Any, Any]] = []
    selected_all: list[str] = []
    retried = False
    try:
        for k, combo in enumerate(plan):
            name = tag(combo)
            progress(f"buckets form: converting {name} ({k + 1}/{len(plan)})")
            bjob = bucket_job(job, combo, scratch / name, kinds)
            out, selected, again = target._build_ifs(bjob, progress)
            selected_all += [s for s in selected if s not in selected_all]
            retried = retried or again
            dest = bundle / name
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            src = Path(bjob.bundle_dir)
            for item in src.iterdir():
                if item.name not in ("manifest.json", "validation"):
                    shutil.move(str(item), str(dest / item.name))
            made.append((combo, bjob, out))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    top_combo, top_job, top = made[-1]
    for combo, _, out in made[:-1]:
        if out.io and top.io and (why := _io_same(out.io, top.io)):
            raise BuildFailed(f"the buckets form's files take their inputs differently ({tag(combo)} vs "
                              f"{tag(top_combo)}: {why}): one IO spec cannot serve them",
                              hint="--option shape_form=static (padded to the top)")
    listed = [{"shapes": {s["name"]: s["shape"] for s in bjob.io["inputs"]},
               "artifact": f"{tag(combo)}/{out.runtime['artifact']}",
               # each bucket's build chose its own settings (an INT8 search per bucket): kept where they differ
               **({"options": out.options} if out.options != top.options else {})}
              for combo, bjob, out in made]
    top.runtime = {**top.runtime, "artifact": listed[-1]["artifact"], "buckets": listed}
    for _, _, out in made[:-1]:
        top.notes += [n for n in out.notes if n not in top.notes]
        top.warnings += [w for w in out.warnings if w not in top.warnings]
    top.notes.append(f"buckets form: {len(made)} static files, one per bucket ("
                     + ", ".join(tag(c)[len('bucket-'):] for c, _, _ in made)
                     + "); each request runs in the file of the smallest bucket that holds it")
    if top.io is None:
        top.io = {"inputs": [dict(s) for s in top_job.io["inputs"]], "outputs": [dict(s) for s in top_job.io["outputs"]]}
    return top, selected_all, retried
