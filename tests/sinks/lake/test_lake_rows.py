"""A chunk's rows as the lake takes them, on their own: validation, scope, sort order."""

from __future__ import annotations

import pyarrow as pa
import pytest

from connectors import schema
from sinks.base import SinkError
from sinks.lake.rows import plain, scope_mask, sorted_rows, table_of
from tests.sinks.lake.lake_frames import history_frame, window

KIND = schema.KIND_TAG_HISTORY
KEYS = schema.KEYS[KIND]


def history(tags: list[str], start_h: int, end_h: int, node: str = "n1") -> pa.Table:
    frame = history_frame(tags, window(start_h, end_h), step_s=3600, node=node)
    return table_of(frame, KIND, "test")


def test_a_frame_of_another_schema_or_with_nulls_in_a_key_is_a_one_line_error() -> None:
    frame = history_frame(["/a"], window(0, 1))
    with pytest.raises(SinkError, match=r"^lake 'x': w: the frame does not match the tag_history"):
        table_of(frame.drop(columns=["seq"]), KIND, "lake 'x': w")
    frame["seq"] = frame["seq"].astype("Int64").astype(object).where(frame["seq"] > 0, None)
    with pytest.raises(SinkError, match=r"^lake 'x': w: .*'seq' with null values"):
        table_of(frame, KIND, "lake 'x': w")


def test_the_scope_mask_takes_the_node_the_window_and_for_tag_history_the_members() -> None:
    table = pa.concat_tables([history(["/a", "/b"], 0, 3), history(["/a", "/b"], 0, 3, "n2")])
    mask = scope_mask(table, KIND, window(1, 3), ["/b"], "n1")
    picked = table.filter(mask)
    assert picked.column("tag").to_pylist() == ["/b", "/b"]
    assert set(picked.column("node").to_pylist()) == {"n1"}
    alarms = scope_mask(table, schema.KIND_ALARM_HISTORY, window(1, 3), ["/b"], "n2")
    assert table.filter(alarms).num_rows == 4, "alarm scopes are the node's paths in the window"


def test_sorted_rows_returns_the_same_table_when_already_in_order() -> None:
    table = history(["/a", "/b"], 0, 3)  # by time, then tag: not in key order
    ordered = table.sort_by([(key, "ascending") for key in KEYS])
    assert not table.equals(ordered)
    assert sorted_rows(table, KEYS).equals(ordered)
    assert sorted_rows(ordered, KEYS) is ordered, "no copy of rows already in order"


def test_dictionary_keys_sort_by_their_value_and_stay_encoded() -> None:
    table = history(["/a", "/b", "/c"], 0, 1)
    tags = pa.DictionaryArray.from_arrays(pa.array([2, 0, 1], pa.int32()), ["/b", "/c", "/a"])
    encoded = table.set_column(table.schema.get_field_index("tag"), "tag", tags)
    ordered = sorted_rows(encoded, KEYS)
    assert pa.types.is_dictionary(ordered.schema.field("tag").type)
    assert ordered.column("tag").to_pylist() == ["/a", "/b", "/c"]
    assert plain(ordered, KIND).schema == schema.SCHEMAS[KIND]
