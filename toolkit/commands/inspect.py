"""``edgeopt inspect MODEL``: what is in the model and which targets can take it."""

from __future__ import annotations

import click

from . import emit_json
from ._common import CONTEXT, config_option, examples, json_option, kind_flags, ns, verbosity

EXAMPLES = examples("""\
examples:
  edgeopt inspect model.onnx
  edgeopt inspect detector.onnx --shape images:1x3x640x640   # FLOPs at that shape
  edgeopt inspect model.onnx --json | jq '.support[] | select(.supported | not)'
  edgeopt inspect face.onnx --calib faces/        # output kinds as a build infers them on that data
  edgeopt inspect face.onnx --output-kind landmarks=regression:px=2 --decision presence=0

Output kinds: what each output means, and so how every check judges it (a build's manifest, the
device, the report, gate and rollout): found as a build finds them, by running the model on the
--calib data (random data without it: say --calib, a random input says little about a detector) and
reading the op that makes each output; --output-kind and --decision override them.

exit codes: 0 ok, 2 the model is missing, truncated or not ONNX.

A target is marked NO when it cannot take a node of the model, or when a runtime on its way cannot
read the model's ONNX opset or IR version (ONNX Runtime, which computes every build's FP32
reference; OpenVINO's ONNX frontend; the TensorRT parser of the target's profile).""")


@click.command("inspect", epilog=EXAMPLES, context_settings=CONTEXT,
               short_help="IO, ops, parameters, FLOPs, output kinds and the target support matrix of a model.")
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("--shape", "--shapes", "shape", multiple=True, metavar="NAME:DIMS",
              help="Fix dynamic dims for the FLOPs count and the output kinds (x:1x3x224x224, x:[1,3,224,224]).")
@click.option("--calib", metavar="PATH", help="Real input data (as build's --calib) to infer the output kinds on.")
@click.option("--preprocess", metavar="SPEC", help="As build's --preprocess, for image --calib data.")
@click.option("--split", default=None, metavar="HOW", help="As build's --split: which samples the kinds are "
              "inferred on (the validation part).")
@click.option("--kinds/--no-kinds", "kinds", default=True, show_default=True,
              help="Run the model as a build would to show the output kinds; --no-kinds: the static facts only.")
@kind_flags
@config_option
@json_option
@verbosity
def command(**kw) -> int:
    """Show a model's opset, inputs/outputs (dynamic dims named), op histogram, parameters, rough
    FLOPs, external data, the output kinds a build will judge by (inferred on --calib data), and for
    every target whether it can take the model (every unsupported node listed with its name)."""
    return run(ns(**kw))


SHOW_NAMES = 3  # node names shown per "probably not" reason before "and N more"


def inspect_kinds(*a, **kw) -> dict:
    from edgeopt.api import inspect_kinds as _kinds

    return _kinds(*a, **kw)


def support_matrix(info, config=None) -> list[dict]:
    from edgeopt.api import support_matrix as _matrix

    return _matrix(info, config)


def run(args) -> int:
    from edgeopt.model import flops_for, inspect, parse_shapes, static_input_shapes
    from edgeopt.ui import table

    info = inspect(args.model)
    matrix = support_matrix(info, args.config)
    given = parse_shapes(list(args.shape)) if args.shape else None
    static = static_input_shapes(info, given) if given else None
    if static is not None:
        info.flops = flops_for(args.model, static)
    kinds = {} if not args.kinds else inspect_kinds(args.model, given, args.calib, args.preprocess, args.split,
                                                   list(args.output_kind) or None, list(args.decision) or None)
    if args.json:
        from edgeopt.shapes import describe

        emit_json({**info.as_dict(), **({"shapes": static} if static else {}),
                   **({"variable": describe(static)} if static and describe(static) else {}),
                   "support": matrix, **kinds}, "inspect")
        return 0
    mb = info.size_bytes / 1e6
    print(f"{info.path}  ({mb:.1f} MB, sha256 {info.sha256[:12]})")
    opsets = ", ".join(f"{d or 'ai.onnx'}:{v}" for d, v in info.opsets.items())
    print(f"  IR {info.ir_version}, opsets {opsets}, producer {info.producer or '?'}")
    for kind, ts in (("input ", info.inputs), ("output", info.outputs)):
        for t in ts:
            shape = "[" + ", ".join("?" if d is None else str(d) for d in t.shape) + "]"
            dyn = "  dynamic: " + ", ".join(t.dynamic_dims) if t.dynamic_dims else ""
            print(f"  {kind} {t.name}: {t.dtype} {shape}{dyn}")
            for a in (info.dynamic_axes if kind == "input " else []):
                if a["input"] == t.name:
                    print(f"      axis {a['axis']} ({a['dim'] or '?'}): " + (
                        f"at most {a['suggest']} ({a['why']}): e.g. --shape {t.name}:"
                        + "x".join(f"1..{a['suggest']}" if j == a["axis"] else (str(d) if isinstance(d, int) else "N")
                                   for j, d in enumerate(t.shape))
                        if a["suggest"] else "no bound in the model: bound it by your data (a range lo..hi or "
                        "buckets b1|b2|b3)"))
    at = f" at {', '.join(f'{k}{v}' for k, v in static.items())}" if static else ""
    dynamic = any(t.dynamic_dims for t in info.inputs) and not static
    print(f"  parameters {info.parameters:,} ({info.parameter_bytes / 1e6:.1f} MB)"
          + (f", ~{_flops_text(info.flops)}{at} (Conv/MatMul/Gemm/LSTM/GRU"
             + ("; dynamic dims counted as 1, --shape fixes them" if dynamic else "") + ")" if info.flops else ""))
    if info.external_data:
        print(f"  external data: {', '.join(info.external_data)}")
    if static is not None:
        from edgeopt.model import load
        from edgeopt.shapes import describe, pad_sensitive

        if describe(static):
            for why in pad_sensitive(load(args.model, load_external=False), [t.name for t in info.inputs]):
                print(f"  warning: padding may change the answers: {why}; a build checks each form at every "
                      "sample's own length")
    print(f"  {len(info.nodes)} nodes: " + ", ".join(f"{op}×{n}" for op, n in info.op_histogram.items()))
    if kinds:
        _print_kinds(kinds)
    print()
    rows = []
    for r in matrix:
        if r["supported"] and r.get("probably"):
            ops = sorted({p["op"] for p in r["probably"]})
            status = f"probably not: {len(r['probably'])} node(s): {', '.join(ops)} (see below)"
        elif r["supported"]:
            status = "yes"
        elif r.get("format") and not r["unsupported"]:
            status = f"NO: opset {info.opset}, IR {info.ir_version} (see below)"
        else:
            ops = sorted({u["op"] for u in r["unsupported"]})
            status = f"NO: {len(r['unsupported'])} node(s): {', '.join(ops)}" + (
                f"; opset {info.opset}, IR {info.ir_version}" if r.get("format") else "")
        rows.append({**r, "status": status, "here": "yes" if r["builds_here"] else "no (extra missing)"})
    print(table(rows, [("target", "target"), ("backend", "backend"), ("status", "can take the model"),
                       ("here", "builds here"), ("host_check", "host check")]))
    refusals: dict[tuple[str, str], list[str]] = {}  # one paragraph per distinct opset/IR refusal
    for r in matrix:
        if r.get("format"):
            refusals.setdefault((r["format"]["message"], r["format"]["hint"]), []).append(r["target"])
    for (msg, hint), names in refusals.items():
        print(f"\n{', '.join(names)}: {msg}\n  hint: {hint}")
    for r in matrix:  # one entry per distinct op label (it carries the rule's reason), every node named
        if r["unsupported"]:
            print(f"\n{r['target']}: unsupported nodes" + (f" ({r['why']})" if r.get("why") else ""))
            for (op,), names in _grouped(r["unsupported"], ("op",)).items():
                print(f"  {op:<24} {names[0]}" if len(names) == 1 else _wrapped(
                    f"  {op:<24} {len(names)} nodes: " if len(op) <= 24 else f"  {op}\n    {len(names)} nodes: ", names))
    for r in matrix:  # one line per (op, reason), the first names only: --json keeps one entry per node
        if r["supported"] and r.get("probably"):
            print(f"\n{r['target']}: probably not (only converting can tell)")
            cut = False
            for (op, why), names in _grouped(r["probably"], ("op", "why")).items():
                shown = names if len(names) <= SHOW_NAMES + 1 else names[:SHOW_NAMES]
                cut |= len(shown) < len(names)
                more = f" and {len(names) - len(shown)} more" if len(shown) < len(names) else ""
                print(f"  {op:<24} {names[0]}: {why}" if len(names) == 1 else
                      f"  {op:<24} {len(names)} nodes ({', '.join(shown)}{more}): {why}")
            if cut:
                print("  (--json lists every node)")
    return 0


def _grouped(entries: list[dict], keys: tuple[str, ...]) -> dict[tuple[str, ...], list[str]]:
    """The node names of ``entries`` by their values at ``keys``, in the order each key first appears."""
    out: dict[tuple[str, ...], list[str]] = {}
    for e in entries:
        out.setdefault(tuple(e[k] for k in keys), []).append(e["node"])
    return out


def _wrapped(prefix: str, names: list[str]) -> str:
    """``prefix`` and every name, comma-separated; on a terminal, wrapped at its width between names (a pipe
    gets one line, for grep)."""
    from edgeopt.ui import terminal_width

    width = terminal_width()
    lines, line = [], prefix
    for i, name in enumerate(names):
        item = name + ("," if i < len(names) - 1 else "")
        last = line.rsplit("\n", 1)[-1]
        if width is not None and not line.endswith(": ") and len(last) + 1 + len(item) > width:
            lines.append(line)
            line = "      " + item
        else:
            line += ("" if line.endswith(": ") else " ") + item
    return "\n".join([*lines, line])


def _print_kinds(kinds: dict) -> None:
    """What each output means, and how a check judges it."""
    from edgeopt_agent.compare import kind_meaning, kind_text

    if kinds.get("output_kinds") is None:
        print(f"  output kinds: not inferred ({kinds.get('output_kinds_note')})")
        return
    print(f"  output kinds ({kinds.get('output_kinds_note')}; --output-kind/--decision override):")
    for name, k in kinds["output_kinds"].items():
        how = "given" if k.get("source") == "option" else "inferred"
        print(f"    {name}: {kind_text(k)}  ({how}{', ' + k['guess'] if k.get('guess') else ''}): {kind_meaning(k)}")


def _flops_text(flops: int) -> str:
    """GFLOPs, or MFLOPs for a model too small to show in GFLOPs (a wake-word head: ~0.6 MFLOPs)."""
    return f"{flops / 1e9:.2f} GFLOPs" if flops >= 1e8 else f"{flops / 1e6:.2f} MFLOPs"
