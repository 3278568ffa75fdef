"""Decode steps (issue 50): greedy decoding driven on both sides from one prepared pair; the first
diverging step in the closed and the open loop, and the culprit at that step. Real exports, real
onnxruntime."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from sbs_widget.engine.entry import prepare
from sbs_widget.errors import InputError
from sbs_widget.samples import zoo
from sbs_widget.samples.decode_faults import mask_beyond
from sbs_widget.steps.decode import decode
from sbs_widget.steps.mapping import StepMapping, infer_mapping, next_inputs


@functools.lru_cache(maxsize=None)
def _llama_without_cache():
    """A LLaMA exported with a dynamic batch and sequence, no cache: the whole sequence each step."""
    ep, prog, args, kwargs = zoo.export("llama", optimize=True, dynamic=True)
    return ep, prog.model_proto, args, kwargs


def test_a_clean_export_agrees_at_every_step():
    ep, model, args, kwargs = _llama_without_cache()
    steps = []
    gen = decode(prepare(ep, model), args, kwargs, steps=6, progress=lambda done, total: steps.append((done, total)))
    assert gen.mapping == StepMapping(ids="input_ids", logits=0, mask="attention_mask")
    assert gen.first_divergence == {"closed_loop": None, "open_loop": None}
    assert [s.step for s in gen.steps] == list(range(7)) and steps[-1] == (7, 7)
    assert all(s.open.within_tolerance and s.open.token_agreement == 1.0 and s.closed is not None for s in gen.steps)
    assert [s.length for s in gen.steps] == list(range(16, 23))
    assert gen.steps[3].torch_tokens == gen.steps[3].closed.tokens
    args3, kwargs3 = gen.kwargs_at(3)
    assert args3[0].shape == (2, 19) and kwargs3["attention_mask"].shape == (2, 19)
    frame = gen.to_dataframe()
    assert len(frame) == 14 and {"step", "loop", "max_abs", "cosine", "top5", "token_agreement", "diverges"} <= \
        set(frame.columns)
    records, culprits = gen.lockstep(4)
    assert records and not [r for r in records if r.status == "mismatch"] and not culprits


def test_a_mask_wrong_past_the_prompt_diverges_at_the_first_generated_token():
    """The single forward call on the prompt agrees; from the first generated token on, the mask hides
    it: both loops diverge at step 1, and the lockstep at that step names the node reading the mask."""
    ep, model, args, kwargs = _llama_without_cache()
    bad, edited = mask_beyond(model, length=args[0].shape[1])
    p = prepare(ep, bad)
    gen = decode(p, args, kwargs, steps=3)
    assert gen.first_divergence == {"closed_loop": 1, "open_loop": 1}
    step1 = gen.steps[1].open
    assert not step1.within_tolerance and step1.noise is False and step1.tie is not True
    assert gen.steps[2].closed is None or not gen.steps[1].closed.token_agreement == 1.0
    _, culprits = gen.lockstep(1)
    assert culprits
    group = p.group(culprits[0].onnx_name)
    names = {p.index.nodes[i].name for i in group.nodes} if group is not None else {culprits[0].onnx_node}
    assert names & set(edited), (culprits[0], names)


def test_the_cli_reports_the_first_diverging_step_and_its_culprits(tmp_path, capsys):
    from sbs_widget.cli.main import main

    ep, model, args, kwargs = _llama_without_cache()
    bad, _ = mask_beyond(model, length=args[0].shape[1])
    import onnx

    torch.export.save(ep, tmp_path / "m.pt2")
    onnx.save(bad, tmp_path / "m.onnx")
    torch.save({"input_ids": args[0], **kwargs}, tmp_path / "prompt.pt")
    code = main(["generate", "--ep", str(tmp_path / "m.pt2"), "--onnx", str(tmp_path / "m.onnx"), "--inputs",
                 str(tmp_path / "prompt.pt"), "--steps", "2", "--json", "-o", str(tmp_path / "steps.csv")])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["first_divergence"] == {"closed_loop": 1, "open_loop": 1}
    assert out["culprits"] and all(c["step"] == 1 and c["onnx_node"] for c in out["culprits"])
    assert len(out["steps"]) == 3 and (tmp_path / "steps.csv").read_text().startswith("step,loop")


def test_the_mapping_is_inferred_or_refused_by_name():
    ids = torch.zeros(1, 4, dtype=torch.int64)
    mask = torch.ones(1, 4, dtype=torch.int64)
    past = torch.zeros(1, 2, 3, 8)
    logits = torch.zeros(1, 4, 10)
    m = infer_mapping({"input_ids": ids, "attention_mask": mask, "past_key": past, "past_value": past},
                      [("logits", logits), ("present_key", torch.zeros(1, 2, 7, 8)),
                       ("present_value", torch.zeros(1, 2, 7, 8))])
    assert m.cache == ((1, "past_key"), (2, "past_value")) and m.with_cache
    nxt = next_inputs(m, {"input_ids": ids, "attention_mask": mask, "past_key": past, "past_value": past},
                      [logits, torch.ones(1, 2, 7, 8), torch.ones(1, 2, 7, 8)], torch.tensor([3]))
    assert nxt["input_ids"].tolist() == [[3]] and nxt["attention_mask"].shape == (1, 5)
    assert nxt["past_key"].shape == (1, 2, 7, 8)
    with pytest.raises(InputError, match="token_type_ids"):
        infer_mapping({"input_ids": ids, "token_type_ids": mask}, [("logits", logits)])
    with pytest.raises(InputError, match="cannot be paired"):
        infer_mapping({"input_ids": ids, "past_key": past}, [("logits", logits)] + [("a", past), ("b", past)])
    with pytest.raises(InputError, match="steps"):
        ep, model, args, kwargs = _llama_without_cache()
        decode(prepare(ep, model), args, kwargs, steps=-1)


def test_steps_stream_and_a_stop_keeps_the_steps_so_far():
    from sbs_widget.engine.cancel import Cancel

    ep, model, args, kwargs = _llama_without_cache()
    cancel, seen = Cancel(), []

    def on_step(step):
        seen.append(step.step)
        if step.step == 2:
            cancel.cancel()

    gen = decode(prepare(ep, model), args, kwargs, steps=8, on_step=on_step, cancel=cancel)
    assert seen == [0, 1, 2] and [s.step for s in gen.steps] == [0, 1, 2]
    assert gen.stopped and "before decode step 3" in gen.stopped
    records = list(gen.run_at(2, node_local=False))
    assert records and all(r.status != "mismatch" for r in records)


@functools.lru_cache(maxsize=None)
def _llama_with_cache():
    from sbs_widget.samples.decoders import export_with_cache

    ep, prog, kw = export_with_cache("llama")
    return ep, prog.model_proto, kw


def test_a_decoder_with_its_cache_agrees_at_every_step():
    """One program for the prompt (an empty cache) and every step (the past growing by one): the
    mapping pairs each present with its past by order and shape, and nothing diverges."""
    ep, model, kw = _llama_with_cache()
    gen = decode(prepare(ep, model), (), kw, steps=8)
    assert gen.mapping.with_cache and [name for _, name in gen.mapping.cache] == [f"cache_{i}" for i in range(4)]
    assert gen.first_divergence == {"closed_loop": None, "open_loop": None}
    assert all(s.open_shared for s in gen.steps[1:]), "one ONNX run per step while both loops agree"
    prompt = kw["input_ids"].shape[1]
    assert [s.length for s in gen.steps] == list(range(prompt, prompt + 9))
    assert gen.inputs[5]["cache_0"].shape[2] == prompt + 4 and gen.inputs[5]["input_ids"].shape[1] == 1
    # memory flat over the steps: a past step's cache is a view of the newest one, not a tensor of its own
    newest = gen.inputs[-1]["cache_0"].untyped_storage().data_ptr()
    assert all(gen.inputs[k]["cache_0"].untyped_storage().data_ptr() == newest for k in range(1, 9))


@pytest.mark.parametrize("fault", ["cache written wrong", "cache slice off by one", "rotary offset after the prompt"])
def test_a_cache_fault_diverges_at_the_first_step_and_is_named_there(fault):
    from sbs_widget.samples.decode_faults import DECODE_FAULTS

    ep, model, kw = _llama_with_cache()
    bad, edited = DECODE_FAULTS[fault](model)
    p = prepare(ep, bad)
    gen = decode(p, (), kw, steps=2)
    assert gen.first_divergence == {"closed_loop": 1, "open_loop": 1}
    assert gen.steps[0].open.within_tolerance, "the prompt alone shows nothing"
    _, culprits = gen.lockstep(1)
    first = culprits[0]
    group = p.group(first.onnx_name) if first.onnx_name in p.index.producer else None
    names = {first.onnx_node} | ({p.index.nodes[i].name for i in group.nodes} if group is not None else set())
    assert names & set(edited), (first, edited)


def test_steps_compared_in_worker_processes_single_out_what_changes_past_the_prompt():
    """``compare_steps`` sends each step's inputs to worker processes (spawned, the pair prepared there
    from files): the prompt is clean, the steps after it are not, and the grouped culprits name the
    edited node at those steps."""
    from sbs_widget.samples.decode_faults import DECODE_FAULTS

    ep, model, kw = _llama_with_cache()
    bad, edited = DECODE_FAULTS["cache slice off by one"](model)
    gen = decode(prepare(ep, bad), (), kw, steps=2)
    spread = gen.compare_steps(max_workers=2)
    assert spread.labels == ["step 0", "step 1", "step 2"] and spread.errors == [None] * 3
    assert all(r.status != "mismatch" for r in spread.records[0]), "the prompt alone shows nothing"
    assert all(any(r.status == "mismatch" for r in spread.records[k]) for k in (1, 2))
    assert spread.input_dependent and all(0 not in p.beyond_inputs for p in spread.input_dependent)
    assert spread.culprits[0].onnx_node in set(edited) and set(spread.culprits[0].inputs) <= {1, 2}
    with pytest.raises(InputError, match="steps \\[5\\]"):
        gen.compare_steps([5], max_workers=0)
