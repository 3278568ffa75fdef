"""The vectorized error figures (``compute_errors_many``) equal the one-pair ones on every kind of value."""

import math
import shutil
import sysconfig

import numpy as np
import pytest
import torch

from sbs_widget.engine import metrics
from sbs_widget.engine.metrics import compute_errors, compute_errors_many


def _pairs(seed: int):
    rng = np.random.default_rng(seed)
    pairs = []
    for k in range(240):
        shape = tuple(int(d) for d in rng.integers(1, 30, size=int(rng.integers(0, 4))))
        a = rng.standard_normal(shape).astype(np.float32)
        kind = k % 8
        if kind == 0:
            b = a.copy()
        elif kind == 1:
            b = a + rng.standard_normal(shape).astype(np.float32) * 10.0 ** -int(rng.integers(1, 8))
        elif kind == 2:
            b = a.copy()
            b.reshape(-1)[0] = np.nan
        elif kind == 3:
            a = a.copy()
            a.reshape(-1)[-1] = -np.inf
            b = a.copy()
        elif kind == 4:
            a = (a * 100).astype(np.int64)
            b = a + rng.integers(0, 2, size=shape)
        elif kind == 5:
            a = a > 0
            b = a.copy()
            b.reshape(-1)[0] = not b.reshape(-1)[0]
        elif kind == 6:
            a = torch.from_numpy(a).to(torch.float64)
            b = a.numpy() * 1.5
        else:
            a = torch.from_numpy(a).to(torch.float16)
            b = a.float().numpy().astype(np.float16) + np.float16(0.01)
        pairs.append((a, b))
    # strided values, as torch hands them over (transposed, expanded, sliced), and one big pair
    base = rng.standard_normal((6, 5, 7)).astype(np.float32)
    noisy = base + rng.standard_normal(base.shape).astype(np.float32) * 1e-3
    pairs.append((torch.from_numpy(base).transpose(0, 2), np.ascontiguousarray(noisy.transpose(2, 1, 0))))
    pairs.append((np.broadcast_to(base[:, :1], (6, 9, 7)), np.broadcast_to(noisy[:, :1], (6, 9, 7)).copy()))
    pairs.append((base[:, ::2, 1:], noisy[:, ::2, 1:]))
    big = rng.standard_normal(1 << 17).astype(np.float32)
    pairs.append((big, big + np.float32(2e-4) * rng.standard_normal(big.size).astype(np.float32)))
    pairs.append((np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)))
    pairs.append((np.complex64(1 + 2j) * np.ones(3, np.complex64), np.ones(3, np.complex64)))
    return pairs


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("batch", [1 << 18, 700])
@pytest.mark.parametrize("histogram", [True, False])
def test_many_equals_one_by_one(monkeypatch, batch, histogram, compiled):
    if compiled and metrics._compare is None:
        pytest.skip("sbs_widget.engine._compare was not built (no C compiler)")
    if not compiled:
        monkeypatch.setattr(metrics, "_compare", None)
    monkeypatch.setattr(metrics, "BATCH_ELEMENTS", batch)  # 700: many small batches, pairs split across
    pairs = _pairs(batch)
    one = [compute_errors(a, b, atol=1e-4, rtol=1e-3, histogram=histogram) for a, b in pairs]
    many = compute_errors_many(pairs, atol=1e-4, rtol=1e-3, histogram=histogram)
    assert len(many) == len(pairs)
    for i, (x, y) in enumerate(zip(one, many)):
        for f in ("err_nan", "err_h01", "err_h001", "n_elements", "within_tolerance", "histogram"):
            assert getattr(x, f) == getattr(y, f), (i, f)
        for f in ("err_abs", "err_rel", "err_dev"):
            u, v = getattr(x, f), getattr(y, f)
            assert math.isclose(u, v, rel_tol=1e-5, abs_tol=0.0), (i, f, u, v)
    # the cases are really varied: mismatches, NaN-pattern differences, exact agreement
    assert any(not e.within_tolerance for e in many) and any(e.err_nan for e in many)
    assert any(e.err_abs == 0.0 and e.n_elements for e in many)


def test_many_flags_a_single_bad_element_among_many():
    a = np.zeros((64, 1000), np.float32)
    b = a.copy()
    b[37, 999] = 1.0
    pairs = [(a[i], b[i]) for i in range(64)]
    errs = compute_errors_many(pairs, atol=1e-4, rtol=1e-4, histogram=True)
    bad = [i for i, e in enumerate(errs) if not e.within_tolerance]
    assert bad == [37]
    assert errs[37].err_abs == 1.0 and errs[37].err_h01 == 1 and errs[37].histogram[-2] == 1


@pytest.mark.parametrize("dtype, big", [(np.int32, 2**24), (np.uint32, 2**31), (np.int64, 2**40),
                                        (np.int64, 2**60), (np.uint64, 2**63)])
def test_large_integers_differing_by_one_are_told_apart(dtype, big):
    """float32 cannot tell 2**24 + 1 from 2**24, float64 not 2**60 + 1 from 2**60: integers are told
    apart exactly."""
    expected = np.array([big + 1, 3, big], dtype=dtype)
    got = np.array([big, 3, big], dtype=dtype)
    one = compute_errors(expected, got, atol=0.0, rtol=0.0)
    many = compute_errors_many([(expected, got), (got, got)], atol=0.0, rtol=0.0)
    assert one.err_abs == many[0].err_abs == 1.0
    assert not one.within_tolerance and not many[0].within_tolerance
    assert many[1].err_abs == 0.0 and many[1].within_tolerance


def test_lazily_negated_and_conjugated_views_are_read():
    """Complex ops leave views with torch's negative or conjugate bit, which numpy cannot read."""
    x = torch.randn(4, dtype=torch.complex64)
    negated = torch.ops.aten._neg_view(x)
    assert negated.is_neg()
    assert compute_errors(negated, -x.numpy(), atol=0.0, rtol=0.0).err_abs == 0.0
    assert compute_errors(x.conj(), np.conj(x.numpy()), atol=0.0, rtol=0.0).err_abs == 0.0
    errors = compute_errors_many([(negated, -x.numpy()), (negated, x.numpy())], atol=1e-6, rtol=0.0)
    assert errors[0].within_tolerance and not errors[1].within_tolerance


def test_beyond_where_names_the_indices_per_axis():
    where = metrics.beyond_where
    a = np.zeros((2, 4, 6, 16), np.float32)
    b = a.copy()
    b[0, :, 0:2, :] = 1  # e.g. the padded positions of one batch item
    assert where(a, b, atol=1e-4, rtol=1e-4) == "[0, :, 0:2, :] (128 of 768)"
    b = a.copy()
    b[1, 2, [0, 3, 4, 5], 7] = np.nan  # a NaN where torch has a number
    assert where(a, b, atol=1e-4, rtol=1e-4) == "[1, 2, {0, 3:6}, 7] (4 of 768)"
    b = a.copy()
    b[0, 0, 0, ::2] = 1  # many runs: the first ones and how many indices
    assert where(a, b, atol=1e-4, rtol=1e-4) == "[0, 0, 0, {0, 2, 4, ... 8 of 16}] (8 of 768)"
    b = a + 5e-5  # within atol everywhere
    assert where(a, b, atol=1e-4, rtol=0) is None
    assert where(a, b, atol=0, rtol=0) == "[:, :, :, :] (768 of 768)"


def test_beyond_where_follows_the_comparison_rule_on_special_values():
    where = metrics.beyond_where
    x = np.array([np.inf, np.nan, 1.0, -np.inf])
    assert where(x, x.copy(), atol=0, rtol=0) is None  # the same NaN/Inf pattern agrees
    assert where(x, np.array([np.inf, 1.0, 1.0, np.inf]), atol=0, rtol=0) == "[{1, 3}] (2 of 4)"
    big = np.array([100.0, 1.0], np.float32)
    assert where(big, big + np.float32(0.5), atol=0.1, rtol=0.01) == "[1] (1 of 2)"  # rtol scales with |torch|
    assert where(np.arange(5), np.array([0, 1, 2, 4, 4]), atol=0, rtol=0) == "[3] (1 of 5)"
    assert where(np.array([True, False]), np.array([True, True]), atol=0, rtol=0) == "[1] (1 of 2)"
    assert where(torch.ones(3, dtype=torch.bfloat16), np.zeros(3, np.float32), atol=0, rtol=0) == "[:] (3 of 3)"
    assert where(np.float32(1), np.float32(2), atol=0, rtol=0) is None  # no axis to name


def test_the_compiled_comparison_is_built_where_a_compiler_is():
    """setup.py builds ``_compare`` as optional: a compile error would silently fall back to numpy
    (2.5x slower comparisons). Where a C compiler exists, it must have been built."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}): numpy compares")
    assert metrics._compare is not None, \
        "sbs_widget/engine/_compare.c did not build: run pip install -e . and read its log"


def test_compiled_comparison_hands_nan_and_odd_values_to_numpy():
    """Pairs the compiled pass does not answer (NaN/Inf, not float32) are answered None, never wrong."""
    if metrics._compare is None:
        pytest.skip("sbs_widget.engine._compare was not built (no C compiler)")
    ok = np.arange(40, dtype=np.float32)
    nan = ok.copy()
    nan[3] = np.nan
    errs = metrics._compare.errors_f32(metrics.Errors, [ok, ok, ok.astype(np.float64), ok],
                                       [ok + 1, nan, ok.astype(np.float64), ok], 1e-4, 1e-4, True,
                                       metrics.HISTOGRAM_EDGES)
    assert errs[1] is None and errs[2] is None
    assert isinstance(errs[0], metrics.Errors) and errs[0].err_abs == 1.0 and errs[0].err_h01 == 40
    assert not errs[0].within_tolerance and errs[0].histogram[8] == 40
    assert errs[3][:9] == (0.0, 0.0, 0.0, 0, 0, 0, 40, True, (40,) + (0,) * 9) and errs[3].min_atol == 0.0
    # the compiled path keeps numpy's answer for the NaN pair through compute_errors_many
    assert compute_errors_many([(ok, nan)], atol=1e-4, rtol=1e-4)[0].err_nan == 1
