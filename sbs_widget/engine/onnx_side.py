"""The ONNX side of a lockstep run (``OnnxSide``): segments compiled ahead, fed, run (in the runner thread or
this one), one node at a time after a failure, and their values freed."""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Callable

import numpy as np
import onnx
import torch

from sbs_widget.dtypes import ONNX_TO_NUMPY, numpy_elem_type
from sbs_widget.engine.background import renew, submit_if_idle
from sbs_widget.engine.cancel import Cancel, where_in
from sbs_widget.engine.prepared import PreparedPair
from sbs_widget.engine.run_state import OnnxState
from sbs_widget.engine.runtimes import Capabilities, Runtime, exact_numpy
from sbs_widget.engine.segments import TRANSPOSED, Segment, segment_bytes, segment_model
from sbs_widget.errors import RunCancelled


class OnnxSide:
    """Owns the ONNX side of a run: its values (``state``), the runtime, the sessions a segment used."""

    def __init__(self, p: PreparedPair, runtime: Runtime, caps: Capabilities, cancel: Cancel, state: OnnxState,
                 fx_env: dict):
        self.p, self.rt, self.caps, self.cancel, self.state = p, runtime, caps, cancel, state
        self.fx_env = fx_env  # torch values: a failed node's outputs are replaced by their twins
        self.used: list[tuple] = []  # compiled pieces used by the current segment
        # A runtime that optimizes (deployed/runtime.py) says which values its graph no longer computes:
        # not asked for (that would stop the fusion), reported one-sided with why.
        self.vanished: dict[str, str] = caps.vanished_values(p.index.full_model()) \
            if caps.vanished_values is not None else {}
        self.hidden = frozenset(self.vanished.keys() - set(p.index.outputs))

    @property
    def env(self) -> dict:
        return self.state.env

    def segment(self, a: int, b: int) -> Segment:
        """Segment ``[a, b)`` as this runtime runs it (values it does not compute left out)."""
        return self.p.segment(a, b, self.hidden, self.caps.weights_in_segments)

    def value(self, name: str):
        if name in self.state.env:
            return self.state.env[name]
        if name in self.p.index.initializers:
            return self.p.weights()[name]
        raise KeyError(name)

    def to_feed(self, value, like_name: str):
        """A torch value as the ONNX side expects value ``like_name`` (dtype and shape)."""
        if not isinstance(value, torch.Tensor):
            value = torch.tensor(value)
        arr = exact_numpy(value)
        vt = self.p.index.types.get(like_name)
        if vt is not None and vt.elem_type in ONNX_TO_NUMPY and arr.dtype != ONNX_TO_NUMPY[vt.elem_type]:
            arr = arr.astype(ONNX_TO_NUMPY[vt.elem_type])
        shape = self.state.shapes.get(like_name)
        if shape is not None and tuple(arr.shape) != tuple(shape) and arr.size == int(np.prod(shape)):
            arr = arr.reshape(shape)
        return np.ascontiguousarray(arr)

    # -- the ONNX side ---------------------------------------------------------------------------
    def _segment_piece(self, seg: Segment, types: dict[str, int]) -> tuple[tuple, Callable[[], onnx.ModelProto]]:
        key = ("seg", seg.start, seg.end, tuple(sorted(types.items())))
        return key, lambda: self._segment_for_runtime(seg, types)

    def _segment_for_runtime(self, seg: Segment, types: dict[str, int]):
        if self.caps.accepts_serialized:
            return segment_bytes(self.p.index, seg, types)
        return segment_model(self.p.index, seg, types)

    def compile_ahead(self, ranges: list[tuple[int, int]], local_ahead: Callable | None) -> None:
        """Start compiling the segments ``ranges`` of this run, typed as the ONNX model declares its
        values (a segment fed other types at run time is compiled again for them); ``local_ahead``:
        a segment's node-local piece (``local_runs.py``), compiled with it."""
        if not self.caps.compiles_in_background:
            return
        p = self.p
        pieces, weights = [], p.weights()
        for a, b in ranges:
            seg = self.segment(a, b)
            types = {x: p.index.types[x].elem_type for x in seg.inputs if x in p.index.types}
            for x in [x for x in types if x in p.index.initializers and weights.transposed_source(x) is not None]:
                types[TRANSPOSED + x] = types.pop(x)  # as the run will feed it (_segment_feeds)
            if seg.outputs and len(types) == len(seg.inputs) and all(types.values()):
                pieces.append(self._segment_piece(seg, types))
            local = local_ahead(seg) if local_ahead is not None else None
            if local is not None:  # (built here, compiled in the background: most of a node-local run)
                pieces.append(local)
        p.cache.compile_ahead(self.rt, pieces)

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
        feeds, env, initializers, weights = {}, self.state.env, self.p.index.initializers, self.p.weights()
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

    def start(self, seg: Segment) -> Future | None:
        """Start running ``seg`` in the runner thread, while the FX side computes the same stretch of
        the model (onnxruntime and torch kernels release the GIL); None when it cannot run whole."""
        job = self._segment_job(seg)
        return submit_if_idle("sbs-run", job) if job is not None else None

    def run(self, seg: Segment, started: Future | None = None) -> float:
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
                self.state.env[o] = arr
                self.state.shapes[o] = getattr(arr, "shape", ())
            return seconds
        self._run_nodes_one_by_one(seg)
        return time.perf_counter() - begin

    def _available(self, name: str) -> bool:
        return name in self.state.env or name in self.p.index.initializers

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
                feeds = {x: self.value(x) for x in one.inputs}
                types = {x: numpy_elem_type(a) for x, a in feeds.items()}
                key = ("seg", i, i + 1, tuple(sorted(types.items())))
                self.used.append(key)
                try:
                    fn = p.compiled(self.rt, key, lambda: self._segment_for_runtime(one, types))
                    outs = self.cancel.call(fn, feeds, one.outputs)
                    for o, arr in zip(one.outputs, outs):
                        self.state.env[o] = arr
                        self.state.shapes[o] = getattr(arr, "shape", ())
                except Exception as e:
                    self.cancel.check(lambda e=e: where_in(p.index, i, i + 1, e))
                    error = f"{self.rt.name} failed on {node.op_type} node {node.name!r}: {type(e).__name__}: " \
                            f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
            if error is None:
                continue
            for o in node.output:
                if not o:
                    continue
                self.state.errors[o] = error
                fx_name = p.alignment.onnx_to_fx.get(o)
                if fx_name is not None and fx_name in self.fx_env:
                    try:
                        self.state.env[o] = self.to_feed(self.fx_env[fx_name], o)
                        self.state.errors[o] = error + "; downstream nodes read the torch value"
                    except (TypeError, ValueError):
                        pass

    def free(self, seg: Segment) -> None:
        """Drop the values no later segment reads (model outputs stay)."""
        outputs, last_reader, env = set(self.p.index.outputs), self.p.schedule.last_reader, self.state.env
        for name in list(seg.inputs) + list(seg.outputs):
            if name in outputs:
                continue
            if last_reader.get(name, -1) < seg.end and name in env:
                del env[name]
