"""The widget's look on the pages that host notebooks, in Debian's Chromium: VS Code's notebook webview
(dark, light), Colab's dark theme and a plain page under the browser's dark scheme.

Each page is a stand-in built here: the host's marks (``body.vscode-dark``, ``html[theme=dark]``) and a
handful of its CSS variables, plus the light ``--jp-*`` defaults that ipywidgets' CSS declares on
``:root`` (widget managers outside JupyterLab load it; Colab's maps a few of them to its own variables).
The bundle is the one the widget ships (``sbs_widget/static/widget.js``), mounted through
``renderStatic`` with the data of a real run (the offline report's). Served from a routed origin: no
server, no network. Asserted with computed styles: the view's background follows the host, its text,
status colours and the graphs' drawing area stay readable (WCAG contrast >= 4.5).

Run: ``pytest tests/browser/test_hosts_look.py -p no:playwright``; ``SBS_WIDGET_SCREENSHOT=1`` also
rewrites docs/widget-vscode-dark.png, docs/widget-vscode-light.png, docs/widget-colab-dark.png and
docs/widget-prefers-dark.png.
"""

from __future__ import annotations

import json
import os
import re
import warnings

import pytest
from conftest import REPO

pytestmark = pytest.mark.browser

SCREENSHOT_TO_DOCS = os.environ.get("SBS_WIDGET_SCREENSHOT") == "1"
ORIGIN = "http://hosts.test"
BUNDLE = REPO / "sbs_widget" / "static" / "widget.js"

# ipywidgets' controls/css/labvariables.css (light JupyterLab defaults on :root), abridged
IPYWIDGETS_JP = """--jp-layout-color0: white; --jp-layout-color1: white; --jp-layout-color2: #eeeeee;
  --jp-ui-font-color1: rgba(0,0,0,0.8); --jp-ui-font-color2: rgba(0,0,0,0.5); --jp-border-color2: #e0e0e0;
  --jp-brand-color1: #2196f3; --jp-ui-font-family: "Helvetica Neue", Helvetica, Arial, sans-serif;
  --jp-code-font-family: monospace;"""

HOSTS = {
    # VS Code's webview: the theme's colours as --vscode-* variables on <html>, its kind as body classes
    "vscode-dark": {
        "html": 'style="--vscode-font-family: system-ui, sans-serif; --vscode-editor-background: #1f1f1f; '
                '--vscode-editor-foreground: #cccccc; --vscode-panel-border: #2b2b2b; '
                '--vscode-descriptionForeground: #9d9d9d; --vscode-textLink-foreground: #4daafc; '
                '--vscode-editorWidget-background: #202020; --vscode-editor-font-family: monospace"',
        "body": 'class="vscode-body vscode-dark" data-vscode-theme-kind="vscode-dark"',
        "css": f":root {{ {IPYWIDGETS_JP} }} body {{ background: var(--vscode-editor-background); }}",
        "scheme": "light", "dark": True, "bg": (31, 31, 31),
    },
    "vscode-light": {
        "html": 'style="--vscode-font-family: system-ui, sans-serif; --vscode-editor-background: #ffffff; '
                '--vscode-editor-foreground: #3b3b3b; --vscode-panel-border: #e5e5e5; '
                '--vscode-descriptionForeground: #3b3b3b; --vscode-textLink-foreground: #005fb8; '
                '--vscode-editorWidget-background: #f8f8f8; --vscode-editor-font-family: monospace"',
        "body": 'class="vscode-body vscode-light" data-vscode-theme-kind="vscode-light"',
        "css": f":root {{ {IPYWIDGETS_JP} }} body {{ background: var(--vscode-editor-background); }}",
        "scheme": "dark", "dark": False, "bg": (255, 255, 255),  # the OS says dark, VS Code says light
    },
    # Colab: html[theme=dark], --colab-* variables; its widget manager maps some --jp-* onto them
    "colab-dark": {
        "html": 'theme="dark"',
        "body": "",
        "css": f""":root {{ {IPYWIDGETS_JP}
  --colab-primary-surface-color: #383838; --colab-secondary-surface-color: #444444;
  --colab-primary-text-color: #d5d5d5; --colab-secondary-text-color: #bdbdbd; --colab-border-color: #5f6368;
  --jp-widgets-color: var(--colab-primary-text-color); --jp-layout-color2: var(--colab-secondary-surface-color);
  --jp-ui-font-color1: var(--colab-primary-text-color); }}
body {{ background: var(--colab-primary-surface-color); }}""",
        "scheme": "light", "dark": True, "bg": (56, 56, 56),
    },
    # no host variables at all: the browser's scheme decides
    "prefers-dark": {"html": "", "body": "", "css": "", "scheme": "dark", "dark": True, "bg": None},
}

PAGE = """<!doctype html>
<html {html}><head><meta charset="utf-8"><style>body {{ margin: 12px; }} {css}</style></head>
<body {body}><div id="out" style="width: 1150px"></div>
<script type="application/json" id="data">{data}</script>
<script type="module">
import {{ renderStatic }} from "/widget.js";
renderStatic(document.getElementById("out"), JSON.parse(document.getElementById("data").textContent));
</script></body></html>"""

ALTERED = "decoder.feed_forward.fc1.bias"  # one bias changed in the ONNX model: mismatches to colour


@pytest.fixture(scope="module")
def report_data(tmp_path_factory):
    """The offline report's data of a real run: dummy_llm with one ONNX bias altered."""
    torch = pytest.importorskip("torch")
    onnx = pytest.importorskip("onnx")
    from onnx import numpy_helper

    import sbs_widget

    model, inputs = sbs_widget.dummy_llm()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, inputs, dynamo=True, verbose=False)
    proto = onnx.ModelProto()
    proto.CopyFrom(program.model_proto)
    for init in proto.graph.initializer:
        if init.name == ALTERED:
            v = numpy_helper.to_array(init).copy()
            v[3] += 0.05
            init.CopyFrom(numpy_helper.from_array(v, init.name))
    w = sbs_widget.SbsWidget(program.exported_program, proto, inputs, title="dummy_llm · fc1.bias altered in ONNX")
    w.wait()
    w.check_deployed(wait=True)  # the as-deployed banner in the report too (verdict export: a warning colour)
    page = w.save_html(tmp_path_factory.mktemp("hosts") / "report.html").read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="sbs-data">(.*?)</script>', page, re.S)
    return m.group(1)  # JSON with <, >, & escaped: safe to put back in a script element


def _rgba(text: str) -> tuple[float, float, float, float]:
    """Chromium's computed colour: rgb(), rgba() or color(srgb r g b / a)."""
    text = text.strip()
    m = re.fullmatch(r"rgba?\(([^)]*)\)", text)
    if m:
        parts = [float(p) for p in re.split(r"[,\s/]+", m.group(1).strip()) if p]
        return (*parts[:3], parts[3] if len(parts) > 3 else 1.0)
    m = re.fullmatch(r"color\(srgb ([^)]*)\)", text)
    if m:
        parts = [float(p) for p in re.split(r"[\s/]+", m.group(1).strip()) if p]
        return (*(255 * p for p in parts[:3]), parts[3] if len(parts) > 3 else 1.0)
    raise ValueError(f"cannot read colour {text!r}")


def _over(top, under):
    """``top`` (rgba) composited over the opaque ``under``."""
    a = top[3]
    return tuple(top[k] * a + under[k] * (1 - a) for k in range(3))


def _luminance(rgb) -> float:
    def lin(c):
        s = c / 255
        return s / 12.92 if s <= 0.03928 else ((s + 0.055) / 1.055) ** 2.4
    return 0.2126 * lin(rgb[0]) + 0.7152 * lin(rgb[1]) + 0.0722 * lin(rgb[2])


def _contrast(a, b) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


PROBE = """(root) => {
  const cs = (e) => getComputedStyle(e);
  const colorOf = (value) => { const p = document.createElement('div'); p.style.backgroundColor = value;
    root.append(p); const c = cs(p).backgroundColor; p.remove(); return c; };
  const rows = [...root.querySelectorAll('.sbs-row')].filter(r => r.style.display !== 'none' && !r.classList.contains('sbs-selected'));
  const badge = root.querySelector('.sbs-badge');
  const head = root.querySelector('.sbs-head');
  const vp = root.querySelector('.sbsg-viewport');
  const texts = [...root.querySelectorAll('.sbsg-viewport svg g.node text')];
  return {
    host: root.dataset.host || '',
    bg: cs(root).backgroundColor, fg: cs(root).color, veil: colorOf('var(--sbs-veil)'),
    badge: [badge.dataset.status, cs(badge).color],
    head: [cs(head).backgroundColor, cs(head.children[2]).color],
    rows: rows.map(r => [r.dataset.k, cs(r).backgroundColor, cs(r.children[2]).color]),
    canvas: cs(vp).backgroundColor,
    nodeText: texts.map(t => [t.closest('g.node').dataset.tone || '', cs(t).fill]),
    clusterText: [...root.querySelectorAll('.sbsg-viewport svg g.cluster > text')].map(t => cs(t).fill),
    edge: [...root.querySelectorAll('.sbsg-viewport svg g.edge > path')].slice(0, 1).map(p => cs(p).stroke),
    deployed: (() => { const d = root.querySelector('.sbs-deployed'); const v = root.querySelector('.sbs-deployed-verdict');
      const hint = root.querySelector('.sbs-deployed-hint');
      return d && v ? { bg: cs(d).backgroundColor, fg: cs(d).color, verdict: [v.dataset.verdict, cs(v).color],
                        hint: hint ? cs(hint).color : null, hidden: d.hidden } : null; })(),
  };
}"""


@pytest.mark.parametrize("host", list(HOSTS))
def test_view_follows_the_host(host, chromium, report_data, tmp_path):
    spec = HOSTS[host]
    context = chromium.new_context(viewport={"width": 1200, "height": 900}, color_scheme=spec["scheme"])
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    html = PAGE.format(html=spec["html"], body=spec["body"], css=spec["css"], data=report_data)
    page.route(f"{ORIGIN}/**", lambda route: route.fulfill(
        status=200, body=html if route.request.url.rstrip("/") == ORIGIN else BUNDLE.read_bytes(),
        content_type="text/html" if route.request.url.rstrip("/") == ORIGIN else "text/javascript"))
    try:
        page.goto(f"{ORIGIN}/")
        page.wait_for_selector(".sbs-root .sbs-row", timeout=30_000)
        root = page.locator(".sbs-root")
        # the worst row selected (detail shown), the graphs open and drawn
        root.locator(".sbs-head > div[data-key='err_abs']").click()
        root.locator(".sbs-row").first.click()
        root.locator(".sbs-graphs-box > summary").click()
        page.wait_for_function("() => document.querySelectorAll('.sbsg-viewport svg g.node text').length > 10", timeout=60_000)
        page.wait_for_function("() => document.querySelectorAll('.sbsg-pane[data-renders]').length === 2", timeout=60_000)
        got = root.evaluate(PROBE)

        bg = _rgba(got["bg"])
        assert bg[3] == 1, got["bg"]
        host_dark = spec["dark"]
        assert (_luminance(bg) < 0.1) if host_dark else (_luminance(bg) > 0.8), (host, got["bg"])
        if spec["bg"]:
            assert tuple(round(c) for c in bg[:3]) == spec["bg"], (host, got["bg"], "the host's own background")
        assert got["host"] == {"vscode-dark": "vscode", "vscode-light": "vscode", "colab-dark": "colab"}.get(host, "")
        fg = _rgba(got["fg"])
        assert _contrast(_over(fg, bg), bg) >= 4.5, (host, got["fg"], got["bg"])
        status, badge = got["badge"]
        assert status == "done" and _contrast(_over(_rgba(badge), bg), bg) >= 4.5, (host, badge)
        head_bg = _over(_rgba(got["head"][0]), bg)
        assert _contrast(_over(_rgba(got["head"][1]), head_bg), head_bg) >= 4.5, (host, got["head"])
        # every painted row: its error tint (veiled in a dark theme) under its text
        veil = _rgba(got["veil"])
        assert got["rows"]
        for k, tint, text in got["rows"]:
            under = _over(veil, _over(_rgba(tint), bg))
            assert _contrast(_over(_rgba(text), under), under) >= 4.5, (host, k, tint, text)
        tints = {tint for _, tint, _ in got["rows"]}
        assert len(tints) > 2, "rows are tinted by their error"

        # the graphs' drawing area: the host's background, readable node and cluster text
        canvas = _rgba(got["canvas"])
        assert canvas[3] == 1 and abs(_luminance(canvas) - _luminance(bg)) < 0.02, (host, got["canvas"], got["bg"])
        plain = [_rgba(fill) for tone, fill in got["nodeText"] if tone != "bright"]
        assert plain, got["nodeText"]
        for fill in plain + [_rgba(f) for f in got["clusterText"]]:
            assert _contrast(fill[:3], canvas) >= 4.5, (host, fill, got["canvas"])
        assert _contrast(_rgba(got["edge"][0])[:3], canvas) >= 2.0, (host, got["edge"])  # lines, not text
        # the as-deployed banner: its text and verdict readable on its own background
        d = got["deployed"]
        assert d is not None and not d["hidden"], got["deployed"]
        banner = _over(_rgba(d["bg"]), bg)
        assert d["verdict"][0] == "export"
        for colour in [d["fg"], d["verdict"][1]] + ([d["hint"]] if d["hint"] else []):
            assert _contrast(_over(_rgba(colour), banner), banner) >= 4.5, (host, colour, d["bg"])
        assert not errors, errors

        shots = REPO / "docs" if SCREENSHOT_TO_DOCS else tmp_path
        # the view, whose graphs area is cut to its top: a small picture
        box = root.bounding_box()
        page.screenshot(path=str(shots / f"widget-{host}.png"),
                        clip={"x": box["x"] - 6, "y": box["y"] - 6, "width": box["width"] + 12, "height": 760})
        print(f"\n[{host}] bg {got['bg']} fg {got['fg']} canvas {got['canvas']}; "
              f"{len(got['rows'])} rows, {len(plain)} node labels checked; screenshot in {shots}")
    finally:
        context.close()


def test_report_data_is_json(report_data):
    """The page data is the report's JSON (escaped for a script element, still JSON)."""
    data = json.loads(report_data)
    assert data["state"]["status"] == "done" and data["runs"]["0"]
