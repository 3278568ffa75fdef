"""The widget's static fallback: plain HTML (no script, no style a host could strip) that pages
rendering no widget show instead: nbconvert without widget state, nbviewer, GitHub.

It is the state when the output was produced: the as-deployed verdict (when checked), the decode steps
(when decoded: the step strip as a plain table), the summary, the culprits and the worst pairs. Every
string from a model is escaped (a name may hold ``<script>``). A live view ignores it (hosts that
render widgets prefer the widget's mimetype).
"""

from __future__ import annotations

import html
import warnings

from sbs_widget import records as R
from sbs_widget.errors import SbsWidgetWarning
from sbs_widget.shared_rules import SEVERITY
from sbs_widget.views.rows import error_key

WORST_ROWS = 15  # pairs listed: the most severe, then the largest errors
SPREAD_ROWS = 15  # input sets: the pairs whose spread is listed
_COLUMNS = (("status", "status"), ("FX node", "ep_name"), ("ONNX value", "onnx_name"), ("op", "onnx_op_type"),
            ("err_abs", "err_abs"), ("min atol", "min_atol"), ("comment", "comment"))


def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    text = "" if value is None else str(value)
    return text if len(text) <= 160 else text[:157] + "..."


def _field(record, name: str):
    # an inner value (inside the ONNX translation of one FX node): which node, and the torch op it is
    # compared with, in the FX column ("linear::mm (aten.mm.default)", "inside linear (unpaired)")
    if name == "ep_name" and getattr(record, "kind", None) == R.KIND_INNER:
        if record.ep_name:
            return f"{record.ep_name} ({record.inner_op})" if record.inner_op else record.ep_name
        return f"inside {record.inner_of} (unpaired)"
    return getattr(record, name, None)


def worst_records(records: list, n: int = WORST_ROWS) -> list:
    """The ``n`` pairs a reader should see first: by status severity, then by error."""
    compared = [r for r in records if r.status != R.ONE_SIDED]
    return sorted(compared, key=lambda r: (-SEVERITY.get(r.status, 0), -error_key(r.err_abs)))[:n]


def deployed_html(state: dict | None) -> str:
    """The as-deployed check (``SbsWidget.deployed``) as escaped HTML; "" when none ran."""
    if not isinstance(state, dict) or not state.get("status"):
        return ""
    status = state.get("status")
    if status == "error":
        return f"<p><b>As deployed: the check failed</b>: {_e(state.get('message'))}</p>"
    result = state.get("result") if isinstance(state.get("result"), dict) else None
    if status != "done" or result is None:
        return "<p><b>As deployed</b>: the check had not ended when this output was produced.</p>"
    verdict = result.get("verdict") or "?"
    parts = [f"<p><b>As deployed: {_e(verdict)}</b> (deployed as {_e(result.get('deployed') or '?')})"]
    if verdict == "export":
        parts.append(" the as-written model already differs from torch: use the lockstep below")
    parts.append("</p>")
    lines = [line for line in str(result.get("summary") or "").splitlines()[1:] if line.strip()]
    if lines:
        parts.append("<ul>" + "".join(f"<li>{_e(line)}</li>" for line in lines) + "</ul>")
    return "".join(parts)


def _loop_cell(loop) -> str:
    if not isinstance(loop, dict):
        return "(stopped)"
    err = loop.get("max_abs")
    return f"{_cell(err) if isinstance(err, float) else _e(err)}{' beyond' if loop.get('diverges') else ''}"


def steps_html(state: dict | None) -> str:
    """The decode steps (``SbsWidget.decoding``) as an escaped plain table; "" when none were decoded."""
    if not isinstance(state, dict) or not state.get("status"):
        return ""
    if state.get("status") == "error":
        return f"<p><b>Decode steps: the decoding failed</b>: {_e(state.get('message'))}</p>"
    steps = state.get("steps") if isinstance(state.get("steps"), list) else []
    if state.get("status") != "done":
        return "<p><b>Decode steps</b>: the decoding had not ended when this output was produced.</p>"
    first = state.get("first_divergence") if isinstance(state.get("first_divergence"), dict) else {}
    closed, opened = first.get("closed_loop"), first.get("open_loop")
    parts = [f"<p><b>Decode steps</b> ({len(steps)}): first divergence, closed loop: "
             f"{_e('none' if closed is None else closed)}; open loop: {_e('none' if opened is None else opened)}</p>",
             "<table><thead><tr>" + "".join(f"<th>{h}</th>" for h in (
                 "step", "length", "torch tokens", "ONNX tokens (closed loop)", "closed max |err|",
                 "open max |err|", "marks")) + "</tr></thead><tbody>"]
    for s in steps:
        c, o = s.get("closed"), s.get("open")
        marks = [m for m, on in (("first divergence (closed loop)", s.get("step") == closed and closed is not None),
                                 ("first divergence (open loop)", s.get("step") == opened and opened is not None))
                 if on]
        for name, loop in (("closed", c), ("open", o)):
            if isinstance(loop, dict) and loop.get("tie"):
                marks.append(f"tie ({name} loop): {loop.get('comment') or ''}")
        tokens = ", ".join(map(str, c.get("tokens") or [])) if isinstance(c, dict) else "(stopped)"
        cells = (s.get("step"), s.get("length"), ", ".join(map(str, s.get("torch") or [])), tokens)
        parts.append("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in cells) + f"<td>{_loop_cell(c)}</td>"
                     f"<td>{_loop_cell(o)}</td><td>{_e('; '.join(marks))}</td></tr>")
    parts.append("</tbody></table>")
    return "\n".join(parts)


def spread_html(sets, limit: int = SPREAD_ROWS) -> str:
    """The spread as an escaped plain table for the static fallback: the input-dependent pairs first."""
    if sets is None:
        return ""
    pairs = sets.input_dependent + [p for p in sets.pairs if p.n_beyond and not p.input_dependent]
    head = (f"<p><b>Input sets</b>: {len(sets)} compared, {len(sets.input_dependent)} input-dependent pair(s) "
            "(beyond tolerance on some inputs only)</p>")
    if not pairs:
        return head
    cols = ("FX node", "ONNX value", "op", "err_abs max", "err_abs median", "beyond", "worst input",
            "input-dependent")
    parts = [head, "<table><thead><tr>" + "".join(f"<th>{_e(c)}</th>" for c in cols) + "</tr></thead><tbody>"]
    for p in pairs[:limit]:
        worst = "" if p.worst_input is None else f"#{p.worst_input} {sets.labels[p.worst_input]}"
        cells = (p.ep_name, p.onnx_name, p.onnx_op_type, p.err_abs_max, p.err_abs_median,
                 f"{p.n_beyond} of {p.n_inputs}", worst, "yes" if p.input_dependent else "")
        parts.append("<tr>" + "".join(f"<td>{_e(_cell(v))}</td>" for v in cells) + "</tr>")
    parts.append("</tbody></table>")
    return "\n".join(parts)


REPORT_PAIRS = 2000  # the offline report's spread: the pairs listed (in execution order, input-dependent first)


def _t(value) -> str:
    """A model's string as escaped HTML text: control and direction characters made visible, then escaped."""
    from sbs_widget.safe_text import visible

    return _e(visible("" if value is None else str(value)))


def _input(sets, k) -> str:
    return "" if k is None else f"#{k} {sets.labels[k]}"


def _inputs(sets, ks, limit: int = 20) -> str:
    shown = ", ".join(_input(sets, k) for k in ks[:limit])
    return shown + (f", ... {len(ks) - limit} more" if len(ks) > limit else "")


def _spread_table(sets, pairs, limit: int) -> str:
    cols = ("FX node", "ONNX value", "ONNX node", "op", "err_abs max", "err_abs median", "worst input",
            "beyond tolerance on", "mismatch on", "input-dependent")
    parts = ["<table class=\"sbs-spread-table\"><thead><tr>" + "".join(f"<th>{_e(c)}</th>" for c in cols)
             + "</tr></thead><tbody>"]
    for p in pairs[:limit]:
        beyond = f"{p.n_beyond} of {p.n_inputs}" + (f": {_inputs(sets, p.beyond_inputs)}" if p.beyond_inputs else "")
        cells = (p.ep_name, p.onnx_name, p.onnx_node_name, p.onnx_op_type or p.kind, _cell(p.err_abs_max),
                 _cell(p.err_abs_median), _input(sets, p.worst_input), beyond, f"{p.n_mismatch} of {p.n_inputs}",
                 "yes" if p.input_dependent else "")
        flag = " data-input-dependent=\"true\"" if p.input_dependent else ""
        parts.append(f"<tr{flag}>" + "".join(f"<td>{_t(v)}</td>" for v in cells) + "</tr>")
    parts.append("</tbody></table>")
    if len(pairs) > limit:
        parts.append(f"<p>... {len(pairs) - limit} more pair(s): write -o spread.csv for every one.</p>")
    return "\n".join(parts)


def spread_report_html(sets, limit: int = REPORT_PAIRS) -> str:
    """The input sets' spread for the offline HTML report, as escaped plain HTML (no script, every model
    string as text): the inputs, the input-dependent pairs singled out, every pair's spread (max and median
    err_abs, worst input, the inputs beyond tolerance), the culprits grouped across the inputs."""
    if sets is None:
        return ""
    n, dependent = len(sets), sets.input_dependent
    tol = "" if sets.atol is None else f"; tolerance atol={sets.atol:g}, rtol={sets.rtol:g}"
    parts = ["<section class=\"sbs-spread-text\" aria-label=\"input sets\">",
             f"<h2>Input sets: {n} compared, {n - len(sets.failed)} ran to the end{_e(tol)}</h2>", "<ul>"]
    for k in range(n):
        counts = ", ".join(f"{v} {s}" for s, v in sorted(sets.statuses[k].items())) or "no pair"
        failed = f"; failed: {sets.errors[k]}" if sets.errors[k] else ""
        parts.append(f"<li data-input=\"{k}\">{_t(_input(sets, k))}: {_t(counts + failed)}</li>")
    parts.append("</ul>")
    parts.append(f"<h3 id=\"sbs-input-dependent\">Input-dependent pairs: {len(dependent)}</h3>")
    if dependent:
        parts.append("<p>Status mismatch on some inputs only, first in execution order: the first is where an "
                     "input-dependent difference starts.</p>")
        parts.append(_spread_table(sets, dependent, limit))
    else:
        parts.append("<p>None: no pair is beyond tolerance on some inputs but not on the others.</p>")
    pairs = sorted(sets.pairs, key=lambda p: (not p.input_dependent, p.order))
    parts.append(f"<h3 id=\"sbs-spread-pairs\">Every pair: {len(pairs)}</h3>")
    parts.append(_spread_table(sets, pairs, limit))
    parts.append(f"<h3 id=\"sbs-grouped-culprits\">Culprits across the inputs: {len(sets.culprits)}</h3>")
    if sets.culprits:
        cols = ("ONNX node", "ONNX value", "op", "FX node", "named on", "best rank", "reason")
        parts.append("<table class=\"sbs-culprits-table\"><thead><tr>" + "".join(f"<th>{_e(c)}</th>" for c in cols)
                     + "</tr></thead><tbody>")
        for g in sets.culprits:
            cells = (g.onnx_node, g.onnx_name, g.onnx_op_type, g.ep_name,
                     f"{g.count} of {n}: {_inputs(sets, g.inputs)}", g.best_rank, g.reason)
            parts.append("<tr>" + "".join(f"<td>{_t(v)}</td>" for v in cells) + "</tr>")
        parts.append("</tbody></table>")
    else:
        parts.append("<p>No culprit on any input.</p>")
    parts.append("</section>")
    return "\n".join(parts)


def fallback_html(*, title: str, run_id: int, status: str, records: list, summary_lines: list[str],
                  culprits: list[dict], atol: float, rtol: float, reset_names=(), deployed: dict | None = None,
                  decoding: dict | None = None, step: int | None = None, spread: str = "") -> str:
    """The static fallback of a run (``status``: the widget's; ``culprits``: its culprit dicts;
    ``deployed``: the as-deployed check's state; ``decoding``: the decode steps' state, ``step``: the
    step whose lockstep the run is; ``spread``: ``spread_html`` of the input sets)."""
    head = f"sbs_widget{': ' + title if title else ''}"
    parts = [f"<div class=\"sbs-widget-fallback\"><p><b>{_e(head)}</b> (static copy: the interactive view needs a "
             "running kernel)</p>"]
    state = f"run {run_id}{'' if step is None else f' (lockstep at decode step {step})'}: {status}, " \
            f"{len(records)} record(s), atol={atol:g}, rtol={rtol:g}"
    if reset_names:
        state += f", reset set: {', '.join(sorted(reset_names))}"
    parts.append(f"<p>{_e(state)}</p>")
    banner = deployed_html(deployed)
    if banner:
        parts.append(banner)
    strip = steps_html(decoding)
    if strip:
        parts.append(strip)
    if spread:
        parts.append(spread)
    if status in ("running", "preparing", "idle"):
        parts.append("<p>The run had not ended when this output was produced. Display the widget after "
                     "<code>w.wait()</code>, or write <code>w.save_html(path)</code>, for a complete static copy.</p>")
    if summary_lines:
        parts.append("<ul>" + "".join(f"<li>{_e(line)}</li>" for line in summary_lines) + "</ul>")
    if culprits:
        parts.append("<p><b>Culprits</b> (where the difference starts):</p><ol>")
        for c in culprits:
            where = " / ".join(_e(x) for x in (c.get("onnx_node") or c.get("onnx_name"), c.get("onnx_op_type"),
                                               c.get("ep_name")) if x)
            parts.append(f"<li>{where}: {_e(c.get('reason'))}</li>")
        parts.append("</ol>")
    elif status == "done":
        parts.append("<p>No culprit: no pair differs beyond tolerance and beyond rounding.</p>")
    rows = worst_records(records)
    if rows:
        parts.append(f"<p><b>The {len(rows)} worst pair(s)</b> of {len(records)}:</p><table><thead><tr>"
                     + "".join(f"<th>{_e(label)}</th>" for label, _ in _COLUMNS) + "</tr></thead><tbody>")
        for r in rows:
            parts.append("<tr>" + "".join(f"<td>{_e(_cell(_field(r, field)))}</td>" for _, field in _COLUMNS)
                         + "</tr>")
        parts.append("</tbody></table>")
    parts.append("</div>")
    return "\n".join(parts)


def widget_fallback(widget) -> str:
    """The fallback page of an ``SbsWidget``: its state when the output is produced."""
    from sbs_widget.engine.summary import summarize

    run = widget._runs[-1] if widget._runs else None
    records = list(run.records) if run is not None else []
    lines = summarize(records, widget._prepared).lines() if records else []
    return fallback_html(title=widget.title, run_id=widget.run_id, status=widget.status, records=records,
                         summary_lines=lines, culprits=list(widget.culprits) if widget.status == "done" else [],
                         atol=widget.atol, rtol=widget.rtol, reset_names=widget.reset_names,
                         deployed=dict(widget.deployed), decoding=dict(widget.decoding),
                         step=None if run is None else run.step,
                         spread=spread_html(getattr(widget, "input_sets", None)))


class StaticFallback:
    """Mixin of ``SbsWidget``: its mimebundle carries the fallback page as ``text/html``."""

    def _repr_mimebundle_(self, **kwargs):
        """The widget's mimebundle plus a ``text/html`` fallback (``views/fallback.py``) for pages that
        render no widget (nbconvert without widget state, nbviewer, GitHub): the state when the output
        is produced, so ``SbsWidget(...).wait()`` as a cell's value gives the complete one."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle
        try:
            data = dict(data, **{"text/html": self._fallback_html()})
        except Exception as e:  # the live view must show even if the fallback cannot be built
            warnings.warn(f"no static fallback: {type(e).__name__}: {e}", SbsWidgetWarning, stacklevel=2)
        return data, metadata

    def _fallback_html(self) -> str:
        return widget_fallback(self)
