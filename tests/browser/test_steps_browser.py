"""The decode-step strip (project issue 50) in a real JupyterLab + Chromium: ``SbsWidget(..., steps=4)``
on a LLaMA whose ONNX attention mask hides every generated token shows 5 step cells above the table, the
first diverging step marked, the lockstep at that step in the table; a click on another step streams
that step's lockstep into the table as a new run, which the kernel then reads back; the strip keeps
readable in JupyterLab's dark theme; the offline report (``save_html``) draws the strip, not clickable.

Run: ``pytest -m browser tests/browser/test_steps_browser.py -p no:playwright``.
"""

from __future__ import annotations

import json

import pytest
from conftest import NB, open_notebook, run_cell

pytestmark = pytest.mark.browser

STEPS = 4
DECODER = f'''
import json, sbs_widget
from sbs_widget.samples import zoo
from sbs_widget.samples.decode_faults import mask_beyond
ep, program, args, kwargs = zoo.export("llama", optimize=True, dynamic=True)
bad, _ = mask_beyond(program.model_proto, int(args[0].shape[1]))  # generated tokens hidden in ONNX only
w = sbs_widget.SbsWidget(ep, bad, args, kwargs=kwargs, steps={STEPS}, title="LLaMA <b>mask</b> beyond the prompt")
w
'''
READ_STATE = '''w.wait()
print("STATE" + json.dumps({"step": w.runs[-1].step, "runs": len(w.runs), "n": len(w.records),
      "records": len(w.step_records(3)), "first": w.decoding["first_divergence"], "steps": len(w.steps),
      "saved": str(w.save_html("steps_report.html"))}))
'''
ROOT = f"{NB} .jp-OutputArea .sbs-root"


def test_strip_renders_and_a_click_streams_the_step(lab, lab_page, tmp_path):
    page = lab_page
    name = lab.write_notebook("steps.ipynb", [DECODER, READ_STATE])
    open_notebook(page, lab, name)
    page.evaluate("() => { const nb = window.jupyterapp.shell.currentWidget.content; nb.activeCellIndex = 0; nb.deselectAll(); }")
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-cell')")  # the first cell only
    page.wait_for_selector(ROOT, timeout=120_000)
    view = page.locator(ROOT).first
    handle = view.element_handle()
    # the strip: N+1 cells once the decoding ended, then the lockstep at the first divergence (step 1)
    page.wait_for_function(f"root => root.querySelectorAll('.sbs-steps .sbs-step').length === {STEPS + 1}",
                           arg=handle, timeout=120_000)
    page.wait_for_function("root => root.querySelector('.sbs-badge').textContent === 'done' && "
                           "Number(root.dataset.rows) > 0", arg=handle, timeout=120_000)
    cells = view.locator(".sbs-steps .sbs-step")
    assert [cells.nth(k).get_attribute("data-step") for k in range(STEPS + 1)] == [str(k) for k in range(STEPS + 1)]
    step1 = view.locator('.sbs-step[data-step="1"]')
    assert step1.get_attribute("data-first-open") == "true" and step1.get_attribute("data-first-closed") == "true"
    assert step1.locator("[data-mark=first-open]").text_content() == "▽O"
    page.wait_for_function("root => root.querySelector('.sbs-step[data-step=\"1\"]').getAttribute('aria-pressed') === 'true'",
                           arg=handle, timeout=30_000)
    assert view.locator(".sbs-culprits").is_visible(), "the step's culprits fill the panel"
    # the tokens are text; the strip sits above the table
    assert step1.locator("[data-side=torch]").text_content().replace(" ", "").isdigit()
    assert view.evaluate("root => root.querySelector('.sbs-steps').getBoundingClientRect().bottom <= "
                         "root.querySelector('.sbs-main').getBoundingClientRect().top")
    rows_before = int(view.get_attribute("data-rows"))

    # a click on step 3: a new run, its rows stream into the table
    view.locator('.sbs-step[data-step="3"]').click()
    page.wait_for_function("root => root.querySelector('.sbs-step[data-step=\"3\"]').getAttribute('aria-pressed') === 'true'",
                           arg=handle, timeout=60_000)
    page.wait_for_function("root => root.querySelector('.sbs-badge').textContent === 'done' && Number(root.dataset.rows) > 0 "
                           "&& root.querySelector(\"select[aria-label='run']\").options.length === 2",
                           arg=handle, timeout=120_000)
    assert view.locator(".sbs-row").count() > 0
    rows_after = int(view.get_attribute("data-rows"))
    assert rows_after > 0 and abs(rows_after - rows_before) < rows_before, (rows_before, rows_after)

    out = run_cell(page, 1)
    state = json.loads(out[out.index("STATE") + 5:].strip().splitlines()[0])
    assert state["step"] == 3 and state["runs"] == 2 and state["n"] == rows_after and state["steps"] == STEPS + 1
    assert state["records"] == rows_after and state["first"] == {"closed_loop": 1, "open_loop": 1}

    # dark theme: the strip's text takes the theme's colour (light on dark)
    # (the theme is a setting of the session's server: an earlier test may have left it dark)
    theme = "(name) => window.jupyterapp.commands.execute('apputils:change-theme', {theme: name})"
    colour = "root => getComputedStyle(root.querySelector('.sbs-steps-head')).color"
    page.evaluate(theme, "JupyterLab Light")
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'true'", timeout=30_000)
    page.wait_for_timeout(300)
    light = view.evaluate(colour)
    page.evaluate(theme, "JupyterLab Dark")
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
    page.wait_for_function(f"([root, before]) => ({colour})(root) !== before", arg=[handle, light], timeout=30_000)
    view.screenshot(path=str(tmp_path / "steps-dark.png"))
    print(f"\n[steps] screenshot {tmp_path / 'steps-dark.png'}")
    errors = [line for line in page.console_lines if line.startswith("pageerror")]
    assert not errors, errors

    # the offline report: the same strip, no kernel to ask
    page.goto(f"file://{lab.root / 'steps_report.html'}")
    page.wait_for_selector(".sbs-root .sbs-steps .sbs-step", timeout=30_000)
    assert page.locator(".sbs-steps .sbs-step").count() == STEPS + 1
    assert page.locator('.sbs-step[data-step="1"]').get_attribute("data-first-open") == "true"
    assert page.locator('.sbs-step[data-step="3"]').get_attribute("aria-pressed") == "true"
    assert page.evaluate("() => [...document.querySelectorAll('.sbs-step')].every(c => c.disabled)")
    errors = [line for line in page.console_lines if line.startswith("pageerror")]
    assert not errors, errors
