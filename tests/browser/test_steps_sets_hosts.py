"""The decode-step strip and the input-sets view (project issue 50) in the other hosts of the main view:
Jupyter Notebook 7 (its own server) and marimo (``marimo run``, the widgets wrapped in ``mo.ui.anywidget``,
drawn in shadow roots that Playwright's CSS locators pierce), and in JupyterLab's dark theme.

Each host gets one notebook with both widgets (the models of tests/browser/test_steps_browser.py and
test_sets_browser.py: a LLaMA whose ONNX attention mask hides the generated tokens, 3 steps; a small MLP
zeroed past position 8 on 4 input sets). Checked: the strip draws one cell per step, the first diverging
step marked and its lockstep in the table; a click on another step streams that step's records into the
table as a new run, which Python then reads; the sets view shows its spread columns, the input-dependent
rows marked, the worst input; "show worst input" shows that input's own records, read back from Python.
In the dark theme: the strip's and the sets view's text keep a WCAG contrast >= 4.5 on what is under it.
The offline report of input sets (``compare --inputs A --inputs B -o report.html``) opened from disk draws the
sets panel and the spread columns without a kernel, a hostile node name as text.

Run: ``pytest -m browser tests/browser/test_steps_sets_hosts.py -p no:playwright``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import NB, REPO, _free_port, jupyter_server, open_notebook, run_cell
from test_hosts_look import _contrast, _luminance, _over, _rgba
from test_marimo import _stop

pytestmark = pytest.mark.browser

STEPS = 3
# both pairs are exported first: a torch.export in the kernel while a widget decodes in its background thread
# fails (KeyError inside torch.export), so no export runs once a widget has started
PREPARE = '''
import json, torch, sbs_widget
from sbs_widget.samples import faults, zoo
from sbs_widget.samples.decode_faults import mask_beyond
ep, program, args, kwargs = zoo.export("llama", optimize=True, dynamic=True)
bad, _ = mask_beyond(program.model_proto, int(args[0].shape[1]))  # generated tokens hidden in ONNX only
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.norm = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16), torch.nn.LayerNorm(16)
    def forward(self, x):
        return self.norm(self.fc2(torch.relu(self.fc1(x))) + x)
prog = torch.onnx.export(Net().eval(), (torch.randn(2, 12, 16),), dynamo=True, verbose=False,
                         dynamic_shapes={"x": {1: torch.export.Dim("seq", max=256)}})
zeroed = faults.zero_beyond(prog.model_proto, "relu", length=8)
gen = torch.Generator().manual_seed(3)
sets = [(torch.randn(2, s, 16, generator=gen),) for s in (4, 8, 12, 16)]
'''
DECODER = f'steps_w = sbs_widget.SbsWidget(ep, bad, args, kwargs=kwargs, steps={STEPS}, title="steps <b>strip</b>")\n'
SETS = ('sets_w = sbs_widget.SbsWidget.from_input_sets(prog.exported_program, zeroed, sets, max_workers=0, '
        'title="input <b>sets</b>")\n')
STATE = '''"STATE" + json.dumps({
    "step": steps_w.runs[-1].step, "step_runs": len(steps_w.runs), "step_rows": len(steps_w.records),
    "first": steps_w.decoding.get("first_divergence"), "steps": len(steps_w.steps),
    "input": sets_w.runs[-1].input, "set_runs": len(sets_w.runs), "set_rows": len(sets_w.records),
    "own": len(sets_w.input_sets.records[sets_w.runs[-1].input or 0]) if sets_w.input_sets else -1,
    "dependent": len(sets_w.input_sets.input_dependent) if sets_w.input_sets else -1})'''

STRIP_DONE = (f"root => root.querySelectorAll('.sbs-steps .sbs-step').length === {STEPS + 1} && "
              "root.querySelector('.sbs-badge').textContent === 'done' && Number(root.dataset.rows) > 0")
SETS_DONE = ("root => root.querySelector('.sbs-badge').textContent === 'done' && Number(root.dataset.rows) > 0 "
             "&& !root.querySelector('.sbs-sets').hidden && "
             "root.querySelectorAll('.sbs-row[data-input-dependent=true]').length > 0")
TWO_RUNS = ("root => root.querySelector(\"select[aria-label='run']\").options.length === 2 "
            "&& root.querySelector('.sbs-badge').textContent === 'done' && Number(root.dataset.rows) > 0")


def _state(text: str) -> dict:
    return json.loads(text[text.index("STATE") + 5:].strip().splitlines()[0])


def check_strip(page, view) -> int:
    """The strip ended: one cell per step, the first diverging step (1) marked and pressed (its lockstep is the
    table's run); then a click on the last step streams its records as a second run. Returns its row count."""
    handle = view.element_handle()
    page.wait_for_function(STRIP_DONE, arg=handle, timeout=240_000)
    cells = view.locator(".sbs-steps .sbs-step")
    assert [cells.nth(k).get_attribute("data-step") for k in range(STEPS + 1)] == [str(k) for k in range(STEPS + 1)]
    step1 = view.locator('.sbs-step[data-step="1"]')
    assert step1.get_attribute("data-first-open") == "true" and step1.get_attribute("data-first-closed") == "true"
    assert step1.locator("[data-mark=first-open]").text_content() == "▽O"
    page.wait_for_function("root => root.querySelector('.sbs-step[data-step=\"1\"]').getAttribute('aria-pressed') === 'true'",
                           arg=handle, timeout=60_000)
    assert view.locator('.sbs-step[data-first-closed=true]').count() == 1
    assert step1.locator("[data-side=torch]").text_content().replace(" ", "").isdigit()
    assert view.locator(".sbs-title").text_content() == "steps <b>strip</b>"  # the title is text
    last = view.locator(f'.sbs-step[data-step="{STEPS}"]')
    assert last.is_enabled()
    last.click()
    page.wait_for_function(f"root => root.querySelector('.sbs-step[data-step=\"{STEPS}\"]').getAttribute('aria-pressed') === 'true'",
                           arg=handle, timeout=60_000)
    page.wait_for_function(TWO_RUNS, arg=handle, timeout=120_000)
    assert view.locator(".sbs-row").count() > 0
    return int(view.get_attribute("data-rows"))


def check_sets(page, view) -> int:
    """The sets view: the spread columns, input-dependent rows marked with their worst input; "show worst
    input" on the first of them shows that input's own records as a second run. Returns that input."""
    handle = view.element_handle()
    page.wait_for_function(SETS_DONE, arg=handle, timeout=240_000)
    assert "4 input sets" in view.locator(".sbs-sets-summary").text_content()
    heads = [t.strip() for t in view.locator(".sbs-head > div").all_text_contents()]
    for label in ("max err", "median err", "beyond", "worst input", "input-dep."):
        assert label in heads, heads
    first = view.locator(".sbs-row[data-input-dependent=true]").first
    cells = [c.strip() for c in first.locator("div").all_text_contents()]
    worst = next((c for c in cells if c.startswith("#3 ") or c.startswith("#2 ")), None)
    assert "◆ yes" in cells and "2/4" in cells and worst, cells
    first.click()
    button = view.locator(".sbs-sets-worst")
    assert button.is_visible() and button.text_content() == f"show worst input {worst.split()[0]}"
    button.click()
    page.wait_for_function(TWO_RUNS, arg=handle, timeout=60_000)
    return int(worst.split()[0][1:])


def _views(page):
    """The two views of a Jupyter notebook (cells 1 and 2), each scrolled into view once drawn: a notebook
    draws the cells off screen lazily."""
    views = []
    for k in (1, 2):
        page.locator(f"{NB} .jp-Cell").nth(k).scroll_into_view_if_needed()
        root = page.locator(f"{NB} .jp-Cell").nth(k).locator(".jp-OutputArea .sbs-root")
        root.wait_for(timeout=120_000)
        root.scroll_into_view_if_needed()
        views.append(root)
    views[0].scroll_into_view_if_needed()
    return views


def check_state(state: dict, step_rows: int, worst: int) -> None:
    assert state["step"] == STEPS and state["step_runs"] == 2 and state["steps"] == STEPS + 1, state
    assert state["first"] == {"closed_loop": 1, "open_loop": 1} and state["step_rows"] == step_rows, state
    assert state["input"] == worst and state["set_runs"] == 2 and state["set_rows"] == state["own"] > 0, state
    assert state["dependent"] > 0, state


# --- Notebook 7 -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def notebook7(tmp_path_factory):
    pytest.importorskip("notebook", minversion="7")
    pytest.importorskip("jupyterlab")
    with jupyter_server("notebook", tmp_path_factory.mktemp("nb7-steps"),
                        ("--JupyterNotebookApp.expose_app_in_browser=True",)) as server:
        yield server


def test_strip_and_sets_in_notebook7(notebook7, lab_page):
    page = lab_page
    name = notebook7.write_notebook("nb7_steps_sets.ipynb", [PREPARE, DECODER + "steps_w", SETS + "sets_w",
                                                             "steps_w.wait(); sets_w.wait()\nprint(" + STATE + ")"])
    open_notebook(page, notebook7, name, notebook7=True)
    before = len(page.console_lines)  # Notebook 7 logs a startup error of its own ("reading 'schema'")
    for k in range(3):
        run_cell(page, k)
    steps_view, sets_view = _views(page)
    step_rows = check_strip(page, steps_view)
    sets_view.scroll_into_view_if_needed()
    worst = check_sets(page, sets_view)
    check_state(_state(run_cell(page, 3)), step_rows, worst)
    page.wait_for_function(f"root => Number(root.dataset.rows) === {step_rows}", arg=steps_view.element_handle())
    errors = [line for line in page.console_lines[before:] if line.startswith("pageerror")]
    assert not errors, errors


# --- marimo ---------------------------------------------------------------------------------------------------

MARIMO_APP = '''import marimo

app = marimo.App(width="full")


@app.cell
def _():
    import marimo as mo
    return (mo,)


@app.cell
def _():
{prepare}
    return args, bad, ep, json, kwargs, prog, sbs_widget, sets, zeroed


@app.cell
def _(args, bad, ep, kwargs, mo, sbs_widget):
{decoder}
    steps_view = mo.ui.anywidget(steps_w)
    steps_view
    return (steps_w,)


@app.cell
def _(mo, prog, sbs_widget, sets, zeroed):
{sets}
    sets_view = mo.ui.anywidget(sets_w)
    sets_view
    return (sets_w,)


@app.cell
def _(mo):
    read = mo.ui.button(label="read the state", value=0, on_click=lambda n: n + 1)
    read
    return (read,)


@app.cell
def _(json, mo, read, sets_w, steps_w):
    mo.stop(read.value == 0, mo.md("not read yet"))
    mo.plain_text({state})
    return


if __name__ == "__main__":
    app.run()
'''


def _indent(code: str) -> str:
    return "\n".join(("    " + line) if line.strip() else "" for line in code.strip("\n").splitlines())


@pytest.fixture(scope="module")
def marimo_app(tmp_path_factory):
    pytest.importorskip("marimo")
    base = tmp_path_factory.mktemp("marimo-steps")
    app = base / "steps_sets.py"
    app.write_text(MARIMO_APP.format(prepare=_indent(PREPARE), decoder=_indent(DECODER),
                                     sets=_indent(SETS), state=STATE.replace("\n", " ")))
    env = dict(os.environ)
    for var, sub in (("HOME", "home"), ("XDG_CONFIG_HOME", "config"), ("XDG_CACHE_HOME", "cache"),
                     ("XDG_STATE_HOME", "state"), ("XDG_DATA_HOME", "data")):
        (base / sub).mkdir()
        env[var] = str(base / sub)
    env["MARIMO_SKIP_UPDATE_CHECK"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["PYTHONWARNINGS"] = "ignore"
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "marimo", "run", str(app), "--headless", "--host", "127.0.0.1", "--port", str(port),
           "--token-password", token, "--no-sandbox"]
    log_path = base / "marimo.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=base, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            deadline = time.time() + 90
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"marimo did not start:\n{log_path.read_text(errors='replace')[-4000:]}")
                time.sleep(0.3)
            yield f"http://127.0.0.1:{port}/?access_token={token}", proc, log_path
        finally:
            _stop(proc)


def test_strip_and_sets_in_marimo(marimo_app, lab_page):
    from playwright.sync_api import expect

    url, proc, log_path = marimo_app
    page = lab_page
    page.goto(url)
    roots = page.locator(".sbs-root")  # inside <marimo-anywidget>'s shadow roots
    steps_view = roots.filter(has=page.locator(".sbs-title", has_text="steps <b>strip</b>"))
    sets_view = roots.filter(has=page.locator(".sbs-title", has_text="input <b>sets</b>"))
    steps_view.wait_for(timeout=240_000)
    sets_view.wait_for(timeout=240_000)
    step_rows = check_strip(page, steps_view)
    worst = check_sets(page, sets_view)
    # Python reads both widgets: the button re-runs the cell that prints their state
    page.get_by_role("button", name="read the state").click()
    out = page.locator("pre", has_text="STATE")
    expect(out).to_have_count(1, timeout=60_000)
    check_state(_state(out.text_content()), step_rows, worst)
    assert proc.poll() is None, log_path.read_text(errors="replace")[-4000:]
    errors = [line for line in page.console_lines if line.startswith("pageerror")]
    assert not errors, errors


# --- JupyterLab's dark theme --------------------------------------------------------------------------------------

PROBE = """(root) => {
  const cs = (e) => getComputedStyle(e);
  const colorOf = (value) => { const p = document.createElement('div'); p.style.backgroundColor = value;
    root.append(p); const c = cs(p).backgroundColor; p.remove(); return c; };
  const bgOf = (e) => { for (let x = e; x; x = x.parentElement) { const c = cs(x).backgroundColor;
    if (c !== 'rgba(0, 0, 0, 0)' && c !== 'transparent') return c; } return 'rgb(255, 255, 255)'; };
  const strip = root.querySelector('.sbs-steps');
  const sets = root.querySelector('.sbs-sets');
  const texts = (sel) => [...root.querySelectorAll(sel)].filter(e => e.textContent.trim() && e.offsetParent)
    .map(e => ({sel, text: e.textContent.slice(0, 30), fg: cs(e).color, bg: bgOf(e)}));
  return {
    bg: cs(root).backgroundColor, veil: colorOf('var(--sbs-veil)'),
    panel: strip ? cs(strip).backgroundColor : sets ? cs(sets).backgroundColor : null,
    cells: [...root.querySelectorAll('.sbs-step')].map(c => ({step: c.dataset.step, tint: cs(c).backgroundColor,
      parts: [...c.querySelectorAll('.sbs-step-k, .sbs-step-tok, .sbs-step-mark')].filter(e => e.textContent.trim())
        .map(e => [e.className + (e.dataset.side ? ':' + e.dataset.side : ''), cs(e).color, cs(e).backgroundColor])})),
    plain: [...texts('.sbs-steps-head b, .sbs-steps-summary, .sbs-steps-head .sbs-muted, .sbs-sets-title, ' +
                     '.sbs-sets-summary, .sbs-sets label, .sbs-sets-worst, .sbs-sets select')],
    spread: [...root.querySelectorAll('.sbs-row')].filter(r => r.style.display !== 'none' && !r.classList.contains('sbs-selected'))
      .map(r => ({tint: cs(r).backgroundColor, dep: r.dataset.inputDependent === 'true',
                  cells: [...r.querySelectorAll('.sbs-spread-dep')].concat([...r.children].slice(-5))
                    .filter(e => e.textContent.trim()).map(e => cs(e).color)})),
  };
}"""


def _readable(got, where: str) -> int:
    """Assert every text of a probe readable (contrast >= 4.5); returns how many were checked."""
    bg = _rgba(got["bg"])
    assert bg[3] == 1 and _luminance(bg) < 0.1, (where, got["bg"], "a dark background")
    veil = _rgba(got["veil"])
    checked = 0
    for cell in got["cells"]:  # a step: its error tint, veiled in a dark theme, under its text
        under = _over(veil, _over(_rgba(cell["tint"]), _over(_rgba(got["panel"]), bg)))
        for name, colour, own in cell["parts"]:  # a mark on its own background, else on the cell's
            under_it = _over(_rgba(own), under)
            assert _contrast(_over(_rgba(colour), under_it), under_it) >= 4.5, (where, cell["step"], name, colour,
                                                                                 cell["tint"], own)
            checked += 1
    for t in got["plain"]:
        under = _over(_rgba(t["bg"]), bg)
        assert _contrast(_over(_rgba(t["fg"]), under), under) >= 4.5, (where, t)
        checked += 1
    for row in got["spread"]:
        under = _over(veil, _over(_rgba(row["tint"]), bg))
        for colour in row["cells"]:
            assert _contrast(_over(_rgba(colour), under), under) >= 4.5, (where, row, colour)
            checked += 1
    return checked


def test_strip_and_sets_readable_in_jupyterlab_dark(lab, lab_page, tmp_path):
    page = lab_page
    name = lab.write_notebook("dark_steps_sets.ipynb", [PREPARE, DECODER + "steps_w", SETS + "sets_w"])
    open_notebook(page, lab, name)
    page.evaluate("(name) => window.jupyterapp.commands.execute('apputils:change-theme', {theme: name})", "JupyterLab Dark")
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=30_000)
    for k in range(3):
        run_cell(page, k)
    steps_view, sets_view = _views(page)
    page.wait_for_function(STRIP_DONE, arg=steps_view.element_handle(), timeout=240_000)
    page.wait_for_function(SETS_DONE, arg=sets_view.element_handle(), timeout=240_000)
    sets_view.locator(".sbs-row[data-input-dependent=true]").first.click()  # the worst-input button shows
    sets_view.locator(".sbs-sets-worst").wait_for()
    page.wait_for_timeout(300)  # the theme's transition, if any, has ended
    strip = steps_view.evaluate(PROBE)
    spread = sets_view.evaluate(PROBE)
    assert len(strip["cells"]) == STEPS + 1 and strip["plain"], strip
    assert spread["spread"] and any(r["dep"] for r in spread["spread"]) and spread["plain"], spread
    n = _readable(strip, "strip") + _readable(spread, "sets")
    steps_view.screenshot(path=str(tmp_path / "steps-dark.png"))
    sets_view.screenshot(path=str(tmp_path / "sets-dark.png"))
    print(f"\n[dark] {n} texts checked; screenshots in {tmp_path}")
    page.evaluate("(name) => window.jupyterapp.commands.execute('apputils:change-theme', {theme: name})", "JupyterLab Light")
    errors = [line for line in page.console_lines if line.startswith("pageerror")]
    assert not errors, errors


# --- the offline report of input sets ---------------------------------------------------------------------------

HOSTILE = "node_linear_1<img src=x onerror=alert(1)><b>"  # the culprit's ONNX node, renamed


def test_sets_report_offline(chromium, tmp_path):
    """``compare --inputs A --inputs B ... -o report.html`` (``views.report.write_sets_report``) in Chromium, from
    disk: the sets panel and the spread columns drawn without a kernel, the input-dependent rows marked, the
    culprits grouped across the inputs; a hostile node name is text in the view and in the plain spread below."""
    from sets_models import length_fault

    from sbs_widget.steps.input_sets import compare_input_sets
    from sbs_widget.views.report import write_sets_report

    ep, _, bad, sets = length_fault()
    next(n for n in bad.graph.node if n.name == "node_linear_1").name = HOSTILE
    result = compare_input_sets(ep, bad, sets, max_workers=0)
    path = write_sets_report(result, tmp_path / "sets_report.html", title="sets <b>report</b>")
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"file://{path}")
        view = page.locator("#sbs-report .sbs-root")
        page.wait_for_function("() => document.querySelectorAll('.sbs-row[data-input-dependent=true]').length > 0",
                               timeout=30_000)
        assert view.locator(".sbs-title").text_content() == "sets <b>report</b>"
        assert "4 input sets" in view.locator(".sbs-sets-summary").text_content()
        assert view.locator("select[aria-label='input set']").is_disabled()  # no kernel to ask
        heads = [t.strip() for t in view.locator(".sbs-head > div").all_text_contents()]
        for label in ("max err", "median err", "beyond", "worst input", "input-dep."):
            assert label in heads, heads
        cells = [c.strip() for c in view.locator(".sbs-row[data-input-dependent=true]").first.locator("div")
                 .all_text_contents()]
        assert "◆ yes" in cells and "2/4" in cells, cells
        assert view.locator(".sbs-culprits li").first.text_content().count(HOSTILE) >= 1
        # the plain spread below the view: the same name as text, nothing injected
        spread = page.locator("section.sbs-spread-text")
        assert spread.locator("tr[data-input-dependent=true] td").nth(2).text_content() == HOSTILE
        assert page.evaluate("() => document.querySelectorAll('img, script:not([id]):not([type=module])').length") == 0
        assert spread.locator("b").count() == 0 and view.locator("b:empty").count() == 0  # no <b> from a name
        assert not errors, errors
    finally:
        context.close()
