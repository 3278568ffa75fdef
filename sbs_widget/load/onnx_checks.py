"""What an ONNX model must be before its nodes are run and compared: checked once, when it is
prepared, so that a broken file gets an error naming the initializer or node and what to do,
instead of a raw numpy error mid-run or "an upstream node failed" on every record.

Checked: the graph has outputs (a 0-byte file parses as an empty model); every initializer's bytes
fit its shape and type; every node reads values produced before it (an unsorted graph, and a cycle,
which no order can fix); no value is produced twice. ``onnx.checker`` checks more and costs more:
these are the faults that would otherwise be misreported.
"""

from __future__ import annotations

import math

import onnx

from sbs_widget.errors import LoadError, ModelMismatchError

_FOUR_BIT = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4, getattr(onnx.TensorProto, "FLOAT4E2M1", -1)}


def _expected_bytes(t: onnx.TensorProto) -> int | None:
    """Bytes ``raw_data`` must hold for ``t``'s shape and type; None for types without a fixed size."""
    n = math.prod(t.dims)
    if t.data_type in _FOUR_BIT:
        return (n + 1) // 2
    if t.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return None
    try:
        return n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return None


def check_initializers(graph: onnx.GraphProto, where: str) -> None:
    for t in graph.initializer:
        if any(d < 0 for d in t.dims):
            raise LoadError(f"{where}: initializer {t.name!r} has a negative dimension {list(t.dims)}; the file "
                            "is corrupt: export the model again")
        if t.data_location == onnx.TensorProto.EXTERNAL or not t.HasField("raw_data"):
            continue  # typed fields are sized by protobuf; external data is checked by onnx.load
        expected = _expected_bytes(t)
        if expected is not None and len(t.raw_data) != expected:
            type_name = onnx.TensorProto.DataType.Name(t.data_type)
            raise LoadError(
                f"{where}: initializer {t.name!r} ({type_name}, shape {list(t.dims)}) holds {len(t.raw_data)} "
                f"bytes of data where its shape needs {expected}; the file is truncated or was edited: export "
                "or save the model again")


def check_graph_order(graph: onnx.GraphProto, where: str) -> None:
    """Every node reads graph inputs, initializers or outputs of nodes before it."""
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    known |= {t.values.name for t in graph.sparse_initializer}
    producer = {out: k for k, node in enumerate(graph.node) for out in node.output if out}
    seen = set(known)
    for k, node in enumerate(graph.node):
        for name in node.input:
            if name in seen:
                continue
            label = node.name or f"#{k} ({node.op_type})"
            later = producer.get(name)
            if later is None:
                raise LoadError(f"{where}: node {label!r} reads {name!r}, which no node, input or initializer "
                                "produces; the graph is broken: export the model again")
            if later == k or _reaches(graph, later, k, producer):
                raise LoadError(f"{where}: node {label!r} is part of a cycle (it reads {name!r}, computed from its "
                                "own output); an ONNX graph must be acyclic: export the model again")
            raise LoadError(f"{where}: node {label!r} reads {name!r}, produced by a later node "
                            f"{graph.node[later].name or later!r}: the nodes are not in topological order; sort "
                            "them (onnx.utils or onnxscript's ir can) or export the model again")
        for out in node.output:
            if out and out in seen:
                raise LoadError(f"{where}: value {out!r} is produced twice (again by node "
                                f"{node.name or k!r}); an ONNX value has one producer: export the model again")
            seen.add(out)


def _reaches(graph: onnx.GraphProto, start: int, target: int, producer: dict[str, int]) -> bool:
    """Whether node ``start`` depends, through its inputs, on node ``target``'s outputs."""
    stack, visited = [start], set()
    while stack:
        k = stack.pop()
        if k == target:
            return True
        if k in visited:
            continue
        visited.add(k)
        stack.extend(producer[i] for i in graph.node[k].input if i in producer)
    return False


def check_model(model: onnx.ModelProto, where: str = "the ONNX model") -> None:
    """Raise ``LoadError`` naming the first fault of the kinds above."""
    if not model.graph.output:
        empty = not model.graph.node and not model.graph.input
        raise LoadError(f"{where} is empty (no graph, no outputs): " + (
            "the file is empty or not an ONNX model; pass the .onnx file torch.onnx.export wrote" if empty else
            "its graph has no outputs, so there is nothing to compare"))
    check_initializers(model.graph, where)
    check_graph_order(model.graph, where)


def check_input_shapes(model: onnx.ModelProto, inputs: list[tuple[str, str, object]]) -> None:
    """``inputs``: (program input, ONNX input, value) triples. A fixed ONNX dimension that the value
    does not have means the two files were exported at other shapes (a batch of 2 and one of 4): say
    so, instead of letting every record downstream fail."""
    declared = {i.name: i.type.tensor_type.shape for i in model.graph.input if i.type.HasField("tensor_type")}
    for fx_name, onnx_name, value in inputs:
        shape = declared.get(onnx_name)
        if shape is None or not hasattr(value, "shape") or not shape.dim:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in shape.dim]
        actual = tuple(value.shape)
        if len(dims) != len(actual) or any(d is not None and d != a for d, a in zip(dims, actual)):
            fixed = tuple(d if d is not None else "?" for d in dims)
            raise ModelMismatchError(
                f"the ONNX model's input {onnx_name!r} has the fixed shape {fixed}, and the program's input "
                f"{fx_name!r} is given {actual}, which the program accepts: the two files were exported at "
                "different shapes; export the ONNX model from this program with the same example inputs, or "
                "both with dynamic shapes")
