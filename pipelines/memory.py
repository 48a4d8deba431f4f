"""Keep a long run's memory flat: hand freed pages back instead of hoarding them.

Measured (BENCHMARKS.md): peak RSS of a run grew with its length although only a bounded
number of chunks is alive at once. Python objects were not the cause (tracemalloc: 7 MB
alive at the end); Arrow's jemalloc pool and glibc's per-thread malloc arenas kept the
freed pages. Arrow buffers on the system allocator, one malloc arena and a low trim
threshold cut a 5 M-row run's peak from 572 MB to 445 MB at the same speed. What was left
was the end-of-run compaction (now ~half the memory, sinks/parquet.py) and heap pages freed
below live blocks, which `release_memory` hands back between chunks: 5 M to 20 M rows in
one run now peak at 310-325 MB.
"""

from __future__ import annotations

import ctypes
import ctypes.util
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
    """Hand the heap's free pages back to the system (between chunks: ~3 ms each, measured).

    The trim threshold only returns the top of the heap; pages freed below a live block
    stay resident until `malloc_trim`, and the next chunk's peak would stack on them.
    """
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
