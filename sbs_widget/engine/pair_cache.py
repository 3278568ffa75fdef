"""What runs over one pair cache for speed: compiled sessions, segment plans, record fields, mapped
weights, the cuts a rerun restarts from. One object, owned by the prepared pair.

Its ``key`` declares what the cached pieces depend on beyond the pair's content: the pair's options
(``PairOptions``: inner values on or off). ``engine/entry.prepare`` keys its cache of prepared pairs
by content and by this key, so that flipping an option gives a pair prepared again, never an old plan.
Everything cached is a pure function of the pair and that key, except sessions (also per runtime
instance) and the cuts of the last run (valid for the same inputs and options, ``restart.py``).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Callable, Iterable

import onnx
import torch

from sbs_widget.align.groups import LocalGroup
from sbs_widget.align.pair import PairOptions
from sbs_widget.engine.background import background
from sbs_widget.engine.run_plan import ReleasePlan
from sbs_widget.engine.runtimes import Runtime
from sbs_widget.engine.segments import Segment


class PairCache:
    """Caches of one prepared pair (see the module's docstring)."""

    def __init__(self, options: PairOptions, weight_files: list):
        self.key = options  # every option that changes what is cached (and so the records)
        self.weight_files = weight_files  # the .pt2's weight pages, mapped (load/mapped_weights.py)
        self.compiled: dict[tuple, tuple] = {}  # (runtime name, id, piece key) -> (runtime, session)
        self.segments: dict[tuple, Segment] = {}
        self.plans: dict[tuple, list[tuple[int, int]]] = {}  # (cuts, most nodes) -> segment ranges
        self.release_plans: dict[tuple, ReleasePlan] = {}  # (segment ranges, node_local, reference) -> plan
        self.groups: dict[str, LocalGroup | None] = {}
        self.fx_plans: dict[torch.device, dict[int, tuple]] = {}  # FxRunner's call plans, per device
        self.weights = None  # engine/weights.Weights: the ONNX initializers as arrays, built on first need
        self.record_fields: dict[tuple, tuple] = {}
        self.segment_records: dict[tuple[int, int], list[tuple]] = {}
        self.weight_records: list[tuple] | None = None
        self.record_positions: dict[str, int] | None = None  # ONNX value -> the node its record comes with
        self.onnx_only_reasons: dict[int, str] | None = None
        self.unrecorded: list | None = None
        self.cut_boundaries: dict[tuple, list] = {}  # restart.py's candidate cuts per segment
        self.placeholder_names: frozenset[str] | None = None
        self.run_cuts = None  # restart.RunCuts of the last run: what a rerun restarts from

    # -- compiled pieces -------------------------------------------------------------------------
    def session(self, runtime: Runtime, key: tuple, build: Callable[[], onnx.ModelProto]):
        """A compiled piece of the model, cached per runtime instance (held here, so that its id
        cannot be reused by another object while the entry lives)."""
        full = (runtime.name, id(runtime)) + key
        hit = self.compiled.get(full)
        if hit is None:
            hit = (runtime, runtime.compile(build()))
            self.compiled[full] = hit
        if isinstance(hit[1], Future):
            try:
                return hit[1].result()
            except BaseException:
                self.compiled.pop(full, None)  # compiled again (and failing again) in the caller's thread
                raise
        return hit[1]

    def forget(self, runtime: Runtime, keys: Iterable[tuple]) -> None:
        """Drop compiled pieces (their memory goes with them)."""
        for key in keys:
            self.compiled.pop((runtime.name, id(runtime)) + key, None)

    def compile_ahead(self, runtime: Runtime, pieces: list[tuple[tuple, Callable[[], onnx.ModelProto]]]) -> None:
        """Compile pieces not compiled yet in a background thread, in order: onnxruntime builds a
        session without holding the GIL, so the coming segments compile while the FX side runs.
        The pieces are built here, first: building them holds the GIL (protobuf), and a thread
        holding it makes the other wait for whole switch intervals (5 ms) at each hand-over."""
        todo = []
        for key, build in pieces:
            full = (runtime.name, id(runtime)) + key
            if full not in self.compiled:
                todo.append((full, build()))
        for full, model in todo:
            self.compiled[full] = (runtime, background("sbs-compile").submit(runtime.compile, model))

