"""Graphviz views of both sides of a comparison: the FX program and the ONNX model, nodes painted by error.

>>> import torch, sbs_widget
>>> model, inputs = sbs_widget.dummy_llm()
>>> onnx_program = torch.onnx.export(model, inputs, dynamo=True)          # doctest: +SKIP
>>> sbs_widget.fx_graph(onnx_program.exported_program).render("fx", format="svg")  # doctest: +SKIP

Spec ids are ``fx:<fx node name>`` and ``onnx:<onnx node name>`` (see ``graphs_spec``); in the DOT a node
is ``n<index into spec.nodes>`` and a module cluster ``cluster_<index into spec.clusters>``: names from a
model may be 100k characters long or hold NULs, and never become DOT ids. Labels are shortened with
hidden characters escaped (``graphs_spec.label_text``); the tooltip holds the full name. The widget lays
these graphs out in the browser (``js/graphs/``); ``dot_sources`` gives it the DOT plus the structure it
needs to collapse clusters.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Iterable

import graphviz

from sbs_widget.graphs.spec import GraphSpec, fx_spec, label_text, onnx_spec, visible
from sbs_widget.records import ERROR, KIND_INNER, KIND_WEIGHT, MISMATCH, OK, ONE_SIDED, RESET, Record
from sbs_widget.shared_rules import B_PAINT, BROADCAST, COLOR_SCALE, GRAPH_SPEC_MARKER, color_for, error_color, worse

if TYPE_CHECKING:
    from sbs_widget.engine.entry import Prepared

__all__ = ["dot_source_b", "dot_sources", "error_color", "fx_graph", "onnx_graph"]
# Colours, severities and the broadcast rule are shared with the browser's graphs (js/rules.js).

SPEC_MARKER = GRAPH_SPEC_MARKER


def fx_graph(ep, records: Iterable[Record] | None = None) -> graphviz.Digraph:
    """The FX graph of ``ep`` (ExportedProgram, ONNXProgram or .pt2 path) as a ``graphviz.Digraph``.

    Give the *decomposed* program (``onnx_program.exported_program``): records name its nodes.
    """
    records = list(records or ())
    spec = fx_spec(ep, failed_weights(records)[0])
    return _digraph(spec, _paint(spec, records))


def onnx_graph(onx, records: Iterable[Record] | None = None) -> graphviz.Digraph:
    """The ONNX graph of ``onx`` (ModelProto, ONNXProgram or .onnx path) as a ``graphviz.Digraph``."""
    records = list(records or ())
    spec = onnx_spec(onx, failed_weights(records)[1])
    return _digraph(spec, _paint(spec, records))


def dot_sources(prepared: Prepared | tuple, records: Iterable[Record] | None = None) -> tuple[str, str]:
    """``(fx_dot, onnx_dot)`` for the widget: ``prepared`` is ``engine.prepare(...)``'s result or ``(ep, onx)``.

    Each DOT starts with a ``// sbs-graph-spec {json}`` comment holding the graph structure, so the
    browser can collapse and expand clusters without parsing DOT; any Graphviz still renders the file.
    """
    yours: dict[str, list[str]] = {}
    if isinstance(prepared, tuple):
        ep, onx = prepared
    else:
        from sbs_widget.align.user_program import user_names_held

        ep, onx = prepared.decomposed_ep, prepared.onnx_model
        yours = user_names_held(prepared)
    records = list(records or ())
    fx_weights, onnx_weights = failed_weights(records)
    out = []
    for spec in (fx_spec(ep, fx_weights, yours), onnx_spec(onx, onnx_weights)):
        header = SPEC_MARKER + json.dumps(spec.to_json(), separators=(",", ":"))  # ASCII: no newline inside
        out.append(_digraph(spec, _paint(spec, records), comment=header).source)
    return out[0], out[1]


def dot_source_b(onx, records: Iterable[Record] | None = None) -> str:
    """The DOT of ``b``, the transformed copy of a comparison of two ONNX models (``compare_models``): as
    ``dot_sources``' ONNX graph, with the spec's side ``"b"`` and ids ``b:<node name>`` (``b-in:``, ``b-out:``),
    its nodes painted by ``Record.b_err_abs`` and ``b_status`` (``shared_rules.B_PAINT``)."""
    spec = onnx_spec(onx)
    spec.side = "b"
    for node in spec.nodes:
        node["id"] = "b" + node["id"].removeprefix("onnx")
    header = SPEC_MARKER + json.dumps(spec.to_json(), separators=(",", ":"))
    return _digraph(spec, _paint(spec, list(records or ())), comment=header).source


def failed_weights(records: list[Record]) -> tuple[set[str], set[str]]:
    """FX placeholders and ONNX initializers whose comparison failed: the weights worth a box."""
    bad = [r for r in records if r.kind == KIND_WEIGHT and r.status in (MISMATCH, ERROR)]
    return {r.ep_name for r in bad if r.ep_name}, {r.onnx_name for r in bad if r.onnx_name}


def _paint(spec: GraphSpec, records) -> dict[str, tuple[float | None, str]]:
    if not records:
        return {}
    by_name = {n["name"]: n["id"] for n in spec.nodes}
    by_value = {v: n["id"] for n in spec.nodes for v in n.get("outputs", ())}
    paint: dict[str, tuple[float | None, str]] = {}
    for r in records:
        if spec.side == "fx":  # an inner value ("<fx node>::<finer node>") paints only its ONNX node
            node_id = by_name.get(r.ep_name) if r.ep_name and r.kind != KIND_INNER else None
        elif spec.side == "b":  # the second model: its value paired with the record's (twomodels/)
            node_id = by_name.get(r.b_node_name) or by_value.get(r.b_name)
            if node_id is not None and r.b_status is not None:
                paint[node_id] = worse(paint.get(node_id), r.b_err_abs, B_PAINT.get(r.b_status, OK))
            continue
        else:
            node_id = by_name.get(r.onnx_node_name) or by_value.get(r.onnx_name)
        if node_id is None:
            continue
        paint[node_id] = worse(paint.get(node_id), r.err_abs, r.status or OK)
    return paint


def _node_style(err: float | None, status: str | None) -> dict[str, str]:
    if status is None:
        return {"fillcolor": COLOR_SCALE["not_compared"]}
    style = {"fillcolor": color_for(err, status)}
    if status == ERROR:
        style.update(color=COLOR_SCALE["error_line"], penwidth="3")
    elif status == ONE_SIDED and err is None:
        style["style"] = "filled,dashed"
    elif status == RESET:
        style.update(color=COLOR_SCALE["reset_line"], penwidth="3", peripheries="2")
    return style


def _digraph(spec: GraphSpec, paint: dict, comment: str | None = None) -> graphviz.Digraph:
    g = graphviz.Digraph(name=spec.side, comment=comment)
    # newrank: rank across clusters; without it dot ranks each module on its own and a model-level
    # mask feeding every layer puts all decoder layers side by side.
    g.attr(newrank="true", rankdir="TB", fontname="Helvetica", fontsize="10", nodesep="0.15", ranksep="0.3")
    g.attr("node", shape="box", style="filled,rounded", fontname="Helvetica", fontsize="9", height="0.3",
           fillcolor=COLOR_SCALE["not_compared"])
    g.attr("edge", arrowsize="0.5", color="#777777")
    children: dict[int, list[int]] = {}
    for i, c in enumerate(spec.clusters):
        children.setdefault(c["parent"], []).append(i)
    members: dict[int, list[int]] = {}
    for i, n in enumerate(spec.nodes):
        members.setdefault(n["cluster"], []).append(i)
    worst = _cluster_worst(spec, paint, children, members)
    lines: list[str] = []
    # Depth first with an explicit stack (no recursion on a hostile module depth): "open" writes a
    # cluster's head and queues its sub-clusters, then its members and closing brace.
    todo: list[tuple[str, int, int]] = [("members", -1, 1), ("children", -1, 1)]
    while todo:
        what, c, depth = todo.pop()
        indent = "\t" * depth
        if what == "close":
            lines.append(f"{indent}}}")
        elif what == "children":
            todo.extend(("open", k, depth) for k in reversed(children.get(c, ())))
        elif what == "members":
            for i in members.get(c, ()):
                n = spec.nodes[i]
                attrs = {"label": n["label"], "tooltip": tooltip(n), **_node_style(*paint.get(n["id"], (None, None)))}
                if n["kind"] != "node":
                    attrs["shape"] = "cylinder" if n["kind"] == "weight" else "ellipse"
                lines.append(f"{indent}n{i} [{_attrs(attrs)}]")
        else:
            path = spec.clusters[c]["path"]
            color = color_for(*worst[c]) if worst.get(c) is not None else "#999999"
            parent = spec.clusters[c]["parent"]
            label = path.removeprefix(spec.clusters[parent]["path"] + ".") if parent >= 0 else path
            tip, style = path, "rounded"
            fx = spec.clusters[c].get("fx")
            if fx is not None:  # the ONNX nodes translating one FX node: named after it, dashed
                label, tip, style = fx, f"the ONNX translation of FX node {fx}", "rounded,dashed"
            lines.append(f"{indent}subgraph cluster_{c} {{")
            lines.append(f"{indent}\tlabel={quote(label_text(label))} tooltip={quote(visible(tip))} "
                         f"style={quote(style)} color={quote(color)} penwidth=2")
            todo += [("close", c, depth), ("members", c, depth + 1), ("children", c, depth + 1)]
    readers: dict[int, list[int]] = {}
    for a, b in dict.fromkeys(spec.edges):
        readers.setdefault(a, []).append(b)
    for a, targets in readers.items():
        if len(targets) < BROADCAST:
            lines.extend(f"\tn{a} -> n{b}" for b in targets)
            continue
        # A value read everywhere (attention mask, rotary tables) gets a stub next to each reader:
        # long edges into every layer make dot's crossing minimisation several times slower.
        for k, b in enumerate(targets):
            stub = f"s{a}_{k}"
            lines.append(f"\t{stub} [label={quote(label_text(spec.nodes[a]['name']))} "
                         f"tooltip={quote(tooltip(spec.nodes[a]))} shape=cds fillcolor={quote(COLOR_SCALE['stub'])} "
                         "fontsize=7 height=0.2]")
            lines.append(f"\t{stub} -> n{b}")
    g.body.extend(line + "\n" for line in lines)
    return g


def _cluster_worst(spec: GraphSpec, paint: dict, children: dict, members: dict) -> dict[int, tuple | None]:
    """Worst paint of each cluster over everything below it (as js/graphs/model.js paintClusters)."""
    worst: dict[int, tuple | None] = {}
    # Parents precede children in spec.clusters, so walking backwards sees every child first.
    for c in range(len(spec.clusters) - 1, -1, -1):
        p = None
        for i in members.get(c, ()):
            if spec.nodes[i]["id"] in paint:
                p = worse(p, *paint[spec.nodes[i]["id"]])
        for k in children.get(c, ()):
            if worst[k] is not None:
                p = worse(p, *worst[k])
        worst[c] = p
    return worst


def quote(text: str) -> str:
    r"""A DOT double-quoted string showing ``text`` literally.

    Backslashes are doubled so that Graphviz escapes (``\N``, ``\l``) in model names stay text; quotes
    are escaped; a newline becomes a centered line break; NULs, other control characters and bidi controls
    become visible escapes (``\x00``, ``\u202e``): Graphviz reads a NUL as the end of its input. Graphviz
    XML-escapes ``<`` and ``&`` in SVG, so ``<img onerror=...>`` is drawn as text. Never returns an
    HTML-like ``<...>`` label.

    A string longer than ``MAX_QUOTED`` once escaped is cut (Debian's ``dot`` 2.42/2.43 rejects a quoted
    string over 16,384 characters), saying how long the whole was.

    >>> print(quote('a"b\\N\x00'))
    "a\"b\\N\\x00"
    """
    text = str(text)
    body = _escaped(text)
    if len(body) > MAX_QUOTED:
        note = f" … [{len(text)} characters in all]"
        keep, step = 0, len(text)  # the longest head whose escaped text fits: escapes widen characters
        while step:
            if len(_escaped(text[:keep + step])) + len(note) <= MAX_QUOTED:
                keep += step
            step //= 2
        body = _escaped(text[:keep] + note)
    return '"' + body + '"'


MAX_QUOTED = 16_000  # characters inside a DOT quoted string


def _escaped(text: str) -> str:
    lines = (visible(part).replace("\\", "\\\\").replace('"', '\\"') for part in text.split("\n"))
    return "\\n".join(lines)


def tooltip(node: dict) -> str:
    """Hover text of a node: its full name (never shortened) and op, hidden characters escaped."""
    name = visible(node["name"])
    text = f"{name}\n{visible(node['op'])}" if node.get("kind") in ("node", "weight") and node.get("op") else name
    if node.get("yours"):  # the user's nodes whose value this one holds (rewritten or dropped by decomposition)
        text += "\nyour program: " + ", ".join(visible(n) for n in node["yours"])
    return text


def _attrs(attrs: dict[str, str]) -> str:
    return " ".join(f"{k}={quote(v)}" for k, v in attrs.items())
