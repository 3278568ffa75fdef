"""Issue 32's coverage: the share of the ONNX graph's floating-point values (outputs of non-Constant
nodes, typed by ONNX shape inference) that get a compared record from ``run_aligned``, per model, with
the exporter's optimizer off, on, and on then fused for onnxruntime (``zoo.fused_for_ort``), and the
values left uncompared by op type. ``SBS_WIDGET_INNER=0`` gives the figures without inner values.

    python benchmarks/inner_coverage.py                       # llama, gpt2, bert, vit
    python benchmarks/inner_coverage.py --models llama,qwen2
"""

from __future__ import annotations

import argparse
import collections
import sys
import warnings

FLOAT = {1, 10, 11, 16}  # float, float16, double, bfloat16


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="llama,gpt2,bert,vit")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    import onnx

    from sbs_widget.engine.entry import prepare
    from sbs_widget.samples import zoo
    from sbs_widget.samples.zoo import fused_for_ort

    print(f"{'model':8s} {'optimize':8s} {'float values':>12s} {'compared':>9s}  left uncompared (by op)")
    for name in a.models.split(","):
        for optimize in (False, True, "ort"):
            ep, prog, args, kwargs = zoo.export(name, optimize=bool(optimize))
            model = fused_for_ort(prog.model_proto) if optimize == "ort" else prog.model_proto
            p = prepare(ep, model)
            records = list(p.run(args, kwargs))
            compared = {r.onnx_name for r in records if r.onnx_name and r.status not in ("one-sided", "error")}
            inferred = onnx.shape_inference.infer_shapes(model)
            types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.output]}
            values = [o for n in p.index.nodes if n.op_type != "Constant" for o in n.output
                      if o and types.get(o, getattr(p.index.types.get(o), "elem_type", 0)) in FLOAT]
            left = [o for o in values if o not in compared]
            ops = collections.Counter(p.index.nodes[p.index.producer[o]].op_type for o in left)
            share = 100 * (1 - len(left) / max(1, len(values)))
            print(f"{name:8s} {optimize!s:8s} {len(values):12d} {share:8.1f}%  {dict(ops.most_common())}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
