"""Values inside a translation, paired with a finer torch reference: worked out once per prepared pair.

The exporter writes several ONNX nodes for one FX node (attention, linear, rsqrt...); only the last has
an FX twin. For each such translation, the FX node's finer reference (``blame/references.py``) is traced
on the node's example arguments (``meta['val']``) and its nodes are paired with the translation's ONNX
nodes by structure (``blame/flow.py``: op kinds and data flow from the shared inputs; nothing by name
or by value). Carriers (Transpose, Reshape, Cast... of a weight or of a paired value) are paired with
the finer program's carriers of the same source and shape. A lockstep run then computes the finer
program on the node's torch arguments and compares each paired ONNX value with its reference
(``engine/inner_run.py``); values left unpaired keep a one-sided record saying why.

Traces are cached by the node's op and argument types and shapes: the layers of a model share them.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch

from sbs_widget.align.flow import (
    FX_CARRY,
    KINDS,
    ONNX_CARRY,
    FxFlow,
    OnnxFlow,
    anchor_placeholders,
    constant_refs,
    op_name,
    pair,
)
from sbs_widget.align.fused_inputs import fused_input_pairs, rewritten_split_pairs
from sbs_widget.align.fx_graph import example_tensor
from sbs_widget.align.inner_plan import Finer, InnerPair, InnerPlan, returning
from sbs_widget.align.references import composite_program, reference_program

if TYPE_CHECKING:
    from sbs_widget.align.pair import Pair

# ONNX carrier -> the aten carriers doing the same rearrangement
_CARRIER_KINDS = {
    "Transpose": {"t", "transpose", "permute"}, "Reshape": {"view", "reshape", "_unsafe_view"},
    "Flatten": {"view", "reshape", "_unsafe_view"}, "Unsqueeze": {"unsqueeze", "view", "reshape"},
    "Squeeze": {"squeeze", "view", "reshape"}, "Expand": {"expand"}, "Identity": {"clone", "alias", "detach"},
    "Cast": {"_to_copy", "to", "convert_element_type"}, "CastLike": {"_to_copy", "to", "convert_element_type"},
}
_COPIES = {"clone", "contiguous", "alias"}  # the same elements, the same shape
_FLOAT = {1, 10, 11, 16}  # float, float16, double, bfloat16
MAX_TRANSLATION = 64  # ONNX nodes in one translation beyond which no finer reference is traced


def _trace(node: torch.fx.Node, cache: dict):
    """The finer reference of ``node`` traced on examples of its arguments, cached by signature."""
    values, key = {}, [node.target]
    for a in node.all_input_nodes:
        ex = example_tensor(a.meta.get("val"))
        if ex is None:
            return None
        values[a.name] = ex
    for a in list(node.args) + list(node.kwargs.values()):
        if isinstance(a, torch.fx.Node):
            key.append((tuple(values[a.name].shape), values[a.name].dtype, list(values).index(a.name)))
        else:
            key.append(repr(a))
    key = tuple(key + list(node.kwargs))
    if key not in cache:
        try:
            cache[key] = reference_program(node, values)
        except Exception:  # a reference that cannot be traced: the translation stays one-sided
            cache[key] = None
    found = cache[key]
    if found is None:
        return None
    gm, placeholder_fx, _, label = found
    # the cached trace's placeholders follow the argument order: map them to this node's arguments
    names = [a.name for a in list(node.args) + list(node.kwargs.values()) if isinstance(a, torch.fx.Node)]
    return gm, dict(zip(placeholder_fx, names)), label, functools.partial(_retrace, node, names)


def _shape(vt) -> tuple | None:
    dims = getattr(getattr(vt, "shape", None), "dim", None)
    if dims is None:
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)


def pair_carriers(index, group_nodes, paired: dict, sources: dict, gm) -> None:
    """Carriers of a paired value, an anchor or a weight, paired with the finer carrier of the same
    source, kind and shape (a weight's Transpose with its ``t``)."""
    by_input: dict[str, list] = {}
    for f in gm.graph.nodes:
        if f.op == "call_function" and op_name(f) in FX_CARRY and f.all_input_nodes:
            src = f.all_input_nodes[0]
            while op_name(src) in _COPIES and src.all_input_nodes:  # (a reshape of a transpose: a copy first)
                src = src.all_input_nodes[0]
            by_input.setdefault(src.name, []).append(f)
    used = set(paired.values())
    for n in group_nodes:
        if n.op_type not in ONNX_CARRY or not n.input or not n.output or n.output[0] in paired:
            continue
        src = paired.get(n.input[0]) or sources.get(n.input[0])
        if src is None:
            continue
        want = _shape(index.types.get(n.output[0]))
        fits = []
        for f in by_input.get(src, []):
            val = f.meta.get("val")
            if f.name in used or op_name(f) not in _CARRIER_KINDS.get(n.op_type, ()) or \
                    not isinstance(val, torch.Tensor):
                continue
            if want is None or (len(want) == val.dim() and all(w is None or w == d for w, d in zip(want, val.shape))):
                fits.append(f)
        if len(fits) == 1:
            paired[n.output[0]] = fits[0].name
            used.add(fits[0].name)


def build_inner_plan(p: Pair) -> InnerPlan:
    """The ``InnerPlan`` of pair ``p`` (whose own inner plan is still empty: ``pipeline.build_pair``)."""
    from sbs_widget.align.elem_types import elem_type

    index, al = p.index, p.alignment
    twins = al.onnx_to_fx
    plan, cache, modules = InnerPlan(), {}, {}
    weight_of = {w.onnx_name: w.placeholder for w in al.weights if w.onnx_name}
    for fx_name, nodes in al.fx_group.items():
        inside = [o for i in nodes if index.op_types[i] != "Constant" for o in index.node_outputs[i]
                  if o and o not in twins and o not in plan.of and elem_type(index, o) in _FLOAT]
        for o in inside:
            plan.of[o] = fx_name
        if not inside:
            continue
        pair_ = al.pairs.get(fx_name)
        value = pair_.onnx_value if pair_ is not None else None
        if value not in index.producer:  # its own value vanished (a fused node took in the end of its
            value = inside[-1]  # computation, e.g. a linear's bias Add): the inside up to the last value
        g = p.group(value)
        if g is None or len(g.nodes) > MAX_TRANSLATION:
            _unpaired(plan, inside, "its translation cannot be isolated from torch values")
            continue
        node = p.fx_nodes[p.fx_position[fx_name]]
        group_nodes = [index.nodes[i] for i in g.nodes]
        traced = _trace(node, cache)
        tried = _attempt(p, group_nodes, g, value, node, traced, weight_of, inside) if traced else None
        computing = [o for o in inside if index.op_types[index.producer[o]] not in ONNX_CARRY]
        if computing and (tried is None or not any(o in tried[1] for o in computing)):
            # nothing computed inside pairs: the translation may cover FX nodes before this one that have
            # no ONNX value of their own (a fusion merged an addmm with the view after it)
            composite = _trace_composite(p, node)
            again = _attempt(p, group_nodes, g, value, node, composite, weight_of, inside) if composite else None
            if again is not None and len(again[1]) > len(tried[1] if tried else ()):
                traced, tried = composite, again
        if tried is None:
            _unpaired(plan, inside, "no finer torch reference for this op")
            continue
        gm, placeholder_fx, label, retrace = traced
        paired, found, crossed, oflow, fflow = tried
        plan.why.update(crossed)
        finer_nodes = {f.name: f for f in gm.graph.nodes}
        for o in inside:
            if o not in found:
                _unpaired(plan, [o], "a constant of the translation (it reads no value of torch's)"
                          if oflow.resolve(o) in oflow.const else
                          f"not paired with a node of {label} (no node of the same kind reading the same values)")
        before = len(plan.pairs)
        refs = _pair_constants(index, g.nodes, paired, oflow, fflow, plan, fx_name, found, weight_of)
        if not found and len(plan.pairs) == before:
            continue
        plan.by_fx[fx_name] = list(found)
        plan.group_value[fx_name] = value
        for o, f in found.items():
            plan.pairs[o] = InnerPair(fx_name, f, str(finer_nodes[f].target),
                                      index.op_types[index.producer[o]] == "Transpose")
        names = sorted(set(found.values()) | refs)
        key = (id(gm), tuple(names))
        if key not in modules:  # (layers share traces: one module per trace and set of values)
            modules[key] = returning(gm, names)
        plan.finer[fx_name] = Finer(modules[key], names, list(placeholder_fx.values()), label, retrace,
                                    _traced_at(gm))
    if not any(getattr(d, "itemsize", 0) == 2 for d in al.fx_dtypes):  # (half precision: not recomputed apart)
        taken = set(plan.pairs)
        for found in fused_input_pairs(p, pair_carriers, taken) + rewritten_split_pairs(p, taken):
            plan.finer[found.key] = _finer_of(found.gm, found.names, found.args, found.label, found.retrace)
            for o, f in found.pairs.items():
                fx = found.fx or plan.of.get(o) or index.node_fx[index.producer[o]] or found.args[0]
                plan.pairs[o] = InnerPair(fx, f, found.ops[f], index.op_types[index.producer[o]] == "Transpose",
                                          program=found.key)
                plan.of[o] = fx
                plan.why.pop(o, None)
    return plan


def _finer_of(gm, names: list[str], args: list[str], label: str, retrace) -> Finer:
    return Finer(returning(gm, names), names, args, label, retrace, _traced_at(gm))


def _traced_at(gm: torch.fx.GraphModule) -> tuple:
    """The argument shapes ``gm`` was traced at (``Finer.module_for`` traces again at others)."""
    return tuple(tuple(n.meta["val"].shape) for n in gm.graph.nodes if n.op == "placeholder"
                 and isinstance(n.meta.get("val"), torch.Tensor))


def _pair_constants(index, node_indices, paired: dict, oflow, fflow, plan: InnerPlan, fx_name: str,
                    found: dict, weights) -> set:
    """The floating-point constants a paired ONNX node reads (a scale, a fill value, an epsilon: an
    initializer, a Constant or a Cast of one) paired one to one, in argument order, with the constants its
    finer node reads; those of a Constant or an initializer are recorded with the node reading them
    (not the program's weights: their own records compare them).
    Returns the finer constant nodes the reference must hand back."""
    from sbs_widget.align.elem_types import elem_type

    finer = {f.name: f for f in fflow.nodes} | {n: None for n in fflow.const}
    paired_fx = set(paired.values())
    refs: set[str] = set()
    for i in node_indices:
        n = index.nodes[i]
        f = next((m for m in fflow.nodes if n.output and m.name == paired.get(n.output[0])), None)
        if f is None or op_name(f) not in KINDS.get(n.op_type, ()):
            continue
        consts = [x for x in n.input if x and oflow.resolve(x) in oflow.const and oflow.resolve(x) not in paired]
        wanted = constant_refs(f, fflow, paired_fx)
        if not consts or len(consts) != len(wanted) or len(consts) > 4:
            continue
        for x, (ref, literal) in zip(consts, wanted):
            if x in plan.pairs or x in found or x in weights or elem_type(index, x) not in _FLOAT or \
                    (literal is None and ref not in finer):
                continue
            plan.pairs[x] = InnerPair(fx_name, ref, str(f.target), constant=True, literal=literal)
            plan.of[x] = fx_name
            plan.why.pop(x, None)
            if literal is None:
                refs.add(ref)
            if x not in index.producer or index.op_types[index.producer[x]] == "Constant":
                plan.constants_of.setdefault(i, []).append(x)  # (a Cast of one: recorded where it is computed)
    return refs


def _attempt(p: Pair, group_nodes, g, value: str, node, traced, weight_of: dict, inside: list):
    """The translation's ONNX nodes paired with the traced reference ``traced``: (ONNX value -> its node,
    the inside values paired, why the others read the same values but compute another op, flows)."""
    from sbs_widget.align.elem_types import elem_type

    index, twins = p.index, p.alignment.onnx_to_fx
    gm, placeholder_fx, label, _ = traced
    anchors_fx = {a: twins[a] for a in g.anchors if a in twins}
    anchor_ph = anchor_placeholders(node, anchors_fx, placeholder_fx)
    oflow = OnnxFlow(index, group_nodes, set(g.constants) | set(index.initializers), elem_type(index, value))
    fflow = FxFlow(gm, set(anchor_ph.values()))
    paired = pair(oflow, fflow, anchor_ph)
    by_fx = {fx: ph for ph, fx in placeholder_fx.items()}
    sources = dict(anchor_ph)
    sources.update({w: by_fx[ph] for w, ph in weight_of.items() if ph in by_fx})
    pair_carriers(index, group_nodes, paired, sources, gm)
    finer_nodes = {f.name: f for f in gm.graph.nodes}
    found, crossed = {}, {}
    for o in inside:
        f = finer_nodes.get(paired.get(o))
        if f is None:
            continue
        op = index.op_types[index.producer[o]]
        if op in ONNX_CARRY or op_name(f) in KINDS.get(op, ()):
            found[o] = f.name
        else:  # paired by the values it reads only: another op (a fault, or another way to compute)
            crossed[o] = (f"reads the same values as {op_name(f)} in {label} but computes {op}: not compared "
                          "(the difference, if any, shows on the values that read it)")
    return paired, found, crossed, oflow, fflow


def _trace_composite(p: Pair, node: torch.fx.Node):
    """The finer reference of ``node`` and of the FX nodes before it that have no ONNX value of their own
    (what one ONNX translation may cover once an optimizer merged them), or None when there are none."""
    al, index = p.alignment, p.index
    nodes, todo = [node], list(node.all_input_nodes)
    while todo and len(nodes) < 4:
        m = todo.pop()
        pair_ = al.pairs.get(m.name)
        if m.op != "call_function" or m in nodes or (pair_ is not None and pair_.onnx_value in index.producer):
            continue
        nodes.insert(0, m)
        todo += m.all_input_nodes
    if len(nodes) == 1:
        return None
    order = {n.name: i for i, n in enumerate(p.fx_nodes)}
    nodes.sort(key=lambda n: order[n.name])
    values = {}
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in nodes and a.name not in values:
                ex = example_tensor(a.meta.get("val"))
                if ex is None:
                    return None
                values[a.name] = ex
    try:
        found = composite_program(nodes, values)
    except Exception:  # (a reference that cannot be traced: the translation stays one-sided)
        return None
    if found is None:
        return None
    gm, placeholder_fx, _, label = found
    names = list(placeholder_fx.values())
    return gm, placeholder_fx, label, lambda args: composite_program(nodes, dict(zip(names, args)))[0]


def _retrace(node: torch.fx.Node, names: list[str], args: list):
    found = reference_program(node, dict(zip(names, args)))
    return found[0] if found is not None else None


def _unpaired(plan: InnerPlan, values, why: str) -> None:
    for o in values:
        plan.why.setdefault(o, why)
