"""The Delta Lake sink: one Delta table per dataset, each chunk one transaction.

Layout (under `url`, a local directory or an object-store URL such as s3://bucket/prefix)::

    <url>/<dataset>/            a Delta table partitioned by `date` (the UTC day of ts)
    <url>/tag_metadata/         the tag dimension, a Delta table upserted by (node, tag)
    <url>/_historian/           the sink's own side files: flow locks, the progress cache
                                and forgetting rules (`sinks.tables.progress`)

A chunk's write is `write_deltalake(mode="overwrite", predicate=...)`: a replace-where of
the chunk's scope (its days, its window, and for tag history its tags, unless the window
holds no row of another tag: `_predicate`) by the new rows,
with the chunk's record in the same commit's info (`historian.chunk`). Either the commit
file lands - rows and record together - or it does not, so a killed run leaves the table
at a committed version, and progress is read back from the log (`TableProgress`). Tag
paths enter the predicate only as SQL string literals with quotes doubled, so no name
can change its meaning.

Each table is created with `delta.logRetentionDuration` of 100 years and every commit of
this sink skips the log clean-up: the log carries the progress, so it is never expired.
`compact(dataset)` is `optimize.compact()` then `vacuum()` with the table's own
retention (`delta.deletedFileRetentionDuration`, 7 days unless the table says otherwise),
so a reader of an older version keeps its files for that long.

A dataset holds many nodes: a chunk's predicate names its node, so it replaces that
node's rows only. Writers: one at a time per dataset for the commit step, whatever their
flow key or node - threads here, processes by a flock on local disk and by the lake's
conditional-PUT lease on object storage (`sinks.store.locks.dataset_lease`): delta-rs's
conflict check let a compaction and a write that rewrote the same file both commit
(tests/sinks/test_writers_on_s3.py doubled rows without it). Flow locks are the lake's
(`sinks.store.locks`). delta-rs 1.x commits to S3 with a conditional write (put-if-absent of
the next log entry), so no lock service is needed: the store must support conditional
writes (AWS S3 does since 2024; moto does, in the tests). A commit that loses a race
anyway (another tool writing the table) is planned again (`sinks.tables.commit_retry`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from connectors import schema as tables
from connectors.schema import Rows
from sinks.base import (
    ChunkScope,
    SinkError,
)
from sinks.identity import identity
from sinks.store.layout import (
    METADATA_DATASET,
    check_dataset,
)
from sinks.store.objects import redacted_url
from sinks.tables.commit_retry import retry_conflicts
from sinks.tables.progress import RECORD_KEY, check_record, chunk_record
from sinks.tables.rows import conform
from sinks.tables.table_sink import TableSink, s3fs_options
from sinks.verify.tables import DeltaFiles

PARTITION_COLUMN = "date"
TABLE_CONFIGURATION = {"delta.logRetentionDuration": "interval 36500 days"}
DAY_MS = 86_400_000


def sql_literal(text: str) -> str:
    """A string as a SQL literal for a Delta predicate: quotes doubled, nothing else is
    special (backslashes, Unicode, commas and dots are plain characters there)."""
    if "\x00" in text:
        raise SinkError("a tag path with a NUL character cannot be matched in a predicate")
    return "'" + text.replace("'", "''") + "'"


def _iso(ms: int) -> str:
    return pd.Timestamp(ms, unit="ms", tz="UTC").strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _day(ms: int) -> str:
    return pd.Timestamp(ms, unit="ms", tz="UTC").strftime("%Y-%m-%d")


def scope_predicate(scope: ChunkScope, *, tags: bool = True) -> str:
    """The rows a chunk replaces, as a Delta predicate: its days first (partition
    pruning), then its window and node, then for tag history its tags (unless `tags` is
    False: the caller has found no row of another tag of the node in the window)."""
    window = scope.window
    parts = [
        f"{PARTITION_COLUMN} >= '{_day(window.start_ms)}'",
        f"{PARTITION_COLUMN} <= '{_day(window.end_ms - 1)}'",
        f"ts >= '{_iso(window.start_ms)}'",
        f"ts < '{_iso(window.end_ms)}'",
        f"node = {sql_literal(scope.node)}",
    ]
    if tags and scope.kind == tables.KIND_TAG_HISTORY:
        members = sorted(set(scope.members))
        parts.append(f"tag IN ({', '.join(sql_literal(m) for m in members)})")
    return " AND ".join(parts)


def lost_race(exc: BaseException) -> bool:
    """Did a commit fail because another writer committed first (`sinks.tables.commit_retry`)?
    Also the first commit of a table another writer has just created."""
    from deltalake.exceptions import CommitFailedError, DeltaError

    if isinstance(exc, CommitFailedError):
        return True
    text = str(exc).lower()
    return isinstance(exc, DeltaError) and ("already exists" in text or "conflict" in text)


def fsspec_options(storage_options: Mapping[str, str]) -> dict[str, Any]:
    """delta-rs (object_store) S3 options as the s3fs options the side files use."""
    lowered = {key.lower(): value for key, value in storage_options.items()}
    return s3fs_options(
        lowered,
        {
            "endpoint_url": ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint"),
            "region_name": ("aws_region", "region"),
            "key": ("aws_access_key_id",),
            "secret": ("aws_secret_access_key",),
            "token": ("aws_session_token",),
        },
    )


class DeltaLake(TableSink):
    """A Delta Lake sink on local disk or object storage (see the module docstring)."""

    label = "delta"

    def __init__(
        self,
        url: str,
        *,
        name: str = "delta",
        storage_options: Mapping[str, str] | None = None,
        target_file_size: int | None = None,
    ) -> None:
        self.storage_options = {str(k): str(v) for k, v in (storage_options or {}).items()}
        super().__init__(url, name=name, s3=fsspec_options(self.storage_options))
        self.target_file_size = target_file_size
        self._facts: dict[str, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"DeltaLake({self.describe()!r})"

    # -- plumbing -------------------------------------------------------------------------

    def table_uri(self, dataset: str) -> str:
        return f"{self.url}/{dataset}"

    def _table(self, dataset: str) -> Any | None:
        """The dataset's DeltaTable, None when there is none yet."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        # Not DeltaTable.is_deltatable: against some S3 servers (moto) its listing hangs.
        try:
            return DeltaTable(self.table_uri(dataset), storage_options=self.storage_options)
        except TableNotFoundError:
            return None

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        self._facts.clear()

    def describe(self) -> str:
        return f"delta lake '{self.name}' at {redacted_url(self.url)}"

    # -- the commit log (TableProgress's CommitLog) ---------------------------------------

    def datasets(self) -> list[str]:
        names = []
        for entry in self.store.listdir(self.store.path()):
            if (
                entry.is_dir
                and not entry.name.startswith(("_", "."))
                and entry.name != METADATA_DATASET
                and self.store.exists(self.store.path(entry.name, "_delta_log"))
            ):
                names.append(entry.name)
        return sorted(names)

    def records_since(self, dataset: str, version: int) -> tuple[int, list[dict[str, Any]]]:
        table = self._table(dataset)
        if table is None:
            return -1, []
        latest = int(table.version())
        if latest <= version:
            return latest, []
        records = []
        for commit in sorted(table.history(limit=latest - version), key=lambda c: c["version"]):
            if int(commit["version"]) <= version or RECORD_KEY not in commit:
                continue
            raw = commit[RECORD_KEY]
            record = check_record(orjson.loads(raw) if isinstance(raw, str) else raw)
            if record is not None:
                records.append(record)
        return latest, records

    # -- writes ---------------------------------------------------------------------------

    def _check_facts(self, scope: ChunkScope, table: Any | None) -> str | None:
        """The facts a new table is created with (its description), or None when the
        table exists and agrees with the chunk; SinkError when it was written otherwise."""
        wanted = {"dataset": scope.dataset, "kind": scope.kind, "attrs": identity(scope.attrs)}
        if table is None:
            return orjson.dumps(wanted, option=orjson.OPT_SORT_KEYS).decode()
        facts = self._facts.get(scope.dataset)
        if facts is None:
            try:
                facts = orjson.loads(table.metadata().description or "{}")
            except orjson.JSONDecodeError:
                facts = {}
            self._facts[scope.dataset] = facts
        self._check_settings(scope, facts)
        return None

    def _writer_properties(self) -> Any:
        """zstd, and dictionary pages for the name columns only (tag paths repeat;
        timestamps and values do not, and trying costs time); measured against delta-rs's
        defaults in BENCHMARKS.md."""
        from deltalake import ColumnProperties, WriterProperties

        names = ("node", "tag", "path")
        return WriterProperties(
            compression="ZSTD",
            default_column_properties=ColumnProperties(dictionary_enabled=False),
            column_properties={name: ColumnProperties(dictionary_enabled=True) for name in names},
        )

    def write(self, scope: ChunkScope, rows: Rows, rows_fetched: int) -> int:
        """Replace the chunk's scope and record the chunk, in one Delta commit."""
        table = self._chunk_rows(scope, rows, rows_fetched)
        table = table.append_column(PARTITION_COLUMN, pc.cast(table.column("ts"), pa.date32()))
        record = chunk_record(
            flow=scope.flow,
            dataset=scope.dataset,
            chunk_id=scope.chunk_id,
            window=scope.window,
            members=scope.members,
            rows_fetched=rows_fetched,
            rows_committed=table.num_rows,
            scope=scope,
        )
        ledger = self._ledger_rows(scope, table, record)
        with self._errors(f"write chunk {scope.chunk_id}"), self._dataset_lock(scope.dataset):
            retry_conflicts(lambda: self._commit(scope, table, record), lost_race)
            self.ledger.fold(scope.dataset, ledger)  # this chunk's, and any left unfolded
        return int(table.num_rows)

    def _commit(self, scope: ChunkScope, table: pa.Table, record: dict[str, Any]) -> None:
        from deltalake import CommitProperties, PostCommitHookProperties, write_deltalake

        existing = self._table(scope.dataset)
        description = self._check_facts(scope, existing)
        common: dict[str, Any] = {
            "partition_by": [PARTITION_COLUMN],
            "storage_options": self.storage_options,
            "writer_properties": self._writer_properties(),
            "target_file_size": self.target_file_size,
            "commit_properties": CommitProperties(
                custom_metadata={RECORD_KEY: orjson.dumps(record).decode()}
            ),
            "post_commithook_properties": PostCommitHookProperties(cleanup_expired_logs=False),
        }
        if existing is None:
            write_deltalake(
                self.table_uri(scope.dataset),
                table,
                mode="append",
                description=description,
                configuration=TABLE_CONFIGURATION,
                **common,
            )
        else:
            predicate = self._predicate(existing, scope)
            write_deltalake(existing, table, mode="overwrite", predicate=predicate, **common)

    @staticmethod
    def _predicate(existing: Any, scope: ChunkScope) -> str:
        """The chunk's predicate, without its tag list when the window holds no row of
        another tag (read from the window's files: the tag column only, row groups
        outside the window skipped). delta-rs evaluates `tag IN (...)` as one comparison
        per member per row of the files it rewrites, far more than reading the window's tags
        (BENCHMARKS.md)."""
        if scope.kind != tables.KIND_TAG_HISTORY:
            return scope_predicate(scope)
        import pyarrow.dataset as pads

        window = scope.window
        ts = pads.field("ts")
        found = existing.to_pyarrow_dataset().to_table(
            columns=["tag"],
            filter=(ts >= pa.scalar(window.start_ms, tables.TS_TYPE))
            & (ts < pa.scalar(window.end_ms, tables.TS_TYPE))
            & (pads.field("node") == scope.node),
        )
        others = tables.names_of(found.column("tag")) - set(scope.members)
        return scope_predicate(scope, tags=bool(others))

    def compact(self, dataset: str) -> int:
        """Merge small files (optimize.compact) and remove files no version within the
        table's retention needs (vacuum); returns the files merged away. A chunk committed
        by another process meanwhile makes the merge's commit fail: it is planned again."""
        from deltalake import PostCommitHookProperties

        check_dataset(dataset)
        with self._errors(f"compact dataset '{dataset}'"), self._dataset_lock(dataset):
            table = self._table(dataset)
            if table is None:
                return 0
            hooks = PostCommitHookProperties(cleanup_expired_logs=False)

            def merge() -> dict[str, Any]:
                table.update_incremental()
                found: dict[str, Any] = table.optimize.compact(
                    writer_properties=self._writer_properties(),
                    target_size=self.target_file_size,
                    post_commithook_properties=hooks,
                )
                return found

            metrics = retry_conflicts(merge, lost_race)
            table.vacuum(dry_run=False, post_commithook_properties=hooks)
            removed, added = metrics.get("numFilesRemoved", 0), metrics.get("numFilesAdded", 0)
            return max(0, int(removed) - int(added))

    def write_metadata(self, rows: Rows) -> int:
        """Upsert the tag dimension by (node, tag) in `<url>/tag_metadata`, one merge."""
        from deltalake import write_deltalake

        table = self._metadata_rows(rows)
        if table.num_rows == 0:
            return 0
        with self._errors("write tag metadata"), self._dataset_lock(METADATA_DATASET):
            existing = self._table(METADATA_DATASET)
            if existing is None:
                write_deltalake(
                    self.table_uri(METADATA_DATASET),
                    table,
                    mode="append",
                    storage_options=self.storage_options,
                    configuration=TABLE_CONFIGURATION,
                )
            else:
                (
                    existing.merge(
                        table,
                        predicate="t.node = s.node AND t.tag = s.tag",
                        source_alias="s",
                        target_alias="t",
                    )
                    .when_matched_update_all()
                    .when_not_matched_insert_all()
                    .execute()
                )
        return int(table.num_rows)

    def _table_files(self) -> DeltaFiles:
        return DeltaFiles(self._table)

    # -- reading --------------------------------------------------------------------------

    def _scan(self, dataset: str, target: pa.Schema) -> pa.Table | None:
        """The table at its latest version."""
        found = self._table(dataset)
        return (
            None if found is None else conform(found.to_pyarrow_table(columns=target.names), target)
        )
