"""Cutting the ONNX graph into segments run one after the other.

One session with every intermediate as an output is the fastest way to get them all, but it holds
them all at once (56x the live set on an 8-layer LLaMA, field notes). A few segments, each exposing
only what is compared or needed later, keep the speed and bound the memory: values are freed as soon
as they are compared and no later segment reads them. Resets cut a segment right after the producer
of the reset value so that downstream nodes read the torch value fed in its place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper

from .onnx_index import OnnxIndex

# Initializers up to this many elements are copied into segment models (shapes, axes, scalars);
# bigger ones are fed as inputs, so that weights are never copied per segment.
SMALL_INITIALIZER = 256

_NUMPY_TO_ONNX = {np.dtype(k): v for k, v in {
    np.float32: 1, np.uint8: 2, np.int8: 3, np.uint16: 4, np.int16: 5, np.int32: 6, np.int64: 7,
    np.bool_: 9, np.float16: 10, np.float64: 11, np.uint32: 12, np.uint64: 13, np.complex64: 14,
    np.complex128: 15}.items()}


def numpy_elem_type(array) -> int:
    dt = getattr(array, "dtype", None)
    if dt is None:
        return 0
    code = _NUMPY_TO_ONNX.get(dt)
    if code is not None:
        return code
    return onnx.TensorProto.BFLOAT16 if str(dt) == "bfloat16" else 0


@dataclass
class Segment:
    start: int                      # first ONNX node index
    end: int                        # one past the last
    inputs: list[str] = field(default_factory=list)         # values read from outside
    embedded: list[str] = field(default_factory=list)       # small initializers copied in
    outputs: list[str] = field(default_factory=list)        # values handed back

    @property
    def key(self) -> tuple[int, int]:
        return (self.start, self.end)


def plan_segments(n_nodes: int, cuts: set[int], node_bytes: list[int], budget: int,
                  max_nodes: int) -> list[tuple[int, int]]:
    """Node ranges in graph order. A segment ends when the values it hands back would exceed
    ``budget`` bytes (they are alive at once), after ``max_nodes`` nodes, and after each node in
    ``cuts`` (the producers of reset values)."""
    edges = [0]
    acc = count = 0
    for i in range(n_nodes):
        acc += node_bytes[i]
        count += 1
        if i in cuts or acc >= budget or count >= max_nodes:
            edges.append(i + 1)
            acc = count = 0
    if edges[-1] != n_nodes:
        edges.append(n_nodes)
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def describe_segment(index: OnnxIndex, start: int, end: int, wanted: set[str],
                     last_reader: dict[str, int]) -> Segment:
    """Inputs, embedded initializers and outputs of nodes ``[start, end)``.

    ``wanted``: values to hand back even if nothing later reads them (compared values).
    ``last_reader``: value -> index of the last node reading it (graph outputs count as len(nodes)).
    """
    seg = Segment(start, end)
    produced_here: set[str] = set()
    seen: set[str] = set()
    for i in range(start, end):
        for x in index.node_inputs[i]:
            if x in produced_here or x in seen:
                continue
            seen.add(x)
            init = index.initializers.get(x)
            if init is not None and _numel(init) <= SMALL_INITIALIZER:
                seg.embedded.append(x)
            else:
                seg.inputs.append(x)
        produced_here.update(o for o in index.node_outputs[i] if o)
    for i in range(start, end):
        for o in index.node_outputs[i]:
            if o and (o in wanted or last_reader.get(o, -1) >= end):
                seg.outputs.append(o)
    return seg


def _numel(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n


def segment_model(index: OnnxIndex, seg: Segment, feed_types: dict[str, int]) -> onnx.ModelProto:
    """A standalone model computing ``seg.outputs`` from ``seg.inputs`` (typed by the actual feeds)."""
    src = index.model
    graph = helper.make_graph(
        [index.nodes[i] for i in range(seg.start, seg.end)],
        f"segment_{seg.start}_{seg.end}",
        [helper.make_tensor_value_info(x, feed_types[x], None) for x in seg.inputs],
        [_output_info(index, o) for o in seg.outputs],
        initializer=[index.initializers[x] for x in seg.embedded],
    )
    # The runtime keeps what it is given: node metadata (stack traces, scopes) is most of a segment's
    # bytes and of its session's memory, and nothing reads it there.
    for node in graph.node:
        node.ClearField("metadata_props")
        node.ClearField("doc_string")
    return _wrap(src, graph)


def _output_info(index: OnnxIndex, name: str) -> onnx.ValueInfoProto:
    vt = index.types.get(name)
    if vt is not None and vt.elem_type:
        return helper.make_tensor_value_info(name, vt.elem_type, None)
    vi = onnx.ValueInfoProto()
    vi.name = name
    return vi


def _wrap(src: onnx.ModelProto, graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=list(src.opset_import), functions=list(src.functions))
    model.ir_version = src.ir_version
    return model
