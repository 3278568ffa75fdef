"""What a comparison produces: one ``Record`` per compared pair of values, and their DataFrame.

Field names follow onnx-diagnostic's ``RunAlignedRecord`` so that its users can switch without
renaming columns; ``err_local``, ``status``, ``module`` and a few others are ours.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Iterable

# Values of Record.status.
OK = "ok"                  # both sides agree within tolerance
NOISE = "noise"            # beyond tolerance, yet onnxruntime is about as close to exact as torch
MISMATCH = "mismatch"      # beyond tolerance and beyond rounding (or NaN/Inf disagree)
ONE_SIDED = "one-sided"    # the value exists on one side only, nothing to compare
RESET = "reset"            # compared, then the torch value replaced the ONNX one downstream
ERROR = "error"            # one side failed to produce the value (see comment)
STATUSES = (OK, NOISE, MISMATCH, ONE_SIDED, RESET, ERROR)

# Values of Record.kind: what the pair is.
KIND_INPUT = "input"
KIND_WEIGHT = "weight"
KIND_NODE = "node"
KIND_OUTPUT = "output"
KIND_INNER = "inner"     # a value inside the ONNX translation of one FX node (``inner_of``)


@dataclass(slots=True)  # thousands per run: slots make them smaller and faster to fill
class Record:
    """One compared pair: a value of the torch.export program and its ONNX twin.

    ``ep_*`` fields describe the FX side, ``onnx_*`` the ONNX side; ``None`` where a side is absent.
    Errors are ``None`` when nothing could be compared (one-sided or error records).

    - ``err_abs``: max |torch - onnx|
    - ``err_rel``: max |torch - onnx| / max(|torch|, 1e-6), element-wise
    - ``err_dev``: root mean square of torch - onnx
    - ``err_nan``: number of elements where the NaN/Inf pattern differs between both sides
    - ``n_finite``: number of elements compared where both sides are finite. NaN on both sides at the
      same place agrees, yet compares no number: a pair with elements but ``n_finite == 0`` (all-NaN
      inputs) is ``ok`` by agreement, not by judgement, and its comment says so (``NOTHING_FINITE``).
    - ``err_h01`` / ``err_h001``: number of elements with |torch - onnx| > 0.1 / > 0.01
    - ``err_local``: max |torch - onnx| when the ONNX node (or its fused group) runs on torch inputs
      (``node_local=True``): a large value means this node creates the error, a small one that it only
      inherits it.
    - ``err_where``: where the elements beyond tolerance lie, per axis, and how many, e.g.
      ``[0, :, 0:2, :] (128 of 768)``: a difference confined to padded positions, one batch item or one
      channel shows at a glance. Filled for pairs beyond tolerance only.
    - ``min_atol``: the smallest atol this pair passes at the run's rtol (0 when rtol alone covers
      it): the figure to pick a CI tolerance from.
    - ``metrics``: the figures asked for with ``metrics=`` (cosine similarity, SQNR...), by name.
    - ``err_torch`` / ``err_onnx`` / ``ref_scale``: for pairs beyond tolerance, the node rerun in float64
      on torch's inputs is the reference (``engine/reference.py``): max |torch - reference| (torch's own
      rounding), max |ONNX node-local value - reference| (onnxruntime's, on the same inputs), and
      max |reference|. ``noise`` says whether the difference is rounding (``engine/noise.py``); None
      where no reference was computed (within tolerance, or no float64 kernel: see the comment).
      ``local_noise``: whether the node itself, on torch's inputs, is within rounding (a pair can be
      a mismatch by what it inherits while its node only rounds).
    """

    ep_id_node: int | None = None
    onnx_id_node: int | None = None
    ep_name: str | None = None
    onnx_name: str | None = None
    ep_target: str | None = None
    onnx_op_type: str | None = None
    onnx_id_output: int | None = None
    ep_shape_type: str | None = None
    onnx_shape_type: str | None = None
    err_abs: float | None = None
    err_rel: float | None = None
    err_dev: float | None = None
    err_nan: int | None = None
    err_h01: int | None = None
    err_h001: int | None = None
    ep_time_run: float | None = None
    onnx_time_run: float | None = None
    comment: str = ""
    err_local: float | None = None
    status: str = OK
    module: str = ""
    # ours, beyond onnx-diagnostic's fields
    kind: str = KIND_NODE
    ep_origin: str | None = None      # the node of the user's ExportedProgram this value comes from
    onnx_node_name: str | None = None  # name of the ONNX node producing onnx_name
    stack_trace: str = ""               # last line of the torch stack trace
    n_elements: int | None = None
    n_finite: int | None = None      # elements compared where both sides are finite (0 of n: nothing judged)
    within_tolerance: bool | None = None
    histogram: tuple[int, ...] | None = field(default=None, repr=False)  # counts of |diff| per decade
    err_where: str | None = None  # where the elements beyond tolerance lie (metrics.beyond_where)
    min_atol: float | None = None    # smallest atol the pair passes at the run's rtol
    err_torch: float | None = None   # torch vs the float64 reference (pairs beyond tolerance)
    err_onnx: float | None = None    # ONNX (node-local) vs the float64 reference
    ref_scale: float | None = None   # max |reference|
    noise: bool | None = None        # beyond tolerance by rounding alone (see engine/noise.py)
    local_noise: bool | None = None  # the ONNX node on torch inputs rounds like torch (creates nothing)
    # inner values (kind "inner"): the FX node whose ONNX translation computes this value, and the op of
    # the finer torch reference it is compared with (None when it cannot be paired: see the comment)
    inner_of: str | None = None
    inner_op: str | None = None
    # the figures asked for with ``metrics=`` (``engine/user_metrics.py``), by name: they describe the
    # pair, the verdict stays the tolerance's
    metrics: dict[str, float] | None = field(default=None, repr=False)
    # a second ONNX model of the program (``b``, twomodels/): its value paired with ``onnx_name``, against
    # torch's; ``b_status`` says which side departs (twomodels/verdicts.py)
    b_name: str | None = None
    b_node_name: str | None = None
    b_op_type: str | None = None
    b_paired_by: str | None = None  # name, metadata, structure or value (twomodels/match.py)
    b_err_abs: float | None = None
    b_err_rel: float | None = None
    b_within_tolerance: bool | None = None
    b_err_local: float | None = None  # b's nodes computing it, fed a's values: their error against a's
    b_status: str | None = None
    b_comment: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# The comment of a pair with elements none of which is finite on both sides.
NOTHING_FINITE = "no finite value compared: NaN/Inf on both sides at every position (inputs NaN/Inf?)"


def nothing_finite(rec: "Record") -> bool:
    """Whether ``rec`` compared elements, none of them finite on both sides: its verdict judged nothing."""
    return rec.n_finite == 0 and bool(rec.n_elements)


_JUDGED = (OK, NOISE, MISMATCH, RESET)


def finite_counts(records: Iterable["Record"]) -> tuple[int, int, int, int]:
    """(pairs that compared nothing finite, pairs compared with elements, the same two among outputs):
    what ``nothing_judged`` reads."""
    blind = compared = blind_out = outputs = 0
    for r in records:
        if r.status not in _JUDGED or not r.n_elements or r.n_finite is None:
            continue
        none = r.n_finite == 0
        compared += 1
        blind += none
        if r.kind == KIND_OUTPUT:
            outputs += 1
            blind_out += none
    return blind, compared, blind_out, outputs


def nothing_judged(records: Iterable["Record"]) -> str | None:
    """A sentence when the verdicts of ``records`` judge (next to) nothing: every compared output, or
    most compared pairs, held no element finite on both sides (NaN/Inf everywhere, as all-NaN inputs
    make). None otherwise, a mix of NaN and finite elements included (its finite part is judged).

    >>> nothing_judged([Record(kind="output", n_elements=4, n_finite=0)])[:35]
    'no finite value was compared in 1 o'
    """
    blind, compared, blind_out, outputs = finite_counts(records)
    if not blind or not (outputs and blind_out == outputs or 2 * blind > compared):
        return None
    where = f"every output among them ({outputs})" if outputs and blind_out == outputs else \
        f"{blind_out} of the {outputs} outputs among them"
    return (f"no finite value was compared in {blind} of the {compared} pairs compared ({where}): both sides "
            "are NaN/Inf at every position there, the inputs are NaN/Inf? Their status (ok) says the NaN/Inf "
            "agree, it is not a judgement of the translation: run on finite inputs")


HISTOGRAM_EDGES = (0.0, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0)
"""Left edges of the |diff| histogram stored in ``Record.histogram`` (last bucket is open)."""

RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(Record))
_TEMPLATE_FIELDS = RECORD_FIELDS[:RECORD_FIELDS.index("stack_trace") + 1]
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(Record)}


def record_template(**known) -> tuple:
    """The fields of a record known before a run (up to ``stack_trace``), named, as the tuple a run
    splats: ``Record(*template)`` costs a third of ``Record(**fields)`` (0.4 ms vs 1.1 ms per 1,200
    records, measured), and a run builds one record per pair; the template is built once per pair.

    >>> Record(*record_template(ep_name="x", status="ok")).ep_name
    'x'
    """
    unknown = set(known) - set(_TEMPLATE_FIELDS)
    if unknown:
        raise TypeError(f"not fields known before a run: {sorted(unknown)}")
    return tuple(known.get(name, _DEFAULTS[name]) for name in _TEMPLATE_FIELDS)


def with_fields(template: tuple, **changes) -> tuple:
    """``template`` with some fields replaced, by name."""
    fields = list(template)
    for name, value in changes.items():
        fields[_TEMPLATE_FIELDS.index(name)] = value
    return tuple(fields)


TABLE_FIELDS = tuple(name for name in RECORD_FIELDS if name != "metrics")
"""The fields of a record as table columns: ``metrics`` (a dict) becomes one column per metric."""


def metric_names(records: Iterable) -> list[str]:
    """The names of the metrics ``records`` carry (``Record.metrics``), in the order they first appear."""
    names: dict[str, None] = {}
    for r in records:
        m = r.metrics if isinstance(r, Record) else (r.get("metrics") if isinstance(r, dict) else None)
        if m:
            names.update(dict.fromkeys(m))
    return list(names)


def to_dataframe(records: Iterable[Record]):
    """One row per record, columns in ``Record`` field order, then one column per metric asked for
    (``metrics=``: ``cosine``, ``sqnr_db``... named as given, float, NaN where a record has none, e.g.
    one-sided pairs). The ``metrics`` dict itself is not a column: its figures are.

    >>> import sbs_widget
    >>> sbs_widget.to_dataframe([sbs_widget.Record(ep_name="x", err_abs=0.0)]).shape[0]
    1
    >>> list(sbs_widget.to_dataframe([sbs_widget.Record(metrics={"cosine": 1.0})]).columns)[-2:]
    ['inner_op', 'cosine']
    """
    import pandas

    records = list(records)
    names = metric_names(records)
    rows = []
    for r in records:
        d = r.to_dict() if isinstance(r, Record) else dict(r)
        figures = d.pop("metrics", None) or {}
        for name in names:
            d[name] = figures.get(name, math.nan)
        rows.append(d)
    df = pandas.DataFrame(rows, columns=list(TABLE_FIELDS) + names)
    for name in names:  # float even where every value is NaN or a figure came as an int
        df[name] = pandas.to_numeric(df[name], errors="coerce").astype("float64")
    return df
