"""Noise or bug: a difference beyond tolerance judged against a reference closer to exact.

Two correct implementations of a node round differently; where a long dot product cancels to near
zero, both are far from each other compared with the value, and a fixed atol/rtol calls that a bug.
With the node rerun in float64 on the same inputs (``engine/reference.py``) as the reference R, torch's
own error e_t = |T - R| and onnxruntime's e_o = |O - R| (the ONNX node run on torch's inputs) can be
compared element by element. The rule:

    e_o <= FACTOR * max(e_t, comparable(e_t)) + ULPS * eps * |R|     at every element (finite ones)

- ``e_t`` at the element: where torch itself is off, onnxruntime may be too;
- ``comparable(e_t)``: torch's largest error over the elements no larger than this one (or than the
  median magnitude): an element near zero where a long dot product cancels carries the rounding of its
  summands, which elements of comparable size show, and an element torch computed exactly by luck
  does not demand the same luck of onnxruntime; much larger elements (fill values such as -65504,
  which absorb what is added to them) do not loosen the bound of the others;
- ``ULPS * eps * |R|``: a few units in the last place of the program's precision, for ops torch
  computes with a wider accumulator or exactly (its error is then ~0).
NaN/Inf must sit where torch has them. ``FACTOR`` and ``ULPS`` were measured on correct exports (see
docs/measurements.md): onnxruntime's error stays within them; a real fault (a wrong constant, an axis,
1e-3 relative on a weight) exceeds them by orders of magnitude.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

try:  # the verdict of a float32 pair in two passes (sbs_widget/engine/_noise.c); numpy's path without it
    from sbs_widget.engine import _noise
except ImportError:  # pragma: no cover - built without a C compiler
    _noise = None

FACTOR = 8.0
ULPS = 8.0


class Verdict(NamedTuple):
    noise: bool
    err_torch: float      # max |torch - reference|
    err_onnx: float       # max |onnx - reference|
    scale: float          # max |reference| (finite)
    excess: float         # max of e_o / bound over the elements beyond the first bound (<= 1: noise)


def judge(torch_value, onnx_value, reference: torch.Tensor, eps: float, largest: float | None = None) -> Verdict:
    """The verdict on one pair; ``eps``: machine epsilon of the program's precision (of ``torch_value``),
    ``largest``: its largest finite number (where the exact value lies at the edge of the range, one
    side may round to it and the other overflow to inf: rounding too)."""
    r = reference.detach().cpu().reshape(-1).to(torch.float64).numpy()
    compiled = _compiled(torch_value, onnx_value, r, eps)
    if compiled is not None:
        return compiled
    t = _as_f64(torch_value).reshape(-1)
    o = _as_f64(onnx_value).reshape(-1)
    if not (r.size == t.size == o.size):
        raise ValueError(f"sizes differ: reference {r.size}, torch {t.size}, onnx {o.size}")
    ft, fo, fr = np.isfinite(t), np.isfinite(o), np.isfinite(r)
    differ = np.flatnonzero((ft != fo) | (~ft & ~fo & ~((t == o) | (np.isnan(t) & np.isnan(o)))))
    same_pattern = differ.size == 0
    if not same_pattern and largest is not None:
        td, od, rd = t[differ], o[differ], r[differ]
        edge = np.isfinite(rd) & (np.abs(rd) >= largest * (1 - ULPS * eps)) & \
            (np.sign(td) == np.sign(rd)) & (np.sign(od) == np.sign(rd))
        same_pattern = bool(edge.all())  # an overflow at the edge of the range, on one side only
        ft[differ] = fo[differ] = False  # not compared further
    keep = ft & fo & fr
    if not keep.any():
        return Verdict(same_pattern, 0.0, 0.0, 0.0, 0.0 if same_pattern else math.inf)
    if not keep.all():
        t, o, r = t[keep], o[keep], r[keep]
    ar = np.abs(r)
    e_t = np.abs(t - r)
    e_o = np.abs(o - r)
    bound = FACTOR * e_t + ULPS * eps * ar
    over = np.flatnonzero(e_o > bound)  # usually few (elements near zero): only they need the rest
    excess = 1.0 if e_o.size and not over.size else 0.0  # (within every bound: at most 1)
    if over.size:
        bound_over = bound[over] + FACTOR * np.maximum(_comparable_error(e_t, ar, over) - e_t[over], 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            excess = float(np.max(np.where(e_o[over] == 0, 0.0, e_o[over] / bound_over)))
    return Verdict(same_pattern and excess <= 1.0, float(e_t.max()), float(e_o.max()), float(ar.max()), excess)


def _comparable_error(e_t: np.ndarray, ar: np.ndarray, at: np.ndarray) -> np.ndarray:
    """For the elements ``at``: torch's largest error over the elements no larger than each, to a
    factor of 2 (or than the median magnitude, for the small ones). An element near zero where a
    long sum cancels has the error of its summands, not of its value: elements of comparable size
    tell it. Larger elements (a fill value of -65504 absorbing the score added to it) do not loosen
    the bound of smaller ones."""
    step = max(1, ar.size // 8192)  # the median of a strided sample: a cut, not a statistic
    cut = float(np.median(ar[::step]))
    limits = np.maximum(ar[at], cut)
    # Magnitudes to a factor of 2 (binary exponents). Few distinct exponents among the elements
    # asked for (the usual case): a masked max per exponent; else a radix sort and a running max.
    exps, wanted = _exponents(ar), _exponents(limits)
    distinct = np.unique(wanted)
    if distinct.size <= 16:
        best = {int(e): float(e_t[exps <= e].max()) for e in distinct.tolist()}
        return np.array([best[e] for e in wanted.tolist()])
    order = np.argsort(exps, kind="stable")
    running = np.maximum.accumulate(e_t[order])
    where = np.searchsorted(exps[order], wanted, side="right") - 1
    return running[np.clip(where, 0, len(running) - 1)]


def _exponents(a: np.ndarray) -> np.ndarray:
    """Binary exponents of ``a`` (>= 0) as int16, zeros lowest: |x| < 2**e."""
    _, e = np.frexp(a)
    e = e.astype(np.int16)
    e[a == 0] = np.iinfo(np.int16).min
    return e


def _compiled(torch_value, onnx_value, r: np.ndarray, eps: float) -> Verdict | None:
    """The compiled verdict for float32/float16/bfloat16 pairs that are finite everywhere (the usual
    case), else None (numpy's path). Half precision is widened to float32 exactly."""
    if _noise is None:
        return None
    t, o = _as_f32(torch_value), _as_f32(onnx_value)
    if t is None or o is None or not (t.size == o.size == r.size):
        return None
    figures = _noise.judge_f32(t, o, r, eps, FACTOR, ULPS)
    if figures is None:  # NaN/Inf somewhere: numpy's path judges where they sit
        return None
    err_torch, err_onnx, scale, excess = figures
    return Verdict(excess <= 1.0, err_torch, err_onnx, scale, excess)


_WIDENED = (torch.float32, torch.float16, torch.bfloat16)


def _as_f32(value) -> np.ndarray | None:
    """``value`` as a C-contiguous float32 array (exact), or None when it is of another type."""
    if isinstance(value, torch.Tensor):
        if value.dtype not in _WIDENED:
            return None
        return np.ascontiguousarray(value.detach().cpu().reshape(-1).to(torch.float32).numpy())
    if isinstance(value, np.ndarray) and value.dtype in (np.float32, np.float16):
        return np.ascontiguousarray(value.reshape(-1), dtype=np.float32)
    return None


def _as_f64(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().to(torch.float64).numpy()
    return np.asarray(value, dtype=np.float64)


def largest(value) -> float | None:
    """The largest finite number of ``value``'s floating type, None for other types."""
    dtype = getattr(value, "dtype", None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return float(torch.finfo(dtype).max)
    return None


def epsilon(value) -> float:
    """Machine epsilon of ``value``'s floating type (float32's for anything else)."""
    dtype = getattr(value, "dtype", None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return float(torch.finfo(dtype).eps)
    if isinstance(dtype, np.dtype) and dtype.kind == "f":
        return float(np.finfo(dtype).eps)
    return float(torch.finfo(torch.float32).eps)
