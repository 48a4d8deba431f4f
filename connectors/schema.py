"""The typed tables the normaliser produces and every sink stores.

One place for column names and Arrow types, so that the normaliser, the Parquet lake and
the SQL warehouse cannot drift apart. DataFrames use `pd.ArrowDtype` columns of exactly
these types; dataset-level facts (mode, method, interval) travel in `DataFrame.attrs`
under the keys of `HISTORY_ATTRS` and in Parquet schema metadata.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

TS_TYPE = pa.timestamp("ms", tz="UTC")

# Tag history: one row per sample. `seq` numbers samples that share (tag, ts): 0 for the
# first, 1 for the next, so that a node storing two events on one millisecond loses none.
TAG_HISTORY_SCHEMA = pa.schema(
    [
        pa.field("node", pa.string(), nullable=False),
        pa.field("tag", pa.string(), nullable=False),
        pa.field("ts", TS_TYPE, nullable=False),
        pa.field("seq", pa.int16(), nullable=False),
        pa.field("value", pa.float64()),
        pa.field("value_bool", pa.bool_()),
        pa.field("value_str", pa.string()),
        pa.field("quality", pa.int16()),
        pa.field("extra", pa.int64()),
    ]
)
TAG_HISTORY_KEY = ("node", "tag", "ts", "seq")

# On the way from the normaliser to the sinks, `node` and `tag` are dictionary-encoded: a
# chunk holds ~100 tag names in ~340k rows, so checks, counts and sorts by tag work on the
# names once and on int32 indices otherwise. Sinks store the strings of TAG_HISTORY_SCHEMA.
NAME_DICTIONARY = pa.dictionary(pa.int32(), pa.string())
TAG_HISTORY_ENCODED_SCHEMA = pa.schema(
    [
        field.with_type(NAME_DICTIONARY) if field.name in ("node", "tag") else field
        for field in TAG_HISTORY_SCHEMA
    ]
)

# Alarm history: one row per alarm state change. `value`, `ack_info` and `extra` are JSON
# text: the value's type is the source's, and unknown fields are kept verbatim.
ALARM_HISTORY_SCHEMA = pa.schema(
    [
        pa.field("node", pa.string(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("ts", TS_TYPE, nullable=False),
        pa.field("status", pa.int16()),
        pa.field("priority", pa.int16()),
        pa.field("value", pa.string()),
        pa.field("description", pa.string()),
        pa.field("ack_ts", TS_TYPE),
        pa.field("ack_user", pa.string()),
        pa.field("ack_msg", pa.string()),
        pa.field("ack_info", pa.string()),
        pa.field("extra", pa.string()),
    ]
)
ALARM_HISTORY_KEY = ("node", "path", "ts", "status")

# Tag metadata from `tag?cmd=details`: the warehouse's tag dimension.
TAG_METADATA_SCHEMA = pa.schema(
    [
        pa.field("node", pa.string(), nullable=False),
        pa.field("tag", pa.string(), nullable=False),
        pa.field("description", pa.string()),
        pa.field("type", pa.string()),
        pa.field("number_type", pa.string()),
        pa.field("eng_units", pa.string()),
        pa.field("format", pa.string()),
        pa.field("deadband", pa.string()),
        pa.field("client_access", pa.string()),
        pa.field("history_enabled", pa.bool_()),
        pa.field("history_mode", pa.string()),
        pa.field("history_deadband", pa.string()),
        pa.field("views", pa.string()),
        pa.field("config", pa.string()),
        pa.field("updated_at", TS_TYPE, nullable=False),
    ]
)
TAG_METADATA_KEY = ("node", "tag")

HISTORY_ATTRS = ("kind", "node", "mode", "method", "interval_ms", "deadband", "invalid_as_null")

# A sample whose `quality` is at least this is good (OPC quality codes); less, or none, is
# bad or uncertain: what the summary and the coverage report count as bad.
GOOD_QUALITY = 192

KIND_TAG_HISTORY = "tag_history"
KIND_ALARM_HISTORY = "alarm_history"
KIND_TAG_METADATA = "tag_metadata"

SCHEMAS: dict[str, pa.Schema] = {
    KIND_TAG_HISTORY: TAG_HISTORY_SCHEMA,
    KIND_ALARM_HISTORY: ALARM_HISTORY_SCHEMA,
    KIND_TAG_METADATA: TAG_METADATA_SCHEMA,
}
KEYS: dict[str, tuple[str, ...]] = {
    KIND_TAG_HISTORY: TAG_HISTORY_KEY,
    KIND_ALARM_HISTORY: ALARM_HISTORY_KEY,
    KIND_TAG_METADATA: TAG_METADATA_KEY,
}
# The column that places a row in a chunk's scope: tags for history, alarm paths for alarms.
SCOPE_COLUMN: dict[str, str] = {
    KIND_TAG_HISTORY: "tag",
    KIND_ALARM_HISTORY: "path",
    KIND_TAG_METADATA: "tag",
}


def empty_frame(kind: str) -> pd.DataFrame:
    """A zero-row DataFrame with the kind's exact column types."""
    return frame_from_table(SCHEMAS[kind].empty_table())


def frame_from_table(table: pa.Table) -> pd.DataFrame:
    """Arrow table to DataFrame with Arrow-backed dtypes (no copies to NumPy objects)."""
    frame: pd.DataFrame = table.to_pandas(types_mapper=pd.ArrowDtype)
    return frame


# A chunk's rows as sinks take them: the Arrow table a run fetched, or a DataFrame of the
# same columns (what a library caller may hold).
Rows: TypeAlias = pa.Table | pd.DataFrame


def as_table(rows: Rows) -> pa.Table:
    """The rows as an Arrow table: the table itself, or the DataFrame's columns."""
    return rows if isinstance(rows, pa.Table) else pa.Table.from_pandas(rows, preserve_index=False)


def last_per_key(rows: Rows, keys: Sequence[str]) -> pa.Table:
    """The rows as a table with only the last row of each key kept, in their order (what
    pandas' `drop_duplicates(keep="last")` keeps, without a DataFrame made for it)."""
    table = as_table(rows)
    if table.num_rows < 2:
        return table
    numbered = table.select(list(keys)).append_column(
        "__row", pa.array(np.arange(table.num_rows, dtype=np.int64))
    )
    last = numbered.group_by(list(keys), use_threads=False).aggregate([("__row", "max")])
    kept = last["__row_max"]
    return table.take(pc.take(kept, pc.sort_indices(kept)))


def table_from_frame(rows: Rows, kind: str, *, keep_dictionaries: bool = False) -> pa.Table:
    """Rows (an Arrow table, or a DataFrame of the same columns) as an Arrow table cast
    to the kind's schema (raises on a column mismatch).

    `keep_dictionaries`: string columns that arrive dictionary-encoded stay so (as
    NAME_DICTIONARY), for a caller that works on the distinct values before storing them.
    """
    schema = SCHEMAS[kind]
    table = as_table(rows).select(schema.names)
    if keep_dictionaries:
        schema = pa.schema(
            [
                field.with_type(NAME_DICTIONARY)
                if pa.types.is_string(field.type) and pa.types.is_dictionary(arrived.type)
                else field
                for field, arrived in zip(schema, table.schema, strict=True)
            ]
        )
    return table.cast(schema)


def sort_key(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column that sorts and compares like `column`: itself, or for a dictionary-encoded
    one each row's dense rank among its dictionary's values (uint32), so that equal names
    have equal keys and a sort or an order check never compares strings row by row."""
    column = one_array(column)
    if not pa.types.is_dictionary(column.type):
        return column
    rank = pc.rank(column.dictionary, sort_keys="ascending", tiebreaker="dense")
    return pc.take(rank.cast(pa.uint32()), column.indices)


def names_of(column: pa.Array | pa.ChunkedArray) -> set[str]:
    """The distinct values of a string column (dictionary-encoded or not), nulls aside; a
    dictionary's values without rows are left out."""
    column = one_array(column)
    if not pa.types.is_dictionary(column.type):
        return {name for name in pc.unique(column).to_pylist() if name is not None}
    used = np.bincount(
        column.indices.fill_null(0).to_numpy(zero_copy_only=False),
        minlength=len(column.dictionary),
    )
    if column.null_count:  # null slots were counted as index 0
        used[0] -= column.null_count
    present = pa.array(used > 0)
    return {name for name in column.dictionary.filter(present).to_pylist() if name is not None}


def one_array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The column as one array: its only chunk as it is, or the chunks concatenated (their
    dictionaries unified on the way)."""
    if not isinstance(column, pa.ChunkedArray):
        return column
    if column.num_chunks == 1:
        return column.chunk(0)
    return column.combine_chunks()
