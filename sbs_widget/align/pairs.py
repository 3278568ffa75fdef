"""Which ONNX value is the twin of which FX value.

The FX side is the *decomposed* program (what the exporter translated). Pairs come from, in order of
trust:
1. ``name``: the ONNX value has the FX node's name and its producer's ``pkg.torch.onnx.fx_node``
   metadata names that FX node (or it is an initializer folded from it);
2. ``metadata``: the ONNX nodes translating the FX node (same ``fx_node`` metadata) end in one value
   of the FX node's shape and dtype (the value was renamed by the optimizer);
3. ``folded``: a constant-folded initializer whose ``folded_from`` names the FX node's inputs and whose
   shape and dtype match (e.g. a transposed weight);
4. ``consumer``: the only unaligned input of the ONNX nodes translating the FX node's consumers that has
   its shape and dtype (CSE-merged or renamed values);
5. ``twinless.py``: the values left without a twin of their own are compared as aliases (no-ops,
   reshapes, duplicates, merged constants) or explained (constant-folded, fused, empty); ``absorbed``
   (a fused node took in the end of the value's computation) is found here.
Every candidate must agree in dtype and shape with the FX node's ``meta["val"]``: a name alone is never
trusted: names collide across programs (the optimizer renames values, so a name can denote an unrelated
value on the other side).
Inputs and outputs map by position; weights by state-dict key / ``original_node_name``.
"""

from __future__ import annotations

import operator

import torch

from sbs_widget.align.alignment import Alignment, FxNodeInfo, Twin, target_name
from sbs_widget.align.fx_graph import numel_hint, program_outputs
from sbs_widget.align.initializers import is_literal_of, read_transposed
from sbs_widget.align.twinless import (
    alias_no_ops,
    alias_reshape_inputs,
    explain_values_without_twin,
    pair_duplicates,
    pair_shared_constants,
)
from sbs_widget.align.weight_pairs import pair_weights
from sbs_widget.dtypes import (
    TORCH_TO_ONNX,
)
from sbs_widget.load.onnx_index import OnnxIndex, ValueType
from sbs_widget.strings import shape_type


def fx_shape_type(val) -> str:
    """Compact description of an FX ``meta['val']`` in the same style as ``ValueType.describe``; a
    dtype ONNX has no type for is written as type 0 (UNDEFINED)."""
    if isinstance(val, torch.Tensor):
        return shape_type(TORCH_TO_ONNX.get(val.dtype, 0), val.shape)
    if isinstance(val, (tuple, list)):
        return "(" + ",".join(fx_shape_type(v) for v in val) + ")"
    if val is None:
        return "None"
    return type(val).__name__


def is_scalar(val) -> bool:
    return isinstance(val, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))


def _shape_matches(val, vt: ValueType | None) -> bool:
    if vt is None or not vt.elem_type:
        return False
    if isinstance(val, torch.Tensor):
        if TORCH_TO_ONNX.get(val.dtype, 0) != vt.elem_type:
            return False
        if vt.shape is None:
            return True
        fx_shape = tuple(val.shape)
    elif is_scalar(val):  # shape arithmetic (sym_size...) is a 0-d or [1] tensor in ONNX
        return vt.shape is None or tuple(vt.shape) in ((), (1,))
    else:
        return False
    if len(fx_shape) != len(vt.shape):
        # torch 0-d vs ONNX [1]
        return (len(fx_shape) == 0 and tuple(vt.shape) in ((1,), ())) or (len(vt.shape) == 0 and fx_shape == (1,))
    for a, b in zip(fx_shape, vt.shape):
        if isinstance(b, int) and b > 0 and isinstance(a, int) and a != b:
            return False
        if isinstance(a, torch.SymInt) and isinstance(b, int) and b > 0:
            hint = a.node.hint if hasattr(a, "node") else None
            if hint is not None and hint != b:
                return False
    return True


class _ShapeMatcher:
    """``_shape_matches`` remembered per (FX shape text, ONNX type): a model repeats a few shapes,
    and the text (worked out once per node) hashes faster than a fake tensor's sizes."""

    def __init__(self):
        self._known: dict = {}

    def __call__(self, val, vt: ValueType | None, text: str) -> bool:
        if vt is None or not isinstance(val, torch.Tensor):
            return _shape_matches(val, vt)
        key = (text, id(vt))  # ValueTypes are shared and outlive the matcher
        hit = self._known.get(key)
        if hit is None:
            hit = self._known[key] = _shape_matches(val, vt)
        return hit


def _module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    return next(reversed(stack.values()))[0]


_STACK_LINES: dict[str, str] = {}  # trace -> its last frame: layers repeat the same traces


def _stack_line(node: torch.fx.Node) -> str:
    trace = node.meta.get("stack_trace")
    if not trace:
        return ""
    line = _STACK_LINES.get(trace)
    if line is None:
        if len(_STACK_LINES) > 50_000:
            _STACK_LINES.clear()
        line = _STACK_LINES[trace] = _last_frame(trace)
    return line


def _last_frame(trace: str) -> str:
    # only the tail matters: traces are long
    lines = [ln.strip() for ln in trace.rstrip().rsplit("\n", 3)[-3:] if ln.strip()]
    # "File ..., line N, in f" followed by the code line: keep both, compactly.
    if len(lines) >= 2 and lines[-2].startswith("File"):
        return f"{lines[-2]}: {lines[-1]}"
    return lines[-1] if lines else ""


def _origin(node: torch.fx.Node, user_graph_id: int | None) -> str | None:
    sources = node.meta.get("from_node")
    src = None
    while sources:
        src = sources[0]
        if user_graph_id is not None and getattr(src, "graph_id", None) == user_graph_id:
            return src.name
        sources = src.from_node
    last = src.name if src is not None else None  # (a property: read once, for the root only)
    return last if user_graph_id is None else (last or node.name)


def _tensor_description(val: torch.Tensor, cache: dict, dtypes: set) -> tuple[str, int, int]:
    """(shape text, elements, bytes) of an example tensor, worked out once per (dtype, shape): a
    program has few distinct ones, and reading a fake tensor's sizes costs more than a lookup. Its
    dtype goes into ``dtypes``."""
    key = (val.dtype, val.shape)
    try:
        known = cache.get(key)
    except TypeError:  # symbolic dimensions do not hash
        dtypes.add(val.dtype)
        elements = numel_hint(val)
        return fx_shape_type(val), elements, elements * val.element_size()
    if known is None:
        dtypes.add(val.dtype)
        elements = numel_hint(val)
        known = cache[key] = (fx_shape_type(val), elements, elements * val.element_size())
    return known


def describe_fx_nodes(program: torch.export.ExportedProgram, user_graph_id: int | None,
                      dtypes: set | None = None) -> list[FxNodeInfo]:
    """What the engine keeps of each FX node; the dtypes of its tensor values go into ``dtypes``."""
    infos = []
    tensors: dict = {}  # (dtype, shape) -> (text, elements, bytes)
    dtypes = set() if dtypes is None else dtypes
    for i, node in enumerate(program.graph.nodes):
        val = node.meta.get("val")
        call = node.op == "call_function"
        info = FxNodeInfo(i, node.name, node.op, target_name(node.target) if call else node.op,  # (positional:
                          _module_path(node), _stack_line(node),  # twice as fast, once per node)
                          _origin(node, user_graph_id) if call else None)
        if isinstance(val, torch.Tensor):
            info.shape_type, info.elements, info.nbytes = _tensor_description(val, tensors, dtypes)
            info.is_tensor = True
        else:
            info.shape_type = fx_shape_type(val)
            info.is_tensor = is_scalar(val)
            if isinstance(val, (tuple, list)):  # multi-output nodes
                for v in val:
                    if isinstance(v, torch.Tensor):
                        _, elements, nbytes = _tensor_description(v, tensors, dtypes)
                        info.elements += elements
                        info.nbytes += nbytes
        infos.append(info)
    return infos


def _group_ends(index: OnnxIndex, al: Alignment, group: list[int], matches) -> list[str]:
    """The values a group of ONNX nodes hands to the rest of the graph (or outputs), not paired yet,
    whose type ``matches``, in node order."""
    members = set(group)
    ends = []
    for i in group:
        for o in index.node_outputs[i]:
            if not o or o in al.onnx_to_fx:
                continue
            used_outside = any(c not in members for c in index.consumers.get(o, [])) or o in index.outputs
            if used_outside and matches(o):
                ends.append(o)
    return ends


FUSED_REACH = 64  # FX nodes searched upstream of a fused node's last one: a fusion covers a few ops


def _upstream_of(node: torch.fx.Node, later: torch.fx.Node | None) -> bool:
    """Whether ``node`` feeds ``later`` within ``FUSED_REACH`` FX nodes."""
    return later is not None and _taken_in(node, later, ())


def _taken_in(source: torch.fx.Node, node: torch.fx.Node, paired) -> bool:
    """Whether ``node`` is computed from ``source`` through FX nodes not in ``paired`` (those without
    an ONNX twin), within ``FUSED_REACH``: the steps a translation of ``source`` may have taken in (a
    getitem of an LSTM, the reshapes after a fused MatMul), so that a value it hands out may be
    ``node``'s."""
    seen, todo = {node}, [node]
    while todo and len(seen) <= FUSED_REACH:
        for x in todo.pop().all_input_nodes:
            if x is source:
                return True
            if x not in seen and x.name not in paired:
                seen.add(x)
                todo.append(x)
    return False


def _absorbed(index: OnnxIndex, value: str, fx_name: str) -> bool:
    """Whether ``value`` (an end of ``fx_name``'s ONNX nodes, not named after it) is read only by
    fused nodes translating other FX nodes: then the fusion may have taken in the rest of
    ``fx_name``'s computation (MatMul + Add + Gelu -> MatMul + BiasGelu leaves the MatMul without
    its bias), and ``value`` is not its twin."""
    readers = index.consumers.get(value, [])
    return bool(readers) and value not in index.outputs and \
        all(index.is_rewritten(i) and index.node_fx[i] != fx_name for i in readers)


def align(program: torch.export.ExportedProgram, index: OnnxIndex, user_graph_id: int | None = None) -> Alignment:
    """Pair the FX values of ``program`` with the ONNX values of ``index``, step by step (see the
    module's docstring): inputs, weights, outputs, values by name and metadata, values whose
    producer vanished, then the values left without a twin of their own (``twinless.py``)."""
    nodes = list(program.graph.nodes)
    dtypes: set = set()
    al = Alignment(fx_nodes=describe_fx_nodes(program, user_graph_id, dtypes))
    al.fx_dtypes = frozenset(dtypes)
    shape_matches = _ShapeMatcher()
    # ONNX nodes grouped by the FX node they translate.
    for i, fx in enumerate(index.node_fx):
        if fx is not None:
            al.fx_group.setdefault(fx, []).append(i)
    by_name = {n.name: n for n in nodes}
    _pair_inputs(program, nodes, index, al)
    pair_weights(program, index, al, by_name)
    _pair_outputs(program, index, al)
    _pair_intermediates(nodes, index, al, by_name, shape_matches)
    _pair_through_consumers(nodes, index, al, by_name, shape_matches)
    pair_shared_constants(nodes, al, index, shape_matches, by_name)
    # 5. no-op nodes the optimizer removed: same value as their input's twin. Reshapes after the
    # duplicates, so that a value with a twin of its own shape keeps it.
    alias_no_ops(nodes, al, index, reshapes=False)
    pair_duplicates(nodes, al, index)
    alias_no_ops(nodes, al, index, reshapes=True)
    alias_reshape_inputs(nodes, al, index)
    explain_values_without_twin(nodes, al, index)
    return al


def _take(al: Alignment, fx_name: str, value: str, how: str, kind: str = "node") -> None:
    al.pairs[fx_name] = Twin(fx_name, value, how, kind)
    al.onnx_to_fx[value] = fx_name


def _pair_inputs(program: torch.export.ExportedProgram, nodes: list, index: OnnxIndex, al: Alignment) -> None:
    """Inputs, by position of the flattened (args, kwargs)."""
    order = list(program.graph_signature.user_inputs)
    user_inputs = [n for n in nodes if n.op == "placeholder" and n.name in order]
    user_inputs.sort(key=lambda n: order.index(n.name))
    # Constant (non-tensor) inputs such as use_cache=False are baked into the ONNX graph.
    user_inputs = [n for n in user_inputs
                   if isinstance(n.meta.get("val"), torch.Tensor) or is_scalar(n.meta.get("val"))]
    al.tensor_inputs = [n.name for n in user_inputs]
    for fx_node, onnx_name in zip(user_inputs, index.inputs):
        al.input_pairs.append((fx_node.name, onnx_name))
        if isinstance(fx_node.meta.get("val"), torch.Tensor):
            _take(al, fx_node.name, onnx_name, "input", "input")


def _pair_outputs(program: torch.export.ExportedProgram, index: OnnxIndex, al: Alignment) -> None:
    """Outputs, by position of the flattened outputs."""
    flat_out = program_outputs(program)
    for pos, onnx_name in enumerate(index.outputs):
        fx_val = flat_out[pos] if pos < len(flat_out) else None
        fx_name = fx_val.name if isinstance(fx_val, torch.fx.Node) else None
        al.output_pairs.append((fx_name, onnx_name))


def _pair_intermediates(nodes: list, index: OnnxIndex, al: Alignment, by_name: dict, shape_matches) -> None:
    """Intermediate values: 1. by name, checked by provenance and type; 2. the value ending the group
    of ONNX nodes translating the FX node (its metadata); 2b. an item of a tuple-valued node."""
    produced = index.producer
    for node, info in zip(nodes, al.fx_nodes):
        if node.op != "call_function" or node.name in al.pairs:
            continue
        val = node.meta.get("val")
        if not (isinstance(val, torch.Tensor) or is_scalar(val)):
            continue
        name = node.name

        def fits(o: str, val=val, info=info) -> bool:
            return shape_matches(val, index.types.get(o), info.shape_type)

        # 1. by name, checked by provenance and type
        if name in produced and name not in al.onnx_to_fx and fits(name):
            fx_of_producer = index.node_fx[produced[name]]
            if fx_of_producer in (name, None):
                _take(al, name, name, "name")
                continue
            if name not in al.fx_group and _upstream_of(node, by_name.get(fx_of_producer)):
                # A node fused from several (onnxruntime's fusions: skip + RMS norm...) keeps the names
                # of the values it still hands out; its metadata names the last FX node it covers.
                _take(al, name, name, "fused")
                continue
        if name in index.initializers and fits(name) and name not in al.onnx_to_fx:
            _take(al, name, name, "name")
            continue
        # 2. the value ending the group of ONNX nodes translating this FX node
        group = al.fx_group.get(name, [])
        if group:
            ends = _group_ends(index, al, group, fits)
            if ends and (ends[-1] == name or not _absorbed(index, ends[-1], name)):
                _take(al, name, ends[-1], "metadata")
                continue
            if ends:
                al.absorbed[name] = index.op_types[index.consumers[ends[-1]][0]]
        # 2b. an item of a tuple-valued node (batch norm, split, topk...): the metadata names the
        # tuple's node, so its group's ends are the items; one of them only, or the one at its position
        parent = node.args[0] if node.target is operator.getitem and len(node.args) == 2 else None
        if isinstance(parent, torch.fx.Node) and parent.name in al.fx_group and isinstance(node.args[1], int):
            group = al.fx_group[parent.name]
            ends = _group_ends(index, al, group, fits)
            last = index.node_outputs[group[-1]]
            k = node.args[1]
            if len(ends) == 1 and len(group) == 1:
                _take(al, name, ends[0], "metadata")
            elif len(ends) > 1 and len(group) == 1 and k < len(last) and last[k] in ends:
                _take(al, name, last[k], "metadata")


def _folded_elsewhere(index: OnnxIndex, al: Alignment, value: str, node: torch.fx.Node) -> bool:
    """Whether ``value`` is a constant-folded initializer computed from neither ``node`` nor its
    inputs: its ``folded_from`` metadata names the values folded into it (a weight by its ONNX name)."""
    if value not in index.initializers:
        return False
    sources = index.folded_from(value)
    if not sources:
        return False
    names = {node.name}
    for x in node.all_input_nodes:
        names.add(x.name)
        if x.name in al.pairs:
            names.add(al.pairs[x.name].onnx_value)
    return names.isdisjoint(sources)


def _pair_through_consumers(nodes: list, index: OnnxIndex, al: Alignment, by_name: dict, shape_matches) -> None:
    """3./4. values whose producer vanished: what their consumers' translations read."""
    for node, info in zip(nodes, al.fx_nodes):
        if node.op != "call_function" or node.name in al.pairs:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        candidates = _read_by_consumers(node, val, info, index, al, by_name, shape_matches)
        folded = [c for c in candidates if c in index.initializers and index.folded_from(c)]
        if len(folded) == 1:
            _take(al, node.name, folded[0], "folded")
        elif len(candidates) == 1:
            _take(al, node.name, candidates[0], "consumer")


def _read_by_consumers(node: torch.fx.Node, val, info, index: OnnxIndex, al: Alignment, by_name: dict,
                       shape_matches) -> list[str]:
    """The ONNX values ``node``'s consumers' translations read that could be its value."""
    produced = index.producer
    candidates: list[str] = []
    for user in node.users:
        for i in al.fx_group.get(user.name, []):
            if index.is_rewritten(i):
                continue  # a fused node's inputs are not its FX node's (a bias may have moved in)
            for x in index.node_inputs[i]:
                if x in al.onnx_to_fx or x in candidates:
                    continue
                producer = produced.get(x)
                if producer is not None and index.node_fx[producer] == user.name:
                    continue  # internal to the consumer's own translation
                source = by_name.get(index.node_fx[producer]) if producer is not None else None
                if source is not None and source is not node and not _taken_in(source, node, al.pairs):
                    continue  # computed for another FX node's translation (a mask layers share)
                if x in by_name and x != node.name:
                    continue  # named after another FX node: that node's value, not this one's
                if _folded_elsewhere(index, al, x, node):
                    continue  # a constant folded from other values (a mask of the same shape)
                if is_literal_of(x, user, index):
                    continue  # the translation of the consumer's own literal (where(m, x, -3.4e38))
                if read_transposed(x, node, user, i, index):
                    continue  # a linear's weight folded transposed: its layout, not its value
                if shape_matches(val, index.types.get(x), info.shape_type):
                    candidates.append(x)
    return candidates
