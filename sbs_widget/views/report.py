"""A comparison as one offline HTML page: the widget's own view, bundle and data inlined.

The page needs no kernel, no network and no other file: the ESM bundle is embedded (base64, so no
``</script>`` inside it can end the tag) and imported from a blob URL; rows ride in a JSON script
element with ``<``, ``>`` and ``&`` escaped, so model strings can neither close the element nor
become markup. The view renders every string with ``textContent``.
"""

from __future__ import annotations

import base64
import html
import json
import pathlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sbs_widget.engine.entry import Prepared

_BUNDLE = pathlib.Path(__file__).parent.parent / "static" / "widget.js"
_STATE_KEYS = ("title", "status", "message", "progress", "run_id", "runs_meta", "compare", "columns", "atol",
               "rtol", "reset_names", "fx_dot", "onnx_dot", "deployed", "culprits",
               "decoding", "input_spread", "models_b", "onnx_b_dot")

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>
  body {{ margin: 16px; background: #fff; color: #222; }}
  .sbs-spread-text {{ font: 13px system-ui, sans-serif; margin-top: 16px; }}
  .sbs-spread-text table {{ border-collapse: collapse; }}
  .sbs-spread-text th, .sbs-spread-text td {{ border: 1px solid #8886; padding: 2px 6px; text-align: left; }}
  .sbs-spread-text tr[data-input-dependent=true] td:last-child {{ font-weight: 600; }}
  @media (prefers-color-scheme: dark) {{
    body {{ background: #111; color: #e6e6e6; }}
    :root {{ --jp-ui-font-color1: #e6e6e6; --jp-ui-font-color2: #a0a0a0; --jp-layout-color1: #111;
             --jp-layout-color2: #222; --jp-border-color2: #444; }}
  }}
</style>
</head>
<body>
<div id="sbs-report"><noscript>This report needs JavaScript.</noscript></div>
{spread}
<script type="application/json" id="sbs-data">{data}</script>
<script type="text/plain" id="sbs-bundle">{bundle}</script>
<script type="module">
const text = (id) => document.getElementById(id).textContent.trim();
const code = Uint8Array.from(atob(text("sbs-bundle")), (c) => c.charCodeAt(0));
let mod;
try {{
  mod = await import(URL.createObjectURL(new Blob([code], {{ type: "text/javascript" }})));
}} catch (err) {{  // some file:// setups refuse blob modules; a data URL is equivalent
  mod = await import("data:text/javascript;base64," + text("sbs-bundle"));
}}
mod.renderStatic(document.getElementById("sbs-report"), JSON.parse(text("sbs-data")));
</script>
</body>
</html>
"""


def _script_json(value) -> str:
    # JSON that is safe inside <script>: no "<", ">", "&" or JS line separators left literal.
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def report_data(runs, state: dict, extra=None) -> dict:
    """``{"state", "runs"}``: what the page's static model serves (every run, its rows as arrays;
    ``extra(record)``: the values of the columns after the metrics, the spread of input sets)."""
    from sbs_widget.views.rows import encode_rows
    from sbs_widget.views.view_state import runs_metrics

    data_state = {k: state.get(k, "" if k.endswith("_dot") else {}) for k in _STATE_KEYS}
    metrics = runs_metrics(runs)  # the columns of the state: each metric's figure after the record's fields
    return {"state": data_state,
            "runs": {str(run.id): json.loads(encode_rows(run.records, metrics, extra)) for run in runs}}


def write_html_report(records, path, *, title: str = "sbs_widget report", atol: float | None = None,
                      rtol: float | None = None, reset_names=(), fx_dot: str = "", onnx_dot: str = "",
                      prepared: Prepared | None = None, deployed: dict | None = None,
                      culprits: list[dict] | None = None, decoding: dict | None = None,
                      input_sets=None, models: dict | None = None) -> pathlib.Path:
    """Write ``records`` (a list of ``Record``, of finished ``Run``s, or an ``SbsWidget``) as a
    self-contained HTML page (``deployed``: the widget's as-deployed check state, shown above the table;
    ``culprits``: as the widget lists them, else found from the last run's records; ``decoding``: the
    widget's decode steps, drawn as its step strip, not clickable; ``input_sets``: the ``InputSets`` the
    runs show, their spread as the table's columns and the sets panel, and as escaped text below the view;
    ``models``: two ONNX models' view state, ``{"models_b": ..., "onnx_b_dot": ...}`` (``views/models_view.py``):
    b's columns, its panel and its graph).

    >>> import sbs_widget, tempfile, os
    >>> from sbs_widget.views.report import write_html_report
    >>> records = [sbs_widget.Record(ep_name="x", err_abs=1e-3)]
    >>> p = write_html_report(records, os.path.join(tempfile.mkdtemp(), "r.html"))
    >>> p.stat().st_size > 10_000
    True
    """
    from sbs_widget.safe_files import output_path
    from sbs_widget.views.runs import Run
    from sbs_widget.views.view_state import finished_run, view_state

    if hasattr(records, "save_html"):  # a widget: its runs, as it shows them
        w = records
        return write_html_report(w.runs, path, title=title, atol=w.atol if atol is None else atol,
                                 rtol=w.rtol if rtol is None else rtol, reset_names=w.reset_names,
                                 fx_dot=w.fx_dot, onnx_dot=w.onnx_dot, prepared=w._prepared,
                                 deployed=dict(w.deployed), culprits=list(w.culprits) if w.status == "done" else None,
                                 decoding=dict(w.decoding), input_sets=getattr(w, "input_sets", None),
                                 **(w._models_html() if hasattr(w, "_models_html") else {}))
    records = list(records)
    atol, rtol = 1e-4 if atol is None else atol, 1e-4 if rtol is None else rtol
    runs = records if records and all(isinstance(r, Run) for r in records) else \
        [finished_run(records, atol=atol, rtol=rtol, reset_names=reset_names)]
    state = view_state(runs, title=title, atol=atol, rtol=rtol, reset_names=reset_names, fx_dot=fx_dot,
                       onnx_dot=onnx_dot, prepared=prepared, deployed=deployed, culprits=culprits, decoding=decoding)
    state.update(models or {})
    if "models_b" not in state:  # records of two models computed elsewhere (the CLI's --onnx-b): b's columns
        from sbs_widget.views.models_view import records_state

        found = records_state(runs[-1].records)
        if found is not None:
            state["models_b"] = found
    extra, spread = None, ""
    if input_sets is not None:
        from sbs_widget.shared_rules import spread_columns
        from sbs_widget.views.fallback import spread_report_html
        from sbs_widget.views.sets_view import sets_state, spread_values

        state["columns"] = list(state["columns"]) + spread_columns()
        state["input_spread"] = sets_state(input_sets)
        extra, spread = spread_values(input_sets), spread_report_html(input_sets)
    page = _PAGE.format(
        title=html.escape(title),
        spread=spread,
        data=_script_json(report_data(runs, state, extra)),
        bundle=base64.b64encode(_BUNDLE.read_bytes()).decode("ascii"),
    )
    path = pathlib.Path(path)
    with output_path(path) as tmp:  # a failed write leaves no half page; a link at path is replaced
        pathlib.Path(tmp).write_text(page, encoding="utf-8")
    return path


def write_sets_report(sets, path, *, title: str = "sbs_widget input sets", reset_names=(),
                      fx_dot: str = "", onnx_dot: str = "") -> pathlib.Path:
    """Write an ``InputSets`` (``compare_input_sets``) as the offline HTML page: the "all inputs" run (each
    pair's worst input's record, its spread as columns, the culprits grouped across the inputs), then the
    spread as escaped text (``fallback.spread_report_html``)."""
    from sbs_widget.views.sets_view import grouped_culprits_state, overview_records
    from sbs_widget.views.view_state import finished_run

    records = overview_records(sets)
    atol = 1e-4 if sets.atol is None else sets.atol
    rtol = 1e-4 if sets.rtol is None else sets.rtol
    run = finished_run(records, atol=atol, rtol=rtol, reset_names=reset_names)
    return write_html_report([run], path, title=title, atol=atol, rtol=rtol, reset_names=reset_names,
                             fx_dot=fx_dot, onnx_dot=onnx_dot, culprits=grouped_culprits_state(sets, records),
                             input_sets=sets)
