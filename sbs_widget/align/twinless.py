"""FX values without a twin of their own: what they equal, or why they have none.

Aliases (compared with another FX node's twin): a no-op the optimizer removed (a cast to the same
type, ``x + 0``, a concat whose other pieces are empty) holds its input's twin; a reshape, or the
input of one, whose value the ONNX graph has only in another shape is compared reshaped; a duplicate
(same op on the same inputs as an earlier node, merged by common subexpression elimination) holds the
earlier node's twin; a constant folded and merged with an equal one is compared with the kept
initializer. The rest are explained: constant-folded with the node they feed, fused into the
rewritten translation of a consumer (``fused_into``), or empty.
"""

from __future__ import annotations

import torch

from sbs_widget.align.alignment import Alignment, Twin, target_name
from sbs_widget.load.onnx_index import OnnxIndex

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


def alias_no_ops(nodes: list[torch.fx.Node], al: Alignment, index: OnnxIndex, reshapes: bool) -> None:
    """No-op nodes without twin hold their input's twin (a no-op on an input: the ONNX nodes read the
    input). ``reshapes``: also those changing the shape (compared reshaped), and no-ops on them."""
    for node in nodes:
        if node.op != "call_function" or al.has_twin(node.name):
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
        same_shape = tuple(val.shape) == tuple(src_val.shape)
        reshaped = src.name in al.reshaped or not same_shape
        if (not same_shape and op not in _RESHAPING) or (reshaped and not reshapes):
            continue
        target = al.twin(src.name)
        if target is not None and target in index.producer:
            _alias(al, node.name, target, reshaped)
        elif src.name in al.of_input or (src.name in al.pairs and al.pairs[src.name].kind == "input"):
            al.of_input[node.name] = al.of_input.get(src.name) or al.pairs[src.name].onnx_value


def alias_reshape_inputs(nodes: list[torch.fx.Node], al: Alignment, index: OnnxIndex) -> None:
    """The input of a reshape, when the ONNX graph has only the reshaped value (onnxruntime's fusions
    run GPT-2's Conv1D ``addmm`` on 3-D values): equal to it once reshaped. From the end, so that
    chains are followed."""
    for node in reversed(nodes):
        if node.op != "call_function" or target_name(node.target) not in _RESHAPING or not node.args:
            continue
        src, val = node.args[0], node.meta.get("val")
        if not isinstance(src, torch.fx.Node) or src.op != "call_function" or al.has_twin(src.name) \
                or not isinstance(val, torch.Tensor) \
                or not isinstance(src.meta.get("val"), torch.Tensor) or src.meta["val"].dtype != val.dtype:
            continue
        target = al.twin(node.name)
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


def pair_shared_constants(nodes: list[torch.fx.Node], al: Alignment, index: OnnxIndex, shape_matches,
                           by_name: dict[str, torch.fx.Node]) -> None:
    """A value without twin that its consumer's translation reads as a constant-folded initializer
    already paired with another FX node: the optimizer folded both constants (DeBERTa's per-layer
    attention scale) and kept one initializer for the equal results. Paired with that initializer
    (a wrong merge then shows as a mismatch).
    Only when it is the one input of its consumer without a twin, and the only such initializer."""
    for node, info in zip(nodes, al.fx_nodes):
        val = node.meta.get("val")
        if node.op != "call_function" or al.has_twin(node.name) or not isinstance(val, torch.Tensor):
            continue
        found: set[tuple[str, str]] | None = set()  # (initializer, FX node paired with it)
        for user in node.users:
            inputs = user.all_input_nodes
            if any(x is not node and not al.has_twin(x.name) and isinstance(x.meta.get("val"), torch.Tensor)
                   for x in inputs):
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
                            and other_val.shape == val.shape \
                            and shape_matches(val, index.types.get(x), info.shape_type):
                        found.add((x, other))
        if found is None or len(found) != 1:
            continue
        (value, other), = found
        al.pairs[node.name] = Twin(node.name, value, "shared")
        al.shares_constant_of[node.name] = other


def _mark_folded_for(node: torch.fx.Node, al: Alignment) -> None:
    """The FX nodes without twin whose value only goes into ``node`` (paired with a constant-folded
    initializer), directly or through one another: the optimizer folded them into it."""
    todo = [node]
    while todo:
        for x in todo.pop().all_input_nodes:
            if x.op != "call_function" or al.has_twin(x.name) or x.name in al.folded_for:
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


def pair_duplicates(nodes: list[torch.fx.Node], al: Alignment, index: OnnxIndex) -> None:
    """A node doing what an earlier node does (same op, same inputs) holds the same value: the
    optimizer's common subexpression elimination keeps one ONNX value for both (the rotary cos/sin
    unsqueezed once per layer in LLaMA), so the twin of the first is the twin of the others."""
    # Only ops some value without a twin has are looked at (a duplicate chain through other ops is
    # not followed): this runs on every node of the program.
    twinless = {id(n.target): n.target for n in nodes if n.op == "call_function" and not al.has_twin(n.name)}
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
        if al.has_twin(name) or not isinstance(val, torch.Tensor) \
                or not isinstance(earlier_val, torch.Tensor) or val.dtype != earlier_val.dtype \
                or val.shape != earlier_val.shape:  # mul(x, 1) and mul(x, 1.0) have equal keys
            continue
        al.duplicate_of[name] = source  # also says why a value without a twin has none
        twin = al.twin(source)
        if twin in index.producer:
            _alias(al, name, twin, False)
        elif twin in index.initializers:  # a constant-folded twin: compared once the FX node has run
            al.pairs[name] = Twin(name, twin, "duplicate")


def explain_values_without_twin(nodes: list[torch.fx.Node], al: Alignment, index: OnnxIndex) -> None:
    """Why the FX nodes left without a twin have none. Constant-folded: their value only goes into a
    node paired with a constant-folded initializer (``folded_for``). Fused: their value flows, through
    nodes without twins, into the translation of a node a rewrite rule made (FuseBatchNormIntoConv
    makes one Conv of conv + batch norm, onnxruntime's fusions one SkipLayerNormalization of a residual
    add and an RMS norm): the fused node took it in, so it no longer exists in the ONNX graph. Empty:
    the optimizer drops values of 0 elements (nothing to compare). Passes from the end."""
    for node in reversed(nodes):  # (a chain is walked from its end)
        pair = al.pairs.get(node.name)
        if pair is not None and pair.kind == "node" and pair.onnx_value in index.initializers:
            _mark_folded_for(node, al)
    into: dict[str, str] = {}  # FX node -> the fused node its value flows into, in words
    for node in reversed(nodes):
        name = node.name
        if node.op != "call_function" or al.has_twin(name):
            continue
        for user in node.users:
            fused = next((i for i in al.fx_group.get(user.name, []) if index.is_rewritten(i)), None)
            if fused is None:  # a fused node handing out the user's value (or the value it is an alias of)
                twin = al.twin(user.name)
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
    """Element count, None when symbolic and not known to be 0 (a static dimension of 0 makes it 0:
    Phi-3's rotary pass-through of width 0 with a dynamic batch and sequence)."""
    if any(isinstance(d, int) and d == 0 for d in val.shape):
        return 0
    n = val.numel()
    return n if isinstance(n, int) else None
