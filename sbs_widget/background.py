"""The engine's background threads: one builds sessions ahead, one runs a segment while the FX
side computes the same stretch of the model (onnxruntime and torch kernels release the GIL)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

_POOLS: dict[str, ThreadPoolExecutor] = {}
NAMES = ("sbs-compile", "sbs-run")


def background(name: str) -> ThreadPoolExecutor:
    """One thread per task, shared by every run: ``sbs-compile`` builds sessions ahead, one at a
    time; ``sbs-run`` runs a segment."""
    pool = _POOLS.get(name)
    if pool is None:
        pool = _POOLS[name] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
    return pool


def start_threads() -> None:
    """Start the threads now, while no other thread holds the GIL: started in the middle of a run,
    a new thread waits for the GIL, and its starter for the new thread."""
    for name in NAMES:
        background(name).submit(int)
