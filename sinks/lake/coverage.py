"""A lake dataset reduced for a coverage report file by file, row group by row group.

One `ParquetFile` at a time rather than a pyarrow Dataset scan: the scan's memory grew
with the number of files, a file at a time stays at one row group's worth whatever their
number (BENCHMARKS.md, "Figures behind design choices"). Only the needed columns are
read, and row groups whose `ts` statistics fall outside the range are not.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from connectors.schema import KIND_TAG_HISTORY, SCHEMAS
from connectors.timewindow import Window
from sinks.base import Buckets
from sinks.coverage import BATCH_ROWS, TS, columns, partials
from sinks.lake.files import visible_files
from sinks.store.objects import LakeStore


class LakeCoverage:
    """A lake dataset's groups per (series, bucket) (`sinks.base.CoverageReader`)."""

    def __init__(self, store: LakeStore, dataset: str, kind: str) -> None:
        self.kind = kind
        self.store = store
        self.paths = visible_files(store, dataset)  # as `ParquetLake.read` lists them
        self.filesystem = store.pafs
        self.member = "tag" if kind == KIND_TAG_HISTORY else "path"
        self.schema = pa.schema(
            [
                pa.field(name, pa.dictionary(pa.int32(), pa.string()))
                if name == self.member
                else SCHEMAS[kind].field(name)
                for name in columns(kind)
            ]
        )

    def _files(self) -> Iterator[Any]:
        for path in self.paths:
            with self.filesystem.open_input_file(path) as handle:
                with self.store.named_if_unreadable(path):
                    file = pq.ParquetFile(handle, read_dictionary=[self.member])
                yield file

    def span(self) -> Window | None:
        lo: int | None = None
        hi: int | None = None
        for file in self._files():
            for first, last in _ts_bounds(file):
                lo = first if lo is None else min(lo, first)
                hi = last if hi is None else max(hi, last)
        return None if lo is None or hi is None else Window.from_ms(lo, hi + 1)

    def partials(self, window: Window, buckets: Buckets) -> Iterator[pa.Table]:
        lo, hi = pa.scalar(window.start_ms, TS), pa.scalar(window.end_ms, TS)
        for file in self._files():
            groups = [
                index
                for index, bounds in _row_group_bounds(file)
                if bounds is None or (bounds[0] < window.end_ms and bounds[1] >= window.start_ms)
            ]
            present = [n for n in self.schema.names if n in file.schema_arrow.names]
            for batch in file.iter_batches(BATCH_ROWS, row_groups=groups, columns=present):
                table = self._conform(batch)
                ts = table.column("ts")
                table = table.filter(pc.and_(pc.greater_equal(ts, lo), pc.less(ts, hi)))
                if table.num_rows:
                    yield partials(table, self.kind, buckets)

    def _conform(self, batch: pa.RecordBatch) -> pa.Table:
        """The batch with this kind's column types; a column the file lacks is all null."""
        found = [
            batch.column(f.name).cast(f.type)
            if f.name in batch.schema.names
            else pa.nulls(batch.num_rows, f.type)
            for f in self.schema
        ]
        return pa.Table.from_arrays(found, schema=self.schema)


def _row_group_bounds(file: Any) -> Iterator[tuple[int, tuple[int, int] | None]]:
    """(row group, (min, max) epoch ms of `ts` from the footer, or None without statistics)."""
    column = file.schema_arrow.get_field_index("ts")
    for index in range(file.metadata.num_row_groups):
        stats = file.metadata.row_group(index).column(column).statistics
        known = stats is not None and stats.has_min_max
        yield index, ((_ms(stats.min), _ms(stats.max)) if known else None)


def _ts_bounds(file: Any) -> Iterator[tuple[int, int]]:
    """(min, max) epoch ms of `ts` per row group: from the footer, else read."""
    for index, bounds in _row_group_bounds(file):
        if bounds is not None:
            yield bounds
            continue
        column = file.read_row_group(index, columns=["ts"]).column("ts")
        if len(column) > column.null_count:
            found = pc.min_max(pc.cast(column, pa.int64()))
            yield int(found["min"].as_py()), int(found["max"].as_py())


def _ms(value: Any) -> int:
    if isinstance(value, int):
        return value
    return int(pa.scalar(value, TS).cast(pa.int64()).as_py())
