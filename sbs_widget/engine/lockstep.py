"""One comparison run over a ``Prepared`` pair, in lockstep: the FX side runs up to the next
segment's last twin, the segment runs (alongside it when both fit on the cores; its session compiled
in the background meanwhile), the segment's pairs are measured together and yielded in node order;
each value is freed once compared and no longer read on its side."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np
import onnx
import torch

from sbs_widget import records as R
from sbs_widget.align.pairs import onnx_elem_type
from sbs_widget.engine.background import renew, submit_if_idle
from sbs_widget.engine.cancel import Cancel, where_in
from sbs_widget.errors import InputError, RunCancelled, ToleranceExceeded
from sbs_widget.engine.fx_runner import FxRunner, program_outputs
from sbs_widget.engine.node_local import ANCHOR, LocalGroup, local_model
from sbs_widget.engine.metrics import (BATCH_ELEMENTS, EMPTY_NOTE, Scratch, as_numpy, beyond_where, compute_errors_many,
                      same_shape)
from sbs_widget.load.onnx_index import ONNX_TO_NUMPY
from sbs_widget.records import HISTOGRAM_EDGES, Record
from sbs_widget.engine.runtimes import cores, exact_numpy
from sbs_widget.engine.segments import SMALL_INITIALIZER, TRANSPOSED, Segment, numpy_elem_type, segment_bytes, segment_model

if TYPE_CHECKING:
    from sbs_widget.engine.prepared import Prepared

# What follows an FX node's run (``Prepared.fx_after``): nothing (not a call), its time only (its
# twin is compared with its segment), a one-sided record, or a comparison with a folded initializer.
FX_SKIP, FX_TIMED, FX_ONE_SIDED, FX_FOLDED = 0, 1, 2, 3


class LockstepRun:
    """One comparison run over a ``Prepared`` pair; ``records()`` is the generator."""

    def __init__(self, p: Prepared, flat, runtime, atol, rtol, reset, node_local, exc, progress,
                 histogram, segment_nodes, keep_sessions=True, device: torch.device = torch.device("cpu"),
                 cancel: Cancel | None = None):
        self.p, self.flat, self.rt = p, flat, runtime
        self.cancel = cancel or Cancel()  # time limit, stop, Ctrl-C (checked once per segment)
        self.keep_sessions = keep_sessions
        self.used: list[tuple] = []  # compiled pieces used by the current segment
        self.atol, self.rtol, self.reset = atol, rtol, reset
        self.node_local, self.exc, self.progress = node_local, exc, progress
        self.histogram = histogram
        self.scratch = Scratch()  # the metrics' work buffers, for the whole run
        self.runner = FxRunner(p.decomposed_ep, p.small_fx_nodes, p.fx_plans.setdefault(device, {}), device)
        self.onnx_env: dict[str, object] = {}
        self.onnx_shapes: dict[str, tuple] = {}
        self.onnx_errors: dict[str, str] = {}
        self.fx_times: dict[str, float] = {}
        self.fx_errors: dict[str, str] = {}
        self.done = 0
        cuts = {p.index.producer[v] for v in reset}
        self.ranges = p.plan(cuts, segment_nodes)
        key = (tuple(self.ranges), node_local)
        if key not in p.run_plans:
            p.run_plans[key] = _release_plan(p, self.ranges, node_local)
        self.segment_of_node, self.fx_release, self.fx_need, self.release_at, single = p.run_plans[key]
        # A segment runs in the runner thread, alongside the FX side's stretch, when neither side
        # needs more than a core: torch's small ops run on one thread and so does onnxruntime here.
        # Otherwise it runs in this thread after the stretch: threads beyond the cores make torch's
        # parallel ops wait for each other (11% slower on an 8-layer LLaMA of hidden size 256).
        alongside = getattr(runtime, "compiles_in_background", False) and \
            getattr(runtime, "intra_op_num_threads", 0) == 1 and cores() >= 2
        self.alongside = [alongside and one for one in single]
        self.current_segment = -1

    # -- helpers ---------------------------------------------------------------------------------
    def _onnx_value(self, name: str):
        if name in self.onnx_env:
            return self.onnx_env[name]
        if name in self.p.index.initializers:
            return self.p.weights()[name]
        raise KeyError(name)

    def _release_fx(self, names) -> None:
        """Free torch values among ``names`` that neither side needs any more."""
        pos = self.runner.position
        env = self.runner.env
        last_use, release, current = self.p.fx_last_use, self.fx_release, self.current_segment
        for name in names:
            if name in env and last_use.get(name, -1) < pos and release.get(name, -1) <= current \
                    and self.p.fx_position[name] < pos:
                del env[name]

    def _to_feed(self, value, like_name: str):
        """A torch value as the ONNX side expects value ``like_name`` (dtype and shape)."""
        if not isinstance(value, torch.Tensor):
            value = torch.tensor(value)
        arr = exact_numpy(value)
        vt = self.p.index.types.get(like_name)
        if vt is not None and vt.elem_type in ONNX_TO_NUMPY and arr.dtype != ONNX_TO_NUMPY[vt.elem_type]:
            arr = arr.astype(ONNX_TO_NUMPY[vt.elem_type])
        shape = self.onnx_shapes.get(like_name)
        if shape is not None and tuple(arr.shape) != tuple(shape) and arr.size == int(np.prod(shape)):
            arr = arr.reshape(shape)
        return np.ascontiguousarray(arr)

    def _record(self, fx_name: str | None, onnx_name: str | None, kind: str, how: str = "") -> Record:
        rec = Record(*self.p.record_fields(fx_name, onnx_name, kind, how))
        if fx_name is not None:
            rec.ep_time_run = self.fx_times.get(fx_name)
        return rec

    def _compare(self, rec: Record, expected, got) -> Record:
        self._compare_many([(rec, expected, got)])
        return rec

    def _compare_many(self, items: list[tuple[Record, object, object]]) -> None:
        """Fill the error fields of each ``(record, torch value, ONNX value)``, all pairs at once: the
        figures of a whole segment come from a few vectorized passes (``compute_errors_many``)."""
        ready, arrays = [], []
        for rec, expected, got in items:
            # The common case, checked first: a CPU tensor and an array of the same dtype and shape.
            if type(expected) is torch.Tensor and type(got) is np.ndarray:
                try:
                    e = expected.numpy()
                except (RuntimeError, TypeError):  # autograd, another device, bfloat16, conjugate bit
                    e = None
                if e is not None and e.dtype == got.dtype and e.shape == got.shape:
                    rec.ep_shape_type = rec.onnx_shape_type = _described(e)
                    ready.append(rec)
                    arrays.append((e, got))
                    continue
            pair = self._readable(rec, expected, got)
            if pair is not None:
                ready.append(rec)
                arrays.append(pair)
        errors = compute_errors_many(arrays, atol=self.atol, rtol=self.rtol, histogram=self.histogram,
                                     scratch=self.scratch)
        for rec, (err_abs, err_rel, err_dev, err_nan, h01, h001, n, within, histogram) in zip(ready, errors):
            rec.err_abs, rec.err_rel, rec.err_dev = err_abs, err_rel, err_dev
            rec.err_nan, rec.err_h01, rec.err_h001 = err_nan, h01, h001
            rec.n_elements, rec.within_tolerance, rec.histogram = n, within, histogram
            rec.status = R.OK if within else R.MISMATCH
            if not n:  # "ok" over nothing: said so
                rec.comment = _join(rec.comment, EMPTY_NOTE)
        for rec, (e, g) in zip(ready, arrays):
            if rec.status == R.MISMATCH:  # rare: one more pass over this pair only
                rec.err_where = beyond_where(e, g, atol=self.atol, rtol=self.rtol)

    def _readable(self, rec: Record, expected, got) -> tuple[np.ndarray, np.ndarray] | None:
        """Both values as numpy arrays of one shape, or None with the record marked as an error."""
        try:
            e = _numpy_of(expected)
            g = got if type(got) is np.ndarray else as_numpy(got)
        except (TypeError, RuntimeError, ValueError) as err:  # this record says so; the run goes on
            rec.status = R.ERROR
            rec.comment = _join(rec.comment, f"cannot read the value: {err}")
            return None
        code = onnx_elem_type(expected.dtype) if isinstance(expected, torch.Tensor) else numpy_elem_type(e)
        rec.ep_shape_type = _shape_type(code, e.shape)
        g_code = numpy_elem_type(g)
        rec.onnx_shape_type = rec.ep_shape_type if g_code == code and g.shape == e.shape else _shape_type(g_code, g.shape)
        if not same_shape(e, g):
            rec.status = R.ERROR
            rec.comment = _join(rec.comment, f"shapes differ: torch {tuple(e.shape)} vs onnx {tuple(g.shape)}")
            return None
        if code != g_code:  # (bfloat16 / float8 are read as float32 on the torch side: same code)
            torch_dtype = str(expected.dtype).removeprefix("torch.") if isinstance(expected, torch.Tensor) else e.dtype
            rec.comment = _join(rec.comment, f"dtypes differ: torch {torch_dtype} vs onnx {g.dtype}")
        return e, g

    def _check_exc(self, rec: Record) -> None:
        if self.exc and rec.status == R.MISMATCH:
            raise ToleranceExceeded(
                f"beyond tolerance (atol={self.atol}, rtol={self.rtol}) at FX node {rec.ep_name!r} "
                f"({rec.ep_target}, {rec.ep_shape_type}) vs ONNX value {rec.onnx_name!r} "
                f"({rec.onnx_op_type} node {rec.onnx_node_name!r}, {rec.onnx_shape_type}): "
                f"err_abs={rec.err_abs:.3g} err_rel={rec.err_rel:.3g} err_nan={rec.err_nan}"
                + (f", beyond tolerance at {rec.err_where}" if rec.err_where else ""),
                rec,
            )

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
        for rec in out:
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
        p = self.p
        rec = self._record(fx_name, None, R.KIND_NODE)
        rec.status = R.ONE_SIDED
        same = p.alignment.duplicate_of.get(fx_name)
        if fx_name in p.folded_into:
            rec.comment = f"no ONNX value: constant-folded into initializer {p.folded_into[fx_name]!r}"
        elif same in p.folded_into:
            rec.comment = (f"no ONNX value: same op on the same inputs as FX node {same!r}, constant-folded into "
                           f"initializer {p.folded_into[same]!r}")
        elif fx_name in p.alignment.of_input:
            rec.comment = (f"no ONNX value: a no-op on input {p.alignment.of_input[fx_name]!r} the ONNX optimizer "
                           "removed (its ONNX consumers read the input itself)")
        elif fx_name in p.alignment.folded_for:
            rec.comment = (f"no ONNX value: constant-folded into the initializer of FX node "
                           f"{p.alignment.folded_for[fx_name]!r} (its value only goes there)")
        elif fx_name in p.alignment.absorbed:
            rec.comment = (f"no ONNX value: the fused {p.alignment.absorbed[fx_name]} node took in the end of "
                           "its computation (its ONNX nodes hand out only a partial value)")
        elif fx_name in p.alignment.fx_group:
            ops = sorted({p.index.nodes[i].op_type for i in p.alignment.fx_group[fx_name]})
            rec.comment = f"translated into ONNX {', '.join(ops)} but no value of the same shape and dtype"
        elif fx_name in p.alignment.fused_into:
            rec.comment = f"no ONNX value: the ONNX optimizer fused it into {p.alignment.fused_into[fx_name]}"
        elif fx_name in p.alignment.empty:
            rec.comment = "no ONNX value: empty (0 elements), dropped by the ONNX optimizer"
        elif fx_name in p.fx_dead:
            rec.comment = "no ONNX value: no output depends on it (the exporter writes no node for it)"
        else:
            rec.comment = "no ONNX value: removed or fused by the ONNX optimizer"
        return rec

    # -- the ONNX side ---------------------------------------------------------------------------
    def _segment_piece(self, seg: Segment, types: dict[str, int]) -> tuple[tuple, Callable[[], onnx.ModelProto]]:
        key = ("seg", seg.start, seg.end, tuple(sorted(types.items())))
        return key, lambda: self._segment_for_runtime(seg, types)

    def _segment_for_runtime(self, seg: Segment, types: dict[str, int]):
        if getattr(self.rt, "accepts_serialized", False):
            return segment_bytes(self.p.index, seg, types)
        return segment_model(self.p.index, seg, types)

    def _compile_ahead(self, first: int = 0, end: int | None = None) -> None:
        """Start compiling segments ``first`` to ``end`` (excluded) of this run, typed as the ONNX model
        declares its values (a segment fed other types at run time is compiled again for them)."""
        if not getattr(self.rt, "compiles_in_background", False):
            return
        p = self.p
        pieces, weights = [], p.weights()
        for a, b in self.ranges[first:end]:
            seg = p.segment(a, b)
            types = {x: p.index.types[x].elem_type for x in seg.inputs if x in p.index.types}
            for x in [x for x in types if x in p.index.initializers and weights.transposed_source(x) is not None]:
                types[TRANSPOSED + x] = types.pop(x)  # as the run will feed it (_segment_feeds)
            if seg.outputs and len(types) == len(seg.inputs) and all(types.values()):
                pieces.append(self._segment_piece(seg, types))
            local = self._local_ahead(seg) if self.node_local else None
            if local is not None:  # (built here, compiled in the background: most of a node-local run)
                pieces.append(local)
        p.compile_ahead(self.rt, pieces)

    def _segment_job(self, seg: Segment) -> Callable[[], tuple[list, float]] | None:
        """Running ``seg`` on the values at hand, as a call returning (outputs, seconds); None when
        it cannot run whole (feeds missing after a failed node, or nothing to hand back)."""
        feeds = self._segment_feeds(seg)
        if len(feeds) != len(seg.inputs) or not seg.outputs:
            return None
        key, build = self._segment_piece(seg, {x: numpy_elem_type(a) for x, a in feeds.items()})
        self.used.append(key)
        prepared, runtime, outputs, call = self.p, self.rt, seg.outputs, self.cancel.call

        def run() -> tuple[list, float]:
            begin = time.perf_counter()
            outs = call(prepared.compiled(runtime, key, build), feeds, outputs)
            return outs, time.perf_counter() - begin

        return run

    def _segment_feeds(self, seg: Segment) -> dict:
        """The values at hand for ``seg``'s inputs; a weight stored transposed comes as its torch
        parameter, under ``TRANSPOSED`` + its name, for the segment to transpose."""
        feeds, env, initializers, weights = {}, self.onnx_env, self.p.index.initializers, self.p.weights()
        for x in seg.inputs:
            if x in env:
                feeds[x] = env[x]
            elif x in initializers:
                source = weights.transposed_source(x)
                if source is None:
                    feeds[x] = weights[x]
                else:
                    feeds[TRANSPOSED + x] = source
        return feeds

    def _start_segment(self, seg: Segment) -> Future | None:
        """Start running ``seg`` in the runner thread, while the FX side computes the same stretch of
        the model (onnxruntime and torch kernels release the GIL); None when it cannot run whole."""
        job = self._segment_job(seg)
        return submit_if_idle("sbs-run", job) if job is not None else None

    def _run_segment(self, seg: Segment, started: Future | None = None) -> float:
        """Run ``seg`` in this thread (or collect the run ``_start_segment`` started); a segment that
        fails runs node by node, in this thread."""
        begin = time.perf_counter()
        try:
            if started is not None:
                outs, seconds = self.cancel.wait(started, lambda: renew("sbs-run"),
                                                 lambda: where_in(self.p.index, seg.start, seg.end))
            else:
                job = self._segment_job(seg)
                outs, seconds = job() if job is not None else (None, 0.0)
        except RunCancelled:
            raise
        except Exception as e:  # an op the runtime cannot run: find it node by node
            if self.cancel.cancelled:  # (or the call was terminated: the run ends here)
                raise self.cancel.error(where_in(self.p.index, seg.start, seg.end, e)) from None
            outs = None
        if outs is not None:
            for o, arr in zip(seg.outputs, outs):
                self.onnx_env[o] = arr
                self.onnx_shapes[o] = getattr(arr, "shape", ())
            return seconds
        self._run_nodes_one_by_one(seg)
        return time.perf_counter() - begin

    def _available(self, name: str) -> bool:
        return name in self.onnx_env or name in self.p.index.initializers

    def _run_nodes_one_by_one(self, seg: Segment) -> None:
        """Fallback when a segment fails: each node alone; a failing node's outputs are replaced by
        their torch twins (when they exist) so that the rest of the model still runs."""
        p = self.p
        for i in range(seg.start, seg.end):
            one = p.segment(i, i + 1)
            node = p.index.nodes[i]
            missing = [x for x in one.inputs if not self._available(x)]
            error = None
            if missing:
                error = f"input {missing[0]!r} unavailable (an upstream node failed)"
            else:
                feeds = {x: self._onnx_value(x) for x in one.inputs}
                types = {x: numpy_elem_type(a) for x, a in feeds.items()}
                key = ("seg", i, i + 1, tuple(sorted(types.items())))
                self.used.append(key)
                try:
                    fn = p.compiled(self.rt, key, lambda: self._segment_for_runtime(one, types))
                    outs = self.cancel.call(fn, feeds, one.outputs)
                    for o, arr in zip(one.outputs, outs):
                        self.onnx_env[o] = arr
                        self.onnx_shapes[o] = getattr(arr, "shape", ())
                except Exception as e:
                    self.cancel.check(lambda: where_in(p.index, i, i + 1, e))
                    error = f"{self.rt.name} failed on {node.op_type} node {node.name!r}: {type(e).__name__}: " \
                            f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
            if error is None:
                continue
            for o in node.output:
                if not o:
                    continue
                self.onnx_errors[o] = error
                fx_name = p.alignment.onnx_to_fx.get(o)
                if fx_name is not None and fx_name in self.runner.env:
                    try:
                        self.onnx_env[o] = self._to_feed(self.runner.env[fx_name], o)
                        self.onnx_errors[o] = error + "; downstream nodes read the torch value"
                    except (TypeError, ValueError):
                        pass

    def _run_local(self, seg: Segment) -> dict[str, np.ndarray]:
        """Node-local values for the compared values of ``seg`` (one session for all groups)."""
        p = self.p
        env = self.runner.env
        groups = [g for g in self._local_groups(seg) if all(p.alignment.onnx_to_fx[a] in env for a in g.anchors)]
        if not groups:
            return {}
        feeds: dict[str, np.ndarray] = {}
        try:
            for g in groups:
                for a in g.anchors:
                    if ANCHOR + a not in feeds:
                        feeds[ANCHOR + a] = self._to_feed(env[p.alignment.onnx_to_fx[a]], a)
                for c in g.constants:
                    if c not in feeds and self._is_big(c):
                        feeds[c] = p.weights()[c]
        except (TypeError, ValueError):
            return {}
        key, build = self._local_piece(seg, groups, {k: numpy_elem_type(v) for k, v in feeds.items()})
        self.used.append(key)
        try:
            fn = p.compiled(self.rt, key, build)
            outs = self.cancel.call(fn, feeds, [g.output_name(k) for k, g in enumerate(groups)])
        except Exception as e:
            self.cancel.check(lambda: where_in(p.index, seg.start, seg.end, e) + " (node-local run)")
            return self._run_local_one_by_one(groups, feeds)
        return {g.value: o for g, o in zip(groups, outs)}

    def _local_groups(self, seg: Segment) -> list[LocalGroup]:
        """The node-local groups of the compared values of ``seg``."""
        p = self.p
        groups = []
        for i in range(seg.start, seg.end):
            for o in p.index.node_outputs[i]:
                if o and o in p.alignment.onnx_to_fx and p.index.op_types[i] != "Constant":
                    g = p.group(o)
                    if g is not None:
                        groups.append(g)
        return groups

    def _local_piece(self, seg: Segment, groups: list[LocalGroup], types: dict[str, int]) -> tuple[tuple, Callable]:
        key = ("local", seg.start, seg.end, tuple(g.value for g in groups), tuple(sorted(types.items())))
        return key, lambda: local_model(self.p.index, groups, types)[0]

    def _local_ahead(self, seg: Segment) -> tuple[tuple, Callable] | None:
        """The node-local piece of ``seg`` as a run will ask for it: every group's anchors fed from
        torch, typed as the ONNX model declares them (None when a type is unknown)."""
        p = self.p
        groups = self._local_groups(seg)
        types: dict[str, int] = {}
        for g in groups:
            for a in g.anchors:
                types[ANCHOR + a] = p.index.types[a].elem_type if a in p.index.types else 0
            for c in g.constants:
                if self._is_big(c):
                    types[c] = p.index.initializers[c].data_type
        if not groups or not all(types.values()):
            return None
        return self._local_piece(seg, groups, types)

    def _is_big(self, name: str) -> bool:
        return self.p.index.initializer_numel(name) > SMALL_INITIALIZER

    def _run_local_one_by_one(self, groups, feeds) -> dict[str, np.ndarray]:
        out = {}
        for g in groups:
            sub = {ANCHOR + a: feeds[ANCHOR + a] for a in g.anchors}
            sub.update({c: feeds[c] for c in g.constants if c in feeds})
            types = {k: numpy_elem_type(v) for k, v in sub.items()}
            key = ("local1", g.value, tuple(sorted(types.items())))
            self.used.append(key)
            try:
                fn = self.p.compiled(self.rt, key, lambda: local_model(self.p.index, [g], types)[0])
                out[g.value] = self.cancel.call(fn, sub, [g.output_name(0)])[0]
            except Exception:
                self.cancel.check(f"at the node-local run of ONNX value {g.value!r}")
                continue
        return out

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
        shapes: list[tuple[Record, str]] = []  # (record of a reshaped alias, the torch value's shape)
        for o, fx_name, fields, aliases in p.segment_records(seg.start, seg.end):
            rec = Record(*fields)
            if fx_name is None:  # ONNX only
                rec.status = R.ONE_SIDED
                rec.comment = "ONNX only"
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
        if local:  # (an alias's torch value is its twin's: the same node-local run measures it)
            self._local_errors([(rec, fx, o) for rec, fx, o in records
                                if o in local and fx is not None and rec.status != R.ERROR], local)
        reset, exc = self.reset, self.exc
        for rec, fx_name, o in records:
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

    def _local_errors(self, items: list[tuple[Record, str, str]], local: dict[str, np.ndarray]) -> None:
        """err_local: the torch value against the ONNX node run on torch inputs."""
        env, reshaped = self.runner.env, self.p.alignment.reshaped
        pairs, recs = [], []
        for rec, fx_name, o in items:
            try:
                got = np.asarray(local[o]).reshape(self.onnx_shapes.get(o, np.shape(local[o])))
                expected = as_numpy(env[fx_name])
                if rec.ep_name in reshaped:
                    expected = expected.reshape(got.shape)
            except (RuntimeError, ValueError, TypeError):
                continue
            if same_shape(expected, got):
                pairs.append((expected, got))
                recs.append(rec)
        for rec, err in zip(recs, compute_errors_many(pairs, atol=self.atol, rtol=self.rtol,
                                                                   scratch=self.scratch)):
            # a node turning -inf into +inf on torch inputs creates an error too
            rec.err_local = err.err_abs if not err.err_nan else float("inf")

    def _free_onnx(self, seg: Segment) -> None:
        outputs = set(self.p.index.outputs)
        for name in list(seg.inputs) + list(seg.outputs):
            if name in outputs:
                continue
            if self.p.last_reader.get(name, -1) < seg.end and name in self.onnx_env:
                del self.onnx_env[name]

    # -- the whole run ---------------------------------------------------------------------------
    def records(self) -> Iterator[Record]:
        self.cancel.start()
        try:  # (in place, not a nested generator: every record would pass through one more frame)
            p = self.p
            self.runner.feed(self.flat)
            # Sessions kept: compile them all ahead; otherwise one segment ahead, each dropped once done.
            self._compile_ahead(0, None if self.keep_sessions else 2)
            yield from self._input_records()
            yield from self._weight_records()
            for s, (a, b) in enumerate(self.ranges):
                self.cancel.check(lambda: where_in(p.index, a, a + 1).replace("at ", "before ", 1))
                self.current_segment = s - 1
                if not self.keep_sessions and s:
                    self._compile_ahead(s + 1, s + 2)
                seg = p.segment(a, b)
                started = self._start_segment(seg) if self.alongside[s] else None
                yield from self._advance_fx(self.fx_need[s])
                seconds = self._run_segment(seg, started)
                self.current_segment = s
                yield from self._segment_records(seg, seconds)
                self._free_onnx(seg)
                self._release_fx(self.release_at[s])
                if not self.keep_sessions:
                    p.forget(self.rt, self.used)
                self.used.clear()
                if sum(p.node_bytes[a:b]) >= TRIM_BYTES:
                    _return_freed_memory()
            self.cancel.check("before the last FX nodes and the outputs")
            yield from self._advance_fx(len(p.fx_nodes))
            yield from self._output_records()
            _return_freed_memory()
        finally:
            self.cancel.finish()

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
                yield self._compare(rec, value, arr)

    def _weight_records(self) -> Iterator[Record]:
        """Weights measured a batch at a time (a few vectorized passes for many small weights; the
        batch is bounded so that transposed copies never add up to the weights' size)."""
        p = self.p
        env, weights = self.runner.env, p.weights()
        batch: list[tuple[Record, object, object]] = []
        elements = 0
        for fields, placeholder, onnx_name in p.weight_records():
            rec = Record(*fields)
            if onnx_name is None:  # nothing to compare (see the record's comment)
                batch.append((rec, None, None))
                continue
            expected = env[placeholder]
            if weights.is_exactly(onnx_name, expected):  # the file's bits are torch's: errors all 0
                batch.append((self._identical(rec, expected), None, None))
                continue
            got = weights[onnx_name]
            batch.append((rec, expected, got))
            elements += got.size
            if elements >= BATCH_ELEMENTS:
                yield from self._measured(batch)
                batch, elements = [], 0
        yield from self._measured(batch)

    def _identical(self, rec: Record, value: torch.Tensor) -> Record:
        """``rec`` filled as measuring a value against its own bits (all finite) would fill it."""
        e = value.detach().numpy()  # (a view of a parameter may require grad)
        rec.ep_shape_type = rec.onnx_shape_type = _described(e)
        rec.err_abs = rec.err_rel = rec.err_dev = 0.0
        rec.err_nan = rec.err_h01 = rec.err_h001 = 0
        rec.n_elements, rec.within_tolerance, rec.status = e.size, True, R.OK
        rec.histogram = (e.size,) + (0,) * (len(HISTOGRAM_EDGES) - 1) if self.histogram else None
        if not e.size:
            rec.comment = _join(rec.comment, EMPTY_NOTE)
        return rec

    def _measured(self, batch: list[tuple[Record, object, object]]) -> Iterator[Record]:
        """Compare the pairs of ``batch`` (records without values stay as they are), then yield all."""
        self._compare_many([x for x in batch if x[1] is not None])
        for rec, expected, _ in batch:
            if expected is not None:
                self._check_exc(rec)
            yield rec

    def _output_records(self) -> Iterator[Record]:
        env = self.runner.env
        fx_out = program_outputs(self.p.decomposed_ep)
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
                rec = self._compare(rec, expected if isinstance(expected, torch.Tensor) else torch.tensor(expected),
                                    self._onnx_value(onnx_name))
                self._check_exc(rec)
            yield rec


def _release_plan(p: Prepared, ranges: list[tuple[int, int]], node_local: bool) -> tuple:
    """When torch values may go, for a run cut into ``ranges`` (worked out once per cut):
    (segment of each ONNX node, FX value -> last segment comparing it or feeding a node-local group
    with it, per segment the last FX position it needs, per segment the FX values it releases)."""
    idx = p.index
    segment_of_node = [0] * len(idx.nodes)
    for s, (a, b) in enumerate(ranges):
        segment_of_node[a:b] = [s] * (b - a)
    # The engine's own hold on torch values: until the segment that compares them (or feeds them to a
    # node-local group) is done.
    fx_release: dict[str, int] = {}
    fx_need: list[int] = [-1] * len(ranges)
    for fx_name, pair in p.alignment.pairs.items():
        v = pair.onnx_value
        if v in idx.producer:
            s = segment_of_node[idx.producer[v]]
            fx_release[fx_name] = max(fx_release.get(fx_name, -1), s)
            fx_need[s] = max(fx_need[s], p.fx_position[fx_name])
            if node_local:
                g = p.group(v)
                if g is not None:
                    for a in g.anchors:
                        f = p.alignment.onnx_to_fx[a]
                        fx_release[f] = max(fx_release.get(f, -1), s)
    for fx_name, v in p.alignment.alias_of.items():
        if fx_name in p.alignment.duplicate_of or fx_name in p.alignment.reshaped:
            continue  # measured with its twin's torch value
        s = segment_of_node[idx.producer[v]]
        fx_release[fx_name] = max(fx_release.get(fx_name, -1), s)
        fx_need[s] = max(fx_need[s], p.fx_position[fx_name])
    for fx_name, _ in p.alignment.output_pairs:
        if fx_name:
            fx_release[fx_name] = len(ranges)  # kept for the output records
    release_at: list[list[str]] = [[] for _ in range(len(ranges) + 1)]
    for name, s in fx_release.items():
        release_at[min(s, len(ranges))].append(name)
    # whether the FX stretch computed for each segment runs on one thread (small ops only)
    single, done = [], -1
    for need in fx_need:
        single.append(all(i in p.small_fx_nodes for i in range(done + 1, need + 1)))
        done = max(done, need)
    return segment_of_node, fx_release, fx_need, release_at, single


def _load_malloc_trim():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _load_malloc_trim()


# A segment handing back at least this many bytes hands freed memory back to the system when done.
# Below it, the system's pages cost more to fault in again (the next segment reuses them) than the
# memory saved: on the tiny benchmark model, trimming after every segment cost 8% of the time
# (15% on the mid one) for 1-2 MB of peak.
TRIM_BYTES = 32 << 20


def _return_freed_memory() -> None:
    """glibc keeps freed blocks below its (growing) mmap threshold, and each thread's blocks in its
    own arena: after a big segment, and at the end of a run, hand what was freed back to the system,
    so that memory follows the values alive, not the run's history."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


_SHAPE_TYPES: dict[tuple, str] = {}
_DESCRIBED: dict[tuple, str] = {}  # (numpy dtype, shape) -> shape text, for the common case


def _shape_type(code: int, shape: tuple) -> str:
    """``T1s2x16x64``: formatted once per distinct (type, shape), a model has few of them."""
    key = (code, shape)
    text = _SHAPE_TYPES.get(key)
    if text is None:
        if len(_SHAPE_TYPES) > 4096:
            _SHAPE_TYPES.clear()
        text = _SHAPE_TYPES[key] = f"T{code}s{'x'.join(map(str, shape))}"
    return text


def _described(e: np.ndarray) -> str:
    """``_shape_type`` of a numpy array, looked up by (dtype, shape): the common case."""
    key = (e.dtype, e.shape)
    text = _DESCRIBED.get(key)
    if text is None:
        text = _DESCRIBED[key] = _shape_type(numpy_elem_type(e), e.shape)
    return text


def _numpy_of(value) -> np.ndarray:
    """``as_numpy`` with a fast path for the common case, a plain CPU tensor numpy can read."""
    if type(value) is torch.Tensor:
        try:
            return value.numpy()
        except (RuntimeError, TypeError):  # autograd, another device, bfloat16, conjugate or negative bit
            pass
    return as_numpy(value)


def _failed(rec: Record, why: str) -> tuple[Record, None, None]:
    """``rec`` marked as an error (nothing to compare), as an entry of a segment's record list."""
    rec.status = R.ERROR
    rec.comment = _join(rec.comment, why)
    return rec, None, None


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a and b else (a or b)
