"""Two ONNX models of one program (issue 47) in a real JupyterLab + Chromium: ``SbsWidget.from_models`` on the
zoo's resnet, ``b`` its static QDQ quantization with one weight's scale doubled (``B_FAULTS``, that node renamed
to a hostile name): the b columns render (b's value, err_abs, err_local, verdict), the "b departs" filter
narrows the rows to those the kernel counts (read back through ``filtered_dataframe()``), the culprits panel
names the node of b as text, the graphs area draws b as a third pane holding the culprit node and highlights
the node of b paired with a row clicked in the table; in JupyterLab's dark theme every new text keeps a
contrast >= 4.5 on what is under it.

Run: ``pytest -m browser tests/browser/test_models_browser.py -p no:playwright``.
"""

from __future__ import annotations

import json

import pytest
from conftest import NB, open_notebook, run_cell
from test_hosts_look import _contrast, _luminance, _over, _rgba

pytestmark = pytest.mark.browser

HOSTILE = 'dq"<img src=x onerror=globalThis.pwned=1>\\N'
MODELS = f'''
import json, sbs_widget
from sbs_widget.samples import zoo
from sbs_widget.samples.transforms import B_FAULTS, TRANSFORMS, feeds_for
ep, prog, args, kwargs = zoo.export("resnet")
a = prog.model_proto
b = TRANSFORMS["quant_static_qdq"](a, [feeds_for(a, args, kwargs)])
bad, edited = B_FAULTS["quant_scale_2x"](b)
next(n for n in bad.graph.node if n.name == edited[0]).name = {HOSTILE!r}
w = sbs_widget.SbsWidget.from_models(prog, a, bad, args, kwargs=kwargs, title="resnet <b>quantized</b>")
w
'''
READ_STATE = '''w.wait()
df = w.filtered_dataframe()
print("STATE" + json.dumps({"culprit": w.culprits[0]["onnx_node"], "n_departs": w.models_b["n_departs"],
      "shown": len(df), "statuses": sorted(set(df["b_status"].dropna())), "n": len(w.records),
      "nodes": {str(i): r.b_node_name for i, r in enumerate(w.records) if r.b_status in ("departs", "inherits")},
      "saved": str(w.save_html("models_report.html"))}))
'''
ROOT = f"{NB} .jp-OutputArea .sbs-root"
DONE = ("root => root.querySelector('.sbs-badge').textContent === 'done' && Number(root.dataset.rows) > 0 "
        "&& !root.querySelector('.sbs-models').hidden && root.querySelectorAll('.sbs-culprits li').length > 0")

PROBE = """(root) => {
  const cs = (e) => getComputedStyle(e);
  const colorOf = (value) => { const p = document.createElement('div'); p.style.backgroundColor = value;
    root.append(p); const c = cs(p).backgroundColor; p.remove(); return c; };
  const bgOf = (e) => { for (let x = e; x; x = x.parentElement) { const c = cs(x).backgroundColor;
    if (c !== 'rgba(0, 0, 0, 0)' && c !== 'transparent') return c; } return 'rgb(255, 255, 255)'; };
  const plain = [...root.querySelectorAll('.sbs-models-title, .sbs-models-summary, .sbs-models label, ' +
      '.sbs-culprits li[data-side=b] > *, .sbsg-pane:nth-child(3) .sbsg-pane-head, ' +
      '.sbs-head > div[data-key^=b_]')]
    .filter(e => e.textContent.trim() && e.offsetParent)
    .map(e => ({text: e.textContent.slice(0, 30), fg: cs(e).color, bg: bgOf(e)}));
  const rows = [...root.querySelectorAll('.sbs-row')].filter(r => r.style.display !== 'none' && !r.classList.contains('sbs-selected'))
    .map(r => ({k: r.dataset.k, b: r.dataset.bStatus, tint: cs(r).backgroundColor,
                cells: [...r.querySelectorAll('.sbs-b-col, .sbs-b-verdict')].filter(e => e.textContent.trim())
                  .map(e => [e.textContent.slice(0, 20), cs(e).color, cs(e).backgroundColor])}));
  return {bg: cs(root).backgroundColor, veil: colorOf('var(--sbs-veil)'), plain, rows};
}"""


def _readable(got) -> int:
    bg = _rgba(got["bg"])
    assert bg[3] == 1 and _luminance(bg) < 0.1, (got["bg"], "a dark background")
    veil = _rgba(got["veil"])
    checked = 0
    for t in got["plain"]:
        under = _over(_rgba(t["bg"]), bg)
        assert _contrast(_over(_rgba(t["fg"]), under), under) >= 4.5, t
        checked += 1
    for row in got["rows"]:  # a row's error tint, veiled in a dark theme, under its b cells
        under = _over(veil, _over(_rgba(row["tint"]), bg))
        for text, colour, own in row["cells"]:  # a cell on its own background, else on the row's
            under_it = _over(_rgba(own), under)
            assert _contrast(_over(_rgba(colour), under_it), under_it) >= 4.5, (row["k"], row["b"], text, colour,
                                                                                 row["tint"], own)
            checked += 1
    return checked


def test_b_columns_filter_culprits_and_graph(lab, lab_page, tmp_path):
    page = lab_page
    name = lab.write_notebook("models.ipynb", [MODELS, READ_STATE])
    open_notebook(page, lab, name)
    theme = "(name) => window.jupyterapp.commands.execute('apputils:change-theme', {theme: name})"
    page.evaluate(theme, "JupyterLab Light")  # (the session's server may have been left dark)
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'true'", timeout=30_000)
    run_cell(page, 0)
    page.wait_for_selector(ROOT, timeout=120_000)
    view = page.locator(ROOT).first
    handle = view.element_handle()
    page.wait_for_function(DONE, arg=handle, timeout=240_000)

    # the b columns, their cells as text
    heads = [t.strip() for t in view.locator(".sbs-head > div").all_text_contents()]
    for label in ("b name", "b err_abs", "b err_local", "b verdict"):
        assert label in heads, heads
    n = int(view.get_attribute("data-rows"))
    assert view.locator(".sbs-row[data-b-status=rounding]").count() > 0
    summary = view.locator(".sbs-models-summary").text_content()
    assert "where b departs" in summary and "culprit" in summary, summary

    # "b departs": fewer rows, each of them departing or inheriting in b
    view.locator(".sbs-models input[type=checkbox]").check()
    page.wait_for_function(f"root => Number(root.dataset.shown) < {n}", arg=handle, timeout=10_000)
    shown = int(view.get_attribute("data-shown"))
    statuses = view.evaluate("root => [...root.querySelectorAll('.sbs-row')].filter(r => r.style.display !== 'none')"
                             ".map(r => r.dataset.bStatus)")
    assert 0 < shown < n and len(statuses) == shown and set(statuses) <= {"departs", "inherits"}, statuses
    verdicts = view.evaluate("root => [...root.querySelectorAll('.sbs-row')].filter(r => r.style.display !== 'none')"
                             ".map(r => r.querySelector('.sbs-b-verdict').textContent)")
    assert set(verdicts) <= {"departs", "inherits"}, verdicts

    # the culprits panel: the node of b, its op, as text
    culprit = view.locator(".sbs-culprits li[data-side=b]").first
    assert culprit.get_attribute("data-node") == HOSTILE
    assert culprit.locator("button").text_content() == f"DequantizeLinear {HOSTILE}"
    assert "err_local" in culprit.text_content() and "quantized" in culprit.text_content()

    # the kernel reads the filtered rows back
    page.wait_for_timeout(400)  # the view publishes view_rows at most every 150 ms
    out = run_cell(page, 1)
    state = json.loads(out[out.index("STATE") + 5:].strip().splitlines()[0])
    assert state["culprit"] == HOSTILE and state["n"] == n
    assert state["shown"] == shown == state["n_departs"], state
    assert set(state["statuses"]) <= {"departs", "inherits"}

    # the graphs: b is a third pane holding the culprit node; a row clicked lights its node of b
    view.locator(".sbs-graphs-box > summary").click()
    page.wait_for_function("root => root.querySelectorAll('.sbsg-pane[data-renders]').length === 3", arg=handle,
                           timeout=120_000)
    pane_b = view.locator(".sbsg-pane").nth(2)
    assert pane_b.is_visible() and pane_b.locator(".sbsg-pane-head").text_content() == "ONNX b (transformed)"
    ids = pane_b.evaluate("p => [...p.querySelectorAll('g.node')].map(g => g.dataset.id)")
    assert f"b:{HOSTILE}" in ids, ids[:10]
    node_text = pane_b.evaluate("(p, id) => [...p.querySelectorAll('g.node')].find(g => g.dataset.id === id)"
                                ".querySelector('text:last-of-type').textContent", f"b:{HOSTILE}")
    assert node_text.startswith('dq"<img'), node_text
    k, node = next((k, v) for k, v in state["nodes"].items() if v)
    view.locator(f'.sbs-row[data-k="{k}"]').click()
    page.wait_for_function("([p, id]) => [...p.querySelectorAll('g.node.sbsg-sel')].some(g => g.dataset.id === id)",
                           arg=[pane_b.element_handle(), f"b:{node}"], timeout=30_000)
    assert view.locator(".sbsg-pane").nth(1).locator("g.node.sbsg-sel").count() >= 1  # a's twin too
    assert view.evaluate("root => root.querySelector('img') === null && globalThis.pwned === undefined")

    # dark theme: the new texts readable on what is under them
    page.evaluate(theme, "JupyterLab Dark")
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
    page.wait_for_function("root => getComputedStyle(root).backgroundColor !== 'rgb(255, 255, 255)'", arg=handle,
                           timeout=30_000)
    page.wait_for_timeout(300)  # the theme's transition, if any, has ended
    departing = view.evaluate(PROBE)  # the rows where b departs (the filter is on), then the first rows of all
    view.locator(".sbs-models input[type=checkbox]").uncheck()
    page.wait_for_function(f"root => Number(root.dataset.shown) === {n}", arg=handle, timeout=10_000)
    got = view.evaluate(PROBE)
    assert any(r["b"] in ("departs", "inherits") and r["cells"] for r in departing["rows"]), departing
    assert got["plain"] and any(r["b"] == "rounding" and r["cells"] for r in got["rows"]), got
    checked = _readable(departing) + _readable(got)
    view.screenshot(path=str(tmp_path / "models-dark.png"))
    print(f"\n[models] {checked} texts checked; screenshot {tmp_path / 'models-dark.png'}")
    page.evaluate(theme, "JupyterLab Light")
    errors = [line for line in page.console_lines if line.startswith("pageerror")]
    assert not errors, errors

    # the offline report (save_html): the same b columns, filter, culprits and third graph, no kernel
    page.goto(f"file://{lab.root / 'models_report.html'}")
    page.wait_for_selector(".sbs-root .sbs-row", timeout=30_000)
    report = page.locator(".sbs-root").first
    heads = [t.strip() for t in report.locator(".sbs-head > div").all_text_contents()]
    assert {"b name", "b err_abs", "b err_local", "b verdict"} <= set(heads), heads
    assert report.locator(".sbs-culprits li[data-side=b]").first.get_attribute("data-node") == HOSTILE
    report.locator(".sbs-models input[type=checkbox]").check()
    page.wait_for_function(f"() => Number(document.querySelector('.sbs-root').dataset.shown) === {shown}", timeout=10_000)
    report.locator(".sbs-graphs-box > summary").click()
    page.wait_for_function("() => document.querySelectorAll('.sbsg-pane[data-renders]').length === 3", timeout=120_000)
    assert f"b:{HOSTILE}" in page.evaluate("() => [...document.querySelectorAll('.sbsg-pane:nth-child(3) g.node')]"
                                           ".map(g => g.dataset.id)")
    assert page.evaluate("() => document.querySelector('.sbs-root img') === null && globalThis.pwned === undefined")
    errors = [line for line in page.console_lines if line.startswith("pageerror")]
    assert not errors, errors
