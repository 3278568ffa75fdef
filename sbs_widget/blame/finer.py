"""Inside a translation with two computing nodes: which one differs, told by a finer torch reference.

When a group of ONNX nodes recomputing one FX value differs on torch's inputs and holds more than one
computing node (SiLU as Sigmoid then Mul), the FX node alone cannot say which. torch's own
decomposition of the FX node (``torch._decomp``: silu -> sigmoid, mul) is a finer program: run on
the same torch inputs, its values are references for the inside of the translation. ONNX nodes are
paired with its nodes by structure only: the op kind (``_KINDS``) and the data flow from the shared
inputs (an ONNX input is the group's anchor standing for an FX argument, or the output of an already
paired node; constants match any literal). The first paired node whose value differs from its
reference, beyond tolerance and beyond rounding (``engine/noise.py``'s rule, against the same
decomposition run in float64), while its inputs agree is where the difference starts. Nothing is paired by name or by
value; whatever cannot be paired stays unjudged and the culprit is left as it was.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch

from sbs_widget.engine.noise import epsilon, judge, largest
from sbs_widget.engine.reference import upcast

# ONNX op -> the aten ops (overload packet names) computing the same thing
_KINDS = {
    "Sigmoid": {"sigmoid"}, "Tanh": {"tanh"}, "Mul": {"mul"}, "Add": {"add"}, "Sub": {"sub", "rsub"},
    "Div": {"div"}, "Exp": {"exp"}, "Log": {"log"}, "Erf": {"erf"}, "Sqrt": {"sqrt"}, "Reciprocal": {"reciprocal"},
    "Pow": {"pow"}, "Neg": {"neg"}, "Abs": {"abs"}, "Relu": {"relu"}, "Softmax": {"_softmax", "softmax"},
    "MatMul": {"mm", "bmm", "matmul"}, "ReduceMean": {"mean"}, "ReduceSum": {"sum"}, "Where": {"where"},
    "Cos": {"cos"}, "Sin": {"sin"}, "Rsqrt": {"rsqrt"},
}


_CONVERSIONS = {"_to_copy", "to", "convert_element_type", "clone", "alias"}


def _op_name(f: torch.fx.Node) -> str:
    """The aten op of a finer node without namespace or overload (``sigmoid``)."""
    return getattr(getattr(f.target, "overloadpacket", None), "__name__", "")


def _reference_program(node: torch.fx.Node, values: dict):
    """(finer graph module, its placeholder -> FX argument name, the argument tensors) from torch's
    decomposition of ``node`` on its torch argument values, or None."""
    from torch._decomp import core_aten_decompositions, decomposition_table
    from torch.fx.experimental.proxy_tensor import make_fx

    table = {**decomposition_table, **core_aten_decompositions()}
    fn = table.get(node.target)
    if fn is None or node.kwargs:
        return None
    names, tensors = [], []
    for a in node.args:
        if isinstance(a, torch.fx.Node):
            if not isinstance(values.get(a.name), torch.Tensor):
                return None
            names.append(a.name)
            tensors.append(values[a.name])

    def call(*ts):
        it = iter(ts)
        args = [next(it) if isinstance(a, torch.fx.Node) else a for a in node.args]
        return fn(*args)

    gm = make_fx(call)(*tensors)  # one level: the ops the decomposition calls stay whole
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    return gm, dict(zip(placeholders, names)), tensors


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


def _pair(group_nodes, anchors_fx: dict, gm, placeholder_fx: dict) -> dict:
    """ONNX output value -> finer FX node name, by data flow from the shared inputs, in passes until
    nothing more pairs: first nodes of the same kind (``_KINDS``), then a node whose inputs match
    exactly one finer node's (its kind may differ: that is what the difference is)."""
    by_arg = {fx: ph for ph, fx in placeholder_fx.items()}  # FX arg name -> finer placeholder
    paired: dict[str, str] = {}
    used: set[str] = set()
    # A conversion of dtype (a float16 program's decomposition computing in float32) carries the value
    # it converts: it stands for its input in the data flow, and is never paired itself.
    same: dict[str, str] = {}
    for f in gm.graph.nodes:
        if f.op == "call_function" and _op_name(f) in _CONVERSIONS and f.all_input_nodes:
            src = f.all_input_nodes[0].name
            same[f.name] = same.get(src, src)
    finer = [n for n in gm.graph.nodes if n.op == "call_function" and n.name not in same]

    def reads(f) -> list[str]:
        return sorted(same.get(m.name, m.name) for m in f.all_input_nodes)

    def sources(node):
        """The finer names its non-constant inputs stand for, or None if one is not known yet."""
        out = []
        for x in node.input:
            if x in anchors_fx:
                if anchors_fx[x] not in by_arg:
                    return None
                out.append(by_arg[anchors_fx[x]])
            elif x in paired:
                out.append(paired[x])
            elif x in producers:
                return None  # computed by a node not paired (yet)
        return sorted(out)

    producers = {o for n in group_nodes if n.op_type != "Constant" for o in n.output}
    changed = True
    while changed:
        changed = False
        for same_kind in (True, False):
            for node in group_nodes:
                if not node.output or node.output[0] in paired or node.op_type == "Constant":
                    continue
                wanted = sources(node)
                if wanted is None:
                    continue
                kinds = _KINDS.get(node.op_type, set())
                fits = [f for f in finer if f.name not in used and reads(f) == wanted
                        and (not same_kind or _op_name(f) in kinds)]
                if len(fits) == 1 or (same_kind and fits):
                    paired[node.output[0]] = fits[0].name
                    used.add(fits[0].name)
                    changed = True
            if changed:
                break
    return paired


def refine(prepared, value: str, fx_name: str, values: dict, atol: float, rtol: float):
    """``(node, its ONNX value, its max |diff| from the finer reference, the finer op)`` for the first
    ONNX node inside ``value``'s group whose value differs from torch's decomposition while its paired
    inputs agree; None when nothing can be said. ``values``: torch values by FX name (the FX node's
    arguments and the group's anchors' twins)."""
    g = prepared.group(value)
    if g is None or fx_name not in prepared.fx_position:
        return None
    index = prepared.index
    node = prepared.fx_nodes[prepared.fx_position[fx_name]]
    ref = _reference_program(node, values)
    if ref is None:
        return None
    gm, placeholder_fx, tensors = ref
    group_nodes = [index.nodes[i] for i in g.nodes]
    twins = prepared.alignment.onnx_to_fx
    anchors_fx = {a: twins[a] for a in g.anchors if a in twins}
    paired = _pair(group_nodes, anchors_fx, gm, placeholder_fx)
    if len(paired) < 2:  # nothing to tell apart
        return None
    finer = _run(gm, tensors)
    exact = _run(gm, [upcast(t) for t in tensors])  # the same decomposition in float64
    onnx_values = _run_group(prepared, g, group_nodes, values, list(paired))
    if onnx_values is None:
        return None
    constants = set(g.constants) | {o for n in group_nodes if n.op_type == "Constant" for o in n.output}
    for n in group_nodes:
        out = n.output[0] if n.output else None
        if out not in paired or out not in onnx_values:
            continue
        if any(x and x not in constants and x not in anchors_fx and x not in paired for x in n.input):
            return None  # an input computed by a node nothing pairs: the difference may start there
        expected, reference = finer[paired[out]], exact.get(paired[out])
        got = onnx_values[out]
        if not isinstance(expected, torch.Tensor) or not isinstance(reference, torch.Tensor) or \
                expected.numel() != got.size:
            continue
        e = expected.detach().cpu().double().numpy().reshape(got.shape)
        diff = np.abs(got.astype(np.float64) - e)
        if np.isfinite(diff).all() and (diff <= atol + rtol * np.abs(e)).all():
            continue
        # beyond tolerance: rounding (as close to the float64 decomposition as torch's), or not
        # (rounding of the coarser of the two types: a float16 ONNX value against a float32 torch one)
        coarse = max(epsilon(expected), epsilon(got))
        if judge(expected.reshape(got.shape), got, reference.reshape(got.shape), coarse, largest(expected)).noise:
            continue
        # its inputs: anchors (torch values) or paired values that agree (checked before, in order)
        return n, out, float(np.nanmax(diff)), paired[out]
    return None


def _run_group(prepared, g, group_nodes, values: dict, wanted: list[str]) -> dict | None:
    """The group's ONNX values ``wanted`` on torch's anchor values (onnxruntime, optimizations off)."""
    import onnxruntime as ort

    from sbs_widget.blame.inside import elem_type

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


def refine_culprits(found: list, prepared, inputs, kwargs, atol: float, rtol: float, top: int = 3) -> list:
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
        names |= {a.name for a in node.args if isinstance(a, torch.fx.Node)}
        names |= {twins[a] for a in g.anchors if a in twins}
    if not names:
        return found
    try:
        values = torch_values(prepared, inputs, kwargs, names)
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
        node, value, diff, finer_op = hit
        if node.name == c.onnx_node:
            continue
        reason = (f"{node.op_type} {node.name!r}, inside the translation of {c.ep_name!r}: on torch inputs it is "
                  f"{diff:.2g} from torch's own decomposition of {c.ep_target or c.ep_name} (its {finer_op!r}) while "
                  f"its inputs agree; the compared {c.onnx_op_type} {c.onnx_node!r} only carries the difference")
        out[k] = dataclasses.replace(c, onnx_node=node.name, onnx_name=value, onnx_op_type=node.op_type,
                                     reason=reason)
    return out
