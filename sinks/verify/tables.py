"""Is every committed chunk of a Delta or Iceberg table still there? The log against files.

A table's log lists its data files with their row counts and `ts` ranges; each file is
checked by its footer (present, readable, the logged row count), and a damaged file costs
every chunk of the flow whose window meets its `ts` range. When every file is whole, the
rows are counted per window against the chunks' records (`sinks.verify.counts`: records
name member counts, not members), reading the node's `tag` and `ts` columns only.

Repairing moves damaged files that are still there aside (`<root>/_quarantine/<their path
under the root>`, never deleted), commits the table without them (Delta: its `repair`,
which drops log entries of files that are gone; Iceberg: an overwrite deleting them), and
forgets the damaged chunks (`TableProgress.forget_chunks`), so the next run fetches
exactly them again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from connectors.timewindow import Window, to_ms
from sinks.base import Damage, UnreadableFile, Verified
from sinks.store.objects import LakeStore
from sinks.tables.progress import TableProgress
from sinks.verify.counts import Record, bucket_ms, expected_rows, short_windows

QUARANTINE_DIR = "_quarantine"


@dataclass(frozen=True)
class DataFile:
    """A data file as the table's log lists it."""

    path: str  # in the sink's store
    rows: int
    ts_min_ms: int | None
    ts_max_ms: int | None
    handle: Any = None  # what the table format needs to drop it


class TableFiles(Protocol):
    """What a table format tells the verifier about one dataset's current version."""

    def data_files(self, dataset: str) -> list[DataFile]: ...

    def rows(self, dataset: str, node: str) -> pa.Table:
        """The node's rows, columns `ts` and `tag` (alarms: `ts` only)."""

    def drop(self, dataset: str, files: Sequence[DataFile]) -> None:
        """Commit the table without these files (moved aside or gone)."""


def store_path(uri: str) -> str:
    """A file URI of a table's log as a path of the sink's store."""
    return uri.split("://", 1)[1] if "://" in uri else uri


def ms(moment: datetime | None) -> int | None:
    return None if moment is None else to_ms(moment)


class TablesVerifier:
    """Checks (and repairs) one progress key's chunks in a Delta or Iceberg sink."""

    def __init__(
        self,
        store: LakeStore,
        progress: TableProgress,
        files: TableFiles,
        dataset_lock: Callable[[str], AbstractContextManager[None]],
    ) -> None:
        self.store = store
        self.progress = progress
        self.files = files
        self.dataset_lock = dataset_lock

    def verify(self, flow: str, node: str, window: Window | None, *, repair: bool) -> Verified:
        found = Verified()
        members = set(self.progress.progress(flow).completed)
        for dataset, entries in self.progress.records(flow).items():
            records = [
                Record(chunk, dataset, Window.from_ms(e[0], e[1]), e[2], e[4], _at(e[5]))
                for chunk, e in entries.items()
                if window is None or (e[0] < window.end_ms and e[1] > window.start_ms)
            ]
            found.chunks += len(records)
            if not records:
                continue
            damaged, damages = self._check_files(dataset, records)
            if not damages:
                damages = self._check_rows(dataset, node, members, records)
            found.damages += damages
            if repair and damages:
                self._repair(flow, dataset, damaged, damages, found)
        return found

    def _check_files(
        self, dataset: str, records: list[Record]
    ) -> tuple[list[DataFile], list[Damage]]:
        damaged, damages = [], []
        for item in self.files.data_files(dataset):
            problem = self._problem(item)
            if problem is None:
                continue
            low, high = item.ts_min_ms, item.ts_max_ms
            costs = [
                r
                for r in records
                if low is None
                or high is None
                or (r.window.start_ms <= high and r.window.end_ms > low)
            ]
            if not costs:
                continue
            span = Window(min(r.window.start for r in costs), max(r.window.end for r in costs))
            chunks = tuple(sorted(r.chunk_id for r in costs))
            damaged.append(item)
            damages.append(Damage(self.store.display(item.path), span, problem, chunks))
        return damaged, damages

    def _problem(self, item: DataFile) -> str | None:
        try:
            rows = self.store.read_parquet_metadata(item.path).num_rows
        except FileNotFoundError:
            return f"missing (logged with {item.rows:,} rows)"
        except UnreadableFile as exc:
            return f"unreadable: {exc.reason}"
        if rows != item.rows:
            return f"holds {rows:,} rows, logged {item.rows:,}"
        return None

    def _check_rows(
        self, dataset: str, node: str, members: set[str], records: list[Record]
    ) -> list[Damage]:
        """Windows holding fewer of the node's rows of the flow's tags than recorded."""
        expected = expected_rows(records, len(members))
        origin, width = bucket_ms([g.window for g in expected])
        table = self.files.rows(dataset, node)
        if "tag" in table.column_names:
            tags = pc.cast(table["tag"], pa.string())
            table = table.filter(pc.is_in(tags, pa.array(sorted(members), pa.string())))
        # Epoch ms whatever unit the format keeps (Delta: microseconds).
        stamps = pc.cast(table["ts"], pa.timestamp("ms", tz="UTC")).cast(pa.int64()).to_numpy()
        buckets, counts = np.unique((stamps - origin) // width, return_counts=True)
        held = dict(zip(buckets.tolist(), counts.tolist(), strict=True))
        return short_windows(expected, held, (origin, width), f"table {dataset}")

    def _repair(
        self,
        flow: str,
        dataset: str,
        damaged: list[DataFile],
        damages: list[Damage],
        found: Verified,
    ) -> None:
        with self.dataset_lock(dataset):
            for item in damaged:
                if not self.store.exists(item.path):
                    continue
                target = self.store.path(QUARANTINE_DIR, self.store.relative(item.path))
                self.store.replace(item.path, target)
                found.quarantined.append(
                    (self.store.display(item.path), self.store.display(target))
                )
            if damaged:
                self.files.drop(dataset, damaged)
        chunks = sorted({chunk for damage in damages for chunk in damage.chunks})
        found.forgotten += self.progress.forget_chunks(flow, chunks)


def _at(committed_ns: int) -> datetime:
    return datetime.fromtimestamp(committed_ns / 1e9, tz=UTC)


class DeltaFiles:
    """A Delta table's files, rows and repair (`TableFiles`)."""

    def __init__(self, table: Callable[[str], Any]) -> None:
        self.table = table

    def data_files(self, dataset: str) -> list[DataFile]:
        found = self.table(dataset)
        if found is None:
            return []
        actions = pa.table(found.get_add_actions(flatten=True))
        uris = {uri.rsplit("/", 1)[-1]: uri for uri in found.file_uris()}
        names = actions.column_names
        return [
            DataFile(
                store_path(uris.get(row["path"].rsplit("/", 1)[-1], row["path"])),
                int(row["num_records"]),
                ms(row.get("min.ts")) if "min.ts" in names else None,
                ms(row.get("max.ts")) if "max.ts" in names else None,
            )
            for row in actions.to_pylist()
        ]

    def rows(self, dataset: str, node: str) -> pa.Table:
        found = self.table(dataset)
        dataset_ = found.to_pyarrow_dataset()
        columns = [c for c in ("tag", "ts") if c in dataset_.schema.names]
        return dataset_.to_table(columns=columns, filter=pc.field("node") == node)

    def drop(self, dataset: str, files: Sequence[DataFile]) -> None:
        self.table(dataset).repair(dry_run=False)


class IcebergFiles:
    """An Iceberg table's files, rows and repair (`TableFiles`)."""

    def __init__(self, table: Callable[[str], Any]) -> None:
        self.table = table

    def data_files(self, dataset: str) -> list[DataFile]:
        found = self.table(dataset)
        if found is None or found.current_snapshot() is None:
            return []
        files = []
        for task in found.scan().plan_files():
            data = task.file
            bounds = _ts_bounds(found, data)
            files.append(
                DataFile(store_path(data.file_path), int(data.record_count), *bounds, data)
            )
        return files

    def rows(self, dataset: str, node: str) -> pa.Table:
        import pyiceberg.expressions

        ex: Any = pyiceberg.expressions  # typed Any: pydantic signatures confuse mypy
        found = self.table(dataset)
        names = [f.name for f in found.schema().fields]
        columns = tuple(c for c in ("tag", "ts") if c in names)
        arrow: pa.Table = found.scan(
            row_filter=ex.EqualTo("node", node), selected_fields=columns
        ).to_arrow()
        return arrow

    def drop(self, dataset: str, files: Sequence[DataFile]) -> None:
        found = self.table(dataset)
        with found.transaction() as tx, tx.update_snapshot().overwrite() as overwrite:
            for item in files:
                overwrite.delete_data_file(item.handle)


def _ts_bounds(table: Any, data: Any) -> tuple[int | None, int | None]:
    """A data file's `ts` range from its logged bounds (epoch microseconds), if any."""
    from pyiceberg.conversions import from_bytes

    field = table.schema().find_field("ts")
    low = (data.lower_bounds or {}).get(field.field_id)
    high = (data.upper_bounds or {}).get(field.field_id)
    if low is None or high is None:
        return None, None
    lo, hi = from_bytes(field.field_type, low), from_bytes(field.field_type, high)
    return int(lo) // 1000, int(hi) // 1000
