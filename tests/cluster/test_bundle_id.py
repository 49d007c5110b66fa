"""A bundle's id (sha256 of manifest.json) is what determines the artifact: the build's and the host check's
timings, when and on which host, are in build-times.json beside it (issue 44: a cluster build and a local build
of one job have one id). The builds themselves are compared in test_cluster.py."""

from __future__ import annotations

import json


def _manifest(time_s: float, node: str, passed: bool = True) -> dict:
    return {"schema": 1, "kind": "edgeopt.bundle", "model": {"name": "m"}, "target": "cpu", "precision": "fp32",
            "runtime": {"name": "onnxruntime", "artifact": "model.onnx"},
            "build": {"time_s": time_s, "built_at": f"2026-11-28T17:{int(time_s) % 60:02d}:00Z",
                      "host": {"machine": "x86_64", "node": node}, "cache_key": "k" * 64},
            "host_check": {"kind": "numeric", "passed": passed, "load_s": time_s / 10, "validation_s": time_s / 3,
                           "summary": "passed"}}


def test_timings_and_host_stay_out_of_the_id_and_are_kept_beside_it(tmp_path):
    from edgeopt.deploy import load_bundle
    from edgeopt.targets.base import BUILD_TIMES, build_times, write_manifest

    b = tmp_path / "b"
    b.mkdir()
    (b / "model.onnx").write_bytes(b"not really a model, but listed and hashed")
    ids = []
    for t, node in ((1.5, "builder-1"), (99.25, "worker-7")):
        m = _manifest(t, node)
        write_manifest(b, m)
        assert m["build"]["time_s"] == t and m["host_check"]["load_s"] == t / 10  # the caller's dict keeps them
        assert build_times(b) == {"build": {"time_s": t, "built_at": m["build"]["built_at"],
                                            "host": {"machine": "x86_64", "node": node}},
                                  "host_check": {"load_s": t / 10, "validation_s": t / 3}}
        ids.append(load_bundle(b).bundle_id)
    assert ids[0] == ids[1]
    written = json.loads((b / "manifest.json").read_text())
    assert written["build"] == {"cache_key": "k" * 64}
    assert "load_s" not in written["host_check"] and written["host_check"]["passed"] is True
    assert set(written["files"]) == {"model.onnx"}  # build-times.json is no file of the bundle (not pushed)
    assert (b / BUILD_TIMES).is_file()
    # what the artifact is (here: its check's verdict) still changes the id
    write_manifest(b, _manifest(1.5, "builder-1", passed=False))
    assert load_bundle(b).bundle_id != ids[0]
