"""Faults one forward call does not show: edits of an exported decoder's ONNX graph that only act past
the prompt, for the decode-step tests and benchmarks (``steps/decode.py``).

Each returns ``(faulty model, names of the ONNX nodes it edits or adds)``: a culprit naming one of them
(or the node whose group holds them) found the fault.
"""

from __future__ import annotations

import copy

import onnx
from onnx import TensorProto, helper


def _inputs_named(model: onnx.ModelProto, part: str) -> list[str]:
    return [i.name for i in model.graph.input if part in i.name]


def _rewire(model: onnx.ModelProto, value: str, new: str, nodes: list[onnx.NodeProto]) -> None:
    """Every reader of ``value`` reads ``new`` instead, ``nodes`` (computing ``new`` from ``value``)
    inserted first."""
    for node in model.graph.node:
        for k, x in enumerate(node.input):
            if x == value:
                node.input[k] = new
    for n in reversed(nodes):
        model.graph.node.insert(0, n)


def mask_beyond(model: onnx.ModelProto, length: int) -> tuple[onnx.ModelProto, list[str]]:
    """The attention mask zeroed at positions ``>= length``: the prompt (``length`` tokens) is right,
    every generated token is hidden from attention."""
    model = copy.deepcopy(model)
    mask = next(iter(_inputs_named(model, "mask")))
    dtype = next(i.type.tensor_type.elem_type for i in model.graph.input if i.name == mask)
    p = "sbs_fault_mask"
    consts = [helper.make_tensor(f"{p}_zero", TensorProto.INT64, [], [0]),
              helper.make_tensor(f"{p}_one", TensorProto.INT64, [], [1]),
              helper.make_tensor(f"{p}_len", TensorProto.INT64, [], [length]),
              helper.make_tensor(f"{p}_axis", TensorProto.INT64, [1], [1])]
    model.graph.initializer.extend(consts)
    nodes = [
        helper.make_node("Shape", [mask], [f"{p}_shape"], name=f"{p}_Shape"),
        helper.make_node("Gather", [f"{p}_shape", f"{p}_one"], [f"{p}_n"], name=f"{p}_Gather", axis=0),
        helper.make_node("Range", [f"{p}_zero", f"{p}_n", f"{p}_one"], [f"{p}_pos"], name=f"{p}_Range"),
        helper.make_node("Less", [f"{p}_pos", f"{p}_len"], [f"{p}_keep_b"], name=f"{p}_Less"),
        helper.make_node("Cast", [f"{p}_keep_b"], [f"{p}_keep"], name=f"{p}_Cast", to=dtype),
        helper.make_node("Mul", [mask, f"{p}_keep"], [f"{p}_mask"], name=f"{p}_Mul"),
    ]
    _rewire(model, mask, f"{p}_mask", nodes)
    return model, [n.name for n in nodes]


def _past_length(model: onnx.ModelProto, p: str) -> tuple[list[onnx.NodeProto], str]:
    """Nodes computing the past length (dimension 2 of the first cache input) as a float scalar."""
    cache = next(i.name for i in model.graph.input if i.type.tensor_type.elem_type in _FLOATS)
    model.graph.initializer.extend([helper.make_tensor(f"{p}_two", TensorProto.INT64, [], [2])])
    return [helper.make_node("Shape", [cache], [f"{p}_shape"], name=f"{p}_Shape"),
            helper.make_node("Gather", [f"{p}_shape", f"{p}_two"], [f"{p}_past_i"], name=f"{p}_Gather", axis=0),
            helper.make_node("Cast", [f"{p}_past_i"], [f"{p}_past"], name=f"{p}_CastPast", to=TensorProto.FLOAT)], \
        f"{p}_past"


_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE)


def _cache_concats(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The Concat nodes appending a step's keys or values to a cache input (the cache update)."""
    caches = {i.name for i in model.graph.input if i.type.tensor_type.elem_type in _FLOATS}
    return [n for n in model.graph.node if n.op_type == "Concat" and n.input and n.input[0] in caches]


def cache_written_wrong(model: onnx.ModelProto, layer: int = 0) -> tuple[onnx.ModelProto, list[str]]:
    """The cache update of one layer's keys writes the new entries before the past instead of after it:
    right on the prompt (no past), wrong at every step after."""
    model = copy.deepcopy(model)
    node = _cache_concats(model)[2 * layer]
    node.input[0], node.input[1] = node.input[1], node.input[0]
    return model, [node.name]


def cache_slice_off_by_one(model: onnx.ModelProto, layer: int = 0) -> tuple[onnx.ModelProto, list[str]]:
    """One layer's past keys read shifted by one position (the first repeated, the last dropped), as an
    off-by-one slice of the cache would: no past on the prompt, wrong at every step after."""
    model = copy.deepcopy(model)
    node = _cache_concats(model)[2 * layer]
    past = node.input[0]
    p = "sbs_fault_slice"
    model.graph.initializer.extend([helper.make_tensor(f"{p}_{n}", TensorProto.INT64, [1], [v])
                                    for n, v in (("zero", 0), ("one", 1), ("last", -1), ("axis", 2))])
    nodes = [helper.make_node("Slice", [past, f"{p}_zero", f"{p}_one", f"{p}_axis"], [f"{p}_head"], name=f"{p}_Head"),
             helper.make_node("Slice", [past, f"{p}_zero", f"{p}_last", f"{p}_axis"], [f"{p}_body"],
                              name=f"{p}_Body"),
             helper.make_node("Concat", [f"{p}_head", f"{p}_body"], [f"{p}_shifted"], name=f"{p}_Concat", axis=2)]
    node.input[0] = f"{p}_shifted"
    at = list(model.graph.node).index(node)
    for n in reversed(nodes):
        model.graph.node.insert(at, n)
    return model, [node.name] + [n.name for n in nodes]


def rotary_offset_after_prompt(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The rotary angles shifted by one once there is a past (positions off after the prompt): the
    input of every Cos and Sin gets ``+ (past length > 0)``."""
    model = copy.deepcopy(model)
    p = "sbs_fault_rotary"
    past_nodes, past = _past_length(model, p)
    model.graph.initializer.extend([helper.make_tensor(f"{p}_zero", TensorProto.FLOAT, [], [0.0])])
    nodes = past_nodes + [helper.make_node("Greater", [past, f"{p}_zero"], [f"{p}_has_past"], name=f"{p}_Greater")]
    edited = [n.name for n in nodes]
    trig = [n for n in model.graph.node if n.op_type in ("Cos", "Sin")]
    if not trig:
        raise ValueError("no Cos or Sin node: the model has no rotary embedding")
    shifted: dict[str, str] = {}
    for n in trig:
        x = n.input[0]
        if x not in shifted:
            k = len(shifted)
            shifted[x] = f"{p}_{k}"
            cast = helper.make_node("CastLike", [f"{p}_has_past", x], [f"{p}_offset{k}"], name=f"{p}_CastLike{k}")
            add = helper.make_node("Add", [x, f"{p}_offset{k}"], [shifted[x]], name=f"{p}_Add{k}")
            nodes += [cast, add]
            edited += [cast.name, add.name]
        n.input[0] = shifted[x]
        edited.append(n.name)
    at = min(list(model.graph.node).index(n) for n in trig)
    for n in reversed(nodes):
        model.graph.node.insert(at, n)
    return model, edited


DECODE_FAULTS = {
    "cache written wrong": cache_written_wrong,
    "cache slice off by one": cache_slice_off_by_one,
    "rotary offset after the prompt": rotary_offset_after_prompt,
}
