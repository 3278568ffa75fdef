"""Accuracy of the culprit finder on injected faults.

    python benchmarks/culprit_accuracy.py                      # full suite (about 2 min on 2 cores)
    python benchmarks/culprit_accuracy.py --models dummy_llm mlp --per-kind 2
    python benchmarks/culprit_accuracy.py --inside --exact --models dummy_llm llama bert gpt2
                        # faults inside translations, scored on the exact ONNX node (issue 32)
    python benchmarks/culprit_accuracy.py --inside --exact --models qwen2 phi3 gemma mistral gpt_neox
                        # the same inside scaled_dot_product_attention translations (79 faults, 100%)
    python benchmarks/culprit_accuracy.py --inside --exact --dtype float16 --models llama bert gpt2 qwen2
                        # float16 programs (28 faults, 100%); docs/measurements.md has the history

Correct exports of several models (optimize=False and True) get ONE fault each, placed after the
first 40% of the ONNX nodes, at seeded random positions, of these kinds: noise on one weight, an op
replaced (Add<->Sub, Mul<->Div...), a changed attribute (epsilon, Softmax axis), a float16 round trip
inserted on one intermediate, a scaled scalar constant, a swapped Gelu approximation. Faults that do
not move a model output beyond tolerance are skipped (not observable). Each fault is run through
``sbs_widget.blame.culprits``; top-1/top-3 count the answers naming the corrupted node (a weight or
constant: the initializer or one of its consumers; a cast: the Cast nodes or the value it rounds).
When the corrupted node has no torch twin (an ONNX-only node fused into the group of a compared
value), naming that group counts too (column ``fused``), except for casts: the consumer of a rounded
value is not an answer. Correct exports must give no culprit. For reference, ``first-div`` and
``max-local`` score onnx-diagnostic's rules on the same records (the first record beyond tolerance;
the largest node-local error), with the same credit rules.

RESULTS (2 shared cores, torch 2.13, onnxruntime 1.32; about 2 min)

    python benchmarks/culprit_accuracy.py

    | fault kind / model     | faults |  top-1 |  top-3 | fused | first-div | max-local |
    |------------------------|--------|--------|--------|-------|-----------|-----------|
    | weight                 |     30 | 100.0% | 100.0% |     0 |    100.0% |    100.0% |
    | op                     |     24 | 100.0% | 100.0% |     0 |    100.0% |    100.0% |
    | attribute              |     19 | 100.0% | 100.0% |     0 |    100.0% |    100.0% |
    | cast                   |     20 | 100.0% | 100.0% |     0 |      0.0% |      0.0% |
    | constant               |     16 | 100.0% | 100.0% |     0 |     93.8% |    100.0% |
    | gelu                   |      2 | 100.0% | 100.0% |     0 |    100.0% |    100.0% |
    | bert opt=False         |     13 | 100.0% | 100.0% |     0 |     76.9% |     76.9% |
    | bert opt=True          |     12 | 100.0% | 100.0% |     0 |     83.3% |     83.3% |
    | dummy_llm opt=False    |     13 | 100.0% | 100.0% |     0 |     76.9% |     76.9% |
    | dummy_llm opt=True     |     13 | 100.0% | 100.0% |     0 |     76.9% |     76.9% |
    | gpt2 opt=False         |     15 | 100.0% | 100.0% |     0 |     80.0% |     80.0% |
    | gpt2 opt=True          |     15 | 100.0% | 100.0% |     0 |     80.0% |     80.0% |
    | llama opt=False        |     11 | 100.0% | 100.0% |     0 |    100.0% |    100.0% |
    | llama opt=True         |     13 | 100.0% | 100.0% |     0 |     69.2% |     76.9% |
    | mlp opt=False          |      3 | 100.0% | 100.0% |     0 |    100.0% |    100.0% |
    | mlp opt=True           |      3 | 100.0% | 100.0% |     0 |    100.0% |    100.0% |
    | ALL                    |    111 | 100.0% | 100.0% |     0 |     81.1% |     82.0% |
    false alarms on correct exports: 0 culprits over 10 exports

A second draw (other sites, more per kind; measured before the zoo's models were made trained-like):

    python benchmarks/culprit_accuracy.py --seed 7 --per-kind 5

    | fault kind / model     | faults |  top-1 |  top-3 | fused | first-div | max-local |
    |------------------------|--------|--------|--------|-------|-----------|-----------|
    | weight                 |     48 | 100.0% | 100.0% |     5 |     93.8% |     97.9% |
    | op                     |     40 | 100.0% | 100.0% |     0 |     92.5% |     95.0% |
    | attribute              |     25 | 100.0% | 100.0% |     2 |    100.0% |    100.0% |
    | cast                   |     26 | 100.0% | 100.0% |     0 |      0.0% |      0.0% |
    | constant               |     22 | 100.0% | 100.0% |     0 |     90.9% |    100.0% |
    | gelu                   |      2 | 100.0% | 100.0% |     0 |    100.0% |    100.0% |
    | bert opt=False         |     19 | 100.0% | 100.0% |     0 |     84.2% |     84.2% |
    | bert opt=True          |     17 | 100.0% | 100.0% |     4 |     88.2% |     88.2% |
    | dummy_llm opt=False    |     19 | 100.0% | 100.0% |     0 |     73.7% |     68.4% |
    | dummy_llm opt=True     |     19 | 100.0% | 100.0% |     1 |     73.7% |     63.2% |
    | gpt2 opt=False         |     23 | 100.0% | 100.0% |     0 |     82.6% |     87.0% |
    | gpt2 opt=True          |     20 | 100.0% | 100.0% |     0 |     95.0% |     95.0% |
    | llama opt=False        |     21 | 100.0% | 100.0% |     2 |     71.4% |     81.0% |
    | llama opt=True         |     17 | 100.0% | 100.0% |     0 |     52.9% |     82.4% |
    | mlp opt=False          |      4 | 100.0% | 100.0% |     0 |    100.0% |    100.0% |
    | mlp opt=True           |      4 | 100.0% | 100.0% |     0 |    100.0% |    100.0% |
    | ALL                    |    163 | 100.0% | 100.0% |     7 |     79.1% |     82.2% |
    false alarms on correct exports: 0 culprits over 10 exports
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sbs_widget.load.onnx_index import OnnxIndex  # noqa: E402
from sbs_widget.samples import faults  # noqa: E402

ATOL = RTOL = 1e-4  # the run's tolerance (--atol: another; float16 runs: the program's default)
RUN = {"atol": ATOL, "rtol": RTOL, "reference": True}  # options of every run (set by main)
OBSERVABLE = {"atol": ATOL, "rtol": RTOL}  # a fault counts when it moves an output beyond this
WEIGHT_NOISE = 1e-2  # relative size of the "weight" faults (--weight-scale)
KINDS = ("weight", "op", "attribute", "cast", "constant", "gelu")
MODELS = ("dummy_llm", "mlp", "llama", "bert", "gpt2")
SWAPS = {"Add": "Sub", "Sub": "Add", "Mul": "Div", "Div": "Mul", "Sigmoid": "Tanh", "Tanh": "Sigmoid",
         "Relu": "Sigmoid", "Exp": "Sigmoid"}
FLOAT = onnx.TensorProto.FLOAT


@dataclass
class Fault:
    kind: str
    description: str
    model: onnx.ModelProto
    ok_nodes: set = field(default_factory=set)   # naming one of these nodes is correct
    ok_values: set = field(default_factory=set)  # naming one of these values is correct


def _floats(index: OnnxIndex, value: str) -> bool:
    vt = index.types.get(value)
    return vt is not None and vt.elem_type in (FLOAT, onnx.TensorProto.FLOAT16)


def candidates(model: onnx.ModelProto, kind: str, inner: set | None = None) -> list:
    """(description, builder() -> Fault) for every site of ``kind`` after the first 40% of nodes;
    with ``inner`` (ONNX node names), only the sites whose corrupted node (or a consumer of the
    corrupted weight or constant) is one of them: faults inside a translation."""
    sites = _candidates(model, kind)
    if inner is None:
        return [(d, b) for d, b, _ in sites]
    return [(d, b) for d, b, touched in sites if touched & inner]


def _candidates(model: onnx.ModelProto, kind: str) -> list:
    """(description, builder, names of the ONNX nodes the fault touches) for every site of ``kind``."""
    index = OnnxIndex.build(model)
    nodes = list(model.graph.node)
    start = int(0.4 * len(nodes))
    deep = range(start, len(nodes))
    out = []
    if kind == "weight":
        seen = set()
        for i in deep:
            for x in nodes[i].input:
                if x in index.initializers and x not in seen and _floats(index, x):
                    arr = index.initializers[x]
                    if int(np.prod(arr.dims)) >= 16:
                        seen.add(x)
                        readers = {nodes[j].name for j in index.consumers.get(x, [])}
                        out.append((f"noise on weight {x}", lambda x=x, readers=readers: Fault(
                            "weight", f"noise {WEIGHT_NOISE:g} on weight {x}",
                            faults.perturb_initializer(model, x, scale=WEIGHT_NOISE), readers, {x}), readers))
    elif kind == "op":
        for i in deep:
            n = nodes[i]
            if n.op_type in SWAPS and n.output and _floats(index, n.output[0]):
                out.append((f"{n.op_type}->{SWAPS[n.op_type]} at {n.name}", lambda n=n: Fault(
                    "op", f"{n.op_type} replaced by {SWAPS[n.op_type]} at {n.name}",
                    faults.replace_op(model, n.name, SWAPS[n.op_type]), {n.name}), {n.name}))
    elif kind == "attribute":
        for i in deep:
            n = nodes[i]
            if n.op_type in ("LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization"):
                out.append((f"epsilon at {n.name}", lambda n=n: Fault(
                    "attribute", f"epsilon=0.1 at {n.name}", faults.set_attribute(model, n.name, "epsilon", 0.1),
                    {n.name}), {n.name}))
            if n.op_type in ("Softmax", "LogSoftmax"):
                out.append((f"axis at {n.name}", lambda n=n: Fault(
                    "attribute", f"axis=-2 at {n.name}", faults.set_attribute(model, n.name, "axis", -2), {n.name}),
                    {n.name}))
    elif kind == "cast":
        for i in deep:
            n = nodes[i]
            if n.op_type in ("Constant", "Shape") or not n.output:
                continue
            v = n.output[0]
            if _floats(index, v) and index.consumers.get(v) and v not in index.outputs:
                out.append((f"float16 round trip on {v}", lambda v=v, n=n: Fault(
                    "cast", f"float16 round trip on {v}", faults.insert_cast(model, v),
                    {f"{v}__cast_low", f"{v}__cast_back", n.name}, {v, f"{v}__lowp", f"{v}__roundtrip"}), {n.name}))
    elif kind == "constant":
        seen = set()
        for i in deep:
            for x in nodes[i].input:
                if x in seen or not x:
                    continue
                arr = None
                if x in index.initializers:
                    t = index.initializers[x]
                    if t.data_type == FLOAT and int(np.prod(t.dims)) == 1:
                        arr = t
                elif x in index.constant_nodes:
                    c = nodes[index.constant_nodes[x]]
                    t = next((a.t for a in c.attribute if a.name == "value"), None)
                    if t is not None and t.data_type == FLOAT and int(np.prod(t.dims)) == 1:
                        arr = t
                if arr is None:
                    continue
                seen.add(x)
                ok = {nodes[j].name for j in index.consumers.get(x, [])}
                if x in index.constant_nodes:
                    ok.add(nodes[index.constant_nodes[x]].name)
                out.append((f"constant {x} x1.5", lambda x=x, ok=ok: Fault(
                    "constant", f"scalar constant {x} scaled by 1.5", faults.scale_constant(model, x, 1.5), ok, {x}),
                    ok))
    elif kind == "gelu":
        for i in deep:
            n = nodes[i]
            if n.op_type == "Gelu":
                out.append((f"gelu at {n.name}", lambda n=n: Fault(
                    "gelu", f"Gelu approximation swapped at {n.name}",
                    faults.swap_gelu_approximation(model, n.name), {n.name}), {n.name}))
    return out


class Oracle:
    """Runs ONNX models with onnxruntime on the inputs: reference outputs, observability of a fault."""

    def __init__(self, model: onnx.ModelProto, args, kwargs):
        import torch

        leaves = [x for x in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
        names = [i.name for i in model.graph.input]
        self.feeds = {n: t.detach().cpu().numpy() for n, t in zip(names, leaves)}
        self.reference = self.outputs(model)

    def outputs(self, model):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return sess.run(None, self.feeds)

    def observable(self, model) -> bool:
        try:
            got = self.outputs(model)
        except Exception:
            return False  # a fault that breaks the model is not a numerical discrepancy
        for e, g in zip(self.reference, got):
            e, g = np.asarray(e, dtype=np.float64), np.asarray(g, dtype=np.float64)
            if e.shape != g.shape:
                return False
            bad = ~np.isclose(g, e, atol=OBSERVABLE["atol"], rtol=OBSERVABLE["rtol"], equal_nan=True)
            if bad.any():
                return True
        return False


def make_faults(model, args, kwargs, *, per_kind: int = 3, seed: int = 0, kinds=KINDS, oracle=None, inner=None):
    """Up to ``per_kind`` observable faults per kind, sites drawn with ``seed`` (``inner``: see
    ``candidates``)."""
    oracle = oracle or Oracle(model, args, kwargs)
    rng = np.random.default_rng(seed)
    out = []
    for kind in kinds:
        sites = candidates(model, kind, inner)
        order = rng.permutation(len(sites))
        found = 0
        for j in order[: per_kind * 4]:
            if found >= per_kind:
                break
            fault = sites[int(j)][1]()
            if oracle.observable(fault.model):
                out.append(fault)
                found += 1
    return out


def is_hit(culprit, fault: Fault, prepared) -> str:
    """'' (wrong), 'exact' or 'fused' (the corrupted ONNX-only node is in the culprit's group)."""
    if culprit.onnx_node in fault.ok_nodes or culprit.onnx_name in fault.ok_values:
        return "exact"
    if fault.kind != "cast" and culprit.onnx_name and culprit.onnx_name in prepared.index.producer:
        g = prepared.group(culprit.onnx_name)
        if g is not None:
            twins = prepared.alignment.onnx_to_fx
            for i in g.nodes:
                node = prepared.index.nodes[i]
                if node.name in fault.ok_nodes and not any(o in twins for o in node.output):
                    return "fused"
    return ""


def evaluate(ep, model, args, kwargs, fault_list):
    """[(fault, rank 1-based or 0, how)] and the number of culprits on the correct export."""
    from sbs_widget.blame.culprits import Culprit, culprits, find_culprits
    from sbs_widget.blame.finer import refine_culprits
    from sbs_widget.engine.entry import prepare

    def as_culprit(rec):
        return Culprit(rec.onnx_node_name, rec.onnx_name, rec.onnx_op_type, rec.ep_name, rec.ep_target,
                       rec.module, 0.0, "", value=rec.onnx_name)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        false_alarms = len(culprits(ep, model, args, kwargs, **RUN))
        results = []
        for fault in fault_list:
            prepared = prepare(ep, fault.model)
            atol, rtol = prepared.tolerance(RUN["atol"], RUN["rtol"])
            records = list(prepared.run(args, kwargs, node_local=True, **RUN))
            found = refine_culprits(find_culprits(records, prepared=prepared, atol=atol, rtol=rtol), prepared,
                                    args, kwargs, atol, rtol)
            rank, how, exact_rank = 0, "", 0
            for r, c in enumerate(found[:3], 1):
                h = is_hit(c, fault, prepared)
                if h and not rank:
                    rank, how = r, h
                if h == "exact":
                    exact_rank = r
                    break
            # onnx-diagnostic's rules for reference: the first record beyond tolerance, the largest err_local
            nodes = [x for x in records if x.kind == "node" and x.onnx_name in prepared.index.producer]
            first = next((x for x in nodes if x.status == "mismatch"), None)
            local = max((x for x in nodes if x.err_local is not None), key=lambda x: x.err_local, default=None)
            base = tuple(bool(x is not None and is_hit(as_culprit(x), fault, prepared))
                         for x in (first, local))
            results.append((fault, rank, how, found[:3], base, exact_rank, _family(prepared, fault)))
    return results, false_alarms


def export(name: str, optimize: bool, dtype=None):
    from sbs_widget.samples import zoo

    with contextlib.redirect_stderr(io.StringIO()):
        return zoo.export(name, optimize=optimize, dtype=dtype)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--per-kind", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true", help="print every miss")
    parser.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                        help="export the models in this precision (float16: the default tolerance of the "
                             "program's precision, unless --atol)")
    parser.add_argument("--atol", type=float, help="atol = rtol of the runs (default: 1e-4; float16: 1e-3)")
    parser.add_argument("--no-reference", action="store_true",
                        help="no float64 verdict: every pair beyond tolerance is a mismatch (as before)")
    parser.add_argument("--weight-scale", type=float, default=1e-2, help="relative size of the weight faults")
    parser.add_argument("--inside", action="store_true",
                        help="faults inside translations only: on ONNX nodes with no torch twin of their own "
                             "(attention's scales and softmax, a linear's MatMul before its Add...), or on the "
                             "weights and constants they read")
    parser.add_argument("--exact", action="store_true",
                        help="top-1/top-3 count only answers naming the corrupted node, initializer or constant "
                             "(naming the translation's compared value, column 'fused', is a miss)")
    args = parser.parse_args(argv)
    EXACT[0] = args.exact
    global WEIGHT_NOISE
    WEIGHT_NOISE = args.weight_scale
    dtype = torch.float16 if args.dtype == "float16" else None
    tol = args.atol if args.atol is not None else (None if dtype is not None else ATOL)
    RUN.update(atol=tol, rtol=tol, reference=not args.no_reference)
    if dtype is not None:  # observable: beyond the float16 precision (what a correct export keeps)
        OBSERVABLE.update(atol=1e-3, rtol=1e-3)
    rows = []
    alarms = {}
    begin = time.perf_counter()
    for name in args.models:
        for optimize in (False, True):
            try:
                ep, prog, a, kw = export(name, optimize, dtype)
            except Exception as e:  # the exporter's failure (dummy_llm in float16): the others still run
                print(f"{name:10s} optimize={optimize!s:5s} export failed: {type(e).__name__}: "
                      f"{str(e).splitlines()[0][:120]}", flush=True)
                continue
            model = prog.model_proto
            inner = _inner_nodes(ep, model) if args.inside else None
            flist = make_faults(model, a, kw, per_kind=args.per_kind, seed=args.seed, inner=inner)
            results, fa = evaluate(ep, model, a, kw, flist)
            alarms[(name, optimize)] = fa
            for fault, rank, how, found, base, exact_rank, family in results:
                rows.append((name, optimize, fault.kind, rank, how) + base + (exact_rank, family))
                if args.verbose and (exact_rank if EXACT[0] else rank) != 1:
                    print(f"MISS {name} opt={optimize} {fault.description}: rank={rank}", flush=True)
                    for c in found:
                        print(f"     {c.score:.2f} {c.onnx_op_type} {c.onnx_node} {c.onnx_name}: {c.reason}")
            print(f"{name:10s} optimize={optimize!s:5s} faults={len(results):3d} "
                  f"top1={sum((r[5] if EXACT[0] else r[1]) == 1 for r in results)} false_alarms={fa} "
                  f"({time.perf_counter() - begin:.0f}s)", flush=True)
    _table(rows, alarms)
    return 0


EXACT = [False]  # --exact: set by main

# the translation a fault sits in, by the op of its FX node (the exporter's metadata on the ONNX node)
FAMILIES = ("attention", "linear", "norm", "activation")
_FAMILY_OPS = {
    "attention": ("scaled_dot_product_attention", "_softmax", "softmax", "flash_attention", "efficient_attention"),
    "linear": ("linear", "addmm", ".mm.", "bmm", "matmul", "baddbmm"),
    "norm": ("layer_norm", "rms_norm", "group_norm", "batch_norm", "rsqrt", ".var", ".mean."),
    "activation": ("silu", "gelu", "sigmoid", "tanh", "relu", "elu", "hardswish", "softplus", "mish"),
}


def _family(prepared, fault) -> str:
    """Which kind of translation the fault's ONNX node lies in (the FX op it translates)."""
    index = prepared.index
    at = {n.name: i for i, n in enumerate(index.nodes)}
    for name in sorted(fault.ok_nodes):
        i = at.get(name)
        fx = index.node_fx[i] if i is not None else None
        if fx in prepared.fx_position:
            target = str(prepared.fx_nodes[prepared.fx_position[fx]].target)
            for family, ops in _FAMILY_OPS.items():
                if any(op in target for op in ops):
                    return family
    return "other"


def _inner_nodes(ep, model) -> set:
    """Names of the ONNX nodes inside a translation: none of their outputs has a torch twin."""
    from sbs_widget.engine.entry import prepare

    twins = prepare(ep, model).alignment.onnx_to_fx
    return {n.name for n in model.graph.node
            if n.output and n.op_type != "Constant" and not any(o in twins for o in n.output)}


def _table(rows, alarms) -> None:
    def hit(r, rank_max):
        return 1 <= (r[7] if EXACT[0] else r[3]) <= rank_max

    def line(label, sel):
        n = len(sel)
        if not n:
            return
        t1 = sum(hit(r, 1) for r in sel) / n
        t3 = sum(hit(r, 3) for r in sel) / n
        fused = sum(r[4] == "fused" and r[3] == 1 for r in sel)
        first = sum(r[5] for r in sel) / n
        local = sum(r[6] for r in sel) / n
        print(f"| {label:22s} | {n:6d} | {100 * t1:5.1f}% | {100 * t3:5.1f}% | {fused:5d} | {100 * first:8.1f}% "
              f"| {100 * local:8.1f}% |")

    print()
    print(f"| {'fault kind / model':22s} | faults |  top-1 |  top-3 | fused | first-div | max-local |")
    print(f"|{'-' * 24}|--------|--------|--------|-------|-----------|-----------|")
    for kind in KINDS:
        line(kind, [r for r in rows if r[2] == kind])
    for family in FAMILIES + ("other",):
        line(f"in {family}", [r for r in rows if r[8] == family])
    for name in sorted({r[0] for r in rows}):
        for opt in (False, True):
            line(f"{name} opt={opt}", [r for r in rows if r[0] == name and r[1] == opt])
    line("ALL", rows)
    print(f"\nfalse alarms on correct exports: {sum(alarms.values())} culprits over {len(alarms)} exports")


if __name__ == "__main__":
    sys.exit(main())
