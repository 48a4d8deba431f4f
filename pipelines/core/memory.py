"""Keep a long run's memory flat without paying for it in system time.

Where a backfill's memory goes (bench/memory_attribution.py, BENCHMARKS.md "Flat memory"):
the libraries imported (~150 MB), the chunks held (at most the node's connections + 1:
`engine.stream_bounded`), and each answer's parse (about three copies of the answer, one
parse at a time: `connectors.fetch`). Peaks grew with the run's length when freed memory
was kept in many places: Arrow's own pool and one malloc arena per thread. So Arrow's
buffers go to the system allocator and glibc keeps one arena.

What glibc does with a freed block decides the system time: below its mmap threshold a
block is reused from the heap; above it, each block is a fresh mapping that the kernel
zero-fills page by page (a fault per 4 KB) and unmaps when freed. A fixed low threshold
(setting the trim threshold fixes it: `mallopt(3)`) and `malloc_trim` after each chunk
held the peak down by faulting every chunk's pages in again: a third of a big backfill's
CPU was the kernel's. Thresholds above one answer's size (`max_answer_mb`, 16 MB by
default) keep the buffers of every chunk in the heap for the next, so the peak is what
the chunks held need, reached once, and free memory at the top of the heap beyond the
trim threshold still goes back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger("historian.memory")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# Blocks below this come from the heap and are reused; above it, mapped and unmapped.
MMAP_THRESHOLD_BYTES = 32 << 20
# Free memory at the top of the heap beyond this is handed back.
TRIM_THRESHOLD_BYTES = 32 << 20
_applied = False
_frozen = False
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
        # mallopt is glibc's (not musl's, not macOS's): nothing to tune elsewhere.
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
    libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    log.debug("memory: Arrow on the system allocator, one malloc arena, buffers reused")


def freeze_imports() -> None:
    """Once per process, as a run starts: leave what exists by then out of the collector.

    Every full (generation 2) pass of CPython's cyclic collector walks every tracked
    object, and the libraries a run imports (pandas, pyarrow, SQLAlchemy, pydantic, httpx)
    make most of them at import: an hourly 10,000-tag run spent ~0.2 s of CPU in five such
    passes over objects that live as long as the process (BENCHMARKS.md). Frozen, they are
    never walked again; what the run makes afterwards is collected as before. Once only:
    a later freeze would keep the cycles an earlier run left for good.
    """
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.freeze()  # no collection first: a full pass is what this spares


def skip_collection_at_exit() -> None:
    """When a command is done: spare the interpreter's last walk over every object.

    At exit, after the atexit handlers, CPython runs the cyclic collector over every
    object still alive, and a command that loaded pandas, pyarrow and pydantic holds
    millions: the walk was a visible part of a short run (BENCHMARKS.md). Frozen objects are
    left out of it; they are freed with the process all the same.
    """
    gc.freeze()
