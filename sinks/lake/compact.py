"""The lake's compactor: which small files to merge, and merging them in bounded memory.

A run of one-minute chunks leaves a file per chunk; readers pay an open for each, so after
a run the small files of a partition are merged. What a merge holds at once is bounded,
whatever the number and size of the files: at most `MERGE_MAX_FILES` inputs and
`MERGE_MAX_ROWS` rows (their strings dictionary-encoded while they are sorted), written a
row group at a time. A partition with more small files than one merge takes is merged in
passes: the first pass's outputs are small files again, merged by the next.

`Compactor` drives it: each batch is merged into the path of its last file (one rename:
a reader reading in name order sees every row, old or merged), the others are emptied,
through the journal like any write, and the markers of the merged chunks are pointed at
the merged file. The lake holds the dataset's lock and recovers it first
(`ParquetLake.compact`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from connectors import schema as tables
from sinks.lake.dataset import DatasetFacts
from sinks.lake.files import LakeFiles
from sinks.lake.journal import Journal, Plan, empty_op, place_op
from sinks.store.layout import Owner, in_dataset
from sinks.store.objects import Entry

# A merge holds at most this many rows (about 45 bytes a row with its strings encoded,
# plus the sort's indices) and reads at most this many files (each read leaves ~40 KB of
# reader state behind until the merge ends): measured by bench/bench_lake_hostile.py.
MERGE_MAX_ROWS = 1_000_000
MERGE_MAX_FILES = 4096
# Files read before their rows are joined into one block (see `merged_rows`).
READ_GROUP_FILES = 64
# Rows decoded and written at a time, each one row group of the merged file.
MERGE_GROUP_ROWS = 64 * 1024


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


def release_unused() -> None:
    """Hand Arrow's freed memory back to the system now (its pool keeps it for reuse)."""
    pa.default_memory_pool().release_unused()


class Compactor:
    """Merges the small files of a dataset's partitions, batch by batch, pass by pass."""

    def __init__(
        self, files: LakeFiles, journal: Journal, datasets: DatasetFacts, *, target_file_rows: int
    ) -> None:
        self.files = files
        self.journal = journal
        self.datasets = datasets
        self.store = journal.store
        self.target_file_rows = target_file_rows

    def compact(self, dataset: str, kind: str, min_rows: int) -> int:
        """Merge each partition's files under `min_rows` rows; how many were merged away."""
        merged = 0
        for label in self.partitions(dataset, kind):
            while True:  # passes: a pass's outputs may be small files again
                done = self.compact_partition(dataset, kind, label, min_rows)
                merged += done
                if not done:
                    break
        return merged

    def partitions(self, dataset: str, kind: str) -> list[str]:
        """Partition directories (relative to the dataset) holding data files, after
        retiring the 0-row files not retired yet and removing those retired longer ago
        than the grace (`LakeFiles.swept`, one listing for all)."""
        top = self.store.path(dataset)
        prefix = top.rstrip("/") + "/"
        listing = []
        for entry in self.store.find(top):
            parts = entry.path[len(prefix) :].split("/")
            if not any(p.startswith((".", "_")) for p in parts[:-1]):
                listing.append(("/".join(parts[:-1]), entry))
        kept, _ = self.files.swept(
            [entry for _, entry in listing],
            kind,
            lambda paths: self.journal.retire(dataset, paths),
        )
        paths = {entry.path for entry in kept}
        return sorted({label for label, entry in listing if entry.path in paths})

    def compact_partition(self, dataset: str, kind: str, label: str, min_rows: int) -> int:
        """One pass over a partition: merge its small files in bounded batches."""
        small = []
        for entry in self.files.data_files(self.store.path(dataset, label)):
            info = self.files.info(entry, kind)
            if 0 < info.rows < min_rows:
                small.append(SmallFile(entry, info.rows, info.owners))
        limit = min(self.target_file_rows, MERGE_MAX_ROWS)
        merged = 0
        for batch in merge_batches(small, max_rows=limit):
            merged += self.merge(dataset, kind, batch)
        return merged

    def merge(self, dataset: str, kind: str, batch: list[SmallFile]) -> int:
        """Merge a batch into the path of its last file (one rename: a reader reading in
        name order sees every row, old or merged), then empty the others."""
        digest = hashlib.blake2b(digest_size=8)
        for item in batch:
            digest.update(orjson.dumps([item.entry.name, item.entry.version]))
        plan = Plan(ident=f"compact-{digest.hexdigest()}", dataset=dataset)
        by_owner = owners_of(batch)
        owners = sorted(by_owner)
        last = batch[-1].entry
        rel = self.store.relative(last.path)
        try:
            schema, rows, groups = merged_rows(
                lambda path, strings: self.store.read_table(path, dictionary=strings),
                [item.entry.path for item in batch],
                kind,
                min(MERGE_GROUP_ROWS, self.journal.format.group_rows),
                release_unused,
            )
            metadata = self.datasets.file_metadata(dataset, kind, owners)
            temp = self.journal.stage_parts(plan, schema, groups, rel, metadata)
        except BaseException:
            self.journal.discard(plan)
            raise
        plan.ops = [place_op(temp, rel, owners, last)]
        plan.ops += [
            empty_op(self.store.relative(item.entry.path), item.owners) for item in batch[:-1]
        ]
        for owner, paths in by_owner.items():
            plan.update(
                owner,
                remove=[in_dataset(self.store.relative(p)) for p in paths],
                add={in_dataset(rel): rows},
            )
        self.journal.commit(plan)
        return len(batch)
