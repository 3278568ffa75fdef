"""Groups: the ONNX nodes that recompute one compared value from the torch values of their inputs.

A *group* is the ONNX node producing a compared value plus the ONNX-only nodes feeding it (Constants,
casts, transposed weights, reshapes of shapes...), up to the nearest values that have a torch twin
(its *anchors*), initializers or graph inputs. Node-local runs (``engine/node_local.py``) feed the
anchors from torch; inner values (``inner_pairs.py``) are the values inside a group.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from sbs_widget.load.onnx_index import OnnxIndex

MAX_GROUP_NODES = 64


@dataclass
class LocalGroup:
    value: str                  # the compared ONNX value this group recomputes
    nodes: list[int]            # ONNX node indices, topological
    anchors: list[str]          # values fed from torch (twins exist)
    constants: list[str]        # initializers read as they are in the ONNX file

    def output_name(self, k: int) -> str:
        return f"sbs_local{k}::{self.value}"



def build_group(index: OnnxIndex, value: str, twins: set[str]) -> LocalGroup | None:
    """The group recomputing ``value`` from twins, or None when it cannot be isolated."""
    start = index.producer.get(value)
    if start is None:
        return None
    own = index.node_fx[start]  # the FX node the value translates
    nodes: set[int] = set()
    foreign = 0  # nodes translating other FX nodes (or none)
    anchors: list[str] = []
    constants: list[str] = []
    stack = [start]
    while stack:
        i = stack.pop()
        if i in nodes:
            continue
        node = index.nodes[i]
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return None  # renaming values would break the subgraph's outer-scope references
        nodes.add(i)
        # One FX node's own translation may be long (an LSTM slices its weights per gate: ~130
        # nodes); beyond MAX_GROUP_NODES others, the value is too far from any twin.
        if own is None or index.node_fx[i] != own:
            foreign += 1
            if foreign > MAX_GROUP_NODES:
                return None
        for x in index.node_inputs[i]:
            if x in index.initializers:
                if x not in constants:
                    constants.append(x)
            elif x in twins and x != value:
                if x not in anchors:
                    anchors.append(x)
            elif x in index.producer:
                stack.append(index.producer[x])
            else:
                return None  # a graph input without twin: nothing to feed
    return LocalGroup(value, sorted(nodes), anchors, constants)
