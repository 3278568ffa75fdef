"""One comparison run in a background thread, reporting to the widget in batches.

The thread owns the record generator (the engine wants it closed from the thread that consumes it),
so a stop request is an Event the loop checks between records. Reports are throttled: one
``report(run, final)`` call per ``FLUSH_SECONDS`` at most, whatever the number of nodes.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from .records import Record
from .widget_rows import error_key, json_value

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
    records: list[Record] = field(default_factory=list)
    status: str = RUNNING
    error: str = ""
    trace: str = field(default="", repr=False)  # formatted traceback when status is "error"
    started: float = field(default_factory=time.time)
    elapsed: float = 0.0
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
        if record.err_abs is not None and (
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
            "elapsed": round(self.elapsed, 3),
            "counts": dict(self.counts),
            "worst_err": None if w is None else json_value(w.err_abs),  # NaN/inf as strings
            "worst_name": "" if w is None else (w.ep_name or w.onnx_name or ""),
            "error": self.error,
        }


class Runner:
    """Consumes ``start()``'s record iterator in a daemon thread; ``stop()`` ends it at the next record."""

    def __init__(self, run: Run, start: Callable[[Run, Callable], object], report: Callable[[Run, bool], None]):
        # start(run, progress) -> iterator of Record; progress(done, total, name) is the engine's callback.
        self.run = run
        self._start = start
        self._report = report
        self._stop = threading.Event()
        self._last_flush = 0.0  # 0: the first record is shown at once
        self.thread = threading.Thread(target=self._main, name=f"sbs-run-{run.id}", daemon=True)

    def begin(self) -> "Runner":
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def join(self, timeout: float | None = None) -> bool:
        self.thread.join(timeout)
        return not self.thread.is_alive()

    def _progress(self, done: int, total: int, name: str) -> None:
        self.run.fx_done, self.run.fx_total, self.run.current = done, total, name or ""
        self._maybe_flush()

    def _maybe_flush(self) -> None:
        now = time.monotonic()
        if now - self._last_flush >= FLUSH_SECONDS:
            self._last_flush = now
            self.run.elapsed = time.time() - self.run.started
            self._report(self.run, False)

    def _main(self) -> None:
        run = self.run
        it = None
        try:
            it = self._start(run, self._progress)
            for record in it:
                run.add(record)
                if self._stop.is_set():
                    break
                self._maybe_flush()
            run.status = STOPPED if self._stop.is_set() else DONE
        except Exception as e:  # the run is over either way; keep what it produced, show why
            run.status = FAILED
            run.error = f"{type(e).__name__}: {e}"
            run.trace = traceback.format_exc()
        finally:
            if it is not None and hasattr(it, "close"):
                try:
                    it.close()
                except Exception:  # closing must not hide the run's own outcome
                    pass
            run.elapsed = time.time() - run.started
            run.current = ""
            self._report(run, True)
