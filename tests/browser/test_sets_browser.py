"""Input sets (project issue 50, item 4) in a real JupyterLab + Chromium: ``SbsWidget.from_input_sets`` on a
model whose ONNX side zeroes the positions from 8 on shows the input sets panel, the spread columns (max and
median err, beyond n of 4, the worst input), the input-dependent rows marked and filtered; "show worst input"
on a selected row shows that input's own records as a new run, which the kernel reads back.

Run: ``pytest -m browser tests/browser/test_sets_browser.py -p no:playwright``.
"""

from __future__ import annotations

import json

import pytest
from conftest import NB, open_notebook, run_cell

pytestmark = pytest.mark.browser

SETS = '''
import json, torch, sbs_widget
from sbs_widget.samples import faults
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.norm = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16), torch.nn.LayerNorm(16)
    def forward(self, x):
        return self.norm(self.fc2(torch.relu(self.fc1(x))) + x)
prog = torch.onnx.export(Net().eval(), (torch.randn(2, 12, 16),), dynamo=True, verbose=False,
                         dynamic_shapes={"x": {1: torch.export.Dim("seq", max=256)}})
bad = faults.zero_beyond(prog.model_proto, "relu", length=8)
gen = torch.Generator().manual_seed(3)
sets = [(torch.randn(2, s, 16, generator=gen),) for s in (4, 8, 12, 16)]
w = sbs_widget.SbsWidget.from_input_sets(prog.exported_program, bad, sets, max_workers=0, title="sets <b>x</b>")
w
'''
READ_STATE = '''w.wait()
print("STATE" + json.dumps({"input": w.runs[-1].input, "runs": len(w.runs), "n": len(w.records),
      "own": len(w.input_sets.records[w.runs[-1].input or 0])}))
'''
ROOT = f"{NB} .jp-OutputArea .sbs-root"


def test_spread_columns_and_input_dependent_marks(lab, lab_page, tmp_path):
    page = lab_page
    name = lab.write_notebook("sets.ipynb", [SETS, READ_STATE])
    open_notebook(page, lab, name)
    page.evaluate("() => { const nb = window.jupyterapp.shell.currentWidget.content; nb.activeCellIndex = 0; nb.deselectAll(); }")
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-cell')")  # the first cell only
    page.wait_for_selector(ROOT, timeout=120_000)
    view = page.locator(ROOT).first
    handle = view.element_handle()
    page.wait_for_function("root => root.querySelector('.sbs-badge').textContent === 'done' && Number(root.dataset.rows) > 0 "
                           "&& !root.querySelector('.sbs-sets').hidden", arg=handle, timeout=120_000)
    assert "4 input sets" in view.locator(".sbs-sets-summary").text_content()
    heads = [t.strip() for t in view.locator(".sbs-head > div").all_text_contents()]
    for label in ("max err", "median err", "beyond", "worst input", "input-dep."):
        assert label in heads, heads
    marked = view.locator(".sbs-row[data-input-dependent=true]")
    page.wait_for_function("root => root.querySelectorAll('.sbs-row[data-input-dependent=true]').length > 0", arg=handle, timeout=30_000)
    first = marked.first
    cells = [c.strip() for c in first.locator("div").all_text_contents()]
    assert "◆ yes" in cells and "2/4" in cells and any(c.startswith("#3 ") or c.startswith("#2 ") for c in cells), cells
    assert view.locator(".sbs-culprits li[data-count='2']").count() >= 1, "grouped culprits: named on 2 inputs"
    # the filter: input-dependent rows only
    total = int(view.get_attribute("data-shown"))
    view.locator("label", has_text="input-dependent only").locator("input").check()
    page.wait_for_function(f"root => Number(root.dataset.shown) < {total}", arg=handle, timeout=10_000)
    drawn = view.evaluate("root => [...root.querySelectorAll('.sbs-row')].filter(r => r.style.display !== 'none')"
                          ".map(r => r.dataset.inputDependent === 'true')")
    assert len(drawn) == int(view.get_attribute("data-shown")) and all(drawn), drawn
    # dark theme: the mark keeps a colour of the theme
    colour = view.evaluate("root => getComputedStyle(root.querySelector('.sbs-row[data-input-dependent=true] .sbs-spread-dep')).color")
    assert colour and colour != "rgba(0, 0, 0, 0)"
    view.screenshot(path=str(tmp_path / "sets.png"))
    print(f"\n[sets] screenshot {tmp_path / 'sets.png'}")

    # the selected row's worst input: its own records as a new run
    first.click()
    worst = view.locator(".sbs-sets-worst")
    assert worst.is_visible()
    worst.click()
    page.wait_for_function("root => root.querySelector(\"select[aria-label='run']\").options.length === 2 "
                           "&& root.querySelector('.sbs-badge').textContent === 'done'", arg=handle, timeout=60_000)
    out = run_cell(page, 1)
    state = json.loads(out[out.index("STATE") + 5:].strip().splitlines()[0])
    assert state["input"] in (2, 3) and state["runs"] == 2 and state["n"] == state["own"]
    page.wait_for_function(f"root => Number(root.dataset.rows) === {state['n']}", arg=handle, timeout=30_000)
    errors = [line for line in page.console_lines if line.startswith("pageerror")]
    assert not errors, errors
