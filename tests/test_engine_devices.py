"""Where the FX side runs: on the device of the user's inputs, whatever device the program was
exported on. (The CUDA tests run where a GPU is: ``benchmarks/cuda_check.py`` covers more models.)"""

from __future__ import annotations

import copy
import subprocess
import sys

import pandas as pd
import pytest
import torch
from engine_models import exported, node_named
from torch.utils._pytree import tree_map_only

import sbs_widget
from sbs_widget.engine.entry import prepare
from sbs_widget.engine.summary import summarize
from sbs_widget.samples import faults

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _to(device, value):
    """``value`` (nested args / kwargs) with every tensor on ``device``."""
    return tree_map_only(torch.Tensor, lambda t: t.to(device), value)


# The CPU case runs everywhere (CI included), the CUDA one where a GPU is.
DEVICES = pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_cuda)])


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


@needs_cuda
@pytest.mark.parametrize("name", ["dummy_llm", "llama"])
def test_inputs_on_cuda_run_the_program_there(name):
    ep, prog, args, kwargs = exported(name, False)
    prepared = prepare(ep, prog.model_proto)
    on_cpu = list(prepared.run(args, kwargs))
    torch.cuda.reset_peak_memory_stats()
    on_cuda = list(prepared.run(_to("cuda", args), _to("cuda", kwargs)))
    assert torch.cuda.max_memory_allocated() > 0  # the FX side ran on the GPU
    _clean(on_cuda)
    assert [(r.ep_name, r.onnx_name, r.status) for r in on_cuda] == \
        [(r.ep_name, r.onnx_name, r.status) for r in on_cpu]
    # a reset experiment on CUDA inputs: the torch value (on the GPU) feeds the ONNX side
    target = next(r for r in on_cuda if r.kind == "node" and r.status == "ok" and r.onnx_op_type == "Add")
    reset = list(sbs_widget.run_aligned(ep, prog.model_proto, _to("cuda", args), _to("cuda", kwargs),
                                        reset_names=[target.ep_name]))
    assert next(r for r in reset if r.ep_name == target.ep_name and r.kind == "node").status == "reset"


@DEVICES
def test_culprits_repro_and_suggested_resets_on_the_inputs_device(tmp_path, device):
    ep, prog, args, kwargs = exported("dummy_llm", True)
    node = node_named(prog.model_proto, "Add", -1)
    p = prepare(ep, faults.replace_op(prog.model_proto, node.name, "Sub"))
    c = sbs_widget.culprits(p, None, _to(device, args), _to(device, kwargs))[0]
    assert c.onnx_node == node.name == sbs_widget.culprits(p, None, args, kwargs)[0].onnx_node
    bundle = sbs_widget.export_repro(p, _to(device, args), c, str(tmp_path / "b"), kwargs=_to(device, kwargs))
    assert c.err_local > 1e-3 and abs(bundle.err_abs - c.err_local) <= 0.1 * c.err_local
    saved = torch.load(tmp_path / "b" / "inputs.pt", weights_only=True)  # readable without a GPU
    assert all(v.device.type == "cpu" for v in saved.values())
    s = sbs_widget.suggest_resets(p, _to(device, args), kwargs=_to(device, kwargs))
    assert s.fixed and s.names


@DEVICES
def test_steal_forward_and_compare_dump_on_the_models_device(tmp_path, device):
    model, inputs = sbs_widget.dummy_llm()
    torch.onnx.export(model, inputs, tmp_path / "model.onnx", dynamo=True, verbose=False)
    model, inputs = model.to(device), _to(device, inputs)
    with sbs_widget.steal_forward([model, model.decoder], dump_file=tmp_path / "dump.onnx"):
        expected = model(*inputs)
    restored = sbs_widget.load_dump(tmp_path / "dump.onnx")
    outputs = [v for k, v in restored.items() if k[2] == "O"]
    assert len(outputs) == 2 and torch.equal(outputs[-1], expected.cpu())  # the model's, stored last
    records = list(sbs_widget.compare_dump(tmp_path / "dump.onnx", tmp_path / "model.onnx"))
    assert records and all(r.status in ("ok", "one-sided") for r in records)


@DEVICES
def test_cli_compare_with_an_inputs_file_saved_on_the_device(tmp_path, device):
    ep, prog, args, kwargs = exported("dummy_llm", False)
    torch.export.save(ep, tmp_path / "model.pt2")
    prog.save(str(tmp_path / "model.onnx"))
    torch.save(_to(device, args), tmp_path / "inputs.pt")
    res = subprocess.run([sys.executable, "-m", "sbs_widget", "compare", "--ep", tmp_path / "model.pt2",
                          "--onnx", tmp_path / "model.onnx", "--inputs", tmp_path / "inputs.pt",
                          "-o", tmp_path / "out.csv"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    table = pd.read_csv(tmp_path / "out.csv")
    assert (table.status == "error").sum() == 0 and (table.status == "mismatch").sum() == 0
