"""A repro bundle for a deployment fault: the nodes as written that compute the value where the
difference starts, cut out of the model with the values they read, and a ``replay.py`` showing the
difference between onnxruntime's two settings, for a bug report or a fix, without torch or this package.

    folder/subgraph.onnx   the nodes as written from the surviving values (or inputs) they read
    folder/inputs.npz      those values, as the deployed run computed them (they agree with torch)
    folder/replay.py       runs the subgraph as written and as deployed, prints both and the difference
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np
import onnx
from onnx import helper

from sbs_widget.dtypes import numpy_elem_type
from sbs_widget.safe_files import output_folder, output_path, write_text

REPLAY = '''"""Replays a deployment fault found by sbs_widget.check_deployed: the subgraph run with onnxruntime's
optimizations off and with the deployed setting (and with the guilty transformers disabled)."""
import json, os, sys
import numpy as np, onnxruntime as ort

here = os.path.dirname(os.path.abspath(__file__))
setting = json.load(open(os.path.join(here, "setting.json")))
feeds = dict(np.load(os.path.join(here, "inputs.npz")))


def run(level, config=(), disabled=()):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    for key, value in config:
        opts.add_session_config_entry(key, value)
    session = ort.InferenceSession(os.path.join(here, "subgraph.onnx"), opts, providers=setting["providers"],
                                   disabled_optimizers=list(disabled))
    return session.run(None, feeds)[0].astype(np.float64)


def diff(a, b):
    """max |a - b|; NaN on one side only, or infinities that differ, count as inf."""
    d = np.abs(a - b)
    d = np.where(np.isnan(a) & np.isnan(b) | (a == b), 0.0, np.where(np.isnan(d), np.inf, d))
    return float(np.max(d, initial=0.0))


def biggest(a):
    finite = np.abs(a[np.isfinite(a)])
    return float(finite.max()) if finite.size else float("nan")


written = run("ORT_DISABLE_ALL")
deployed = run(setting["level"], setting["config"])
print(f"as written: max |finite value| {biggest(written):.6g}, non-finite {int((~np.isfinite(written)).sum())}")
print(f"as deployed ({setting['describe']}): max |finite value| {biggest(deployed):.6g}, "
      f"non-finite {int((~np.isfinite(deployed)).sum())}")
print(f"max |as deployed - as written| = {diff(deployed, written):.6g}")
if setting["transformers"]:
    fixed = run(setting["level"], setting["config"], setting["transformers"])
    print(f"as deployed without {', '.join(setting['transformers'])}: max |difference| = {diff(fixed, written):.6g}")
sys.exit(0)
'''


def write_repro(folder, original: onnx.ModelProto, value: str, values: dict[str, np.ndarray], setting,
                transformers: list[str]) -> str | None:
    """Write the bundle for ``value`` (a value as written) into ``folder``; ``values``: the graph inputs
    and surviving values, by their names as written. None when the subgraph cannot be cut (a value it
    reads is neither an input, a weight, nor a surviving value)."""
    graph = original.graph
    producer = {o: n for n in graph.node for o in n.output}
    weights = {t.name: t for t in graph.initializer}
    nodes, reads, seen = [], [], set()
    stack = [value]
    while stack:  # back from the value to the surviving values, inputs and weights it comes from
        v = stack.pop()
        if v in seen or not v:
            continue
        seen.add(v)
        if v != value and (v in values or v in weights):
            reads.append(v)
            continue
        node = producer.get(v)
        if node is None:
            return None
        if all(node is not n for n in nodes):
            nodes.append(node)
            stack.extend(node.input)
    order = {id(n): i for i, n in enumerate(graph.node)}
    nodes.sort(key=lambda n: order[id(n)])
    fed = [r for r in reads if r not in weights]
    inputs = [helper.make_tensor_value_info(r, numpy_elem_type(values[r]), list(values[r].shape)) for r in fed]
    sub = helper.make_graph(nodes, "repro", inputs, [onnx.ValueInfoProto(name=value)],
                            initializer=[weights[r] for r in reads if r in weights])
    model = helper.make_model(sub, opset_imports=list(original.opset_import), ir_version=original.ir_version)
    model.functions.extend(original.functions)
    out = pathlib.Path(output_folder(folder))
    # each file written aside, then renamed over its name: a link planted there is replaced, never followed
    with output_path(out / "subgraph.onnx") as tmp:
        onnx.save_model(model, tmp)
    with output_path(out / "inputs.npz") as tmp:
        np.savez(tmp, **{r: values[r] for r in fed})
    write_text(out / "setting.json", json.dumps(
        {"level": setting.level, "config": [list(c) for c in setting.config],
         "providers": list(setting.providers), "transformers": list(transformers),
         "describe": setting.describe(), "value": value, "nodes": [n.name for n in nodes]}, indent=1))
    write_text(out / "replay.py", REPLAY)
    return os.fspath(out)
