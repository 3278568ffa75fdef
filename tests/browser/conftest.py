"""Real JupyterLab + Debian's Chromium for the browser tests (docs: /work/shared/docs/browser-testing.md).

One JupyterLab server per session (isolated config dirs, token, free port); one Chromium; a fresh page
per test whose console is kept and which is screenshotted on failure (tests/browser/failures/).
Run: ``pytest -m browser tests/browser -p no:playwright``.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
NB = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook on screen
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
FAILURES = pathlib.Path(__file__).parent / "failures"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    def __init__(self, root: pathlib.Path, port: int, token: str, proc: subprocess.Popen):
        self.root, self.port, self.token, self.proc = root, port, token, proc
        self.base = f"http://127.0.0.1:{port}"

    def url(self, notebook: str) -> str:
        # a workspace per notebook, reset: an earlier test's tabs must not come back
        stem = pathlib.Path(notebook).stem
        return f"{self.base}/lab/workspaces/ws-{stem}/tree/{notebook}?reset&token={self.token}"

    def notebook7_url(self, notebook: str) -> str:
        return f"{self.base}/notebooks/{notebook}?token={self.token}"

    def write_notebook(self, name: str, cells: list[str]) -> str:
        import nbformat

        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
        nbformat.write(nb, self.root / name)
        return name


@contextlib.contextmanager
def jupyter_server(app: str, base: pathlib.Path, extra_args=(), start_timeout: float = 120):
    """Start ``jupyter APP`` (``notebook``: Notebook 7's own server) in ``base``: notebooks in ``base/root``,
    isolated JUPYTER_* / IPYTHONDIR dirs, a token, a free port, its own process group. Yields a ``Lab``
    once ``/api/status`` answers; shuts it down (``/api/shutdown``, else kills the group) on exit."""
    root = base / "root"
    root.mkdir()
    env = dict(os.environ)
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_SETTINGS_DIR", "JUPYTERLAB_WORKSPACES_DIR",
                "IPYTHONDIR"):
        (base / var.lower()).mkdir()
        env[var] = str(base / var.lower())
    news = base / "jupyterlab_settings_dir" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')  # no news toast
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["PYTHONWARNINGS"] = "ignore"
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyter", app, "--no-browser", f"--IdentityProvider.token={token}",
           f"--port={port}", "--ip=127.0.0.1", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
           *extra_args]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log_path = base / f"{app}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        server = Lab(root, port, token, proc)
        try:
            deadline = time.time() + start_timeout
            while True:
                try:
                    with urllib.request.urlopen(f"{server.base}/api/status?token={token}", timeout=5) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"jupyter {app} did not start; see {log_path}")
                time.sleep(0.3)
            yield server
        finally:
            try:
                if proc.poll() is None:
                    req = urllib.request.Request(f"{server.base}/api/shutdown", method="POST",
                                                 headers={"Authorization": f"token {token}"})
                    urllib.request.urlopen(req, timeout=10)
                proc.wait(20)
            except Exception:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    if shutil.which("jupyter") is None:
        pytest.skip("jupyterlab is not installed")
    pytest.importorskip("jupyterlab")
    args = ("--LabApp.news_url=None", "--LabApp.expose_app_in_browser=True",
            "--JupyterNotebookApp.expose_app_in_browser=True")  # Notebook 7, when installed
    with jupyter_server("lab", tmp_path_factory.mktemp("lab"), args, start_timeout=60) as server:
        yield server


@pytest.fixture(scope="session")
def chromium():
    sync_api = pytest.importorskip("playwright.sync_api")
    exe = shutil.which("chromium")
    if not exe:
        pytest.skip("Debian's chromium is not installed (apt-get install -y chromium)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.stash.setdefault("reports", []).append(report)
    return report


@pytest.fixture
def lab_page(request, chromium):
    context = chromium.new_context(viewport={"width": 1500, "height": 1000})
    page = context.new_page()
    page.console_lines = []
    page.on("console", lambda m: page.console_lines.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: page.console_lines.append(f"pageerror: {e}"))
    yield page
    if any(r.failed for r in request.node.stash.get("reports", [])):
        FAILURES.mkdir(exist_ok=True)
        page.screenshot(path=str(FAILURES / f"{request.node.name}.png"), full_page=True)
        (FAILURES / f"{request.node.name}.console.txt").write_text("\n".join(page.console_lines))
    context.close()


def open_notebook(page, lab: Lab, name: str, notebook7: bool = False) -> None:
    """Open a notebook and wait until its kernel really accepts work (the flaky-start fix)."""
    page.goto(lab.notebook7_url(name) if notebook7 else lab.url(name))
    page.wait_for_selector(".jp-Notebook", timeout=60_000)
    if not notebook7:  # Notebook 7 has no status bar; its debugger button says the same
        page.wait_for_function(
            "() => document.querySelector('.jp-StatusBar-Widget, #jp-main-statusbar')?.textContent.includes('| Idle')",
            timeout=90_000)
    page.wait_for_selector(".jp-DebuggerBugButton[aria-disabled='false']", timeout=90_000)


def command(page, name: str, args: dict | None = None):
    return page.evaluate("([n, a]) => window.jupyterapp.commands.execute(n, a || {})", [name, args])


def run_all(page) -> None:
    command(page, "notebook:run-all-cells")
    # a Run All dropped by a half-connected kernel leaves the first prompt at "[ ]:"
    page.wait_for_function(
        "() => { const p = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell .jp-InputPrompt'); return p && !p.textContent.includes('[ ]'); }",
        timeout=30_000)


def run_cell(page, index: int) -> str:
    """Run cell ``index`` and return its output text once its prompt shows a new execution count."""
    prompt = "(i) => document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell')[i].querySelector('.jp-InputPrompt').textContent"
    before = page.evaluate(prompt, index)
    page.evaluate(
        "(i) => { const nb = window.jupyterapp.shell.currentWidget.content; nb.activeCellIndex = i; nb.deselectAll(); }",
        index)
    command(page, "notebook:run-cell")
    page.wait_for_function(
        f"([i, before]) => {{ const p = ({prompt})(i); return p !== before && /\\[\\d+\\]/.test(p); }}",
        arg=[index, before], timeout=120_000)
    return page.evaluate(
        "(i) => document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell')[i].querySelector('.jp-OutputArea').textContent", index)
