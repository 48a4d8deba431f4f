"""Writer processes of the contract suite's concurrency case (started with `spawn`).

Each process builds its own sink over the shared place, waits for the others at a
barrier, writes its chunks (disjoint scopes of one dataset: another node, the same node's
other tags, the same node's other hours) under its own lock key, and compacts the
dataset after its first chunk, while the others write.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import replace
from typing import Any

import pandas as pd

from connectors import schema
from sinks.base import Compacts, Sink
from tests.sinks.contract_sinks import build
from tests.sinks.sql.sql_frames import history, hours, scope

# One job: (lock key, progress key, node, [(tags, first hour, last hour), ...]).
Job = tuple[str, str, str, list[tuple[list[str], int, int]]]


def chunks_of(job: Job) -> list[tuple[Any, Any]]:
    """The job's chunks, an hour each: (scope, frame)."""
    _, key, node, parts = job
    made = []
    for tags, first, last in parts:
        for hour in range(first, last):
            window = hours(hour, hour + 1)
            frame = history(tags, window, step_s=900, node=node)
            chunk = scope(tags, window, flow=key, node=node)
            # Shards of one key write the same hours for other tags: ids name the tags too.
            made.append((replace(chunk, chunk_id=f"{chunk.chunk_id}-{'-'.join(tags)}"), frame))
    return made


def write_job(cls: str, kwargs: dict[str, Any], job: Job, barrier: Any) -> None:
    """The process's work (module docstring); raises on any failure (non-zero exit)."""
    sink = build(cls, kwargs)
    sink.open()
    try:
        with sink.lock(job[0]):
            barrier.wait(timeout=120)
            for number, (chunk_scope, frame) in enumerate(chunks_of(job)):
                assert sink.write(chunk_scope, frame, len(frame)) == len(frame)
                if number == 0 and isinstance(sink, Compacts):  # a merge while others write
                    sink.compact(chunk_scope.dataset)
    finally:
        sink.close()


JOBS: list[Job] = [
    ("f@north#1-of-2", "f@north", "north", [(["a", "b"], 0, 2)]),
    # The same node: other tags over the same hours, then the first shard's tags later on.
    ("f@north#2-of-2", "f@north", "north", [(["c", "d"], 0, 2), (["a", "b"], 2, 4)]),
    ("f@south", "f@south", "south", [(["a", "b"], 0, 3)]),  # another node, the same tags
]


def run_writers(cls: str, kwargs: dict[str, Any], jobs: list[Job] = JOBS) -> None:
    """Run each job in a process of its own, all at once; every one must succeed."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(jobs))
    writers = [context.Process(target=write_job, args=(cls, kwargs, job, barrier)) for job in jobs]
    for writer in writers:
        writer.start()
    try:
        for writer in writers:
            writer.join(timeout=240)
        assert [w.exitcode for w in writers] == [0] * len(jobs)
    finally:
        for writer in writers:
            if writer.is_alive():
                writer.kill()
                writer.join()


def assert_every_scope_once(sink: Sink) -> None:
    """The sink holds exactly the union of `JOBS`' chunks, and each key's progress."""
    from tests.sinks.test_contract import assert_holds

    expected = pd.concat([frame for job in JOBS for _, frame in chunks_of(job)], ignore_index=True)
    assert_holds(sink, "hist", schema.KIND_TAG_HISTORY, expected)
    north = sink.progress("f@north")
    assert north.windows_of("a") == [hours(0, 4)]
    assert north.windows_of("c") == [hours(0, 2)]
    assert sink.progress("f@south").windows_of("b") == [hours(0, 3)]
    assert len(sink.chunk_log("f@north", limit=100)) == 2 + 4
    from tests.sinks.contract_ledger import assert_ledger_holds

    ledger = assert_ledger_holds(sink, "hist")  # every chunk's ledger rows, and no other
    assert len(ledger) == sum(len(s.members) for job in JOBS for s, _ in chunks_of(job))
