"""Metrics beside the verdict: figures a user asks for (``metrics=``), measured on every compared
pair and carried by the record (``Record.metrics``), the table, the DataFrame and the CLI.

The verdict stays the ``Tolerance``'s: a metric describes a pair, it never judges it. Named metrics:

- ``max_abs``: max |onnx - torch|; ``max_rel``: max |onnx - torch| / |torch| (|torch| at least 1e-6);
- ``cosine``: cosine similarity of the two values flattened (1 when both are all zeros);
- ``sqnr_db``: signal-to-quantization-noise ratio, 10 log10(sum torch^2 / sum (onnx - torch)^2), in dB
  (inf when equal): the figure quantization work reads;
- ``nmse``: sum (onnx - torch)^2 / sum torch^2;
- ``top1``, ``top5``, ``top<k>``: for logits, the share of rows (over the last axis) whose k largest
  entries are the same set on both sides.

Each is computed in float64 over the positions where both sides are finite (NaN and Inf are counted by
``err_nan``); a pair with none gives NaN. A callable ``f(torch_value, onnx_value) -> float`` (numpy
arrays of one shape) is a metric named by its ``__name__``, or by its key when ``metrics`` is a dict.

>>> import numpy as np
>>> figures = resolve_metrics(["cosine", "sqnr_db"])
>>> measure(figures, np.array([1.0, 2.0]), np.array([1.0, 2.0]))
{'cosine': 1.0, 'sqnr_db': inf}
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Callable, Iterable, Mapping

import numpy as np

from sbs_widget.errors import InputError

Metric = Callable[[np.ndarray, np.ndarray], float]
_TOP = re.compile(r"^top(\d+)$")


def _finite_pair(e: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    e = np.asarray(e, dtype=np.float64).reshape(-1)
    g = np.asarray(g, dtype=np.float64).reshape(-1)
    keep = np.isfinite(e) & np.isfinite(g)
    return (e, g) if keep.all() else (e[keep], g[keep])


def max_abs(e: np.ndarray, g: np.ndarray) -> float:
    e, g = _finite_pair(e, g)
    return float(np.abs(g - e).max()) if e.size else math.nan


def max_rel(e: np.ndarray, g: np.ndarray) -> float:
    e, g = _finite_pair(e, g)
    return float((np.abs(g - e) / np.maximum(np.abs(e), 1e-6)).max()) if e.size else math.nan


def cosine(e: np.ndarray, g: np.ndarray) -> float:
    e, g = _finite_pair(e, g)
    if not e.size:
        return math.nan
    ne, ng = float(np.linalg.norm(e)), float(np.linalg.norm(g))
    if ne == 0.0 or ng == 0.0:
        return 1.0 if ne == ng else 0.0
    return float(np.dot(e, g) / (ne * ng))


def sqnr_db(e: np.ndarray, g: np.ndarray) -> float:
    e, g = _finite_pair(e, g)
    if not e.size:
        return math.nan
    noise = float(np.sum((g - e) ** 2))
    signal = float(np.sum(e ** 2))
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def nmse(e: np.ndarray, g: np.ndarray) -> float:
    e, g = _finite_pair(e, g)
    if not e.size:
        return math.nan
    signal = float(np.sum(e ** 2))
    noise = float(np.sum((g - e) ** 2))
    if signal == 0.0:
        return 0.0 if noise == 0.0 else math.inf
    return noise / signal


def top_k_agreement(k: int) -> Metric:
    """The share of rows (last axis) whose ``k`` largest entries are the same set on both sides."""

    def top(e: np.ndarray, g: np.ndarray) -> float:
        e, g = np.asarray(e), np.asarray(g)
        if e.ndim == 0 or e.shape[-1] < k or e.size == 0:
            return math.nan
        e2, g2 = e.reshape(-1, e.shape[-1]), g.reshape(-1, g.shape[-1])
        return float(np.mean(np.all(_largest(e2, k) == _largest(g2, k), axis=-1)))

    top.__name__ = f"top{k}"
    return top


def _largest(rows: np.ndarray, k: int) -> np.ndarray:
    """The indices of each row's ``k`` largest entries, sorted: found in linear time, NaN counting as
    -inf (never among them). Compared in the rows' own float type: the order is the same in float64."""
    if rows.dtype.kind != "f" or rows.dtype.itemsize < 4:
        rows = rows.astype(np.float64)
    if np.isnan(rows).any():
        rows = np.nan_to_num(rows, nan=-np.inf)
    return np.sort(np.argpartition(-rows, k - 1, axis=-1)[:, :k], axis=-1)


NAMED: dict[str, Metric] = {"max_abs": max_abs, "max_rel": max_rel, "cosine": cosine, "sqnr_db": sqnr_db,
                            "nmse": nmse}


@dataclasses.dataclass(frozen=True)
class Figure:
    """One metric of a run: its column name and how it is computed."""

    name: str
    compute: Metric


def _named(name: str) -> Metric:
    if name in NAMED:
        return NAMED[name]
    m = _TOP.match(name)
    if m and int(m.group(1)) >= 1:
        return top_k_agreement(int(m.group(1)))
    raise InputError(f"unknown metric {name!r}: use one of {', '.join(NAMED)}, top<k> (e.g. top1, top5), "
                     "or a callable f(torch_value, onnx_value) -> float")


def resolve_metrics(metrics: Iterable | Mapping | str | Callable | None) -> tuple[Figure, ...]:
    """``metrics=`` as given (names, callables, a dict name -> name or callable, or one of them) as
    ``Figure``s, checked: names unique, none shadowing a record field."""
    from sbs_widget.records import Record

    if metrics is None:
        return ()
    if isinstance(metrics, str) or callable(metrics):
        metrics = [metrics]
    items = list(metrics.items()) if isinstance(metrics, Mapping) else [(None, m) for m in metrics]
    out: list[Figure] = []
    fields = {f.name for f in dataclasses.fields(Record)}
    for key, m in items:
        if isinstance(m, str):
            figure = Figure(key or m, _named(m))
        elif callable(m):
            name = key or getattr(m, "__name__", None)
            if not name or name == "<lambda>":
                raise InputError("a metric given as a lambda needs a name: pass metrics={'name': f}")
            figure = Figure(str(name), m)
        else:
            raise InputError(f"metric {m!r} is neither a name nor a callable")
        if figure.name in fields:
            raise InputError(f"metric name {figure.name!r} is a record field: name it otherwise "
                             f"(metrics={{'my_{figure.name}': ...}})")
        if any(f.name == figure.name for f in out):
            raise InputError(f"metric {figure.name!r} is given twice")
        out.append(figure)
    return tuple(out)


def measure(figures: tuple[Figure, ...], expected: np.ndarray, got: np.ndarray) -> dict[str, float]:
    """Each figure on one pair; a callable that fails gives NaN (the figure fails, not the run)."""
    out = {}
    for f in figures:
        try:
            out[f.name] = float(f.compute(expected, got))
        except Exception:  # a user's callable: its failure is this figure's, not the run's
            out[f.name] = math.nan
    return out
