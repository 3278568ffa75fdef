"""The lockstep engine on real exports: alignment, records, options."""

from __future__ import annotations

import onnx
import pytest
import torch
from engine_models import export_module, exported, node_named

import sbs_widget
from sbs_widget.engine.entry import prepare
from sbs_widget.engine.summary import summarize
from sbs_widget.samples import faults, zoo
from sbs_widget.samples.zoo import fused_for_ort


@pytest.mark.parametrize("optimize", [False, True])
def test_correct_export_has_no_false_alarm(optimize):
    ep, prog, args, kwargs = exported("dummy_llm", optimize)
    records = list(sbs_widget.run_aligned(ep, prog.model_proto, args, kwargs))
    s = summarize(records, prepare(ep, prog.model_proto))
    assert s.by_status.get("mismatch", 0) == 0
    assert s.by_status.get("error", 0) == 0
    assert s.n_compared > 30
    assert s.coverage >= (0.95 if not optimize else 0.8)
    # every FX value that still exists in the ONNX graph is compared; the others say why they do not
    assert s.coverage_of_present == 1.0, s.uncovered
    kinds = {r.kind for r in records}
    assert kinds == {"input", "weight", "node", "output", "inner"}
    out = [r for r in records if r.kind == "output"]
    assert len(out) == 1 and out[0].status == "ok" and out[0].err_abs < 1e-4


@pytest.mark.parametrize("optimize", [False, True])
def test_programs_that_mutate_a_buffer_and_an_input(optimize):
    """torch.export returns the new values of mutated buffers and inputs as extra outputs, the ONNX
    exporter drops them (static KV caches, BatchNorm statistics): the user outputs still pair up, and
    comparing mutates neither the model's buffer nor the caller's tensor."""
    class Mutating(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("seen", torch.zeros(4))
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, cache):
            self.seen.add_(x.mean(0))
            cache.mul_(0.5)
            return self.lin(x) + self.seen, cache.sum()

    torch.manual_seed(0)
    x, cache = torch.randn(3, 4), torch.ones(2)
    ep, prog = export_module(Mutating(), (x, cache), optimize=optimize)
    records = list(sbs_widget.run_aligned(ep, prog.model_proto, (x, cache)))
    outputs = [r for r in records if r.kind == "output"]
    assert [r.status for r in outputs] == ["ok", "ok"]
    assert outputs[1].err_abs == 0
    assert {r.status for r in records} <= {"ok", "one-sided"}
    assert torch.equal(cache, torch.ones(2)) and torch.equal(ep.state_dict["seen"], torch.zeros(4))


def test_items_of_tuple_valued_nodes_pair_through_their_metadata():
    """Batch norm decomposes to a tuple-valued node and getitem; the ONNX metadata names the tuple's
    node. Two of them feeding one Add (a residual block's main path and shortcut) are still paired."""
    class Residual(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Conv2d(3, 4, 1)
            self.na, self.nb = torch.nn.BatchNorm2d(4), torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return torch.relu(self.na(self.a(x)) + self.nb(self.b(x)))

    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    ep, prog = export_module(Residual().eval(), (x,))
    p = prepare(ep, prog.model_proto)
    records = list(p.run((x,), {}))
    s = summarize(records, p)
    assert s.coverage == 1.0, s.uncovered
    assert s.by_status.get("mismatch", 0) == 0


@pytest.mark.parametrize("cell", [torch.nn.LSTM, torch.nn.GRU])
def test_recurrent_layers_with_unused_final_states(cell):
    """An LSTM/GRU's final states, when nothing reads them, are dead values: the exporter writes no
    ONNX node for them. Their records say so, and coverage (which counts only values some output
    depends on) is full: it used to leave them out only when the program needed decomposing. The
    layer's translation (~130 ONNX nodes slicing the weights per gate, then the LSTM/GRU nodes) runs
    node-local as one group: longer than other groups may be, since it is one FX node's."""
    torch.manual_seed(0)
    x = torch.randn(2, 10, 16)
    ep, prog = export_module(zoo.Tagger(cell).eval(), (x,))
    p = prepare(ep, prog.model_proto)
    records = list(p.run((x,), {}, node_local=True))
    states = next(r for r in records if r.ep_name == "getitem")
    assert states.status == "ok" and states.err_local is not None and states.err_local < 1e-5
    s = summarize(records, p)
    assert s.by_status.get("mismatch", 0) == 0 and s.by_status.get("error", 0) == 0
    assert s.coverage == 1.0, s.uncovered
    dead = [r for r in records if r.kind == "node" and r.status == "one-sided" and r.ep_name]
    assert dead and all("no output depends on it" in r.comment for r in dead), [(r.ep_name, r.comment) for r in dead]
    assert next(r for r in records if r.kind == "output").status == "ok"


def test_a_constant_folded_from_other_values_is_not_the_twin_of_a_vanished_value():
    """Falcon, optimized: the optimizer drops the key's last reshape, and folds the causal mask into
    an initializer of the same shape (multi-query attention: one key head) that the same attention
    reads. The mask was folded from other values (its ``folded_from`` says which): it is not the
    key's twin. It used to be paired with it, and a correct export showed 3.4e38 beyond tolerance."""
    ep, prog, args, kwargs = exported("falcon", True)
    p = prepare(ep, prog.model_proto)
    records = list(p.run(args, kwargs))
    s = summarize(records, p)
    assert s.by_status.get("mismatch", 0) == 0 and s.by_status.get("error", 0) == 0
    assert s.worst.err_abs < 1e-4
    for fx_name, pair in p.alignment.pairs.items():
        sources = p.index.folded_from(pair.onnx_value)
        if pair.onnx_value in p.index.initializers and sources and pair.how != "weight":
            node = p.fx_nodes[p.fx_position[fx_name]]
            assert {fx_name, *(x.name for x in node.all_input_nodes)} & set(sources) or \
                pair.onnx_value == fx_name, (fx_name, pair)


def test_a_value_computed_for_another_layer_is_not_the_twin_of_a_vanished_value():
    """Falcon with dynamic shapes, optimized: the causal mask is no longer folded but computed once,
    inside the first attention's translation, and read by the second attention too, where the key's
    last reshape vanished. The mask comes from a node this key does not derive from without passing
    through compared values: it is not the key's twin (it was: 3.4e38 beyond tolerance at the
    export's shape, and a shape error at another)."""
    model, args, _ = zoo.BUILDERS["falcon"]()
    zoo.trained_like(model)
    dims = ({0: torch.export.Dim("batch", max=8), 1: torch.export.Dim("seq", max=32)},)
    ep, prog = export_module(model, args, optimize=True, dynamic_shapes=dims)
    p = prepare(ep, prog.model_proto)
    for inputs in (args, (torch.randint(0, 1000, (3, 9)),)):
        s = summarize(list(p.run(inputs, {})), p)
        assert s.by_status.get("mismatch", 0) == 0 and s.by_status.get("error", 0) == 0, s.first_beyond


def test_dynamic_shapes_run_on_other_shapes_with_every_present_value_compared():
    """LLaMA exported with dynamic batch and sequence, run on shapes other than the export's: no
    false alarm, and every FX value the ONNX graph still has is compared (with dynamic shapes the
    optimizer folds less, and merges the position ``unsqueeze`` chains: compared reshaped)."""
    model, args, kwargs = zoo.BUILDERS["llama"]()
    zoo.trained_like(model)
    dims = {"input_ids": {0: torch.export.Dim("batch", max=8), 1: torch.export.Dim("seq", max=64)}}
    dims["attention_mask"] = dims["input_ids"]
    ep, prog = export_module(model, args, kwargs, optimize=True, dynamic_shapes=dims)
    p = prepare(ep, prog.model_proto)
    for b, n in ((2, 16), (3, 9), (1, 33)):
        inputs = (torch.randint(0, 1000, (b, n)),), {"attention_mask": torch.ones(b, n, dtype=torch.int64)}
        records = list(p.run(*inputs))
        s = summarize(records, p)
        assert s.by_status.get("mismatch", 0) == 0 and s.by_status.get("error", 0) == 0, s.first_beyond
        assert s.coverage_of_present == 1.0, s.uncovered
    assert any("reshaped" in r.comment and r.status == "ok" for r in records)


def test_a_cast_to_the_same_type_removed_by_the_optimizer_is_compared_through_its_input():
    """``type_as`` / ``to`` to the dtype a value already has stay in the program the exporter
    translates; the optimizer drops the Cast: the value is its input's, compared through that twin."""
    class Norm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            h = self.lin(x)
            return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) + 1

    x = torch.randn(2, 8)
    ep, prog = export_module(Norm(), (x,), optimize=True)
    p = prepare(ep, prog.model_proto)
    records = list(p.run((x,), {}))
    cast = next(r for r in records if r.ep_name == "type_as")
    assert cast.status == "ok" and "no-op removed" in cast.comment
    assert summarize(records, p).coverage == 1.0


def test_arithmetic_with_a_neutral_number_removed_by_the_optimizer_is_compared_through_its_operand():
    """``x + 0`` (RoBERTa's position offset, which decomposition turns into ``x + scalar_tensor(0)``)
    and ``x * 1.0`` (BART's embedding scale when it is 1): the optimizer drops them; their value is
    the other operand's, compared through its twin."""
    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(20, 8)

        def forward(self, ids):
            mask = ids.ne(1).int()
            pos = (torch.cumsum(mask, dim=1).type_as(mask) + 0) * mask
            return self.emb(pos.long() + 1) * 1.0

    ids = torch.randint(0, 10, (2, 6))
    ep, prog = export_module(Positions(), (ids,), optimize=True)
    p = prepare(ep, prog.model_proto)
    records = list(p.run((ids,), {}))
    by_fx = {r.ep_name: r for r in records if r.kind == "node"}
    for name, operand in (("add", "type_as"), ("mul_1", "embedding")):
        assert by_fx[name].status == "ok" and "no-op removed" in by_fx[name].comment, by_fx[name]
        assert by_fx[name].onnx_name == by_fx[operand].onnx_name
    assert by_fx["add_1"].comment == ""  # + 1 is not neutral: its own twin
    assert summarize(records, p).coverage == 1.0


def test_a_constant_the_optimizer_merged_with_an_equal_one_is_compared_with_the_kept_initializer():
    """Each layer computes the same constant (DeBERTa's attention scale, sqrt of a tensor made in
    forward): the optimizer folds each and keeps one initializer for both. The second layer's value
    is compared with it (a wrong merge would show), and the nodes computing it are constant-folded."""
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))

        def forward(self, x):
            for lin in self.layers:
                x = lin(x) / torch.sqrt(torch.tensor(16.0) * 1)
            return x

    x = torch.randn(2, 8)
    ep, prog = export_module(Scaled(), (x,), optimize=True)
    assert [i.name for i in prog.model_proto.graph.initializer if not i.name.startswith("layers")] == ["sqrt"]
    p = prepare(ep, prog.model_proto)
    records = list(p.run((x,), {}))
    by_fx = {r.ep_name: r for r in records if r.kind == "node"}
    assert by_fx["sqrt_1"].onnx_name == "sqrt" and by_fx["sqrt_1"].status == "ok"
    assert "FX node 'sqrt'" in by_fx["sqrt_1"].comment
    for name in ("lift_fresh_copy_1", "detach__1", "mul_1"):
        assert by_fx[name].status == "one-sided" and "constant-folded" in by_fx[name].comment, by_fx[name]
    s = summarize(records, p)
    assert s.coverage_of_present == 1.0, s.uncovered
    # the pair is measured: a different kept constant is a mismatch on both layers' values
    bad = onnx.ModelProto()
    bad.CopyFrom(prog.model_proto)
    init = next(i for i in bad.graph.initializer if i.name == "sqrt")
    init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init) * 2, "sqrt"))
    by_fx = {r.ep_name: r for r in prepare(ep, bad).run((x,), {}) if r.kind == "node"}
    assert by_fx["sqrt"].status == by_fx["sqrt_1"].status == "mismatch"


def test_duplicates_merged_by_the_optimizer_are_compared_with_the_kept_twin():
    """The same op on the same inputs twice (rotary cos/sin unsqueezed once per layer in LLaMA): the
    optimizer keeps one ONNX value, the twin of both FX nodes, whether computed or constant-folded."""
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("freq", torch.arange(8.0))
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            h = self.lin(x)
            a, b = torch.sin(h).unsqueeze(1), torch.sin(h).unsqueeze(1)
            c, d = self.freq.cos().unsqueeze(0), self.freq.cos().unsqueeze(0)
            return a * 2 + c, b * x.unsqueeze(1) + d

    x = torch.randn(2, 8)
    ep, prog = export_module(Twice(), (x,), optimize=True)
    assert sum(n.op_type == "Sin" for n in prog.model_proto.graph.node) == 1  # merged
    p = prepare(ep, prog.model_proto)
    by_fx = {r.ep_name: r for r in p.run((x,), {}) if r.kind == "node"}
    # computed twin: the second sin and its unsqueeze are compared with the kept ONNX values
    assert by_fx["sin_1"].onnx_name == by_fx["sin"].onnx_name == "sin"
    assert by_fx["sin_1"].status == "ok" and "FX node 'sin'" in by_fx["sin_1"].comment
    assert by_fx["unsqueeze_1"].onnx_name == by_fx["unsqueeze"].onnx_name
    # constant-folded twin: the second unsqueeze of the buffer is compared with the same initializer
    folded = by_fx["unsqueeze_2"].onnx_name
    assert folded in {i.name for i in prog.model_proto.graph.initializer}
    assert by_fx["unsqueeze_3"].onnx_name == folded and by_fx["unsqueeze_3"].status == "ok"
    assert by_fx["unsqueeze_3"].err_abs == by_fx["unsqueeze_2"].err_abs < 1e-6
    # the second cos vanished with the first: said so
    assert by_fx["cos_1"].status == "one-sided" and "FX node 'cos'" in by_fx["cos_1"].comment
    s = summarize(list(p.run((x,), {})), p)
    assert s.coverage_of_present == 1.0 and s.folded == 2, (s.uncovered, s.folded)
    # node-local: the kept node run on torch's inputs measures the duplicate as it does the first
    local = {r.ep_name: r for r in p.run((x,), {}, node_local=True) if r.kind == "node"}
    for first, second in (("sin", "sin_1"), ("unsqueeze", "unsqueeze_1")):
        assert local[second].err_local is not None and local[second].err_local == local[first].err_local


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_concat_with_empty_pieces_is_compared_through_the_other_piece(dynamic):
    """A rotary embedding over the whole head leaves an empty "pass-through" slice (Phi-3's partial
    rotary at factor 1): the optimizer drops it and the concat. The concat's value is the other
    piece's twin; the empty slice has nothing to compare and says so. ``dynamic``: batch and sequence
    are symbolic, the slice's last dimension is still 0."""
    class PartialRotary(torch.nn.Module):
        def forward(self, x):
            h = x * 2
            rot, rest = h[..., :8], h[..., 8:]
            return torch.cat([rot.neg(), rest], dim=-1) + 1

    x = torch.randn(2, 4, 8)
    dims = ({0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")},) if dynamic else None
    ep, prog = export_module(PartialRotary(), (x,), optimize=True, dynamic_shapes=dims)
    assert "Concat" not in {n.op_type for n in prog.model_proto.graph.node}
    p = prepare(ep, prog.model_proto)
    records = list(p.run((x,), {}))
    by_fx = {r.ep_name: r for r in records if r.kind == "node"}
    assert by_fx["cat"].status == "ok" and by_fx["cat"].onnx_name == by_fx["neg"].onnx_name
    empty = [r for r in by_fx.values() if (r.ep_shape_type or "").endswith("x0")]  # (symbolic: ss..x4x0)
    assert empty and all(r.status == "one-sided" and "empty" in r.comment for r in empty), by_fx
    s = summarize(records, p)
    assert s.coverage_of_present == 1.0, s.uncovered


def test_a_value_fused_into_the_rewritten_node_of_its_consumer_says_so():
    """FuseBatchNormIntoConv makes one Conv of conv + batch norm: the convolution's own value is gone.
    Its record names the fused node and the rule; coverage counts it as absent from the ONNX graph."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                torch.nn.Conv2d(4, 4, 3), torch.nn.BatchNorm2d(4)).eval()
    with torch.no_grad():
        for bn in (model[1], model[4]):
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
    x = torch.randn(1, 3, 12, 12)
    ep, prog = export_module(model, (x,), optimize=True)
    assert [n.op_type for n in prog.model_proto.graph.node] == ["Conv", "Relu", "Conv"]
    p = prepare(ep, prog.model_proto)
    records = list(p.run((x,), {}))
    convs = [r for r in records if r.kind == "node" and r.ep_target == "aten.conv2d.default"]
    assert len(convs) == 2
    for r in convs:
        assert r.status == "one-sided"
        assert "fused it into Conv node" in r.comment and "FuseBatchNormIntoConv" in r.comment, r.comment
    assert not any(r.status in ("mismatch", "error") for r in records)
    s = summarize(records, p)
    assert s.fused == 2 and s.coverage_of_present == 1.0, (s.uncovered, s.fused)
    assert "2 fused into other nodes" in "\n".join(s.lines())


def _compared_after_ort_fusions(module_class, fused_op: str):
    """Records and summary of a seeded ``module_class()`` (on a random (2, 5, 16) input) against its
    optimized export rewritten by onnxruntime's fusions, which must have made a ``fused_op`` node;
    none beyond tolerance."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    ep, prog = export_module(module_class(), (x,), optimize=True)
    fused = fused_for_ort(prog.model_proto)
    assert any(n.op_type == fused_op for n in fused.graph.node)
    p = prepare(ep, fused)
    records = list(p.run((x,), {}, node_local=True))
    s = summarize(records, p)
    assert s.by_status.get("mismatch", 0) == 0
    return records, s


def test_outputs_of_nodes_fused_for_onnxruntime_pair_by_name():
    """onnxruntime's fusions (onnxscript's ``optimize_for_ort``) replace the residual Add and the RMS norm
    after it by one SkipSimplifiedLayerNormalization that still hands out the sum under its FX name,
    while its metadata names the norm's last node. The sum is paired by its name, not with another
    value of the same shape read by the next fused node (a false mismatch and wrong node-local
    errors downstream before)."""
    pytest.importorskip("onnxscript.rewriter.ort_fusions")

    class RMSNorm(torch.nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.rand(d) + 0.5)

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    class Blocks(torch.nn.Module):
        def __init__(self, d=16):
            super().__init__()
            self.lins = torch.nn.ModuleList(torch.nn.Linear(d, d, bias=False) for _ in range(3))
            self.norms = torch.nn.ModuleList(RMSNorm(d) for _ in range(3))

        def forward(self, x):
            h = x
            for lin, norm in zip(self.lins, self.norms):
                h = h + lin(norm(h))
            return h

    records, s = _compared_after_ort_fusions(Blocks, "SkipSimplifiedLayerNormalization")
    skip = [r for r in records if r.onnx_op_type == "SkipSimplifiedLayerNormalization" and r.ep_name]
    sums = [r for r in skip if r.ep_target == "aten.add.Tensor"]
    assert sums and all(r.ep_name == r.onnx_name and r.status == "ok" for r in sums)
    assert all("fused" in r.comment for r in sums)
    # run on torch's inputs, each fused node agrees with torch: it creates no error
    assert all(r.err_local is not None and r.err_local < 1e-4 for r in skip)
    # the norms' inner values (pow, mean, rsqrt...) are gone: each says which fused node took it in
    inner = [r for r in records if r.kind == "node" and r.ep_target in ("aten.pow.Tensor_Scalar", "aten.rsqrt.default")]
    assert inner and all(r.status == "one-sided" and "SimplifiedLayerNormalization node" in r.comment
                         for r in inner), [r.comment for r in inner]
    assert s.coverage_of_present == 1.0, s.uncovered


def test_a_node_whose_end_a_fusion_took_in_is_not_paired_with_its_partial_value():
    """Fused for onnxruntime, Linear + GELU becomes MatMul + BiasGelu: the MatMul keeps the Linear's
    metadata but hands out the product without its bias. That partial value is not the Linear's twin
    (a false mismatch before); the GELU is compared at the fused node's output."""
    pytest.importorskip("onnxscript.rewriter.ort_fusions")

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

        def forward(self, x):
            return self.fc2(torch.nn.functional.gelu(self.fc1(x)))

    records, s = _compared_after_ort_fusions(Mlp, "BiasGelu")
    fc1 = next(r for r in records if r.kind == "node" and r.ep_name == "linear")
    assert fc1.status == "one-sided" and "BiasGelu" in fc1.comment
    gelu = next(r for r in records if r.ep_name == "gelu")
    assert gelu.status == "ok" and gelu.onnx_op_type == "BiasGelu" and gelu.err_local < 1e-4
    assert s.fused >= 1 and s.coverage_of_present == 1.0, s.uncovered  # the partial value is not counted


def test_a_value_the_onnx_graph_has_only_reshaped_is_compared_reshaped():
    """GPT-2's Conv1D flattens to 2-D for ``addmm`` and views the result back to 3-D; fused for
    onnxruntime, it is a MatMul + Add on the 3-D values and the 2-D ones are gone. Each is compared with
    the 3-D value (same elements, same order), its record keeping the torch shape; the view of the
    input says that its consumers read the input itself."""
    class Conv1DMlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.b1 = torch.nn.Parameter(torch.randn(16, 32) * 0.2), torch.nn.Parameter(torch.randn(32) * 0.1)
            self.w2, self.b2 = torch.nn.Parameter(torch.randn(32, 16) * 0.2), torch.nn.Parameter(torch.randn(16) * 0.1)

        def forward(self, x):
            h = torch.addmm(self.b1, x.view(-1, 16), self.w1).view(x.shape[:-1] + (32,))
            h = torch.nn.functional.gelu(h, approximate="tanh")
            return torch.addmm(self.b2, h.view(-1, 32), self.w2).view(x.shape) + x

    records, s = _compared_after_ort_fusions(Conv1DMlp, "MatMul")
    by_fx = {r.ep_name: r for r in records if r.kind == "node"}
    for name, twin, shape in (("addmm", "view_1", "T1s10x32"), ("view_2", "gelu", "T1s10x32"),
                              ("addmm_1", "view_3", "T1s10x16")):
        r = by_fx[name]
        assert r.status == "ok" and r.onnx_name == twin and "reshaped" in r.comment, r
        assert r.ep_shape_type == shape and r.onnx_shape_type != shape and r.err_local is not None
    assert by_fx["view"].status == "one-sided" and "input 'x'" in by_fx["view"].comment
    assert s.coverage_of_present == 1.0, s.uncovered


def test_record_fields_and_dataframe():
    ep, prog, args, kwargs = exported("dummy_llm", False)
    records = list(sbs_widget.run_aligned(ep, prog.model_proto, args, kwargs))
    node = next(r for r in records if r.kind == "node" and r.ep_name == "layer_norm" or
                r.kind == "node" and r.onnx_op_type == "LayerNormalization")
    assert node.module == "decoder.norm1"
    assert node.onnx_op_type == "LayerNormalization" and node.onnx_node_name
    assert node.ep_shape_type == "T1s2x30x16" and node.onnx_shape_type == "T1s2x30x16"
    assert node.ep_origin is not None and node.stack_trace
    assert sum(node.histogram) == node.n_elements == 2 * 30 * 16
    df = sbs_widget.to_dataframe(records)
    assert len(df) == len(records)
    for col in ("ep_id_node", "onnx_id_node", "ep_name", "onnx_name", "ep_target", "onnx_op_type",
                "onnx_id_output", "ep_shape_type", "onnx_shape_type", "err_abs", "err_rel", "err_dev",
                "err_nan", "err_h01", "err_h001", "ep_time_run", "onnx_time_run", "comment",
                "err_local", "status", "module"):
        assert col in df.columns
    # execution order: FX ids of compared nodes never go backwards by much
    ids = [r.ep_id_node for r in records if r.kind == "node" and r.ep_id_node is not None]
    assert ids == sorted(ids) or sum(a > b for a, b in zip(ids, ids[1:])) <= len(ids) // 10


def test_weights_are_compared_and_onnx_runs_with_its_own_weights():
    ep, prog, args, kwargs = exported("dummy_llm", False)
    name = "decoder.feed_forward.fc2.weight"
    bad = faults.perturb_initializer(prog.model_proto, name, scale=0.5)
    records = list(sbs_widget.run_aligned(ep, bad, args, kwargs))
    weight = next(r for r in records if r.kind == "weight" and r.onnx_name == name)
    assert weight.status == "mismatch" and weight.err_abs > 1e-3
    assert next(r for r in records if r.kind == "output").status == "mismatch"
    # nodes before the corrupted layer still agree
    first_bad = next(r for r in records if r.kind == "node" and r.status == "mismatch")
    assert "fc2" in (first_bad.module or "") or "fc2" in (first_bad.ep_name or "")


def test_a_weight_rewritten_under_its_own_name_is_marked_not_flagged():
    """The optimizer folds a BatchNorm into the bias-free convolution before it and keeps the
    convolution's weight name for the folded weight (no provenance metadata in such a model): the
    weight record says it was rewritten (the Conv now translates the batch norm), it is no mismatch;
    a weight really changed in the file is still flagged."""
    class ConvBn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = torch.nn.Conv2d(3, 4, 3, bias=False), torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x)))

    torch.manual_seed(0)
    model = ConvBn().eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 8, 8)
    ep, prog = export_module(model, (x,), optimize=True)
    assert [n.op_type for n in prog.model_proto.graph.node] == ["Conv", "Relu"]
    records = list(prepare(ep, prog.model_proto).run((x,), {}))
    weight = next(r for r in records if r.kind == "weight" and r.onnx_name == "conv.weight")
    assert weight.status == "one-sided" and "rewritten" in weight.comment and "Conv" in weight.comment
    assert all(r.status != "mismatch" for r in records)

    ep, prog = export_module(model, (x,), optimize=False)
    bad = faults.perturb_initializer(prog.model_proto, "conv.weight", scale=0.5)
    weight = next(r for r in prepare(ep, bad).run((x,), {}) if r.kind == "weight" and r.onnx_name == "conv.weight")
    assert weight.status == "mismatch"


def test_onnx_program_and_paths(tmp_path):
    ep, prog, args, kwargs = exported("dummy_llm", True)
    via_program = list(sbs_widget.run_aligned(prog, None, args, kwargs))
    assert via_program and all(r.status != "mismatch" for r in via_program)
    torch.export.save(ep, tmp_path / "model.pt2")
    prog.save(str(tmp_path / "model.onnx"))
    torch.save(args, tmp_path / "inputs.pt")
    via_paths = list(sbs_widget.run_aligned(tmp_path / "model.pt2", tmp_path / "model.onnx", tmp_path / "inputs.pt"))
    assert len(via_paths) >= len(via_program) - 2
    assert all(r.status != "mismatch" for r in via_paths)


def test_progress_callback():
    ep, prog, args, kwargs = exported("dummy_llm", False)
    calls = []
    list(sbs_widget.run_aligned(ep, prog.model_proto, args, kwargs, progress=lambda d, t, n: calls.append((d, t, n))))
    assert calls and calls[-1][0] == calls[-1][1] == prepare(ep, prog.model_proto).n_fx_nodes
    assert all(isinstance(n, str) for _, _, n in calls)


def _corrupt_add(prog):
    """Replace the residual Add of the decoder (after attention) by Sub."""
    model = prog.model_proto
    target = next(n for n in model.graph.node if n.op_type == "Add" and "add" in n.name and
                  any(p.key == "pkg.torch.onnx.name_scopes" and "decoder" in p.value for p in n.metadata_props)
                  and "attention" not in "".join(p.value for p in n.metadata_props
                                                 if p.key == "pkg.torch.onnx.name_scopes"))
    return faults.replace_op(model, target.name, "Sub"), target


def test_reset_names_replace_the_onnx_value_downstream():
    ep, prog, args, kwargs = exported("dummy_llm", False)
    bad, target = _corrupt_add(prog)
    value = target.output[0]
    plain = list(sbs_widget.run_aligned(ep, bad, args, kwargs))
    assert next(r for r in plain if r.kind == "output").status == "mismatch"
    reset = list(sbs_widget.run_aligned(ep, bad, args, kwargs, reset_names=[value]))
    rec = next(r for r in reset if r.onnx_name == value and r.kind == "node")
    assert rec.status == "reset" and rec.err_abs > 1e-3  # still measured, then replaced
    assert next(r for r in reset if r.kind == "output").status == "ok"
    assert not [r for r in reset if r.status == "mismatch"]
    # FX names work too and the prepared pair is reused
    rec_fx = next(r for r in sbs_widget.run_aligned(ep, bad, args, kwargs, reset_names=[rec.ep_name])
                  if r.onnx_name == value and r.kind == "node")
    assert rec_fx.status == "reset"
    with pytest.raises(sbs_widget.InputError, match="cannot reset 'no_such_value'"):
        sbs_widget.run_aligned(ep, bad, args, kwargs, reset_names=["no_such_value"])
    # a weight (an initializer: no node computes it) is not resettable: the error names what reads it
    p = sbs_widget.prepare(ep, bad)
    weight = next(k for k, v in p.alignment.pairs.items() if v.onnx_value in p.index.initializers)
    with pytest.raises(sbs_widget.InputError, match=r"is an initializer .*reset what reads it instead: \S+"):
        sbs_widget.run_aligned(ep, bad, args, kwargs, reset_names=[weight])


def test_node_local_separates_creator_from_inheritors():
    ep, prog, args, kwargs = exported("dummy_llm", False)
    bad, target = _corrupt_add(prog)
    records = list(sbs_widget.run_aligned(ep, bad, args, kwargs, node_local=True))
    culprit = next(r for r in records if r.onnx_name == target.output[0])
    assert culprit.err_local is not None and culprit.err_local > 1e-2
    downstream = [r for r in records if r.kind == "node" and r.status == "mismatch" and r is not culprit
                  and r.err_local is not None]
    assert downstream, "errors propagate downstream"
    assert all(r.err_local < 1e-4 for r in downstream)
    compared_nodes = [r for r in records if r.kind == "node" and r.status in ("ok", "mismatch")
                      and r.onnx_id_node is not None and "no-op" not in r.comment]
    filled = sum(r.err_local is not None for r in compared_nodes)
    assert filled / len(compared_nodes) >= 0.95


def test_node_local_with_weights_and_transposed_weights_on_optimized_export():
    ep, prog, args, kwargs = exported("dummy_llm", True)
    init = "decoder.feed_forward.fc1.weight"
    folded = [i.name for i in prog.model_proto.graph.initializer if i.name == init]
    model = prog.model_proto
    if not folded:  # optimized exports may store the transposed weight under a new name
        fold = [vi.name for vi in model.graph.value_info
                if any(p.value.find(init) >= 0 for p in vi.metadata_props)]
        init = fold[0]
    bad = faults.perturb_initializer(model, init, scale=0.5)
    records = list(sbs_widget.run_aligned(ep, bad, args, kwargs, node_local=True))
    consumer = next(r for r in records if r.kind == "node" and r.status == "mismatch")
    assert consumer.err_local is not None and consumer.err_local > 1e-3
    assert "fc1" in consumer.module


def test_exc_raises_at_first_pair_beyond_tolerance():
    ep, prog, args, kwargs = exported("dummy_llm", False)
    bad, target = _corrupt_add(prog)
    got = []
    with pytest.raises(sbs_widget.ToleranceExceeded) as info:
        for r in sbs_widget.run_aligned(ep, bad, args, kwargs, exc=True):
            got.append(r)
    msg = str(info.value)
    assert target.output[0] in msg and "err_abs" in msg and "T1s2x30x16" in msg
    assert info.value.record.onnx_name == target.output[0]
    assert got and all(r.status != "mismatch" for r in got)


class _Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 6)

    def forward(self, x):
        return self.proj(x).sum(dim=-1)


def test_records_beyond_tolerance_say_where_the_difference_lies():
    """One element of a bias wrong in the file: the weight, the Linear's value and its sum over the
    last axis are beyond tolerance, each at the indices the element reaches; the culprit's reason, the
    exception of exc=True and the summary say where too."""
    torch.manual_seed(0)
    args = (torch.randn(3, 5, 8),)
    ep, prog = export_module(_Head().eval(), args)
    bad = onnx.ModelProto()
    bad.CopyFrom(prog.model_proto)
    bias = next(i for i in bad.graph.initializer if i.name == "proj.bias")
    values = onnx.numpy_helper.to_array(bias).copy()
    values[4] += 1.0
    bias.CopyFrom(onnx.numpy_helper.from_array(values, bias.name))
    records = list(sbs_widget.run_aligned(ep, bad, args))
    where = {r.ep_name: r.err_where for r in records if r.status == "mismatch"}
    assert where["p_proj_bias"] == "[4] (1 of 6)"
    assert where["linear"] == "[:, :, 4] (15 of 90)"  # every row, only the 5th feature
    assert where["sum_1"] == "[:, :] (15 of 15)"
    assert all(r.err_where is None for r in records if r.status != "mismatch")
    assert "err_where" in sbs_widget.to_dataframe(records).columns
    assert "beyond tolerance at [4] (1 of 6)" in "\n".join(summarize(records, prepare(ep, bad)).lines())
    with pytest.raises(sbs_widget.ToleranceExceeded, match=r"beyond tolerance at \[4\] \(1 of 6\)"):
        list(sbs_widget.run_aligned(ep, bad, args, exc=True))
    culprit = sbs_widget.culprits(ep, bad, args)[0]
    assert culprit.kind == "weight" and "by 1 at [4] (1 of 6)" in culprit.reason


def test_default_tolerance_follows_the_programs_precision():
    """A float16 program differs from its export by rounding alone beyond the float32 default 1e-4:
    with the default tolerance its correct export has no pair beyond tolerance and no culprit, while
    a fault is still found; a tolerance given is used as is."""
    from sbs_widget.samples import zoo

    ep, prog, args, _ = zoo.export("mlp", optimize=False, dtype=torch.float16)
    p = prepare(ep, prog.model_proto)
    assert p.precision == torch.float16 and tuple(p.tolerance()) == (1e-3, 1e-3)
    assert tuple(p.tolerance(1e-2, None)) == (1e-2, 1e-3)
    assert tuple(prepare(exported("mlp", False)[1]).tolerance()) == (1e-4, 1e-4)  # a float32 program
    assert all(r.status != "mismatch" for r in sbs_widget.run_aligned(ep, prog.model_proto, args))
    strict = list(sbs_widget.run_aligned(ep, prog.model_proto, args, atol=1e-4, rtol=1e-4, reference=False))
    assert any(r.status == "mismatch" for r in strict), "float16 rounding exceeds the float32 default"
    assert sbs_widget.culprits(ep, prog.model_proto, args) == []
    target = node_named(prog.model_proto, "Gemm", 0)
    bad = faults.set_attribute(prog.model_proto, target.name, "alpha", 0.9)
    assert sbs_widget.culprits(ep, bad, args)[0].onnx_node == target.name


def test_tolerances_apply_without_verbosity():
    ep, prog, args, kwargs = exported("dummy_llm", False)
    strict = list(sbs_widget.run_aligned(ep, prog.model_proto, args, kwargs, atol=0.0, rtol=0.0, reference=False))
    loose = list(sbs_widget.run_aligned(ep, prog.model_proto, args, kwargs, atol=1.0, rtol=0.0))
    assert sum(r.status == "mismatch" for r in strict) > 0  # float rounding differs somewhere
    assert sum(r.status == "mismatch" for r in loose) == 0


class CountingRuntime:
    """A plugged-in runtime (the Runtime protocol) that counts and keeps what it compiles."""

    name = "counting"

    def __init__(self):
        self.inner = sbs_widget.get_runtime("onnxruntime")
        self.compiled = 0
        self.models = []

    def compile(self, model):
        self.compiled += 1
        self.models.append(model)
        return self.inner.compile(model)


def test_reference_runtime_and_custom_runtime():
    ep, prog, args, kwargs = exported("mlp", False)
    ref = list(sbs_widget.run_aligned(ep, prog.model_proto, args, kwargs, runtime="onnx.reference"))
    assert ref and not [r for r in ref if r.status in ("mismatch", "error")]

    rt = CountingRuntime()
    assert isinstance(rt, sbs_widget.Runtime)
    recs = list(sbs_widget.run_aligned(ep, prog.model_proto, args, kwargs, runtime=rt))
    assert rt.compiled >= 1 and not [r for r in recs if r.status in ("mismatch", "error")]
    with pytest.raises(sbs_widget.InputError, match="unknown runtime"):
        sbs_widget.run_aligned(ep, prog.model_proto, args, kwargs, runtime="tensorrt-nope")


def test_no_session_per_node_and_reruns_reuse_sessions():
    ep, prog, args, kwargs = exported("dummy_llm", False)

    rt = CountingRuntime()
    p = prepare(ep, prog.model_proto)
    list(p.run(args, kwargs, runtime=rt))
    first = rt.compiled
    assert first <= 2, "one session per segment, not per node"
    list(p.run(args, kwargs, runtime=rt))
    assert rt.compiled == first, "a rerun compiles nothing"


def test_sessions_dropped_after_their_segment_when_not_kept():
    from sbs_widget.align.pipeline import build_pair
    from sbs_widget.engine.entry import Prepared

    ep, prog, args, kwargs = exported("dummy_llm", False)
    p = prepare(ep, prog.model_proto)
    kept = [(r.onnx_name, r.status, r.err_abs) for r in p.run(args, kwargs, segment_nodes=10)]
    fresh = Prepared(build_pair(p.decomposed_ep, p.onnx_model))
    recs, alive = [], []
    for r in fresh.run(args, kwargs, segment_nodes=10, keep_sessions=False):
        recs.append((r.onnx_name, r.status, r.err_abs))
        alive.append(len(fresh.cache.compiled))
    assert recs == kept
    assert max(alive) <= 3, "at most the current segment and the next one compiled"
    assert len(fresh.cache.compiled) == 0


def test_memory_values_are_freed_on_both_sides():
    ep, prog, args, kwargs = exported("dummy_llm", False)
    p = prepare(ep, prog.model_proto)
    from sbs_widget.engine.fx_runner import flat_inputs
    from sbs_widget.engine.lockstep import LockstepRun
    from sbs_widget.engine.run_parts import RunOptions
    from sbs_widget.engine.runtimes import get_runtime

    run = LockstepRun(p, flat_inputs(p.decomposed_ep, args, kwargs), get_runtime(),
                      RunOptions(p.tolerance(1e-4, 1e-4), histogram=False, segment_nodes=10))
    peak_fx = peak_onnx = 0
    for _ in run.records():
        n_fx = sum(1 for k in run.parts.state.fx.env if not k.startswith(("p_", "b_", "c_")))
        peak_fx = max(peak_fx, n_fx)
        peak_onnx = max(peak_onnx, len(run.parts.state.onnx.env))
    total = len([n for n in p.fx_nodes if n.op == "call_function"])
    assert peak_fx < total / 2 and peak_onnx < len(p.index.nodes) / 2


@pytest.mark.parametrize("reshaped", [False, True])
def test_a_duplicate_layers_later_does_not_make_the_fx_side_run_ahead(reshaped):
    """Each layer recomputes the same gate from the input (as LLaMA recomputes its rotary tables): the
    optimizer keeps the first layer's. The later duplicates are measured with that twin's torch value,
    so the FX side does not run ahead to them, holding every value in between. ``reshaped``: each layer
    reshapes one shared gate back and forth instead (a pair of reshapes the optimizer removes), compared
    with the gate's twin reshaped: the same."""
    class Gated(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lins = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(8))

        def forward(self, x):
            h, gate = x, torch.sigmoid(x) if reshaped else None
            for lin, shape in zip(self.lins, ((1, 4, 16), (4, 1, 16), (2, 2, 16), (4, 16, 1), (1, 1, 4, 16),
                                              (64,), (8, 8), (2, 32))):
                h = torch.relu(lin(h)) * (gate.view(shape).view(4, 16) if reshaped else torch.sigmoid(x))
            return h

    x = torch.randn(4, 16)
    ep, prog = export_module(Gated(), (x,), optimize=True)
    assert sum(n.op_type == "Sigmoid" for n in prog.model_proto.graph.node) == 1
    p = prepare(ep, prog.model_proto)
    from sbs_widget.engine.fx_runner import flat_inputs
    from sbs_widget.engine.lockstep import LockstepRun
    from sbs_widget.engine.run_parts import RunOptions
    from sbs_widget.engine.runtimes import get_runtime

    run = LockstepRun(p, flat_inputs(p.decomposed_ep, (x,), {}), get_runtime(),
                      RunOptions(p.tolerance(1e-4, 1e-4), histogram=False, segment_nodes=4))
    peak_fx, records = 0, []
    for r in run.records():
        records.append(r)
        peak_fx = max(peak_fx, sum(1 for k in run.parts.state.fx.env if not k.startswith(("p_", "b_", "c_"))))
    gates = [r for r in records
             if (r.ep_name.startswith("view") if reshaped else r.ep_target == "aten.sigmoid.default")]
    assert len(gates) == (16 if reshaped else 8), [r.ep_name for r in gates]
    assert all(r.status == "ok" and r.onnx_name == gates[0].onnx_name for r in gates), \
        [(r.ep_name, r.onnx_name, r.status, r.comment) for r in gates]
    assert peak_fx < len([n for n in p.fx_nodes if n.op == "call_function"]) / 3, peak_fx


@pytest.mark.parametrize("optimize", [False, True])  # True: folded, transposed weights
def test_a_weight_is_served_from_torch_memory_only_when_bit_identical(optimize):
    """The ONNX side computes with the file's own bits: -0.0 in the file where torch holds 0.0 (equal
    numbers, but 1/x differs) keeps that initializer out of the ones read from torch's memory."""
    import numpy as np
    from engine_models import export_module
    from onnx import numpy_helper

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.randn(2, 64)
    ep, prog = export_module(model, (x,), optimize=optimize)
    weights = prepare(ep, prog.model_proto).weights()
    assert weights.shared >= 1
    name, (param, _) = next(iter(weights._views.items()))
    # Element 0 is the same element whether the file holds the weight transposed or not.
    with torch.no_grad():
        param.view(-1)[0] = 0.0
    onx = onnx.ModelProto()
    onx.CopyFrom(prog.model_proto)
    init = next(i for i in onx.graph.initializer if i.name == name)
    values = numpy_helper.to_array(init).copy()
    values.flat[0] = -0.0
    init.CopyFrom(numpy_helper.from_array(values, name))

    weights2 = prepare(ep, onx).weights()
    assert weights2.shared == weights.shared - 1
    assert np.signbit(np.asarray(weights2[name]).flat[0])  # the file's bits, not torch's
    records = list(sbs_widget.run_aligned(ep, onx, (x,)))
    assert all(r.status in ("ok", "one-sided") for r in records)  # 0.0 and -0.0 are equal numbers


def test_a_parameter_transposed_in_the_program_and_folded_by_the_optimizer():
    """``x @ w.permute(1, 0)``: the optimizer stores the transposed weight as an initializer, served
    from the parameter's memory; the permute's value is a view of a parameter that requires grad
    (inference mode keeps that on views). Its record is filled without reading it through numpy
    directly: that used to raise and end the run (found on Falcon)."""
    class Projection(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(64, 48))

        def forward(self, x):
            return x @ self.w.permute(1, 0)

    torch.manual_seed(0)
    x = torch.randn(3, 48)
    ep, prog = export_module(Projection(), (x,), optimize=True)
    p = prepare(ep, prog.model_proto)
    assert p.schedule.fx_folded == {"permute"} and p.weights().shared == 1
    records = list(p.run((x,), {}))
    folded = next(r for r in records if r.ep_name == "permute")
    assert folded.status == "ok" and folded.err_abs == 0 and "constant-folded" in folded.comment
    assert [r.status for r in records if r.kind == "output"] == ["ok"]


def test_big_weights_stored_transposed_are_transposed_by_the_segment_from_torch_memory(monkeypatch):
    """An optimized export stores ``linear``'s weight transposed (MatMul on 3-D inputs). Past
    TRANSPOSE_IN_SEGMENT_BYTES the segment is fed the torch parameter itself and transposes it (no
    copy held for the whole segment): the records, resets and node-local errors are exactly those of
    a run fed the file's layout."""
    from sbs_widget.engine import weights
    from sbs_widget.engine.segments import TRANSPOSED

    torch.manual_seed(0)
    width = 256  # 256 kB weights
    assert width * width * 4 >= weights.TRANSPOSE_IN_SEGMENT_BYTES
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width),
                                torch.nn.Tanh(), torch.nn.Linear(width, 8))
    x = torch.randn(2, 3, width)
    ep, prog = export_module(model, (x,), optimize=True)
    p = prepare(ep, prog.model_proto)
    transposed = [n for n in p.index.initializers if p.weights().transposed_source(n) is not None]
    assert len(transposed) == 2  # the two square weights (the last one is below the threshold)

    rt = CountingRuntime()
    records = list(p.run((x,), {}, runtime=rt))
    fed = {i.name for m in rt.models for i in m.graph.input}
    assert {TRANSPOSED + n for n in transposed} <= fed
    assert records and all(r.status in ("ok", "one-sided") for r in records)
    assert [r.status for r in records if r.kind == "output"] == ["ok"]

    def measured(recs):
        return [(r.kind, r.ep_name, r.onnx_name, r.status, r.err_abs, r.err_local) for r in recs]

    reset_name = next(r.onnx_name for r in records if r.kind == "node" and "gelu" in (r.ep_target or ""))
    runs = [measured(records), measured(p.run((x,), {}, reset_names=[reset_name])),
            measured(p.run((x,), {}, node_local=True))]
    assert next(s for _, _, o, s, _, _ in runs[1] if o == reset_name) == "reset"
    assert any(loc is not None for *_, loc in runs[2])
    # The same runs with every weight fed in the file's layout (copied transposes, as below the threshold).
    monkeypatch.setattr(weights, "TRANSPOSE_IN_SEGMENT_BYTES", 1 << 62)
    p2 = prepare(ep, prog.model_proto)
    assert not [n for n in p2.index.initializers if p2.weights().transposed_source(n) is not None]
    assert runs == [measured(p2.run((x,), {})), measured(p2.run((x,), {}, reset_names=[reset_name])),
                    measured(p2.run((x,), {}, node_local=True))]
