"""A self-contained, offline HTML page with both graphs painted by the records and a records table.

The page inlines ``static/graphs_page.js`` (built from ``js/graphs/page.js``; Graphviz as WebAssembly
inside), so it opens from a file:// URL on a machine without network or Graphviz.
"""

from __future__ import annotations

import html
import json
import pathlib
from typing import TYPE_CHECKING, Iterable

from sbs_widget.errors import SbsError
from sbs_widget.graphs.dot import dot_sources
from sbs_widget.records import Record
from sbs_widget.safe_files import write_text
from sbs_widget.shared_rules import json_value

if TYPE_CHECKING:
    from sbs_widget.engine.entry import Prepared

_BUNDLE = pathlib.Path(__file__).parent.parent / "static" / "graphs_page.js"
_ROW_FIELDS = ("ep_name", "onnx_name", "onnx_node_name", "err_abs", "err_local", "status", "kind", "module")


def write_graphs_html(path, prepared: Prepared | tuple, records: Iterable[Record] | None = None, *,
                      title: str = "sbs_widget graphs"):
    """Write the page for ``prepared`` (``engine.prepare(...)`` or ``(decomposed_ep, onx)``) to ``path``.

    >>> write_graphs_html("graphs.html", (onnx_program.exported_program, onnx_program.model_proto))  # doctest: +SKIP
    """
    if not _BUNDLE.exists():
        raise SbsError(f"{_BUNDLE} is missing: build the front end with `npm install && npm run build`")
    records = list(records or ())
    fx_dot, onnx_dot = dot_sources(prepared, records)
    # NaN/inf as the widget sends them (shared_rules.NON_FINITE): the page reads them back as numbers
    rows = [{"i": i, **{k: json_value(getattr(r, k)) for k in _ROW_FIELDS}} for i, r in enumerate(records)]
    data = json.dumps({"title": title, "fx_dot": fx_dot, "onnx_dot": onnx_dot, "rows": rows}, allow_nan=False)
    # "<" escaped so that no "</script>" in a model name can close the data block.
    data = data.replace("<", "\\u003c")
    script = _BUNDLE.read_text(encoding="utf-8").replace("</script", "<\\/script")
    page = (
        "<!doctype html>\n<html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title></head><body>\n"
        f'<script type="application/json" id="sbs-graphs-data">{data}</script>\n'
        f'<script type="module">{script}</script>\n</body></html>\n'
    )
    out = pathlib.Path(path)
    write_text(out, page)  # a link at that name is replaced, never written through
    return out

