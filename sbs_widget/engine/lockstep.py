"""One comparison run over a ``Prepared`` pair, in lockstep: the FX side runs up to the next
segment's last twin, the segment runs (alongside it when both fit on the cores; its session compiled
in the background meanwhile), the segment's pairs are measured together and yielded in node order;
each value is freed once compared and no longer read on its side."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import numpy as np
import torch

from sbs_widget import records as R
from sbs_widget.align.inner_values import onnx_only_reasons
from sbs_widget.align.twinless import why_no_twin
from sbs_widget.dtypes import numpy_elem_type
from sbs_widget.engine.cancel import Cancel, where_in
from sbs_widget.engine.fx_runner import FxRunner, program_outputs
from sbs_widget.engine.inner_run import InnerValues
from sbs_widget.engine.local_runs import NodeLocalRuns
from sbs_widget.engine.measure import Measuring, _failed, _join
from sbs_widget.engine.memory import TRIM_BYTES, return_freed_memory
from sbs_widget.engine.metrics import BATCH_ELEMENTS, Scratch
from sbs_widget.engine.onnx_side import OnnxSide
from sbs_widget.engine.restart import CUTS_PER_RUN, open_cuts, restore
from sbs_widget.engine.run_plan import FX_FOLDED, FX_ONE_SIDED, FX_SKIP
from sbs_widget.engine.runtimes import cores
from sbs_widget.engine.segments import Segment
from sbs_widget.engine.verdicts import Judging
from sbs_widget.errors import InputError
from sbs_widget.records import Record

if TYPE_CHECKING:
    from sbs_widget.engine.prepared import Prepared


class LockstepRun(OnnxSide, NodeLocalRuns, Measuring, Judging, InnerValues):
    """One comparison run over a ``Prepared`` pair; ``records()`` is the generator."""

    def __init__(self, p: Prepared, flat, runtime, atol, rtol, reset, node_local, exc, progress,
                 histogram, segment_nodes, keep_sessions=True, device: torch.device = torch.device("cpu"),
                 cancel: Cancel | None = None, reference: bool = True, keep_cuts: int | None = None,
                 figures: tuple = ()):
        self.p, self.flat, self.rt = p, flat, runtime
        self.figures = figures  # metrics asked for (user_metrics.py)
        self.cancel = cancel or Cancel()  # time limit, stop, Ctrl-C (checked once per segment)
        self.keep_sessions = keep_sessions
        self.used: list[tuple] = []  # compiled pieces used by the current segment
        self.atol, self.rtol, self.reset = atol, rtol, reset
        self.node_local, self.exc, self.progress = node_local, exc, progress
        self.histogram = histogram
        self.reference = reference  # pairs beyond tolerance judged noise or mismatch (verdicts.py)
        self._init_judging()
        self.scratch = Scratch()  # the metrics' work buffers, for the whole run
        self.runner = FxRunner(p.decomposed_ep, p.small_fx_nodes, p.fx_plans.setdefault(device, {}), device)
        self.runner.hand_back_pages(p.weight_files)
        self.runner.cancel = self.cancel  # checked by the torch side's loops too (fx_runner._CheckedHop)
        self.onnx_env: dict[str, object] = {}
        self._finer: dict[tuple, object] = {}  # finer references of the segment being measured (inner_run.py)
        self._apart: dict[str, object] = {}  # its inner values recomputed apart (half precision)
        self.onnx_shapes: dict[str, tuple] = {}
        self.onnx_errors: dict[str, str] = {}
        self.fx_times: dict[str, float] = {}
        self.fx_errors: dict[str, str] = {}
        self.done = 0
        cuts = {p.index.producer[v] for v in reset}
        # cuts kept for the next run, and the one of the run before this one restarts from (restart.py)
        same = (atol, rtol, node_local, histogram, reference, segment_nodes, exc, figures)
        self.kept, self.restart = open_cuts(p, flat, runtime, device, same, frozenset(reset), keep_cuts)
        if self.restart is not None:
            cuts.add(self.restart.start - 1)
        self.ranges = p.plan(cuts, segment_nodes)
        self.segment_of_node, self.fx_release, self.fx_need, self.release_at, single = \
            p.release_plan(self.ranges, node_local, reference)
        # A segment runs in the runner thread, alongside the FX side's stretch, when neither side
        # needs more than a core: torch's small ops run on one thread and so does onnxruntime here.
        # Otherwise it runs in this thread after the stretch: threads beyond the cores make torch's
        # parallel ops wait for each other (11% slower on an 8-layer LLaMA of hidden size 256).
        alongside = getattr(runtime, "compiles_in_background", False) and \
            getattr(runtime, "intra_op_num_threads", 0) == 1 and cores() >= 2
        self.alongside = [alongside and one for one in single]
        self.current_segment = -1
        # A runtime that optimizes (deployed/runtime.py) says which values its graph no longer computes:
        # not asked for (that would stop the fusion), reported one-sided with why.
        vanished_of = getattr(runtime, "vanished_values", None)
        self.vanished: dict[str, str] = vanished_of(p.index.full_model()) if vanished_of is not None else {}
        self.hidden = frozenset(self.vanished.keys() - set(p.index.outputs))
        self.weights_in = bool(getattr(runtime, "weights_in_segments", False))
        # unknown, so not clean: what reads them cannot be called rounding on its node-local run alone
        self.sources.update(p.alignment.onnx_to_fx[v] for v in self.hidden if v in p.alignment.onnx_to_fx)


    def _release_fx(self, names) -> None:
        """Free torch values among ``names`` that neither side needs any more."""
        pos = self.runner.position
        env = self.runner.env
        last_use, release, current = self.p.fx_last_use, self.fx_release, self.current_segment
        for name in names:
            if name in env and last_use.get(name, -1) < pos and release.get(name, -1) <= current \
                    and self.p.fx_position[name] < pos:
                del env[name]


    def _record(self, fx_name: str | None, onnx_name: str | None, kind: str, how: str = "") -> Record:
        rec = Record(*self.p.record_fields(fx_name, onnx_name, kind, how))
        if fx_name is not None:
            rec.ep_time_run = self.fx_times.get(fx_name)
        return rec


    # -- the FX side -----------------------------------------------------------------------------
    def _advance_fx(self, until: int) -> Iterator[Record]:
        """Run the FX side up to node ``until`` (all of it in one go), then yield its records."""
        p = self.p
        runner = self.runner
        last = len(p.fx_nodes) - 1  # the output node
        stop = min(until, last - 1)
        if runner.position > stop:
            return
        times: list[tuple[int, float]] = []
        kept: dict[str, object] = {}
        error = runner.run_to(stop, times, p.fx_frees, self.fx_release, self.current_segment, p.fx_folded, kept)
        fx_times, pairs, names, after = self.fx_times, p.alignment.pairs, p.fx_names, p.fx_after
        progress = self.progress
        out: list[Record] = []
        folded: list[tuple[Record, object, object]] = []  # measured together, like a segment's pairs
        for position, seconds in times:
            what = after[position]
            if what == FX_SKIP:
                continue
            name = names[position]
            fx_times[name] = seconds
            self.done += 1
            if progress is not None:
                progress(self.done, p.n_fx_nodes, name)
            if what == FX_ONE_SIDED:
                out.append(self._one_sided_fx(name))
            elif what == FX_FOLDED:
                pair = pairs[name]
                rec = self._record(name, pair.onnx_value, R.KIND_NODE, pair.how)
                rec.comment = _join(rec.comment, "constant-folded into an initializer")
                value, weights = kept[name], p.weights()
                if weights.is_exactly(pair.onnx_value, value):  # a transposed view of the same bits
                    self._identical(rec, value)
                else:
                    folded.append((rec, value, weights[pair.onnx_value]))
                out.append(rec)
        if folded:
            self._compare_many(folded)
            if self.reference:
                self._judge_folded(folded)
        for rec in out:
            if rec.status == R.MISMATCH:
                self._add_source(rec.ep_name)
            self._check_exc(rec)  # only compared records can be beyond tolerance
            yield rec
        if error is not None:
            # A failed FX node: nothing downstream can run on the torch side.
            node = p.fx_nodes[runner.position - 1]
            self.fx_errors[node.name] = error
            rec = self._record(node.name, None, R.KIND_NODE)
            rec.status = R.ERROR
            rec.comment = error
            runner.position = last
            yield rec

    def _one_sided_fx(self, fx_name: str) -> Record:
        rec = self._record(fx_name, None, R.KIND_NODE)
        rec.status, rec.comment = R.ONE_SIDED, why_no_twin(self.p, fx_name)
        return rec


    def _segment_records(self, seg: Segment, seconds: float) -> Iterator[Record]:
        """The records of a segment's values, in node order: built first, measured together, then
        yielded (resets and ``exc`` act in order)."""
        p = self.p
        env, onnx_env, onnx_errors, fx_times = self.runner.env, self.onnx_env, self.onnx_errors, self.fx_times
        local = self._run_local(seg) if self.node_local else {}
        onnx_time = seconds / max(1, seg.end - seg.start)
        # (record, FX node holding the torch value, ONNX value) compared
        records: list[tuple[Record, str | None, str | None]] = []
        compares = []
        duplicate_of, reshaped = p.alignment.duplicate_of, p.alignment.reshaped
        inside = onnx_only_reasons(p)
        inner_pairs, inner_of, inner = p.inner.pairs, p.inner.of, []
        if p.half:  # inner values recomputed apart, not handed back by the segment (inner_run.py)
            apart = [o for o, *_ in p.segment_records(seg.start, seg.end) if o in inner_pairs
                     and not inner_pairs[o].constant]
            self._apart = self._inner_apart(apart, False) if apart else {}
            local_inner = self._inner_apart(apart, True) if apart and self.node_local else {}
        shapes: list[tuple[Record, str]] = []  # (record of a reshaped alias, the torch value's shape)
        for o, fx_name, fields, aliases in p.segment_records(seg.start, seg.end):
            rec = Record(*fields)
            if o in self.hidden:  # not computed by the deployed graph
                rec.status, rec.comment = R.ONE_SIDED, self.vanished[o]
                records.append((rec, None, None))
                for _, alias_fields in aliases:
                    alias = Record(*alias_fields)
                    alias.status, alias.comment = R.ONE_SIDED, self.vanished[o]
                    records.append((alias, None, None))
                continue
            if o in inner_pairs:  # inside a translation, paired with a finer torch reference
                item = self._inner_item(rec, o)
                records.append((rec, None, o if item[1] is not None else None))
                if item[1] is not None:
                    compares.append(item)
                    inner.append(item)
                continue
            if fx_name is None:  # ONNX only
                rec.inner_of = inner_of.get(o)
                rec.status = R.ONE_SIDED
                rec.comment = rec.comment or inside.get(p.index.producer.get(o, -1), "ONNX only")
                if o in onnx_errors:
                    rec.status = R.ERROR
                    rec.comment = _join(rec.comment, onnx_errors[o])
                records.append((rec, None, None))
                continue
            rec.ep_time_run = fx_times.get(fx_name)
            rec.onnx_time_run = onnx_time
            if o in onnx_errors:
                records.append(_failed(rec, onnx_errors[o]))
            elif fx_name not in env:
                records.append(_failed(rec, self.fx_errors.get(fx_name, "torch value unavailable "
                                                                        "(an upstream FX node failed)")))
            elif o not in onnx_env:
                records.append(_failed(rec, "ONNX value unavailable"))
            else:
                compares.append((rec, env[fx_name], onnx_env[o]))
                records.append((rec, fx_name, o))
            for alias, alias_fields in aliases:  # FX no-ops removed by the optimizer, duplicates it merged
                rec = Record(*alias_fields)
                rec.ep_time_run = fx_times.get(alias)
                # A duplicate's value is its twin's (same op, same inputs), a reshaped alias's its twin's
                # reshaped: measured with the twin's torch value, so that the FX side need not run ahead
                # to it (it may be layers later: LLaMA's rotary cos unsqueezed in every layer).
                holder = fx_name if alias in duplicate_of or alias in reshaped else alias
                if holder not in env or o not in onnx_env:
                    records.append(_failed(rec, "value unavailable"))
                elif alias in reshaped:  # the same elements in the ONNX value's shape
                    try:
                        value = env[holder].reshape(np.shape(onnx_env[o]))
                    except (RuntimeError, AttributeError) as e:
                        records.append(_failed(rec, f"cannot reshape the torch value to the ONNX value's shape: {e}"))
                        continue
                    compares.append((rec, value, onnx_env[o]))
                    records.append((rec, holder, o))
                    shapes.append((rec, rec.ep_shape_type))
                else:
                    compares.append((rec, env[holder], onnx_env[o]))
                    records.append((rec, holder, o))
        self._compare_many(compares)
        for rec, shape_type in shapes:  # the record tells the torch value's own shape
            rec.ep_shape_type = shape_type
        if self.reference and not self.node_local:  # node-local values where a verdict needs them
            beyond = {o for rec, fx, o in records if rec.status == R.MISMATCH and fx is not None}
            if beyond:
                local = self._run_local(seg, beyond)
        local_scale: dict[int, float] = {}
        if local:  # (an alias's torch value is its twin's: the same node-local run measures it)
            local_scale = self._local_errors([(rec, fx, o) for rec, fx, o in records
                                              if o in local and fx is not None and rec.status != R.ERROR], local)
        if self.reference:
            self._judge_segment(records, local, local_scale)
        if inner:
            self._judge_inner(inner, local_inner if p.half else local)
        reset, exc = self.reset, self.exc
        for rec, fx_name, o in records:
            if rec.kind == R.KIND_INNER and o is not None and o in reset and o in inner_pairs:
                self._reset_inner(rec, o)
            if reset and o is not None and o in reset and rec.ep_name == fx_name == p.alignment.onnx_to_fx.get(o):
                try:
                    onnx_env[o] = self._to_feed(env[fx_name], o)
                    rec.status = R.RESET
                    rec.comment = _join(rec.comment, "reset: downstream ONNX nodes read the torch value")
                except (TypeError, ValueError) as e:
                    rec.comment = _join(rec.comment, f"cannot reset: {e}")
            if exc and fx_name is not None:
                self._check_exc(rec)
            yield rec


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
        self.cancel.start()
        try:
            p, kept = self.p, self.kept
            self.runner.feed(self.flat)
            first = 0 if self.restart is None else restore(self, self.restart)
            every = max(1, len(p.index.nodes) // CUTS_PER_RUN)
            # Sessions kept: compile them all ahead; otherwise one segment ahead, each dropped once done.
            self._compile_ahead(first, None if self.keep_sessions else first + 2)
            if self.restart is None:
                yield from self._input_records()
                yield from self._weight_records()
            else:  # the run before's records up to the cut, marked as reused
                yield from kept.prefix
                kept.prefix = []
            for s in range(first, len(self.ranges)):
                a, b = self.ranges[s]
                self.cancel.check(lambda: where_in(p.index, a, a + 1).replace("at ", "before ", 1))
                self.current_segment = s - 1
                if not self.keep_sessions and s > first:
                    self._compile_ahead(s + 1, s + 2)
                seg = p.segment(a, b, self.hidden, self.weights_in)
                started = self._start_segment(seg) if self.alongside[s] else None
                yield from self._advance_fx(self.fx_need[s])
                seconds = self._run_segment(seg, started)
                self.current_segment = s
                n_before, sources_before = len(kept.records) if kept else 0, set(self.sources)
                yield from self._segment_records(seg, seconds)
                self._finer.clear()
                self._apart = {}
                if kept is not None:
                    kept.take(self, s, a, b, n_before, sources_before, every)
                self._free_onnx(seg)
                self._release_fx(self.release_at[s])
                if not self.keep_sessions:
                    p.forget(self.rt, self.used)
                self.used.clear()
                if sum(p.node_bytes[a:b]) >= TRIM_BYTES:
                    return_freed_memory()
                for f in p.weight_files:  # the pages of the weights this segment read (load/mapped_weights.py)
                    f.release()
            self.cancel.check("before the last FX nodes and the outputs")
            yield from self._advance_fx(len(p.fx_nodes))
            yield from self._unrecorded_records()  # (before the outputs: they stay last)
            yield from self._output_records()
            return_freed_memory()
            for f in p.weight_files:
                f.release()
        finally:
            self.cancel.finish()

    def _unrecorded_records(self) -> Iterator[Record]:
        """One one-sided record per node of the user's program no other record names, with why (a
        no-op the decomposition removed, folded from constants, no output depends on it)."""
        for node in self.p.unrecorded:
            rec = Record(ep_name=node.name, ep_target=node.target, ep_origin=node.name, module=node.module,
                         status=R.ONE_SIDED, kind=R.KIND_NODE, comment=f"not in the program the exporter "
                                                                      f"translated: {node.reason}")
            yield rec

    def _input_records(self) -> Iterator[Record]:
        for fx_name, onnx_name in self.p.alignment.input_pairs:
            value = self.runner.env[fx_name]
            if isinstance(value, torch.Tensor):
                try:
                    arr = self._to_feed(value, onnx_name)
                except (TypeError, ValueError) as e:
                    raise InputError(f"input {fx_name!r} cannot be fed to the ONNX model: {e}") from e
                self.onnx_env[onnx_name] = arr
                self.onnx_shapes[onnx_name] = arr.shape
                rec = self._record(fx_name, onnx_name, R.KIND_INPUT)
                vt = self.p.index.types.get(onnx_name)
                if vt is not None and vt.elem_type and vt.elem_type != numpy_elem_type(arr):
                    raise InputError(f"input {fx_name!r}: the ONNX model expects element type {vt.elem_type}")
                rec = self._compare(rec, value, arr)
                if rec.status == R.MISMATCH:
                    self._add_source(fx_name)
                yield rec

    def _weight_records(self) -> Iterator[Record]:
        """Weights measured a batch at a time (a few vectorized passes for many small weights; the
        batch is bounded so that transposed copies never add up to the weights' size)."""
        p = self.p
        env, weights = self.runner.env, p.weights()
        batch: list[tuple[Record, object, object]] = []
        elements = 0
        for fields, placeholder, onnx_name, transposed in p.weight_records():
            rec = Record(*fields)
            if onnx_name is None:  # nothing to compare (see the record's comment)
                batch.append((rec, None, None))
                continue
            expected = env[placeholder].t() if transposed else env[placeholder]
            if weights.is_exactly(onnx_name, expected):  # the file's bits are torch's: errors all 0
                batch.append((self._identical(rec, expected), None, None))
                continue
            got = weights[onnx_name]
            batch.append((rec, expected, got))
            elements += got.size
            if elements >= BATCH_ELEMENTS:
                yield from self._weight_batch(batch)
                batch, elements = [], 0
        yield from self._weight_batch(batch)

    def _weight_batch(self, batch: list[tuple[Record, object, object]]) -> Iterator[Record]:
        """The weight records of ``batch``, measured; weights are copied, not computed: one that
        differs beyond rounding of its type is a mismatch even within tolerance, and a source."""
        self._compare_many([x for x in batch if x[1] is not None])
        for rec, expected, got in batch:
            if self.reference and expected is not None and rec.status == R.OK and rec.err_abs:
                self._weight_beyond_rounding(rec, expected, got)
            if rec.status == R.MISMATCH:
                self._add_source(rec.ep_name)
            if expected is not None:
                self._check_exc(rec)
            yield rec

    def _output_records(self) -> Iterator[Record]:
        env = self.runner.env
        fx_out = program_outputs(self.p.decomposed_ep)
        out: list[Record] = []
        compared: list[tuple[Record, str | None, object, object]] = []
        for pos, (fx_val, onnx_name) in enumerate(zip(fx_out, self.p.index.outputs)):
            fx_name = fx_val.name if isinstance(fx_val, torch.fx.Node) else None
            rec = self._record(fx_name, onnx_name, R.KIND_OUTPUT)
            rec.ep_name = rec.ep_name or f"output[{pos}]"
            rec.comment = _join(f"output {pos}", rec.comment)
            expected = env.get(fx_name) if fx_name is not None else fx_val
            if onnx_name in self.onnx_errors:
                rec.status = R.ERROR
                rec.comment = _join(rec.comment, self.onnx_errors[onnx_name])
            elif fx_name is not None and fx_name not in env:
                rec.status = R.ERROR
                rec.comment = _join(rec.comment, "torch value unavailable")
            elif onnx_name not in self.onnx_env and onnx_name not in self.p.index.initializers:
                rec.status = R.ERROR
                rec.comment = _join(rec.comment, "ONNX value unavailable")
            elif expected is None:
                rec.status = R.ONE_SIDED
                rec.comment = _join(rec.comment, "torch output is None")
            else:
                expected = expected if isinstance(expected, torch.Tensor) else torch.tensor(expected)
                got = self._onnx_value(onnx_name)
                rec = self._compare(rec, expected, got)
                compared.append((rec, fx_name, expected, got))
            out.append(rec)
        if self.reference:
            self._judge_outputs(compared)
        for rec in out:
            if rec.status in (R.MISMATCH, R.NOISE, R.OK) and rec.kind == R.KIND_OUTPUT:
                self._check_exc(rec)
            yield rec
