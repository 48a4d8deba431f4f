"""A chunk's rows as the lake takes them: validated, in the kind's schema, sorted.

The engine hands over frames whose string columns (`node`, `tag`) are dictionary-encoded;
they stay so until the rows are sorted (compared by rank, never string by string) and
written (dictionary pages from their codes), and files read back as plain strings. That
no row lies outside the chunk's scope is every sink's check (`sinks.scope`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from connectors import schema as tables
from connectors.schema import Rows
from connectors.timewindow import Window
from sinks.base import SinkError

HISTORY_KINDS = (tables.KIND_TAG_HISTORY, tables.KIND_ALARM_HISTORY)


def reason(exc: BaseException) -> str:
    """An exception as one short line for a user-facing error."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200] + ("..." if len(text) > 200 else "")


def table_of(rows: Rows, kind: str, where: str) -> pa.Table:
    """The rows as a table of the kind's schema (one chunk per column), else a one-line
    SinkError starting with `where`. Dictionary-encoded string columns of history stay so
    until `sorted_rows` has used them."""
    try:
        table = tables.table_from_frame(rows, kind, keep_dictionaries=kind in HISTORY_KINDS)
    except (KeyError, ValueError, TypeError, pa.ArrowException) as exc:
        raise SinkError(
            f"{where}: the frame does not match the {kind} schema: {reason(exc)}"
        ) from exc
    for item in tables.SCHEMAS[kind]:
        if not item.nullable and table.column(item.name).null_count:
            raise SinkError(f"{where}: column {item.name} has nulls")
    if table.num_columns and table.column(0).num_chunks == 1:
        return table  # one chunk per column already: no copy
    return table.combine_chunks()


def scope_mask(
    table: pa.Table, kind: str, window: Window, members: Sequence[str], node: str
) -> pa.Array:
    """Which rows of `table` are in a chunk's scope (its node's rows in its window; for
    tag history, of its tags)."""
    ts = pc.cast(table["ts"], pa.int64())
    mask = pc.and_(pc.greater_equal(ts, window.start_ms), pc.less(ts, window.end_ms))
    mask = pc.and_(mask, pc.equal(table["node"], pa.scalar(node, pa.string())))
    if kind == tables.KIND_TAG_HISTORY:
        mask = pc.and_(mask, pc.is_in(table["tag"], value_set=pa.array(list(members), pa.string())))
    return pc.fill_null(mask, False)


def plain(table: pa.Table, kind: str) -> pa.Table:
    """`table` with the kind's exact schema (dictionary-encoded strings decoded)."""
    return table.cast(tables.SCHEMAS[kind]).replace_schema_metadata(None)


def sorted_rows(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """`table` sorted by `keys` (stable); as it is when it already is sorted, as the
    engine's chunks are: checking adjacent rows is a fraction of the cost of a sort and a
    copy. Dictionary-encoded keys are compared by the rank of their value and stay encoded."""
    n = table.num_rows
    if n < 2:
        return table
    ranked = pa.table([tables.sort_key(table.column(key)) for key in keys], names=list(keys))
    # With nulls, where they go is the sort's to say.
    if not any(ranked.column(key).null_count for key in keys) and _in_order(ranked, keys):
        return table
    return table.take(pc.sort_indices(ranked, sort_keys=[(key, "ascending") for key in keys]))


def _in_order(ranked: pa.Table, keys: Sequence[str]) -> bool:
    """Is every row <= the next by `keys` (columns without nulls)?"""
    n = ranked.num_rows
    ordered: pa.Array | None = None
    for key in reversed(keys):
        column = ranked.column(key)
        before, after = column.slice(0, n - 1), column.slice(1)
        if ordered is None:
            ordered = pc.less_equal(before, after)
        else:
            ordered = pc.or_(pc.less(before, after), pc.and_(pc.equal(before, after), ordered))
    return ordered is not None and bool(pc.all(ordered).as_py())
