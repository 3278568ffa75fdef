"""Careless numbers (issue 31, M1/M2): integers compared exactly, tolerances validated at every entry
point, the comparison paths agreeing on every special value, empty values said to be empty."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from engine_models import export_module
from onnx import numpy_helper

import sbs_widget
from sbs_widget.dumps.compare import compare_dump
from sbs_widget.engine import metrics
from sbs_widget.engine.metrics import EMPTY_NOTE, beyond_where, compute_errors, compute_errors_many
from sbs_widget.engine.tolerance import cli_tolerance, resolve, valid_tolerance
from sbs_widget.errors import InputError

BAD_TOLERANCES = [float("nan"), float("inf"), -float("inf"), -1, -1e-9, "1e-4", True, [1e-4],
                  np.float32("nan"), 1j]

# -- the comparison paths agree on special values ------------------------------------------------


def _special_pairs(dtype):
    """Pairs whose figures are exact in every dtype (differences of 0.5, 1, 2: no rounding), mixing
    non-finite values with finite ones, agreeing and not."""
    inf, nan = np.inf, np.nan
    rows = [
        ([-inf, 1, 2, 3], [-inf, 1, 2, 3]),        # exact, -inf in the same place
        ([inf, -inf, nan, 4], [inf, -inf, nan, 4]),  # exact, every special value
        ([-inf], [-inf]), ([nan, nan], [nan, nan]),  # nothing finite to compare
        ([nan, 1, 2, 3], [1, 1, 2, 3]),             # NaN vs number
        ([1, 1, 2, 3], [nan, 1, 2, 3]),             # number vs NaN
        ([inf, 1, 2, 3], [-inf, 1, 2, 3]),          # inf vs -inf
        ([inf, 1, 2, 3], [5, 1, 2, 3]),             # inf vs number
        ([-inf, 1, 2, 3], [-inf, 1.5, 2, 3]),       # -inf agreeing, a finite difference beside it
        ([1, 2, 3, 4], [1, 2, 3, 4]),               # finite, exact
        ([1, 2, 3, 4], [1, 2, 3, 6]),               # finite, beyond
        ([0, 0, 0, 0], [0, 0, 0, 0.5]),
    ]
    pairs = [(np.array(a, dtype), np.array(b, dtype)) for a, b in rows]
    pairs.append((np.zeros((0, 3), dtype), np.zeros((0, 3), dtype)))  # empty
    return pairs


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("tol", [(0.0, 0.0), (1e-4, 1e-4), (1.0, 0.5), (2.0, 0.0)])
@pytest.mark.parametrize("histogram", [True, False])
def test_every_path_gives_the_same_errors_on_special_values(monkeypatch, dtype, tol, histogram):
    atol, rtol = tol
    pairs = _special_pairs(dtype)
    one = [compute_errors(e, g, atol=atol, rtol=rtol, histogram=histogram) for e, g in pairs]
    paths = {"batched": compute_errors_many(pairs, atol=atol, rtol=rtol, histogram=histogram)}
    with monkeypatch.context() as m:
        m.setattr(metrics, "_compare", None)  # numpy's batches instead of the compiled pass
        paths["numpy batches"] = compute_errors_many(pairs, atol=atol, rtol=rtol, histogram=histogram)
        m.setattr(metrics, "BATCH_ELEMENTS", 6)  # pairs split over many small batches
        paths["small batches"] = compute_errors_many(pairs, atol=atol, rtol=rtol, histogram=histogram)
    for name, many in paths.items():
        for i, (x, y) in enumerate(zip(one, many)):
            assert tuple(x) == tuple(y), (name, i, pairs[i], x, y)
    for (e, g), err in zip(pairs, one):  # where the beyond elements lie: the same rule
        assert (beyond_where(e, g, atol=atol, rtol=rtol) is None) == err.within_tolerance, (e, g, err)
    exact_special = one[:4]
    assert all(err.within_tolerance and err.err_nan == 0 and err.err_abs == 0.0 for err in exact_special)
    assert [err.err_nan for err in one[4:8]] == [1, 1, 1, 1]
    assert not any(err.within_tolerance for err in one[4:8])


# -- integers and bools are exact ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int16, np.uint16, np.uint8, np.int8])
def test_an_integer_off_by_two_at_30000_is_beyond_tolerance(monkeypatch, dtype):
    big = {np.uint8: 250, np.int8: 120}.get(dtype, 30000)
    expected = np.array([[big, 7], [3, big]], dtype)
    got = expected.copy()
    got[1, 1] -= 2
    # the float rule would let it pass: 2 <= atol + rtol * |torch| (3 at 30000, here 10)
    atol, rtol = 2.0, 1e-4
    for compiled in (True, False):
        with monkeypatch.context() as m:
            if not compiled:
                m.setattr(metrics, "_compare", None)
            one = compute_errors(expected, got, atol=atol, rtol=rtol)
            many = compute_errors_many([(expected, got), (expected, expected.copy())], atol=atol, rtol=rtol)
            assert tuple(one) == tuple(many[0])
            assert one.err_abs == 2.0 and not one.within_tolerance
            assert many[1].within_tolerance and many[1].err_abs == 0.0
    assert beyond_where(expected, got, atol=atol, rtol=rtol) == "[1, 1] (1 of 4)"


def test_bools_and_mixed_integer_float_pairs_are_exact():
    mask = np.array([True, False, True])
    flipped = np.array([True, True, True])
    for e, g in [(mask, flipped), (np.array([30000, 1]), np.array([30002.0, 1.0])),
                 (np.array([30000.0, 1.0], np.float32), np.array([30002, 1], np.int32))]:
        one = compute_errors(e, g, atol=1.0, rtol=0.5)
        many = compute_errors_many([(e, g)], atol=1.0, rtol=0.5)[0]
        assert not one.within_tolerance and not many.within_tolerance, (e, g)
        assert one.err_abs == many.err_abs == (1.0 if e.dtype == bool else 2.0)
        assert beyond_where(e, g, atol=1.0, rtol=0.5) is not None
    # floats keep their tolerance
    assert compute_errors(np.array([30000.0]), np.array([30002.0]), atol=1e-4, rtol=1e-4).within_tolerance


class _TokenIds(torch.nn.Module):
    """Token ids around 30,000 (argmax + an int64 buffer), an empty value and a float output."""

    def __init__(self):
        super().__init__()
        self.register_buffer("offset", torch.full((4,), 30000, dtype=torch.int64))

    def forward(self, x):
        return x.argmax(-1) + self.offset, x[:, :0] * 2, x + 1


@pytest.fixture(scope="module")
def token_model():
    x = torch.randn(3, 4, 4)
    ep, prog = export_module(_TokenIds(), (x,))
    return ep, prog.model_proto, x


def test_a_token_id_off_by_two_in_the_onnx_file_is_a_mismatch(token_model):
    ep, good, x = token_model
    bad = onnx.ModelProto()
    bad.CopyFrom(good)
    init = next(i for i in bad.graph.initializer if i.name == "offset")
    values = numpy_helper.to_array(init).copy()
    values[1] += 2  # 30002: within 1e-4 + 1e-4 * 30000 = 3 by the float rule
    init.CopyFrom(numpy_helper.from_array(values, "offset"))
    records = list(sbs_widget.run_aligned(ep, bad, (x,)))
    out = next(r for r in records if r.kind == "output" and r.onnx_name == "add")
    assert out.status == "mismatch" and out.within_tolerance is False, out
    assert out.err_abs == 2.0 and out.err_where == "[:, 1] (3 of 12)"
    weight = next(r for r in records if r.kind == "weight")
    assert weight.status == "mismatch" and weight.err_where == "[1] (1 of 4)"
    assert all(r.status in ("ok", "one-sided") for r in sbs_widget.run_aligned(ep, good, (x,)))
    # the culprit finder sees it too
    assert sbs_widget.find_culprits(records)


def test_empty_values_say_nothing_was_compared(token_model):
    ep, onx, x = token_model
    records = list(sbs_widget.run_aligned(ep, onx, (x,)))
    empty = [r for r in records if r.n_elements == 0]
    assert {r.kind for r in empty} == {"node", "output"}
    for r in empty:
        assert r.status == "ok" and EMPTY_NOTE in r.comment, r
    assert all(EMPTY_NOTE not in r.comment for r in records if r.n_elements)


# -- tolerances are validated everywhere ---------------------------------------------------------


@pytest.mark.parametrize("value", BAD_TOLERANCES, ids=repr)
def test_a_bad_tolerance_is_refused_with_what_to_pass(value):
    for atol, rtol in ((value, None), (None, value), (1e-4, value)):
        with pytest.raises(InputError, match=r"tol=.* is not a tolerance: pass a finite number >= 0"):
            resolve(atol, rtol, torch.float32)
    assert valid_tolerance("atol", 0) == 0.0 and tuple(resolve(np.float32(0.5), 0, None)) == (0.5, 0.0)


def test_run_aligned_prepare_and_culprits_refuse_a_nan_tolerance(token_model):
    ep, onx, x = token_model
    with pytest.raises(InputError, match=r"atol=nan is not a tolerance"):
        sbs_widget.run_aligned(ep, onx, (x,), atol=float("nan"))
    prepared = sbs_widget.prepare(ep, onx)
    with pytest.raises(InputError, match=r"rtol=-1 is not a tolerance"):
        prepared.run((x,), rtol=-1)
    with pytest.raises(InputError, match=r"rtol=inf"):
        prepared.tolerance(rtol=float("inf"))
    with pytest.raises(InputError, match=r"atol=nan"):
        sbs_widget.culprits(prepared, None, (x,), atol=float("nan"))
    with pytest.raises(InputError, match=r"atol=nan"):  # before the dump is even read
        list(compare_dump("no such dump.onnx", None, atol=float("nan"), rtol=1e-4))


def test_the_widget_refuses_a_bad_tolerance(token_model):
    ep, onx, x = token_model
    for bad in (float("nan"), -1, "x", True):
        with pytest.raises(InputError, match=r"atol=.* is not a tolerance"):
            sbs_widget.SbsWidget(ep, onx, (x,), atol=bad)
    w = sbs_widget.SbsWidget(ep, onx, (x,), autostart=False)
    for bad in (float("nan"), float("inf"), -1e-3):
        with pytest.raises(InputError, match=r"rtol=.* is not a tolerance"):
            w.rtol = bad
    assert w.rtol == 1e-4  # unchanged
    w.rtol = 1e-3
    assert w.rtol == 1e-3
    with pytest.raises(InputError):
        sbs_widget.SbsWidget.from_records([], atol=float("nan"))


@pytest.mark.parametrize("text", ["nan", "inf", "-1", "-inf", "abc", ""])
def test_cli_tolerance_option_refuses_bad_values(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="is not a tolerance: pass a finite number >= 0"):
        cli_tolerance(text)
    assert cli_tolerance("1e-3") == 1e-3 and cli_tolerance("0") == 0.0


@pytest.mark.parametrize("command", ["compare", "culprits", "steal-compare"])
def test_cli_exits_with_the_message_on_a_nan_tolerance(tmp_path, command):
    files = ["--dump", tmp_path / "d.onnx"] if command == "steal-compare" else \
        ["--ep", tmp_path / "m.pt2", "--inputs", tmp_path / "i.pt"]
    res = subprocess.run([sys.executable, "-m", "sbs_widget", command, *map(str, files), "--onnx",
                          str(tmp_path / "m.onnx"), "--atol", "nan"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res
    assert "argument --atol: 'nan' is not a tolerance: pass a finite number >= 0, e.g. 1e-4" in res.stderr
    assert "Traceback" not in res.stderr
