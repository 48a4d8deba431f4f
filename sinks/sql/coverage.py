"""A warehouse dataset (table or view) reduced for a coverage report by the database, and
the warehouse's completeness ledger.

The rows never leave the database: one GROUP BY yields the groups of `sinks.coverage`
(the same columns and meaning as the lake's reader, `sinks.lake.coverage`).

The ledger (`sinks.ledger`) is one table, `historian_coverage`, with a `dataset` column,
keyed by (dataset, node, tag, window_start, chunk_id): in a chunk's own transaction
(`write_ledger`) the ledger rows its scope overlaps are deleted (as its rows are) and its
own loaded, so they commit with its rows and progress or not at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from connectors.schema import GOOD_QUALITY, KIND_TAG_HISTORY
from connectors.timewindow import Window, from_ms
from sinks.base import Buckets, ChunkScope
from sinks.coverage import ALARM_KEYS, ALARM_PARTS, BATCH_ROWS, TAG_PARTS
from sinks.ledger import LEDGER_KEY, LEDGER_SCHEMA, ledger_tags
from sinks.sql import mysql as sql_mysql
from sinks.sql.dialects import quote
from sinks.sql.load import copy_binary, epoch_ms_sql, load_duckdb, select_arrow
from sinks.sql.tables import Layout, check_dataset_name

LEDGER_TABLE = "historian_coverage"


def ensure_ledger(conn: Connection, layout: Layout) -> None:
    """Create the ledger table (and the index its per-chunk delete uses) if absent."""
    if layout.columns(conn, LEDGER_TABLE):
        return
    columns = [
        (f.name, layout.column_ddl(f, f.name in LEDGER_KEY).split(" ", 1)[1]) for f in LEDGER_SCHEMA
    ]
    conn.execute(sa.text(layout.create_table(LEDGER_TABLE, columns, LEDGER_KEY)))


def write_ledger(conn: Connection, layout: Layout, scope: ChunkScope, rows: pa.Table) -> None:
    """Replace the ledger rows the chunk's scope overlaps (its node's, of its members, in
    windows overlapping its own) by its `rows`, in the caller's transaction."""
    members = sorted(ledger_tags(scope))
    target = layout.table(LEDGER_TABLE)
    where = (
        "dataset = :d AND node = :n AND window_start < :e AND window_end > :s AND "
        + layout.sql.in_list("tag", "members")
    )
    conn.execute(
        layout.sql.text(f"DELETE FROM {target} WHERE {where}", "members"),
        {
            "d": scope.dataset,
            "n": scope.node,
            "s": scope.window.start,
            "e": scope.window.end,
            "members": members,
        },
    )
    if rows.num_rows == 0:
        return
    if layout.dialect == "postgresql":
        copy_binary(conn, target, rows)
    elif layout.dialect == "mysql":
        sql_mysql.load_data(conn, target, rows)
    else:
        load_duckdb(conn, target, rows, LEDGER_KEY)


def read_ledger(conn: Connection, layout: Layout, dataset: str) -> pa.Table:
    """A dataset's ledger rows (LEDGER_SCHEMA); empty when the table is absent."""
    if not layout.columns(conn, LEDGER_TABLE):
        return LEDGER_SCHEMA.empty_table()
    columns = ", ".join(
        layout.sql.epoch_ms(f.name) if pa.types.is_timestamp(f.type) else quote(f.name)
        for f in LEDGER_SCHEMA
    )
    check_dataset_name(dataset)  # a plain name: safe in the SQL text
    sql = (
        f"SELECT {columns} FROM {layout.table(LEDGER_TABLE)} WHERE dataset = '{dataset}' "
        "ORDER BY window_start, tag"
    )
    return select_arrow(conn, layout.dialect, sql, LEDGER_SCHEMA)


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
