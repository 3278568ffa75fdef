"""Inner values (issue 32): the ONNX values inside one FX node's translation (attention's ~10 nodes,
linear's Transpose and MatMul, rsqrt's Sqrt) compared with a finer torch reference in the lockstep run,
on real exports: records of kind "inner", no false alarm on correct exports (float32 and float16),
a fault shows first on the node it is in, err_local, and resets."""

from __future__ import annotations

import onnx
import pytest
import torch
from engine_models import ATTENTION_SCALE as SCALE
from engine_models import Attention, attention_inputs, export_module

import sbs_widget
from sbs_widget.samples import faults, zoo

FLOAT = {1, 10, 11, 16}


def _coverage(records, model: onnx.ModelProto) -> float:
    """Share of the graph's floating-point values (outputs of non-Constant nodes) with a compared record."""
    compared = {r.onnx_name for r in records if r.onnx_name and r.status not in ("one-sided", "error")}
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in [*inferred.graph.value_info, *inferred.graph.output]}
    values = [o for n in model.graph.node if n.op_type != "Constant" for o in n.output if types.get(o) in FLOAT]
    return sum(o in compared for o in values) / len(values)


@pytest.mark.parametrize("name,optimize", [("llama", False), ("llama", True), ("bert", False)])
def test_correct_exports_compare_their_inner_values_without_false_alarm(name, optimize):
    ep, prog, args, kwargs = zoo.export(name, optimize=optimize)
    records = list(sbs_widget.run_aligned(ep, prog.model_proto, args, kwargs))
    inner = [r for r in records if r.kind == "inner"]
    compared = [r for r in inner if r.status not in ("one-sided", "error")]
    assert compared and all(r.status == "ok" for r in compared), [r for r in compared if r.status != "ok"][:2]
    ops = {r.onnx_op_type for r in compared}
    if not optimize:  # linear: the weight's transpose, its matmul before the bias
        assert {"MatMul", "Transpose"} & ops
    if name == "llama":
        assert "Sqrt" in ops  # rsqrt's square root
        assert optimize or "Softmax" in ops  # attention's softmax
    position = {(r.kind, r.ep_name): k for k, r in enumerate(records)}
    for r in compared:
        assert r.ep_name == f"{r.inner_of}::{r.ep_name.split('::')[1]}" and r.inner_op
        owner = position.get(("node", r.inner_of), position.get(("output", r.inner_of)))
        assert owner is not None and owner > records.index(r)  # nested under its FX node, which comes after
    # the rest say why
    assert all(r.comment for r in inner if r.status == "one-sided")
    assert _coverage(records, prog.model_proto) >= 0.9


def test_float16_inner_values_are_never_false_alarms():
    ep, prog, args, kwargs = zoo.export("llama", optimize=False, dtype=torch.float16)
    records = list(sbs_widget.run_aligned(ep, prog.model_proto, args, kwargs))
    inner = [r for r in records if r.kind == "inner" and r.status not in ("one-sided", "error")]
    assert inner and all(r.status in ("ok", "noise") for r in inner), [r for r in inner if r.status == "mismatch"][:2]


@pytest.fixture(scope="module")
def attention():
    args = attention_inputs()
    ep, prog = export_module(Attention().eval(), args)
    return ep, prog.model_proto, args


def _first_beyond(records):
    return next(r for r in records if r.status == "mismatch")


def test_a_softmax_axis_fault_is_first_seen_on_the_inner_softmax(attention):
    ep, model, args = attention
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    bad = faults.set_attribute(model, softmax.name, "axis", -2)
    records = list(sbs_widget.run_aligned(ep, bad, args, node_local=True))
    first = _first_beyond(records)
    assert first.kind == "inner" and first.onnx_node_name == softmax.name, first
    assert first.inner_of and "scaled_dot_product_attention" in first.inner_of
    assert first.err_local is not None and first.err_local > 1e-3  # the node itself creates it
    # what it reads agrees: the inner values upstream of it are within tolerance
    upstream = [r for r in records[:records.index(first)] if r.kind == "inner" and r.inner_of == first.inner_of
                and r.status != "one-sided"]
    assert upstream and all(r.status == "ok" for r in upstream)


def test_a_changed_scale_is_first_seen_on_the_constant(attention):
    """The scale constant (cast, then square-rooted before multiplying q and k^T) scaled by 1.5: the first
    value beyond tolerance is that constant, compared with the scalar torch's math definition uses."""
    ep, model, args = attention
    sqrt = next(n for n in model.graph.node if n.op_type == "Sqrt")
    src = sqrt.input[0]
    producers = {o: n for n in model.graph.node for o in n.output}
    while producers[src].op_type in ("Cast", "CastLike"):
        src = producers[src].input[0]
    records = list(sbs_widget.run_aligned(ep, faults.scale_constant(model, src, 1.5), args))
    first = _first_beyond(records)
    assert first.kind == "inner" and first.onnx_name in (src, sqrt.input[0]), first
    assert f"{SCALE * 1.5:g} where torch's math definition of attention uses {SCALE:g}" in first.comment, first.comment


def test_a_reset_on_an_inner_value_feeds_the_reference_downstream(attention):
    """The softmax with the wrong axis reset to the reference's softmax: the attention's own value, and
    everything after it, agree again; the reset record keeps its error."""
    ep, model, args = attention
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    bad = faults.set_attribute(model, softmax.name, "axis", -2)
    records = list(sbs_widget.run_aligned(ep, bad, args, reset_names=[softmax.output[0]]))
    reset = next(r for r in records if r.onnx_name == softmax.output[0])
    assert reset.status == "reset" and reset.err_abs > 1e-3
    assert not [r for r in records if r.status == "mismatch"], [r for r in records if r.status == "mismatch"][:1]


def test_the_inner_values_of_a_linear_include_its_transposed_weight(attention):
    """linear's weight, stored as written and transposed by an ONNX Transpose: that value is compared
    with the parameter transposed; noise on the weight shows on it first (the weight record too)."""
    ep, model, args = attention
    transpose = next(n for n in model.graph.node if n.op_type == "Transpose"
                     and n.input[0] in {i.name for i in model.graph.initializer})
    bad = faults.perturb_initializer(model, transpose.input[0], scale=1e-2)
    records = list(sbs_widget.run_aligned(ep, bad, args))
    record = next(r for r in records if r.onnx_name == transpose.output[0])
    assert record.kind == "inner" and record.status == "mismatch" and record.inner_op.startswith("aten.t")
    clean = next(r for r in sbs_widget.run_aligned(ep, model, args) if r.onnx_name == transpose.output[0])
    assert clean.status == "ok" and clean.err_abs == 0


def test_the_inputs_of_a_fused_attention_are_compared_in_the_layout_it_reads():
    """LLaMA rewritten for onnxruntime (MultiHeadAttention): the Transposes and Reshapes feeding the fused
    node are compared with torch's q, k, v in the (batch, sequence, heads x size) layout the op reads;
    a wrong permutation there is a mismatch on the Reshape after it."""
    ep, prog, args, kwargs = zoo.export("llama", optimize=True)
    fused = zoo.fused_for_ort(prog.model_proto)
    mha = next(n for n in fused.graph.node if n.op_type == "MultiHeadAttention")
    producers = {o: n for n in fused.graph.node for o in n.output}
    feeding = [producers[x] for x in mha.input[:3] if x in producers]
    assert feeding and all(n.op_type == "Reshape" for n in feeding)
    records = {r.onnx_name: r for r in sbs_widget.run_aligned(ep, fused, args, kwargs)}
    for reshape in feeding:
        transpose = producers[reshape.input[0]]
        for value in (transpose.output[0], reshape.output[0]):
            r = records[value]
            assert r.kind == "inner" and r.status == "ok" and "MultiHeadAttention reads" in r.comment, r
    reshape = feeding[0]
    transpose = producers[reshape.input[0]]
    bad = faults.set_attribute(fused, transpose.name, "perm", [0, 1, 2, 3])
    records = {r.onnx_name: r for r in sbs_widget.run_aligned(ep, bad, args, kwargs)}
    assert records[reshape.output[0]].status == "mismatch", records[reshape.output[0]]


def test_gpt2_fused_for_onnxruntime_compares_what_the_rewrite_merged_and_split():
    """GPT-2 rewritten for onnxruntime: the MatMul of each Conv1D now sits in the translation of the view
    after its addmm (the reference spans addmm and view), and the packed query-key-value is split anew by
    a Split without metadata (its pieces paired with the program's own split): all compared, all ok."""
    ep, prog, args, kwargs = zoo.export("gpt2", optimize=True)
    fused = zoo.fused_for_ort(prog.model_proto)
    records = list(sbs_widget.run_aligned(ep, fused, args, kwargs))
    by_value = {r.onnx_name: r for r in records}
    split = next(n for n in fused.graph.node if n.op_type == "Split")
    pieces = [by_value[o] for o in split.output]
    assert all(r.kind == "inner" and r.status == "ok" and "split" in r.inner_op for r in pieces), pieces
    matmuls = [r for r in records if r.kind == "inner" and r.onnx_op_type == "MatMul"]
    assert matmuls and all(r.status == "ok" and r.inner_op == "aten.mm.default" for r in matmuls)
    assert _coverage(records, fused) >= 0.9
