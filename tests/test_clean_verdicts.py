"""Issue 51 #4, #5, #22: a clean run says so, and a rounding-only one says where it starts; weights the
exporter tied or deduplicated are compared with the initializer holding them; coverage as numbers;
the full group of a culprit's ONNX-only nodes."""

from __future__ import annotations

import re

import onnx
import pytest
import torch
from engine_models import export_module, exported

import sbs_widget
from sbs_widget import records as R
from sbs_widget.engine.summary import summarize
from sbs_widget.samples import faults, zoo

CLEAN = "outputs agree within tolerance; 0 culprits"


def _run(name: str):
    ep, prog, args, kwargs = exported(name, True)
    p = sbs_widget.prepare(ep, prog.model_proto)
    return p, list(p.run(args, kwargs, node_local=True)), args, kwargs


# -- #4: the verdict ---------------------------------------------------------------------------------
def test_a_clean_run_says_so_first():
    p, records, _, _ = _run("mlp")
    lines = summarize(records, p).lines()
    assert lines[0] == CLEAN
    assert lines[1].startswith("records: ")  # the former lines follow


def test_a_rounding_only_run_says_where_it_starts():
    p, records, _, _ = _run("loud_convnet")
    noise = [r for r in records if r.status == R.NOISE]
    assert noise and not [r for r in records if r.status == R.MISMATCH]
    first = summarize(records, p).lines()[0]
    assert "by rounding only (float64 reference: torch and onnxruntime equally close)" in first
    assert f"starting at node {noise[0].ep_name} ({noise[0].onnx_op_type} {noise[0].onnx_node_name})" in first
    assert not first.startswith(CLEAN)


def test_outputs_beyond_tolerance_by_rounding_say_by_how_much():
    records = [
        sbs_widget.Record(ep_name="a", onnx_name="a", kind="node", status=R.OK, err_abs=1e-6),
        sbs_widget.Record(ep_name="conv", onnx_name="c", onnx_node_name="n_conv", onnx_op_type="Conv", kind="node",
                          status=R.NOISE, err_abs=3e-4, noise=True),
        sbs_widget.Record(ep_name="out", onnx_name="o", kind="output", status=R.NOISE, err_abs=7e-4, noise=True),
    ]
    first = summarize(records).lines()[0]
    assert first.startswith("outputs differ by 0.0007 beyond tolerance, by rounding only")
    assert "starting at node conv (Conv n_conv)" in first
    found = sbs_widget.find_culprits(records)
    assert found == [] and found.verdict == first


def test_a_mismatch_gets_no_clean_verdict():
    records = [sbs_widget.Record(ep_name="a", onnx_name="a", onnx_node_name="n", onnx_op_type="Add", kind="node",
                                 status=R.MISMATCH, err_abs=0.5, err_local=0.5)]
    assert not summarize(records).lines()[0].startswith("outputs")
    assert sbs_widget.find_culprits(records).verdict is None


def test_cli_culprits_says_rounding_only(tmp_path, capsys):
    from sbs_widget.cli.main import main

    ep, prog, args, _ = exported("loud_convnet", True)
    torch.export.save(ep, tmp_path / "m.pt2")
    onnx.save(prog.model_proto, tmp_path / "m.onnx")
    torch.save(args, tmp_path / "in.pt")
    files = ["--ep", str(tmp_path / "m.pt2"), "--onnx", str(tmp_path / "m.onnx"), "--inputs", str(tmp_path / "in.pt")]
    assert main(["culprits", *files]) == 0
    out = capsys.readouterr().out
    assert "by rounding only (float64 reference: torch and onnxruntime equally close), starting at node " in out
    assert "no culprit: every compared value agrees" not in out


# -- #5: tied and deduplicated weights ----------------------------------------------------------------
def _fresh(name: str):
    model, args, kwargs = zoo.BUILDERS[name]()  # no trained_like: zero biases, unit norms
    ep, prog = export_module(model, args, kwargs, optimize=True)
    p = sbs_widget.prepare(ep, prog.model_proto)
    return [r for r in p.run(args, kwargs) if r.kind == R.KIND_WEIGHT]


def test_tied_and_deduplicated_weights_are_compared_gpt2():
    weights = {r.ep_target: r for r in _fresh("gpt2")}
    wte = weights["transformer.wte.weight"]
    assert wte.status == R.OK and wte.onnx_name == "lm_head.weight" and wte.comment.startswith("tied to lm_head.weight")
    ln = weights["transformer.h.0.ln_2.weight"]
    assert ln.status == R.OK and ln.comment.startswith("deduplicated into ") and ln.err_abs == 0
    # what is still one-sided has no initializer at all (a zero bias the optimizer dropped from a Gemm)
    for r in weights.values():
        if r.status == R.ONE_SIDED:
            assert "all zeros" in r.comment or "folded" in r.comment, (r.ep_target, r.comment)


def test_deduplicated_norms_are_compared_llama():
    weights = _fresh("llama")
    norms = [r for r in weights if r.ep_target.endswith("norm.weight")]
    assert norms and all(r.status == R.OK for r in norms)
    assert sum("deduplicated into" in (r.comment or "") for r in norms) == len(norms) - 1
    assert not [r for r in weights if r.comment == "no initializer: removed by the ONNX optimizer"
                and r.ep_target.startswith("model.layers")]


# -- #22: coverage, Culprit fields --------------------------------------------------------------------
def test_coverage_is_public():
    p, records, _, _ = _run("mlp")
    cov = sbs_widget.coverage(records, p)
    s = summarize(records, p)
    assert isinstance(cov, sbs_widget.Coverage)
    assert cov.pairs_compared == s.n_compared
    assert (cov.program_compared, cov.program_total) == (s.covered, s.coverable) and cov.program_share == 1.0
    assert 0 < cov.onnx_compared <= cov.onnx_total
    bare = sbs_widget.coverage(records)
    assert bare.pairs_compared == s.n_compared and bare.program_total is None and bare.onnx_share is None


def test_culprit_docs_say_what_fields_mean_by_kind():
    doc = sbs_widget.Culprit.__doc__
    assert "first reader" in doc and "value it *reads*" in doc and "group" in doc


class _GroupNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gn = torch.nn.GroupNorm(4, 8)

    def forward(self, x):
        return self.gn(x) * 2


def test_culprit_group_lists_every_onnx_only_node():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 5, 5)
    ep, prog = export_module(_GroupNorm(), (x,), optimize=False)
    node = next(n for n in prog.model_proto.graph.node if n.op_type == "InstanceNormalization")
    bad = faults.set_attribute(prog.model_proto, node.name, "epsilon", 0.5)
    found = sbs_widget.culprits(sbs_widget.prepare(ep, bad), None, (x,))
    c = found[0]
    n = int(re.search(r"one of the (\d+) ONNX-only nodes", c.reason).group(1))
    assert n > 3 and len(c.group) == n and node.name in c.group and c.onnx_node not in c.group
    assert c.to_dict()["group"] == c.group


@pytest.mark.parametrize("kind", ["weight", "cast"])
def test_docs_api_documents_culprit_kinds_and_coverage(kind):
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "api.md").read_text()
    assert f"| `{kind}` |" in text and "coverage(records, prepared=None)" in text
