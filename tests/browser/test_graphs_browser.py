"""The graph views in Debian's Chromium: linking, table selection, cluster collapse/expand.

Most tests use the offline page ``python -m sbs_widget graph`` writes (the same ``mountGraphs`` as the
widget, a plain table standing in for the widget's), opened from a file:// URL: no server, 1-2 s each.
One test runs the real widget in JupyterLab (conftest's ``lab``): FX node click -> ONNX twin and table row.
Run: ``pytest -m browser tests/browser/test_graphs_browser.py -p no:playwright``.
"""

from __future__ import annotations

import os
import warnings

import pytest
from conftest import NB, open_notebook, run_all

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def page_file(tmp_path_factory):
    torch = pytest.importorskip("torch")
    import sbs_widget
    from sbs_widget.graphs.page import write_graphs_html
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


@pytest.fixture
def page(chromium, page_file):
    page = chromium.new_page(viewport={"width": 1400, "height": 900})
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
    onnx_ids = page.eval_on_selector_all(".sbsg-pane:nth-child(2) g.node", "gs => gs.map(g => g.dataset.id)")
    assert "onnx:node_softmax" in onnx_ids and len(onnx_ids) < 12


WIDGET_CELL = """
import onnx, torch, sbs_widget
from onnx import numpy_helper
model, inputs = sbs_widget.dummy_llm()
program = torch.onnx.export(model, inputs, dynamo=True, verbose=False)
proto = onnx.ModelProto(); proto.CopyFrom(program.model_proto)
for init in proto.graph.initializer:  # fc1's bias altered in the ONNX file: linear_4 diverges
    if init.name == "decoder.feed_forward.fc1.bias":
        v = numpy_helper.to_array(init).copy(); v[3] += 0.05
        init.CopyFrom(numpy_helper.from_array(v, init.name))
w = sbs_widget.SbsWidget(program.exported_program, proto, inputs, title="graphs")
w
"""


def test_widget_graphs_link_to_the_table(lab, lab_page):
    page = lab_page
    open_notebook(page, lab, lab.write_notebook("graphs.ipynb", [WIDGET_CELL]))
    run_all(page)
    root = f"{NB} .jp-OutputArea .sbs-root"
    page.wait_for_selector(root, timeout=120_000)
    page.wait_for_function(f"document.querySelector('{root} .sbs-badge')?.textContent === 'done'", timeout=120_000)
    page.click(f"{root} .sbs-graphs-box > summary")
    page.wait_for_function(f"document.querySelectorAll('{root} .sbsg-pane[data-renders]').length == 2",
                           timeout=60_000)
    fx_node = f'{root} g.node[data-id="fx:linear_4"]'
    # Painted by the run: the altered bias makes linear_4 a mismatch.
    assert page.get_attribute(fx_node, "data-status") == "mismatch"
    page.click(fx_node)
    assert "sbsg-sel" in page.get_attribute(f'{root} g.node[data-id="onnx:node_linear_4"]', "class")
    selected = page.locator(f"{root} .sbs-row.sbs-selected")
    assert selected.count() == 1 and "linear_4" in selected.text_content()
    if os.environ.get("SBS_GRAPHS_SCREENSHOT"):  # a look at the graphs inside JupyterLab
        page.wait_for_timeout(500)
        page.screenshot(path=os.environ["SBS_GRAPHS_SCREENSHOT"], full_page=True)


def test_narrow_screens_stack_the_graphs(page):
    boxes = lambda: [page.query_selector(f".sbsg-pane:nth-child({k})").bounding_box() for k in (1, 2)]  # noqa: E731
    fx, onnx = boxes()
    assert abs(fx["y"] - onnx["y"]) < 1 and onnx["x"] > fx["x"] + fx["width"] - 1  # side by side
    page.set_viewport_size({"width": 700, "height": 900})
    page.wait_for_timeout(100)
    fx, onnx = boxes()
    assert onnx["y"] >= fx["y"] + fx["height"] - 1 and abs(onnx["x"] - fx["x"]) < 1  # stacked
