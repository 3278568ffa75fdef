"""The engine's core (issue 46): the pair is an immutable value, the options that change it are part
of every cache key, a run is made of parts whose state is one ``RunState``, and one ``Tolerance``
rule judges the engine's pairs and the views' alike."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from engine_models import exported

from sbs_widget.align.pair import INNER_ENV, Pair
from sbs_widget.engine.entry import prepare
from sbs_widget.engine.fx_runner import flat_inputs
from sbs_widget.engine.lockstep import LockstepRun
from sbs_widget.engine.run_parts import RunOptions
from sbs_widget.engine.run_state import RunState
from sbs_widget.engine.runtimes import Capabilities, capabilities, get_runtime
from sbs_widget.engine.tolerance import Tolerance
from sbs_widget.samples import faults


def test_the_pair_is_immutable():
    ep, prog, args, kwargs = exported("dummy_llm", False)
    p = prepare(ep, prog.model_proto)
    assert isinstance(p.pair, Pair)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.pair.alignment = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.schedule.live_bytes = 0


def test_an_option_that_changes_records_is_part_of_the_cache_key(monkeypatch):
    """Inner values off (``SBS_WIDGET_INNER=0``) within one process: a pair prepared again, whose inner
    values stay one-sided; back on: compared again (before, the old plan came back)."""
    ep, prog, args, kwargs = exported("dummy_llm", False)
    model = prog.model_proto  # (each .model_proto is a new object: the cache keys by identity and content)
    on = prepare(ep, model)
    inner_on = [r for r in on.run(args, kwargs) if r.kind == "inner" and r.status != "one-sided"]
    assert inner_on, "the dummy LLM has compared inner values"
    monkeypatch.setenv(INNER_ENV, "0")
    off = prepare(ep, model)
    assert off is not on and not off.pair.options.inner_values and off.cache.key == off.pair.options
    assert not [r for r in off.run(args, kwargs) if r.kind == "inner" and r.status != "one-sided"]
    monkeypatch.setenv(INNER_ENV, "1")
    assert prepare(ep, model) is on


def test_a_run_is_parts_over_one_state():
    """The run object holds a handful of attributes; the parts share one RunState, which is what a
    restart copies (``restart.restore``)."""
    ep, prog, args, kwargs = exported("dummy_llm", False)
    p = prepare(ep, prog.model_proto)
    run = LockstepRun(p, flat_inputs(p.decomposed_ep, args, kwargs), get_runtime(),
                      RunOptions(p.tolerance(), segment_nodes=10, keep_cuts=0))
    records = list(run.records())
    assert len(vars(run)) <= 15, sorted(vars(run))
    parts, state = run.parts, run.parts.state
    assert isinstance(state, RunState)
    assert parts.fx.env is state.fx.env and parts.onnx.env is state.onnx.env
    assert parts.judge.state is state.judged and parts.judge.fx_env is state.fx.env
    assert state.done == p.schedule.n_fx_nodes and records


def test_a_runtime_declares_its_capabilities_or_gets_the_defaults():
    class Plain:
        name = "plain"

        def compile(self, model):
            return get_runtime().compile(model)

    assert capabilities(Plain()) == Capabilities()
    ours = capabilities(get_runtime())
    assert ours.compiles_in_background and ours.accepts_serialized
    ep, prog, args, kwargs = exported("mlp", False)
    plain = [(r.ep_name, r.status) for r in prepare(ep, prog.model_proto).run(args, kwargs, runtime=Plain())]
    assert plain == [(r.ep_name, r.status) for r in prepare(ep, prog.model_proto).run(args, kwargs)]


def test_the_tolerance_at_another_atol_is_the_element_wise_rule():
    """``Tolerance.within_record`` at an atol other than the run's gives what the element-wise rule
    gives on the arrays themselves (``Record.min_atol``), for every compared record of a faulty run."""
    ep, prog, args, kwargs = exported("mlp", False)
    model = prog.model_proto
    name = next(i.name for i in model.graph.initializer if "weight" in i.name)
    bad = faults.perturb_initializer(model, name, scale=1e-3)
    arrays = {}

    def keep(e, g):
        arrays[len(arrays)] = (np.asarray(e, np.float64).copy(), np.asarray(g, np.float64).copy())
        return float(len(arrays) - 1)

    p = prepare(ep, bad)
    tol = p.tolerance()
    records = [r for r in p.run(args, kwargs, metrics={"k": keep}) if r.metrics]
    checked = 0
    for rec in records:
        e, g = arrays[int(rec.metrics["k"])]
        for atol in (1e-6, 1e-4, 1e-3, 1e-2):
            with np.errstate(invalid="ignore"):
                expected = bool(np.all(np.abs(g - e) <= atol + tol.rtol * np.abs(e)))
            assert tol.within_record(rec, atol) == expected, (rec.ep_name, atol)
            checked += 1
    assert checked > 20
    assert Tolerance.resolve(None, None, torch.float16).atol == 1e-3
    assert tuple(Tolerance.resolve(2e-4, None, None)) == (2e-4, 1e-4)
