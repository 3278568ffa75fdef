"""Metrics beside the verdict (``metrics=``) on real records, and the one tolerance rule in the views.

Each named metric is checked against a float64 numpy reference computed here, on the very arrays the
engine measured: a callable metric stashes a copy of each pair and answers with its position, so every
record says which arrays it was measured on. Then: the DataFrame, the CSV the CLI writes, the CLI's
``--metrics``, the JSON report, the widget's rows (its Python side, as the view receives them), an
rtol change rerunning the widget, and bad ``metrics=`` values.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pandas as pd
import pytest
import torch

import sbs_widget
from sbs_widget.errors import InputError
from sbs_widget.records import RECORD_FIELDS, TABLE_FIELDS
from sbs_widget.samples import faults, zoo
from sbs_widget.shared_rules import METRIC_PREFIX
from sbs_widget.views.rows import decode_rows, within
from sbs_widget.views.widget import SbsWidget

NAMED = ["max_abs", "max_rel", "cosine", "sqnr_db", "nmse", "top1", "top3"]


class Stash:
    """A metric that keeps a float64 copy of each pair it sees and answers with the copy's position."""

    __name__ = "stash"

    def __init__(self):
        self.pairs: list[tuple[np.ndarray, np.ndarray]] = []

    def __call__(self, e, g) -> float:
        self.pairs.append((np.array(e, dtype=np.float64, copy=True), np.array(g, dtype=np.float64, copy=True)))
        return float(len(self.pairs) - 1)


def _finite(e, g):
    e, g = e.reshape(-1), g.reshape(-1)
    keep = np.isfinite(e) & np.isfinite(g)
    return e[keep], g[keep]


def _top_k(e, g, k):
    if e.ndim == 0 or e.shape[-1] < k:
        return math.nan
    e2, g2 = e.reshape(-1, e.shape[-1]), g.reshape(-1, g.shape[-1])
    same = [set(np.argsort(-a, kind="stable")[:k]) == set(np.argsort(-b, kind="stable")[:k]) for a, b in zip(e2, g2)]
    return float(np.mean(same))


def reference(name: str, e: np.ndarray, g: np.ndarray) -> float:
    """The float64 reference of metric ``name``, written from its definition."""
    if name.startswith("top"):
        return _top_k(e, g, int(name[3:]))
    e, g = _finite(e, g)
    d = g - e
    if name == "max_abs":
        return float(np.max(np.abs(d)))
    if name == "max_rel":
        return float(np.max(np.abs(d) / np.maximum(np.abs(e), 1e-6)))
    if name == "cosine":
        return float(e @ g / math.sqrt((e @ e) * (g @ g)))
    if name == "sqnr_db":
        return math.inf if not d.any() else 10 * math.log10(float(e @ e) / float(d @ d))
    if name == "nmse":
        return float(d @ d) / float(e @ e)
    raise AssertionError(name)


@pytest.fixture(scope="module")
def mlp():
    """The zoo's mlp, its ONNX export with one weight 1% off, and the records of a run with every metric."""
    ep, prog, args, kwargs = zoo.export("mlp", optimize=True)
    weight = next(i.name for i in prog.model_proto.graph.initializer if len(i.dims) == 2)
    bad = faults.perturb_initializer(prog.model_proto, weight, scale=1e-2)
    stash = Stash()
    records = list(sbs_widget.run_aligned(prog.exported_program, bad, args, kwargs, metrics=[*NAMED, stash]))
    return {"ep": prog.exported_program, "onnx": bad, "args": args, "kwargs": kwargs, "records": records,
            "stash": stash}


def _measured(records):
    return [r for r in records if r.metrics]


def test_named_metrics_match_a_float64_reference_on_real_records(mlp):
    measured = _measured(mlp["records"])
    assert measured and len(mlp["stash"].pairs) == len(measured)
    differing = 0
    for r in measured:
        assert list(r.metrics) == [*NAMED, "stash"]
        e, g = mlp["stash"].pairs[int(r.metrics["stash"])]
        assert e.shape == g.shape
        for name in NAMED:
            want = reference(name, e, g)
            got = r.metrics[name]
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12, nan_ok=True), (r.ep_name, name, got, want)
        differing += r.metrics["max_abs"] > 0
    # the weight 1% off moves values: the figures describe real differences, not only zeros
    assert differing > 0
    assert any(math.isfinite(r.metrics["sqnr_db"]) and r.metrics["cosine"] < 1.0 for r in measured)
    # one-sided pairs compare nothing and carry no figure
    assert all(not r.metrics for r in mlp["records"] if r.status in ("one-sided", "error"))


def test_the_views_judge_another_atol_element_wise(mlp):
    """``within`` at an atol other than the run's: the element-wise rule on the very arrays compared."""
    records = mlp["records"]
    run_atol, run_rtol = 1e-4, 1e-4  # the defaults of a float32 program
    checked = 0
    for r in _measured(records):
        if r.ep_shape_type and not r.ep_shape_type.startswith("T1s"):
            continue  # float32 pairs here (integer pairs are exact: another test)
        e, g = mlp["stash"].pairs[int(r.metrics["stash"])]
        slack = np.abs(g - e) - run_rtol * np.abs(e)
        for atol in (1e-7, 1e-6, 1e-5, 3e-5, 1e-3, 1e-2):
            margin = float(np.max(slack)) - atol
            if abs(margin) < 1e-6 * atol:
                continue  # too near the boundary for float rounding to agree
            assert within(r, atol, run_rtol, run_atol, run_rtol) is bool(margin <= 0), (r.ep_name, atol)
            checked += 1
        # an rtol other than the run's is not judged from the figures: the run's verdict stands
        assert within(r, run_atol, 0.5, run_atol, run_rtol) is r.within_tolerance
    assert checked > 20


def test_dataframe_has_one_column_per_metric(mlp):
    records = mlp["records"]
    df = sbs_widget.to_dataframe(records)
    assert "metrics" not in df.columns
    assert list(df.columns) == [*TABLE_FIELDS, *NAMED, "stash"]
    assert len(TABLE_FIELDS) == len(RECORD_FIELDS) - 1
    for name in [*NAMED, "stash"]:
        assert df[name].dtype == np.float64
    for k, r in enumerate(records):
        for name in NAMED:
            want = math.nan if not r.metrics else r.metrics[name]
            assert df[name].iloc[k] == pytest.approx(want, nan_ok=True)
    # records without metrics: no metric column
    plain = sbs_widget.to_dataframe([sbs_widget.Record(ep_name="x")])
    assert list(plain.columns) == list(TABLE_FIELDS)


def test_the_cli_writer_and_the_json_report_carry_them(mlp, tmp_path):
    from sbs_widget.cli.compare import write_records
    from sbs_widget.gate.report import load_report

    records = mlp["records"]
    write_records(records, str(tmp_path / "m.csv"))
    df = pd.read_csv(tmp_path / "m.csv")
    assert {"stash", "cosine", "sqnr_db"} <= set(df.columns) and "metrics" not in df.columns
    assert df["stash"].dropna().tolist() == [r.metrics["stash"] for r in records if r.metrics]
    write_records(records, str(tmp_path / "m.json"))
    back = load_report(tmp_path / "m.json").records
    for a, b in zip(records, back):
        assert (a.metrics is None) == (b.metrics is None)
        if a.metrics:
            assert list(a.metrics) == list(b.metrics)
            assert all(b.metrics[k] == pytest.approx(v, nan_ok=True) for k, v in a.metrics.items())  # inf, NaN too


def test_cli_compare_metrics_option(mlp, tmp_path, capsys):
    from sbs_widget.cli.main import main

    torch.export.save(mlp["ep"], tmp_path / "m.pt2")
    onnx.save(mlp["onnx"], tmp_path / "m.onnx")
    torch.save(mlp["args"], tmp_path / "inputs.pt")
    files = ["--ep", tmp_path / "m.pt2", "--onnx", tmp_path / "m.onnx", "--inputs", tmp_path / "inputs.pt"]
    code = main(["compare", *map(str, files), "--metrics", "cosine,sqnr_db", "--metrics", "top1", "--quiet",
                 "-o", str(tmp_path / "out.csv")])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    at = lines.index("metrics of the outputs (every pair's: -o):")
    assert lines[at + 1].split() == ["output", "cosine", "sqnr_db", "top1"]
    assert len(lines[at + 2].split()) == 4
    df = pd.read_csv(tmp_path / "out.csv")
    assert list(df.columns)[-3:] == ["cosine", "sqnr_db", "top1"]
    # an unknown name stops the command before any work, with the names there are
    with pytest.raises(SystemExit) as stop:
        main(["compare", *map(str, files), "--metrics", "cosine,nope"])
    assert stop.value.code == 2
    assert "unknown metric 'nope'" in capsys.readouterr().err


def test_widget_rows_carry_each_metric_as_a_column(mlp):
    stash = Stash()
    w = SbsWidget(mlp["ep"], mlp["onnx"], mlp["args"], kwargs=mlp["kwargs"], metrics=["cosine", stash]).wait(120)
    assert w.columns[-2:] == [METRIC_PREFIX + "cosine", METRIC_PREFIX + "stash"]
    sent = []
    w.send = lambda content, buffers=None: sent.append((content, bytes(buffers[0]) if buffers else b""))
    w._on_msg(w, {"type": "get_rows", "run": 0, "start": 0}, [])  # what the view asks for
    rows = decode_rows(sent[-1][1], ["cosine", "stash"])
    assert len(rows) == len(w.records)
    for row, r in zip(rows, w.records):
        for name in ("cosine", "stash"):
            want = None if not r.metrics else r.metrics[name]
            assert row[METRIC_PREFIX + name] == (want if want is None or math.isfinite(want) else str(want))
    assert any(row[METRIC_PREFIX + "cosine"] not in (None, 1.0) for row in rows)
    df = w.to_dataframe()
    assert list(df.columns)[-2:] == ["cosine", "stash"]
    # a view of the same records, saved: the same columns, found from the records
    saved = SbsWidget.from_records(w.records)
    assert saved.columns == w.columns
    # atol re-judges in place; an rtol change reruns (a run's figures are measured at its own rtol)
    first = {(r.kind, r.ep_name, r.onnx_name) for r in w.records if r.metrics}
    w.atol = 1e-3
    assert len(w.runs) == 1
    w.rtol = 1e-2
    w.wait(120)
    assert len(w.runs) == 2 and w.runs[-1].rtol == 1e-2 and w.runs[-1].atol == 1e-3
    assert {(r.kind, r.ep_name, r.onnx_name) for r in w.records if r.metrics} == first  # measured again
    saved.rtol = 1e-2  # nothing to rerun: kept for a rerun, the view says so
    assert len(saved.runs) == 1


@pytest.mark.parametrize("bad, message", [
    (["nope"], r"unknown metric 'nope'"),
    ([lambda e, g: 0.0], r"lambda needs a name"),
    (["cosine", "cosine"], r"'cosine' is given twice"),
    ({"status": "cosine"}, r"'status' is a record field"),
    ([3], r"neither a name nor a callable"),
])
def test_bad_metrics_are_refused_naming_the_problem(mlp, bad, message):
    with pytest.raises(InputError, match=message):
        SbsWidget(mlp["ep"], mlp["onnx"], mlp["args"], metrics=bad)
    with pytest.raises(InputError, match=message):
        list(sbs_widget.run_aligned(mlp["ep"], mlp["onnx"], mlp["args"], metrics=bad))
