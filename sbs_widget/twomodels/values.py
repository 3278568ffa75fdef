"""Every intermediate value of an ONNX model on one set of feeds, from one whole-model run with each node
output made a graph output (graph optimizations off: the values are the ones the file describes)."""

from __future__ import annotations

import numpy as np
import onnx

from sbs_widget.errors import InputError

# ONNX element types whose values are compared (float types); others are kept for pairing only
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}


def node_outputs(model: onnx.ModelProto) -> list[str]:
    """The values the main graph's nodes compute, in graph order."""
    return [o for n in model.graph.node for o in n.output if o]


def all_values(model: onnx.ModelProto, feeds: dict[str, np.ndarray], providers: list[str] | None = None,
               optimized: bool = False) -> dict[str, np.ndarray]:
    """``name -> value`` for every tensor value the graph's nodes compute (plus the feeds). A value the
    runtime cannot return as a tensor (a sequence, an optional) is left out."""
    import onnxruntime as ort

    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    del exposed.graph.output[:]
    del exposed.graph.value_info[:]  # (a transformation may leave stale types there; the runtime infers them)
    wanted = [o for o in dict.fromkeys(node_outputs(model))]
    for name in wanted:
        exposed.graph.output.append(onnx.ValueInfoProto(name=name))
    opts = ort.SessionOptions()
    if not optimized:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        session = ort.InferenceSession(exposed.SerializeToString(), opts,
                                       providers=providers or ["CPUExecutionProvider"])
    except Exception as e:
        raise InputError(f"onnxruntime cannot load the model to read its values: {e}") from e
    names = [o.name for o in session.get_outputs() if o.type.startswith("tensor")]
    wanted_feeds = {i.name for i in session.get_inputs()}
    missing = wanted_feeds - set(feeds)
    if missing:
        raise InputError(f"the model's inputs {sorted(missing)} have no value: the two models must take the same "
                         "inputs (names of the export's inputs)")
    out = session.run(names, {k: v for k, v in feeds.items() if k in wanted_feeds})
    values = dict(zip(names, (np.asarray(v) for v in out)))
    values.update({k: v for k, v in feeds.items() if k in wanted_feeds})
    return values
