"""Keep a long run's memory flat: hand freed pages back instead of hoarding them.

Why: peak RSS of a run grew with its length although only a bounded number of chunks is
alive at once. Python objects were not the cause (few were alive at the end); Arrow's
jemalloc pool and glibc's per-thread malloc arenas kept the freed pages. Arrow buffers on
the system allocator, one malloc arena and a low trim threshold cut the peak at the same
speed; heap pages freed below live blocks are handed back between chunks by
`release_memory`, so the peak no longer grows with the run's length (the figures:
BENCHMARKS.md, "Figures behind design choices").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger("historian.memory")

_M_TRIM_THRESHOLD = -1
_M_ARENA_MAX = -8
_TRIM_THRESHOLD_BYTES = 128 * 1024
_applied = False
_libc: ctypes.CDLL | None = None
_libc_looked_up = False


def _glibc() -> ctypes.CDLL | None:
    global _libc, _libc_looked_up
    if not _libc_looked_up:
        _libc_looked_up = True
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name) if name else None
        except OSError:
            libc = None
        # mallopt and malloc_trim are glibc's (not musl's, not macOS's): nothing to tune.
        if libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim"):
            _libc = libc
    return _libc


def bound_memory() -> None:
    """Apply once per process, before worker threads start (the CLI's entry point)."""
    global _applied
    if _applied:
        return
    _applied = True
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())
    libc = _glibc()
    if libc is None:
        return
    libc.mallopt(_M_ARENA_MAX, 1)
    libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)
    log.debug("memory: Arrow on the system allocator, one malloc arena")


def release_memory() -> None:
    """Hand the heap's free pages back to the system (between chunks: cheap next to a chunk).

    The trim threshold only returns the top of the heap; pages freed below a live block
    stay resident until `malloc_trim`, and the next chunk's peak would stack on them.
    """
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def skip_collection_at_exit() -> None:
    """When a command is done: spare the interpreter's last walk over every object.

    At exit, after the atexit handlers, CPython runs the cyclic collector over every
    object still alive, and a command that loaded pandas, pyarrow and pydantic holds
    millions: the walk was a visible part of a short run (BENCHMARKS.md). Frozen objects are
    left out of it; they are freed with the process all the same.
    """
    gc.freeze()
