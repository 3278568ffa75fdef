"""One comparison run in a background thread, reporting to the widget in batches.

The thread owns the record generator (the engine wants it closed from the thread that consumes it),
so a stop request is an Event the loop checks between records, and the run's ``Cancel`` token, which
terminates a runtime call in flight. A thread stuck in a call that ignores that is abandoned
(``Runner.abandon``): the run ends "stopped" at once and the thread's later output is dropped.
Reports are throttled: one ``report(run, final)`` call per ``FLUSH_SECONDS`` at most.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from sbs_widget.engine.background import renew
from sbs_widget.engine.cancel import TIMEOUT, Cancel
from sbs_widget.engine.shutdown import track
from sbs_widget.errors import RunCancelled
from sbs_widget.records import RESET, Record
from sbs_widget.views.rows import error_key, json_value

FLUSH_SECONDS = 0.15

# Values of Run.status (and of SbsWidget.status, which adds "idle" and "preparing").
RUNNING = "running"
DONE = "done"
STOPPED = "stopped"
FAILED = "error"


@dataclass
class Run:
    """A run of the comparison: its settings, its records (in execution order) and how it went."""

    id: int
    reset_names: frozenset[str]
    atol: float
    rtol: float
    node_local: bool = False
    step: int | None = None  # a decode step: the lockstep comparison on torch's inputs at that step
    input: int | None = None  # input sets (views/sets_view.py): the input set whose records these are
    records: list[Record] = field(default_factory=list)
    status: str = RUNNING
    error: str = ""
    trace: str = field(default="", repr=False)  # formatted traceback when status is "error"
    exception: BaseException | None = field(default=None, repr=False, compare=False)  # what ended it, as raised
    started: float = field(default_factory=time.time)
    elapsed: float | None = 0.0  # seconds; None for records computed elsewhere with no times
    fx_done: int = 0
    fx_total: int = 0
    current: str = ""
    counts: Counter = field(default_factory=Counter)
    worst_i: int | None = None
    onnx_nodes_seen: set = field(default_factory=set, repr=False)

    def add(self, record: Record) -> None:
        i = len(self.records)
        self.records.append(record)
        self.counts[record.status] += 1
        if record.onnx_node_name:
            self.onnx_nodes_seen.add(record.onnx_node_name)
        if record.err_abs is not None and record.status != RESET and (  # a reset pair was fixed on purpose
            self.worst_i is None or error_key(record.err_abs) > error_key(self.records[self.worst_i].err_abs)
        ):
            self.worst_i = i

    @property
    def finished(self) -> bool:
        return self.status != RUNNING

    def summary(self) -> dict:
        """Small JSON-able description (synced to the view as an item of ``runs_meta``)."""
        w = self.records[self.worst_i] if self.worst_i is not None else None
        return {
            "id": self.id,
            "status": self.status,
            "reset_names": sorted(self.reset_names),
            "atol": self.atol,
            "rtol": self.rtol,
            "n_records": len(self.records),
            "elapsed": None if self.elapsed is None else round(self.elapsed, 3),
            "counts": dict(self.counts),
            "worst_err": None if w is None else json_value(w.err_abs),  # NaN/inf as strings
            "worst_name": "" if w is None else (w.ep_name or w.onnx_name or ""),
            "error": self.error,
            "step": self.step,
            "input": self.input,
        }


ABANDONED = ("stopped; a runtime call did not end and was abandoned (its thread is left to finish "
             "on its own; later runs use fresh threads)")


class Runner:
    """Consumes ``start()``'s record iterator in a daemon thread; ``stop()`` ends it at the next record
    (or terminates the runtime call in flight); ``ended`` is set once the run's final status is."""

    def __init__(self, run: Run, start: Callable[[Run, Callable, Cancel], object],
                 report: Callable[[Run, bool], None], time_limit: float | None = None):
        # start(run, progress, cancel) -> iterator of Record; progress(done, total, name) is the engine's callback.
        self.run = run
        self._start = start
        self._report = report
        self._stop = threading.Event()
        self.cancel = Cancel(time_limit)
        self.ended = threading.Event()
        self.abandoned = False
        self._final = threading.Lock()  # the final status is set once: by the thread or by abandon()
        self._last_flush = 0.0  # 0: the first record is shown at once
        self._closing = False  # the run's end is being reported: not to be interrupted at exit
        self.thread = threading.Thread(target=self._main, name=f"sbs-run-{run.id}", daemon=True)

    def begin(self) -> "Runner":
        self.thread.start()
        track(self.thread, self.stop, lambda: not self._closing)  # a script ending mid-run ends cleanly
        return self

    def stop(self) -> None:
        self._stop.set()
        self.cancel.cancel()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Whether the run ended (its final status set) within ``timeout``."""
        return self.ended.wait(timeout)

    def abandon(self) -> bool:
        """End the run now, "stopped", leaving its thread stuck in a call (False: it had ended)."""
        with self._final:
            if self.ended.is_set():
                return False
            self.abandoned = True
        renew("sbs-run")  # the stuck call may hold the shared runner thread: later runs get a new one
        self._finish(STOPPED, ABANDONED, "")
        return True

    def _progress(self, done: int, total: int, name: str) -> None:
        self.run.fx_done, self.run.fx_total, self.run.current = done, total, name or ""
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        now = time.monotonic()
        if now - self._last_flush >= FLUSH_SECONDS and not self.abandoned:
            self._last_flush = now
            self.run.elapsed = time.time() - self.run.started
            self._report(self.run, False)

    def _main(self) -> None:
        run = self.run
        it = None
        status, error, trace = FAILED, "", ""
        self.run.exception = None
        try:
            it = self._start(run, self._progress, self.cancel)
            for record in it:
                if self.abandoned:  # the run was given up: what comes late is dropped
                    break
                run.add(record)
                if self._stop.is_set():
                    break
                self._maybe_flush()
            status = STOPPED if self._stop.is_set() else DONE
        except RunCancelled as e:  # stopped, or out of time: keep what it produced, say where it ended
            status = FAILED if e.reason == TIMEOUT else STOPPED
            error = f"{type(e).__name__}: {e}" if e.reason == TIMEOUT else str(e)
            run.exception = e
        except BaseException as e:  # KeyboardInterrupt too: the run must not be left "running"
            status = STOPPED if isinstance(e, KeyboardInterrupt) else FAILED
            error = f"{type(e).__name__}: {e}".rstrip(": ")
            trace = traceback.format_exc()
            run.exception = e
        finally:
            self._closing = True
            if it is not None and hasattr(it, "close"):
                try:
                    it.close()
                except BaseException:  # closing must not hide the run's own outcome
                    pass
            self._finish(status, error, trace)

    def _finish(self, status: str, error: str, trace: str) -> None:
        with self._final:
            if self.ended.is_set():  # abandoned meanwhile: its final report is out
                return
            run = self.run
            run.status, run.error, run.trace = status, error, trace
            run.elapsed = time.time() - run.started
            run.current = ""
            try:
                self._report(run, True)
            finally:
                self.ended.set()
