"""A chunk's rows as the Arrow tables the warehouse loads, without touching the database.

Rows are typed to the kind's exact schema once (a frame that does not fit is a one-line
`SinkError` before any transaction starts); wide tables and DuckDB load them decoded
(`plain`); the narrow tag-history layout (sinks/sql/tables.py) loads them with (node, tag)
replaced by a series id, which `series_pairs` and `narrow` split into the pairs to look
up and the table built from their ids.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from connectors.schema import SCHEMAS, Rows, as_table
from sinks.base import SinkError
from sinks.sql.pg_copy import dense_codes

Pair = tuple[str, str]  # (node, tag)


def typed_table(rows: Rows, kind: str) -> pa.Table:
    """The rows as an Arrow table of the kind's exact schema, or a one-line SinkError."""
    if not len(rows):
        return SCHEMAS[kind].empty_table()
    try:
        table = as_table(rows)
        # Text columns may come dictionary-encoded (tag names, repeated on every row): they
        # stay so, as the narrow load wants codes anyway; plain text stays plain.
        target = pa.schema(
            [
                f.with_type(table.schema.field(f.name).type)
                if f.name in table.column_names
                and is_text(f.type)
                and _is_text_dictionary(table.schema.field(f.name).type)
                else f
                for f in SCHEMAS[kind]
            ]
        )
        return table.select(target.names).cast(target)
    except (KeyError, ValueError, TypeError, pa.ArrowException) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise SinkError(f"frame does not match the {kind} schema: {reason}") from None


def is_text(kind: pa.DataType) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or _is_text_dictionary(kind)


def _is_text_dictionary(kind: pa.DataType) -> bool:
    if not pa.types.is_dictionary(kind):
        return False
    return bool(pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type))


def plain(table: pa.Table) -> pa.Table:
    """Dictionary-encoded columns decoded (what the wide tables and DuckDB are loaded from)."""
    for i, f in enumerate(table.schema):
        if pa.types.is_dictionary(f.type):
            table = table.set_column(i, f.name, table.column(i).cast(f.type.value_type))
    return table


def series_pairs(table: pa.Table) -> tuple[list[Pair], npt.NDArray[np.int64]]:
    """The distinct (node, tag) pairs of tag history rows, and each row's index into them
    (found on dictionary codes: no Python per row)."""
    if table.num_rows == 0:
        return [], np.zeros(0, np.int64)
    nodes = pc.dictionary_encode(table.column("node").combine_chunks())
    tags = pc.dictionary_encode(table.column("tag").combine_chunks())
    node_codes = np.asarray(nodes.indices, dtype=np.int64)
    tag_codes = np.asarray(tags.indices, dtype=np.int64)
    pair_codes, count = dense_codes(node_codes * len(tags.dictionary) + tag_codes)
    firsts = np.full(count, -1, np.int64)
    firsts[pair_codes[::-1]] = np.arange(len(pair_codes) - 1, -1, -1)  # first row of each
    node_names = nodes.dictionary.to_pylist()
    tag_names = tags.dictionary.to_pylist()
    pairs = [(node_names[node_codes[row]], tag_names[tag_codes[row]]) for row in firsts.tolist()]
    return pairs, pair_codes


def narrow(table: pa.Table, series_ids: npt.NDArray[np.int32]) -> pa.Table:
    """Tag history rows with (node, tag) replaced by each row's series id, fixed-width
    columns before text (the rows table's order, sinks/sql/tables.py `by_alignment`)."""
    rest = plain(table.select([n for n in table.column_names if n not in ("node", "tag")]))
    fixed = [n for n in rest.column_names if not is_text(rest.schema.field(n).type)]
    text = [n for n in rest.column_names if n not in fixed]
    columns = [rest.column(n) for n in fixed + text]
    ids = pa.array(series_ids, pa.int32())
    return pa.table([ids, *columns], names=["series_id", *fixed, *text])
