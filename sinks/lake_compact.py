"""The lake's compactor: which small files to merge, and merging them in bounded memory.

A run of one-minute chunks leaves a file per chunk; readers pay an open for each, so after
a run the small files of a partition are merged. What a merge holds at once is bounded,
whatever the number and size of the files: at most `MERGE_MAX_FILES` inputs and
`MERGE_MAX_ROWS` rows (their strings dictionary-encoded while they are sorted), written a
row group at a time. A partition with more small files than one merge takes is merged in
passes: the first pass's outputs are small files again, merged by the next.

Where the merged file goes, and what replaces the inputs, is the lake's business
(`ParquetLake.compact`): this module plans batches and yields the merged rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from connectors import schema as tables
from sinks.lake_store import Entry

# A merge holds at most this many rows (about 45 bytes a row with its strings encoded,
# plus the sort's indices) and reads at most this many files (each read leaves ~40 KB of
# reader state behind until the merge ends): measured by bench/bench_lake_hostile.py.
MERGE_MAX_ROWS = 1_000_000
MERGE_MAX_FILES = 4096
# Files read before their rows are joined into one block (see `merged_rows`).
READ_GROUP_FILES = 64
# Rows decoded and written at a time, each one row group of the merged file.
MERGE_GROUP_ROWS = 64 * 1024

Owner = tuple[str, str]  # (flow, chunk_id)


@dataclass(frozen=True)
class SmallFile:
    """A data file worth merging: its listing entry, rows and owner chunks."""

    entry: Entry
    rows: int
    owners: tuple[Owner, ...]


def merge_batches(
    files: Sequence[SmallFile], *, max_rows: int, max_files: int = MERGE_MAX_FILES
) -> list[list[SmallFile]]:
    """Consecutive runs (by name) of `files`, each of at most `max_rows` rows and
    `max_files` files; a run of one file is left out (nothing to merge)."""
    batches: list[list[SmallFile]] = []
    batch: list[SmallFile] = []
    rows = 0
    for item in sorted(files, key=lambda f: f.entry.name):
        if batch and (rows + item.rows > max_rows or len(batch) >= max_files):
            batches.append(batch)
            batch, rows = [], 0
        batch.append(item)
        rows += item.rows
    batches.append(batch)
    return [b for b in batches if len(b) >= 2]


def owners_of(batch: Sequence[SmallFile]) -> dict[Owner, list[str]]:
    """For each owner chunk, the paths of the batch's files that hold its rows."""
    found: dict[Owner, list[str]] = {}
    for item in batch:
        for owner in item.owners:
            found.setdefault(owner, []).append(item.entry.path)
    return found


def merged_rows(
    read: Callable[[str, Sequence[str]], pa.Table],
    paths: Sequence[str],
    kind: str,
    group_rows: int,
    release: Callable[[], None] = lambda: None,
) -> tuple[pa.Schema, int, Iterator[pa.Table]]:
    """The rows of `paths` (each sorted by the kind's key) as one sorted stream.

    Returns the plain schema (strings decoded), the row count and the row groups, each
    at most `group_rows` rows, decoded only when asked for. `read(path, dictionary)`
    reads a file with the named string columns dictionary-encoded; `release` hands freed
    memory back to the system between row groups.
    """
    strings = [f.name for f in tables.SCHEMAS[kind] if pa.types.is_string(f.type)]
    # Strings stay dictionary-encoded while the files are held and sorted (a tag path is
    # 4 bytes a row instead of ~40); a row group at a time is decoded to be written. Files
    # are read a few at a time and their rows joined into one block per group: a table
    # per small file would hold its own buffers and metadata (~40 KB each).
    groups = []
    for start in range(0, len(paths), READ_GROUP_FILES):
        parts = [
            read(p, strings).replace_schema_metadata(None)
            for p in paths[start : start + READ_GROUP_FILES]
        ]
        groups.append(pa.concat_tables(parts).unify_dictionaries().combine_chunks())
        del parts
    merged = pa.concat_tables(groups).unify_dictionaries()
    del groups
    keys = tables.KEYS[kind]
    order = pc.sort_indices(
        _sort_keys(merged, keys), sort_keys=[(key, "ascending") for key in keys]
    )
    release()  # the sort's scratch, before the decoded row groups come
    plain = pa.schema(
        [
            f.with_type(f.type.value_type) if pa.types.is_dictionary(f.type) else f
            for f in merged.schema
        ]
    )

    def row_groups() -> Iterator[pa.Table]:
        for start in range(0, len(order), group_rows):
            part = merged.take(order.slice(start, group_rows)).cast(plain)
            yield part
            del part
            release()

    return plain, merged.num_rows, row_groups()


def _sort_keys(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The key columns of `table`, dictionary-encoded ones replaced by the rank of their value
    (same order as sorting the strings; the dictionaries must be unified)."""
    columns = []
    for key in keys:
        column = table.column(key)
        if pa.types.is_dictionary(column.type) and column.num_chunks:
            rank = pc.rank(column.chunk(0).dictionary, sort_keys="ascending").cast(pa.uint32())
            column = pa.chunked_array(
                [pc.take(rank, chunk.indices) for chunk in column.chunks], type=pa.uint32()
            )
        columns.append(column)
    return pa.table(columns, names=list(keys))
