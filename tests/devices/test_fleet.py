"""Bench fan-out over real SSH servers: a dead device, a crashing runtime and a hanging runtime are
each reported, and the healthy device's measurement completes in the same run."""

from __future__ import annotations

import socket

from edgeopt.deploy import load_bundle
from edgeopt.fleetbench import bench_fleet, plan
from edgeopt.inventory import load_inventory, local_device, make_device
from edgeopt.results import ResultsDB

from .conftest import device_entry, known_hosts, write_inventory

FAST = {"duration_s": 0.5, "min_iters": 20, "warmup": 3, "return_samples": True}


def test_bench_fleet_reports_dead_crashing_and_hanging_devices_others_finish(ssh_env, sshd, tmp_path, cls_bundle):
    second = ssh_env.make("fleet-b")
    kh = known_hosts(tmp_path / "known_hosts", sshd, second)
    with socket.socket() as s:  # a port nothing listens on: the device is off
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    inv = write_inventory(tmp_path / "devices.yaml", {
        "good": device_entry(ssh_env, sshd, tmp_path / "r-good", kh, target="cpu"),
        # the kernel stops this runtime at 1 CPU-second (SIGXCPU): a real crash of the runtime process
        "fragile": device_entry(ssh_env, sshd, tmp_path / "r-fragile", kh, target="cpu",
                                bench={"duration_s": 20, "limits": {"cpu_s": 1}}),
        # a runtime that will not finish within its timeout is killed and reported as hung
        "stuck": device_entry(ssh_env, second, tmp_path / "r-stuck", kh, target="cpu",
                              bench={"timeout_s": 4, "duration_s": 1, "min_iters": 10_000_000}),
        "off": {**device_entry(ssh_env, sshd, tmp_path / "r-off", kh, target="cpu"), "port": dead_port,
                "connect_timeout": 2},
        "other-target": device_entry(ssh_env, sshd, tmp_path / "r-o", kh, target="jetson"),
        "stranger": device_entry(ssh_env, second, tmp_path / "r-s", tmp_path / "empty_known_hosts", target="cpu"),
    })
    (tmp_path / "empty_known_hosts").write_text("")
    devices = load_inventory(inv).select()
    with ResultsDB(tmp_path / "results.db") as db:
        res = bench_fleet(devices, [load_bundle(cls_bundle)], FAST, db=db, jobs=4)
        stored = db.query()
    by = {r.device["name"]: r for r in res.records}
    assert set(by) == {"good", "fragile", "stuck", "off", "stranger"}
    assert res.skipped == [{"device": "other-target", "reason": "no bundle for target 'jetson-orin'"}]
    good = by["good"]
    assert good.status == "ok", good.error
    assert good.bench["latency_ms"]["p50"] > 0 and good.bench["iterations"] >= 20
    assert good.bench["accuracy"]["passed"] and len(good.bench["samples_ms"]) == good.bench["iterations"]
    assert by["fragile"].status == "crashed" and by["fragile"].error["type"] == "RuntimeCrashed"
    assert "SIGXCPU" in by["fragile"].error["message"]
    assert by["stuck"].status == "hung" and by["stuck"].error["type"] == "RuntimeHung"
    assert by["off"].status == "unreachable" and "cannot connect" in by["off"].error["message"]
    assert by["stranger"].status == "refused" and by["stranger"].error["type"] == "HostKeyError"
    assert not (tmp_path / "r-s").exists()  # nothing was sent to a host we could not authenticate
    assert not res.ok
    assert sorted(r["status"] for r in stored) == ["crashed", "hung", "ok", "refused", "unreachable"]
    assert all(r["run_id"] == res.run_id for r in stored)


def test_plan_matches_targets_and_local_takes_runnable_bundles(tmp_path, cls_bundle):
    b = load_bundle(cls_bundle)
    local = local_device(root=str(tmp_path / "r"))
    mobile = make_device("rpi", {"host": "h", "target": "mobile"})
    notarget = make_device("bare", {"host": "h"})
    work, skipped = plan([local, mobile, notarget], [b])
    assert [(d.name, [x.target for x in bs]) for d, bs in work] == [("local", ["cpu"])]
    assert {s["device"] for s in skipped} == {"rpi", "bare"}
    assert plan([local], [b], targets=["intel-cpu"])[0] == []
