"""SbsWidget(..., steps=N) (project issue 50): the decoding in the background, the step strip's state in
``decoding``, a click on a step (the view's message) handled as a lockstep run whose records stream to the
view, ``w.steps`` / ``w.steps_dataframe()`` / ``w.step_records(k)`` / ``w.generation``, the static fallback.
Driven without a browser, as tests/test_widget.py does: messages in through ``_on_msg``, out through a
spy on ``send``."""

from __future__ import annotations

import json
import time

import pytest
import torch

import sbs_widget
from sbs_widget.errors import InputError
from sbs_widget.steps.decode import Step
from sbs_widget.views.rows import decode_rows
from sbs_widget.views.widget import SbsWidget

STEPS = 4


@pytest.fixture(scope="module")
def decoder():
    """The dummy LLM exported with a dynamic sequence: every step is the whole sequence again."""
    model, inputs, shapes = sbs_widget.dummy_llm(dynamic_shapes=True, seq=8)
    program = torch.onnx.export(model, inputs, dynamic_shapes=shapes, dynamo=True, verbose=False)
    return program, inputs


@pytest.fixture(scope="module")
def masked():
    """A LLaMA whose ONNX attention mask hides every generated token: right on the prompt, wrong after."""
    from sbs_widget.samples import zoo
    from sbs_widget.samples.decode_faults import mask_beyond

    ep, program, args, kwargs = zoo.export("llama", optimize=True, dynamic=True)
    bad, names = mask_beyond(program.model_proto, int(args[0].shape[1]))
    return ep, bad, args, kwargs, names


@pytest.fixture(scope="module")
def decoded(decoder):
    program, inputs = decoder
    return SbsWidget(program.exported_program, program.model_proto, inputs, steps=STEPS).wait(120)


def _spy(w: SbsWidget) -> list:
    sent = []
    send = w.send

    def spy(content, buffers=None):
        sent.append((content, bytes(buffers[0]) if buffers else b""))
        send(content, buffers)

    w.send = spy
    return sent


def test_constructor_returns_at_once_and_the_strip_state_fills(decoder):
    program, inputs = decoder
    t = time.perf_counter()
    w = SbsWidget(program.exported_program, program.model_proto, inputs, steps=STEPS)
    assert time.perf_counter() - t < 2.0, "the decoding runs in the background"
    assert w.decoding["status"] in ("running", "done") and w.decoding["total"] == STEPS + 1
    w.wait(120)
    state = w.decoding
    assert state["status"] == "done" and state["done"] == state["total"] == STEPS + 1
    json.dumps(state, allow_nan=False)  # what the view gets: JSON, no NaN
    assert [s["step"] for s in state["steps"]] == list(range(STEPS + 1))
    first = state["steps"][0]
    assert first["length"] == 8 and len(first["torch"]) == 2 and first["closed"]["tokens"] == first["torch"]
    assert {"max_abs", "cosine", "top5", "token_agreement", "tie", "comment", "diverges"} <= set(first["open"])
    assert state["first_divergence"] == {"closed_loop": None, "open_loop": None}
    # Python reads the same: the Generation's steps, a DataFrame
    assert len(w.steps) == STEPS + 1 and all(isinstance(s, Step) for s in w.steps)
    assert w.generation is not None and w.generation.first_divergence == state["first_divergence"]
    df = w.steps_dataframe()
    assert len(df) == 2 * (STEPS + 1) and set(df.loop) == {"closed", "open"}
    # no divergence: the table shows the lockstep at the prompt
    assert w.runs[-1].step == 0 and w.runs[-1].node_local and w.status == "done" and w.records
    assert w.progress["step"] == 0 and w.runs_meta[-1]["step"] == 0


def test_click_on_a_step_streams_its_lockstep(decoded):
    w = decoded
    sent = _spy(w)
    n_runs = len(w.runs)
    w._on_msg(w, {"type": "step", "step": 3}, [])  # the view's click on step 3
    w.wait(60)
    run = w.runs[-1]
    assert len(w.runs) == n_runs + 1 and run.step == 3 and w.run_id == run.id and run.status == "done"
    assert w.progress["step"] == 3 and w.runs_meta[-1]["step"] == 3
    rows = [r for content, payload in sent if content["type"] == "rows" and content["run"] == run.id
            for r in decode_rows(payload)]
    assert [r["ep_name"] for r in rows] == [r.ep_name for r in run.records], "every record reached the view"
    # step 3's inputs: the prompt and three generated tokens
    ids = w.generation.kwargs_at(3)[0][0]
    assert ids.shape[1] == 8 + 3
    assert any(r.ep_shape_type and "11" in r.ep_shape_type for r in run.records)
    # the same click again: the current run is that step's already
    w._on_msg(w, {"type": "step", "step": 3}, [])
    assert len(w.runs) == n_runs + 1
    # stale or malformed clicks are ignored, nothing raised at the view
    for bad in (-1, STEPS + 1, "2", True, None, 1.5):
        w._on_msg(w, {"type": "step", "step": bad}, [])
    assert len(w.runs) == n_runs + 1
    # a rerun after a step's lockstep reruns that step
    assert w.rerun().wait(60).runs[-1].step == 3


def test_step_records_reuses_a_run_or_computes_the_lockstep(decoded):
    w = decoded
    w.show_step(2).wait(60)
    df = w.step_records(2)
    assert len(df) == len(w.runs[-1].records)
    n_runs = len(w.runs)
    other = w.step_records(1)  # no run of step 1: Generation.lockstep, not a run of the table
    assert len(other) > 0 and len(w.runs) == n_runs and 1 in w._lockstep_cache
    for bad in (-1, STEPS + 1, "1", True):
        with pytest.raises(InputError):
            w.step_records(bad)
    with pytest.raises(InputError):
        w.show_step(STEPS + 1)


def test_divergence_marked_and_its_culprits_shown(masked):
    ep, bad, args, kwargs, names = masked
    w = SbsWidget(ep, bad, args, kwargs=kwargs, steps=3, title="masked <b>decoder</b>").wait(120)
    first = w.decoding["first_divergence"]
    assert first["open_loop"] == 1, first  # the prompt is right, the first generated token is hidden
    assert first["closed_loop"] == 1
    step1 = w.decoding["steps"][1]
    assert step1["open"]["diverges"] and w.decoding["steps"][2]["closed"] is None  # the closed loop stopped
    assert w.runs[-1].step == 1, "the table opens on the first diverging step"
    assert any(r.status == "mismatch" for r in w.records)
    assert w.culprits, "the culprits of the step's lockstep fill the panel"
    text = json.dumps(w.culprits)
    assert any(name in text for name in names) or "mask" in text, (names, text[:400])
    page = w._fallback_html()
    assert "Decode steps" in page and "first divergence (open loop)" in page
    assert "<b>decoder</b>" not in page and "&lt;b&gt;decoder&lt;/b&gt;" in page
    assert "lockstep at decode step 1" in page


def test_a_decoding_that_fails_says_why():
    model = torch.nn.Linear(4, 3)
    x = (torch.randn(2, 4),)
    program = torch.onnx.export(model, x, dynamo=True, verbose=False)
    w = SbsWidget(program.exported_program, program.model_proto, x, steps=2)
    with pytest.raises(InputError):
        w.wait(60)
    assert w.decoding["status"] == "error" and "InputError" in w.decoding["message"]
    assert w.status == "error" and w.runs == []
    assert "the decoding failed" in w._fallback_html()


def test_bad_steps_and_saved_records():
    with pytest.raises(InputError):
        SbsWidget(autostart=False, steps=-1)
    with pytest.raises(InputError):
        SbsWidget(autostart=False, steps=True)
    w = SbsWidget.from_records([])
    with pytest.raises(InputError):
        w.decode(2)
    assert w.steps == [] and len(w.steps_dataframe()) == 0 and w.generation is None


def test_report_keeps_the_strip_and_from_module_decodes(decoded, tmp_path):
    page = decoded.save_html(tmp_path / "steps.html").read_text()
    assert '"decoding"' in page and '"first_divergence"' in page  # the offline view draws the strip (not clickable)
    model, inputs, shapes = sbs_widget.dummy_llm(dynamic_shapes=True, seq=6)
    w = SbsWidget.from_module(model, inputs, dynamic_shapes=shapes, steps=2).wait(180)
    assert w.exported is not None and len(w.steps) == 3 and w.runs[-1].step == 0 and w.status == "done"
