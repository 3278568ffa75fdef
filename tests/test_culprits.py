"""Culprit finder, repro bundles and reset suggestions on injected faults (a CI-sized subset of
benchmarks/culprit_accuracy.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
from engine_models import export_module, exported, node_named

import sbs_widget
from sbs_widget.engine.entry import prepare
from sbs_widget.samples import faults

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from culprit_accuracy import evaluate, make_faults  # noqa: E402


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


@pytest.mark.parametrize("optimize", [False, True])
def test_fault_suite_dummy_llm(optimize):
    ep, prog, args, kwargs = exported("dummy_llm", optimize)
    flist = make_faults(prog.model_proto, args, kwargs, per_kind=1, seed=1)
    assert {f.kind for f in flist} >= {"weight", "op", "cast", "constant"}
    results, false_alarms = evaluate(ep, prog.model_proto, args, kwargs, flist)
    assert false_alarms == 0
    misses = [(f.description, found[:1]) for f, rank, _, found, *_ in results if rank != 1]
    assert not misses


def test_culprit_fields_and_reason():
    ep, prog, args, kwargs = exported("dummy_llm", False)
    node = node_named(prog.model_proto, "LayerNormalization", -1)
    bad = faults.set_attribute(prog.model_proto, node.name, "epsilon", 0.5)
    found = sbs_widget.culprits(ep, bad, args, kwargs, top=3)
    c = found[0]
    assert c.onnx_node == node.name and c.onnx_op_type == "LayerNormalization"
    assert c.ep_name and c.ep_target and c.module and 0 < c.score <= 1
    assert "LayerNormalization gives" in c.reason and "the node itself differs" in c.reason
    assert "; beyond tolerance at [" in c.reason  # where in the value (records' err_where)
    assert set(c.to_dict()) >= {"onnx_node", "onnx_name", "onnx_op_type", "ep_name", "ep_target", "module",
                                "score", "reason"}
    assert sbs_widget.culprits(ep, prog.model_proto, args, kwargs) == []
    assert sbs_widget.find_culprits([]) == []


class _MaskedAttention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("optimize", [False, True])
def test_a_difference_in_fully_masked_rows_is_located(optimize):
    """A real discrepancy of the exporter (torch 2.13): for a query row whose keys are all masked (left
    padding does that), torch's attention returns zeros and the exported graph the mean of the values.
    The culprit is the attention, and the reason says the difference lies in that row only."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 1, 3, 4) for _ in range(3))
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool).tril()
    mask[0, 0, 0] = False  # batch item 0, query 0: every key masked
    args = (q, k, v, mask)
    ep, prog = export_module(_MaskedAttention(), args, optimize=optimize)
    found = sbs_widget.culprits(ep, prog.model_proto, args)
    if not found:
        pytest.skip("this exporter matches torch on fully masked rows")
    c = found[0]
    assert c.ep_target == "aten.scaled_dot_product_attention.default"
    assert c.reason.endswith("beyond tolerance at [0, :, 0, :] (4 of 24)")  # (axis 1 has one index)


def test_cast_names_the_cast():
    ep, prog, args, kwargs = exported("dummy_llm", False)
    value = node_named(prog.model_proto, "MatMul", -2).output[0]
    bad = faults.insert_cast(prog.model_proto, value)
    c = sbs_widget.culprits(ep, bad, args, kwargs)[0]
    assert c.kind == "cast" and c.onnx_node == f"{value}__cast_low" and c.onnx_name == value
    assert "float16" in c.reason


def test_repro_bundle_replays_the_error(tmp_path):
    ep, prog, args, kwargs = exported("dummy_llm", True)
    node = node_named(prog.model_proto, "Add", -1)
    bad = faults.replace_op(prog.model_proto, node.name, "Sub")
    p = prepare(ep, bad)
    c = sbs_widget.culprits(p, None, args, kwargs)[0]
    bundle = sbs_widget.export_repro(p, args, c, str(tmp_path / "b"), kwargs=kwargs)
    for f in ("model.onnx", "inputs.pt", "inputs.npz", "expected.pt", "expected.npz", "fx.txt", "replay.py"):
        assert (tmp_path / "b" / f).exists()
    loaded = torch.load(tmp_path / "b" / "inputs.pt", weights_only=True)
    assert all(isinstance(v, torch.Tensor) for v in loaded.values())
    assert "FX node" in (tmp_path / "b" / "fx.txt").read_text()
    out = subprocess.run([sys.executable, str(tmp_path / "b" / "replay.py")], capture_output=True, text=True,
                         check=True).stdout
    err = float(re.search(r"max abs error: (\S+)", out).group(1))
    assert c.err_local > 1e-3 and abs(err - c.err_local) <= 0.1 * c.err_local
    assert abs(bundle.err_abs - err) <= 1e-3 * err and bundle.value == c.value


def test_suggest_resets():
    ep, prog, args, kwargs = exported("dummy_llm", False)
    node = node_named(prog.model_proto, "LayerNormalization", 0)
    p = prepare(ep, faults.set_attribute(prog.model_proto, node.name, "epsilon", 0.5))
    s = sbs_widget.suggest_resets(p, args, kwargs=kwargs)
    assert s.fixed and s.names == [node.output[0]]
    assert max(s.before) > 1e-4 and max(s.after) <= 1e-4
    assert sbs_widget.suggest_resets(prepare(ep, prog.model_proto), args, kwargs=kwargs).names == []


def test_cli_culprits_and_repro(tmp_path, capsys):
    from sbs_widget.cli.main import main

    ep, prog, args, kwargs = exported("dummy_llm", False)
    node = node_named(prog.model_proto, "Gelu", -1)
    bad = faults.swap_gelu_approximation(prog.model_proto, node.name)
    torch.export.save(ep, tmp_path / "m.pt2")
    import onnx

    onnx.save(bad, tmp_path / "bad.onnx")
    onnx.save(prog.model_proto, tmp_path / "good.onnx")
    torch.save(args, tmp_path / "in.pt")
    files = ["--ep", str(tmp_path / "m.pt2"), "--inputs", str(tmp_path / "in.pt")]
    assert main(["culprits", *files, "--onnx", str(tmp_path / "bad.onnx"), "--json", "--top", "2"]) == 0
    items = json.loads(capsys.readouterr().out)
    assert 1 <= len(items) <= 2 and items[0]["onnx_node"] == node.name and items[0]["reason"]
    assert main(["culprits", *files, "--onnx", str(tmp_path / "good.onnx"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["repro", *files, "--onnx", str(tmp_path / "bad.onnx"), "--name", items[0]["onnx_name"],
                 "-o", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "replay.py").exists()


def test_widget_culprits_trait_and_repro(tmp_path):
    ep, prog, args, kwargs = exported("dummy_llm", False)
    node = node_named(prog.model_proto, "LayerNormalization", -1)
    bad = faults.set_attribute(prog.model_proto, node.name, "epsilon", 0.5)
    w = sbs_widget.SbsWidget(ep, bad, args, kwargs=kwargs, node_local=True).wait()
    assert w.culprits and w.culprits[0]["onnx_node"] == node.name
    first = w.culprits[0]
    assert w.records[first["i"]].onnx_name == first["onnx_name"] and first["reason"]
    bundle = w.export_repro(first["onnx_name"], str(tmp_path / "w"))
    assert (tmp_path / "w" / "replay.py").exists() and bundle.err_abs > 1e-3
    good = sbs_widget.SbsWidget(ep, prog.model_proto, args, kwargs=kwargs, node_local=True).wait()
    assert good.culprits == []


def test_one_culprit_per_onnx_node():
    """Two FX names twinned with one ONNX value (``view_3`` and the attention it ends) name one place."""
    from sbs_widget.blame.culprits import Culprit, _one_per_onnx_node

    a = Culprit("node_MatMul_9", "matmul_9", "MatMul", "view_3", "aten.view", "", 0.9, "MatMul gives 0.5")
    b = Culprit("node_MatMul_9", "matmul_9", "MatMul", "sdpa", "aten.sdpa", "", 0.8, "MatMul gives 0.5")
    c = Culprit("node_Add_2", "add_2", "Add", "add", "aten.add", "", 0.5, "Add gives 0.1")
    out = _one_per_onnx_node([a, b, c])
    assert [x.onnx_node for x in out] == ["node_MatMul_9", "node_Add_2"]
    assert "also the twin of FX node 'sdpa'" in out[0].reason


@pytest.mark.slow
def test_a_fault_before_a_copy_is_blamed_on_the_node_inside_the_translation():
    """LLaMA's ``softmax`` is translated as Softmax + Cast (to float32, its input's type): the Cast only
    copies, so a wrong Softmax axis is the Softmax's, not the compared Cast's."""
    from sbs_widget.samples import faults, zoo

    ep, prog, args, kwargs = zoo.export("llama", optimize=False)
    model = prog.model_proto
    cast = next(n for n in model.graph.node if n.op_type == "Cast" and n.output[0] == "softmax")
    softmax = next(n for n in model.graph.node if n.output and n.output[0] == cast.input[0])
    assert softmax.op_type == "Softmax"
    bad = faults.set_attribute(model, softmax.name, "axis", -2)
    found = sbs_widget.culprits(ep, bad, args, kwargs)
    assert found and found[0].onnx_node == softmax.name and found[0].onnx_op_type == "Softmax"
    assert "only copies it" in found[0].reason and cast.name in found[0].reason


@pytest.mark.slow
def test_two_computing_nodes_of_a_translation_are_told_apart_by_torchs_decomposition():
    """SiLU is translated as Sigmoid then Mul (both compute): with the Sigmoid turned into Tanh, the
    group differs, and torch's decomposition of silu (sigmoid, mul), paired by data flow, says the
    difference starts at the Tanh, not at the compared Mul."""
    from sbs_widget.samples import faults, zoo

    ep, prog, args, kwargs = zoo.export("llama", optimize=True)
    model = prog.model_proto
    mul = next(n for n in model.graph.node if n.op_type == "Mul" and n.output[0] == "silu")
    sigmoid = next(n for n in model.graph.node if n.output and n.output[0] in mul.input and n.op_type == "Sigmoid")
    bad = faults.replace_op(model, sigmoid.name, "Tanh")
    found = sbs_widget.culprits(ep, bad, args, kwargs)
    assert found and found[0].onnx_node == sigmoid.name and found[0].onnx_op_type == "Tanh"
    assert "decomposition" in found[0].reason and "'sigmoid'" in found[0].reason
    # a correct export: no culprit, nothing refined
    assert sbs_widget.culprits(ep, model, args, kwargs) == []


class ScaledSquareLinear(torch.nn.Module):
    """``F.linear(x, w * 0.5)`` with a square weight, as RWKV rescales its layers: the optimizer folds
    ``(w * 0.5).T`` into one initializer, whose shape is also ``w * 0.5``'s."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 16))
        self.b = torch.nn.Parameter(torch.randn(16))

    def forward(self, x):
        return torch.nn.functional.linear(x, self.w * 0.5, self.b).relu()


def test_square_weight_folded_transposed_is_no_culprit():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 16)
    ep, prog = export_module(ScaledSquareLinear().eval(), (x,), optimize=True)
    folded = [i.name for i in prog.model_proto.graph.initializer if list(i.dims) == [16, 16]]
    assert len(folded) == 1 and folded[0] != "w", "the optimizer folded the scaled weight"
    records = list(sbs_widget.run_aligned(ep, prog.model_proto, (x,)))
    assert not [r for r in records if r.status == "mismatch"], [(r.ep_name, r.onnx_name) for r in records]
    assert sbs_widget.culprits(ep, prog.model_proto, (x,)) == []
    # the folded weight is still compared, where the program transposes it
    assert any(r.kind == "inner" and r.onnx_name == folded[0] and r.status == "ok" for r in records)
