"""Each value of ``b`` computed locally: ``b``'s nodes fed ``a``'s values wherever ``b`` reads a value it
shares with ``a``. One run of a rewired copy of ``b`` gives them all: every input a node reads that is
paired with a value of ``a`` becomes a graph input fed that value (in ``b``'s type and shape). What a
value of ``b`` then differs from its twin in ``a`` is what ``b``'s own nodes since the paired values did:
the error the transformation made there, not the one it inherited (for a quantized model: the quantized
node fed float inputs)."""

from __future__ import annotations

import numpy as np
import onnx

from sbs_widget.twomodels.match import Matching
from sbs_widget.twomodels.values import all_values

_FED = "__sbs_a__"  # suffix of the graph inputs that feed a's values into b


def local_values(b: onnx.ModelProto, matching: Matching, values_a: dict[str, np.ndarray],
                 values_b: dict[str, np.ndarray], providers: list[str] | None = None,
                 b_key: tuple | None = None) -> dict[str, np.ndarray]:
    """``b value -> its value computed from a's values``, for every value of b a node computes."""
    graph_inputs = {i.name for i in b.graph.input}
    fed: dict[str, np.ndarray] = {}
    rewired = onnx.ModelProto()
    rewired.CopyFrom(b)
    for node in rewired.graph.node:
        for k, name in enumerate(node.input):
            twin = matching.b_to_a.get(name)
            if not name or twin is None or name in graph_inputs or name not in values_b:
                continue
            source = values_a.get(twin[0])
            own = values_b[name]
            if source is None or source.size != own.size or own.dtype.kind != "f":
                continue
            fed.setdefault(name + _FED, np.ascontiguousarray(source.reshape(own.shape).astype(own.dtype)))
            node.input[k] = name + _FED
    for name, value in fed.items():
        rewired.graph.input.append(onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)))
    feeds = {k: v for k, v in values_b.items() if k in graph_inputs}
    feeds.update(fed)
    key = None if b_key is None else ("b fed a", *b_key, tuple(sorted(fed)))
    return {k: v for k, v in all_values(rewired, feeds, providers, key=key, owner=b).items()
            if not k.endswith(_FED)}
