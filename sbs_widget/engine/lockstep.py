"""One comparison run over a prepared pair, in lockstep: the FX side runs up to the next segment's last
twin, the segment runs (alongside it when both fit on the cores; its session compiled in the
background meanwhile), the segment's pairs are measured together and yielded in node order; each value
is freed once compared and no longer read on its side.

Call tree of one run (``LockstepRun.records``)::

    records
      start: fx.runner.feed(inputs); restart.restore(cut) or edge_records.inputs / .weights
      for each segment s (run_plan ranges):
        cancel.check
        onnx.compile_ahead (the coming segments, background thread)
        onnx.start(segment)                 (alongside the FX side, when both fit on one core each)
        fx_records(until the segment's last twin)   -> FxSide.run_to, folded constants measured
        onnx.run(segment)                   (or collect the started run; node by node after a failure)
        segment_records.records(segment)    -> build, Measurer.compare_many, LocalRuns, Judge, InnerValues,
                                               resets, exc
        kept.take (cuts for a rerun); onnx.free; fx.release; sessions dropped; weight pages handed back
      fx_records(to the end); edge_records.unrecorded; edge_records.outputs
"""

from __future__ import annotations

from typing import Iterator

import torch

from sbs_widget import records as R
from sbs_widget.engine import edge_records, segment_records
from sbs_widget.engine.cancel import Cancel, where_in
from sbs_widget.engine.measure import _join
from sbs_widget.engine.memory import TRIM_BYTES, return_freed_memory
from sbs_widget.engine.prepared import PreparedPair
from sbs_widget.engine.restart import CUTS_PER_RUN, open_cuts, restore
from sbs_widget.engine.run_parts import RunOptions, build_parts
from sbs_widget.engine.run_plan import FX_FOLDED, FX_ONE_SIDED, FX_SKIP
from sbs_widget.engine.runtimes import Runtime, cores
from sbs_widget.records import Record


class LockstepRun:
    """One comparison run over a prepared pair; ``records()`` is the generator (call tree above)."""

    def __init__(self, p: PreparedPair, flat: list, runtime: Runtime, options: RunOptions,
                 device: torch.device = torch.device("cpu"), cancel: Cancel | None = None):
        self.parts = parts = build_parts(p, flat, runtime, options, device, cancel or Cancel())
        onnx, judge = parts.onnx, parts.judge
        cuts = {p.index.producer[v] for v in options.reset}
        # cuts kept for the next run, and the one of the run before this one restarts from (restart.py)
        self.kept, self.restart = open_cuts(p, flat, runtime, device, options.restart_key(), options.reset,
                                            options.keep_cuts)
        if self.restart is not None:
            cuts.add(self.restart.start - 1)
        ranges = p.plan(cuts, options.segment_nodes)
        plan = p.release_plan(ranges, options.node_local, options.reference)
        # A segment runs in the runner thread, alongside the FX side's stretch, when neither side
        # needs more than a core: torch's small ops run on one thread and so does onnxruntime here.
        # Otherwise it runs in this thread after the stretch: threads beyond the cores make torch's
        # parallel ops wait for each other (11% slower on an 8-layer LLaMA of hidden size 256).
        caps = onnx.caps
        alongside = caps.compiles_in_background and caps.intra_op_num_threads == 1 and cores() >= 2
        self.ranges, self.plan = ranges, plan
        self.alongside = [alongside and one for one in plan.single]
        self.segment = -1  # the segment whose records are being measured (-1: none yet)
        # unknown, so not clean: what reads them cannot be called rounding on its node-local run alone
        judge.sources.update(p.alignment.onnx_to_fx[v] for v in onnx.hidden if v in p.alignment.onnx_to_fx)

    # -- the whole run ---------------------------------------------------------------------------
    def records(self) -> Iterator[Record]:
        kept = self.kept
        if kept is None:
            yield from self._records()
            return
        for rec in self._records():  # kept: the records before a cut are a restarted run's
            kept.records.append(rec)
            yield rec

    def _records(self) -> Iterator[Record]:
        parts = self.parts
        p, cancel = parts.p, parts.cancel
        cancel.start()
        try:
            parts.fx.runner.feed(parts.flat)
            first = 0 if self.restart is None else restore(parts, self.ranges, self.restart)
            self.segment = first - 1
            # Sessions kept: compile them all ahead; otherwise one segment ahead, each dropped once done.
            self._compile_ahead(first, None if parts.options.keep_sessions else first + 2)
            if self.restart is None:
                yield from edge_records.inputs(parts)
                yield from edge_records.weights(parts)
            else:  # the run before's records up to the cut, marked as reused
                yield from self.kept.prefix
                self.kept.prefix = []
            for s in range(first, len(self.ranges)):
                yield from self._segment(s, first)
            cancel.check("before the last FX nodes and the outputs")
            yield from self._fx_records(len(p.fx_nodes))
            yield from edge_records.unrecorded(parts)  # (before the outputs: they stay last)
            yield from edge_records.outputs(parts)
            return_freed_memory()
            for f in p.weight_files:
                f.release()
        finally:
            cancel.finish()

    def _segment(self, s: int, first: int) -> Iterator[Record]:
        """Segment ``s``: run both sides to its end, yield its records, free what it no longer needs."""
        parts, kept = self.parts, self.kept
        p, onnx, options = parts.p, parts.onnx, parts.options
        a, b = self.ranges[s]
        parts.cancel.check(lambda: where_in(p.index, a, a + 1).replace("at ", "before ", 1))
        self.segment = s - 1
        if not options.keep_sessions and s > first:
            self._compile_ahead(s + 1, s + 2)
        seg = onnx.segment(a, b)
        started = onnx.start(seg) if self.alongside[s] else None
        yield from self._fx_records(self.plan.fx_need[s])
        seconds = onnx.run(seg, started)
        self.segment = s
        n_before, sources_before = len(kept.records) if kept else 0, set(parts.judge.sources)
        yield from segment_records.records(parts, seg, seconds)
        parts.inner.clear()
        if kept is not None:
            kept.take(parts, self.plan.release_at[s], a, b, n_before, sources_before,
                      max(1, len(p.index.nodes) // CUTS_PER_RUN))
        onnx.free(seg)
        parts.fx.release(self.plan.release_at[s], self.plan.fx_release, s)
        if not options.keep_sessions:
            p.forget(onnx.rt, onnx.used)
        onnx.used.clear()
        if sum(p.schedule.node_bytes[a:b]) >= TRIM_BYTES:
            return_freed_memory()
        for f in p.weight_files:  # the pages of the weights this segment read (load/mapped_weights.py)
            f.release()

    def _compile_ahead(self, first: int, end: int | None) -> None:
        parts = self.parts
        local_ahead = parts.local.ahead if parts.options.node_local else None
        parts.onnx.compile_ahead(self.ranges[first:end], local_ahead)

    # -- the FX side's records -------------------------------------------------------------------
    def _fx_records(self, until: int) -> Iterator[Record]:
        """Run the FX side up to node ``until`` (all of it in one go), then yield its records: one-sided
        nodes, and values constant-folded by the exporter (measured together, like a segment's pairs)."""
        parts = self.parts
        p, fx, measurer, judge, state = parts.p, parts.fx, parts.measurer, parts.judge, parts.state
        last = len(p.fx_nodes) - 1  # the output node
        stop = min(until, last - 1)
        if fx.position > stop:
            return
        times, kept, error = fx.run_to(stop, self.plan.fx_release, self.segment)
        fx_times, pairs, names, after = fx.state.times, p.alignment.pairs, p.schedule.fx_names, p.schedule.fx_after
        progress, total = parts.options.progress, p.schedule.n_fx_nodes
        out: list[Record] = []
        folded: list[tuple[Record, object, object]] = []
        for position, seconds in times:
            what = after[position]
            if what == FX_SKIP:
                continue
            name = names[position]
            fx_times[name] = seconds
            state.done += 1
            if progress is not None:
                progress(state.done, total, name)
            if what == FX_ONE_SIDED:
                rec = edge_records.record(parts, name, None, R.KIND_NODE)
                rec.status, rec.comment = R.ONE_SIDED, p.pair.why_no_twin(name)
                out.append(rec)
            elif what == FX_FOLDED:
                pair = pairs[name]
                rec = edge_records.record(parts, name, pair.onnx_value, R.KIND_NODE, pair.how)
                rec.comment = _join(rec.comment, "constant-folded into an initializer")
                value, weights = kept[name], p.weights()
                if weights.is_exactly(pair.onnx_value, value):  # a transposed view of the same bits
                    measurer.identical(rec, value)
                else:
                    folded.append((rec, value, weights[pair.onnx_value]))
                out.append(rec)
        if folded:
            measurer.compare_many(folded)
            if parts.options.reference:
                judge.judge_folded(folded)
        for rec in out:
            if rec.status == R.MISMATCH:
                judge.add_source(rec.ep_name)
            measurer.check_exc(rec)  # only compared records can be beyond tolerance
            yield rec
        if error is not None:  # a failed FX node: nothing downstream can run on the torch side
            node = fx.failed_node()
            rec = edge_records.record(parts, node.name, None, R.KIND_NODE)
            rec.status = R.ERROR
            rec.comment = error
            fx.runner.position = last
            yield rec
