"""The pair: what ``prepare`` computes from the two programs, once, as one immutable value.

Built in pipeline order by ``pipeline.build_pair``: the programs and the ONNX index (``load``), the FX nodes,
the alignment (``pairs.py``), the values the exporter constant-folded, then the inner plan
(``inner_pairs.py``), which reads all of the above. Nothing here runs a model or holds a session:
what a run caches for speed lives in the engine's ``PairCache``, keyed by ``PairOptions`` too.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping

import onnx
import torch

from sbs_widget.align.groups import LocalGroup, build_group
from sbs_widget.align.inner_plan import InnerPlan
from sbs_widget.align.pairs import Alignment
from sbs_widget.load.onnx_index import OnnxIndex

INNER_ENV = "SBS_WIDGET_INNER"  # "0": no inner values (their records stay one-sided)


@dataclasses.dataclass(frozen=True)
class PairOptions:
    """The options that change what a pair is (and so its records): part of every cache key."""

    inner_values: bool = True

    @classmethod
    def from_environment(cls) -> PairOptions:
        return cls(inner_values=os.environ.get(INNER_ENV, "1") != "0")


@dataclasses.dataclass(frozen=True, eq=False)
class Pair:
    """A torch.export program and its ONNX model, aligned. Immutable: a run reads it, never writes it
    (``groups`` is a memo of the pure function ``build_group``, filled on demand)."""

    decomposed_ep: torch.export.ExportedProgram  # the program the exporter translated
    user_ep: torch.export.ExportedProgram | None  # the user's program, when it was decomposed here
    onnx_model: onnx.ModelProto
    index: OnnxIndex
    fx_nodes: tuple[torch.fx.Node, ...]
    fx_position: Mapping[str, int]
    alignment: Alignment
    folded_into: Mapping[str, str]  # FX value -> the initializer the exporter folded it into
    fx_dead: frozenset[str]  # FX nodes no output depends on (no ONNX node translates them)
    inner: InnerPlan  # values inside translations paired with a finer torch reference
    options: PairOptions = PairOptions()
    notes: tuple[str, ...] = ()  # what limits this comparison, said once (e.g. no exporter metadata)
    program_mismatch: str | None = None  # the ONNX metadata names another program's node: the message
    groups: dict[str, LocalGroup | None] = dataclasses.field(default_factory=dict, repr=False)

    def group(self, value: str) -> LocalGroup | None:
        """The ONNX nodes recomputing ``value`` from torch values (``groups.py``)."""
        if value not in self.groups:
            self.groups[value] = build_group(self.index, value, set(self.alignment.onnx_to_fx))
        return self.groups[value]

    def why_no_twin(self, fx_name: str) -> str:
        """Why FX node ``fx_name`` has no ONNX value to compare (its one-sided record says so)."""
        p = self
        al = p.alignment
        same = al.duplicate_of.get(fx_name)
        if fx_name in p.folded_into:
            return f"no ONNX value: constant-folded into initializer {p.folded_into[fx_name]!r}"
        if same in p.folded_into:
            return (f"no ONNX value: same op on the same inputs as FX node {same!r}, constant-folded into "
                    f"initializer {p.folded_into[same]!r}")
        if fx_name in al.of_input:
            return (f"no ONNX value: a no-op on input {al.of_input[fx_name]!r} the ONNX optimizer "
                    "removed (its ONNX consumers read the input itself)")
        if fx_name in al.folded_for:
            return (f"no ONNX value: constant-folded into the initializer of FX node "
                    f"{al.folded_for[fx_name]!r} (its value only goes there)")
        if fx_name in al.absorbed:
            return (f"no ONNX value: the fused {al.absorbed[fx_name]} node took in the end of "
                    "its computation (its ONNX nodes hand out only a partial value)")
        if fx_name in al.fx_group:
            ops = sorted({p.index.nodes[i].op_type for i in al.fx_group[fx_name]})
            return f"translated into ONNX {', '.join(ops)} but no value of the same shape and dtype"
        if fx_name in al.fused_into:
            return f"no ONNX value: the ONNX optimizer fused it into {al.fused_into[fx_name]}"
        if fx_name in al.empty:
            return "no ONNX value: empty (0 elements), dropped by the ONNX optimizer"
        if fx_name in p.fx_dead:
            return "no ONNX value: no output depends on it (the exporter writes no node for it)"
        return "no ONNX value: removed or fused by the ONNX optimizer"

    @property
    def half(self) -> bool:
        """Whether the program computes in a 2-byte floating type (float16, bfloat16)."""
        return any(getattr(d, "itemsize", 0) == 2 and d.is_floating_point for d in self.alignment.fx_dtypes)
