"""The user's program, node by node: where each value-producing node of the program the user wrote
(the ``torch.export`` result; the decomposed one when the user handed over an ``ONNXProgram``) is
compared, or why it is not.

The exporter translates the decomposed program: a user node is compared through the decomposed node
that holds its value (the last one coming from it: ``meta["from_node"]``). Decomposition drops some
user nodes: no-ops (``to`` the same dtype, ``contiguous``, ``alias``) whose value is their input's,
values computed from constants only (``arange`` chains, folded into constants), and nodes no output
depends on. Those get a one-sided record saying which, so that a user looking for a node finds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from sbs_widget.align.fx_graph import dead_nodes
from sbs_widget.align.pairs import is_scalar

if TYPE_CHECKING:
    from sbs_widget.align.pair import Pair


def value_producing(node: torch.fx.Node) -> bool:
    """A call_function node whose value is a tensor or a number (not an assertion, not a tuple)."""
    val = node.meta.get("val")
    return node.op == "call_function" and (isinstance(val, torch.Tensor) or is_scalar(val))


def value_holder(prepared: Pair):
    """Function: user program node -> the decomposed node (or placeholder) holding its value, or None
    when decomposition left none; the identity when the user handed over the decomposed program."""
    if prepared.user_ep is None:
        return lambda name: name
    representative: dict[str, str] = {}
    for info in prepared.alignment.fx_nodes:
        if info.op == "call_function" and info.is_tensor and info.origin is not None:
            representative[info.origin] = info.name  # the last one wins: it holds the value
    user_nodes = {n.name: n for n in prepared.user_ep.graph.nodes}
    placeholders = {n.name for n in prepared.user_ep.graph.nodes if n.op == "placeholder"}

    def holder(name: str, depth: int = 0) -> str | None:
        """Decomposition drops no-op nodes (``to`` the same dtype, ``alias``...): their value is
        their input's."""
        if name in representative or depth > 50:
            return representative.get(name)
        if name in placeholders:
            return name
        node = user_nodes.get(name)
        if node is None or not node.args or not isinstance(node.args[0], torch.fx.Node):
            return None
        return holder(node.args[0].name, depth + 1)

    return holder


def user_names_held(prepared: Pair) -> dict[str, list[str]]:
    """Decomposed node (or placeholder) -> the user's nodes whose value it holds, when their names
    differ (``reshape`` held by ``view_3``, a no-op ``to`` by its input): the graph shows them."""
    if getattr(prepared, "user_ep", None) is None:  # (also a bare (decomposed_ep, onnx_model) holder)
        return {}
    holder = value_holder(prepared)
    out: dict[str, list[str]] = {}
    for node in prepared.user_ep.graph.nodes:
        if value_producing(node):
            held_by = holder(node.name)
            if held_by is not None and held_by != node.name:
                out.setdefault(held_by, []).append(node.name)
    return out


@dataclass(frozen=True)
class Unrecorded:
    """A value-producing user node no record names (by ``ep_name`` or ``ep_origin``), and why."""

    name: str
    target: str
    module: str
    reason: str


def unrecorded_nodes(prepared: Pair, recorded: set[str]) -> list[Unrecorded]:
    """The value-producing nodes of the user's program that no record of a run names (``recorded``:
    the ``ep_name`` and ``ep_origin`` of its records), each with the reason it has no pair."""
    program = prepared.user_ep if prepared.user_ep is not None else prepared.decomposed_ep
    dead = dead_nodes(program.graph)
    holder = value_holder(prepared)
    from_inputs = _reading_inputs(program)
    out = []
    for node in program.graph.nodes:
        if not value_producing(node) or node.name in recorded:
            continue
        held_by = holder(node.name)
        if node.name in dead:
            reason = "no output depends on it: the exporter writes no ONNX node for it"
        elif held_by is not None and held_by != node.name:
            reason = (f"a no-op the exporter's decomposition removed: its value is {held_by!r}'s"
                      + (", compared there" if held_by in recorded else ""))
        elif node.name not in from_inputs:
            reason = "computed from constants only (no input or weight): folded by the exporter, nothing to compare"
        else:
            reason = "removed by the exporter's decomposition: no node of the program it translated holds its value"
        stack = node.meta.get("nn_module_stack") or {}
        module = next(reversed(stack.values()))[0] if stack else ""
        out.append(Unrecorded(node.name, str(node.target), module if isinstance(module, str) else "", reason))
    return out


def _reading_inputs(program: torch.export.ExportedProgram) -> set[str]:
    """Names of the nodes that depend on a placeholder (an input, a weight, a buffer)."""
    reached: set[str] = set()
    for node in program.graph.nodes:
        if node.op == "placeholder" or any(m.name in reached for m in node.all_input_nodes):
            reached.add(node.name)
    return reached
