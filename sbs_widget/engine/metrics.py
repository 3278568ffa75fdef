"""Error figures between a torch value (expected) and an ONNX value (got)."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from sbs_widget.records import HISTOGRAM_EDGES

try:  # the compiled pass over float32 pairs (sbs_widget/engine/_compare.c); numpy's batches without it
    from sbs_widget.engine import _compare
except ImportError:  # built without a C compiler
    _compare = None

BATCH_ELEMENTS = 1 << 16  # elements per vectorized pass: its temporaries stay in cache (and small)
# The comment of a pair of empty values (0 elements): "ok", yet no number was compared, only shapes.
EMPTY_NOTE = "empty (0 elements): nothing compared but the shapes"


class Errors(NamedTuple):  # one per compared pair: a tuple, built and unpacked fast
    err_abs: float
    err_rel: float
    err_dev: float
    err_nan: int
    err_h01: int
    err_h001: int
    n_elements: int
    within_tolerance: bool
    histogram: tuple[int, ...] | None = None
    min_atol: float = 0.0  # the smallest atol the pair passes at this rtol (inf: NaN/Inf disagree)
    scale: float = 0.0     # max |expected| over finite positions
    # elements compared where both sides are finite (n_elements unless NaN/Inf: NaN on both sides at one
    # place agrees, yet compares no number; 0 of n: the pair judged nothing)
    n_finite: int = 0


_new_errors = tuple.__new__  # (Errors, fields): skips NamedTuple's Python-level __new__


def as_numpy(value) -> np.ndarray:
    """A numpy view of a torch tensor / numpy array / OrtValue / python scalar; no copy when possible.

    Numbers are compared in numpy: it is single-threaded and predictable, while torch's thread pool
    costs more than the work on the many small tensors of a comparison.
    """
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype.is_floating_point and t.dtype not in (torch.float16, torch.float32, torch.float64) or \
                t.dtype.is_complex and t.dtype not in (torch.complex64, torch.complex128):
            t = t.to(torch.float32)  # bfloat16, float8: numpy has no such type (float32 holds them exactly)
        if t.is_conj():
            t = t.resolve_conj()
        if t.is_neg():  # a lazily negated view (complex conjugates): numpy cannot read the bit
            t = t.resolve_neg()
        return t.numpy()
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (bool, int, float, np.generic)):
        return np.asarray(value)
    if hasattr(value, "numpy"):  # OrtValue
        return np.asarray(value.numpy())
    if hasattr(value, "__int__"):  # SymInt with a hint
        return np.asarray(int(value))
    raise TypeError(f"cannot compare a value of type {type(value).__name__}")


def same_shape(expected, got) -> bool:
    """Equal shapes, treating torch 0-d tensors and ONNX [1] tensors as equal (the exporter does that)."""
    es, gs = tuple(expected.shape), tuple(got.shape)
    if es == gs:
        return True
    return int(np.prod(es)) == int(np.prod(gs)) == 1


_EDGES = tuple(HISTOGRAM_EDGES[1:])


def _histogram(diff: np.ndarray, top: float) -> tuple[int, ...]:
    """Counts of |diff| per decade bucket. Edges above the largest diff cost nothing: on agreeing
    values (the common case) this is one or two comparisons, not a search per element."""
    above = [int(diff.size)]
    for edge in _EDGES:
        above.append(int(np.count_nonzero(diff >= edge)) if edge <= top else 0)
    above.append(0)
    return tuple(above[i] - above[i + 1] for i in range(len(HISTOGRAM_EDGES)))


def compute_errors(expected, got, *, atol: float, rtol: float, histogram: bool = False) -> Errors:
    """Compare ``got`` (ONNX) with ``expected`` (torch). Shapes must already agree (``same_shape``).

    Works for float, int and bool tensors; NaN/Inf never raise: positions where the non-finite pattern
    differs are counted in ``err_nan`` and excluded from the other figures. A pair where a side holds
    integers or bools is compared exactly (``exact``): a token id off by 2 at 30,000 is wrong, although
    within rtol * |torch| = 3.
    """
    e = as_numpy(expected)
    g = as_numpy(got)
    n = int(e.size)
    if n == 0:
        return Errors(0.0, 0.0, 0.0, 0, 0, 0, 0, True, (0,) * len(HISTOGRAM_EDGES) if histogram else None, 0.0,
                      0.0, 0)
    is_exact = exact(e, g)
    if is_exact:
        atol = rtol = 0.0
    e = e.reshape(-1)
    g = g.reshape(-1)
    if np.iscomplexobj(e) or np.iscomplexobj(g):
        e = np.concatenate([e.real, e.imag]).astype(np.float64)
        g = np.concatenate([g.real, g.imag]).astype(np.float64)
    calc = _calc_dtype(e, g)
    wide_ints = (e, g) if e.dtype == g.dtype and e.dtype.kind in "iu" and e.dtype.itemsize == 8 else None
    e = e.astype(calc, copy=False)
    g = g.astype(calc, copy=False)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: handled below
        diff = np.subtract(e, g)
        np.abs(diff, out=diff)
        if wide_ints is not None:
            _exact_integer_differences(diff, *wide_ints)
        top = diff.max()
        if math.isfinite(top):
            err_nan = 0
            ae = np.abs(e)
        else:  # NaN or Inf somewhere: compare the finite positions, count the others
            fe, fg = np.isfinite(e), np.isfinite(g)
            same_nonfinite = (~fe) & (~fg) & ((e == g) | (np.isnan(e) & np.isnan(g)))
            err_nan = int(((fe != fg) | ((~fe) & (~fg) & ~same_nonfinite)).sum())
            keep = fe & fg
            diff = diff[keep]
            ae = np.abs(e[keep])
            top = diff.max() if diff.size else 0.0
    scale = float(ae.max()) if ae.size and not is_exact and e.dtype.kind == "f" else 0.0
    if diff.size == 0 or top == 0.0:
        hist = ((int(diff.size),) + (0,) * (len(HISTOGRAM_EDGES) - 1)) if histogram else None
        return Errors(0.0, 0.0, 0.0, err_nan, 0, 0, n, err_nan == 0, hist, math.inf if err_nan else 0.0, scale,
                      min(n, int(diff.size)))
    err_abs = float(top)
    err_rel = float((diff / np.maximum(ae, 1e-6)).max())
    err_dev = float(np.sqrt(np.dot(diff, diff) / diff.size))
    h01 = int(np.count_nonzero(diff > 0.1)) if err_abs > 0.1 else 0
    h001 = int(np.count_nonzero(diff > 0.01)) if err_abs > 0.01 else 0
    within = err_nan == 0 and (err_abs <= atol or bool((diff <= atol + rtol * ae).all()))
    hist = _histogram(diff, err_abs) if histogram else None
    if err_nan:
        min_atol = math.inf
    elif is_exact or not rtol:
        min_atol = err_abs
    else:
        min_atol = max(0.0, float((diff - rtol * ae).max()))
    return Errors(err_abs, err_rel, err_dev, err_nan, h01, h001, n, within, hist, min_atol, scale,
                  min(n, int(diff.size)))


def beyond_where(expected, got, *, atol: float, rtol: float) -> str | None:
    """Where the elements beyond tolerance lie: per axis, the indices holding at least one (``:``
    for all of them), then how many there are, e.g. ``[0, :, 0:2, :] (128 of 768)``. It tells a
    difference confined to some rows (padded positions, one batch item, one channel) from one spread
    everywhere. Same rule as ``compute_errors``: |diff| > atol + rtol * |torch|, or a different NaN/Inf
    pattern; integers and bools exactly. None when no element is beyond tolerance or the value has no
    axis."""
    e, g = as_numpy(expected), as_numpy(got)
    if e.ndim == 0 or e.shape != g.shape or e.size == 0:
        return None
    if exact(e, g):
        atol = rtol = 0.0
    if np.iscomplexobj(e) or np.iscomplexobj(g):
        e, g = e.astype(np.complex128), g.astype(np.complex128)
    else:
        calc = _calc_dtype(e, g)
        e, g = e.astype(calc, copy=False), g.astype(calc, copy=False)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(e - g)
        bad = ~(diff <= atol + rtol * np.abs(e))  # NaN (NaN, inf - inf) is not <=: beyond
        if e.dtype.kind in "fc" and not np.isfinite(diff.max()):  # NaN/Inf somewhere
            suspects = np.flatnonzero(~np.isfinite(diff))  # the same infinity, NaN on both sides agree
            eb, gb = e.reshape(-1)[suspects], g.reshape(-1)[suspects]
            # the others are beyond: inf vs -inf or vs a number is not <= atol + rtol * inf
            bad.reshape(-1)[suspects] = ~((eb == gb) | (np.isnan(eb) & np.isnan(gb)))
    count = int(np.count_nonzero(bad))
    if not count:
        return None
    axes = range(e.ndim)
    if count == e.size:
        return f"[{', '.join(':' for _ in axes)}] ({count} of {e.size})"
    where = [_index_set(bad.any(axis=tuple(j for j in axes if j != k))) for k in axes]
    return f"[{', '.join(where)}] ({count} of {e.size})"


def _index_set(any_bad: np.ndarray, most: int = 4) -> str:
    """The indices where ``any_bad`` is true: ``:`` for all of them, else runs of consecutive indices
    as slices: ``3``, ``0:2``, ``{0, 5:9, 12}``; past ``most`` runs, the first ones and how many."""
    flags = any_bad.tolist()  # short (one axis): plain Python beats numpy's per-call cost here
    if all(flags):
        return ":"
    runs: list[list[int]] = []
    for i, flag in enumerate(flags):
        if flag:
            if runs and runs[-1][1] == i:
                runs[-1][1] = i + 1
            else:
                runs.append([i, i + 1])
    parts = [str(a) if b == a + 1 else f"{a}:{b}" for a, b in runs]
    if len(parts) == 1:
        return parts[0]
    if len(parts) > most:
        parts = parts[:most - 1] + [f"... {sum(flags)} of {len(flags)}"]
    return "{" + ", ".join(parts) + "}"


def exact(e: np.ndarray, g: np.ndarray) -> bool:
    """Whether the pair is compared exactly: a side holds integers or bools (ids, indices, counts,
    masks), where a float tolerance is meaningless and a difference of 1 is a wrong answer."""
    return e.dtype.kind in "iub" or g.dtype.kind in "iub"


def _exact_integer_differences(diff: np.ndarray, e: np.ndarray, g: np.ndarray) -> None:
    """64-bit integers above 2**53 that differ can round to the same float64: such positions get
    their exact difference (Python integers, only where it was lost)."""
    lost = (e != g) & (diff == 0)
    if lost.any():
        diff[lost] = [float(abs(int(a) - int(b))) for a, b in zip(e[lost].tolist(), g[lost].tolist())]


def _calc_dtype(e: np.ndarray, g: np.ndarray):
    """float32 where it holds both sides exactly, float64 otherwise: integers of 4 bytes or more
    (float32 stops telling consecutive integers apart at 2**24: 16777217 and 16777216 would agree;
    float64 at 2**53, where ``_exact_integer_differences`` takes over)."""
    wide = e.dtype == np.float64 or g.dtype == np.float64 or \
        (e.dtype.kind in "iu" and e.dtype.itemsize >= 4) or (g.dtype.kind in "iu" and g.dtype.itemsize >= 4)
    return np.float64 if wide else np.float32


class Scratch:
    """Work buffers reused by every batch of a run (``compute_errors_many(..., scratch=)``): fresh
    temporaries per batch would each be faulted in from the system again once the run hands freed
    memory back between segments."""

    def __init__(self):
        self._buffers: dict[tuple[str, type], np.ndarray] = {}

    def get(self, name: str, size: int, dtype) -> np.ndarray:
        buf = self._buffers.get((name, dtype))
        if buf is None or buf.size < size:
            # Grown by powers of two, up to what a batch needs: a model whose only non-float32 values
            # are a few masks keeps a few kB here, not BATCH_ELEMENTS of each dtype.
            grown = 1 << max(10, (size - 1).bit_length())
            buf = self._buffers[(name, dtype)] = np.empty(max(size, min(grown, BATCH_ELEMENTS)), dtype)
        return buf[:size]


def compute_errors_many(pairs, *, atol: float, rtol: float, histogram: bool = False,
                        scratch: Scratch | None = None) -> list[Errors]:
    """``compute_errors`` for many ``(expected, got)`` pairs, same results, far fewer numpy calls.

    A model has thousands of small values: per pair, numpy's call overhead costs more than the
    arithmetic. float32 pairs (nearly all of a run) go to the compiled module ``_compare``: one pass
    per pair, all pairs in one call, the GIL released (2.5x less time than numpy on a run's pairs).
    Other pairs (and float32 ones where the module was not built) are concatenated (up to
    ``BATCH_ELEMENTS`` at a time) and reduced per pair with ``reduceat``; big pairs and pairs with
    NaN/Inf, complex or empty values take the one-pair path. Integer and bool pairs share the float
    batches (same tolerances) and are judged exactly afterwards (``exact``).
    ``scratch``: buffers to work in, kept by the caller between calls.
    """
    scratch = scratch if scratch is not None else Scratch()
    out: list[Errors | None] = [None] * len(pairs)
    batches: dict[type, tuple[list, list, list, list]] = {}  # calc dtype -> (indices, torch, onnx, sizes)
    totals: dict[type, int] = {}
    f32, most = _FLOAT32, BATCH_ELEMENTS
    compiled = ([], [], []) if _compare is not None else None  # float32 pairs for the compiled pass
    exact_pairs = []  # batched integer/bool pairs: within tolerance only when equal
    for i, (expected, got) in enumerate(pairs):
        e = expected if type(expected) is np.ndarray else as_numpy(expected)
        g = got if type(got) is np.ndarray else as_numpy(got)
        size = e.size
        if compiled is not None and e.dtype is f32 and g.dtype is f32 and size and size == g.size:
            compiled[0].append(i)
            compiled[1].append(e)
            compiled[2].append(g)
            continue
        if e.dtype is f32 and g.dtype is f32 and 0 < size < most and size == g.size:
            calc = np.float32  # the common case, told first
        else:
            ek, gk = e.dtype.kind, g.dtype.kind
            # Big pairs gain nothing from batching (and np.dot sums their squares more accurately).
            # (and 64-bit integers: exact differences beyond float64's 2**53 need the one-pair path)
            if size == 0 or size >= most or size != g.size or ek == "c" or gk == "c" or \
                    (ek in "iu" and e.itemsize == 8):
                out[i] = compute_errors(e, g, atol=atol, rtol=rtol, histogram=histogram)
                continue
            if ek in "iub" or gk in "iub":  # (exact(e, g), told where the kinds are at hand)
                exact_pairs.append(i)
            calc = _calc_dtype(e, g)
        batch = batches.get(calc)
        total = totals.get(calc, 0)
        if batch is None:
            batch = batches[calc] = ([], [], [], [])
        elif total + size > most:  # full: a batch never outgrows the scratch buffers
            _reduce_batch(out, *batch, calc, atol, rtol, histogram, scratch, total)
            batch = batches[calc] = ([], [], [], [])
            total = 0
        batch[0].append(i)
        batch[1].append(e)
        batch[2].append(g)
        batch[3].append(size)
        totals[calc] = total + size
    for calc, batch in batches.items():
        _reduce_batch(out, *batch, calc, atol, rtol, histogram, scratch, totals[calc])
    for i in exact_pairs:  # the float rule let a nonzero integer difference pass: it may not
        err = out[i]
        if err.err_abs:
            out[i] = err._replace(within_tolerance=False, min_atol=err.err_abs, scale=0.0)
        elif err.scale:
            out[i] = err._replace(scale=0.0)
    if compiled and compiled[0]:
        idx, es, gs = compiled
        for i, e, g, err in zip(idx, es, gs, _compare.errors_f32(Errors, es, gs, atol, rtol, histogram,
                                                                  HISTOGRAM_EDGES)):
            out[i] = err if err is not None else compute_errors(e, g, atol=atol, rtol=rtol, histogram=histogram)
    return out  # type: ignore[return-value]


_FLOAT32 = np.dtype(np.float32)


def _reduce_batch(out, idx, es, gs, sizes, calc, atol, rtol, histogram, scratch: Scratch, total: int) -> None:
    k = len(es)
    n = np.array(sizes, dtype=np.int64)
    starts = np.zeros(k, dtype=np.int64)
    np.cumsum(n[:-1], out=starts[1:])
    ae, diff = scratch.get("ae", total, calc), scratch.get("diff", total, calc)
    mask = scratch.get("mask", total, np.bool_)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        # Two concatenations (flattened, cast on the way) instead of a few numpy calls per pair.
        np.concatenate(es, axis=None, out=ae, casting="unsafe")
        np.concatenate(gs, axis=None, out=diff, casting="unsafe")
        np.subtract(ae, diff, out=diff)
        np.abs(ae, out=ae)
        np.abs(diff, out=diff)
        top = np.maximum.reduceat(diff, starts)  # NaN/Inf propagate: such pairs go one by one
        finite = np.isfinite(top)
        highest = float(top[finite].max()) if finite.any() else 0.0
        # Passes whose answer the highest |diff| already gives are skipped: on agreeing values (the
        # common case) the tolerance test, h01/h001 and most histogram buckets cost nothing.
        scale = np.maximum.reduceat(ae, starts).tolist()
        tmp = scratch.get("tmp", total, calc)
        np.multiply(ae, rtol, out=tmp)
        np.subtract(diff, tmp, out=tmp)  # the atol each element needs
        slack = np.maximum.reduceat(tmp, starts).tolist()
        if highest > atol:
            viol = _count_per_pair(np.greater(tmp, atol, out=mask), starts).tolist()
        else:
            viol = _ZEROS[:k] if k <= len(_ZEROS) else [0] * k
        eps = calc(1e-6)
        ae[np.less(ae, eps, out=mask)] = eps  # max(|torch|, 1e-6): a masked write is 3x faster than np.maximum
        rel = np.maximum.reduceat(np.divide(diff, ae, out=ae), starts)
        dev = np.sqrt(np.add.reduceat(np.square(diff, out=ae), starts) / n)  # |torch| no longer read
        zero = viol if highest <= atol else [0] * k
        h01 = _count_per_pair(np.greater(diff, 0.1, out=mask), starts).tolist() if highest > 0.1 else zero
        h001 = _count_per_pair(np.greater(diff, 0.01, out=mask), starts).tolist() if highest > 0.01 else zero
        if histogram:  # counts at or above each edge, then per bucket
            above = np.zeros((k, len(HISTOGRAM_EDGES) + 1), np.int64)
            above[:, 0] = n
            for b, edge in enumerate(_EDGES, start=1):
                if edge > highest:
                    break
                above[:, b] = _count_per_pair(np.greater_equal(diff, edge, out=mask), starts)
            hist = list(map(tuple, (above[:, :-1] - above[:, 1:]).tolist()))
        else:
            hist = _NONES[:k] if k <= len(_NONES) else [None] * k
    new = _new_errors
    for i, t, ok, r, d, c01, c001, v, size, hst, e, g, sl, sc in zip(
            idx, top.tolist(), finite.tolist(), rel.tolist(), dev.tolist(), h01, h001, viol, sizes, hist, es, gs,
            slack, scale):
        if not ok:
            out[i] = compute_errors(e, g, atol=atol, rtol=rtol, histogram=histogram)
        elif t == 0.0:
            out[i] = new(Errors, (0.0, 0.0, 0.0, 0, 0, 0, size, True, hst, 0.0, sc, size))
        else:
            out[i] = new(Errors, (t, r, d, 0, c01, c001, size, t <= atol or v == 0, hst, max(0.0, sl), sc, size))


_ZEROS = [0] * 4096   # read-only stand-ins for the columns a batch skips (sliced, never written)
_NONES = [None] * 4096


def _count_per_pair(mask: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Number of True per pair: a uint8 view summed into int32 (2x faster than into int64; a batch
    holds fewer than 2**31 elements)."""
    return np.add.reduceat(mask.view(np.uint8), starts, dtype=np.int32)
