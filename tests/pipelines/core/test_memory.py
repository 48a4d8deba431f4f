"""The `historian` process keeps Arrow buffers on the system allocator, and a chunk's
buffers are reused by the next instead of being faulted in again (flat memory, little
system time)."""

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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt, getrusage")
def test_an_answer_sized_buffer_freed_is_reused_without_faulting_its_pages_again() -> None:
    # 10 MB, an answer's size: below the mmap threshold it comes from the heap and, freed,
    # stays there for the next one; above it (glibc's default once the trim threshold is
    # set low) each one is a fresh mapping, 2,560 page faults to fill.
    code = """
import ctypes, ctypes.util, resource
from pipelines.core.memory import bound_memory
bound_memory()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
size = 10 << 20
def faults_of_one_buffer():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    address = libc.malloc(size)
    ctypes.memset(address, 1, size)
    libc.free(address)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
first = faults_of_one_buffer()
print(first, max(faults_of_one_buffer() for _ in range(5)))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    first, again = (int(n) for n in result.stdout.split())
    assert first >= 2000, result.stdout  # the first fills its pages once
    assert again < 100, result.stdout  # the next ones find them in the heap


def test_a_runs_start_freezes_what_the_imports_made_once_and_later_cycles_are_collected() -> None:
    """In a fresh process, as `historian run` is: the first run's start freezes what exists
    (a full collection then walks none of it), a later start freezes nothing more, and a
    cycle made after it is still collected."""
    code = """
import gc
from pipelines.core.memory import freeze_imports
assert gc.get_freeze_count() == 0
freeze_imports()
first = gc.get_freeze_count()
made = [[] for _ in range(10_000)]
freeze_imports()
later = gc.get_freeze_count()
class Node:
    pass
one, two = Node(), Node()
one.other, two.other = two, one
del one, two
print(first, later, gc.collect())
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    first, later, collected = (int(word) for word in result.stdout.split())
    assert first > 1_000, "the imports' objects are frozen"
    assert later == first, "a second start does not freeze the objects made since"
    assert collected >= 2, "a cycle made after the freeze is collected"
