"""SbsWidget in Jupyter Notebook 7 served by its own server (``jupyter notebook``), in Debian's Chromium:
Run All from Notebook 7's Run menu builds the bundled example with ``SbsWidget.from_module`` (torch.export
and torch.onnx in the first run), the run ends done, a clicked row is selected, and a later cell reads
``len(w.selected)``, ``w.status`` and ``len(w.filtered_dataframe())`` from the kernel.

Run: ``pytest -m browser tests/browser/test_notebook7.py -p no:playwright -s`` (``-s`` prints timings);
``SBS_WIDGET_SCREENSHOT=1`` also rewrites docs/widget-notebook7.png.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import NB, REPO, jupyter_server, open_notebook

pytestmark = pytest.mark.browser

# docs/widget-notebook7.png is rewritten only on request: a plain run leaves the tree clean
SCREENSHOT_TO_DOCS = os.environ.get("SBS_WIDGET_SCREENSHOT") == "1"

BUILD = """import sbs_widget
model, inputs = sbs_widget.dummy_llm()
w = sbs_widget.SbsWidget.from_module(model, inputs, title="dummy_llm in Notebook 7")
w"""
READ = """import json
print("STATE" + json.dumps({"selected": len(w.selected), "status": w.status,
                            "filtered": len(w.filtered_dataframe())}))"""

ROOT = f"{NB} .jp-OutputArea .sbs-root"
CELLS = f"{NB} .jp-Notebook .jp-Cell"


@pytest.fixture(scope="module")
def notebook7(tmp_path_factory):
    """Notebook 7's own server (not JupyterLab's /notebooks route), one for this module."""
    pytest.importorskip("notebook", minversion="7")
    pytest.importorskip("jupyterlab")
    with jupyter_server("notebook", tmp_path_factory.mktemp("notebook7")) as server:
        yield server


def _prompt(page, index: int) -> str:
    return page.locator(CELLS).nth(index).locator(".jp-InputPrompt").text_content() or ""


def _run_cell_by_keyboard(page, index: int) -> str:
    """Click into cell ``index``, Ctrl+Enter (run in place); return its output once the prompt shows a new count."""
    before = _prompt(page, index)
    cell = page.locator(CELLS).nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    page.wait_for_function(
        """([sel, i, before]) => { const p = document.querySelectorAll(sel)[i].querySelector('.jp-InputPrompt').textContent;
            return p !== before && /\\[\\d+\\]/.test(p); }""",
        arg=[CELLS, index, before], timeout=120_000)
    return cell.locator(".jp-OutputArea").text_content() or ""


def _state(text: str) -> dict:
    return json.loads(text[text.index("STATE") + 5:].strip().splitlines()[0])


def test_widget_in_notebook7(notebook7, lab_page, tmp_path):
    page = lab_page
    shots = REPO / "docs" if SCREENSHOT_TO_DOCS else tmp_path
    name = notebook7.write_notebook("nb7_widget.ipynb", [BUILD, READ])
    t0 = time.perf_counter()
    open_notebook(page, notebook7, name, notebook7=True)  # waits until the kernel really accepts work
    t_open = time.perf_counter()
    before = len(page.console_lines)  # Notebook 7 logs a startup error of its own ("reading 'schema'")

    # Run > Run All Cells, from Notebook 7's menu bar
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator(".lm-Menu-item:visible", has_text="Run All Cells").first.click()
    # a Run All dropped by a half-connected kernel leaves the first prompt at "[ ]:"
    page.wait_for_function(
        "sel => { const p = document.querySelector(sel + ' .jp-InputPrompt'); return p && !p.textContent.includes('[ ]'); }",
        arg=CELLS, timeout=60_000)

    page.wait_for_selector(ROOT, timeout=180_000)
    t_view = time.perf_counter()
    view = page.locator(ROOT).first
    # record what the progress line says while the export and the comparison run
    view.evaluate("""root => { root._seen = new Set([root.querySelector('.sbs-badge').textContent + ' | ' +
            root.querySelector('.sbs-current').textContent]);
        new MutationObserver(() => root._seen.add(root.querySelector('.sbs-badge').textContent + ' | ' +
            root.querySelector('.sbs-current').textContent))
          .observe(root, {childList: true, characterData: true, subtree: true}); }""")

    # the run ends done: the bar says so, full, and the table has rows
    page.wait_for_function(
        "root => root.querySelector('.sbs-meter')?.dataset.state === 'done' && Number(root.dataset.rows) > 0",
        arg=view.element_handle(), timeout=300_000)
    t_done = time.perf_counter()
    seen = sorted(view.evaluate("root => [...root._seen]"))
    bar = view.evaluate("""root => { const m = root.querySelector('.sbs-meter');
        return {state: m.dataset.state, width: m.firstElementChild.style.width, badge: root.querySelector('.sbs-badge').textContent,
                label: root.querySelector('.sbs-progress-state').textContent, text: m.parentElement.textContent}; }""")
    assert bar["state"] == "done" and bar["badge"] == "done" and bar["width"] == "100%" and bar["label"] == "100%", bar
    assert "FX " in bar["text"] and "records" in bar["text"], bar
    n_rows = int(view.get_attribute("data-rows"))
    n_shown = int(view.get_attribute("data-matched"))  # every row, inner values folded under their FX node's included
    assert n_rows > 10 and n_shown == n_rows, (n_rows, n_shown)
    assert view.locator(".sbs-row").count() > 0

    # click a row: it is the one selection
    row = view.locator(".sbs-row").nth(2)
    k = int(row.get_attribute("data-k"))
    row.click()
    page.wait_for_function("([root, k]) => [...root.querySelectorAll('.sbs-row.sbs-selected')].map(r => Number(r.dataset.k)).join() === String(k)",
                           arg=[view.element_handle(), k], timeout=10_000)
    assert view.locator(".sbs-detail").text_content().strip()

    # Run All has finished: the second cell shows its count (not "[*]:")
    page.wait_for_function("sel => /\\[\\d+\\]/.test(document.querySelectorAll(sel)[1].querySelector('.jp-InputPrompt').textContent)",
                           arg=CELLS, timeout=120_000)
    # the kernel agrees (read by a second cell: a running cell would hold the comm messages). The view
    # publishes its selection at most every 150 ms, so read again until it has arrived.
    deadline = time.perf_counter() + 60
    while True:
        out = _run_cell_by_keyboard(page, 1)
        state = _state(out)
        if state["selected"] == 1 or time.perf_counter() > deadline:
            break
    assert state == {"selected": 1, "status": "done", "filtered": n_shown}, (state, n_shown)
    # and the page shows those values, in the second cell's output
    text = page.locator(CELLS).nth(1).locator(".jp-OutputArea").text_content()
    assert f'"selected": 1, "status": "done", "filtered": {n_shown}' in text, text
    assert view.locator(".sbs-row.sbs-selected").count() == 1  # running a cell left the selection as it was

    view.scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "widget-notebook7.png"))
    print(f"\n[notebook7] page ready {t_open - t0:.1f} s; view {t_view - t_open:.1f} s after Run All; done "
          f"{t_done - t_view:.1f} s later (export included); {n_rows} rows; progress seen: {seen}")
    errors = [line for line in page.console_lines[before:] if line.startswith("pageerror")]
    assert not errors, errors
