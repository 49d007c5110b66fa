"""`edgeopt debug` on the command line: MODEL (built first) and BUNDLE forms, --json (one object, the
project's schema, no bare NaN), exit codes (0 within the bound, 5 a node past it, 2 bad input), --reduce's
files, and --html with the error-by-layer plot rendered in headless Chromium (the first jump's row marked)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgeopt.cli import main
from tests.conftest import fixture

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """A cpu fp32 bundle of the real ocr-cls model, and a copy with one Conv weight changed in its artifact."""
    import onnx
    from onnx import numpy_helper

    from edgeopt import api

    model = fixture("ocr-cls")
    tmp = tmp_path_factory.mktemp("debugcli")
    rep = api.build(str(model), "cpu", precision="fp32", shapes=["x:1x3x48x192"], dist=str(tmp / "dist"),
                    val_count=4, calib_count=4)
    good = Path(rep.results[0].bundle)
    bad = tmp / "bad" / "cpu-fp32"
    shutil.copytree(good, bad)
    art = onnx.load(str(bad / "model.onnx"))
    victim = [n for n in art.graph.node if n.op_type in ("Conv", "FusedConv")][5]
    init = next(i for i in art.graph.initializer if i.name == victim.input[1])
    w = numpy_helper.to_array(init).copy()
    w[0] = -2.0 * w[0]  # output channel 0's filter flipped: a dead channel comes alive, a live one dies
    init.CopyFrom(numpy_helper.from_array(w, init.name))
    onnx.save(art, str(bad / "model.onnx"))
    return {"model": model, "good": good, "bad": bad, "victim": victim.name, "tmp": tmp}


def test_model_form_builds_then_passes(built, tmp_path, capsys):
    rc = main(["debug", str(built["model"]), "--target", "cpu", "--precision", "fp32", "--shape", "x:1x3x48x192",
               "--dist", str(tmp_path / "dist"), "--json", "-q"])
    out = capsys.readouterr().out
    doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"bare {c} in --json"))
    assert rc == 0
    assert doc["schema"] == "edgeopt/v1" and doc["kind"] == "debug"
    assert doc["passed"] is True and doc["first_jump"] is None
    assert doc["target"] == "cpu" and doc["precision"] == "fp32" and doc["observed"] > 100
    assert (tmp_path / "dist" / "ch_ppocr_mobile_v2.0_cls_infer" / "cpu-fp32" / "manifest.json").is_file()


def test_bundle_form_names_the_fault_and_reduces(built, tmp_path, capsys):
    red = tmp_path / "red"
    html = tmp_path / "debug.html"
    rc = main(["debug", str(built["bad"]), "--model", str(built["model"]), "--reduce", str(red),
               "--html", str(html), "-q"])
    out = capsys.readouterr().out
    assert rc == 5  # ran fine, a node is past the bound
    assert "first jump:" in out and f"artifact node {built['victim']}" in out
    assert "<- first jump" in out
    assert (red / "reduced.onnx").is_file() and (red / "reduced_inputs.npz").is_file()
    assert "fails alone" in out
    text = html.read_text()
    assert "data:image/png;base64," in text and 'class="jump"' in text and "<script" not in text
    if Path(CHROMIUM).exists():
        _rendered(html, tmp_path)


def _rendered(html: Path, tmp: Path) -> None:
    import matplotlib.image as mpimg

    png = tmp / "debug.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp / 'chromium-profile'}", f"--screenshot={png}", "--window-size=1200,1400",
                    html.resolve().as_uri()], check=True, capture_output=True, timeout=120)
    img = (mpimg.imread(png)[..., :3] * 255).round().astype(np.uint8)

    def has(rgb, tol=8):
        return bool(np.any(np.all(np.abs(img.astype(int) - rgb) <= tol, axis=-1)))

    assert has((0xD6, 0x27, 0x28))  # the bound (matplotlib tab:red dashed line)
    assert has((0xFF, 0x7F, 0x0E))  # the first jump marked (tab:orange)
    assert has((0x1F, 0x77, 0xB4))  # the error curve (tab:blue)
    assert has((0xFF, 0xCC, 0x88))  # the first jump's table row


def test_bundle_json_same_first_jump(built, capsys):
    rc = main(["debug", str(built["bad"]), "--model", str(built["model"]), "--json", "--max-memory", "4M"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 5 and doc["passed"] is False
    assert doc["first_jump"]["artifact_node"] == built["victim"]
    assert doc["windows"] > 1  # 4 MB of values at once: several windows


@pytest.mark.parametrize("argv, words", [
    (["{bad}"], "source model"),  # the bundle's source model is not next to it
    (["{model}"], "--target"),
    (["{bad}", "--model", "{model}", "--max-memory", "lots"], "--max-memory"),
    (["{model}", "--target", "cpu,intel-cpu"], "one --target"),
])
def test_bad_input_is_exit_2(built, capsys, argv, words):
    args = [a.format(bad=built["bad"], model=built["model"]) for a in argv]
    rc = main(["debug", *args])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert words in err and "Traceback" not in err
