"""The agent under the oldest Python it supports (issue 31 item 3): ≥ 3.8, with numpy 1.17.4 — what JetPack 5's
Ubuntu 20.04 ships (python3-numpy), installed from PyPI as a wheel into a venv of pyenv's 3.8 by
``scripts/install.sh --test`` (``~/.cache/edgeopt/agent-floor/py3.8``; ``$EDGEOPT_FLOOR_PYTHON`` names another).

Two parts, both under that interpreter: (1) every agent module imported, the probe verb, the accuracy
comparison (``compare_outputs`` on a real bundle's reference outputs, every output kind it infers), the timing
loop and its statistics, the bundle's validation data read and laid out for the artifact; (2) the host's real
path to a device whose ``python:`` is that interpreter: the preflight, the agent installed, a bundle pushed,
verified, activated, committed, listed, rolled back and gc'd by the store, and a bench refused in one line
because that device has no runtime (the stdlib + numpy agent still answers). Skipped, with the reason, where
the interpreter is absent. The bench itself on an old Python and numpy runs in the emulated bullseye board
(Python 3.9, numpy 1.19, ONNX Runtime: tests/devices/test_emulated_arm.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLOOR = (3, 8)


def floor_python() -> Path | None:
    env = os.environ.get("EDGEOPT_FLOOR_PYTHON")
    p = Path(env) if env else Path.home() / ".cache" / "edgeopt" / "agent-floor" / "py3.8" / "bin" / "python"
    return p if p.exists() else None


@pytest.fixture(scope="module")
def old_python() -> Path:
    p = floor_python()
    if p is None:
        pytest.skip("no Python 3.8 venv for the agent's floor (scripts/install.sh --test makes one from pyenv's "
                    "3.8 and numpy's PyPI wheel; or set EDGEOPT_FLOOR_PYTHON)")
    return p


# Run by the old interpreter with the agent package copied beside it (as it is on a device): prints one JSON.
SMOKE = r'''
import importlib, json, pkgutil, sys, time
import numpy as np
import edgeopt_agent
mods = sorted(m.name for m in pkgutil.walk_packages(edgeopt_agent.__path__, "edgeopt_agent."))
failed = {}
for m in mods:
    try:
        importlib.import_module(m)
    except ImportError as e:  # a runtime a runner names lazily is fine; the agent's own code must import
        failed[m] = repr(e)
    except Exception as e:
        failed[m] = repr(e)
from edgeopt_agent import bench, bundle, compare
bdir = sys.argv[1]
man = bundle.load_manifest(bdir)
ver = bundle.verify(bdir, man)
ins = bundle.validation_inputs(bdir, man)
ref = bundle.reference_outputs(bdir, man)
feeds = [bundle.to_artifact(f, man["io"]["inputs"]) for f in ins]
same = compare.compare_outputs(ref, ref, "fp32")
rng = np.random.default_rng(0)
noisy = {k: (v + rng.standard_normal(v.shape).astype(v.dtype) * np.abs(v).max() * 0.3) for k, v in ref.items()}
worse = compare.compare_outputs(noisy, ref, "fp32")
half = compare.compare_outputs({k: v.astype(np.float16).astype(np.float32) for k, v in ref.items()}, ref, "fp16")
kinds = {}
for shape in ((1, 1000), (1, 84, 400), (1, 32, 96), (2, 3, 8, 8)):
    a = rng.standard_normal(shape).astype(np.float32)
    r = compare.compare_outputs({"y": a * 1.0001}, {"y": a}, "fp16")
    kinds[str(shape)] = [r["outputs"]["y"]["kind"], r["passed"]]
w = rng.standard_normal((64, 64)).astype(np.float32)
ns = bench.timed_loop(lambda f: f @ w, [rng.standard_normal((1, 64)).astype(np.float32)], min_iters=20, duration_s=0.05)
stats = bench.latency_stats(ns)
print(json.dumps({"python": list(sys.version_info[:3]), "numpy": np.__version__, "modules": len(mods),
                  "failed": failed, "verified": ver, "inputs": len(ins), "feed_shapes": [list(v.shape) for v in feeds[0].values()],
                  "same": [same["passed"], same["summary"]], "worse": [worse["passed"], worse["summary"]],
                  "fp16": [half["passed"], half["summary"]], "kinds": kinds, "iters": int(len(ns)),
                  "p50": stats["p50"]}, default=str))
'''


def _agent_copy(dest: Path) -> Path:
    """The agent package as the host ships it (edgeopt.deploy.agent_package: sources, no caches)."""
    from edgeopt.deploy import agent_package

    for rel, p in agent_package().files:
        (dest / "edgeopt_agent" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, dest / "edgeopt_agent" / rel)
    return dest


def test_the_agent_runs_on_the_oldest_python_it_supports(old_python, cls_bundle, tmp_path):
    here = _agent_copy(tmp_path / "dev")
    p = subprocess.run([str(old_python), "-I", "-c", f"import sys; sys.path.insert(0, {str(here)!r})\n" + SMOKE,
                        str(cls_bundle)], capture_output=True, text=True, timeout=180, cwd=here,
                       env={"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8"})
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert tuple(r["python"][:2]) == FLOOR, r["python"]
    # every module imports (a runner imports its runtime only in load(): none is installed here)
    assert r["modules"] >= 15 and r["failed"] == {}, r["failed"]
    assert r["verified"]["ok"] and r["inputs"] >= 4 and r["feed_shapes"] == [[1, 3, 48, 192]], r
    assert r["same"][0] is True and r["worse"][0] is False and r["fp16"][0] is True, r
    assert r["kinds"]["(1, 1000)"] == ["logits", True] or r["kinds"]["(1, 1000)"][1] is True, r["kinds"]
    assert all(ok for _, ok in r["kinds"].values()), r["kinds"]
    assert r["iters"] >= 20 and r["p50"] > 0


def test_the_hosts_path_to_a_device_on_the_oldest_python(old_python, cls_bundle, tmp_path):
    """Preflight, agent install and every store verb, run by the 3.8 interpreter through the host's own code."""
    from edgeopt.deploy import DeviceSession, load_bundle
    from edgeopt.inventory import make_device

    dev = make_device("py38", {"transport": "local", "python": str(old_python), "root": str(tmp_path / "root"),
                               "target": "cpu"})
    b = load_bundle(cls_bundle)
    with DeviceSession.open(dev) as sess:
        facts = sess.probe()
        assert facts["python"].startswith("3.8.") and facts["numpy"], facts
        assert facts["emulated"] is False and not facts["runtimes"].get("onnxruntime")
        pr = sess.push([b])
        assert pr.ok and pr.bundles[0].status == "installed", pr
        assert sess.verify(b.bundle_id)["ok"]
        assert sess.push([b]).bundles[0].status == "present"
        slot = sess.activate(b.bundle_id)["slot"]
        sess.commit(slot, b.bundle_id)
        assert sess.listing()["slots"][slot]["current"] == b.bundle_id
        sess.rollback(slot, to_empty=True)
        assert sess.listing()["slots"][slot]["current"] is None
        # no runtime on this device: the agent says so in one line, it does not crash
        reply = sess.agent("bench", {"root": sess.root, "bundle_id": b.bundle_id,
                                     "options": {"duration_s": 0.2, "min_iters": 2, "warmup": 0}}, timeout=120)
        sess.gc(keep=0, grace_s=0)
        assert sess.has([b.bundle_id]) == {b.bundle_id: False}  # nothing uses it: collected
    assert reply["ok"] is False, reply
    err = reply["error"]
    assert "onnxruntime" in err["message"] and "\n" not in err["message"].strip(), err
