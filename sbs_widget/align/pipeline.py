"""The alignment pipeline, in order: the programs and the ONNX index (``load``), the FX nodes, the
alignment (``pairs.py``), the values the exporter constant-folded, then the inner plan
(``inner_pairs.py``), which reads all of the above; the result is one immutable ``Pair``."""

from __future__ import annotations

import dataclasses

import onnx
import torch

from sbs_widget.align.fx_graph import dead_nodes
from sbs_widget.align.inner_pairs import build_inner_plan
from sbs_widget.align.inner_plan import InnerPlan
from sbs_widget.align.pair import Pair, PairOptions
from sbs_widget.align.pairs import align
from sbs_widget.load.onnx_index import OnnxIndex


def build_pair(decomposed: torch.export.ExportedProgram, model: onnx.ModelProto, user_ep=None,
               index: OnnxIndex | None = None, options: PairOptions | None = None) -> Pair:
    """The pair of ``decomposed`` and ``model``, in pipeline order."""
    options = options or PairOptions.from_environment()
    index = index if index is not None else OnnxIndex.build(model)
    fx_nodes = tuple(decomposed.graph.nodes)
    alignment = align(decomposed, index, id(user_ep.graph) if user_ep is not None else None)
    folded_into = {src: names[0] for src, names in index.folded_into().items()}
    pair = Pair(decomposed, user_ep, model, index, fx_nodes, {n.name: i for i, n in enumerate(fx_nodes)},
                alignment, folded_into, frozenset(dead_nodes(decomposed.graph)), InnerPlan(), options)
    if options.inner_values:
        pair = dataclasses.replace(pair, inner=build_inner_plan(pair))
    return pair
