"""A reference closer to exact: an FX node (or a whole program) rerun in float64 on its torch inputs
upcast. Against it, torch's own rounding and onnxruntime's can be measured on the same inputs, which
tells a difference that is rounding from one that is a bug (``engine/noise.py``).

Every floating tensor argument becomes float64 (complex: complex128) and every floating dtype argument
(``_to_copy(dtype=float16)``, ``full(..., dtype=float32)``) float64 too, so that the node computes the
same math without rounding to the program's precision on the way. Float64 kernels exist on the CPU
for nearly every aten op; where one does not (or the op draws random numbers), ``NoReference`` says so
and the tolerance rule stands.
"""

from __future__ import annotations

import contextlib
import operator

import torch
from torch.fx.node import map_aggregate

from sbs_widget.align.fx_graph import numel_hint
from sbs_widget.engine.fx_runner import weight_reads
from sbs_widget.load.mapped_weights import PagesRead

REFERENCE_DTYPE = torch.float64
_COMPLEX = {torch.complex32: torch.complex128, torch.complex64: torch.complex128}
# Ops whose result is random or depends on memory, not on the math of the inputs.
_NOT_MATH = ("rand", "bernoulli", "dropout", "normal", "multinomial", "empty", "uniform", "exponential",
             "randperm", "poisson", "native_dropout")


class NoReference(Exception):
    """The node has no float64 counterpart (no kernel, random, not a tensor): the message says why."""


def upcast(value):
    """``value`` with floating tensors and dtypes raised to float64 (nested containers too)."""
    def one(x):
        if isinstance(x, torch.Tensor):
            if x.dtype.is_floating_point and x.dtype != REFERENCE_DTYPE:
                return x.to(REFERENCE_DTYPE)
            if x.dtype in _COMPLEX:
                return x.to(_COMPLEX[x.dtype])
            return x
        if isinstance(x, torch.dtype):
            if x.is_floating_point:
                return REFERENCE_DTYPE
            return _COMPLEX.get(x, x)
        return x

    return map_aggregate(value, one)


def has_reference(node: torch.fx.Node) -> bool:
    """Whether ``node`` can be rerun in float64 at all (a call, not random, not control flow: a loop's
    subgraphs run outside the run's Cancel token here, and a crafted bound never ends)."""
    if node.op != "call_function" or isinstance(node.target, torch._ops.HigherOrderOperator):
        return False
    name = getattr(node.target, "__name__", str(node.target))
    return not any(word in name for word in _NOT_MATH)


# A stop set no node is named: the reference recomputes everything down to the program's inputs and
# weights (a constant-folded value, computed by the exporter from the weights alone).
FROM_PLACEHOLDERS = frozenset({"\0placeholders"})
MAX_REFERENCE_NODES = 256  # FX nodes recomputed for one reference: a translation is rarely longer


def leaves(node: torch.fx.Node, stop: frozenset[str]) -> tuple[list[torch.fx.Node], list[torch.fx.Node]]:
    """The FX nodes a reference of ``node`` recomputes (topological) and those it reads as they are:
    the names in ``stop`` (the values the ONNX side reads from torch), placeholders and anything that
    is not a call. Without ``stop``, ``node`` alone is recomputed (an item of a tuple: its producer too).
    """
    inner: dict[str, torch.fx.Node] = {}
    read: dict[str, torch.fx.Node] = {}
    order: list[torch.fx.Node] = []
    stack = [(node, False)]
    while stack:
        n, expanded = stack.pop()
        if expanded:
            order.append(n)
            continue
        if n.name in inner:
            continue
        inner[n.name] = n
        stack.append((n, True))
        for m in n.all_input_nodes:
            if m.name in inner or m.name in read:
                continue
            # without stop names: the node and, for getitem, its producer; else up to the stop names
            open_up = (m.op == "call_function" and m.name not in stop and
                       (stop or (n.target is operator.getitem and n is node)))
            if open_up:
                stack.append((m, False))
            else:
                read[m.name] = m
        if len(inner) > MAX_REFERENCE_NODES:
            raise NoReference(f"the computation from the ONNX side's torch inputs spans more than "
                              f"{MAX_REFERENCE_NODES} FX nodes")
    return order, list(read.values())


def reference_of(node: torch.fx.Node, env: dict, stop: frozenset[str] = frozenset()) -> torch.Tensor:
    """``node``'s value computed in float64 from torch values: those of ``stop`` (the values the ONNX
    side read, when it recomputed ``node`` from them) or, without ``stop``, of ``node``'s own inputs.
    Every FX node between them is recomputed in float64, so that torch's and onnxruntime's rounding
    over the same stretch of computation are measured against the same exact value."""
    order, read = leaves(node, stop)
    values: dict[str, object] = {}
    for n in read:
        if n.name not in env:
            raise NoReference(f"the torch value of {n.name!r} was released")
        values[n.name] = upcast(env[n.name])
    with one_thread(_numel(env.get(node.name))):
        for n in order:
            values[n.name] = _call(n, values)
    value = values[node.name]
    if not isinstance(value, torch.Tensor):
        raise NoReference(f"{node.target} returns {type(value).__name__}, not a tensor")
    return value


SMALL = 1 << 16  # elements: below this, torch's thread pool costs more than it saves


def _numel(value) -> int:
    """Elements of ``value``: a dynamic program's recorded ``meta['val']`` counted at its example sizes
    (comparing a symbolic count would guard on it, and fail)."""
    return numel_hint(value) if isinstance(value, torch.Tensor) else SMALL


@contextlib.contextmanager
def one_thread(numel: int):
    """torch on one thread for small values: its pool's threads spin after each op and take the core
    onnxruntime's segment runs on meanwhile (the lockstep runs both at once)."""
    threads = torch.get_num_threads()
    if numel >= SMALL or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _call(node: torch.fx.Node, values: dict):
    if not has_reference(node):
        raise NoReference(f"{node.target} has no deterministic float64 counterpart")
    args = torch.fx.node.map_arg(node.args, lambda n: values[n.name])
    kwargs = upcast(torch.fx.node.map_arg(node.kwargs, lambda n: values[n.name]))
    args = upcast(args)
    try:
        with torch.inference_mode():
            return node.target(*args, **kwargs)
    except Exception as e:  # no float64 kernel (or the op refuses float64): said on the record
        raise NoReference(f"no float64 kernel for {node.target}: {type(e).__name__}: {str(e)[:200]}") from None


class ProgramShadow:
    """The whole program run in float64 from its inputs and weights (``flat``, in placeholder order)
    upcast, node by node, as far as asked: the exact value of any FX node for the run, against which
    torch's value and onnxruntime's can each be measured (with all each inherits). It advances with
    the lockstep, so that the run's values and these are at hand together; a value is freed after
    its last reader (``last_use``: FX name -> position of that reader) unless asked to be kept.
    ``failed`` says why, once a node has no float64 counterpart (then nothing more is computed)."""

    def __init__(self, program: torch.export.ExportedProgram, flat: list, last_use: dict[str, int],
                 weight_files=()):
        self._nodes = list(program.graph.nodes)
        # a big .pt2's weights: their pages handed back as it goes (load/mapped_weights.py)
        self._reads = weight_reads(program) if weight_files else {}
        self._pages = PagesRead(weight_files)
        self._flat = iter(flat)
        self._last_use = last_use
        self._values: dict[str, object] = {}
        self._kept: set[str] = set()
        self.position = 0  # the next node to compute
        self.failed: str | None = None

    def advance(self, upto: int, keep=()) -> None:
        """Compute the nodes up to position ``upto`` (included); the values of ``keep`` stay until
        ``settle``."""
        self._kept.update(keep)
        if self.failed is not None or upto < self.position:
            return
        threads = torch.get_num_threads()
        single = False
        try:
            for position in range(self.position, min(upto + 1, len(self._nodes))):
                n = self._nodes[position]
                if n.op == "placeholder":  # upcast where read (_call): never every weight in float64 at once
                    self._values[n.name] = next(self._flat)
                elif n.op == "call_function":
                    small = _numel(n.meta.get("val")) < SMALL  # torch's pool only for big values
                    if threads > 1 and small != single:
                        single = small
                        torch.set_num_threads(1 if single else threads)
                    self._values[n.name] = _call(n, self._values)
                    if position in self._reads:
                        self._pages.add(self._reads[position])
                elif n.op == "get_attr":
                    raise NoReference("the program reads attributes (get_attr): no whole-program reference")
                self.position = position + 1
                if n.op != "output":  # (the outputs stay)
                    self._free(n, position)
        except NoReference as e:
            self.failed = str(e)
            self._values.clear()
        finally:
            if single:
                torch.set_num_threads(threads)

    def _free(self, node: torch.fx.Node, position: int) -> None:
        for m in node.all_input_nodes:
            if self._last_use.get(m.name, -1) <= position and m.name not in self._kept:
                self._values.pop(m.name, None)

    def get(self, name: str) -> torch.Tensor | None:
        value = self._values.get(name)
        return upcast(value) if isinstance(value, torch.Tensor) else None

    def settle(self) -> None:
        """Free the kept values whose last reader has been computed."""
        done = self.position - 1
        for name in self._kept:
            last = self._last_use.get(name)  # (None: read by no node, judged now, needed no more)
            if last is None or (last <= done and self._nodes[last].op != "output"):
                self._values.pop(name, None)
        self._kept.clear()


def program_reference(program: torch.export.ExportedProgram, flat: list, last_use: dict[str, int],
                      wanted: list[str], weight_files=()) -> dict[str, torch.Tensor]:
    """The values of FX nodes ``wanted`` (the program's outputs) with the whole program run in float64
    (``ProgramShadow`` run to the end)."""
    shadow = ProgramShadow(program, flat, last_use, weight_files)
    shadow.advance(len(shadow._nodes), keep=wanted)
    if shadow.failed is not None:
        raise NoReference(shadow.failed)
    return {name: shadow.get(name) for name in wanted if shadow.get(name) is not None}
