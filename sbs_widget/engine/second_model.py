"""A second ONNX model of the same program (``b``: the export simplified, optimized, converted to float16,
quantized, or run on another provider), measured in the same lockstep run as the first (``a``).

The FX side runs once: where a value of ``a`` is compared with torch's, the value of ``b`` paired with it
(``twomodels/match.py``) is compared with the same torch value, and the record says both. A three-way
run thus costs a two-way run plus ``b``'s own forward, not a second lockstep.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Mapping

import numpy as np

from sbs_widget.engine.metrics import compute_errors_many


@dataclasses.dataclass(frozen=True)
class BPaired:
    """What ``b`` has for one value of ``a``: its value, and where it comes from in ``b``."""

    name: str  # the value's name in b
    node: str  # the node of b that computes it
    op_type: str
    how: str  # how it was paired: "name", "metadata", "structure", "value"
    value: np.ndarray | None = None  # b's value on the run's inputs (None: not computed)


@dataclasses.dataclass(frozen=True)
class SecondModel:
    """``b``'s values keyed by the value of ``a`` each is paired with, for one run's inputs."""

    paired: Mapping[str, BPaired]
    # tells runs apart (a rerun restarts from a run's cuts only with the same second model)
    token: int = dataclasses.field(default_factory=itertools.count().__next__)

    def measure_many(self, items: list[tuple], atol: float, rtol: float) -> None:
        """Fill the ``b_*`` fields of each ``(record, torch value)``: b's value paired with the record's
        ``onnx_name`` against torch's, by the run's tolerance, all pairs in one batched pass
        (``compute_errors_many``)."""
        ready, pairs = [], []
        paired = self.paired
        for rec, expected in items:
            other = paired.get(rec.onnx_name) if rec.onnx_name is not None else None
            if other is None:
                continue
            rec.b_name, rec.b_node_name, rec.b_op_type, rec.b_paired_by = other.name, other.node, other.op_type, \
                other.how
            got = other.value
            if got is None:
                continue
            if got.size != expected.size:
                rec.b_comment = f"shapes differ: torch {tuple(expected.shape)} vs b {tuple(got.shape)}"
                continue
            ready.append(rec)  # (b computes some values flattened: a Gemm's 2-D output)
            pairs.append((expected, _comparable(got, expected).reshape(expected.shape)))
        for rec, err in zip(ready, compute_errors_many(pairs, atol=atol, rtol=rtol)):
            rec.b_err_abs, rec.b_err_rel = err.err_abs, err.err_rel
            rec.b_within_tolerance = bool(err.within_tolerance)


def _comparable(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """``b``'s value in a type ``compute_errors`` compares with torch's (float16 of a float32 value: widened)."""
    if got.dtype != expected.dtype and got.dtype.kind == "f" and expected.dtype.kind == "f":
        return got.astype(np.promote_types(got.dtype, expected.dtype))
    return got
