"""The `historian` process keeps Arrow buffers on the system allocator (flat memory)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_bound_memory_moves_arrow_to_the_system_pool_and_is_idempotent() -> None:
    code = (
        "from pipelines.core.memory import bound_memory; import pyarrow as pa; "
        "bound_memory(); bound_memory(); print(pa.default_memory_pool().backend_name)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "system"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim, /proc")
def test_release_memory_hands_freed_heap_pages_back() -> None:
    # 200 MB of small malloc'd blocks, all freed but one at the top of the heap: the trim
    # threshold cannot return what lies below it; release_memory() does.
    code = """
import ctypes, ctypes.util
from pipelines.core.memory import bound_memory, release_memory
bound_memory()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
blocks = [libc.malloc(64 * 1024) for _ in range(3200)]
for address in blocks:
    ctypes.memset(address, 1, 64 * 1024)
for address in blocks[:-1]:
    libc.free(address)
before = rss()
release_memory()
print(before - rss())
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert int(result.stdout.strip()) > 100, result.stdout
