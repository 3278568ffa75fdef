"""How records travel to the view, and what changed between two runs.

Rows go to the front end as JSON inside binary buffers (one buffer per batch, rows as arrays in
``ROW_COLUMNS`` order): JSON keeps strings exact and is parsed natively by the browser; the buffer keeps
them out of the trait state, which is resent whole on every change.
"""

from __future__ import annotations

import json
import math
from typing import Iterable, Sequence

from sbs_widget.records import RESET, Record
from sbs_widget.shared_rules import ROW_COLUMNS, json_value, within

# The rules the view applies too live in shared_rules (re-exported here for the modules that use them).

__all__ = ["ROW_COLUMNS", "compare_runs", "decode_rows", "encode_rows", "error_key", "json_value", "record_key",
           "within", "worst"]


def encode_rows(records: Sequence[Record]) -> bytes:
    """UTF-8 JSON of ``[[v, ...], ...]``, one array per record in ``ROW_COLUMNS`` order."""
    rows = [[json_value(getattr(r, name)) for name in ROW_COLUMNS] for r in records]
    return json.dumps(rows, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


def decode_rows(payload: bytes) -> list[dict]:
    """Inverse of ``encode_rows`` as dicts (tests and reports)."""
    return [dict(zip(ROW_COLUMNS, row)) for row in json.loads(payload.decode("utf-8"))]


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
