"""Measuring the pairs of a lockstep run (``Measurer``): values made readable, error figures for a whole batch
at once, the record fields they fill."""

from __future__ import annotations

import numpy as np
import torch

from sbs_widget import records as R
from sbs_widget.dtypes import numpy_elem_type, onnx_elem_type
from sbs_widget.engine.metrics import EMPTY_NOTE, Scratch, as_numpy, beyond_where, compute_errors_many, same_shape
from sbs_widget.engine.second_model import SecondModel
from sbs_widget.engine.tolerance import Tolerance
from sbs_widget.engine.user_metrics import Figure
from sbs_widget.engine.user_metrics import measure as measure_figures
from sbs_widget.errors import ToleranceExceeded
from sbs_widget.records import HISTOGRAM_EDGES, Record
from sbs_widget.strings import shape_type

_SHAPE_TYPES: dict[tuple, str] = {}

_DESCRIBED: dict[tuple, str] = {}  # (numpy dtype, shape) -> shape text, for the common case

def _shape_type(code: int, shape: tuple) -> str:
    """``T1s2x16x64``: formatted once per distinct (type, shape), a model has few of them."""
    key = (code, shape)
    text = _SHAPE_TYPES.get(key)
    if text is None:
        if len(_SHAPE_TYPES) > 4096:
            _SHAPE_TYPES.clear()
        text = _SHAPE_TYPES[key] = shape_type(0 if code is None else code, shape)
    return text

def _described(e: np.ndarray) -> str:
    """``_shape_type`` of a numpy array, looked up by (dtype, shape): the common case."""
    key = (e.dtype, e.shape)
    text = _DESCRIBED.get(key)
    if text is None:
        text = _DESCRIBED[key] = _shape_type(numpy_elem_type(e), e.shape)
    return text

def _numpy_of(value) -> np.ndarray:
    """``as_numpy`` with a fast path for the common case, a plain CPU tensor numpy can read."""
    if type(value) is torch.Tensor:
        try:
            return value.numpy()
        except (RuntimeError, TypeError):  # autograd, another device, bfloat16, conjugate or negative bit
            pass
    return as_numpy(value)

def _failed(rec: Record, why: str) -> tuple[Record, None, None]:
    """``rec`` marked as an error (nothing to compare), as an entry of a segment's record list."""
    rec.status = R.ERROR
    rec.comment = _join(rec.comment, why)
    return rec, None, None

def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a and b else (a or b)


class Measurer:
    """Owns the comparison of a run: its tolerance, the metrics asked for, the work buffers."""

    def __init__(self, tolerance: Tolerance, histogram: bool = True, figures: tuple[Figure, ...] = (),
                 exc: bool = False, second: SecondModel | None = None):
        self.tolerance = tolerance
        self.histogram = histogram  # fill Record.histogram
        self.figures = figures  # metrics beside the verdict (user_metrics.py)
        self.exc = exc  # raise ToleranceExceeded at the first pair beyond tolerance
        self.scratch = Scratch()  # the metrics' work buffers, for the whole run
        self.second = second  # a second ONNX model's values, measured against the same torch values

    def compare(self, rec: Record, expected, got) -> Record:
        self.compare_many([(rec, expected, got)])
        return rec

    def compare_many(self, items: list[tuple[Record, object, object]]) -> None:
        """Fill the error fields of each ``(record, torch value, ONNX value)``, all pairs at once: the
        figures of a whole segment come from a few vectorized passes (``compute_errors_many``)."""
        ready, arrays = [], []
        for rec, expected, got in items:
            # The common case, checked first: a CPU tensor and an array of the same dtype and shape.
            if type(expected) is torch.Tensor and type(got) is np.ndarray:
                try:
                    e = expected.numpy()
                except (RuntimeError, TypeError):  # autograd, another device, bfloat16, conjugate bit
                    e = None
                if e is not None and e.dtype == got.dtype and e.shape == got.shape:
                    rec.ep_shape_type = rec.onnx_shape_type = _described(e)
                    ready.append(rec)
                    arrays.append((e, got))
                    continue
            pair = self._readable(rec, expected, got)
            if pair is not None:
                ready.append(rec)
                arrays.append(pair)
        atol, rtol = self.tolerance
        errors = compute_errors_many(arrays, atol=atol, rtol=rtol, histogram=self.histogram, scratch=self.scratch)
        for rec, (err_abs, err_rel, err_dev, err_nan, h01, h001, n, within, histogram, min_atol, _, n_finite) in \
                zip(ready, errors):
            rec.err_abs, rec.err_rel, rec.err_dev, rec.min_atol = err_abs, err_rel, err_dev, min_atol
            rec.err_nan, rec.err_h01, rec.err_h001 = err_nan, h01, h001
            rec.n_elements, rec.within_tolerance, rec.histogram, rec.n_finite = n, within, histogram, n_finite
            rec.status = R.OK if within else R.MISMATCH
            if not n:  # "ok" over nothing: said so
                rec.comment = _join(rec.comment, EMPTY_NOTE)
            elif not n_finite:  # NaN against NaN everywhere: agreement, not a judgement
                rec.comment = _join(rec.comment, R.NOTHING_FINITE)
        for rec, (e, g) in zip(ready, arrays):
            if rec.status == R.MISMATCH:  # rare: one more pass over this pair only
                rec.err_where = beyond_where(e, g, atol=atol, rtol=rtol)
        if self.figures:
            for rec, (e, g) in zip(ready, arrays):
                rec.metrics = measure_figures(self.figures, e, g)
        if self.second is not None:
            self.second.measure_many([(rec, e) for rec, (e, _) in zip(ready, arrays)], atol, rtol)

    def _readable(self, rec: Record, expected, got) -> tuple[np.ndarray, np.ndarray] | None:
        """Both values as numpy arrays of one shape, or None with the record marked as an error."""
        try:
            e = _numpy_of(expected)
            g = got if type(got) is np.ndarray else as_numpy(got)
        except (TypeError, RuntimeError, ValueError) as err:  # this record says so; the run goes on
            rec.status = R.ERROR
            rec.comment = _join(rec.comment, f"cannot read the value: {err}")
            return None
        code = onnx_elem_type(expected.dtype) if isinstance(expected, torch.Tensor) else numpy_elem_type(e)
        rec.ep_shape_type = _shape_type(code, e.shape)
        g_code = numpy_elem_type(g)
        same = g_code == code and g.shape == e.shape
        rec.onnx_shape_type = rec.ep_shape_type if same else _shape_type(g_code, g.shape)
        if not same_shape(e, g):
            rec.status = R.ERROR
            rec.comment = _join(rec.comment, f"shapes differ: torch {tuple(e.shape)} vs onnx {tuple(g.shape)}")
            return None
        if code != g_code:  # (bfloat16 / float8 are read as float32 on the torch side: same code)
            torch_dtype = str(expected.dtype).removeprefix("torch.") if isinstance(expected, torch.Tensor) else e.dtype
            rec.comment = _join(rec.comment, f"dtypes differ: torch {torch_dtype} vs onnx {g.dtype}")
        return e, g

    def check_exc(self, rec: Record) -> None:
        if self.exc and rec.status == R.MISMATCH:
            raise ToleranceExceeded(
                f"beyond tolerance (atol={self.tolerance.atol}, rtol={self.tolerance.rtol}) at FX node {rec.ep_name!r} "
                f"({rec.ep_target}, {rec.ep_shape_type}) vs ONNX value {rec.onnx_name!r} "
                f"({rec.onnx_op_type} node {rec.onnx_node_name!r}, {rec.onnx_shape_type}): "
                f"err_abs={rec.err_abs:.3g} err_rel={rec.err_rel:.3g} err_nan={rec.err_nan}"
                + (f", beyond tolerance at {rec.err_where}" if rec.err_where else ""),
                rec,
            )

    def identical(self, rec: Record, value: torch.Tensor) -> Record:
        """``rec`` filled as measuring a value against its own bits (all finite) would fill it."""
        e = value.detach().numpy()  # (a view of a parameter may require grad)
        rec.ep_shape_type = rec.onnx_shape_type = _described(e)
        rec.err_abs = rec.err_rel = rec.err_dev = rec.min_atol = 0.0
        rec.err_nan = rec.err_h01 = rec.err_h001 = 0
        rec.n_elements, rec.within_tolerance, rec.status = e.size, True, R.OK
        rec.n_finite = e.size
        rec.histogram = (e.size,) + (0,) * (len(HISTOGRAM_EDGES) - 1) if self.histogram else None
        if not e.size:
            rec.comment = _join(rec.comment, EMPTY_NOTE)
        if self.figures:  # (the same bits on both sides: what the metrics say of equal values)
            rec.metrics = measure_figures(self.figures, e, e)
        return rec
