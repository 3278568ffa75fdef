"""One verdict on a whole run: do the program and the ONNX model agree?

Outcomes and the exit codes of ``python -m sbs_widget check``:

- ``agree`` (0): no pair beyond tolerance;
- ``mismatch`` (1): some pair beyond tolerance and beyond rounding (status ``mismatch``, a reset pair
  beyond tolerance that is not rounding), or a side failed to produce a value (status ``error``);
- ``cannot-judge`` (2): bad input (unreadable files, inputs that do not fit), a run that could not
  complete, or a run that compared nothing finite (NaN/Inf inputs);
- ``noise`` (3): pairs beyond tolerance, every one of them by rounding alone (status ``noise``: onnxruntime
  as close to a float64 rerun as torch).

``fail_on`` picks what fails: ``"noise"`` (the default, strict: anything beyond tolerance fails, rounding
with its own code 3) or ``"mismatch"`` (rounding passes: exit 0).

>>> from sbs_widget.records import Record
>>> judge([Record(status="ok", err_abs=0.0, kind="output")]).outcome
'agree'
>>> v = judge([Record(status="noise", err_abs=2e-4, kind="output", noise=True)])
>>> v.outcome, v.exit_code("noise"), v.exit_code("mismatch")
('noise', 3, 0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from sbs_widget import records as R
from sbs_widget.errors import InputError
from sbs_widget.records import Record

AGREE, MISMATCH, CANNOT_JUDGE, NOISE = "agree", "mismatch", "cannot-judge", "noise"
OUTCOMES = (AGREE, MISMATCH, CANNOT_JUDGE, NOISE)
EXIT_CODES = {AGREE: 0, MISMATCH: 1, CANNOT_JUDGE: 2, NOISE: 3}
FAIL_ON = ("mismatch", "noise")
WORST = 3  # outputs quoted by the assertion message and the Markdown summary

_STATUS_RANK = {R.MISMATCH: 0, R.ERROR: 1, R.RESET: 2, R.NOISE: 3, R.OK: 4, R.ONE_SIDED: 5}


def check_fail_on(fail_on: str) -> str:
    if fail_on not in FAIL_ON:
        raise InputError(f"fail_on={fail_on!r}: use 'mismatch' (rounding passes) or 'noise' (anything beyond "
                         "tolerance fails)")
    return fail_on


def is_mismatch(rec: Record) -> bool:
    """Beyond tolerance and beyond rounding (a reset pair too: it was compared before the reset)."""
    if rec.status == R.MISMATCH:
        return True
    return rec.status == R.RESET and rec.within_tolerance is False and rec.noise is not True


def is_noise(rec: Record) -> bool:
    """Beyond tolerance by rounding alone."""
    if rec.status == R.NOISE:
        return True
    return rec.status == R.RESET and rec.within_tolerance is False and rec.noise is True


@dataclass
class Verdict:
    """What a run amounts to. ``worst_outputs``: indices (into the records) of the outputs, worst first
    (mismatch, then noise, then by ``err_abs``); ``first_mismatch``: index of the first pair beyond
    tolerance and rounding; ``cannot_judge``: why nothing could be judged, when so."""

    outcome: str
    n_records: int = 0
    n_compared: int = 0
    n_mismatch: int = 0
    n_noise: int = 0
    n_error: int = 0
    counts: dict = field(default_factory=dict)
    worst_outputs: list = field(default_factory=list)
    first_mismatch: int | None = None
    worst_pair: int | None = None
    max_min_atol: float | None = None  # the largest min_atol of the pairs beyond tolerance
    cannot_judge: str | None = None

    def fails(self, fail_on: str = "noise") -> bool:
        return self.exit_code(fail_on) != 0

    def exit_code(self, fail_on: str = "noise") -> int:
        if self.outcome == NOISE and check_fail_on(fail_on) == "mismatch":
            return 0
        return EXIT_CODES[self.outcome]

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _severity(rec: Record) -> tuple:
    err = rec.err_abs if rec.err_abs is not None else -1.0
    if isinstance(err, float) and math.isnan(err):
        err = math.inf
    rank = 0 if is_mismatch(rec) else 1 if rec.status == R.ERROR else 2 if is_noise(rec) else 3
    return (rank, -err)


def judge(records: Sequence[Record], *, cannot_judge: str | None = None) -> Verdict:
    """The verdict on ``records`` (a whole run). ``cannot_judge``: a reason known from elsewhere (the
    run ended early): the outcome is then ``cannot-judge`` unless a mismatch was already seen."""
    v = Verdict(AGREE, n_records=len(records))
    outputs = []
    worst_err = None
    for k, r in enumerate(records):
        v.counts[r.status] = v.counts.get(r.status, 0) + 1
        if r.err_abs is not None and r.status in (R.OK, R.NOISE, R.MISMATCH, R.RESET):
            v.n_compared += 1
            e = r.err_abs if not math.isnan(r.err_abs) else math.inf
            if worst_err is None or e > worst_err:
                worst_err, v.worst_pair = e, k
        if is_mismatch(r):
            v.n_mismatch += 1
            if v.first_mismatch is None:
                v.first_mismatch = k
        elif is_noise(r):
            v.n_noise += 1
        elif r.status == R.ERROR:
            v.n_error += 1
        if (is_mismatch(r) or is_noise(r)) and r.min_atol is not None:
            v.max_min_atol = r.min_atol if v.max_min_atol is None else max(v.max_min_atol, r.min_atol)
        if r.kind == R.KIND_OUTPUT:
            outputs.append(k)
    outputs.sort(key=lambda k: _severity(records[k]))
    v.worst_outputs = outputs[:WORST]
    blind = R.nothing_judged(records)
    if v.n_mismatch or v.n_error:
        v.outcome = MISMATCH
    elif cannot_judge or blind or not records:
        v.outcome = CANNOT_JUDGE
        v.cannot_judge = cannot_judge or blind or "no record: nothing was compared"
    elif v.n_noise:
        v.outcome = NOISE
    return v


def headline(v: Verdict, atol: float, rtol: float, fail_on: str = "noise") -> str:
    """One line: the outcome in words, with the tolerance."""
    tol = f"atol={atol:g}, rtol={rtol:g}"
    if v.outcome == AGREE:
        return f"the ONNX model agrees with the program: {v.n_compared} pairs compared within {tol}"
    if v.outcome == CANNOT_JUDGE:
        return f"cannot judge the ONNX model: {v.cannot_judge}"
    if v.outcome == NOISE:
        passes = " (passes: fail_on='mismatch')" if not v.fails(fail_on) else ""
        return (f"the ONNX model differs from the program by rounding only (noise): {v.n_noise} of "
                f"{v.n_compared} pairs beyond {tol}, each about as close to a float64 rerun as torch{passes}")
    errors = f", {v.n_error} value(s) a side failed to compute (status error)" if v.n_error else ""
    return (f"the ONNX model does not match the program: {v.n_mismatch} of {v.n_compared} pairs beyond {tol} "
            f"and beyond rounding (mismatch), {v.n_noise} by rounding alone (noise){errors}")
