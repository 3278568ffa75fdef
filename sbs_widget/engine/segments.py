"""Cutting the ONNX graph into segments run one after the other.

One session with every intermediate as an output is the fastest way to get them all, but it holds
them all at once (56x the live set on an 8-layer LLaMA). A few segments, each exposing
only what is compared or needed later, keep the speed and bound the memory: values are freed as soon
as they are compared and no later segment reads them. Resets cut a segment right after the producer
of the reset value so that downstream nodes read the torch value fed in its place.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import onnx
from onnx import helper

from sbs_widget.dtypes import onnx_itemsize
from sbs_widget.load.lean_onnx import encode_varint, read_varint
from sbs_widget.load.onnx_index import OnnxIndex

# Initializers up to this many elements are copied into segment models (shapes, axes, scalars);
# bigger ones are fed as inputs, so that weights are never copied per segment.
SMALL_INITIALIZER = 256

# A feed named TRANSPOSED + x is the transpose of input x (a weight the optimizer stored transposed,
# fed from the torch parameter's memory): the segment transposes it itself, so the copy lives from
# just before its first reader to its last (onnxruntime frees it then), not through the whole segment.
TRANSPOSED = "sbs_transposed::"

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
                  max_nodes: int, weights: tuple[list[int], int] | None = None) -> list[tuple[int, int]]:
    """Node ranges in graph order. A segment ends when the values it hands back would exceed
    ``budget`` bytes (they are alive at once), after ``max_nodes`` nodes, after each node in
    ``cuts`` (the producers of reset values), and, with ``weights`` = (bytes of weights each node
    reads, budget), when the weights it reads would exceed that budget (``half_weights_budget``)."""
    edges = [0]
    acc = count = read = 0
    per_node, weight_budget = weights if weights is not None else (None, 0)
    for i in range(n_nodes):
        acc += node_bytes[i]
        count += 1
        read += per_node[i] if per_node is not None else 0
        if i in cuts or acc >= budget or count >= max_nodes or (per_node is not None and read >= weight_budget):
            edges.append(i + 1)
            acc = count = read = 0
    if edges[-1] != n_nodes:
        edges.append(n_nodes)
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


# Weights read per segment, as a share of all the weights, where a segment's weights cost memory
# while it runs:
# - half precision: onnxruntime's CPU kernels lack most float16 / bfloat16 ops, so it casts their inputs
#   to float32 where they are read, weights fed as inputs included, and its sequential executor runs
#   the casts of a segment's weights early: a segment then holds a float32 copy of every weight it
#   reads (measured on a 0.6 GB float16 LLaMA: +0.54 GB in a segment reading 448 MB; with segments
#   reading 1/8 of the weights, +0.1 GB);
# - weights mapped from their file (load/mapped_weights.py): a segment holds the pages of the weights
#   it reads until it is done (on a 1.2 GB float32 LLaMA cut in 2 segments: 1.03 GB resident at once).
# Half precision keeps its own rule (cutting it elsewhere changes its records: a value handed back is
# rounded to float16); float32 values are handed back as they are, so its records do not move.
WEIGHTS_SHARE = 8
_HALF = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def weights_budget(index: OnnxIndex, mapped: bool = False) -> tuple[list[int], int] | None:
    """(bytes of weights each node reads, the budget per segment), or None when a segment's weights
    cost nothing more than the weights themselves: half-precision weights count their float32 copies;
    ``mapped``, with no big half-precision weights, every weight counts its own bytes."""
    half = _weight_reads(index, lambda t, n: 2 * n if t.data_type in _HALF else 0)
    if half is None and mapped:
        half = _weight_reads(index, lambda t, n: n * onnx_itemsize(t.data_type))
    if half is None:
        return None
    per_node, total = half
    return per_node, max(total // WEIGHTS_SHARE, 1 << 20)


def _weight_reads(index: OnnxIndex, cost) -> tuple[list[int], int] | None:
    per_node, total = [], 0
    for inputs in index.node_inputs:
        n = 0
        for x in inputs:
            t = index.initializers.get(x)
            if t is not None and index.initializer_numel(x) > SMALL_INITIALIZER:
                n += cost(t, index.initializer_numel(x))
        per_node.append(n)
        total += n
    return (per_node, total) if total else None


def describe_segment(index: OnnxIndex, start: int, end: int, wanted: set[str],
                     last_reader: dict[str, int], weights_in: bool = False) -> Segment:
    """Inputs, embedded initializers and outputs of nodes ``[start, end)``.

    ``wanted``: values to hand back even if nothing later reads them (compared values).
    ``last_reader``: value -> index of the last node reading it (graph outputs count as len(nodes)).
    ``weights_in``: every initializer copied in, not only the small ones.
    """
    seg = Segment(start, end)
    produced_here: set[str] = set()
    seen: set[str] = set()
    initializers, numel = index.initializers, index.initializer_numel
    node_inputs, node_outputs = index.node_inputs, index.node_outputs
    for i in range(start, end):
        for x in node_inputs[i]:
            if x in produced_here or x in seen:
                continue
            seen.add(x)
            if x in initializers and (weights_in or numel(x) <= SMALL_INITIALIZER):
                seg.embedded.append(x)
            else:
                seg.inputs.append(x)
        produced_here.update(node_outputs[i])
    for i in range(start, end):
        for o in node_outputs[i]:
            if o and (o in wanted or last_reader.get(o, -1) >= end):
                seg.outputs.append(o)
    return seg


def segment_model(index: OnnxIndex, seg: Segment, feed_types: dict[str, int]) -> onnx.ModelProto:
    """A standalone model computing ``seg.outputs`` from ``seg.inputs`` (typed by the actual feeds)."""
    return onnx.ModelProto.FromString(segment_bytes(index, seg, feed_types))


def segment_bytes(index: OnnxIndex, seg: Segment, feed_types: dict[str, int]) -> bytes:
    """``segment_model`` serialized, built from bytes: the nodes were serialized once for the whole
    model (``SerializedNodes``), a segment joins a slice of them. Building protobuf messages per
    segment held the GIL for ~10 ms a model while the main thread ran the comparison."""
    inputs, transposes = [], []
    # A feed with no ONNX type (``numpy_elem_type`` -> None) is declared UNDEFINED (0).
    for x in seg.inputs:
        if x in feed_types:
            inputs.append(helper.make_tensor_value_info(x, feed_types[x] or 0, None))
        else:
            source = TRANSPOSED + x
            inputs.append(helper.make_tensor_value_info(source, feed_types[source] or 0, None))
            transposes.append(helper.make_node("Transpose", [source], [x], perm=[1, 0]))
    shell = onnx.GraphProto(
        name=f"segment_{seg.start}_{seg.end}",
        node=transposes,  # first in the file; onnxruntime runs each just before its first reader
        input=inputs,
        initializer=[index.initializer_proto(x) for x in seg.embedded],  # (bytes read from the file if left there)
    )
    nodes = _serialized_nodes(index)
    # A message field given twice is merged by protobuf parsers (repeated fields concatenate): the
    # graph is the shell (inputs, initializers), the outputs' records, then the nodes' records.
    records = nodes.output_records
    outputs = b"".join([records.get(o) or _output_record(index, o, records) for o in seg.outputs])
    graph = shell.SerializeToString() + outputs + nodes.records(seg.start, seg.end)
    return nodes.model_head + _length_delimited(_MODEL_GRAPH_FIELD, graph)


def _output_record(index: OnnxIndex, name: str, cache: dict[str, bytes]) -> bytes:
    """A ``GraphProto.output`` record: a ValueInfoProto naming the value and its element type (shape
    left to the runtime), written directly (building the message costs more, for every output of
    every segment)."""
    vt = index.types.get(name)
    code = vt.elem_type if vt is not None else 0
    typed = _TYPE_FIELDS.get(code)
    if typed is None:
        # ValueInfoProto.type { TypeProto.tensor_type { elem_type } }
        typed = _TYPE_FIELDS[code] = _length_delimited(2, _length_delimited(1, b"\x08" + _varint(code))) \
            if code else b""
    encoded = name.encode()
    info = b"\x0a" + _varint(len(encoded)) + encoded + typed  # ValueInfoProto.name, then the type
    record = cache[name] = _OUTPUT_TAG + _varint(len(info)) + info
    return record


_OUTPUT_TAG = bytes([(12 << 3) | 2])  # GraphProto.output
_TYPE_FIELDS: dict[int, bytes] = {}


_MODEL_GRAPH_FIELD = 7   # ModelProto.graph
_GRAPH_NODE_FIELD = 1    # GraphProto.node


class SerializedNodes:
    """Every node of a model serialized once, without metadata (stack traces, scopes: most of a
    node's bytes, and kept by the runtime if given), as the records of a GraphProto's ``node`` field,
    plus the model fields every segment repeats (IR version, opsets, local functions)."""

    CHUNK = 128  # nodes copied at a time: their metadata is copied before it is cleared

    def __init__(self, model: onnx.ModelProto):
        nodes = model.graph.node
        parts = []
        for start in range(0, len(nodes), self.CHUNK):
            graph = onnx.GraphProto()
            graph.node.extend(nodes[start:start + self.CHUNK])
            for node in graph.node:
                node.ClearField("metadata_props")
                node.ClearField("doc_string")
            parts.append(graph.SerializeToString())
        self.data = b"".join(parts)
        # Only field 1 is set: the bytes are (tag, length, NodeProto) records, one per node, in order.
        offsets = [0]
        data, pos, end = self.data, 0, len(self.data)
        tag = (_GRAPH_NODE_FIELD << 3) | 2
        while pos < end:
            if data[pos] != tag:
                raise ValueError("unexpected field in a serialized GraphProto")
            length, pos = read_varint(data, pos + 1, len(data))
            pos += length
            offsets.append(pos)
        self.offsets = offsets
        head = onnx.ModelProto(ir_version=model.ir_version, opset_import=list(model.opset_import),
                               functions=list(model.functions))
        self.model_head = head.SerializeToString()
        self.output_records: dict[str, bytes] = {}  # value -> its GraphProto.output record

    def records(self, start: int, end: int) -> bytes:
        return self.data[self.offsets[start]:self.offsets[end]]


_SERIALIZED_LOCK = threading.Lock()


def _serialized_nodes(index: OnnxIndex) -> SerializedNodes:
    """Built once per index, by whichever thread first builds a segment."""
    nodes = index.__dict__.get("_serialized_nodes")
    if nodes is None:
        with _SERIALIZED_LOCK:
            nodes = index.__dict__.get("_serialized_nodes")
            if nodes is None:
                nodes = index.__dict__["_serialized_nodes"] = SerializedNodes(index.model)
    return nodes


def _varint(n: int) -> bytes:
    return _SMALL_VARINTS[n] if n < 0x80 else encode_varint(n)


_SMALL_VARINTS = [bytes([n]) for n in range(0x80)]


def _length_delimited(field_number: int, payload: bytes) -> bytes:
    return bytes([(field_number << 3) | 2]) + _varint(len(payload)) + payload


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
