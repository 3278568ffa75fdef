"""``compare --onnx-b B`` and ``culprits --onnx-b B``: the export ``--onnx`` (a) and a transformed copy of it
(b: simplified, optimized, float16, quantized) against the program, in one run (``twomodels/``).

    python -m sbs_widget compare --ep model.pt2 --onnx model.onnx --onnx-b b.onnx --inputs inputs.pt [-o out.csv]
    python -m sbs_widget culprits --ep model.pt2 --onnx model.onnx --onnx-b b.onnx --inputs inputs.pt --json
"""

from __future__ import annotations

import json
from collections import Counter


def compare_two(args, inputs):
    """Run and print the summary; the comparison is returned for ``-o`` (``cli/compare.py`` writes it)."""
    from sbs_widget.safe_text import clipped, visible
    from sbs_widget.twomodels.compare import compare_models

    found = compare_models(args.ep, args.onnx, args.onnx_b, inputs, None, atol=args.atol, rtol=args.rtol)
    m = found.matching
    statuses = Counter(r.b_status for r in found.records if r.b_status is not None)
    print(f"b: {sum(1 for v in m.b_float if v in m.b_to_a)} of {len(m.b_float)} float values paired with a "
          f"({m.coverage:.0%}); {len(m.a_only)} values of a without a twin in b, each with why")
    print("b against torch: " + ", ".join(f"{n} {k}" for k, n in statuses.most_common()))
    for k, c in enumerate(found.culprits[:10], 1):
        print(visible(f"{k}. b departs at {c.op_type} node {clipped(repr(c.onnx_node))} -> {clipped(repr(c.b_value))}: "
                      f"{c.transformation}, {c.err_local:.3g} of the value's magnitude fed a's values"))
    if not found.culprits:
        print("no node of b departs beyond what its precision explains")
    return found


def culprits_two(args) -> int:
    from sbs_widget.safe_text import clipped, visible
    from sbs_widget.twomodels.compare import compare_models

    found = compare_models(args.ep, args.onnx, args.onnx_b, args.inputs, None, atol=args.atol, rtol=args.rtol)
    top = found.culprits[:args.top]
    if args.json:
        print(json.dumps([dict(c.to_dict(), model="b") for c in top], indent=1, default=float))
        return 0
    if not top:
        print("no culprit in b: no node of b departs beyond what its precision explains")
    for k, c in enumerate(top, 1):
        print(visible(f"{k}. {c.op_type} {clipped(repr(c.onnx_node))} of b -> {clipped(repr(c.b_value))} "
                      f"(paired with {clipped(repr(c.a_value))} of a, excess {c.excess:.3g})"))
        print(visible(f"   {c.transformation}: {c.err_local:.3g} of the value's magnitude fed a's values"))
    return 0
