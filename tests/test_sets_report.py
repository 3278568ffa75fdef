"""The offline HTML report of input sets (project issue 50): ``compare --inputs A --inputs B ... -o report.html``
writes the view of every pair's worst record with the spread as its columns, and the spread itself as escaped
text below it: per pair max and median err_abs, the worst input, the inputs beyond tolerance, the
input-dependent pairs singled out, the culprits grouped across the inputs. A node named ``<script>...`` is
text in the page, never markup.
"""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys

import onnx
import pytest
import torch
from sets_models import LENGTHS, length_fault

HOSTILE = "node_linear_1<script>alert('x')</script>&<b>"  # the culprit's ONNX node, renamed


def _page_parts(page: str) -> tuple[dict, str]:
    """(the view's data, the plain-text spread section) of a report page."""
    data = re.search(r'<script type="application/json" id="sbs-data">(.*?)</script>', page, re.S).group(1)
    section = re.search(r'<section class="sbs-spread-text".*?</section>', page, re.S).group(0)
    return json.loads(data), section


def _rows(section: str, table_after: str) -> list[list[str]]:
    """The rows of the first table after the heading whose id is ``table_after``, cells unescaped."""
    start = section.index(f'id="{table_after}"')
    table = section[start:section.index("</table>", start)]
    return [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", table, re.S) if "<td>" in row]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """program.pt2, a faulty ONNX model whose culprit node has a hostile name, one inputs file per length."""
    folder = tmp_path_factory.mktemp("sets_report")
    ep, _, bad, sets = length_fault()
    node = next(n for n in bad.graph.node if n.name == "node_linear_1")
    node.name = HOSTILE
    onnx.checker.check_model(bad)
    torch.export.save(ep, folder / "program.pt2")
    onnx.save(bad, folder / "bad.onnx")
    inputs = []
    for s, (x,) in zip(LENGTHS, sets):
        torch.save((x,), folder / f"len{s}.pt")
        inputs.append(folder / f"len{s}.pt")
    return folder, inputs


def test_cli_html_report_holds_the_spread_as_text(files):
    folder, inputs = files
    out = folder / "report.html"
    res = subprocess.run([sys.executable, "-m", "sbs_widget", "compare", "--ep", str(folder / "program.pt2"),
                          "--onnx", str(folder / "bad.onnx"), "--inputs", *map(str, inputs), "--workers", "0",
                          "--quiet", "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "wrote" in res.stdout and "report.html" in res.stdout
    page = out.read_text(encoding="utf-8")

    # the hostile name is never markup: no script element but the page's own three, escaped where it shows
    assert "<script>alert" not in page and "<b>" not in page
    assert len(re.findall(r"<script\b", page)) == 3
    data, section = _page_parts(page)
    assert html.escape(HOSTILE, quote=True) in section
    assert "<script" not in section and "<b>" not in section

    # the plain-text spread: the inputs, by their file names
    for k, s in enumerate(LENGTHS):
        assert re.search(rf'<li data-input="{k}">#{k} len{s}\.pt: ', section), section[:2000]
    assert "Input sets: 4 compared, 4 ran to the end" in section
    # the input-dependent pairs singled out: linear_1 first, beyond tolerance on the long inputs only
    dependent = _rows(section, "sbs-input-dependent")
    assert dependent, section[:3000]
    first = dependent[0]
    assert first[1] == "linear_1" and first[2] == HOSTILE and first[-1] == "yes"
    assert float(first[4]) > 0.1 and float(first[5]) > 0  # err_abs max, median
    assert first[6] in ("#2 len12.pt", "#3 len16.pt")  # the worst input
    assert first[7] == "2 of 4: #2 len12.pt, #3 len16.pt" and first[8] == "2 of 4"
    assert all(r[-1] == "yes" for r in dependent)
    # every pair: the input-dependent ones first, then the others, which agree on every input here
    pairs = _rows(section, "sbs-spread-pairs")
    assert pairs[:len(dependent)] == dependent
    others = pairs[len(dependent):]
    assert others and all(r[-1] == "" for r in others)
    x = next(r for r in others if r[1] == "x")
    assert x[7] == "0 of 4" and x[8] == "0 of 4" and x[6].startswith("#")
    # the culprits grouped across the inputs: the hostile node, named on the two long inputs
    culprits = _rows(section, "sbs-grouped-culprits")
    assert culprits[0][0] == HOSTILE and culprits[0][4] == "2 of 4: #2 len12.pt, #3 len16.pt"
    assert culprits[0][5] == "1" and culprits[0][6]

    # the view's data: the "all inputs" run with the spread as columns, the sets panel's state, grouped culprits
    state = data["state"]
    assert state["columns"][-7:] == ["spread:err_abs_max", "spread:err_abs_median", "spread:n_beyond",
                                     "spread:n_inputs", "spread:worst_input", "spread:worst_label",
                                     "spread:input_dependent"]
    assert state["input_spread"]["status"] == "done" and state["input_spread"]["n_inputs"] == 4
    assert state["input_spread"]["labels"] == [f"len{s}.pt" for s in LENGTHS]
    assert state["input_spread"]["n_input_dependent"] == len(dependent)
    rows = [dict(zip(state["columns"], row)) for row in data["runs"]["0"]]
    assert len(rows) == len(pairs)
    row = next(r for r in rows if r["onnx_name"] == "linear_1")
    assert row["spread:input_dependent"] is True and row["spread:n_beyond"] == 2 and row["spread:n_inputs"] == 4
    assert row["err_abs"] == row["spread:err_abs_max"] and row["onnx_node_name"] == HOSTILE
    assert state["culprits"][0]["onnx_node"] == HOSTILE and state["culprits"][0]["count"] == 2


def test_widget_save_html_keeps_the_spread(tmp_path):
    """``SbsWidget.from_input_sets(...).save_html``: the runs it shows (all inputs, then an input's own records)
    with the spread columns, the sets panel's state, and the plain spread below the view."""
    import sbs_widget

    ep, _, bad, sets = length_fault()
    w = sbs_widget.SbsWidget.from_input_sets(ep, bad, sets, max_workers=0, title="sets").wait()
    w.show_input(3)
    data, section = _page_parts(w.save_html(tmp_path / "w.html").read_text(encoding="utf-8"))
    state = data["state"]
    assert state["columns"][-1] == "spread:input_dependent" and state["input_spread"]["n_inputs"] == 4
    assert sorted(data["runs"]) == ["0", "1"] and state["runs_meta"][1]["input"] == 3
    for run in data["runs"].values():  # every run's rows carry the spread of their pair
        rows = [dict(zip(state["columns"], row)) for row in run]
        row = next(r for r in rows if r["onnx_name"] == "linear_1")
        assert row["spread:input_dependent"] is True and row["spread:n_beyond"] == 2
    assert len(data["runs"]["1"]) == len(w.input_sets.records[3])
    assert _rows(section, "sbs-input-dependent")[0][1] == "linear_1"
