"""The engine's background threads: one builds sessions ahead, one runs a segment while the FX
side computes the same stretch of the model (onnxruntime and torch kernels release the GIL).

Each is a daemon thread with a queue (not a ThreadPoolExecutor, whose threads the interpreter joins
at exit): a thread stuck in a runtime call that cannot be interrupted is abandoned (``renew``), and
neither later runs nor the end of the process wait for it."""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future

NAMES = ("sbs-compile", "sbs-run")


class Worker:
    """One daemon thread running submitted calls in order."""

    def __init__(self, name: str):
        self.name = name
        self.busy = 0  # calls submitted and not done
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        self.thread.start()

    def submit(self, fn, *args) -> Future:
        if self._closed:
            raise RuntimeError(f"background thread {self.name} was abandoned")
        future: Future = Future()
        with _LOCK:
            self.busy += 1
        self._queue.put((future, fn, args))
        return future

    def _main(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            future, fn, args = item
            if not future.set_running_or_notify_cancel():
                self._release()
                continue
            try:
                result = fn(*args)
            except BaseException as e:  # handed to the waiting run, as an executor would
                self._release()  # (before the waiter wakes: its next segment finds the thread idle)
                future.set_exception(e)
            else:
                self._release()
                future.set_result(result)
            item = future = fn = args = result = None  # nothing held while idle

    def _release(self) -> None:
        with _LOCK:
            self.busy -= 1

    def shutdown(self) -> None:
        """No more calls; queued ones are cancelled; the thread ends after its current call."""
        self._closed = True
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        self._queue.put(None)


_POOLS: dict[str, Worker] = {}
_LOCK = threading.Lock()


def background(name: str) -> Worker:
    """One thread per task, shared by every run: ``sbs-compile`` builds sessions ahead, one at a
    time; ``sbs-run`` runs a segment."""
    pool = _POOLS.get(name)
    if pool is None:
        with _LOCK:
            pool = _POOLS.get(name)
            if pool is None:
                pool = _POOLS[name] = Worker(name)
    return pool


def submit_if_idle(name: str, fn) -> Future | None:
    """``fn`` submitted to thread ``name`` when it has nothing else to do, else None (the caller runs
    it itself): a run never queues behind another run's segment, stuck or slow."""
    pool = background(name)
    with _LOCK:
        if pool.busy:
            return None
    try:
        return pool.submit(fn)
    except RuntimeError:  # abandoned meanwhile: the caller runs it
        return None


def renew(name: str) -> None:
    """Abandon thread ``name`` (stuck in a call that cannot be interrupted): later calls go to a
    fresh thread; the old one ends whenever its call returns."""
    with _LOCK:
        old = _POOLS.pop(name, None)
    if old is not None:
        old.shutdown()


def shutdown_all() -> list[threading.Thread]:
    """Shut every thread down (queued calls cancelled; a call in flight ends on its own) and forget
    them (later calls get fresh threads): their threads, to wait for. At exit (``shutdown.stop_all``)."""
    with _LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.shutdown()
    return [pool.thread for pool in pools]


def start_threads() -> None:
    """Start the threads now, while no other thread holds the GIL: started in the middle of a run,
    a new thread waits for the GIL, and its starter for the new thread."""
    for name in NAMES:
        background(name)
