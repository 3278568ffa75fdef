"""The inner plan of a pair: which ONNX values inside a translation are compared with which node of a
finer torch reference, and the references ready to run (built by ``inner_pairs.build_inner_plan``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class InnerPair:
    fx: str       # the FX node whose translation computes the value
    finer: str    # the node of its finer reference the value is compared with
    op: str       # that node's op, e.g. aten._softmax.default
    exact_shape: bool = False  # a transpose: compared only in the same shape (a reshape would reorder)
    constant: bool = False     # a constant the translation reads (a scale, a fill value, an epsilon)
    literal: float | None = None  # the scalar the reference writes there, when it is no node of its own
    program: str = ""          # the reference program it comes from (``InnerPlan.finer``), if not ``fx``'s

    @property
    def key(self) -> str:
        return self.program or self.fx


@dataclass
class Finer:
    """A finer reference ready to run: ``module(*args)`` returns the paired values, in ``names`` order."""

    module: torch.fx.GraphModule
    names: list[str]
    args: list[str]         # FX argument per placeholder
    label: str              # what the reference is ("torch's math definition of attention")
    retrace: object         # argument values -> the reference traced on them (gm, or None)
    shapes: tuple           # the argument shapes it was traced at
    _other: dict = field(default_factory=dict, repr=False)  # argument shapes -> module traced at them

    def module_for(self, args: list) -> torch.fx.GraphModule | None:
        """The module for ``args``: traced again at other shapes (a program with dynamic shapes), None
        when the reference takes another form there (its nodes are not the ones paired)."""
        shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
        if shapes == self.shapes:
            return self.module
        if shapes not in self._other:
            try:
                gm = self.retrace(args)
                names = {n.name for n in gm.graph.nodes} if gm is not None else set()
                self._other[shapes] = returning(gm, self.names) if set(self.names) <= names else None
            except Exception:
                self._other[shapes] = None
        return self._other[shapes]


@dataclass
class InnerPlan:
    pairs: dict[str, InnerPair] = field(default_factory=dict)  # ONNX value -> its pair
    finer: dict[str, Finer] = field(default_factory=dict)      # FX node -> its finer reference
    why: dict[str, str] = field(default_factory=dict)          # ONNX value inside a translation, unpaired -> why
    of: dict[str, str] = field(default_factory=dict)           # ONNX value inside a translation -> FX node

    by_fx: dict[str, list[str]] = field(default_factory=dict)  # FX node -> its paired ONNX values
    constants_of: dict[int, list[str]] = field(default_factory=dict)  # ONNX node -> constants recorded with it
    group_value: dict[str, str] = field(default_factory=dict)  # FX node -> the value its ONNX group ends at

    def values_of(self, fx: str) -> list[str]:
        return self.by_fx.get(fx, [])

    def recorded_at(self, producer: dict[str, int]) -> dict[str, int]:
        """ONNX value -> the node its inner record comes with: its producer, or for a constant the
        node reading it."""
        at = {x: producer[x] for x in self.pairs if x in producer}
        at.update({x: i for i, xs in self.constants_of.items() for x in xs})
        return at


def returning(gm: torch.fx.GraphModule, names: list[str]) -> torch.fx.GraphModule:
    """A copy of ``gm`` returning the values of nodes ``names`` (generated code: no interpreter)."""
    import copy

    graph = copy.deepcopy(gm.graph)
    by_name = {n.name: n for n in graph.nodes}
    out = next(n for n in graph.nodes if n.op == "output")
    graph.erase_node(out)
    graph.output(tuple(by_name[n] for n in names))
    graph.eliminate_dead_code()
    return torch.fx.GraphModule(gm, graph)
