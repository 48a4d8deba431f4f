"""What the table-format sinks (Delta Lake, Iceberg) do alike around their library's commit.

Both keep their progress in their commit logs (`sinks.tables.progress`), check a chunk's
rows once (`sinks.tables.rows`), refuse a chunk whose dataset was written with other
settings, and read a dataset back whole; they differ in how a table is found, committed
to and scanned, which each says in `_scan` and its own write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from connectors import schema as tables
from connectors.schema import Rows
from connectors.timewindow import Window
from sinks.base import ChunkScope, SinkError, Verified
from sinks.identity import differences
from sinks.ledger import ledger_rows
from sinks.store.file_sink import FileSink
from sinks.store.layout import check_dataset, check_flow
from sinks.tables.ledger import TableLedger, own_key
from sinks.tables.progress import Record, TableProgress
from sinks.tables.rows import chunk_rows, plain, reason, transient, typed_table
from sinks.verify.tables import TableFiles, TablesVerifier

HISTORY_KINDS = (tables.KIND_TAG_HISTORY, tables.KIND_ALARM_HISTORY)
# The s3fs options the side files (locks, progress caches) take, and whether each goes
# into the client's keyword arguments.
_S3FS_CLIENT = {
    "endpoint_url": True,
    "region_name": True,
    "key": False,
    "secret": False,
    "token": False,
}


def s3fs_options(settings: Mapping[str, str], names: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """A table library's S3 settings as the s3fs options of the sink's side files.

    `names`: per s3fs option, the setting keys that give it (the last one present wins).
    """
    options: dict[str, Any] = {}
    client: dict[str, Any] = {}
    for option, keys in names.items():
        for key in keys:
            if key in settings:
                (client if _S3FS_CLIENT[option] else options)[option] = settings[key]
    if client:
        options["client_kwargs"] = client
    return options


class TableSink(FileSink):
    """A table-format sink: a `FileSink` whose progress is read back from its tables' logs
    (it is the `CommitLog` of its own `TableProgress`)."""

    def __init__(self, url: str, *, name: str, s3: Mapping[str, object]) -> None:
        """`s3`: the s3fs options of the side files when `url` is on object storage."""
        url = url.rstrip("/") or url
        self.local = "://" not in url or url.startswith("file://")
        super().__init__(url, name=name, storage_options={} if self.local else s3)
        self._progress: TableProgress | None = None
        self._ledger: TableLedger | None = None

    @property
    def state(self) -> TableProgress:
        if self._progress is None:
            self._progress = TableProgress(self.store, self)
        return self._progress

    @property
    def ledger(self) -> TableLedger:
        """The completeness ledger, folded from the tables' logs (`sinks.tables.ledger`)."""
        if self._ledger is None:
            self._ledger = TableLedger(self.store, self)
        return self._ledger

    def _opened(self) -> None:
        """Fold into each dataset's ledger the commits a killed writer left unfolded."""
        for dataset in self.datasets():
            with self._dataset_lock(dataset):
                self.ledger.fold(dataset)

    def read_ledger(self, dataset: str) -> pa.Table:
        """The dataset's completeness ledger, up to its log (`sinks.tables.ledger`)."""
        check_dataset(dataset)
        with self._errors(f"read the ledger of dataset '{dataset}'"):
            with self._dataset_lock(dataset):
                self.ledger.fold(dataset)
            return self.ledger.read(dataset)

    @staticmethod
    def _ledger_rows(
        scope: ChunkScope, table: pa.Table, record: Mapping[str, Any]
    ) -> dict[tuple[str, int], pa.Table]:
        """The chunk's ledger rows, by the key of the record its commit carries."""
        moment = datetime.fromtimestamp(int(record["committed_ns"]) / 1e9, UTC)
        return {own_key(record): ledger_rows(scope, table, committed_at=moment)}

    def _transient(self, exc: BaseException) -> bool:
        return transient(exc)

    def _reason(self, exc: BaseException) -> str:
        return reason(exc)

    # -- the commit log (TableProgress's CommitLog) -------------------------------------

    def datasets(self) -> list[str]:
        """Datasets that hold tables (the tag dimension aside)."""
        raise NotImplementedError

    def records_since(self, dataset: str, version: int) -> tuple[int, list[Record]]:
        """The latest version of the dataset's log and the chunk records after `version`."""
        raise NotImplementedError

    # -- verifying ----------------------------------------------------------------------

    def _table_files(self) -> TableFiles:
        """The table format's files, rows and repair, for `verify`."""
        raise NotImplementedError

    def verify(
        self, flow: str, node: str, window: Window | None = None, *, repair: bool = False
    ) -> Verified:
        """Every committed chunk against the table's files and rows (`sinks.verify.tables`)."""
        check_flow(flow)
        with self._errors(f"verify flow '{flow}'"):
            files = self._table_files()
            verifier = TablesVerifier(self.store, self.state, files, self._dataset_lock)
            return verifier.verify(flow, node, window, repair=repair)

    # -- writes -------------------------------------------------------------------------

    def _chunk_rows(self, scope: ChunkScope, rows: Rows, rows_fetched: int) -> pa.Table:
        """The chunk's rows checked once (`sinks.tables.rows.chunk_rows`), for a history
        kind only; SinkError (CountMismatch) before anything is written."""
        check_dataset(scope.dataset)
        check_flow(scope.flow)
        if scope.kind not in HISTORY_KINDS:
            raise SinkError(
                f"{self.label} '{self.name}': write chunk {scope.chunk_id}: "
                f"cannot write kind {scope.kind!r}"
            )
        return chunk_rows(rows, scope, rows_fetched, f"{self.label} '{self.name}'")

    def _metadata_rows(self, rows: Rows) -> pa.Table:
        """Tag metadata as a plain table, the last row of each (node, tag) kept."""
        unique = tables.last_per_key(rows, tables.TAG_METADATA_KEY)
        where = f"{self.label} '{self.name}': write tag metadata"
        return plain(typed_table(unique, tables.KIND_TAG_METADATA, where))

    def _check_settings(self, scope: ChunkScope, facts: dict[str, Any]) -> None:
        """SinkError when the dataset's stored kind and attrs differ from the chunk's."""
        found = differences(facts.get("kind"), facts.get("attrs") or {}, scope.kind, scope.attrs)
        if found:
            raise SinkError(
                f"{self.label} '{self.name}': dataset '{scope.dataset}' was written with other "
                f"settings ({'; '.join(found)}); use another dataset name or reset it"
            )
