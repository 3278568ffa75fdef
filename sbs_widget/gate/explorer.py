"""Overlays for Model Explorer (``ai-edge-model-explorer``): the records as per-node data files it
reads ("node data" JSON, ``model_explorer.node_data_builder.ModelNodeData``), to paint the ONNX model
and the program with the comparison.

Three files per graph: ``error`` (the largest |torch - onnx| of the node's values, painted by status),
``status`` (the record status: ok, noise, mismatch, one-sided, reset, error) and ``verdict`` (in words:
``agree``, ``rounding``, ``mismatch``, ``mismatch (inherited)``, ``culprit 1``...). A node with several
compared values shows its worst.

Node ids are those the viewers give:

- the ONNX model, as ``model-explorer-onnx`` names them: graph id = the graph's name (``<main>`` when
  it has none), a node = its name (unnamed or repeated names as onnx_ir's ``NameFixPass`` fixes them,
  which the adapter runs first), a graph input, output or initializer = ``[value] <its name>``;
- the program, as Model Explorer's built-in ExportedProgram adapter names them: graph id ``graph``, a
  node = its FX name. Records name the nodes of the program the exporter translated (``ep_name``) and of
  the program you exported (``ep_origin``): both are written, so either program can be opened.

Load them in Model Explorer with ``model_explorer.visualize(path, node_data={"node_data_path": ...})``,
or from its UI ("Add per-node data"). Numbers JSON cannot hold (NaN, infinities) are written as the
largest float.

>>> graph_id_of(None)
'<main>'
"""

from __future__ import annotations

import json
import math
import os
import sys

from sbs_widget import records as R

PROGRAM_GRAPH_ID = "graph"  # model_explorer's built-in ExportedProgram adapter
DATA_NAMES = ("error", "status", "verdict")
_RANK = {R.MISMATCH: 0, R.ERROR: 1, R.NOISE: 2, R.RESET: 3, R.OK: 4, R.ONE_SIDED: 5}
COLORS = {R.OK: "#a6d96a", R.NOISE: "#6baed6", R.MISMATCH: "#d73027", R.ERROR: "#c2a5cf", R.RESET: "#9ecae1",
          R.ONE_SIDED: "#e8e8e8"}
TEXT_COLORS = {R.MISMATCH: "#ffffff"}


def graph_id_of(model) -> str:
    """The graph id model-explorer-onnx gives the main graph of ``model`` (a ``ModelProto``, or None)."""
    name = getattr(getattr(model, "graph", None), "name", None)
    return name or "<main>"


def _value(x) -> float:
    x = float(x)
    return x if math.isfinite(x) else sys.float_info.max


def _verdict(rec, culprit_rank: int | None) -> str:
    if culprit_rank is not None:
        return f"culprit {culprit_rank}"
    s = rec.status
    if s == R.OK:
        return "agree"
    if s == R.NOISE or s == R.RESET and rec.noise is True:
        return "rounding"
    if s == R.MISMATCH or s == R.RESET and rec.within_tolerance is False:
        return "mismatch (inherited)" if rec.local_noise is True or (rec.err_local is not None and rec.err_abs and
                                                                     rec.err_local < 1e-2 * rec.err_abs) else "mismatch"
    if s == R.RESET:
        return "reset"
    if s == R.ERROR:
        return "error"
    return "not compared"


class _Node:
    __slots__ = ("status", "err", "verdict", "rank")

    def __init__(self):
        self.status, self.err, self.verdict, self.rank = None, None, None, 99

    def add(self, rec, verdict: str) -> None:
        rank = _RANK.get(rec.status, 6)
        if verdict.startswith("culprit"):
            rank = -1
        if rank < self.rank:
            self.rank, self.status, self.verdict = rank, rec.status, verdict
        if rec.err_abs is not None:
            e = _value(rec.err_abs) if not math.isnan(rec.err_abs) else sys.float_info.max
            self.err = e if self.err is None else max(self.err, e)


def _graph_data(nodes: dict, name: str) -> dict:
    """{data name: GraphNodeData as JSON} for one graph."""
    error, status, verdict = {}, {}, {}
    for node_id, n in nodes.items():
        color = COLORS.get(n.status)
        if n.err is not None:
            item = {"value": n.err}
            if color:
                item["bgColor"] = color
                if n.status in TEXT_COLORS:
                    item["textColor"] = TEXT_COLORS[n.status]
            error[node_id] = item
        if n.status is not None:
            status[node_id] = {"value": n.status, **({"bgColor": color} if color else {})}
            verdict[node_id] = {"value": n.verdict, **({"bgColor": color} if color else {})}
    return {
        "error": {"results": error, "name": f"{name}: max |torch - onnx|"},
        "status": {"results": status, "name": f"{name}: status", "showExpandedSummaryOnGroupNode": True,
                   "showLabelCountColumnsInChildrenStatsTable": True},
        "verdict": {"results": verdict, "name": f"{name}: verdict", "showExpandedSummaryOnGroupNode": True,
                    "showLabelCountColumnsInChildrenStatsTable": True},
    }


def _culprit_ranks(culprits, records) -> dict:
    ranks = {}
    for k, c in enumerate(culprits, 1):
        if c.record is not None and 0 <= c.record < len(records) and c.record not in ranks:
            ranks[c.record] = k
    return ranks


def onnx_node_data(records, onx, culprits=()) -> dict:
    """``{"error": ..., "status": ..., "verdict": ...}``, each a ``ModelNodeData`` as JSON (graph id ->
    ``GraphNodeData``) for the ONNX model ``onx`` (``ModelProto`` or path; read without its weights)."""
    import onnx

    model = onnx.load(os.fspath(onx), load_external_data=False) if isinstance(onx, (str, os.PathLike)) else onx
    graph = model.graph
    producer = {}
    for node, node_id in zip(graph.node, _node_ids(model)):
        for out in node.output:
            if out:
                producer[out] = node_id
    values = {v.name for v in graph.input} | {v.name for v in graph.output} | {t.name for t in graph.initializer}
    outputs = {v.name for v in graph.output}
    ranks = _culprit_ranks(culprits, records)
    nodes: dict[str, _Node] = {}
    for k, rec in enumerate(records):
        name = rec.onnx_name
        if not name:
            continue
        verdict = _verdict(rec, ranks.get(k))
        ids = []
        if name in producer:
            ids.append(producer[name])
        if name in values and (name not in producer or name in outputs):
            ids.append(f"[value] {name}")
        for node_id in ids:
            nodes.setdefault(node_id, _Node()).add(rec, verdict)
    return _per_data({graph_id_of(model): nodes}, "ONNX")


def _node_ids(model) -> list[str]:
    """The ids of the main graph's nodes, in order: their names; where some are missing or repeated, the
    names onnx_ir's ``NameFixPass`` gives them, as model-explorer-onnx runs it before naming its nodes."""
    names = [n.name for n in model.graph.node]
    if all(names) and len(set(names)) == len(names):
        return names
    try:
        import onnx_ir as ir
        from onnx_ir.passes.common import NameFixPass

        ir_model = ir.serde.deserialize_model(model)
        NameFixPass()(ir_model)
        fixed = [n.name for n in ir_model.graph]
        if len(fixed) == len(names):
            return fixed
    except Exception:  # the adapter's own fallback below
        pass
    return [name or f"<node_{i}>" for i, name in enumerate(names)]


def program_node_data(records, culprits=()) -> dict:
    """As ``onnx_node_data`` for the program (graph id ``graph``, FX node names): the nodes of the program
    the exporter translated (``ep_name``) and of yours (``ep_origin``) where they differ."""
    ranks = _culprit_ranks(culprits, records)
    nodes: dict[str, _Node] = {}
    for k, rec in enumerate(records):
        if rec.kind == R.KIND_INNER or not rec.ep_name:
            continue
        verdict = _verdict(rec, ranks.get(k))
        for name in {rec.ep_name, rec.ep_origin} - {None}:
            nodes.setdefault(name, _Node()).add(rec, verdict)
    return _per_data({PROGRAM_GRAPH_ID: nodes}, "program")


def _per_data(graphs: dict, label: str) -> dict:
    out = {name: {} for name in DATA_NAMES}
    for graph_id, nodes in graphs.items():
        for name, data in _graph_data(nodes, label).items():
            out[name][graph_id] = data
    return out


def write_model_explorer(records, onx, folder, *, culprits=(), program: bool = True) -> list[str]:
    """Write the overlays into ``folder`` (created if needed): ``onnx_error.json``, ``onnx_status.json``,
    ``onnx_verdict.json`` and, with ``program``, ``program_error.json``... Returns the paths written."""
    from sbs_widget.safe_text import atomic_path

    os.makedirs(folder, exist_ok=True)
    records = list(records)
    sets = {"onnx": onnx_node_data(records, onx, culprits)}
    if program:
        sets["program"] = program_node_data(records, culprits)
    paths = []
    for prefix, data in sets.items():
        for name, model_data in data.items():
            path = os.path.join(folder, f"{prefix}_{name}.json")
            with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
                json.dump(model_data, f, ensure_ascii=True, allow_nan=False, indent=1)
            paths.append(path)
    return paths
