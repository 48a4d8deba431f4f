"""MariaDB / MySQL: the bulk load and the flow lock (the words are in sinks/sql/dialects.py).

Chunk rows go in by `LOAD DATA LOCAL INFILE` from a tab-separated file that Arrow's
compute kernels write column by column (bench/bench_sql.py compares it with pandas'
`to_sql` and with executemany INSERTs). LOAD DATA LOCAL turns errors into warnings
(it implies IGNORE), so a load is checked: rows skipped as duplicates show as fewer rows
loaded (a count mismatch, nothing committed), and any other warning (a value the column
could not hold) fails the write with the server's own message.

MariaDB/MySQL DOUBLE holds no NaN or infinity: such values are written as NULL.

The flow lock is `GET_LOCK(name, 0)` on a connection of its own, held for the run: the
server releases it when that session ends, as when the process is killed.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from sinks.base import SinkError
from sinks.sql.dialects import MySQL, quote
from sinks.sql.locks import SessionLock, holding

NULL = "\\N"


def _text_column(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """One column as LOAD DATA text: escaped, NULL as \\N."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    if pa.types.is_dictionary(kind):
        column = column.cast(kind.value_type)
        kind = column.type
    if pa.types.is_timestamp(kind):  # epoch ms: `load_data` makes the DATETIME
        text = column.cast(pa.timestamp("ms", tz="UTC")).cast(pa.int64()).cast(pa.string())
    elif pa.types.is_boolean(kind):
        text = column.cast(pa.int8()).cast(pa.string())
    elif pa.types.is_floating(kind):
        finite = pc.is_finite(column)
        text = pc.if_else(finite, column, pa.scalar(None, kind)).cast(pa.string())
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = column.cast(pa.string())
        for raw, escaped in (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r")):
            text = pc.replace_substring(text, raw, escaped)
    else:
        text = column.cast(pa.string())
    return pc.fill_null(text, NULL)


def tsv_bytes(table: pa.Table) -> memoryview:
    """The table as LOAD DATA's default format (tab-separated, backslash escapes, \\N),
    timestamps as epoch milliseconds."""
    columns = [_text_column(table.column(i)) for i in range(table.num_columns)]
    lines = pc.binary_join_element_wise(*columns, "\t")
    # One string per row, each ending in the separator the join appended: the values
    # buffer of the string array is the whole file, back to back.
    lines = pc.binary_join_element_wise(lines, pa.scalar(""), "\n")
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)[lines.offset :]
    data = lines.buffers()[2]
    if data is None:
        return memoryview(b"")
    return memoryview(data)[int(offsets[0]) : int(offsets[len(lines)])]


def _variable(index: int) -> str:
    return f"historian_v{index}"


def load_data(conn: Connection, target: str, table: pa.Table) -> int:
    """LOAD DATA LOCAL INFILE the rows into `target`; returns rows loaded, or raises a
    SinkError with the server's first warning when a value did not load as given."""
    if table.num_rows == 0:
        return 0
    # Timestamps travel as epoch milliseconds and become DATETIME on the server: exact, in
    # any year (FROM_UNIXTIME stops in 2038 on MariaDB 10), and 5x cheaper to write than
    # formatted text.
    stamps = {f.name for f in table.schema if pa.types.is_timestamp(f.type)}
    columns = ", ".join(
        f"@{_variable(i)}" if c in stamps else quote(c) for i, c in enumerate(table.column_names)
    )
    sets = ", ".join(
        f"{quote(c)} = TIMESTAMPADD(MICROSECOND, CAST(@{_variable(i)} AS SIGNED) * 1000, "
        "TIMESTAMP'1970-01-01 00:00:00')"
        for i, c in enumerate(table.column_names)
        if c in stamps
    )
    raw: Any = conn.connection.dbapi_connection
    with tempfile.NamedTemporaryFile(prefix="historian-load-", suffix=".tsv") as file:
        file.write(tsv_bytes(table))
        file.flush()
        path = file.name.replace("\\", "\\\\").replace("'", "\\'")
        with raw.cursor() as cursor:
            cursor.execute(
                f"LOAD DATA LOCAL INFILE '{path}' INTO TABLE {target} CHARACTER SET utf8mb4 "
                f"FIELDS TERMINATED BY '\\t' ESCAPED BY '\\\\' LINES TERMINATED BY '\\n' "
                f"({columns})" + (f" SET {sets}" if sets else "")
            )
            loaded = int(cursor.rowcount)
            cursor.execute("SELECT @@warning_count")  # a diagnostic: keeps the warnings
            if loaded == table.num_rows and not int(cursor.fetchone()[0]):
                return loaded
            cursor.execute("SHOW WARNINGS LIMIT 1")
            warning = cursor.fetchone()
    if loaded < table.num_rows and warning and int(warning[1]) == 1062:
        return loaded  # rows sharing a key: the caller's count check refuses the chunk
    reason = " ".join(str(warning[2]).split())[:200] if warning else "rows were changed"
    raise SinkError(f"{loaded} of {table.num_rows} rows loaded into {target}: {reason}")


def upsert(conn: Connection, target: str, table: pa.Table, key: Sequence[str]) -> int:
    """INSERT ... ON DUPLICATE KEY UPDATE every row (tag metadata: small); rows written."""
    if table.num_rows == 0:
        return 0
    names = table.column_names
    listed = ", ".join(quote(c) for c in names)
    marks = ", ".join(f":c{i}" for i in range(len(names)))
    clause = MySQL().upsert(key, [c for c in names if c not in key])
    values = [
        {f"c{i}": value for i, value in enumerate(row)}
        for row in zip(*(_py_values(table.column(n)) for n in names), strict=True)
    ]
    conn.execute(sa.text(f"INSERT INTO {target} ({listed}) VALUES ({marks}) {clause}"), values)
    return int(table.num_rows)


def _py_values(column: pa.ChunkedArray) -> list[Any]:
    """Python values PyMySQL escapes as the column wants (UTC wall time for timestamps)."""
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("ms"))
    return list(column.to_pylist())


def lock_name(key: str) -> str:
    """GET_LOCK names are at most 64 characters: the key's digest, readable prefix."""
    return "historian:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:48]


class NamedLock(SessionLock):
    """`GET_LOCK(name, 0)` (MariaDB/MySQL; `pid` is the connection id)."""

    def __init__(self, engine: Engine, flow: str, key: str, where: str) -> None:
        super().__init__(engine, flow, where)
        self.name = lock_name(key)

    holder_noun = "connection"

    def try_take(self, conn: sa.Connection) -> tuple[int | None, int | None]:
        got, pid = conn.execute(
            sa.text("SELECT GET_LOCK(:k, 0), CONNECTION_ID()"), {"k": self.name}
        ).one()
        if got == 1:
            return int(pid), None
        holder = conn.execute(sa.text("SELECT IS_USED_LOCK(:k)"), {"k": self.name}).scalar()
        return None, None if holder is None else int(holder)

    def held_sql(self) -> tuple[str, dict[str, object]]:
        return (
            "SELECT COALESCE(IS_USED_LOCK(:lock_name) = :lock_pid, 0)",
            {"lock_name": self.name, "lock_pid": self.pid},
        )

    def free_sql(self) -> tuple[str, dict[str, object]]:
        return "SELECT RELEASE_LOCK(:k)", {"k": self.name}


def named_lock(
    engine: Engine, flow: str, key: str, where: str
) -> contextlib.AbstractContextManager[NamedLock]:
    """Hold the flow's named lock for the block, or FlowLocked."""
    return holding(NamedLock(engine, flow, key, where))


def probe(engine: Engine, database: str) -> str:
    """Whether the database exists and this user may create tables (read from its grants,
    best effort: a CREATE or ALL PRIVILEGES grant anywhere), without creating anything."""
    with engine.connect() as conn:
        exists = conn.execute(
            sa.text("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = :s"),
            {"s": database},
        ).scalar()
        grants = " ".join(str(row[0]) for row in conn.execute(sa.text("SHOW GRANTS"))).upper()
        conn.rollback()
    allowed = "ALL PRIVILEGES" in grants or "CREATE" in grants
    found = f"database {database} " + ("exists" if exists else "does not exist yet")
    if not allowed:
        raise SinkError(f"no CREATE privilege ({found})")
    return f"{found}, writable"
