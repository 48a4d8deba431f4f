"""A warehouse dataset (table or view) reduced for a coverage report by the database.

The rows never leave the database: one GROUP BY yields the groups of `sinks.coverage`
(the same columns and meaning as the lake's reader, `sinks.lake.coverage`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from connectors.schema import GOOD_QUALITY, KIND_TAG_HISTORY
from connectors.timewindow import Window, from_ms
from sinks.base import Buckets
from sinks.coverage import ALARM_KEYS, ALARM_PARTS, BATCH_ROWS, TAG_PARTS
from sinks.sql.load import epoch_ms_sql
from sinks.sql.tables import Layout


class SqlCoverage:
    """A warehouse dataset (table or view) aggregated by the database: one GROUP BY.

    Buckets are computed by the database: `date_bin` on PostgreSQL 14+ (a timestamp to
    group on, the bucket index taken after grouping: faster than epoch arithmetic on every
    row), epoch milliseconds elsewhere. On PostgreSQL the query also asks for hash
    aggregation: right after a load, before statistics exist, the planner would otherwise
    sort every row to disk (BENCHMARKS.md, "Figures behind design choices").
    """

    def __init__(
        self, engine: Engine, layout: Layout, dialect: str, dataset: str, kind: str
    ) -> None:
        self.engine = engine
        self.layout = layout
        self.dialect = dialect
        self.dataset = dataset
        self.kind = kind

    def _relation(self, conn: Any) -> str | None:
        if not self.layout.columns(conn, self.dataset):
            return None
        return str(self.layout.table(self.dataset))

    def span(self) -> Window | None:
        with self.engine.connect() as conn:
            relation = self._relation(conn)
            if relation is None:
                return None
            lo, hi = conn.execute(
                sa.text(
                    f"SELECT {epoch_ms_sql('lo', self.dialect)}, {epoch_ms_sql('hi', self.dialect)} "
                    f"FROM (SELECT min(ts) AS lo, max(ts) AS hi FROM {relation}) AS s"
                )
            ).one()
        return None if lo is None else Window.from_ms(int(lo), int(hi) + 1)

    def _buckets(self, conn: Any, buckets: Buckets) -> tuple[str, str]:
        """SQL of the grouped bucket per row, and of its index once grouped."""
        size = int(buckets.bucket_ms)  # our own integer: safe to write into the SQL
        version = getattr(conn.dialect, "server_version_info", None) or (0,)
        if self.dialect == "postgresql" and version >= (14,):
            binned = f"date_bin(interval '{size} milliseconds', ts, :origin_ts)"
            index = (
                f"CAST(round(extract(epoch FROM (bucket - :origin_ts)) * 1000 / {size}) AS BIGINT)"
            )
            return binned, index
        epoch = epoch_ms_sql("ts", self.dialect)
        if self.dialect == "mysql":  # no CAST AS DOUBLE PRECISION / BIGINT; FLOOR is exact
            return f"FLOOR(({epoch} - :origin) / {size})", "bucket"
        return (
            f"CAST(floor(CAST({epoch} - :origin AS DOUBLE PRECISION) / {size}) AS BIGINT)",
            "bucket",
        )

    def partials(self, window: Window, buckets: Buckets) -> Iterator[pa.Table]:
        params = {
            "origin": buckets.start_ms,
            "origin_ts": from_ms(buckets.start_ms),
            "lo": window.start,
            "hi": window.end,
        }
        with self.engine.connect() as conn:
            relation = self._relation(conn)
            if relation is None:
                return
            if self.dialect == "postgresql":
                conn.exec_driver_sql("SET LOCAL enable_sort = off")  # this read's transaction only
            binned, index = self._buckets(conn, buckets)
            if self.kind == KIND_TAG_HISTORY:
                keys, names = ["member", "bucket"], ["member", "bucket", *TAG_PARTS]
                good = f"quality >= {GOOD_QUALITY}"
                inner = (
                    f"SELECT tag AS member, {binned} AS bucket, "
                    f"CASE WHEN {good} THEN 0 ELSE 1 END AS bad, "
                    f"CASE WHEN {good} THEN coalesce(value, "
                    "CASE WHEN value_bool THEN 1.0 WHEN NOT value_bool THEN 0.0 END) END AS v"
                )
                outer = (
                    'count(*) AS "rows", sum(bad) AS bad, min(v) AS low, max(v) AS high, '
                    "sum(v) AS total, count(v) AS counted"
                )
                types = [pa.string(), *[pa.int64()] * 3, *[pa.float64()] * 3, pa.int64()]
            else:
                keys, names = list(ALARM_KEYS), [*ALARM_KEYS, *ALARM_PARTS]
                inner = f"SELECT path AS member, {binned} AS bucket, priority, status"
                outer = "count(*) AS events"
                types = [pa.string(), *[pa.int64()] * 4]
            shown = ["member", f"{index} AS bucket", *keys[2:]]
            sql = (
                f"SELECT {', '.join(shown)}, {outer} FROM ({inner} FROM {relation} "
                f"WHERE ts >= :lo AND ts < :hi) AS s GROUP BY {', '.join(keys)}"
            )
            wanted = {k: v for k, v in params.items() if f":{k}" in sql}
            result = conn.execution_options(stream_results=True).execute(sa.text(sql), wanted)
            for rows in result.partitions(BATCH_ROWS):
                columns = list(zip(*rows, strict=True))
                yield pa.table(
                    {
                        name: pa.array([_plain(v) for v in column], type=kind)
                        for name, column, kind in zip(names, columns, types, strict=True)
                    }
                )


def _plain(value: Any) -> Any:
    """Decimals (PostgreSQL's sum/avg of numbers) as floats; everything else as it is."""
    return float(value) if value is not None and type(value).__name__ == "Decimal" else value
