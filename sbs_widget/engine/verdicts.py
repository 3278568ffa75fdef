"""Noise or mismatch, for the pairs of a lockstep run that fail the tolerance test.

A pair beyond tolerance is judged in two steps:

1. Does its node *create* a difference beyond rounding? The ONNX node (or its group) run on torch's
   inputs, and torch's own value, are both measured against the FX node rerun in float64 on the same
   inputs (``reference.py``, rule in ``noise.py``). A node that does is a *source*.
2. A pair whose node creates nothing beyond rounding differs only by what it inherits. It is ``noise``
   when no source lies upstream of it in the program (the difference is rounding carried along),
   ``mismatch`` otherwise (it carries a real difference from upstream).

Sources are also looked for below tolerance: a pair within tolerance whose node-local value is more
than ``SUSPECT_ULPS`` units in the last place (of the value's scale) off torch's gets the same float64
check, so that a fault too small to fail the tolerance where it is born, yet grown beyond it
downstream, still makes the downstream pairs mismatches. Inputs and weights that differ are sources;
a weight (also one stored transposed) that differs beyond rounding of its type is a mismatch
even within tolerance. Outputs beyond tolerance are also measured against the whole program run in
float64; constant-folded values against their computation from the weights in float64.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

import numpy as np
import torch

from sbs_widget import records as R
from sbs_widget.engine.measure import _join
from sbs_widget.engine.noise import Verdict, epsilon, judge, largest
from sbs_widget.engine.reference import FROM_PLACEHOLDERS, NoReference, ProgramShadow, reference_of, upcast
from sbs_widget.engine.run_state import JudgeState
from sbs_widget.records import Record

if TYPE_CHECKING:
    from sbs_widget.engine.prepared import Prepared

SUSPECT_ULPS = 64  # node-local |diff| beyond this many ulps of the value's scale: checked in float64
# A pair beyond tolerance whose node, on torch's inputs, agrees with torch within this many ulps of the
# value's scale creates nothing beyond rounding: no float64 rerun needed (most inherited differences).
SAME_ULPS = 2


class Judge:
    """Owns the verdicts of a run: which pairs beyond tolerance are noise, which mismatches, and the
    sources found so far (``state.sources``: the FX nodes and placeholders where a difference beyond
    rounding is born)."""

    def __init__(self, p: Prepared, flat: list, state: JudgeState, fx_env: dict, onnx_env: dict,
                 reset: frozenset[str]):
        self.p, self.flat, self.state = p, flat, state
        self.fx_env, self.onnx_env = fx_env, onnx_env  # the sides' values (read only)
        self._downstream: dict[str, bool] = {}  # FX name -> a source upstream (valid for len(sources))
        self._downstream_at = 0
        # values reset to torch's: downstream ONNX nodes read torch's value, no difference passes them
        to_fx = p.alignment.onnx_to_fx
        self._cuts = {to_fx[v] for v in reset if v in to_fx}
        self._placeholders: dict | None = None
        self._shadow: ProgramShadow | None = None  # the program in float64, once a verdict needs it
        self._no_shadow = ""  # why there is none (memory, no float64 kernel)

    @property
    def sources(self) -> set[str]:
        return self.state.sources

    def restore(self, sources: set[str]) -> None:
        """Go on from a kept state (``restart.py``): its sources, the memo forgotten."""
        self.state.sources = set(sources)
        self._downstream.clear()
        self._downstream_at = -1

    def with_inputs(self, env: dict) -> collections.ChainMap:
        """``env`` and, behind it, the run's inputs and weights by placeholder name (the runner frees
        them from ``env`` after their last reader; the caller still holds them)."""
        if self._placeholders is None:
            names = [n.name for n in self.p.fx_nodes if n.op == "placeholder"]
            self._placeholders = dict(zip(names, self.flat))
        return collections.ChainMap(env, self._placeholders)

    def add_source(self, fx_name: str | None) -> None:
        if fx_name is not None:
            self.state.sources.add(fx_name)

    def has_source_upstream(self, fx_name: str) -> bool:
        """Whether a source lies upstream of FX node ``fx_name`` (itself excluded), through the FX
        program's data flow. Memoized until a new source appears (rare: real faults only)."""
        if self._downstream_at != len(self.sources):
            self._downstream.clear()
            self._downstream_at = len(self.sources)
        memo, sources, p = self._downstream, self.sources, self.p
        node = p.fx_nodes[p.fx_position[fx_name]]
        stack = [(n, False) for n in node.all_input_nodes]
        while stack:  # iterative post-order: deep programs would overflow recursion
            n, expanded = stack.pop()
            if n.name in memo:
                continue
            if expanded:
                memo[n.name] = n.name not in self._cuts and (
                    n.name in sources or any(memo.get(m.name, False) for m in n.all_input_nodes))
                continue
            stack.append((n, True))
            stack.extend((m, False) for m in n.all_input_nodes if m.name not in memo)
        return any(memo[n.name] for n in node.all_input_nodes)

    def judge_segment(self, records: list[tuple[Record, str | None, str | None]], local: dict[str, np.ndarray],
                       local_scale: dict[int, float]) -> None:
        """Judge the records of one segment (in node order: sources upstream are known first)."""
        env, onnx_env, p = self.fx_env, self.onnx_env, self.p
        references: dict[tuple, torch.Tensor | NoReference] = {}
        mismatch = R.MISMATCH
        # the pairs to judge: beyond tolerance, or with a node-local error (maybe a source below it);
        # on a clean run without node-local values, none (this loop runs for every record of a run)
        todo = [x for x in records if x[0].status == mismatch or x[0].err_local]
        direct = {id(rec): fx for rec, fx, o in todo if self._against_program(rec, fx, o, env, local_scale)}
        shadow = self._shadow_for(list(direct.values()))
        for rec, fx_name, o in todo:
            if fx_name is None or o is None or rec.status not in (R.OK, R.MISMATCH) or rec.kind != R.KIND_NODE:
                continue
            if fx_name not in env or not isinstance(env[fx_name], torch.Tensor) or \
                    not env[fx_name].dtype.is_floating_point:
                if rec.status == R.MISMATCH:
                    self.add_source(fx_name)  # integers, bools: compared exactly, never rounding
                continue
            beyond = rec.status == R.MISMATCH
            scale = local_scale.get(id(rec))
            if not beyond and not self._suspect(rec, env[fx_name], scale):
                continue
            if beyond and o in local and scale is not None and rec.err_local is not None and \
                    rec.err_local <= SAME_ULPS * epsilon(env[fx_name]) * scale:
                self.inherited(rec, fx_name, f"on torch's inputs the ONNX side agrees with torch within "
                                              f"{SAME_ULPS} ulps of the value's scale")
                continue
            if shadow is not None and id(rec) in direct and \
                    self._as_exact_as_torch(rec, fx_name, env[fx_name], onnx_env.get(o), shadow):
                continue
            got = local.get(o)
            stop = p.reference_stop(o) if got is not None else frozenset()
            if got is None:  # no node-local value: the ONNX value itself (what it inherits counts too)
                got = onnx_env.get(o)
            key = (fx_name, stop)  # (an alias is measured with its holder's value)
            reference = references.get(key)
            if reference is None:
                try:
                    reference = reference_of(p.fx_nodes[p.fx_position[fx_name]], self.with_inputs(env), stop)
                except NoReference as e:
                    reference = e
                references[key] = reference
            if isinstance(reference, NoReference):
                if beyond:
                    rec.comment = _join(rec.comment, f"no float64 reference ({reference}): the tolerance rule stands")
                    self.add_source(fx_name)
                continue
            try:
                verdict = judge(env[fx_name], got, reference, epsilon(env[fx_name]), largest(env[fx_name]))
            except (ValueError, TypeError, RuntimeError) as e:
                if beyond:
                    rec.comment = _join(rec.comment, f"no float64 verdict ({e}): the tolerance rule stands")
                    self.add_source(fx_name)
                continue
            self._apply(rec, fx_name, verdict, beyond)
        if shadow is not None:
            shadow.settle()

    def _against_program(self, rec: Record, fx_name: str | None, o: str | None, env: dict,
                         local_scale: dict[int, float]) -> bool:
        """A pair beyond tolerance whose node, on torch's inputs, rounds within ``SUSPECT_ULPS`` of its
        scale (as pairs within tolerance are let through): before its node is rerun in float64, its
        value is measured against the program's own in float64 (all it inherits included)."""
        if rec.status != R.MISMATCH or rec.kind != R.KIND_NODE or fx_name is None or o is None or \
                rec.err_local is None:
            return False
        value = env.get(fx_name)
        if not isinstance(value, torch.Tensor) or not value.dtype.is_floating_point:
            return False
        scale = local_scale.get(id(rec))
        return scale is not None and not self._suspect(rec, value, scale) and \
            not rec.err_local <= SAME_ULPS * epsilon(value) * scale  # (those need no float64 at all)

    def _as_exact_as_torch(self, rec: Record, fx_name: str, value: torch.Tensor, got, shadow: ProgramShadow) -> bool:
        """Whether the pair's ONNX value is as close to the program run in float64 as torch's: then the
        node, rounding within a few ulps on torch's inputs, is no source, and what the pair carries is
        rounding unless a source lies upstream (no float64 rerun of the node needed)."""
        exact = shadow.get(fx_name)
        if exact is None or got is None:
            return False
        try:
            verdict = judge(value, got, exact, epsilon(value), largest(value))
        except (ValueError, TypeError, RuntimeError):
            return False
        if not verdict.noise:
            return False
        rec.err_torch, rec.err_onnx, rec.ref_scale = verdict.err_torch, verdict.err_onnx, verdict.scale
        self.inherited(rec, fx_name, "onnxruntime as close to the program run in float64 as torch, and its node "
                                      f"agrees with torch on torch's inputs within {SUSPECT_ULPS} ulps of the scale")
        return True

    def _shadow_for(self, names: list[str]) -> ProgramShadow | None:
        """The program in float64 advanced to the FX nodes ``names`` (their values kept until the
        segment is judged), started on first need; None where it cannot run."""
        if not names or self._no_shadow:
            return None
        if self._shadow is None:
            why = self._too_big_for_float64()
            if why:
                self._no_shadow = why
                return None
            self._shadow = ProgramShadow(self.p.decomposed_ep, self.flat, self.p.schedule.fx_last_use,
                                         self.p.weight_files)
        position = self.p.fx_position
        self._shadow.advance(max(position[n] for n in names), keep=names)
        if self._shadow.failed is not None:
            self._no_shadow = f"no whole-program float64 run: {self._shadow.failed}"
            self._shadow = None
        return self._shadow

    def _suspect(self, rec: Record, value: torch.Tensor, scale: float | None) -> bool:
        """A pair within tolerance whose node-local value is far, in ulps, from torch's."""
        if rec.err_local is None or scale is None or not rec.err_local:
            return False
        return not rec.err_local <= SUSPECT_ULPS * epsilon(value) * scale

    def _apply(self, rec: Record, fx_name: str, verdict: Verdict, beyond: bool) -> None:
        rec.err_torch, rec.err_onnx, rec.ref_scale = verdict.err_torch, verdict.err_onnx, verdict.scale
        rec.local_noise = verdict.noise
        if not verdict.noise:  # the node itself creates a difference beyond rounding
            self.add_source(fx_name)
            rec.noise = False
            if beyond:
                rec.comment = _join(rec.comment, _beyond_rounding(verdict))
            return
        if beyond:
            self.inherited(rec, fx_name, "onnxruntime about as close to exact (float64) as torch")

    def inherited(self, rec: Record, fx_name: str, why: str) -> None:
        """A pair beyond tolerance whose node creates nothing beyond rounding: what it inherits decides."""
        rec.local_noise = True
        if self.has_source_upstream(fx_name):
            rec.noise = False
            rec.comment = _join(rec.comment, f"the node rounds like torch ({why}), but inherits a difference "
                                             "beyond rounding from upstream")
            return
        rec.noise = True
        rec.status = R.NOISE
        rec.comment = _join(rec.comment, f"rounding: {why}, and nothing beyond rounding upstream")

    def weight_beyond_rounding(self, rec: Record, expected, got) -> None:
        """A weight within tolerance whose ONNX copy is off by more than a few ulps of its own value:
        the file holds another weight (a fault the tolerance of a float16 program can hide)."""
        if not isinstance(expected, torch.Tensor) or not expected.dtype.is_floating_point:
            return
        try:
            verdict = judge(expected, got, upcast(expected), epsilon(expected))
        except (ValueError, TypeError, RuntimeError):
            return
        if not verdict.noise:
            rec.status, rec.noise, rec.local_noise = R.MISMATCH, False, False
            rec.err_torch, rec.err_onnx, rec.ref_scale = 0.0, verdict.err_onnx, verdict.scale
            rec.comment = _join(rec.comment, "within tolerance, but the ONNX file's weight differs from the "
                                             "program's beyond rounding")
            self.add_source(rec.ep_name)

    def judge_folded(self, items: list[tuple[Record, object, object]]) -> None:
        """Constant-folded values (a standardized weight, a mask) beyond tolerance: the exporter's
        optimizer computed them, the way it rounds; against the FX computation from the weights in
        float64, they are noise when as close to exact as torch's own value."""
        p = self.p
        placeholders = self.with_inputs({})
        for rec, expected, got in items:
            # (beyond tolerance only: folded tables such as rotary cos/sin differ by rounding on every
            # run, and a weight stored transposed is compared as a weight)
            if rec.status != R.MISMATCH or rec.err_nan or not isinstance(expected, torch.Tensor) or \
                    not expected.dtype.is_floating_point or rec.ep_name not in p.fx_position:
                continue
            try:
                reference = reference_of(p.fx_nodes[p.fx_position[rec.ep_name]], placeholders, FROM_PLACEHOLDERS)
                verdict = judge(expected, got, reference, epsilon(expected), largest(expected))
            except (NoReference, ValueError, TypeError, RuntimeError) as e:
                rec.comment = _join(rec.comment, f"no float64 verdict ({e}): the tolerance rule stands")
                continue
            rec.err_torch, rec.err_onnx, rec.ref_scale = verdict.err_torch, verdict.err_onnx, verdict.scale
            rec.noise = rec.local_noise = verdict.noise
            if verdict.noise:
                rec.status = R.NOISE
                rec.comment = _join(rec.comment, "rounding: the folded constant is as close to exact (float64, "
                                                 "from the weights) as torch's value")
            else:
                rec.comment = _join(rec.comment, _beyond_rounding(verdict).replace("on torch's inputs",
                                                                                   "from the weights"))

    def judge_outputs(self, items: list[tuple[Record, str | None, object, object]]) -> None:
        """The outputs beyond tolerance, judged on the whole program: torch's outputs and onnxruntime's
        measured against the program run in float64 from the same inputs (when it fits in memory).
        That also catches what no single node shows: a fault too small to be seen where it is born."""
        beyond = [x for x in items if x[0].status == R.MISMATCH and x[1] is not None and not x[0].err_nan
                  and isinstance(x[2], torch.Tensor) and x[2].dtype.is_floating_point]
        if not beyond:
            return
        references, why = self._program_reference([fx for _, fx, _, _ in beyond])
        for rec, fx_name, expected, got in beyond:
            upstream = fx_name in self.sources or self.has_source_upstream(fx_name)
            reference = references.get(fx_name)
            if reference is None:  # the sources alone decide
                rec.noise = not upstream
                if rec.noise:
                    rec.status = R.NOISE
                    rec.comment = _join(rec.comment, f"rounding: nothing beyond rounding upstream ({why})")
                continue
            try:
                verdict = judge(expected, got, reference, epsilon(expected), largest(expected))
            except (ValueError, TypeError, RuntimeError):
                continue
            rec.err_torch, rec.err_onnx, rec.ref_scale = verdict.err_torch, verdict.err_onnx, verdict.scale
            # noise only when both say so: no source upstream, and as close to exact as torch overall
            rec.noise = verdict.noise and not upstream
            if upstream:
                rec.comment = _join(rec.comment, "carries a difference beyond rounding from upstream")
            elif verdict.noise:
                rec.status = R.NOISE
                rec.comment = _join(rec.comment, "rounding: onnxruntime's output as close to the whole program "
                                                 "run in float64 as torch's")
            else:
                rec.comment = _join(rec.comment, _beyond_rounding(verdict).replace(
                    "on torch's inputs", "for the whole program"))

    def _program_reference(self, names: list[str]) -> tuple[dict[str, torch.Tensor], str]:
        """The whole program's values ``names`` in float64 (the shadow run to the end), or ``{}`` and
        why not."""
        shadow = self._shadow_for(names)
        if shadow is None:
            return {}, self._no_shadow
        shadow.advance(len(self.p.fx_nodes), keep=names)
        if shadow.failed is not None:
            return {}, f"no whole-program float64 run: {shadow.failed}"
        return {name: shadow.get(name) for name in names if shadow.get(name) is not None}, ""

    def _too_big_for_float64(self) -> str:
        p = self.p
        # weights are raised to float64 where read (one at a time); the live set all in float64
        largest = max((t.numel() * t.element_size() for t in p.decomposed_ep.state_dict.values()), default=0)
        need = (largest + 4 * p.schedule.live_bytes) * 8 // max(1, _smallest_float_size(p))
        available = available_memory()
        if available is not None and need > available // 2:
            return f"no whole-program float64 run: it needs ~{need / 2**30:.1f} GiB, {available / 2**30:.1f} free"
        return ""


def _smallest_float_size(p: Prepared) -> int:
    sizes = [d.itemsize for d in p.alignment.fx_dtypes if isinstance(d, torch.dtype) and d.is_floating_point]
    return min(sizes, default=4)


def available_memory() -> int | None:
    """Bytes the system can still hand out (MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _beyond_rounding(v: Verdict) -> str:
    if v.err_torch > 0:
        return (f"beyond rounding: onnxruntime {v.err_onnx:.2g} from exact (float64) on torch's inputs, "
                f"torch {v.err_torch:.2g} ({v.err_onnx / v.err_torch:.3g}x)")
    return f"beyond rounding: onnxruntime {v.err_onnx:.2g} from exact (float64) on torch's inputs, torch exact"
