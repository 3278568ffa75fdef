"""Ending the process cleanly while runs are in progress.

The runs are daemon threads: the interpreter does not wait for them. But a daemon thread still inside
torch or onnxruntime (an export, a decomposition, a session being built) when the interpreter
finalizes is ended by ``pthread_exit`` as soon as it takes the GIL again; the unwinding crosses C++
frames that may not be unwound, and the process aborts ("terminate called without an active
exception", exit code 134) instead of ending with the script's own code.

So, at exit (``atexit``: before finalization, after the main script ended), every run still in
progress is stopped: its token fires (onnxruntime calls in flight return), and a thread still busy
afterwards gets ``InterpreterExiting`` raised in it (at its next Python bytecode: torch's exporter and
decompositions run Python all along), which unwinds it as any error does. The background threads
are shut down and waited for too. All of it is bounded by ``EXIT_GRACE_SECONDS``: a thread stuck in
a native call that ignores both is left as it is.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
import time
import weakref
from typing import Callable

from sbs_widget.errors import RunCancelled

EXIT_GRACE_SECONDS = 20.0  # at most this long spent at exit stopping runs
_NUDGE_SECONDS = 0.25  # a stopped thread still busy after this long gets InterpreterExiting raised in it

_TRACKED: "weakref.WeakKeyDictionary[threading.Thread, tuple[Callable[[], None], Callable[[], bool]]]" = \
    weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_REGISTERED = False


class InterpreterExiting(RunCancelled):
    """Raised in a run's thread when the process ends while the run is in progress."""

    def __init__(self, *args):
        super().__init__("run stopped: the process is exiting", "stopped", "")


def _always() -> bool:
    return True


def track(thread: threading.Thread, stop: Callable[[], None] | None = None,
          interruptible: Callable[[], bool] = _always) -> None:
    """Stop ``thread`` at exit if it is still running: ``stop()`` first, then, while ``interruptible()``
    (the thread is in its work, not in the code that reports its end), ``InterpreterExiting`` raised in
    it; waited for, within the grace."""
    global _REGISTERED
    with _LOCK:
        _TRACKED[thread] = (stop or (lambda: None), interruptible)
        if not _REGISTERED:
            atexit.register(stop_all)
            _REGISTERED = True


def _raise_in(thread: threading.Thread) -> None:
    ident = thread.ident
    if ident is not None and thread.is_alive():
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(InterpreterExiting))


def stop_all(grace: float = EXIT_GRACE_SECONDS) -> list[threading.Thread]:
    """Stop every tracked thread and the background threads, waiting up to ``grace`` seconds in all;
    returns the threads still alive (stuck in a native call)."""
    from sbs_widget.engine import background

    deadline = time.monotonic() + grace
    with _LOCK:
        tracked = [(t, *v) for t, v in list(_TRACKED.items()) if t.is_alive() and t is not threading.current_thread()]
    for _, stop, _ in tracked:
        try:
            stop()
        except Exception:  # noqa: BLE001 - exiting: the next thread is stopped all the same
            pass
    pending = [(t, interrupt) for t, _, interrupt in tracked]
    nudged: dict[threading.Thread, float] = {}
    start = time.monotonic()
    while pending and time.monotonic() < deadline:
        for t, interrupt in pending:
            t.join(0.05)
            now = time.monotonic()
            if t.is_alive() and interrupt() and now - start >= _NUDGE_SECONDS and now - nudged.get(t, 0) >= 1.0:
                nudged[t] = now  # again each second: torch may have caught and dropped the first one
                _raise_in(t)
        pending = [(t, i) for t, i in pending if t.is_alive()]
    workers = background.shutdown_all()  # after the runs: a run still going would start them again
    for w in workers:  # a call in flight there (a session being built) ends on its own
        w.join(max(0.0, deadline - time.monotonic()))
    return [t for t, _ in pending] + [w for w in workers if w.is_alive()]
