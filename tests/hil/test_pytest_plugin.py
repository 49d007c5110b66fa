"""The pytest plugin, run for real: pytest in a subprocess on a small HIL test file, with a rig of local
devices (each its own agent root) and a real bundle of the PP-OCR classifier; outcomes read back from
the JUnit XML with junitparser, runs read back from the results DB."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.hil.conftest import _build, same_speed_gate

TEST_FILE = '''
import sqlite3

import pytest

BUNDLE = {bundle!r}
BAD = {bad!r}
SAME_SPEED = {gate!r}  # the bundle against itself: loose latency bounds at level 1%


def test_rig(edgeopt_rig):
    assert edgeopt_rig.names() == ["lab-a", "lab-b", "desk", "orin"]


def test_each_device(edgeopt_device):
    assert edgeopt_device.transport == "local" and edgeopt_device.root


@pytest.mark.hil(target="cpu", label="lab")
def test_bench(edgeopt_hil, edgeopt_device):
    res = edgeopt_hil.bench(BUNDLE, duration=0.3, min_iters=5, warmup=2)
    (rec,) = res.records
    assert rec.ok and rec.device["name"] == edgeopt_device.name
    assert rec.bench["latency_ms"]["p50"] > 0


@pytest.mark.hil(target="jetson")
def test_jetson_alias(edgeopt_device):
    assert edgeopt_device.name == "orin"


@pytest.mark.hil(target="rpi5")
def test_no_such_device(edgeopt_device):
    raise AssertionError("must not run")


@pytest.mark.hil(target="jetsn")
def test_typo(edgeopt_device):
    raise AssertionError("must not run")


def test_gate(edgeopt_hil):
    res = edgeopt_hil.gate(BUNDLE, BUNDLE, "desk", budget="3s", gate=SAME_SPEED, check=False)
    assert res["verdict"] in ("pass", "inconclusive"), res["verdict"]
    assert [d["device"] for d in res["devices"]] == ["desk"]


def test_gate_catches_a_regression(edgeopt_hil):
    edgeopt_hil.gate(BAD, BUNDLE, "desk", budget="4s")  # perturbed weights: other decisions


def test_plain():
    assert 1 + 1 == 2
'''


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> tuple[Path, Path]:
    """The PP-OCR classifier, and the same with perturbed weights (same speed, other decisions)."""
    from tests.conftest import fixture
    from tests.hil.models import perturbed

    src = Path(fixture("ocr-cls"))
    d = tmp_path_factory.mktemp("plugin")
    return _build(src, d / "dist"), _build(perturbed(src, d / "bad" / src.name, scale=0.3), d / "dist-bad")


def _rig(path: Path) -> Path:
    devs = {"lab-a": ("cpu", "lab"), "lab-b": ("cpu", "lab"), "desk": ("cpu", "desk"), "orin": ("jetson-orin", "lab")}
    lines = ["devices:"]
    for name, (target, label) in devs.items():
        lines += [f"  {name}:", "    transport: local", f"    root: {path / 'roots' / name}",
                  f"    target: {target}", f"    labels: [{label}]"]
    rig = path / "rig.yaml"
    rig.write_text("\n".join(lines) + "\n")
    return rig


def _pytest(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, tuple[str, str]]]:
    """Run pytest on cwd/test_hil_demo.py; -> (process, {test id: (outcome, message)}) from the JUnit XML."""
    from junitparser import Error, Failure, JUnitXml, Properties, Property, Skipped

    junit = cwd / f"junit-{len(list(cwd.glob('junit-*.xml')))}.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "test_hil_demo.py", "-p", "no:cacheprovider",
                           "--strict-markers", "-q", f"--junitxml={junit}", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    out: dict[str, tuple[str, str]] = {}
    if junit.is_file():
        for suite in JUnitXml.fromfile(str(junit)):
            for case in suite:
                res = case.result
                kind = next((k for t, k in ((Failure, "failed"), (Error, "error"), (Skipped, "skipped"))
                             for r in res if isinstance(r, t)), "passed")
                out[case.name] = (kind, " ".join((r.message or "") for r in res))
                props = case.child(Properties)
                out[case.name + "#props"] = ("", " ".join(f"{p.name}={p.value}" for p in props.iterchildren(Property))
                                             if props is not None else "")
    return proc, out


@pytest.fixture(scope="module")
def demo(tmp_path_factory, bundles) -> Path:
    d = tmp_path_factory.mktemp("demo")
    text = TEST_FILE.format(bundle=str(bundles[0]), bad=str(bundles[1]), gate=str(same_speed_gate(d)))
    (d / "test_hil_demo.py").write_text(textwrap.dedent(text))
    return d


def test_plugin_runs_hil_tests_on_the_rig(demo):
    from edgeopt.results import ResultsDB

    rig, db = _rig(demo), demo / "hil.db"
    proc, cases = _pytest(demo, "--edgeopt-rig", str(rig), "--edgeopt-db", str(db))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]  # 1: the regression's failure
    outcome = {k: v[0] for k, v in cases.items() if not k.endswith("#props")}
    assert outcome == {
        "test_rig": "passed",
        **{f"test_each_device[{n}]": "passed" for n in ("lab-a", "lab-b", "desk", "orin")},
        # the marker filter: cpu + lab = lab-a, lab-b (not desk: other label; not orin: other target)
        "test_bench[lab-a]": "passed", "test_bench[lab-b]": "passed",
        "test_jetson_alias[orin]": "passed",  # `jetson` is an alias of the rig's jetson-orin
        "test_no_such_device[no-device]": "skipped", "test_typo[no-device]": "skipped",
        "test_gate": "passed", "test_gate_catches_a_regression": "failed", "test_plain": "passed"}
    msg = cases["test_gate_catches_a_regression"][1]
    assert "edgeopt gate on desk: REGRESSED" in msg and "decisions regressed" in msg, msg
    assert "matches target='rpi5'" in cases["test_no_such_device[no-device]"][1]
    assert "did you mean 'jetson'?" in cases["test_typo[no-device]"][1]
    # the headline figures went to the JUnit properties, the runs to the results DB
    assert "edgeopt.lab-a.cpu-fp32.p50_ms=" in cases["test_bench[lab-a]#props"][1]
    assert "edgeopt.desk.gate=" in cases["test_gate#props"][1]
    with ResultsDB(db, create=False) as rdb:
        recs = rdb.query()
    benched = sorted(r["device"]["name"] for r in recs if r["status"] == "ok")
    gated = [(r["device"]["name"], r["status"]) for r in recs if r["status"].startswith("gate-")]
    assert benched == ["lab-a", "lab-b"] and len(gated) == 2 and ("desk", "gate-regressed") in gated
    # each device measured in its own agent root
    assert (demo / "roots" / "lab-a").is_dir() and (demo / "roots" / "lab-b").is_dir()
    assert not (demo / "roots" / "orin").exists()


def test_plugin_without_rig_skips_with_the_reason(demo):
    proc, cases = _pytest(demo, "-rs")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # -rs names the skipped test's own file and line, not the plugin's line that raised the skip
    summary = [ln for ln in proc.stdout.splitlines() if ln.startswith("SKIPPED")]
    assert summary and all("test_hil_demo.py:" in ln for ln in summary), summary
    assert "pytest_plugin.py" not in proc.stdout
    outcome = {k: v for k, v in cases.items() if not k.endswith("#props")}
    assert outcome["test_plain"][0] == "passed"
    skipped = {k for k, v in outcome.items() if v[0] == "skipped"}
    assert skipped == {"test_rig", "test_each_device[no-rig]", "test_bench[no-rig]", "test_jetson_alias[no-rig]",
                       "test_no_such_device[no-rig]", "test_typo[no-rig]", "test_gate",
                       "test_gate_catches_a_regression"}
    assert all("--edgeopt-rig" in outcome[k][1] for k in skipped)
    assert not (demo / "edgeopt-results.db").exists()  # nothing measured, nothing recorded


def test_plugin_bad_rig_is_one_line(demo, tmp_path):
    bad = tmp_path / "rig.yaml"
    bad.write_text("devices:\n  x:\n    transport: local\n    tagret: cpu\n")
    proc, _ = _pytest(demo, "--edgeopt-rig", str(bad))
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "--edgeopt-rig" in err[0] and "tagret" in err[0], proc.stderr
    assert "Traceback" not in proc.stderr
