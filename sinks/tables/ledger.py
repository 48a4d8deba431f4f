"""The completeness ledger of the table formats (Delta Lake, Iceberg): derived from their logs.

Delta and Iceberg commit one table per transaction, so the ledger cannot share the
chunk's commit. What does travel in that commit is the chunk's record (its node, kind,
members, window: `sinks.tables.progress`), and the ledger is a function of the records
and the data, so it is kept as a fold of the log:
`<url>/<dataset>.coverage/<key>/part-<start_ms>-<end_ms>-<chunk_id>.parquet` (files of
`sinks.ledger.LEDGER_SCHEMA`, the same query as the lake's), and
`_historian/ledger/<dataset>.json` holding the log version folded so far.

After each chunk's commit, under the dataset's lock, every commit after that version is
folded: the chunk just committed from the rows in hand, any other (a writer killed
between its commit and its ledger) from the rows the table holds for its scope now.
Folding a record writes its file (replacing, each by one atomic rename, the ledger rows
of other chunks that its scope overlaps), then the version; a kill anywhere in between
is folded again, idempotently, by the next write, `read_ledger` or `open()`. So the
ledger is as strong as the progress it is derived from: never a row for a chunk the log
does not hold, and, from the next open on, one for every chunk it does. Between a kill
and that open, a direct reader of the folder may miss the last chunk's rows (or see its
earlier write's): a chunk without proof, never a false one of another chunk.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from connectors import schema as tables
from connectors.timewindow import Window
from sinks.base import ChunkScope
from sinks.ledger import LEDGER_SCHEMA, ledger_rows, overlapped
from sinks.store.layout import STATE_DIR, is_data_file, key_name
from sinks.store.objects import Entry, LakeStore, token

LEDGER_SUFFIX = ".coverage"


class Log(Protocol):
    """What the ledger needs of a table-format sink: its log and its rows."""

    def records_since(self, dataset: str, version: int) -> tuple[int, list[dict[str, Any]]]: ...

    def _scan(self, dataset: str, target: pa.Schema) -> pa.Table | None: ...


def scope_of(record: Mapping[str, Any]) -> ChunkScope | None:
    """The scope a chunk record describes; None for a record of an earlier version
    (without its node and kind: no ledger for it)."""
    if "node" not in record or "kind" not in record:
        return None
    return ChunkScope(
        str(record["flow"]),
        str(record["dataset"]),
        str(record["kind"]),
        tuple(str(m) for m in record["members"]),
        Window.from_ms(int(record["start_ms"]), int(record["end_ms"])),
        str(record["chunk_id"]),
        node=str(record["node"]),
        held={str(k): str(v) for k, v in (record.get("held") or {}).items()},
    )


def own_key(record: Mapping[str, Any]) -> tuple[str, int]:
    """A record's identity: its chunk and commit time."""
    return str(record["chunk_id"]), int(record["committed_ns"])


class TableLedger:
    """The ledger files of one table-format sink, folded from its log."""

    def __init__(self, store: LakeStore, log: Log) -> None:
        self.store = store
        self.log = log

    def _state(self, dataset: str) -> str:
        return self.store.path(STATE_DIR, "ledger", f"{dataset}.json")

    def folder(self, dataset: str) -> str:
        return self.store.path(dataset + LEDGER_SUFFIX)

    def fold(self, dataset: str, own: Mapping[tuple[str, int], pa.Table] | None = None) -> None:
        """Bring the dataset's ledger up to its log (under the dataset's lock); `own`:
        ledger rows in hand, by `own_key` of their record."""
        found = self.store.read_json(self._state(dataset), torn_is_missing=True)
        version = int(found.get("version", -1)) if isinstance(found, dict) else -1
        latest, records = self.log.records_since(dataset, version)
        if latest == version:
            return
        data: pa.Table | None = None
        for record in records:
            scope = scope_of(record)
            if scope is None:
                continue
            rows = (own or {}).get(own_key(record))
            if rows is None:
                if data is None:
                    data = self.log._scan(dataset, tables.SCHEMAS[scope.kind])
                rows = ledger_rows(
                    scope,
                    _in_scope(data, scope),
                    committed_at=datetime.fromtimestamp(int(record["committed_ns"]) / 1e9, UTC),
                )
            self._put(dataset, scope, rows)
        self.store.makedirs(self.store.path(STATE_DIR, "ledger"))
        self.store.write_json(self._state(dataset), {"version": latest})

    def _files(self, dataset: str) -> list[Entry]:
        """The dataset's ledger files: one folder per progress key."""
        keys = self.store.listdir(self.folder(dataset))
        return [
            entry
            for key in sorted(keys, key=lambda e: e.name)
            if key.is_dir
            for entry in sorted(self.store.listdir(key.path), key=lambda e: e.name)
            if not entry.is_dir and is_data_file(entry.name)
        ]

    def _put(self, dataset: str, scope: ChunkScope, rows: pa.Table) -> None:
        """The chunk's ledger file, after the rows its scope overlaps left the others."""
        name = f"part-{scope.window.start_ms}-{scope.window.end_ms}-{scope.chunk_id}.parquet"
        mine = f"{self.folder(dataset)}/{key_name(scope.flow)}/{name}"
        for entry in self._files(dataset):
            if entry.path == mine or not _may_overlap(entry.name, scope.window):
                continue
            table = _read(self.store, entry.path)
            gone = overlapped(table, scope)
            if pc.any(gone).as_py():
                kept = table.filter(pc.invert(gone))
                if kept.num_rows:
                    self._place(kept, entry.path)
                else:
                    self.store.remove(entry.path)
        self._place(rows, mine)

    def _place(self, rows: pa.Table, path: str) -> None:
        temp = self.store.path(STATE_DIR, "ledger", "tmp", f"{token()}.parquet.tmp")
        self.store.write_parquet(rows, temp)
        self.store.replace(temp, path)

    def read(self, dataset: str) -> pa.Table:
        """Every ledger row of the dataset (call `fold` first)."""
        parts = [_read(self.store, entry.path) for entry in self._files(dataset)]
        return pa.concat_tables(parts) if parts else LEDGER_SCHEMA.empty_table()


def _may_overlap(name: str, window: Window) -> bool:
    """Does a ledger file's window (in its name) overlap `window`? True when unknown."""
    parts = name.split("-", 3)
    try:
        start, end = int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        return True
    return start < window.end_ms and end > window.start_ms


def _read(store: LakeStore, path: str) -> pa.Table:
    with store.pafs.open_input_file(path) as handle:
        return pq.read_table(handle).select(LEDGER_SCHEMA.names).cast(LEDGER_SCHEMA)


def _in_scope(data: pa.Table | None, scope: ChunkScope) -> pa.Table:
    """The rows a table holds in a chunk's scope (its node's, in its window, of its tags)."""
    if data is None:
        return tables.SCHEMAS[scope.kind].empty_table()
    ts = pc.cast(data.column("ts"), pa.int64())
    mask = pc.and_(
        pc.and_(pc.greater_equal(ts, scope.window.start_ms), pc.less(ts, scope.window.end_ms)),
        pc.equal(data.column("node"), scope.node),
    )
    if scope.kind == tables.KIND_TAG_HISTORY:
        mask = pc.and_(mask, pc.is_in(data.column("tag"), value_set=pa.array(scope.members)))
    return data.filter(pc.fill_null(mask, False))
