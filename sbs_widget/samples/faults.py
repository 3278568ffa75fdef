"""Deliberate faults in an ONNX model: for demos, tests and the culprit-finder's accuracy suite.

Each function returns a modified copy and leaves its argument untouched.

>>> import onnx
>>> # bad = replace_op(model, "node_add_3", "Sub")
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _node(model: onnx.ModelProto, node_name: str) -> onnx.NodeProto:
    for node in model.graph.node:
        if node.name == node_name:
            return node
    raise KeyError(f"no node named {node_name!r}")


def perturb_initializer(model: onnx.ModelProto, name: str, *, scale: float = 1e-2, seed: int = 0) -> onnx.ModelProto:
    """Add Gaussian noise of relative size ``scale`` to initializer ``name``."""
    out = _copy(model)
    for i, init in enumerate(out.graph.initializer):
        if init.name == name:
            arr = numpy_helper.to_array(init)
            rng = np.random.default_rng(seed)
            noisy = arr + (scale * (np.abs(arr).mean() + 1e-3) * rng.standard_normal(arr.shape)).astype(arr.dtype)
            new = numpy_helper.from_array(noisy.astype(arr.dtype), name)
            out.graph.initializer[i].CopyFrom(new)
            return out
    raise KeyError(f"no initializer named {name!r}")


def replace_op(model: onnx.ModelProto, node_name: str, op_type: str) -> onnx.ModelProto:
    """Replace the operator of a node (e.g. Add by Sub), keeping inputs and outputs."""
    out = _copy(model)
    _node(out, node_name).op_type = op_type
    return out


def set_attribute(model: onnx.ModelProto, node_name: str, attr: str, value) -> onnx.ModelProto:
    """Change (or add) an attribute, e.g. ``epsilon`` of a LayerNormalization, ``axis`` of a Softmax."""
    out = _copy(model)
    node = _node(out, node_name)
    kept = [a for a in node.attribute if a.name != attr]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute(attr, value)])
    return out


def insert_cast(model: onnx.ModelProto, value: str, to: int = onnx.TensorProto.FLOAT16) -> onnx.ModelProto:
    """Round-trip ``value`` through a lower precision type right after it is produced: every
    consumer reads ``Cast(Cast(value, to), original type)``."""
    out = _copy(model)
    g = out.graph
    producer = next((i for i, n in enumerate(g.node) if value in n.output), None)
    if producer is None:
        raise KeyError(f"no node produces {value!r}")
    elem = next((vi.type.tensor_type.elem_type for vi in list(g.value_info) + list(g.output) if vi.name == value),
                onnx.TensorProto.FLOAT)
    low, back = f"{value}__lowp", f"{value}__roundtrip"
    for n in g.node:
        for k, x in enumerate(n.input):
            if x == value:
                n.input[k] = back
    for o in g.output:
        if o.name == value:  # keep graph outputs reading the original name: add an Identity
            pass
    cast1 = helper.make_node("Cast", [value], [low], to=to, name=f"{value}__cast_low")
    cast2 = helper.make_node("Cast", [low], [back], to=elem, name=f"{value}__cast_back")
    nodes = list(g.node)
    nodes[producer + 1:producer + 1] = [cast1, cast2]
    del g.node[:]
    g.node.extend(nodes)
    return out


def scale_constant(model: onnx.ModelProto, name: str, factor: float) -> onnx.ModelProto:
    """Multiply a scalar (or small) constant, given as an initializer or a Constant node output."""
    out = _copy(model)
    for i, init in enumerate(out.graph.initializer):
        if init.name == name:
            arr = numpy_helper.to_array(init)
            out.graph.initializer[i].CopyFrom(numpy_helper.from_array((arr * factor).astype(arr.dtype), name))
            return out
    for node in out.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            for a in node.attribute:
                if a.name == "value":
                    arr = numpy_helper.to_array(a.t)
                    a.t.CopyFrom(numpy_helper.from_array((arr * factor).astype(arr.dtype), a.t.name))
                    return out
    raise KeyError(f"no initializer or Constant named {name!r}")


def swap_gelu_approximation(model: onnx.ModelProto, node_name: str) -> onnx.ModelProto:
    """Switch a Gelu node between ``approximate="none"`` and ``"tanh"``."""
    out = _copy(model)
    node = _node(out, node_name)
    current = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "approximate"), b"none")
    current = current.decode() if isinstance(current, bytes) else current
    return set_attribute(out, node_name, "approximate", "tanh" if current == "none" else "none")


def zero_beyond(model: onnx.ModelProto, value: str, *, length: int, axis: int = 1) -> onnx.ModelProto:
    """Every consumer of ``value`` reads it with the positions from ``length`` on along ``axis`` set to zero
    (``Where(Range(dim) < length, value, 0)``): a fault that shows on longer inputs only (padding or a
    window applied where it should not be). The rank of ``value`` is read from the model's value infos."""
    out = _copy(model)
    g = out.graph
    producer = next((i for i, n in enumerate(g.node) if value in n.output), None)
    if producer is None:
        raise KeyError(f"no node produces {value!r}")
    info = next((vi for vi in list(g.value_info) + list(g.output) if vi.name == value), None)
    if info is None or not info.type.tensor_type.HasField("shape"):
        raise KeyError(f"no value info gives the rank of {value!r}")
    rank = len(info.type.tensor_type.shape.dim)
    elem = info.type.tensor_type.elem_type
    p = f"{value}__beyond{length}"
    masked = f"{p}_masked"
    for n in g.node:
        for k, x in enumerate(n.input):
            if x == value:
                n.input[k] = masked

    def const(name, array):
        return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(array), name))

    added = [
        helper.make_node("Shape", [value], [f"{p}_shape"], name=f"{p}_shape_node"),
        const(f"{p}_axis", np.array(axis, dtype=np.int64)),
        helper.make_node("Gather", [f"{p}_shape", f"{p}_axis"], [f"{p}_dim"], name=f"{p}_dim_node"),
        const(f"{p}_start", np.array(0, dtype=np.int64)), const(f"{p}_step", np.array(1, dtype=np.int64)),
        helper.make_node("Range", [f"{p}_start", f"{p}_dim", f"{p}_step"], [f"{p}_pos"], name=f"{p}_range"),
        const(f"{p}_length", np.array(length, dtype=np.int64)),
        helper.make_node("Less", [f"{p}_pos", f"{p}_length"], [f"{p}_keep"], name=f"{p}_less"),
        const(f"{p}_axes", np.arange(1, rank - axis, dtype=np.int64)),
        helper.make_node("Unsqueeze", [f"{p}_keep", f"{p}_axes"], [f"{p}_keep_b"], name=f"{p}_unsqueeze"),
        const(f"{p}_zero", np.zeros((), dtype=helper.tensor_dtype_to_np_dtype(elem))),
        helper.make_node("Where", [f"{p}_keep_b", value, f"{p}_zero"], [masked], name=f"{p}_where"),
    ]
    nodes = list(g.node)
    nodes[producer + 1:producer + 1] = added
    del g.node[:]
    g.node.extend(nodes)
    return out
