"""The README's main job through the CLI: `edgeopt run` builds, pushes over SSH (and to `local`),
benches and reports; `edgeopt report` renders every format; the HTML report renders in Chromium."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from edgeopt.cli import main
from tests.conftest import fixture

from .conftest import device_entry, known_hosts, write_inventory

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def ran(ssh_env, tmp_path_factory):
    """One `edgeopt run` of the real text-orientation classifier on an SSH device and on `local`."""
    from _pytest.monkeypatch import MonkeyPatch

    from .conftest import Sshd  # noqa: F401  (type of the server below)

    tmp = tmp_path_factory.mktemp("run")
    server = ssh_env.make("run")
    inv = write_inventory(tmp / "devices.yaml", {
        "box": device_entry(ssh_env, server, tmp / "box-root", known_hosts(tmp / "kh", server), target="cpu",
                            labels=["lab"]),
    })
    mp = MonkeyPatch()
    mp.setenv("EDGEOPT_AGENT_ROOT", str(tmp / "local-root"))
    mp.chdir(tmp)
    try:
        rc = main(["run", str(fixture("ocr-cls")), "--targets", "cpu", "--shape", "x:1x3x48x192",
                   "--calib", str(fixture("images")), "--preprocess", "preset=pm1", "--out", "dist",
                   "--val-count", "6", "--devices", str(inv), "--only", "box,local", "--duration", "0.5",
                   "--min-iters", "20", "--report", "report.html", "--quiet"])
        yield {"rc": rc, "tmp": tmp, "inv": inv, "server": server}
    finally:
        mp.undo()


def test_run_over_ssh_and_local_exit_0_and_results_stored(ran, capsys):
    assert ran["rc"] == 0
    db = ran["tmp"] / "edgeopt-results.db"  # the default database, in the working directory
    assert db.is_file()
    rc = main(["report", "--db", str(db), "--format", "json"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {r["device"] for r in rows} == {"box", "local"}
    for r in rows:
        assert r["status"] == "ok" and r["model"] == "ch_ppocr_mobile_v2.0_cls_infer" and r["target"] == "cpu"
        assert 0 < r["p50_ms"] <= r["p99_ms"] and r["throughput_ips"] > 0 and r["load_s"] > 0
        assert r["peak_rss_mb"] > 0 and r["accuracy"] == "passed" and r["cosine_min"] > 0.9999
        assert r["top1"] == 1.0 and r["runtime"].startswith("onnxruntime")
    box_root = ran["tmp"] / "box-root" / "store"
    assert len([p for p in box_root.iterdir() if len(p.name) == 64]) == 1  # pushed over SSH and installed


@pytest.mark.parametrize("fmt,check", [
    ("table", lambda s: "ch_ppocr_mobile_v2.0_cls_infer" in s and "p50 ms" in s),
    ("md", lambda s: s.startswith("# ") and "| model |" in s and "| box |" in s),
    ("csv", lambda s: s.splitlines()[0].startswith("model,target,precision") and len(s.splitlines()) == 3),
])
def test_report_formats_and_filters(ran, capsys, fmt, check):
    db = str(ran["tmp"] / "edgeopt-results.db")
    assert main(["report", "--db", db, "--format", fmt]) == 0
    assert check(capsys.readouterr().out)
    assert main(["report", "--db", db, "--format", "json", "--device", "box", "--since", "1h"]) == 0
    assert [r["device"] for r in json.loads(capsys.readouterr().out)["rows"]] == ["box"]
    assert main(["report", "--db", db, "--format", "json", "--since", "2000-01-01", "--precision", "int8"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == []


def test_report_without_database_is_one_clear_error(tmp_path, capsys):
    assert main(["report", "--db", str(tmp_path / "none.db")]) == 2
    err = capsys.readouterr().err
    assert "no results database" in err and "Traceback" not in err


def test_bench_unreachable_device_exit_4_and_recorded(ran, capsys, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inv = write_inventory(tmp_path / "d.yaml", {"off": {"host": "127.0.0.1", "port": port, "target": "cpu",
                                                         "ssh_config": "none", "connect_timeout": 2,
                                                         "known_hosts": str(tmp_path / "kh")}})
    db = tmp_path / "r.db"
    rc = main(["bench", "--devices", str(inv), "--dist", str(ran["tmp"] / "dist"), "--db", str(db), "--quiet"])
    assert rc == 4
    assert "unreachable" in capsys.readouterr().out
    assert main(["report", "--db", str(db), "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["status"] == "unreachable" and "cannot connect" in row["error"]


def test_push_cli_second_run_sends_nothing(ran, capsys):
    args = ["push", "--devices", str(ran["inv"]), "--dist", str(ran["tmp"] / "dist"), "--json", "--quiet"]
    assert main(args) == 0
    (res,) = json.loads(capsys.readouterr().out)["items"]
    assert res["device"] == "box" and res["bytes_sent"] == 0 and res["bundles"][0]["status"] == "present"


def _screenshot(html: Path, png: Path, tmp: Path) -> None:
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp / 'chromium-profile'}", f"--screenshot={png}", "--window-size=1400,1800",
                    html.resolve().as_uri()], check=True, capture_output=True, timeout=120)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (apt-get install chromium)")
def test_html_report_renders_table_and_plots_in_chromium(ran, tmp_path):
    import matplotlib.image as mpimg
    import numpy as np

    html = ran["tmp"] / "report.html"
    text = html.read_text()
    assert "<table" in text and text.count("data:image/png;base64,") == 3
    assert "http://" not in text and "https://" not in text and "<script" not in text  # self-contained
    png = tmp_path / "report.png"
    _screenshot(html, png, tmp_path)
    shutil.copy(png, ran["tmp"] / "report.png")
    img = (mpimg.imread(png)[..., :3] * 255).round().astype(np.uint8)
    assert img.shape[:2] == (1800, 1400)

    def has(rgb, tol=6):
        return bool(np.any(np.all(np.abs(img.astype(int) - rgb) <= tol, axis=-1)))

    assert has((0xF6, 0xF8, 0xFA))  # the table header
    assert has((0x1A, 0x7F, 0x37))  # the throughput bars
    assert has((0x2F, 0x81, 0xF7))  # the latency-vs-accuracy points
    plots = img[250:1500].reshape(-1, 3).astype(np.uint32)
    colours = np.unique((plots[:, 0] << 16) | (plots[:, 1] << 8) | plots[:, 2])
    assert len(colours) > 50, "the plot area is nearly blank"


def test_devices_probe_over_ssh(ran, capsys):
    assert main(["devices", "--devices", str(ran["inv"]), "--probe", "--json", "--quiet"]) == 0
    (dev,) = json.loads(capsys.readouterr().out)["items"]
    assert dev["name"] == "box" and dev["probe"]["ok"]
    probe = dev["probe"]["probe"]
    assert probe["runtimes"]["onnxruntime"] and probe["python"] and probe["os"]


def test_results_latest_and_all(ran, tmp_path):
    from edgeopt.results import ResultsDB

    with ResultsDB(ran["tmp"] / "edgeopt-results.db", create=False) as src:
        recs = src.query(device="box")
    with ResultsDB(tmp_path / "copy.db") as db:
        old, new = dict(recs[-1]), dict(recs[-1])
        old["time"], new["time"] = "2024-01-01T00:00:00.000000Z", "2024-06-01T00:00:00.000000Z"
        old["run_id"], new["run_id"] = "older", "newer"
        db.add(new)
        db.add(old)
        assert [r["run_id"] for r in db.query(latest=True)] == ["newer"]
        assert [r["run_id"] for r in db.query()] == ["older", "newer"]
        assert [r["run_id"] for r in db.query(since="2024-03-01")] == ["newer"]
        assert db.query(model="other,model") == [] and len(db.query(target="cpu", precision="fp32")) == 2


def test_run_exit_3_when_the_build_fails(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGEOPT_AGENT_ROOT", str(tmp_path / "root"))
    rc = main(["run", str(fixture("ocr-cls")), "--targets", "cpu", "--shape", "x:1x3x48x192", "--out", "dist",
               "--calib", str(fixture("images")), "--preprocess", "preset=pm1", "--force",
               "--timeout", "0.01", "--quiet"])  # the converter is killed at once: a failed build
    assert rc == 3
    assert "nothing was benchmarked" in capsys.readouterr().out
