"""``python -m sbs_widget check`` exit codes, the JSON report (schema, round trip) and the Markdown summary
(hostile names stay text)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings

import pandas as pd
import pytest
from engine_models import exported
from gate_pairs import fault_models, loud, save_pair

import sbs_widget
from sbs_widget.cli.main import main
from sbs_widget.gate.markdown import code
from sbs_widget.gate.report import build_report, load_report, schema_path, write_report
from sbs_widget.gate.verdict import judge
from sbs_widget.records import RECORD_FIELDS, Record

jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


@pytest.fixture(scope="module")
def schema():
    with open(schema_path(), encoding="utf-8") as f:
        data = json.load(f)
    jsonschema.Draft202012Validator.check_schema(data)
    return data


def _valid(path, schema) -> dict:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    jsonschema.Draft202012Validator(schema).validate(data)
    return data


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """clean, faulty, rounding-only pairs as files."""
    folder = tmp_path_factory.mktemp("pairs")
    ep, prog, args, kwargs = exported("dummy_llm", False)
    bad, node = fault_models(prog.model_proto)["op"]
    clean = save_pair(str(folder / "llm"), prog.exported_program, prog.model_proto, args)
    faulty = save_pair(str(folder / "llm"), prog.exported_program, bad, args, onnx_name="bad.onnx")
    lep, lmodel, largs = loud()
    rounding = save_pair(str(folder / "loud"), lep, lmodel, largs)
    return {"clean": clean, "faulty": faulty, "rounding": rounding, "node": node, "folder": folder}


def _check(p, *extra):
    return main(["check", p["ep"], p["onnx"], p["inputs"], *extra])


def test_exit_codes(pairs, tmp_path, capsys, schema):
    assert _check(pairs["clean"]) == 0
    assert "agrees with the program" in capsys.readouterr().out
    assert _check(pairs["faulty"], "-o", str(tmp_path / "bad.json"), "-o", str(tmp_path / "bad.md")) == 1
    out = capsys.readouterr().out
    assert f"node {pairs['node']!r}" in out and "exit code 1" in out
    data = _valid(tmp_path / "bad.json", schema)
    assert data["verdict"]["outcome"] == "mismatch" and data["culprits"][0]["onnx_node"] == pairs["node"]
    md = (tmp_path / "bad.md").read_text()
    assert "FAIL: mismatch" in md and code(pairs["node"]) in md
    assert _check(pairs["rounding"]) == 3
    assert "rounding only (noise)" in capsys.readouterr().out
    assert _check(pairs["rounding"], "--fail-on", "mismatch", "-o", str(tmp_path / "loud.json")) == 0
    assert _valid(tmp_path / "loud.json", schema)["verdict"]["outcome"] == "noise"
    assert _check(pairs["faulty"], "--fail-on", "mismatch") == 1


def test_bad_input_exits_2(pairs, tmp_path, capsys):
    p = dict(pairs["clean"])
    assert _check(dict(p, onnx=str(tmp_path / "missing.onnx"))) == 2
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(b"\x08\x07not an onnx model")
    assert _check(dict(p, onnx=str(corrupt))) == 2
    assert _check(dict(p, inputs=str(tmp_path / "missing.pt"))) == 2
    assert _check(p, "-o", str(tmp_path / "report.txt")) == 2  # refused before the run
    err = capsys.readouterr().err
    assert "exit code 2" in err and "missing.onnx" in err
    assert main(["check", p["ep"]]) == 2  # ONNX and INPUTS missing
    with pytest.raises(SystemExit) as e:  # argparse: bad option
        main(["check", p["ep"], p["onnx"], p["inputs"], "--fail-on", "everything"])
    assert e.value.code == 2


def test_exit_code_of_the_process(pairs):
    """As CI runs it: the process's exit code."""
    p = pairs["faulty"]
    run = subprocess.run([sys.executable, "-m", "sbs_widget", "check", p["ep"], p["onnx"], p["inputs"], "--quiet"],
                         capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == "exit code 1"


@pytest.mark.parametrize("name", ["mlp", "convnet", "dummy_llm", "llama"])
def test_json_round_trip_on_zoo_exports(name, tmp_path, schema):
    ep, prog, args, kwargs = exported(name, True)
    records = list(sbs_widget.run_aligned(prog, None, args, kwargs))
    path = write_report(records, tmp_path / "report.json", atol=1e-4, rtol=1e-4, sources={"onnx": name})
    _valid(path, schema)
    back = load_report(path)
    pd.testing.assert_frame_equal(back.to_dataframe(), sbs_widget.to_dataframe(records))
    assert back.verdict == judge(records)
    w = back.widget()
    pd.testing.assert_frame_equal(w.to_dataframe(), sbs_widget.to_dataframe(records))


def test_non_finite_numbers_and_compare_output(tmp_path, schema, pairs, capsys):
    recs = [Record(ep_name="x", onnx_name="y", kind="output", status="mismatch", err_abs=float("nan"),
                   err_rel=float("inf"), min_atol=float("-inf"), histogram=(1, 2, 3), err_nan=4)]
    path = write_report(recs, tmp_path / "nan.json")
    text = open(path).read()
    assert "NaN" in text and "Infinity" in text
    _valid(path, schema)
    pd.testing.assert_frame_equal(load_report(path).to_dataframe(), sbs_widget.to_dataframe(recs))
    p = pairs["faulty"]  # compare -o writes the report too
    assert main(["compare", "--ep", p["ep"], "--onnx", p["onnx"], "--inputs", p["inputs"], "--quiet",
                 "-o", str(tmp_path / "cmp.json")]) == 0
    assert load_report(tmp_path / "cmp.json").verdict.outcome == "mismatch"


def test_schema_names_every_record_field(schema):
    assert set(schema["$defs"]["record"]["properties"]) == set(RECORD_FIELDS)
    assert schema["properties"]["schema_version"]["const"] == 1


def test_load_report_refuses_foreign_files(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(sbs_widget.LoadError):
        load_report(bad)
    bad.write_text(json.dumps({"schema": "sbs_widget.report", "schema_version": 99}))
    with pytest.raises(sbs_widget.LoadError, match="upgrade"):
        load_report(bad)
    bad.write_text("{not json")
    with pytest.raises(sbs_widget.LoadError):
        load_report(bad)


def test_load_report_refuses_crafted_files(tmp_path):
    """A report may come from anyone: deep nesting, values of the wrong kind, a FIFO: a LoadError each."""
    bad = tmp_path / "deep.json"
    bad.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(sbs_widget.LoadError):
        load_report(bad)
    head = {"schema": "sbs_widget.report", "schema_version": 1}
    for records in ([{"err_abs": {"x": 1}, "status": []}], ["not a record"], 7):
        bad.write_text(json.dumps({**head, "records": records}))
        with pytest.raises(sbs_widget.LoadError, match="malformed|report"):
            load_report(bad)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.json")
        with pytest.raises(sbs_widget.LoadError, match="FIFO"):
            load_report(tmp_path / "fifo.json")


HOSTILE = ["a|b", "tick`s``x", "line\nbreak", "<script>alert(1)</script>", "rev\u202eersed", "http://evil.example",
           "www.evil.example", "me@evil.example", "[link](http://x)", "**bold**", "x" * 100_000, "`", " "]


def test_hostile_names_stay_text_in_markdown(tmp_path):
    cmarkgfm = pytest.importorskip("cmarkgfm")
    recs = [Record(ep_name=n, onnx_name=n, onnx_node_name=n, onnx_op_type=n[:50], module=n, kind="output",
                   status="mismatch", err_abs=1.0, err_where=n, local_noise=False, noise=False, err_local=1.0,
                   comment=n) for n in HOSTILE]
    rep = build_report(recs, atol=1e-4, rtol=1e-4, sources={"onnx": HOSTILE[3], "ep": HOSTILE[2]})
    assert rep.culprits, "the hostile records name culprits"
    md = rep.to_markdown()
    assert len(md) < 20_000  # a pull request comment
    html = cmarkgfm.github_flavored_markdown_to_html(md)
    assert "<script" not in html and "<a " not in html
    for table in html.split("<table>")[1:]:  # names: no emphasis, no link, no markup
        inside = table.split("</table>")[0]
        assert not any(tag in inside for tag in ("<strong", "<em", "<a ", "<img", "<del")), inside[:300]
    assert "\u202e" not in md and "\\u202e" in md
    tables = html.split("<table>")[1:]
    for table in tables:  # every row has its header's cells: no name split a row or a cell
        head = len(re.findall("<th[ >]", table.split("</thead>")[0]))
        for row in table.split("<tbody>")[1].split("</tr>")[:-1]:
            assert len(re.findall("<td[ >]", row)) == head, row[:300]
    assert len(tables) == 2  # worst outputs, culprits
    assert "a|b" in html and "tick`s``x" in html and "&lt;script&gt;" in html and "line\\x0abreak" in html
    path = write_report(rep, tmp_path / "hostile.json")
    back = load_report(path)
    assert [r.ep_name for r in back.records] == HOSTILE  # exact in JSON
    assert all(ord(ch) < 128 for ch in open(path, encoding="utf-8").read())  # escaped, inert
