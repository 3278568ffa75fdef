"""Handing freed memory back to the system after big segments and at the end of a run."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

def _load_malloc_trim():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _load_malloc_trim()


# A segment handing back at least this many bytes hands freed memory back to the system when done.
# Below it, the system's pages cost more to fault in again (the next segment reuses them) than the
# memory saved: on the tiny benchmark model, trimming after every segment cost 8% of the time
# (15% on the mid one) for 1-2 MB of peak.
TRIM_BYTES = 32 << 20


def return_freed_memory() -> None:
    """glibc keeps freed blocks below its (growing) mmap threshold, and each thread's blocks in its
    own arena: after a big segment, and at the end of a run, hand what was freed back to the system,
    so that memory follows the values alive, not the run's history."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
