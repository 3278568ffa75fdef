"""Where, inside the deployed graph, the difference starts: the values that survive optimization
(the optimized graph still computes a value of the graph as written, under the exporter's name)
compared with their FX twins, and the first beyond tolerance and beyond rounding named with the node
of the optimized graph that computes it (a fused node, as a rule) and the nodes as written it stands for.

One session: the deployed graph (saved by onnxruntime at the deployed setting) run with optimizations
off and every surviving value as an output, under the deployed config entries and providers.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import onnx

from sbs_widget.deployed.result import Location, output_errors, rounding
from sbs_widget.deployed.sessions import SessionFailed
from sbs_widget.deployed.settings import CPU, INSERTED
from sbs_widget.dtypes import NO_NUMPY_DTYPES, numpy_dtype, onnx_elem_type


def locate(sessions, setting, deployed_path: str | None, original: onnx.ModelProto, onnx_to_fx: dict[str, str],
           torch_of, references_of, atol: float, rtol: float) -> tuple[Location | None, dict[str, np.ndarray]]:
    """(where the deployed run starts to differ, the surviving values as deployed) or (None, {}) when
    the deployed graph cannot be read or run again. ``torch_of(fx names) -> {name: tensor}``,
    ``references_of(fx names) -> {name: float64 tensor}``."""
    if not deployed_path or not os.path.exists(deployed_path):
        return None, {}
    deployed = onnx.load(deployed_path)
    producers = {o: n for n in deployed.graph.node for o in n.output}
    outputs = {o.name for o in deployed.graph.output}
    # a deployed value -> the value as written it is (the same, or its copy in the type the provider
    # computes in: InsertedPrecisionFreeCast_<name>)
    as_written: dict[str, str] = {}
    for n in deployed.graph.node:
        for o in n.output:
            name = o[len(INSERTED):] if o.startswith(INSERTED) and o not in onnx_to_fx else o
            if name in onnx_to_fx and name not in as_written.values():
                as_written[o] = name
    survivors = list(as_written)
    kept = set(as_written.values())
    stored = _inputs_of(original)  # inputs and weights are not computed: they cannot vanish
    vanished = sorted(v for v in onnx_to_fx if v not in kept and v not in stored)
    new_weights = _inputs_of(deployed) - stored
    if not survivors:
        return Location(None, None, None, None, 0.0, [], len(survivors), len(vanished), vanished[:20],
                        "no value of the graph as written survives in the deployed graph"), {}
    for name in survivors:
        if name not in outputs:
            deployed.graph.output.append(onnx.ValueInfoProto(name=name))
    path = os.path.join(sessions.folder, "deployed_with_survivors.onnx")
    onnx.save_model(deployed, path)
    del deployed
    # optimizations off: the saved graph is already the deployed one; the config entries still apply
    again = dataclasses.replace(setting, level="ORT_DISABLE_ALL", disabled=(),
                                providers=setting.providers if CPU in setting.providers else (CPU,))
    try:
        values, _ = sessions.run(again, model_path=path)
    except SessionFailed:
        return None, {}
    names = [o.name for o in onnx.load(path, load_external_data=False).graph.output]
    got = dict(zip(names, values))
    wanted = [onnx_to_fx[as_written[s]] for s in survivors]
    expected = torch_of(set(wanted))
    errors = output_errors(survivors, [expected[f] for f in wanted], [got[s] for s in survivors], atol, rtol)
    beyond = [i for i, e in enumerate(errors) if e.ratio > 1.0]
    exact = references_of(list(dict.fromkeys(wanted[i] for i in beyond))) if beyond else {}
    for i in beyond:
        if exact.get(wanted[i]) is not None:
            errors[i].noise = rounding(expected[wanted[i]], got[survivors[i]], exact[wanted[i]])
    first = next((e for e in errors if e.ratio > 1.0 and not e.noise), None)
    got = {as_written[d]: _as_torch_type(got[d], expected[f]) for d, f in zip(survivors, wanted)}
    if first is None:
        return Location(None, None, None, None, 0.0, [], len(survivors), len(vanished), vanished[:20],
                        "every surviving value agrees with torch: the difference is in values that vanished "
                        "into fused nodes"), got
    node = producers[first.name]
    while node.name.startswith(INSERTED) and node.input and node.input[0] in producers:
        node = producers[node.input[0]]  # a cast the provider needed: the node it converts computed it
    agree = [i for i in node.input if _stripped(i) in got and not any(
        e.name == i and e.ratio > 1.0 and not e.noise for e in errors)]
    made = [_stripped(i) for i in node.input if _stripped(i) in new_weights]
    reads = f"; it reads initializers the optimizer made: {', '.join(made[:4])}" if made else ""
    return Location(as_written[first.name], onnx_to_fx[as_written[first.name]], node.name, node.op_type, first.ratio,
                    list(node.input), len(survivors), len(vanished), vanished[:20],
                    f"the first surviving value beyond tolerance and rounding ({first.ratio:.3g} x tolerance); "
                    f"{len(agree)} of its {len(node.input)} inputs are surviving values that agree{reads}"), got


def _as_torch_type(array: np.ndarray, t) -> np.ndarray:
    """A value the provider computed in another type (float32 for float16) back in torch's type."""
    code = onnx_elem_type(t.dtype)
    want = numpy_dtype(code) if code is not None and t.dtype not in NO_NUMPY_DTYPES else None
    return array.astype(want) if want is not None and array.dtype.kind == "f" and array.dtype != want else array


def _stripped(name: str) -> str:
    return name[len(INSERTED):] if name.startswith(INSERTED) else name


def _inputs_of(model: onnx.ModelProto) -> set[str]:
    return {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer}
