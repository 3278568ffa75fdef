"""The report as Markdown short enough for a pull request comment: the verdict, the worst outputs,
the culprits, the status counts and the versions, in link-free tables.

Model names may come from anyone (``|``, backticks, newlines, ``<script>``, bidi overrides, URLs,
100,000 characters). Every string that comes from the model or the report is written as a code span
(``code``): no emphasis, link, autolink, mention or HTML is read inside one; its backtick fence is
longer than any run of backticks in it, ``|`` is escaped for the table, control and bidi characters
are written as visible escapes (``\\u202e``) and long names are cut. The rest is this module's own
words and numbers.

>>> code("a|b`c")
'``a\\\\|b`c``'
>>> code("")
'-'
"""

from __future__ import annotations

import math
import re

from sbs_widget.gate.verdict import AGREE, CANNOT_JUDGE, MISMATCH, NOISE, headline
from sbs_widget.safe_text import clipped, visible

NAME_LIMIT = 80      # characters of a name in a cell
REASON_LIMIT = 300   # characters of a culprit's reason
TOP_CULPRITS = 5
_TICKS = re.compile("`+")

_TITLE = {AGREE: "PASS: agree", MISMATCH: "FAIL: mismatch", NOISE: "rounding only (noise)",
          CANNOT_JUDGE: "cannot judge"}


def code(s, limit: int = NAME_LIMIT) -> str:
    """``s`` as an inert Markdown code span for a table cell; ``-`` for an empty or missing value."""
    if s is None or s == "":
        return "-"
    s = visible(clipped(str(s), limit)).replace("|", "\\|")
    longest = max((len(m.group(0)) for m in _TICKS.finditer(s)), default=0)
    fence = "`" * (longest + 1)
    if s[0] in "` " or s[-1] in "` ":
        s = f" {s} "
    return f"{fence}{s}{fence}"


def num(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, str):  # a non-finite number read back from JSON, or anything foreign
        return code(x, 20)
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "-"
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return f"{x:.3g}"


def _row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def to_markdown(report, *, top_culprits: int = TOP_CULPRITS, title: str = "sbs_widget check") -> str:
    """The Markdown summary of ``report`` (a ``gate.report.Report``)."""
    v = report.verdict
    fail_on = report.settings.get("fail_on", "noise")
    status = _TITLE.get(v.outcome, "?")
    if v.outcome == NOISE:
        status = ("FAIL: " if v.fails(fail_on) else "PASS: ") + status
    lines = [f"### {title}: {status}", ""]
    lines.append(_own_text(headline(v, report.atol, report.rtol, fail_on)) if v.outcome != CANNOT_JUDGE else
                 "cannot judge the ONNX model: " + code(v.cannot_judge, REASON_LIMIT))
    lines.append("")
    sources = report.sources
    compared = " vs ".join(code(sources[k]) for k in ("onnx", "ep") if sources.get(k))
    settings = (f"atol {num(report.atol)}, rtol {num(report.rtol)}, fails on {code(fail_on, 20)}, exit code "
                f"{v.exit_code(fail_on) if fail_on in ('noise', 'mismatch') else '?'}")
    lines.append(f"{compared}: {settings}" if compared else settings)
    lines.append("")
    records = report.records
    if v.worst_outputs:
        lines += ["**Worst outputs**", ""]
        lines.append(_row(["output (FX)", "ONNX value", "status", "max abs err", "max rel err", "passes at atol",
                           "where"]))
        lines.append(_row(["---", "---", "---", "---:", "---:", "---:", "---"]))
        for k in v.worst_outputs:
            r = records[k]
            lines.append(_row([code(r.ep_name), code(r.onnx_name), code(r.status, 20), num(r.err_abs),
                               num(r.err_rel), num(r.min_atol), code(r.err_where)]))
        lines.append("")
    if v.first_mismatch is not None and v.first_mismatch < len(records):
        r = records[v.first_mismatch]
        lines.append(f"First pair beyond tolerance and rounding: {code(r.ep_name)} / {code(r.onnx_name)} "
                     f"({code(r.onnx_op_type, 40)}), max abs err {num(r.err_abs)}")
        lines.append("")
    if report.culprits:
        shown = report.culprits[:top_culprits]
        lines += [f"**Culprits** (where the difference starts, most likely first; {len(shown)} of "
                  f"{len(report.culprits)})", ""]
        lines.append(_row(["#", "ONNX node", "op", "FX node", "module", "score", "rounding", "reason"]))
        lines.append(_row(["---:", "---", "---", "---", "---", "---:", "---", "---"]))
        for k, c in enumerate(shown, 1):
            lines.append(_row([str(k), code(c.onnx_node), code(c.onnx_op_type, 40), code(c.ep_name),
                               code(c.module), num(c.score), _rounding(c, records),
                               code(c.reason, REASON_LIMIT)]))
        lines.append("")
    elif v.outcome == MISMATCH:
        lines += ["No culprit named: no node is seen creating the difference (status error, or an inherited "
                  "difference).", ""]
    counts = " · ".join(f"{code(k, 20)} {n}" for k, n in sorted(v.counts.items()))
    lines.append(f"Pairs: {v.n_records} records, {v.n_compared} compared; {counts}" if counts else
                 "Pairs: none")
    lines.append("")
    ver = report.versions
    if ver:
        lines.append("_" + ", ".join(f"{_own_text(k)} {code(x, 30)}" for k, x in ver.items() if x) + "_")
    return "\n".join(lines) + "\n"


def _rounding(culprit, records) -> str:
    """Whether the culprit's pair is rounding: ``no`` for a mismatch (culprits are never noise pairs);
    ``node rounds`` when the node itself only rounds on torch's inputs (it inherits the difference)."""
    k = culprit.record
    if k is None or not 0 <= k < len(records):
        return "no"
    r = records[k]
    if r.noise is True:
        return "yes"
    return "node rounds" if r.local_noise is True else "no"


_SPECIAL = re.compile(r"([\\`*_{}\[\]<>()#+!|~&@:])")


def _own_text(s: str) -> str:
    """This module's sentences (which quote numbers, never names): Markdown punctuation escaped."""
    return _SPECIAL.sub(r"\\\1", visible(s))
