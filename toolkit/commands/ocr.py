"""``edgeopt ocr-check DET REC IMAGE``: the OCR task gate for a PP-OCR det + rec pair."""

from __future__ import annotations

import click

from . import emit_json
from ._common import CONTEXT, examples, json_option, ns, verbosity

EXAMPLES = """\
examples:
  # the INT8 pair must still read this sentence of the page (every word, in order, in one line)
  edgeopt ocr-check dist/det/cpu-int8 dist/rec/cpu-int8 page.png --expect "Let us first determine markers"
  # and read the whole page like the FP32 models do (>= 90% of the characters alike)
  edgeopt ocr-check dist/det/mobile-int8 dist/rec/mobile-int8 page.png --reference det.onnx rec.onnx

DET and REC are bundle folders made by `edgeopt build` (any runtime that runs on this host) or .onnx
files. Exit codes: 0 passed, 3 the reading missed the bound, 2 bad input.
"""


@click.command("ocr-check", epilog=examples(EXAMPLES), context_settings=CONTEXT,
               short_help="Task gate: does a PP-OCR det + rec pair still read an image?")
@click.argument("det", type=click.Path())
@click.argument("rec", type=click.Path())
@click.argument("image", type=click.Path())
@click.option("--expect", metavar="TEXT", help="Text that must be read (its words, in order, in one line).")
@click.option("--min-words", type=click.FloatRange(0, 1), default=1.0, metavar="F",
              help="Share of --expect's words that must be found (1.0: all).")
@click.option("--reference", nargs=2, metavar="DET.onnx REC.onnx", default=None,
              help="The FP32 models: the pair must read the page like them (also gives the character list "
                   "when the rec bundle's artifact carries none).")
@click.option("--min-similarity", type=click.FloatRange(0, 1), default=0.9, metavar="F",
              help="Character similarity to the reference reading over the page.")
@json_option
@verbosity
def command(**kw) -> int:
    """Read IMAGE with a text detector (DET) + recogniser (REC) pair (PP-OCR / rapidocr pipeline: DB
    boxes, line pieces, CTC decode) and judge the reading: expected text found, and/or the FP32 ONNX
    pair's reading matched."""
    return run(ns(**kw))


def run(args) -> int:
    from edgeopt.errors import EXIT_BUILD_FAILED
    from edgeopt.tasks.ocr import check_pair

    res = check_pair(args.det, args.rec, args.image, args.expect, tuple(args.reference) if args.reference else None,
                     args.min_words, args.min_similarity)
    if args.json:
        emit_json(res, "ocr-check")
    else:
        print(f"read {len(res['lines'])} line(s) of {res['image']}:")
        for line in res["lines"]:
            print(f"  {line}")
        if "expect" in res:
            e = res["expect"]
            print(f"expected text: {e['words']:.0%} of its words (need {e['min_words']:.0%}) "
                  f"-> {'ok' if e['passed'] else 'MISSED'}; best line: {e['line']!r}")
        if "reference" in res:
            r = res["reference"]
            print(f"vs the FP32 reference reading: {r['similarity']:.1%} of characters alike "
                  f"(need {r['min_similarity']:.0%}) -> {'ok' if r['passed'] else 'MISSED'}")
        print("PASSED" if res["passed"] else "FAILED")
    return 0 if res["passed"] else EXIT_BUILD_FAILED
