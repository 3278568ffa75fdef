"""``compare_models``: the torch program, its export ``a`` and a transformed copy ``b``, in one lockstep run.

``a`` is run against torch node by node as always; ``b`` runs whole once on the same inputs, each of its
values paired with a value of ``a`` (``match.py``) and measured against the same torch value in the run
(``engine/second_model.py``); ``b`` runs once more fed ``a``'s values (``local.py``), so that each value
says whether ``b``'s own nodes depart there (``verdicts.py``). The culprits are the nodes of ``b`` where
a departure starts, the largest excess over what their precision explains first.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import torch

from sbs_widget import records as R
from sbs_widget.engine.entry import Prepared, prepare
from sbs_widget.engine.second_model import BPaired, SecondModel
from sbs_widget.load.readers import load_inputs
from sbs_widget.records import Record
from sbs_widget.twomodels import verdicts as V
from sbs_widget.twomodels.local import local_values
from sbs_widget.twomodels.match import Matching, block_size, unblocked
from sbs_widget.twomodels.paired import paired_models


@dataclasses.dataclass
class BCulprit:
    """A node of b where a departure starts."""

    onnx_node: str  # the node of b
    op_type: str
    b_value: str
    a_value: str  # the value of a it is paired with
    err_local: float  # its error fed a's values, relative to the value's magnitude
    precision: str
    transformation: str
    excess: float  # err_local over what its precision explains

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ModelsComparison:
    """What ``compare_models`` answers: the records (``b_*`` fields filled), the pairing of b with a,
    the local verdicts of b's values, and the culprits in b (most likely first)."""

    records: list[Record]
    matching: Matching
    local: list[V.LocalVerdict]
    culprits: list[BCulprit]
    a_only: dict[str, str]
    b_only: dict[str, str]
    b_model: onnx.ModelProto | None = dataclasses.field(default=None, repr=False)

    @property
    def b_departs(self) -> list[Record]:
        return [r for r in self.records if r.b_status in (V.DEPARTS, V.INHERITS)]

    def to_dataframe(self):
        import pandas

        return pandas.DataFrame([r.to_dict() for r in self.records])


def compare_models(ep, a, b, args=(), kwargs=None, *, atol: float | None = None, rtol: float | None = None,
                   providers_b: list[str] | None = None, **run_options) -> ModelsComparison:
    """Compare ``b`` (a transformed copy of ``a``: ModelProto or path) with ``a`` (the export of ``ep``)
    and the torch program, node by node, on one set of inputs. ``providers_b``: the execution providers
    ``b`` runs on (another provider than a's CPU: the same model on CUDA, say). ``run_options`` go to
    ``Prepared.run``. ``ep`` may be a ``Prepared`` (then ``a`` is None). b's values are paired with a's
    on the first inputs compared and the pairing kept (``paired.py``)."""
    prepared = ep if isinstance(ep, Prepared) and a is None else prepare(ep, a)
    args, kwargs = load_inputs(args, kwargs)
    feeds = onnx_feeds(prepared, args, kwargs)
    pair, first = paired_models(prepared, b, feeds, providers_b)
    tol = prepared.tolerance(atol, rtol)
    # b runs whole once, measured in the lockstep against the same torch values; b's nodes are run fed a's
    # values (its local errors) only when b is beyond tolerance somewhere: a correct float32 rewrite (an
    # optimizer, a simplifier) pays b's run alone
    values_a, values_b = first if first is not None else (None, pair.values_b(feeds))
    second = SecondModel(_paired(pair.matching, pair.a_shapes, values_b, pair.b_model))
    records = list(prepared.run(args, kwargs, atol=tol.atol, rtol=tol.rtol, second=second, **run_options))
    local = []
    if any(r.b_within_tolerance is False for r in records) or not records:
        local = _local(pair, values_a if values_a is not None else pair.values_a(feeds), feeds, tol)
    judge_records(records, local, pair.matching)
    return ModelsComparison(records, pair.matching, local, _culprits(local), pair.matching.a_only,
                            pair.matching.b_only, pair.b_model)


def _local(pair, values_a: dict, feeds: dict, tol) -> list[V.LocalVerdict]:
    key = ("b fed a", *pair.b_key, pair.providers_b)
    return V.local_verdicts(pair.plans, values_a, local_values(pair.rewired, values_a, feeds, pair.providers_b, key),
                            tol.atol, tol.rtol)


def onnx_feeds(prepared: Prepared, args, kwargs) -> dict[str, np.ndarray]:
    """The ONNX model's feeds for the program's inputs (names of a's inputs)."""
    flat, _ = prepared._inputs(args, kwargs)
    by_name = {n.name: v for n, v in zip((n for n in prepared.fx_nodes if n.op == "placeholder"), flat)}
    feeds = {}
    for fx, onnx_name in prepared.alignment.input_pairs:
        value = by_name.get(fx)
        if isinstance(value, torch.Tensor):
            feeds[onnx_name] = value.detach().cpu().numpy()
    return feeds


def _paired(matching: Matching, a_shapes: dict, values_b: dict, b: onnx.ModelProto) -> dict[str, BPaired]:
    """For each value of a, the value of b its consumers read: the last paired one in b's order (a
    DequantizeLinear after the float value, a Cast back to float32), of a's shape where one is."""
    producer = {o: n for n in b.graph.node for o in n.output}
    out = {}
    for a_name, bs in matching.a_to_b.items():
        shaped = [v for v in bs if v in values_b and values_b[v].shape == a_shapes.get(a_name)]
        chosen = (shaped or bs)[-1]
        node = producer.get(chosen)
        how = matching.b_to_a[chosen][1]
        value = values_b.get(chosen)
        if value is not None and block_size(how):  # (NCHWc: measured once unblocked)
            value = unblocked(value, block_size(how))
        out[a_name] = BPaired(chosen, node.name if node is not None else chosen,
                              node.op_type if node is not None else "input", how, value)
    return out


def judge_records(records: list[Record], local: list[V.LocalVerdict], matching: Matching) -> None:
    """Fill ``b_status``, ``b_err_local`` and ``b_comment`` of each record with a value of b."""
    by_value = {lv.b_value: lv for lv in local}
    departed = sorted(lv.order for lv in local if lv.departs)
    for rec in records:
        if rec.b_name is None:
            if rec.onnx_name in matching.a_only:
                rec.b_comment = matching.a_only[rec.onnx_name]
            continue
        lv = by_value.get(rec.b_name)
        if lv is not None:
            rec.b_err_local = lv.err_local
        if rec.b_within_tolerance:
            rec.b_status = V.SAME
        elif rec.status in (R.MISMATCH,) and rec.err_abs is not None and rec.b_err_abs is not None \
                and rec.b_err_abs <= rec.err_abs * 1.01:
            rec.b_status = V.FOLLOWS_A
        elif lv is not None and lv.departs:
            rec.b_status = V.DEPARTS
            rec.b_comment = f"{lv.transformation}: {lv.err_local:.3g} of the value's magnitude fed a's values"
        elif lv is not None and departed and departed[0] < lv.order:
            rec.b_status = V.INHERITS
        elif rec.b_within_tolerance is False:  # nothing departs upstream: the rounding b's precision adds up
            rec.b_status = V.ROUNDING
            if lv is not None:
                rec.b_comment = f"{lv.transformation}: rounds by {lv.err_local:.3g} of the value's magnitude"


def _culprits(local: list[V.LocalVerdict]) -> list[BCulprit]:
    found: dict[str, BCulprit] = {}
    for lv in local:
        if not lv.departs:
            continue
        envelope = {"float16": V.FLOAT16_ENVELOPE, "quantized": V.QUANTIZED_ENVELOPE}.get(lv.precision, 1e-4)
        c = BCulprit(lv.node, lv.op_type, lv.b_value, lv.a_value, lv.err_local, lv.precision, lv.transformation,
                     lv.err_local / envelope)
        if lv.node not in found or found[lv.node].excess < c.excess:
            found[lv.node] = c
    return sorted(found.values(), key=lambda c: -c.excess if np.isfinite(c.excess) else -np.inf)
