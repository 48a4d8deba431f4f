"""What a dataset holds per series and time bucket: the partial groups coverage readers yield.

A coverage reader (`sinks.base.ReadsCoverage`) reduces rows where they live - the lake a
record batch at a time, a SQL warehouse in one GROUP BY - into rows of partial groups,
and the report merges them. These are the groups' columns and the one reduction of
Arrow rows, so every reader (and the report's read-whole path) means the same by them.

Tag history: rows, bad-quality rows (quality < 192, or none) and the min / sum / count of
the good values per (tag, bucket); booleans count as 0/1, text values have no trend.
Alarm history: events per (alarm path, bucket, priority, status).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from connectors.schema import GOOD_QUALITY, KIND_TAG_HISTORY
from sinks.base import Buckets

TS = pa.timestamp("ms", tz="UTC")
BATCH_ROWS = 262_144  # rows reduced at a time

TAG_KEYS = ("member", "bucket")
# Each part of a tag group, and how partial groups of one key merge.
TAG_PARTS = {
    "rows": "sum",
    "bad": "sum",
    "low": "min",
    "high": "max",
    "total": "sum",
    "counted": "sum",
}
ALARM_KEYS = ("member", "bucket", "priority", "status")
ALARM_PARTS = {"events": "sum"}


def columns(kind: str) -> list[str]:
    """The columns of a kind's rows that its groups are made of."""
    if kind == KIND_TAG_HISTORY:
        return ["tag", "ts", "quality", "value", "value_bool"]
    return ["path", "ts", "priority", "status"]


def bucket_of(ts: pa.ChunkedArray | pa.Array, buckets: Buckets) -> pa.Array:
    """Each time's bucket index (floored: times before `start_ms` are negative)."""
    return pc.divide(pc.subtract(pc.cast(ts, pa.int64()), buckets.start_ms), buckets.bucket_ms)


def _text(column: Any) -> Any:
    return pc.cast(column, pa.string()) if pa.types.is_dictionary(column.type) else column


def tag_partials(table: pa.Table | pa.RecordBatch, buckets: Buckets) -> pa.Table:
    """Rows (tag, ts, quality, value, value_bool) -> one row per (tag, bucket) present."""
    quality = table.column("quality")
    good = pc.fill_null(pc.greater_equal(quality, GOOD_QUALITY), False)
    numeric = pc.coalesce(table.column("value"), pc.cast(table.column("value_bool"), pa.float64()))
    value = pc.if_else(good, numeric, pa.scalar(None, pa.float64()))
    work = pa.table(
        {
            "member": table.column("tag"),
            "bucket": bucket_of(table.column("ts"), buckets),
            "bad": pc.cast(pc.invert(good), pa.int64()),
            "value": value,
        }
    )
    grouped = work.group_by(list(TAG_KEYS)).aggregate(
        [
            ([], "count_all"),
            ("bad", "sum"),
            ("value", "min"),
            ("value", "max"),
            ("value", "sum"),
            ("value", "count"),
        ]
    )
    return pa.table(
        {
            "member": _text(grouped.column("member")),
            "bucket": grouped.column("bucket"),
            "rows": grouped.column("count_all"),
            "bad": grouped.column("bad_sum"),
            "low": grouped.column("value_min"),
            "high": grouped.column("value_max"),
            "total": grouped.column("value_sum"),
            "counted": grouped.column("value_count"),
        }
    )


def alarm_partials(table: pa.Table | pa.RecordBatch, buckets: Buckets) -> pa.Table:
    """Rows (path, ts, priority, status) -> events per (path, bucket, priority, status)."""
    work = pa.table(
        {
            "member": table.column("path"),
            "bucket": bucket_of(table.column("ts"), buckets),
            "priority": table.column("priority"),
            "status": table.column("status"),
        }
    )
    grouped = work.group_by(list(ALARM_KEYS)).aggregate([([], "count_all")])
    return pa.table(
        {
            "member": _text(grouped.column("member")),
            "bucket": grouped.column("bucket"),
            "priority": pc.cast(grouped.column("priority"), pa.int64()),
            "status": pc.cast(grouped.column("status"), pa.int64()),
            "events": grouped.column("count_all"),
        }
    )


def partials(table: pa.Table | pa.RecordBatch, kind: str, buckets: Buckets) -> pa.Table:
    """The kind's partial groups of these rows."""
    if kind == KIND_TAG_HISTORY:
        return tag_partials(table, buckets)
    return alarm_partials(table, buckets)
