"""What ``compare_input_sets`` answers (``input_sets.py``): per aligned pair, how its error spreads over the
input sets; the pairs beyond tolerance on some inputs only (input-dependent), first in execution order; the
culprits of every input grouped by node; each input's records and status counts kept.

>>> from sbs_widget.records import Record
>>> ok, bad = Record(ep_name="y", onnx_name="y", err_abs=0.0, status="ok", within_tolerance=True), \\
...     Record(ep_name="y", onnx_name="y", err_abs=0.5, status="mismatch", within_tolerance=False)
>>> sets = build_input_sets([InputOutcome(0, [ok]), InputOutcome(1, [bad])], ["short", "long"])
>>> [(p.onnx_name, p.n_mismatch, p.worst_input) for p in sets.input_dependent]
[('y', 1, 1)]
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from sbs_widget import records as R
from sbs_widget.records import Record

PairKey = tuple  # (kind, ep_name, onnx_name)


@dataclass
class InputOutcome:
    """One input set's run, as a worker returns it: its records (in execution order; those produced before
    a failure too), its culprits (``blame.culprit.Culprit``, most likely first), the error that ended it
    (``"Type: message"``, None when it ran to the end), its seconds, and the tolerance it was judged by."""

    index: int
    records: list[Record] = field(default_factory=list)
    culprits: list = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    atol: float | None = None
    rtol: float | None = None


@dataclass
class PairSpread:
    """One aligned pair across the input sets. ``n_inputs``: the inputs it was compared on; ``n_beyond``: those
    where it is beyond tolerance (``within_tolerance`` False: mismatch, noise or reset beyond it);
    ``n_mismatch``: those with status mismatch; ``err_abs_max``/``err_abs_median`` over the inputs
    (NaN ignored by the median, counted as the worst); ``worst_input``: the index of the input of the largest
    ``err_abs`` (None when none was measured); ``beyond_inputs``: the indices where it is beyond tolerance;
    ``statuses``: how many inputs gave each status; ``order``: its place in execution order."""

    kind: str
    ep_name: str | None
    onnx_name: str | None
    onnx_node_name: str | None = None
    onnx_op_type: str | None = None
    order: int = 0
    n_inputs: int = 0
    n_beyond: int = 0
    n_mismatch: int = 0
    err_abs_max: float | None = None
    err_abs_median: float | None = None
    err_rel_max: float | None = None
    worst_input: int | None = None
    beyond_inputs: list[int] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)

    @property
    def key(self) -> PairKey:
        return (self.kind, self.ep_name, self.onnx_name)

    @property
    def input_dependent(self) -> bool:
        """Status mismatch on some of the inputs it was compared on, not on all."""
        return 0 < self.n_mismatch < self.n_inputs


@dataclass
class GroupedCulprit:
    """A culprit named on one input or more: ``count`` inputs name it, ``best_rank`` (1: the most likely) and
    ``best_score`` are its best over them, ``inputs`` their indices; the other fields are the culprit as
    the input of its best rank named it (``culprit``: that ``Culprit``)."""

    onnx_node: str | None
    onnx_name: str | None
    ep_name: str | None
    onnx_op_type: str | None
    kind: str
    count: int
    best_rank: int
    best_score: float
    inputs: list[int]
    reason: str
    culprit: object = field(default=None, repr=False)


@dataclass
class InputSets:
    """The answer of ``compare_input_sets``; indices are positions in the input sets given.

    - ``pairs``: one ``PairSpread`` per aligned pair, in execution order; ``input_dependent``: those beyond
      tolerance (status mismatch) on some inputs but not all, first in execution order (the first is where an
      input-dependent difference starts);
    - ``culprits``: ``GroupedCulprit`` per ONNX node named on any input, the most often named first;
    - ``records``/``culprits_per_input``/``errors``/``seconds``: per input (an input that failed keeps the
      records produced before and its error, ``"Type: message"``); ``labels``: a short text per input;
    - ``statuses``: per input, how many pairs gave each status (``"error"`` counts a failure too);
    - ``atol``/``rtol``: the tolerance the runs judged by."""

    pairs: list[PairSpread]
    culprits: list[GroupedCulprit]
    records: list[list[Record]]
    culprits_per_input: list[list]
    errors: list[str | None]
    seconds: list[float]
    labels: list[str]
    statuses: list[dict[str, int]]
    atol: float | None = None
    rtol: float | None = None

    def __len__(self) -> int:
        return len(self.records)

    @property
    def input_dependent(self) -> list[PairSpread]:
        return [p for p in self.pairs if p.input_dependent]

    @property
    def failed(self) -> list[int]:
        return [i for i, e in enumerate(self.errors) if e is not None]

    def to_dataframe(self):
        """One row per pair, in execution order, with the spread columns (``worst_label``: the worst input's
        label; ``beyond_inputs``: the indices, as text)."""
        import pandas

        rows = []
        for p in self.pairs:
            rows.append({
                "kind": p.kind, "ep_name": p.ep_name, "onnx_name": p.onnx_name, "onnx_node_name": p.onnx_node_name,
                "onnx_op_type": p.onnx_op_type, "input_dependent": p.input_dependent, "n_inputs": p.n_inputs,
                "n_beyond": p.n_beyond, "n_mismatch": p.n_mismatch, "err_abs_max": p.err_abs_max,
                "err_abs_median": p.err_abs_median, "err_rel_max": p.err_rel_max, "worst_input": p.worst_input,
                "worst_label": None if p.worst_input is None else self.labels[p.worst_input],
                "beyond_inputs": " ".join(map(str, p.beyond_inputs)),
                "statuses": " ".join(f"{k}:{v}" for k, v in sorted(p.statuses.items())),
            })
        columns = list(rows[0]) if rows else ["kind", "ep_name", "onnx_name"]
        return pandas.DataFrame(rows, columns=columns)

    def lines(self, limit: int = 20) -> list[str]:
        """The summary, as the CLI prints it: the inputs, the input-dependent pairs first, the pairs beyond
        tolerance on every input, the culprits across inputs."""
        n = len(self)
        out = [f"input sets: {n} compared, {n - len(self.failed)} ran to the end"
               + (f" (tolerance atol={self.atol:g}, rtol={self.rtol:g})" if self.atol is not None else "")]
        for i in range(n):
            counts = ", ".join(f"{v} {k}" for k, v in sorted(self.statuses[i].items()))
            tail = f"; failed: {self.errors[i][:200]}" if self.errors[i] else ""
            out.append(f"  #{i} {self.labels[i]}: {counts or 'no pair'} ({self.seconds[i]:.1f} s){tail}")
        dependent = self.input_dependent
        out.append(f"input-dependent pairs (mismatch on some inputs only), first in execution order: {len(dependent)}"
                   if dependent else "input-dependent pairs: none")
        out += [f"  {_pair_line(p, n)}" for p in dependent[:limit]]
        if len(dependent) > limit:
            out.append(f"  ... {len(dependent) - limit} more")
        everywhere = [p for p in self.pairs if p.n_mismatch and p.n_mismatch == p.n_inputs]
        if everywhere:
            out.append(f"pairs beyond tolerance on every input: {len(everywhere)}, first: "
                       f"{_pair_line(everywhere[0], n)}")
        for c in self.culprits[:5]:
            out.append(f"culprit {c.onnx_op_type} node {c.onnx_node!r} (value {c.onnx_name!r}): named on {c.count} "
                       f"of {n} inputs {c.inputs[:10]}, best rank {c.best_rank}")
        return out


def _pair_line(p: PairSpread, n: int) -> str:
    worst = "-" if p.worst_input is None else f"#{p.worst_input}"
    return (f"{p.onnx_name} / {p.ep_name} ({p.onnx_op_type or p.kind}): mismatch on {p.n_mismatch} of {p.n_inputs} "
            f"inputs {p.beyond_inputs[:10]}, err_abs max {_g(p.err_abs_max)} (input {worst}), median "
            f"{_g(p.err_abs_median)}")


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _rank_value(x: float) -> float:
    return math.inf if math.isnan(x) else x


def _spreads(outcomes: list[InputOutcome]) -> list[PairSpread]:
    """The pairs, in execution order: that of the input with the most records, the others' extra pairs after."""
    spreads: dict[PairKey, PairSpread] = {}
    errors: dict[PairKey, list[tuple[float, int]]] = {}
    for o in sorted(outcomes, key=lambda o: -len(o.records)):
        for rec in o.records:
            key = (rec.kind, rec.ep_name, rec.onnx_name)
            if key not in spreads:
                spreads[key] = PairSpread(rec.kind, rec.ep_name, rec.onnx_name, rec.onnx_node_name, rec.onnx_op_type,
                                          order=len(spreads))
    for o in sorted(outcomes, key=lambda o: o.index):
        for rec in o.records:
            p = spreads[(rec.kind, rec.ep_name, rec.onnx_name)]
            p.n_inputs += 1
            p.statuses[rec.status] = p.statuses.get(rec.status, 0) + 1
            if rec.within_tolerance is False:
                p.n_beyond += 1
                p.beyond_inputs.append(o.index)
            if rec.status == R.MISMATCH:
                p.n_mismatch += 1
            if rec.err_abs is not None:
                errors.setdefault(p.key, []).append((rec.err_abs, o.index))
            if rec.err_rel is not None and not math.isnan(rec.err_rel):
                p.err_rel_max = rec.err_rel if p.err_rel_max is None else max(p.err_rel_max, rec.err_rel)
    for key, values in errors.items():
        p = spreads[key]
        worst = max(values, key=lambda v: _rank_value(v[0]))
        p.err_abs_max, p.worst_input = worst
        finite = [v for v, _ in values if not math.isnan(v)]
        p.err_abs_median = statistics.median(finite) if finite else math.nan
    return list(spreads.values())


def _grouped_culprits(outcomes: list[InputOutcome]) -> list[GroupedCulprit]:
    groups: dict[tuple, GroupedCulprit] = {}
    first: dict[tuple, tuple[int, int]] = {}
    for o in sorted(outcomes, key=lambda o: o.index):
        for rank, c in enumerate(o.culprits, 1):
            key = (c.kind, c.onnx_node or c.onnx_name)
            g = groups.get(key)
            if g is None:
                groups[key] = GroupedCulprit(c.onnx_node, c.onnx_name, c.ep_name, c.onnx_op_type, c.kind, 1, rank,
                                             c.score, [o.index], c.reason, c)
                first[key] = (rank, o.index)
                continue
            if o.index not in g.inputs:
                g.count += 1
                g.inputs.append(o.index)
            g.best_score = max(g.best_score, c.score)
            if rank < g.best_rank:
                g.best_rank, g.reason, g.culprit = rank, c.reason, c
    return sorted(groups.values(), key=lambda g: (-g.count, g.best_rank, first[(g.kind, g.onnx_node or g.onnx_name)]))


def build_input_sets(outcomes: list[InputOutcome], labels: list[str]) -> InputSets:
    """``InputSets`` from one outcome per input (``outcomes[i].index == i`` once sorted)."""
    outcomes = sorted(outcomes, key=lambda o: o.index)
    statuses = []
    for o in outcomes:
        counts = dict(Counter(r.status for r in o.records))
        if o.error is not None:
            counts[R.ERROR] = counts.get(R.ERROR, 0) + 1
        statuses.append(counts)
    judged = next((o for o in outcomes if o.atol is not None), None)
    return InputSets(
        pairs=_spreads(outcomes), culprits=_grouped_culprits(outcomes), records=[o.records for o in outcomes],
        culprits_per_input=[o.culprits for o in outcomes], errors=[o.error for o in outcomes],
        seconds=[o.seconds for o in outcomes], labels=list(labels), statuses=statuses,
        atol=judged.atol if judged else None, rtol=judged.rtol if judged else None)
