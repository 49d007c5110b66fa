"""The agent's probe, its light imports and its JSON framing, run as on a device."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import edgeopt_agent
from tests.agent.conftest import agent


def test_probe_reports_device_cpu_memory_disk_and_runtimes(tmp_path):
    rc, reply = agent("probe", {"root": str(tmp_path / "root")})
    p = reply["probe"]
    assert rc == 0 and reply["ok"]
    assert p["os"] and p["arch"] and p["hostname"] and p["python"].count(".") == 2
    assert p["cpu"]["cores"] == os.cpu_count() and 1 <= p["cpu"]["cores_usable"] <= p["cpu"]["cores"]
    assert p["cpu"]["model"] and isinstance(p["cpu"]["flags_subset"], list)
    assert p["memory_mb"] > 0 and p["disk_free_mb"] > 0
    assert p["root"] == str(tmp_path / "root")  # not created by a probe, free space of its parent
    assert not (tmp_path / "root").exists()
    assert isinstance(p["gpus"], list) and (p["jetson"] is None or "l4t" in p["jetson"])
    assert set(p["runtimes"]) >= {"onnxruntime", "openvino", "tflite_runtime", "ai_edge_litert", "tensorrt",
                                  "coremltools"}
    assert p["runtimes"]["onnxruntime"] == importlib.metadata.version("onnxruntime")
    assert p["agent"] == edgeopt_agent.AGENT_VERSION
    if Path("/proc/cpuinfo").exists() and "model name" in Path("/proc/cpuinfo").read_text():
        assert p["cpu"]["model"] in Path("/proc/cpuinfo").read_text()
    if shutil.which("nvidia-smi"):
        assert p["gpus"] and p["gpus"][0]["vendor"] == "nvidia"


def test_probe_version_fallback_imports_a_runtime_without_metadata_in_a_child(tmp_path, monkeypatch):
    from edgeopt_agent import probe

    (tmp_path / "vendor_rt").mkdir()
    (tmp_path / "vendor_rt" / "__init__.py").write_text("__version__ = '8.6.2'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(probe, "RUNTIMES", {"vendor": (("no-such-dist-edgeopt",), "vendor_rt"),
                                            "absent": (("no-such-dist-edgeopt",), "no_such_module_edgeopt")})
    assert probe.runtime_versions() == {"vendor": "8.6.2", "absent": None}
    assert "vendor_rt" not in sys.modules  # found by spec, imported only in the child
    assert probe.runtime_versions(import_fallback=False) == {"vendor": None, "absent": None}


def test_agent_modules_import_with_stdlib_and_numpy_only():
    code = (
        "import sys\n"
        "pre = set(sys.modules)  # what the interpreter's own site/sitecustomize loaded (a GPU image loads certifi)\n"
        "import edgeopt_agent.verbs, edgeopt_agent.bench, edgeopt_agent.store, edgeopt_agent.probe\n"
        "import edgeopt_agent.__main__, edgeopt_agent.check, edgeopt_agent.runners\n"
        "from edgeopt_agent.probe import probe\n"
        "from edgeopt_agent.store import listing\n"
        "import pathlib, tempfile\n"
        "root = pathlib.Path(tempfile.mkdtemp())\n"
        "probe(root, import_fallback=False); listing(root)\n"
        "third = {m.split('.')[0] for m in set(sys.modules) - pre} - set(sys.stdlib_module_names)\n"
        "third = {m for m in third if not m.startswith('_')}\n"
        "assert third <= {'numpy', 'edgeopt_agent', 'cython_runtime'}, third  # cython_runtime: numpy's\n"
        "assert 'onnxruntime' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_agent_runs_from_a_plain_copy_of_its_folder(tmp_path, tiny_bundle):
    """On a device the agent is a copied folder on PYTHONPATH/cwd, not an installed package."""
    src = Path(edgeopt_agent.__file__).parent
    shutil.copytree(src, tmp_path / "edgeopt_agent", ignore=shutil.ignore_patterns("__pycache__"))
    rc, reply = agent("probe", {"root": str(tmp_path / "r")}, cwd=tmp_path)
    assert reply["probe"]["agent_path"] == str((tmp_path / "edgeopt_agent").resolve())
    rc, reply = agent("bench", {"bundle": str(tiny_bundle), "options": {"duration_s": 0.1, "min_iters": 5}},
                      cwd=tmp_path)
    assert rc == 0 and reply["bench"]["accuracy"]["passed"]


def test_unknown_verb_and_malformed_json_are_one_json_error():
    rc, reply = agent("fly")
    assert rc == 1 and "unknown verb 'fly'" in reply["error"]["message"] and "bench" in reply["error"]["message"]
    proc = subprocess.run([sys.executable, "-m", "edgeopt_agent", "probe"], input="{not json",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and '"ok": false' in proc.stdout and proc.stdout.count("\n") == 1
    proc = subprocess.run([sys.executable, "-m", "edgeopt_agent", "has"], input="[1]",
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "must be a JSON object" in proc.stdout
