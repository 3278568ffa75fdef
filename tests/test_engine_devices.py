"""Where the FX side runs: on the device of the user's inputs, whatever device the program was
exported on. (The CUDA tests run where a GPU is: ``benchmarks/cuda_check.py`` covers more models.)"""

from __future__ import annotations

import copy

import pytest
import torch

import sbs_widget
from sbs_widget.engine import prepare
from sbs_widget.summary import summarize

from engine_models import exported


def _clean(records) -> None:
    s = summarize(records)
    failed = [(r.ep_name, r.comment) for r in records if r.status == "error"]
    assert not failed, failed[:3]
    assert s.by_status.get("mismatch", 0) == 0


def _devices_in_graph(program) -> set:
    return {v for n in program.graph.nodes for v in list(n.args) + list(n.kwargs.values())
            if isinstance(v, torch.device)}


def test_device_arguments_follow_the_inputs_device():
    """A program exported on one device names it in nodes such as ``arange(..., device=...)``; run on
    inputs from another, those nodes must create their tensors on the inputs' device. A program
    exported on an accelerator is stood in for by renaming the device of every such node (CI has no
    GPU): without the mapping, the position ids land on that device and the embedding fails."""
    ep, prog, args, kwargs = exported("dummy_llm", False)
    decomposed = copy.deepcopy(prog.exported_program)
    elsewhere = torch.device("meta")
    changed = 0
    for node in decomposed.graph.nodes:
        if node.op == "call_function" and isinstance(node.kwargs.get("device"), torch.device):
            node.kwargs = {**node.kwargs, "device": elsewhere}
            changed += 1
    assert changed and _devices_in_graph(decomposed) == {elsewhere}
    prepared = prepare(decomposed, prog.model_proto)
    records = list(prepared.run(args, kwargs))
    _clean(records)
    assert summarize(records, prepared).coverage == 1.0
    # the program itself is left as it was
    assert _devices_in_graph(decomposed) == {elsewhere}


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _to_cuda(value):
    if isinstance(value, torch.Tensor):
        return value.cuda()
    if isinstance(value, (tuple, list)):
        return type(value)(_to_cuda(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_cuda(v) for k, v in value.items()}
    return value


@needs_cuda
@pytest.mark.parametrize("name", ["dummy_llm", "llama"])
def test_inputs_on_cuda_run_the_program_there(name):
    ep, prog, args, kwargs = exported(name, False)
    prepared = prepare(ep, prog.model_proto)
    on_cpu = list(prepared.run(args, kwargs))
    torch.cuda.reset_peak_memory_stats()
    on_cuda = list(prepared.run(_to_cuda(args), _to_cuda(kwargs)))
    assert torch.cuda.max_memory_allocated() > 0  # the FX side ran on the GPU
    _clean(on_cuda)
    assert [(r.ep_name, r.onnx_name, r.status) for r in on_cuda] == \
        [(r.ep_name, r.onnx_name, r.status) for r in on_cpu]
    # a reset experiment on CUDA inputs: the torch value (on the GPU) feeds the ONNX side
    target = next(r for r in on_cuda if r.kind == "node" and r.status == "ok" and r.onnx_op_type == "Add")
    reset = list(sbs_widget.run_aligned(ep, prog.model_proto, _to_cuda(args), _to_cuda(kwargs),
                                        reset_names=[target.ep_name]))
    assert next(r for r in reset if r.ep_name == target.ep_name and r.kind == "node").status == "reset"
