"""The bundled example: ``dummy_llm`` exported on the fly, with an optional fault in the ONNX model.

Used by ``python -m sbs_widget demo``, the notebooks and the README.
"""

from __future__ import annotations

import contextlib
import io
import warnings

import torch

from sbs_widget.samples import faults
from sbs_widget.samples.dummy_llm import dummy_llm


def export_dummy_llm(optimize: bool = False):
    """``(ep, onnx_program, inputs)`` for ``dummy_llm``."""
    model, inputs = dummy_llm()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, inputs)
        prog = torch.onnx.export(ep, inputs, dynamo=True, optimize=optimize)
    return ep, prog, inputs


def demo_pair(fault: bool = True, optimize: bool = False):
    """``(ep, onnx_model, inputs, fault_description)``: the second residual Add of the decoder becomes
    a Sub in the ONNX model, a real discrepancy that starts in module ``decoder``."""
    ep, prog, inputs = export_dummy_llm(optimize)
    model = prog.model_proto
    if not fault:
        return ep, model, inputs, None
    adds = [n for n in model.graph.node if n.op_type == "Add" and any(
        p.key == "pkg.torch.onnx.name_scopes" and p.value.startswith("['', 'decoder', 'add")
        for p in n.metadata_props)]
    target = adds[0]
    bad = faults.replace_op(model, target.name, "Sub")
    return ep, bad, inputs, f"ONNX node {target.name!r} (Add -> Sub), value {target.output[0]!r}"
