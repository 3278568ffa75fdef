"""Inner values (issue 32) in a real JupyterLab: a real comparison of the zoo's LLaMA, whose rsqrt and
silu the exporter writes as several ONNX nodes; the FX node's row holds them behind a disclosure (a
count and the worst status), a click shows them under it, each with the torch op it is compared with,
and the ONNX graph draws each translation as a cluster named after the FX node.
Run: ``pytest -m browser tests/browser/test_inner_rows_browser.py -p no:playwright``.
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import NB, open_notebook, run_all, run_cell

pytestmark = pytest.mark.browser

ROOT = f"{NB} .jp-OutputArea .sbs-root"
LLAMA = '''
import json, sbs_widget
from sbs_widget.samples import zoo
ep, prog, args, kwargs = zoo.export("llama")
w = sbs_widget.SbsWidget(ep, prog.model_proto, args, kwargs=kwargs, title="zoo llama: inner values")
w
'''
READ = '''w.wait()
inner = [r for r in w.records if r.kind == "inner"]
print("STATE" + json.dumps({"n": len(w.records), "inner": len(inner),
      "parents": sorted({r.inner_of for r in inner}), "ops": sorted({r.inner_op or "" for r in inner})}))
'''


def test_inner_values_fold_under_their_fx_node(lab, lab_page):
    page = lab_page
    name = lab.write_notebook("inner.ipynb", [LLAMA, READ])
    open_notebook(page, lab, name)
    run_all(page)
    page.wait_for_selector(ROOT, timeout=120_000)
    view = page.locator(ROOT).first
    page.wait_for_function("root => root.querySelector('.sbs-badge').textContent === 'done' && "
                           "Number(root.dataset.matched) > Number(root.dataset.shown)", arg=view.element_handle(),
                           timeout=120_000)
    text = run_cell(page, 1)
    state = json.loads(text[text.index("STATE") + 5:].strip().splitlines()[0])
    assert state["inner"] > 0, state
    assert int(view.get_attribute("data-rows")) == state["n"]
    # collapsed by default: every inner row whose FX node has a row is folded
    assert int(view.get_attribute("data-matched")) == state["n"]
    assert int(view.get_attribute("data-shown")) <= state["n"] - state["inner"]

    view.locator("input[aria-label='filter']").fill(state["parents"][0])
    button = view.locator(".sbs-row .sbs-disclose:not([hidden])").first
    label = button.text_content()
    assert re.fullmatch(r"▸ \d+( · \d+ [a-z-]+)?", label), label
    count = int(label.split()[1])
    assert button.get_attribute("aria-expanded") == "false"
    assert f"{count} inside" in button.get_attribute("aria-label")
    parent = int(button.evaluate("b => b.closest('.sbs-row').dataset.k"))
    button.click()
    assert button.get_attribute("aria-expanded") == "true"
    rows = view.evaluate("""root => [...root.querySelectorAll('.sbs-row')].filter(r => r.style.display !== 'none')
        .sort((a, b) => parseFloat(a.style.transform.slice(11)) - parseFloat(b.style.transform.slice(11)))
        .map(r => ({k: Number(r.dataset.k), child: r.classList.contains('sbs-child'),
                    op: r.querySelector('.sbs-inner-op').textContent, name: r.querySelector('.sbs-fxname').textContent,
                    indent: getComputedStyle(r.querySelector('.sbs-fxname')).paddingLeft}))""")
    at = [r["k"] for r in rows].index(parent)
    children = rows[at + 1:at + 1 + count]
    assert len(children) == count and all(r["child"] for r in children), rows
    assert all(r["op"] in state["ops"] and r["op"].startswith("aten.") for r in children if r["op"] != "unpaired"), rows
    assert any(r["op"] != "unpaired" for r in children), rows
    assert children[0]["indent"] != rows[at]["indent"]
    # the keyboard reaches the disclosure: Enter closes it again
    button.focus()
    page.keyboard.press("Enter")
    assert button.get_attribute("aria-expanded") == "false"

    # a child's detail names its FX node and torch op
    button.click()
    view.locator(f".sbs-row[data-k='{children[0]['k']}']").click()
    detail = view.locator(".sbs-detail").text_content()
    assert f"inside{state['parents'][0]}" in detail and f"torch op{children[0]['op']}" in detail

    # the ONNX graph: the translation drawn as a cluster named after the FX node
    view.locator(".sbs-graphs-box > summary").click()
    page.wait_for_selector(f"{ROOT} .sbs-graphs-host svg", timeout=60_000)
    page.wait_for_function("root => root.querySelectorAll('.sbs-graphs-host svg').length >= 2", arg=view.element_handle(),
                           timeout=60_000)
    titles = view.evaluate("""root => { const svg = root.querySelectorAll('.sbs-graphs-host svg')[1];
        return [...svg.querySelectorAll('g.cluster text, g.node text')].map(t => t.textContent); }""")
    assert state["parents"][0] in titles, titles[:40]
    errors = [line for line in page.console_lines if line.startswith("pageerror")]
    assert not errors, errors
