"""What an ONNX model must be before its nodes are run and compared: checked once, when it is
prepared, so that a broken file gets an error naming the initializer or node and what to do,
instead of a raw numpy error mid-run or "an upstream node failed" on every record.

Checked: the graph has outputs (a 0-byte file parses as an empty model); every tensor the file holds
(initializers, ``Constant`` values and other tensor attributes, in subgraphs too) has a known numeric
type, no negative dimension, and as many bytes or values as its shape needs (counted, never read);
every node reads values produced before it (an unsorted graph, and a cycle, which no order can fix);
no value is produced twice. ``onnx.checker`` checks more and costs more: these are the faults that
would otherwise be misreported.
"""

from __future__ import annotations

import math

import onnx

from sbs_widget.errors import LoadError, ModelMismatchError

# Sub-byte types: elements packed per byte of ``raw_data`` and per entry of ``int32_data``.
_PACKED = {getattr(onnx.TensorProto, name): per for name, per in (
    ("INT4", 2), ("UINT4", 2), ("FLOAT4E2M1", 2), ("INT2", 4), ("UINT2", 4)) if hasattr(onnx.TensorProto, name)}
_SIX_BIT = {getattr(onnx.TensorProto, name) for name in ("FLOAT6E2M3", "FLOAT6E3M2") if hasattr(onnx.TensorProto, name)}
_KNOWN_TYPES = set(onnx.TensorProto.DataType.values()) - {onnx.TensorProto.UNDEFINED}
# The typed field holding each type's values when there is no ``raw_data``, and values per element.
_TYPED_FIELD = {
    onnx.TensorProto.FLOAT: ("float_data", 1), onnx.TensorProto.COMPLEX64: ("float_data", 2),
    onnx.TensorProto.DOUBLE: ("double_data", 1), onnx.TensorProto.COMPLEX128: ("double_data", 2),
    onnx.TensorProto.INT64: ("int64_data", 1), onnx.TensorProto.UINT32: ("uint64_data", 1),
    onnx.TensorProto.UINT64: ("uint64_data", 1), onnx.TensorProto.STRING: ("string_data", 1),
}


def expected_bytes(data_type: int, dims) -> int | None:
    """Bytes ``raw_data`` (or external data) must hold for a tensor of this type and shape; None for
    types without a fixed size (STRING, unknown types) and negative dimensions."""
    dims = list(dims)
    if any(d < 0 for d in dims):
        return None
    n = math.prod(dims)
    if data_type in _PACKED:
        return -(-n // _PACKED[data_type])
    if data_type in _SIX_BIT:
        return (n * 6 + 7) // 8
    if data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return None
    try:
        return n * onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return None


def _expected_entries(data_type: int, n: int) -> tuple[str, int]:
    """The typed field holding ``n`` elements of this type, and how many entries they take there."""
    field, per_element = _TYPED_FIELD.get(data_type, ("int32_data", 1))
    if data_type in _PACKED:
        return field, -(-n // _PACKED[data_type])
    return field, n * per_element


def _type_name(data_type: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(data_type)
    except ValueError:
        return str(data_type)


def check_tensor(t: onnx.TensorProto, what: str, where: str) -> None:
    """Raise ``LoadError`` naming ``what`` ("initializer 'w'") when ``t`` cannot be read as its dims and
    type say: negative dimensions, an unknown or string type, or fewer or more values than its shape
    needs, whether in ``raw_data`` or in the typed fields (``float_data``...). Nothing is allocated:
    only the counts are compared (dims of 2**31 x 2**31 with no data are refused, never read)."""
    dims = list(t.dims)
    if any(d < 0 for d in dims):
        raise LoadError(f"{where}: {what} has a negative dimension {dims}; the file is corrupt: export the "
                        "model again")
    if t.data_type not in _KNOWN_TYPES:
        raise LoadError(f"{where}: {what} has the element type {_type_name(t.data_type)}, which ONNX does not "
                        "define (UNDEFINED or unknown); the file is corrupt or was edited: export the model again")
    if t.data_type == onnx.TensorProto.STRING:
        raise LoadError(f"{where}: {what} holds strings (STRING, shape {dims}); a program exported from torch "
                        "computes with numbers only, so this is not its export, or the file was edited: export "
                        "the model again")
    if t.HasField("segment"):
        raise LoadError(f"{where}: {what} is stored in segments, which neither onnx nor sbs_widget reads; "
                        "save the model again without segments")
    if t.data_location == onnx.TensorProto.EXTERNAL:
        return  # sized when the file is read (lean_onnx, onnx.load)
    type_name = _type_name(t.data_type)
    if t.HasField("raw_data"):
        expected = expected_bytes(t.data_type, dims)
        if expected is not None and len(t.raw_data) != expected:
            raise LoadError(
                f"{where}: {what} ({type_name}, shape {dims}) holds {len(t.raw_data)} bytes of data where its "
                f"shape needs {expected}; the file is truncated or was edited: export or save the model again")
        return
    field, expected = _expected_entries(t.data_type, math.prod(dims))
    held = len(getattr(t, field))
    if held != expected:
        data = f"{held} values in {field}" if held else f"no data (no raw_data, nothing in {field})"
        raise LoadError(
            f"{where}: {what} ({type_name}, shape {dims}) holds {data} where its shape needs {expected} "
            "values; the file is truncated or was edited: export or save the model again")


def _node_label(node: onnx.NodeProto, k: int) -> str:
    return repr(node.name) if node.name else f"#{k} ({node.op_type})"


def check_tensors(graph: onnx.GraphProto, where: str) -> None:
    """Every tensor the graph holds: initializers (sparse ones too), tensors in node attributes
    (``Constant``'s ``value``, ``ConstantOfShape``'s...), and those of subgraphs (``If``, ``Loop``)."""
    stack = [(graph, "")]
    while stack:
        g, inside = stack.pop()
        for t in g.initializer:
            check_tensor(t, f"{inside}initializer {t.name!r}", where)
        for s in g.sparse_initializer:
            check_tensor(s.values, f"{inside}sparse initializer {s.values.name!r} (values)", where)
            check_tensor(s.indices, f"{inside}sparse initializer {s.values.name!r} (indices)", where)
        for k, node in enumerate(g.node):
            label = f"{inside}node {_node_label(node, k)}"
            for a in node.attribute:
                if a.HasField("t"):
                    check_tensor(a.t, f"{label} attribute {a.name!r}", where)
                for j, t in enumerate(a.tensors):
                    check_tensor(t, f"{label} attribute {a.name!r}[{j}]", where)
                if a.HasField("sparse_tensor"):
                    check_tensor(a.sparse_tensor.values, f"{label} attribute {a.name!r} (values)", where)
                    check_tensor(a.sparse_tensor.indices, f"{label} attribute {a.name!r} (indices)", where)
                if a.HasField("g"):
                    stack.append((a.g, f"{label} attribute {a.name!r}: "))
                stack.extend((sub, f"{label} attribute {a.name!r}[{j}]: ") for j, sub in enumerate(a.graphs))


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
    check_tensors(model.graph, where)
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
