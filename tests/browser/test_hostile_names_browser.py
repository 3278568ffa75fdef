"""Issue 31 in Debian's Chromium: a model name holding U+202E (right-to-left override), a NUL and 100k
characters shows escaped in the widget's table and detail (the offline report: the widget's own view)
and in the graph labels; a 20,000-node chain draws a part with a note naming the node count.
Run: ``pytest -m browser tests/browser/test_hostile_names_browser.py -p no:playwright``.
"""

from __future__ import annotations

import warnings

import pytest

pytestmark = pytest.mark.browser

RLO = "relu\u202eTMATMUL\x00"  # would display as "reluLUMTAMT" and cut at the NUL
RLO_SHOWN = "relu\\u202eTMATMUL\\x00"
LONG = "L" * 100_000 + "tail"


def rename_value(model, old: str, new: str) -> None:
    for node in model.graph.node:
        node.input[:] = [new if v == old else v for v in node.input]
        node.output[:] = [new if v == old else v for v in node.output]
    for v in list(model.graph.output) + list(model.graph.value_info):
        if v.name == old:
            v.name = new


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """A real export and run whose ONNX ReLU is named RLO (value and node) and whose MatMul node is 100k long."""
    torch = pytest.importorskip("torch")
    import onnx
    from engine_models import export_module

    from sbs_widget.engine.entry import prepare

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    args = (torch.randn(3, 4),)
    ep, prog = export_module(model, args)
    onx = onnx.ModelProto()
    onx.CopyFrom(prog.model_proto)
    relu = next(n for n in onx.graph.node if n.op_type == "Relu")
    rename_value(onx, relu.output[0], RLO)
    relu.name = RLO
    next(n for n in onx.graph.node if n.op_type in ("Gemm", "MatMul")).name = LONG
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records = list(prepare(ep, onx).run(args))
    assert any(r.onnx_name == RLO for r in records)
    return tmp_path_factory.mktemp("hostile"), ep, onx, records


def test_bidi_name_is_escaped_in_the_widget_table_and_detail(chromium, hostile_run):
    from sbs_widget.views.report import write_html_report

    root, _, _, records = hostile_run
    path = write_html_report(records, root / "report.html", title="hostile \u202etitle")
    page = chromium.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(path.as_uri())
        page.wait_for_function("document.querySelectorAll('.sbs-row[data-k]').length > 0", timeout=30_000)
        cells = page.eval_on_selector_all(".sbs-row[data-k] > div", "cs => cs.map((c) => c.textContent)")
        assert RLO_SHOWN in cells, cells
        shown = page.evaluate("document.body.innerText")
        assert "\u202e" not in shown and "\x00" not in shown  # nothing hidden reaches the screen
        assert "hostile \\u202etitle" in shown
        # the detail of that row names it escaped too
        row = page.locator(".sbs-row[data-k]", has_text=RLO_SHOWN).first
        row.click()
        page.wait_for_function(f"document.body.innerText.split({RLO_SHOWN!r}).length > 2", timeout=10_000)
        assert "\u202e" not in page.evaluate("document.body.innerText")
    finally:
        page.close()
    assert not errors, errors


def test_graph_labels_escaped_and_shortened_with_full_name_on_hover(chromium, hostile_run):
    from sbs_widget.graphs.page import write_graphs_html

    root, ep, onx, records = hostile_run
    path = write_graphs_html(root / "graphs.html", (ep, onx), records)
    page = chromium.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(path.as_uri())
        page.wait_for_function("document.querySelectorAll('.sbsg-pane[data-renders]').length == 2", timeout=60_000)
        onnx_pane = page.locator(".sbsg-pane").nth(1)
        texts = onnx_pane.locator("g.node text").all_text_contents()
        assert RLO_SHOWN in texts, texts
        assert max(len(t) for t in texts) <= 64 and any(t.startswith("LLL") and t.endswith("tail") for t in texts)
        titles = onnx_pane.locator("g.node > title").all_text_contents()
        assert any(t.startswith(LONG) for t in titles)  # the full 100k name on hover
        assert "\u202e" not in page.evaluate("document.body.innerText")
        assert RLO_SHOWN in page.locator(".sbsp-table").inner_text()
    finally:
        page.close()
    assert not errors, errors


def test_a_20000_node_chain_draws_a_part_and_says_so(chromium, tmp_path):
    from onnx import TensorProto, helper

    from sbs_widget.graphs.dot import onnx_graph
    from sbs_widget.graphs.page import write_graphs_html

    n = 20_000
    nodes = [helper.make_node("Relu", [f"v{i - 1}" if i else "x"], [f"v{i}"], name=f"relu_{i}") for i in range(n)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info(f"v{n - 1}", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    torch = pytest.importorskip("torch")
    from engine_models import export_module

    ep, _ = export_module(torch.nn.ReLU(), (torch.randn(2),))
    assert onnx_graph(model).source  # the DOT of the whole chain builds
    path = write_graphs_html(tmp_path / "chain.html", (ep, model))
    page = chromium.new_page(viewport={"width": 1400, "height": 900})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(path.as_uri())
        page.wait_for_function("document.querySelectorAll('.sbsg-pane')[1]?.dataset.renders"
                               " || document.querySelectorAll('.sbsg-pane')[1]?.querySelector('.sbsg-message')",
                               timeout=120_000)
        onnx_pane = page.locator(".sbsg-pane").nth(1)
        assert onnx_pane.locator(".sbsg-message").count() == 0
        note = onnx_pane.locator(".sbsg-note").inner_text()
        assert "20,002 nodes" in note and "showing 1,500 nodes" in note, note
        assert onnx_pane.locator("g.node").count() == 1500
    finally:
        page.close()
    assert not errors, errors
