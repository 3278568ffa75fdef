"""Node-local errors of a lockstep run: each ONNX node (or fused group) of a segment run again on
torch inputs, all groups of a segment in one session."""

from __future__ import annotations

from typing import Callable

import numpy as np

from sbs_widget.dtypes import numpy_elem_type
from sbs_widget.engine.cancel import where_in
from sbs_widget.engine.measure import Measurer
from sbs_widget.engine.metrics import as_numpy, compute_errors_many, same_shape
from sbs_widget.engine.node_local import ANCHOR, LocalGroup, inner_output_name, local_model
from sbs_widget.engine.onnx_side import OnnxSide
from sbs_widget.engine.prepared import PreparedPair
from sbs_widget.engine.segments import SMALL_INITIALIZER, Segment
from sbs_widget.records import Record


class LocalRuns:
    """Node-local runs of a lockstep run, on the ONNX side's runtime, fed from the FX side's values."""

    def __init__(self, p: PreparedPair, onnx: OnnxSide, fx_env: dict, measurer: Measurer):
        self.p, self.onnx, self.fx_env, self.measurer = p, onnx, fx_env, measurer

    def run(self, seg: Segment, only: set[str] | None = None) -> dict[str, np.ndarray]:
        """Node-local values for the compared values of ``seg`` (one session for all groups), or for
        those in ``only``."""
        p, onnx = self.p, self.onnx
        env = self.fx_env
        groups = [g for g in self.groups_of(seg) if all(p.alignment.onnx_to_fx[a] in env for a in g.anchors)
                  and (only is None or g.value in only)]
        if not groups:
            return {}
        feeds: dict[str, np.ndarray] = {}
        try:
            for g in groups:
                for a in g.anchors:
                    if ANCHOR + a not in feeds:
                        feeds[ANCHOR + a] = onnx.to_feed(env[p.alignment.onnx_to_fx[a]], a)
                for c in g.constants:
                    if c not in feeds and self.is_big(c):
                        feeds[c] = p.weights()[c]
        except (TypeError, ValueError):
            return {}
        key, build = self._piece(seg, groups, {k: numpy_elem_type(v) for k, v in feeds.items()})
        onnx.used.append(key)
        inner = {} if p.pair.half else self.inner_outputs(groups)
        names = [g.output_name(k) for k, g in enumerate(groups)]
        values = [g.value for g in groups]
        for k, g in enumerate(groups):
            names += [inner_output_name(k, x) for x in inner.get(g.value, ())]
            values += inner.get(g.value, [])
        try:
            fn = p.compiled(onnx.rt, key, build)
            outs = onnx.cancel.call(fn, feeds, names)
        except Exception as e:  # a node-local group failed (or the run was stopped): one group at a time
            onnx.cancel.check(lambda e=e: where_in(p.index, seg.start, seg.end, e) + " (node-local run)")
            return self._one_by_one(groups, feeds)
        return dict(zip(values, outs))

    def inner_outputs(self, groups: list[LocalGroup]) -> dict[str, list[str]]:
        """Per group value, the paired values inside its translation (``align/inner_pairs.py``) the
        group computes: handed back too, for their err_local."""
        p, out = self.p, {}
        for g in groups:
            nodes = set(g.nodes)
            inside = [x for x in p.inner.values_of(p.alignment.onnx_to_fx.get(g.value, ""))
                      if p.index.producer.get(x) in nodes]
            if inside:
                out[g.value] = inside
        return out

    def groups_of(self, seg: Segment) -> list[LocalGroup]:
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

    def _piece(self, seg: Segment, groups: list[LocalGroup], types: dict[str, int]) -> tuple[tuple, Callable]:
        key = ("local", seg.start, seg.end, tuple(g.value for g in groups), tuple(sorted(types.items())))
        inner = {} if self.p.pair.half else self.inner_outputs(groups)
        return key, lambda: local_model(self.p.index, groups, types, inner)[0]

    def ahead(self, seg: Segment) -> tuple[tuple, Callable] | None:
        """The node-local piece of ``seg`` as a run will ask for it: every group's anchors fed from
        torch, typed as the ONNX model declares them (None when a type is unknown)."""
        p = self.p
        groups = self.groups_of(seg)
        types: dict[str, int] = {}
        for g in groups:
            for a in g.anchors:
                types[ANCHOR + a] = p.index.types[a].elem_type if a in p.index.types else 0
            for c in g.constants:
                if self.is_big(c):
                    types[c] = p.index.initializers[c].data_type
        if not groups or not all(types.values()):
            return None
        return self._piece(seg, groups, types)

    def is_big(self, name: str) -> bool:
        return self.p.index.initializer_numel(name) > SMALL_INITIALIZER

    def _one_by_one(self, groups: list[LocalGroup], feeds: dict) -> dict[str, np.ndarray]:
        out, onnx = {}, self.onnx
        for g in groups:
            sub = {ANCHOR + a: feeds[ANCHOR + a] for a in g.anchors}
            sub.update({c: feeds[c] for c in g.constants if c in feeds})
            types = {k: numpy_elem_type(v) for k, v in sub.items()}
            key = ("local1", g.value, tuple(sorted(types.items())))
            onnx.used.append(key)
            try:
                fn = self.p.compiled(onnx.rt, key, lambda: local_model(self.p.index, [g], types)[0])
                out[g.value] = onnx.cancel.call(fn, sub, [g.output_name(0)])[0]
            except Exception:
                onnx.cancel.check(f"at the node-local run of ONNX value {g.value!r}")
                continue
        return out

    def errors(self, items: list[tuple[Record, str, str]], local: dict[str, np.ndarray]) -> dict[int, float]:
        """err_local: the torch value against the ONNX node run on torch inputs. Returns, per record
        (``id``), the largest |torch value| (the scale ``verdicts`` reads ulps against)."""
        env, reshaped, shapes = self.fx_env, self.p.alignment.reshaped, self.onnx.state.shapes
        pairs, recs = [], []
        for rec, fx_name, o in items:
            try:
                got = np.asarray(local[o]).reshape(shapes.get(o, np.shape(local[o])))
                expected = as_numpy(env[fx_name])
                if rec.ep_name in reshaped:
                    expected = expected.reshape(got.shape)
            except (RuntimeError, ValueError, TypeError):
                continue
            if same_shape(expected, got):
                pairs.append((expected, got))
                recs.append(rec)
        scales = {}
        atol, rtol = self.measurer.tolerance
        for rec, err in zip(recs, compute_errors_many(pairs, atol=atol, rtol=rtol, scratch=self.measurer.scratch)):
            # a node turning -inf into +inf on torch inputs creates an error too
            rec.err_local = err.err_abs if not err.err_nan else float("inf")
            scales[id(rec)] = err.scale
        return scales
