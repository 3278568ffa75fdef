"""How much of a run was compared, as numbers: ``sbs_widget.coverage(records, prepared)``.

The CLI's summary (``engine/summary.py``) prints the same counts in words."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sbs_widget import records as R

if TYPE_CHECKING:
    from sbs_widget.engine.prepared import PreparedPair

_COMPARED = (R.OK, R.NOISE, R.MISMATCH, R.RESET)
_FLOAT_TYPES = frozenset({1, 10, 11, 16})  # ONNX FLOAT, FLOAT16, DOUBLE, BFLOAT16


@dataclass
class Coverage:
    """What a run compared.

    ``pairs_compared``: pairs measured (status ok, noise, mismatch or reset); ``program_compared`` of
    ``program_total``: the user program's value-producing ``call_function`` nodes whose value was
    compared (dead nodes left out); ``onnx_compared`` of ``onnx_total``: the ONNX graph's float values
    computed by a node (``Constant`` nodes left out; values whose type the graph declares) that were
    compared. The ``*_total``/``program_compared``/``onnx_compared`` counts are None without ``prepared``.
    ``uncovered``: the program nodes not compared (their one-sided records, if any, say why).
    """

    pairs_compared: int = 0
    program_compared: int | None = None
    program_total: int | None = None
    onnx_compared: int | None = None
    onnx_total: int | None = None
    uncovered: list[str] = field(default_factory=list)

    @property
    def program_share(self) -> float | None:
        """``program_compared / program_total`` (None when unknown or nothing to cover)."""
        return self.program_compared / self.program_total if self.program_total else None

    @property
    def onnx_share(self) -> float | None:
        """``onnx_compared / onnx_total`` (None when unknown or nothing to cover)."""
        return self.onnx_compared / self.onnx_total if self.onnx_total else None


def coverage(records, prepared: PreparedPair | None = None) -> Coverage:
    """Coverage of a run: ``records`` as ``Prepared.run`` (or ``run_aligned``) yielded them,
    ``prepared`` the ``Prepared`` pair they come from (without it, only ``pairs_compared`` is counted).

    >>> import sbs_widget
    >>> sbs_widget.coverage([sbs_widget.Record(status="ok", err_abs=0.0)]).pairs_compared
    1
    """
    from sbs_widget.engine.summary import coverage as node_coverage

    records = list(records)
    compared = [r for r in records if r.status in _COMPARED and r.err_abs is not None]
    out = Coverage(pairs_compared=len(compared))
    if prepared is None:
        return out
    out.program_compared, out.program_total, out.uncovered = node_coverage(records, prepared)
    index = prepared.index
    floats = set()
    for i, outputs in enumerate(index.node_outputs):
        if index.op_types[i] == "Constant":
            continue
        for o in outputs:
            vt = index.types.get(o) if o else None
            if vt is not None and vt.elem_type in _FLOAT_TYPES:
                floats.add(o)
    out.onnx_total = len(floats)
    out.onnx_compared = len({r.onnx_name for r in compared if r.onnx_name in floats})
    return out
