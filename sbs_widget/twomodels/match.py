"""Which value of ``a`` each value of ``b`` is, when ``b`` is ``a`` transformed (simplified, optimized,
converted to float16, quantized).

Pairing never guesses from names alone; it goes, in order:

1. **name**: the transformation kept the value's name and shape (the optimizers, float16 conversion and
   quantizers keep most names of the values they leave in place);
2. **structure**, in ``b``'s graph order: a node whose inputs are paired, with the op type and input
   values of a node of ``a``, computes what that node computes (a renamed value: onnxslim); a ``Cast``,
   a ``DequantizeLinear`` of a ``QuantizeLinear``, or a ``DequantizeLinear`` of a quantized weight is
   the value it converts (float16 conversion, QDQ quantization);
3. **value**, for what is left (a fused node's output: ``SkipLayerNormalization``, ``FusedMatMul``): a
   value of ``a`` of the same shape, downstream of what the node's paired inputs are paired with, equal
   to it within ``VALUE_MATCH`` of its scale, the closest one. Weights of ``a`` are candidates too (a
   dequantized weight).

What is not paired is one-sided, with why: a value of ``a`` fused or folded into a node of ``b``, a
value of ``b`` that is a quantized form (integers), a value new in ``b``.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np
import onnx
from onnx import numpy_helper

# a value of b is paired by value with a value of a whose |difference| is within this share of the
# value's largest magnitude: a transformed model rounds differently (float16: ~1e-3, int8: a few %), a
# different value of the same shape rarely comes this close
VALUE_MATCH = 0.05
EXACT_MATCH = 1e-3  # closer than this: the same value rounded differently, no better twin looked for
# ops that convert a value without changing what it is (b's value is a's, in another type)
CONVERTS = {"Cast", "CastLike", "DequantizeLinear", "Identity"}
# ops that keep a value's elements in order under another shape (an optimizer flattens a MatMul's input
# for a Gemm): the same value, reshaped
RESHAPES = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}
BLOCKED_LAYOUT = "com.microsoft.nchwc"  # onnxruntime's blocked channels: elements in another order


@dataclasses.dataclass
class Matching:
    """``b_to_a``: b value -> (a value, how); ``a_to_b``: a value -> the b values paired with it (the last
    one is what b's consumers read); ``a_only``/``b_only``: values without a twin, with why."""

    b_to_a: dict[str, tuple[str, str]]
    a_to_b: dict[str, list[str]]
    a_only: dict[str, str]
    b_only: dict[str, str]
    b_float: list[str]  # b's float values, in graph order (what the coverage counts)

    @property
    def coverage(self) -> float:
        """The share of b's float values paired with a value of a."""
        if not self.b_float:
            return 1.0
        return sum(1 for v in self.b_float if v in self.b_to_a) / len(self.b_float)


def match_models(a: onnx.ModelProto, b: onnx.ModelProto, values_a: dict[str, np.ndarray],
                 values_b: dict[str, np.ndarray]) -> Matching:
    """Pair the values of ``b`` with those of ``a`` (see the module's docstring); ``values_*``: each model's
    values on the same inputs (``values.all_values``)."""
    ga, gb = _Graph(a), _Graph(b)
    values_a = _Values(values_a)
    weights_a = {i.name: numpy_helper.to_array(i) for i in a.graph.initializer}
    b_to_a: dict[str, tuple[str, str]] = {}
    for name in gb.order:  # 1. names kept
        if _blocked(gb.producer[name]):
            continue
        if name in ga.position and _same_shape(values_a.get(name), values_b.get(name)):
            b_to_a[name] = (name, "name")
    for name in gb.inputs:
        if name in ga.inputs:
            b_to_a[name] = (name, "name")
    _back_through_layout(gb, b_to_a, values_a, values_b)
    for node in gb.nodes:  # 2. structure, 3. values, in b's graph order (a node's inputs are paired first)
        if _blocked(node):  # (values in a blocked layout: compared once unblocked)
            _by_blocked_value(node, ga, gb, b_to_a, values_a, values_b)
            continue
        for k, out in enumerate(node.output):
            if out in b_to_a and b_to_a[out][1] == "name" and _far(values_a.get(out), values_b.get(out)):
                # a kept name on another value (an optimizer folding a BatchNorm into the Conv before it
                # names the Conv's output as the Conv's): the value of a it equals, if one does
                twin = _by_value(out, node, ga, gb, b_to_a, values_a, values_b, weights_a)
                if twin is not None and twin != out:
                    b_to_a[out] = (twin, "value")
                continue
            if not out or out in b_to_a:
                continue
            twin = _by_structure(node, k, ga, gb, b_to_a, weights_a, values_a, values_b)
            if twin is not None and _far(values_a.get(twin), values_b.get(out)):
                # the structure says twin, the values another (a quantization range that clamps like the
                # Relu it replaced): the value of a it equals, if one does; else the structure stands
                # (a node of b that computes it wrongly)
                twin = _by_value(out, node, ga, gb, b_to_a, values_a, values_b, weights_a) or twin
            if twin is not None:
                b_to_a[out] = (twin, "structure")
                continue
            twin = _by_value(out, node, ga, gb, b_to_a, values_a, values_b, weights_a)
            if twin is not None:
                b_to_a[out] = (twin, "value")
    params = _quantization_parameters(gb)
    _dequantized_later(gb, b_to_a, params, values_b)
    a_to_b: dict[str, list[str]] = defaultdict(list)
    for bv in gb.order:
        if bv in b_to_a:
            a_to_b[b_to_a[bv][0]].append(bv)
    b_float = [v for v in gb.order if _is_float(values_b.get(v)) and v not in params]
    b_only = _b_only(gb, b_to_a, values_b)
    b_only.update({v: "a quantization scale (not a value of the program)" for v in params if v not in b_to_a})
    return Matching(b_to_a, dict(a_to_b), _a_only(ga, gb, a_to_b, b_to_a), b_only, b_float)


def _back_through_layout(gb: _Graph, b_to_a: dict, values_a: dict, values_b: dict) -> None:
    """A reshape, a cast or a dequantization of a quantization keeps what a value is: where its output kept
    its name, its input is the same value of a (the input of a Reshape an optimizer named as the MatMul
    output it replaced; what a Gemm computes before its output is quantized). From the outputs back."""
    for node in reversed(gb.nodes):
        if node.op_type not in RESHAPES | CONVERTS or not node.input or not node.output:
            continue
        out, src = node.output[0], node.input[0]
        if out not in b_to_a:
            continue
        if node.op_type == "DequantizeLinear":  # through the QuantizeLinear before it
            q = gb.producer.get(src)
            if q is None or q.op_type != "QuantizeLinear" or not q.input:
                continue
            src = q.input[0]
        twin = b_to_a[out][0]
        e = values_a.get(twin)
        if src and src not in b_to_a and src in gb.producer and _same_size(e, values_b.get(src)) \
                and not _far(e, values_b.get(out)) and not _far(e, values_b.get(src)):
            b_to_a[src] = (twin, "structure")  # (a kept name on another value, a clamping range: not followed)


BLOCKS = (8, 16)  # onnxruntime's channel blocks: 8 floats (AVX2), 16 (AVX-512)


def _blocked(node) -> bool:
    """A node of onnxruntime's NCHWc layout whose outputs are blocked (``ReorderOutput`` unblocks)."""
    return node.domain == BLOCKED_LAYOUT and node.op_type != "ReorderOutput"


def block_size(how: str) -> int:
    """The channel block of a value paired in onnxruntime's NCHWc layout (``"nchwc16"``), else 0."""
    return int(how[5:]) if how.startswith("nchwc") else 0


def unblocked(x: np.ndarray, block: int) -> np.ndarray:
    """A value in NCHWc layout (``[N, C/block, H, W, block]`` in memory, reported ``[N, C, H, W]``) as NCHW."""
    n, c, *space = x.shape
    moved = x.reshape(n, c // block, *space, block)
    return np.moveaxis(moved, -1, 2).reshape(x.shape)


def blocked(x: np.ndarray, block: int) -> np.ndarray:
    """``unblocked``'s inverse: an NCHW value laid out as onnxruntime's NCHWc nodes read it."""
    n, c, *space = x.shape
    return np.ascontiguousarray(np.moveaxis(x.reshape(n, c // block, block, *space), 2, -1)).reshape(x.shape)


def _by_blocked_value(node, ga: _Graph, gb: _Graph, b_to_a: dict, values_a: dict, values_b: dict) -> None:
    """The outputs of a node in onnxruntime's NCHWc layout, paired by value once unblocked (the block
    size is the one that makes the value equal one of a's)."""
    for out in node.output:
        got = values_b.get(out)
        if out in b_to_a or not _is_float(got) or got.ndim < 3:
            continue
        ancestors = [b_to_a[i][0] for i in node.input if i in b_to_a]
        below = [ga.downstream(v) for v in ancestors]
        candidates = [v for v in values_a.of_size(got.size) if v not in ancestors and all(v in d for d in below)]
        best = None
        for block in BLOCKS:
            if got.shape[1] % block:
                continue
            twin, err = _closest(unblocked(got, block), candidates, values_a, ga, VALUE_MATCH)
            if twin is not None and (best is None or err < best[1]):
                best = (twin, err, block)
        if best is not None:
            b_to_a[out] = (best[0], f"nchwc{best[2]}")


def _quantization_parameters(gb: _Graph) -> set[str]:
    """The scales of dynamic quantization and the values computed from scales and weights alone (a
    product of scales): parameters of b's arithmetic, not values of the program (not counted)."""
    params: set[str] = set()
    for n in gb.nodes:
        if n.op_type == "DynamicQuantizeLinear" and len(n.output) > 1 and n.output[1]:
            params.add(n.output[1])
        elif n.input and any(i in params for i in n.input) and \
                all(i in params or i in gb.initializers or gb.constant(i) for i in n.input if i):
            params.update(o for o in n.output if o)
    return params


def _dequantized_later(gb: _Graph, b_to_a: dict, params: set[str], values_b: dict) -> None:
    """An integer kernel's accumulator cast to float, multiplied by scales (and given its bias) into a paired
    value, is that value before its dequantization: paired with it (``"dequantized"``: compared after)."""
    for v in reversed(gb.order):
        if v in b_to_a or not _is_float(values_b.get(v)) or v in params:
            continue
        users = gb.consumers.get(v, [])
        if len(users) != 1 or users[0].op_type not in ("Mul", "Add") or not users[0].output:
            continue
        other = [i for i in users[0].input if i != v]
        out = users[0].output[0]
        if other and all(i in params or i in gb.initializers or gb.constant(i) for i in other) and out in b_to_a:
            b_to_a[v] = (b_to_a[out][0], "dequantized")


class _Graph:
    """A model's main graph as the pairing reads it: producers, consumers, graph order, initializers."""

    def __init__(self, model: onnx.ModelProto):
        self.nodes = list(model.graph.node)
        self.inputs = [i.name for i in model.graph.input]
        self.initializers = {i.name for i in model.graph.initializer}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        self.order: list[str] = []
        for n in self.nodes:
            for i in n.input:
                if i:
                    self.consumers[i].append(n)
            for o in n.output:
                if o:
                    self.producer[o] = n
                    self.order.append(o)
        self.position = {v: i for i, v in enumerate([*self.inputs, *self.order])}
        self.node_position = {id(n): k for k, n in enumerate(self.nodes)}
        self._downstream: dict[str, set[str]] = {}
        self._constant = self._constants()

    def constant(self, value: str) -> bool:
        """A value computed from initializers alone (or one)."""
        return value in self.initializers or value in self._constant

    def _constants(self) -> set[str]:
        """The values computed from initializers alone, in one pass in graph order."""
        out: set[str] = set()
        for n in self.nodes:
            if all(i in self.initializers or i in out for i in n.input if i):
                out.update(o for o in n.output if o)
        return out

    def downstream(self, value: str) -> set[str]:
        """The values computed from ``value`` (itself included)."""
        hit = self._downstream.get(value)
        if hit is None:
            hit, todo = set(), [value]
            while todo:
                v = todo.pop()
                if v in hit:
                    continue
                hit.add(v)
                todo.extend(o for n in self.consumers.get(v, ()) for o in n.output if o)
            self._downstream[value] = hit
        return hit


def _same_shape(x, y) -> bool:
    return x is not None and y is not None and np.shape(x) == np.shape(y)


def _same_size(x, y) -> bool:
    """Same number of elements: a value reshaped keeps its elements in order (a Gemm fed a flattened
    MatMul input)."""
    return x is not None and y is not None and np.size(x) == np.size(y)


def _is_float(x) -> bool:
    return x is not None and np.asarray(x).dtype.kind == "f"


def _by_structure(node, k: int, ga: _Graph, gb: _Graph, b_to_a, weights_a, values_a, values_b) -> str | None:
    """The value of a that output ``k`` of b's ``node`` is by structure, or None."""
    out = node.output[k]
    if node.op_type in CONVERTS and k == 0 and node.input:
        source = _unquantized(node.input[0], gb, b_to_a)
        if source in b_to_a and _same_shape(values_a.get(b_to_a[source][0]), values_b.get(out)):
            return b_to_a[source][0]  # the same value in another type (Cast, DequantizeLinear of a Quantize)
        return None
    inputs = [i for i in node.input if i and i not in gb.initializers and not gb.constant(i)]
    if not inputs or not all(i in b_to_a for i in inputs):
        return None
    twins = [b_to_a[i][0] for i in inputs]
    for candidate in ga.consumers.get(twins[0], ()):
        if candidate.op_type != node.op_type or len(candidate.output) != len(node.output):
            continue
        a_inputs = [i for i in candidate.input if i and i not in ga.initializers and not ga.constant(i)]
        if a_inputs == twins and _same_shape(values_a.get(candidate.output[k]), values_b.get(out)):
            return candidate.output[k]
    if node.op_type in RESHAPES and k == 0 and _same_size(values_a.get(twins[0]), values_b.get(out)):
        return twins[0]  # the same elements under another shape
    return None


def _far(e, g) -> bool:
    """Values of one shape further apart than ``VALUE_MATCH`` of the first's magnitude."""
    if not (_is_float(e) and _is_float(g)) or np.size(e) != np.size(g) or not np.size(e):
        return False
    e64 = np.asarray(e, dtype=np.float64).reshape(-1)
    scale = float(np.abs(e64).max())
    with np.errstate(invalid="ignore"):
        diff = float(np.nanmax(np.abs(np.asarray(g, dtype=np.float64).reshape(-1) - e64)))
    return np.isfinite(scale) and scale > 0 and diff > VALUE_MATCH * scale


def _unquantized(value: str, gb: _Graph, b_to_a: dict) -> str:
    """The float value a quantized (or cast) value of b stands for: through ``QuantizeLinear`` and
    ``Cast`` back to a paired value, else ``value``."""
    seen = set()
    while value not in b_to_a and value not in seen:
        seen.add(value)
        node = gb.producer.get(value)
        if node is None or node.op_type not in ("QuantizeLinear", "DynamicQuantizeLinear", "Cast") or not node.input:
            break
        value = node.input[0]
    return value


def _by_value(out: str, node, ga: _Graph, gb: _Graph, b_to_a, values_a, values_b, weights_a) -> str | None:
    """The value of a that ``out`` equals within ``VALUE_MATCH``, downstream of what the node's paired
    inputs are paired with; a weight of a where the node reads initializers only."""
    got = values_b.get(out)
    if not _is_float(got) or got.size == 0:
        return None
    sources = [_unquantized(i, gb, b_to_a) for i in node.input if i]  # (a Dequantize: the value quantized)
    ancestors = list(dict.fromkeys(b_to_a[i][0] for i in sources if i in b_to_a))
    if ancestors:
        below = [ga.downstream(v) for v in ancestors]
        candidates = [v for v in values_a.of_size(got.size)
                      if v not in ancestors and all(v in d for d in below)]
        pool = values_a
    elif all(i in gb.initializers or gb.constant(i) for i in node.input if i):
        candidates = [w for w, x in weights_a.items() if x.size == got.size and x.dtype.kind == "f"]
        pool = weights_a
    else:
        return None
    best, best_err = _closest(got, candidates, pool, ga, VALUE_MATCH)
    if best_err > EXACT_MATCH and pool is values_a:
        # not equal within rounding in the window (an upstream value paired by a near miss): anywhere in a,
        # when some value is far closer
        anywhere, err = _closest(got, values_a.of_size(got.size), pool, ga, best_err / 10)
        if anywhere is not None:
            best = anywhere
    return best


class _Values(dict):
    """a's values (name -> array), with the float ones indexed by their number of elements (the value pass
    looks candidates up by size)."""

    def of_size(self, size: int) -> list[str]:
        index = self.__dict__.get("_by_size")
        if index is None:
            index = self.__dict__["_by_size"] = defaultdict(list)
            for name, x in self.items():
                if _is_float(x):
                    index[np.size(x)].append(name)
        return index.get(size, [])


def _closest(got: np.ndarray, candidates, pool: dict, ga: _Graph, within: float) -> tuple[str | None, float]:
    """The candidate closest to ``got`` (relative to its magnitude) under ``within``, earliest first on ties."""
    best, best_err = None, within
    g = got.astype(np.float32, copy=False).reshape(-1)  # (float32 tells 5% apart, in half the time)
    for v in sorted(candidates, key=lambda v: ga.position.get(v, 0)):
        e = np.asarray(pool[v]).astype(np.float32, copy=False).reshape(-1)
        with np.errstate(invalid="ignore", over="ignore"):
            scale = float(np.abs(e).max()) if e.size else 0.0
            if not np.isfinite(scale) or scale == 0.0:
                continue
            diff = np.abs(g - e)
            err = float(diff.max()) / scale
        if err != err:  # NaN somewhere: the finite positions decide
            err = float(np.nanmax(diff)) / scale if not np.isnan(diff).all() else np.inf
        if err < best_err:
            best, best_err = v, err
    return best, best_err


def _a_only(ga: _Graph, gb: _Graph, a_to_b: dict, b_to_a: dict) -> dict[str, str]:
    """Why each value of a has no twin in b: folded (computed from weights alone), fused into the node of
    b that computes its first paired descendant, or gone."""
    why = {}
    for v in ga.order:
        if v in a_to_b:
            continue
        if ga.constant(v):
            why[v] = "folded into a constant of b"
            continue
        after = next((d for d in sorted(ga.downstream(v), key=lambda d: ga.position.get(d, 0)) if d in a_to_b), None)
        if after is None:
            why[v] = "not computed by b"
            continue
        node = gb.producer.get(a_to_b[after][-1])
        why[v] = f"fused into {node.op_type} node {node.name!r} of b" if node is not None else "fused in b"
    return why


def _b_only(gb: _Graph, b_to_a: dict, values_b: dict) -> dict[str, str]:
    why = {}
    for v in gb.order:
        if v in b_to_a:
            continue
        node = gb.producer[v]
        x = values_b.get(v)
        if _blocked(node):
            why[v] = "in onnxruntime's blocked NCHWc layout: not comparable element by element"
        elif node.op_type in ("QuantizeLinear", "DynamicQuantizeLinear") or (x is not None and x.dtype.kind in "iu"
                                                                           and node.op_type != "Shape"):
            source = node.input[0] if node.input else ""
            why[v] = f"the quantized form of {source!r}" if source else "a quantized value"
        elif gb.constant(v):
            why[v] = "a constant of b"
        elif x is None:
            why[v] = "not returned by the runtime"
        else:
            why[v] = f"new in b ({node.op_type}): no value of a equals it"
    return why
