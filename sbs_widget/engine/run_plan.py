"""What a lockstep run follows, worked out once per cut of the ONNX graph and kept by the prepared
pair (``PreparedPair.release_plan``): what comes after each FX node, and when torch values may go."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import torch

    from sbs_widget.align.pair import Pair

# What follows an FX node's run (``fx_after``): nothing (not a call), its time only (its
# twin is compared with its segment), a one-sided record, or a comparison with a folded initializer.
FX_SKIP, FX_TIMED, FX_ONE_SIDED, FX_FOLDED = 0, 1, 2, 3


class ReleasePlan(NamedTuple):
    """When torch values may go, for a run cut into segments."""

    segment_of_node: list[int]  # the segment of each ONNX node
    fx_release: dict[str, int]  # FX value -> last segment comparing it or feeding a node-local group with it
    fx_need: list[int]  # per segment, the last FX position it needs
    release_at: list[list[str]]  # per segment, the FX values it releases
    single: list[bool]  # per segment, whether the FX stretch computed for it runs on one thread


def release_plan(p: Pair, small_fx_nodes: frozenset[int], ranges: list[tuple[int, int]], node_local: bool,
                 reference: bool = False) -> ReleasePlan:
    """The ``ReleasePlan`` of a run of ``p`` cut into ``ranges``. ``reference``: the run may rerun a
    compared node in float64 and its ONNX group on torch inputs (``verdicts.py``) when the pair fails
    the tolerance: the node's FX inputs and its group's anchors are held until its segment is done."""
    idx = p.index
    segment_of_node = [0] * len(idx.nodes)
    for s, (a, b) in enumerate(ranges):
        segment_of_node[a:b] = [s] * (b - a)
    # The engine's own hold on torch values: until the segment that compares them (or feeds them to a
    # node-local group) is done.
    fx_release: dict[str, int] = {}
    fx_need: list[int] = [-1] * len(ranges)
    for fx_name, pair in p.alignment.pairs.items():
        v = pair.onnx_value
        if v in idx.producer:
            s = segment_of_node[idx.producer[v]]
            fx_release[fx_name] = max(fx_release.get(fx_name, -1), s)
            fx_need[s] = max(fx_need[s], p.fx_position[fx_name])
            if node_local or reference:
                g = p.group(v)
                if g is not None:
                    for a in g.anchors:
                        f = p.alignment.onnx_to_fx[a]
                        fx_release[f] = max(fx_release.get(f, -1), s)
            if reference:
                _hold_reference_inputs(p, fx_name, v, s, fx_release)
    for fx_name, v in p.alignment.alias_of.items():
        if fx_name in p.alignment.duplicate_of or fx_name in p.alignment.reshaped:
            continue  # measured with its twin's torch value
        s = segment_of_node[idx.producer[v]]
        fx_release[fx_name] = max(fx_release.get(fx_name, -1), s)
        fx_need[s] = max(fx_need[s], p.fx_position[fx_name])
        if reference:
            _hold_reference_inputs(p, fx_name, v, s, fx_release)
    recorded_at = p.inner.recorded_at(idx.producer)  # (a constant: with the node reading it)
    for o, inner in p.inner.pairs.items():  # a finer reference reads its FX node's arguments
        s = segment_of_node[recorded_at.get(o, 0)]
        for a in p.inner.finer[inner.key].args:
            if p.fx_nodes[p.fx_position[a]].op != "placeholder":
                fx_release[a] = max(fx_release.get(a, -1), s)
                fx_need[s] = max(fx_need[s], p.fx_position[a])
    for fx_name, _ in p.alignment.output_pairs:
        if fx_name:
            fx_release[fx_name] = len(ranges)  # kept for the output records
    release_at: list[list[str]] = [[] for _ in range(len(ranges) + 1)]
    for name, s in fx_release.items():
        release_at[min(s, len(ranges))].append(name)
    # whether the FX stretch computed for each segment runs on one thread (small ops only)
    single, done = [], -1
    for need in fx_need:
        single.append(all(i in small_fx_nodes for i in range(done + 1, need + 1)))
        done = max(done, need)
    return ReleasePlan(segment_of_node, fx_release, fx_need, release_at, single)


def _hold_reference_inputs(p: Pair, fx_name: str, value: str, s: int, fx_release: dict[str, int]) -> None:
    """Hold, until segment ``s`` is done, the torch values a float64 reference of ``fx_name`` reads
    (``verdicts.py``): its ONNX group's anchors (held above) or its own inputs (an item of a tuple:
    its producer's). The program's inputs and weights are read from the run's inputs."""
    import operator

    node = p.fx_nodes[p.fx_position[fx_name]]
    inputs = list(node.all_input_nodes)
    if node.target is operator.getitem and inputs and inputs[0].op == "call_function":
        inputs += inputs[0].all_input_nodes
    for n in inputs:
        if n.op != "placeholder":
            fx_release[n.name] = max(fx_release.get(n.name, -1), s)


def fx_after(node: torch.fx.Node, info, alignment, folded: set[str]) -> int:
    """What a run does once an FX node has run."""
    if node.op != "call_function":
        return FX_SKIP
    name = node.name
    if name in alignment.pairs:
        return FX_FOLDED if name in folded else FX_TIMED
    return FX_ONE_SIDED if info.is_tensor and name not in alignment.alias_of else FX_TIMED
