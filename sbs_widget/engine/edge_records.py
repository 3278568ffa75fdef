"""The records at the edges of a lockstep run: inputs and weights before the first segment, the
user's nodes no record names and the outputs after the last."""

from __future__ import annotations

from typing import Iterator

import torch

from sbs_widget import records as R
from sbs_widget.align.fx_graph import program_outputs
from sbs_widget.dtypes import numpy_elem_type
from sbs_widget.engine.measure import _join
from sbs_widget.engine.metrics import BATCH_ELEMENTS
from sbs_widget.engine.run_parts import RunParts
from sbs_widget.errors import InputError
from sbs_widget.records import Record


def record(parts: RunParts, fx_name: str | None, onnx_name: str | None, kind: str, how: str = "") -> Record:
    """A record of the pair's fields, with the FX node's time when it ran."""
    rec = Record(*parts.p.record_fields(fx_name, onnx_name, kind, how))
    if fx_name is not None:
        rec.ep_time_run = parts.fx.state.times.get(fx_name)
    return rec


def inputs(parts: RunParts) -> Iterator[Record]:
    """The model inputs, fed to the ONNX side as torch has them (checked against the model's types)."""
    p, onnx = parts.p, parts.onnx
    for fx_name, onnx_name in p.alignment.input_pairs:
        value = parts.fx.env[fx_name]
        if not isinstance(value, torch.Tensor):
            continue
        try:
            arr = onnx.to_feed(value, onnx_name)
        except (TypeError, ValueError) as e:
            raise InputError(f"input {fx_name!r} cannot be fed to the ONNX model: {e}") from e
        onnx.env[onnx_name] = arr
        onnx.state.shapes[onnx_name] = arr.shape
        rec = record(parts, fx_name, onnx_name, R.KIND_INPUT)
        vt = p.index.types.get(onnx_name)
        if vt is not None and vt.elem_type and vt.elem_type != numpy_elem_type(arr):
            raise InputError(f"input {fx_name!r}: the ONNX model expects element type {vt.elem_type}")
        rec = parts.measurer.compare(rec, value, arr)
        if rec.status == R.MISMATCH:
            parts.judge.add_source(fx_name)
        yield rec


def weights(parts: RunParts) -> Iterator[Record]:
    """Weights measured a batch at a time (a few vectorized passes for many small weights; the
    batch is bounded so that transposed copies never add up to the weights' size)."""
    p = parts.p
    env, onnx_weights = parts.fx.env, p.weights()
    batch: list[tuple[Record, object, object]] = []
    elements = 0
    for fields, placeholder, onnx_name, transposed in p.weight_records():
        rec = Record(*fields)
        if onnx_name is None:  # nothing to compare (see the record's comment)
            batch.append((rec, None, None))
            continue
        expected = env[placeholder].t() if transposed else env[placeholder]
        if onnx_weights.is_exactly(onnx_name, expected):  # the file's bits are torch's: errors all 0
            batch.append((parts.measurer.identical(rec, expected), None, None))
            continue
        got = onnx_weights[onnx_name]
        batch.append((rec, expected, got))
        elements += got.size
        if elements >= BATCH_ELEMENTS:
            yield from _weight_batch(parts, batch)
            batch, elements = [], 0
    yield from _weight_batch(parts, batch)


def _weight_batch(parts: RunParts, batch: list[tuple[Record, object, object]]) -> Iterator[Record]:
    """The weight records of ``batch``, measured; weights are copied, not computed: one that
    differs beyond rounding of its type is a mismatch even within tolerance, and a source."""
    measurer, judge, reference = parts.measurer, parts.judge, parts.options.reference
    measurer.compare_many([x for x in batch if x[1] is not None])
    for rec, expected, got in batch:
        if reference and expected is not None and rec.status == R.OK and rec.err_abs:
            judge.weight_beyond_rounding(rec, expected, got)
        if rec.status == R.MISMATCH:
            judge.add_source(rec.ep_name)
        if expected is not None:
            measurer.check_exc(rec)
        yield rec


def unrecorded(parts: RunParts) -> Iterator[Record]:
    """One one-sided record per node of the user's program no other record names, with why (a
    no-op the decomposition removed, folded from constants, no output depends on it)."""
    for node in parts.p.unrecorded:
        yield Record(ep_name=node.name, ep_target=node.target, ep_origin=node.name, module=node.module,
                     status=R.ONE_SIDED, kind=R.KIND_NODE, comment=f"not in the program the exporter "
                                                                  f"translated: {node.reason}")


def outputs(parts: RunParts) -> Iterator[Record]:
    """The model outputs, last; beyond tolerance, judged against the whole program in float64."""
    p, onnx = parts.p, parts.onnx
    env = parts.fx.env
    out: list[Record] = []
    compared: list[tuple[Record, str | None, object, object]] = []
    for pos, (fx_val, onnx_name) in enumerate(zip(program_outputs(p.decomposed_ep), p.index.outputs)):
        fx_name = fx_val.name if isinstance(fx_val, torch.fx.Node) else None
        rec = record(parts, fx_name, onnx_name, R.KIND_OUTPUT)
        rec.ep_name = rec.ep_name or f"output[{pos}]"
        rec.comment = _join(f"output {pos}", rec.comment)
        expected = env.get(fx_name) if fx_name is not None else fx_val
        why = _unavailable(parts, fx_name, onnx_name)
        if why:
            rec.status = R.ERROR
            rec.comment = _join(rec.comment, why)
        elif expected is None:
            rec.status = R.ONE_SIDED
            rec.comment = _join(rec.comment, "torch output is None")
        else:
            expected = expected if isinstance(expected, torch.Tensor) else torch.tensor(expected)
            got = onnx.value(onnx_name)
            rec = parts.measurer.compare(rec, expected, got)
            compared.append((rec, fx_name, expected, got))
        out.append(rec)
    if parts.options.reference:
        parts.judge.judge_outputs(compared)
    for rec in out:
        if rec.status in (R.MISMATCH, R.NOISE, R.OK) and rec.kind == R.KIND_OUTPUT:
            parts.measurer.check_exc(rec)
        yield rec


def _unavailable(parts: RunParts, fx_name: str | None, onnx_name: str) -> str:
    """Why an output pair cannot be compared ('' when it can)."""
    errors = parts.onnx.state.errors
    if onnx_name in errors:
        return errors[onnx_name]
    if fx_name is not None and fx_name not in parts.fx.env:
        return "torch value unavailable"
    if onnx_name not in parts.onnx.env and onnx_name not in parts.p.index.initializers:
        return "ONNX value unavailable"
    return ""
