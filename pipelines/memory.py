"""Keep a long run's memory flat: hand freed pages back instead of hoarding them.

Measured (BENCHMARKS.md): peak RSS of a run grew with its length although only a bounded
number of chunks is alive at once. Python objects were not the cause (tracemalloc: 7 MB
alive at the end); Arrow's jemalloc pool and glibc's per-thread malloc arenas kept the
freed pages. Arrow buffers on the system allocator, one malloc arena and a low trim
threshold cut a 5 M-row run's peak from 572 MB to 445 MB at the same speed.
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


def bound_memory() -> None:
    """Apply once per process, before worker threads start (the CLI's entry point)."""
    global _applied
    if _applied:
        return
    _applied = True
    import pyarrow as pa

    pa.set_memory_pool(pa.system_memory_pool())
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return
    mallopt(_M_ARENA_MAX, 1)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)
    log.debug("memory: Arrow on the system allocator, one malloc arena")
