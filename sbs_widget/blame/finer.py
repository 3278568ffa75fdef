"""Inside a translation: which of its ONNX nodes (or constants) differs, told by a finer torch reference.

When a group of ONNX nodes recomputing one FX value differs on torch's inputs and holds computing nodes
besides the compared one (SiLU as Sigmoid then Mul; attention as ~10 nodes), the FX node alone cannot
say which. A finer program for the FX node (``align/references.py``: attention's math definition,
softmax as torch writes it, torch's own decomposition) run on the same torch inputs gives references
for the inside of the translation. ONNX nodes are paired with its nodes by structure only
(``align/flow.py``: op kinds and the data flow from the shared inputs, carriers and constants read the
same way on both sides). The first paired node whose value differs from its reference, beyond tolerance
and beyond rounding (``engine/noise.py``'s rule, against the same reference run in float64), while its
inputs agree is where the difference starts; when the constants it reads (a scale, a fill value, a
folded mask) differ from the ones the reference reads at the same place, the constant is named instead
("0.375 where torch's math definition of attention uses 0.25"). Nothing is paired by name or by value;
whatever cannot be paired stays unjudged and the culprit is left as it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import onnx
import torch

from sbs_widget.align.flow import KINDS, FxFlow, OnnxFlow, anchor_placeholders, constant_refs, op_name, pair
from sbs_widget.align.references import reference_program
from sbs_widget.engine.noise import epsilon, judge, largest
from sbs_widget.engine.reference import upcast

if TYPE_CHECKING:
    from sbs_widget.engine.entry import Prepared

_COMPARED = 4  # how many constants a node may read for them to be compared one by one


def _run(gm, tensors) -> dict:
    values: dict = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            values[n.name] = out
            return out

    with torch.no_grad():
        Recorder(gm).run(*tensors)
    return values


def _as_array(x, shape=None):
    a = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if a.dtype == bool:
        return a.reshape(shape) if shape is not None else a
    a = a.astype(np.float64)
    return a.reshape(shape) if shape is not None else a


def _saturate(a: np.ndarray, dtype) -> np.ndarray:
    """-inf and the lowest finite number both mean 'masked': compared as the same."""
    big = float(np.finfo(dtype).max) if np.dtype(dtype).kind == "f" else np.inf
    return np.clip(a, -big, big) if a.dtype.kind == "f" else a


def _beyond(got: np.ndarray, expected: np.ndarray, atol: float, rtol: float, dtype) -> np.ndarray:
    """Elements of ``got`` beyond tolerance of ``expected`` (booleans: any difference)."""
    if got.dtype == bool or expected.dtype == bool:
        return got.astype(bool) != expected.astype(bool)
    g, e = _saturate(got, dtype), _saturate(expected, dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(g - e)
        same_nan = np.isnan(g) & np.isnan(e)
        return ~same_nan & ~(diff <= atol + rtol * np.abs(e))


def _fx_constants(f, flow, finer: dict, paired_fx: set) -> list:
    """The constants a finer node reads, in argument order (``flow.constant_refs``), as values: literal
    scalars, and the values of constant nodes that no ONNX node is paired with."""
    return [literal if literal is not None else finer[name] for name, literal in constant_refs(f, flow, paired_fx)
            if literal is not None or isinstance(finer.get(name), torch.Tensor)]


def _what_differs(n, f, rank: int) -> str:
    """What the ONNX node does differently from its finer twin, where its attributes say it."""
    if op_name(f) not in KINDS.get(n.op_type, set()):
        return f"; the reference computes {op_name(f)!r} there"
    if n.op_type in ("Softmax", "LogSoftmax") and len(f.args) > 1 and isinstance(f.args[1], int):
        axis = next((a.i for a in n.attribute if a.name == "axis"), -1)
        dim = f.args[1]
        if rank and axis % rank != dim % rank:
            return f"; {n.op_type} over axis {axis} where the reference normalizes axis {dim}"
    return ""


def refine(prepared: Prepared, value: str, fx_name: str, values: dict, atol: float, rtol: float):
    """``(node name, its ONNX value, its op type, what differs, whether it is a constant)`` for the first
    ONNX node (or the constant it reads) inside ``value``'s group whose value differs from torch's finer
    reference while its inputs agree; None when nothing can be said. ``values``: torch values by FX name
    (the FX node's arguments and the group's anchors' twins)."""
    from sbs_widget.align.elem_types import elem_type

    g = prepared.group(value)
    if g is None or fx_name not in prepared.fx_position:
        return None
    index = prepared.index
    node = prepared.fx_nodes[prepared.fx_position[fx_name]]
    ref = reference_program(node, values)
    if ref is None:
        return None
    gm, placeholder_fx, tensors, label = ref
    group_nodes = [index.nodes[i] for i in g.nodes]
    twins = prepared.alignment.onnx_to_fx
    anchors_fx = {a: twins[a] for a in g.anchors if a in twins}
    anchor_ph = anchor_placeholders(node, anchors_fx, placeholder_fx)
    initializers = set(g.constants) | set(index.initializers)
    oflow = OnnxFlow(index, group_nodes, initializers, elem_type(index, value))
    fflow = FxFlow(gm, set(anchor_ph.values()))
    paired = pair(oflow, fflow, anchor_ph)
    if not paired:
        return None
    finer = _run(gm, tensors)
    exact = _run(gm, [upcast(t) for t in tensors])  # the same reference in float64
    wanted = list(paired)
    for n in group_nodes:
        if n.output and n.output[0] in paired:
            wanted += [x for x in n.input if x and oflow.resolve(x) in oflow.const and x in oflow.producer]
    weights = prepared.weights()
    onnx_values = _run_group(prepared, g, group_nodes, values, list(dict.fromkeys(wanted)))
    if onnx_values is None:
        return None
    paired_fx = set(paired.values())
    for n in group_nodes:
        out = n.output[0] if n.output else None
        if out not in paired or out not in onnx_values:
            continue
        consts = []
        for x in n.input:
            if not x:
                continue
            r = oflow.resolve(x)
            if r in oflow.const:
                if r not in paired:
                    consts.append(x)
            elif r not in anchor_ph and r not in paired:
                return None  # an input computed by a node nothing pairs: the difference may start there
        f = next(m for m in fflow.nodes if m.name == paired[out])
        expected, reference = finer.get(f.name), exact.get(f.name)
        got = onnx_values[out]
        if not isinstance(expected, torch.Tensor) or not isinstance(reference, torch.Tensor) or \
                expected.numel() != got.size:
            continue
        e = _as_array(expected, got.shape)
        bad = _beyond(got, e, atol, rtol, got.dtype)
        if not bad.any():
            continue
        if got.dtype != bool:
            # beyond tolerance: rounding (as close to the float64 reference as torch's), or not
            # (rounding of the coarser of the two types: a float16 ONNX value against a float32 torch one)
            coarse = max(epsilon(expected), epsilon(got))
            big = float(np.finfo(got.dtype).max)
            ex = torch.clamp(expected.reshape(got.shape).double(), -big, big)
            rf = torch.clamp(reference.reshape(got.shape).double(), -big, big)
            if judge(ex, _saturate(got.astype(np.float64), got.dtype), rf, coarse, largest(expected)).noise:
                continue
        # its inputs agree (anchors, paired values checked before in order); its constants?
        hit = _constant_differs(n, consts, f, fflow, finer, paired_fx, onnx_values, weights, oflow, atol, rtol,
                                label)
        if hit is not None:
            return hit
        what = _how_far(got, e, bad, label, f.name, n.op_type) + _what_differs(n, f, got.ndim)
        return n.name, out, n.op_type, what, False
    return None


def _how_far(got: np.ndarray, e: np.ndarray, bad: np.ndarray, label: str, finer: str, op: str) -> str:
    """How the ONNX value differs from the reference: the largest difference, or where the reference is
    NaN/inf (softmax over a row masked everywhere) and the ONNX value is not."""
    if got.dtype == bool or e.dtype == bool:
        return f"different at {int(bad.sum())} of {bad.size} elements from {label} (its {finer!r})"
    finite = np.isfinite(e) & np.isfinite(got)
    if not (bad & finite).any():
        kind = "NaN" if np.isnan(e[bad]).any() else "inf"
        why = " (a row masked everywhere)" if op == "Softmax" else ""
        return f"finite at {int(bad.sum())} of {bad.size} elements where {label} (its {finer!r}) gives {kind}{why}"
    with np.errstate(invalid="ignore"):
        diff = float(np.max(np.abs(got.astype(np.float64) - e)[bad & finite]))
    return f"{diff:.2g} from {label} (its {finer!r})"


def _constant_differs(n, consts, f, fflow, finer, paired_fx, onnx_values, weights, oflow, atol, rtol, label):
    """``(node name, value, op type, what, True)`` naming the constant ``n`` reads (the Constant or initializer it
    carries, else the node computing it) that differs from the one torch's reference reads there; None
    when they agree or cannot be matched one to one."""
    refs = _fx_constants(f, fflow, finer, paired_fx)
    if not consts or len(consts) != len(refs) or len(consts) > _COMPARED:
        return None
    for x, want in zip(consts, refs):
        have = onnx_values.get(x)
        if have is None and x in weights:
            have = weights[x]
        if have is None:
            return None
        a, b = _as_array(have), _as_array(want)
        if not (a.size == b.size or b.size == 1):
            continue
        b = np.full(a.shape, b.reshape(-1)[0], dtype=b.dtype) if b.size == 1 else b.reshape(a.shape)
        if a.dtype == bool or not _beyond(a, b, atol, rtol, np.float32).any():
            continue
        root = oflow.resolve(x)
        producer = oflow.producer.get(root)
        if a.size == 1:
            what = f"{a.reshape(-1)[0]:.6g} where {label} uses {b.reshape(-1)[0]:.6g}"
        else:
            bad = int(_beyond(a, b, atol, rtol, np.float32).sum())
            what = f"{bad} of {a.size} elements differ from the ones {label} uses"
        what += f" (read by {n.op_type} {n.name!r})"
        if producer is None:  # an initializer
            return n.name, root, "initializer", what, True
        return producer.name, root, producer.op_type, what, True
    return None


def _run_group(prepared: Prepared, g, group_nodes, values: dict, wanted: list[str]) -> dict | None:
    """The group's ONNX values ``wanted`` on torch's anchor values (onnxruntime, optimizations off)."""
    import onnxruntime as ort

    from sbs_widget.align.elem_types import elem_type

    index, twins = prepared.index, prepared.alignment.onnx_to_fx
    feeds, inputs = {}, []
    for a in g.anchors:
        t = values.get(twins.get(a))
        if not isinstance(t, torch.Tensor):
            return None
        arr = t.detach().cpu().numpy()
        feeds[a] = arr
        inputs.append(onnx.helper.make_tensor_value_info(a, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype),
                                                         list(arr.shape)))
    weights = prepared.weights()
    inits = [onnx.numpy_helper.from_array(np.asarray(weights[c]), c) for c in g.constants]
    outputs = []
    for v in wanted:
        t = elem_type(index, v)
        if not t:
            return None
        outputs.append(onnx.helper.make_tensor_value_info(v, t, None))
    graph = onnx.helper.make_graph(list(group_nodes), "inside", inputs, outputs, inits)
    model = onnx.helper.make_model(graph, opset_imports=list(prepared.onnx_model.opset_import),
                                   ir_version=prepared.onnx_model.ir_version)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 4
    try:
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        got = sess.run(wanted, feeds)
    except Exception:
        return None
    return dict(zip(wanted, got))


def refine_culprits(found: list, prepared: Prepared, inputs, kwargs, atol: float, rtol: float, top: int = 3) -> list:
    """``found`` (culprits, most likely first) with each of the first ``top`` node culprits moved to
    the ONNX node inside its translation where torch's decomposition says the difference starts
    (``refine``); the others as they are. Reruns the torch program once, up to the nodes needed."""
    import dataclasses

    from sbs_widget.engine.fx_runner import torch_values

    todo = [(k, c) for k, c in enumerate(found[:top]) if c.kind == "node" and c.ep_name and c.value]
    if not todo or prepared is None:
        return found
    names: set[str] = set()
    twins = prepared.alignment.onnx_to_fx
    for _, c in todo:
        g = prepared.group(c.value)
        if g is None or c.ep_name not in prepared.fx_position or len(g.nodes) < 2:
            continue
        node = prepared.fx_nodes[prepared.fx_position[c.ep_name]]
        names |= {a.name for a in node.all_input_nodes}
        names |= {twins[a] for a in g.anchors if a in twins}
    if not names:
        return found
    try:
        values = torch_values(prepared.decomposed_ep, inputs, kwargs, names)
    except Exception:
        return found
    out = list(found)
    for k, c in todo:
        try:
            hit = refine(prepared, c.value, c.ep_name, values, atol, rtol)
        except Exception:  # a decomposition that fails to trace: the culprit stays as found
            hit = None
        if hit is None:
            continue
        name, value, op_type, what, constant = hit
        if name == c.onnx_node and value == c.onnx_name:
            continue
        target = c.ep_target or c.ep_name
        if constant:
            reason = (f"the constant {value!r} inside the translation of {c.ep_name!r} ({target}): {what}; "
                      f"the compared {c.onnx_op_type} {c.onnx_node!r} only carries the difference")
        else:
            reason = (f"{op_type} {name!r}, inside the translation of {c.ep_name!r}: on torch inputs it is {what}, "
                      f"while its inputs agree; the compared {c.onnx_op_type} {c.onnx_node!r} only carries the "
                      f"difference")
        at = c.reason.rfind("; beyond tolerance at ")
        if at >= 0:  # where the compared value differs, as found
            reason += c.reason[at:]
        out[k] = dataclasses.replace(c, onnx_node=name, onnx_name=value, onnx_op_type=op_type, reason=reason)
    return out
