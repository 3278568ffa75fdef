"""Greedy decoding driven on both sides, step by step, from one prepared pair.

Each step runs the torch program once (its graph module, eager) and the whole ONNX model twice, in one
session compiled once (shapes change every step, sessions do not):

- **closed loop**: the ONNX side feeds itself its own token and cache, as a deployed model does;
- **open loop**: the ONNX side gets torch's token and cache at every step, so an error that starts
  at step ``k`` shows at ``k`` whatever came before, told apart from a drift that accumulates. As long
  as the closed loop's tokens are torch's and its cache is within tolerance of torch's, feeding it
  torch's would change nothing the tolerance sees: the open loop is the closed loop (``open_shared``)
  and runs apart from the first step where they part.

Step 0 is the prompt. Per step and loop: the logits' max abs and rel error, cosine, top-5 agreement,
token agreement and the tolerance's verdict. A step *diverges* when a token differs and it is no
tie, or when the logits go beyond tolerance and, measured against the program run in float64 on the
same inputs, the ONNX side is further from exact than torch (``engine/noise.py``'s rule). A flipped
token is a *tie* when the logits are within tolerance or rounding, and the gap between the two
candidates in float64 is within twice what torch rounds by on that row. The closed loop stops
comparing after its first flipped token (the two sides then decode different texts); the open loop
goes on. ``Generation.lockstep(step)`` runs the node-by-node comparison with culprits on a step's
inputs.
"""

from __future__ import annotations

import collections.abc
import concurrent.futures as cf
import dataclasses
import functools
import math
import os
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from sbs_widget.align.fx_graph import program_outputs
from sbs_widget.dtypes import ONNX_TO_NUMPY
from sbs_widget.engine.cancel import Cancel
from sbs_widget.engine.entry import Prepared
from sbs_widget.engine.fx_runner import flat_inputs
from sbs_widget.engine.metrics import compute_errors
from sbs_widget.engine.noise import epsilon, judge, largest
from sbs_widget.engine.reference import NoReference, program_reference
from sbs_widget.engine.runtimes import Runtime, exact_numpy, get_runtime
from sbs_widget.engine.tolerance import Tolerance
from sbs_widget.engine.user_metrics import cosine, top_k_agreement
from sbs_widget.errors import InputError
from sbs_widget.load.readers import load_inputs
from sbs_widget.records import Record
from sbs_widget.steps.mapping import StepMapping, infer_mapping, next_inputs

TOP_K = 5
_TOP = top_k_agreement(TOP_K)


@dataclasses.dataclass
class LoopStep:
    """One step of one loop: the ONNX side's logits against torch's."""

    tokens: list[int]  # the ONNX side's next token per batch row
    max_abs: float
    max_rel: float
    cosine: float
    top5: float  # share of rows whose 5 largest logits are the same set
    token_agreement: float  # share of rows choosing torch's token
    within_tolerance: bool
    noise: bool | None = None  # beyond tolerance: rounding (float64 judged), None: not judged
    tie: bool | None = None  # a flipped token: within the float64 rounding envelope
    comment: str = ""

    @property
    def diverges(self) -> bool:
        flipped = self.token_agreement < 1.0 and not self.tie
        return flipped or (not self.within_tolerance and self.noise is not True)


@dataclasses.dataclass
class Step:
    step: int  # 0: the prompt
    length: int  # tokens in the sequence after this step's input
    torch_tokens: list[int]
    closed: LoopStep | None  # None once the closed loop has stopped (a token flipped before)
    open: LoopStep
    # the open loop's step is the closed loop's: up to here the ONNX side's own inputs were torch's
    # within tolerance (its tokens the same, its cache within tolerance), no separate run was needed
    open_shared: bool = False


@dataclasses.dataclass
class Generation:
    """The steps of one greedy decoding, compared (``decode``)."""

    prepared: Prepared
    mapping: StepMapping
    tolerance: Tolerance
    steps: list[Step]
    inputs: Sequence[dict]  # torch's flat user inputs at each step (the open loop's, the lockstep's)
    stopped: str | None = None  # why the decoding ended before its last step (stop, time limit)

    @property
    def first_divergence(self) -> dict[str, int | None]:
        """The first diverging step of each loop (``None``: none)."""
        closed = next((s.step for s in self.steps if s.closed is not None and s.closed.diverges), None)
        opened = next((s.step for s in self.steps if s.open.diverges), None)
        return {"closed_loop": closed, "open_loop": opened}

    def kwargs_at(self, step: int) -> tuple[tuple, dict]:
        """Torch's inputs at ``step`` as the program takes them (``args``, ``kwargs``)."""
        program = self.prepared.decomposed_ep
        flat = list(self.inputs[step].values())
        return torch.utils._pytree.tree_unflatten(flat, program.call_spec.in_spec)

    def run_at(self, step: int, **options) -> Iterator[Record]:
        """The node-by-node comparison at ``step`` (torch's inputs at that step, both sides fed them), as
        ``Prepared.run`` yields it (``options``: its own, e.g. ``progress``, ``cancel``; node-local
        errors on by default: the culprit finder reads them)."""
        args, kwargs = self.kwargs_at(step)
        atol, rtol = self.tolerance
        options.setdefault("node_local", True)
        return self.prepared.run(args, kwargs, atol=atol, rtol=rtol, **options)

    def lockstep(self, step: int, **options):
        """``run_at(step)``'s records and their culprits: ``(records, culprits)``."""
        from sbs_widget.blame.culprits import find_culprits
        from sbs_widget.blame.finer import refine_culprits

        args, kwargs = self.kwargs_at(step)
        atol, rtol = self.tolerance
        records = list(self.run_at(step, **options))
        found = find_culprits(records, prepared=self.prepared, atol=atol, rtol=rtol)
        return records, refine_culprits(found, self.prepared, args, kwargs, atol, rtol)

    def compare_steps(self, steps: Iterable[int] | None = None, *, executor=None, max_workers: int | None = None,
                      **options):
        """The lockstep run at each of ``steps`` (default: every step) with its culprits, in worker
        processes (``compare_input_sets`` on the steps' inputs: ``executor``, ``max_workers`` and
        ``options`` as there; the tolerance is this decoding's). Its ``input_dependent`` pairs are those
        beyond tolerance at some steps only: what changes with the length, the cache, the position."""
        from sbs_widget.steps.input_sets import compare_input_sets

        chosen = list(range(len(self.steps))) if steps is None else [int(k) for k in steps]
        wrong = [k for k in chosen if not 0 <= k < len(self.steps)]
        if wrong:
            raise InputError(f"steps {wrong}: this decoding has steps 0 to {len(self.steps) - 1}")
        atol, rtol = self.tolerance
        options.setdefault("node_local", True)
        pair = self.prepared.pair
        return compare_input_sets(pair.user_ep if pair.user_ep is not None else pair.decomposed_ep,
                                  pair.onnx_model, [self.kwargs_at(k) for k in chosen], executor=executor,
                                  max_workers=max_workers, atol=atol, rtol=rtol,
                                  labels=[f"step {k}" for k in chosen], **options)

    def to_dataframe(self):
        import pandas

        rows = []
        for s in self.steps:
            for loop, ls in (("closed", s.closed), ("open", s.open)):
                if ls is None:
                    continue
                rows.append({"step": s.step, "loop": loop, "length": s.length, "torch_tokens": s.torch_tokens,
                             "open_shared": s.open_shared,
                             **{k: v for k, v in dataclasses.asdict(ls).items()}, "diverges": ls.diverges})
        return pandas.DataFrame(rows)


class _Sides:
    """The torch program and the ONNX model, run whole on flat user inputs (name -> tensor)."""

    def __init__(self, p: Prepared, runtime: Runtime):
        self.p = p
        program = p.decomposed_ep
        self.module = program.graph_module
        self.user_inputs = list(program.graph_signature.user_inputs)
        self.output_names = [n.name if isinstance(n, torch.fx.Node) else str(n) for n in program_outputs(program)]
        self.onnx_names = dict(p.alignment.input_pairs)  # FX input -> ONNX input
        self.kinds = [s.kind for s in program.graph_signature.output_specs]
        self.runtime = runtime
        self.session = p.compiled(runtime, ("whole-model",), lambda: p.index.full_model())
        # small ops run on one thread, as the lockstep's FX side runs them (fx_runner.small_nodes): torch's
        # thread pool costs more than such ops (8x on a 2-layer LLaMA of hidden size 64, two busy cores)
        small = p.schedule.small_fx_nodes
        self.single = all(i in small for i, n in enumerate(p.fx_nodes) if n.op == "call_function")

    def appended_caches(self, mapping: StepMapping) -> bool:
        """Whether torch's program builds every present as ``cat(past, new)`` on the growing dimension
        (as transformers' ``DynamicCache`` does): then a step's past is the start of every later one."""
        outputs = program_outputs(self.p.decomposed_ep)
        for position, past in mapping.cache:
            node = outputs[position] if position < len(outputs) else None
            if not (isinstance(node, torch.fx.Node) and node.target == torch.ops.aten.cat.default):
                return False
            parts, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
            rank = len(node.meta["val"].shape) if "val" in node.meta else 0
            first = parts[0] if parts else None
            along = dim % max(rank, 1) == _grown_rank(rank)
            if not (isinstance(first, torch.fx.Node) and first.name == past and along):
                return False
        return True

    def torch(self, weights: list, flat: dict) -> list[torch.Tensor]:
        threads = torch.get_num_threads()
        if self.single:
            torch.set_num_threads(1)
        try:
            with torch.no_grad():  # (not inference mode: its tensors, fed to a lockstep run later, keep versions)
                out = self.module(*weights, *flat.values())
        finally:
            torch.set_num_threads(threads)
        user = torch.export.graph_signature.OutputKind.USER_OUTPUT
        out = [v for v, kind in zip(out, self.kinds) if kind == user] if len(out) == len(self.kinds) else out
        return [v for v in torch.utils._pytree.tree_leaves(out) if v is not None]

    def onnx(self, flat: dict) -> list[torch.Tensor]:
        types = self.p.index.types
        feeds = {}
        for name, value in flat.items():
            onnx_name = self.onnx_names.get(name)
            if onnx_name is None or not isinstance(value, torch.Tensor):
                continue
            arr = value.detach().cpu().numpy()
            vt = types.get(onnx_name)
            if vt is not None and vt.elem_type in ONNX_TO_NUMPY and arr.dtype != ONNX_TO_NUMPY[vt.elem_type]:
                arr = arr.astype(ONNX_TO_NUMPY[vt.elem_type])
            feeds[onnx_name] = np.ascontiguousarray(arr)
        outs = self.session(feeds, list(self.p.index.outputs))
        return [torch.from_numpy(np.asarray(o)) for o in outs]


def decode(prepared: Prepared, inputs=(), kwargs=None, *, steps: int = 32, atol: float | None = None,
           rtol: float | None = None, mapping: StepMapping | None = None, runtime: str | Runtime = "onnxruntime",
           progress: Callable[[int, int], None] | None = None, on_step: Callable[[Step], None] | None = None,
           cancel: Cancel | None = None) -> Generation:
    """Greedy decoding of ``steps`` tokens after the prompt (``inputs``/``kwargs``: the program's inputs
    at step 0), compared in a closed and an open loop (see the module's docstring)."""
    hooks = _Hooks(progress, on_step, cancel or Cancel())
    hooks.cancel.start()
    try:
        return Generation(prepared, *_run(prepared, inputs, kwargs, steps, atol, rtol, mapping, runtime, hooks))
    finally:
        hooks.cancel.finish()


@dataclasses.dataclass
class _Hooks:
    progress: Callable[[int, int], None] | None  # (steps done, total)
    on_step: Callable[[Step], None] | None  # each step as it is judged (a live view)
    cancel: Cancel  # checked before each step: stop, time limit


def _run(p: Prepared, inputs, kwargs, steps: int, atol, rtol, mapping: StepMapping | None, runtime, hooks: _Hooks):
    if not isinstance(steps, int) or steps < 0:
        raise InputError(f"steps={steps!r}: pass the number of tokens to generate after the prompt (>= 0)")
    tolerance = p.tolerance(atol, rtol)
    args, kwargs = load_inputs(inputs, kwargs)
    placeholders = flat_inputs(p.decomposed_ep, args, kwargs)
    sides = _Sides(p, runtime if not isinstance(runtime, str) else get_runtime(runtime))
    n_user = len(sides.user_inputs)
    weights, user = placeholders[:-n_user] if n_user else placeholders, placeholders[len(placeholders) - n_user:]
    torch_in = dict(zip(sides.user_inputs, user))
    with _OnnxBeside(sides, hooks.cancel) as beside:
        prompt = beside.run(torch_in)
        out_t = sides.torch(weights, torch_in)
        if mapping is None:
            mapping = infer_mapping(torch_in, list(zip(sides.output_names, out_t)))
        history = _History(mapping, sides.appended_caches(mapping))
        onnx_in = dict(torch_in)
        out_closed = out_open = prompt.result()
        done, closed_on, shared = [], True, True
        length = int(torch_in[mapping.ids].shape[1]) + (_past(mapping, torch_in) if mapping.with_cache else 0)
        for k in range(steps + 1):
            history.append(torch_in)
            logits_t = out_t[mapping.logits]
            token_t = logits_t[:, -1].argmax(-1)
            judged = functools.partial(_loop_step, logits_t=logits_t, tolerance=tolerance, p=p, weights=weights,
                                       torch_in=torch_in, sides=sides, mapping=mapping, new=None if k == 0 else 1)
            closed = judged(out_closed[mapping.logits]) if closed_on else None
            opened = dataclasses.replace(closed) if shared and closed is not None else judged(out_open[mapping.logits])
            done.append(Step(k, length + k, token_t.tolist(), closed, opened, shared and closed is not None))
            if hooks.on_step is not None:
                hooks.on_step(done[-1])
            if hooks.progress is not None:
                hooks.progress(k + 1, steps + 1)
            closed_on = closed_on and closed.token_agreement == 1.0  # else the sides decode different texts
            if k == steps:
                break
            if hooks.cancel.cancelled:  # the steps so far are kept, with why it ended
                return mapping, tolerance, done, history, str(hooks.cancel.error(f"before decode step {k + 1}"))
            next_t = next_inputs(mapping, torch_in, out_t, token_t)
            if closed_on:
                onnx_in = next_inputs(mapping, onnx_in, out_closed, out_closed[mapping.logits][:, -1].argmax(-1))
            shared = shared and closed_on and closed.within_tolerance and \
                _caches_close(mapping, out_t, out_closed, tolerance, int(torch_in[mapping.ids].shape[1]))
            torch_in = next_t
            # the ONNX runs of the step go beside torch's (see _OnnxBeside), then both are judged
            closed_run = beside.run(onnx_in) if closed_on else None
            open_run = None if shared else beside.run(torch_in)
            out_t = sides.torch(weights, torch_in)
            try:
                if closed_run is not None:
                    out_closed = closed_run.result()
                out_open = out_closed if shared else open_run.result()
            except Exception:
                if not hooks.cancel.cancelled:
                    raise
                return mapping, tolerance, done, history, str(hooks.cancel.error(f"in decode step {k + 1}"))
    return mapping, tolerance, done, history, None


class _OnnxBeside:
    """The ONNX model's runs of a step, made beside torch's run of that step when both sides compute on
    one thread each (ops too small for a thread pool: torch's graph module is mostly Python, onnxruntime
    releases the GIL), so that a step costs the slower side, not the sum; otherwise made at once, in
    turn. Each run carries the decoding's stop switch (``Cancel.call``)."""

    def __init__(self, sides: _Sides, cancel: Cancel):
        self.sides, self.cancel = sides, cancel
        overlap = sides.single and getattr(sides.runtime, "intra_op_num_threads", 0) == 1 and (os.cpu_count() or 1) > 1
        self.pool = cf.ThreadPoolExecutor(1, thread_name_prefix="sbs-decode-onnx") if overlap else None

    def run(self, flat: dict) -> cf.Future:
        if self.pool is not None:
            return self.pool.submit(self.cancel.call, self.sides.onnx, dict(flat))
        done: cf.Future = cf.Future()
        done.set_result(self.cancel.call(self.sides.onnx, flat))
        return done

    def __enter__(self) -> "_OnnxBeside":
        return self

    def __exit__(self, *exc) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


class _History(collections.abc.Sequence):
    """Torch's inputs at every step (``history[k]``: name -> value), for ``Generation.run_at`` and the
    lockstep on demand, in memory flat over the steps: where torch's program appends to each cache
    (every present is ``cat(past, new)`` along the growing dimension), a past step's cache is the start
    of the newest one: each step keeps its lengths and is read as views of the newest cache, and the
    older cache tensors are freed as the decoding goes."""

    def __init__(self, mapping: StepMapping, appended: bool):
        self.names = [name for _, name in mapping.cache] if appended else []
        self._steps: list[dict] = []  # per step its inputs, a cache entry replaced by its length
        self._newest: dict = {}  # the newest step's cache tensors

    def append(self, flat: dict) -> None:
        self._newest = {name: flat[name] for name in self.names}
        self._steps.append({name: (int(v.shape[_grown(v)]) if name in self._newest else v) for name, v in flat.items()})

    def __len__(self) -> int:
        return len(self._steps)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        kept = self._steps[k]
        return {name: (self._newest[name].narrow(_grown(self._newest[name]), 0, v) if name in self._newest else v)
                for name, v in kept.items()}


def _caches_close(mapping: StepMapping, torch_out: list, onnx_out: list, tolerance: Tolerance, new: int) -> bool:
    """Whether the ``new`` positions every present just appended are within tolerance of torch's (the
    rest of each present is the past the step read, judged when it was appended)."""
    if not mapping.cache:
        return True
    ts, os_ = [], []
    for k, _ in mapping.cache:  # (numpy views: a slice costs a tenth of torch's narrow on such sizes)
        t, o = exact_numpy(torch_out[k]), exact_numpy(onnx_out[k])
        d = _grown(t)
        ts.append(t[(slice(None),) * d + (slice(t.shape[d] - new, None),)].ravel())
        os_.append(o[(slice(None),) * d + (slice(o.shape[d] - new, None),)].ravel())
    # one vectorized pass over every appended entry (in float32 at least: float16 rounds atol away)
    e, g = np.concatenate(ts).astype(np.float32, copy=False), np.concatenate(os_).astype(np.float32, copy=False)
    return bool((((np.abs(g - e) <= tolerance.atol + tolerance.rtol * np.abs(e))) | (g == e)).all())


def _grown(present) -> int:
    """The dimension a cache grows along: the sequence, second to last of ``[batch, heads, seq, size]``."""
    return _grown_rank(len(present.shape))


def _grown_rank(rank: int) -> int:
    return rank - 2 if rank >= 2 else 0


def _past(mapping: StepMapping, flat: dict) -> int:
    """The prompt's past length: the cache's dimension that grows (the one torch's next present
    extends), read as the second to last of the past key (``[batch, heads, past, head size]``)."""
    past = flat[mapping.cache[0][1]]
    return int(past.shape[-2]) if past.dim() >= 2 else 0


def _loop_step(logits_o: torch.Tensor, logits_t: torch.Tensor, tolerance: Tolerance, p: Prepared, weights: list,
               torch_in: dict, sides: _Sides, mapping: StepMapping, new: int | None = None) -> LoopStep:
    """One loop's step judged on the logits of the ``new`` positions the step added (all: the prompt;
    without a cache the earlier positions were judged at their own step)."""
    if new is not None:
        logits_o, logits_t = logits_o[:, -new:], logits_t[:, -new:]
    e, g = logits_t.detach().cpu().numpy(), logits_o.detach().cpu().numpy()
    err = compute_errors(e, g, atol=tolerance.atol, rtol=tolerance.rtol)
    last_t, last_o = e[:, -1], g[:, -1]
    tokens_t, tokens_o = last_t.argmax(-1), last_o.argmax(-1)
    ls = LoopStep(tokens_o.tolist(), err.err_abs if not err.err_nan else math.inf, err.err_rel, cosine(last_t, last_o),
                  _TOP(last_t, last_o), float(np.mean(tokens_t == tokens_o)), bool(err.within_tolerance))
    if ls.within_tolerance and ls.token_agreement == 1.0:
        return ls
    try:  # the program in float64 on the same inputs: ties and noise told from bugs
        ref = _reference_logits(p, weights, torch_in, sides, mapping)[:, -e.shape[1]:]
    except NoReference as why:
        ls.comment = f"no float64 reference ({why}): the tolerance rule and the tokens stand"
        return ls
    if not ls.within_tolerance:
        verdict = judge(logits_t, g, ref, epsilon(logits_t), largest(logits_t))
        ls.noise = verdict.noise
        ls.comment = "rounding: the ONNX logits as close to float64 as torch's" if verdict.noise else \
            f"beyond rounding: {verdict.err_onnx:.3g} from float64 where torch is {verdict.err_torch:.3g}"
    if ls.token_agreement < 1.0:  # (a difference beyond rounding is never a tie)
        ls.tie = ls.noise is not False and _ties(ref[:, -1].numpy(), last_t, last_o, tokens_t, tokens_o)
        if ls.tie:
            ls.comment = (ls.comment + "; " if ls.comment else "") + \
                "tie: the flipped tokens' logits are within what both sides round by (float64)"
    return ls


def _reference_logits(p: Prepared, weights: list, torch_in: dict, sides: _Sides, mapping: StepMapping):
    flat = [*weights, *torch_in.values()]
    name = sides.output_names[mapping.logits]
    values = program_reference(p.decomposed_ep, flat, p.schedule.fx_last_use, [name], p.weight_files)
    if name not in values:
        raise NoReference("the logits have no float64 value")
    return values[name]


def _ties(ref: np.ndarray, t: np.ndarray, o: np.ndarray, tokens_t, tokens_o) -> bool:
    """Whether every row whose token flipped is a tie: the two candidates' float64 logits closer than
    twice torch's own rounding on that row (the envelope one more rounding side fits in)."""
    for row in np.nonzero(tokens_t != tokens_o)[0]:
        r = ref[row].astype(np.float64)
        envelope = 2 * float(np.abs(t[row].astype(np.float64) - r).max())
        if abs(r[tokens_t[row]] - r[tokens_o[row]]) > envelope:
            return False
    return True
