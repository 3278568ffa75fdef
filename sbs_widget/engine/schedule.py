"""The schedule of a pair: when each FX value is computed, compared and freed, which ONNX values are
handed back, and the sizes segments are cut by. Worked out once per pair (``build_schedule``), read
by every run; immutable."""

from __future__ import annotations

import dataclasses

from sbs_widget.align.fx_graph import last_uses
from sbs_widget.align.pair import Pair
from sbs_widget.dtypes import onnx_value_bytes
from sbs_widget.engine.fx_runner import small_nodes
from sbs_widget.engine.run_plan import fx_after


@dataclasses.dataclass(frozen=True)
class Schedule:
    fx_last_use: dict[str, int]  # FX value -> position of its last reader
    fx_frees: list[list[str]]  # after node i runs: the values it read for the last time, and its own if unread
    fx_names: list[str]
    fx_after: list[str]  # per FX node, what follows its run (run_plan.FX_*)
    fx_folded: frozenset[str]  # FX values whose twin is a constant-folded initializer
    small_fx_nodes: frozenset[int]
    n_fx_nodes: int  # call_function nodes (the progress total)
    last_reader: dict[str, int]  # ONNX value -> its last reader (outputs: past the end)
    wanted: frozenset[str]  # ONNX values a segment hands back
    node_bytes: list[int]  # bytes handed back per ONNX node
    live_bytes: int  # the largest set of torch values alive at once in an eager run
    weight_bytes: int


def build_schedule(pair: Pair) -> Schedule:
    decomposed, index, alignment = pair.decomposed_ep, pair.index, pair.alignment
    fx_nodes = pair.fx_nodes
    fx_last_use = last_uses(decomposed.graph)
    fx_sizes = [(info.elements, info.nbytes) for info in alignment.fx_nodes]
    fx_frees: list[list[str]] = [[] for _ in fx_nodes]
    for name, i in fx_last_use.items():
        fx_frees[i].append(name)
    for i, node in enumerate(fx_nodes):
        if node.op == "call_function" and node.name not in fx_last_use:
            fx_frees[i].append(node.name)
    last_reader: dict[str, int] = {v: max(readers) for v, readers in index.consumers.items()}
    for o in index.outputs:
        last_reader[o] = len(index.nodes)
    # (half precision: handing a value back would make onnxruntime round it to float16 where it keeps
    # float32 between nodes, and change what follows; inner_run.py recomputes those apart)
    half = pair.half
    wanted = frozenset(set(alignment.onnx_to_fx) | set(index.outputs) | {
        v for v, inner in pair.inner.pairs.items() if inner.constant or not half})
    fx_folded = frozenset(fx for fx, p in alignment.pairs.items()
                          if p.onnx_value not in index.producer and p.onnx_value in index.initializers)
    node_bytes, live_bytes = _estimate_sizes(pair, fx_sizes, fx_frees, wanted)
    return Schedule(
        fx_last_use=fx_last_use, fx_frees=fx_frees, fx_names=[n.name for n in fx_nodes],
        fx_after=[fx_after(n, info, alignment, fx_folded) for n, info in zip(fx_nodes, alignment.fx_nodes)],
        fx_folded=fx_folded, small_fx_nodes=frozenset(small_nodes(list(fx_nodes), fx_sizes)),
        n_fx_nodes=sum(1 for n in fx_nodes if n.op == "call_function"), last_reader=last_reader,
        wanted=wanted, node_bytes=node_bytes, live_bytes=live_bytes,
        weight_bytes=sum(t.numel() * t.element_size() for t in decomposed.state_dict.values()))


def _estimate_sizes(pair: Pair, fx_sizes: list[tuple[int, int]], fx_frees: list[list[str]],
                    wanted: frozenset[str]) -> tuple[list[int], int]:
    """Bytes handed back per ONNX node (its compared outputs), and the largest set of torch values
    alive at once in an eager run: the yardstick segments are cut by."""
    fx_bytes: dict[str, int] = {}
    alive, live, peak = {}, 0, 0
    for node, (_, size), frees in zip(pair.fx_nodes, fx_sizes, fx_frees):
        name = node.name
        fx_bytes[name] = size
        if node.op == "call_function":
            alive[name] = size
            live += size
            peak = max(peak, live)
        for gone in frees:  # inputs read for the last time (an unread output stays counted)
            if gone != name and gone in alive:
                live -= alive.pop(gone)
    per_node = []
    onnx_to_fx, types = pair.alignment.onnx_to_fx, pair.index.types
    for outputs in pair.index.node_outputs:
        total = 0
        for o in outputs:
            if o in wanted:
                fx = onnx_to_fx.get(o)
                total += fx_bytes.get(fx, 0) if fx else onnx_value_bytes(types.get(o))
        per_node.append(total)
    return per_node, peak
