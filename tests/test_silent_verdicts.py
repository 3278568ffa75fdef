"""Verdicts that were silently wrong: two files from two programs (told apart by the exporter's
metadata, ``align/same_program.py``), and pairs that compared no finite element (all-NaN inputs)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from engine_models import export_module, exported

import sbs_widget
from sbs_widget import records as R
from sbs_widget.align.same_program import NODE, first_difference, parse_call
from sbs_widget.engine.entry import prepare
from sbs_widget.engine.metrics import compute_errors, compute_errors_many
from sbs_widget.engine.summary import summarize
from sbs_widget.errors import NothingJudgedWarning, ProgramMismatchWarning, SbsWidgetWarning


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


class GeluMlp(torch.nn.Module):
    def __init__(self, approximate: str = "none", scale: float = 0.5):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)
        self.approximate, self.scale = approximate, scale

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x), approximate=self.approximate) * self.scale)


X = (torch.randn(4, 16, generator=torch.Generator().manual_seed(3)),)
_EXPORTS: dict = {}


def _export(approximate="none", scale=0.5, optimize=False):
    key = (approximate, scale, optimize)
    if key not in _EXPORTS:
        _EXPORTS[key] = export_module(GeluMlp(approximate, scale), X, optimize=optimize)
    return _EXPORTS[key]


# -- two programs --------------------------------------------------------------------------------


@pytest.mark.parametrize("optimize", [False, True])
def test_gelu_approximations_paired_crosswise_are_told_apart(optimize):
    ep_exact, prog_exact = _export("none", optimize=optimize)
    ep_tanh, prog_tanh = _export("tanh", optimize=optimize)
    for ep, prog, exported_value, program_value in ((ep_exact, prog_tanh, "tanh", "none"),
                                                    (ep_tanh, prog_exact, "none", "tanh")):
        with pytest.warns(ProgramMismatchWarning) as caught:
            prepared = prepare(ep, prog.model_proto)
        message = str(caught[0].message)
        assert "'gelu'" in message and "'approximate'" in message
        assert f"'{exported_value}' in the ONNX model's metadata, '{program_value}' in this program" in message
        assert "not a translation bug" in message
        assert prepared.program_mismatch == message
        # said first in the summary, and once
        records = list(prepared.run(X))
        lines = summarize(records, prepared).lines()
        assert lines[0].startswith("WARNING: the ONNX model was exported from another program")
        assert sum(message[:60] in line for line in lines) == 1


def test_another_scale_constant_is_told_apart():
    ep, _ = _export(scale=0.5)
    _, prog = _export(scale=0.25)
    with pytest.warns(ProgramMismatchWarning, match=r"'mul'.*'other': '0.25' .*'0.5'"):
        prepare(ep, prog.model_proto)


def test_the_same_program_exported_twice_is_no_alarm():
    ep, _ = _export(scale=0.5)
    _, prog = export_module(GeluMlp(scale=0.5), X)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SbsWidgetWarning)
        assert prepare(ep, prog.model_proto).program_mismatch is None


@pytest.mark.parametrize("name", ["mlp", "convnet", "loud_convnet", "dummy_llm", "llama"])
@pytest.mark.parametrize("optimize", [False, True])
def test_correct_exports_raise_no_alarm(name, optimize):
    ep, prog, args, kwargs = exported(name, optimize)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ProgramMismatchWarning)
        assert prepare(ep, prog.model_proto).program_mismatch is None
        assert prepare(prog).program_mismatch is None
    # the check ran: the metadata of the nodes it compares parses
    texts = [n.metadata_props for n in prog.model_proto.graph.node]
    fx = [next((p.value for p in props if p.key == "pkg.torch.onnx.fx_node"), None) for props in texts]
    assert fx and all(parse_call(t) is not None for t in fx if t)
    assert first_difference(prog.exported_program, prepare(prog).index) is None


def test_parse_call_reads_the_printed_structure_and_refuses_garbage():
    text = ("%x : [num_users=1] = call_function[target=torch.ops.aten.sum.dim_IntList](args = (%mul, [-1, 2], "
            "True), kwargs = {dtype: torch.float32, size: [2, %s0]})")
    assert parse_call(text) == ("torch.ops.aten.sum.dim_IntList", [NODE, ["-1", "2"], "True"],
                                {"dtype": "torch.float32", "size": ["2", NODE]})
    assert parse_call("call_function[target=t](args = ((((, kwargs = {})") is None
    assert parse_call("call_function[target=t](args = (" + "[" * 100 + "]" * 100 + ",), kwargs = {})") is None
    assert parse_call("call_function[target=t](args = (1,), kwargs = {" + "x" * (1 << 17) + "})") is None
    assert parse_call("nothing of the kind") is None


# -- nothing finite compared ---------------------------------------------------------------------


def test_nan_figures_count_the_finite_elements_on_every_path():
    a = np.random.default_rng(0).random(300).astype(np.float32)
    nan = np.full_like(a, np.nan)
    half = a.copy()
    half[::2] = np.nan
    pairs = [(a, a + 1e-6), (nan, nan.copy()), (half, half.copy()), (a.astype(np.float64), a), (half, a)]
    expected = [300, 0, 150, 300, 150]
    assert [compute_errors(e, g, atol=1e-4, rtol=1e-4).n_finite for e, g in pairs] == expected
    assert [e.n_finite for e in compute_errors_many(pairs, atol=1e-4, rtol=1e-4)] == expected
    assert compute_errors(nan, nan, atol=1e-4, rtol=1e-4).within_tolerance  # NaN against NaN still agrees


def test_all_nan_inputs_are_no_judgement():
    model, (x,), _ = sbs_widget.samples.zoo.mlp()
    ep, prog = export_module(model, (x,))
    nan = (torch.full_like(x, float("nan")),)
    prepared = prepare(ep, prog.model_proto)
    records = list(prepared.run(nan))
    values = [r for r in records if r.kind in (R.KIND_NODE, R.KIND_OUTPUT, R.KIND_INPUT) and r.n_elements]
    assert values and all(r.status == R.OK and r.n_finite == 0 and R.NOTHING_FINITE in r.comment for r in values)
    assert all(r.n_finite == r.n_elements for r in records if r.kind == R.KIND_WEIGHT and r.n_elements)
    frame = sbs_widget.to_dataframe(records)
    assert "n_finite" in frame.columns and (frame.loc[frame.kind == "output", "n_finite"] == 0).all()
    summary = summarize(records, prepared)
    assert summary.n_nothing_finite == len(values)
    assert summary.lines()[0].startswith("WARNING: no finite value was compared")
    assert "inputs are NaN/Inf?" in summary.lines()[0]
    with pytest.warns(NothingJudgedWarning, match="cannot judge"):
        found = sbs_widget.find_culprits(records, prepared=prepared)
    assert found == [] and found.cannot_judge.startswith("cannot judge")
    with pytest.warns(NothingJudgedWarning):
        found = sbs_widget.culprits(ep, prog.model_proto, nan)
    assert found == [] and found.cannot_judge


def test_some_nan_elements_stay_judged():
    model, (x,), _ = sbs_widget.samples.zoo.mlp()
    ep, prog = export_module(model, (x,))
    mixed = x.clone()
    mixed[0] = float("nan")  # one batch row: the others stay finite all the way
    prepared = prepare(ep, prog.model_proto)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SbsWidgetWarning)
        records = list(prepared.run((mixed,)))
        found = sbs_widget.find_culprits(records, prepared=prepared)
    assert found == [] and found.cannot_judge is None
    outputs = [r for r in records if r.kind == R.KIND_OUTPUT]
    assert outputs and all(0 < r.n_finite < r.n_elements for r in outputs)
    assert not any(R.NOTHING_FINITE in r.comment for r in records)
    summary = summarize(records, prepared)
    assert summary.n_nothing_finite == 0 and summary.nothing_judged is None
    assert not summary.lines()[0].startswith("WARNING")


def test_a_fault_beside_nan_rows_is_still_found():
    """A mix: the finite rows are judged as usual, a wrong scale in the ONNX model is named."""
    ep, _ = _export(scale=0.5)
    _, prog = _export(scale=0.5)
    model = prog.model_proto.__deepcopy__()
    from onnx import numpy_helper

    for node in model.graph.node:  # the Constant holding 0.5 made 0.25: a translation fault
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value" and numpy_helper.to_array(attr.t).size == 1 and \
                        float(numpy_helper.to_array(attr.t)) == 0.5:
                    attr.t.CopyFrom(numpy_helper.from_array(np.array(0.25, dtype=numpy_helper.to_array(attr.t).dtype),
                                                            attr.t.name))
    mixed = X[0].clone()
    mixed[1] = float("nan")
    found = sbs_widget.culprits(ep, model, (mixed,))
    assert found and found.cannot_judge is None and found[0].ep_name == "mul"
