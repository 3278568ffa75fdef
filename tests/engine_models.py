"""Small models and exports shared by the engine tests (real torch.export and ONNX exports)."""

from __future__ import annotations

import contextlib
import functools
import io
import warnings

import torch

from sbs_widget.samples import zoo


@functools.lru_cache(maxsize=None)
def exported(name: str, optimize: bool):
    """(user ExportedProgram, ONNXProgram, args, kwargs), cached for the test session."""
    with contextlib.redirect_stderr(io.StringIO()):
        return zoo.export(name, optimize=optimize)


def export_module(model: torch.nn.Module, args: tuple, kwargs: dict | None = None, *, optimize: bool = False,
                  **export_kw):
    """Export any module: (ep, onnx_program)."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, args, kwargs=kwargs or {}, **export_kw)
        prog = torch.onnx.export(ep, args, kwargs=kwargs or {}, dynamo=True, optimize=optimize)
    return ep, prog


def node_named(model, op_type: str, index: int = -1, *, contains: str = ""):
    """Name of the ``index``-th node of ``op_type`` (whose name contains ``contains``)."""
    nodes = [n for n in model.graph.node if n.op_type == op_type and contains in n.name]
    return nodes[index]

