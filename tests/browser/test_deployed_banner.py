"""The as-deployed banner (issue 33) in a real JupyterLab: the toolbar's button starts a check whose
running state, then verdict, the banner shows above the table; ``w.check_deployed(wait=True)`` from
the kernel redraws it; the offline report (``save_html``) keeps it.

Run: ``pytest -m browser tests/browser/test_deployed_banner.py -p no:playwright``.
"""

from __future__ import annotations

import pytest
from conftest import NB, open_notebook, run_cell

pytestmark = pytest.mark.browser

DENORMAL = '''
import torch, sbs_widget
class Denormal(torch.nn.Module):  # ~1e-39 (float32 denormals) scaled back to ~0.1: flushed to zero, 0
    def forward(self, x):
        return (x * 1e-39) * 1e38
x = torch.rand(16, 16) + 0.5
ep = torch.export.export(Denormal(), (x,))
prog = torch.onnx.export(ep, (x,), dynamo=True, verbose=False, optimize=False)
w = sbs_widget.SbsWidget(ep, prog.model_proto, (x,), title="Denormal <b>as deployed</b>")
w
'''
FLUSH = '''w.check_deployed(session_options={"config": {"session.set_denormal_as_zero": "1"}}, wait=True)
print("VERDICT", w.deployed["status"], w.deployed["result"]["verdict"], w.deployed_result.sessions)
'''
SAVE = '''print("SAVED", w.save_html("deployed_report.html"))'''

ROOT = f"{NB} .jp-OutputArea .sbs-root"


def test_banner_after_the_button_and_after_check_deployed(lab, lab_page, tmp_path):
    page = lab_page
    name = lab.write_notebook("deployed.ipynb", [DENORMAL, FLUSH, SAVE])
    open_notebook(page, lab, name)
    command = "() => { const nb = window.jupyterapp.shell.currentWidget.content; nb.activeCellIndex = 0; nb.deselectAll(); }"
    page.evaluate(command)
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-cell')")  # the first cell only
    page.wait_for_selector(ROOT, timeout=120_000)
    view = page.locator(ROOT).first
    page.wait_for_function("root => root.querySelector('.sbs-badge').textContent === 'done'", arg=view.element_handle(),
                           timeout=60_000)
    banner = view.locator(".sbs-deployed")
    assert banner.is_hidden()
    button = view.locator("button.sbs-check-deployed")
    assert button.is_visible()

    # the button: the banner goes through "running" to the verdict with onnxruntime's defaults
    view.evaluate("""root => { root._states = []; const b = root.querySelector('.sbs-deployed');
        new MutationObserver(() => root._states.push(b.dataset.state)).observe(b, {attributes: true}); }""")
    button.click()
    page.wait_for_function("root => root.querySelector('.sbs-deployed').dataset.state === 'done'",
                           arg=view.element_handle(), timeout=120_000)
    states = view.evaluate("root => root._states")
    assert "running" in states, states
    verdict = view.locator(".sbs-deployed-verdict")
    assert verdict.text_content() == "same" and verdict.get_attribute("data-level") == "ok"
    assert button.is_hidden(), "the button leaves once a check ran"
    text = banner.text_content()
    assert "whole-model sessions" in text and "as deployed:" in text, text
    ok_colour = view.evaluate("root => getComputedStyle(root.querySelector('.sbs-deployed-verdict')).color")

    # the kernel: denormals flushed to zero, a session option; the same banner redraws
    out = run_cell(page, 1)
    assert "VERDICT done session-option" in out, out
    page.wait_for_function("root => root.querySelector('.sbs-deployed-verdict')?.textContent === 'session-option'",
                           arg=view.element_handle(), timeout=30_000)
    assert view.locator(".sbs-deployed").get_attribute("data-level") == "bad"
    assert "session.set_denormal_as_zero=1" in view.locator(".sbs-deployed-cause").text_content()
    bad_colour = view.evaluate("root => getComputedStyle(root.querySelector('.sbs-deployed-verdict')).color")
    assert bad_colour != ok_colour, (ok_colour, bad_colour)
    # the banner sits above the table
    above = view.evaluate("root => root.querySelector('.sbs-deployed').getBoundingClientRect().bottom <= "
                          "root.querySelector('.sbs-main').getBoundingClientRect().top")
    assert above
    view.screenshot(path=str(tmp_path / "deployed.png"))
    print(f"\n[deployed] screenshot {tmp_path / 'deployed.png'}")

    # the offline report keeps the verdict (no kernel, no button)
    assert "SAVED" in run_cell(page, 2)
    page.goto(f"file://{lab.root / 'deployed_report.html'}")
    page.wait_for_selector(".sbs-root .sbs-deployed-verdict", timeout=30_000)
    assert page.locator(".sbs-deployed-verdict").text_content() == "session-option"
    assert page.locator("button.sbs-check-deployed").count() == 0
    errors = [line for line in page.console_lines if line.startswith("pageerror")]
    assert not errors, errors
