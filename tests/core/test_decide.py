"""The one comparison engine (edgeopt.decide) behind the report's SHIP line: intervals, noise, too few
samples, device truth, the gate's default accuracy rules, batch sizes.

Real parts: the agent's own output comparison (compare_outputs) makes every accuracy figure, the HIL
gate's statistics and default spec judge them, the report renders every format.  The latency samples
are drawn from known distributions (seeded) so that what must separate separates and what must not
does not, whatever the machine's load.
"""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from edgeopt import decide
from edgeopt.reporting import render, rows_of
from edgeopt_agent.compare import compare_outputs


def _accuracy(precision: str, differ: int, n: int = 16) -> dict:
    """A real comparison of n classifier outputs with ``differ`` top-1 decisions flipped."""
    rng = np.random.default_rng(n + differ)
    ref = rng.normal(size=(n, 1, 2)).astype(np.float32)
    out = ref + rng.normal(scale=1e-7 if precision == "fp32" else 1e-3, size=ref.shape).astype(np.float32)
    out[:differ] = out[:differ, :, ::-1]
    acc = compare_outputs({"y": out}, {"y": ref}, precision, None, {"y": "classification"})
    acc["samples"] = n
    acc["data"] = {"kind": "images", "n": n}
    return acc


def _rec(target: str, precision: str, ms: float, *, seed: int = 0, n: int = 400, device: str = "box",
         transport: str = "ssh", batch: int = 1, differ: int = 0, load: float = 0.2, cpu: str = "AMD EPYC 7B13",
         emulated=None, spread: float = 0.03) -> dict:
    rng = np.random.default_rng(seed)
    samples = (ms * np.exp(rng.normal(0, spread, n))).round(4).tolist()
    p = np.percentile(samples, [50, 90, 99])
    env = {"cpu_model": cpu, "cores": 8, "cores_usable": 8, "loadavg": [load, load, load]}
    if emulated is not None:
        env["emulated"] = emulated
    return {
        "run_id": "r1", "time": f"2026-11-24T22:{seed % 60:02d}:00Z", "status": "ok",
        "device": {"name": device, "transport": transport},
        "bundle": {"model": "cls", "target": target, "precision": precision, "path": f"/home/someone/dist/cls/{target}-{precision}",
                   "backend": {"cpu": "onnxruntime", "intel-cpu": "openvino", "mobile": "tflite"}[target]},
        "bench": {"latency_ms": {"p50": p[0], "p90": p[1], "p99": p[2]}, "samples_ms": samples,
                  "throughput_ips": batch * 1000 / ms, "iterations": n, "inputs": {"batch": batch},
                  "accuracy": _accuracy(precision, differ), "environment": env},
    }


def _verdict(records: list[dict]) -> list[dict]:
    return json.loads(render(records, "json"))["ship"]


def test_wilson_interval_of_15_of_16():
    lo, hi = decide.wilson(15, 16)
    assert lo == pytest.approx(0.717, abs=1e-3) and hi == pytest.approx(0.989, abs=1e-3)
    assert decide.wilson(16, 16)[1] == 1.0 and decide.wilson(0, 16)[0] == 0.0


def test_a_clear_winner_carries_ratio_interval_criterion_and_batch():
    recs = [_rec("cpu", "fp32", 4.0, seed=1), _rec("cpu", "int8", 2.0, seed=2)]
    (v,) = _verdict(recs)
    assert v["ship"] == "cpu-int8" and v["clear"] and v["basis"] == "speed"
    assert v["runner_up"] == "cpu-fp32" and 1.8 < v["ratio"] < 2.2 and 1 < v["ci_low"] <= v["ratio"] <= v["ci_high"]
    assert v["p_value"] <= 0.05 and v["gate_accepts"] is True
    assert v["line"].startswith("batch 1 on box: ship cpu-int8 -- lowest p50 at batch 1 on box")
    assert "99% CI" in v["line"] and "gate defaults accept it" in v["line"]


def test_overlapping_intervals_say_no_clear_winner_and_ship_the_more_faithful():
    recs = [_rec("cpu", "fp32", 3.0, seed=1), _rec("cpu", "int8", 2.97, seed=2)]
    (v,) = _verdict(recs)
    assert not v["clear"] and v["basis"] == "fidelity" and v["ship"] == "cpu-fp32"
    assert "no clear winner" in v["line"] and "the more faithful (fp32" in v["line"]
    assert v["ci_low"] <= 1 <= v["ci_high"]
    # the paired measurement that can separate them, with no path of this machine
    assert "edgeopt gate DIST/cls/cpu-int8 --baseline DIST/cls/cpu-fp32 --devices INVENTORY --limit box" in v["line"]
    assert "/home/someone" not in render(recs, "json") + render(recs, "html")


@pytest.mark.parametrize("why,kw", [("device noisy", {"load": 12.0}), ("too few latency samples", {"n": 20})])
def test_noise_or_too_few_samples_is_no_clear_winner_however_far_apart(why, kw):
    recs = [_rec("cpu", "fp32", 4.0, seed=1, **kw), _rec("cpu", "int8", 2.0, seed=2, **kw)]
    (v,) = _verdict(recs)
    assert not v["clear"] and v["ship"] == "cpu-fp32" and why in v["line"]


def test_the_gate_defaults_decide_what_ships():
    """15/16 top-1 passes the INT8 build bound (90%) but the gate's default decisions rule (5%) refuses it:
    the faster INT8 is not shipped, and the line says why; alone, it is shipped with the refusal stated."""
    ok, why = decide.gate_defaults_accept(_accuracy("int8", 1))
    assert ok is False and why == ("1 of 16 distinct validation samples decided differently (6.2%, 95% CI 1%–28%; "
                                   "allowed 5%)")
    recs = [_rec("cpu", "fp32", 4.0, seed=1), _rec("cpu", "int8", 2.0, seed=2, differ=1)]
    rows = rows_of(recs)
    assert [r["gate_accepts"] for r in rows] == [True, False] and rows[1]["accuracy"] == "passed"
    (v,) = _verdict(recs)
    assert v["ship"] == "cpu-fp32" and "gate defaults would refuse, not shipped: cpu-int8 (1 of 16" in v["line"]
    (v,) = _verdict(recs[1:])
    assert v["ship"] == "cpu-int8" and "gate defaults would refuse it: 1 of 16 distinct validation samples " \
                                      "decided differently (6.2%" in v["line"]
    a = rows[1]["agreement_ci"]
    assert (a["k"], a["n"]) == (15, 16) and a["ci_low"] == pytest.approx(0.717, abs=1e-3)
    table = render(recs, "table")
    assert "93.8% (15/16, 95% CI 72%–99%)" in table and "REFUSE" in table
    assert "93.8% (15/16, 95% CI 72%–99%)" in render(recs, "html")


@pytest.mark.parametrize("rec,truth", [
    (dict(target="mobile", precision="fp16", device="local", transport="local"), "build-host"),
    (dict(target="intel-cpu", precision="int8", cpu="AMD EPYC 7B13"), "other-vendor"),
    (dict(target="cpu", precision="int8", emulated="qemu-user"), "emulated"),
    (dict(target="cpu", precision="int8", emulated={"emulated": True, "by": "qemu-aarch64"}), "emulated"),
    (dict(target="cpu", precision="int8", emulated=False), "device"),
    (dict(target="intel-cpu", precision="int8", cpu="Intel(R) Xeon(R) Platinum 8481C"), "device"),
])
def test_rows_not_measured_on_their_device_are_never_the_ship(rec, truth):
    fast = _rec(ms=1.0, seed=3, **rec)
    slow = _rec("cpu", "fp32", 4.0, seed=1, device=fast["device"]["name"], transport=fast["device"]["transport"])
    rows = rows_of([fast, slow])
    assert next(r for r in rows if r["p50_ms"] < 2)["device_truth"] == truth
    (v,) = _verdict([fast, slow])
    if truth == "device":
        assert v["ship"] == f"{rec['target']}-{rec['precision']}"
    else:
        assert v["ship"] == "cpu-fp32" and f"({truth})" in v["line"] and "never a SHIP" in v["line"]
        assert {"build-host": "BUILD HOST", "other-vendor": "OTHER VENDOR", "emulated": "EMULATED"}[truth] \
            in render([fast, slow], "table")
    (alone,) = _verdict([fast])
    assert (alone["ship"] is None) == (truth != "device")


def test_batch_sizes_get_their_own_verdicts_and_fp32_ratio():
    recs = [_rec("cpu", "fp32", 4.0, seed=1), _rec("cpu", "int8", 2.0, seed=2),
            _rec("cpu", "fp32", 12.0, seed=3, batch=4), _rec("cpu", "int8", 7.0, seed=4, batch=4)]
    vs = _verdict(recs)
    assert [(v["batch"], v["ship"]) for v in vs] == [(1, "cpu-int8"), (4, "cpu-int8")]
    assert vs[1]["line"].startswith("batch 4 on box:") and "at batch 4" in vs[1]["line"]
    assert 1.5 < vs[1]["ratio"] < 1.9  # batch 4 against batch 4, not against batch 1's 4 ms
    rows = rows_of(recs)
    assert [(r["batch"], r["precision"], r["vs_fp32"] is None) for r in rows] == [
        (1, "fp32", True), (4, "fp32", True), (1, "int8", False), (4, "int8", False)]
    assert rows[3]["vs_fp32"] == pytest.approx(12 / 7, rel=0.05)
    assert sum(r["ship"] == "SHIP" for r in rows) == 2


def test_written_reports_hold_no_samples_no_local_paths_and_standard_json():
    recs = [_rec("cpu", "fp32", 4.0, seed=1), _rec("mobile", "fp16", 1.0, seed=2, device="local", transport="local")]
    recs[0]["bench"]["accuracy"]["outputs"]["y"]["metrics"]["snr_db"] = float("inf")
    text = render(recs, "json")
    assert "Infinity" not in text and "NaN" not in text
    doc = json.loads(text)
    assert all(not k.startswith("_") for r in doc["rows"] for k in r)
    assert {r["device_truth"] for r in doc["rows"]} == {"device", "build-host"}
    rows = list(csv.DictReader(io.StringIO(render(recs, "csv"))))
    assert "_samples" not in rows[0] and rows[0]["agreement_ci"].startswith("100.0% (16/16")
    page = render(recs, "html")
    assert 'class="ok untrue host"' in page or 'class="ok host untrue"' in page


def test_plot_labels_name_the_batch_and_where_a_row_was_measured():
    from edgeopt.reporting import _label, html_dependency_note

    recs = [_rec("cpu", "fp32", 4.0, seed=1), _rec("cpu", "fp32", 12.0, seed=3, batch=4),
            _rec("mobile", "fp16", 1.0, seed=2, device="local", transport="local")]
    labels = [_label(r, False) for r in rows_of(recs)]
    assert labels == ["cpu-fp32 @ box", "cpu-fp32 batch 4 @ box", "mobile-fp16 @ local (build host)"]
    if html_dependency_note() is None:  # matplotlib: every plot drawn, the not-device rows among them
        assert render(recs, "html").count("data:image/png;base64,") == 3


def test_pick_takes_records_or_labelled_rows_for_other_callers():
    recs = [_rec("cpu", "fp32", 4.0, seed=1), _rec("cpu", "int8", 2.0, seed=2)]
    (v,) = decide.pick(recs)
    assert v.ship == "cpu-int8" and v.clear and v.line == _verdict(recs)[0]["line"]
    rows = rows_of(recs)
    for r, threads in zip(rows, (4, 2)):
        r["label"] = f"{r['target']}-{r['precision']} threads {threads}"
    (v,) = decide.pick(rows, one_group=True)
    assert v.ship == "cpu-int8 threads 2" and v.runner_up == "cpu-fp32 threads 4"


def test_with_every_run_listed_each_artifacts_latest_run_decides():
    old = _rec("cpu", "int8", 1.0, seed=2)  # 22:02, fast
    new = _rec("cpu", "int8", 8.0, seed=5)  # 22:05, slow: the latest word on cpu-int8
    (v,) = _verdict([_rec("cpu", "fp32", 4.0, seed=1), old, new])
    assert v["ship"] == "cpu-fp32" and v["clear"] and v["measured"].endswith("22:01:00Z")
    rows = rows_of([_rec("cpu", "fp32", 4.0, seed=1), old, new])
    assert [r["ship"] for r in rows] == ["SHIP", None, None]


def test_an_accuracy_not_judged_here_is_not_a_refusal():
    """An h100 bundle's host check says ``passed: None`` (checked on its device): the gate prediction cannot
    tell, it does not refuse ("fails its bound" was what a None read as)."""
    from edgeopt.decide import gate_defaults_accept

    assert gate_defaults_accept({"passed": None, "outputs": {}})[0] is None
    assert gate_defaults_accept({"passed": False, "summary": "x", "outputs": {}})[0] is False


def test_no_clear_winner_across_targets_names_no_gate_that_gate_would_refuse():
    """A tie between an Intel CPU's cpu and intel-cpu bundles: `edgeopt gate` compares two bundles of one
    target, so the line names no gate command across targets and says why; within a target it names one."""
    intel = "Intel(R) Xeon(R) Platinum 8480+"
    recs = [_rec("cpu", "fp32", 4.0, seed=1, cpu=intel), _rec("intel-cpu", "fp32", 4.0, seed=2, cpu=intel)]
    (v,) = _verdict(recs)
    assert not v["clear"] and v["paired"] is None and "edgeopt gate" not in v["line"]
    assert "no paired gate separates different targets" in v["line"]
    (v,) = _verdict([_rec("cpu", "fp32", 4.0, seed=1), _rec("cpu", "int8", 4.0, seed=2)])
    assert v["paired"] and v["paired"].startswith("edgeopt gate ") and "cpu-int8" in v["paired"]
