"""Prune the float nodes of a passing float-fallback variant (the ``cpu`` INT8 search).

The fallback of ``qdq_search`` adds nodes to float until a variant passes; its joint step adds the 2, 4,
8 ... most SQNR-sensitive ones at once, so the first variant that passes can carry many float nodes that
the bound does not need.  On ONNX Runtime every float node costs speed twice: its own float kernel and
the layout changes around it (ORT runs the fused int8 convolutions in NHWC, float ones in NCHWc: each
boundary is a Transpose).  Measured on EfficientNet-Lite0 (real ImageNet weights, 2-core AVX-512 VNNI,
1 thread): all-INT8 U8S8 2.1x FP32 at 90.6% top-1 agreement; the fallback's first pass at
``top1_min=0.95`` kept 24 nodes float (20 Transposes) and ran 1.5x.

So after a fallback pass, groups of its float nodes are put back to INT8 -- least sensitive first,
halves, then quarters, ... -- and a group stays INT8 when the variant still meets the same bound on the
validation samples *and* its error on calibration samples (``Variant.calib_rel_l2``, samples the bound
does not judge) is no worse than the all-INT8 grid variant the fallback started from: pruning may give
back what the fallback gained on held-out data only as far as plain INT8 already was, so re-testing the
validation samples cannot walk the float set towards a variant that merely got lucky on them.  The
search's usual selection (fastest passing, timed) then chooses among all passing variants.
"""

from __future__ import annotations

from dataclasses import replace

from .qdq_search import QdqSearch, Variant

PRUNE_TRIALS = {"quick": 8, "full": 24}  # mode -> variants tried at most while pruning


def prune_float_nodes(search: QdqSearch, max_trials: int | None = None) -> Variant | None:
    """Try to quantize again the float nodes of the fallback's passing variant with the fewest float
    nodes; returns the passing variant with the fewest float nodes found (None: nothing to prune)."""
    fallback = [v for v in search.passing() if v.step in ("float-fallback", "joint-fallback")]
    grid = [v for v in search.variants if v.step == "grid" and v.outputs]
    if not fallback or not grid:
        return None
    start = min(fallback, key=lambda v: (len(v.settings.exclude), v.calib_rel_l2))
    origin = max((v for v in grid if v.settings.calibration == start.settings.calibration
                  and v.settings.per_channel == start.settings.per_channel), key=lambda v: v.accuracy,
                 default=max(grid, key=lambda v: v.accuracy))
    keep = set(origin.settings.exclude)  # float before the fallback began: not the fallback's to undo
    floats = [n for n in start.settings.exclude if n not in keep]
    guard = origin.calib_rel_l2
    trials = PRUNE_TRIALS.get(search.mode, 8) if max_trials is None else max_trials
    best, tried = start, 0
    search.progress(f"int8: pruning the {len(floats)} float node(s) of {start.settings.label()} "
                    f"(<= {trials} variants; calibration-sample error must stay <= {guard:.4f})")
    group = max(1, len(floats) // 2)
    while floats and tried < trials:
        i = len(floats)
        while i > 0 and tried < trials and not search.over_budget():
            lo = max(0, i - group)
            trial = floats[:lo] + floats[i:]
            exclude = tuple(n for n in start.settings.exclude if n in keep or n in trial)
            why = {n: w for n, w in start.why_float.items() if n in exclude}
            search.set_stage("prune", tried + 1, trials)
            v = search.try_variant(replace(start.settings, exclude=exclude), "prune", why)
            tried += 1
            if v.passed and v.calib_rel_l2 <= guard:
                floats, best = trial, v
            elif v.passed:
                search.notes.append(f"prune: {v.settings.label()} met the bound on the validation samples but its "
                                    f"calibration-sample error {v.calib_rel_l2:.4f} > {guard:.4f} (all-INT8 "
                                    "variant's): not taken")
                v.passed = False
                v.reasons.append(f"pruning guard: calibration-sample rel_l2 {v.calib_rel_l2:.4f} > {guard:.4f}")
            i = lo
        if group == 1 or search.over_budget():
            break
        group = max(1, group // 2)
    search.notes.append(f"prune: {len(start.settings.exclude)} -> {len(best.settings.exclude)} float node(s) "
                        f"in {tried} variant(s)")
    return best
