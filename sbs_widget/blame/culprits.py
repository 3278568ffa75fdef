"""Culprit finder: the nodes where a discrepancy *starts*, not where it is merely inherited.

Once one ONNX node is wrong, everything downstream differs; a table of differing values is not an
answer. Each compared value is scored from the signals the engine records:

- node-local error (``err_local``: the ONNX node, or its fused group, run on torch's inputs): the
  share of the value's error the node creates by itself, ``err_local / err_abs``;
- input agreement: the torch-twinned inputs of its group (its anchors) agree, so nothing was inherited;
- first divergence in execution order;
- NaN/Inf appearing here while its inputs have none;
- weights: an ONNX initializer that differs from the program's parameter;
- dtype changes: a precision-losing Cast (float32 -> float16...) inside the group that recomputes
  the value names the Cast rather than the consumer.

>>> import sbs_widget
>>> sbs_widget.find_culprits([])
[]
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Iterable, Sequence

import onnx

from sbs_widget import records as R
from sbs_widget.blame.culprit import Culprit, Culprits
from sbs_widget.blame.finer import refine_culprits
from sbs_widget.blame.inside import computing_producer
from sbs_widget.engine.tolerance import resolve
from sbs_widget.errors import NothingJudgedWarning
from sbs_widget.records import Record, nothing_judged

if TYPE_CHECKING:
    from sbs_widget.engine.entry import Prepared

DEFAULT_TOP = 10

# Bits of mantissa per ONNX element type: a Cast to fewer bits loses precision.
_MANTISSA = {
    onnx.TensorProto.DOUBLE: 52, onnx.TensorProto.FLOAT: 23, onnx.TensorProto.FLOAT16: 10,
    onnx.TensorProto.BFLOAT16: 7,
}
for _name in ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ"):
    if hasattr(onnx.TensorProto, _name):
        _MANTISSA[getattr(onnx.TensorProto, _name)] = 3 if "E4M3" in _name else 2
_TYPE_NAME = {v: onnx.TensorProto.DataType.Name(v).lower() for v in _MANTISSA}

# Weights of the evidence in the score (sum to 1): node-local share, inputs agree, first divergence,
# NaN/Inf born here.
W_LOCAL, W_INPUTS, W_FIRST, W_NAN = 0.6, 0.2, 0.1, 0.1
# Errors below the tolerance's ``trace_floor`` (atol * ``TRACE_SHARE``: why that share, in
# engine/tolerance.py) are float rounding, not a signal, when an error is traced back.


def _g(x: float | None) -> str:
    return "?" if x is None else f"{x:.2g}"


def _beyond(rec: Record) -> bool:
    """Beyond tolerance and beyond rounding (``noise`` pairs are never culprits)."""
    if rec.status == R.MISMATCH:
        return True
    if rec.status == R.RESET:
        return rec.within_tolerance is False and rec.noise is not True
    return False


def _local_share(rec: Record, atol: float) -> float:
    """Share of the value's error the node creates by itself, 0 when its local error is noise (below
    ``atol``, or as close to exact as torch's own: ``Record.local_noise``)."""
    if rec.err_local is None or not rec.err_abs or rec.local_noise:
        return 0.0
    if not math.isfinite(rec.err_local):
        return 1.0
    if rec.err_local <= atol:
        return 0.0
    if not math.isfinite(rec.err_abs):
        return 1.0
    return min(1.0, rec.err_local / rec.err_abs)


class _Context:
    """What the prepared pair adds to the records: groups, anchors, consumers, types."""

    def __init__(self, records: Sequence[Record], prepared: Prepared):
        self.p = prepared
        self.by_onnx: dict[str, Record] = {}
        self._traced: dict[int, int | None] = {}
        self._position: dict[int, int] = {}
        for r in records:
            if r.onnx_name is not None and r.onnx_name not in self.by_onnx and r.kind != R.KIND_INNER:
                self.by_onnx[r.onnx_name] = r

    def anchors(self, value: str) -> list[str] | None:
        if self.p is None:
            return None
        try:
            g = self.p.group(value)
        except Exception:  # a value the index does not know
            return None
        return None if g is None else list(g.anchors)

    def group_nodes(self, value: str) -> list[int]:
        if self.p is None:
            return []
        try:
            g = self.p.group(value)
        except Exception:
            return []
        return [] if g is None else list(g.nodes)

    def group_constants(self, value: str) -> list[str]:
        if self.p is None:
            return []
        g = self.p.group(value)
        return [] if g is None else list(g.constants)

    def input_state(self, value: str, noise: float | None = None) -> tuple[bool | None, float, bool]:
        """(all anchors agree or None if unknown, worst anchor err_abs, some anchor has NaN diff).
        Anchors agree when within tolerance, or when their error is below ``noise`` if given."""
        anchors = self.anchors(value)
        if anchors is None:
            return None, 0.0, False
        worst, nan, agree = 0.0, False, True
        for a in anchors:
            r = self.by_onnx.get(a)
            if r is None or r.err_abs is None:
                continue
            worst = max(worst, r.err_abs if math.isfinite(r.err_abs) else math.inf)
            nan = nan or bool(r.err_nan)
            if _beyond(r) or (noise is not None and r.err_abs > noise):
                agree = False
        return agree, worst, nan

    def trace(self, k: int, records: Sequence[Record], candidates: set[int]) -> int | None:
        """Follow the error of record ``k`` back through the anchor carrying the largest error to the
        record that creates most of its own error (``err_local >= err_abs / 2``): its index."""
        if self.p is None:
            return None
        if k in self._traced:
            return self._traced[k]
        position = {id(r): i for i, r in enumerate(records)} if not self._position else self._position
        self._position = position
        seen, cur, found = set(), k, None
        while cur not in seen:
            seen.add(cur)
            rec = records[cur]
            if cur != k and cur in candidates:
                break  # explained by a culprit already named
            anchors = self.anchors(rec.onnx_name) if rec.onnx_name else None
            # the anchor carrying the largest error, however small; a differing NaN/Inf pattern first
            best, best_err = None, (False, 0.0)
            for a in anchors or ():
                r = self.by_onnx.get(a)
                if r is None or r.kind != R.KIND_NODE or r.err_abs is None:
                    continue
                err = (bool(r.err_nan), r.err_abs)
                if err > best_err:
                    best, best_err = r, err
            if rec.err_nan and not best_err[0]:
                found = cur if cur != k else None  # NaN/Inf born here
                break
            # where the error is born: beyond rounding on torch's inputs (judged against float64 where
            # the run did), or most of its own error
            creates = rec.local_noise is False or (rec.local_noise is None and rec.err_local is not None
                                                   and rec.err_abs and rec.err_local >= 0.5 * rec.err_abs)
            if cur != k and not rec.err_nan and creates:
                found = cur
                break
            if best is None:
                break
            cur = position[id(best)]
        self._traced[k] = found
        return found

    def computing_producer(self, value: str, node_name: str | None):
        """See ``inside.computing_producer``: the node inside ``value``'s group where its difference
        starts when the compared node only copies."""
        if self.p is None or node_name is None:
            return None
        return computing_producer(self.p, set(self.group_nodes(value)), value)

    def lossy_cast(self, value: str):
        """A precision-losing Cast in the group recomputing ``value``: (cast node, value it rounds)."""
        if self.p is None:
            return None
        idx = self.p.index
        for i in self.group_nodes(value):
            node = idx.nodes[i]
            if node.op_type != "Cast" or not node.input:
                continue
            to = next((a.i for a in node.attribute if a.name == "to"), 0)
            src = node.input[0]
            vt = idx.types.get(src)
            frm = vt.elem_type if vt is not None else 0
            if not frm:  # type unknown: a round trip (Cast back to a wider type) says what it was
                back = [idx.nodes[j] for j in idx.consumers.get(node.output[0], []) if idx.nodes[j].op_type == "Cast"]
                frm = next((a.i for b in back for a in b.attribute if a.name == "to"), 0)
            if frm in _MANTISSA and to in _MANTISSA and _MANTISSA[to] < _MANTISSA[frm]:
                return node, src, frm, to
        return None

    def twin_downstream(self, name: str) -> str | None:
        """The first value with a torch twin computed from ``name`` (breadth first)."""
        if self.p is None:
            return None
        idx, twins = self.p.index, self.p.alignment.onnx_to_fx
        queue, seen = list(idx.consumers.get(name, [])), set()
        while queue:
            i = queue.pop(0)
            if i in seen:
                continue
            seen.add(i)
            out = next((o for o in idx.nodes[i].output if o in twins), None)
            if out is not None:
                return out
            for o in idx.nodes[i].output:
                queue.extend(idx.consumers.get(o, []))
        return None

    def consumer(self, initializer: str):
        if self.p is None:
            return None
        readers = self.p.index.consumers.get(initializer) or []
        return self.p.index.nodes[readers[0]] if readers else None


def find_culprits(records: Iterable[Record], *, top: int = DEFAULT_TOP, prepared: Prepared | None = None,
                  atol: float | None = None, rtol: float | None = None) -> Culprits:
    """Rank the places where errors originate, most likely first.

    ``records``: what ``run_aligned``/``Prepared.run`` yielded, best with ``node_local=True``
    (``err_local``); ``prepared``: the ``Prepared`` pair they come from (optional: it adds input
    agreement and Cast attribution). An export whose values all agree gives ``[]``; where the pairs compared
    no finite element (all-NaN inputs) the empty list's ``cannot_judge`` says so, with a
    ``NothingJudgedWarning``. ``atol``/``rtol``:
    those of the run (``None``: the program's default with ``prepared``, else 1e-4).

    >>> import sbs_widget
    >>> rec = sbs_widget.Record(onnx_name="y", onnx_node_name="n", onnx_op_type="Add", status="mismatch",
    ...                         err_abs=0.5, err_local=0.5)
    >>> [c.onnx_node for c in sbs_widget.find_culprits([rec])]
    ['n']
    """
    records = list(records)
    tolerance = prepared.tolerance(atol, rtol) if prepared is not None else resolve(atol, rtol, None)
    atol, rtol = tolerance
    ctx = _Context(records, prepared)
    out: list[Culprit] = []
    first_seen = False
    inherited: list[int] = []
    explained: set[str] = set()  # initializers already named by a weight culprit

    for k, rec in enumerate(records):
        if rec.kind in (R.KIND_INPUT, R.KIND_INNER):  # (inner values: refine_culprits looks inside)
            continue
        if rec.kind == R.KIND_WEIGHT:
            if _beyond(rec) and rec.onnx_name:
                out.append(_weight_culprit(k, rec, ctx))
                explained.add(rec.onnx_name)
            continue
        if not _beyond(rec) or rec.onnx_name is None:
            continue
        first = not first_seen
        first_seen = True
        share = _local_share(rec, atol)
        agree, worst_in, nan_in = ctx.input_state(rec.onnx_name)
        nan_here = bool(rec.err_nan) and not nan_in
        if agree is None:  # no group: guess from the records only
            agree = first
        evidence = W_LOCAL * share + W_INPUTS * (1.0 if agree else 0.0) + W_FIRST * first + W_NAN * nan_here
        local_known = rec.err_local is not None
        if local_known and share == 0.0 and not nan_here:
            inherited.append(k)  # the node recomputes its value from torch inputs correctly
            continue
        if not local_known and not agree:
            continue  # nothing says the error starts here
        if rec.onnx_name and any(c in explained for c in ctx.group_constants(rec.onnx_name)) and share > 0:
            continue  # a differing weight already explains this node
        out.append(_node_culprit(k, rec, ctx, evidence, share, agree, worst_in, nan_here, first))

    # An inherited mismatch whose error was born below tolerance upstream: follow the error back.
    named = {c.record for c in out}
    for k in inherited:
        origin = ctx.trace(k, records, named)
        if origin is None or origin in named:
            continue
        named.add(origin)
        rec = records[origin]
        if any(c in explained for c in ctx.group_constants(rec.onnx_name)):
            continue
        agree, worst_in, _ = ctx.input_state(rec.onnx_name, noise=tolerance.trace_floor)
        share = min(1.0, (rec.err_local or 0.0) / rec.err_abs) if rec.err_abs else 0.0
        evidence = W_LOCAL * share + W_INPUTS * (1.0 if agree else 0.0)
        c = _node_culprit(origin, rec, ctx, evidence, share, agree, worst_in, False, False)
        c.reason += (f"; below tolerance here ({_g(rec.err_abs)}), the error grows downstream to "
                     f"{_g(records[k].err_abs)} at {records[k].onnx_name!r}")
        out.append(c)

    out.sort(key=lambda c: (-c.score, c.record if c.record is not None else 0))
    out = Culprits(_one_per_onnx_node(out)[:top] if top else _one_per_onnx_node(out))
    if not out:
        blind = nothing_judged(records)
        if blind is not None:  # "no culprit" would read as "the translation is right"
            out.cannot_judge = f"cannot judge, no culprit can be named: {blind}"
            warnings.warn(out.cannot_judge, NothingJudgedWarning, stacklevel=2)
        else:
            from sbs_widget.engine.summary import run_verdict

            out.verdict = run_verdict(records)
    return out


def _one_per_onnx_node(culprits: list[Culprit]) -> list[Culprit]:
    """One culprit per ONNX node (the best ranked): an ONNX value twin of two FX names (``view_3``
    and the ``scaled_dot_product_attention`` it ends) is one place to look, said once."""
    kept: dict[tuple, Culprit] = {}
    out = []
    for c in culprits:
        key = (c.kind, c.onnx_node, c.onnx_name) if c.kind == "weight" else (c.onnx_node or c.onnx_name,)
        first = kept.get(key)
        if first is None or key == (None,):
            kept[key] = c
            out.append(c)
        elif c.ep_name and c.ep_name != first.ep_name and f"'{c.ep_name}'" not in first.reason:
            first.reason += f" (also the twin of FX node {c.ep_name!r})"
    return out


def _weight_culprit(k: int, rec: Record, ctx: _Context) -> Culprit:
    consumer = ctx.consumer(rec.onnx_name)
    reader = f"; it feeds {consumer.op_type} node {consumer.name!r}" if consumer is not None else ""
    return Culprit(
        onnx_node=consumer.name if consumer is not None else None, onnx_name=rec.onnx_name,
        onnx_op_type="initializer", ep_name=rec.ep_name, ep_target=rec.ep_target, module=rec.module,
        score=1.0, kind="weight", record=k, err_abs=rec.err_abs, value=ctx.twin_downstream(rec.onnx_name),
        reason=f"initializer {rec.onnx_name!r} differs from the program's {rec.ep_target or rec.ep_name} "
               f"by {_g(rec.err_abs)}" + (f" at {rec.err_where}" if rec.err_where else "")
               + f"{reader}: the ONNX file holds a different weight",
    )


def _node_culprit(k, rec, ctx, evidence, share, agree, worst_in, nan_here, first) -> Culprit:
    op = rec.onnx_op_type or "node"
    inputs = f"its inputs agree to {_g(worst_in)}" if agree else f"its inputs already differ by {_g(worst_in)}"
    cast = ctx.lossy_cast(rec.onnx_name) if share > 0 else None
    if cast is not None:
        node, src, frm, to = cast
        return Culprit(
            onnx_node=node.name, onnx_name=src, onnx_op_type="Cast", ep_name=rec.ep_name,
            ep_target=rec.ep_target, module=rec.module, score=round(evidence, 4), kind="cast", record=k,
            err_abs=rec.err_abs, err_local=rec.err_local, value=rec.onnx_name,
            reason=f"Cast node {node.name!r} rounds {src!r} from {_TYPE_NAME[frm]} to {_TYPE_NAME[to]} before "
                   f"{op} {rec.onnx_node_name!r} reads it: {op} gives {_g(rec.err_local)} on torch inputs "
                   f"({inputs}); keep {src!r} in {_TYPE_NAME[frm]}",
        )
    if nan_here and share == 0:
        why = f"NaN/Inf appear in {op} {rec.onnx_node_name!r} ({rec.err_nan} elements) while {inputs}"
    elif rec.err_local is None:
        why = (f"first value beyond tolerance ({_g(rec.err_abs)}) in execution order and {inputs}; "
               f"{op} could not be rerun on torch inputs: check this node first")
    elif agree:
        why = (f"{op} gives {_g(rec.err_local)} on torch inputs; {inputs}: the node itself differs"
               + (", and NaN/Inf appear here" if nan_here else ""))
    else:
        why = (f"{op} adds {_g(rec.err_local)} of its own on torch inputs ({inputs}, output off by "
               f"{_g(rec.err_abs)}): the node itself differs")
    inner = ctx.computing_producer(rec.onnx_name, rec.onnx_node_name) if agree and rec.err_local else None
    if inner is not None:  # the compared node only copies: the difference starts inside the translation
        node, value, copy = inner
        why = (f"{node.op_type} {node.name!r}, inside the translation of {rec.ep_name!r}: the compared value "
               f"comes out of {copy.op_type} {copy.name!r}, which only copies it; {op} gives {_g(rec.err_local)} "
               f"on torch inputs ({inputs}), so {node.op_type} {node.name!r} computes it differently")
        if rec.err_where:
            why += f"; beyond tolerance at {rec.err_where}"
        return Culprit(
            onnx_node=node.name, onnx_name=value, onnx_op_type=node.op_type, ep_name=rec.ep_name,
            ep_target=rec.ep_target, module=rec.module, score=round(evidence, 4), kind="node", record=k,
            err_abs=rec.err_abs, err_local=rec.err_local, reason=why, value=rec.onnx_name,
        )
    shown = _group_of(ctx, rec)
    if shown:
        named = ", ".join(f"{n.op_type} {n.name!r}" for n in shown[:3]) + (", ..." if len(shown) > 3 else "")
        why += f" (or one of the {len(shown)} ONNX-only nodes computed with it: {named})"
    if rec.err_where:  # a difference confined to some rows or channels says a lot about its cause
        why += f"; beyond tolerance at {rec.err_where}"
    if "dtypes differ" in (rec.comment or ""):
        why += f"; {rec.comment[rec.comment.index('dtypes differ'):].split(';')[0]}"
    return Culprit(
        onnx_node=rec.onnx_node_name, onnx_name=rec.onnx_name, onnx_op_type=rec.onnx_op_type,
        ep_name=rec.ep_name, ep_target=rec.ep_target, module=rec.module, score=round(evidence, 4),
        kind="node" if rec.err_local is not None else "first-divergence", record=k, err_abs=rec.err_abs,
        err_local=rec.err_local, reason=why, value=rec.onnx_name, group=[n.name for n in shown],
    )


def _group_of(ctx: _Context, rec: Record) -> list:
    """The ONNX-only nodes computed with ``rec``'s node (its group but itself), those that compute first."""
    group = ctx.group_nodes(rec.onnx_name) if ctx.p is not None else []
    if len(group) <= 1:
        return []
    others = [ctx.p.index.nodes[i] for i in group if ctx.p.index.nodes[i].name != rec.onnx_node_name]
    return sorted(others, key=lambda n: n.op_type in _MOVES_VALUES)


# Ops that make constants, read shapes or move values without computing new ones: rarely where a
# numerical difference starts, so a culprit's reason names the other nodes of its group first.
_MOVES_VALUES = frozenset({"Constant", "ConstantOfShape", "Shape", "Size", "Range", "Slice", "Reshape", "Transpose",
                           "Unsqueeze", "Squeeze", "Flatten", "Concat", "Split", "Gather", "Expand", "Identity"})


def culprits(ep, onx=None, inputs=(), kwargs=None, *, top: int = DEFAULT_TOP, atol: float | None = None,
             rtol: float | None = None, runtime: str = "onnxruntime", reference: bool = True) -> Culprits:
    """Run ``ep`` and ``onx`` side by side with ``node_local=True`` and return ``find_culprits``.
    ``reference=False``: no float64 verdict (pairs beyond tolerance are all mismatches, as before
    the ``noise`` status).

    ``ep``/``onx``: as for ``prepare`` (or a ``Prepared``), or a ``torch.nn.Module`` with ``onx=None``
    (exported here: ``export_module``); ``inputs``: args tuple, or a path to a ``torch.save``d inputs
    file.

    >>> import torch, sbs_widget
    >>> model, inputs = sbs_widget.dummy_llm()
    >>> prog = torch.onnx.export(torch.export.export(model, inputs), inputs, dynamo=True)  # doctest: +SKIP
    >>> sbs_widget.culprits(prog, None, inputs)                                            # doctest: +SKIP
    []
    """
    from sbs_widget.engine.entry import from_model

    ep, onx = from_model(ep, onx, inputs, kwargs)
    prepared = as_prepared(ep, onx)
    atol, rtol = prepared.tolerance(atol, rtol)
    records = list(prepared.run(inputs, kwargs, runtime=runtime, atol=atol, rtol=rtol, node_local=True,
                                reference=reference))
    found = find_culprits(records, top=top, prepared=prepared, atol=atol, rtol=rtol)
    refined = Culprits(refine_culprits(found, prepared, inputs, kwargs, atol, rtol))  # inside translations: finer.py
    refined.cannot_judge, refined.verdict = found.cannot_judge, found.verdict if not refined else None
    return refined


def as_prepared(ep, onx=None):
    from sbs_widget.engine.entry import Prepared, prepare

    return ep if isinstance(ep, Prepared) else prepare(ep, onx)
