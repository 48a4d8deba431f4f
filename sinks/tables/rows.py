"""A chunk's rows made ready for a table-format sink (Delta Lake, Iceberg), checked once.

Both sinks refuse the same things before anything is written: a frame that does not fit
the kind's schema, nulls in key columns, rows outside the chunk's scope, a row count
other than the one fetched, and rows sharing a key. Rows are stored sorted by the kind's
key; the engine's chunks already are, so sortedness is checked first (adjacent rows, on
the dictionary ranks of `node` and `tag`) and a sort is paid only when needed.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from connectors import schema as tables
from connectors.schema import Rows
from sinks.base import ChunkScope, CountMismatch, SinkError
from sinks.scope import check_scope


def reason(exc: BaseException) -> str:
    """An exception as one short line (library errors span lines and tables)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def transient(exc: BaseException) -> bool:
    """Whether a failure looks like an unreachable store (try again later)."""
    text = str(exc).lower()
    return isinstance(exc, ConnectionError | TimeoutError) or any(
        word in text for word in ("connection refused", "timed out", "connection reset")
    )


def typed_table(rows: Rows, kind: str, where: str) -> pa.Table:
    """The rows as the kind's Arrow table (string columns that arrive dictionary-encoded
    stay so, until `plain`); SinkError naming `where` when it does not fit."""
    try:
        table = tables.table_from_frame(rows, kind, keep_dictionaries=True)
    except (KeyError, ValueError, TypeError, pa.ArrowException) as exc:
        raise SinkError(
            f"{where}: the frame does not match the {kind} schema: {reason(exc)}"
        ) from exc
    for item in tables.SCHEMAS[kind]:
        if not item.nullable and table.column(item.name).null_count:
            raise SinkError(f"{where}: column {item.name} has nulls")
    return table


def conform(table: pa.Table, target: pa.Schema) -> pa.Table:
    """The table's columns of `target`, in its order and types (a table read back)."""
    return pa.table([table.column(f.name).cast(f.type) for f in target], schema=target)


def plain(table: pa.Table) -> pa.Table:
    """Dictionary-encoded columns decoded: what the table formats store."""
    for i, item in enumerate(table.schema):
        if pa.types.is_dictionary(item.type):
            table = table.set_column(i, item.name, table.column(i).cast(item.type.value_type))
    return table


def _adjacent(table: pa.Table, keys: list[str]) -> tuple[pa.Array, pa.Array]:
    """Per adjacent pair of rows: (ordered by `keys`, equal on every key)."""
    n = table.num_rows
    ordered: pa.Array | None = None
    equal: pa.Array | None = None
    for key in reversed(keys):
        column = tables.sort_key(table.column(key))
        before, after = column.slice(0, n - 1), column.slice(1)
        same = pc.fill_null(pc.equal(before, after), False)
        less = pc.fill_null(pc.less(before, after), False)
        if ordered is None or equal is None:
            ordered, equal = pc.or_(less, same), same
        else:
            ordered = pc.or_(less, pc.and_(same, ordered))
            equal = pc.and_(same, equal)
    assert ordered is not None
    assert equal is not None
    return ordered, equal


def sorted_unique(table: pa.Table, scope: ChunkScope, where: str) -> pa.Table:
    """The table sorted by the kind's key; CountMismatch when two rows share a key."""
    keys = list(tables.KEYS[scope.kind])
    if table.num_rows < 2:
        return table
    ordered, equal = _adjacent(table, keys)
    if not pc.all(ordered).as_py():
        ranks = pa.table([tables.sort_key(table.column(k)) for k in keys], names=keys)
        table = table.take(pc.sort_indices(ranks, sort_keys=[(k, "ascending") for k in keys]))
        _, equal = _adjacent(table, keys)
    if pc.any(equal).as_py():
        raise CountMismatch(
            f"{where}: chunk {scope.chunk_id}: rows share one key ({', '.join(keys)}); "
            f"fetched {table.num_rows}, nothing committed"
        )
    return table


def encoded_names(table: pa.Table, kind: str) -> pa.Table:
    """The key's string columns dictionary-encoded (the engine's chunks arrive so): names
    are then checked, compared and sorted by their ranks, never string by string."""
    for key in tables.KEYS[kind]:
        i = table.schema.get_field_index(key)
        if pa.types.is_string(table.schema.field(i).type):
            table = table.set_column(i, key, pc.dictionary_encode(table.column(i)))
    return table


def chunk_rows(rows: Rows, scope: ChunkScope, rows_fetched: int, where: str) -> pa.Table:
    """The chunk's rows checked, sorted and decoded, ready to be committed."""
    table = typed_table(rows, scope.kind, f"{where}: write chunk {scope.chunk_id}")
    table = encoded_names(table, scope.kind)
    check_scope(scope, table, where)
    if table.num_rows != rows_fetched:
        raise CountMismatch(
            f"{where}: chunk {scope.chunk_id} holds {table.num_rows} rows, fetched "
            f"{rows_fetched}: nothing committed"
        )
    return plain(sorted_unique(table, scope, where))
