"""Reruns that restart at a kept cut before the first changed reset (engine/restart.py), on real exports:
the records are those of a full rerun, the ones upstream reused and marked."""

from __future__ import annotations

import pytest
import torch

from sbs_widget.engine.entry import prepare
from sbs_widget.engine.restart import REUSED
from sbs_widget.samples import zoo


@pytest.fixture(scope="module")
def llama():
    ep, prog, args, kwargs = zoo.export("llama", layers=4, hidden=64, seq=16, batch=2)
    return prepare(ep, prog.model_proto), args, kwargs


def _figures(records):
    """Each record's identity and figures (its comment without the reuse mark), in a stable order."""
    def key(r):
        comment = (r.comment or "").replace(f"; {REUSED}", "").replace(REUSED, "")
        return (str(r.kind), str(r.ep_name), str(r.onnx_name), r.status, repr(r.err_abs), repr(r.err_rel),
                repr(r.err_local), repr(r.noise), comment)
    return sorted(map(key, records))


def _pairs(records):
    return [r for r in records if r.kind == "node" and r.onnx_name and r.ep_name and r.status in ("ok", "noise")]


@pytest.mark.parametrize("depth", [0.1, 0.5, 0.9])
def test_a_restarted_rerun_gives_the_records_of_a_full_rerun(llama, depth):
    p, args, kwargs = llama
    first = list(p.run(args, kwargs))
    assert len(p.cache.run_cuts.cuts) >= 4  # spread over the depth
    target = _pairs(first)[int(len(_pairs(first)) * depth)].onnx_name
    restarted = list(p.run(args, kwargs, reset_names=[target]))
    reused = [r for r in restarted if REUSED in (r.comment or "")]
    full = list(p.run(args, kwargs, reset_names=[target], keep_cuts=0))
    assert not any(REUSED in (r.comment or "") for r in full)
    assert _figures(restarted) == _figures(full)
    assert "reset" in [r.status for r in restarted if r.onnx_name == target]
    # what was reused lies upstream of the reset, and the deeper the reset the more
    producer = p.index.producer
    assert reused and all(producer.get(r.onnx_name, -1) < producer[target] for r in reused if r.kind == "node")
    assert len(reused) >= depth * 0.5 * len(restarted)


def test_changing_the_reset_back_and_forth_stays_exact(llama):
    p, args, kwargs = llama
    pairs = _pairs(list(p.run(args, kwargs)))
    late, early = pairs[int(len(pairs) * 0.8)].onnx_name, pairs[int(len(pairs) * 0.3)].onnx_name
    runs = [list(p.run(args, kwargs, reset_names=names)) for names in ([late], [late, early], [late], [])]
    fulls = [list(p.run(args, kwargs, reset_names=names, keep_cuts=0)) for names in ([late], [late, early], [late], [])]
    for restarted, full in zip(runs, fulls):
        assert _figures(restarted) == _figures(full)


def test_other_inputs_or_options_never_restart(llama):
    p, args, kwargs = llama
    list(p.run(args, kwargs))
    other = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)  # same values, other tensors
    again = list(p.run(other, kwargs))
    assert not any(REUSED in (r.comment or "") for r in again)
    tighter = list(p.run(other, kwargs, atol=1e-6))
    assert not any(REUSED in (r.comment or "") for r in tighter)
    # a rerun with nothing changed restarts at the last cut: all but the end reused, same figures
    same = list(p.run(other, kwargs, atol=1e-6))
    assert any(REUSED in (r.comment or "") for r in same) and _figures(same) == _figures(tighter)


def test_the_cuts_stay_within_their_budget(llama):
    p, args, kwargs = llama
    list(p.run(args, kwargs, keep_cuts=200_000))
    kept = p.cache.run_cuts
    assert kept.nbytes <= 200_000 and kept.budget == 200_000


def test_float16_restarts_only_where_a_full_rerun_cuts_too():
    """onnxruntime's CPU provider keeps float16 values in float32 between nodes of one segment: a
    float16 rerun restarts at segment ends only, so its records stay those of a full rerun, also
    after a chain of reruns."""
    ep, prog, args, kwargs = zoo.export("llama", layers=4, hidden=64, seq=16, batch=2, dtype=torch.float16)
    p = prepare(ep, prog.model_proto)
    first = list(p.run(args, kwargs, segment_nodes=40))
    pairs = [r for r in _pairs(first) if r.onnx_name in p.index.producer]  # computed values only
    restarted_any = False
    for depth in (0.3, 0.8, 0.5):
        target = pairs[int(len(pairs) * depth)].onnx_name
        restarted = list(p.run(args, kwargs, reset_names=[target], segment_nodes=40))
        full = list(p.run(args, kwargs, reset_names=[target], segment_nodes=40, keep_cuts=0))
        assert _figures(restarted) == _figures(full), depth
        restarted_any |= any(REUSED in (r.comment or "") for r in restarted)
    assert restarted_any
    edges = {b for _, b in p.plan({p.index.producer[target]}, 40)}  # the last rerun's segment ends
    assert p.cache.run_cuts.cuts and all(c.start in edges for c in p.cache.run_cuts.cuts)
