"""The rows as the warehouse loads them (sinks/sql/rows.py): pure Arrow, no database."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from connectors import schema
from sinks.base import SinkError
from sinks.sql.rows import narrow, plain, series_pairs, typed_table
from tests.sinks.sql.sql_frames import history, hours

HIST = schema.KIND_TAG_HISTORY


def test_series_pairs_are_the_distinct_pairs_and_index_every_row() -> None:
    table = pa.table(
        {
            "node": ["n2", "n1", "n2", "n1", "n2"],
            "tag": ["b", "a", "b", "b", "a"],
        }
    )
    pairs, rows_pair = series_pairs(table)
    assert sorted(pairs) == [("n1", "a"), ("n1", "b"), ("n2", "a"), ("n2", "b")]
    assert [pairs[i] for i in rows_pair] == list(
        zip(table.column("node").to_pylist(), table.column("tag").to_pylist(), strict=True)
    )


def test_series_pairs_of_no_rows_are_none() -> None:
    pairs, rows_pair = series_pairs(typed_table(schema.empty_frame(HIST), HIST))
    assert pairs == []
    assert len(rows_pair) == 0


def test_narrow_rows_carry_their_series_id_and_put_text_last() -> None:
    table = typed_table(history(["a", "b"], hours(0, 1)), HIST)
    pairs, rows_pair = series_pairs(table)
    assert sorted(pairs) == [("node1", "a"), ("node1", "b")]
    given = {("node1", "a"): 7, ("node1", "b"): 9}
    ids = np.array([given[p] for p in pairs], dtype=np.int32)[rows_pair]
    narrowed = narrow(table, ids)
    assert narrowed.column_names == [
        "series_id", "ts", "seq", "value", "value_bool", "quality", "extra", "value_str",
    ]  # fmt: skip
    assert narrowed.schema.field("series_id").type == pa.int32()
    by_tag = dict(
        zip(table.column("tag").to_pylist(), narrowed.column("series_id").to_pylist(), strict=True)
    )
    assert by_tag == {"a": 7, "b": 9}
    assert narrowed.column("value").equals(table.column("value"))


def test_dictionary_encoded_tags_stay_encoded_until_decoded_by_plain() -> None:
    frame = history(["a", "b"], hours(0, 1))
    frame["tag"] = frame["tag"].astype("category")
    table = typed_table(frame, HIST)
    assert pa.types.is_dictionary(table.schema.field("tag").type)
    decoded = plain(table)
    assert decoded.schema.field("tag").type == pa.string()
    assert decoded.column("tag").to_pylist() == list(frame["tag"].astype(str))


def test_a_frame_of_another_shape_is_one_line_sink_error() -> None:
    frame = history(["a"], hours(0, 1)).drop(columns=["ts"])
    with pytest.raises(SinkError, match=r"^frame does not match the tag_history schema: [^\n]+$"):
        typed_table(frame, HIST)
