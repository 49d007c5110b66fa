"""Load scenarios on the device: MLPerf LoadGen for real (short runs), the agent's own loops without it."""

from __future__ import annotations

import pytest

from tests.agent.conftest import agent


def _bench(bundle, **opts):
    rc, reply = agent("bench", {"bundle": str(bundle), "options": {"duration_s": 1.0, "timeout_s": 120, **opts}})
    return rc, reply


@pytest.mark.parametrize("scenario, extra", [
    ("single-stream", {}), ("server", {"target_qps": 50, "latency_bound_ms": 200, "latency_percentile": 90}),
    ("offline", {"target_qps": 200}), ("multi-stream", {"samples_per_query": 2}),
])
def test_loadgen_scenarios_run_and_report_loadgens_own_verdict(tiny_bundle, scenario, extra):
    pytest.importorskip("mlperf_loadgen")
    rc, reply = _bench(tiny_bundle, scenario=scenario, engine="loadgen", **extra)
    assert rc == 0, reply
    sc = reply["bench"]["scenario"]
    assert sc["engine"] == "loadgen" and sc["scenario"] == scenario and sc["valid"] in (True, False)
    assert "MLPerf Results Summary" in sc["summary_log"] and sc["latency_ms"]["p50"] > 0
    assert sc["samples_served"] > 0 and sc["seeds"]
    if scenario == "server":
        assert 20 < sc["scheduled_qps"] < 100  # Poisson arrivals at 50/s over ~1 s
        # ~50 queries in 1 s are short of LoadGen's early-stopping minimum for p90 (64): never rounded up
        if sc["completed_qps"] * 1.0 < 64:
            assert sc["valid"] is False and "Early stopping satisfied" in sc["invalid_reasons"]


def test_without_loadgen_the_agents_own_server_loop_counts_the_queue(tiny_bundle):
    rc, reply = _bench(tiny_bundle, scenario="server", engine="edgeopt", target_qps=100, latency_bound_ms=1000,
                       latency_percentile=99)
    assert rc == 0, reply
    sc = reply["bench"]["scenario"]
    assert sc["engine"] == "edgeopt" and "not LoadGen" in sc["note"]
    assert sc["bound"]["samples_needed"] == 662 and sc["valid"] is (sc["bound"]["samples"] >= 662)


@pytest.mark.parametrize("opts, msg", [
    ({"scenario": "server"}, "target_qps > 0"), ({"scenario": "server", "target_qps": 0}, "target_qps > 0"),
    ({"scenario": "burst"}, "unknown scenario"), ({"scenario": "single-stream", "samples_per_query": 4},
                                                  "multi-stream scenario only"),
    ({"scenario": "offline", "engine": "edgeopt"}, "needs LoadGen"),
    ({"scenario": "server", "target_qps": 5, "latency_percentile": 101}, "latency_percentile"),
])
def test_scenario_options_that_make_no_sense_are_refused(tiny_bundle, opts, msg):
    rc, reply = _bench(tiny_bundle, **opts)
    assert rc == 1 and msg in reply["error"]["message"]
