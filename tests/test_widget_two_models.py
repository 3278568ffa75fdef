"""SbsWidget.from_models (issue 47): the export ``a`` and a transformed copy ``b`` compared against the torch
program in the widget's background run (``compare_models``): each row carries its twin in b (the ``b_*``
record fields travel with the rows), the "b departs" rows, b's culprits in the panel, b's graph as a third
DOT, the state readable from Python. Real exports (the zoo's resnet), real transforms (onnxruntime's static
QDQ quantization) and a real fault placed in b (``B_FAULTS``); driven without a browser, as
tests/test_widget.py does."""

from __future__ import annotations

import functools
import json

import onnx
import pytest

from sbs_widget.errors import InputError
from sbs_widget.graphs.dot import quote
from sbs_widget.graphs.spec import label_text
from sbs_widget.samples import zoo
from sbs_widget.samples.transforms import B_FAULTS, TRANSFORMS, feeds_for
from sbs_widget.shared_rules import B_DEPARTS, B_STATUSES, COLOR_SCALE, GRAPH_SPEC_MARKER
from sbs_widget.twomodels import verdicts as V
from sbs_widget.twomodels.compare import ModelsComparison
from sbs_widget.views.rows import decode_rows
from sbs_widget.views.widget import SbsWidget

# the culprit's node of b, renamed: DOT quotes and escapes, markup, a newline and a Graphviz escape
HOSTILE = 'dq"<img src=x onerror=alert(1)>\\N\nend'


@functools.lru_cache(maxsize=None)
def _export(name: str):
    ep, prog, args, kwargs = zoo.export(name)
    return prog, prog.model_proto, args, kwargs


@functools.lru_cache(maxsize=None)
def _quantized(name: str) -> onnx.ModelProto:
    prog, a, args, kwargs = _export(name)
    return TRANSFORMS["quant_static_qdq"](a, [feeds_for(a, args, kwargs)])


def _faulty(name: str) -> tuple[onnx.ModelProto, str]:
    """b with its scale doubled at one quantized weight, that node renamed ``HOSTILE``."""
    bad, edited = B_FAULTS["quant_scale_2x"](_quantized(name))
    node = next(n for n in bad.graph.node if n.name == edited[0])
    node.name = HOSTILE
    return bad, HOSTILE


@pytest.fixture(scope="module")
def widget():
    prog, a, args, kwargs = _export("resnet")
    bad, _ = _faulty("resnet")
    return SbsWidget.from_models(prog, a, bad, args, kwargs=kwargs, title="resnet quantized").wait(600)


def _rows(w: SbsWidget, run: int = -1) -> list[dict]:
    sent = []
    send = w.send
    w.send = lambda content, buffers=None: sent.append((content, bytes(buffers[0]) if buffers else b""))
    try:
        w._on_msg(w, {"type": "get_rows", "run": run % len(w.runs), "start": 0}, [])
    finally:
        w.send = send
    return decode_rows(sent[-1][1], w._metric_names)


def test_the_run_compares_b_and_fills_the_state(widget):
    w = widget
    assert w.status == "done", w.message
    assert isinstance(w.models, ModelsComparison) and w.models.records == w.records
    state = w.models_b
    json.dumps(state, allow_nan=False)
    assert state["status"] == "done" and state["n_records"] == len(w.records)
    assert state["n_paired"] == sum(r.b_name is not None for r in w.records) > 0
    assert state["n_departs"] == len(w.models.b_departs) > 0
    assert set(state["counts"]) <= set(B_STATUSES) and set(B_STATUSES) == {V.SAME, V.FOLLOWS_A, V.DEPARTS,
                                                                        V.ROUNDING, V.INHERITS}
    assert w.runs_meta[-1]["n_records"] == len(w.records)


def test_the_culprits_panel_names_the_faulty_node_of_b(widget):
    w = widget
    first = w.culprits[0]
    json.dumps(w.culprits, allow_nan=False)
    assert first["side"] == "b" and first["onnx_node"] == HOSTILE and first["op_type"] == "DequantizeLinear"
    assert first["onnx_op_type"] == first["op_type"] and first["transformation"].startswith("quantized")
    assert first["err_local"] > 0 and len(w.culprits) == len(w.b_culprits) == w.models_b["n_culprits"]
    assert w.b_culprits[0].onnx_node == HOSTILE
    row = w.records[first["i"]]  # the row a click on the culprit selects: its value of b, or of a paired with it
    assert row.b_name == first["b_value"] or row.onnx_name == first["a_value"], (row, first)
    assert row.b_name is not None and row.b_status in B_DEPARTS


def test_rows_carry_b_to_the_view(widget):
    w = widget
    rows = _rows(w)
    assert len(rows) == len(w.records)
    for row, rec in zip(rows, w.records):
        assert (row["b_name"], row["b_status"], row["b_comment"], row["b_node_name"]) == \
            (rec.b_name, rec.b_status, rec.b_comment, rec.b_node_name)
    departs = [r for r in rows if r["b_status"] in B_DEPARTS]
    assert departs and all(r["b_err_abs"] is not None for r in departs)
    assert any(r["b_status"] == V.ROUNDING for r in rows), "quantization rounds: said so, not a departure"
    # a value of a without a twin in b says why (a_only), on its row
    for rec in w.records:
        if rec.b_name is None and rec.onnx_name in w.models.a_only:
            assert rec.b_comment == w.models.a_only[rec.onnx_name]


def test_dataframes_hold_the_b_columns(widget):
    w = widget
    frame = w.to_dataframe()
    b_columns = {"b_name", "b_node_name", "b_op_type", "b_err_abs", "b_err_local", "b_status", "b_comment"}
    assert b_columns <= set(frame.columns)
    assert [v if isinstance(v, str) else None for v in frame["b_status"]] == [r.b_status for r in w.records]
    # the view reports the rows on its screen after the "b departs" filter: the DataFrame follows
    departs = [i for i, r in enumerate(w.records) if r.b_status in B_DEPARTS]
    w.view_rows = departs
    shown = w.filtered_dataframe()
    assert len(shown) == len(departs) and set(shown["b_status"]) <= set(B_DEPARTS)
    w.selected_rows = [w.culprits[0]["i"]]
    assert w.selected[0] is w.records[w.culprits[0]["i"]]


def test_the_graph_of_b_is_a_third_dot_painted_and_escaped(widget):
    w = widget
    dot = w.onnx_b_dot
    head, _, body = dot.partition("\n")
    spec = json.loads(head.removeprefix("// " + GRAPH_SPEC_MARKER))
    assert spec["side"] == "b"
    ids = {n["id"]: n for n in spec["nodes"]}
    culprit = ids[f"b:{HOSTILE}"]
    assert culprit["name"] == HOSTILE  # raw in the spec (JSON), the view draws it as text
    # every node of b is drawn, and its name only appears quoted: label and tooltip escaped for DOT
    assert len([n for n in spec["nodes"] if n["kind"] == "node"]) == len(w.models.b_model.graph.node)
    assert quote(label_text(HOSTILE).split("\n")[0])[1:-1] in body and HOSTILE not in body
    assert '\\"<img' in body and "\\\\N" in body
    # painted by b's verdicts: the nodes of b whose value departs are coloured, a's graph stays a's
    k = spec["nodes"].index(culprit)
    assert f"n{k} [" in body
    departing = {r.b_node_name for r in w.records if r.b_status in B_DEPARTS and r.b_node_name}
    painted = [n for i, n in enumerate(spec["nodes"]) if n["name"] in departing
               and f'n{i} [' in body and COLOR_SCALE["not_compared"] not in body.split(f"\tn{i} [")[1].split("\n")[0]]
    assert painted, departing
    assert json.loads(w.onnx_dot.partition("\n")[0].removeprefix("// " + GRAPH_SPEC_MARKER))["side"] == "onnx"


def test_progress_is_live_and_a_rerun_compares_b_again():
    prog, a, args, kwargs = _export("resnet")
    seen = []
    w = SbsWidget.from_models(prog, a, _quantized("resnet"), args, kwargs=kwargs, autostart=False)
    assert w.models_b == {"status": "idle", "message": ""} and w.onnx_b_dot == ""
    w.observe(lambda change: seen.append(dict(change["new"])), "progress")
    states = []
    w.observe(lambda change: states.append(change["new"]["status"]), "models_b")
    w.rerun().wait(600)
    assert w.status == "done", w.message
    currents = [p.get("current") for p in seen]
    assert "pairing the values of b with a's" in currents
    last = w.progress  # the run's own progress follows (its counts, the FX nodes done)
    assert last["finished"] and last["fx_total"] > 0 and last["fx_done"] == last["fx_total"]
    assert last["n_rows"] == len(w.records) and sum(last["counts"].values()) == len(w.records)
    assert states[0] == "running" and states[-1] == "done"
    # a correct quantization: b rounds, departs nowhere, no culprit in b
    assert w.culprits == [] and w.models_b["n_departs"] == 0 and w.models_b["counts"].get(V.ROUNDING, 0) > 0
    first = w.models
    w.rerun().wait(600)
    assert len(w.runs) == 2 and w.models is not first and w.runs[-1].records == w.models.records
    assert [r.b_status for r in w.runs[0].records] == [r.b_status for r in w.runs[1].records]


def test_bad_arguments_are_refused():
    prog, a, args, kwargs = _export("resnet")
    with pytest.raises(InputError, match="needs b"):
        SbsWidget.from_models(prog, a, None, args, kwargs=kwargs)
    with pytest.raises(InputError, match="steps="):
        SbsWidget.from_models(prog, a, _quantized("resnet"), args, kwargs=kwargs, steps=2)


def test_a_widget_of_one_model_has_no_b():
    prog, a, args, kwargs = _export("resnet")
    w = SbsWidget(prog, a, args, kwargs=kwargs).wait(600)
    assert w.status == "done" and w.models_b == {} and w.onnx_b_dot == "" and w.models is None
    assert all(r.b_name is None and r.b_status is None for r in w.records)
    assert all(c.get("side") != "b" for c in w.culprits)


def test_the_offline_report_keeps_b(widget, tmp_path):
    """``save_html``: the page's frozen state holds b's panel state and graph; the rows their b fields."""
    from sbs_widget.views.report import write_html_report

    page = widget.save_html(tmp_path / "models.html").read_text(encoding="utf-8")
    assert '"models_b"' in page and '"onnx_b_dot"' in page and '"b_status"' in page
    assert "<img" not in page.split("<body", 1)[1].split("<script", 1)[0]  # model names only as data, never markup
    same = write_html_report(widget, tmp_path / "again.html").read_text(encoding="utf-8")
    assert '"models_b"' in same and '"onnx_b_dot"' in same


def test_the_run_options_reach_the_lockstep_a_time_limit_ends_it():
    """``time_limit`` (the run's ``cancel``) is forwarded to the lockstep of a and b: past it the run ends
    "error" naming the limit, and the panel says so (nothing half-judged is shown as b's verdicts)."""
    from sbs_widget.errors import RunTimeout

    prog, a, args, kwargs = _export("resnet")
    w = SbsWidget.from_models(prog, a, _quantized("resnet"), args, kwargs=kwargs, time_limit=1e-6)
    with pytest.raises(RunTimeout):
        w.wait(600)
    assert w.status == "error" and "time" in w.message.lower(), w.message
    assert w.models_b["status"] == "error" and w.models is None and w.culprits == []


def test_values_fused_away_in_b_say_so_on_their_rows():
    """onnxruntime's optimizer fuses bert's MatMul + Add into Gemm-like nodes: a's values inside have no twin
    in b, and their rows carry why (``b_comment``: "fused into ..."), which the view shows in the b verdict
    column; nothing departs on a correct optimization."""
    prog, a, args, kwargs = _export("bert")
    b = TRANSFORMS["ort_extended"](a, [feeds_for(a, args, kwargs)])
    w = SbsWidget.from_models(prog, a, b, args, kwargs=kwargs).wait(600)
    assert w.status == "done", w.message
    fused = [r for r in _rows(w) if r["b_name"] is None and str(r["b_comment"]).startswith("fused into")]
    assert fused and all(r["b_status"] is None for r in fused)
    assert w.models_b["n_departs"] == 0 and w.culprits == []
    assert w.models_b["a_only"] == len(w.models.a_only) > 0


def test_records_of_two_models_saved_elsewhere_show_b_offline(widget, tmp_path):
    """``write_html_report`` of bare records carrying b's fields (what ``compare --onnx-b -o x.html`` has): the
    page's state says two models, so the view shows b's columns and filter; records of one model do not."""
    import dataclasses

    from sbs_widget.views.report import write_html_report

    page = write_html_report(widget.records, tmp_path / "records.html").read_text(encoding="utf-8")
    assert '"models_b":{"status":"done"' in page
    one = [dataclasses.replace(r, b_name=None, b_status=None) for r in widget.records]  # copies: the fixture stays
    plain = write_html_report(one, tmp_path / "plain.html").read_text(encoding="utf-8")
    assert '"models_b":{}' in plain and '"onnx_b_dot":""' in plain
