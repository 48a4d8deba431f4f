"""Join the small fetched chunks of one window into one write.

Why: a write has a fixed cost whatever its size (a file, its intent record, fsyncs,
renames and a marker in the lake; a transaction, a scope delete and a progress merge in
the warehouse). An hourly run on 10,000 tags is 100 chunks of ~400 rows each: written one
by one, the fixed cost is most of the run, and the lake is left with 100 tiny files to
compact. Joined, the same rows go in one write (BENCHMARKS.md).

A joined write is still one atomic, idempotent write: its scope is the union of the
chunks' members over their common window, which both sinks replace and record like any
chunk's (an earlier write of any part of it, joined or not, is replaced, never
duplicated). Only chunks of the same window join: a scope has one window. Chunks of any
size pass through unchanged once they hold `small_rows` rows or more, and a joined write
never passes `max_rows`, so memory stays bounded by what a large chunk takes anyway.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from connectors.schema import table_from_frame
from connectors.timewindow import Window
from pipelines.core.engine import ChunkResult
from pipelines.planning import Chunk, chunk_label

# A chunk with fewer rows than this waits to be written with others of its window.
SMALL_ROWS = 25_000
# A joined write is flushed once it holds this many rows.
MAX_ROWS = 200_000


@dataclass
class _Pending:
    """Small results of one window waiting to be written together."""

    results: list[ChunkResult] = field(default_factory=list)
    rows: int = 0


def coalesce(
    results: Iterable[ChunkResult],
    expected: Counter[Window],
    *,
    small_rows: int = SMALL_ROWS,
    max_rows: int = MAX_ROWS,
) -> Iterator[ChunkResult]:
    """Yield `results` with the small ones of each window joined (see the module doc).

    `expected` counts the chunks of each window still to arrive: a window's joined write
    goes as soon as its last chunk is in, so at most the windows in flight wait. When the
    stream fails, what was already fetched is yielded (written) before the error goes on.
    """
    remaining = Counter(expected)
    waiting: dict[Window, _Pending] = {}
    try:
        for result in results:
            window = result.chunk.window
            remaining[window] -= 1
            if result.rows_fetched >= small_rows or result.pieces:
                yield result  # a chunk fetched in pieces is written a piece at a time
            elif _wait(waiting, result) >= max_rows:
                yield join(waiting.pop(window).results)
            # Written by now: not kept while the next one is fetched (nor through a
            # local naming the pending results: they would outlive their write).
            del result
            if remaining[window] <= 0 and window in waiting:
                yield join(waiting.pop(window).results)
    except Exception:
        for pending in list(waiting.values()):
            yield join(pending.results)
        waiting.clear()
        raise
    for pending in waiting.values():
        yield join(pending.results)


def _wait(waiting: dict[Window, _Pending], result: ChunkResult) -> int:
    """Put a small result with the others of its window; the rows they hold now."""
    pending = waiting.setdefault(result.chunk.window, _Pending())
    pending.results.append(result)
    pending.rows += result.rows_fetched
    return pending.rows


def join(results: list[ChunkResult]) -> ChunkResult:
    """One result for chunks of one window: their rows, members and costs together."""
    if len(results) == 1:
        return results[0]
    chunks = [result.chunk for result in results]
    window = chunks[0].window
    if any(chunk.window != window for chunk in chunks):
        raise ValueError("only chunks of one window join")
    members = tuple(member for chunk in chunks for member in chunk.members)
    first = chunks[0]
    joined = Chunk(
        unit_key=first.unit_key,
        dataset=first.dataset,
        kind=first.kind,
        members=members,
        window=window,
        chunk_id=joined_id(chunks),
        label=f"{chunk_label(members, window)} ({len(chunks)} chunks)",
    )
    return ChunkResult(
        chunk=joined,
        rows=_concat(results, first.kind),
        rows_fetched=sum(result.rows_fetched for result in results),
        requests=sum(result.requests for result in results),
        bytes_received=sum(result.bytes_received for result in results),
        seconds=sum(result.seconds for result in results),
        continuations=sum(result.continuations for result in results),
        parts=tuple(chunks),
        missing=tuple(tag for result in results for tag in result.missing),
        rows_out_of_range=sum(result.rows_out_of_range for result in results),
        values_not_of_type=_total(results, "values_not_of_type"),
    )


def _total(results: list[ChunkResult], count: str) -> int:
    """The sum of one count of the results (a ChunkResult field)."""
    return sum(int(getattr(result, count)) for result in results)


def joined_id(chunks: list[Chunk]) -> str:
    """A stable 20-hex id of a set of chunks (the order they arrived in does not matter)."""
    digest = hashlib.blake2b(digest_size=10)
    for chunk_id in sorted(chunk.chunk_id for chunk in chunks):
        digest.update(chunk_id.encode())
    return digest.hexdigest()


def _concat(results: list[ChunkResult], kind: str) -> pa.Table:
    """The results' rows as one table, one chunk per column, dictionaries unified."""
    with_rows = [result for result in results if result.rows_fetched] or results[:1]
    tables = [result.table for result in with_rows]
    try:
        table = pa.concat_tables(tables)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # Frames typed apart (a column plain in one, dictionary-encoded in another): the
        # kind's schema makes them one type.
        table = pa.concat_tables([table_from_frame(r.table, kind) for r in with_rows])
    return table.unify_dictionaries().combine_chunks()
