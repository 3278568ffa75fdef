"""Bounding and stopping a run.

A ``Cancel`` token goes with each run. The engine checks it once per segment (a monotonic clock
read); firing it (time limit, ``SbsWidget.stop()``, Ctrl-C or SIGTERM) also sets ``terminate`` on the
onnxruntime ``RunOptions`` of the run's calls, which makes a call in flight (a Loop with a huge trip
count, say) return with an error at its next node or iteration. A runtime that cannot be interrupted
is waited for up to ``GRACE_SECONDS``, then abandoned (``background.renew``).
"""

from __future__ import annotations

import math
import os
import re
import signal
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable

from sbs_widget.errors import InputError, RunCancelled, RunTimeout

# Why a run ended early (``Cancel.reason``).
TIMEOUT, STOPPED, INTERRUPTED = "time limit", "stopped", "interrupted"

GRACE_SECONDS = 2.0  # a call that ignores terminate is abandoned after this long

_local = threading.local()  # the token of the runtime call this thread is making


def check_time_limit(time_limit) -> float | None:
    if time_limit is None:
        return None
    try:
        value = float(time_limit)
    except (TypeError, ValueError):
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"time_limit must be a number of seconds > 0 (or None for no limit), not {time_limit!r}")
    return value


class Cancel:
    """The stop switch and deadline of one run; ``cancel()`` may be called from any thread."""

    def __init__(self, time_limit: float | None = None):
        self.time_limit = check_time_limit(time_limit)
        self.reason: str | None = None
        self.signal_name = "Ctrl-C"  # what interrupted the run (``ctrl_c`` sets SIGTERM)
        self.deadline: float | None = None
        self._timer: threading.Timer | None = None
        self._run_options = None  # onnxruntime.RunOptions shared by the run's calls
        self._lock = threading.Lock()

    def start(self) -> None:
        """Arm the time limit (from the run's first record on)."""
        if self.time_limit is not None and self.deadline is None:
            self.deadline = time.monotonic() + self.time_limit
            # A timer, not only the per-segment check: a call in flight must be terminated.
            self._timer = threading.Timer(self.time_limit, self.cancel, (TIMEOUT,))
            self._timer.daemon = True
            self._timer.start()

    def finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def cancel(self, reason: str = STOPPED) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
            if self._run_options is not None:
                self._run_options.terminate = True

    @property
    def cancelled(self) -> bool:
        if self.reason is None and self.deadline is not None and time.monotonic() >= self.deadline:
            self.cancel(TIMEOUT)
        return self.reason is not None

    def check(self, where: Callable[[], str] | str = "") -> None:
        """Raise ``RunTimeout`` / ``RunCancelled`` once the token fired."""
        if self.cancelled:
            raise self.error(where() if callable(where) else where)

    def error(self, where: str = "") -> RunCancelled:
        at = f" {where}" if where else ""
        if self.reason == TIMEOUT:
            return RunTimeout(f"time limit of {self.time_limit:g} s reached{at}; the records computed so far "
                              "are kept. Raise time_limit (CLI --time-limit) for a longer run, or see why that "
                              "node takes so long (a Loop with a huge trip count, say)", self.reason, where)
        what = f"interrupted ({self.signal_name})" if self.reason == INTERRUPTED else "stopped"
        return RunCancelled(f"run {what}{at}; the records computed so far are kept", self.reason, where)

    def run_options(self, ort):
        """The onnxruntime RunOptions of this run (terminated once the token fires)."""
        with self._lock:
            if self._run_options is None:
                opts = ort.RunOptions()
                opts.log_severity_level = 4  # a terminated call is reported by the run, not logged
                opts.terminate = self.reason is not None
                self._run_options = opts
            return self._run_options

    def call(self, fn: Callable, *args):
        """``fn(*args)`` with this token as the thread's current one (runtimes read it)."""
        before = getattr(_local, "token", None)
        _local.token = self
        try:
            return fn(*args)
        finally:
            _local.token = before

    def wait(self, future: Future, abandon: Callable[[], None], where: Callable[[], str] = str):
        """``future.result()``, given up ``GRACE_SECONDS`` after the token fired if the call it
        runs ignores terminate (``abandon()`` then frees the thread it holds for other runs)."""
        while True:  # short slices: the token may fire from another thread at any time
            try:
                return future.result(timeout=0.2)
            except FutureTimeout:
                if self.cancelled:
                    break
        try:
            return future.result(timeout=GRACE_SECONDS)
        except FutureTimeout:
            abandon()
            raise self.error(f"{where()} (the runtime call did not end and was abandoned)") from None


def current_run_options(ort):
    """For a runtime: the RunOptions of the run calling it, None outside a run."""
    token = getattr(_local, "token", None)
    return None if token is None else token.run_options(ort)


_ORT_NODE = re.compile(r"running (\w+) node\. Name:'([^']*)'")


def failed_node(error: BaseException) -> str:
    """The node an onnxruntime error names (``Loop node 'x'``), or ''."""
    m = _ORT_NODE.search(str(error))
    return f"{m.group(1)} node {m.group(2)!r}" if m else ""


# The signals that interrupt a run: Ctrl-C, and SIGTERM (``kill``, a job scheduler, a container
# stopping), which would otherwise end the process at once, without the records computed so far.
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ctrl_c:
    """``with ctrl_c(token, on_stuck):`` the first Ctrl-C or SIGTERM fires ``token`` at once, even
    while the main thread is inside a runtime call (a watcher thread reads Python's signal wakeup fd);
    if the run has not ended ``GRACE_SECONDS`` later, ``on_stuck()`` runs in the watcher (write what is
    computed) and the process exits with 130. A second one raises KeyboardInterrupt as Ctrl-C does.
    Main thread only; elsewhere it does nothing."""

    def __init__(self, token: Cancel, on_stuck: Callable[[], None]):
        self.token, self.on_stuck = token, on_stuck
        self.active = threading.current_thread() is threading.main_thread()
        self.fired = False
        self._signals = 0
        self._done = threading.Event()

    def __enter__(self) -> "ctrl_c":
        if not self.active:
            return self
        self._read, write = os.pipe()
        os.set_blocking(write, False)
        self._write = write
        self._old_fd = signal.set_wakeup_fd(write)
        self._old_handlers = {s: signal.signal(s, self._handler) for s in SIGNALS}
        threading.Thread(target=self._watch, name="sbs-ctrl-c", daemon=True).start()
        return self

    def _handler(self, signum, frame) -> None:
        # (the watcher fires the token on the same signal, earlier: the count is the handler's own)
        self._signals += 1
        if self._signals > 1:  # the second Ctrl-C (or SIGTERM)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self._fire(signum)

    def _fire(self, signum: int) -> None:
        if not self.fired:
            self.fired = True
            if signum == signal.SIGTERM:
                self.token.signal_name = "SIGTERM"
            self.token.cancel(INTERRUPTED)
            threading.Thread(target=self._deadline, name="sbs-ctrl-c-grace", daemon=True).start()

    def _watch(self) -> None:
        try:
            while True:
                data = os.read(self._read, 64)
                if not data:  # the write end closed: the run is over
                    return
                fired = next((s for s in SIGNALS if s in data), None)
                if fired is not None:
                    self._fire(fired)
        except OSError:
            return
        finally:
            os.close(self._read)

    def _deadline(self) -> None:
        if self._done.wait(GRACE_SECONDS):
            return
        try:  # the main thread is stuck in a call that ignores terminate
            self.on_stuck()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)

    def __exit__(self, *exc) -> None:
        self._done.set()
        if not self.active:
            return
        for s, old in self._old_handlers.items():
            signal.signal(s, old)
        signal.set_wakeup_fd(self._old_fd)
        os.close(self._write)  # the watcher reads the end of the pipe and closes its end


def where_in(index, start: int, end: int, error: BaseException | None = None) -> str:
    """Where a run ended, for its message: the node onnxruntime names, else the control-flow nodes
    of ONNX nodes ``[start, end)`` (the likely long ones), else the range."""
    node = failed_node(error) if error is not None else ""
    if not node:
        loops = [i for i in range(start, end) if index.nodes[i].op_type in ("Loop", "Scan", "If")][:3]
        node = ", ".join(f"{index.nodes[i].op_type} node {index.nodes[i].name!r}" for i in loops)
    span = f"ONNX nodes {start}-{end - 1} of {len(index.nodes)}" if end - start > 1 else \
        f"ONNX node {start} of {len(index.nodes)}"
    return f"at {node} ({span})" if node else f"at {span}"


def cli_time_limit(text: str) -> float:
    """argparse type of ``--time-limit``: seconds > 0."""
    import argparse

    try:
        return check_time_limit(text)
    except InputError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0 (e.g. 60)") from None
