"""Node-local runs: each ONNX node (or fused group) recomputed from the torch values of its inputs.

If a node's output differs from torch even when it reads torch's inputs, the node itself creates the
error; if it agrees, it only inherits an error from upstream. A *group* is the ONNX node producing a
compared value plus the ONNX-only nodes feeding it (Constants, casts, transposed weights, reshapes of
shapes...), up to the nearest values that have a torch twin, initializers or graph inputs. All groups
of a segment are copied, renamed apart, into ONE model: one session per segment, never one per node.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
from onnx import helper

from sbs_widget.align.groups import MAX_GROUP_NODES, LocalGroup, build_group  # noqa: F401 (re-exported)
from sbs_widget.engine.segments import SMALL_INITIALIZER, _output_info, _wrap
from sbs_widget.load.onnx_index import OnnxIndex

ANCHOR = "sbs_torch::"


def inner_output_name(k: int, value: str) -> str:
    """The name of ``value``, inside group ``k``, in a node-local model (as the group renames it)."""
    return f"sbs_local{k}::{value}"


@dataclass
class LocalPlan:
    groups: list[LocalGroup] = field(default_factory=list)
    anchors: list[str] = field(default_factory=list)
    big_constants: list[str] = field(default_factory=list)


def local_model(index: OnnxIndex, groups: list[LocalGroup], feed_types: dict[str, int],
                inner: dict[str, list[str]] | None = None, values: bool = True) -> tuple[onnx.ModelProto, LocalPlan]:
    """One model holding every group, values renamed per group; anchors are inputs named
    ``sbs_torch::<value>``, big initializers are inputs under their own name. ``inner``: per group
    value, values inside it handed back too (``inner_output_name``); ``values=False``: only those."""
    plan = LocalPlan(groups=groups)
    nodes, inits = [], []
    seen_init: set[str] = set()
    for k, g in enumerate(groups):
        rename = {a: ANCHOR + a for a in g.anchors}
        for c in g.constants:
            rename[c] = c
            if c in seen_init:
                continue
            seen_init.add(c)
            if index.initializer_numel(c) <= SMALL_INITIALIZER:
                inits.append(index.initializers[c])
            else:
                plan.big_constants.append(c)
        for a in g.anchors:
            if a not in plan.anchors:
                plan.anchors.append(a)
        prefix = f"sbs_local{k}::"
        for i in g.nodes:
            src = index.nodes[i]
            node = onnx.NodeProto()
            node.CopyFrom(src)
            # metadata (stack traces...) is most of a node's bytes, and the runtime would keep it
            node.ClearField("metadata_props")
            node.ClearField("doc_string")
            node.name = prefix + (src.name or f"n{i}")
            del node.input[:]
            node.input.extend(rename.get(x, prefix + x) if x else "" for x in src.input)
            del node.output[:]
            node.output.extend(prefix + o if o else "" for o in src.output)
            nodes.append(node)
    # None (a feed with no ONNX type, see ``dtypes.numpy_elem_type``) is declared UNDEFINED, as segments do
    inputs = [helper.make_tensor_value_info(ANCHOR + a, feed_types[ANCHOR + a] or 0, None) for a in plan.anchors]
    inputs += [helper.make_tensor_value_info(c, feed_types[c] or 0, None) for c in plan.big_constants]
    outputs = []
    for k, g in enumerate(groups):
        if values:
            vi = _output_info(index, g.value)
            vi.name = g.output_name(k)
            outputs.append(vi)
        for x in (inner or {}).get(g.value, ()):
            vi = _output_info(index, x)
            vi.name = inner_output_name(k, x)
            outputs.append(vi)
    graph = helper.make_graph(nodes, "node_local", inputs, outputs, initializer=inits)
    return _wrap(index.model, graph), plan
