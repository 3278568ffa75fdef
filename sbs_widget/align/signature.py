"""What can tell, before decomposing the program (seconds to minutes on a big model), that an ONNX model
was not exported from it: how many inputs and outputs each has, and, input by input, the element type,
the rank and the fixed dimensions. The exporter keeps all of them: the user's tensor inputs become the
graph inputs in the same order, with the same dtype and rank, and a static dimension stays fixed.
Every check here would fail later anyway (when the run feeds the inputs, or compares the outputs):
made early, it costs nothing and says what differs.
"""

from __future__ import annotations

import onnx
import torch

from sbs_widget.align.fx_graph import program_outputs
from sbs_widget.align.pairs import is_scalar
from sbs_widget.dtypes import onnx_elem_type
from sbs_widget.errors import ModelMismatchError

_FIX = ("the ONNX model was not exported from this program: export it from this one "
        "(torch.onnx.export(ep, ..., dynamo=True))")


def user_inputs(program: torch.export.ExportedProgram) -> list[torch.fx.Node]:
    """The placeholders the ONNX model has as graph inputs, in order (as ``align`` pairs them): the
    user's tensor and scalar inputs; constants (``use_cache=False``) are baked into the graph."""
    order = list(program.graph_signature.user_inputs)
    nodes = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in order]
    nodes.sort(key=lambda n: order.index(n.name))
    return [n for n in nodes if isinstance(n.meta.get("val"), torch.Tensor) or is_scalar(n.meta.get("val"))]


def _fixed(d) -> int | None:
    return d if type(d) is int else None


def check_signature(program: torch.export.ExportedProgram, model: onnx.ModelProto, inputs: list[str],
                    outputs: list[str]) -> None:
    """Raise ``ModelMismatchError`` when ``model`` (graph inputs ``inputs``, initializers left out, and
    ``outputs``) cannot have been exported from ``program``."""
    placeholders = user_inputs(program)
    if len(inputs) != len(placeholders):
        names = [n.name for n in placeholders]
        raise ModelMismatchError(
            f"the ONNX model has {len(inputs)} inputs {inputs[:8]} but the program {len(names)} tensor inputs "
            f"{names[:8]}: {_FIX}")
    fx_out = program_outputs(program)
    if len(fx_out) != len(outputs):
        raise ModelMismatchError(
            f"the ExportedProgram has {len(fx_out)} outputs and the ONNX model {len(outputs)} ({outputs[:5]}): "
            f"{_FIX}")
    declared = {i.name: i.type for i in model.graph.input}
    for node, name in zip(placeholders, inputs):
        val = node.meta.get("val")
        vt = declared.get(name)
        if not isinstance(val, torch.Tensor) or vt is None or not vt.HasField("tensor_type"):
            continue
        tt = vt.tensor_type
        elem = onnx_elem_type(val.dtype)
        if tt.elem_type and elem is not None and not val.dtype.is_complex and tt.elem_type != elem:
            raise ModelMismatchError(
                f"the ONNX model's input {name!r} is {onnx.TensorProto.DataType.Name(tt.elem_type)} and the "
                f"program's input {node.name!r} {val.dtype}: {_FIX}")
        if not tt.HasField("shape") or val.dtype.is_complex:  # (complex: the exporter adds a dimension)
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        shape = [_fixed(d) for d in val.shape]
        if len(dims) != len(shape) or any(a is not None and b is not None and a != b for a, b in zip(dims, shape)):
            onnx_shape = tuple(d if d is not None else "?" for d in dims)
            fx_shape = tuple(d if d is not None else "?" for d in shape)
            fixed = "fixed shape" if any(d is not None for d in dims) else "shape"
            raise ModelMismatchError(
                f"the ONNX model's input {name!r} has the {fixed} {onnx_shape}, and the program's input "
                f"{node.name!r} the shape {fx_shape}: the two files were exported at different shapes, or from "
                "different models; export the ONNX model from this program with the same example inputs, or "
                "both with dynamic shapes")
