"""Minimal repro bundles: the ONNX node (or fused group) where a discrepancy starts, cut into its own
model, with the torch values it reads and the torch value it should produce.

A bundle folder holds:

- ``model.onnx``: the group's nodes; its anchors (values fed from torch) are the graph inputs, its
  constants the initializers;
- ``inputs.pt`` / ``inputs.npz``: the torch values of the anchors (plain tensors / arrays, keyed by
  the model's input names); ``expected.pt`` / ``expected.npz``: torch's value of the output;
- ``fx.txt``: the FX node, its target and its arguments (names, shapes, dtypes);
- ``replay.py``: runs ``model.onnx`` with onnxruntime and prints ``max abs error: X``.

>>> import sbs_widget
>>> # bundle = sbs_widget.export_repro(prepared, inputs, culprits[0], "repro_folder")
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from sbs_widget.dtypes import ONNX_TO_NUMPY, numpy_elem_type
from sbs_widget.engine.fx_runner import torch_values
from sbs_widget.engine.node_local import ANCHOR, local_model
from sbs_widget.errors import InputError
from sbs_widget.safe_files import output_folder, output_path
from sbs_widget.safe_text import short_name

if TYPE_CHECKING:
    from sbs_widget.engine.entry import Prepared

OUTPUT = "expected"
BUNDLE_FILES = ("model.onnx", "inputs.pt", "inputs.npz", "expected.pt", "expected.npz", "fx.txt", "replay.py",
                "info.json")

# Model strings enter the script only as repr() literals (VALUE, NODES, NAMES): a name holding quotes,
# backslashes, \N, newlines or NUL cannot break or inject code.
REPLAY = '''"""Replay this repro bundle: run model.onnx on the torch inputs and compare with torch's output.

    python replay.py
"""
import os

import numpy as np
import onnxruntime

VALUE = {value}
NODES = {nodes}
NAMES = {names}  # key in inputs.npz -> model input name (long or odd names have short keys)

here = os.path.dirname(os.path.abspath(__file__))
inputs = {{NAMES.get(k, k): v for k, v in np.load(os.path.join(here, "inputs.npz")).items()}}
expected = np.load(os.path.join(here, "expected.npz"))["expected"]
session = onnxruntime.InferenceSession(os.path.join(here, "model.onnx"), providers=["CPUExecutionProvider"])
got = session.run(None, inputs)[0]
if got.shape != expected.shape and got.size == expected.size:
    got = got.reshape(expected.shape)
diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
finite = np.isfinite(diff)
print(f"value: {{VALUE!r}}")  # repr: no control character reaches the terminal
print(f"nodes: {{', '.join(map(repr, NODES))}}")
print(f"shape: {{tuple(got.shape)}} dtype: {{got.dtype}}")
print(f"max abs error: {{float(diff[finite].max()) if finite.any() else 0.0:.6g}}")
print(f"NaN/Inf mismatches: {{int((~finite).sum())}}")
'''


@dataclass
class ReproBundle:
    folder: str
    value: str                      # the ONNX value the piece computes
    nodes: list[str]                # ONNX node names in the piece
    err_abs: float                  # max |torch - piece| on torch inputs (the culprit's err_local)
    files: list[str] = field(default_factory=list)


def _resolve(prepared: Prepared, target) -> str:
    """The compared ONNX value whose group reproduces ``target`` (a Culprit, or a name)."""
    p = prepared
    twins = p.alignment.onnx_to_fx
    value = getattr(target, "value", None)
    if value:
        return value
    name = getattr(target, "onnx_name", None) or target
    if not isinstance(name, str):
        raise InputError(f"cannot make a repro of {target!r}: give a Culprit or a name")
    idx = p.index
    if name in twins and name in idx.producer:
        return name
    if name in p.alignment.pairs and p.alignment.pairs[name].onnx_value in idx.producer:
        return p.alignment.pairs[name].onnx_value
    by_node = {n.name: n for n in idx.nodes}
    readers = []
    if name in by_node:
        readers = [by_node[name]]
    elif name in idx.producer:  # an ONNX-only value: its first reader with a twin downstream
        readers = [idx.nodes[i] for i in idx.consumers.get(name, [])]
    elif name in idx.initializers:
        readers = [idx.nodes[i] for i in idx.consumers.get(name, [])]
    seen = set()
    while readers:
        node = readers.pop(0)
        if node.name in seen:
            continue
        seen.add(node.name)
        out = next((o for o in node.output if o in twins), None)
        if out is not None:
            return out
        for o in node.output:
            readers.extend(idx.nodes[i] for i in idx.consumers.get(o, []))
    raise InputError(f"cannot make a repro of {name!r}: it is not an ONNX value, ONNX node or FX node with a "
                     "torch twin downstream")


def _as_array(value, like: str, index) -> np.ndarray:
    t = value if isinstance(value, torch.Tensor) else torch.tensor(value)
    arr = t.detach().cpu().float().numpy() if t.dtype == torch.bfloat16 else t.detach().cpu().numpy()
    vt = index.types.get(like)
    if vt is not None and vt.elem_type in ONNX_TO_NUMPY and arr.dtype != ONNX_TO_NUMPY[vt.elem_type]:
        arr = arr.astype(ONNX_TO_NUMPY[vt.elem_type])
    if vt is not None and vt.shape is not None and all(isinstance(d, int) for d in vt.shape) \
            and arr.size == int(np.prod(vt.shape)):
        arr = arr.reshape(vt.shape)
    return np.ascontiguousarray(arr)


def piece_model(prepared: Prepared, value: str, feed_types: dict[str, int]) -> tuple[onnx.ModelProto, list[str]]:
    """The group computing ``value`` as a standalone model: anchors are inputs (named after the
    values), every constant an initializer, one output named ``expected``."""
    g = prepared.group(value)
    if g is None:
        raise InputError(f"the ONNX nodes computing {value!r} cannot be isolated from torch inputs")
    types = {ANCHOR + a: t for a, t in feed_types.items()}
    types.update({c: prepared.index.initializers[c].data_type for c in g.constants})
    model, plan = local_model(prepared.index, [g], types)
    graph = model.graph
    weights = prepared.weights()
    big = set(plan.big_constants)
    kept = [i for i in graph.input if i.name not in big]
    del graph.input[:]
    graph.input.extend(kept)
    graph.initializer.extend(numpy_helper.from_array(weights[c], c) for c in plan.big_constants)
    rename = {ANCHOR + a: a for a in g.anchors}
    rename[g.output_name(0)] = OUTPUT
    for vi in list(graph.input) + list(graph.output):
        vi.name = rename.get(vi.name, vi.name)
    for node in graph.node:
        for k, x in enumerate(node.input):
            node.input[k] = rename.get(x, x)
        for k, x in enumerate(node.output):
            node.output[k] = rename.get(x, x)
    graph.name = f"repro_{value}"[:120]
    return model, [prepared.index.nodes[i].name for i in g.nodes]


def export_repro(prepared: Prepared, inputs, culprit, folder: str, *, kwargs=None, atol: float | None = None,
                 rtol: float | None = None) -> ReproBundle:
    """Write the smallest ONNX model reproducing ``culprit`` (a ``Culprit``, or an ONNX value, ONNX
    node, FX node or initializer name) into ``folder``, with its torch inputs, expected output, the FX
    op and a ``replay.py``. ``prepared``: a ``Prepared`` or an ``(ep, onx)`` pair.

    >>> import sbs_widget
    >>> # b = sbs_widget.export_repro((ep, onx), inputs, "node_Add_12", "repro"); b.err_abs
    """
    from sbs_widget.blame.culprits import as_prepared

    p = as_prepared(*prepared) if isinstance(prepared, tuple) else as_prepared(prepared)
    atol, rtol = p.tolerance(atol, rtol)
    value = _resolve(p, culprit)
    g = p.group(value)
    if g is None:
        raise InputError(f"the ONNX nodes computing {value!r} cannot be isolated from torch inputs")
    fx_of = p.alignment.onnx_to_fx
    fx_out = fx_of[value]
    torch_vals = torch_values(p.decomposed_ep, inputs, kwargs, {fx_out} | {fx_of[a] for a in g.anchors})
    feeds = {a: _as_array(torch_vals[fx_of[a]], a, p.index) for a in g.anchors}
    model, node_names = piece_model(p, value, {a: numpy_elem_type(v) for a, v in feeds.items()})
    expected_t = torch_vals[fx_out]
    expected_t = expected_t if isinstance(expected_t, torch.Tensor) else torch.tensor(expected_t)
    expected = _as_array(expected_t, value, p.index)

    output_folder(folder)
    files = []

    def path(name):  # each file written aside, then renamed over the name: a link there is replaced
        files.append(name)
        return output_path(os.path.join(folder, name))

    with path("model.onnx") as tmp:
        onnx.save(model, tmp)
    with path("inputs.pt") as tmp:
        torch.save({a: torch.from_numpy(v.copy()) for a, v in feeds.items()}, tmp)
    keys = _npz_keys(feeds)  # zip entry names: a 100k-character name cannot be one
    with path("inputs.npz") as tmp:
        np.savez(tmp, **{k: feeds[a] for k, a in keys.items()})
    with path("expected.pt") as tmp:
        torch.save({OUTPUT: expected_t.detach().cpu().clone()}, tmp)
    with path("expected.npz") as tmp:
        np.savez(tmp, **{OUTPUT: expected})
    with path("fx.txt") as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(_fx_text(p, fx_out, torch_vals, g))
    with path("replay.py") as tmp, open(tmp, "w", encoding="utf-8") as f:
        f.write(REPLAY.format(value=repr(value), nodes=repr(list(node_names)), names=repr(keys)))
    err = _replay_error(model, feeds, expected)
    with path("info.json") as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump({"value": value, "fx_node": fx_out, "nodes": node_names, "anchors": list(g.anchors),
                   "npz_keys": keys,
                   "constants": list(g.constants), "err_abs": err, "atol": atol, "rtol": rtol}, f, indent=1)
    return ReproBundle(folder, value, node_names, err, files)


def _npz_keys(feeds: dict) -> dict[str, str]:
    """Short, distinct, file-safe keys for ``inputs.npz`` -> the model input names they stand for."""
    keys: dict[str, str] = {}
    for k, name in enumerate(feeds):
        key = short_name(name)
        if key in keys or key in ("file", "allow_pickle", "args"):  # np.savez's own parameters
            key = f"{key}_{k}"
        keys[key] = name
    return keys


def _replay_error(model, feeds, expected) -> float:
    import onnxruntime

    sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)[0]
    if got.shape != expected.shape and got.size == expected.size:
        got = got.reshape(expected.shape)
    diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
    finite = np.isfinite(diff)
    return float(diff[finite].max()) if finite.any() else 0.0


def _fx_text(p: Prepared, fx_name: str, values: dict, group) -> str:
    node = next(n for n in p.fx_nodes if n.name == fx_name)
    lines = [f"FX node: {node.format_node()}", f"target: {node.target}", "arguments:"]
    for k, a in enumerate(node.args):
        lines.append(f"  args[{k}]: {_describe_arg(a, p)}")
    for k, a in node.kwargs.items():
        lines.append(f"  {k}: {_describe_arg(a, p)}")
    lines.append("")
    lines.append("ONNX piece (model.onnx): the torch twins of these values are its inputs:")
    for a in group.anchors:
        lines.append(f"  {a}  <- FX {p.alignment.onnx_to_fx[a]}")
    lines.append("ONNX nodes:")
    for i in group.nodes:
        n = p.index.nodes[i]
        lines.append(f"  {n.op_type} {n.name}({', '.join(n.input)}) -> {', '.join(n.output)}")
    stack = node.meta.get("stack_trace") or ""
    if stack:
        lines += ["", "stack trace:", stack.strip()]
    return "\n".join(lines) + "\n"


def _describe_arg(a, p: Prepared) -> str:
    if isinstance(a, torch.fx.Node):
        val = a.meta.get("val")
        if isinstance(val, torch.Tensor):
            return f"%{a.name}: {val.dtype} {tuple(val.shape)}"
        return f"%{a.name}"
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_describe_arg(x, p) for x in a) + "]"
    return repr(a)
