"""SbsWidget on real exports and the real engine: background runs, batching, stop, rerun with a reset
set, the rows protocol, DataFrame export and the offline HTML report."""

from __future__ import annotations

import json
import time

import onnx
import pytest
import torch
from onnx import numpy_helper

import sbs_widget
from sbs_widget.errors import SbsError
from sbs_widget.records import Record
from sbs_widget.views.report import write_html_report
from sbs_widget.views.rows import decode_rows, encode_rows
from sbs_widget.views.runs import FLUSH_SECONDS
from sbs_widget.views.widget import SbsWidget

ALTERED = "decoder.feed_forward.fc1.bias"


@pytest.fixture(scope="module")
def llm():
    model, inputs = sbs_widget.dummy_llm()
    return torch.onnx.export(model, inputs, dynamo=True, verbose=False), inputs


@pytest.fixture(scope="module")
def altered(llm):
    """The dummy LLM's ONNX model with one initializer changed: a real discrepancy in fc1."""
    program, _ = llm
    proto = onnx.ModelProto()
    proto.CopyFrom(program.model_proto)
    for init in proto.graph.initializer:
        if init.name == ALTERED:
            value = numpy_helper.to_array(init).copy()
            value[3] += 0.05
            init.CopyFrom(numpy_helper.from_array(value, init.name))
    return proto


class _Chain(torch.nn.Module):
    def forward(self, x):
        for _ in range(500):
            x = torch.sin(x) + x
        return x


@pytest.fixture(scope="module")
def chain():
    """1,000 FX nodes (and as many ONNX nodes): enough to see batching and to stop mid-run."""
    x = torch.randn(4, 8)
    return torch.onnx.export(_Chain(), (x,), dynamo=True, verbose=False, optimize=False), (x,)


class _Sends:
    """Counts the custom messages a widget sends (its rows) and its progress updates."""

    def __init__(self, w: SbsWidget):
        self.rows: list[tuple[dict, bytes]] = []
        self.progress = 0
        send = w.send

        def spy(content, buffers=None):
            self.rows.append((content, bytes(buffers[0]) if buffers else b""))
            send(content, buffers)

        w.send = spy
        w.observe(self._count, "progress")

    def _count(self, change):
        self.progress += 1


def test_runs_in_background_and_exports(llm, altered):
    program, inputs = llm
    t = time.perf_counter()
    w = SbsWidget(program.exported_program, altered, inputs, autostart=True)
    assert time.perf_counter() - t < 2.0, "the constructor must return before the run ends"
    assert w.status in ("preparing", "running", "done")
    w.wait(60)
    assert w.status == "done" and w.message == ""
    records = w.records
    assert records and all(isinstance(r, Record) for r in records)
    assert w.progress["n_rows"] == len(records) and w.progress["finished"]
    assert w.progress["fx_done"] == w.progress["fx_total"] > 0
    assert w.progress["onnx_total"] > 0
    mismatches = [r for r in records if r.status == "mismatch"]
    assert mismatches, "the altered initializer must show"
    worst = max(mismatches, key=lambda r: r.err_abs)
    assert w.progress["worst_name"] == (worst.ep_name or worst.onnx_name)
    df = w.to_dataframe()
    assert len(df) == len(records) and list(df.columns)[:3] == ["ep_id_node", "onnx_id_node", "ep_name"]
    assert set(df.status) >= {"ok", "mismatch"}
    meta = w.runs_meta[-1]
    assert meta["n_records"] == len(records) and meta["status"] == "done"


def test_default_tolerance_is_the_programs_and_shows_on_the_widget():
    """No tolerance given: the first run sets the default of the program's precision (float16 here),
    the view shows it, and reruns keep it; a tolerance given is kept as is."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).half().eval()
    x = (torch.randn(8, 16).half(),)
    program = torch.onnx.export(model, x, dynamo=True, verbose=False, optimize=False)
    w = SbsWidget(program.exported_program, program.model_proto, x).wait(60)
    assert (w.atol, w.rtol) == (1e-3, 1e-3) and (w.runs[-1].atol, w.runs[-1].rtol) == (1e-3, 1e-3)
    assert w.runs_meta[-1]["atol"] == 1e-3
    assert w.rerun().wait(60).runs[-1].atol == 1e-3
    given = SbsWidget(program.exported_program, program.model_proto, x, atol=1e-2).wait(60)
    assert (given.atol, given.rtol) == (1e-2, 1e-3)


def test_rows_protocol_serves_any_page(llm):
    program, inputs = llm
    w = SbsWidget(program, None, inputs).wait(60)  # an ONNXProgram holds both sides
    sends = _Sends(w)
    w._on_msg(w, {"type": "get_rows", "run": 0, "start": 5}, [])
    content, payload = sends.rows[-1]
    assert content == {"type": "rows", "run": 0, "start": 5, "reply": True}
    rows = decode_rows(payload)
    assert [r["ep_name"] for r in rows] == [r.ep_name for r in w.records[5:]]
    w._on_msg(w, {"type": "get_rows", "run": 7, "start": 0}, [])  # no such run: no answer, no error
    assert len(sends.rows) == 1


def test_encoding_keeps_nan_inf_and_hostile_strings():
    evil = '<img src=x onerror="alert(1)"></script>'
    recs = [Record(ep_name=evil, err_abs=float("nan")), Record(err_abs=float("inf"), histogram=(1, 2))]
    rows = decode_rows(encode_rows(recs))
    assert rows[0]["ep_name"] == evil and rows[0]["err_abs"] == "NaN"
    assert rows[1]["err_abs"] == "Infinity" and rows[1]["histogram"] == [1, 2]


def test_batches_a_thousand_nodes_into_few_messages(chain):
    program, inputs = chain
    w = SbsWidget(program, None, inputs, autostart=False)
    sends = _Sends(w)
    t = time.perf_counter()
    w.rerun().wait(120)
    elapsed = time.perf_counter() - t
    assert w.status == "done" and len(w.records) > 1000
    assert w.progress["fx_total"] >= 1000
    budget = elapsed / FLUSH_SECONDS + 3
    assert len(sends.rows) <= budget and sends.progress <= budget + 3, (len(sends.rows), sends.progress, elapsed)
    assert len(sends.rows) < 50
    # the pushes cover every record exactly once, in order
    start = 0
    for content, payload in sends.rows:
        assert content["start"] == start
        start += len(json.loads(payload))
    assert start == len(w.records)


def test_stop_ends_promptly_and_keeps_records(chain):
    program, inputs = chain
    w = SbsWidget(program, None, inputs).wait(120)
    total = len(w.records)
    # stop from the run's own thread as soon as the first batch is out
    w.observe(lambda c: w.stop() if c["new"].get("n_rows") and not c["new"].get("finished") else None, "progress")
    w.rerun().wait(60)
    assert w.status == "stopped" and w.runs[-1].status == "stopped"
    assert 0 < len(w.records) < total
    assert w.to_dataframe().shape[0] == len(w.records)
    assert w.runs_meta[-1]["status"] == "stopped"


def test_stop_from_the_notebook_thread(chain):
    program, inputs = chain
    w = SbsWidget(program, None, inputs).wait(120)
    total = len(w.records)
    w.rerun()
    time.sleep(0.3)
    t = time.perf_counter()
    w.stop()
    assert time.perf_counter() - t < 2.0
    assert not w.running
    assert w.status in ("stopped", "done")
    if w.status == "stopped":
        assert len(w.records) < total
    assert len(w.runs[0].records) == total, "earlier runs are untouched"


def test_rerun_with_reset_set(llm, altered):
    program, inputs = llm
    w = SbsWidget(program.exported_program, altered, inputs).wait(60)
    prepared = w._prepared
    first = next(r for r in w.records if r.status == "mismatch" and r.kind == "node")
    downstream = [r.ep_name for r in w.records[w.records.index(first) + 1:] if r.status == "mismatch"]
    assert downstream

    # the view sets the trait as JSON (a list); Python sees a set
    w.set_state({"reset_names": [first.ep_name]})
    assert w.reset_names == {first.ep_name}
    assert w.get_state()["reset_names"] == [first.ep_name]
    w._on_msg(w, {"type": "rerun"}, [])  # the view's Rerun button
    w.wait(60)
    assert w._prepared is prepared, "reruns reuse the prepared comparison"
    assert len(w.runs) == 2 and w.run_id == 1
    assert w.runs[1].reset_names == {first.ep_name}
    by_name = {r.ep_name: r for r in w.records if r.kind == "node"}
    assert by_name[first.ep_name].status == "reset"
    assert all(by_name[n].status == "ok" for n in downstream if n in by_name)
    # what changed
    cmp = w.compare
    assert cmp["before"] == 0 and cmp["after"] == 1
    assert cmp["n_moved_in"] >= 3 and cmp["n_moved_out"] == 0
    assert set(cmp["moved_in"]) <= set(downstream) | {None, ""}
    assert cmp["worst_after"]["err_abs"] < cmp["worst_before"]["err_abs"]
    # the previous run stays available
    old = w.to_dataframe(run=0)
    assert (old.status == "mismatch").sum() > (w.to_dataframe().status == "mismatch").sum()
    assert [m["id"] for m in w.runs_meta] == [0, 1]
    assert w.runs_meta[1]["reset_names"] == [first.ep_name]
    # re-judging at another tolerance needs no rerun
    w.atol = 1.0
    assert w.compare["n_moved_in"] == 0


def test_bad_reset_name_fails_the_run_not_the_widget(llm):
    program, inputs = llm
    w = SbsWidget(program, None, inputs).wait(60)
    w.rerun(reset_names={"no_such_node"})
    with pytest.raises(SbsError, match="no_such_node"):
        w.wait(60)
    assert w.status == "error" and "no_such_node" in w.message
    assert len(w.runs[0].records) > 0
    w.rerun(reset_names=set()).wait(60)
    assert w.status == "done"


def test_from_records_and_html_report(tmp_path, llm):
    program, inputs = llm
    w = SbsWidget(program, None, inputs, title="dummy <llm>").wait(60)
    evil = '<img src=x onerror="alert(1)"></script>'
    recs = w.records + [Record(ep_name=evil, onnx_op_type=evil, err_abs=1.0, status="mismatch")]
    path = write_html_report(recs, tmp_path / "report.html", title=f"report {evil}", atol=1e-3)
    page = path.read_text(encoding="utf-8")
    assert page.count("</script>") == 3, "model strings cannot close a script element"
    assert "<img" not in page
    data = json.loads(page.split('id="sbs-data">')[1].split("</script>")[0])
    assert data["state"]["atol"] == 1e-3 and len(data["runs"]["0"]) == len(recs)
    assert data["runs"]["0"][-1][list(data["state"]["columns"]).index("ep_name")] == evil
    assert w.save_html(tmp_path / "w.html").stat().st_size > 100_000
    v = SbsWidget.from_records(recs)
    assert v.status == "done" and len(v.records) == len(recs)
    assert v.run_id == 0 and v.progress["run"] == 0 and v.progress["n_rows"] == len(recs)
    with pytest.raises(RuntimeError):
        v.rerun()


def test_inputs_from_a_saved_file(tmp_path, llm):
    program, inputs = llm
    path = tmp_path / "inputs.pt"
    torch.save(inputs, path)
    w = SbsWidget(program, None, str(path)).wait(60)
    assert w.status == "done" and len(w.records) > 10


def test_exported_from_the_package():
    assert sbs_widget.SbsWidget is SbsWidget


def test_demo_notebook_runs(tmp_path, monkeypatch):
    """notebooks/demo.ipynb end to end in a real kernel (nbclient), writing its CSV and HTML report."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    import pathlib

    repo = pathlib.Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", str(repo))  # the kernel imports this checkout
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    nb = nbformat.read(repo / "notebooks" / "demo.ipynb", as_version=4)
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "\n".join(str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", ""))
                        for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "reset: linear_4" in outputs
    assert "'n_moved_in': 6" in outputs  # gelu, linear_5 and the MatMul inside it, add_3, linear_6, the output
    assert (tmp_path / "demo_run0.csv").stat().st_size > 1000
    assert (tmp_path / "demo_report.html").stat().st_size > 100_000


def test_offline_page_lists_the_culprits_and_no_made_up_time(tmp_path, llm, altered):
    """The offline page shows the culprits the widget found (it said "Culprits (0)"), and records computed
    elsewhere carry their own time, or none (it said "0 ms")."""
    program, inputs = llm
    w = SbsWidget(program.exported_program, altered, inputs).wait(120)
    assert w.culprits, "the altered initializer makes culprits"
    page = w.save_html(tmp_path / "w.html").read_text(encoding="utf-8")
    state = json.loads(page.split('id="sbs-data">')[1].split("</script>")[0])["state"]
    assert [c["value"] for c in state["culprits"]] == [c["value"] for c in w.culprits]
    page = write_html_report(w.records, tmp_path / "r.html").read_text(encoding="utf-8")
    state = json.loads(page.split('id="sbs-data">')[1].split("</script>")[0])["state"]
    assert state["culprits"], "found again from the records"
    timed = sum((r.ep_time_run or 0) + (r.onnx_time_run or 0) for r in w.records)
    assert state["progress"]["elapsed"] == pytest.approx(timed, abs=1e-3)
    bare = [Record(ep_name="x", err_abs=0.0, status="ok")]
    page = write_html_report(bare, tmp_path / "bare.html").read_text(encoding="utf-8")
    assert json.loads(page.split('id="sbs-data">')[1].split("</script>")[0])["state"]["progress"]["elapsed"] is None
