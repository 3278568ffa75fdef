"""SbsWidget.from_input_sets (project issue 50, item 4): every input set compared in the background, one row
per aligned pair with its spread as columns (encoded after the record's fields), the input-dependent pairs,
the grouped culprits, an input's own records shown as a run (``show_input``, the view's message), the static
fallback. The model: tests/test_input_sets.py's, whose ONNX side zeroes the positions from 8 on (sequences of
8 or fewer agree). Driven without a browser, as tests/test_widget.py does; in this process (max_workers=0)."""

from __future__ import annotations

import json
import time

import pytest
from sets_models import LENGTHS, length_fault

from sbs_widget.errors import InputError
from sbs_widget.shared_rules import spread_columns
from sbs_widget.views.rows import decode_rows
from sbs_widget.views.widget import SbsWidget


@pytest.fixture(scope="module")
def pair():
    ep, _, bad, sets = length_fault()
    return ep, bad, sets


@pytest.fixture(scope="module")
def widget(pair):
    ep, bad, sets = pair
    return SbsWidget.from_input_sets(ep, bad, sets, max_workers=0, title="sets").wait(120)


def _rows(w: SbsWidget, run: int) -> list[dict]:
    sent = []
    send = w.send
    w.send = lambda content, buffers=None: sent.append((content, bytes(buffers[0]) if buffers else b""))
    try:
        w._on_msg(w, {"type": "get_rows", "run": run, "start": 0}, [])
    finally:
        w.send = send
    content, payload = sent[-1]
    assert content["run"] == run and content["reply"]
    return decode_rows(payload, w._metric_names, spread_columns())


def test_runs_in_the_background_and_fills_the_state(pair):
    ep, bad, sets = pair
    t = time.perf_counter()
    w = SbsWidget.from_input_sets(ep, bad, sets, max_workers=0)
    assert time.perf_counter() - t < 2.0, "the input sets run in the background"
    w.wait(120)
    assert w.status == "done", w.message
    state = w.input_spread
    json.dumps(state, allow_nan=False)
    assert state["status"] == "done" and state["n_inputs"] == len(LENGTHS) and len(state["labels"]) == len(LENGTHS)
    assert state["n_input_dependent"] == len(w.input_sets.input_dependent) > 0
    assert w.columns[-len(spread_columns()):] == spread_columns()
    assert (w.atol, w.rtol) == (w.input_sets.atol, w.input_sets.rtol)


def test_rows_carry_the_spread(widget):
    sets = widget.input_sets
    assert len(widget.records) == len(sets.pairs) and widget.runs[-1].input is None
    rows = _rows(widget, 0)
    by_name = {(r["kind"], r["onnx_name"]): r for r in rows}
    first = sets.input_dependent[0]
    row = by_name[(first.kind, first.onnx_name)]
    assert first.onnx_name == "linear_1"
    assert row["spread:input_dependent"] is True and row["spread:n_beyond"] == 2 and row["spread:n_inputs"] == 4
    assert row["spread:worst_input"] in (2, 3) and row["spread:worst_label"] == sets.labels[row["spread:worst_input"]]
    assert row["spread:err_abs_max"] == pytest.approx(first.err_abs_max) == pytest.approx(row["err_abs"])
    assert row["spread:err_abs_median"] == pytest.approx(first.err_abs_median)
    x = by_name[("input", "x")]
    assert x["spread:input_dependent"] is False and x["spread:n_beyond"] == 0
    df = widget.spread_dataframe()
    assert len(df) == len(sets.pairs) and {"err_abs_max", "n_beyond", "worst_input"} <= set(df.columns)


def test_culprits_grouped_across_inputs(widget):
    top = widget.culprits[0]
    assert top["onnx_node"] == "node_linear_1" and top["count"] == 2 and top["n_inputs"] == 4
    assert top["inputs"] == [2, 3]
    assert widget.records[top["i"]].onnx_name == "linear_1"
    json.dumps(widget.culprits, allow_nan=False)


def test_selecting_an_input_shows_its_records_as_a_run(widget):
    sets = widget.input_sets
    before = len(widget.runs)
    widget._on_msg(widget, {"type": "input", "input": 3}, [])  # the view's selector / "show worst input"
    run = widget.runs[-1]
    assert len(widget.runs) == before + 1 and widget.run_id == run.id and run.input == 3
    assert widget.records == sets.records[3] and widget.status == "done"
    assert widget.runs_meta[-1]["input"] == 3
    rows = _rows(widget, run.id)
    assert len(rows) == len(sets.records[3])
    row = next(r for r in rows if r["onnx_name"] == "linear_1")
    assert row["status"] == "mismatch" and row["spread:n_beyond"] == 2  # its own record, the pair's spread
    assert widget.culprits and widget.culprits[0]["onnx_node"] == "node_linear_1" and "count" not in widget.culprits[0]
    widget._on_msg(widget, {"type": "input", "input": 3}, [])  # the same again: nothing new
    assert len(widget.runs) == before + 1
    widget.show_input(0)  # a short input: no mismatch, no culprit
    assert widget.runs[-1].input == 0 and widget.culprits == []
    assert all(r.status != "mismatch" for r in widget.records)
    widget.show_input(None)  # all inputs again
    assert widget.runs[-1].input is None and len(widget.records) == len(sets.pairs)
    assert widget.culprits[0]["count"] == 2
    for bad in ({"type": "input", "input": 99}, {"type": "input", "input": "1"}, {"type": "input", "input": True}):
        widget._on_msg(widget, bad, [])  # stale or malformed: ignored
    assert widget.runs[-1].input is None
    with pytest.raises(InputError):
        widget.show_input(4)


def test_rerun_compares_every_input_again(pair):
    ep, bad, sets = pair
    w = SbsWidget.from_input_sets(ep, bad, iter(sets), max_workers=0).wait(120)  # an iterator is read once
    first = w.input_sets
    w.rerun(reset_names={"linear_1"}).wait(120)
    assert w.status == "done" and w.input_sets is not first and len(w.input_sets) == len(LENGTHS)
    assert w.runs[-1].reset_names == frozenset({"linear_1"})
    assert len(w.input_sets.input_dependent) < len(first.input_dependent)


def test_static_fallback_shows_the_spread(widget):
    widget.show_input(None)
    html = widget._fallback_html()
    assert "Input sets" in html and "input-dependent pair" in html and "linear_1" in html and "2 of 4" in html


def test_plain_widget_unchanged(pair):
    ep, bad, sets = pair
    w = SbsWidget(ep, bad, sets[0]).wait(120)
    assert w.input_sets is None and w.input_spread == {} and w.spread_dataframe().empty
    assert not any(c.startswith("spread:") for c in w.columns)
    with pytest.raises(InputError):
        w.show_input(0)
