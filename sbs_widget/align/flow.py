"""Data flow inside a translation and inside its finer torch reference, and the pairing between them.

Both sides are read the same way:

- carriers pass a value on without computing (ONNX Reshape, Transpose, Expand, Squeeze, Unsqueeze,
  Identity, Cast, CastLike; aten views, expand, transpose, clone, dtype conversions): a carrier stands
  for its first input and is never paired. A Cast that narrows the type (float32 -> float16) carries
  only when it returns to the translation's own output type (a float16 softmax computed in float32);
  elsewhere it is a rounding of its own (never paired: whatever reads it is not judged);
- constants depend on no value of the translation's inputs (ONNX Constant, initializers, Shape and
  what is computed from them only; aten tensor constants, factories, literals, and arguments the
  ONNX side has folded into constants);
- a non-constant node is identified by the nodes it reads: the group's anchors (the FX arguments), or
  already paired nodes; a constant node by the paired constant nodes it reads (a scale's Sqrt).

``pair`` matches ONNX nodes with finer nodes by these sources, in passes until nothing more pairs:
same op kind first (``KINDS``), then the one node reading exactly the same sources whatever its kind
(among the kinds known: a swapped op, Div where the reference multiplies).
Nothing is paired by name or by value.
"""

from __future__ import annotations

import onnx
import torch

# ONNX op -> the aten ops (overload packet names) computing the same thing
KINDS = {
    "Sigmoid": {"sigmoid"}, "Tanh": {"tanh"}, "Mul": {"mul"}, "Add": {"add"}, "Sub": {"sub", "rsub"},
    "Div": {"div"}, "Exp": {"exp"}, "Log": {"log"}, "Erf": {"erf"}, "Sqrt": {"sqrt"}, "Reciprocal": {"reciprocal"},
    "Pow": {"pow"}, "Neg": {"neg"}, "Abs": {"abs"}, "Relu": {"relu"},
    "Softmax": {"_softmax", "softmax", "_safe_softmax"}, "LogSoftmax": {"_log_softmax", "log_softmax"},
    "MatMul": {"mm", "bmm", "matmul"}, "ReduceMean": {"mean"}, "ReduceSum": {"sum"}, "Where": {"where"},
    "Cos": {"cos"}, "Sin": {"sin"}, "Rsqrt": {"rsqrt"}, "IsNaN": {"isnan"},
}
_FX_KINDS = set().union(*KINDS.values())

ONNX_CARRY = {"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Cast", "CastLike"}
_ONNX_SOURCES = {"Constant", "Shape", "Size"}  # constants whatever they read (a shape is not a value)
FX_CARRY = {"view", "reshape", "_unsafe_view", "expand", "transpose", "permute", "t", "unsqueeze", "squeeze",
            "clone", "contiguous", "alias", "_to_copy", "to", "convert_element_type", "lift_fresh_copy", "detach"}
_FX_FACTORIES = {"scalar_tensor", "full", "ones", "zeros", "empty", "arange", "full_like", "zeros_like",
                 "ones_like", "empty_like", "new_ones", "new_zeros", "new_full", "new_empty"}
_BITS = {onnx.TensorProto.DOUBLE: 52, onnx.TensorProto.FLOAT: 23, onnx.TensorProto.FLOAT16: 10,
         onnx.TensorProto.BFLOAT16: 7}


def op_name(f: torch.fx.Node) -> str:
    """The aten op of a finer node without namespace or overload (``sigmoid``)."""
    return getattr(getattr(f.target, "overloadpacket", None), "__name__", "")


class OnnxFlow:
    """The group's ONNX nodes read as carriers, constants and computing nodes."""

    def __init__(self, index, group_nodes, initializers: set, out_type: int):
        from sbs_widget.align.elem_types import elem_type

        self.nodes = [n for n in group_nodes if n.output]
        self.producer = {o: n for n in self.nodes for o in n.output if o}
        self.carry: dict[str, str] = {}   # carrier output -> its input
        self.const: set[str] = set(initializers)
        for n in self.nodes:
            out = n.output[0]
            if n.op_type in ONNX_CARRY and n.input and n.input[0]:
                if n.op_type == "Cast":
                    to = next((a.i for a in n.attribute if a.name == "to"), 0)
                    src = elem_type(index, n.input[0])
                    if _BITS.get(to, 0) < _BITS.get(src, 0) and to != out_type:
                        if self.resolve(n.input[0]) in self.const:
                            self.const.add(out)
                        continue  # a rounding of its own: neither carried nor paired
                self.carry[out] = n.input[0]
                if self.resolve(n.input[0]) in self.const:
                    self.const.add(out)
            elif n.op_type in _ONNX_SOURCES or all(
                    not x or self.resolve(x) in self.const for x in n.input):
                self.const.update(o for o in n.output if o)

    def resolve(self, x: str) -> str:
        seen = 0
        while x in self.carry and seen < 64:
            x, seen = self.carry[x], seen + 1
        return x

    def pairable(self):
        """Computing nodes of a known kind, or any computing node reading non-constants."""
        for n in self.nodes:
            out = n.output[0]
            if out in self.carry or n.op_type in _ONNX_SOURCES or n.op_type in ("Cast", "CastLike") or \
                    (out in self.const and n.op_type not in KINDS):
                continue
            yield n


class FxFlow:
    """The finer program's nodes read the same way; ``anchored``: its placeholders fed by an anchor."""

    def __init__(self, gm, anchored: set):
        self.carry: dict[str, str] = {}
        self.const: set[str] = set()
        self.nodes = []
        for f in gm.graph.nodes:
            name = op_name(f)
            if f.op == "get_attr" or (f.op == "placeholder" and f.name not in anchored):
                self.const.add(f.name)
            elif f.op != "call_function":
                continue
            elif name in FX_CARRY and f.all_input_nodes:
                self.carry[f.name] = f.all_input_nodes[0].name
                if self.resolve(f.name) in self.const:
                    self.const.add(f.name)
            elif name in _FX_FACTORIES or all(m.name in self.const for m in f.all_input_nodes):
                self.const.add(f.name)
                if name in _FX_KINDS:
                    self.nodes.append(f)
            else:
                self.nodes.append(f)

    def resolve(self, x: str) -> str:
        seen = 0
        while x in self.carry and seen < 64:
            x, seen = self.carry[x], seen + 1
        return x

    def reads(self, f) -> list[str]:
        """What a node is identified by: its non-constant inputs, or for a constant node the constant
        nodes of a known kind it reads."""
        kinded = {n.name for n in self.nodes}
        if f.name not in self.const:
            return sorted(self.resolve(m.name) for m in f.all_input_nodes if self.resolve(m.name) not in self.const)
        return sorted(r for r in (self.resolve(m.name) for m in f.all_input_nodes) if r in kinded)


def pair(onnx_flow: OnnxFlow, fx_flow: FxFlow, anchor_ph: dict) -> dict:
    """ONNX output value -> finer node name (``anchor_ph``: ONNX anchor -> finer placeholder)."""
    paired: dict[str, str] = {}
    used: set[str] = set()
    kinded = {n.output[0] for n in onnx_flow.pairable()}

    def sources(node):
        """The finer names the inputs identifying ``node`` stand for, or None if one is not known yet."""
        constant = node.output[0] in onnx_flow.const
        out = []
        for x in node.input:
            if not x:
                continue
            r = onnx_flow.resolve(x)
            if r in onnx_flow.const:
                if not constant or r not in kinded:
                    continue  # a constant read by a computing node, or a leaf of a constant one
                if r not in paired:
                    return None
                out.append(paired[r])
            elif constant:
                continue
            elif r in anchor_ph:
                out.append(anchor_ph[r])
            elif r in paired:
                out.append(paired[r])
            else:
                return None  # computed by a node not paired (yet), or unknown
        return sorted(out)

    reads = {f.name: fx_flow.reads(f) for f in fx_flow.nodes}
    todo = list(onnx_flow.pairable())
    changed = True
    while changed:
        changed = False
        for same_kind in (True, False):
            for node in todo:
                out = node.output[0]
                if out in paired:
                    continue
                wanted = sources(node)
                if wanted is None:
                    continue
                constant = out in onnx_flow.const
                kinds = KINDS.get(node.op_type, set())

                def fit(f, node_kinds=kinds, wanted=wanted, constant=constant, same_kind=same_kind):
                    # kinds may differ (what a swapped op looks like) only between ops of known kinds:
                    # a MatMul is not an addmm (its bias is added by the next node)
                    return (reads[f.name] == wanted and (f.name in fx_flow.const) == constant
                            and (op_name(f) in node_kinds if same_kind else bool(node_kinds)
                                 and op_name(f) in _FX_KINDS))

                fits = [f for f in fx_flow.nodes if f.name not in used and fit(f)]
                if same_kind and not fits:  # the same value computed twice on the ONNX side (sqrt(scale))
                    fits = [f for f in fx_flow.nodes if f.name in used and fit(f)]
                if len(fits) == 1 or (same_kind and fits):
                    paired[out] = fits[0].name
                    used.add(fits[0].name)
                    changed = True
            if changed:
                break
    return paired


def anchor_placeholders(fx_node: torch.fx.Node, anchors_fx: dict, placeholder_fx: dict) -> dict:
    """ONNX anchor -> finer placeholder. An anchor's torch twin is the FX argument itself, or the value
    the argument carries unchanged (a view, an expand, a clone of it, a concatenation with empty
    tensors: what the ONNX optimizer removes)."""
    by_arg = {fx: ph for ph, fx in placeholder_fx.items()}
    carried: dict[str, set] = {}
    for arg in fx_node.all_input_nodes:
        if arg.name not in by_arg:
            continue
        n, depth = _carried_input(arg), 1
        while n is not None and depth < 16:
            carried.setdefault(n.name, set()).add(by_arg[arg.name])
            n, depth = _carried_input(n), depth + 1
    out = {}
    for a, fx in anchors_fx.items():
        if fx in by_arg:
            out[a] = by_arg[fx]
        elif len(carried.get(fx, ())) == 1:  # carried by one argument only (q and k views of one value: neither)
            out[a] = next(iter(carried[fx]))
    return out


def _carried_input(n: torch.fx.Node):
    """The node ``n`` carries unchanged, or None."""
    if n.op != "call_function":
        return None
    name = op_name(n)
    if name in ("view", "reshape", "_unsafe_view", "expand", "clone", "contiguous", "alias", "unsqueeze", "squeeze"):
        return n.all_input_nodes[0] if n.all_input_nodes else None
    if name == "cat" and n.args and isinstance(n.args[0], (list, tuple)):
        full = [x for x in n.args[0] if isinstance(x, torch.fx.Node)
                and getattr(x.meta.get("val"), "numel", lambda: 1)() != 0]
        return full[0] if len(full) == 1 else None
    return None


def constant_refs(f, fflow, paired_fx: set) -> list:
    """The constants finer node ``f`` reads, in argument order: ``(constant node name, None)`` for a
    constant node no ONNX node is paired with, ``(argument label, value)`` for a literal scalar."""
    schema = getattr(f.target, "_schema", None)
    arguments = list(schema.arguments) if schema is not None else []
    out = []
    for i, a in enumerate(f.args):
        if isinstance(a, torch.fx.Node):
            r = fflow.resolve(a.name)
            if r in fflow.const and r not in paired_fx:
                out.append((a.name, None))
        elif isinstance(a, (int, float)) and not isinstance(a, bool) and i < len(arguments) and \
                str(arguments[i].type).split("?")[0] in ("Scalar", "Tensor"):
            out.append((f"{f.name}.{arguments[i].name}", float(a)))
    return out
