"""Inside a translation: where a group's difference starts when its compared node cannot be it.

The exporter translates one FX node into several ONNX nodes; only the last value has a torch twin.
When that last node only copies its input (Identity, a Cast to the input's own element type: the
output is the input, bit for bit), a difference the group creates on torch's inputs was computed
before it: the culprit is the ONNX-only node that computed what it copies (the Softmax of a
``softmax`` translated as Softmax + Cast).
"""

from __future__ import annotations

import onnx

# Ops whose output has the element type of their first input (the ONNX operator schemas' "T -> T"):
# an inner value the exporter wrote no type for gets its producer's input type through them.
_SAME_TYPE = frozenset({
    "Abs", "Add", "Clip", "Cos", "Div", "Elu", "Erf", "Exp", "Expand", "Flatten", "Gelu", "Gemm", "HardSigmoid",
    "Identity", "LayerNormalization", "LeakyRelu", "Log", "LogSoftmax", "MatMul", "Max", "Min", "Mul", "Neg", "Pow",
    "ReduceL2", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceSum", "Reciprocal", "Relu", "Reshape", "Sigmoid",
    "Sin", "Softmax", "Softplus", "Sqrt", "Squeeze", "Sub", "Tanh", "Transpose", "Unsqueeze"})

_BOOL = frozenset({"IsNaN", "IsInf", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or",
                   "Xor"})


def elem_type(index, value: str, depth: int = 0) -> int:
    """ONNX element type of ``value``: written by the exporter, or carried from its producer's input
    (``_SAME_TYPE``, ``Cast``'s ``to``, ``CastLike``'s model, ``Where``'s branches, a Constant's value,
    comparisons' booleans); 0 when unknown."""
    vt = index.types.get(value)
    if vt is not None and vt.elem_type:
        return vt.elem_type
    i = index.producer.get(value)
    if i is None or depth > 16:
        return 0
    node = index.nodes[i]
    if node.op_type == "Cast":
        return next((a.i for a in node.attribute if a.name == "to"), 0)
    if node.op_type == "CastLike" and len(node.input) > 1:
        return elem_type(index, node.input[1], depth + 1)
    if node.op_type in _BOOL:
        return onnx.TensorProto.BOOL
    if node.op_type == "Constant":
        for a in node.attribute:
            if a.name == "value":
                return a.t.data_type
            if a.name in ("value_float", "value_floats"):
                return onnx.TensorProto.FLOAT
            if a.name in ("value_int", "value_ints"):
                return onnx.TensorProto.INT64
        return 0
    if node.op_type == "Where" and len(node.input) > 1:
        return elem_type(index, node.input[1], depth + 1)
    if node.op_type in _SAME_TYPE and node.input:
        return elem_type(index, node.input[0], depth + 1)
    return 0


def copies_its_input(index, node) -> bool:
    """Identity, or a Cast to its input's own element type: the output is the input, bit for bit."""
    if node.op_type == "Identity":
        return bool(node.input)
    if node.op_type != "Cast" or not node.input:
        return False
    to = next((a.i for a in node.attribute if a.name == "to"), 0)
    return to != 0 and elem_type(index, node.input[0]) == to


def computing_producer(prepared, group: set[int], value: str):
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
