"""DOT builders: ids shared with records, module clusters, colors, escaping; the offline page and CLI."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

import sbs_widget
from sbs_widget.graphs.dot import SPEC_MARKER, dot_sources, error_color, fx_graph, onnx_graph, quote
from sbs_widget.graphs.spec import fx_spec, onnx_spec
from sbs_widget.records import Record

ROOT = Path(__file__).resolve().parents[1]
EVIL = ['"];evil[', "<img src=x onerror=alert(1)>", "back\\slash\\", "a\nb", "&lt;amp&gt;", "\\N\\G"]


@pytest.fixture(scope="module")
def program():
    model, inputs = sbs_widget.dummy_llm()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.onnx.export(model, inputs, dynamo=True, verbose=False)


@pytest.fixture(scope="module")
def ep(program):
    return program.exported_program


@pytest.fixture(scope="module")
def onx(program):
    return program.model_proto


def records_for(ep, onx, bad=("linear",)):
    onnx_nodes = {n.name for n in onx.graph.node}
    out = []
    for node in ep.graph.nodes:
        if node.op == "call_function" and f"node_{node.name}" in onnx_nodes:
            err = 0.5 if node.name in bad else 1e-7
            out.append(Record(ep_name=node.name, onnx_name=node.name, onnx_node_name=f"node_{node.name}",
                              err_abs=err, status="mismatch" if err > 1e-4 else "ok"))
    return out


def node_line(source: str, node_id: str, spec=None) -> str:
    """The DOT line of the node whose spec id is ``node_id``: DOT ids are ``n<index>``, the spec comes from
    the ``dot_sources`` header when not given."""
    nodes = spec.nodes if spec is not None else json.loads(source.split("\n", 1)[0].split(SPEC_MARKER, 1)[1])["nodes"]
    index = [i for i, n in enumerate(nodes) if n["id"] == node_id]
    assert len(index) == 1, (node_id, index)
    lines = [line for line in source.splitlines() if line.strip().startswith(f"n{index[0]} [")]
    assert len(lines) == 1, (node_id, lines)
    return lines[0]


def test_ids_link_fx_and_onnx_by_name(ep, onx):
    fx, on = fx_spec(ep), onnx_spec(onx)
    fx_ids = {n["id"] for n in fx.nodes}
    assert {"fx:input_ids", "fx:linear", "fx:softmax", "fx:output"} <= fx_ids
    assert not any(i.startswith("fx:p_") for i in fx_ids)  # parameters are not drawn
    on_by_name = {n["name"]: n for n in on.nodes}
    assert on_by_name["node_linear"]["links"] == ["linear"]  # pkg.torch.onnx.fx_node
    assert on_by_name["node_linear"]["outputs"] == ["linear"]
    assert "onnx-in:input_ids" in {n["id"] for n in on.nodes}
    # Every ONNX node made from an FX node names one that exists.
    fx_names = {n["name"] for n in fx.nodes}
    assert all(link in fx_names for n in on.nodes if n["kind"] == "node" for link in n["links"])


def test_both_sides_cluster_by_the_same_module_paths(ep, onx):
    fx, on = fx_spec(ep), onnx_spec(onx)
    fx_paths = {c["path"] for c in fx.clusters}
    assert {"decoder", "decoder.attention", "decoder.attention.q_proj", "lm_head"} <= fx_paths
    assert {c["path"] for c in on.clusters if "fx" not in c} <= fx_paths  # (translations: see below)
    attention = next(i for i, c in enumerate(fx.clusters) if c["path"] == "decoder.attention")
    assert fx.clusters[attention]["parent"] == next(i for i, c in enumerate(fx.clusters) if c["path"] == "decoder")
    source = fx_graph(ep).source
    assert re.search(r'subgraph cluster_\d+ \{\n\t\tlabel="decoder"[^\n]*\n\t\tsubgraph cluster_\d+ \{\n'
                     r'\t\t\tlabel="norm1" tooltip="decoder.norm1"', source)
    assert 'label="attention" tooltip="decoder.attention"' in onnx_graph(onx).source


def test_nodes_painted_by_records(ep, onx):
    records = records_for(ep, onx)
    records.append(Record(ep_name="arange", status="one-sided"))  # constant-folded in ONNX
    records.append(Record(ep_name="transpose", onnx_node_name="node_transpose", err_abs=0.0, status="reset"))
    records.append(Record(ep_name="gelu", onnx_node_name="node_gelu", status="error"))
    fx = fx_graph(ep, records).source
    spec = fx_spec(ep)
    assert f'fillcolor="{error_color(0.5)}"' in node_line(fx, "fx:linear", spec)
    assert f'fillcolor="{error_color(1e-7)}"' in node_line(fx, "fx:add", spec)
    assert 'style="filled,dashed"' in node_line(fx, "fx:arange", spec)
    assert 'peripheries="2"' in node_line(fx, "fx:transpose", spec)
    assert 'color="#7b3294"' in node_line(fx, "fx:gelu", spec)
    assert 'fillcolor="#ffffff00"' in node_line(fx, "fx:unsqueeze", spec)  # no record: not compared
    on = onnx_graph(onx, records).source
    assert f'fillcolor="{error_color(0.5)}"' in node_line(on, "onnx:node_linear", onnx_spec(onx))
    # A cluster's frame takes its worst error: linear sits in decoder.attention.q_proj.
    q_proj = re.search(r'subgraph cluster_\d+ \{\n\s*label="q_proj"[^\n]*', fx).group(0)
    assert f'color="{error_color(0.5)}"' in q_proj


def test_onnx_nodes_of_one_fx_node_sit_in_its_translation_cluster(ep, onx):
    """linear_4 became MatMul + Add: a cluster named linear_4 inside fc1's, dashed, painted by its worst
    record (an inner value's record paints its own node); one-node translations get no cluster."""
    on = onnx_spec(onx)
    translations = {c["fx"]: (i, c) for i, c in enumerate(on.clusters) if "fx" in c}
    assert set(translations) == {"linear_4", "linear_5"}
    k, cluster = translations["linear_4"]
    assert on.clusters[cluster["parent"]]["path"] == "decoder.feed_forward.fc1"
    assert cluster["path"] == "decoder.feed_forward.fc1::linear_4"
    members = sorted(n["op"] for n in on.nodes if n["cluster"] == k)
    assert members == ["Add", "MatMul"]
    assert all(n["links"] == ["linear_4"] for n in on.nodes if n["cluster"] == k)
    fc2 = next(i for i, c in enumerate(on.clusters) if c["path"] == "decoder.feed_forward.fc2")
    assert not [n for n in on.nodes if n["cluster"] == fc2 and n["kind"] == "node"], "fc2's nodes are in linear_5's"
    matmul = next(n for n in on.nodes if n["cluster"] == k and n["op"] == "MatMul")
    inner = Record(kind="inner", inner_of="linear_4", inner_op="aten.mm.default", ep_name="linear_4::mm",
                   onnx_name=matmul["outputs"][0], onnx_node_name=matmul["name"], err_abs=0.5, status="mismatch")
    records = records_for(ep, onx, bad=()) + [inner]
    source = onnx_graph(onx, records).source
    assert f'fillcolor="{error_color(0.5)}"' in node_line(source, matmul["id"], on)
    assert f'fillcolor="{error_color(1e-7)}"' in node_line(source, "onnx:node_linear_4", on)
    head = re.search(r'subgraph cluster_\d+ \{\n\s*label="linear_4"[^\n]*', source).group(0)
    assert 'tooltip="the ONNX translation of FX node linear_4"' in head and 'style="rounded,dashed"' in head
    assert f'color="{error_color(0.5)}"' in head
    fc1 = re.search(r'label="fc1"[^\n]*\n(.*?)\n\t\t\t}', source, re.S)
    assert fc1 and 'label="linear_4"' in fc1.group(1), "nested in fc1's cluster"
    fx = fx_graph(ep, records).source  # the inner record paints no FX node
    assert f'fillcolor="{error_color(0.5)}"' not in fx
    svg = render(source)
    assert ">linear_4</text>" in svg


def test_translation_clusters_of_hostile_fx_names_stay_text(onx):
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(onx)
    evil = '"];evil[<img\\N'
    for node in model.graph.node:
        for p in node.metadata_props:
            if p.key == "pkg.torch.onnx.fx_node" and p.value.startswith("%linear_4 :"):
                p.value = p.value.replace("%linear_4 :", f"%{evil} :", 1)
    spec = onnx_spec(model)
    assert evil in {c.get("fx") for c in spec.clusters}
    source = onnx_graph(model).source
    assert f"label={quote(evil)}" in source
    svg = render(source)
    assert "<img" not in svg and "&lt;img" in svg


def test_error_color_is_a_log_scale():
    assert error_color(None) == "#ffffff00"
    assert error_color(float("nan")) == error_color(1.0)  # NaN is the worst error, as in the table's sort
    assert error_color(1e-9) == error_color(0.0) == error_color(1e-7)  # below the scale: green
    assert error_color(float("inf")) == error_color(10.0) == error_color(1.0)
    assert len({error_color(10.0 ** -k) for k in range(8)}) == 8


def test_unnamed_and_duplicated_onnx_nodes_get_stable_ids(onx):
    import onnx

    model = onnx.ModelProto()
    model.CopyFrom(onx)
    model.graph.node[0].name = ""
    model.graph.node[2].name = model.graph.node[1].name
    ids = [n["id"] for n in onnx_spec(model).nodes]
    assert len(ids) == len(set(ids))
    assert "onnx:#0" in ids
    assert f"onnx:{model.graph.node[1].name}#2" in ids
    assert ids == [n["id"] for n in onnx_spec(model).nodes]


@pytest.fixture(scope="module")
def evil_models(ep, onx):
    """The dummy model with hostile node names and module paths on both sides."""
    import copy

    import onnx

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep2 = copy.deepcopy(ep)
    for k, node in enumerate(n for n in ep2.graph.nodes if n.op == "call_function"):
        node.name = EVIL[k % len(EVIL)] + str(k)
        stack = node.meta.get("nn_module_stack")
        if stack:
            node.meta["nn_module_stack"] = {**stack, "evil": (EVIL[k % len(EVIL)], "X")}
    model = onnx.ModelProto()
    model.CopyFrom(onx)
    for k, node in enumerate(model.graph.node):
        node.name = EVIL[k % len(EVIL)] + str(k)
        for p in node.metadata_props:
            if p.key == "pkg.torch.onnx.name_scopes":
                p.value = repr(["", EVIL[k % len(EVIL)], "x"])
    return ep2, model


def render(dot: str) -> str:
    node = shutil.which("node")
    if not node or not (ROOT / "node_modules" / "@viz-js" / "viz").exists():
        pytest.skip("node or node_modules/@viz-js/viz missing (npm install)")
    done = subprocess.run([node, str(ROOT / "js" / "graphs" / "render-dot.mjs")], input=dot.encode(),
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def test_hostile_names_neither_break_dot_nor_inject_svg(evil_models):
    from xml.etree import ElementTree

    ep2, model = evil_models
    for graph, spec in ((fx_graph(ep2), fx_spec(ep2)), (onnx_graph(model), onnx_spec(model))):
        svg = render(graph.source)
        root = ElementTree.fromstring(svg)  # well-formed XML
        ns = "{http://www.w3.org/2000/svg}"
        titles = [t.text for g in root.iter(f"{ns}g") if g.get("class") == "node" for t in g.findall(f"{ns}title")]
        assert len(titles) == len(set(titles)) == len(spec.nodes)  # no node split, merged or invented
        texts = {t.text for t in root.iter(f"{ns}text")}
        assert any(t and t.startswith("<img src=x onerror=alert(1)>") for t in texts)  # drawn as text
        assert not [e for e in root.iter() if e.tag.split("}")[-1] in ("img", "script", "foreignObject")]
        assert not [e for e in root.iter() if any(a.lower().startswith("on") for a in e.attrib)]
        clusters = {c["path"] for c in spec.clusters}
        assert '"];evil[' in clusters and "<img src=x onerror=alert(1)>" in clusters


def test_dot_sources_carry_the_structure_for_the_browser(ep, onx):
    fx_dot, onnx_dot = dot_sources((ep, onx), records_for(ep, onx))
    for dot, side in ((fx_dot, "fx"), (onnx_dot, "onnx")):
        first, rest = dot.split("\n", 1)
        assert first.startswith("// " + SPEC_MARKER)
        spec = json.loads(first[len("// " + SPEC_MARKER):])
        assert spec["side"] == side and spec["nodes"] and spec["edges"]
        assert rest.startswith(f"digraph {side} {{")
    render(fx_dot)  # the header is a comment: any Graphviz still reads the file


def test_dot_sources_accepts_prepared(ep, onx):
    class Prepared:
        decomposed_ep, onnx_model = ep, onx

    assert dot_sources(Prepared()) == dot_sources((ep, onx))


def test_broadcast_values_become_stubs(ep):
    spec = fx_spec(ep)
    readers = {}
    for a, b in spec.edges:
        readers.setdefault(a, set()).add(b)
    # The dummy model has no value read 6 times; a synthetic one shows the rule.
    spec.nodes.append({"id": "fx:mask", "name": "mask", "label": "mask", "op": "x", "kind": "node", "cluster": -1})
    m = len(spec.nodes) - 1
    spec.edges.extend((m, b) for b in range(1, 8))
    from sbs_widget.graphs.dot import _digraph

    source = _digraph(spec, {}).source
    assert source.count('shape=cds') == 7
    assert f"s{m}_0 -> n1" in source and f"n{m} -> " not in source


def test_html_page_is_self_contained_and_escaped(tmp_path, evil_models):
    from sbs_widget.graphs.page import write_graphs_html

    if not (ROOT / "sbs_widget" / "static" / "graphs_page.js").exists():
        pytest.skip("front end not built (npm run build)")
    ep2, model = evil_models
    rows = [Record(ep_name=n.name, onnx_name="</script><script>alert(1)</script>", err_abs=float("inf"))
            for n in list(ep2.graph.nodes)[20:23]]
    out = write_graphs_html(tmp_path / "g.html", (ep2, model), rows, title="<b>t</b>")
    text = out.read_text()
    assert text.count("</script>") == 2  # the data block and the module, nothing from the model
    assert "<title>&lt;b&gt;t&lt;/b&gt;</title>" in text
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text
    data = json.loads(re.search(r'id="sbs-graphs-data">(.*?)</script>', text, re.S).group(1))
    assert data["rows"][0]["onnx_name"].startswith("</script>")
    assert data["rows"][0]["err_abs"] == "Infinity"  # JSON has no Infinity: the page reads it back with Number()


def test_cli_registers_graph_command():
    from sbs_widget.cli.main import build_parser

    args = build_parser().parse_args(["graph", "--ep", "a.pt2", "--onnx", "b.onnx", "-o", "x.html"])
    assert args.command == "graph" and args.output == "x.html" and callable(args.func)


def test_cli_writes_a_painted_page(tmp_path, program, capsys):
    pytest.importorskip("sbs_widget.engine.entry")
    if not (ROOT / "sbs_widget" / "static" / "graphs_page.js").exists():
        pytest.skip("front end not built (npm run build)")
    import onnx
    from onnx import numpy_helper

    from sbs_widget.cli.main import main

    proto = onnx.ModelProto()
    proto.CopyFrom(program.model_proto)
    for init in proto.graph.initializer:  # fc1's bias altered: linear_4 and everything after diverge
        if init.name == "decoder.feed_forward.fc1.bias":
            v = numpy_helper.to_array(init).copy()
            v[3] += 0.05
            init.CopyFrom(numpy_helper.from_array(v, init.name))
    onnx.save(proto, tmp_path / "m.onnx")
    torch.export.save(program.exported_program, tmp_path / "m.pt2")
    _, inputs = sbs_widget.dummy_llm()
    torch.save(inputs, tmp_path / "inputs.pt")
    out = tmp_path / "graphs.html"
    assert main(["graph", "--ep", str(tmp_path / "m.pt2"), "--onnx", str(tmp_path / "m.onnx"),
                 "--inputs", str(tmp_path / "inputs.pt"), "-o", str(out)]) == 0
    assert "not ok" in capsys.readouterr().out
    data = json.loads(re.search(r'id="sbs-graphs-data">(.*?)</script>', out.read_text(), re.S).group(1))
    status = {r["ep_name"]: r["status"] for r in data["rows"] if r["ep_name"]}
    assert status["linear_4"] == "mismatch" and status["linear_3"] == "ok"
    assert f'fillcolor="{error_color(max(r["err_abs"] for r in data["rows"] if r["ep_name"] == "linear_4"))}"' \
        in node_line(data["fx_dot"], "fx:linear_4")


def test_a_wrong_weight_gets_a_box_on_both_sides(ep, onx):
    """A corrupted initializer: the real engine flags its weight record, and both graphs draw that
    weight (only that one) next to the node reading it, painted by its error."""
    from sbs_widget.engine.entry import prepare
    from sbs_widget.samples import faults

    inits = [i for i in onx.graph.initializer if i.name.endswith("fc1.bias")]
    assert inits, [i.name for i in onx.graph.initializer]
    bad = faults.perturb_initializer(onx, inits[0].name, scale=0.5)
    model, inputs = sbs_widget.dummy_llm()
    records = list(prepare(ep, bad).run(inputs))
    weight = next(r for r in records if r.kind == "weight" and r.onnx_name == inits[0].name)
    assert weight.status == "mismatch"
    fx_dot, onnx_dot = dot_sources((ep, bad), records)
    fx_line = node_line(fx_dot, f"fx:{weight.ep_name}")
    onnx_line = node_line(onnx_dot, f"onnx-init:{weight.onnx_name}")
    for line in (fx_line, onnx_line):
        assert "shape=cylinder" in line.replace("\"", "") and f'fillcolor="{error_color(weight.err_abs)}"' in line
    assert sum("shape=\"cylinder\"" in line for line in fx_dot.splitlines()) == 1
    assert sum("shape=\"cylinder\"" in line for line in onnx_dot.splitlines()) == 1
    # drawn inside the module that reads it, with an edge to its reader
    spec = json.loads(onnx_dot.splitlines()[0].split(SPEC_MARKER, 1)[1])
    box = next(i for i, n in enumerate(spec["nodes"]) if n["id"] == f"onnx-init:{weight.onnx_name}")
    assert spec["clusters"][spec["nodes"][box]["cluster"]]["path"].endswith("feed_forward.fc1")
    assert any(a == box for a, _ in spec["edges"])
