"""The decode steps of an ``SbsWidget`` (project issue 50): greedy decoding driven on both sides
(``steps.decode.decode``) in a background thread, the step strip's state in the widget's ``decoding``
trait, and the node-by-node (lockstep) comparison at any step as a run of the table, on demand.

``decoding`` (what js/steps.js draws, JSON-safe: non-finite numbers as ``NON_FINITE`` strings)::

    {"status": "running" | "done" | "error", "message": str, "done": int, "total": int,
     "steps": [{"step", "length", "torch": [token per batch row],
                "closed": LoopStep fields + "diverges" | None (the closed loop stopped), "open": ...}],
     "first_divergence": {"closed_loop": int | None, "open_loop": int | None}, "atol", "rtol"}

A step's lockstep run is a ``Run`` whose ``step`` is set: it runs the program on torch's inputs at that
step (``Generation.kwargs_at``) with ``node_local`` on, as ``Generation.lockstep`` does, but through the
widget's ``Runner``, so its records stream into the table and its culprits fill the culprits panel. The
steps arrive once the decoding has ended (``decode`` reports progress, not steps); the strip shows the
progress meanwhile.
"""

from __future__ import annotations

import dataclasses
import threading
import traceback

from sbs_widget.engine.shutdown import track
from sbs_widget.errors import InputError
from sbs_widget.records import to_dataframe
from sbs_widget.shared_rules import MESSAGES
from sbs_widget.views.deployed_check import json_safe
from sbs_widget.views.runs import DONE, RUNNING

STEP_MESSAGE = MESSAGES["step"]  # the view's click on a step: {"type": "step", "step": k}
DECODING, DECODED, FAILED = "running", "done", "error"
DEFAULT_STEPS = 32  # w.decode() on a widget built without steps=


def checked_steps(steps) -> int:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise InputError(f"steps={steps!r}: pass the number of tokens to generate after the prompt (>= 0)")
    return steps


def loop_state(loop) -> dict | None:
    """A ``LoopStep`` as the strip reads it (``None``: the closed loop had stopped)."""
    if loop is None:
        return None
    return dict(json_safe(dataclasses.asdict(loop)), diverges=bool(loop.diverges))


def generation_state(gen) -> dict:
    """The steps of a ``Generation`` and its first divergence per loop, JSON-safe."""
    steps = [{"step": s.step, "length": s.length, "torch": json_safe(list(s.torch_tokens)),
              "closed": loop_state(s.closed), "open": loop_state(s.open)} for s in gen.steps]
    atol, rtol = gen.tolerance
    return {"steps": steps, "first_divergence": dict(gen.first_divergence), "atol": atol, "rtol": rtol}


def auto_step(gen) -> int:
    """The step whose lockstep the widget shows first: the open loop's first divergence (the error
    arises there, whatever came before), else the closed loop's, else the prompt."""
    first = gen.first_divergence
    for loop in ("open_loop", "closed_loop"):
        if first.get(loop) is not None:
            return first[loop]
    return 0


class DecodeSteps:
    """Mixin of ``SbsWidget``: ``steps=N`` (or ``w.decode(N)``) decodes N tokens after the prompt on
    both sides and shows the steps above the table; a click on a step (or ``w.show_step(k)``) runs the
    lockstep comparison at that step into the table."""

    def _init_steps(self, steps: int | None) -> None:
        self._decode_steps = None if steps is None else checked_steps(steps)
        self._generation = None
        self._decode_thread: threading.Thread | None = None
        self._decode_error: BaseException | None = None
        self._decode_working = False
        self._lockstep_cache: dict[int, tuple] = {}  # step -> (records, culprits) of step_records

    def _autostart(self) -> None:
        """The constructor's first work: the decoding (``steps=``) or the comparison run."""
        if self._decode_steps is not None:
            self.decode(self._decode_steps)
        else:
            self.rerun()

    # --- public API ------------------------------------------------------------------------------

    def decode(self, steps: int | None = None, *, wait: bool = False):
        """Decode ``steps`` tokens greedily after the prompt (the widget's inputs), torch and ONNX side by
        side (``sbs_widget.steps.decode.decode``: closed and open loop), in a background thread; the step
        strip shows them, then the lockstep at the first diverging step (else the prompt) fills the table.
        Returns at once (``wait=True``: when the decoding and that run have ended). A decoding already
        under way is kept: one at a time."""
        if self._ep is None and self._to_export is None:
            raise InputError("nothing to decode: this widget shows saved records (build it from the programs)")
        if self._decode_thread is None or not self._decode_thread.is_alive():
            steps = self._decode_steps if steps is None else steps
            self._decode_steps = checked_steps(DEFAULT_STEPS if steps is None else steps)
            self._decode_error = None
            self._publish_decoding(DECODING, "preparing", done=0, total=self._decode_steps + 1)
            if not self.running:
                self.status, self.message = "preparing", ""
            self._decode_working = True
            self._decode_thread = threading.Thread(target=self._decode_work, name="sbs-decode", daemon=True)
            self._decode_thread.start()
            track(self._decode_thread, None, lambda: self._decode_working)
        return self.wait() if wait else self

    @property
    def generation(self):
        """The ``Generation`` of the last decoding that ended well (None before; see ``decode``)."""
        return self._generation

    @property
    def steps(self) -> list:
        """The decoded steps (``Step``: tokens of both sides, closed and open loop figures); [] before."""
        return list(self._generation.steps) if self._generation is not None else []

    def steps_dataframe(self):
        """The steps as a DataFrame, a row per step and loop (``Generation.to_dataframe``)."""
        if self._generation is None:
            import pandas

            return pandas.DataFrame()
        return self._generation.to_dataframe()

    def show_step(self, step: int):
        """Run the lockstep comparison at ``step`` (torch's inputs at that step, both sides fed them) as a
        new run of the table, its culprits in the panel; returns at once (``wait()`` blocks)."""
        self._step_index(step)
        return self._begin(None, step)

    def step_records(self, step: int):
        """The records of the lockstep comparison at ``step`` as a DataFrame: a finished run of that step
        (without a reset set) when there is one, else ``Generation.lockstep(step)``, computed here once."""
        k = self._step_index(step)
        current = self._runs[-1] if self._runs else None
        if current is not None and current.step == k and self.running:
            self._runner.join()
        for run in reversed(self._runs):
            if run.step == k and run.status == DONE and not run.reset_names:
                return to_dataframe(run.records)
        if k not in self._lockstep_cache:
            self._lockstep_cache[k] = self._generation.lockstep(k)
        return to_dataframe(self._lockstep_cache[k][0])

    # --- the decoding and the step runs ------------------------------------------------------------

    def _step_index(self, step) -> int:
        self._wait_decoding(None)
        if self._generation is None:
            raise InputError("no decoded steps: start with SbsWidget(..., steps=N) or w.decode(N)")
        n = len(self._generation.steps)
        if isinstance(step, bool) or not hasattr(step, "__index__") or not 0 <= step < n:
            raise InputError(f"step={step!r} does not exist: the decoding has steps 0 to {n - 1}")
        return int(step)

    def _inputs_of(self, run) -> tuple:
        """The inputs ``run`` compares on: torch's at its step, else the widget's."""
        if run.step is not None and self._generation is not None:
            return self._generation.kwargs_at(run.step)
        return self._args, self._kwargs

    def _wait_decoding(self, timeout: float | None) -> None:
        thread = self._decode_thread
        if thread is None or thread is threading.current_thread():
            return
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"the decoding is still running after {timeout} s")
        if self._decode_error is not None:
            raise self._decode_error

    def _publish_decoding(self, status: str, message: str = "", **extra) -> None:
        state = {k: v for k, v in (self.decoding or {}).items() if status == DECODING and k in ("done", "total")}
        state.update(status=status, message=message, **extra)
        self.decoding = state

    def _decode_work(self) -> None:
        from sbs_widget.steps.decode import decode

        try:
            prepared = self._prepare()  # from_module: exports once; otherwise cached by content
            auto_atol, auto_rtol = self._default_tolerance
            extra = {} if self._runtime is None else {"runtime": self._runtime}
            self._publish_decoding(DECODING, "decoding", done=0, total=self._decode_steps + 1)
            gen = decode(prepared, self._args, self._kwargs, steps=self._decode_steps,
                         atol=None if auto_atol else self.atol, rtol=None if auto_rtol else self.rtol,
                         progress=lambda done, total: self._publish_decoding(DECODING, "decoding", done=done,
                                                                             total=total), **extra)
        except Exception as e:  # lands in the strip and the status line; the table is untouched
            self._decode_working = False
            self._decode_error = e
            message = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            self._publish_decoding(FAILED, message, trace=traceback.format_exc(limit=8))
            if not self.running:
                self.status, self.message = "error", message
            return
        self._decode_working = False
        if any(self._default_tolerance):  # the decoding settled them, as a first run does
            self._default_tolerance = (False, False)
            self.atol, self.rtol = gen.tolerance
        self._generation, self._lockstep_cache = gen, {}
        self._publish_decoding(DECODED, "", done=len(gen.steps), total=len(gen.steps), **generation_state(gen))
        self._begin(None, auto_step(gen))

    def _on_step_message(self, content: dict) -> None:
        """A click on a step: its lockstep as a new run, unless the current run is that step's already."""
        step = content.get("step")
        gen = self._generation
        if gen is None or isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < len(gen.steps):
            return  # a stale or malformed message: nothing to do, nothing raised at the view
        current = self._runs[-1] if self._runs else None
        if current is not None and current.step == step and current.status in (RUNNING, DONE) \
                and current.reset_names == frozenset(self.reset_names):
            return
        self._begin(None, step)
