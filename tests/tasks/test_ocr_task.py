"""The OCR task check: PP-OCR det + rec read skimage's scanned page, in FP32 and as `cpu` INT8 bundles.

Tolerances of the INT8 builds (``int8_tolerance``), and why:
- det: cosine >= 0.93, rel_l2 <= 0.4 (default 0.97 / 0.25), calibrated and validated on text
  (``det_inputs``: page.png at other scales and places than the task's view, plus photos; on
  text-free photos alone the map is ~0 and the metrics weigh rounding, not text edges).  At this
  small input (256 x 512) the quick search's best measured cos 0.960 / rel_l2 0.280; at 640 x 640
  the fixture matrix (bench/build_fixtures.py) ships it on the default bound.  The binding check
  here is the task below.
- rec: the default INT8 bound.  A looser one (cosine >= 0.95, rel_l2 <= 0.35) let the MinMax variant
  through (cos 0.962, top-1 91%), and that rec read "Let-usfirst determine ...": the task check
  caught it.  At the default bound the search needs Percentile calibration plus a float fallback.
The task bound: every word of the sentence, in order, in one line read by the INT8 pair.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import numpy as np
import pytest

from edgeopt.errors import ModelError, UsageError
from tests.conftest import fixture

SENTENCE = "Let us first determine markers of the coins and the"
DET_HW = (256, 512)  # covers page.png (384 x 191) at 1.33x; the sentence reads the same as at 640 x 640
DET_TOL = "cosine_min=0.93,rel_l2_max=0.4"


@pytest.fixture(scope="module")
def fp32_run():
    from edgeopt.tasks import ocr

    return ocr.onnx_run_fn(fixture("ocr-det")), ocr.onnx_run_fn(fixture("ocr-rec"))


def test_fp32_pair_reads_the_page(fp32_run):
    from edgeopt.tasks import ocr

    lines = ocr.read_page_onnx(fixture("ocr-det"), fixture("ocr-rec"), fixture("page"), DET_HW)
    assert ocr.word_match(SENTENCE, lines) == (1.0, SENTENCE)
    assert len(lines) >= 6 and lines[0].replace(" ", "") == "Region-basedsegmentation"


def test_ctc_decode_merges_repeats_and_drops_blanks():
    from edgeopt.tasks.ocr import ctc_decode

    chars = ["blank", "a", "b", " "]
    steps = [1, 1, 0, 1, 2, 2, 3, 0, 2]
    probs = np.eye(4)[steps] * 0.9 + 0.025
    assert ctc_decode(probs, chars) == "aab b"


def test_long_lines_are_cut_between_words_into_rec_sized_pieces(fp32_run):
    from edgeopt.tasks import ocr

    det, _ = fp32_run
    img = ocr.load_image(fixture("page"))
    boxes = ocr.detect_lines(det, img, DET_HW)
    x0, y0, x1, y1 = boxes[1]
    pieces = ocr.line_pieces(img[y0:y1, x0:x1])
    assert len(pieces) >= 2
    assert all(p.shape[1] * 48 / p.shape[0] <= 320 + 1 for p in pieces)
    assert sum(p.shape[1] for p in pieces) == x1 - x0  # nothing lost or doubled at the cuts


def test_bad_inputs_give_one_clear_error(tmp_path):
    from edgeopt.tasks import ocr

    with pytest.raises(UsageError, match="image not found"):
        ocr.load_image(tmp_path / "missing.png")
    (tmp_path / "junk.png").write_bytes(b"not an image")
    with pytest.raises(UsageError, match="cannot read image"):
        ocr.load_image(tmp_path / "junk.png")
    with pytest.raises(UsageError, match="not a usable bundle"):
        ocr.read_page_with_bundles(tmp_path, tmp_path, fixture("page"))
    with pytest.raises(ModelError, match="character"):
        ocr.characters_from_onnx(fixture("ocr-det"))


def _rec_calibration(det, out: Path) -> Path:
    """Real rec inputs: line pieces the FP32 det finds in the skimage images, the page's sentence held out.

    Cut with the det at 640 x 640 (its size in rapidocr's range): it finds 11 pieces in the other
    images where 256 x 512 finds 3, and with those 3 the quick search missed the default bound.
    """
    from edgeopt.tasks import ocr

    others = [p for p in sorted(fixture("images").iterdir()) if p.suffix in (".png", ".jpg") and p.name != "page.png"]
    pieces = list(ocr.rec_inputs(det, others))
    img = ocr.load_image(fixture("page"))
    rec = ocr.onnx_run_fn(fixture("ocr-rec"))
    chars = ocr.characters_from_onnx(fixture("ocr-rec"))
    page = []
    for x0, y0, x1, y1 in ocr.detect_lines(det, img):
        feeds = [ocr.rec_tensor(p) for p in ocr.line_pieces(img[y0:y1, x0:x1])]
        text = " ".join(ocr.ctc_decode(rec(f)[0], chars) for f in feeds)
        if ocr.word_match(SENTENCE, [text])[0] < 0.5:  # not the line the test reads
            page += feeds
    # The pipeline validates on the last samples: the page's other lines, the most text-like data.
    np.savez(out, x=np.stack(pieces + page))
    return out


def _det_calibration(out: Path) -> Path:
    """Text-bearing det inputs: page.png at 16 other scales/places than the task's view + 8 photos."""
    from edgeopt.tasks import ocr

    images = fixture("images")
    others = [images / f for f in ("chelsea.png", "coffee.png", "astronaut.png", "camera.png", "coins.png",
                                   "rocket.jpg", "motorcycle_left.png", "brick.png")]
    np.savez(out, x=ocr.det_inputs([images / "page.png"], others, DET_HW, views=16))
    return out


@pytest.fixture(scope="module")
def int8_bundles(tmp_path_factory, fp32_run):
    from edgeopt.pipeline import build

    out = tmp_path_factory.mktemp("ocr-int8")
    det_report = build(fixture("ocr-det"), "cpu", ["int8"], shapes={"x": [1, 3, *DET_HW]},
                       calib=str(_det_calibration(out / "det-text.npz")), out=out, n_calib=16, n_val=8,
                       options={"int8_tolerance": DET_TOL}, jobs=1)
    rec_calib = _rec_calibration(fp32_run[0], out / "rec-lines.npz")
    rec_report = build(fixture("ocr-rec"), "cpu", ["int8"], shapes={"x": [1, 3, 48, 320]}, calib=str(rec_calib),
                       out=out, options={"int8_budget_s": 300}, jobs=1)  # room for a loaded machine
    return det_report.results[0], rec_report.results[0]


def _rec_refused_on_its_decodings(rec_res) -> bool:
    """The rec's INT8 is judged on its CTC decodings (seq_match, issue 14): ORT's quick search may not
    keep 90% of the validation lines' decodings equal, and then the build must refuse it *by that
    metric* (not ship an artifact that passes on cosine while it reads differently)."""
    return not rec_res.ok and "seq_match" in (rec_res.error or "")


def test_int8_bundles_are_built_with_their_tolerance_recorded(int8_bundles):
    det_res, rec_res = int8_bundles
    for res in int8_bundles:
        if res is rec_res and _rec_refused_on_its_decodings(res):
            continue
        assert res.ok, res.error
        assert res.manifest["host_check"]["passed"] is True
    want = {k: float(v) for k, v in (item.split("=") for item in DET_TOL.split(","))}
    det = json.loads((Path(det_res.bundle) / "manifest.json").read_text())
    assert det["tolerance_override"] == want  # the agent's check on the device applies the same bound
    assert {k: det["host_check"]["tolerance"][k] for k in want} == want
    if rec_res.ok:
        rec = json.loads((Path(rec_res.bundle) / "manifest.json").read_text())
        assert "tolerance_override" not in rec and rec["host_check"]["tolerance"]["cosine_min"] == 0.97
        assert rec["output_kinds"] and "ctc" in json.dumps(rec["output_kinds"])


def test_int8_pair_still_reads_the_sentence(int8_bundles, fp32_run):
    from edgeopt.tasks import ocr

    det_res, rec_res = int8_bundles
    # the INT8 det with the INT8 rec when it shipped, else with the FP32 rec: the det's task result holds
    rec = rec_res.bundle if rec_res.ok else str(fixture("ocr-rec"))
    lines = ocr.read_page_with_bundles(det_res.bundle, rec, fixture("page"))
    score, line = ocr.word_match(SENTENCE, lines)
    assert score == 1.0, f"INT8 read {line!r}; all lines: {lines}"
    fp32 = ocr.read_lines(*fp32_run, ocr.load_image(fixture("page")), ocr.characters_from_onnx(fixture("ocr-rec")),
                          DET_HW)
    # Over the whole page, characters (spaces aside: the rec merges words on both precisions).
    a, b = ("".join(t).replace(" ", "") for t in (fp32, lines))
    similarity = difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
    print(f"INT8 vs FP32 character similarity over the page: {similarity:.1%}; INT8 lines: {lines}")
    assert similarity >= 0.9
    gate = ocr.check_pair(det_res.bundle, rec, fixture("page"), SENTENCE,
                          (str(fixture("ocr-det")), str(fixture("ocr-rec"))))
    assert gate["passed"], gate


def test_ocr_check_cli_gates_on_expected_text_and_reference(capsys):
    from edgeopt.cli import main

    det, rec, page = (str(fixture(k)) for k in ("ocr-det", "ocr-rec", "page"))
    assert main(["ocr-check", det, rec, page, "--expect", SENTENCE, "--reference", det, rec]) == 0
    out = capsys.readouterr().out
    assert "100% of its words" in out and "100.0% of characters alike" in out and out.rstrip().endswith("PASSED")
    # A sentence that is not on the page trips the gate (exit 3), JSON says why.
    assert main(["ocr-check", det, rec, page, "--expect", "Four score and seven years ago", "--json"]) == 3
    res = json.loads(capsys.readouterr().out)
    assert res["passed"] is False and res["expect"]["words"] < 0.5 and len(res["lines"]) >= 6


def test_ocr_check_cli_refuses_bad_input_with_one_line(tmp_path, capsys):
    from edgeopt.cli import main

    det, rec, page = (str(fixture(k)) for k in ("ocr-det", "ocr-rec", "page"))
    assert main(["ocr-check", det, rec, page]) == 2  # nothing to judge by
    assert main(["ocr-check", str(tmp_path), rec, page, "--expect", "x"]) == 2  # not a bundle
    (tmp_path / "model.txt").write_text("x")
    assert main(["ocr-check", str(tmp_path / "model.txt"), rec, page, "--expect", "x"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("edgeopt: error:") == 3


def test_character_similarity_ignores_line_order_but_not_lost_lines():
    from edgeopt.tasks.ocr import character_similarity

    a = ["Region-based segmentation", "Let us first determine", "markers of the coins"]
    assert character_similarity(a, [a[0], a[2], a[1]]) == 1.0
    assert character_similarity(a, a[:1]) < 0.8
    assert character_similarity(a, ["Regi0n-based segmentati0n", *a[1:]]) > 0.95
