"""``edgeopt inspect MODEL``: what is in the model and which targets can take it."""

from __future__ import annotations

import argparse

from . import emit_json


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="IO, ops, parameters, FLOPs and the target support matrix of a model",
                       description="Show a model's opset, inputs/outputs (dynamic dims named), op histogram, "
                                   "parameters, rough FLOPs, external data, and for every target whether it "
                                   "can take the model (all unsupported ops listed with node names).")
    p.add_argument("model", help="path to an .onnx file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--config", help="config file with user-defined targets (default ./edgeopt.yaml)")
    p.set_defaults(func=run)


def support_matrix(info, config=None) -> list[dict]:
    from edgeopt.targets.registry import all_targets, get_backend

    rows = []
    for spec in all_targets(config).values():
        backend = get_backend(spec.backend)
        bad = backend.unsupported_nodes(info, spec.as_dict())
        rows.append({"target": spec.name, "backend": spec.backend, "supported": not bad,
                     "unsupported": [{"op": op, "node": n} for op, n in bad],
                     "builds_here": backend.available() is None,
                     "host_check": backend.check_kind})
    return rows


def run(args: argparse.Namespace) -> int:
    from edgeopt.model import inspect
    from edgeopt.ui import table

    info = inspect(args.model)
    matrix = support_matrix(info, args.config)
    if args.json:
        emit_json({**info.as_dict(), "support": matrix})
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
    print(f"  parameters {info.parameters:,} ({info.parameter_bytes / 1e6:.1f} MB)"
          + (f", ~{info.flops / 1e9:.2f} GFLOPs (Conv/MatMul/Gemm)" if info.flops else ""))
    if info.external_data:
        print(f"  external data: {', '.join(info.external_data)}")
    print(f"  {len(info.nodes)} nodes: " + ", ".join(f"{op}×{n}" for op, n in info.op_histogram.items()))
    print()
    rows = []
    for r in matrix:
        if r["supported"]:
            status = "yes"
        else:
            ops = sorted({u["op"] for u in r["unsupported"]})
            status = f"NO: {len(r['unsupported'])} node(s): {', '.join(ops)}"
        rows.append({**r, "status": status, "here": "yes" if r["builds_here"] else "no (extra missing)"})
    print(table(rows, [("target", "target"), ("backend", "backend"), ("status", "can take the model"),
                       ("here", "builds here"), ("host_check", "host check")]))
    for r in matrix:
        if r["unsupported"]:
            print(f"\n{r['target']}: unsupported nodes")
            for u in r["unsupported"]:
                print(f"  {u['op']:<24} {u['node']}")
    return 0
