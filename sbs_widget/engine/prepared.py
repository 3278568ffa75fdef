"""A pair made ready for runs: the immutable ``Pair`` (``align/pair.py``), its ``Schedule`` (when values
are computed, compared and freed) and its ``PairCache`` (sessions, plans, record fields, weights).

``PreparedPair`` holds the three and answers what runs ask of the pair: segments and their plans,
record fields, groups, weights, names given by users. ``engine/entry.Prepared`` adds ``run``.
"""

from __future__ import annotations

import functools
from typing import Callable, Iterable

import onnx
import torch

from sbs_widget.align.fx_graph import program_outputs
from sbs_widget.align.groups import LocalGroup
from sbs_widget.align.pair import Pair
from sbs_widget.align.user_program import unrecorded_nodes
from sbs_widget.engine import record_plan
from sbs_widget.engine.names import resolve_names
from sbs_widget.engine.pair_cache import PairCache
from sbs_widget.engine.run_plan import FX_ONE_SIDED, ReleasePlan, release_plan
from sbs_widget.engine.runtimes import Runtime
from sbs_widget.engine.schedule import Schedule, build_schedule
from sbs_widget.engine.segments import Segment, describe_segment, plan_segments, weights_budget
from sbs_widget.engine.tolerance import Tolerance, least_precise
from sbs_widget.engine.weights import Weights
from sbs_widget.errors import ModelMismatchError
from sbs_widget.load.mapped_weights import weight_files

SEGMENT_NODES = 400  # most ONNX nodes per segment
MIN_SEGMENT_BYTES = 1 << 20  # below this, more sessions cost more time than the memory they save


class PreparedPair:
    """A pair, its schedule and its caches (see the module's docstring)."""

    def __init__(self, pair: Pair):
        self.pair = pair
        self.schedule: Schedule = build_schedule(pair)
        program = pair.decomposed_ep
        self.cache = PairCache(pair.options, weight_files([*program.state_dict.values(), *program.constants.values()]))
        _check_outputs(pair)

    # -- the pair's parts, as read by the rest of the package ------------------------------------
    decomposed_ep = property(lambda self: self.pair.decomposed_ep)
    user_ep = property(lambda self: self.pair.user_ep)
    onnx_model = property(lambda self: self.pair.onnx_model)
    index = property(lambda self: self.pair.index)
    alignment = property(lambda self: self.pair.alignment)
    inner = property(lambda self: self.pair.inner)
    fx_nodes = property(lambda self: self.pair.fx_nodes)
    fx_position = property(lambda self: self.pair.fx_position)
    folded_into = property(lambda self: self.pair.folded_into)
    fx_dead = property(lambda self: self.pair.fx_dead)
    notes = property(lambda self: self.pair.notes)
    program_mismatch = property(lambda self: self.pair.program_mismatch)
    weight_files = property(lambda self: self.cache.weight_files)
    fx_last_use = property(lambda self: self.schedule.fx_last_use)
    n_fx_nodes = property(lambda self: self.schedule.n_fx_nodes)
    n_onnx_nodes = property(lambda self: len(self.pair.index.nodes))

    # -- tolerance -------------------------------------------------------------------------------
    @property
    def precision(self) -> torch.dtype | None:
        """The least precise floating type the program computes in (it sets the default tolerance)."""
        return least_precise(self.pair.alignment.fx_dtypes)

    def tolerance(self, atol: float | None = None, rtol: float | None = None) -> Tolerance:
        """The run's ``Tolerance``: each of atol/rtol given as is, each ``None`` the default for the
        program's precision (``tolerance.py``: 1e-4 for float32, 1e-3 for float16)."""
        return Tolerance.resolve(atol, rtol, self.precision)

    def resolve_names(self, names: Iterable[str]) -> dict[str, str]:
        """Names given by a user (FX node names, ONNX values, ``fx::finer``) -> ONNX values (``names.py``)."""
        return resolve_names(self.pair, names)

    # -- segments --------------------------------------------------------------------------------
    def plan(self, cuts: set[int], segment_nodes: int = SEGMENT_NODES) -> list[tuple[int, int]]:
        """Segments for a run: values handed back by one segment stay near the eager live set."""
        # Alive at once: about the eager live set, or half the weights' size when that is larger
        # (fewer sessions to build; weights are shared with torch, not copied, so this stays within
        # the memory of one model).
        key = (frozenset(cuts), segment_nodes)
        plans = self.cache.plans
        if key not in plans:
            s = self.schedule
            budget = max(s.live_bytes, s.weight_bytes // 2, 4 * max(s.node_bytes, default=0), MIN_SEGMENT_BYTES)
            plans[key] = plan_segments(len(self.pair.index.nodes), cuts, s.node_bytes, budget, segment_nodes,
                                       weights_budget(self.pair.index, bool(self.cache.weight_files)))
        return list(plans[key])

    def segment(self, start: int, end: int, hidden: frozenset = frozenset(), weights_in: bool = False) -> Segment:
        """``hidden``: values not to hand back, ``weights_in``: every weight copied in (a deployed runtime:
        asking for a value keeps it from a fusion, a weight fed as input is no constant to fold)."""
        key = (start, end, hidden, weights_in) if hidden or weights_in else (start, end)
        segments = self.cache.segments
        if key not in segments:
            segments[key] = describe_segment(self.pair.index, start, end, self.schedule.wanted - hidden,
                                             self.schedule.last_reader, weights_in)
        return segments[key]

    def release_plan(self, ranges: list[tuple[int, int]], node_local: bool, reference: bool = False) -> ReleasePlan:
        """When a run cut into ``ranges`` may release torch values (worked out once per cut)."""
        key = (tuple(ranges), node_local, reference)
        plan = self.cache.release_plans.get(key)
        if plan is None:
            plan = self.cache.release_plans[key] = release_plan(self.pair, self.schedule.small_fx_nodes, ranges,
                                                                node_local, reference)
        return plan

    # -- groups and weights ----------------------------------------------------------------------
    def group(self, value: str) -> LocalGroup | None:
        return self.pair.group(value)

    def reference_stop(self, value: str) -> frozenset[str]:
        """The FX values a float64 reference of ``value``'s twin starts from: those the ONNX group
        recomputing ``value`` reads from torch (its anchors), so both cover the same computation."""
        g = self.pair.group(value)
        return frozenset(self.pair.alignment.onnx_to_fx[a] for a in g.anchors) if g is not None else frozenset()

    def weights(self) -> Weights:
        """The ONNX file's initializers as numpy arrays, shared by every segment."""
        if self.cache.weights is None:
            self.cache.weights = Weights(self.pair, self.schedule.weight_bytes, self.cache.weight_files)
        return self.cache.weights

    @functools.cached_property
    def unrecorded(self) -> list:
        """The value-producing nodes of the user's program no record of a run names, each with why
        (``align/user_program.py``): a run ends with a one-sided record for each."""
        pair, s = self.pair, self.schedule
        recorded = {n.name for n in pair.fx_nodes if n.op == "placeholder"} | set(pair.alignment.pairs) | \
            set(pair.alignment.alias_of)
        recorded |= {name for name, what in zip(s.fx_names, s.fx_after) if what == FX_ONE_SIDED}
        recorded |= {info.origin for info in pair.alignment.fx_nodes if info.origin is not None and
                     (info.name in recorded)}
        return unrecorded_nodes(pair, recorded)

    # -- compiled pieces (``PairCache``) ---------------------------------------------------------
    def compiled(self, runtime: Runtime, key: tuple, build: Callable[[], onnx.ModelProto]):
        return self.cache.session(runtime, key, build)

    def forget(self, runtime: Runtime, keys: Iterable[tuple]) -> None:
        self.cache.forget(runtime, keys)

    # -- record fields (``record_plan.py``) ------------------------------------------------------
    def record_fields(self, fx_name: str | None, onnx_name: str | None, kind: str, how: str,
                      comment: str | None = None) -> tuple:
        return record_plan.record_fields(self.pair, self.cache, fx_name, onnx_name, kind, how, comment)

    def segment_records(self, start: int, end: int) -> list[tuple]:
        return record_plan.segment_records(self.pair, self.cache, start, end)

    def weight_records(self) -> list[tuple[tuple, str, str | None, bool]]:
        return record_plan.weight_records(self.pair, self.cache)


def _check_outputs(pair: Pair) -> None:
    fx_out = program_outputs(pair.decomposed_ep)
    if len(fx_out) != len(pair.index.outputs):
        raise ModelMismatchError(
            f"the ExportedProgram has {len(fx_out)} outputs and the ONNX model {len(pair.index.outputs)} "
            f"({pair.index.outputs[:5]}): they do not come from the same model; export the ONNX "
            "model from this program (torch.onnx.export(ep, ..., dynamo=True))"
        )

