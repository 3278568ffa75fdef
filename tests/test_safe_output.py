"""Hostile names on the way out (issue 31): spreadsheets, the terminal, output paths, repro bundles.

A real MLP is exported with torch.export / torch.onnx.export, then ONNX values and nodes are renamed
(consistently: producers, consumers, graph outputs) to names a hostile file could hold.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import openpyxl
import pytest
import torch
from engine_models import export_module

import sbs_widget
from sbs_widget.cli.compare import write_records
from sbs_widget.cli.main import main
from sbs_widget.errors import InputError
from sbs_widget.records import Record
from sbs_widget.safe_text import short_name, spreadsheet_cell, visible
from sbs_widget.samples import faults

# relu's value: a formula, NUL, an ANSI colour, a bidi override, "\N{", quotes, a newline, a backslash
EVIL = '=HYPERLINK("http://x")\x00\x1b[31m\u202eevil\\N{x}\'"\n\\'
# mul's value, the culprit: a formula prefix, far beyond any file name, and control codes again
LONG = "@SUM(1)" + "m" * 100_000 + "\x1b[2J\u202e\\N{"
NASTY_CHARS = ("\x1b", "\x00", "\u202e")


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)) * 2.0)


def _rename(model: onnx.ModelProto, mapping: dict) -> onnx.ModelProto:
    """Values renamed everywhere they appear; a renamed value's producer gets ``<name>_node``."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    for n in g.node:
        if n.output[0] in mapping:
            n.name = mapping[n.output[0]] + "_node"
        n.input[:] = [mapping.get(x, x) for x in n.input]
        n.output[:] = [mapping.get(x, x) for x in n.output]
    for v in list(g.value_info) + list(g.output):
        v.name = mapping.get(v.name, v.name)
    return model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    torch.manual_seed(0)
    args = (torch.randn(2, 4),)
    ep, prog = export_module(_Mlp(), args)
    hostile = _rename(prog.model_proto, {"relu": EVIL, "mul": LONG})
    bad = faults.replace_op(hostile, LONG + "_node", "Add")  # x * 2 -> x + 2: the Mul node is the culprit
    torch.export.save(ep, folder / "m.pt2")
    onnx.save(bad, folder / "bad.onnx")
    torch.save(args, folder / "in.pt")
    return folder, ["--ep", str(folder / "m.pt2"), "--onnx", str(folder / "bad.onnx"), "--inputs",
                    str(folder / "in.pt")]


def _no_nasty(text: str):
    assert not any(c in text for c in NASTY_CHARS), [c for c in NASTY_CHARS if c in text]


def test_safe_text_functions():
    assert visible("a\x1b[31mb\u202ec\x00\u2066") == "a\\x1b[31mb\\u202ec\\x00\\u2066"
    assert visible("line\nnext", newlines=True) == "line\nnext" and visible("a\nb") == "a\\x0ab"
    assert visible("plain é 漢") == "plain é 漢"
    for start in "=+-@\t\r":
        assert spreadsheet_cell(start + "1+1").startswith("'" + start.replace("\r", "\\x0d"))
    assert spreadsheet_cell("ok\x00\x1b") == "ok\\x00\\x1b" and spreadsheet_cell("a\tb\nc") == "a\tb\nc"
    long = short_name(LONG)
    assert len(long) <= 64 and long.startswith("_SUM_1_mmm") and long != short_name(LONG + "x")
    assert short_name("val_3") == "val_3" and "/" not in short_name("../x/y")


def test_compare_spreadsheets_hold_no_formula_and_terminal_no_escape(files, tmp_path, capsys):
    _, common = files
    assert main(["compare", *common, "-o", str(tmp_path / "out.xlsx"), "--node-local"]) == 0
    out = capsys.readouterr()
    _no_nasty(out.out + out.err)  # summary lines and the progress bar's postfix
    assert "first pair beyond tolerance: mul / @SUM(1)mmm" in out.out
    assert "mmm\\x1b[2J\\u202e\\N{ (Add" in out.out  # named, visibly
    sheet = openpyxl.load_workbook(tmp_path / "out.xlsx").active
    rows = list(sheet.iter_rows())
    assert len(rows) == 11  # header + 10 records: the file is complete
    cells = [c for row in rows for c in row]
    assert all(c.data_type != "f" for c in cells)
    strings = [c.value for c in cells if isinstance(c.value, str)]
    assert not any(s.startswith(("=", "+", "-", "@")) for s in strings)
    assert any(s.startswith("'=HYPERLINK") and "\\x00\\x1b[31m\\u202e" in s for s in strings)
    # an xlsx cell holds 32,767 characters: a longer name is cut, visibly
    assert any(s.startswith("'@SUM(1)mmm") and s.endswith("]") and "[cut: 100024 characters" in s
               for s in strings)
    header = [c.value for c in rows[0]]
    err_abs = [row[header.index("err_abs")].value for row in rows[1:]]
    assert all(isinstance(v, (int, float)) for v in err_abs)  # numbers stay numbers

    assert main(["compare", *common, "-o", str(tmp_path / "out.csv"), "--quiet"]) == 0
    with open(tmp_path / "out.csv", newline="", encoding="utf-8") as f:
        table = list(csv.reader(f))
    assert len(table) == 11
    flat = [c for row in table for c in row]
    assert not any(c.startswith(("=", "+", "@")) for c in flat) and "\x00" not in "".join(flat)
    assert not any(c.startswith("-") and not _is_number(c) for c in flat)
    assert float(table[6][table[0].index("err_abs")]) >= 0.0
    assert "'@SUM(1)" + "m" * 100_000 + "\\x1b[2J\\u202e\\N{" in flat  # CSV: no cell limit


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_failed_write_leaves_the_old_file_and_no_partial_one(tmp_path):
    target = tmp_path / "out.parquet"
    target.write_text("old")
    # a column mixing floats and text: pyarrow refuses it half-way through writing
    bad = [Record(ep_name="a", err_abs=0.5), Record(ep_name="b", err_abs="not a number")]
    with pytest.raises(Exception):  # noqa: B017 - pyarrow's own error type
        write_records(bad, str(target))
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["out.parquet"]
    write_records([Record(ep_name="\x00=1", err_abs=0.5)], str(tmp_path / "ok.xlsx"))  # NUL: no crash
    assert openpyxl.load_workbook(tmp_path / "ok.xlsx").active["C2"].value == "\\x00=1"


def test_output_paths_are_checked_before_the_work(files, tmp_path, capsys):
    folder, common = files
    (tmp_path / "dir.csv").mkdir()
    cases = [
        (["compare", *common, "-o", str(tmp_path / "missing" / "out.csv")], "does not exist"),
        (["compare", *common, "-o", str(tmp_path / "dir.csv")], "it is a folder"),
        (["compare", *common, "-o", str(tmp_path / "out.txt")], ".csv, .xlsx, .parquet, .html"),
        (["graph", *common, "-o", str(tmp_path / "g.png")], ".html, .htm"),
        (["graph", *common, "-o", str(tmp_path / "missing" / "g.html")], "does not exist"),
        (["steal-compare", "--dump", "x.pt", "--onnx", "x.onnx", "-o", str(tmp_path / "d.txt")], ".csv"),
        (["repro", *common, "--name", "linear", "-o", str(folder / "in.pt")], "it is a file"),
        (["repro", *common, "--name", "linear", "-o", str(tmp_path / "missing" / "r")], "does not exist"),
    ]
    for argv, message in cases:
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err, (argv, err)
        assert "comparing" not in err  # refused before the run started
    assert not (tmp_path / "missing").exists()


def test_culprits_top_is_positive_and_output_is_visible(files, capsys):
    _, common = files
    for bad in ("0", "-1", "x"):
        with pytest.raises(SystemExit) as e:
            main(["culprits", *common, "--top", bad])
        assert e.value.code == 2 and "positive integer" in capsys.readouterr().err
    assert main(["culprits", *common, "--top", "1"]) == 0
    out = capsys.readouterr().out
    _no_nasty(out)
    assert out.startswith("1. Add ") and "2. " not in out
    assert len(out) < 2000 and "characters]..." in out  # the long name clipped on screen
    assert main(["culprits", *common, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)  # JSON escapes them; parsed back they are exact
    assert found[0]["onnx_name"] == LONG


def test_repro_of_hostile_names_replays(files, tmp_path, capsys):
    _, common = files
    out = tmp_path / "bundle"
    assert main(["repro", *common, "--name", LONG, "-o", str(out)]) == 0
    _no_nasty(capsys.readouterr().out)
    source = (out / "replay.py").read_text(encoding="utf-8")
    compile(source, "replay.py", "exec")
    run = subprocess.run([sys.executable, str(out / "replay.py")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    _no_nasty(run.stdout)
    assert float(run.stdout.split("max abs error: ")[1].split()[0]) > 1.0  # x+2 vs x*2
    info = json.loads((out / "info.json").read_text())
    assert info["value"] == LONG and info["anchors"] == [EVIL]  # full names kept inside the files
    assert list(info["npz_keys"].values()) == [EVIL]
    assert list(np.load(out / "inputs.npz").keys()) == list(info["npz_keys"])
    assert list(torch.load(out / "inputs.pt", weights_only=True)) == [EVIL]
    # again into the same folder: refused without --force, done with it
    assert main(["repro", *common, "--name", LONG, "-o", str(out)]) == 1
    assert "--force" in capsys.readouterr().err
    assert main(["repro", *common, "--name", LONG, "-o", str(out), "--force"]) == 0


def test_to_dataframe_run_out_of_range_names_the_runs():
    w = sbs_widget.SbsWidget.from_records([Record(ep_name="x", err_abs=0.0)])
    assert len(w.to_dataframe(0)) == 1 and len(w.to_dataframe(-1)) == 1
    for run in (99, -2, "0"):
        with pytest.raises(InputError, match=r"1 run\(s\), give 0 to 0"):
            w.to_dataframe(run=run)
