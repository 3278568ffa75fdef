"""The rules the kernel and the view both apply, written once.

The data below is the single source: ``npm run build`` writes it into ``js/spec.gen.js``
(``python -m sbs_widget.shared_rules > js/spec.gen.js``), which ``js/rules.js`` reads to apply the
same rules in the browser. ``tests/test_shared_rules.py`` feeds the same records to both sides and fails
when the answers differ or when ``js/spec.gen.js`` is stale.

One error colour scale everywhere (table rows, the widget's graph panes, ``fx_graph``/``onnx_graph`` and
the offline graph page): absolute |err| on a log scale, green at 1e-7, yellow at ~3e-4, red at 1 and
beyond (NaN and inf count as the worst, like ``rows.error_key``). Chosen over the view's former
atol-relative ramp because a colour then depends on the record only: a DOT file or an offline page,
which know no atol, paint a node as the widget does, and changing atol in the view repaints nothing.
Whether a record is within tolerance is the status and the "beyond" filter's job. Colours are
``#rrggbbaa`` with the stop colour at alpha 0.55: over the graphs' white canvas that is the pastel the
black labels need, and on a dark notebook theme the table rows stay readable under light text.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys

from sbs_widget.records import (
    ERROR,
    HISTOGRAM_EDGES,
    MISMATCH,
    NOISE,
    OK,
    ONE_SIDED,
    RESET,
    STATUSES,
    TABLE_FIELDS,
    Record,
)

SEVERITY = {ERROR: 5, MISMATCH: 4, RESET: 3, NOISE: 2, OK: 1, ONE_SIDED: 0}
"""Worst first: the status a graph node (or cluster) shows when its records disagree."""

NO_VERDICT = (ONE_SIDED, ERROR)
"""Statuses that are neither within nor beyond tolerance: nothing was compared."""

EXACT_ELEM_TYPES = (2, 3, 4, 5, 6, 7, 9, 12, 13, 21, 22)
"""ONNX element types compared exactly (uint8/int8/uint16/int16/int32/int64/bool/uint32/uint64/uint4/
int4): a float tolerance means nothing for ids, indices or masks. The one list: ``engine.tolerance``'s
``Tolerance`` reads it from here (this module is below the engine in the flow, and the view reads it too)."""

SHAPE_TYPE = r"^T(\d+)s"
"""Leading element type of ``ep_shape_type``/``onnx_shape_type`` texts such as ``T7s2x3``."""

ROW_COLUMNS = TABLE_FIELDS
"""Order of the values in each encoded row (the row index is implicit: ``start`` + position): the record's
fields but ``metrics``, whose figures follow as one value per metric name (``metric_columns``)."""

METRIC_PREFIX = "metric:"
"""The view's key of a metric's column (``metric:cosine``): metric names come from users, the prefix keeps
them apart from the record's fields and from the view's own row keys (``i``, ``_search``, ``__proto__``)."""

NUMERIC_COLUMNS = ("i",) + tuple(
    f.name for f in dataclasses.fields(Record) if str(f.type).startswith(("int", "float")))
"""Columns holding numbers: a string there is a non-finite number (see ``NON_FINITE``)."""

SPREAD_PREFIX = "spread:"
"""The view's key of a spread column (``spread:err_abs_max``): the figures of a pair across the input sets of
``SbsWidget.from_input_sets`` (``views/sets_view.py``), after the metrics in each encoded row."""

SPREAD_FIELDS = ("err_abs_max", "err_abs_median", "n_beyond", "n_inputs", "worst_input", "worst_label",
                 "input_dependent")
"""The spread columns, in order (``steps.input_spread.PairSpread`` fields, the worst input's label and
whether the pair is input-dependent): each prefixed with ``SPREAD_PREFIX``."""

SPREAD_NUMERIC = ("err_abs_max", "err_abs_median", "n_beyond", "n_inputs", "worst_input")
"""The spread columns holding numbers (a string there is a non-finite number)."""

B_STATUSES = ("same", "follows a", "departs", "rounding", "inherits")
"""Values of ``Record.b_status`` (``twomodels/verdicts.py``): b's value against torch's, told apart from a's."""

B_DEPARTS = ("departs", "inherits")
"""The b statuses the view's "b departs" filter keeps: b's own nodes depart there, or inherit a departure."""

B_PAINT = {"same": OK, "follows a": MISMATCH, "departs": MISMATCH, "rounding": NOISE, "inherits": MISMATCH}
"""The status a node of b is painted with in its graph (``error_color`` of ``b_err_abs``, as a's nodes)."""

NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
"""JSON has no NaN/Infinity: they travel as these strings, which JS ``Number()`` reads back."""

BROADCAST = 6
"""A graph node read by this many others is drawn as stubs next to each reader."""

GRAPH_SPEC_MARKER = "sbs-graph-spec "
"""Starts the DOT comment (``// sbs-graph-spec {json}``) that carries a graph's structure to the view."""

MESSAGES = {"get_rows": "get_rows", "rows": "rows", "rerun": "rerun", "stop": "stop", "step": "step", "input": "input"}
"""Custom messages between the view and the kernel (``content["type"]``)."""

COLOR_SCALE = {
    "log_lo": -7.0,  # |err| at or below 1e-7: the first stop
    "log_hi": 0.0,  # |err| at or above 1 (and NaN, inf): the last stop
    "stops": ("#1a9850", "#fee08b", "#d73027"),
    "alpha": "8c",  # 0.55
    "not_compared": "#ffffff00",
    "one_sided": "#8080802e",  # #e8e8e8 over white
    "error": "#7b329476",  # #c2a5cf over white
    "error_line": "#7b3294",
    "noise": "#6baed68c",  # beyond tolerance by rounding alone: blue, off the green-red error scale
    "reset_line": "#1f5fbf",
    "stub": "#f0f0f0",  # the small copies of a value read everywhere (BROADCAST)
}

# Characters that hide, reorder or break text, shown as escapes in every view (code point ranges):
# C0/C1 controls, soft hyphen, Arabic letter mark, Mongolian vowel separator, zero-width and bidi
# marks, line/paragraph separators, bidi embeddings and overrides, word joiner to bidi isolates and
# deprecated format characters, BOM, interlinear annotations, lone surrogates, tag characters.
HIDDEN_RANGES = ((0x00, 0x1F), (0x7F, 0x9F), (0xAD, 0xAD), (0x61C, 0x61C), (0x180E, 0x180E), (0x200B, 0x200F),
                 (0x2028, 0x202E), (0x2060, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0xD800, 0xDFFF),
                 (0xE0000, 0xE007F))

SPEC = {
    "STATUSES": STATUSES,
    "HIDDEN_RANGES": HIDDEN_RANGES,
    "SEVERITY": SEVERITY,
    "NO_VERDICT": NO_VERDICT,
    "EXACT_ELEM_TYPES": EXACT_ELEM_TYPES,
    "SHAPE_TYPE": SHAPE_TYPE,
    "ROW_COLUMNS": ROW_COLUMNS,
    "NUMERIC_COLUMNS": NUMERIC_COLUMNS,
    "METRIC_PREFIX": METRIC_PREFIX,
    "SPREAD_PREFIX": SPREAD_PREFIX,
    "SPREAD_FIELDS": SPREAD_FIELDS,
    "SPREAD_NUMERIC": SPREAD_NUMERIC,
    "B_STATUSES": B_STATUSES,
    "B_DEPARTS": B_DEPARTS,
    "B_PAINT": B_PAINT,
    "NON_FINITE": NON_FINITE,
    "BROADCAST": BROADCAST,
    "GRAPH_SPEC_MARKER": GRAPH_SPEC_MARKER,
    "HISTOGRAM_EDGES": HISTOGRAM_EDGES,  # left edges of Record.histogram buckets, last one open
    "MESSAGES": MESSAGES,
    "COLOR_SCALE": COLOR_SCALE,
}

_SHAPE_TYPE = re.compile(SHAPE_TYPE)
_STOPS = [tuple(int(s[k:k + 2], 16) for k in (1, 3, 5)) for s in COLOR_SCALE["stops"]]


def json_value(value):
    """``value`` as JSON can hold it: non-finite floats as ``NON_FINITE`` strings, tuples as lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return NON_FINITE["nan"] if math.isnan(value) else NON_FINITE["inf" if value > 0 else "-inf"]
    if isinstance(value, tuple):
        return list(value)
    return value


def is_exact(record) -> bool:
    """Whether a side of ``record`` holds integers or bools (by its shape text, ``T7s2x16``)."""
    for text in (record.ep_shape_type, record.onnx_shape_type):
        m = _SHAPE_TYPE.match(text) if text else None
        if m and int(m.group(1)) in EXACT_ELEM_TYPES:
            return True
    return False


def metric_columns(names) -> list[str]:
    """The view's column keys of the metrics ``names`` (``METRIC_PREFIX`` + name), in order."""
    return [METRIC_PREFIX + name for name in names]


def spread_columns() -> list[str]:
    """The view's column keys of the spread (``SPREAD_PREFIX`` + field), in order."""
    return [SPREAD_PREFIX + name for name in SPREAD_FIELDS]


def worse(paint: tuple | None, err: float | None, status: str) -> tuple:
    """``(err, status)`` of a node after one more record: the largest error (NaN wins), worst status."""
    if paint is None:
        return err, status
    old, old_status = paint
    if old is None:
        e = err
    elif err is None:
        e = old
    elif math.isnan(old) or math.isnan(err):
        e = math.nan
    else:
        e = max(old, err)
    return e, (status if SEVERITY.get(status, 0) > SEVERITY.get(old_status, 0) else old_status)


def error_color(err: float | None) -> str:
    """Colour of an absolute error on the scale (``None``: nothing compared).

    >>> error_color(0.0), error_color(1e-4), error_color(1.0), error_color(float("nan"))
    ('#1a98508c', '#ddd6838c', '#d730278c', '#d730278c')
    """
    if err is None:
        return COLOR_SCALE["not_compared"]
    lo, hi = COLOR_SCALE["log_lo"], COLOR_SCALE["log_hi"]
    t = 1.0 if not math.isfinite(err) else (math.log10(max(err, 1e-30)) - lo) / (hi - lo)
    t = min(max(t, 0.0), 1.0) * (len(_STOPS) - 1)
    i = min(int(t), len(_STOPS) - 2)
    a, b, f = _STOPS[i], _STOPS[i + 1], t - i
    # floor(x + 0.5): JS Math.round, where Python's round() would round halves to even
    return "#" + "".join("%02x" % math.floor(x + (y - x) * f + 0.5) for x, y in zip(a, b)) + COLOR_SCALE["alpha"]


def color_for(err: float | None, status: str | None) -> str:
    """Colour of a record (or a node's worst paint) by its error and status."""
    if status == ERROR:
        return COLOR_SCALE["error"]
    if status == ONE_SIDED and err is None:
        return COLOR_SCALE["one_sided"]
    if status == NOISE:
        return COLOR_SCALE["noise"]
    return error_color(err)


def js_module() -> str:
    """``js/spec.gen.js``: one ``export const`` per entry of ``SPEC``, deterministic (sorted keys)."""
    lines = ["// Generated by `python -m sbs_widget.shared_rules` (npm run build): do not edit.",
             "// The source is sbs_widget/shared_rules.py; tests/test_shared_rules.py checks it is current."]
    for name, value in SPEC.items():
        text = json.dumps(value, sort_keys=True)
        frozen = f"Object.freeze({text})" if isinstance(value, (dict, tuple)) else text
        lines.append(f"export const {name} = {frozen};")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(js_module())
