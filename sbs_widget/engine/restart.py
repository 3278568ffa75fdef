"""Reruns that pay only for what is downstream of the reset.

A rerun with another reset set computes exactly what the run before it computed, up to the first
node that reads a value whose reset changed. So a run keeps, at some node boundaries (every
len(nodes) / 32 nodes, where each value crossing the boundary was handed back by its segment), what the
rest of the run needs from the past: the torch values still alive, the ONNX values later segments
read, the judging state (which FX nodes are sources of differences), the counters, and how many
records it had yielded. A rerun on the same inputs and options starts at the last kept cut at or
before the producer of the first changed reset value: the records before it are the previous run's
(copied, marked as reused), the rest is computed.

Values are shared with the run, not copied (torch and onnxruntime values are never written in place
once computed): a cut costs only what the run would have freed meanwhile. The cuts of one run hold at
most ``budget`` bytes together (by default twice the eager live set, and 32 MiB at least; inputs and
weights not counted); past it, the cut closest to its neighbours is dropped, so that those left stay
spread over the depth.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from sbs_widget.engine.prepared import PreparedPair
from sbs_widget.engine.record_plan import record_positions
from sbs_widget.engine.run_parts import RunParts
from sbs_widget.records import Record

MIN_BUDGET = 32 << 20
CUTS_PER_RUN = 32  # node boundaries considered for a cut: one every len(nodes) / this
REUSED = "reused from the run before (upstream of the first changed reset)"


@dataclasses.dataclass
class Cut:
    start: int  # the ONNX node the next segment starts at
    fx_position: int
    fx_env: dict
    fx_times: dict
    fx_errors: dict
    onnx_env: dict
    onnx_shapes: dict
    onnx_errors: dict
    sources: set
    done: int
    n_records: int


class RunCuts:
    """What one run kept for the next: its cuts and its records (the prefix a restart reuses)."""

    def __init__(self, key: tuple, reset: frozenset, budget: int, flat):
        self.key, self.reset, self.budget = key, reset, budget
        self.flat = flat  # held: the key names the inputs by id
        self.cuts: list[Cut] = []
        self.records: list[Record] = []  # every record the run yielded, in order
        self.prefix: list[Record] = []  # a restarted run's first records: the run before's, reused
        # bytes the cuts hold together, each value once (values alive in the run count: they stay
        # alive past their last use); inputs and weights not counted (their owner holds them)
        self.nbytes = 0
        self._held: dict[int, list] = {}  # id(value) -> [bytes, cuts holding it]
        self._flat_ids = {id(t) for t in flat}
        self._counted = 0  # cuts counted in nbytes

    def take(self, parts: RunParts, release_at: list[str], a: int, b: int, n_before: int, sources_before: set,
             every: int) -> None:
        """Keep cuts inside the segment of nodes ``[a, b)`` of a run, just run and measured (its values
        all at hand; ``release_at``: the FX values it releases): at node boundaries ``every`` nodes
        apart where every value crossing the boundary is at hand (handed back by a segment), each
        with only what the rest needs."""
        p, state = parts.p, parts.state
        plan = _boundaries(p, a, b, every)
        if not plan:
            return
        producer = p.index.producer
        at = record_positions(p.pair, p.cache)
        made = [at.get(r.onnx_name, -1) for r in self.records[n_before:]]
        release = set(release_at)
        env_now, onnx_now = state.fx.env, state.onnx.env
        fed = p.cache.placeholder_names
        if fed is None:  # inputs and weights: the restarted run is fed them again
            fed = p.cache.placeholder_names = frozenset(n.name for n in p.fx_nodes if n.op == "placeholder")
        later_fx = {n for n in env_now if n not in release and n not in fed}
        times, fx_errors, onnx_errors = dict(state.fx.times), dict(state.fx.errors), dict(state.onnx.errors)
        sources = state.judged.sources
        new_sources = {f: producer.get(p.alignment.twin(f) or "", b) for f in sources - sources_before}
        for c, crossing, twins_after in plan:
            if not all(v in onnx_now for v in crossing):
                continue  # a value only the segment saw: no state to restart from here
            env = {n: v for n, v in env_now.items() if n in later_fx or (n in twins_after and n not in fed)}
            shapes = state.onnx.shapes
            self.cuts.append(Cut(c, parts.fx.position, env, times, fx_errors,
                                 {v: onnx_now[v] for v in crossing},
                                 {v: shapes[v] for v in crossing if v in shapes}, onnx_errors,
                                 sources_before | {f for f, i in new_sources.items() if i < c}, state.done,
                                 n_before + sum(1 for i in made if i < c)))
        self._fit()

    def _fit(self) -> None:
        """Within the budget: while over it, drop the cut whose neighbours are closest (the cuts
        left stay evenly spread over the depth; the last one stays)."""
        for c in self.cuts[self._counted:]:
            self._hold(c, +1)
        self._counted = len(self.cuts)
        while len(self.cuts) > 1 and self.nbytes > self.budget:
            if len(self.cuts) == 2:
                self._drop(0)
                continue
            starts = [0] + [c.start for c in self.cuts]
            gaps = [starts[i + 2] - starts[i] for i in range(len(self.cuts) - 1)]
            self._drop(gaps.index(min(gaps)))
        if self.nbytes > self.budget:
            while self.cuts:
                self._drop(0)

    def _drop(self, i: int) -> None:
        self._hold(self.cuts.pop(i), -1)
        self._counted -= 1

    def _hold(self, cut: Cut, step: int) -> None:
        """Count (or uncount) the values ``cut`` holds: each value once over all cuts, inputs and
        weights never (their owner holds them)."""
        for v in (*cut.fx_env.values(), *cut.onnx_env.values()):
            key = id(v)
            if key in self._flat_ids:
                continue
            held = self._held.get(key)
            if held is None:
                held = self._held[key] = [_bytes((v,)), 0]
            if held[1] == 0 and step > 0:
                self.nbytes += held[0]
            held[1] += step
            if held[1] == 0:
                self.nbytes -= held[0]
                del self._held[key]

    def restart_point(self, key: tuple, reset: frozenset, producer: dict[str, int]) -> Cut | None:
        """The last kept cut valid for a run with ``key`` and ``reset``: no node before it reads a
        value whose reset changed, and the changed values' own records come after it."""
        if key != self.key:
            return None
        changed = self.reset ^ reset
        first = min((producer[v] for v in changed if v in producer), default=None)
        valid = [c for c in self.cuts if first is None or c.start <= first]
        return valid[-1] if valid else None

    def reused(self, cut: Cut) -> list[Record]:
        """Copies of the records before ``cut``, marked as reused."""
        out = []
        for rec in self.records[:cut.n_records]:
            copy = dataclasses.replace(rec)
            copy.comment = f"{copy.comment}; {REUSED}" if copy.comment else REUSED
            out.append(copy)
        return out

    def inherit(self, before: RunCuts, cut: Cut) -> None:
        """A restarted run computed what ``before`` did up to ``cut``: its cuts up to there stay valid."""
        self.cuts = [c for c in before.cuts if c.start <= cut.start]
        self._fit()


def _boundaries(p: PreparedPair, a: int, b: int, every: int) -> list[tuple[int, list[str], set[str]]]:
    """The candidate cuts in segment ``[a, b)``, worked out once per prepared pair: ``(c, the ONNX
    values crossing c (produced before, read at or after, or inputs read after), the FX names whose
    values the rest of the segment compares or the crossing values stand for)``."""
    cache = p.cache.cut_boundaries
    key = (a, b, every)
    if key in cache:
        return cache[key]
    producer, last_reader = p.index.producer, p.schedule.last_reader
    to_fx, aliases, inputs = p.alignment.onnx_to_fx, p.alignment.aliases, set(p.index.inputs)
    # A half-precision program restarts at segment ends only: onnxruntime's CPU provider computes
    # float16 ops in float32 and keeps a value in float32 for a reader in the same segment, so a
    # boundary inside a segment changes its last bits (a rerun cut there would not be the full rerun).
    half = p.pair.half
    plan = []
    for c in [c for c in range(a + 1, b + 1) if (c % every == 0 and not half) or c == b]:
        crossing = [v for v, last in last_reader.items() if last >= c and (producer.get(v, c) < c or v in inputs)]
        twins: set[str] = set()
        for v in crossing + [o for o, i in producer.items() if c <= i < b]:
            twins.update(n for n in [to_fx.get(v), *aliases.get(v, ())] if n)
        # and the arguments the rest of the segment's inner values and float64 references read
        rest = {to_fx[o] for o, i in producer.items() if c <= i < b and o in to_fx}
        twins.update(a.name for f in rest for a in p.fx_nodes[p.fx_position[f]].all_input_nodes)
        twins.update(a for o, i in record_positions(p.pair, p.cache).items() if c <= i < b and o in p.inner.pairs
                     for a in p.inner.finer[p.inner.pairs[o].key].args)
        plan.append((c, crossing, twins))
    cache[key] = plan
    return plan


def open_cuts(p: PreparedPair, flat: list, runtime, device, options: tuple, reset: frozenset,
              budget: int | None) -> tuple[RunCuts | None, Cut | None]:
    """(the cuts this run keeps, or None; the cut it restarts from, or None). ``options``: what
    else must be equal (tolerances, node_local, histogram, reference, segment_nodes); ``budget``:
    bytes the cuts may hold (None: ``default_budget``, 0: keep none)."""
    if budget == 0:
        return None, None
    # (an inference tensor has no version counter: it cannot be written outside inference mode)
    inputs = tuple((id(t), 0 if t.is_inference() else t._version) if isinstance(t, torch.Tensor) else (id(t),)
                   for t in flat)
    key = (inputs, str(device), id(runtime), options)
    before: RunCuts | None = p.cache.run_cuts
    cut = before.restart_point(key, reset, p.index.producer) if before is not None else None
    kept = RunCuts(key, reset, default_budget(p) if budget is None else budget, flat)
    if cut is not None:
        kept.inherit(before, cut)
        kept.prefix = before.reused(cut)
    p.cache.run_cuts = kept
    return kept, cut


def default_budget(p: PreparedPair) -> int:
    """Twice the eager live set, 32 MiB at least."""
    return max(2 * p.schedule.live_bytes, MIN_BUDGET)


def restore(parts: RunParts, ranges: list[tuple[int, int]], cut: Cut) -> int:
    """Put a fresh run (``parts``, inputs and weights fed; cut into ``ranges``) in the state ``cut``
    kept; returns the segment to go on at."""
    state = parts.state
    state.fx.env.update(cut.fx_env)  # (after the inputs and weights, fed as for a first run)
    parts.fx.runner.position = cut.fx_position
    state.fx.times.update(cut.fx_times)
    state.fx.errors.update(cut.fx_errors)
    state.onnx.env.update(cut.onnx_env)
    state.onnx.shapes.update(cut.onnx_shapes)
    state.onnx.errors.update(cut.onnx_errors)
    parts.judge.restore(cut.sources)
    state.done = cut.done
    return next((i for i, (a, _) in enumerate(ranges) if a == cut.start), len(ranges))  # (or past the end)


def _bytes(values) -> int:
    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            total += v.element_size() * v.numel()
        elif isinstance(v, np.ndarray):
            total += v.nbytes
    return total
