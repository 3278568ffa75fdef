"""The records of one segment, in node order: built first (``_build``), measured together
(``Measurer.compare_many``), given node-local errors and verdicts (``_judge``), then yielded with the
resets and ``exc`` acting in order (``records``)."""

from __future__ import annotations

from typing import Iterator

import numpy as np

from sbs_widget import records as R
from sbs_widget.engine.measure import _failed, _join
from sbs_widget.engine.record_plan import only_onnx_reasons
from sbs_widget.engine.run_parts import RunParts
from sbs_widget.engine.segments import Segment
from sbs_widget.records import Record

# (record, FX node holding the torch value, ONNX value) compared; (record, None, None) otherwise
Entry = tuple[Record, "str | None", "str | None"]


class _Built:
    """A segment's records as built: entries in node order, the pairs to measure, the inner ones."""

    def __init__(self):
        self.entries: list[Entry] = []
        self.compares: list[tuple[Record, object, object]] = []
        self.inner: list[tuple[Record, object, object]] = []
        self.shapes: list[tuple[Record, str]] = []  # (record of a reshaped alias, the torch value's shape)
        self.local_inner: dict = {}  # inner values' node-local values (half precision: recomputed apart)


def records(parts: RunParts, seg: Segment, seconds: float) -> Iterator[Record]:
    """The records of ``seg`` (run ``seconds``), in node order."""
    local = parts.local.run(seg) if parts.options.node_local else {}
    built = _build(parts, seg, seconds)
    parts.measurer.compare_many(built.compares)
    for rec, shape_type in built.shapes:  # the record tells the torch value's own shape
        rec.ep_shape_type = shape_type
    _judge(parts, seg, built, local)
    yield from _reset_and_yield(parts, built.entries)


def _build(parts: RunParts, seg: Segment, seconds: float) -> _Built:
    p, onnx, inner_values = parts.p, parts.onnx, parts.inner
    built = _Built()
    inner_pairs = p.inner.pairs
    if p.pair.half:  # inner values recomputed apart, not handed back by the segment (inner_run.py)
        apart = [o for o, *_ in p.segment_records(seg.start, seg.end) if o in inner_pairs
                 and not inner_pairs[o].constant]
        inner_values.apart = inner_values.recompute_apart(apart, False) if apart else {}
        if apart and parts.options.node_local:
            built.local_inner = inner_values.recompute_apart(apart, True)
    onnx_time = seconds / max(1, seg.end - seg.start)
    for o, fx_name, fields, aliases in p.segment_records(seg.start, seg.end):
        rec = Record(*fields)
        if o in onnx.hidden:  # not computed by the deployed graph
            for r in [rec] + [Record(*f) for _, f in aliases]:
                r.status, r.comment = R.ONE_SIDED, onnx.vanished[o]
                built.entries.append((r, None, None))
        elif o in inner_pairs:  # inside a translation, paired with a finer torch reference
            item = inner_values.item(rec, o)
            built.entries.append((rec, None, o if item[1] is not None else None))
            if item[1] is not None:
                built.compares.append(item)
                built.inner.append(item)
        elif fx_name is None:  # ONNX only
            built.entries.append((_onnx_only(parts, rec, o), None, None))
        else:
            rec.ep_time_run = parts.fx.state.times.get(fx_name)
            rec.onnx_time_run = onnx_time
            _pair(parts, built, rec, fx_name, o)
            for alias, alias_fields in aliases:
                _alias(parts, built, Record(*alias_fields), alias, fx_name, o)
    return built


def _onnx_only(parts: RunParts, rec: Record, o: str) -> Record:
    p = parts.p
    rec.inner_of = p.inner.of.get(o)
    rec.status = R.ONE_SIDED
    rec.comment = rec.comment or only_onnx_reasons(p.pair, p.cache).get(p.index.producer.get(o, -1), "ONNX only")
    errors = parts.onnx.state.errors
    if o in errors:
        rec.status = R.ERROR
        rec.comment = _join(rec.comment, errors[o])
    return rec


def _pair(parts: RunParts, built: _Built, rec: Record, fx_name: str, o: str) -> None:
    env, onnx_env, onnx_errors = parts.fx.env, parts.onnx.env, parts.onnx.state.errors
    if o in onnx_errors:
        built.entries.append(_failed(rec, onnx_errors[o]))
    elif fx_name not in env:
        built.entries.append(_failed(rec, parts.fx.state.errors.get(
            fx_name, "torch value unavailable (an upstream FX node failed)")))
    elif o not in onnx_env:
        built.entries.append(_failed(rec, "ONNX value unavailable"))
    else:
        built.compares.append((rec, env[fx_name], onnx_env[o]))
        built.entries.append((rec, fx_name, o))


def _alias(parts: RunParts, built: _Built, rec: Record, alias: str, fx_name: str, o: str) -> None:
    """An FX no-op removed by the optimizer, or a duplicate it merged: measured with its twin's ONNX value."""
    alignment, env, onnx_env = parts.p.alignment, parts.fx.env, parts.onnx.env
    rec.ep_time_run = parts.fx.state.times.get(alias)
    # A duplicate's value is its twin's (same op, same inputs), a reshaped alias's its twin's
    # reshaped: measured with the twin's torch value, so that the FX side need not run ahead
    # to it (it may be layers later: LLaMA's rotary cos unsqueezed in every layer).
    holder = fx_name if alias in alignment.duplicate_of or alias in alignment.reshaped else alias
    if holder not in env or o not in onnx_env:
        built.entries.append(_failed(rec, "value unavailable"))
        return
    value = env[holder]
    if alias in alignment.reshaped:  # the same elements in the ONNX value's shape
        try:
            value = value.reshape(np.shape(onnx_env[o]))
        except (RuntimeError, AttributeError) as e:
            built.entries.append(_failed(rec, f"cannot reshape the torch value to the ONNX value's shape: {e}"))
            return
        built.shapes.append((rec, rec.ep_shape_type))
    built.compares.append((rec, value, onnx_env[o]))
    built.entries.append((rec, holder, o))


def _judge(parts: RunParts, seg: Segment, built: _Built, local: dict) -> None:
    """Node-local errors where a verdict needs them, then the verdicts (in node order)."""
    options, entries = parts.options, built.entries
    if options.reference and not options.node_local:  # node-local values where a verdict needs them
        beyond = {o for rec, fx, o in entries if rec.status == R.MISMATCH and fx is not None}
        if beyond:
            local = parts.local.run(seg, beyond)
    local_scale: dict[int, float] = {}
    if local:  # (an alias's torch value is its twin's: the same node-local run measures it)
        local_scale = parts.local.errors([(rec, fx, o) for rec, fx, o in entries
                                          if o in local and fx is not None and rec.status != R.ERROR], local)
    if options.reference:
        parts.judge.judge_segment(entries, local, local_scale)
    if built.inner:
        parts.inner.verdicts(built.inner, built.local_inner if parts.p.pair.half else local)


def _reset_and_yield(parts: RunParts, entries: list[Entry]) -> Iterator[Record]:
    reset, exc = parts.options.reset, parts.options.exc
    p, onnx, env = parts.p, parts.onnx, parts.fx.env
    inner_pairs, onnx_to_fx = p.inner.pairs, p.alignment.onnx_to_fx
    for rec, fx_name, o in entries:
        if rec.kind == R.KIND_INNER and o is not None and o in reset and o in inner_pairs:
            parts.inner.reset(rec, o)
        if reset and o is not None and o in reset and rec.ep_name == fx_name == onnx_to_fx.get(o):
            try:
                onnx.env[o] = onnx.to_feed(env[fx_name], o)
                rec.status = R.RESET
                rec.comment = _join(rec.comment, "reset: downstream ONNX nodes read the torch value")
            except (TypeError, ValueError) as e:
                rec.comment = _join(rec.comment, f"cannot reset: {e}")
        if exc and fx_name is not None:
            parts.measurer.check_exc(rec)
        yield rec
