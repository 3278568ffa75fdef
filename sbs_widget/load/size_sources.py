"""Which input a decomposed program reads each dynamic size from, as the exporter's program did.

A dynamic size shared by several inputs (a batch of ``input_ids``, ``attention_mask`` and each KV-cache
tensor) is one symbol; the decomposed program reads it once, with a ``sym_size.int`` node on one of
those inputs. Which one is not written in a ``.pt2``: decomposing the program ``torch.export.export``
returned, torch reads it from the input that first held the symbol (the others held symbols since
replaced by it, a state the ShapeEnv keeps in memory only); decomposing the same program loaded from
its file, from the first input that has it. The graphs then differ in those nodes only: other inputs,
other names (``sym_size_int_20`` reading ``input_ids`` where the exporter's ``sym_size_int_26`` reads
``cache_1``), and every node using them prints other input names.

The ONNX model's metadata names the exporter's nodes with their inputs: ``follow_exporter_sizes``
makes the decomposed program read each size where the exporter's did, under the exporter's name.
Sizes of one symbol are equal on every valid input (the program's input checks), so the values are
the same; only where they are read from, and the names, change.
"""

from __future__ import annotations

import re

import torch

from sbs_widget.load.onnx_index import OnnxIndex

_SIZE_TARGET = "aten.sym_size.int"
# how ``format_node`` prints a size node's call: ``(args = (%cache_1, 0), kwargs = {})``
_SIZE_ARGS = re.compile(r"\(args = \(%([A-Za-z_][A-Za-z0-9_]*), (\d+)\), kwargs = \{\}\)")


def _symbol(node: torch.fx.Node):
    val = node.meta.get("val")
    return val.node.expr if isinstance(val, torch.SymInt) else None


def _input_size_symbol(node: torch.fx.Node | None, dim: int):
    val = node.meta.get("val") if node is not None else None
    if not isinstance(val, torch.Tensor) or not 0 <= dim < val.dim():
        return None
    size = val.shape[dim]
    return size.node.expr if isinstance(size, torch.SymInt) else None


def exporter_size_nodes(index: OnnxIndex) -> dict[str, tuple[str, int]]:
    """The exporter's size nodes, as the ONNX metadata prints them: name -> (input read, dimension)."""
    out = {}
    for i, name in enumerate(index.node_fx):
        if name and (index.node_fx_target[i] or "").removeprefix("torch.ops.") == _SIZE_TARGET:
            m = _SIZE_ARGS.search(index.node_meta(i, "pkg.torch.onnx.fx_node") or "")
            if m:
                out[name] = (m.group(1), int(m.group(2)))
    return out


def follow_exporter_sizes(program: torch.export.ExportedProgram, index: OnnxIndex) -> int:
    """Make ``program``'s size nodes read the inputs the exporter's did (see the module's docstring),
    under the exporter's names; the number of nodes changed. A size node is changed only where the
    exporter's reads an input of ``program`` whose size there is the same symbol, and no other node
    of ``program`` already has the exporter's name."""
    graph = program.graph
    nodes = {n.name: n for n in graph.nodes}
    inputs = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    ours = {}  # symbol -> our size node reading it
    for n in graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.aten.sym_size.int and _symbol(n) is not None:
            ours.setdefault(_symbol(n), n)
    moves = []  # (our node, exporter's name, input node, dim)
    for name, (read, dim) in exporter_size_nodes(index).items():
        symbol = _input_size_symbol(inputs.get(read), dim)
        node = ours.get(symbol) if symbol is not None else None
        if node is None or (node.name == name and node.args[0] is inputs[read] and node.args[1] == dim):
            continue
        if name in nodes and nodes[name] is not node and nodes[name] not in ours.values():
            continue  # the name is another node's: leave both
        moves.append((node, name, inputs[read], dim))
    if not moves:
        return 0
    for node, _, source, dim in moves:
        node.args = (source, dim)
    for node, _, _, _ in moves:  # through free names first: the exporter's may be one of ours (a swap)
        node._rename(f"{node.name}_sbs_size")
    for node, name, _, _ in moves:
        node._rename(name)
    program.graph_module.recompile()
    return sum(node.name == name for node, name, _, _ in moves)
