"""From a model to both sides of a comparison: ``torch.export.export``, then ``torch.onnx.export`` of
that program, each failure named by its stage.

The ``ONNXProgram`` is kept: its ``exported_program`` is the program the exporter translated (the
user's, decomposed), so the comparison never decomposes it again; the user's own program is kept too,
so that every node the user wrote can be accounted for.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from typing import Callable

import torch

from sbs_widget.errors import ExportError, InputError

STAGES = ("torch.export.export: capturing the model as an FX program",
          "torch.onnx.export: translating the program to ONNX")


@dataclass
class Exported:
    """Both programs of a model: the user's ExportedProgram and the exporter's ONNXProgram (which holds
    the decomposed program and the ONNX model). Accepted wherever an ``ONNXProgram`` is."""

    user_ep: torch.export.ExportedProgram
    onnx_program: object  # torch.onnx.ONNXProgram

    @property
    def exported_program(self) -> torch.export.ExportedProgram:
        return self.onnx_program.exported_program

    @property
    def model_proto(self):
        return self.onnx_program.model_proto


def export_module(model: torch.nn.Module, args=(), kwargs: dict | None = None, *, dynamic_shapes=None,
                  optimize: bool = True, strict: bool = False, opset_version: int | None = None,
                  report: Callable[[int, str], None] | None = None) -> Exported:
    """Export ``model`` on ``args``/``kwargs`` with ``torch.export.export`` and then ``torch.onnx.export``
    (``dynamo=True``, ``optimize`` as given). ``report(stage, text)`` is called as each stage starts
    (0, then 1). An export that fails raises ``ExportError`` naming the stage, the original error
    chained; what the exporter printed is kept in its message's tail."""
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"from_module needs a torch.nn.Module, got {type(model).__name__}; for an "
                         "ExportedProgram and an ONNX model, pass them as (ep, onx)")
    args = args if isinstance(args, tuple) else (tuple(args) if isinstance(args, list) else (args,))
    report = report or (lambda stage, text: None)
    report(0, STAGES[0])
    try:
        user_ep = torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    except Exception as e:
        raise ExportError(_failed(0, e, "", "make the model exportable (torch.export's message above says "
                                            "where), or export it yourself and pass (ep, onx)"), stage=0) from e
    report(1, STAGES[1])
    printed = io.StringIO()
    try:
        options = {} if opset_version is None else {"opset_version": opset_version}
        with contextlib.redirect_stdout(printed):  # the exporter's progress lines: the widget shows its own
            onnx_program = torch.onnx.export(user_ep, args, kwargs=kwargs, dynamo=True, optimize=optimize,
                                             **options)
    except Exception as e:
        raise ExportError(_failed(1, e, printed.getvalue(), "the program was captured; an op the exporter cannot "
                                                            "translate is usually named above: see "
                                                            "torch.onnx's report, or export with another opset"),
                          stage=1) from e
    if onnx_program is None:
        raise ExportError(_failed(1, RuntimeError("torch.onnx.export returned None"), printed.getvalue(),
                                  "export it yourself and pass (ep, onx)"), stage=1)
    return Exported(user_ep, onnx_program)


def _failed(stage: int, error: Exception, printed: str, what_to_do: str) -> str:
    message = str(error).strip() or type(error).__name__
    if len(message) > 2000:
        message = message[:2000] + " [...]"
    tail = "\n".join(printed.strip().splitlines()[-5:])
    out = f"export failed at stage {stage + 1} of 2 ({STAGES[stage]}): {type(error).__name__}: {message}"
    if tail:
        out += f"\nthe exporter printed, last lines:\n{tail}"
    return out + f"\nwhat to do: {what_to_do}"
