"""The element type of an ONNX value: as the exporter wrote it, or carried from its producer's input
when the exporter wrote none (a translation's inner values often have no type)."""

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
