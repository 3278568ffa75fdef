"""Module-level comparison: the outputs stolen from each torch module against the ONNX value that ends
that module's scope in an ONNX export.

The exporter (``torch.onnx.export(..., dynamo=True)``) writes ``pkg.torch.onnx.name_scopes`` on every
node, e.g. ``['', 'decoder', 'decoder.attention', 'linear']``; a node belongs to every module listed
before the last element. A module's scope ends with the output of its last node consumed outside it.
The ONNX model runs once, with onnxruntime, with those values added as graph outputs and fed with the
dumped inputs of the top-level module.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import onnx
import torch

from sbs_widget.dtypes import numpy_elem_type, torch_dtype
from sbs_widget.dumps.steal import ForwardStealer, flatten_tensors, load_dump
from sbs_widget.engine.metrics import EMPTY_NOTE, beyond_where, compute_errors, same_shape
from sbs_widget.engine.runtimes import exact_numpy, ort_array, ort_value
from sbs_widget.engine.tolerance import checked, least_precise_float, resolve
from sbs_widget.errors import InputError
from sbs_widget.load.onnx_index import SCOPES_KEY, module_paths
from sbs_widget.records import ERROR, KIND_NODE, KIND_OUTPUT, MISMATCH, OK, ONE_SIDED, Record
from sbs_widget.strings import string_type


def _node_modules(node: onnx.NodeProto) -> list[str]:
    return module_paths(next((p.value for p in node.metadata_props if p.key == SCOPES_KEY), None))


def scope_outputs(model: onnx.ModelProto, path: str) -> list[tuple[int, int, str]]:
    """``(node index, output index, value name)`` of the values leaving module ``path``'s scope, in
    graph order: the last one ends the scope. Empty when no node carries that scope (or ``path`` is the
    root, ``""``: its outputs are the graph's).

    >>> import onnx
    >>> scope_outputs(onnx.ModelProto(), "decoder")
    []
    """
    graph = model.graph
    inside = {i for i, n in enumerate(graph.node) if path in _node_modules(n)}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(graph.node):
        for name in n.input:
            consumers.setdefault(name, []).append(i)
    graph_outputs = {o.name for o in graph.output}
    found = []
    for i in sorted(inside):
        for k, name in enumerate(graph.node[i].output):
            if name and (name in graph_outputs or any(c not in inside for c in consumers.get(name, ()))):
                found.append((i, k, name))
    return found


def _to_ort(t: torch.Tensor):
    import onnxruntime

    return ort_value(onnxruntime, exact_numpy(t))


def _from_ort(value) -> torch.Tensor:
    arr = ort_array(value)
    if arr.dtype.kind != "V":
        return torch.from_numpy(np.array(arr))
    # bfloat16 / float8 (ml_dtypes): torch reads the bits and views them with their type
    bits = torch.from_numpy(arr.view(np.int16 if arr.itemsize == 2 else np.uint8))
    return bits.view(torch_dtype(numpy_elem_type(arr)))


def _run_onnx(model: onnx.ModelProto, feeds: list[torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
    """Run ``model`` once and return ``names`` (intermediate values exposed as extra outputs)."""
    import onnxruntime

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    typed = {v.name: v for v in list(graph.value_info) + list(graph.output) + list(graph.input)}
    present = {o.name for o in graph.output}
    for name in names:
        if name not in present:
            # ORT accepts an untyped output; value_info gives the type when the exporter wrote it.
            graph.output.append(typed[name] if name in typed else onnx.ValueInfoProto(name=name))
            present.add(name)
    inits = {i.name for i in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in inits]
    if len(inputs) != len(feeds):
        raise InputError(f"the ONNX model has {len(inputs)} input(s) {inputs} but the dumped top-level call "
                         f"holds {len(feeds)} tensor(s); dump the module that was exported")
    opts = onnxruntime.SessionOptions()
    # Fusions would hide the intermediate values we ask for.
    opts.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    try:
        sess = onnxruntime.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        out = sess.run_with_ort_values(names, {n: _to_ort(t) for n, t in zip(inputs, feeds)})
    except Exception as e:
        raise InputError(f"onnxruntime could not run the ONNX model on the dumped inputs {inputs}: {e}") from e
    return {n: _from_ort(v) for n, v in zip(names, out)}


def _pick(leaves: list[torch.Tensor], candidates: list[tuple[int, int, str]], shapes: dict) -> list:
    """One candidate (or None) per torch leaf: the last one for a single leaf, else the latest unused
    candidate whose static shape matches (modules returning tuples end their scope with several values)."""
    if len(leaves) == 1:
        return [candidates[-1] if candidates else None]
    chosen, used = [], set()
    for leaf in leaves:
        pick = None
        for c in reversed(candidates):
            if c[2] not in used and shapes.get(c[2]) in (None, tuple(leaf.shape)):
                pick = c
                break
        if pick:
            used.add(pick[2])
        chosen.append(pick)
    return chosen


def _static_shapes(model: onnx.ModelProto) -> dict[str, tuple | None]:
    shapes = {}
    for v in list(model.graph.value_info) + list(model.graph.output):
        dims = v.type.tensor_type.shape.dim
        shapes[v.name] = tuple(d.dim_value for d in dims) if all(d.HasField("dim_value") for d in dims) else None
    return shapes


def compare_dump(dump, onx, *, atol: float | None = None, rtol: float | None = None, root_iteration: int = 0,
                 scopes: dict[str, str] | None = None) -> Iterator[Record]:
    """Compare each stolen module output with the ONNX value that ends the module's scope.

    ``dump``: a dump file (``steal_forward(..., dump_file=...)``), ``load_dump``'s dict or the
    ``steal_forward`` object itself; ``onx``: an ONNX model or its path, exported by
    ``torch.onnx.export(..., dynamo=True)``. The first call in the
    dump is the top-level module; its call ``root_iteration`` feeds the ONNX inputs (tensors by position)
    and the modules called within it are compared. Names are module paths (``decoder.attention``) unless
    ``scopes`` maps a name to one. ``atol``/``rtol``: ``None`` for the default of the least precise
    floating type in the dump (``tolerance.py``). Records come in the order modules return (inner before outer), so the
    first mismatch is where the difference starts.

    >>> import os, tempfile, torch, sbs_widget
    >>> model, inputs = sbs_widget.dummy_llm()
    >>> d = tempfile.mkdtemp()
    >>> with sbs_widget.steal_forward([model, model.decoder], dump_file=f"{d}/dump.onnx"):
    ...     _ = model(*inputs)
    >>> _ = torch.onnx.export(model, inputs, f"{d}/m.onnx", dynamo=True, verbose=False)  # doctest: +SKIP
    >>> [r.status for r in compare_dump(f"{d}/dump.onnx", f"{d}/m.onnx")]  # doctest: +SKIP
    ['ok', 'ok']
    """
    atol, rtol = checked(atol, rtol)  # before reading anything; resolve below only runs for a None
    if isinstance(dump, ForwardStealer):
        dump = dump.storage
    elif not isinstance(dump, dict):
        dump = load_dump(dump)
    from sbs_widget.load.readers import load_onnx_model  # checked as any model file is (load/onnx_checks.py)

    onx = load_onnx_model(onx)
    keys = list(dump)
    if not keys:
        raise InputError("the dump is empty: nothing was stolen")
    root = next(k[0] for k in keys if k[2] == "I")
    start, end = (root, root_iteration, "I"), (root, root_iteration, "O")
    if start not in dump or end not in dump:
        raise InputError(f"the dump has no complete call {root}[{root_iteration}] (inputs and outputs)")
    window = keys[keys.index(start): keys.index(end) + 1]
    if atol is None or rtol is None:
        atol, rtol = resolve(atol, rtol, least_precise_float(dump[k] for k in window))
    scopes = dict(scopes or {})
    scopes.setdefault(root, "")
    shapes = _static_shapes(onx)
    producer = {name: (i, k) for i, n in enumerate(onx.graph.node) for k, name in enumerate(n.output)}
    graph_outputs = [(*producer.get(o.name, (None, 0)), o.name) for o in onx.graph.output]

    # Plan every comparison first: the ONNX model then runs once for all of them.
    plan, first_call = [], {}
    for name, it, kind in window:
        if kind != "O":
            continue
        path = scopes.get(name, name)
        leaves = flatten_tensors(dump[name, it, "O"])
        if first_call.setdefault(name, it) != it:
            plan.append((name, it, path, leaves, None, "called again within the same forward; the ONNX "
                                                       "graph holds one scope for all its calls"))
        elif path == "":
            picks = [graph_outputs[i] if i < len(graph_outputs) else None for i in range(len(leaves))]
            plan.append((name, it, path, leaves, picks, ""))
        else:
            cands = scope_outputs(onx, path)
            plan.append((name, it, path, leaves, _pick(leaves, cands, shapes) if cands else None,
                         "" if cands else f"no ONNX node has scope {path!r} (constant-folded, fused or renamed)"))

    needed = {p[2] for *_, picks, _ in plan if picks for p in picks if p}
    inits = {i.name: i for i in onx.graph.initializer if i.name in needed}
    values = _run_onnx(onx, flatten_tensors(dump[start]), sorted(needed - set(inits)))
    # A scope may end on an initializer when the exporter folded the module into a constant.
    values.update({n: torch.from_numpy(onnx.numpy_helper.to_array(i).copy()) for n, i in inits.items()})
    order = {k[:2]: i for i, k in enumerate(k for k in keys if k[2] == "I")}

    for name, it, path, leaves, picks, comment in plan:
        for j, leaf in enumerate(leaves):
            rec = Record(ep_name=f"{name}[{it}]" + (f":{j}" if len(leaves) > 1 else ""), module=path,
                         ep_id_node=order.get((name, it)), ep_shape_type=string_type(leaf),
                         kind=KIND_OUTPUT if path == "" else KIND_NODE, comment=comment)
            pick = picks[j] if picks else None
            if pick is None:
                rec.status = ONE_SIDED
                rec.comment = comment or "no ONNX value of this shape leaves the scope"
                yield rec
                continue
            node_index, out_index, onnx_name = pick
            rec.onnx_name, rec.onnx_id_output = onnx_name, out_index
            if node_index is not None:
                node = onx.graph.node[node_index]
                rec.onnx_id_node, rec.onnx_op_type, rec.onnx_node_name = node_index, node.op_type, node.name
            got = values.get(onnx_name)
            if got is None:
                rec.status, rec.comment = ERROR, f"onnxruntime returned no value for {onnx_name!r}"
                yield rec
                continue
            rec.onnx_shape_type = string_type(got)
            if not same_shape(leaf, got):
                rec.status, rec.comment = MISMATCH, f"shapes differ: {rec.ep_shape_type} vs {rec.onnx_shape_type}"
                yield rec
                continue
            err = compute_errors(leaf, got, atol=atol, rtol=rtol, histogram=True)
            for field in ("err_abs", "err_rel", "err_dev", "err_nan", "err_h01", "err_h001", "n_elements",
                          "within_tolerance", "histogram"):
                setattr(rec, field, getattr(err, field))
            rec.status = OK if err.within_tolerance else MISMATCH
            if not err.n_elements:  # "ok" over nothing: said so
                rec.comment = "; ".join(filter(None, (rec.comment, EMPTY_NOTE)))
            if not err.within_tolerance:
                rec.err_where = beyond_where(leaf, got, atol=atol, rtol=rtol)
            yield rec

