"""Error figures between a torch value (expected) and an ONNX value (got)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .records import HISTOGRAM_EDGES

_HIST_EDGES = torch.tensor(HISTOGRAM_EDGES[1:], dtype=torch.float64)


@dataclass
class Errors:
    err_abs: float
    err_rel: float
    err_dev: float
    err_nan: int
    err_h01: int
    err_h001: int
    n_elements: int
    within_tolerance: bool
    histogram: tuple[int, ...] | None = None


def as_torch(value) -> torch.Tensor:
    """A torch view of a numpy array / OrtValue / python scalar; no copy when possible."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise TypeError("object arrays (strings) cannot be compared numerically")
        if not value.flags.writeable:
            value = value.copy()
        return torch.from_numpy(value) if value.dtype.kind != "V" else torch.from_numpy(value.copy())
    if isinstance(value, (bool, int, float)):
        return torch.tensor(value)
    if hasattr(value, "numpy"):  # OrtValue
        return torch.from_numpy(value.numpy())
    raise TypeError(f"cannot compare a value of type {type(value).__name__}")


def same_shape(expected: torch.Tensor, got: torch.Tensor) -> bool:
    """Equal shapes, treating torch 0-d tensors and ONNX [1] tensors as equal (the exporter does that)."""
    if tuple(expected.shape) == tuple(got.shape):
        return True
    return expected.numel() == got.numel() == 1


def compute_errors(expected, got, *, atol: float, rtol: float, histogram: bool = False) -> Errors:
    """Compare ``got`` (ONNX) with ``expected`` (torch). Shapes must already agree (``same_shape``).

    Works for float, int and bool tensors; NaN/Inf never raise: positions where the non-finite pattern
    differs are counted in ``err_nan`` and excluded from the other figures.
    """
    e = as_torch(expected).detach()
    g = as_torch(got).detach()
    if e.device != g.device:
        g = g.to(e.device)
    n = e.numel()
    if n == 0:
        return Errors(0.0, 0.0, 0.0, 0, 0, 0, 0, True, (0,) * len(HISTOGRAM_EDGES) if histogram else None)
    e = e.reshape(-1)
    g = g.reshape(-1)
    calc = torch.float64 if (e.dtype == torch.float64 or g.dtype == torch.float64) else torch.float32
    if e.dtype.is_complex or g.dtype.is_complex:
        e = torch.view_as_real(e.to(torch.complex128)).reshape(-1)
        g = torch.view_as_real(g.to(torch.complex128)).reshape(-1)
        calc = torch.float64
    if e.dtype != calc:
        e = e.to(calc)
    if g.dtype != calc:
        g = g.to(calc)
    fe = torch.isfinite(e)
    fg = torch.isfinite(g)
    if bool(fe.all()) and bool(fg.all()):
        err_nan = 0
        diff = (e - g).abs_()
        ae = e.abs()
    else:
        # Non-finite on both sides with the same value (inf == inf, nan vs nan) is agreement.
        same_nonfinite = (~fe) & (~fg) & ((e == g) | (torch.isnan(e) & torch.isnan(g)))
        bad = (fe != fg) | ((~fe) & (~fg) & ~same_nonfinite)
        err_nan = int(bad.sum())
        keep = fe & fg
        diff = (e[keep] - g[keep]).abs_()
        ae = e[keep].abs()
    if diff.numel() == 0:
        err_abs = err_rel = err_dev = 0.0
        h01 = h001 = 0
        within = err_nan == 0
        hist = None
    else:
        err_abs = float(diff.max())
        err_rel = float((diff / ae.clamp_min(1e-6)).max())
        err_dev = float(diff.square().mean().sqrt())
        h01 = int((diff > 0.1).sum())
        h001 = int((diff > 0.01).sum())
        within = err_nan == 0 and (err_abs <= atol or bool((diff <= atol + rtol * ae).all()))
        hist = None
        if histogram:
            idx = torch.bucketize(diff.to(torch.float64), _HIST_EDGES, right=True)
            hist = tuple(int(c) for c in torch.bincount(idx, minlength=len(HISTOGRAM_EDGES)))
    return Errors(err_abs, err_rel, err_dev, err_nan, h01, h001, n, within, hist)
