"""The Parquet lake: Hive-partitioned Parquet files any engine reads, written exactly once.

Layout (under the lake's root, a local directory or any fsspec URL such as s3://b/prefix)::

    <root>/<dataset>/node-<node>/date=YYYY-MM-DD/part-<chunk_id>[-<n>].parquet  "date"
    <root>/<dataset>/node-<node>/month=YYYY-MM/part-<chunk_id>[-<n>].parquet    "month"
    <root>/<dataset>/node-<node>/year=YYYY/part-<chunk_id>[-<n>].parquet        "year"
    <root>/<dataset>/node-<node>/part-<chunk_id>[-<n>].parquet                  "none"
    <root>/tag_metadata/part-tag_metadata.parquet                    the tag dimension
    <root>/_quarantine/<dataset>/<path>      unreadable files `historian verify --repair`
                                             moved aside (sinks.verify.lake)
    <root>/<dataset>.coverage/<key>/part-<chunk_id>.parquet    the completeness ledger
                                                (sinks/lake/ledger.py), in the chunk's commit
    <root>/_historian/                                               the sink's own state
        _flows/<key>/markers/<chunk_id>.json    one per committed chunk: flow, dataset,
                                                chunk_id, window, members, files (with
                                                row counts), rows fetched/committed,
                                                committed_at
        _flows/<key>/progress.json              compacted progress snapshot (a cache)
        _flows/<key>/resets.json                per-member reset moments
        <dataset>/dataset.json                  kind, partition scheme, node level, attrs
        <dataset>/pending/<id>.json             intent of a write in progress
        <dataset>/tmp/                          staged files (never under <dataset>/)
        <dataset>/empty.parquet                 what emptied data files become
        <dataset>/write.lock, locks/<key>.lock  flocks (local disk)
        <dataset>/write.lease, locks/<key>.lease.json   leases (object storage)

A dataset holds many nodes' rows: each under `node-<node>` (the name percent-encoded;
not a Hive key: `node` is a column of every file, sinks/store/layout.py), so writers of
different nodes touch disjoint directories. Datasets created by earlier versions (one
node each, `dataset.json` without `node_level`) keep their partitions right under
`<dataset>/`. `<key>` is a progress or lock key (`flow`, `flow@node`, `flow@node#2-of-4`),
percent-encoded when it is not a plain name (`lake_layout.key_name`).

Partitions are by the UTC day (month, year) of `ts`. `partition="auto"` (the default)
picks a dataset's scheme when its first chunk is written, from the flow's chunk size
(`lake_layout.auto_partition`: day, week, quarter-year windows -> date, month, year), so a
chunk is one file, not one per day; `dataset.json` records the scheme and the dataset
keeps it. Readers see the partition column its directories name (`date`, `month` or
`year`); `ts` is in every file, so filter on `ts`. The Hive names let pyarrow.dataset,
DuckDB (`read_parquet('<root>/<dataset>/**/*.parquet', hive_partitioning=1)`), Polars
`scan_parquet` and `pandas.read_parquet('<root>/<dataset>')` read a dataset directly;
the node directories are no Hive key, so `node` comes from the files.
`ts` is `timestamp[ms, tz=UTC]`; the dataset's attrs (mode, method, interval...) are in
each file's schema metadata under `historian`, and the chunks whose rows a file holds
under `historian.owners`.

A write replaces its scope's rows partition by partition: the overlap planner
(`sinks.lake.overlap`) finds the earlier files holding rows of the scope by their footers
(`sinks.lake.files`) and decides which are swapped, joined, trimmed or emptied; the
journal (`sinks.lake.journal`) stages the files, records the intent, applies it and
recovers an interrupted one; the compactor (`sinks.lake.compact`) merges small files;
markers and progress are `sinks.lake.state`, a dataset's stored facts
`sinks.lake.dataset`. This class is the Sink facade over them: validation, locks, errors.

What a reader of the plain folder sees (pyarrow.dataset, DuckDB, pandas, Polars):

* Every change of a data file is an atomic rename over its path, and a file whose rows
  all left becomes an empty Parquet file (0 rows, the dataset's schema; `_historian/
  <dataset>/empty.parquet`) instead of being removed. A 0-row file goes in two steps
  (`sinks.lake.files`): the first write or compaction of its partition that finds it
  retires it (a 0-row file stamped with that moment, renamed over it), and one at least
  `reader_grace_s` (60 s) after that removes it. The grace counts from the write that
  retired it, never from the file's age, so a read that began before a write and takes
  less than the grace never fails with FileNotFoundError because of that write, however
  long the lake was left alone. The removal itself, a grace later, can still race a
  listing taken in the instant before it (no plain folder can rule that out): once per
  0-row file, not once per write.
* New rows appear before the rows they replace leave: files of new rows first, then the
  file the new rows join, then the other earlier files. No instant lacks a row that was
  complete before the write began. The usual writes (a new chunk, a re-written chunk, a
  re-extraction over a compacted file) change one file per partition, in one rename: a
  reader sees the file before or after, each row once. A write that spans several earlier
  files (another window size, other tag batches) and a compaction change several: between
  its first and last rename a read may see some rows of the scope twice; a read in name
  order (what pyarrow.dataset and DuckDB do) that starts before and ends after never
  misses one, because the new rows go into the last of the files - unless they outgrow
  `target_file_rows` and go to new files, which a listing taken before does not name.
  Measured in tests/sinks/lake/test_lake_readers.py. Readers that need snapshots use a table
  format (Delta Lake, Iceberg).
* DuckDB's own `read_parquet` opens a file again by its path while it scans it (a handle
  per scan thread, after reading the footer through another), so a file replaced or
  emptied in that instant is read with the footer of the one before it (`TProtocolException:
  Invalid data`, `Prefetch registered for bytes outside file`). No rename-based writer can
  keep a path's bytes while new rows take its place; DuckDB beside a writer scans the lake
  through pyarrow.dataset (`con.register("lake", pyarrow.dataset.dataset(...))`), which reads
  each file through one handle (bench/lake_readers.py).

Writes are crash-safe at every point (`sinks.lake.journal`): files are staged outside the
dataset, an intent lists the renames and emptyings in the order above, and a write killed
half-way is rolled forward, or back, on `open()` and before the next write of the
dataset; after recovery each row is there once.

`compact()` (after a run) merges a partition's small files (under 1/20 of
`target_file_rows` rows) in batches of bounded rows and files (`sinks.lake.compact`),
each into the path of its last file, the others emptied, through the same journal, and
points the markers at the merged files.
"""

from __future__ import annotations

from collections.abc import Mapping

import orjson
import pyarrow as pa
import pyarrow.dataset as pads

from connectors import schema as tables
from connectors.schema import Rows
from connectors.timewindow import Window
from sinks.base import (
    ChunkScope,
    CountMismatch,
    SinkError,
    UnreadableFile,
    Verified,
)
from sinks.lake.compact import Compactor
from sinks.lake.coverage import LakeCoverage
from sinks.lake.dataset import DatasetFacts
from sinks.lake.files import (
    DATASET_KEY,
    DECODED_MAX_ROWS,
    FileFormat,
    LakeFiles,
    visible_files,
)
from sinks.lake.journal import Journal, Plan
from sinks.lake.ledger import read_ledger, stage_ledger
from sinks.lake.overlap import WritePlanner
from sinks.lake.rows import HISTORY_KINDS, reason, sorted_rows, table_of
from sinks.lake.state import LakeState
from sinks.ledger import ledger_rows
from sinks.scope import check_scope
from sinks.store.file_sink import FileSink
from sinks.store.layout import (
    AUTO,
    METADATA_DATASET,
    METADATA_FILE,
    STATE_DIR,
    check_chunk_id,
    check_dataset,
    check_flow,
    check_partition,
    join,
)
from sinks.store.objects import LakeStore, redacted_url
from sinks.verify.lake import LakeVerifier

# A 0-row file stays this long after the write or compaction that retired it (the first
# of its partition to find it) before a later one removes it: a reader that listed the
# lake before that write still opens every file it listed, as long as it reads within
# this time. Until then each costs a reader an open.
READER_GRACE_S = 60.0


def transient(exc: BaseException) -> bool:
    """Is this failure of the storage worth a retry (a network error, a timeout)?"""
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    names = {klass.__name__ for klass in type(exc).__mro__}
    return bool(
        names
        & {
            "EndpointConnectionError",
            "ConnectTimeoutError",
            "ReadTimeoutError",
            "ClientConnectorError",
            "ServerDisconnectedError",
            "ConnectionClosedError",
        }
    )


class LakeParts:
    """The lake's parts over one store: file facts, dataset facts, journal, planners."""

    def __init__(self, lake: ParquetLake, store: LakeStore) -> None:
        self.store = store
        self.state = LakeState(store)
        self.files = LakeFiles(
            store,
            grace_s=lake.reader_grace_s,
            decoded_rows=max(lake.target_file_rows, DECODED_MAX_ROWS),
        )
        self.datasets = DatasetFacts(store, lake=lake.name, partition=lake.partition)
        self.journal = Journal(store, self.state, self.files, self.datasets, lake.file_format)
        self.writes = WritePlanner(
            self.files,
            self.journal,
            self.datasets,
            target_file_rows=lake.target_file_rows,
            lake=lake.name,
        )
        self.compactor = Compactor(
            self.files, self.journal, self.datasets, target_file_rows=lake.target_file_rows
        )


class ParquetLake(FileSink):
    """A Parquet lake on local disk or object storage (see the module docstring).

    `store`: the `LakeStore` every file operation goes through, instead of one made from
    `url` and `storage_options` (tests pass one that counts, fails or pauses).
    """

    label = "lake"

    def __init__(
        self,
        url: str,
        *,
        name: str = "lake",
        partition: str = AUTO,
        storage_options: Mapping[str, object] | None = None,
        target_file_rows: int = 1_000_000,
        compression: str = "zstd",
        reader_grace_s: float = READER_GRACE_S,
        store: LakeStore | None = None,
    ) -> None:
        super().__init__(url, name=name, storage_options=storage_options, store=store)
        self.partition = check_partition(partition)
        self.target_file_rows = max(1, int(target_file_rows))
        self.compression = compression
        self.reader_grace_s = float(reader_grace_s)
        self.file_format = FileFormat(compression, self.target_file_rows)
        self._parts: LakeParts | None = None

    def __repr__(self) -> str:
        return f"ParquetLake({self.describe()!r})"

    # -- plumbing -------------------------------------------------------------------------

    @property
    def parts(self) -> LakeParts:
        """The lake's parts (opening the lake on first use); tests reach each one here."""
        if self._parts is None:
            self.open()
        assert self._parts is not None
        return self._parts

    @property
    def store(self) -> LakeStore:
        return self.parts.store

    @property
    def state(self) -> LakeState:
        return self.parts.state

    def _transient(self, exc: BaseException) -> bool:
        return transient(exc)

    def _reason(self, exc: BaseException) -> str:
        return reason(exc)

    def _write_lock(self, dataset: str) -> str:
        return self.store.path(STATE_DIR, dataset, "write")

    # -- lifecycle ------------------------------------------------------------------------

    def _opened(self) -> None:
        """Finish any interrupted write (`sinks.lake.journal`)."""
        self._parts = LakeParts(self, super().store)
        self._parts.journal.recover_all(self._dataset_lock)

    def close(self) -> None:
        if self._parts is not None:
            self._parts.files.clear()

    def describe(self) -> str:
        return (
            f"parquet lake '{self.name}' at {redacted_url(self.url)} (partition={self.partition})"
        )

    def coverage_reader(self, dataset: str, kind: str) -> LakeCoverage:
        """The dataset read file by file for a coverage report (`sinks.lake.coverage`)."""
        return LakeCoverage(self.store, dataset, kind)

    def verify(
        self, flow: str, node: str, window: Window | None = None, *, repair: bool = False
    ) -> Verified:
        """Every committed chunk's files against their footers (`sinks.verify.lake`); the
        node's rows are in the files its markers list, so `node` adds nothing here."""
        check_flow(flow)
        with self._errors(f"verify flow '{flow}'"):
            verifier = LakeVerifier(self.parts.state, self._dataset_lock)
            found = verifier.verify(flow, window, repair=repair)
            if repair:
                self.parts.files.clear()
            return found

    def read_ledger(self, dataset: str) -> pa.Table:
        """The dataset's completeness ledger (`sinks.lake.ledger`)."""
        check_dataset(dataset)
        with self._errors(f"read the ledger of dataset '{dataset}'"):
            return read_ledger(self.store, dataset)

    # -- writing --------------------------------------------------------------------------

    def write(self, scope: ChunkScope, rows: Rows, rows_fetched: int) -> int:
        """Replace the scope's rows by `rows` and record the chunk (module docstring)."""
        check_flow(scope.flow)
        dataset = check_dataset(scope.dataset)
        chunk = check_chunk_id(scope.chunk_id)
        if scope.kind not in HISTORY_KINDS:
            raise SinkError(f"lake '{self.name}': kind {scope.kind!r} is not a history kind")
        what = f"write chunk {chunk} of dataset '{dataset}'"
        table = table_of(rows, scope.kind, f"lake '{self.name}': {what}")
        check_scope(scope, table, f"lake '{self.name}'")
        if table.num_rows != rows_fetched:
            raise CountMismatch(
                f"lake '{self.name}': chunk {chunk} of dataset '{dataset}': {table.num_rows} rows "
                f"to commit but {rows_fetched} fetched; nothing written"
            )
        table = sorted_rows(table, tables.KEYS[scope.kind])
        ledger = ledger_rows(scope, table)
        parts = self.parts  # opened first: opening recovers under the lock taken next
        with self._errors(what), self._dataset_lock(dataset):
            parts.journal.recover(dataset)
            parts.datasets.check(scope)
            plan = Plan(ident=chunk, dataset=dataset)
            try:
                parts.writes.plan(plan, scope, table)
                stage_ledger(parts.journal, plan, scope, ledger)  # in the chunk's commit
            except UnreadableFile as exc:
                parts.journal.discard(plan)
                raise exc.for_flow(scope.flow.split("@", 1)[0]) from exc
            except BaseException:
                parts.journal.discard(plan)
                raise
            parts.journal.commit(plan)
        return plan.rows

    # -- compaction -----------------------------------------------------------------------

    def small_file_rows(self) -> int:
        """Below this many rows a file is worth merging: 1/20 of `target_file_rows`.

        A larger file costs a reader one more open among tens, while merging it rewrites
        all its rows: a backfill's chunk files (tens of thousands of rows each) stay as
        written, the slivers of chunks cut by a partition boundary and the few-hundred-row
        files of incremental runs are merged.
        """
        return max(1, self.target_file_rows // 20)

    def compact(self, dataset: str, *, min_rows: int | None = None) -> int:
        """Merge each partition's small files (< min_rows, default `small_file_rows()`)
        into files of up to ~target_file_rows; a partition with fewer than two is left alone.

        Returns how many files were merged away. Crash-safe like a write (an intent first);
        the markers of the merged chunks are pointed at the new files. Memory is bounded
        by `sinks.lake.compact` whatever the number of files. 0-row files are retired
        first, and those retired longer ago than `reader_grace_s` removed.
        """
        check_dataset(dataset)
        if min_rows is None:
            min_rows = self.small_file_rows()
        parts = self.parts  # opened first: opening recovers under the lock taken next
        with self._errors(f"compact dataset '{dataset}'"), self._dataset_lock(dataset):
            parts.journal.recover(dataset)
            facts = parts.datasets.get(dataset)
            if facts is None:
                return 0
            return parts.compactor.compact(dataset, str(facts["kind"]), min_rows)

    # -- metadata -------------------------------------------------------------------------

    def write_metadata(self, rows: Rows) -> int:
        """Upsert the tag dimension by (node, tag) in `<root>/tag_metadata/`."""
        kind = tables.KIND_TAG_METADATA
        unique = tables.last_per_key(rows, tables.TAG_METADATA_KEY)
        table = table_of(unique, kind, f"lake '{self.name}': write tag metadata")
        journal = self.parts.journal  # opened first: opening recovers under the lock
        with self._errors("write tag metadata"), self._dataset_lock(METADATA_DATASET):
            journal.recover(METADATA_DATASET)
            rel = join(METADATA_DATASET, METADATA_FILE)
            path = self.store.path(rel)
            combined = table
            if self.store.exists(path):
                old = self.store.read_table(path).select(table.schema.names).cast(table.schema)
                keys = table.select(list(tables.TAG_METADATA_KEY))
                kept = old.join(keys, list(tables.TAG_METADATA_KEY), join_type="left anti")
                combined = pa.concat_tables(
                    [kept.select(table.schema.names).cast(table.schema), table]
                )
            combined = combined.sort_by([(key, "ascending") for key in tables.TAG_METADATA_KEY])
            plan = Plan(ident="tag_metadata", dataset=METADATA_DATASET)
            about = {DATASET_KEY: orjson.dumps({"dataset": METADATA_DATASET, "kind": kind})}
            try:
                temp = journal.stage(plan, combined, rel, about)
            except BaseException:
                journal.discard(plan)
                raise
            plan.ops = [{"op": "place", "tmp": temp, "dest": rel, "owners": [], "new": False}]
            journal.commit(plan)
        return int(table.num_rows)

    # -- reading --------------------------------------------------------------------------

    def _scan(self, dataset: str, target: pa.Schema) -> pa.Table | None:
        """The files a plain reader sees, in the kind's exact types."""
        paths = visible_files(self.store, dataset)
        if not paths:
            return None
        try:
            found = pads.dataset(paths, format="parquet", filesystem=self.store.pafs, schema=target)
            table: pa.Table = found.to_table(columns=target.names)
        except pa.ArrowInvalid:
            for path in paths:  # which file: its footer says (an UnreadableFile naming it)
                self.store.read_parquet_metadata(path)
            raise
        return table.cast(target).replace_schema_metadata(None)
