"""Reading the FX graph of an ExportedProgram without running it: which nodes are read last or by
nothing, the example tensors export recorded for a node (``meta['val']``) and their sizes, the program's
user outputs. Alignment and the engine both read the graph this way."""

from __future__ import annotations

import torch


def last_uses(graph: torch.fx.Graph) -> dict[str, int]:
    """FX node name -> index of the last node that reads it (computed once, used to free values)."""
    last: dict[str, int] = {}
    for i, n in enumerate(graph.nodes):
        for inp in n.all_input_nodes:
            last[inp.name] = i  # nodes come in order: the last assignment is the last reader
    return last


def dead_nodes(graph: torch.fx.Graph) -> set[str]:
    """Names of the nodes no output depends on: read by no node, or only by dead ones. (Walking back
    from the few dead nodes costs a fraction of walking forward from the outputs through all.)"""
    dead: set[torch.fx.Node] = set()
    for node in reversed(graph.nodes):
        if node.op != "output" and dead.issuperset(node.users):
            dead.add(node)
    return {n.name for n in dead}


def example_tensors(node: torch.fx.Node) -> list[torch.Tensor]:
    """The example tensors export recorded for a node's outputs (``meta['val']``)."""
    val = node.meta.get("val")
    return [v for v in (val if isinstance(val, (tuple, list)) else [val]) if isinstance(v, torch.Tensor)]


def example_tensor(t) -> torch.Tensor | None:
    """A real tensor like the example ``t`` (a fake tensor of export's metadata), or None."""
    if not isinstance(t, torch.Tensor):
        return None
    shape = []
    for d in t.shape:  # a symbolic dimension at its example value, read without a guard (int() would
        # specialize the program's shape environment)
        hint = d if isinstance(d, int) else getattr(getattr(d, "node", None), "hint", None)
        if hint is None:  # unbacked
            return None
        shape.append(int(hint))
    if t.dtype == torch.bool:
        return torch.ones(shape, dtype=torch.bool)
    if t.dtype.is_floating_point:
        return torch.rand(shape, dtype=t.dtype)
    return torch.zeros(shape, dtype=t.dtype)


def numel_hint(t: torch.Tensor) -> int:
    """Number of elements, symbolic dimensions counted at their example value."""
    n = t.numel()
    if type(n) is int:  # static shape
        return n
    n = 1
    for d in t.shape:
        if isinstance(d, int):
            n *= d
        else:
            hint = getattr(getattr(d, "node", None), "hint", None)
            n *= int(hint) if hint is not None else 16
    return n


def example_size(node: torch.fx.Node) -> tuple[int, int]:
    """(elements, bytes) of a node's example outputs."""
    elements = size = 0
    for t in example_tensors(node):
        n = numel_hint(t)
        elements += n
        size += n * t.element_size()
    return elements, size


def program_outputs(program: torch.export.ExportedProgram) -> list:
    """The program's user outputs, flattened, as the ONNX model's outputs come: without the None ones
    and without the new values of mutated buffers and inputs (the exporter drops both)."""
    out = next(n for n in reversed(program.graph.nodes) if n.op == "output")
    values = out.args[0]
    specs = program.graph_signature.output_specs
    if isinstance(values, (tuple, list)) and len(values) == len(specs):
        user = torch.export.graph_signature.OutputKind.USER_OUTPUT
        values = [v for v, spec in zip(values, specs) if spec.kind == user]
    return [v for v in torch.utils._pytree.tree_leaves(values) if v is not None]
