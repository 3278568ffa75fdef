"""The inputs of onnxruntime's fused attention nodes, compared in the layout the op's specification fixes.

A model rewritten for onnxruntime (``MultiHeadAttention``, ``GroupQueryAttention``, com.microsoft
domain) has its attention read query, key and value as (batch, sequence, heads x head size), where the
program holds them as (batch, heads, sequence, head size): the rewrite writes a Transpose and a Reshape
between. No FX node computes that layout and no finer reference of an FX node has it, so these values
are compared with the torch value they start from, put in the layout the specification fixes (read
from the op's documentation, not from the ONNX node's attributes: a wrong permutation differs from
it). They are paired as carriers are (``inner_pairs.pair_carriers``: kind, source and shape); the
inner plan records them like any inner value.

The rewrite also splits a packed query-key-value anew (a Split without the exporter's metadata): its
pieces are paired with those of the program's own split of the same value (same op kind, the same
number of pieces of the same shapes) and compared with torch's split of it.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sbs_widget.align.pair import Pair

FUSED_ATTENTION = {"MultiHeadAttention", "GroupQueryAttention"}
_STEPS = ("Transpose", "Reshape")  # what the rewrite writes between a torch value and the fused node


def batch_sequence_hidden(*tensors):
    """(batch, heads, sequence, size) -> (batch, sequence, heads x size), each tensor."""
    out = []
    for t in tensors:
        u = t.transpose(1, 2)
        out.append(u.reshape(u.shape[0], u.shape[1], -1))
    return tuple(out)


def _chains(p: Pair, node) -> list[tuple[str, list]]:
    """(the twinned value it starts from, the Transpose / Reshape nodes in order) per query, key and value
    input of a fused attention ``node``, where such a chain leads to a 4-d torch value."""
    index, twins = p.index, p.alignment.onnx_to_fx
    out = []
    for x in list(node.input)[:3]:
        steps = []
        while x and x not in twins and x in index.producer and len(steps) < 4:
            producer = index.nodes[index.producer[x]]
            if producer.op_type not in _STEPS or not producer.input:
                break
            steps.insert(0, producer)
            x = producer.input[0]
        fx = twins.get(x)
        val = p.fx_nodes[p.fx_position[fx]].meta.get("val") if fx in p.fx_position else None
        if steps and isinstance(val, torch.Tensor) and val.dim() == 4:
            out.append((x, steps))
    return out


@dataclass
class FusedInputs:
    """The layout references of one fused attention node's inputs, and the values they pair with."""

    key: str            # the reference program's name in the inner plan
    gm: torch.fx.GraphModule
    names: list[str]    # its nodes paired with ONNX values
    args: list[str]     # the FX values it reads
    label: str
    retrace: object     # argument values -> the program traced on them
    pairs: dict         # ONNX value -> its node
    ops: dict           # its node -> op
    fx: str = ""        # the FX node the values belong to (else the translation's, by metadata)


def fused_input_pairs(p: Pair, pair_carriers, taken: set) -> list[FusedInputs]:
    """The Transposes and Reshapes feeding each fused attention node of ``p``'s model, paired with
    ``batch_sequence_hidden`` of the torch values they start from (``pair_carriers``: the carrier pairing
    of ``inner_pairs``; ``taken``: ONNX values already paired)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from sbs_widget.align.fx_graph import example_tensor

    index, twins = p.index, p.alignment.onnx_to_fx
    out = []
    for node in index.nodes:
        if node.op_type not in FUSED_ATTENTION or node.domain != "com.microsoft":
            continue
        chains = [(x, steps) for x, steps in _chains(p, node) if not any(s.output[0] in taken for s in steps)]
        examples = [example_tensor(p.fx_nodes[p.fx_position[twins[x]]].meta["val"]) for x, _ in chains]
        if not chains or any(e is None for e in examples):
            continue
        try:
            gm = make_fx(batch_sequence_hidden)(*examples)
        except Exception:  # (a layout torch cannot trace: left one-sided)
            continue
        placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        paired: dict[str, str] = {}
        pair_carriers(index, [s for _, steps in chains for s in steps], paired,
                      {x: ph for (x, _), ph in zip(chains, placeholders)}, gm)
        if paired:
            ops = {f.name: str(f.target) for f in gm.graph.nodes}
            out.append(FusedInputs(f"onnx node {node.name}", gm, sorted(set(paired.values())),
                                   [twins[x] for x, _ in chains],
                                   f"the (batch, sequence, heads x size) layout onnxruntime's {node.op_type} reads",
                                   lambda args: make_fx(batch_sequence_hidden)(*args), paired, ops))
    return out


_SPLITS = ("split_with_sizes", "split", "chunk", "unbind", "tensor_split")


def rewritten_split_pairs(p: Pair, taken: set) -> list[FusedInputs]:
    """The pieces of each Split the rewrite wrote without metadata, paired with the program's own split
    of the same value (``taken``: ONNX values already paired)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from sbs_widget.align.fx_graph import example_tensor

    index, twins = p.index, p.alignment.onnx_to_fx
    out = []
    for node in index.nodes:
        outs = [o for o in node.output if o]
        if node.op_type != "Split" or not node.input or node.input[0] not in twins or \
                any(o in twins or o in taken for o in outs):
            continue
        x = twins[node.input[0]]
        if x not in p.fx_position:
            continue
        source = p.fx_nodes[p.fx_position[x]]
        for split in source.users:
            name = getattr(getattr(split.target, "overloadpacket", None), "__name__", "")
            pieces = sorted((u for u in split.users if u.target is operator.getitem), key=lambda u: u.args[1])
            if name not in _SPLITS or len(pieces) != len(outs) or not all(
                    _same_shape(index, o, u) for o, u in zip(outs, pieces)):
                continue
            example = example_tensor(source.meta.get("val"))
            if example is None:
                break
            call = _splitting(split)
            try:
                gm = make_fx(call)(example)
            except Exception:  # (left one-sided)
                break
            got = list(next(n for n in gm.graph.nodes if n.op == "output").args[0])  # the pieces, in order
            if len(got) != len(outs) or not all(isinstance(g, torch.fx.Node) for g in got):
                break
            pairs = {o: g.name for o, g in zip(outs, got)}
            out.append(FusedInputs(f"onnx node {node.name}", gm, sorted(pairs.values()), [x],
                                   f"torch's {name} of the same value", lambda args, call=call: make_fx(call)(*args),
                                   pairs, {g.name: f"{split.target} piece {k}" for k, g in enumerate(got)}, split.name))
            break
    return out


def _splitting(split):
    """A function of one tensor splitting it as FX node ``split`` does (its pieces as a tuple)."""
    target, rest, kwargs = split.target, split.args[1:], dict(split.kwargs)

    def call(t):
        return tuple(target(t, *rest, **kwargs))

    return call


def _same_shape(index, value: str, fx_node) -> bool:
    """Whether ONNX ``value`` has the shape of ``fx_node``'s example (unknown dimensions match)."""
    val = fx_node.meta.get("val")
    vt = index.types.get(value)
    dims = getattr(vt, "shape", None)
    if not isinstance(val, torch.Tensor):
        return False
    if dims is None:
        return True
    return len(dims) == val.dim() and all(not isinstance(d, int) or d <= 0 or d == v for d, v in zip(dims, val.shape))
