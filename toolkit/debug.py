"""``edgeopt debug``: where a bundle departs from the ONNX FP32 reference (the engine is ``edgeopt.layerdiff``).

``debug_bundle`` judges the bundle with the accuracy policy (``policy_check``: the host check on its
validation set, with the gate file it was built under) and compares it layer by layer with its source model;
when the policy refuses on decisions, ``explain_flips`` names the validation samples whose decision flipped
and, for each, the first node where its error jumps (the layers compared on those samples, beside samples that
kept their decision); ``debug_model`` builds the bundle first (``edgeopt.api.build``, into ``--dist`` or a temporary folder); ``reduce`` cuts the smallest subgraph
around the first diverging node that still fails the same check on that backend and writes it
(``reduced.onnx`` + ``reduced_inputs.npz``); ``table`` / ``html`` render the result.
"""

from __future__ import annotations

import base64
import html as _html
import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edgeopt.errors import BuildFailed, UsageError
from edgeopt.layerdiff import (
    DEFAULT_MAX_MEMORY,
    DebugResult,
    compare_layers,
    nodes_of,
    reference_source,
    static_reference,
)

FLIPS_COMPARED = 8  # flipped samples compared layer by layer (the rest are named)
KEPT_COMPARED = 8  # samples that kept their decision, compared beside them
STANDS_OUT = 2.0  # a flipped sample's error at a node this many times the kept samples' largest: its error jumps
ERR_FLOOR = 0.1  # ... when also at least this share of the precision's rel_l2 bound (ratios of tiny errors are noise)

SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30,
              "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def _say(_: str) -> None:
    pass


def parse_size(text: str | int | None) -> int:
    """``512M``, ``2G``, ``1.5GiB``, a bare number of bytes -> bytes; one line for anything else."""
    if text is None:
        return DEFAULT_MAX_MEMORY
    if isinstance(text, int):
        return text
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in SIZE_UNITS or float(m.group(1)) <= 0:
        raise UsageError(f"--max-memory takes a size such as 512M or 2G, got {text!r}")
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2).lower()])


def find_model(bundle: Path, manifest: dict[str, Any], model: str | None) -> Path:
    """The bundle's source ONNX: ``--model``, else the manifest's ``model.source`` next to the bundle's dist
    or in the working folder, checked by its sha256."""
    from edgeopt_agent.bundle import sha256_file

    if model:
        p = Path(model)
        if not p.is_file():
            raise UsageError(f"--model {model}: no such file")
        return p
    src = (manifest.get("model") or {}).get("source") or ""
    want = (manifest.get("model") or {}).get("sha256")
    for base in [Path.cwd(), *bundle.resolve().parents]:
        p = base / src
        if src and p.is_file() and (not want or sha256_file(p) == want):
            return p
    raise UsageError(f"{bundle}: the bundle's source model {src or '?'} was not found next to it",
                     hint=f"give it: edgeopt debug {bundle} --model PATH/{Path(src).name or 'model.onnx'}")


def policy_check(bundle: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The accuracy policy's word on the bundle, the host check's way: the agent's ``check`` in a child process
    over the bundle's whole validation set (``targets.base.host_check``), judged with the gate file the bundle
    was built under (its manifest's ``accept``).  Where the check cannot run here (a runtime this host lacks),
    the build's recorded host check is judged instead, and ``judged_by`` says so."""
    from edgeopt.policy.accept import judge
    from edgeopt.targets.base import host_check

    spec = manifest.get("accept")
    check = host_check(bundle)
    how = "the host check on the bundle's validation set, here"
    if check.get("error"):
        recorded = manifest.get("host_check") or {}
        how = (f"the build's recorded host check (it cannot run here: {str(check['error'])[:160]})"
               if recorded.get("kind") == "numeric" else f"not judged here: {str(check['error'])[:160]}")
        check = recorded if recorded.get("kind") == "numeric" else {}
    a = judge(check or None, spec)
    return {**a.as_dict(), "word": a.word(), "judged_by": how, "samples": check.get("samples"),
            "summary": check.get("summary")}


def sample_decisions(bundle: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """Per distinct validation sample, the artifact's decisions against the FP32 reference's, by the output's kind
    and the gate's decoder (``edgeopt_agent.paired``): ``{"output", "kind", "n", "flipped": [index, ...], "shown":
    {index: (reference, artifact)}, "feeds": [feed of each sample]}`` (decisions shown when short).  A
    ``build --batch B`` set is counted as the host check counts it (``compare.batch_rows``/``unbatch``: B
    distinct samples to a feed, the repeats that fill the last one dropped); ``feeds`` maps each sample to the
    validation feed that holds it (the unit ``compare_layers`` runs)."""
    from edgeopt_agent.bundle import reference_outputs
    from edgeopt_agent.check import run_validation
    from edgeopt_agent.compare import batch_rows, unbatch
    from edgeopt_agent.paired import decision_kind, pair_decisions
    from edgeopt_agent.runners import open_runner

    runner = open_runner(bundle, manifest, {})
    runner.load()
    try:
        outs = run_validation(runner, manifest, bundle)
    finally:
        runner.close()
    refs = reference_outputs(bundle, manifest)
    rows = batch_rows((manifest.get("validation") or {}).get("source"))
    if rows:
        outs, refs = unbatch(outs, rows), unbatch(refs, rows)
    feeds = [i for i, r in enumerate(rows) for _ in range(r)] if rows else None
    kind = decision_kind(manifest)
    name = kind["output"] if kind else manifest["io"]["outputs"][0]["name"]
    ref, out = list(refs[name]), list(outs[name])
    flipped, shown = [], {}
    if (kind or {}).get("kind") == "detection":  # boxes matched one to one, per image
        for i, (a, b) in enumerate(zip(ref, out)):
            da, db = pair_decisions([a], [b], kind)
            if da != db:
                flipped.append(i)
                shown[i] = (f"{len(da or [])} boxes", f"{sum(1 for x, y in zip(da or [], db or []) if x == y)} matched")
    else:
        da, db = pair_decisions(ref, out, kind)
        for i, (x, y) in enumerate(zip(da or [], db or [])):
            if x != y:
                flipped.append(i)
                shown[i] = (x, y) if len(x) <= 8 else (f"{len(x)} decisions", f"{sum(u != v for u, v in zip(x, y))} differ")
    return {"output": name, "kind": (kind or {}).get("kind") or "argmax", "n": len(ref), "flipped": flipped,
            "shown": shown, "feeds": feeds or list(range(len(ref)))}


def explain_flips(bundle: Path, model: Path, decisions: dict[str, Any], max_memory: int = DEFAULT_MAX_MEMORY,
                  progress: Callable[[str], None] = _say) -> dict[str, Any]:
    """For the samples whose decision flipped: the first node where each one's error jumps.  The layers are
    compared on those samples (up to ``FLIPS_COMPARED``) and on samples that kept their decision (up to
    ``KEPT_COMPARED``), each sample alone.  A flipped sample's error jumps at the first node where it is
    ``STANDS_OUT`` times the largest error any kept sample shows there (and at least ``ERR_FLOOR`` of the rel_l2
    bound): on the README's intel-cpu INT8 classifier, the head's MatMul (rel_l2 0.87 against at most 0.35).
    Without such a node: the first node where that sample alone is past the precision's bound while every kept
    sample is within it (a sample alone is noisier than the check's pooled figure: kept samples pass the bound
    alone too, so that is the second rule, not the first).  Where neither happens, its error is no larger than
    the kept samples': the node where it stands out most is named, and the flip put down to a decision FP32
    itself made narrowly."""
    flipped = list(decisions["flipped"])
    feed = decisions.get("feeds") or list(range(decisions["n"]))  # sample -> the validation feed holding it
    look = flipped[:FLIPS_COMPARED]
    look_feeds = list(dict.fromkeys(feed[i] for i in look))
    bad = {feed[i] for i in flipped}
    beside = [f for f in dict.fromkeys(feed) if f not in bad][:KEPT_COMPARED]  # feeds whose every sample kept
    out: dict[str, Any] = {"output": decisions["output"], "kind": decisions["kind"], "n": decisions["n"],
                           "flipped": flipped, "compared": look, "kept_compared": beside, "samples": []}
    if feed != list(range(decisions["n"])):
        out["feeds"] = {i: feed[i] for i in look}
    if not look:
        return out
    progress(f"comparing layers on {len(look)} flipped sample(s) and {len(beside)} validation feed(s) that kept "
             "their decisions")
    res = compare_layers(bundle, model, sample_ids=look_feeds + beside, max_memory=max_memory, per_sample=True,
                         progress=progress)
    floor = ERR_FLOOR * float(res.bound.get("rel_l2_max") or 0.0)
    rows = [r for r in res.nodes if r.get("per_sample")]
    look_at = {f: j for j, f in enumerate(look_feeds)}
    unit = "validation feed(s) whose samples" if "feeds" in out else "sample(s) that"
    for idx in look:
        j = look_at[feed[idx]]  # its feed's column (a batch-B feed holds B samples: their errors pooled)
        entry: dict[str, Any] = {"sample": idx, "decisions": decisions["shown"].get(idx)}
        best, best_ratio, alone = None, 0.0, None
        for r in rows:
            mine = r["per_sample"][j]
            kept_here = [r["per_sample"][len(look_feeds) + k] for k in range(len(beside))]
            top = max(x["err"] for x in kept_here) if kept_here else None
            ratio = mine["err"] / top if top else 0.0
            if ratio > best_ratio and mine["err"] >= floor:
                best, best_ratio = r, ratio
            if top is not None and mine["err"] >= max(STANDS_OUT * top, floor) and mine["err"] > 0:
                entry["first_jump"] = _jump(r, mine, top, f"rel_l2 {mine['err']:.3g} against at most {top:.3g} on "
                                                          f"the {len(kept_here)} {unit} kept their decision")
                break
            if alone is None and mine["reasons"] and not any(x["reasons"] for x in kept_here):
                alone = _jump(r, mine, top, "past the bound on this sample alone (" + "; ".join(mine["reasons"][:2])
                              + ")" + (f" while the {len(kept_here)} {unit} kept their decision stay within it"
                                       if kept_here else ""))
        if "first_jump" not in entry and alone is not None:
            entry["first_jump"] = alone
        if "first_jump" not in entry:
            entry["first_jump"] = None
            if best is not None:
                j_err = best["per_sample"][j]["err"]
                entry["stands_out_most"] = {"node": best["node"], "op": best["op"], "rel_l2": j_err,
                                            "ratio": round(best_ratio, 3)}
        out["samples"].append(entry)
    return out


def _jump(row: dict[str, Any], mine: dict[str, Any], top: float | None, why: str) -> dict[str, Any]:
    return {"node": row["node"], "op": row["op"], "rel_l2": mine["rel_l2"], "kept_max": top, "why": why,
            **({"artifact_node": row["artifact_node"]} if row.get("artifact_node") else {})}


def debug_bundle(bundle: str | Path, model: str | None = None, samples: int | None = 4,
                 max_memory: int = DEFAULT_MAX_MEMORY, progress: Callable[[str], None] = _say,
                 judge: bool = True) -> DebugResult:
    """Layer-by-layer comparison of ``bundle`` with its source model and, with ``judge``, the accuracy policy's
    word on it; when the policy refuses on decisions, the flipped samples and their first jumps (``flips``)."""
    from edgeopt.layerdiff import BackendUnavailable
    from edgeopt_agent.bundle import BundleError, load_manifest

    bundle = Path(bundle)
    try:
        manifest = load_manifest(bundle)
    except (BundleError, OSError, ValueError) as exc:
        raise UsageError(f"{bundle}: not a bundle ({exc})") from None
    path = find_model(bundle, manifest, model)
    try:
        from edgeopt import spec_check

        result = compare_layers(bundle, path, samples=samples, max_memory=max_memory, progress=progress)
        found = ((manifest.get("validation") or {}).get("source") or {}).get("spec_deviations") or []
        result.notes.extend(spec_check.debug_note(d) for d in found)
        if judge:
            progress("judging the bundle with the accuracy policy (the host check on its validation set)")
            result.policy = policy_check(bundle, manifest)
            if result.policy.get("accepted") is False and result.policy.get("metric") == "decisions":
                try:
                    decisions = sample_decisions(bundle, manifest)
                except Exception as exc:  # noqa: BLE001 - the artifact does not run in this process: say so
                    result.notes.append(f"the flipped samples could not be found here ({str(exc).splitlines()[0][:160]})")
                else:
                    result.flips = explain_flips(bundle, path, decisions, max_memory, progress)
        return result
    except BackendUnavailable as exc:
        raise UsageError(f"{manifest.get('target', '?')} ({manifest['runtime']['name']}): intermediate tensors "
                         f"are not available on this host: {exc}",
                         hint="debug the same model for a backend that runs here: --target cpu or intel-cpu") from None


def debug_model(model: str, target: str, precision: str = "auto", dist: str | None = None, samples: int | None = 4,
                max_memory: int = DEFAULT_MAX_MEMORY, progress: Callable[[str], None] = _say,
                **build_kw: Any) -> tuple[str, DebugResult]:
    """Build ``model`` for one target/precision (kept even when its check fails), then debug the bundle."""
    from edgeopt import api

    if "," in target:
        raise UsageError("edgeopt debug takes one --target", hint="run it once per target")
    out = dist or tempfile.mkdtemp(prefix="edgeopt-debug-")
    report = api.build(model, target, precision=precision, dist=out, allow_mismatch=True, progress=progress,
                       raise_on_failure=False, **build_kw)
    built = [r for r in report.results if r.bundle]
    if not built:
        r = report.results[0] if report.results else None
        raise BuildFailed(f"{target}: nothing was built to debug"
                          + (f" ({r.status}: {(r.error or '').splitlines()[0][:300] if r.error else ''})" if r else ""),
                          hint="a build whose check failed before is remembered: add --force to build it again "
                               "(debug keeps a bundle that fails its check; cpu, intel-* and TensorRT INT8 searches "
                               "keep their closest variant for it); mobile's INT8 search ships none: debug "
                               "--precision fp16/fp32 there")
    return built[0].bundle, debug_bundle(built[0].bundle, model, samples=samples, max_memory=max_memory,
                                         progress=progress)


def refused(result: DebugResult) -> bool:
    """Debug's failure word (exit 5): the policy refuses the artifact; where it could not judge here, a node
    past the precision's bound (the first jump)."""
    if result.policy and result.policy.get("accepted") is not None:
        return result.policy["accepted"] is False
    return result.first_jump is not None


# --- reduce ------------------------------------------------------------------------------------------

def _extract(model, inputs: list[str], outputs: list[str]):
    import onnx.utils

    return onnx.utils.Extractor(model).extract_model(inputs, outputs)


def reduce(result: DebugResult, out_dir: str | Path, max_steps: int = 8, options: list[str] | None = None,
           progress: Callable[[str], None] = _say) -> dict[str, Any]:
    """The smallest subgraph ending at the first diverging node that still fails on this backend.

    The subgraph starts as that node alone (its inputs fed with the reference's values) and grows backwards
    one producer level at a time until it fails the same check: on ``onnxruntime`` the same subgraph cut from
    the bundle's artifact (tensor names are shared) against the reference's; on the other backends the
    subgraph built for the bundle's target and precision (``edgeopt.api.build``, its host check) -- a
    converter's mistake shows again when the converter sees the small model."""
    import onnx

    from edgeopt_agent.bundle import load_manifest, validation_inputs

    if result.first_jump is None:
        raise UsageError("nothing to reduce: every compared tensor is within the bound (no first jump)")
    bundle = Path(result.bundle)
    manifest = load_manifest(bundle)
    ref_model = static_reference(result.model, manifest)
    feeds = validation_inputs(bundle, manifest)[: max(result.samples, 1)]
    producer = {o: n for n in ref_model.graph.node for o in n.output}
    graph_inputs = {i.name for i in ref_model.graph.input}
    inits = {i.name for i in ref_model.graph.initializer} | {
        o for n in ref_model.graph.node if n.op_type == "Constant" for o in n.output}
    node = next(n for n in nodes_of(ref_model) if n.name == result.first_jump["node"])
    outputs = list(node.outputs)
    frontier = [t for t in node.inputs]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ref = reference_source(ref_model)
    attempt: dict[str, Any] = {}
    for step in range(max_steps):
        frontier = list(dict.fromkeys(t for t in frontier if t not in inits))
        sub = _extract(ref_model, frontier, outputs)
        values = ref.run([t for t in frontier if t not in graph_inputs], feeds) if any(
            t not in graph_inputs for t in frontier) else {}
        data = {t: values[t] if t in values else np.stack([f[t] for f in feeds]) for t in frontier}
        nodes = [n for n in sub.graph.node if n.op_type != "Constant"]
        progress(f"reduce step {step + 1}: {len(nodes)} node(s) from {', '.join(frontier)[:120]}")
        failed, why = _fails(result, manifest, bundle, sub, data, frontier, outputs, options, progress)
        attempt = {"nodes": len(nodes), "ops": [n.op_type for n in nodes], "inputs": frontier, "outputs": outputs,
                   "reproduced": failed, "check": why, "steps": step + 1}
        if failed:
            break
        grown = []
        for t in frontier:
            p = producer.get(t)
            if p is None or t in graph_inputs:
                grown.append(t)
            else:
                grown.extend(i for i in p.input if i)
        if set(grown) == set(frontier):
            break
        frontier = grown
    onnx.save(sub, str(out_dir / "reduced.onnx"))
    np.savez(out_dir / "reduced_inputs.npz", **data)
    attempt.update({"model": str(out_dir / "reduced.onnx"), "inputs_npz": str(out_dir / "reduced_inputs.npz")})
    return attempt


def _fails(result: DebugResult, manifest: dict[str, Any], bundle: Path, sub, data: dict[str, np.ndarray],
           inputs: list[str], outputs: list[str], options: list[str] | None,
           progress: Callable[[str], None]) -> tuple[bool, str]:
    from edgeopt.layerdiff import node_metrics

    if manifest["runtime"]["name"] == "onnxruntime":
        import onnx
        import onnxruntime as ort

        art = onnx.load(str(bundle / manifest["runtime"]["artifact"]))
        dq = {n.input[0]: n.output[0] for n in art.graph.node if n.op_type == "DequantizeLinear"}
        q = {n.input[0]: n.output[0] for n in art.graph.node if n.op_type == "QuantizeLinear"}
        outs = [dq.get(q.get(t, ""), t) for t in outputs]
        have = {o for n in art.graph.node for o in n.output} | {i.name for i in art.graph.input}
        missing = [t for t in inputs if t not in have]
        if missing:
            return False, f"the artifact has no tensor {missing[0]!r} (fused away): the cut grows"
        try:
            cut = _extract(art, inputs, outs)
            so = ort.SessionOptions()
            so.log_severity_level = 3
            sess = ort.InferenceSession(cut.SerializeToString(), so, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - a fusion crosses the cut: grow further
            return False, f"the artifact cannot be cut there ({str(exc).splitlines()[0][:120]})"
        refsess = reference_source(sub)
        n = len(next(iter(data.values())))
        feeds = [{k: v[i] for k, v in data.items()} for i in range(n)]
        got = {o: np.stack([sess.run([a], f)[0] for f in feeds]) for o, a in zip(outputs, outs)}
        want = refsess.run(outputs, feeds)
        reasons = [r for o in outputs for r in node_metrics(got[o], want[o], result.precision)[1]]
        return bool(reasons), "; ".join(reasons) or "passes"
    # other backends: build the subgraph for the target and run its host check
    from edgeopt import api

    with tempfile.TemporaryDirectory(prefix="edgeopt-reduce-") as tmp:
        import onnx

        mp = Path(tmp) / "sub.onnx"
        onnx.save(sub, str(mp))
        npz = Path(tmp) / "data.npz"
        np.savez(npz, **data)
        n = len(next(iter(data.values())))
        rep = api.build(str(mp), manifest["target"], precision=manifest["precision"], calib=str(npz),
                        dist=str(Path(tmp) / "dist"), allow_mismatch=True, force=True, raise_on_failure=False,
                        option=list(options or []), calib_count=n, val_count=n, progress=progress)
        r = rep.results[0]
        hc = (r.manifest or {}).get("host_check") or {}
        if r.status in ("check-failed",) or hc.get("passed") is False:
            return True, r.check or "host check failed"
        return False, r.check or r.status


# --- rendering ----------------------------------------------------------------------------------------

def _f(v: Any, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def rows_for_table(result: DebugResult, all_nodes: bool = False) -> list[dict[str, Any]]:
    jump = result.first_jump["index"] if result.first_jump else None
    rows = []
    for r in result.nodes:
        if not all_nodes and r.get("status") in ("not observed", "no float output"):
            continue
        mark = "<- first jump" if r["index"] == jump else ""
        rows.append({"node": r["node"], "op": r["op"], "status": r.get("status", ""),
                     "cosine": _f(r.get("cosine"), ".6f"), "rel_l2": _f(r.get("rel_l2"), ".3g"),
                     "max_abs_norm": _f(r.get("max_abs_norm"), ".3g"),
                     "prec": r.get("runtime_precision", ""), "mark": mark})
    return rows


def summary(result: DebugResult) -> str:
    bound = ", ".join(f"{k} {v:g}" for k, v in result.bound.items())
    head = (f"{result.target} {result.precision} ({result.artifact}) vs ONNX FP32: {result.observed} tensors "
            f"compared in {result.windows} window(s), {result.samples} sample(s); bound {bound}")
    cov = result.coverage or {}
    if cov.get("units"):
        head += (f"\nobservable: {cov['units_observable']} of {cov['units']} compute units ({cov['unit_share']:.0%}; "
                 f"Conv, Gemm, MatMul, and each of the {cov['attention_blocks']} attention blocks -- Q·Kᵀ, softmax, ·V "
                 f"-- as one: {cov['attention_observed']} observed whole)")
    if cov.get("compute_nodes"):
        head += (f"\nobservable: {cov['observable']} of {cov['compute_nodes']} compute nodes (Conv, Gemm, MatMul, "
                 f"attention; {cov['share']:.0%}): {cov['own_output']} at their own output, {cov['fused']} inside the "
                 "fused kernel of a compared node" + (f"; not observed: {', '.join(cov['unobserved'][:6])}"
                                                      + (" ..." if len(cov["unobserved"]) > 6 else "")
                                                      if cov["unobserved"] else ""))
    head += "".join(f"\nnote: {n}" for n in result.notes)
    pol = result.policy or {}
    if pol:
        head += (f"\npolicy: {pol.get('word')}" + (f" -- {pol['metric']}: " if pol.get("metric") else " -- ")
                 + f"{pol.get('reason') or ''} (judged by {pol.get('judged_by')})")
    if result.first_jump:
        j = result.first_jump
        at = f" (artifact node {j['artifact_node']})" if j.get("artifact_node") else ""
        text = head + f"\nfirst jump: {j['node']} ({j['op']}){_fused_text(result, j)}{at}: " + "; ".join(
            j.get("reasons") or [])
        if pol.get("accepted") is True:
            text += " -- a diagnosis only: the policy accepts the artifact"
    elif pol.get("accepted") is False:
        text = head + (f"\nno tensor past the bound on the {result.samples} sample(s) compared, yet the policy refuses "
                       "the artifact")
    else:
        text = head + "\nno first jump: every compared tensor is within the bound"
    return text + flips_text(result)


def _fused_text(result: DebugResult, row: dict[str, Any]) -> str:
    """The unobserved nodes a compared node's value also shows (``covers``), compute nodes first: the changed
    Conv of a Conv+BatchNormalization kernel is named beside the BatchNormalization whose output is compared."""
    from edgeopt.layerdiff import COMPUTE_OPS

    covers = row.get("covers") or []
    if not covers:
        return ""
    op = {r["node"]: r["op"] for r in result.nodes}
    first = sorted(covers, key=lambda n: op.get(n) not in COMPUTE_OPS)
    shown = ", ".join(f"{n} ({op.get(n, '?')})" for n in first[:3]) + (" ..." if len(first) > 3 else "")
    block = row.get("op") in COMPUTE_OPS and any(op.get(n) == "Softmax" for n in covers)
    return f", fused with {shown}" + (" (an attention block the artifact runs as one kernel)" if block else "")


def _sample_word(ids: list[int]) -> str:
    return ("validation sample " if len(ids) == 1 else "validation samples ") + ", ".join(str(i) for i in ids)


def _lab(f: dict[str, Any], e: dict[str, Any]) -> str:
    fe = (f.get("feeds") or {}).get(e["sample"])
    return f"sample {e['sample']}" + (f" (validation feed {fe}, its errors pooled with the feed's)" if fe is not None else "")


def flips_text(result: DebugResult) -> str:
    f = result.flips
    if not f:
        return ""
    if not f["flipped"]:
        return (f"\nno decision of output {f['output']!r} flipped on this run of the {f['n']} validation samples "
                "(the policy's refusal came from the host check's run)")
    lines = [f"\ndecisions flipped ({f['kind']}, output {f['output']!r}) on {len(f['flipped'])} of {f['n']}: "
             + _sample_word(f["flipped"])]
    for e in f["samples"]:
        d = e.get("decisions")
        said = f" (FP32 {d[0]}, artifact {d[1]})" if d else ""
        j = e.get("first_jump")
        if j:
            at = f" (artifact node {j['artifact_node']})" if j.get("artifact_node") else ""
            lines.append(f"{_lab(f, e)}{said}: its error jumps at {j['node']} ({j['op']}){at}: {j['why']}")
        elif e.get("stands_out_most"):
            m = e["stands_out_most"]
            lines.append(f"{_lab(f, e)}{said}: no node's error jumps past the bound or the kept samples' "
                         f"(most at {m['node']} ({m['op']}): rel_l2 {m['rel_l2']:.3g}, {m['ratio']:.2f}x the kept "
                         "samples' largest): FP32 itself decides this sample narrowly")
        else:
            lines.append(f"{_lab(f, e)}{said}: no node's error jumps past the bound or the kept samples': "
                         "FP32 itself decides this sample narrowly")
    rest = [i for i in f["flipped"] if i not in f["compared"]]
    if rest:
        lines.append(f"(layers compared on the first {len(f['compared'])} flipped samples; also flipped: "
                     + ", ".join(str(i) for i in rest) + ")")
    return "\n".join(lines)


def table(result: DebugResult, all_nodes: bool = False) -> str:
    from edgeopt.ui import table as _table

    cols = [("node", "ONNX node"), ("op", "op"), ("status", "status"), ("cosine", "cosine"), ("rel_l2", "rel_l2"),
            ("max_abs_norm", "max_abs_norm"), ("prec", "ran in"), ("mark", "")]
    return _table(rows_for_table(result, all_nodes), cols) + "\n" + summary(result)


def plot_png(result: DebugResult) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(i, r) for i, r in enumerate(result.nodes) if r.get("rel_l2") is not None]
    fig, ax = plt.subplots(figsize=(10, 3.6), dpi=100)
    if pts:
        xs = [i for i, _ in pts]
        ys = [max(float(r["rel_l2"]), 1e-12) if np.isfinite(r["rel_l2"]) else 1e6 for _, r in pts]
        ax.plot(xs, ys, ".-", lw=0.8, ms=3, label="rel_l2 vs ONNX FP32")
        ax.set_yscale("log")
    if result.bound.get("rel_l2_max") is not None:
        ax.axhline(result.bound["rel_l2_max"], color="tab:red", ls="--", lw=1,
                   label=f"bound rel_l2 {result.bound['rel_l2_max']:g}")
    if result.first_jump:
        i = next(k for k, r in enumerate(result.nodes) if r is result.first_jump or r["index"] == result.first_jump["index"])
        ax.axvline(i, color="tab:orange", lw=1)
        ax.annotate(f"first jump: {result.first_jump['node']}", (i, ax.get_ylim()[1]), xytext=(4, -12),
                    textcoords="offset points", color="tab:orange", fontsize=8)
    ax.set_xlabel("ONNX node (topological order)")
    ax.set_ylabel("rel_l2 (log)")
    ax.set_title(f"{Path(result.model).name}: {result.target} {result.precision} error by layer")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def html(result: DebugResult) -> str:
    esc = _html.escape
    png = base64.b64encode(plot_png(result)).decode()
    jump = result.first_jump["index"] if result.first_jump else None
    rows = []
    for r in result.nodes:
        cls = ' class="jump"' if r["index"] == jump else (' class="fail"' if r.get("status") == "FAIL" else "")
        rows.append(f"<tr{cls}><td>{esc(r['node'])}</td><td>{esc(r['op'])}</td><td>{esc(r.get('status', ''))}</td>"
                    f"<td>{_f(r.get('cosine'), '.6f')}</td><td>{_f(r.get('rel_l2'), '.3g')}</td>"
                    f"<td>{_f(r.get('max_abs_norm'), '.3g')}</td><td>{esc(r.get('runtime_precision', ''))}</td>"
                    f"<td>{esc(str(r.get('artifact_node') or ''))}</td></tr>")
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>edgeopt debug: {esc(Path(result.model).name)}</title>
<style>body{{font-family:sans-serif;margin:1.5em}} table{{border-collapse:collapse;font-size:12px}}
td,th{{border:1px solid #ccc;padding:2px 6px}} tr.fail{{background:#fee}} tr.jump{{background:#fc8;font-weight:bold}}
pre{{background:#f6f6f6;padding:.5em}}</style></head><body>
<h1>edgeopt debug</h1><pre id="summary">{esc(summary(result))}</pre>
<img id="plot" alt="error by layer" src="data:image/png;base64,{png}">
<table id="layers"><tr><th>ONNX node</th><th>op</th><th>status</th><th>cosine</th><th>rel_l2</th><th>max_abs_norm</th>
<th>ran in</th><th>artifact node</th></tr>
{''.join(rows)}
</table></body></html>
"""


def as_json(result: DebugResult) -> dict[str, Any]:
    from edgeopt.jsonsafe import clean

    d = result.as_dict()
    for row in d.get("nodes") or []:
        row.pop("per_sample", None)
    return clean({"schema": "edgeopt/v1", "kind": "debug", **d, "passed": not refused(result)})


def write_text(path: str | os.PathLike, text: str) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(p)
