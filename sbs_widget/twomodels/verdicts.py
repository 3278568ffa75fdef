"""The three-way verdict of each value: torch (exact within the run's tolerance), ``a`` (the export) and
``b`` (the transformed model). Which side departs, and for ``b``, by what:

- ``same``: ``b`` within tolerance of torch;
- ``follows a``: ``a`` is beyond tolerance itself and ``b`` no further from torch than ``a``;
- ``departs``: ``b``'s own nodes computing it, fed ``a``'s values (``local.py``), are beyond what their
  precision explains: the transformation made an error here;
- ``rounding``: beyond tolerance, but ``b``'s nodes round as their precision does (float16, int8) and
  nothing upstream departs: the price of the precision, not a bug;
- ``inherits``: beyond tolerance from a departure upstream.

What a precision explains (``envelope``): float32 nodes, the run's tolerance (a rewrite or a fusion
computes the same function); float16 nodes, ``FLOAT16_ENVELOPE`` of the value's magnitude; quantized
nodes (a ``QuantizeLinear``/``DequantizeLinear`` or an integer kernel on the way since the values fed
from ``a``), ``QUANTIZED_ENVELOPE``. Both are relative to the largest magnitude of the value, as the
precision's rounding is: float16 keeps 11 bits (a node rounds each element to ~5e-4 of its magnitude;
reductions add a few of those), int8 keeps 8 (a step of ~1/127 of the range per quantized input).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sbs_widget.twomodels.match import Matching, _Graph, block_size, unblocked

FLOAT16_ENVELOPE = 0.02  # ~40 float16 roundings of the value's magnitude
QUANTIZED_ENVELOPE = 0.25  # ~32 int8 steps of the value's range
QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "MatMulInteger", "ConvInteger",
             "QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "MatMulIntegerToFloat",
             "DynamicQuantizeMatMul", "QAttention", "QGemm"}
LAYOUT_ONLY = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "ReorderInput", "ReorderOutput"}
SAME, FOLLOWS_A, DEPARTS, ROUNDING, INHERITS = "same", "follows a", "departs", "rounding", "inherits"


@dataclasses.dataclass
class LocalVerdict:
    """One value of b, computed from a's values: its error against a's twin and what explains it."""

    b_value: str
    a_value: str
    node: str  # the node of b to blame when it departs
    op_type: str
    precision: str  # float32, float16, quantized
    err_local: float  # max |local - a| / max |a|
    departs: bool
    transformation: str  # what b's nodes there are: "rewritten as X", "cast to float16", "quantized"...
    order: int  # position in b's graph order


@dataclasses.dataclass(frozen=True)
class ValuePlan:
    """What one value of b is, worked out once per pair of models: its twin in a, the nodes of b that
    compute it from the values fed from a, their precision, the node to blame when it departs."""

    b_value: str
    a_value: str
    node: str  # the node computing it
    op_type: str
    blamed: str  # the node to blame when it departs (a converted weight before it, the node before a reshape)
    blamed_op: str
    precision: str
    transformation: str
    order: int
    block: int = 0  # held in onnxruntime's NCHWc layout with this channel block (compared unblocked)


def plan_values(gb: _Graph, matching: Matching, values_a: dict, values_b: dict,
                a_ops: dict[str, str] | None = None) -> list[ValuePlan]:
    """A plan for every float value of b paired with a value of a, in b's graph order (``a_ops``: the op
    computing each value of a, to say what the transformation made of it)."""
    fed = {v for v, (x, how) in matching.b_to_a.items() if x in values_a and how != "dequantized"}  # (local.py's)
    out = []
    for position, v in enumerate(gb.order):
        pair = matching.b_to_a.get(v)
        if pair is not None and pair[1] == "dequantized":  # (compared after its product with the scales)
            continue
        mine, theirs = values_b.get(v), values_a.get(pair[0]) if pair else None
        if pair is None or mine is None or theirs is None or mine.dtype.kind != "f" or mine.size != theirs.size:
            continue
        chain = _local_chain(v, gb, fed)
        precision = _precision(chain, values_b)
        node = gb.producer[v]
        blamed = _blamed_node(node, chain, gb, values_b, matching)
        out.append(ValuePlan(v, pair[0], node.name, node.op_type, blamed.name, blamed.op_type, precision,
                             _transformation(chain, node, precision, (a_ops or {}).get(pair[0])), position,
                             block_size(pair[1])))
    return out


def local_verdicts(plans: list[ValuePlan], values_a: dict, local: dict, atol: float,
                   rtol: float) -> list[LocalVerdict]:
    """Each planned value of b, computed from a's values (``local``), judged against a's."""
    out = []
    for plan in plans:
        mine, theirs = local.get(plan.b_value), values_a.get(plan.a_value)
        if mine is None or theirs is None or mine.dtype.kind != "f" or mine.size != theirs.size:
            continue
        if plan.block:
            mine = unblocked(mine, plan.block)
        e, g = _in_b_type(theirs, mine)
        err = _relative(e, g)
        if plan.precision == "float32":
            departs = not _within(e, g, atol, rtol)
        else:
            departs = err > (FLOAT16_ENVELOPE if plan.precision == "float16" else QUANTIZED_ENVELOPE)
        node, op = (plan.blamed, plan.blamed_op) if departs else (plan.node, plan.op_type)
        out.append(LocalVerdict(plan.b_value, plan.a_value, node, op, plan.precision, err, departs,
                                plan.transformation, plan.order))
    return out


def _in_b_type(theirs: np.ndarray, mine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a's value as b's type holds it (float16: rounded) and b's, flat, in float32 at least, without the
    positions where a's value is beyond the range of b's type: b cannot hold those (the float16 converter
    clamps a mask's -3.4e38 to -10000, onnxruntime makes it -inf); what b does there is judged by its
    consumers."""
    wide = np.promote_types(np.promote_types(theirs.dtype, mine.dtype), np.float32)
    e = theirs.reshape(-1)
    g = mine.reshape(-1).astype(wide, copy=False)
    if mine.dtype.kind == "f" and mine.dtype.itemsize < theirs.dtype.itemsize:
        top = float(np.finfo(mine.dtype).max)
        keep = ~(np.abs(e) > top)
        if not keep.all():
            e, g = e[keep], g[keep]
        e = e.astype(mine.dtype)
    return e.astype(wide, copy=False), g


def _within(e: np.ndarray, g: np.ndarray, atol: float, rtol: float) -> bool:
    """Every element within ``atol + rtol * |a|`` (NaN where both are NaN, and equal infinities, agree)."""
    with np.errstate(invalid="ignore", over="ignore"):
        ok = np.abs(g - e) <= atol + rtol * np.abs(e)
    if ok.all():
        return True
    bad = ~ok
    return bool(((e[bad] == g[bad]) | (np.isnan(e[bad]) & np.isnan(g[bad]))).all())


def _relative(e: np.ndarray, g: np.ndarray) -> float:
    """max |g - e| / max |e| over finite positions; a non-finite pattern that differs: infinite."""
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(g - e)
        top = float(diff.max()) if diff.size else 0.0
        scale = float(np.abs(e).max()) if e.size else 0.0
    if np.isfinite(top) and np.isfinite(scale):  # the common case: all finite, one pass each
        return top / scale if scale > 0 else (0.0 if top == 0 else float("inf"))
    fe, fg = np.isfinite(e), np.isfinite(g)
    if (fe != fg).any() or ((~fe) & (e != g) & ~(np.isnan(e) & np.isnan(g))).any():
        return float("inf")
    if not fe.any():
        return 0.0
    scale = float(np.abs(e[fe]).max())
    diff = float(np.abs(g[fe] - e[fe]).max())
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def _local_chain(v: str, gb: _Graph, fed: set[str]) -> list:
    """The nodes of b that compute ``v`` from the values fed from a (``local.py``): v's producer and,
    upstream, the producers of what is not fed (a weight dequantized or cast on the way included)."""
    chain, todo, seen = [], [v], set()
    while todo:
        value = todo.pop()
        node = gb.producer.get(value)
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        chain.append(node)
        todo.extend(i for i in node.input if i and i not in fed)
    return chain


def _precision(chain: list, values_b: dict) -> str:
    if any(n.op_type in QUANT_OPS for n in chain):
        return "quantized"
    for n in chain:
        for name in [*n.input, *n.output]:
            x = values_b.get(name)
            if x is not None and (x.dtype == np.float16 or x.dtype.kind == "V"):  # (V: bfloat16 as ml_dtypes)
                return "float16"
    return "float32"


def _blamed_node(node, chain: list, gb: _Graph, values_b: dict, matching: Matching):
    """The node of the chain where the departure starts: a node of b that converts a weight (a
    ``DequantizeLinear`` of an int8 weight, a ``Cast`` of a constant) to a value no weight of a is
    within the envelope of, else the node computing the value."""
    for n in reversed(chain):  # upstream first
        if n is node or n.op_type not in ("DequantizeLinear", "Cast") or not n.output:
            continue
        if all(i in gb.initializers or gb.constant(i) for i in n.input if i):
            got = values_b.get(n.output[0])
            if got is not None and got.dtype.kind == "f" and n.output[0] not in matching.b_to_a:
                return n  # a converted weight that equals no weight of a (the value pass found none)
    # the first node of the chain that computes (not a reshape, not a weight's conversion): the values
    # between it and the value are b's own, not paired (a fused node's, or wrong), so the departure can
    # start no later than there
    computing = [n for n in chain if n.op_type not in LAYOUT_ONLY
                 and not all(i in gb.initializers or gb.constant(i) for i in n.input if i)]
    return min(computing, key=lambda n: gb.node_position[id(n)]) if computing else node


def _transformation(chain: list, node, precision: str, a_op: str | None) -> str:
    """What the transformation made of the value, in words: quantized, converted to float16, in a blocked
    layout, fused (a node of b computing what several of a's did), rewritten (another op), or a's op."""
    ops = sorted({n.op_type for n in chain})
    if precision == "quantized":
        return "quantized: " + ", ".join(ops)
    if precision == "float16":
        return "converted to float16: " + ", ".join(ops)
    name = f"{node.domain}.{node.op_type}" if node.domain else node.op_type
    if node.domain == "com.microsoft.nchwc":
        return f"in onnxruntime's NCHWc layout: {name}" + (f" for a's {a_op}" if a_op else "")
    if a_op is None:
        return f"computed by {name}"
    if len(ops) > 1 or node.domain:
        return f"fused: {name} computes a's {a_op}" + (f" (with {', '.join(o for o in ops if o != node.op_type)})"
                                                       if len(ops) > 1 else "")
    if node.op_type != a_op:
        return f"rewritten: a's {a_op} as {node.op_type}"
    return f"a's {a_op}, as b has it"
