"""Inner values of a lockstep run (``InnerValues``): the ONNX values inside a translation compared with the finer torch
reference of their FX node (``align/inner_pairs.py``), run on the node's torch arguments.

A pair beyond tolerance is judged like any: the same finer reference run in float64 decides whether
it is rounding (``engine/noise.py``'s rule). Masked positions compare as equal whether a side writes
-inf or the lowest finite number. A node-local run gives ``err_local`` (the translation on torch's
inputs, ``node_local=True``). Inner values never become sources of the culprit finder's trace: their
FX node's own pair does.
"""

from __future__ import annotations

import numpy as np
import torch

from sbs_widget import records as R
from sbs_widget.dtypes import numpy_elem_type
from sbs_widget.engine.local_runs import LocalRuns
from sbs_widget.engine.measure import Measurer, _join
from sbs_widget.engine.metrics import compute_errors_many, same_shape
from sbs_widget.engine.node_local import ANCHOR, inner_output_name, local_model
from sbs_widget.engine.noise import epsilon, judge, largest
from sbs_widget.engine.onnx_side import OnnxSide
from sbs_widget.engine.prepared import PreparedPair
from sbs_widget.engine.reference import upcast
from sbs_widget.engine.verdicts import Judge
from sbs_widget.records import Record


class InnerValues:
    """The inner values of a lockstep run. ``finer``: finer values of the segment being measured, by
    FX node; ``apart``: its inner values recomputed apart (half precision); both dropped after it
    (``clear``)."""

    def __init__(self, p: PreparedPair, onnx: OnnxSide, local: LocalRuns, measurer: Measurer, judge: Judge):
        self.p, self.onnx, self.local, self.measurer, self.judge = p, onnx, local, measurer, judge
        self.finer: dict[tuple, object] = {}
        self.apart: dict[str, object] = {}

    def clear(self) -> None:
        self.finer.clear()
        self.apart = {}

    def _finer_values(self, program: str, exact: bool = False) -> dict | tuple[str, str]:
        """The paired values of a finer reference (``InnerPlan.finer[program]``) on its torch arguments
        (``exact``: in float64), or (the status its records take, why) when there are none."""
        key = (program, exact)
        cache = self.finer
        if key in cache:
            return cache[key]
        finer = self.p.inner.finer[program]
        env = self.judge.with_inputs(self.judge.fx_env)
        missing = [a for a in finer.args if a not in env]
        if missing:
            cache[key] = (R.ERROR, f"torch value {missing[0]!r} unavailable (an upstream FX node failed)")
            return cache[key]
        # contiguous: the trace's views assume the strides it saw
        args = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in (env[a] for a in finer.args)]
        module = finer.module_for(args)
        if module is None:
            cache[key] = (R.ONE_SIDED, f"not compared: {finer.label} takes another form at these shapes")
            return cache[key]
        if exact:
            args = [upcast(a) for a in args]
        try:
            with torch.inference_mode():
                outs = module(*args)
            cache[key] = dict(zip(finer.names, outs))
        except Exception as e:  # a reference that fails on these values: its records say so
            cache[key] = (R.ERROR, f"the finer reference failed: {type(e).__name__}: {str(e)[:200]}")
        return cache[key]

    def recompute_apart(self, values: list[str], torch_side: bool) -> dict:
        """(half-precision programs) ``values``, inner values, recomputed apart by their translations'
        ONNX nodes, fed the ONNX side's values of the translations' inputs (``torch_side``: torch's,
        for err_local): handed back by the lockstep's segments, they would be rounded to float16 where
        onnxruntime keeps float32 between nodes, and change what follows them."""
        p = self.p
        plan, twins = p.inner, p.alignment.onnx_to_fx
        groups = []
        for fx in dict.fromkeys(plan.pairs[o].fx for o in values):
            g = p.group(plan.group_value[fx])
            if g is not None and g not in groups:
                groups.append(g)
        inner = {g.value: [x for x in xs if x in values] for g, xs in
                 ((g, self.local.inner_outputs([g]).get(g.value, [])) for g in groups)}
        inner = {k: xs for k, xs in inner.items() if xs}
        groups = [g for g in groups if g.value in inner]
        feeds: dict[str, np.ndarray] = {}
        env, onnx = self.judge.fx_env, self.onnx
        try:
            for g in groups:
                for a in g.anchors:
                    if torch_side:
                        feeds[ANCHOR + a] = onnx.to_feed(env[twins[a]], a)
                    else:
                        feeds[ANCHOR + a] = onnx.value(a)
                for c in g.constants:
                    if self.local.is_big(c):
                        feeds[c] = p.weights()[c]
        except (KeyError, TypeError, ValueError):
            return {}
        types = {k: numpy_elem_type(v) for k, v in feeds.items()}
        names, wanted = [], []
        for k, g in enumerate(groups):
            names += [inner_output_name(k, x) for x in inner[g.value]]
            wanted += inner[g.value]
        key = ("inner", tuple(g.value for g in groups), tuple(sorted(types.items())))
        onnx.used.append(key)
        try:
            fn = p.compiled(onnx.rt, key, lambda: local_model(p.index, groups, types, inner, values=False)[0])
            return dict(zip(wanted, onnx.cancel.call(fn, feeds, names)))
        except Exception:  # (a translation that cannot run apart: its inner values say so)
            onnx.cancel.check("at the inner values of a segment")
            return {}

    def item(self, rec: Record, o: str) -> tuple[Record, object, object]:
        """``(record, torch reference value, ONNX value)`` to measure, or the record marked why not
        (then the last two are None)."""
        pair = self.p.inner.pairs[o]
        rec.inner_of, rec.inner_op = pair.fx, pair.op
        values = self._finer_values(pair.key)
        if not isinstance(values, dict):
            return self._inner_failed(rec, *values)
        got = self.onnx.env.get(o, self.apart.get(o))
        if got is None and o in self.p.index.initializers:
            got = self.p.weights()[o]
        if got is None:
            return self._inner_failed(rec, R.ERROR, self.onnx.state.errors.get(o, "ONNX value unavailable"))
        if pair.constant:  # the scalar or constant the reference uses there, in the ONNX value's type
            ref = pair.literal if pair.literal is not None else values.get(pair.finer)
            if isinstance(ref, torch.Tensor) and ref.numel() != 1 and ref.numel() != np.size(got):
                return self._inner_failed(rec, R.ONE_SIDED, "not compared: sizes differ from the reference's")
            ref = ref.detach().double().numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref, np.float64)
            got = np.asarray(got)
            with np.errstate(over="ignore"):
                expected = np.broadcast_to(ref.reshape(-1)[0] if ref.size == 1 else ref.reshape(got.shape), got.shape)
                return rec, torch.from_numpy(np.ascontiguousarray(expected.astype(got.dtype))), got
        expected = values.get(pair.finer)
        if not isinstance(expected, torch.Tensor):
            return self._inner_failed(rec, R.ONE_SIDED, "not compared: the finer reference gives no tensor here")
        expected = expected.detach()  # (a view of a parameter, such as its transpose, requires grad)
        shape = tuple(np.shape(got))
        if tuple(expected.shape) != shape:
            if pair.exact_shape or expected.numel() != int(np.prod(shape)):
                rec.status = R.ONE_SIDED
                rec.comment = _join(rec.comment, f"not compared: shapes differ, reference {tuple(expected.shape)} "
                                                 f"vs ONNX {shape}")
                return rec, None, None
            expected = expected.reshape(shape)
        return rec, expected, got

    @staticmethod
    def _inner_failed(rec: Record, status: str, why: str) -> tuple[Record, None, None]:
        rec.status = status
        rec.comment = _join(rec.comment, why)
        return rec, None, None

    def verdicts(self, items: list[tuple[Record, object, object]], local: dict) -> None:
        """err_local from the node-local run, and verdicts on the pairs beyond tolerance."""
        pairs, recs = [], []
        for rec, expected, got in items:
            o = rec.onnx_name
            if o in local:
                g = np.asarray(local[o]).reshape(np.shape(got))
                e = expected.numpy() if isinstance(expected, torch.Tensor) else np.asarray(expected)
                if same_shape(e, g):
                    pairs.append((e, g))
                    recs.append(rec)
        atol, rtol = self.measurer.tolerance
        for rec, err in zip(recs, compute_errors_many(pairs, atol=atol, rtol=rtol, scratch=self.measurer.scratch)):
            rec.err_local = err.err_abs if not err.err_nan else float("inf")
        for rec, expected, got in items:
            if rec.status == R.MISMATCH and expected.dtype.is_floating_point:
                self._judge_one_inner(rec, expected, got, local.get(rec.onnx_name))

    def _judge_one_inner(self, rec: Record, expected: torch.Tensor, got, local) -> None:
        big = float(torch.finfo(expected.dtype).max)
        e = expected.double().clamp(-big, big)  # -inf and the lowest finite number both mean 'masked'
        g = np.clip(np.asarray(got, dtype=np.float64), -big, big)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(g - e.numpy())
            atol, rtol = self.measurer.tolerance
            within = (diff <= atol + rtol * np.abs(e.numpy())) | (np.isnan(g) & np.isnan(e.numpy()))
        if within.all():
            rec.status = R.OK
            rec.comment = _join(rec.comment, "within tolerance once -inf and the lowest finite number are read "
                                             "alike (masked positions)")
            return
        if self.p.inner.pairs[rec.onnx_name].constant:  # copied, not computed: any difference stands
            label = self.p.inner.finer[self.p.inner.pairs[rec.onnx_name].key].label
            what = f"{g.reshape(-1)[0]:.6g} where {label} uses {e.reshape(-1)[0].item():.6g}" if g.size == 1 else \
                f"{int((~within).sum())} of {g.size} elements differ from the ones {label} uses"
            rec.comment = _join(rec.comment, what)
            return
        exact = self._finer_values(self.p.inner.pairs[rec.onnx_name].key, exact=True)
        reference = exact.get(self.p.inner.pairs[rec.onnx_name].finer) if isinstance(exact, dict) else None
        if not isinstance(reference, torch.Tensor):
            rec.comment = _join(rec.comment, "no float64 reference: the tolerance rule stands")
            return
        value = local if local is not None else got
        try:
            verdict = judge(e, np.clip(np.asarray(value, dtype=np.float64), -big, big),
                            reference.double().clamp(-big, big).reshape(e.shape), epsilon(expected), largest(expected))
        except (ValueError, TypeError, RuntimeError) as err:
            rec.comment = _join(rec.comment, f"no float64 verdict ({err}): the tolerance rule stands")
            return
        rec.err_torch, rec.err_onnx, rec.ref_scale = verdict.err_torch, verdict.err_onnx, verdict.scale
        rec.local_noise = verdict.noise if local is not None else None
        if not verdict.noise:
            rec.noise = False
            rec.comment = _join(rec.comment, f"beyond rounding: {verdict.err_onnx:.3g} from the reference in float64 "
                                             f"where torch is {verdict.err_torch:.3g} from it")
        elif self.judge.has_source_upstream(rec.inner_of):
            rec.noise = False
            rec.comment = _join(rec.comment, "rounds like torch, but its FX node inherits a difference beyond "
                                             "rounding from upstream")
        else:
            rec.noise = True
            rec.status = R.NOISE
            rec.comment = _join(rec.comment, "rounding: as close to the reference in float64 as torch, and nothing "
                                             "beyond rounding upstream")

    def reset(self, rec: Record, o: str) -> None:
        """Downstream ONNX nodes read the finer reference's value instead of ``o``."""
        values = self._finer_values(self.p.inner.pairs[o].key)
        expected = values.get(self.p.inner.pairs[o].finer) if isinstance(values, dict) else None
        if not isinstance(expected, torch.Tensor):
            rec.comment = _join(rec.comment, "cannot reset: no torch reference value")
            return
        try:
            self.onnx.env[o] = self.onnx.to_feed(expected, o)
            rec.status = R.RESET
            rec.comment = _join(rec.comment, "reset: downstream ONNX nodes read the finer torch reference's value")
        except (TypeError, ValueError) as e:
            rec.comment = _join(rec.comment, f"cannot reset: {e}")
