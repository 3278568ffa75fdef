"""Culprits inside a translation (issue 32) on real exports: attention's ~10 ONNX nodes and a float16
softmax's Cast, Softmax, Cast. One fault each; the culprit must name the exact ONNX node (or constant,
or initializer) and say what differs there."""

from __future__ import annotations

import pytest
import torch
from engine_models import ATTENTION_SCALE as SCALE
from engine_models import Attention, attention_inputs, export_module

import sbs_widget
from sbs_widget.samples import faults


@pytest.fixture(scope="module")
def attention():
    """(ep, ONNX model unoptimized, ONNX model optimized, args)."""
    args = attention_inputs()
    model = Attention().eval()
    ep, prog = export_module(model, args)
    _, opt = export_module(model, args, optimize=True)
    return ep, prog.model_proto, opt.model_proto, args


def _one(model, op_type: str, reads=None):
    nodes = [n for n in model.graph.node if n.op_type == op_type and (reads is None or reads(n))]
    assert len(nodes) == 1, [n.name for n in nodes]
    return nodes[0]


def _producer(model, value: str):
    return next((n for n in model.graph.node if value in n.output), None)


def test_correct_attention_exports_give_no_culprit(attention):
    ep, model, opt, args = attention
    assert sbs_widget.culprits(ep, model, args) == []
    assert sbs_widget.culprits(ep, opt, args) == []


def test_a_changed_scale_constant_is_named_with_the_scale_torch_uses(attention):
    """The scale (a Constant, cast and square-rooted before multiplying q and k^T) scaled by 1.5: the
    culprit is the Constant, and the reason gives both scales."""
    ep, model, _, args = attention
    sqrt = [n for n in model.graph.node if n.op_type == "Sqrt"]
    assert sqrt
    src = sqrt[0].input[0]
    while _producer(model, src) is not None and _producer(model, src).op_type in ("CastLike", "Cast"):
        src = _producer(model, src).input[0]
    const = _producer(model, src)
    assert const.op_type == "Constant"
    found = sbs_widget.culprits(ep, faults.scale_constant(model, src, 1.5), args)
    assert found and found[0].onnx_node == const.name and found[0].onnx_name == src, found[:1]
    assert f"{SCALE * 1.5:g} where torch's math definition of attention uses {SCALE:g}" in found[0].reason


def test_a_changed_folded_scale_is_named_on_the_optimized_export(attention):
    """Optimized, sqrt(scale) is one initializer read by both Muls: the culprit is that initializer."""
    ep, _, opt, args = attention
    inits = {i.name for i in opt.graph.initializer}
    muls = [n for n in opt.graph.node if n.op_type == "Mul" and any(x in inits for x in n.input)]
    scale = next(x for n in muls for x in n.input if x in inits and not [i for i in opt.graph.initializer
                                                                          if i.name == x][0].dims)
    found = sbs_widget.culprits(ep, faults.scale_constant(opt, scale, 1.5), args)
    assert found and found[0].onnx_name == scale and found[0].onnx_op_type == "initializer", found[:1]
    assert f"where torch's math definition of attention uses {SCALE ** 0.5:.6g}" in found[0].reason


def test_a_softmax_axis_inside_attention_is_named(attention):
    ep, model, _, args = attention
    softmax = _one(model, "Softmax")
    found = sbs_widget.culprits(ep, faults.set_attribute(model, softmax.name, "axis", -2), args)
    assert found and found[0].onnx_node == softmax.name, found[:1]
    assert "Softmax over axis -2 where the reference normalizes axis -1" in found[0].reason
    assert "scaled_dot_product_attention" in found[0].reason


@pytest.mark.parametrize("optimize", [False, True])
def test_add_turned_sub_in_the_mask_is_named(attention, optimize):
    """The Add of the mask to q.k^T turned into a Sub: the Sub is named, with the op torch computes."""
    ep, model, opt, args = attention
    m = opt if optimize else model
    where = {n.output[0] for n in m.graph.node if n.op_type == "Where"}
    add = _one(m, "Add", lambda n: any(x in where for x in n.input))
    found = sbs_widget.culprits(ep, faults.replace_op(m, add.name, "Sub"), args)
    assert found and found[0].onnx_node == add.name and found[0].onnx_op_type == "Sub", found[:1]
    assert "the reference computes 'add' there" in found[0].reason


def test_a_scaling_mul_turned_div_is_named_not_the_other(attention):
    """q and k^T are each multiplied by sqrt(scale): the one turned into Div is named."""
    ep, model, _, args = attention
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul"
                  and all(getattr(_producer(model, x), "op_type", "") == "Mul" for x in n.input))
    for mul_value in matmul.input:
        mul = _producer(model, mul_value)
        found = sbs_widget.culprits(ep, faults.replace_op(model, mul.name, "Div"), args)
        assert found and found[0].onnx_node == mul.name and found[0].onnx_op_type == "Div", found[:1]


def test_pairing_does_not_read_names(attention):
    """Every ONNX node renamed (the order of their names reversed): the same node is found."""
    ep, model, _, args = attention
    softmax = _one(model, "Softmax")
    bad = faults.set_attribute(model, softmax.name, "axis", -2)
    names = [n.name for n in bad.graph.node]
    for n, name in zip(bad.graph.node, reversed(names)):
        n.name = f"renamed_{name}"
    found = sbs_widget.culprits(ep, bad, args)
    renamed = next(n.name for n in bad.graph.node if n.op_type == "Softmax")
    assert found and found[0].onnx_node == renamed, found[:1]


class HalfSoftmax(torch.nn.Module):
    """A float16 program whose softmax is asked in float32 (as LLaMA's eager attention does): the
    exporter computes the Softmax in float16 and casts it to float32, the compared value."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(16, 16))

    def forward(self, x):
        return torch.softmax(x @ self.w, dim=-1, dtype=torch.float32).to(torch.float16) @ self.w


def test_a_float16_softmax_axis_is_named_not_the_cast_after_it():
    model = HalfSoftmax().half().eval()
    x = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(2)).half()
    ep, prog = export_module(model, (x,))
    onx = prog.model_proto
    softmax = _one(onx, "Softmax")
    assert [n.op_type for n in onx.graph.node if softmax.output[0] in n.input] == ["Cast"]
    assert sbs_widget.culprits(ep, onx, (x,)) == []
    found = sbs_widget.culprits(ep, faults.set_attribute(onx, softmax.name, "axis", 1), (x,))
    assert found and found[0].onnx_node == softmax.name, found[:1]
    assert "Softmax over axis 1 where the reference normalizes axis" in found[0].reason


def test_a_row_masked_everywhere_is_explained_at_the_softmax():
    """torch 2.13's exporter fills a boolean mask with the lowest float, not -inf: a query row whose keys
    are all masked gets a finite softmax (the mean of the values) where torch's gives NaN, set to 0.
    The culprit is that Softmax, the reason says where the reference has NaN, and the compared value's
    place stays at the end."""
    class Masked(torch.nn.Module):
        def forward(self, q, k, v, mask):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 1, 3, 4) for _ in range(3))
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool).tril()
    mask[0, 0, 0] = False
    ep, prog = export_module(Masked(), (q, k, v, mask))
    found = sbs_widget.culprits(ep, prog.model_proto, (q, k, v, mask))
    if not found:
        pytest.skip("this exporter matches torch on fully masked rows")
    softmax = _one(prog.model_proto, "Softmax")
    assert found[0].onnx_node == softmax.name
    assert "finite at 3 of 18 elements where torch's math definition of attention" in found[0].reason
    assert "gives NaN (a row masked everywhere)" in found[0].reason
    assert found[0].reason.endswith("beyond tolerance at [0, :, 0, :] (4 of 24)")


def test_attention_of_one_value_with_itself():
    """scaled_dot_product_attention(x, x, x): one FX value is q, k and v. The reference reads it through
    one input; a wrong Softmax axis is still found, and a correct export gives no culprit."""
    class SelfAttention(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.scaled_dot_product_attention(x, x, x, scale=SCALE)

    x = torch.randn(2, 2, 6, 8, generator=torch.Generator().manual_seed(3))
    ep, prog = export_module(SelfAttention(), (x,))
    model = prog.model_proto
    assert sbs_widget.culprits(ep, model, (x,)) == []
    softmax = _one(model, "Softmax")
    found = sbs_widget.culprits(ep, faults.set_attribute(model, softmax.name, "axis", -2), (x,))
    assert found and found[0].onnx_node == softmax.name, found[:1]
    mul = [n for n in model.graph.node if n.op_type == "Mul"][-1]
    found = sbs_widget.culprits(ep, faults.replace_op(model, mul.name, "Div"), (x,))
    assert found and found[0].onnx_node == mul.name, found[:1]
