"""How records travel to the view, and what changed between two runs.

Rows go to the front end as JSON inside binary buffers (one buffer per batch, rows as arrays in
``ROW_COLUMNS`` order): JSON keeps strings exact and is parsed natively by the browser; the buffer keeps
them out of the trait state, which is resent whole on every change.
"""

from __future__ import annotations

import json
import math
from typing import Callable, Iterable, Sequence

from sbs_widget.engine.tolerance import Tolerance
from sbs_widget.records import RESET, Record
from sbs_widget.shared_rules import NO_VERDICT, ROW_COLUMNS, json_value, metric_columns

# The rules the view applies too live in shared_rules (re-exported here for the modules that use them);
# ``within`` is the engine's Tolerance rule (shared_rules is below the engine in the flow).

__all__ = ["ROW_COLUMNS", "columns_of", "compare_runs", "decode_rows", "encode_rows", "error_key", "json_value",
           "record_key", "run_metrics", "within", "worst"]


def columns_of(metrics: Sequence[str] = ()) -> list[str]:
    """The view's columns of a run measuring ``metrics``: ``ROW_COLUMNS``, then one ``metric:<name>`` per
    metric (``shared_rules.METRIC_PREFIX``): the widget's ``columns`` trait, the order ``encode_rows`` writes."""
    return list(ROW_COLUMNS) + metric_columns(metrics)


def run_metrics(metrics) -> tuple[object, list[str]]:
    """``metrics=`` of a widget checked (``engine.user_metrics.resolve_metrics``: ``InputError`` for a bad
    one): ``(what to pass to the run, None when no metric, their names)``."""
    from sbs_widget.engine.user_metrics import resolve_metrics

    names = [f.name for f in resolve_metrics(metrics)]
    return (metrics if names else None), names


def encode_rows(records: Sequence[Record], metrics: Sequence[str] = (),
                extra: Callable[[Record], list] | None = None) -> bytes:
    """UTF-8 JSON of ``[[v, ...], ...]``, one array per record in ``columns_of(metrics)`` order: its
    ``ROW_COLUMNS`` values, then the figure of each metric (null where the record has none), then
    ``extra(record)``'s values when given (the spread columns of input sets: ``views/sets_view.py``)."""
    rows = []
    for r in records:
        row = [json_value(getattr(r, name)) for name in ROW_COLUMNS]
        if metrics:
            figures = r.metrics or {}
            row += [json_value(figures.get(name)) for name in metrics]
        if extra is not None:
            row += [json_value(v) for v in extra(r)]
        rows.append(row)
    return json.dumps(rows, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def decode_rows(payload: bytes, metrics: Sequence[str] = (), extra: Sequence[str] = ()) -> list[dict]:
    """Inverse of ``encode_rows`` as dicts keyed by ``columns_of(metrics)`` then ``extra`` (tests, reports)."""
    columns = columns_of(metrics) + list(extra)
    return [dict(zip(columns, row)) for row in json.loads(payload.decode("utf-8"))]


def within(record, atol: float, rtol: float, run_atol: float, run_rtol: float) -> bool | None:
    """Whether ``record`` is within tolerance when the view's atol is ``atol``; ``None`` when nothing was
    compared. The rule is the engine's, ``Tolerance.within_record``: at the run's atol the record's own
    verdict; at another the element-wise rule itself, ``min_atol <= atol`` (``min_atol``: the smallest atol
    every element passes at the run's rtol); integer and bool pairs exact, a NaN/Inf disagreement beyond
    any tolerance.

    ``rtol``: the view's. The figures are measured at the run's rtol and cannot tell the element-wise
    verdict at another, so a record is judged at ``run_rtol`` whatever ``rtol`` says: the widget reruns
    the comparison when its rtol changes (a view of saved records says the rtol applies on a rerun). Same
    rule as js/rules.js ``isWithin`` (tests/test_shared_rules.py feeds both the same records).
    """
    if record.err_abs is None or record.status in NO_VERDICT:
        return None
    return Tolerance(run_atol, run_rtol).within_record(record, atol)


def error_key(err: float | None) -> float:
    """Sort key of an error: NaN counts as the worst (it is, for a comparison)."""
    if err is None:
        return -1.0
    return math.inf if math.isnan(err) else err


def worst(records: Iterable[Record], skip_reset: bool = False) -> dict | None:
    """``{"i", "err_abs", "name"}`` of the record with the largest err_abs, or None.

    ``skip_reset``: ignore reset records, whose error a reset experiment has already accounted for.
    """
    best = None
    for i, r in enumerate(records):
        if r.err_abs is None or (skip_reset and r.status == RESET):
            continue
        if best is None or error_key(r.err_abs) > error_key(best[1].err_abs):
            best = (i, r)
    if best is None:
        return None
    i, r = best
    return {"i": i, "err_abs": json_value(r.err_abs), "name": r.ep_name or r.onnx_name or ""}


def record_key(record: Record) -> tuple:
    """Identity of a compared pair across runs of the same prepared comparison."""
    return (record.kind, record.ep_name, record.onnx_name)


def compare_runs(before, after, atol: float, rtol: float, limit: int = 200) -> dict:
    """What changed from run ``before`` to run ``after`` (both ``widget_run.Run``), judged at (atol, rtol).

    ``moved_in``: pairs beyond tolerance before and within it after; ``moved_out``: the reverse.
    Worst errors leave reset records out: the question after a reset is what remains downstream.
    Lists are cut at ``limit`` names; ``n_moved_*`` count them all.
    """
    old = {record_key(r): within(r, atol, rtol, before.atol, before.rtol) for r in before.records}
    moved_in, moved_out = [], []
    for r in after.records:
        was = old.get(record_key(r))
        now = within(r, atol, rtol, after.atol, after.rtol)
        if was is None or now is None or was == now:
            continue
        (moved_in if now else moved_out).append(r.ep_name or r.onnx_name or "")
    return {
        "before": before.id,
        "after": after.id,
        "worst_before": worst(before.records, skip_reset=True),
        "worst_after": worst(after.records, skip_reset=True),
        "n_moved_in": len(moved_in),
        "n_moved_out": len(moved_out),
        "moved_in": moved_in[:limit],
        "moved_out": moved_out[:limit],
    }
