"""A decoder exported with its KV cache and dynamic lengths (issue 50): one program for prefill and
decode steps, compared from the objects and from saved ``.pt2`` / ``.onnx`` files.

Saved and loaded, the program used to be decomposed into other node names than the exporter's:
sbs_widget's reader dropped the program's guards (Python source, never run as it is written in the
file), and the exporter's decomposition traces them, numbering its nodes after them. Only guards of a
strict grammar are kept now. The shared dynamic sizes (the batch of every input, the past length of
each cache tensor) are then read from the inputs the exporter read them from (``size_sources``).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import sbs_widget  # noqa: E402
from sbs_widget.engine.entry import _metadata_agreement, prepare  # noqa: E402
from sbs_widget.load.guards import is_safe_guard  # noqa: E402
from sbs_widget.load.readers import load_exported_program  # noqa: E402
from sbs_widget.samples.decoders import (  # noqa: E402
    cache_pairs,
    decode_step_kwargs,
    export_with_cache,
    input_names,
    output_names,
)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    ep, prog, prefill = export_with_cache("llama", layers=2, hidden=64, seed=0)
    folder = tmp_path_factory.mktemp("decoder")
    pt2, onx = str(folder / "llama.pt2"), str(folder / "llama.onnx")
    torch.export.save(ep, pt2)
    prog.save(onx)
    return ep, prog, prefill, pt2, onx


def _clean(records):
    statuses = {r.status for r in records}
    assert statuses <= {"ok", "one-sided"}, [(r.ep_name, r.onnx_name, r.status, r.comment) for r in records
                                            if r.status not in ("ok", "one-sided")][:5]
    outputs = [r for r in records if r.kind == "output"]
    assert len(outputs) == 5 and all(r.status == "ok" for r in outputs)
    return records


def test_inputs_and_outputs_as_the_onnx_model_names_them(llama):
    ep, prog, prefill, _, _ = llama
    assert input_names(prog) == ["input_ids", "attention_mask", "cache_0", "cache_1", "cache_2", "cache_3"]
    # the logits, then the present keys and values (layer 0 keys, values, layer 1 ...), named after FX nodes
    outputs = output_names(prog)
    assert len(outputs) == 5 and outputs[0].startswith("linear") and all(o.startswith("cat") for o in outputs[1:])
    assert [k.shape[2] for k, _ in cache_pairs(prefill["cache"])] == [0, 0]  # a prefill: no past
    step = decode_step_kwargs(prefill, past=8)
    assert step["input_ids"].shape == (2, 1) and step["attention_mask"].shape == (2, 9)
    assert all(k.shape == v.shape == (2, 2, 8, 16) for k, v in cache_pairs(step["cache"]))


def test_prepare_from_files_names_nodes_as_the_exporter(llama):
    """The saved program, decomposed, has the exporter's node names (it used to have 63 of 140)."""
    ep, prog, prefill, pt2, onx = llama
    loaded = load_exported_program(pt2)
    assert loaded._guards_code and loaded._guards_code == ep._guards_code  # torch's own guards: all kept
    for pair in (prepare(ep, prog.model_proto).pair, prepare(pt2, onx).pair):
        ok, total = _metadata_agreement(pair.decomposed_ep, pair.index)
        assert total > 100 and ok == total, (ok, total)
        assert not pair.program_mismatch


@pytest.mark.parametrize("source", ["objects", "files"])
@pytest.mark.parametrize("step", ["prefill", "decode"])
def test_no_mismatch_prefill_and_decode(llama, source, step):
    ep, prog, prefill, pt2, onx = llama
    kwargs = prefill if step == "prefill" else decode_step_kwargs(prefill, past=8, new_tokens=1)
    pair = (ep, prog.model_proto) if source == "objects" else (pt2, onx)
    records = _clean(list(sbs_widget.run_aligned(*pair, (), kwargs)))
    assert sum(r.status == "ok" and r.kind == "node" for r in records) > 100


def test_files_and_objects_give_the_same_records(llama):
    ep, prog, prefill, pt2, onx = llama
    kwargs = decode_step_kwargs(prefill, past=8)
    a = [(r.ep_name, r.onnx_name, r.status) for r in sbs_widget.run_aligned(ep, prog.model_proto, (), kwargs)]
    b = [(r.ep_name, r.onnx_name, r.status) for r in sbs_widget.run_aligned(pt2, onx, (), kwargs)]
    assert a == b


@pytest.mark.parametrize("guard", [
    "L['input_ids'].size()[1] + L['cache'][0].size()[2] + ((-1)*L['attention_mask'].size()[1]) <= 0",
    "min(16*L['input_ids'].size()[1], 32*L['cache'][1].size()[2]) == (16*L['input_ids'].size()[1])",
    "L['input_ids'].size()[0] // 2 == 1 and L['input_ids'].size()[1] % 3 != 0",
])
def test_torch_guards_are_kept(guard):
    assert is_safe_guard(guard, frozenset({"input_ids", "attention_mask", "cache"}))


@pytest.mark.parametrize("guard", [
    "__import__('os').mkdir('x')",
    "L['input_ids'].size()[0] == 2 # comment",
    "L['input_ids'].size()[0] == 2, \"\"); __import__('os')",
    "L['input_ids'].__class__",
    "L['input_ids'].size()[0] ** 1000 == 1",
    "L['input_ids'].size()[0] == (lambda: 1)()",
    "L['other'].size()[0] == 1",
    "L['input_ids'].size()[0] == len('abc')",
    "torch.ops.aten.sym_size(L['input_ids'], 0) == 1",
    "L['input_ids'].size()[0] == 1\nimport os",
    "math.__dict__ == 1",
    123,
])
def test_other_guards_are_dropped(guard):
    assert not is_safe_guard(guard, frozenset({"input_ids"}))
