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



ATTENTION_SCALE = 0.3  # not 1/sqrt(head size): the scale is the module's own constant


class Attention(torch.nn.Module):
    """Self-attention through scaled_dot_product_attention, with a boolean mask and a scale given."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        torch.manual_seed(0)
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)

    def forward(self, x, mask):
        b, s, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=ATTENTION_SCALE)
        return self.out(a.transpose(1, 2).reshape(b, s, d))


def attention_inputs():
    """(x, a causal boolean mask) for ``Attention``."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 8, 32, generator=gen)
    mask = torch.ones(8, 8, dtype=torch.bool).tril().expand(2, 1, 8, 8).contiguous()
    return x, mask
