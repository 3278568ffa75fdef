"""Every intermediate value of an ONNX model on one set of feeds, from one whole-model run with each node
output made a graph output (graph optimizations off: the values are the ones the file describes).

The sessions are kept for reruns (a comparison on other inputs, a widget's rerun), the last few, keyed by
what the caller says identifies the model (``key``; ``owner``: the object whose id the key holds, kept
alive with the entry so that the id cannot be reused)."""

from __future__ import annotations

import collections
import threading

import numpy as np
import onnx

from sbs_widget.errors import InputError

# ONNX element types whose values are compared (float types); others are kept for pairing only
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
KEPT_SESSIONS = 6  # a, b and b fed a's values, for the last two comparisons

_SESSIONS: collections.OrderedDict = collections.OrderedDict()
_LOCK = threading.Lock()


def node_outputs(model: onnx.ModelProto) -> list[str]:
    """The values the main graph's nodes compute, in graph order."""
    return [o for n in model.graph.node for o in n.output if o]


def all_values(model: onnx.ModelProto, feeds: dict[str, np.ndarray], providers: list[str] | None = None,
               key: tuple | None = None, owner=None) -> dict[str, np.ndarray]:
    """``name -> value`` for every tensor value the graph's nodes compute (plus the feeds). A value the
    runtime cannot return as a tensor (a sequence, an optional) is left out."""
    providers = list(providers or ["CPUExecutionProvider"])
    _check_providers(providers)
    session, names, inputs = _session(model, providers, key, owner)
    missing = inputs - set(feeds)
    if missing:
        raise InputError(f"the model's inputs {sorted(missing)} have no value: the two models must take the same "
                         "inputs (names of the export's inputs)")
    out = session.run(names, {k: v for k, v in feeds.items() if k in inputs})
    values = dict(zip(names, (np.asarray(v) for v in out)))
    values.update({k: v for k, v in feeds.items() if k in inputs})
    return values


def _check_providers(providers: list[str]) -> None:
    import onnxruntime as ort

    missing = [p for p in providers if p not in ort.get_available_providers()]
    if missing:  # (onnxruntime would fall back to the CPU with a warning: b would not be what was asked)
        raise InputError(f"execution providers {missing} are not in this onnxruntime build (it has "
                         f"{ort.get_available_providers()}); install the build that has them (onnxruntime-gpu for "
                         "CUDA) or compare on the providers it has")


def _session(model: onnx.ModelProto, providers: list[str], key: tuple | None, owner):
    full = None if key is None else (*key, tuple(providers))
    if full is not None:
        with _LOCK:
            hit = _SESSIONS.get(full)
            if hit is not None:
                _SESSIONS.move_to_end(full)
                return hit[:3]
    made = _build(model, providers)
    if full is not None:
        with _LOCK:
            _SESSIONS[full] = (*made, owner)
            while len(_SESSIONS) > KEPT_SESSIONS:
                _SESSIONS.popitem(last=False)
    return made


def _build(model: onnx.ModelProto, providers: list[str]):
    import onnxruntime as ort

    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    del exposed.graph.output[:]
    del exposed.graph.value_info[:]  # (a transformation may leave stale types there; the runtime infers them)
    for name in dict.fromkeys(node_outputs(model)):
        exposed.graph.output.append(onnx.ValueInfoProto(name=name))
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        session = ort.InferenceSession(exposed.SerializeToString(), opts, providers=providers)
    except Exception as e:
        raise InputError(f"onnxruntime cannot load the model to read its values: {e}") from e
    names = [o.name for o in session.get_outputs() if o.type.startswith("tensor")]
    return session, names, {i.name for i in session.get_inputs()}
