"""One chunk's write, as the statements of its one transaction.

Delete the chunk's scope from the target, bulk-load the rows (PostgreSQL: binary COPY;
MariaDB/MySQL: LOAD DATA; DuckDB: a registered Arrow view), check the count, record the
chunk and merge its window into the progress of every member. All of it commits or none
of it does, so a crash or a dropped connection at any point leaves the whole chunk or
nothing, and a re-run replaces instead of adding. The caller owns the transaction (and
the checks that need the sink's own state, like the flow lock).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from sqlalchemy.engine import Connection

from connectors.schema import KEYS, KIND_TAG_HISTORY
from sinks.base import ChunkScope, CountMismatch
from sinks.sql import mysql as sql_mysql
from sinks.sql.datasets import check_facts
from sinks.sql.errors import is_database_error, is_duplicate_key
from sinks.sql.load import copy_binary, load_duckdb, scalar_list
from sinks.sql.state import merge_progress, record_chunk
from sinks.sql.tables import SERIES_TABLE, Layout, Storage


def replace_chunk(
    conn: Connection,
    layout: Layout,
    scope: ChunkScope,
    table: pa.Table,
    storage: Storage,
    rows_fetched: int,
    sink: str,
) -> int:
    """Replace the scope's rows by `table` and record the chunk; returns rows committed,
    or CountMismatch (the caller's transaction then commits nothing)."""
    check_facts(conn, layout, scope, sink)
    delete_scope(conn, layout, scope, storage)
    committed = load_rows(conn, layout, scope, table, storage, sink)
    if committed != rows_fetched:
        raise CountMismatch(
            f"sink {sink}: chunk {scope.chunk_id} committed {committed} rows, "
            f"fetched {rows_fetched}: nothing committed"
        )
    record_chunk(conn, layout, scope, rows_fetched, committed)
    merge_progress(conn, layout, scope)
    return committed


def delete_scope(conn: Connection, layout: Layout, scope: ChunkScope, storage: Storage) -> None:
    """Delete the scope's rows: its node's, of its members, in its window."""
    params: dict[str, Any] = {"s": scope.window.start, "e": scope.window.end, "n": scope.node}
    where = "ts >= :s AND ts < :e"
    lists: tuple[str, ...] = ()
    if not storage.narrow:
        # The key leads with node (tag history: then tag; alarms: then path).
        where += " AND node = :n"
        if scope.kind == KIND_TAG_HISTORY:
            params["members"] = list(scope.members)
            where += " AND " + layout.sql.in_list("tag", "members")
            lists = ("members",)
    elif layout.dialect == "mysql":
        # The series' ids first: a subquery in a DELETE is run per row in MariaDB 10,
        # and the key of the rows leads with series_id (the window alone has no index).
        params["ids"] = scalar_list(
            conn,
            f"SELECT series_id FROM {layout.table(SERIES_TABLE)} WHERE node = :n AND tag IN :t",
            {"n": scope.node, "t": list(scope.members)},
            layout.sql.text,
        )
        if not params["ids"]:
            return
        where += " AND series_id IN :ids"
        lists = ("ids",)
    else:
        # The node's series of the scope's tags (the key leads with series_id).
        params["members"] = list(scope.members)
        where += (
            " AND series_id = ANY(ARRAY(SELECT series_id FROM "
            f"{layout.table(SERIES_TABLE)} WHERE node = :n AND "
            f"{layout.sql.in_list('tag', 'members')}))"
        )
        lists = ("members",)
    conn.execute(layout.sql.text(f"DELETE FROM {storage.target} WHERE {where}", *lists), params)


def load_rows(
    conn: Connection,
    layout: Layout,
    scope: ChunkScope,
    table: pa.Table,
    storage: Storage,
    sink: str,
) -> int:
    """Bulk-load the rows into the (emptied) scope; rows loaded. Two rows with one key
    are a CountMismatch: after the delete only the frame itself can hold them."""
    target = storage.target
    key = KEYS[scope.kind]
    try:
        if layout.dialect == "postgresql":
            return copy_binary(conn, target, table) if table.num_rows else 0
        if layout.dialect == "mysql":
            return sql_mysql.load_data(conn, target, table)
        return load_duckdb(conn, target, table, key)
    except Exception as exc:
        if is_database_error(exc) and is_duplicate_key(exc):
            raise CountMismatch(
                f"sink {sink}: chunk {scope.chunk_id}: rows share one key "
                f"({', '.join(key)}); fetched {table.num_rows}, nothing committed"
            ) from None
        raise
