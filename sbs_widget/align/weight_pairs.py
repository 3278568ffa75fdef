"""Weights paired with the ONNX initializers holding them: by the exporter's provenance metadata, by
state-dict key, stored transposed, tied or deduplicated (``merged_weights.py``); a weight with no
initializer of its own says why."""

from __future__ import annotations

import torch

from sbs_widget.align.alignment import Alignment, Twin, WeightPair
from sbs_widget.align.initializers import stored_transposed
from sbs_widget.align.merged_weights import merged_into, removed_comment
from sbs_widget.load.onnx_index import OnnxIndex


def pair_weights(program: torch.export.ExportedProgram, index: OnnxIndex, al: Alignment, by_name: dict) -> None:
    """Weights: parameters, buffers and lifted constants become initializers named by state-dict key."""
    sig = program.graph_signature
    has_origin_meta = any("pkg.torch.onnx.original_node_name" in m for m in index.value_meta.values())
    by_original = {m["pkg.torch.onnx.original_node_name"]: v for v, m in index.value_meta.items()
                   if "pkg.torch.onnx.original_node_name" in m and v in index.initializers}
    placeholder_keys = {**sig.inputs_to_parameters, **sig.inputs_to_buffers,
                        **sig.inputs_to_lifted_tensor_constants}
    owner_of = {v: placeholder_keys[ph] for ph, v in by_original.items() if ph in placeholder_keys}
    for ph, key in placeholder_keys.items():
        onnx_name = by_original.get(ph)
        if onnx_name is not None:
            al.weights.append(WeightPair(ph, key, onnx_name, True))
            _take(al, ph, onnx_name)
        elif key in index.initializers:
            if has_origin_meta:
                # Same name, no provenance: the optimizer rewrote it (e.g. BatchNorm folded into Conv).
                al.weights.append(WeightPair(ph, key, key, False,
                                             "initializer rewritten by the ONNX optimizer (no original_node_name)"))
            elif (reader := _read_for_another_node(index, key, by_name.get(ph))) is not None:
                al.weights.append(WeightPair(ph, key, key, False,
                                             f"initializer rewritten by the ONNX optimizer: read by {reader}"))
            else:
                al.weights.append(WeightPair(ph, key, key, True))
                _take(al, ph, key)
        else:
            folded = index.folded_into().get(key, [])
            if stored_transposed(index, key, folded, by_name.get(ph)):
                al.weights.append(WeightPair(ph, key, folded[0], True, "stored transposed by the ONNX optimizer",
                                             transposed=True))
                continue
            merged = None if folded else merged_into(program, index, key, by_name.get(ph), al, owner_of)
            if merged is not None:  # tied, or deduplicated: compared with the initializer holding it
                al.weights.append(WeightPair(ph, key, merged[0], True, merged[1]))
                continue
            why = (f"no initializer of its own: the ONNX optimizer folded it into {', '.join(folded[:3])} "
                   "(compared where the program transforms it)") if folded else \
                removed_comment(program, key)
            al.weights.append(WeightPair(ph, key, None, False, why))



def _take(al: Alignment, placeholder: str, value: str) -> None:
    al.pairs[placeholder] = Twin(placeholder, value, "weight", "weight")
    al.onnx_to_fx[value] = placeholder


def _read_for_another_node(index: OnnxIndex, name: str, placeholder: torch.fx.Node | None) -> str | None:
    """When every ONNX node reading initializer ``name`` translates an FX node other than those
    reading the weight in the program, the initializer was rewritten under the same name (BatchNorm
    folded into the convolution before it: the Conv then translates the batch norm): the reader, else
    None. Readers without metadata say nothing."""
    readers = index.consumers.get(name, [])
    if placeholder is None or not readers:
        return None
    users = {u.name for u in placeholder.users}
    fx = [index.node_fx[i] for i in readers]
    if None in fx or any(f in users for f in fx):
        return None
    return f"{index.op_types[readers[0]]} node {index.nodes[readers[0]].name!r} (translating FX node {fx[0]!r})"
