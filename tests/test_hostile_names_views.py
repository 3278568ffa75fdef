"""Issue 31, the views: names with NUL, bidi controls, Graphviz escapes and 100k characters keep the
graph DOT parseable (checked with the bundled Graphviz: js/graphs/render-dot.mjs), show escaped and
shortened labels with the full name on hover, and a 20,000-node chain builds without recursion."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

import onnx
import pytest
import torch
from engine_models import export_module
from onnx import TensorProto, helper

from sbs_widget.graphs.dot import fx_graph, onnx_graph, quote
from sbs_widget.graphs.spec import LABEL_LIMIT, MAX_CLUSTER_DEPTH, label_text, onnx_spec, shorten, visible

ROOT = Path(__file__).resolve().parents[1]
NS = "{http://www.w3.org/2000/svg}"
LONG = "L" * 100_000 + "tail"
HOSTILE = ["nul\x00byte", "rtl\u202eevil", "iso\u2066x\u2069", "esc\\N\\G\\L\\l\\r", 'q"];x[', "new\nline",
           "back\\slash\\", "ctl\x1b[31m\x7f\x85", LONG, LONG + "2", "\u200f\u061c\u200e"]


GRAPHVIZ = ["system", "bundled"]


def render(dot: str, graphviz: str = "") -> ElementTree.Element:
    """SVG of ``dot`` from the real Graphviz: the system ``dot`` (Debian's rejects quoted strings over
    16,384 characters) or the bundled one (the widget's, compiled to WebAssembly); either when not said."""
    bundled = shutil.which("node") and (ROOT / "node_modules" / "@viz-js" / "viz").exists()
    if shutil.which("dot") and graphviz in ("", "system"):
        cmd = [shutil.which("dot"), "-Tsvg"]
    elif bundled and graphviz in ("", "bundled"):
        cmd = [shutil.which("node"), str(ROOT / "js" / "graphs" / "render-dot.mjs")]
    else:
        pytest.skip(f"no {graphviz or 'Graphviz'}: `dot` (apt-get install graphviz) or node_modules/@viz-js/viz "
                    "(npm install)")
    done = subprocess.run(cmd, input=dot.encode(), capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()[:2000]
    assert not [line for line in done.stderr.decode().splitlines() if line.startswith("error")]
    return ElementTree.fromstring(done.stdout.decode())


def chain_model(names: list[str], scopes: list[str] | None = None) -> onnx.ModelProto:
    """A real ONNX chain x -> Relu -> ... whose node and value names are ``names``."""
    nodes, prev = [], "x"
    for i, name in enumerate(names):
        node = helper.make_node("Relu", [prev], [f"{name}#v"], name=name)
        if scopes:
            node.metadata_props.add(key="pkg.torch.onnx.name_scopes", value=scopes[i % len(scopes)])
        nodes.append(node)
        prev = f"{name}#v"
    graph = helper.make_graph(nodes, "hostile", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    return model


def test_visible_and_shorten_match_the_browser():
    assert visible("a\u202eb\x00c") == "a\\u202eb\\x00c"
    assert visible("x\ny") == "x\\x0ay" and visible("x\ny", newlines=True) == "x\ny"
    assert visible("tag\U000e0041") == "tag\\U000e0041"
    assert visible("日本語 😀 a\\N") == "日本語 😀 a\\N"
    assert len(shorten(LONG)) == LABEL_LIMIT and shorten(LONG).endswith("tail")
    if not shutil.which("node"):
        pytest.skip("node missing")
    # The same strings through js/format.js give the same text: one rule on both sides.
    cases = ["a\u202eb\x00c", "x\ny\u2066", "s\u00ad\ufeff\u180e", LONG, "😀" * 100, "\u202e" * 80]
    js = ("const { labelText, visible } = await import('./js/format.js');"
          "const { readFileSync } = await import('node:fs');"
          "const cases = JSON.parse(readFileSync(0, 'utf8'));"
          "process.stdout.write(JSON.stringify(cases.map((c) => [visible(c), labelText(c)])));")
    done = subprocess.run([shutil.which("node"), "--input-type=module", "-e", js], input=json.dumps(cases).encode(),
                          capture_output=True, cwd=ROOT, timeout=60, check=True)
    assert json.loads(done.stdout) == [[visible(c), label_text(c)] for c in cases]


def test_quote_stays_under_what_system_graphviz_reads():
    for text in (LONG, "\x00" * 20_000, "\\" * 20_000, '"' * 20_000 + "end"):
        quoted = quote(text)
        assert len(quoted) <= 16_002 and quoted.endswith(f' … [{len(text)} characters in all]"')
        assert not quoted[:-1].endswith("\\") or quoted[:-1].endswith("\\\\")  # no escape cut in two


def test_quote_keeps_every_name_literal():
    assert quote("a\x00b") == '"a\\\\x00b"'  # a NUL would end Graphviz's input
    assert quote("\\N") == '"\\\\N"'  # Graphviz substitutes \N with the node name unless the backslash is doubled
    assert quote('a"b') == '"a\\"b"'
    assert quote("a\nb") == '"a\\nb"'


@pytest.mark.parametrize("graphviz", GRAPHVIZ)
def test_hostile_onnx_names_parse_and_show_literally(graphviz):
    model = chain_model(HOSTILE, scopes=[repr(["", "mod\x00\u202e" + "m" * 500, "x"]), "[" * 50_000, "42"])
    spec = onnx_spec(model)
    svg = render(onnx_graph(model).source, graphviz)
    groups = [g for g in svg.iter(f"{NS}g") if g.get("class") == "node"]
    assert len(groups) == len(spec.nodes) == len(HOSTILE) + 2  # input, the nodes, output: none merged or split
    texts = [t.text or "" for t in svg.iter(f"{NS}text")]
    for shown in ("nul\\x00byte", "rtl\\u202eevil", "iso\\u2066x\\u2069", "esc\\N\\G\\L\\l\\r", 'q"];x[',
                  "new\\x0aline", "back\\slash\\", "ctl\\x1b[31m\\x7f\\x85", "\\u200f\\u061c\\u200e"):
        assert shown in texts, (shown, texts)
    assert not any(ch in "".join(texts) for ch in "\x00\u202e\u2066\u200f\x1b")
    assert max(len(t) for t in texts) <= LABEL_LIMIT * 10  # the 100k names are shortened
    assert sum(t.startswith("LLLL") and t.endswith("tail") and "…" in t for t in texts) == 1
    # the name is the tooltip (Graphviz writes it as the link title), cut with its length past 16,000
    # characters: Debian's dot rejects longer quoted strings
    titles = [a.get("{http://www.w3.org/1999/xlink}title") for a in svg.iter(f"{NS}a")]
    long_titles = [t for t in titles if t.startswith("LLLL")]
    assert len(long_titles) == 2 and all("[100010 characters in all]" in t or "[100009 characters in all]" in t
                                         for t in long_titles), [t[-60:] for t in long_titles]
    assert all(15_000 < len(t) <= 16_000 for t in long_titles)
    assert "iso\\u2066x\\u2069\nRelu" in titles
    # a module path with NUL and bidi controls is one escaped cluster, not a broken file
    assert any("mod\\x00\\u202emmm" in t for t in texts)


@pytest.mark.parametrize("graphviz", GRAPHVIZ)
def test_hostile_fx_names_parse_and_show_literally(graphviz):
    ep, _ = export_module(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)),
                          (torch.randn(2, 4),))
    calls = [n for n in ep.graph.nodes if n.op == "call_function"]
    for node, name in zip(calls, ["fx\x00\u202e", LONG, "fx\\N"]):
        node.name = name
    svg = render(fx_graph(ep).source, graphviz)
    texts = [t.text or "" for t in svg.iter(f"{NS}text")]
    assert "fx\\x00\\u202e" in texts and "fx\\N" in texts
    assert any(t.startswith("LLLL") and t.endswith("tail") for t in texts)
    assert max(len(t) for t in texts) <= LABEL_LIMIT


def test_module_nesting_is_capped_and_built_without_recursion():
    deep = repr([""] + [f"m{k}" for k in range(5_000)] + ["leaf"])
    model = chain_model(["a", "b"], scopes=[deep])
    spec = onnx_spec(model)
    assert len(spec.clusters) == MAX_CLUSTER_DEPTH
    render(onnx_graph(model).source)


def test_a_20000_node_chain_builds_its_dot_without_recursion():
    model = chain_model([f"relu_{i}" for i in range(20_000)])
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # any recursion along the chain would fail here
    try:
        start = time.perf_counter()
        onnx_dot = onnx_graph(model).source
        spec = onnx_spec(model)
    finally:
        sys.setrecursionlimit(limit)
    assert time.perf_counter() - start < 60
    assert len(spec.nodes) == 20_002
    assert onnx_dot.count(" -> ") == 20_001
    ids = [line.split(" ", 1)[0].strip() for line in onnx_dot.splitlines() if " [label=" in line]
    assert len(ids) == len(set(ids)) == 20_002 and all(i.startswith("n") for i in ids)
