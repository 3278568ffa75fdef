"""SbsWidget in marimo: marimo's own server runs ``notebooks/marimo_demo.py`` (app mode), Chromium opens it.

The widget is wrapped in ``mo.ui.anywidget``; marimo renders it inside a shadow root (Playwright's CSS
locators pierce it; ``document.querySelector`` does not). Checked: the run streams into the table, the
culprits and summary areas, the graphs' SVG, and both directions of the round trip: Python's state on the
page, and the view's edits (tolerance, a ticked reset row, a selected row, Rerun) reaching Python, shown by
the notebook's last cell, which marimo re-runs when the view changes a trait.

Run: ``pytest -m browser tests/browser/test_marimo.py -p no:playwright``;
``SBS_WIDGET_SCREENSHOT=1`` also rewrites docs/widget-marimo.png.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import REPO, _free_port

pytestmark = pytest.mark.browser

NOTEBOOK = REPO / "notebooks" / "marimo_demo.py"
SCREENSHOT_TO_DOCS = os.environ.get("SBS_WIDGET_SCREENSHOT") == "1"  # a plain run leaves the tree clean
ROOT = ".sbs-root"  # inside <marimo-anywidget>'s shadow root


class Marimo:
    def __init__(self, port: int, token: str, proc: subprocess.Popen, log_path):
        self.port, self.token, self.proc, self.log_path = port, token, proc, log_path
        self.base = f"http://127.0.0.1:{port}"

    @property
    def url(self) -> str:
        return f"{self.base}/?access_token={self.token}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (marimo says goodbye and ends its kernels), then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def marimo_server(tmp_path_factory):
    pytest.importorskip("marimo")
    base = tmp_path_factory.mktemp("marimo")
    env = dict(os.environ)
    # marimo's config, cache, state (recent files, server registry) and anything else under ~ go here
    for var, sub in (("HOME", "home"), ("XDG_CONFIG_HOME", "config"), ("XDG_CACHE_HOME", "cache"),
                     ("XDG_STATE_HOME", "state"), ("XDG_DATA_HOME", "data")):
        (base / sub).mkdir()
        env[var] = str(base / sub)
    env["MARIMO_SKIP_UPDATE_CHECK"] = "1"  # no PyPI query at start
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["PYTHONWARNINGS"] = "ignore"
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "marimo", "run", str(NOTEBOOK), "--headless", "--host", "127.0.0.1",
           "--port", str(port), "--token-password", token, "--no-sandbox"]
    log_path = base / "marimo.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(cmd, env=env, cwd=base, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    server = Marimo(port, token, proc, log_path)
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{server.base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"marimo did not start:\n{server.log()}")
            time.sleep(0.3)
        yield server
    finally:
        _stop(proc)
        log.close()


def _python_says(page):
    """The notebook's last cell: the widget's state as Python reads it."""
    return page.locator("marimo-callout-output", has_text="From Python")


def test_marimo_app(marimo_server, lab_page, tmp_path):
    from playwright.sync_api import expect

    page = lab_page
    shots = REPO / "docs" if SCREENSHOT_TO_DOCS else tmp_path
    t0 = time.perf_counter()
    # what the page tells the kernel (UI values, widget messages) and what it hears back: in the failure log
    page.on("request", lambda r: page.console_lines.append(f"> {r.method} {r.url} {(r.post_data or '')[:300]}")
            if "/api/kernel/" in r.url else None)
    page.on("websocket", lambda ws: ws.on("framereceived", lambda f: page.console_lines.append(f"< {f[:300]}")
                                          if isinstance(f, str) and '"op": "variable-values"' in f[:40] else None))
    page.goto(marimo_server.url)

    # the view appears while the export and the run go on in the kernel; the run streams into it
    root = page.locator(ROOT)
    root.wait_for(timeout=180_000)
    t_view = time.perf_counter()
    expect(root.locator(".sbs-badge")).to_have_text("done", timeout=180_000)
    page.wait_for_function("root => Number(root.dataset.rows) > 0", arg=root.element_handle(), timeout=60_000)
    t_done = time.perf_counter()
    n_rows = int(root.get_attribute("data-rows"))
    assert n_rows > 20 and root.locator(".sbs-row").count() > 0
    progress_text = root.locator(".sbs-bar").first.text_content()
    assert "FX " in progress_text and f"{n_rows} records" in progress_text, progress_text
    print(f"\n[marimo] view {t_view - t0:.1f} s after page load (export included), run done "
          f"{t_done - t_view:.1f} s later; {n_rows} rows")

    # summary chips and the culprits panel (mounted; shown when Python found culprits)
    chips = root.locator(".sbs-chip").all_text_contents()
    assert any(c.startswith("ok ") for c in chips), chips
    culprits = root.locator(".sbs-culprits")
    expect(culprits).to_have_count(1)

    # view -> Python: a tolerance typed in the view re-runs the cell that reads it from Python
    atol = root.locator("input[aria-label='atol']")
    atol.fill("0.003")
    atol.press("Enter")
    says = _python_says(page)
    expect(says).to_contain_text("atol 0.003", timeout=60_000)
    expect(says).to_contain_text("status done")
    expect(says).to_contain_text(f"records {n_rows}")  # the rows on the page are Python's records
    text = says.evaluate("el => (el.shadowRoot || el).textContent")  # the markdown is in a shadow root too
    n_culprits = int(text.split("culprits")[1].split()[0])
    if n_culprits:
        expect(culprits).to_be_visible()
        expect(culprits.locator("li")).to_have_count(n_culprits)
    else:
        expect(culprits).to_be_hidden()

    # Python -> view: the tolerance Python validated is what the view shows
    expect(atol).to_have_value("0.003")

    # tick a node row for reset (one an ONNX node computes: a folded constant cannot be reset): the reset set
    # reaches Python
    target = root.evaluate("""root => {
        const keys = [...root.querySelectorAll('.sbs-head > div')].map(c => c.dataset.key);
        const row = [...root.querySelectorAll('.sbs-row')].map(r => [r, [...r.children].map(c => c.textContent)])
            .find(([r, cells]) => cells[keys.indexOf('kind')] === 'node' && cells[keys.indexOf('status')] === 'ok' &&
                  !['', 'initializer'].includes(cells[keys.indexOf('onnx_op_type')]));  // computed by an ONNX node
        return row && {k: row[0].dataset.k, name: row[1][keys.indexOf('ep_name')]};
    }""")
    assert target, root.locator(".sbs-body").text_content()
    # filter first: the table is virtualized, a row scrolled into view for a click may be repainted under it
    root.locator("input[aria-label='filter']").fill(target["name"])
    root.locator(f".sbs-row[data-k='{target['k']}'] input[type=checkbox]").click()
    root.locator("input[aria-label='filter']").fill("")
    expect(root.locator(".sbs-reset")).to_contain_text(target["name"])
    expect(says).to_contain_text(f"reset set ['{target['name']}'] (1)", timeout=60_000)

    # Rerun (a custom message to Python): a second run streams back, compared with the first
    root.locator(".sbs-rerun").click()
    expect(root.locator("select[aria-label='run'] option")).to_have_count(2, timeout=120_000)
    expect(root.locator(".sbs-badge")).to_have_text("done", timeout=120_000)
    expect(root.locator(".sbs-compare")).to_contain_text("Run #1 vs #0", timeout=60_000)
    page.wait_for_function(f"root => root.dataset.rows === '{n_rows}'", arg=root.element_handle(), timeout=60_000)

    # select a row: the selection reaches Python, which now holds both runs
    root.locator(".sbs-row").nth(1).click()
    expect(root.locator(".sbs-detail")).to_contain_text("err_abs")
    expect(says).to_contain_text("selected rows 1", timeout=60_000)
    expect(says).to_contain_text("runs 2")
    assert marimo_server.proc.poll() is None, marimo_server.log()

    # the graphs' area renders the model's DOT to SVG on first open
    root.locator(".sbs-graphs-box > summary").click()
    root.locator(".sbs-graphs-host svg").first.wait_for(timeout=120_000)

    # marimo scrolls inside its own container (full_page does not reach past the viewport): a taller one
    page.set_viewport_size({"width": 1500, "height": 1420})
    says.scroll_into_view_if_needed()
    page.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
    page.screenshot(path=str(shots / "widget-marimo.png"))
    print(f"[marimo] screenshot in {shots}")
    errors = [line for line in page.console_lines if line.startswith("pageerror")]
    assert not errors, errors
