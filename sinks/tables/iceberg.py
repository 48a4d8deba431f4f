"""The Apache Iceberg sink: one Iceberg table per dataset in a SQL catalog, each chunk one commit.

Layout: `url` is the warehouse (a local directory or s3://bucket/prefix); the catalog is
pyiceberg's SQL catalog, by default an SQLite file beside a local warehouse
(`<url>/catalog.db`), or any SQLAlchemy URL given as `catalog` (PostgreSQL:
`postgresql+psycopg://...`). Tables are `<namespace>.<dataset>` (namespace `historian`),
partitioned by `day(ts)`; the tag dimension is `<namespace>.tag_metadata`, upserted by
(node, tag). The sink's own side files are under `<url>/_historian/` (flow locks, the
progress cache and forgetting rules of `sinks.tables.progress`, and chunk member lists).

A chunk's write is `Table.overwrite(rows, overwrite_filter=...)`: the filter is the
chunk's scope (its window, and for tag history `tag IN members`) built from pyiceberg's
expression objects - tag paths are values, never parsed text - and the chunk's record
goes in the snapshot summary (`historian.chunk`). The delete and the append are one
catalog commit, so a killed run leaves the table at a committed snapshot with the
record and the rows together, or neither. The record names the chunk's member list by
the hash of a content-addressed file (`_historian/members/<hash>.json`, written before
the commit and never changed): Iceberg rewrites its metadata file, with every snapshot's
summary, at each commit, so summaries are kept small.

A dataset holds many nodes: a chunk's filter names its node, so it replaces that node's
rows only. Writers take turns per dataset for the commit step (threads; a flock on local
disk; on object storage the lake's conditional-PUT lease, `sinks.store.locks.dataset_lease`),
and a commit the catalog refuses because another writer committed first is planned
again on the new snapshot (`sinks.tables.commit_retry`).

`compact(dataset)` rewrites each day holding several small files as one file (the same
rows, one overwrite of that day). Snapshots are never expired by the sink: their
summaries carry the progress (expire them only after resetting the flows concerned).
Each table's properties record the dataset's kind and attrs; a later chunk must agree.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from connectors import schema as tables
from connectors.schema import Rows
from sinks.base import ChunkScope, SinkError
from sinks.identity import identity
from sinks.store.layout import (
    METADATA_DATASET,
    STATE_DIR,
    check_dataset,
)
from sinks.store.member_lists import MemberLists
from sinks.store.objects import redacted_url
from sinks.tables.commit_retry import retry_conflicts
from sinks.tables.progress import RECORD_KEY, check_record, chunk_record
from sinks.tables.rows import conform
from sinks.tables.table_sink import TableSink, s3fs_options
from sinks.verify.tables import IcebergFiles

NAMESPACE = "historian"
PARTITION_FIELD = "ts_day"
FACTS_KEY = "historian.dataset"
US = pa.timestamp("us", tz="UTC")
SMALL_FILE_ROWS = 200_000
COMPACT_MAX_ROWS = 5_000_000


def iceberg_schema(kind: str) -> pa.Schema:
    """The kind's Arrow schema as Iceberg stores it: timestamps in microseconds."""
    return pa.schema(
        [f.with_type(US) if pa.types.is_timestamp(f.type) else f for f in tables.SCHEMAS[kind]]
    )


def fsspec_options(properties: Mapping[str, str]) -> dict[str, Any]:
    """pyiceberg's S3 FileIO properties as the s3fs options the side files use."""
    return s3fs_options(
        properties,
        {
            "endpoint_url": ("s3.endpoint",),
            "region_name": ("s3.region",),
            "key": ("s3.access-key-id",),
            "secret": ("s3.secret-access-key",),
            "token": ("s3.session-token",),
        },
    )


def _expressions() -> Any:
    """pyiceberg's expression classes (typed Any: their pydantic signatures confuse mypy)."""
    from pyiceberg import expressions

    return expressions


def time_filter(start: datetime, end: datetime) -> Any:
    """`start <= ts < end` as a pyiceberg expression."""
    ex = _expressions()
    return ex.And(
        ex.GreaterThanOrEqual("ts", start.isoformat()), ex.LessThan("ts", end.isoformat())
    )


def node_window_filter(scope: ChunkScope) -> Any:
    """The scope's node's rows in its window, as a pyiceberg expression."""
    ex = _expressions()
    return ex.And(time_filter(scope.window.start, scope.window.end), ex.EqualTo("node", scope.node))


def scope_filter(scope: ChunkScope) -> Any:
    """The rows a chunk replaces, as a pyiceberg expression (values, not parsed text)."""
    expression = node_window_filter(scope)
    if scope.kind == tables.KIND_TAG_HISTORY:
        ex = _expressions()
        expression = ex.And(expression, ex.In("tag", set(scope.members)))
    return expression


def lost_race(exc: BaseException) -> bool:
    """Did a commit fail because another writer committed first (`sinks.tables.commit_retry`)?"""
    from pyiceberg.exceptions import CommitFailedException

    return isinstance(exc, CommitFailedException)


class IcebergLake(TableSink):
    """An Iceberg sink with a SQL catalog (see the module docstring)."""

    label = "iceberg"

    def __init__(
        self,
        url: str,
        *,
        name: str = "iceberg",
        catalog: str | None = None,
        namespace: str = NAMESPACE,
        properties: Mapping[str, str] | None = None,
    ) -> None:
        self.namespace = namespace
        self.properties = {str(k): str(v) for k, v in (properties or {}).items()}
        super().__init__(url, name=name, s3=fsspec_options(self.properties))
        if catalog is None:
            if not self.local:
                raise SinkError(
                    f"iceberg '{name}': catalog is required for a warehouse on object storage "
                    "(an SQLAlchemy URL, e.g. postgresql+psycopg://host/db)"
                )
            catalog = f"sqlite:///{Path(self.url) / 'catalog.db'}"
        self.catalog_url = catalog
        self._catalog: Any | None = None
        self._lists: MemberLists | None = None

    def __repr__(self) -> str:
        return f"IcebergLake({self.describe()!r})"

    # -- plumbing -------------------------------------------------------------------------

    @property
    def warehouse(self) -> str:
        return self.url if not self.local else Path(self.url).absolute().as_uri()

    @property
    def _member_lists(self) -> MemberLists:
        """Chunk records name their members by digest (`sinks.store.member_lists`); the lists
        reach the disk first, as the catalog's commit that names them is durable."""
        if self._lists is None:
            self._lists = MemberLists(self.store, durable=True)
        return self._lists

    @property
    def _members_dir(self) -> str:
        return self.store.path(STATE_DIR, "members")

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            from pyiceberg.catalog.sql import SqlCatalog

            if self.local:
                os.makedirs(self.url, exist_ok=True)
            catalog = open_catalog(
                lambda: SqlCatalog(
                    self.name, uri=self.catalog_url, warehouse=self.warehouse, **self.properties
                )
            )
            create_namespace(catalog, self.namespace)
            self._catalog = catalog
        return self._catalog

    def _identifier(self, dataset: str) -> tuple[str, str]:
        return (self.namespace, dataset)

    def _table(self, dataset: str) -> Any | None:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(self._identifier(dataset))
        except NoSuchTableError:
            return None

    # -- lifecycle ------------------------------------------------------------------------

    def _opened(self) -> None:
        self.catalog  # noqa: B018 - reach the catalog now, not at the first chunk
        super()._opened()  # the ledgers brought up to the logs

    def close(self) -> None:
        if self._catalog is not None:
            engine = getattr(self._catalog, "engine", None)
            if engine is not None:
                engine.dispose()
            self._catalog = None

    def describe(self) -> str:
        return (
            f"iceberg warehouse '{self.name}' at {redacted_url(self.url)} "
            f"(catalog {self.catalog_url if self.catalog_url.startswith('sqlite') else redacted_url(self.catalog_url)})"
        )

    def probe(self) -> str:
        """Whether the sink could be written, without creating anything (the catalog is
        only connected to, when it is a server)."""
        found = super().probe()
        if self.catalog_url.startswith("sqlite"):
            return found
        import sqlalchemy as sa

        with self._errors(f"check {redacted_url(self.url)}"):
            engine = sa.create_engine(self.catalog_url)
            try:
                with engine.connect() as conn:
                    conn.execute(sa.text("SELECT 1"))
            finally:
                engine.dispose()
        return found + "; catalog reachable"

    # -- the commit log (TableProgress's CommitLog) ---------------------------------------

    def datasets(self) -> list[str]:
        return sorted(
            name for _, name in self.catalog.list_tables(self.namespace) if name != METADATA_DATASET
        )

    def _load_members(self, digest: str) -> list[str]:
        listed = self._member_lists.load(self._members_dir, digest)
        if listed is None:
            raise SinkError(
                f"iceberg '{self.name}': a chunk names member list {digest}, which is missing"
            )
        return listed

    def records_since(self, dataset: str, version: int) -> tuple[int, list[dict[str, Any]]]:
        table = self._table(dataset)
        if table is None:
            return -1, []
        latest = int(table.metadata.last_sequence_number)
        records: list[dict[str, Any]] = []
        seen: set[tuple[str, int]] = set()
        for snapshot in sorted(table.snapshots(), key=lambda s: s.sequence_number or 0):
            if (snapshot.sequence_number or 0) <= version or snapshot.summary is None:
                continue
            raw = snapshot.summary.get(RECORD_KEY)
            if raw is None:
                continue
            record = check_record(orjson.loads(raw))
            if record is None:
                continue
            key = (str(record["chunk_id"]), int(record["committed_ns"]))
            if key in seen:  # an overwrite is a delete and an append snapshot
                continue
            seen.add(key)
            if isinstance(record["members"], str):
                record["members"] = self._load_members(record["members"])
            records.append(record)
        return latest, records

    # -- writes ---------------------------------------------------------------------------

    def _facts(self, scope: ChunkScope) -> str:
        return orjson.dumps(
            {"kind": scope.kind, "attrs": identity(scope.attrs)}, option=orjson.OPT_SORT_KEYS
        ).decode()

    def _ensure_table(self, scope: ChunkScope) -> Any:
        """The dataset's table, created partitioned by day(ts) in one catalog commit; an
        existing one must have been written with the chunk's kind and attrs."""
        from pyiceberg.exceptions import TableAlreadyExistsError
        from pyiceberg.transforms import DayTransform

        facts = self._facts(scope)
        table = self._table(scope.dataset)
        if table is None:
            try:
                with (
                    self.catalog.create_table_transaction(
                        self._identifier(scope.dataset),
                        schema=iceberg_schema(scope.kind),
                        properties={FACTS_KEY: facts},
                    ) as create,
                    create.update_spec() as spec,
                ):
                    spec.add_field("ts", DayTransform(), PARTITION_FIELD)
            except TableAlreadyExistsError:
                pass  # another writer created it first
            table = self._table(scope.dataset)
            assert table is not None
        stored = table.properties.get(FACTS_KEY)
        if stored != facts:
            self._check_settings(scope, orjson.loads(stored or "{}"))
        return table

    def write(self, scope: ChunkScope, rows: Rows, rows_fetched: int) -> int:
        """Replace the chunk's scope and record the chunk, in one catalog commit."""
        table = self._chunk_rows(scope, rows, rows_fetched).cast(iceberg_schema(scope.kind))
        with self._errors(f"write chunk {scope.chunk_id}"), self._dataset_lock(scope.dataset):
            target = self._ensure_table(scope)
            record = chunk_record(
                flow=scope.flow,
                dataset=scope.dataset,
                chunk_id=scope.chunk_id,
                window=scope.window,
                members=[],
                rows_fetched=rows_fetched,
                rows_committed=table.num_rows,
                scope=scope,
            )
            ledger = self._ledger_rows(scope, table, record)
            record["members"] = self._member_lists.save(self._members_dir, scope.members)
            properties = {RECORD_KEY: orjson.dumps(record).decode()}
            files = self._write_files(target, table)
            retry_conflicts(lambda: self._commit(scope, table, files, properties), lost_race)
            self.ledger.fold(scope.dataset, ledger)  # this chunk's, and any left unfolded
        return int(table.num_rows)

    def _commit(
        self, scope: ChunkScope, table: pa.Table, files: list[str], properties: dict[str, str]
    ) -> None:
        """One catalog commit on the table's latest snapshot: the delete of the scope
        (when a file may hold rows of its window), the chunk's files, and the record in
        the snapshot summaries. Another process committing first fails it; it is planned
        again (`sinks.tables.commit_retry`).

        The data files are written first (`_write_files`), by pyarrow with the lake's
        options (dictionary pages for names only, delta-encoded ts), one per UTC day, then
        added by `add_files`: faster than pyiceberg's own writer (BENCHMARKS.md). A kill
        before the commit leaves unreferenced files in the table's data folder, never
        visible rows (Iceberg's orphan-file clean-up removes them).
        """
        target = self._table(scope.dataset)
        assert target is not None
        delete = self._delete_filter(target, scope)
        with target.transaction() as transaction:
            if delete is not None:
                transaction.delete(delete, snapshot_properties=properties)
            if files:
                transaction.add_files(
                    files, snapshot_properties=properties, check_duplicate_files=False
                )
            else:  # an empty chunk: a snapshot of no files still carries its record
                transaction.append(table, snapshot_properties=properties)

    def _write_files(self, target: Any, table: pa.Table) -> list[str]:
        """The rows as Parquet files in the table's data folder, one per UTC day."""
        if table.num_rows == 0:
            return []
        days = pc.cast(table.column("ts"), pa.date32())
        paths = []
        for day in pc.unique(days).to_pylist():
            rows = table.filter(pc.equal(days, pa.scalar(day, pa.date32())))
            path = f"{target.location()}/data/{PARTITION_FIELD}={day}/{uuid.uuid4().hex}.parquet"
            with target.io.new_output(path).create(overwrite=True) as stream:
                pq.write_table(rows, stream, **_parquet_options(rows.schema))
            paths.append(path)
        return paths

    @staticmethod
    def _delete_filter(target: Any, scope: ChunkScope) -> Any | None:
        """What the chunk's commit deletes: nothing when the window holds no row of the
        node yet (a new window is an append), the node's window alone when it holds rows
        of the chunk's tags only, else the node's window and the tags. Found by reading the window's `tag`
        column (files outside it skipped by their bounds): pyiceberg binds and copies a
        filter of 1,000 tag names at every step of a commit, which cost more than the
        write (BENCHMARKS.md)."""
        if target.current_snapshot() is None:
            return None
        window = node_window_filter(scope)
        found = target.scan(
            row_filter=window,
            selected_fields=("tag",) if (scope.kind == tables.KIND_TAG_HISTORY) else ("ts",),
        ).to_arrow()
        if found.num_rows == 0:
            return None
        if scope.kind != tables.KIND_TAG_HISTORY:
            return window
        others = tables.names_of(found.column("tag")) - set(scope.members)
        return scope_filter(scope) if others else window

    def compact(self, dataset: str) -> int:
        """Rewrite each day holding several small files as one file: the same rows in one
        overwrite of that day (which records no chunk, so progress is unchanged); returns
        the files merged away."""
        check_dataset(dataset)
        with self._errors(f"compact dataset '{dataset}'"), self._dataset_lock(dataset):
            table = self._table(dataset)
            if table is None or table.current_snapshot() is None:
                return 0
            merged = 0
            files = table.inspect.files().select(["partition", "record_count"]).to_pylist()
            days: dict[Any, list[int]] = {}
            for item in files:
                day = (item.get("partition") or {}).get(PARTITION_FIELD)
                if day is not None:
                    days.setdefault(day, []).append(int(item["record_count"]))
            for day, counts in sorted(days.items()):
                small = [c for c in counts if c < SMALL_FILE_ROWS]
                if len(small) < 2 or sum(counts) > COMPACT_MAX_ROWS:
                    continue
                start = pd.Timestamp(day, tz="UTC")
                where = time_filter(start, start + pd.Timedelta(days=1))
                rows = table.scan(row_filter=where).to_arrow()
                rows = rows.sort_by([(k, "ascending") for k in tables.KEYS[_kind_of(table)]])
                try:
                    table.overwrite(
                        rows, overwrite_filter=where, snapshot_properties={"historian.compact": "1"}
                    )
                except Exception as exc:
                    # Another process committed meanwhile: its rows are not in `rows`, so
                    # the merge is dropped (the catalog refused it) and tried next time.
                    if not lost_race(exc):
                        raise
                    table = self._table(dataset)
                    assert table is not None
                    continue
                merged += len(counts) - 1
            return merged

    def write_metadata(self, rows: Rows) -> int:
        """Upsert the tag dimension by (node, tag) in `<namespace>.tag_metadata`."""
        kind = tables.KIND_TAG_METADATA
        table = self._metadata_rows(rows).cast(iceberg_schema(kind))
        if table.num_rows == 0:
            return 0
        with self._errors("write tag metadata"), self._dataset_lock(METADATA_DATASET):
            target = self._table(METADATA_DATASET)
            if target is None:
                target = self.catalog.create_table_if_not_exists(
                    self._identifier(METADATA_DATASET), schema=iceberg_schema(kind)
                )
            if target.current_snapshot() is None:
                target.append(table)
            else:
                target.upsert(table, join_cols=list(tables.TAG_METADATA_KEY))
        return int(table.num_rows)

    def _table_files(self) -> IcebergFiles:
        return IcebergFiles(self._table)

    # -- reading --------------------------------------------------------------------------

    def _scan(self, dataset: str, target: pa.Schema) -> pa.Table | None:
        """The table at its current snapshot."""
        found = self._table(dataset)
        if found is None:
            return None
        return conform(found.scan(selected_fields=tuple(target.names)).to_arrow(), target)


def _parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """zstd, dictionary pages for string columns only, delta-encoded ts (as the lake)."""
    return {
        "compression": "zstd",
        "use_dictionary": [f.name for f in schema if pa.types.is_string(f.type)],
        "column_encoding": {"ts": "DELTA_BINARY_PACKED"},
        "write_statistics": True,
    }


def _kind_of(table: Any) -> str:
    facts = orjson.loads(table.properties.get(FACTS_KEY) or "{}")
    kind = facts.get("kind")
    if kind not in tables.SCHEMAS:
        raise SinkError(f"table {table.name()} records no known kind ({kind!r})")
    return str(kind)


def open_catalog(make: Callable[[], Any]) -> Any:
    """The SQL catalog `make` opens, safe when writers open a new catalog at once: opening
    creates the catalog's own tables where they are missing, checking first, so of two
    processes that both found them missing the second's CREATE fails (SQLite: "already
    exists"; PostgreSQL: a unique key of its own catalog). The tables are there then: the
    second opening finds them and creates nothing."""
    import sqlalchemy.exc

    try:
        return make()
    except sqlalchemy.exc.DBAPIError:
        return make()


def create_namespace(catalog: Any, namespace: str) -> None:
    """`create_namespace_if_not_exists`, safe when writers open the catalog at once:
    pyiceberg's SQL catalog checks, then inserts, so of two processes that both found the
    namespace missing the second fails on the catalog's unique key; the namespace is there
    then, which is all that was asked."""
    import sqlalchemy.exc

    try:
        catalog.create_namespace_if_not_exists(namespace)
    except sqlalchemy.exc.IntegrityError:
        if not catalog.namespace_exists(namespace):
            raise
