"""Pairs saved as files for the gate, report and assertion tests: a clean export, faulty ones, a
rounding-only one (``loud_convnet``: its correct export differs from torch by rounding beyond the
float32 default tolerance)."""

from __future__ import annotations

import functools
import os
import warnings

import onnx
import torch
from engine_models import exported

from sbs_widget.samples import faults


def fault_models(model: onnx.ModelProto) -> dict:
    """Three real faults planted in the dummy_llm export: {name: (faulty model, ONNX node to blame)}."""
    nodes = list(model.graph.node)
    add = [n for n in nodes if n.op_type == "Add"][-2]
    norm = [n for n in nodes if n.op_type == "LayerNormalization"][-1]
    gelu = [n for n in nodes if n.op_type == "Gelu"]
    out = {
        "op": (faults.replace_op(model, add.name, "Sub"), add.name),
        "attribute": (faults.set_attribute(model, norm.name, "epsilon", 0.5), norm.name),
    }
    if gelu:
        out["gelu"] = (faults.swap_gelu_approximation(model, gelu[0].name), gelu[0].name)
    else:  # pragma: no cover - the exporter writes Gelu for dummy_llm at opset 20
        mm = [n for n in nodes if n.op_type == "MatMul"][-1]
        out["matmul"] = (faults.replace_op(model, mm.name, "Add"), mm.name)
    return out


def save_pair(folder: str, ep, model: onnx.ModelProto, args, kwargs=None, *, onnx_name: str = "model.onnx") -> dict:
    """ep, onnx and inputs written into ``folder``: {"ep": path, "onnx": path, "inputs": path}."""
    os.makedirs(folder, exist_ok=True)
    paths = {"ep": os.path.join(folder, "program.pt2"), "onnx": os.path.join(folder, onnx_name),
             "inputs": os.path.join(folder, "inputs.pt")}
    if not os.path.exists(paths["ep"]):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.export.save(ep, paths["ep"])
        torch.save((tuple(args), dict(kwargs or {})) if kwargs else tuple(args), paths["inputs"])
    onnx.save(model, paths["onnx"])
    return paths


@functools.lru_cache(maxsize=None)
def loud():
    """(decomposed ep, ONNX model, args) of loud_convnet: rounding beyond tolerance, nothing else."""
    ep, prog, args, _ = exported("loud_convnet", True)
    return prog.exported_program, prog.model_proto, args
