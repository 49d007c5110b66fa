"""rollout --eval: a labelled set scored on each device beside the incumbent (real bundles, real agents)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml

from tests.fleet.test_rollout import _edgeopt


def _eval_set(bundle: Path, out: Path) -> Path:
    """The bundle's validation crops (real images) and their flipped copies, labelled with the FP32
    reference model's own decisions (the labels a team would get from its reference model)."""
    m = json.loads((bundle / "manifest.json").read_text())
    x = np.load(bundle / m["validation"]["inputs"])
    ref = np.load(bundle / m["validation"]["reference"])
    arr = x[x.files[0]]
    labels = np.argmax(ref[ref.files[0]], axis=-1).reshape(len(arr), -1)[:, 0]
    name = m["io"]["inputs"][0]["name"]
    np.savez(out, **{name: arr, "labels": labels.astype(np.int64)})
    return out


def test_eval_passes_a_faithful_version_and_halts_a_worse_one(versions, tmp_path):
    devs = {f"d{i}": {"transport": "local", "root": str(tmp_path / f"r{i}"), "target": "cpu"} for i in range(3)}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({"devices": devs}))
    ev = _eval_set(versions["v1"], tmp_path / "eval.npz")
    common = ["--devices", "fleet.yaml", "--waves", "1,100%", "--no-latency-gate", "--json", "--events", "ev.jsonl"]
    assert _edgeopt("rollout", str(versions["v1"]), *common, cwd=tmp_path).returncode == 0
    p = _edgeopt("rollout", str(versions["v2"]), *common, "--eval", str(ev), cwd=tmp_path)
    assert p.returncode == 0, p.stdout[-1500:] + p.stderr[-1500:]
    evs = [json.loads(x) for x in (tmp_path / "ev.jsonl").read_text().splitlines()]
    scored = [e for e in evs if e["step"] == "gate-eval"]
    assert len(scored) == 3 and all(e["status"] == "pass" and e["n"] == len(np.load(ev)["labels"]) for e in scored)
    assert all(e["incumbent"] == 1.0 and e["candidate"] == 1.0 for e in scored)
    # the perturbed-weights candidate reads the same inputs differently: halted at the canary by --eval
    p = _edgeopt("rollout", str(versions["bad"]), *common, "--eval", str(ev), cwd=tmp_path)
    assert p.returncode == 5, p.stdout[-1500:] + p.stderr[-1500:]
    summary = json.loads(p.stdout)
    canary = summary["waves"][0]["outcomes"][0]
    assert canary["step"] == "gate" and "eval top-1" in canary["reason"] and "dropped more than" in canary["reason"]
    assert len(summary["waves"]) == 1
    # the inputs went to each device once, content-addressed; the labels stayed on the host
    for i in range(3):
        files = list((tmp_path / f"r{i}" / "eval").glob("*.npz"))
        assert len(files) == (1 if i in _scored_devices(scored) else len(files)) and all(
            "labels" not in np.load(f).files for f in files)


def _scored_devices(scored: list[dict]) -> set[int]:
    return {int(e["device"][1:]) for e in scored}


def test_eval_bad_input_is_one_line(versions, tmp_path):
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump({"devices": {"d0": {
        "transport": "local", "root": str(tmp_path / "r0"), "target": "cpu"}}}))
    np.savez(tmp_path / "nolabels.npz", x=np.zeros((2, 1, 3, 48, 192), np.float32))
    np.savez(tmp_path / "wrongshape.npz", x=np.zeros((2, 1, 3, 48, 100), np.float32), labels=np.array([0, 1]))
    for f, msg in (("missing.npz", "does not exist"), ("nolabels.npz", "needs `labels`"),
                   ("wrongshape.npz", "takes")):
        p = _edgeopt("rollout", str(versions["v1"]), "--devices", "fleet.yaml", "--eval", str(tmp_path / f),
                     cwd=tmp_path)
        assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, (f, p.stderr)
    assert not (tmp_path / "r0").exists()
