"""The default tolerance of a comparison: it follows the precision the program computes in.

The tolerance is the threshold below which a pair is ``ok`` without further thought. A pair beyond it
is not yet called a mismatch: the engine judges it against a float64 rerun (``noise.py``,
``verdicts.py``) and calls it ``noise`` when onnxruntime is about as close to exact as torch. So the
tolerance can sit at the precision's own epsilon instead of a guess at how far rounding goes:
float32 1e-4 (as before), float16 1e-3 (its epsilon, 9.8e-4; it was 3e-2, which hid real float16
faults: one row of a weight 2% off moved no computed value beyond 3e-2). With 1e-3, correct float16
exports of the zoo and of the 62 architectures of ``benchmarks/noise_zoo.py`` get ``noise`` pairs and
no ``mismatch`` (docs/measurements.md). bfloat16 keeps 8x fewer mantissa bits than float16: its
tolerance is float16's scaled by the ratio of their epsilons. A tolerance given is always used as is.

>>> import torch
>>> tolerance_for(torch.float32), tolerance_for(torch.float16), tolerance_for(torch.bfloat16)
(0.0001, 0.001, 0.008)
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import torch

from sbs_widget.errors import InputError
from sbs_widget.shared_rules import EXACT_ELEM_TYPES, is_exact  # noqa: F401 (re-exported: see below)

DEFAULT_ATOL = 1e-4  # float32 and float64 programs
DEFAULT_RTOL = 1e-4
FLOAT16_TOLERANCE = 1e-3  # float16's epsilon, rounded: beyond it, the float64 verdict decides
# onnxruntime's CPU provider has too few bfloat16 kernels to measure it here: float16's tolerance
# scaled by the ratio of their epsilons.
BFLOAT16_TOLERANCE = FLOAT16_TOLERANCE * torch.finfo(torch.bfloat16).eps / torch.finfo(torch.float16).eps


def tolerance_for(dtype: torch.dtype | None) -> float:
    """atol = rtol for a program whose least precise floating type is ``dtype``."""
    if dtype is None or not dtype.is_floating_point:
        return DEFAULT_ATOL
    eps = torch.finfo(dtype).eps
    if eps <= torch.finfo(torch.float32).eps:
        return DEFAULT_ATOL
    return FLOAT16_TOLERANCE if eps <= torch.finfo(torch.float16).eps else BFLOAT16_TOLERANCE


def valid_tolerance(name: str, value) -> float:
    """``value`` as a float when it is a tolerance: a finite real number >= 0. Anything else raises
    ``InputError``: NaN makes every ``|diff| <= tol`` false in numpy but true in other tests (the
    paths would disagree), inf and negatives pass or fail everything, a bool is a slip.

    >>> valid_tolerance("atol", 1e-3)
    0.001
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise InputError(f"{name}={value!r} is not a tolerance: pass a finite number >= 0 (e.g. {name}=1e-4), "
                         f"or None for the default of the program's precision")
    return float(value)


def checked(atol, rtol) -> tuple[float | None, float | None]:
    """``(atol, rtol)`` validated (``valid_tolerance``), ``None`` kept: every entry point (API, widget,
    CLI, culprits, dumps) goes through here, through ``resolve``."""
    return (None if atol is None else valid_tolerance("atol", atol),
            None if rtol is None else valid_tolerance("rtol", rtol))


def resolve(atol: float | None, rtol: float | None, dtype: torch.dtype | None) -> Tolerance:
    """``Tolerance.resolve``: each one given as is (validated), each ``None`` the default for ``dtype``."""
    return Tolerance.resolve(atol, rtol, dtype)


# ONNX element types compared exactly (integers and bools): a difference of 1 is a wrong answer.
# ``EXACT_ELEM_TYPES`` and ``is_exact`` (by a record's shape text) live in ``shared_rules``, below the engine
# in the flow, which also hands them to the view's JS (js/rules.js): one list for the engine, the Python
# views and the browser; imported above and re-exported here.


# The culprit finder traces errors back through the graph; an error below this share of atol is float
# rounding carried along, not a signal (a pair within tolerance can still hold that much: a quarter of
# an ulp at the values' scale, summed over a reduction). One hundredth keeps it two decades below the
# verdict, where a real fault that fails the tolerance downstream is already visible.
TRACE_SHARE = 1e-2


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """The one rule a pair is judged by, resolved once per run.

    - Floating pairs: within when every element has ``|onnx - torch| <= atol + rtol * |torch|``.
    - Integer and bool pairs (either side): exact, whatever atol and rtol say.
    - NaN and Inf: positions where both sides hold the same non-finite value (NaN and NaN, +inf and
      +inf) agree; anywhere else a non-finite value is beyond any tolerance (``err_nan``).
    - Defaults follow the program's least precise floating type (``tolerance_for``); a value given
      is used as is.

    Iterating gives ``(atol, rtol)``: ``atol, rtol = prepared.tolerance()``.
    """

    atol: float
    rtol: float
    dtype: torch.dtype | None = None  # the least precise floating type the program computes in
    atol_default: bool = False  # whether atol is the default for ``dtype`` (said in summaries)
    rtol_default: bool = False

    @classmethod
    def resolve(cls, atol: float | None, rtol: float | None, dtype: torch.dtype | None) -> "Tolerance":
        """Each of ``atol``/``rtol`` given as is (validated), each ``None`` the default for ``dtype``."""
        a, r = checked(atol, rtol)
        default = tolerance_for(dtype)
        return cls(default if a is None else a, default if r is None else r, dtype, a is None, r is None)

    def __iter__(self):
        return iter((self.atol, self.rtol))

    @property
    def trace_floor(self) -> float:
        """Errors below this are rounding when the culprit finder traces back (``TRACE_SHARE``)."""
        return self.atol * TRACE_SHARE

    def within_record(self, record, atol: float | None = None) -> bool | None:
        """The verdict of a measured record at this rtol and ``atol`` (default: this one); None when
        nothing was compared. ``Record.min_atol`` is the smallest atol at which every element passes
        at this rtol, so another atol gets the element-wise rule itself, not a stand-in for it."""
        if record.err_abs is None:
            return None
        atol = self.atol if atol is None else atol
        if atol == self.atol and record.within_tolerance is not None:
            return bool(record.within_tolerance)
        if record.err_nan or math.isnan(record.err_abs):
            return False
        if is_exact(record):
            return record.err_abs == 0
        return (record.err_abs if record.min_atol is None else record.min_atol) <= atol

    def describe(self) -> str:
        """One line for summaries (``describe``)."""
        return describe(self.atol, self.rtol, self.dtype, (self.atol_default, self.rtol_default))

    def as_spec(self) -> dict:
        """What the front end needs to apply the rule (``views``, ``js/rules.js``)."""
        return {"atol": self.atol, "rtol": self.rtol, "trace_share": TRACE_SHARE}


def cli_tolerance(text: str) -> float:
    """argparse ``type=`` of ``--atol``/``--rtol``: a bad value stops the command before any work,
    with argparse's usage line and this message."""
    import argparse

    try:
        return valid_tolerance("tolerance", float(text))
    except (ValueError, InputError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a tolerance: pass a finite number >= 0, e.g. 1e-4") \
            from None


def least_precise(dtypes) -> torch.dtype | None:
    """The floating type with the largest epsilon among ``dtypes``; None when there is none."""
    floats = [d for d in set(dtypes) if isinstance(d, torch.dtype) and d.is_floating_point]
    return max(floats, key=lambda d: torch.finfo(d).eps, default=None)


def least_precise_float(values) -> torch.dtype | None:
    """``least_precise`` of the dtypes of the tensors in ``values`` (nested in lists, tuples and dicts).
    A program's precision is that of all its values (weights, inputs and every intermediate): an
    upcast at the end (``logits.float()``) does not undo a float16 body; ``Alignment.fx_dtypes`` holds
    them."""
    dtypes = set()
    stack = list(values)
    while stack:
        v = stack.pop()
        if isinstance(v, (list, tuple)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(getattr(v, "dtype", None), torch.dtype):
            dtypes.add(v.dtype)
    return least_precise(dtypes)


def describe(atol: float, rtol: float, dtype: torch.dtype | None, defaults: tuple[bool, bool]) -> str:
    """One line for summaries: the tolerance, and why for the ones that are defaults.

    >>> describe(1e-3, 3e-2, torch.float16, (False, True))
    'tolerance: atol=0.001, rtol=0.03 (rtol: the default for a program computing in float16)'
    """
    text = f"tolerance: atol={atol:g}, rtol={rtol:g}"
    which = [name for name, default in zip(("atol", "rtol"), defaults) if default]
    if which:
        what = "both" if len(which) == 2 else which[0]
        program = f"a program computing in {str(dtype).removeprefix('torch.')}" if dtype is not None else \
            "a program without floating values"
        text += f" ({what}: the default for {program})"
    return text
