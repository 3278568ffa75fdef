"""The graph views in Debian's Chromium: linking, table selection, cluster collapse/expand.

Runs on the offline page ``python -m sbs_widget graph`` writes (same ``mountGraphs`` as the widget, with a
plain table standing in for the widget's), opened from a file:// URL: no server needed.
Run: ``pytest -m browser tests/browser/test_graphs.py -p no:playwright``.
"""

from __future__ import annotations

import shutil
import warnings

import pytest

pytestmark = pytest.mark.browser

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def page_file(tmp_path_factory):
    torch = pytest.importorskip("torch")
    import sbs_widget
    from sbs_widget.graphs_html import write_graphs_html
    from sbs_widget.records import Record

    model, inputs = sbs_widget.dummy_llm()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, inputs, dynamo=True, verbose=False)
    ep, onx = program.exported_program, program.model_proto
    onnx_nodes = {n.name for n in onx.graph.node}
    records = []
    for node in ep.graph.nodes:
        if node.op == "call_function" and f"node_{node.name}" in onnx_nodes:
            err = 0.05 if node.name.startswith("linear") else 1e-7
            records.append(Record(ep_name=node.name, onnx_name=node.name, onnx_node_name=f"node_{node.name}",
                                  err_abs=err, status="mismatch" if err > 1e-4 else "ok"))
    path = tmp_path_factory.mktemp("graphs") / "graphs.html"
    write_graphs_html(path, (ep, onx), records, title="browser test")
    return path, records


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api")
    exe = shutil.which("chromium")
    if not exe:
        pytest.skip("Debian's chromium is not installed")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, page_file):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(page_file[0].as_uri())
    page.wait_for_function("document.querySelectorAll('.sbsg-pane[data-renders]').length == 2", timeout=30_000)
    yield page
    page.close()
    assert not errors, errors


def renders(page, pane: int) -> int:
    return int(page.eval_on_selector_all(".sbsg-pane", f"p => p[{pane}].dataset.renders"))


def test_click_fx_node_highlights_onnx_twin_and_selects_row(page, page_file):
    records = page_file[1]
    row = next(i for i, r in enumerate(records) if r.ep_name == "linear")
    page.click('.sbsg-pane g.node[data-id="fx:linear"]')
    assert "sbsg-sel" in page.get_attribute('g.node[data-id="onnx:node_linear"]', "class")
    assert "sbsg-sel" in page.get_attribute('g.node[data-id="fx:linear"]', "class")
    assert "sbsp-selected" in page.get_attribute(f'tr[data-row="{row}"]', "class")
    # Painted on the log scale: the mismatched pair is not green.
    fill = page.eval_on_selector('g.node[data-id="onnx:node_linear"] polygon, g.node[data-id="onnx:node_linear"] path',
                                 "e => e.getAttribute('fill')")
    assert fill not in ("#ffffff", "none")


def test_table_row_selects_both_nodes(page, page_file):
    records = page_file[1]
    row = next(i for i, r in enumerate(records) if r.ep_name == "add")
    page.click(f'tr[data-row="{row}"]')
    assert "sbsg-sel" in page.get_attribute('g.node[data-id="fx:add"]', "class")
    assert "sbsg-sel" in page.get_attribute('g.node[data-id="onnx:node_add"]', "class")


def test_hover_marks_counterpart(page):
    page.hover('g.node[data-id="onnx:node_layer_norm"]')
    assert "sbsg-hover" in page.get_attribute('g.node[data-id="fx:layer_norm"]', "class")


def test_cluster_collapses_and_expands_on_both_sides(page):
    label = '.sbsg-pane:first-child g.cluster:has(> text:text-is("attention")) > text'
    before = [renders(page, 0), renders(page, 1)]
    page.click(label)
    page.wait_for_function(f"document.querySelectorAll('.sbsg-pane')[1].dataset.renders > {before[1]}")
    page.wait_for_function(f"document.querySelectorAll('.sbsg-pane')[0].dataset.renders > {before[0]}")
    box = 'g.node[data-id="cluster:decoder.attention"]'
    assert page.locator(box).count() == 2  # the same module closed in both graphs
    assert page.locator('g.node[data-id="fx:softmax"]').count() == 0
    before = [renders(page, 0), renders(page, 1)]
    page.click(f".sbsg-pane:first-child {box}")
    page.wait_for_function(f"document.querySelectorAll('.sbsg-pane')[0].dataset.renders > {before[0]}")
    page.wait_for_function(f"document.querySelectorAll('.sbsg-pane')[1].dataset.renders > {before[1]}")
    assert page.locator('g.node[data-id="fx:softmax"]').count() == 1
    assert page.locator(box).count() == 0


def test_neighbourhood_mode_shows_k_hops(page):
    page.click('g.node[data-id="fx:softmax"]')
    before = renders(page, 0)
    page.check(".sbsg-bar input[type=checkbox] >> nth=0")
    page.wait_for_function(f"document.querySelectorAll('.sbsg-pane')[0].dataset.renders > {before}")
    ids = set(page.eval_on_selector_all(".sbsg-pane:first-child g.node", "gs => gs.map(g => g.dataset.id)"))
    # softmax <- add_1 <- div, triu; softmax -> matmul_1 -> transpose_4 (and matmul_1's other input)
    assert {"fx:softmax", "fx:add_1", "fx:div", "fx:triu", "fx:matmul_1", "fx:transpose_4"} <= ids
    assert "fx:linear" not in ids and len(ids) < 10
    onnx_ids = page.eval_on_selector_all(".sbsg-pane:last-child g.node", "gs => gs.map(g => g.dataset.id)")
    assert "onnx:node_softmax" in onnx_ids and len(onnx_ids) < 12
