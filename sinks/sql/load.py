"""Bulk movement of Arrow tables in and out of the warehouse, inside the caller's transaction.

Chunk rows, PostgreSQL: binary COPY (encoded by sinks/sql/pg_copy.py) straight into the
target, after the caller deleted the chunk's scope. Measured against COPY into a
temporary staging table + INSERT ... SELECT ... ON CONFLICT DO UPDATE, the direct COPY
moves the same rows in about half the time (bench/bench_sql.py), and the safety net is
the primary key itself: after the delete a conflict can only come from the frame
(two rows with one key), and then the whole transaction fails instead of keeping either.

Upserts (tag metadata), and every DuckDB load: staged rows (a temporary table filled by
COPY; a registered Arrow view in DuckDB) read by one INSERT ... ON CONFLICT DO UPDATE.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from psycopg.copy import QueuedLibpqWriter
from sqlalchemy.engine import Connection

from sinks.sql.dialects import DIALECTS, quote
from sinks.sql.pg_copy import iter_binary_copy

_COPY_STEP = 1 << 20
_names = itertools.count()


def _upsert_sql(target: str, source: str, columns: Sequence[str], key: Sequence[str]) -> str:
    listed = ", ".join(quote(c) for c in columns)
    keys = ", ".join(quote(k) for k in key)
    rest = [c for c in columns if c not in key]
    action = (
        "DO UPDATE SET " + ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in rest)
        if rest
        else "DO NOTHING"
    )
    return (
        f"INSERT INTO {target} ({listed}) SELECT {listed} FROM {source} "
        f"ON CONFLICT ({keys}) {action}"
    )


def copy_binary(conn: Connection, target: str, table: pa.Table) -> int:
    """COPY a table into `target` (PostgreSQL, psycopg 3) as binary; returns rows copied.

    The stream is encoded in pieces and handed to a queued writer, whose thread sends one
    piece while this one encodes the next: the client's work overlaps the server's.
    """
    columns = ", ".join(quote(c) for c in table.column_names)
    raw: Any = conn.connection.dbapi_connection
    with raw.cursor() as cursor:
        statement = f"COPY {target} ({columns}) FROM STDIN (FORMAT binary)"
        with cursor.copy(statement, writer=QueuedLibpqWriter(cursor)) as copy:
            for piece in iter_binary_copy(table):
                view = memoryview(piece)
                for offset in range(0, len(view), _COPY_STEP):
                    copy.write(view[offset : offset + _COPY_STEP])
        return int(cursor.rowcount)


def upsert_postgres(conn: Connection, target: str, table: pa.Table, key: Sequence[str]) -> int:
    """Stage a table by binary COPY, then upsert it into `target`; returns rows written."""
    if table.num_rows == 0:
        return 0
    stage = quote(f"historian_stage_{next(_names)}")
    conn.exec_driver_sql(
        f"CREATE TEMPORARY TABLE {stage} (LIKE {target} INCLUDING DEFAULTS) ON COMMIT DROP"
    )
    copy_binary(conn, stage, table)
    result = conn.exec_driver_sql(_upsert_sql(target, stage, table.column_names, key))
    conn.exec_driver_sql(f"DROP TABLE {stage}")
    return int(result.rowcount)


def load_duckdb(conn: Connection, target: str, table: pa.Table, key: Sequence[str]) -> int:
    """Upsert a table into `target` by scanning it as a registered Arrow view (DuckDB)."""
    if table.num_rows == 0:
        return 0
    raw: Any = conn.connection.dbapi_connection
    view = f"historian_stage_{next(_names)}"
    raw.register(view, table)
    try:
        row = raw.execute(_upsert_sql(target, quote(view), table.column_names, key)).fetchone()
    finally:
        raw.unregister(view)
    return int(row[0]) if row else 0


def select_arrow(conn: Connection, dialect: str, sql: str, schema: pa.Schema) -> pa.Table:
    """Run a SELECT whose columns match `schema` (timestamps as epoch ms) into an Arrow table."""
    if dialect == "duckdb":
        raw: Any = conn.connection.dbapi_connection
        result = raw.execute(sql).arrow()
        fetched = result.read_all() if isinstance(result, pa.RecordBatchReader) else result
        arrays = [fetched.column(i).combine_chunks() for i in range(len(schema))]
    else:
        rows = conn.exec_driver_sql(sql).fetchall()
        # Drivers hand back what the column holds (MySQL: 0/1 for a boolean), so values
        # are taken as they come and cast to the schema's type below.
        arrays = [
            pa.array([row[i] for row in rows], type=_fetch_type(field.type))
            if not pa.types.is_boolean(field.type)
            else pa.array([row[i] for row in rows])
            for i, field in enumerate(schema)
        ]
    return pa.Table.from_arrays(
        [a.cast(f.type) for a, f in zip(arrays, schema, strict=True)], schema=schema
    )


def _fetch_type(kind: pa.DataType) -> pa.DataType:
    return pa.int64() if pa.types.is_timestamp(kind) else kind


def epoch_ms_sql(column: str, dialect: str) -> str:
    """SQL for a timestamp column as BIGINT epoch milliseconds (exact, no time zone)."""
    return DIALECTS[dialect]().epoch_ms(column)


def scalar_list(
    conn: Connection,
    sql: str,
    params: dict[str, Any],
    text: Callable[[str, str], sa.TextClause] | None = None,
) -> list[Any]:
    """First column of every row of a query (`text` makes the statement with its one list
    parameter `t`: `Dialect.text`)."""
    statement = sa.text(sql) if text is None else text(sql, "t")
    return [row[0] for row in conn.execute(statement, params)]
