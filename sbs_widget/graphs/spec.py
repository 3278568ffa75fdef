"""The structure both graph views draw: nodes, edges and module clusters of the FX program and of the
ONNX model, as plain JSON-able data.

A node id is ``fx:<fx node name>`` or ``onnx:<onnx node name>``: the engine's records carry those names
(``Record.ep_name``, ``Record.onnx_node_name``), so a view links a record to its nodes by name alone.
Clusters are module paths (``decoder.attention``): FX ``nn_module_stack`` and the exporter's
``pkg.torch.onnx.name_scopes`` give the same paths, so a cluster means the same module on both sides.
On the ONNX side, the nodes translating one FX node (the exporter's ``pkg.torch.onnx.fx_node``, the
grouping the engine's inner records come from) sit in a cluster of their own inside their module's when
there are two or more of them: linear's Transpose, MatMul and Add, attention's ten nodes.
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable

from sbs_widget.errors import InputError
from sbs_widget.safe_text import visible  # noqa: F401 - graph labels use the one rule of every view

# The exporter writes "%add_3 : [num_users=2] = call_function[...]" on every ONNX node.
_FX_NODE_RE = re.compile(r"^%(\S+) :")
LABEL_LIMIT = 64  # code points of a name in a graph box; the full name is on hover
MAX_CLUSTER_DEPTH = 64  # deeper module chains are cut: Graphviz recurses into nested subgraphs


def shorten(text, limit: int = LABEL_LIMIT) -> str:
    """``text`` cut to ``limit`` code points as head…tail (as js/format.js ``shorten``)."""
    s = str(text)
    if len(s) <= limit:
        return s
    head = math.ceil((limit - 1) * 0.65)
    return f"{s[:head]}…{s[len(s) - (limit - 1 - head):]}"


def label_text(text, limit: int = LABEL_LIMIT) -> str:
    """One line of a graph label: shortened, then made visible."""
    return visible(shorten(text, limit))


@dataclass
class GraphSpec:
    """One side of the comparison, ready to lay out.

    ``nodes``: dicts with ``id``, ``name``, ``label``, ``op``, ``kind`` (input/node/output), ``cluster``
    (index into ``clusters`` or -1); ``label`` is display text (``label_text``: shortened, hidden
    characters escaped) while ``name`` stays the raw name records carry; ``outputs`` (value names the node
    produces, ONNX) and ``links``
    (FX node names the node comes from, ONNX). ``edges``: ``(src, dst)`` node indices.
    ``clusters``: dicts with ``path`` and ``parent`` (index or -1); a parent precedes its children. A
    translation cluster (ONNX: the nodes made from one FX node) also has ``fx``, that node's raw name
    (its label), and the path ``<module path>::<fx>``.
    """

    side: str
    nodes: list[dict] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)
    clusters: list[dict] = field(default_factory=list)
    _cluster_index: dict[str, int] = field(default_factory=dict, init=False, repr=False)
    _translation_index: dict[str, int] = field(default_factory=dict, init=False, repr=False)

    def to_json(self) -> dict:
        return {"side": self.side, "nodes": self.nodes, "edges": [list(e) for e in self.edges],
                "clusters": self.clusters}

    def cluster_of(self, chain: list[str]) -> int:
        """Index of the cluster for a module chain (outermost first), creating the missing ones."""
        index, parent = -1, -1
        for path in chain[:MAX_CLUSTER_DEPTH]:
            index = self._cluster_index.get(path, -1)
            if index < 0:
                index = len(self.clusters)
                self.clusters.append({"path": path, "parent": parent})
                self._cluster_index[path] = index
            parent = index
        return index

    def translation_of(self, fx: str, module: int) -> int:
        """Index of the cluster of the ONNX nodes translating FX node ``fx``, inside cluster ``module``
        (the first node's, when a hostile model puts them in several), created on first use."""
        index = self._translation_index.get(fx, -1)
        if index < 0:
            index = len(self.clusters)
            path = self.clusters[module]["path"] if module >= 0 else ""
            self.clusters.append({"path": f"{path}::{fx}", "parent": module, "fx": fx})
            self._translation_index[fx] = index
        return index


def fx_spec(ep, weights: Iterable[str] = (), yours: dict[str, list[str]] | None = None) -> GraphSpec:
    """Nodes of an ExportedProgram: user inputs, every call_function and the output.

    Parameters, buffers and lifted constants are left out (they would double the node count of a
    transformer), except the placeholders named in ``weights``: the ones whose comparison failed, drawn
    next to their first reader so that a wrong weight has a place in the graph. ``yours``: node name ->
    the nodes of the user's program whose value it holds (shown in its tooltip).
    """
    ep = _as_exported_program(ep)
    yours = yours or {}
    sig = ep.graph_signature
    user_inputs = set(sig.user_inputs)
    weights = set(weights)
    keys = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
    spec = GraphSpec("fx")
    index: dict = {}
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in weights:
            reader = next(iter(node.users), None)
            chain = _fx_module_chain(reader.meta.get("nn_module_stack")) if reader is not None else []
            index[node] = len(spec.nodes)
            spec.nodes.append({"id": f"fx:{node.name}", "name": node.name,
                               "label": label_text(keys.get(node.name, node.name)),
                               "op": "weight", "kind": "weight", "cluster": spec.cluster_of(chain)})
            continue
        if node.op == "placeholder":
            if node.name not in user_inputs:
                continue
            kind, label = "input", label_text(node.name)
        elif node.op == "output":
            kind, label = "output", "output"
        elif node.op == "get_attr":
            continue
        else:
            kind, label = "node", _fx_label(node.name, _short_target(node.target))
        chain = _fx_module_chain(node.meta.get("nn_module_stack"))
        index[node] = len(spec.nodes)
        spec.nodes.append({"id": f"fx:{node.name}", "name": node.name, "label": label,
                           "op": _short_target(node.target) if kind == "node" else kind, "kind": kind,
                           "cluster": spec.cluster_of(chain) if kind == "node" else -1})
        if yours.get(node.name):
            spec.nodes[-1]["yours"] = yours[node.name]
        for src in node.all_input_nodes:
            if src in index:
                spec.edges.append((index[src], index[node]))
    return spec


def onnx_spec(onx, weights: Iterable[str] = ()) -> GraphSpec:
    """Nodes of an ONNX model: graph inputs, every node of the main graph, graph outputs.

    Initializers and ``Constant`` nodes are left out (see ``fx_spec``), except the initializers named in
    ``weights``. Unnamed or duplicated node names get a stable suffix from the node's index so that
    every id is unique.
    """
    onx = _as_model_proto(onx)
    graph = onx.graph
    spec = GraphSpec("onnx")
    producer: dict[str, int] = {}
    initializers = {i.name for i in graph.initializer}
    wanted = set(weights) & initializers
    if wanted:
        first_reader = {}
        for node in graph.node:
            for v in node.input:
                if v in wanted and v not in first_reader:
                    first_reader[v] = node
        for init in graph.initializer:
            if init.name in wanted:
                reader = first_reader.get(init.name)
                scopes = next((p.value for p in reader.metadata_props if p.key == "pkg.torch.onnx.name_scopes"),
                              None) if reader is not None else None
                producer[init.name] = len(spec.nodes)
                spec.nodes.append({"id": f"onnx-init:{init.name}", "name": init.name, "label": label_text(init.name),
                                   "op": "weight", "kind": "weight",
                                   "cluster": spec.cluster_of(_onnx_module_chain(scopes)),
                                   "outputs": [init.name], "links": []})
    for inp in graph.input:
        if inp.name in initializers:
            continue
        producer[inp.name] = len(spec.nodes)
        spec.nodes.append({"id": f"onnx-in:{inp.name}", "name": inp.name, "label": label_text(inp.name), "op": "input",
                           "kind": "input", "cluster": -1, "outputs": [inp.name], "links": [inp.name]})
    seen: set[str] = set()
    # Like initializers, Constant nodes are left out: a third of an unoptimized export (1,035 of 3,112
    # nodes on a 16-layer LLaMA), no FX twin, and each one an extra box next to the node reading it.
    drawn = [(i, node) for i, node in enumerate(graph.node) if not (node.op_type == "Constant" and not node.domain)]
    links = [_fx_link(node) for _, node in drawn]
    made = Counter(link for link in links if link is not None)  # FX node -> ONNX nodes drawn for it
    for (i, node), link in zip(drawn, links):
        name = node.name if node.name and node.name not in seen else f"{node.name}#{i}"
        seen.add(name)
        me = len(spec.nodes)
        label = f"{label_text(node.op_type)}\n{label_text(name)}"
        scopes = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), None)
        cluster = spec.cluster_of(_onnx_module_chain(scopes))
        if link is not None and made[link] > 1:  # a translation of several nodes: a cluster of its own
            cluster = spec.translation_of(link, cluster)
        spec.nodes.append({"id": f"onnx:{name}", "name": name, "label": label,
                           "op": node.op_type, "kind": "node", "cluster": cluster,
                           "outputs": [o for o in node.output if o], "links": [link] if link is not None else []})
        for src in {producer[v] for v in node.input if v in producer}:
            spec.edges.append((src, me))
        for out in node.output:
            if out:
                producer[out] = me
    for out in graph.output:
        me = len(spec.nodes)
        spec.nodes.append({"id": f"onnx-out:{out.name}", "name": out.name, "label": label_text(out.name),
                           "op": "output", "kind": "output", "cluster": -1, "outputs": [], "links": ["output"]})
        if out.name in producer:
            spec.edges.append((producer[out.name], me))
    return spec


def _fx_link(node) -> str | None:
    # The FX node an ONNX node translates: "%add_3 : [num_users=2] = call_function[...]".
    meta = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.fx_node"), "")
    match = _FX_NODE_RE.match(meta)
    return match.group(1) if match else None


def _fx_module_chain(stack) -> list[str]:
    # nn_module_stack maps keys to (path, class) from the outermost module in; the root has path "".
    return [v[0] for v in (stack or {}).values() if v and v[0]]


def _onnx_module_chain(scopes: str | None) -> list[str]:
    # "['', 'decoder', 'decoder.norm1', 'layer_norm']": root "", module paths, then the node itself.
    if not scopes:
        return []
    try:
        parts = ast.literal_eval(scopes)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # hostile metadata: no modules
        return []
    if not isinstance(parts, (list, tuple)):
        return []
    return [p for p in parts[:-1] if isinstance(p, str) and p]


def _fx_label(name: str, op: str) -> str:
    # "add_3\nadd.Tensor" says the op; "linear_2\nlinear" would only repeat the name.
    return label_text(name) if re.sub(r"_\d+$", "", name) == op else f"{label_text(name)}\n{label_text(op)}"


def _short_target(target) -> str:
    # torch.ops.aten.add.Tensor -> add.Tensor; keeps labels short without losing the overload.
    text = getattr(target, "__name__", None) or str(target)
    return text.removeprefix("aten.").removesuffix(".default")


def _as_exported_program(ep):
    from sbs_widget.load.readers import is_onnx_program, load_exported_program

    if is_onnx_program(ep):  # its decomposed program is what was translated, and what records name
        ep = ep.exported_program
    return load_exported_program(ep)


def _as_model_proto(onx):
    import onnx

    if hasattr(onx, "model_proto"):  # an ONNXProgram
        onx = onx.model_proto
    if isinstance(onx, (str, bytes)) or hasattr(onx, "__fspath__"):
        from sbs_widget.errors import LoadError

        try:
            onx = onnx.load(onx, load_external_data=False)
        except Exception as e:  # protobuf decode errors have no common base class
            raise LoadError(f"cannot load the ONNX model {onx!s}: {e}") from e
    if not isinstance(onx, onnx.ModelProto):
        raise InputError(f"expected an onnx.ModelProto, got {type(onx).__name__}")
    return onx
