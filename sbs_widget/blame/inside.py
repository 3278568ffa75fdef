"""Inside a translation: where a group's difference starts when its compared node cannot be it.

The exporter translates one FX node into several ONNX nodes; only the last value has a torch twin.
When that last node only copies its input (Identity, a Cast to the input's own element type: the
output is the input, bit for bit), a difference the group creates on torch's inputs was computed
before it: the culprit is the ONNX-only node that computed what it copies (the Softmax of a
``softmax`` translated as Softmax + Cast).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sbs_widget.align.elem_types import elem_type

if TYPE_CHECKING:
    from sbs_widget.engine.entry import Prepared


def copies_its_input(index, node) -> bool:
    """Identity, or a Cast to its input's own element type: the output is the input, bit for bit."""
    if node.op_type == "Identity":
        return bool(node.input)
    if node.op_type != "Cast" or not node.input:
        return False
    to = next((a.i for a in node.attribute if a.name == "to"), 0)
    return to != 0 and elem_type(index, node.input[0]) == to


def computing_producer(prepared: Prepared, group: set[int], value: str):
    """``(node, its output, the copy that passes it on)`` for ``value``'s group (``group``: its ONNX
    node indices) when the node producing ``value`` only copies, through other copies, what an
    ONNX-only node of the group computed; None otherwise (a computing node, or a copy of a compared
    value: nothing inside to blame)."""
    index, twins = prepared.index, prepared.alignment.onnx_to_fx
    i = index.producer.get(value)
    while i is not None and i in group and copies_its_input(index, index.nodes[i]):
        copy = index.nodes[i]
        src = copy.input[0]
        i = index.producer.get(src)
        if i is None or i not in group or src in twins:
            return None
        if not copies_its_input(index, index.nodes[i]):
            return index.nodes[i], src, copy
    return None
