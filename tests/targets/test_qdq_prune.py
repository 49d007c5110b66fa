"""Pruning the float nodes of a passing fallback variant (``qdq_prune``), with ONNX Runtime's quantizer.

The model is ``outlier_net``: conv1's channel 0 is ~300x the others and conv2 reads it weakly, so conv2
in INT8 breaks the output.  A fallback variant that keeps conv1, conv2 and fc float passes; pruning must
give fc back to INT8 and keep conv1 and conv2 float.  conv1 stays float because its output ``r1`` is the
tensor conv2 reads: with conv1 in INT8 that tensor is rounded on one per-tensor scale set by channel 0,
and although a float conv2 then keeps the whole output within the tensor bound (rel_l2 0.19 < 0.25,
cosine 0.986), the check per slice (``slice_metrics``: each logit across the validation samples against
its own scale) finds logit 0 destroyed: rel_l2 0.895 > 0.5, cosine 0.77 < 0.9.  That INT8 must not ship,
so the honest answer of the pruning on this model is (conv1, conv2) float, fc INT8.
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

from edgeopt.targets.onnxruntime.int8 import OrtBackend, OrtSettings
from edgeopt.targets.qdq_prune import prune_float_nodes
from edgeopt.targets.qdq_search import QdqSearch
from tests.targets.test_qdq_search import _feeds, _reference, outlier_net


def _search(tmp_path: Path) -> tuple[QdqSearch, OrtSettings]:
    model = outlier_net(tmp_path / "o.onnx")
    calib, val = _feeds(16, seed=1), _feeds(8, seed=2)
    work = tmp_path / "work"
    work.mkdir()
    backend = OrtBackend(ort, tmp_path / "o.onnx", calib, work, lambda s: None)
    search = QdqSearch(backend, val=val, calib=calib, reference=_reference(model, val), mode="quick",
                       budget_s=120, work=work)
    base = OrtSettings("minmax", True)
    backend.prepare("minmax")
    return search, base


def test_prune_gives_unneeded_float_nodes_back_to_int8_and_keeps_the_sensitive_one(tmp_path):
    search, base = _search(tmp_path)
    grid = search.try_variant(base, "grid")
    assert not grid.passed  # all-INT8 misses the bound: the fallback's case
    wide = search.try_variant(base.__class__(**{**base.__dict__, "exclude": ("conv1", "conv2", "fc")}),
                              "joint-fallback", {"conv1": "t", "conv2": "t", "fc": "t"})
    assert wide.passed

    best = prune_float_nodes(search)

    assert best is not None and best.passed and best.step == "prune"
    assert best.settings.exclude == ("conv1", "conv2")  # fc, not needed float, is INT8 again
    assert best.why_float == {"conv1": "t", "conv2": "t"}
    assert best.calib_rel_l2 <= grid.calib_rel_l2
    tried = [v for v in search.variants if v.step == "prune"]
    assert 1 <= len(tried) <= 8
    # with conv2 back in INT8 the output breaks: those variants fail
    assert all(not v.passed for v in tried if "conv2" not in v.settings.exclude)
    assert any(not v.passed for v in tried)
    # conv2 float but conv1 INT8: within the whole-tensor bound, refused by the per-slice check alone
    conv2_only = [v for v in tried if v.settings.exclude == ("conv2",)]
    assert conv2_only and not conv2_only[0].passed
    assert conv2_only[0].outputs["y"]["rel_l2"] <= 0.25
    assert any(r.startswith("slice_rel_l2: index 0 ") for r in conv2_only[0].reasons)
    assert any("prune: 3 -> 2 float node(s)" in n for n in search.notes)


def test_prune_does_not_take_a_variant_worse_than_all_int8_on_calibration_samples(tmp_path):
    search, base = _search(tmp_path)
    grid = search.try_variant(base, "grid")
    wide = search.try_variant(base.__class__(**{**base.__dict__, "exclude": ("conv1", "conv2", "fc")}),
                              "joint-fallback")
    assert wide.passed and not grid.passed
    grid.calib_rel_l2 = 0.0  # no pruned variant can be at least as close as all-INT8 on calibration samples

    best = prune_float_nodes(search)

    assert best is wide  # the fallback's own pass stays the answer
    tried = [v for v in search.variants if v.step == "prune"]
    assert tried and not any(v.passed for v in tried)
    assert any("pruning guard" in r for v in tried for r in v.reasons)


def test_prune_does_nothing_without_a_fallback_pass(tmp_path):
    search, base = _search(tmp_path)
    search.try_variant(base, "grid")

    assert prune_float_nodes(search) is None
    assert [v.step for v in search.variants] == ["grid"]
