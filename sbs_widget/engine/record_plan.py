"""The fields of every record known before anything runs, worked out once per pair and read by every
run (``records.record_template``): per pair of values, per segment, per weight, per inner value."""

from __future__ import annotations

from sbs_widget import records as R
from sbs_widget.align.inner_values import onnx_only_reasons
from sbs_widget.align.pair import Pair
from sbs_widget.engine.pair_cache import PairCache
from sbs_widget.records import record_template, with_fields

_ALIAS_COMMENT = "no-op removed by the ONNX optimizer: compared with its input's twin"
_RESHAPED_COMMENT = ("no ONNX value of its shape: the ONNX graph has it only reshaped (a reshape removed or "
                     "moved by the optimizer); compared with that value, reshaped")
_DUPLICATE_COMMENT = ("same op on the same inputs as FX node {!r}: the ONNX optimizer merged them "
                      "(common subexpression elimination); compared with that node's twin")
_SHARED_COMMENT = ("equal to the constant of FX node {!r}: the ONNX optimizer folded both and kept one "
                   "initializer; compared with it")
_MATCHED_BY = {**{how: f"matched by {how}" for how in ("metadata", "folded", "consumer")},
               "fused": "matched by name: an output of a node fused from several"}


def record_fields(pair: Pair, cache: PairCache, fx_name: str | None, onnx_name: str | None, kind: str, how: str,
                  comment: str | None = None) -> tuple:
    """The fields of a record known before anything runs: worked out once per pair of values, read by
    every run. ``comment``: instead of the one saying how the pair was matched."""
    key = (fx_name, onnx_name, kind, how, comment)
    fields = cache.record_fields.get(key)
    if fields is not None:
        return fields
    index, alignment = pair.index, pair.alignment
    i = index.producer.get(onnx_name) if onnx_name is not None else None
    info = alignment.fx_nodes[pair.fx_position[fx_name]] if fx_name is not None else None
    if i is not None:
        op, node_name, out = index.op_types[i], index.nodes[i].name, index.node_outputs[i].index(onnx_name)
        # the FX side's module path when it has one (the ONNX scopes are read only otherwise)
        module = info.module if info is not None and info.module else index.module_of_node(i)
    else:
        op = "initializer" if onnx_name in index.initializers else "input" if onnx_name in index.inputs else None
        node_name = out = None
        module = info.module if info is not None else ""
    onnx_shape = index.describe(onnx_name) if onnx_name is not None else None
    if comment is None:
        comment = alias_comment(pair, fx_name) if how == "duplicate" else \
            _SHARED_COMMENT.format(alignment.shares_constant_of[fx_name]) if how == "shared" else \
            _MATCHED_BY.get(how, "")
    fields = record_template(
        onnx_id_node=i, onnx_name=onnx_name, onnx_op_type=op, onnx_id_output=out, onnx_shape_type=onnx_shape,
        comment=comment, status=R.OK, module=module, kind=kind, onnx_node_name=node_name)
    if info is not None:
        fields = with_fields(fields, ep_id_node=info.index, ep_name=fx_name, ep_target=info.target,
                             ep_shape_type=info.shape_type, ep_origin=info.origin, stack_trace=info.stack_line)
    cache.record_fields[key] = fields
    return fields


def alias_comment(pair: Pair, fx_name: str) -> str:
    source = pair.alignment.duplicate_of.get(fx_name)
    if source is not None:
        return _DUPLICATE_COMMENT.format(source)
    return _RESHAPED_COMMENT if fx_name in pair.alignment.reshaped else _ALIAS_COMMENT


def segment_records(pair: Pair, cache: PairCache, start: int, end: int) -> list[tuple]:
    """What the records of segment ``[start, end)`` are, worked out once: per ONNX value in node order,
    ``(value, FX twin or None, record fields, ((FX alias, its record fields), ...))``; values with
    neither a twin nor a reason to be reported (Constant nodes, model outputs) are left out."""
    key = (start, end)
    plan = cache.segment_records.get(key)
    if plan is not None:
        return plan
    plan = []
    index, inner = pair.index, pair.inner
    onnx_to_fx, pairs, aliases = pair.alignment.onnx_to_fx, pair.alignment.pairs, pair.alignment.aliases
    outputs = set(index.outputs)
    for i in range(start, end):
        # the constants an inner value reads (align/inner_pairs.py), recorded with their reader
        plan += [(x, None, inner_fields(pair, cache, x), ()) for x in inner.constants_of.get(i, ())]
        for o in index.node_outputs[i]:
            if not o:
                continue
            fx_name = onnx_to_fx.get(o)
            if fx_name is None:
                if o in inner.of:
                    plan.append((o, None, inner_fields(pair, cache, o), ()))
                elif index.op_types[i] != "Constant" and o not in outputs:
                    plan.append((o, None, record_fields(pair, cache, None, o, R.KIND_NODE, ""), ()))
                continue
            more = aliases.get(o)
            if more:
                more = tuple((a, record_fields(pair, cache, a, o, R.KIND_NODE, "", alias_comment(pair, a)))
                             for a in more)
            matched = pairs[fx_name]
            plan.append((o, fx_name, record_fields(pair, cache, fx_name, o, matched.kind, matched.how), more or ()))
    cache.segment_records[key] = plan
    return plan


def weight_records(pair: Pair, cache: PairCache) -> list[tuple[tuple, str, str | None, bool]]:
    """Per weight, worked out once: (record fields, FX placeholder, ONNX initializer to compare with or
    None when there is nothing to compare, whether it holds the parameter transposed)."""
    if cache.weight_records is None:
        plan = []
        for w in pair.alignment.weights:
            fields = with_fields(record_fields(pair, cache, w.placeholder, w.onnx_name or None, R.KIND_WEIGHT, ""),
                                 ep_target=w.key, onnx_op_type="initializer" if w.onnx_name else None)
            comparable, comment = w.comparable, w.comment
            if w.transposed and w.onnx_name in pair.alignment.onnx_to_fx:  # the program's own transpose
                comparable = False  # is compared with it already
                comment = f"folded into {w.onnx_name} (compared where the program transforms it)"
                fields = with_fields(fields, onnx_name=None, onnx_op_type=None)
            if comment:
                fields = with_fields(fields, comment=comment)
            if not comparable:
                fields = with_fields(fields, status=R.ONE_SIDED)
            plan.append((fields, w.placeholder, w.onnx_name if comparable else None, w.transposed))
        cache.weight_records = plan
    return cache.weight_records


def only_onnx_reasons(pair: Pair, cache: PairCache) -> dict[int, str]:
    """``align/inner_values.onnx_only_reasons``, once per pair."""
    if cache.onnx_only_reasons is None:
        cache.onnx_only_reasons = onnx_only_reasons(pair)
    return cache.onnx_only_reasons


def inner_fields(pair: Pair, cache: PairCache, value: str) -> tuple:
    """The record fields of ``value``, inside the translation of an FX node: named after its finer
    reference node when paired, with why when not."""
    plan = pair.inner
    fx = plan.of[value]
    info = pair.alignment.fx_nodes[pair.fx_position[fx]]
    inner = plan.pairs.get(value)
    if inner is None:
        reason = only_onnx_reasons(pair, cache).get(pair.index.producer.get(value, -1),
                                                    f"inside the translation of {fx!r}")
        comment = f"{reason}; {plan.why.get(value, 'not paired')}"
        return with_fields(record_fields(pair, cache, None, value, R.KIND_INNER, "", comment), ep_origin=info.origin)
    if inner.constant:
        what = f"the scalar {inner.literal:.6g}" if inner.literal is not None else "the constant"
        comment = (f"a constant inside the translation of {fx!r}: compared with {what} "
                   f"{plan.finer[inner.key].label} uses there ({inner.finer})")
    else:
        comment = f"inside the translation of {fx!r}: compared with {plan.finer[inner.key].label} ({inner.finer})"
    return with_fields(record_fields(pair, cache, None, value, R.KIND_INNER, "", comment),
                       ep_name=f"{fx}::{inner.finer}", ep_target=inner.op, ep_origin=info.origin,
                       stack_trace=info.stack_line)


def record_positions(pair: Pair, cache: PairCache) -> dict[str, int]:
    """ONNX value -> the node its record comes with (its producer; an inner constant: its reader)."""
    if cache.record_positions is None:
        cache.record_positions = {**pair.index.producer, **pair.inner.recorded_at(pair.index.producer)}
    return cache.record_positions
