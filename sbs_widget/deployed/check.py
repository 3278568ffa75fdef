"""``check_deployed``: the whole ONNX model run as written (optimizations off) and as deployed
(the user's level, config entries and providers), both against torch, and, when the deployed run is
worse, the setting that makes it so, found in a logarithmic number of whole-model sessions.

Attribution, each step one session (``attribute.py``):
1. providers: the deployed setting on CPU alone; if that fixes it, each other provider against CPU;
2. session config entries: the deployed setting without them; if that fixes it, the smallest set of
   entries, by bisection;
3. optimizer: the first level (BASIC, EXTENDED, LAYOUT, ALL) showing the difference, by bisection,
   then the smallest set of that level's transformers whose disabling removes it (bisection over the
   candidates, the transformers the optimized graph shows first).

>>> import torch, sbs_widget
>>> model, inputs = sbs_widget.dummy_llm()
>>> ep = torch.export.export(model, inputs)
>>> onx = torch.onnx.export(ep, inputs, dynamo=True).model_proto    # doctest: +SKIP
>>> sbs_widget.check_deployed(ep, onx, inputs).verdict             # doctest: +SKIP
'same'
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from sbs_widget.align.fx_graph import program_outputs
from sbs_widget.deployed.attribute import Attribution
from sbs_widget.deployed.locate import locate
from sbs_widget.deployed.repro import write_repro
from sbs_widget.deployed.result import DeployedResult, Step, output_errors, worse, wrong_as_written
from sbs_widget.deployed.sessions import SessionFailed, Sessions
from sbs_widget.deployed.settings import AS_WRITTEN, deployment
from sbs_widget.engine.entry import prepare
from sbs_widget.engine.fx_runner import check_inputs, flat_inputs, torch_values
from sbs_widget.engine.reference import NoReference, program_reference
from sbs_widget.engine.runtimes import exact_numpy
from sbs_widget.errors import ModelMismatchError
from sbs_widget.load.readers import load_inputs

if TYPE_CHECKING:
    from sbs_widget.engine.entry import Prepared


def check_deployed(ep, onx, args=(), kwargs=None, *, session_options=None, providers=None,
                   atol: float | None = None, rtol: float | None = None, localize: bool = True,
                   timeout: float | None = None, repro=None) -> DeployedResult:
    """Run the whole ONNX model as written and as deployed, compare both with torch, and name what
    makes the deployed run worse.

    - ``ep``/``onx``/``args``/``kwargs``: as for ``run_aligned`` (``args`` may be a path to inputs).
    - ``session_options``: an ``onnxruntime.SessionOptions`` (its level, attributes and the config
      entries onnxruntime lets one read back: see ``settings.KNOWN_CONFIG``), a dict
      ``{"level": "all", "config": {KEY: VALUE}, "intra_op_num_threads": N}``, or None for
      onnxruntime's defaults (ORT_ENABLE_ALL); ``providers``: names (default CPU).
    - ``atol``/``rtol``: the lockstep's defaults for the program's precision when None.
    - ``localize``: name the nodes the guilty transformer created (reads the optimized graphs).
    - ``timeout``: seconds one session may take.
    - ``repro``: a folder; when the deployment is at fault and the start is located, a repro bundle is
      written there (``repro.py``: the subgraph as written, its inputs, ``replay.py``).

    Verdicts: ``same`` (the deployed run is not farther from torch than the rule in ``result.RULE``
    allows), ``export`` (the as-written run is already beyond tolerance: use ``run_aligned``),
    ``provider``, ``session-option``, ``optimizer``. Each session runs in a fresh process: some
    settings (denormals as zero) are process state in onnxruntime.
    """
    start = time.perf_counter()
    prepared = prepare(ep, onx)
    atol, rtol = prepared.tolerance(atol, rtol)
    setting = deployment(session_options, providers)
    feeds, expected, flat = _torch_side(prepared, args, kwargs)
    references = _float64_outputs(prepared, flat)
    names = list(prepared.index.outputs)
    if len(expected) != len(names):
        raise ModelMismatchError(f"torch returned {len(expected)} outputs and the ONNX model has {len(names)} "
                                 f"({names[:5]}): export the ONNX model from this program")
    # (every weight's bytes: a path's big weights otherwise stay in the file, referenced from where it lies)
    sessions = Sessions(prepared.index.full_model(), feeds, timeout)
    try:
        written_out, _ = sessions.run(AS_WRITTEN)
        written = output_errors(names, expected, written_out, atol, rtol, references)

        def errors_of(s, save=False):
            """(errors, optimized model path) of one session; a failed session is infinitely far."""
            try:
                out, optimized = sessions.run(s, save_optimized=save)
            except SessionFailed as e:
                return output_errors(names, expected, [np.full(1, np.nan)] * len(names), atol, rtol), None, str(e)
            return output_errors(names, expected, out, atol, rtol, references), optimized, ""

        deployed, deployed_model, failure = errors_of(setting, save=True)
        result = DeployedResult(verdict="same", deployed=setting.describe(), written_errors=written,
                                deployed_errors=deployed, sessions=0, atol=atol, rtol=rtol)
        if wrong_as_written(written):
            result.verdict = "export"
        elif worse(deployed, written):
            attribution = Attribution(setting, written, errors_of, deployed_model, failure, sessions.model_path)
            result.cause, result.steps, result.fused = attribution.run(localize)
            result.verdict = result.cause.kind
            if localize and result.verdict != "provider":
                values = _locate(result, sessions, attribution.guilty_setting, attribution.guilty_model,
                                 prepared, args, kwargs, flat, atol, rtol)
                if repro is not None and result.located is not None and result.located.value is not None:
                    result.repro = write_repro(repro, prepared.index.full_model(), result.located.value,
                                               {**feeds, **values}, attribution.guilty_setting,
                                               result.cause.transformers)
        result.sessions = sessions.count
    finally:
        sessions.close()
    result.seconds = time.perf_counter() - start
    return result


def _locate(result, sessions, setting, deployed_model, prepared: Prepared, args, kwargs, flat, atol, rtol) -> dict:
    """Fill ``result.located``: one more session, counted as a step; returns the surviving values as
    deployed, by their names as written."""
    def torch_of(names):
        return torch_values(prepared.decomposed_ep, args, kwargs, names)

    def references_of(names):
        try:
            return program_reference(prepared.decomposed_ep, flat, prepared.fx_last_use, names, prepared.weight_files)
        except NoReference:
            return {}

    located, values = locate(sessions, setting, deployed_model, prepared.onnx_model, prepared.alignment.onnx_to_fx,
                        torch_of, references_of, atol, rtol)
    if located is not None:
        result.located = located
        result.steps.append(Step(f"localize: the deployed graph with its {located.survivors} surviving values as "
                                 "outputs", setting.describe(), located.value is not None, located.ratio))
    return values


def _float64_outputs(prepared: Prepared, flat: list):
    """A callable giving the program's outputs run in float64 (computed once, on first need; a
    program without a float64 counterpart gives no reference: then the tolerance rule alone judges)."""
    cache: list = []

    def references() -> list:
        if not cache:
            outputs = program_outputs(prepared.decomposed_ep)
            names = [o.name if isinstance(o, torch.fx.Node) else None for o in outputs]
            try:
                values = program_reference(prepared.decomposed_ep, flat, prepared.fx_last_use,
                                           [n for n in names if n], prepared.weight_files)
            except NoReference:
                values = {}
            cache.append([values.get(n) if n else None for n in names])
        return cache[0]

    return references


def _torch_side(prepared: Prepared, args, kwargs) -> tuple[dict[str, np.ndarray], list[torch.Tensor], list]:
    """The ONNX feeds (the program's tensor inputs, as the lockstep pairs them) and torch's outputs,
    flattened as the exporter flattens them (no None, no mutated buffers)."""
    args, kwargs = load_inputs(args, kwargs)
    program = prepared.decomposed_ep
    flat = flat_inputs(program, args, kwargs)
    check_inputs(program, flat)
    by_name = {n.name: v for n, v in zip((n for n in program.graph.nodes if n.op == "placeholder"), flat)}
    tensor_inputs, onnx_inputs = prepared.alignment.tensor_inputs, prepared.index.inputs
    if len(tensor_inputs) != len(onnx_inputs):
        raise ModelMismatchError(f"the ONNX model has {len(onnx_inputs)} inputs {onnx_inputs} but the program "
                                 f"{len(tensor_inputs)} tensor inputs: they do not come from the same export")
    feeds = {o: exact_numpy(by_name[fx]) for fx, o in zip(tensor_inputs, onnx_inputs)}
    with torch.no_grad():
        out = torch.fx.Interpreter(program.graph_module).run(*flat)
    n = len(program_outputs(program))
    values = out if isinstance(out, (tuple, list)) else [out]
    specs = program.graph_signature.output_specs
    if len(values) == len(specs):
        user = torch.export.graph_signature.OutputKind.USER_OUTPUT
        values = [v for v, spec in zip(values, specs) if spec.kind == user]
    tensors = [v for v in torch.utils._pytree.tree_leaves(values) if v is not None]
    return feeds, tensors[:n] if len(tensors) >= n else tensors, flat
