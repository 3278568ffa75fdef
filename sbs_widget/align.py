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
5. aliases: a no-op the optimizer removed holds its input's twin; a duplicate (same op on the same
   inputs as an earlier node, merged by the optimizer's common subexpression elimination) holds the
   earlier node's twin.
FX values left without a twin are explained: constant-folded, absorbed, fused into the rewritten
translation of a consumer (``fused_into``), or empty.
Every candidate must agree in dtype and shape with the FX node's ``meta["val"]``: a name alone is never
trusted (names collide across programs, see the field notes).
Inputs and outputs map by position; weights by state-dict key / ``original_node_name``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch

from .fx_runner import numel_hint, program_outputs
from .onnx_index import OnnxIndex, ValueType
from .strings import TORCH_TO_ONNX


def onnx_elem_type(dtype: torch.dtype) -> int:
    """``strings.onnx_elem_type``, 0 for a dtype ONNX has no type for."""
    return TORCH_TO_ONNX.get(dtype, 0)


def fx_shape_type(val) -> str:
    """Compact description of an FX ``meta['val']`` in the same style as ``ValueType.describe``."""
    if isinstance(val, torch.Tensor):
        dims = "x".join(str(d) for d in val.shape)
        return f"T{onnx_elem_type(val.dtype)}s{dims}"
    if isinstance(val, (tuple, list)):
        return "(" + ",".join(fx_shape_type(v) for v in val) + ")"
    if val is None:
        return "None"
    return type(val).__name__


@dataclass(slots=True)  # one per FX node
class FxNodeInfo:
    index: int
    name: str
    op: str
    target: str
    module: str = ""
    stack_line: str = ""
    origin: str | None = None
    shape_type: str = ""
    is_tensor: bool = False
    elements: int = 0  # of the example outputs (symbolic dimensions at their example value)
    nbytes: int = 0


@dataclass(slots=True)  # one per paired FX node
class Pair:
    fx_name: str
    onnx_value: str
    how: str          # name | metadata | folded | consumer | input | output | weight
    kind: str = "node"


@dataclass(slots=True)  # one per weight
class WeightPair:
    placeholder: str        # FX placeholder name (p_*, b_*, c_*)
    key: str                # state-dict key / constant name
    onnx_name: str | None   # ONNX initializer
    comparable: bool
    comment: str = ""


@dataclass
class Alignment:
    fx_nodes: list[FxNodeInfo]
    pairs: dict[str, Pair] = field(default_factory=dict)       # FX node name -> pair
    onnx_to_fx: dict[str, str] = field(default_factory=dict)   # ONNX value -> FX node name
    weights: list[WeightPair] = field(default_factory=list)
    input_pairs: list[tuple[str, str]] = field(default_factory=list)   # (FX placeholder, ONNX input)
    output_pairs: list[tuple[str | None, str]] = field(default_factory=list)  # (FX value or None, ONNX output)
    tensor_inputs: list[str] = field(default_factory=list)  # user-input placeholders the ONNX model has
    fx_group: dict[str, list[int]] = field(default_factory=dict)  # FX node -> ONNX node indices
    aliases: dict[str, list[str]] = field(default_factory=dict)   # ONNX value -> more FX nodes equal to it
    alias_of: dict[str, str] = field(default_factory=dict)        # FX node -> ONNX value it equals
    absorbed: dict[str, str] = field(default_factory=dict)  # FX node -> op of the fused node that took its end
    duplicate_of: dict[str, str] = field(default_factory=dict)  # FX node -> earlier FX node computing the same
    # (only for FX nodes without a twin of their own)
    fused_into: dict[str, str] = field(default_factory=dict)  # FX node without twin -> the fused ONNX node, in words
    empty: set = field(default_factory=set)  # FX values of 0 elements without twin (the optimizer drops them)
    shares_constant_of: dict[str, str] = field(default_factory=dict)  # FX node -> FX node whose equal
    # constant the optimizer kept for both (its twin is that node's folded initializer)
    reshaped: set = field(default_factory=set)  # aliases equal to their ONNX value once reshaped to its shape
    of_input: dict[str, str] = field(default_factory=dict)  # FX no-op on a user input without twin -> ONNX
    # input (the optimizer removed it: the ONNX nodes read the input itself, nothing to compare)
    folded_for: dict[str, str] = field(default_factory=dict)  # FX node without twin -> the constant-folded
    # FX node its value only feeds (their computation became one initializer)
    fx_dtypes: frozenset = frozenset()  # dtypes of the program's tensor values (its precision)


# Ops whose output equals their input when shape and dtype are unchanged: the ONNX optimizer removes
# them, and the value they hold is their input's ONNX twin.
_VALUE_PRESERVING = {
    "aten.clone.default", "aten.alias.default", "aten.detach.default", "aten._to_copy.default",
    "aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.expand.default",
    "aten.contiguous.default", "aten.dropout.default", "aten.lift_fresh_copy.default",
    "aten.clone", "aten.copy.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.unsqueeze.default",
    # casts the exporter keeps as they are; a no-op only when dtype and shape do not change (checked)
    "aten.type_as.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device",
    "aten.detach_.default",
}

# Ops that only change the shape (same elements in the same order): the optimizer may fold them with
# a neighbour or compute the value in another shape (onnxruntime's fusions run GPT-2's Conv1D on 3-D
# values, where torch goes through 2-D ones); the value is compared reshaped.
_RESHAPING = {
    "aten.view.default", "aten.reshape.default", "aten._unsafe_view.default", "aten.squeeze.dim",
    "aten.squeeze.dims", "aten.squeeze.default", "aten.unsqueeze.default", "aten.flatten.using_ints",
}

# Arithmetic with its neutral number (x + 0, x * 1.0: RoBERTa's position offset, BART's embedding
# scale when it is 1): the optimizer removes it, the value is the other operand's.
# op -> (neutral number, whether the operands commute)
_ARITHMETIC_IDENTITY = {
    "aten.add.Tensor": (0, True), "aten.add.Scalar": (0, True), "aten.sub.Tensor": (0, False),
    "aten.sub.Scalar": (0, False), "aten.mul.Tensor": (1, True), "aten.mul.Scalar": (1, True),
    "aten.div.Tensor": (1, False), "aten.div.Scalar": (1, False),
}


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


_TARGET_NAMES: dict = {}  # op -> str(op): an op's name costs more to format than to look up


def target_name(target) -> str:
    try:
        name = _TARGET_NAMES.get(target)
    except TypeError:  # an unhashable callable
        return str(target)
    if name is None:
        name = str(target)
        if len(_TARGET_NAMES) < 100_000:
            _TARGET_NAMES[target] = name
    return name


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


def _read_for_another_node(index: OnnxIndex, name: str, placeholder: torch.fx.Node | None) -> str | None:
    """When every ONNX node reading initializer ``name`` translates an FX node other than those
    reading the weight in the program, the initializer was rewritten under the same name (BatchNorm
    folded into the convolution before it: the Conv then translates the batch norm): the reader, else
    None. Readers without metadata say nothing."""
    readers = index.consumers.get(name, [])
    if placeholder is None or not readers:
        return None
    users = {u.name for u in placeholder.users}
    fx = [index.node_fx[i] for i in readers]
    if None in fx or any(f in users for f in fx):
        return None
    return f"{index.op_types[readers[0]]} node {index.nodes[readers[0]].name!r} (translating FX node {fx[0]!r})"


def _absorbed(index: OnnxIndex, value: str, fx_name: str) -> bool:
    """Whether ``value`` (an end of ``fx_name``'s ONNX nodes, not named after it) is read only by
    fused nodes translating other FX nodes: then the fusion may have taken in the rest of
    ``fx_name``'s computation (MatMul + Add + Gelu -> MatMul + BiasGelu leaves the MatMul without
    its bias), and ``value`` is not its twin."""
    readers = index.consumers.get(value, [])
    return bool(readers) and value not in index.outputs and \
        all(index.is_rewritten(i) and index.node_fx[i] != fx_name for i in readers)


def align(program: torch.export.ExportedProgram, index: OnnxIndex, user_graph_id: int | None = None) -> Alignment:
    graph = program.graph
    nodes = list(graph.nodes)
    dtypes: set = set()
    al = Alignment(fx_nodes=describe_fx_nodes(program, user_graph_id, dtypes))
    al.fx_dtypes = frozenset(dtypes)
    shape_matches = _ShapeMatcher()

    # ONNX nodes grouped by the FX node they translate.
    for i, fx in enumerate(index.node_fx):
        if fx is not None:
            al.fx_group.setdefault(fx, []).append(i)

    def take(fx_name: str, value: str, how: str, kind: str = "node") -> None:
        al.pairs[fx_name] = Pair(fx_name, value, how, kind)
        al.onnx_to_fx[value] = fx_name

    # Inputs, by position of the flattened (args, kwargs).
    sig = program.graph_signature
    order = list(sig.user_inputs)
    user_inputs = [n for n in nodes if n.op == "placeholder" and n.name in order]
    user_inputs.sort(key=lambda n: order.index(n.name))
    # Constant (non-tensor) inputs such as use_cache=False are baked into the ONNX graph.
    user_inputs = [n for n in user_inputs if isinstance(n.meta.get("val"), torch.Tensor) or is_scalar(n.meta.get("val"))]
    al.tensor_inputs = [n.name for n in user_inputs]
    for fx_node, onnx_name in zip(user_inputs, index.inputs):
        al.input_pairs.append((fx_node.name, onnx_name))
        if isinstance(fx_node.meta.get("val"), torch.Tensor):
            take(fx_node.name, onnx_name, "input", "input")

    by_name = {n.name: n for n in nodes}
    # Weights: parameters, buffers and lifted constants become initializers named by state-dict key.
    has_origin_meta = any("pkg.torch.onnx.original_node_name" in m for m in index.value_meta.values())
    by_original = {m["pkg.torch.onnx.original_node_name"]: v for v, m in index.value_meta.items()
                   if "pkg.torch.onnx.original_node_name" in m and v in index.initializers}
    placeholder_keys = {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
                        **sig.inputs_to_lifted_tensor_constants}
    for ph, key in placeholder_keys.items():
        onnx_name = by_original.get(ph)
        if onnx_name is not None:
            al.weights.append(WeightPair(ph, key, onnx_name, True))
            take(ph, onnx_name, "weight", "weight")
        elif key in index.initializers:
            if has_origin_meta:
                # Same name, no provenance: the optimizer rewrote it (e.g. BatchNorm folded into Conv).
                al.weights.append(WeightPair(ph, key, key, False,
                                             "initializer rewritten by the ONNX optimizer (no original_node_name)"))
            elif (reader := _read_for_another_node(index, key, by_name.get(ph))) is not None:
                al.weights.append(WeightPair(ph, key, key, False,
                                             f"initializer rewritten by the ONNX optimizer: read by {reader}"))
            else:
                al.weights.append(WeightPair(ph, key, key, True))
                take(ph, key, "weight", "weight")
        else:
            folded = index.folded_into().get(key, [])
            why = (f"no initializer of its own: the ONNX optimizer folded it into {', '.join(folded[:3])} "
                   "(compared where the program transforms it)") if folded else \
                "no initializer: removed by the ONNX optimizer"
            al.weights.append(WeightPair(ph, key, None, False, why))

    # Outputs, by position of the flattened outputs.
    flat_out = program_outputs(program)
    for pos, onnx_name in enumerate(index.outputs):
        fx_val = flat_out[pos] if pos < len(flat_out) else None
        fx_name = fx_val.name if isinstance(fx_val, torch.fx.Node) else None
        al.output_pairs.append((fx_name, onnx_name))

    # Intermediate values.
    produced = index.producer
    for node, info in zip(nodes, al.fx_nodes):
        if node.op != "call_function" or node.name in al.pairs:
            continue
        val = node.meta.get("val")
        if not (isinstance(val, torch.Tensor) or is_scalar(val)):
            continue
        name = node.name
        # 1. by name, checked by provenance and type
        if name in produced and name not in al.onnx_to_fx \
                and shape_matches(val, index.types.get(name), info.shape_type):
            fx_of_producer = index.node_fx[produced[name]]
            if fx_of_producer in (name, None):
                take(name, name, "name")
                continue
            if name not in al.fx_group and _upstream_of(node, by_name.get(fx_of_producer)):
                # A node fused from several (onnxruntime's fusions: skip + RMS norm...) keeps the names
                # of the values it still hands out; its metadata names the last FX node it covers.
                take(name, name, "fused")
                continue
        if name in index.initializers and shape_matches(val, index.types.get(name), info.shape_type) \
                and name not in al.onnx_to_fx:
            take(name, name, "name")
            continue
        # 2. the value ending the group of ONNX nodes translating this FX node
        group = al.fx_group.get(name, [])
        if group:
            ends = _group_ends(index, al, group, lambda o: shape_matches(val, index.types.get(o), info.shape_type))
            if ends and (ends[-1] == name or not _absorbed(index, ends[-1], name)):
                take(name, ends[-1], "metadata")
                continue
            if ends:
                al.absorbed[name] = index.op_types[index.consumers[ends[-1]][0]]
        # 2b. an item of a tuple-valued node (batch norm, split, topk...): the metadata names the
        # tuple's node, so its group's ends are the items; one of them only, or the one at its position
        parent = node.args[0] if node.target is operator.getitem and len(node.args) == 2 else None
        if isinstance(parent, torch.fx.Node) and parent.name in al.fx_group and isinstance(node.args[1], int):
            group = al.fx_group[parent.name]
            ends = _group_ends(index, al, group, lambda o: shape_matches(val, index.types.get(o), info.shape_type))
            last = index.node_outputs[group[-1]]
            k = node.args[1]
            if len(ends) == 1 and len(group) == 1:
                take(name, ends[0], "metadata")
            elif len(ends) > 1 and len(group) == 1 and k < len(last) and last[k] in ends:
                take(name, last[k], "metadata")

    def folded_elsewhere(value: str, node: torch.fx.Node) -> bool:
        """Whether ``value`` is a constant-folded initializer computed from neither ``node`` nor its
        inputs: its ``folded_from`` metadata names the values folded into it (a weight by its ONNX
        name)."""
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

    # 3./4. values whose producer vanished: look at what their consumers read.
    for node, info in zip(nodes, al.fx_nodes):
        if node.op != "call_function" or node.name in al.pairs:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        candidates = []
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
                    if folded_elsewhere(x, node):
                        continue  # a constant folded from other values (a mask of the same shape)
                    if shape_matches(val, index.types.get(x), info.shape_type):
                        candidates.append(x)
        folded = [c for c in candidates if c in index.initializers and index.folded_from(c)]
        if len(folded) == 1:
            take(node.name, folded[0], "folded")
        elif len(candidates) == 1:
            take(node.name, candidates[0], "consumer")
    _pair_shared_constants(nodes, al, index, shape_matches, by_name)
    # 5. no-op nodes the optimizer removed: same value as their input's twin. Reshapes after the
    # duplicates, so that a value with a twin of its own shape keeps it.
    _alias_no_ops(nodes, al, index, reshapes=False)
    _pair_duplicates(nodes, al, index)
    _alias_no_ops(nodes, al, index, reshapes=True)
    _alias_reshape_inputs(nodes, al, index)
    for node in reversed(nodes):  # (a chain is walked from its end)
        pair = al.pairs.get(node.name)
        if pair is not None and pair.kind == "node" and pair.onnx_value in index.initializers:
            _mark_folded_for(node, al)
    _explain_values_without_twin(nodes, al, index)
    return al


def _alias_no_ops(nodes: list[torch.fx.Node], al: Alignment, index: OnnxIndex, reshapes: bool) -> None:
    """No-op nodes without twin hold their input's twin (a no-op on an input: the ONNX nodes read the
    input). ``reshapes``: also those changing the shape (compared reshaped), and no-ops on them."""
    for node in nodes:
        if node.op != "call_function" or node.name in al.pairs or node.name in al.alias_of:
            continue
        op = target_name(node.target)
        if op == "aten.cat.default":
            src = _only_non_empty(node)  # a concat with empty pieces (a rotary part of width 0)
        elif op in _VALUE_PRESERVING:
            src = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
        elif op in _ARITHMETIC_IDENTITY:
            src = _identity_operand(node, *_ARITHMETIC_IDENTITY[op])
        else:
            continue
        val = node.meta.get("val")
        src_val = src.meta.get("val") if src is not None else None
        if not (isinstance(val, torch.Tensor) and isinstance(src_val, torch.Tensor)) or val.dtype != src_val.dtype:
            continue
        reshaped = src.name in al.reshaped or tuple(val.shape) != tuple(src_val.shape)
        if reshaped and not (reshapes and (op in _RESHAPING or tuple(val.shape) == tuple(src_val.shape))):
            continue
        target = al.pairs[src.name].onnx_value if src.name in al.pairs else al.alias_of.get(src.name)
        if target is not None and target in index.producer:
            _alias(al, node.name, target, reshaped)
        elif src.name in al.of_input or (src.name in al.pairs and al.pairs[src.name].kind == "input"):
            al.of_input[node.name] = al.of_input.get(src.name) or al.pairs[src.name].onnx_value


def _alias_reshape_inputs(nodes: list[torch.fx.Node], al: Alignment, index: OnnxIndex) -> None:
    """The input of a reshape, when the ONNX graph has only the reshaped value (onnxruntime's fusions
    run GPT-2's Conv1D ``addmm`` on 3-D values): equal to it once reshaped. From the end, so that
    chains are followed."""
    for node in reversed(nodes):
        if node.op != "call_function" or target_name(node.target) not in _RESHAPING or not node.args:
            continue
        src, val = node.args[0], node.meta.get("val")
        if not isinstance(src, torch.fx.Node) or src.op != "call_function" or src.name in al.pairs \
                or src.name in al.alias_of or not isinstance(val, torch.Tensor) \
                or not isinstance(src.meta.get("val"), torch.Tensor) or src.meta["val"].dtype != val.dtype:
            continue
        target = al.pairs[node.name].onnx_value if node.name in al.pairs else al.alias_of.get(node.name)
        if target is not None and target in index.producer:
            _alias(al, src.name, target, True)


def _alias(al: Alignment, fx_name: str, value: str, reshaped: bool) -> None:
    al.alias_of[fx_name] = value
    al.aliases.setdefault(value, []).append(fx_name)
    if reshaped:
        al.reshaped.add(fx_name)


def _identity_operand(node: torch.fx.Node, neutral: int, commutative: bool) -> torch.fx.Node | None:
    """The operand ``node`` hands out unchanged when the other is the op's neutral number."""
    a, b = (tuple(node.args) + (None, None))[:2]
    if isinstance(a, torch.fx.Node) and _is_number(b, neutral):
        return a
    if commutative and isinstance(b, torch.fx.Node) and _is_number(a, neutral) and node.kwargs.get("alpha", 1) == 1:
        return b
    return None


def _is_number(x, value) -> bool:
    """Whether ``x`` is the number ``value``, or a node making a 0-d tensor of it (decomposition
    turns ``x + 0`` into ``x + scalar_tensor(0)``)."""
    if isinstance(x, torch.fx.Node) and x.op == "call_function" and x.target is torch.ops.aten.scalar_tensor.default:
        x = x.args[0] if x.args else None
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == value


def _pair_shared_constants(nodes: list[torch.fx.Node], al: Alignment, index: OnnxIndex, shape_matches,
                           by_name: dict[str, torch.fx.Node]) -> None:
    """A value without twin that its consumer's translation reads as a constant-folded initializer
    already paired with another FX node: the optimizer folded both constants (DeBERTa's per-layer
    attention scale) and kept one initializer for the equal results. Paired with that initializer
    (a wrong merge then shows as a mismatch).
    Only when it is the one input of its consumer without a twin, and the only such initializer."""
    for node, info in zip(nodes, al.fx_nodes):
        val = node.meta.get("val")
        if node.op != "call_function" or node.name in al.pairs or node.name in al.alias_of \
                or not isinstance(val, torch.Tensor):
            continue
        found: set[tuple[str, str]] | None = set()  # (initializer, FX node paired with it)
        for user in node.users:
            inputs = user.all_input_nodes
            if any(x is not node and x.name not in al.pairs and x.name not in al.alias_of
                   and isinstance(x.meta.get("val"), torch.Tensor) for x in inputs):
                found = None  # another input without twin could be the one read
                break
            names = {x.name for x in inputs}
            for i in al.fx_group.get(user.name, []):
                if index.is_rewritten(i):
                    continue
                for x in index.node_inputs[i]:
                    other = al.onnx_to_fx.get(x)
                    if other is None or other in names or x not in index.initializers or not index.folded_from(x):
                        continue
                    other_val = by_name[other].meta.get("val") if other in by_name else None
                    if isinstance(other_val, torch.Tensor) and other_val.dtype == val.dtype \
                            and other_val.shape == val.shape and shape_matches(val, index.types.get(x), info.shape_type):
                        found.add((x, other))
        if found is None or len(found) != 1:
            continue
        (value, other), = found
        al.pairs[node.name] = Pair(node.name, value, "shared")
        al.shares_constant_of[node.name] = other


def _mark_folded_for(node: torch.fx.Node, al: Alignment) -> None:
    """The FX nodes without twin whose value only goes into ``node`` (paired with a constant-folded
    initializer), directly or through one another: the optimizer folded them into it."""
    todo = [node]
    while todo:
        for x in todo.pop().all_input_nodes:
            if x.op != "call_function" or x.name in al.pairs or x.name in al.alias_of or x.name in al.folded_for:
                continue
            if all(u is node or al.folded_for.get(u.name) == node.name for u in x.users):
                al.folded_for[x.name] = node.name
                todo.append(x)


def _only_non_empty(cat: torch.fx.Node) -> torch.fx.Node | None:
    """The one piece of a concatenation that is not empty, if the others all are."""
    pieces = cat.args[0] if cat.args and isinstance(cat.args[0], (list, tuple)) else ()
    kept = [x for x in pieces if not (isinstance(x, torch.fx.Node) and isinstance(x.meta.get("val"), torch.Tensor)
                                      and _numel(x.meta["val"]) == 0)]
    return kept[0] if len(kept) == 1 and len(pieces) > 1 and isinstance(kept[0], torch.fx.Node) else None


def _duplicate_key(node: torch.fx.Node, canonical: dict):
    """What makes two FX nodes compute the same value: op and arguments, each input node replaced by
    its canonical node (the first computing its value). Raises TypeError when an argument cannot be
    hashed. The plain tuple is tried first: most nodes hash as they are."""
    args, kwargs = node.args, node.kwargs
    if canonical and not canonical.keys().isdisjoint(node.all_input_nodes):
        args = torch.fx.node.map_arg(args, lambda x: canonical.get(x, x))
        kwargs = torch.fx.node.map_arg(kwargs, lambda x: canonical.get(x, x))
    key = (id(node.target), args, tuple(kwargs.items()) if kwargs else ())  # (ops are singletons)
    try:
        hash(key)
    except TypeError:  # lists in the arguments (shapes, tensors to concatenate)
        key = _frozen(key)
    return key


def _frozen(x):
    if isinstance(x, (list, tuple)):
        return tuple(_frozen(y) for y in x)
    if isinstance(x, dict):
        return tuple((k, _frozen(v)) for k, v in x.items())
    hash(x)  # anything else unhashable has no key: TypeError, caught by the caller
    return x


_UNINITIALIZED = ("aten.empty", "aten.new_empty")  # two calls give two memories' garbage


def _pair_duplicates(nodes: list[torch.fx.Node], al: Alignment, index: OnnxIndex) -> None:
    """A node doing what an earlier node does (same op, same inputs) holds the same value: the
    optimizer's common subexpression elimination keeps one ONNX value for both (the rotary cos/sin
    unsqueezed once per layer in LLaMA), so the twin of the first is the twin of the others."""
    # Only ops some value without a twin has are looked at (a duplicate chain through other ops is
    # not followed): this runs on every node of the program.
    twinless = {id(n.target): n.target for n in nodes if n.op == "call_function" and n.name not in al.pairs
                and n.name not in al.alias_of}
    seeded = torch.Tag.nondeterministic_seeded  # random ops draw different numbers each time
    wanted = {k for k, target in twinless.items() if seeded not in getattr(target, "tags", ())
              and not target_name(target).startswith(_UNINITIALIZED)}
    first: dict = {}
    canonical: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in nodes:
        if node.op != "call_function" or id(node.target) not in wanted:
            continue
        try:
            key = _duplicate_key(node, canonical)
        except TypeError:
            continue
        earlier = first.setdefault(key, node)
        if earlier is node:
            continue
        canonical[node] = earlier
        name, source = node.name, earlier.name
        val, earlier_val = node.meta.get("val"), earlier.meta.get("val")
        if name in al.pairs or name in al.alias_of or not isinstance(val, torch.Tensor) \
                or not isinstance(earlier_val, torch.Tensor) or val.dtype != earlier_val.dtype \
                or val.shape != earlier_val.shape:  # mul(x, 1) and mul(x, 1.0) have equal keys
            continue
        al.duplicate_of[name] = source  # also says why a value without a twin has none
        twin = al.pairs[source].onnx_value if source in al.pairs else al.alias_of.get(source)
        if twin in index.producer:
            al.alias_of[name] = twin
            al.aliases.setdefault(twin, []).append(name)
        elif twin in index.initializers:  # a constant-folded twin: compared once the FX node has run
            al.pairs[name] = Pair(name, twin, "duplicate")


def _explain_values_without_twin(nodes: list[torch.fx.Node], al: Alignment, index: OnnxIndex) -> None:
    """FX nodes without a twin whose value flows, through nodes without twins, into the translation
    of a node a rewrite rule made (FuseBatchNormIntoConv makes one Conv of conv + batch norm,
    onnxruntime's fusions one SkipLayerNormalization of a residual add and an RMS norm): the fused node
    took their value in, so it no longer exists in the ONNX graph. Also empty values without twin (the
    optimizer drops them: nothing to compare). One pass from the end."""
    into: dict[str, str] = {}  # FX node -> the fused node its value flows into, in words
    for node in reversed(nodes):
        name = node.name
        if node.op != "call_function" or name in al.pairs or name in al.alias_of:
            continue
        for user in node.users:
            fused = next((i for i in al.fx_group.get(user.name, []) if index.is_rewritten(i)), None)
            if fused is None:  # a fused node handing out the user's value (or the value it is an alias of)
                twin = al.pairs[user.name].onnx_value if user.name in al.pairs else al.alias_of.get(user.name)
                producer = index.producer.get(twin) if twin is not None else None
                fused = producer if producer is not None and index.is_rewritten(producer) else None
            if fused is not None:
                into[name] = (f"{index.op_types[fused]} node {index.nodes[fused].name!r} "
                              f"(rule {index.rewrite_rule(fused)}, translating FX node {user.name!r})")
                break
            if user.name in into:
                into[name] = into[user.name]
                break
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        if name in into and name not in al.absorbed:
            al.fused_into[name] = into[name]
        elif _numel(val) == 0:
            al.empty.add(name)


def _numel(val: torch.Tensor) -> int | None:
    """Element count, None when symbolic (dynamic shapes: not known to be empty)."""
    n = val.numel()
    return n if isinstance(n, int) else None
