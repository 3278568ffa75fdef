"""Each value of ``b`` computed locally: ``b``'s nodes fed ``a``'s values wherever ``b`` reads a value it
shares with ``a``. One run of a rewired copy of ``b`` gives them all: every input a node reads that is
paired with a value of ``a`` becomes a graph input fed that value (in ``b``'s type and shape). What a
value of ``b`` then differs from its twin in ``a`` is what ``b``'s own nodes since the paired values did:
the error the transformation made there, not the one it inherited (for a quantized model: the quantized
node fed float inputs)."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from sbs_widget.twomodels.match import Matching, block_size, blocked
from sbs_widget.twomodels.values import all_values

_FED = "__sbs_a__"  # suffix of the graph inputs that feed a's values into b


@dataclasses.dataclass(frozen=True)
class Rewired:
    """``b`` with the values it shares with ``a`` read from graph inputs: ``fed`` maps each such input to
    (a's value, b's dtype, b's shape, the NCHWc block b holds it in or 0)."""

    model: onnx.ModelProto
    fed: dict[str, tuple[str, np.dtype, tuple, int]]


def rewire(b: onnx.ModelProto, matching: Matching, values_a: dict[str, np.ndarray],
           values_b: dict[str, np.ndarray]) -> Rewired:
    graph_inputs = {i.name for i in b.graph.input}
    fed: dict[str, tuple[str, np.dtype, tuple, int]] = {}
    model = onnx.ModelProto()
    model.CopyFrom(b)
    for node in model.graph.node:
        for k, name in enumerate(node.input):
            twin = matching.b_to_a.get(name)
            if not name or twin is None or twin[1] == "dequantized" or name in graph_inputs or name not in values_b:
                continue  # (a value paired after its dequantization is not the twin's value: b computes it)
            source, own = values_a.get(twin[0]), values_b[name]
            if source is None or source.size != own.size or own.dtype.kind != "f":
                continue
            fed.setdefault(name + _FED, (twin[0], own.dtype, own.shape, block_size(twin[1])))
            node.input[k] = name + _FED
    for name, (_, dtype, shape, _) in fed.items():
        model.graph.input.append(onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(dtype), list(shape)))
    return Rewired(model, fed)


def local_values(rewired: Rewired, values_a: dict[str, np.ndarray], feeds: dict[str, np.ndarray],
                 providers: list[str] | None = None, key: tuple | None = None) -> dict[str, np.ndarray]:
    """``b value -> its value computed from a's values``, for every value of b a node computes."""
    fed = {}
    for name, (a_name, dtype, shape, block) in rewired.fed.items():
        value = values_a[a_name].reshape(shape).astype(dtype, copy=False)
        fed[name] = blocked(value, block) if block else np.ascontiguousarray(value)
    values = all_values(rewired.model, {**feeds, **fed}, providers, key=key, owner=rewired)
    return {k: v for k, v in values.items() if not k.endswith(_FED)}
