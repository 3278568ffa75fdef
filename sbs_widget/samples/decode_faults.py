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
