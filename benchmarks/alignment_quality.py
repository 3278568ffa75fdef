"""Alignment quality on correct exports: false alarms (pairs beyond tolerance) and coverage.

For each model (built from a small config, random init, seeded) and each export mode
(optimize=False / True), run the comparison against the USER ExportedProgram (what
torch.export.export returns) and report:
- beyond: mismatches, records beyond tolerance and beyond rounding (must be 0 on a correct export),
- noise: records beyond tolerance by rounding alone (the float64 verdict),
- errors: records with status error,
- coverage: share of the user program's value-producing call_function nodes compared,
- cov_present: the same among nodes whose value exists in the ONNX graph (folded: constant-folded ones,
  fused: taken into a node the optimizer rewrote, e.g. a Conv with its BatchNorm folded in),
- err_local: share of compared node pairs that got a node-local error,
- inner: values inside translations compared with a finer torch reference (issue 32), and of them
  inner_beyond (mismatches, counted in beyond too) and inner_noise (rounding, counted in noise too).

    python benchmarks/alignment_quality.py [--models llama,gpt2,bert,vit,resnet]
    python benchmarks/alignment_quality.py --models gemma,mistral,phi3,gpt_neox,distilbert,mobilevit
    python benchmarks/alignment_quality.py --models qwen2,roberta,deberta,bart,clip_vision,convnext
    python benchmarks/alignment_quality.py --ort-fusions   # also optimize=True + onnxruntime's fusions
    python benchmarks/alignment_quality.py --dtype float16 --models llama,gpt2,bert,vit,mlp,convnet,resnet
    python benchmarks/alignment_quality.py --dynamic --models llama,gpt2,bert,vit,qwen2,roberta

``--ort-fusions`` adds a row per model (optimize "ort"): the optimized export rewritten by onnxscript's
``optimize_for_ort`` (SkipLayerNormalization, MultiHeadAttention...), as users do before deploying.
``--dynamic`` exports with a dynamic batch (and sequence, for token inputs) and runs each export at
its own shape and at two others (batch 3 / sequence 9, batch 1 / sequence 33): beyond and errors
add up over the three runs, coverage is the last run's.
``--dtype float16`` casts the models first; the tolerance is then the program's default (1e-3) unless
``--atol``/``--rtol`` are given (column ``tol``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
import warnings

import pandas as pd


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="dummy_llm,mlp,convnet,llama,gpt2,bert,vit,resnet")
    parser.add_argument("--atol", type=float, default=None, help="default: the program's (1e-4 for float32)")
    parser.add_argument("--rtol", type=float, default=None)
    parser.add_argument("--dtype", default=None, help="cast the models first: float16, bfloat16")
    parser.add_argument("--ort-fusions", action="store_true", help="add exports fused for onnxruntime")
    parser.add_argument("--dynamic", action="store_true", help="dynamic shapes, run at three shapes")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    import torch

    from sbs_widget.engine.entry import prepare
    from sbs_widget.engine.summary import summarize
    from sbs_widget.samples import zoo

    rows = []
    for name in args.models.split(","):
        for optimize in (False, True, "ort") if args.ort_fusions else (False, True):
            try:
                with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                    ep, prog, a, kw = zoo.export(name, optimize=bool(optimize), dynamic=args.dynamic,
                                                 dtype=getattr(torch, args.dtype) if args.dtype else None)
                    model = zoo.fused_for_ort(prog.model_proto) if optimize == "ort" else prog.model_proto
            except Exception as e:  # the exporter's failure, not ours: the other models still run
                print(f"  {name} optimize={optimize}: export failed: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:200]}",
                      file=sys.stderr)
                continue
            begin = time.perf_counter()
            prepared = prepare(ep, model)
            atol, rtol = prepared.tolerance(args.atol, args.rtol)
            runs = [(a, kw)]
            if args.dynamic:  # two other shapes
                runs += [zoo.other_shapes(a, kw, 3, 9), zoo.other_shapes(a, kw, 1, 33)]
            beyond = errors = noise = inner_beyond = inner_noise = 0
            for inputs, kwargs in runs:
                records = list(prepared.run(inputs, kwargs, atol=atol, rtol=rtol, node_local=True))
                s = summarize(records, prepared)
                beyond += s.by_status.get("mismatch", 0)
                noise += s.by_status.get("noise", 0)
                errors += s.by_status.get("error", 0)
                inner_beyond += sum(r.kind == "inner" and r.status == "mismatch" for r in records)
                inner_noise += sum(r.kind == "inner" and r.status == "noise" for r in records)
            inner = sum(r.kind == "inner" and r.status in ("ok", "noise", "mismatch", "reset") for r in records)
            seconds = time.perf_counter() - begin
            nodes = [r for r in records if r.kind == "node" and r.status in ("ok", "noise", "mismatch")
                     and r.onnx_op_type != "initializer"]
            rows.append(dict(
                model=name, optimize=optimize, fx_nodes=prepared.n_fx_nodes, onnx_nodes=len(prepared.index.nodes),
                records=len(records), compared=s.n_compared, beyond=beyond, noise=noise, errors=errors,
                coverage=round(100 * (s.coverage or 0), 1),
                cov_present=round(100 * (s.coverage_of_present or 0), 1), folded=s.folded, fused=s.fused,
                err_local=round(100 * sum(r.err_local is not None for r in nodes) / max(1, len(nodes)), 1),
                inner=inner, inner_beyond=inner_beyond, inner_noise=inner_noise,
                worst=f"{s.worst.err_abs:.1e}" if s.worst else "-", tol=f"{atol:g}/{rtol:g}",
                seconds=round(seconds, 2),
            ))
            if s.first_beyond is not None:
                f = s.first_beyond
                print(f"  {name} optimize={optimize}: first beyond {f.ep_name}/{f.onnx_name} {f.err_abs} {f.comment}",
                      file=sys.stderr)
            failed = next((r for r in records if r.status == "error"), None)
            if failed is not None:
                print(f"  {name} optimize={optimize}: first error {failed.ep_name}/{failed.onnx_name} "
                      f"({failed.onnx_op_type}): {failed.comment[:200]}", file=sys.stderr)
            print(pd.DataFrame(rows[-1:]).to_string(index=False, header=len(rows) == 1), flush=True)
    print()
    print(pd.DataFrame(rows).to_markdown(index=False) if _has_tabulate() else pd.DataFrame(rows).to_string(index=False))
    return 0


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
        return True
    except ImportError:
        return False


if __name__ == "__main__":
    sys.exit(main())
